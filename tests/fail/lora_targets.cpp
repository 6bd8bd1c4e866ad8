// SPDX-License-Identifier: BSL-1.0
// expect: Targets is a non-empty set of lora_target bits
#include <memalg/memalg.hpp>
using namespace memalg;
// LoRA on no projection at all: nothing would train.
using adapted = model::lora<16, presets::llama3_8b, 0>;
constexpr auto trainable = adapted::value.trainable_parameters();
int main() { return static_cast<int>(trainable); }
