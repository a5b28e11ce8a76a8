#!/usr/bin/env bash
# The job-boundary node check on a real GPU node (issue 28), one call of the device tool:
#   run(command="bash bench/gpu_boundary_session.sh", carry=[".whl"], timeout_s=200)
# Each context three times as slurmd would start it (a fresh process, wall time from outside), with
# the node's GPUs expected; then an epilog that expects one GPU more than the node has (the lost-GPU
# case as the check sees it: nvidia-smi lists fewer).
# $OUT/boundary.txt: wall times and outcomes; $OUT/docs.jsonl: every document.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-boundary}
. bench/device_env.sh
n=$(nvidia-smi -L | grep -c '^GPU')
uuids=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | paste -sd,)
run() {  # label, args...
  local label=$1; shift
  local t0 t1 doc
  t0=$(date +%s%N)
  doc=$($PY -m probes.boundary --stdout "$@" 2>>"$OUT/stderr.txt"); rc=$?
  t1=$(date +%s%N)
  echo "$doc" >> "$OUT/docs.jsonl"
  printf '%s exit %s wall %.2f s: %s\n' "$label" "$rc" "$(( (t1 - t0) / 1000000 ))e-3" \
    "$(echo "$doc" | $PY -c 'import json,sys; d=json.loads(sys.stdin.read()); p=d["params"]; print(d["outcome"], "elapsed", p.get("elapsed_s"), "budget", p.get("budget_s"), "skipped", list(p.get("skipped", {})), "errors", p.get("errors"), "|", d["reason"][:160], "|", [(m["name"], m["labels"], round(m["value"]/1e12, 1) if "flop" in m["name"] else m["value"]) for m in d["measurements"]][:6])' 2>&1)" \
    >> "$OUT/boundary.txt"
}
for i in 1 2 3; do
  for ctx in prolog epilog health; do
    run "$ctx#$i" --context "$ctx" --expect-gpus "$n" --expect-gpu-uuids "$uuids"
  done
done
run "epilog-one-gpu-more" --context epilog --expect-gpus $((n + 1))
cat "$OUT/boundary.txt"
