#!/bin/bash
# RebootProgram of the lab Slurm cluster (scripts/slurm-test-cluster.sh, HEALTHD_SLURM_REBOOT_PROGRAM):
# "reboots" the node whose slurmd runs it by restarting that slurmd with -b, which makes it report a
# reboot to slurmctld (slurmd(8): "-b Report node rebooted when daemon restarted. Used for testing
# purposes."), as if the machine had booted again. The multiple-slurmd cluster runs one `slurmd -N NODE`
# per node, so the node is the -N of the slurmd above this process. HEALTHD_SLURM_REBOOT_DELAY (seconds,
# default 2) is how long the node stays "off".
set -u
pid=$PPID node="" conf="" exe=""
while ((pid > 1)); do
    args=()
    mapfile -d '' args <"/proc/$pid/cmdline" 2>/dev/null || break
    if [[ ${args[0]:-} == *slurmd ]]; then
        exe=${args[0]}
        for ((i = 1; i < ${#args[@]}; i++)); do
            case ${args[i]} in
                -N) node=${args[i + 1]:-} ;;
                -f) conf=${args[i + 1]:-} ;;
            esac
        done
        break
    fi
    pid=$(awk '{print $4}' "/proc/$pid/stat" 2>/dev/null) || break
done
if [[ -z $node || -z $conf ]]; then
    logger -t slurm-test-reboot "no 'slurmd -N NODE -f CONF' above pid $$; not rebooting" 2>/dev/null
    echo "slurm-test-reboot: no 'slurmd -N NODE -f CONF' above pid $$" >&2
    exit 1
fi
[[ $exe == /* ]] || exe=$(command -v slurmd)
delay=${HEALTHD_SLURM_REBOOT_DELAY:-2}
# detached: the slurmd that runs this script is the one stopped
setsid bash -c '
    pid=$1 exe=$2 conf=$3 node=$4 delay=$5
    kill -TERM "$pid" 2>/dev/null
    for ((i = 0; i < 300; i++)); do [[ -e /proc/$pid ]] || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
    sleep "$delay"
    exec "$exe" -b -f "$conf" -N "$node"
' slurm-test-reboot "$pid" "$exe" "$conf" "$node" "$delay" </dev/null >/dev/null 2>&1 &
# 26.05's slurmd kills this script's process group once it exits: wait until the restarter is in a
# session of its own (setsid done) before exiting
child=$!
for ((i = 0; i < 50; i++)); do
    sid=$(awk '{print $6}' "/proc/$child/stat" 2>/dev/null) || break
    [[ $sid == "$child" ]] && break
    sleep 0.1
done
exit 0
