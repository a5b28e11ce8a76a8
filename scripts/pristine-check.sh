#!/usr/bin/env bash
# The README's two commands on a pristine root: what a newcomer meets on a fresh Debian machine.
#
#   scripts/pristine-check.sh            both steps below, at once, each from a fresh extraction of the root
#   scripts/pristine-check.sh run|test   one of them
#
# The root: a minbase Debian bookworm (mmdebstrap) with python3 and ca-certificates only, as a new
# Debian 12 machine has them, cached as a tarball under $HEALTHD_PRISTINE_CACHE (default
# /var/cache/healthd-pristine; rebuilt when the recipe below changes). Each step starts from a new
# extraction of that tarball, never from a used root: no package of ours, no /etc/hosts line, no munge
# key, no chroot cache, no state directory, no user, no virtualenv. The tracked and untracked (not
# ignored) files of this checkout are copied in (no .venv); so are the host's apt and pip configuration
# (sources, apt.conf.d, pip.conf and the local package directories they name, bound read-only) and its CA
# bundle, as a new machine of this kind has them. The root shares the host's network (registries) but has its own mount
# and PID namespaces: every daemon started inside ends with the step.
#
#   run    `scripts/run.sh` until the first GEMM figure is in /metrics (port 9469), then stopped
#   test   `scripts/test.sh` with $HEALTHD_PRISTINE_SLICE (default: the store, one Slurm integration
#          test, the alert rule tests): Debian packages installed, the Slurm test cluster started, the
#          slice passed. ruff and mypy are left to the main run (HEALTHD_TEST_LINT=0).
#
# Each step prints its time; a failing step names itself, prints the tail of its log and keeps the log
# under $HEALTHD_PRISTINE_LOGS (default /tmp/healthd-pristine-logs). Root only (mmdebstrap, chroot,
# namespaces). Exit status 0 when every step asked for passed. .ci/run runs it beside scripts/test.sh's set-up
# (HEALTHD_TEST_AWAIT: pytest waits for it), its Slurm cluster on ports of its own (16880, 17080+).
set -Eeuo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
CACHE=${HEALTHD_PRISTINE_CACHE:-/var/cache/healthd-pristine}
LOGS=${HEALTHD_PRISTINE_LOGS:-/tmp/healthd-pristine-logs}
MIRROR=${HEALTHD_PRISTINE_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
INCLUDE=python3,ca-certificates
RUN_TIMEOUT=${HEALTHD_PRISTINE_RUN_TIMEOUT:-600}
TEST_TIMEOUT=${HEALTHD_PRISTINE_TEST_TIMEOUT:-900}
SLICE=${HEALTHD_PRISTINE_SLICE:-tests/unit/test_store.py tests/integration/test_slurm_cli.py::test_nodes_with_gres_partitions_and_features tests/unit/test_alert_rules.py}
# Each root is a tmpfs (HEALTHD_PRISTINE_SIZE, default 8g; a used one holds about 2 GB) mounted under this.
WORK_PARENT=${HEALTHD_PRISTINE_WORK:-/var/tmp}

log() { printf 'pristine-check: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
trap 'log "error: line $LINENO: \`$BASH_COMMAND\` exited $?"' ERR
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

[[ $(id -u) == 0 ]] || die "needs root (mmdebstrap, chroot, mount and PID namespaces)"
steps=("$@")
((${#steps[@]})) || steps=(run test)
for s in "${steps[@]}"; do [[ $s == run || $s == test ]] || die "unknown step '$s' (run, test)"; done
mkdir -p "$CACHE" "$LOGS"

# --- the cached tarball ------------------------------------------------------------------------

recipe="$SUITE $INCLUDE $MIRROR minbase v1"
TARBALL=$CACHE/$SUITE-$(printf '%s' "$recipe" | sha256sum | cut -c1-12).tar

build_tarball() {
    exec 7>"$CACHE/build.lock"
    flock 7
    if [[ -s $TARBALL ]]; then exec 7>&-; return 0; fi
    "$REPO/scripts/install-debian-deps.sh" chroot || die "could not install mmdebstrap"
    local t0 tmp=$TARBALL.tmp
    t0=$(date +%s.%N)
    log "building the pristine $SUITE root ($INCLUDE; mmdebstrap from $MIRROR)"
    if ! mmdebstrap --variant=minbase --mode=root --include="$INCLUDE" --format=tar \
        --aptopt='Acquire::Retries "3"' "$SUITE" "$tmp" "$MIRROR" >"$LOGS/mmdebstrap.log" 2>&1; then
        tail -n 20 "$LOGS/mmdebstrap.log" >&2
        rm -f "$tmp"
        die "mmdebstrap failed; log in $LOGS/mmdebstrap.log"
    fi
    mv "$tmp" "$TARBALL"
    find "$CACHE" -maxdepth 1 -name "$SUITE-*.tar" ! -path "$TARBALL" -delete
    log "root built in $(since "$t0") s: $TARBALL ($(du -h "$TARBALL" | cut -f1))"
    exec 7>&-
}

# --- one fresh root ----------------------------------------------------------------------------

# Absolute directories that the host's pip configuration names (find-links, index URLs as file://,
# constraint files' folders): bound read-only at the same paths.
pip_paths() {
    local f
    {
        for f in /etc/pip.conf /etc/xdg/pip/pip.conf "$HOME/.config/pip/pip.conf" "$HOME/.pip/pip.conf"; do
            [[ -f $f ]] && cat "$f"
        done
        env | grep -E '^PIP_' || true
    } | { grep -oE '(file://)?/[^ ,;"]+' || true; } | sed 's#^file://##' | while read -r f; do
        if [[ -d $f ]]; then printf '%s\n' "$f"; elif [[ -f $f ]]; then dirname "$f"; fi
    done | { grep -vE '^/(etc|proc|sys|dev)(/|$)' || true; } | sort -u \
        | awk 'NR == 1 || index($0, prev "/") != 1 { print; prev = $0 }'
}

new_root() {  # new_root DIR: a fresh extraction, the checkout and the host's apt and pip configuration
    local root=$1 p
    mkdir -p "$root"
    tar -C "$root" -xf "$TARBALL"
    mkdir -p "$root/root/healthd"
    (cd "$REPO" && git ls-files -z -co --exclude-standard) | (cd "$REPO" && tar --null -T - -cf - 2>/dev/null) \
        | tar -C "$root/root/healthd" -xf -
    [[ -d $REPO/.git ]] && cp -a "$REPO/.git" "$root/root/healthd/.git"
    mkdir -p "$root/etc/apt/apt.conf.d" "$root/etc/apt/sources.list.d"
    rm -f "$root/etc/apt/sources.list" "$root"/etc/apt/sources.list.d/*
    [[ -f /etc/apt/sources.list ]] && cp /etc/apt/sources.list "$root/etc/apt/"
    for p in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [[ -f $p ]] && cp "$p" "$root/etc/apt/sources.list.d/"
    done
    for p in /etc/apt/apt.conf.d/*; do
        [[ -f $p && ! -e $root$p ]] && cp "$p" "$root$p"
    done
    [[ -f /etc/pip.conf ]] && cp /etc/pip.conf "$root/etc/pip.conf"
    [[ -d /etc/xdg/pip ]] && mkdir -p "$root/etc/xdg" && cp -a /etc/xdg/pip "$root/etc/xdg/pip"
    cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
    # The machine's trust store (it may hold a site's proxy CA that the registries are reached through).
    [[ -f /etc/ssl/certs/ca-certificates.crt ]] && cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
    # As a new machine's: localhost and its own name, nothing of ours.
    printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t%s\n' "$(hostname)" >"$root/etc/hosts"
    hostname >"$root/etc/hostname"
    mapfile -t BINDS < <(pip_paths)
    for p in "${BINDS[@]}"; do mkdir -p "$root$p"; done
}

# in_root ROOT LOG TIMEOUT COMMAND...: COMMAND as root in the fresh root, in mount and PID namespaces
# of its own (everything it started ends with it), with a new machine's environment.
in_root() {
    local root=$1 logf=$2 limit=$3 p
    shift 3
    local setup="set -e; r=$(printf '%q' "$root")"
    setup+='; mount -t proc proc "$r/proc"; mount --rbind /dev "$r/dev"; mount --rbind /sys "$r/sys"'
    setup+='; mount -t tmpfs -o mode=1777 tmpfs "$r/tmp"; mkdir -p "$r/run/lock"'
    for p in "${BINDS[@]}"; do setup+="; mount --bind $(printf '%q' "$p") \"\$r\"$(printf '%q' "$p"); mount -o remount,bind,ro \"\$r\"$(printf '%q' "$p")"; done
    setup+='; exec chroot "$r" "$@"'
    local envs=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 CI=true TERM=dumb)
    while IFS= read -r p; do envs+=("$p"); done < <(env | grep -E '^(PIP_[A-Z_]+|SSL_CERT_(FILE|DIR)|REQUESTS_CA_BUNDLE|HEALTHD_SLURM_(CTLD|NODE)_PORT|https?_proxy|HTTPS?_PROXY|no_proxy|NO_PROXY)=' || true)
    timeout --kill-after=10 "$limit" env -i "${envs[@]}" \
        unshare --mount --pid --fork --propagation private sh -c "$setup" inner "$@" >"$logf" 2>&1
}

fail_step() {  # fail_step NAME LOG: name the step and its log, show the tail
    log "FAILED: $1; the last lines of $2:"
    tail -n 40 "$2" | sed 's/^/    /' >&2
    exit 1
}

# --- the steps ---------------------------------------------------------------------------------

# Inside the root: scripts/run.sh in the background, /metrics polled until a GEMM figure is in it.
RUN_INNER='
cd /root/healthd
scripts/run.sh >/root/run.log 2>&1 &
pid=$!
python3 - "$pid" <<"EOF"
import os, re, sys, time, urllib.request
pid = int(sys.argv[1])
t0 = time.monotonic()
while True:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        state = "Z"
    if state == "Z":
        sys.exit("scripts/run.sh exited before any GEMM figure reached /metrics")
    try:
        text = urllib.request.urlopen("http://127.0.0.1:9469/metrics", timeout=5).read().decode()
    except OSError:
        text = ""
    hits = [l for l in text.splitlines() if re.match(r"healthd_gemm_\w+\{", l)]
    if hits:
        print(f"first GEMM figure in /metrics {time.monotonic() - t0:.1f} s after scripts/run.sh started:")
        print(hits[0])
        break
    time.sleep(2)
EOF
rc=$?
kill "$pid" 2>/dev/null || true
echo "--- scripts/run.sh output"
cat /root/run.log
exit $rc
'

step_run() {
    local root=$1 t0
    t0=$(date +%s.%N)
    in_root "$root" "$LOGS/run.log" "$RUN_TIMEOUT" /bin/sh -c "$RUN_INNER" || fail_step "scripts/run.sh on a pristine root" "$LOGS/run.log"
    log "run: $(grep -m1 'first GEMM' "$LOGS/run.log" | sed 's/:$//') (step $(since "$t0") s)"
}

step_test() {
    local root=$1 t0
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086  # the slice is a list of pytest arguments
    in_root "$root" "$LOGS/test.log" "$TEST_TIMEOUT" /usr/bin/env -C /root/healthd HEALTHD_TEST_LINT=0 \
        scripts/test.sh -p no:cacheprovider -q $SLICE || fail_step "scripts/test.sh on a pristine root" "$LOGS/test.log"
    local summary
    summary=$(grep -E '^[0-9]+ passed|passed' "$LOGS/test.log" | tail -n 1)
    log "test: $(grep -m1 'Slurm test cluster up' "$LOGS/test.log" | sed 's/^== //'); $summary (step $(since "$t0") s)"
}

t_all=$(date +%s.%N)
build_tarball
work=""
drop_root() {  # a tmpfs: gone at once (removing a used root file by file takes minutes)
    [[ -n $work ]] || return 0
    umount -l "$work" 2>/dev/null || true
    rmdir "$work" 2>/dev/null || true
    work=""
}
one_step() {  # one_step STEP: STEP in a fresh root of its own, dropped when it ends (run in a subshell)
    trap drop_root EXIT
    work=$(mktemp -d "$WORK_PARENT/healthd-pristine.XXXXXX")
    mount -t tmpfs -o "size=${HEALTHD_PRISTINE_SIZE:-8g},mode=0755" healthd-pristine "$work"
    local t0
    t0=$(date +%s.%N)
    new_root "$work/root"
    log "$1: fresh root extracted in $(since "$t0") s"
    "step_$1" "$work/root"
}
# The steps at once, each in its own root (they share nothing but the host's network: the run step's daemon
# listens on 9469, the test step's Slurm cluster on HEALTHD_SLURM_*_PORT): the time of the longer one.
declare -A pid=()
for s in "${steps[@]}"; do
    ( one_step "$s" ) &
    pid[$s]=$!
done
failed=()
for s in "${steps[@]}"; do wait "${pid[$s]}" || failed+=("$s"); done
((${#failed[@]} == 0)) || die "failed: ${failed[*]} (above)"
log "passed: ${steps[*]} in $(since "$t_all") s"
