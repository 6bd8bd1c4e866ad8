// SPDX-License-Identifier: BSL-1.0
// examples/pick_strategy.cpp — choose a parallel strategy at compile time, and say why.
//
// Llama-2 7B, sequence 4096, amp-bf16 AdamW, on 8 A100 80 GB. The space: ZeRO stages 0-3, tensor
// parallelism 1, 2, 4, 8 (with sequence parallelism), pipeline 1 or 2, micro-batch 1, 2, 4, 8 and
// three recomputation choices: 384 configurations, each planned by the compiler. Memory only has
// to fit; what slows a step down is communication, so the program keeps the feasible configuration
// that sends the fewest bytes per step, and the build fails if the space had none.
#include <cstdio>

#include <memalg/memalg.hpp>
#include <memalg/plan/search_hana.hpp>

namespace m = memalg;
namespace s = memalg::search;
namespace rc = memalg::train::recompute;

using model = m::presets::llama2_7b;
using training = m::train::recipe<m::precision::amp_bf16, m::optim::adamw<>>;
using space = s::space<8, s::zero_stages<0, 1, 2, 3>, s::tensor_sequence_degrees<1, 2, 4, 8>, s::pipeline_degrees<1, 2>,
                       s::micro_batches<4096, 1, 2, 4, 8>, s::one_of<rc::none, rc::selective, rc::full>>;
using found = s::strategy_search<model, training, space, m::device::a100_80gb>;

// The choice is a type: its mesh and recipe can instantiate a runtime, and its plan is checked.
using chosen = found::least_communication;
static_assert(m::require_fits<chosen::plan>(), "the chosen configuration fits");
using smallest = found::least_memory;
using largest_batch = found::largest_micro_batch;

namespace {

double gib(std::uint64_t b) { return static_cast<double>(b) / (1ULL << 30); }

template <class Configuration>
void describe(const char* what) {
  constexpr const m::strategy& c = Configuration::choice;
  constexpr const m::training_desc& t = Configuration::plan::training;
  constexpr m::comm_volume v = m::communication(Configuration::plan::model, t, Configuration::plan::mesh);
  std::printf("%-22s dp=%llu zero=%d tp=%llu%s pp=%llu micro-batch=%llu recompute=%s: peak %.2f GiB, sends %.2f GiB/step\n",
              what, static_cast<unsigned long long>(c.dp), c.zero_stage, static_cast<unsigned long long>(c.tensor.degree),
              c.tensor.sequence_parallel ? "+sp" : "", static_cast<unsigned long long>(c.pipeline.degree),
              static_cast<unsigned long long>(t.micro_batch), std::string(m::recompute_name(t.recompute)).c_str(),
              gib(Configuration::plan::peak.value), gib(v.total().value));
}

}  // namespace

int main() {
  constexpr const m::search_result& r = found::result;
  std::printf("Llama-2 7B, sequence 4096, amp-bf16 AdamW on 8 x A100 80 GB (limit %.2f GiB per GPU)\n",
              gib(found::problem.device.limit().value));
  std::printf("searched %llu configurations at compile time: %llu valid, %llu fit\n\n",
              static_cast<unsigned long long>(r.evaluated), static_cast<unsigned long long>(r.valid),
              static_cast<unsigned long long>(r.feasible));
  describe<chosen>("chosen (least traffic)");
  describe<smallest>("least memory");
  describe<largest_batch>("largest micro-batch");

  constexpr m::comm_volume v = m::communication(chosen::plan::model, chosen::plan::training, chosen::plan::mesh);
  std::printf("\nwhy: of the %llu configurations that fit, it sends the fewest bytes per step: %.2f GiB of gradient\n"
              "reduction and weight gathering, %.2f GiB of tensor-parallel and %.2f GiB of pipeline activations.\n"
              "It holds %.2f GiB more than the least-memory configuration, which still leaves %.2f GiB free.\n\n",
              static_cast<unsigned long long>(r.feasible), gib(v.data_parallel.value), gib(v.tensor_parallel.value),
              gib(v.pipeline.value), gib(chosen::plan::peak.value - smallest::plan::peak.value),
              gib(chosen::plan::result.headroom().value));
  std::printf("%s", m::breakdown_table(chosen::plan::result, chosen::plan::device).c_str());
  return 0;
}
