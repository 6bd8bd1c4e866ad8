// SPDX-License-Identifier: BSL-1.0
// expect: the most loaded rank does not fit in device memory
// expect: need_bytes<117737846736
// expect: limit_bytes<85899345920
// expect: activations<109183631360
// The speech-synthesis model of examples/speech_tts.cpp with 64 utterances of 1024 mel frames per
// GPU (fp32, Adam, 4 data-parallel A100 80 GB that do not shard the data, trained with PyTorch):
// 118 GB at the peak of backward, of which 102 GiB are saved activations — the build stops and
// prints the numbers.
#include <memalg/memalg.hpp>
using namespace memalg;
using p = plan<presets::speech_tts_500m<256>,
               train::recipe<precision::fp32, optim::adam<>, train::batch<64, 1024>>,
               parallel::mesh<parallel::data<4>>, device::a100_80gb>;
static_assert(require_fits<p>());
int main() {}
