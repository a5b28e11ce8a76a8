#!/usr/bin/env bash
# The daemon on a real GPU node, local backend (issue 26): a healthy round, then the same node with
# its GPUs hidden from the probes (CUDA_VISIBLE_DEVICES=""), in one call of the device tool:
#   run(command="bash bench/gpu_daemon_session.sh", carry=[".whl"], timeout_s=360)
# $OUT gets /metrics, /api/v1/runs, /api/v1/nodes and /api/v1/recommendations of each phase and
# the daemon's log. The second phase must give fail/gpus_missing and a drain recommendation.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-daemon}
. bench/device_env.sh
STATE=$(mktemp -d)
PORT=9477
cat > "$STATE/healthd.toml" <<TOML
backend = "local"
state_dir = "$STATE/state"
[http]
host = "127.0.0.1"
port = $PORT
[scheduler]
discover_interval_s = 2
plan_interval_s = 1
collect_interval_s = 0.5
[local]
node_name = "gpunode"
python = "$(command -v $PY)"
[probes.gemm]
interval_s = 20
[probes.nccl]
interval_s = 20
[probes.ddp]
interval_s = 20
[logging]
format = "json"
TOML
get() { $PY -c 'import sys,urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' \
  "http://127.0.0.1:$PORT$1"; }
phase() {  # name, seconds, endpoint, python predicate on its document (d)
  local name=$1 wait_s=$2 endpoint=$3 pred=$4 t0
  t0=$(date +%s)
  $PY -c 'from healthd.cli import main; main()' run --config "$STATE/healthd.toml" > "$OUT/$name.log" 2>&1 &
  local pid=$!
  while [ $(( $(date +%s) - t0 )) -lt "$wait_s" ]; do
    sleep 3
    get "$endpoint" > "$OUT/$name-poll.json" 2>/dev/null || continue
    $PY -c "import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if ($pred) else 1)" \
      "$OUT/$name-poll.json" && break
  done
  sleep 2
  get /metrics > "$OUT/$name-metrics.txt"; get /api/v1/nodes > "$OUT/$name-nodes.json"
  get /api/v1/recommendations > "$OUT/$name-recommendations.json"; get /api/v1/runs > "$OUT/$name-runs.json"
  kill -TERM $pid; wait $pid
  echo "$name: $(( $(date +%s) - t0 )) s, daemon exit $?"
}
phase healthy 150 /api/v1/runs \
  '{r["probe"] for r in d["runs"] if r["outcome"] in ("pass","degraded","fail","skipped")} >= {"gemm","nccl","ddp"}'
CUDA_VISIBLE_DEVICES= phase hidden 150 /api/v1/recommendations 'bool(d.get("recommendations"))'
