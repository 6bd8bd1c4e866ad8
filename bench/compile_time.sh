#!/usr/bin/env bash
# SPDX-License-Identifier: BSL-1.0
# Median wall-clock compile time (-c -O0 to an object) of each source, g++ and nvcc, N runs each.
#   bench/compile_time.sh [N] [sources...]     (default: 5 runs of bench/compile_*.cpp)
# Prints one Markdown table row per source: name | g++ median ms | nvcc median ms.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-5}
shift || true
sources=("$@")
((${#sources[@]})) || sources=(bench/compile_*.cpp)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
time_ms() {  # command... → elapsed milliseconds
  local t0 t1
  t0=$(date +%s%N); "$@" >/dev/null 2>&1 || { echo "compile failed: $*" >&2; exit 1; }; t1=$(date +%s%N)
  echo $(((t1 - t0) / 1000000))
}
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
for src in "${sources[@]}"; do
  gxx=$(for _ in $(seq "$n"); do time_ms g++ -std=c++20 -O0 -Iinclude -c "$src" -o "$tmp/o.o"; done | median)
  if [[ -x $nvcc ]]; then
    cp "$src" "$tmp/src.cu"
    nv=$(for _ in $(seq "$n"); do time_ms "$nvcc" -std=c++20 -O0 -Iinclude -c "$tmp/src.cu" -o "$tmp/o.o"; done | median)
  else
    nv="n/a"
  fi
  echo "| $(basename "$src") | $gxx | $nv |"
done
