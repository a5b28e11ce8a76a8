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
  # Debian's python3 has no venv module until python3-venv is installed (a fresh Debian 12 machine).
  if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "bootstrap: $python has no venv module; installing Debian's python3-venv" >&2
      scripts/install-debian-deps.sh venv
    else
      echo "bootstrap: error: $python has no venv module; install Debian's python3-venv (as root: scripts/install-debian-deps.sh venv)" >&2
      exit 2
    fi
  fi
  "$python" -m venv "$venv" || { echo "bootstrap: error: '$python -m venv $venv' failed" >&2; exit 1; }
fi
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
stamp="$venv/.healthd-deps"
want="$(cat pyproject.toml; echo "$torch_spec ${1:-}")"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  extra=probes
  [ "${1:-}" = dev ] && extra=dev
  "${pip[@]}" "$torch_spec" || { echo "bootstrap: error: pip could not install $torch_spec (above)" >&2; exit 1; }
  "${pip[@]}" -e ".[$extra]" || { echo "bootstrap: error: pip could not install healthd[$extra] (above)" >&2; exit 1; }
  printf '%s' "$want" > "$stamp"
fi
