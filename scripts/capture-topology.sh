#!/usr/bin/env bash
# Capture `scontrol show topology` of the running test cluster as golden files for healthd's parser:
# tests/fixtures/slurm/<release>/topology.<kind>.txt (+ .stderr when scontrol wrote any), where kind is
# the cluster's HEALTHD_SLURM_TOPOLOGY (tree, block, yaml, none). With `yaml` (25.05+) also the other
# named topology (`scontrol show topology blocks`), `scontrol show topoconf` and an unknown name.
#
#   eval "$(scripts/slurm-test-cluster.sh env)" && scripts/capture-topology.sh
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
kind=${HEALTHD_SLURM_TOPOLOGY:-tree}
version=$(scontrol --version)
[[ $version =~ ([0-9]+)\.([0-9]+)\. ]] || { echo "capture-topology: unexpected '$version'" >&2; exit 1; }
out=$REPO/tests/fixtures/slurm/${BASH_REMATCH[1]}.${BASH_REMATCH[2]}
mkdir -p "$out"
capture() {  # capture NAME ARGV...
    local name=$1 rc=0
    shift
    timeout 30 "$@" >"$out/$name" 2>"$out/$name.stderr" || rc=$?
    [[ -s $out/$name.stderr ]] || rm -f "$out/$name.stderr"
    printf 'capture-topology: %s (%s, exit %d): %s\n' "$out/$name" "$version" "$rc" "$*" >&2
}
capture "topology.$kind.txt" scontrol show topology
if [[ $kind == yaml ]]; then
    capture topology.yaml-blocks.txt scontrol show topology blocks
    capture topology.yaml-topoconf.txt scontrol show topoconf
    capture topology.yaml-nosuch.txt scontrol show topology nosuch
fi
