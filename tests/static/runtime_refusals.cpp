// SPDX-License-Identifier: BSL-1.0
// Passes by compiling: the plan the runtime-refusal fail tests (tests/fail/runtime_*.cpp,
// cuda_runtime_*.cpp) each change in one place fits and both runtimes implement it, so each of
// those tests fails for the one refusal it names; and every refusal has a sentence for each
// runtime (exec/runtime_issues.hpp).
#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>
#include <memalg/exec/gpt/plan_cuda.hpp>

#include <string_view>

#include "../fail/runtime_plan.hpp"

namespace {
namespace m = memalg;
namespace ex = memalg::exec;

using base = fail_runtime::plan<fail_runtime::gpt_config>;
using cpu_run = ex::gpt_run<base, m::backend::cpu::local_communicator>;
static_assert(cpu_run::issue == ex::runtime_issue::none);
static_assert(ex::gpt_run_cuda_check<base>::value);
static_assert(ex::gpt_run_cuda_check<base>::issue == ex::runtime_issue::none);

constexpr bool every_issue_has_sentences() {
  for (int i = 1; i <= static_cast<int>(ex::runtime_issue::head_width); ++i) {
    const auto issue = static_cast<ex::runtime_issue>(i);
    if (ex::describe(issue).empty() || ex::describe(issue) == "unknown") return false;
    if (ex::describe_cuda(issue).empty() || ex::describe_cuda(issue) == "unknown") return false;
  }
  return ex::describe(ex::runtime_issue::none).empty() && ex::describe_cuda(ex::runtime_issue::none).empty();
}
static_assert(every_issue_has_sentences());
// describe and describe_cuda read the two sides of each entry: the CUDA runtime has no fp16.
static_assert(ex::describe(ex::runtime_issue::precision).find("amp-fp16") != std::string_view::npos);
static_assert(ex::describe_cuda(ex::runtime_issue::precision).find("amp-fp16") == std::string_view::npos);
}  // namespace
