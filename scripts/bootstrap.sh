#!/usr/bin/env bash
# Create (or update) the project virtualenv at $HEALTHD_VENV (default: .venv) with healthd, its
# `probes` extra (torch: the local backend runs the probes on this machine) and their dependencies.
# torch is pinned to a CPU build and installed first, so that the extra's `torch>=2.1` cannot pull
# a multi-GB CUDA build; set HEALTHD_TORCH to choose another spec (e.g. "torch==2.13.0").
# Usage: scripts/bootstrap.sh [dev]   ("dev" adds the test and lint tools)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${HEALTHD_VENV:-.venv}
torch_spec=${HEALTHD_TORCH:-torch==2.13.0}
python=${PYTHON:-python3}

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "healthd needs Python 3.11 or newer; $python is $("$python" -V 2>&1)" >&2
  exit 2
fi
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
stamp="$venv/.healthd-deps"
want="$(cat pyproject.toml; echo "$torch_spec ${1:-}")"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  "${pip[@]}" "$torch_spec"
  if [ "${1:-}" = dev ]; then
    "${pip[@]}" -e ".[dev]"
  else
    "${pip[@]}" -e ".[probes]"
  fi
  printf '%s' "$want" > "$stamp"
fi
