// SPDX-License-Identifier: BSL-1.0
// fuzz/fuzz_cli.cpp — libFuzzer target: arbitrary bytes as a `memalg` command line.
//
// The input is split at newlines into arguments and given to the tool's own main() (compiled
// with main renamed), so every sub-command and flag parser is exercised. Every input must end with
// exit status 0 or 2 (a one-line usage error); status 1 (an internal error), a crash, a sanitizer
// report or a hang is a bug. Inputs with arguments that would write files (--svg, -o/--output)
// are skipped so the fuzzer cannot write anywhere — a new flag that writes a file must be added
// to that filter — and sweeps are limited to a few thousand configurations so that each input
// runs in milliseconds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <streambuf>
#include <string>
#include <vector>

#include "planner.hpp"

int memalg_main(int argc, char** argv);

namespace {
struct null_buffer : std::streambuf {
  int overflow(int c) override { return c; }
} sink;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::cout.rdbuf(&sink);
  std::cerr.rdbuf(&sink);
  memalg::cli::max_sweep_configurations = 5000;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 4096) return 0;
  std::vector<std::string> args{"memalg"};
  std::string current;
  for (std::size_t i = 0; i < size; ++i) {
    const char c = static_cast<char>(data[i]);
    if (c == '\n') {
      args.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (!current.empty()) args.push_back(current);
  for (const std::string& a : args) {
    const bool short_option = a.size() > 1 && a[0] == '-' && a[1] != '-';
    if (a.rfind("--svg", 0) == 0 || a.rfind("--output", 0) == 0 || (short_option && a.find('o') != std::string::npos))
      return 0;
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int status = memalg_main(static_cast<int>(args.size()), argv.data());
  if (status != 0 && status != 2) std::abort();  // an internal error is a bug
  return 0;
}
