// SPDX-License-Identifier: BSL-1.0
// expect: the serving plan does not fit in device memory
// expect: need_bytes<
// expect: limit_bytes<25769803776
// Llama 3 8B in bf16 on a 24 GB card: 15 GiB of weights, and 16 sequences of 4096 tokens need
// 8 GiB of keys and values more.
#include <memalg/memalg.hpp>
using namespace memalg;
using p = serving_plan<presets::llama3_8b, serving::request<serving::batch<16>, serving::prompt<4096>>, device::rtx3090>;
static_assert(require_fits<p>());
int main() {}
