#!/usr/bin/env bash
# The whole test suite: set up, build (with the CUDA backend when nvcc is present), run every test
# with ctest. GPU tests report themselves as skipped on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build=${BUILD_DIR:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir "$build" --output-on-failure -j "$(nproc 2>/dev/null || echo 2)"
