// SPDX-License-Identifier: BSL-1.0
// expect: the most loaded rank does not fit in device memory
// expect: need_bytes<52915216
// expect: limit_bytes<37748736
// expect: activations<49594368
// The seed scenario at CPU scale (examples/speech_seed_plans.hpp): the speech model with 64
// utterances of 64 mel frames per rank on 4 data-parallel ranks of the scaled 36 MiB device does
// not fit — 50.5 MiB at its peak, of which 47.3 MiB are saved activations. The build stops and
// prints the numbers; train_speech_cpu refuses the same plan (seed-b64) at run time.
#include "../../examples/speech_seed_plans.hpp"
static_assert(memalg::require_fits<speech_seed::b64>());
int main() {}
