# Sourced by the bench/gpu_*session.sh scripts (one device-tool call each): $OUT made, $PY set, and on
# a lent GPU machine (no package index) the daemon's wheels from .whl/ installed (../shared/tools/device-wheels.sh).
OUT=${OUT:?set OUT before sourcing}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if [ -d .whl ] && ! $PY -c 'import apscheduler' 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
