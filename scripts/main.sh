#!/usr/bin/env bash
# SPDX-License-Identifier: BSL-1.0
# The main job: set up, build, then show what memalg does — compile-time-checked plans (the
# examples), the command-line planner, and a short run of the CPU reference trainer.
set -euo pipefail
cd "$(dirname "$0")/.."
# Only what this job runs, all CPU code, and the first answer first: the tool and the model-state
# example, then the speech example and the CPU trainer (the test command builds everything, the
# CUDA backend included).
BUILD_TARGETS="memalg_tool model_states" scripts/setup.sh
build=${BUILD_DIR:-build}
jobs=$(nproc 2>/dev/null || echo 2)

echo; echo "== examples/model_states: a 7.5B model on 64 x A100 80 GB (checked at compile time)"
"$build"/examples/model_states

echo; echo "== memalg plan: Llama-2-7B-sized model states, Megatron's bf16 layout (mixed-bf16-fp32-grads) AdamW, 8 x A100 80 GB, ZeRO-1"
"$build"/tools/memalg plan --params 7B --precision mixed-bf16-fp32-grads --optimizer adamw --dp 8 --zero 1 --device a100-80gb

echo; echo "== building the speech example and the CPU trainer"
cmake --build "$build" -j "$jobs" --target speech_tts train_gpt_cpu

echo; echo "== examples/speech_tts"
"$build"/examples/speech_tts

echo; echo "== examples/train_gpt_cpu: a small GPT trained byte-level on the GPL-3 text (short run)"
"$build"/examples/train_gpt_cpu --plan tiny-fp32 --steps 20
