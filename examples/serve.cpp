// SPDX-License-Identifier: BSL-1.0
// examples/serve.cpp — how many users fit on one H100 with Llama 3 8B? Serving plans checked at
// compile time (plan/serve.hpp; docs/serving.md), the same plans as
//
//   memalg serve --preset llama3-8b --device h100-80gb --prompt 2048 --new-tokens 512 \
//                --batch B [--weights awq-int4] [--cache static|paged]
//
// Hugging Face's generate holds the bf16 weights (15 GiB), a key/value cache of 128 KiB per token
// and sequence, and the prefill's transients; AWQ's int4 weights leave about 10 GiB more for the
// cache. vLLM's paged cache takes 90 % of the card and says how many sequences share it.
#include <memalg/memalg.hpp>

#include <cstdio>

namespace m = memalg;
namespace s = memalg::serving;

using llama3 = m::presets::llama3_8b;
template <std::uint64_t Batch, class... More>
using users = m::serving_plan<llama3, s::request<s::batch<Batch>, s::prompt<2048>, s::new_tokens<512>, More...>,
                              m::device::h100_80gb>;

static_assert(m::require_fits<users<100>>(), "100 sequences of 2048 + 512 tokens fit in bf16");
static_assert(!users<200>::fits, "200 do not: their cache alone is 62 GiB");
static_assert(m::require_fits<users<150, s::weights<m::model::dt::int4_g128>>>(), "int4 weights make room for 150");
static_assert(users<1, s::paged_cache<>>::result.concurrent_sequences > 150, "vLLM's blocks hold more than 150 at once");

namespace {
template <class Plan>
void row(const char* name) {
  std::printf("  %-34s %8.2f GiB in %-7s %s\n", name, static_cast<double>(Plan::peak.value) / (1 << 30),
              m::serve_phase_name(Plan::result.peak_phase).data(), Plan::fits ? "fits" : "does not fit");
}
}  // namespace

int main() {
  std::printf("Llama 3 8B on an H100 80 GB, 2048 prompt + 512 new tokens per sequence:\n");
  row<users<100>>("bf16, batch 100");
  row<users<200>>("bf16, batch 200");
  row<users<150, s::weights<m::model::dt::int4_g128>>>("int4 (AWQ, group 128), batch 150");
  std::printf("  vLLM, bf16: %llu blocks of 16 tokens, %llu sequences at once\n",
              static_cast<unsigned long long>(users<1, s::paged_cache<>>::result.blocks),
              static_cast<unsigned long long>(users<1, s::paged_cache<>>::result.concurrent_sequences));
  return 0;
}
