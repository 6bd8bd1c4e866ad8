#!/usr/bin/env bash
# SPDX-License-Identifier: BSL-1.0
# Fails, naming each file, when a C++, CUDA, CMake, shell or Python source of the project lacks
# the line `SPDX-License-Identifier: BSL-1.0` among its first three lines. Data (JSON, corpora,
# text) carries no such line and is not checked.
#   scripts/check_spdx.sh [SOURCE_DIR]
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  list() { git ls-files --cached --others --exclude-standard; }
else  # an unpacked source archive: every file outside build trees
  list() { find . -type f -not -path './build*' -not -path './.git/*' | sed 's|^\./||'; }
fi
missing=0 checked=0
while IFS= read -r f; do
  case "$f" in
    *.hpp|*.cpp|*.cuh|*.cu|*.h|*.cc|*.cmake|*.cmake.in|*CMakeLists.txt|*.sh|*.py|.ci/run) ;;
    *) continue ;;
  esac
  [[ -f "$f" ]] || continue
  checked=$((checked + 1))
  if ! head -n 3 "$f" | grep -q 'SPDX-License-Identifier: BSL-1\.0'; then
    echo "missing SPDX-License-Identifier: BSL-1.0: $f"
    missing=$((missing + 1))
  fi
done < <(list)
if ((checked == 0)); then
  echo "check_spdx: no source file found" >&2
  exit 1
fi
echo "check_spdx: $checked source files, $missing without the license line"
((missing == 0))
