#!/usr/bin/env bash
# SPDX-License-Identifier: BSL-1.0
# Time of the main job on a fresh clone: seconds from start to its first result (the first line
# of the model-state example's output after its `==` heading) and to its end, N runs, medians.
#   bench/first_run.sh [N] [COMMIT]     (default: 3 runs of HEAD)
# Each run clones the repository into a scratch directory, so nothing is built beforehand.
set -euo pipefail
n=${1:-3}
commit=${2:-HEAD}
repo=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
median() { sort -n | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
firsts=() totals=()
for i in $(seq "$n"); do
  rm -rf "$tmp/clone"
  git clone -q "$repo" "$tmp/clone"
  git -C "$tmp/clone" checkout -q "$commit"
  start=$(date +%s.%N)
  first=""
  while IFS= read -r line; do
    now=$(date +%s.%N)
    if [[ -z $first && $line == "== examples/model_states"* ]]; then seen=1; fi
    if [[ -z $first && ${seen:-0} == 1 && $line != "=="* && -n $line ]]; then
      first=$(echo "$now - $start" | bc)
    fi
  done < <(cd "$tmp/clone" && bash scripts/main.sh 2>&1)
  total=$(echo "$(date +%s.%N) - $start" | bc)
  unset seen
  printf 'run %d: first result %.1f s, done %.1f s\n' "$i" "$first" "$total"
  firsts+=("$first") totals+=("$total")
done
printf 'median of %d (%s): first result %.1f s, done %.1f s\n' "$n" "$(git -C "$repo" rev-parse --short "$commit")" \
  "$(printf '%s\n' "${firsts[@]}" | median)" "$(printf '%s\n' "${totals[@]}" | median)"
