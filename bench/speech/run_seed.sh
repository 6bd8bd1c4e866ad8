#!/bin/sh
# SPDX-License-Identifier: BSL-1.0
# bench/speech/run_seed.sh — the seed scenario's runs at CPU scale (docs/tutorial-speech.md,
# "The answer, measured"): every plan of train_speech_cpu on 4 MPI ranks, with --json, one line
# per run into bench/speech/seed_runs.jsonl.
#   bench/speech/run_seed.sh [BUILD_DIR] [STEPS]      (defaults: build, 30)
set -eu
build=${1:-build}
steps=${2:-30}
out=$(dirname "$0")/seed_runs.jsonl
bin=$build/examples/train_speech_cpu
data=$build/data/speech
small=$build/data/speech-small
[ -x "$bin" ] || { echo "run_seed.sh: no $bin (build first)" >&2; exit 2; }
[ -f "$data/manifest.json" ] || { echo "run_seed.sh: no dataset in $data (cmake --build $build --target speech_data)" >&2; exit 2; }
[ -f "$small/manifest.json" ] || "$build/tools/make_speech_data" --out "$small" --utterances 30 --no-wav --if-missing
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
run() {
  mpirun -np 4 "$bin" --json --steps "$steps" "$@" | grep '^{"plan"' >> "$out"
}
: > "$out"
for plan in seed-b16-shard4 seed-b16-accum4 seed-bf16 seed-b64-large exact-b64 exact-b16-accum4; do
  run --plan "$plan" --data "$data" --validate-every 10
done
run --plan seed-b16-shard4 --data "$data" --lr 0.03 --validate-every 10
run --plan seed-b16-shard4 --data "$small" --validate-every 10
# The seed itself: refused before anything is allocated (status 3), its numbers on stderr.
mpirun -np 4 "$bin" --plan seed-b64 --data "$data" 2> "$(dirname "$0")/seed_b64_refusal.txt" && exit 1 || true
echo "wrote $out"
