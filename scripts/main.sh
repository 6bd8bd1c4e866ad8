#!/usr/bin/env bash
# SPDX-License-Identifier: BSL-1.0
# The main job: set up, build, then show what memalg does — compile-time-checked plans (the
# examples), the command-line planner, and a short run of the CPU reference trainer.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build=${BUILD_DIR:-build}

echo; echo "== examples/model_states: a 7.5B model on 64 x A100 80 GB (checked at compile time)"
"$build"/examples/model_states
for ex in speech_tts; do
  if [[ -x "$build/examples/$ex" ]]; then
    echo; echo "== examples/$ex"
    "$build/examples/$ex"
  fi
done

echo; echo "== memalg plan: Llama-2-7B-sized model states, amp-bf16 AdamW, 8 x A100 80 GB, ZeRO-1"
"$build"/tools/memalg plan --params 7B --precision amp-bf16 --optimizer adamw --dp 8 --zero 1 --device a100-80gb

if [[ -x "$build/examples/train_gpt_cpu" ]]; then
  echo; echo "== examples/train_gpt_cpu: a small GPT trained byte-level on the GPL-3 text (short run)"
  "$build"/examples/train_gpt_cpu --plan tiny-fp32 --steps 20
fi
