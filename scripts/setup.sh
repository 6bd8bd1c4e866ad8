#!/usr/bin/env bash
# SPDX-License-Identifier: BSL-1.0
# Set-up shared by the two README commands: install the Debian packages memalg needs (when run as
# root and something is missing), configure and build. Idempotent; a second run only rebuilds.
#   BUILD_DIR    build directory (default: build)
#   MEMALG_CUDA  ON/OFF to force the CUDA backend (default: on when nvcc is found)
#   BUILD_TARGETS  space-separated targets to build (default: all)
#   MEMALG_SPEECH_DATA  OFF to skip generating the speech dataset (build/data/speech, docs/speech-data.md)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ cmake ninja-build libboost-dev doctest-dev nlohmann-json3-dev libcli11-dev libfmt-dev
          libopenmpi-dev openmpi-bin clang libclang-rt-14-dev dpkg-dev espeak-ng libkissfft-dev librsvg2-bin)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -eq 0 ]]; then
    echo "setup: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "setup: missing Debian packages: ${missing[*]} (run as root, or: sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
fi

build=${BUILD_DIR:-build}
cuda_flag=()
if [[ -n ${MEMALG_CUDA:-} ]]; then
  cuda_flag=(-DMEMALG_WITH_CUDA="$MEMALG_CUDA")
fi
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_flag[@]}" "$@"
targets=()
for t in ${BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j "$jobs" "${targets[@]}"
# The speech dataset, generated into the build tree when it is missing (a few seconds; the
# generator keeps a dataset made with the same options).
if [[ ${MEMALG_SPEECH_DATA:-ON} != OFF ]] && ninja -C "$build" -t targets all 2>/dev/null | grep -q '^speech_data:'; then
  cmake --build "$build" --target speech_data
fi
