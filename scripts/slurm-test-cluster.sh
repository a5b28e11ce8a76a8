#!/usr/bin/env bash
# A real five-node Slurm cluster on this one machine, for healthd's integration tests and CI.
#
#   scripts/slurm-test-cluster.sh start    install (root, when missing), configure, start, wait until all nodes answer
#   scripts/slurm-test-cluster.sh stop     stop every daemon this script started (pid files); idempotent
#   scripts/slurm-test-cluster.sh status   sinfo of the cluster
#   scripts/slurm-test-cluster.sh env      shell lines for `eval "$(scripts/slurm-test-cluster.sh env)"`
#   scripts/slurm-test-cluster.sh build    only build (or check) the chroot of HEALTHD_SLURM_RELEASE
#   scripts/slurm-test-cluster.sh hosts    only add the node names to /etc/hosts (HEALTHD_SLURM_HOSTS_FILE: another file)
#
# One munged with its own key and socket, one slurmctld, and one `slurmd -N nodeX` per node
# (multiple-slurmd build), all on 127.0.0.1, each node with two fake GPUs (gres `gpu:tgpu:2` backed by
# character devices under the cluster directory). Everything lives under $HEALTHD_SLURM_DIR. Node
# names are added to /etc/hosts (one marked line).
#
# Releases (HEALTHD_SLURM_RELEASE, a Debian suite): the host's own suite (bookworm: Slurm 22.05) runs
# the host's packages. Any other suite (trixie: 24.11, sid: 26.05) runs that suite's Slurm from a
# minbase chroot under $HEALTHD_SLURM_CHROOT_DIR/<suite>, built once with mmdebstrap (about 270 MB
# before the excluded docs; kept for later runs, rebuilt with HEALTHD_SLURM_FRESH=1). Root only.
# The daemons and the client commands of a chroot cluster run in a private mount namespace each
# (unshare), so nothing is ever mounted on the host: the chroot sees the host's /dev, /sys, /tmp,
# /etc/hosts, this repository, and the Python installation behind its virtualenv at the same paths,
# so batch scripts, result directories and `python -m probes` work unchanged; jobs run as users of
# the chroot's /etc/passwd (root). Wrappers under $HEALTHD_SLURM_DIR/bin (first in PATH after `env`)
# run the chroot's sinfo, squeue, sbatch... for the host.
#
# Environment: HEALTHD_SLURM_RELEASE (default: the host's suite), HEALTHD_SLURM_DIR (default
# /tmp/healthd-slurm, or /tmp/healthd-slurm-<suite> for a chroot release), HEALTHD_SLURM_NODES
# (default 5: one busy, one drained by someone else, one reserved and two idle, as the live-cluster tests place them), HEALTHD_SLURM_START_TIMEOUT (s, default 60), HEALTHD_SLURM_CTLD_PORT and
# HEALTHD_SLURM_NODE_PORT (controller port and first slurmd port; defaults 16817/17001 for the host's
# suite, 16827/17011 for trixie, 16837/17021 for sid), HEALTHD_SLURM_CHROOT_DIR (default
# /var/cache/healthd-slurm), HEALTHD_SLURM_MIRROR (default http://deb.debian.org/debian),
# HEALTHD_SLURM_FRESH=1 (rebuild the chroot), HEALTHD_SLURM_BINDS (more host paths the chroot must see,
# space-separated), HEALTHD_VENV (the virtualenv whose Python jobs run; default .venv),
# HEALTHD_SLURM_PROLOG, HEALTHD_SLURM_EPILOG, HEALTHD_SLURM_HEALTH_CHECK (opt-in: Prolog=, Epilog=,
# HealthCheckProgram= of slurm.conf, e.g. healthd's node-check wrappers; unset: none) and
# HEALTHD_SLURM_HEALTH_CHECK_INTERVAL (HealthCheckInterval=, default 60),
# HEALTHD_SLURM_REBOOT_PROGRAM (opt-in RebootProgram=, e.g. scripts/slurm-test-reboot.sh: restarts the
# node's own slurmd with -b, so `scontrol reboot` completes as a real reboot would; unset: none),
# HEALTHD_SLURM_OCI_CONF (opt-in: a file installed as oci.conf beside slurm.conf, for srun --container),
# HEALTHD_SLURM_PROLOG_EPILOG_TIMEOUT (seconds: PrologEpilogTimeout= before 25.05, PrologTimeout= and
# EpilogTimeout= from 25.05; unset: Slurm's default), HEALTHD_SLURM_TOPOLOGY
# (the network topology slurmctld is given: `tree` (default; topology/tree with a topology.conf of
# HEALTHD_SLURM_LEAVES leaf switches (default 2) of ceil(nodes / leaves) nodes each in name order,
# leaf1 = node1.., the last one holding the rest, under one spine), `block`
# (23.11+: topology/block, blocks of two nodes (an odd last node in none), BlockSizes=2,4), `yaml` (25.05+: a topology.yaml of two named
# topologies, the tree above as the cluster default and the blocks as `blocks`) or `none`), and
# HEALTHD_SLURM_LEAVES (the tree's leaves, default 2; more for per-switch tests, e.g. 16 nodes in 6 leaves of 3).
# `env` prints all of these for the cluster it describes, so later calls act on the same cluster.

set -Eeuo pipefail
# A command that fails outside a check (set -e) ends the script: say which, so no failure is silent.
trap 'printf "slurm-test-cluster: error: line %s: \`%s\` exited %s\n" "$LINENO" "$BASH_COMMAND" "$?" >&2' ERR

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
HOST_SUITE=$(. /etc/os-release && printf '%s' "${VERSION_CODENAME:-}")
RELEASE=${HEALTHD_SLURM_RELEASE:-$HOST_SUITE}
[[ $RELEASE =~ ^[a-z][a-z0-9-]*$ ]] || { echo "slurm-test-cluster: HEALTHD_SLURM_RELEASE must be a Debian suite (bookworm, trixie, sid), not '$RELEASE'" >&2; exit 2; }
if [[ $RELEASE == "$HOST_SUITE" ]]; then
    NATIVE=1 PORT_OFFSET=0 DEFAULT_DIR=/tmp/healthd-slurm
else
    NATIVE=0 DEFAULT_DIR=/tmp/healthd-slurm-$RELEASE
    case $RELEASE in trixie) PORT_OFFSET=10 ;; sid) PORT_OFFSET=20 ;; *) PORT_OFFSET=30 ;; esac
fi
DIR=${HEALTHD_SLURM_DIR:-$DEFAULT_DIR}
NNODES=${HEALTHD_SLURM_NODES:-5}
START_TIMEOUT=${HEALTHD_SLURM_START_TIMEOUT:-60}
CTLD_PORT=${HEALTHD_SLURM_CTLD_PORT:-$((16817 + PORT_OFFSET))}
NODE_PORT0=${HEALTHD_SLURM_NODE_PORT:-$((17001 + PORT_OFFSET))}
CHROOT_DIR=${HEALTHD_SLURM_CHROOT_DIR:-/var/cache/healthd-slurm}
ROOT=$CHROOT_DIR/$RELEASE
MIRROR=${HEALTHD_SLURM_MIRROR:-http://deb.debian.org/debian}
VENV=${HEALTHD_VENV:-.venv}
[[ $VENV == /* ]] || VENV=$REPO/$VENV
HOSTS_MARK="# healthd-slurm-test-cluster"
HOSTS_FILE=${HEALTHD_SLURM_HOSTS_FILE:-/etc/hosts}  # another file only for tests of `hosts`
# Slurm and munge: on the host for its own suite, --included in the chroot of any other.
mapfile -t PACKAGES < <("$REPO/scripts/install-debian-deps.sh" --list slurm)
((${#PACKAGES[@]})) || { echo "slurm-test-cluster: no slurm packages in scripts/debian-packages.txt" >&2; exit 1; }
# In the chroot: what the virtualenv's Python (built on the host) loads that minbase lacks.
CHROOT_EXTRA=(libffi8 libsqlite3-0)

CONF=$DIR/etc/slurm.conf
MUNGE_SOCKET=$DIR/munge/munge.socket.2
MUNGE_PID=$DIR/munge/munged.pid
CTLD_PID=$DIR/run/slurmctld.pid

log() { printf 'slurm-test-cluster: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

node_names() { local i; for ((i = 1; i <= NNODES; i++)); do printf 'node%d\n' "$i"; done; }

alive() {  # alive PIDFILE -> 0 when the pid in it is a live munged/slurmctld/slurmd (not a recycled pid)
    local pid comm
    [[ -s $1 ]] || return 1
    pid=$(<"$1")
    [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
    [[ $comm == munged || $comm == slurmctld || $comm == slurmd ]]
}

apt_install_host() {  # apt_install_host ROLE...: install the missing host packages of these roles
    # (scripts/debian-packages.txt), serialised with every other install of ours
    "$REPO/scripts/install-debian-deps.sh" "$@" || die "could not install the Debian packages of: $*"
}

# --- the chroot of another Debian suite ---------------------------------------------------------

build_chroot() {
    [[ $(id -u) == 0 ]] || die "a $RELEASE cluster runs Slurm from a chroot: run as root"
    apt_install_host chroot
    mkdir -p "$CHROOT_DIR"
    exec 9>"$CHROOT_DIR/$RELEASE.lock"
    flock 9  # one build at a time; a second start waits for it and uses the result
    if [[ -f $ROOT/.healthd-slurm-ready && ${HEALTHD_SLURM_FRESH:-0} != 1 ]]; then
        exec 9>&-
        return 0
    fi
    local tmp=$ROOT.build t0
    t0=$(date +%s.%N)
    rm -rf "$tmp"
    log "building the $RELEASE chroot in $ROOT (mmdebstrap from $MIRROR)"
    local include
    include=$(IFS=,; printf '%s' "${PACKAGES[*]},${CHROOT_EXTRA[*]}")
    if ! mmdebstrap --variant=minbase --mode=root --include="$include" \
        --aptopt='Acquire::Check-Valid-Until "false"' --aptopt='Acquire::Retries "3"' \
        --dpkgopt=force-unsafe-io \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
        "$RELEASE" "$tmp" "$MIRROR" >"$CHROOT_DIR/$RELEASE.build.log" 2>&1; then
        tail -n 20 "$CHROOT_DIR/$RELEASE.build.log" >&2
        rm -rf "$tmp"
        die "mmdebstrap $RELEASE failed; log in $CHROOT_DIR/$RELEASE.build.log"
    fi
    chroot "$tmp" dpkg-query -W -f='${Version}\n' slurmctld >"$tmp/.healthd-slurm-ready"
    rm -rf "$ROOT"
    mv "$tmp" "$ROOT"
    log "$RELEASE chroot (slurm $(<"$ROOT/.healthd-slurm-ready")) built in $(since "$t0") s, $(du -sh "$ROOT" | cut -f1)"
    exec 9>&-
}

under() {  # under PATH DIR -> 0 when PATH is DIR or inside it
    [[ $1 == "$2" || $1 == "$2"/* ]]
}

# Host paths the chroot sees at the same place, besides /dev, /sys, /tmp and /etc/hosts: this
# repository, the virtualenv (when outside it), the Python installation the virtualenv was made from,
# the cluster directory (when outside /tmp) and HEALTHD_SLURM_BINDS.
bind_paths() {
    local paths=("$REPO") home="" exe prefix p
    under "$VENV" "$REPO" || paths+=("$VENV")
    [[ -f $VENV/pyvenv.cfg ]] && home=$(sed -n 's/^home *= *//p' "$VENV/pyvenv.cfg")
    if [[ -n $home ]]; then
        exe=$(readlink -f "$VENV/bin/python") || exe=""
        prefix=$(cd "$home/.." && pwd -P)
        case $prefix in
            / | /usr | /usr/local)  # a system Python: its executable and standard library only
                [[ -n $exe ]] && paths+=("$exe")
                [[ -n $exe && -d $prefix/lib/$(basename "$exe") ]] && paths+=("$prefix/lib/$(basename "$exe")")
                ;;
            *) paths+=("$prefix") ;;
        esac
    fi
    under "$DIR" /tmp || paths+=("$DIR")
    for p in ${HEALTHD_SLURM_BINDS:-}; do paths+=("$p"); done
    for p in "${paths[@]}"; do
        [[ -e $p ]] && printf '%s\n' "$(readlink -f "$p")"
    done | sort -u
}

write_wrappers() {
    mkdir -p "$DIR/bin"
    local p binds=()
    while read -r p; do
        binds+=("$p")
        if [[ -d $p ]]; then
            mkdir -p "$ROOT$p"
        elif [[ ! -e $ROOT$p ]]; then
            mkdir -p "$(dirname "$ROOT$p")" && touch "$ROOT$p"
        fi
    done < <(bind_paths)
    local enter=$DIR/bin/.enter tmp
    tmp=$(mktemp "$DIR/bin/.enter.XXXXXX")
    {
        printf '#!/bin/sh\n'
        printf '# Generated by scripts/slurm-test-cluster.sh: run COMMAND [ARGS] of the %s chroot %s\n' "$RELEASE" "$ROOT"
        printf '# for the cluster in %s, in a mount namespace of its own (nothing is mounted on the host).\n' "$DIR"
        printf 'set -e\nroot=%q\nbin=%q\n' "$ROOT" "$DIR/bin"
        cat <<'EOF'
if [ "${1:-}" != --in-namespace ]; then exec unshare --mount --propagation private "$0" --in-namespace "$@"; fi
shift
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount --rbind /sys "$root/sys"
mount --rbind /tmp "$root/tmp"
mount --bind /etc/hosts "$root/etc/hosts"
EOF
        for p in "${binds[@]}"; do printf 'mount --rbind %q "$root"%q\n' "$p" "$p"; done
        # Inside, PATH without the wrappers (the chroot's own commands), plus the system directories: without
        # any cluster's wrappers (a cluster started from another's environment, as test_boundary_slurm does,
        # would otherwise run the other's wrapper inside the chroot, where its unshare fails).
        cat <<'EOF'
path=
IFS=:
for p in $PATH; do [ "$p" = "$bin" ] || [ -z "$p" ] || [ -e "$p/.enter" ] || path=${path:+$path:}$p; done
unset IFS
export PATH="${path:+$path:}/usr/sbin:/usr/bin:/sbin:/bin"
exec chroot "$root" /bin/sh -c 'cd "$1" 2>/dev/null || cd /; shift; exec "$@"' enter "$PWD" "$@"
EOF
    } >"$tmp"
    chmod 0755 "$tmp"
    mv -f "$tmp" "$enter"
    local cmd
    [[ -f $ROOT/etc/hosts ]] || : >"$ROOT/etc/hosts"
    for cmd in $(chroot "$ROOT" dpkg -L slurm-client slurmctld slurmd munge | sed -En 's#^/usr/s?bin/([^/]+)-wlm$#\1#p; t; s#^/usr/s?bin/([^/]+)$#\1#p'); do
        tmp=$(mktemp "$DIR/bin/.$cmd.XXXXXX")
        printf '#!/bin/sh\n# %s of Debian %s (scripts/slurm-test-cluster.sh)\nexec %q %q "$@"\n' "$cmd" "$RELEASE" "$enter" "$cmd" >"$tmp"
        chmod 0755 "$tmp"
        mv -f "$tmp" "$DIR/bin/$cmd"
    done
}

# --- the cluster ------------------------------------------------------------------------------

slurm_release() {  # the major release of the Slurm that runs this cluster, e.g. 24.11
    local v
    v=$(slurmctld -V) || die "slurmctld -V failed"
    [[ $v =~ ([0-9]+)\.([0-9]+)\. ]] || die "slurmctld -V: unexpected '$v'"
    printf '%d%02d' "${BASH_REMATCH[1]}" "$((10#${BASH_REMATCH[2]}))"
}

write_config() {
    mkdir -p "$DIR"/{etc,munge,state,spool,run,log,dev}
    chmod 0711 "$DIR" "$DIR/munge"
    local i
    for ((i = 0; i < 2; i++)); do
        [[ -c $DIR/dev/tgpu$i ]] || mknod -m 0666 "$DIR/dev/tgpu$i" c 1 3
    done
    local last=$((NODE_PORT0 + NNODES - 1)) tmp none_plugins=""
    # 23.11 made the "none" accounting, job completion and gathering plugins built in: naming them fails.
    (($(slurm_release) < 2311)) && none_plugins=$'AccountingStorageType=accounting_storage/none\nJobAcctGatherType=jobacct_gather/none\nJobCompType=jobcomp/none'
    local boundary=""  # opt-in scripts at job boundaries (healthd's node check)
    [[ -n ${HEALTHD_SLURM_PROLOG:-} ]] && boundary+=$'\n'"Prolog=$HEALTHD_SLURM_PROLOG"
    [[ -n ${HEALTHD_SLURM_EPILOG:-} ]] && boundary+=$'\n'"Epilog=$HEALTHD_SLURM_EPILOG"
    [[ -n ${HEALTHD_SLURM_HEALTH_CHECK:-} ]] && boundary+=$'\n'"HealthCheckProgram=$HEALTHD_SLURM_HEALTH_CHECK"$'\n'"HealthCheckInterval=${HEALTHD_SLURM_HEALTH_CHECK_INTERVAL:-60}"$'\n'"HealthCheckNodeState=ANY"
    [[ -n ${HEALTHD_SLURM_REBOOT_PROGRAM:-} ]] && boundary+=$'\n'"RebootProgram=$HEALTHD_SLURM_REBOOT_PROGRAM"$'\n'"ResumeTimeout=60"
    local pe_timeout=${HEALTHD_SLURM_PROLOG_EPILOG_TIMEOUT:-}  # 25.05 split PrologEpilogTimeout in two
    if [[ -n $pe_timeout ]]; then
        [[ $pe_timeout =~ ^[1-9][0-9]*$ ]] || die "HEALTHD_SLURM_PROLOG_EPILOG_TIMEOUT must be whole seconds, not '$pe_timeout'"
        if (($(slurm_release) < 2505)); then
            boundary+=$'\n'"PrologEpilogTimeout=$pe_timeout"
        else
            boundary+=$'\n'"PrologTimeout=$pe_timeout"$'\n'"EpilogTimeout=$pe_timeout"
        fi
    fi
    local topology
    topology=$(write_topology)
    tmp=$(mktemp "$DIR/etc/.slurm.conf.XXXXXX")
    cat >"$tmp" <<EOF
# Generated by scripts/slurm-test-cluster.sh: a test cluster, not a template for production.
ClusterName=healthd-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$NODE_PORT0
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$DIR/run/slurmd.%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SwitchType=switch/none
MpiDefault=none
${none_plugins}
ReturnToService=2
SlurmdTimeout=10
SlurmctldTimeout=10
InactiveLimit=0
KillWait=5
MinJobAge=600${boundary}${topology}
GresTypes=gpu
NodeName=node[1-$NNODES] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[$NODE_PORT0-$last] CPUs=2 RealMemory=2000 Gres=gpu:tgpu:2 Feature=fake,tgpu State=UNKNOWN
PartitionName=batch Nodes=node[1-$NNODES] Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=node[1-$NNODES] MaxTime=INFINITE State=UP
EOF
    mv -f "$tmp" "$CONF"
    cat >"$DIR/etc/gres.conf" <<EOF
AutoDetect=off
NodeName=node[1-$NNODES] Name=gpu Type=tgpu File=$DIR/dev/tgpu[0-1]
EOF
    chmod 0644 "$CONF" "$DIR/etc/gres.conf"
    # Slurm's OCI containers (srun --container) read oci.conf beside slurm.conf; opt-in.
    rm -f "$DIR/etc/oci.conf"
    if [[ -n ${HEALTHD_SLURM_OCI_CONF:-} ]]; then
        install -m 0644 "$HEALTHD_SLURM_OCI_CONF" "$DIR/etc/oci.conf" || die "cannot copy HEALTHD_SLURM_OCI_CONF=$HEALTHD_SLURM_OCI_CONF"
    fi
}

write_topology() {  # topology.conf or topology.yaml next to slurm.conf; prints the slurm.conf line
    local kind=${HEALTHD_SLURM_TOPOLOGY:-tree} release half b i tmp
    release=$(slurm_release)
    rm -f "$DIR/etc/topology.conf" "$DIR/etc/topology.yaml"  # 25.05+ prefers a stale topology.yaml
    local nleaves=${HEALTHD_SLURM_LEAVES:-2}
    [[ $nleaves =~ ^[1-9][0-9]*$ ]] || die "HEALTHD_SLURM_LEAVES must be a positive number, not '$nleaves'"
    half=$(((NNODES + nleaves - 1) / nleaves))  # nodes per leaf: leaves of ceil(N/L) nodes in name order
    local leaves="" yleaves="" spine used=0
    for ((i = 1; i <= NNODES; i += half)); do
        used=$((used + 1))
        b=$((i + half - 1 < NNODES ? i + half - 1 : NNODES))
        leaves+="${leaves:+$'\n'}SwitchName=leaf$used Nodes=node[$i-$b]"
        yleaves+="      - switch: leaf$used"$'\n'"        nodes: node[$i-$b]"$'\n'
    done
    spine="SwitchName=spine Switches=leaf1"
    ((used > 1)) && spine="SwitchName=spine Switches=leaf[1-$used]"
    local blocks="" yblocks=""
    for ((i = 1, b = 1; i + 1 <= NNODES; i += 2, b++)); do  # 24.11: a block short of BlockSize is fatal
        blocks+="BlockName=block$b Nodes=node[$i-$((i + 1))]"$'\n'
        yblocks+="      - block: block$b"$'\n'"        nodes: node[$i-$((i + 1))]"$'\n'
    done
    local sizes=2
    ((NNODES >= 4)) && sizes=2,4  # 4: aggregated blocks of two base blocks
    case $kind in
        none) return 0 ;;
        tree)
            printf '# Generated by scripts/slurm-test-cluster.sh: %d leaf switch(es) under one spine.\n%s\n%s\n' "$used" "$leaves" "$spine" >"$DIR/etc/topology.conf"
            printf '\nTopologyPlugin=topology/tree' ;;
        block)
            ((release >= 2311)) || die "HEALTHD_SLURM_TOPOLOGY=block needs Slurm 23.11+ (this is $release)"
            printf '# Generated by scripts/slurm-test-cluster.sh: blocks of two nodes.\n%sBlockSizes=%s\n' "$blocks" "$sizes" >"$DIR/etc/topology.conf"
            printf '\nTopologyPlugin=topology/block' ;;
        yaml)
            ((release >= 2505)) || die "HEALTHD_SLURM_TOPOLOGY=yaml needs Slurm 25.05+ (this is $release)"
            tmp="# Generated by scripts/slurm-test-cluster.sh: two named topologies."$'\n'
            tmp+="- topology: fabric"$'\n'"  cluster_default: true"$'\n'"  tree:"$'\n'"    switches:"$'\n'
            tmp+="$yleaves"
            tmp+="      - switch: spine"$'\n'"        children: leaf[1-$used]"$'\n'
            tmp+="- topology: blocks"$'\n'"  cluster_default: false"$'\n'"  block:"$'\n'"    block_sizes: [$sizes]"$'\n'"    blocks:"$'\n'"$yblocks"
            printf '%s' "$tmp" >"$DIR/etc/topology.yaml" ;;
        *) die "HEALTHD_SLURM_TOPOLOGY must be tree, block, yaml or none, not '$kind'" ;;
    esac
    chmod 0644 "$DIR/etc"/topology.* 2>/dev/null || true
}

add_hosts() {  # the marked line names every node of every cluster started here: never fewer (clusters of
    local line names  # different sizes run side by side; a smaller one must not unname the others' nodes)
    # `|| true`: a first run has no marked line, and an empty grep must not end the script (set -e, pipefail).
    names=$( { node_names; { grep -F "$HOSTS_MARK" "$HOSTS_FILE" 2>/dev/null || true; } | sed 's/#.*//' \
               | tr ' \t' '\n\n' | { grep -E '^node[0-9]+$' || true; }; } | sort -u -V | tr '\n' ' ')
    line="127.0.0.1 ${names}$HOSTS_MARK"
    if grep -qF "$HOSTS_MARK" "$HOSTS_FILE" 2>/dev/null; then
        grep -qxF "$line" "$HOSTS_FILE" && return 0
        [[ -w "$HOSTS_FILE" ]] || die "$HOSTS_FILE has an outdated '$HOSTS_MARK' line and is not writable"
        local rest
        rest=$(grep -vF "$HOSTS_MARK" "$HOSTS_FILE" || true)  # nothing but the marked line: empty, not an error
        printf '%s%s\n' "${rest:+$rest$'\n'}" "$line" >"$HOSTS_FILE"  # in place: /etc/hosts may be a bind mount
    else
        [[ -w "$HOSTS_FILE" ]] || die "node names do not resolve; add '$line' to $HOSTS_FILE (needs root)"
        printf '%s\n' "$line" >>"$HOSTS_FILE"
    fi
}

start_munge() {
    alive "$MUNGE_PID" && return 0
    local key=$DIR/munge/munge.key
    if [[ ! -s $key ]]; then
        if command -v mungekey >/dev/null; then
            mungekey --create --keyfile="$key"
        else
            dd if=/dev/urandom of="$key" bs=1024 count=1 status=none
        fi
    fi
    chmod 0400 "$key"
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    munged --socket="$MUNGE_SOCKET" --key-file="$key" --pid-file="$MUNGE_PID" \
        --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed" --force
    local i
    for ((i = 0; i < 50; i++)); do
        [[ -S $MUNGE_SOCKET ]] && return 0
        sleep 0.1
    done
    tail -n 20 "$DIR/log/munged.log" >&2 || true
    die "munged did not create $MUNGE_SOCKET"
}

STARTED_NODES=()  # slurmds started by this invocation: they must register before `start` returns
START_EPOCH=0

start_slurm() {
    export SLURM_CONF=$CONF
    alive "$CTLD_PID" || slurmctld -f "$CONF"
    START_EPOCH=$(date +%s)
    local n
    while read -r n; do
        alive "$DIR/run/slurmd.$n.pid" && continue
        mkdir -p "$DIR/spool/$n"
        slurmd -f "$CONF" -N "$n"
        STARTED_NODES+=("$n")
    done < <(node_names)
}

daemons_dead() {  # names of the daemons this script needs that are not running
    local dead=() n
    alive "$MUNGE_PID" || dead+=(munged)
    alive "$CTLD_PID" || dead+=(slurmctld)
    while read -r n; do
        alive "$DIR/run/slurmd.$n.pid" || dead+=("slurmd $n")
    done < <(node_names)
    printf '%s' "${dead[*]}"
}

# Every node answers and is usable (not down, unknown, invalid, future or not responding '*'), and every
# slurmd started by this run has registered (a restarted slurmctld shows saved states before that).
nodes_ready() {
    local states n t
    states=$(SLURM_CONF=$CONF sinfo -h -N -p batch -o '%N %T' 2>/dev/null) || return 1
    [[ $(wc -l <<<"$states") -eq $NNODES ]] || return 1
    grep -Eqi ' (down|unknown|inval|future|not_responding|no_respond|fail|powered_down)|\*' <<<"$states" && return 1
    for n in "${STARTED_NODES[@]}"; do
        t=$(SLURM_CONF=$CONF scontrol -o show node "$n" 2>/dev/null | grep -o 'SlurmdStartTime=[^ ]*') || return 1
        t=$(date -d "${t#*=}" +%s 2>/dev/null) || return 1
        ((t >= START_EPOCH)) || return 1
    done
}

use_chroot() {  # chroot releases: build (once), then every Slurm and munge command is a wrapper
    ((NATIVE)) && return 0
    build_chroot
    write_wrappers
    export PATH=$DIR/bin:$PATH
}

cmd_build() {
    ((NATIVE)) && { apt_install_host slurm; return 0; }
    build_chroot
}

cmd_start() {
    if ((NATIVE)); then
        apt_install_host slurm
    else
        mkdir -p "$DIR"
        use_chroot
    fi
    local t0
    t0=$(date +%s.%N)
    write_config
    add_hosts
    start_munge
    start_slurm
    local deadline=$((SECONDS + START_TIMEOUT)) grace=$((SECONDS + 3)) why=""
    until nodes_ready; do
        ((SECONDS < grace)) || why=$(daemons_dead)  # pid files appear once the daemons are up
        if [[ -n $why ]] || ((SECONDS >= deadline)); then
            log "nodes not ready${why:+ ($why died)} after $((SECONDS + START_TIMEOUT - deadline)) s:"
            SLURM_CONF=$CONF timeout 15 sinfo -N -o '%N %T %E' >&2 || true
            local f
            for f in "$DIR"/log/*.log; do
                log "--- tail of $f"
                grep -Ev 'pmix|MPI:' "$f" | tail -n 12 >&2
            done
            die "cluster did not come up; logs in $DIR/log"
        fi
        sleep 0.5
    done
    log "all $NNODES nodes of $RELEASE's $(sinfo --version) up in $(since "$t0") s"
    cmd_status
    log "use it with: eval \"\$($0 env)\""
}

stop_pidfile() {  # stop_pidfile PIDFILE NAME
    alive "$1" || { rm -f "$1"; return 0; }
    local pid i
    pid=$(<"$1")
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || { rm -f "$1"; return 0; }
        sleep 0.1
    done
    log "$2 (pid $pid) ignored SIGTERM for 10 s; SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$1"
}

cmd_stop() {
    local n
    while read -r n; do
        stop_pidfile "$DIR/run/slurmd.$n.pid" "slurmd $n" &
    done < <(node_names)
    stop_pidfile "$CTLD_PID" slurmctld &
    wait
    stop_pidfile "$MUNGE_PID" munged
    log "stopped"
}

cmd_status() {
    [[ -f $CONF ]] || die "no cluster configured under $DIR (run: $0 start)"
    ((NATIVE)) || [[ -x $DIR/bin/sinfo ]] || die "no wrappers under $DIR/bin (run: $0 start)"
    ((NATIVE)) || PATH=$DIR/bin:$PATH
    SLURM_CONF=$CONF sinfo -o '%P %a %D %T %N %G'
}

cmd_env() {
    printf 'export SLURM_CONF=%q\n' "$CONF"
    printf 'export HEALTHD_SLURM_DIR=%q\n' "$DIR"
    printf 'export HEALTHD_SLURM_RELEASE=%q\n' "$RELEASE"
    printf 'export HEALTHD_SLURM_NODES=%q\n' "$NNODES"
    printf 'export HEALTHD_SLURM_CTLD_PORT=%q\n' "$CTLD_PORT"
    printf 'export HEALTHD_SLURM_NODE_PORT=%q\n' "$NODE_PORT0"
    printf 'export HEALTHD_SLURM_TOPOLOGY=%q\n' "${HEALTHD_SLURM_TOPOLOGY:-tree}"
    printf 'export HEALTHD_SLURM_LEAVES=%q\n' "${HEALTHD_SLURM_LEAVES:-2}"
    if ((!NATIVE)); then
        printf 'export HEALTHD_SLURM_CHROOT_DIR=%q\n' "$CHROOT_DIR"
        printf 'case ":$PATH:" in *:%q:*) ;; *) export PATH=%q:"$PATH" ;; esac\n' "$DIR/bin" "$DIR/bin"
    fi
}

case ${1:-} in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env) cmd_env ;;
    build) cmd_build ;;
    hosts) add_hosts ;;
    *) echo "usage: $0 {start|stop|status|env|build|hosts}" >&2; exit 2 ;;
esac
