#!/usr/bin/env bash
# Install healthd into .venv and run the daemon in the foreground.
# With no config file and no Slurm answering, it probes this machine (local backend),
# keeps state under ~/.local/state/healthd and serves metrics on http://0.0.0.0:9469/metrics.
# Any arguments are passed to `healthd run` (e.g. --config healthd.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec "${HEALTHD_VENV:-.venv}/bin/healthd" run "$@"
