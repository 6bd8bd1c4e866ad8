#!/usr/bin/env bash
# SPDX-License-Identifier: BSL-1.0
# Regenerates bench/torch/measured.json and bench/torch/configs/ (the whole CPU matrix).
#
#   bench/torch/run.sh                 # = measure.py --all
#   bench/torch/run.sh --cases 'llama*' --out llama.json
#
# The virtual environment lives outside the repository: $MEMALG_TORCH_VENV, by default
# ${XDG_CACHE_HOME:-~/.cache}/memalg/venv-torch. It is created, with the pinned versions of
# requirements.txt, when missing or when its versions differ.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${MEMALG_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/memalg/venv-torch}"
python="${PYTHON:-python3}"

pinned() {
  "$venv/bin/python" - "$here/requirements.txt" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, want = line.split("==")
        if version(name).split("+")[0] != want:
            sys.exit(1)
PY
}

if [ ! -x "$venv/bin/python" ]; then
  echo "creating $venv" >&2
  "$python" -m venv "$venv"
fi
if ! pinned; then
  "$venv/bin/pip" install -r "$here/requirements.txt"
fi
cd "$repo"
if [ $# -eq 0 ]; then
  set -- --all
fi
exec "$venv/bin/python" bench/torch/measure.py "$@"
