#!/usr/bin/env bash
# One device session's GPU checks (issue 26), in one call of the device tool:
#   ../shared/tools/device-wheels.sh      # here, once: the daemon's wheels in .whl/
#   run(command="bash bench/gpu_session.sh", carry=[".whl"], timeout_s=560)
# Everything lands in $OUT as it is produced (a run cut short still returns what it had):
# the card, the lost-GPU and wrong-UUID documents, bench/gpu_check.py (JSON + table),
# bench/probe_check.py, the local backend's discovery of the node's GPUs.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-session}
. bench/device_env.sh
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-540} - ($(date +%s) - start) )); }

{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv
  $PY -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'
} > "$OUT/card.txt" 2>&1
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
# a GPU node whose GPU is gone, and one whose GPU is not the one it had: fail documents, no figure
CUDA_VISIBLE_DEVICES= timeout 120 $PY -m probes gemm --expect-gpus 1 --expect-gpu-uuids "$uuid" \
  --timeout 100 > "$OUT/lost-gpu.json" 2> "$OUT/lost-gpu.err"
timeout 120 $PY -m probes env --expect-gpus 1 --expect-gpu-uuids GPU-00000000-0000-0000-0000-000000000000 \
  --timeout 100 > "$OUT/wrong-uuid.json" 2> "$OUT/wrong-uuid.err"
$PY -c 'from healthd.cluster.local import discover_gpus; print(discover_gpus())' > "$OUT/discovery.txt" 2>&1
timeout $(( $(left) - 150 )) $PY bench/gpu_check.py --rounds 3 --json > "$OUT/gpu_check.json" 2> "$OUT/gpu_check.log"
echo "gpu_check exit $?" >> "$OUT/gpu_check.log"
$PY -c 'import json,sys; sys.path.insert(0,"bench"); import gpu_check; print(gpu_check.render(json.load(open(sys.argv[1]))))' \
  "$OUT/gpu_check.json" > "$OUT/gpu_check.txt" 2>&1
[ "$(left)" -gt 60 ] && timeout $(( $(left) - 10 )) $PY bench/probe_check.py --repeat 2 > "$OUT/probe_check.txt" 2>&1
echo "probe_check exit $?" >> "$OUT/probe_check.txt"
echo "done in $(( $(date +%s) - start )) s"
