// SPDX-License-Identifier: BSL-1.0
// memalg/exec/runtime_issues.hpp — the reasons a runtime refuses a plan that fits, one sentence each.
//
// The sentences are written once, in exec/runtime_issues.def, and expanded from there three
// ways: the `runtime_issue` enumeration; `describe` (CPU runtime) and `describe_cuda` (CUDA
// runtime), what a program prints; and `detail::runtime_check<I>` / `detail::cuda_runtime_check<I>`,
// whose static_assert strings are the same sentences joined by literal concatenation (C++20's
// static_assert takes a string literal only), so a refused plan is a compile error that names the
// problem under g++ and nvcc. Where the CPU and CUDA runtimes differ, the difference is a
// parameter of the entry, MEMALG_RUNTIME(cpu_text, cuda_text), not a second list. The rules that
// pick an issue are find_runtime_issue / find_cpu_runtime_issue (exec/gpt/plan.hpp) and
// find_cuda_runtime_issue (exec/gpt/plan_cuda.hpp).
#pragma once

#include <string_view>

namespace memalg::exec {

/// Why a runtime cannot run a configuration. One list for both runtimes: the CPU one never reports
/// head_width (exec/gpt/plan_cuda.hpp).
enum class runtime_issue : int {
  none = 0,
#define MEMALG_RUNTIME(cpu, cuda) cpu
#define MEMALG_RUNTIME_ISSUE(name, sentence) name,
#include "memalg/exec/runtime_issues.def"
#undef MEMALG_RUNTIME_ISSUE
#undef MEMALG_RUNTIME
};

/// The CUDA runtime's reasons are runtime_issue's.
using cuda_runtime_issue = runtime_issue;

/// The sentence the CPU runtime refuses a configuration with (empty for none).
constexpr std::string_view describe(runtime_issue i) {
  switch (i) {
    case runtime_issue::none: return {};
#define MEMALG_RUNTIME(cpu, cuda) cpu
#define MEMALG_RUNTIME_ISSUE(name, sentence) \
  case runtime_issue::name: return sentence;
#include "memalg/exec/runtime_issues.def"
#undef MEMALG_RUNTIME_ISSUE
#undef MEMALG_RUNTIME
  }
  return "unknown";
}

/// The sentence the CUDA runtime refuses a configuration with (empty for none).
constexpr std::string_view describe_cuda(runtime_issue i) {
  switch (i) {
    case runtime_issue::none: return {};
#define MEMALG_RUNTIME(cpu, cuda) cuda
#define MEMALG_RUNTIME_ISSUE(name, sentence) \
  case runtime_issue::name: return sentence;
#include "memalg/exec/runtime_issues.def"
#undef MEMALG_RUNTIME_ISSUE
#undef MEMALG_RUNTIME
  }
  return "unknown";
}

namespace detail {
/// Instantiated with the issue the CPU runtime reports; only the matching assertion fires, with
/// "gpt_run: " and describe(I).
template <runtime_issue I>
struct runtime_check {
#define MEMALG_RUNTIME(cpu, cuda) cpu
#define MEMALG_RUNTIME_ISSUE(name, sentence) static_assert(I != runtime_issue::name, "gpt_run: " sentence);
#include "memalg/exec/runtime_issues.def"
#undef MEMALG_RUNTIME_ISSUE
#undef MEMALG_RUNTIME
  static constexpr bool value = I == runtime_issue::none;
};

/// The same for the CUDA runtime: "gpt_run_cuda: " and describe_cuda(I).
template <runtime_issue I>
struct cuda_runtime_check {
#define MEMALG_RUNTIME(cpu, cuda) cuda
#define MEMALG_RUNTIME_ISSUE(name, sentence) static_assert(I != runtime_issue::name, "gpt_run_cuda: " sentence);
#include "memalg/exec/runtime_issues.def"
#undef MEMALG_RUNTIME_ISSUE
#undef MEMALG_RUNTIME
  static constexpr bool value = I == runtime_issue::none;
};
}  // namespace detail

}  // namespace memalg::exec
