#!/usr/bin/env bash
# SPDX-License-Identifier: BSL-1.0
# The whole test suite: set up, build (with the CUDA backend when nvcc is present), run every test
# with ctest; then build the host code again with AddressSanitizer and UndefinedBehaviorSanitizer
# and run the CPU tests (host, examples, MPI) under them. GPU tests report themselves as skipped
# on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build=${BUILD_DIR:-build}
jobs=$(nproc 2>/dev/null || echo 2)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

status=0
ctest --test-dir "$build" --output-on-failure -j "$jobs" || status=1
# What the compile-time budget measured on this machine (ctest prints a passing test's output only
# with -V; bench/RESULTS.md has the reference figures).
grep -h "ms (budget" "$build/Testing/Temporary/LastTest.log" 2>/dev/null || true

echo
echo "== sanitizers: AddressSanitizer + UndefinedBehaviorSanitizer build of the CPU code"
asan=${ASAN_BUILD_DIR:-build-asan}
san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
# (No fuzz targets: their short runs are the first pass's, built with clang's own sanitizers.)
# -O1 -g1 (line tables: what the sanitizers' reports need) halves the compile time of the
# template-heavy tests against -O2 -g.
cmake -S . -B "$asan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DMEMALG_WITH_CUDA=OFF \
  -DMEMALG_BUILD_BENCH=OFF -DMEMALG_COMPILE_CHECKS=OFF -DMEMALG_BUILD_FUZZ=OFF \
  -DMEMALG_SPEECH_DATA_DIR="$(cd "$build" && pwd)/data/speech" \
  -DCMAKE_CXX_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="$san" >/dev/null
cmake --build "$asan" -j "$jobs"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir "$asan" --output-on-failure -j "$jobs" -L '^host$' -LE '^example$' || status=1
# Programs linked with Open MPI (the training binary, the MPI tests) are reported for Open MPI's
# own allocations at exit, so they run without the leak check; memalg's code is leak-checked above.
# The MPI tests that train each plan twice, on the mesh and on one rank, to compare the losses
# (pipeline, program_tp, program_vs_one_rank) run in the first pass only: under the sanitizers they
# take minutes, and the same program builder and backend code runs sanitized here through the
# named multi-rank plans (mpi.train_gpt_cpu.pp2, pp2-dp2, tp2-sp, tp2-sp-dropout, llama-bf16-dp2).
# Of the speech runs, seed-b16-shard4 and the refused seed-b64 run sanitized (the same program
# builder, backend and data path as the others, which the first pass runs); the dataset is the
# first pass's.
ASAN_OPTIONS=detect_leaks=0 ctest --test-dir "$asan" --output-on-failure -j "$jobs" -L '^(example|mpi)$' \
  -E '^mpi\.(pipeline|program_tp|program_vs_one_rank)\.|^mpi\.train_speech_cpu\.(seed-bf16|seed-b16-accum4|accum_equals_b64|lr_x10|data_x10)$' \
  || status=1
exit $status
