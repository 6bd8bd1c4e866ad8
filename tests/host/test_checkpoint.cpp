// SPDX-License-Identifier: BSL-1.0
// Checkpoints: round trip, atomic replacement, refusal of corrupt, truncated and foreign files.
#include <doctest/doctest.h>

#include <memalg/exec/checkpoint.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

using namespace memalg::exec;
namespace fs = std::filesystem;

namespace {
struct scratch {
  fs::path dir = fs::temp_directory_path() / ("memalg_ckpt_test_" + std::to_string(::getpid()));
  scratch() { fs::create_directories(dir); }
  ~scratch() { fs::remove_all(dir); }
};
std::vector<checkpoint_section> sections(std::vector<float>& a, std::vector<double>& b) {
  return {{"weights", std::as_writable_bytes(std::span(a))}, {"adam_m", std::as_writable_bytes(std::span(b))}};
}
std::vector<char> slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void spit(const fs::path& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
}  // namespace

TEST_CASE("a checkpoint round-trips bit for bit") {
  scratch s;
  std::vector<float> w{1.5f, -2.25f, 3e-38f};
  std::vector<double> m{0.1, 0.2};
  auto sec = sections(w, m);
  save_checkpoint(s.dir / "ckpt.bin", "tiny-fp32", 42, sec);
  std::vector<float> w2(3);
  std::vector<double> m2(2);
  auto sec2 = sections(w2, m2);
  CHECK(load_checkpoint(s.dir / "ckpt.bin", "tiny-fp32", sec2) == 42);
  CHECK(std::memcmp(w.data(), w2.data(), sizeof(float) * 3) == 0);
  CHECK(std::memcmp(m.data(), m2.data(), sizeof(double) * 2) == 0);
  CHECK_FALSE(fs::exists(s.dir / "ckpt.bin.tmp"));
}

TEST_CASE("corrupt, truncated, foreign and mismatched checkpoints are refused with a reason") {
  scratch s;
  std::vector<float> w{1, 2, 3};
  std::vector<double> m{4, 5};
  auto sec = sections(w, m);
  const fs::path file = s.dir / "ckpt.bin";
  save_checkpoint(file, "tiny-fp32", 7, sec);
  const std::vector<char> good = slurp(file);

  std::vector<char> bad = good;
  bad[bad.size() / 2] ^= 0x10;
  spit(file, bad);
  CHECK_THROWS_WITH_AS(load_checkpoint(file, "tiny-fp32", sec), doctest::Contains("checksum mismatch"),
                       checkpoint_error);

  spit(file, std::vector<char>(good.begin(), good.begin() + static_cast<long>(good.size() / 3)));
  CHECK_THROWS_AS(load_checkpoint(file, "tiny-fp32", sec), checkpoint_error);
  spit(file, std::vector<char>(good.begin(), good.begin() + 4));
  CHECK_THROWS_WITH_AS(load_checkpoint(file, "tiny-fp32", sec), doctest::Contains("truncated"), checkpoint_error);

  spit(file, good);
  CHECK_THROWS_WITH_AS(load_checkpoint(file, "tiny-bf16", sec), doctest::Contains("written by plan 'tiny-fp32'"),
                       checkpoint_error);
  std::vector<float> w4(4);
  auto other = sections(w4, m);
  CHECK_THROWS_WITH_AS(load_checkpoint(file, "tiny-fp32", other), doctest::Contains("does not match"),
                       checkpoint_error);
  spit(file, std::vector<char>{'n', 'o', 't', ' ', 'a', ' ', 'c', 'k', 'p', 't', ' ', 'f', 'i', 'l', 'e', '!'});
  CHECK_THROWS_WITH_AS(load_checkpoint(file, "tiny-fp32", sec), doctest::Contains("not a memalg checkpoint"),
                       checkpoint_error);
  CHECK_THROWS_AS(load_checkpoint(s.dir / "missing.bin", "tiny-fp32", sec), checkpoint_error);
}

TEST_CASE("an interrupted save leaves the previous checkpoint intact") {
  scratch s;
  std::vector<float> w{1, 2, 3};
  std::vector<double> m{4, 5};
  auto sec = sections(w, m);
  const fs::path file = s.dir / "ckpt.bin";
  save_checkpoint(file, "p", 1, sec);
  const std::vector<char> before = slurp(file);
  // A crash in the middle of a save leaves a partial temporary file behind ...
  spit(s.dir / "ckpt.bin.tmp", std::vector<char>(before.begin(), before.begin() + 10));
  CHECK(slurp(file) == before);
  CHECK(load_checkpoint(file, "p", sec) == 1);
  // ... and a save that cannot even create its temporary file fails without touching the old one.
  fs::remove(s.dir / "ckpt.bin.tmp");
  fs::create_directory(s.dir / "ckpt.bin.tmp");
  w[0] = 99;
  CHECK_THROWS_AS(save_checkpoint(file, "p", 2, sec), checkpoint_error);
  CHECK(slurp(file) == before);
  // The next successful save replaces it.
  fs::remove(s.dir / "ckpt.bin.tmp");
  save_checkpoint(file, "p", 2, sec);
  w[0] = 0;
  CHECK(load_checkpoint(file, "p", sec) == 2);
  CHECK(w[0] == 99);
}
