#!/usr/bin/env bash
# SPDX-License-Identifier: BSL-1.0
# The whole test suite: set up and build (with the CUDA backend when nvcc is present), then run
# every test with ctest. The test executables are built at -Og and, on the host, with
# AddressSanitizer and UndefinedBehaviorSanitizer's value checks (MEMALG_TEST_SANITIZE,
# cmake/memalg_testing.cmake); the library, the tool and the examples are built as users get them.
# GPU tests report themselves as skipped on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh -DMEMALG_TEST_SANITIZE=ON
build=${BUILD_DIR:-build}
jobs=$(nproc 2>/dev/null || echo 2)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

status=0
ctest --test-dir "$build" --output-on-failure -j "$jobs" || status=1
# What the compile-time budget measured on this machine (ctest prints a passing test's output only
# with -V; bench/RESULTS.md has the reference figures).
grep -h "ms (budget" "$build/Testing/Temporary/LastTest.log" 2>/dev/null || true
exit $status
