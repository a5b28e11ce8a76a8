#!/usr/bin/env bash
# The pipeline probe (issue 30) on whatever GPUs the device has, in one call of the device tool:
#   ../shared/tools/device-wheels.sh      # here, once (only pydantic is needed besides torch)
#   run(command="bash bench/gpu_pipeline_session.sh", carry=[".whl"], timeout_s=560)
# Everything lands in $OUT as it is produced (a run cut short still returns what it had): the card,
# then per run one JSON document and its table. With 2 GPUs or more: the pipeline on every GPU (GPipe and
# 1F1B; NCCL; per-link send/recv; the GPU-pair P2P matrix on local rank 0). With one: the one-rank run is
# `skipped` (no pipeline, no GPU pair), and the CPU runs below still give the gloo figures of this host.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-pipeline-session}
. bench/device_env.sh
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-540} - ($(date +%s) - start) )); }

{ nvidia-smi -L; nvidia-smi topo -m
  nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv
  $PY -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.device_count(), torch.cuda.get_device_name(0))'
} > "$OUT/card.txt" 2>&1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')

probe() {  # probe NAME TIMEOUT ARGS...: one standalone run, its JSON and its table
  local name=$1 limit=$2; shift 2
  [ "$(left)" -gt $(( limit + 10 )) ] || { echo "$name: no time left" >> "$OUT/skipped.txt"; return; }
  timeout $(( limit + 10 )) $PY -m probes pipeline --timeout "$limit" "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "$name exit $?" >> "$OUT/exits.txt"
  $PY -c 'import sys; from probes.pipeline import format_table; from probes.result import ProbeResult
print(format_table(ProbeResult.model_validate_json(open(sys.argv[1]).read())))' "$OUT/$name.json" \
    > "$OUT/$name.txt" 2>&1
}

if [ "$gpus" -ge 2 ]; then
  probe gpu-gpipe 240 --nproc "$gpus"
  probe gpu-1f1b 180 --nproc "$gpus" --schedule 1f1b --no-p2p
else
  probe gpu-one 120 --nproc 1
fi
probe cpu-2 120 --device cpu --nproc 2
probe cpu-4 120 --device cpu --nproc 4
echo "done in $(( $(date +%s) - start )) s"
