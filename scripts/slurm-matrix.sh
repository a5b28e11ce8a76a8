#!/usr/bin/env bash
# The release-sensitive Slurm integration tests (pytest -m "slurm and slurm_release") once per Slurm
# release, each against a real cluster of scripts/slurm-test-cluster.sh: start it, eval its env,
# pytest, stop it; prints the time per release.
#
#   scripts/slurm-matrix.sh [RELEASE...] [-- PYTEST-ARGS...]   test; default releases: trixie sid,
#                                                              PYTEST-ARGS instead of the default
#                                                              `tests/integration` (where every slurm test is)
#   scripts/slurm-matrix.sh build [RELEASE...]                 only build the chroots (in parallel)
#
# Releases are Debian suites: bookworm (Slurm 22.05, this host's packages), trixie (24.11) and sid
# (26.05) run from chroots that slurm-test-cluster.sh builds once (HEALTHD_SLURM_FRESH=1 rebuilds).
# scripts/test.sh runs the whole suite against bookworm's cluster; this script adds the others. All
# chroots are built in the background at the start, so one release's build overlaps the tests of the
# one before; `build` lets a caller start that even earlier (a later test run waits for it).
# Releases run one after the other (two clusters' tests at once on a 2-core machine time out).
# Only the release-sensitive subset runs here: the tests marked `slurm_release` (pyproject.toml), those
# of what a Slurm command's arguments, output, errors or behaviour may change between releases:
# discovery (nodes busy, drained, in a maintenance reservation; JSON and text), submit, poll and
# collect (test_slurm_cli, the launchers through the daemon, a held job cancelled), cancel,
# drain/undrain and reservations (the recheck of an own drain), the topology, the boundary checks
# (test_boundary_slurm), the controller down (test_controller_down_is_a_slurm_error) and the
# scheduler's order (test_slurm_live's nice). Every Slurm command healthd runs is in it. The other
# slurm tests (healthd's own logic over those same calls: the daemon with its defaults, on-demand
# probes, adoption after SIGKILL, the controller outage, sweeps, the hang) run in the main suite,
# against the host's release only.
# Each cluster gets a fresh directory of its own ($HEALTHD_SLURM_MATRIX_DIR-<suite>, default
# /tmp/healthd-slurm-matrix-<suite>) and free ports (16900+/17100+), apart from any cluster in use;
# logs go to $HEALTHD_SLURM_MATRIX_DIR-logs. HEALTHD_SLURM_CHROOT_DIR and HEALTHD_SLURM_MIRROR are
# passed on. Needs root. Exit status: 0 when every release passed.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
CLUSTER=$REPO/scripts/slurm-test-cluster.sh
PY=${HEALTHD_VENV:-.venv}/bin/python
MATRIX_DIR=${HEALTHD_SLURM_MATRIX_DIR:-/tmp/healthd-slurm-matrix}
LOGS=$MATRIX_DIR-logs

log() { printf '== slurm-matrix: %s\n' "$*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

expected_release() {  # the Slurm release each Debian suite ships (checked by test_version)
    case $1 in bookworm) echo 22.05 ;; trixie) echo 24.11 ;; sid) echo 26.05 ;; *) echo "" ;; esac
}

mode="test"
if [[ ${1:-} == build ]]; then mode=build; shift; fi
releases=()
pytest_args=()
while (($#)); do
    if [[ $1 == -- ]]; then shift; pytest_args=("$@"); break; fi
    releases+=("$1")
    shift
done
((${#releases[@]})) || releases=(trixie sid)
[[ $(id -u) == 0 ]] || { log "needs root (clusters, chroots)"; exit 2; }
mkdir -p "$LOGS"

declare -A build_pid=()
start_builds() {  # one background build per release, each in a session of its own (killed as a group)
    local r
    for r in "${releases[@]}"; do
        rm -f "$LOGS/$r.build.seconds" "$LOGS/$r.build.failed"
        HEALTHD_SLURM_RELEASE=$r setsid bash -c '
            t0=$(date +%s.%N)
            "$1" build || { : >"$2.failed"; exit 1; }
            awk -v a="$t0" -v b="$(date +%s.%N)" '\''BEGIN { printf "%.1f\n", b - a }'\'' >"$2.seconds"
        ' build "$CLUSTER" "$LOGS/$r.build" >"$LOGS/$r.build.log" 2>&1 &
        build_pid[$r]=$!
    done
}
stop_builds() {
    local r
    for r in "${!build_pid[@]}"; do kill -- "-${build_pid[$r]}" 2>/dev/null || true; done
}
running_cluster=""  # the directory of the cluster to stop should this script be stopped
cleanup() {
    stop_builds
    [[ -z $running_cluster ]] || HEALTHD_SLURM_DIR=$running_cluster "$CLUSTER" stop >/dev/null 2>&1 || true
}
build_done() {  # build_done SUITE: wait for that build (from any subshell); 0 when it succeeded
    while [[ ! -e $LOGS/$1.build.seconds && ! -e $LOGS/$1.build.failed ]]; do
        kill -0 "${build_pid[$1]}" 2>/dev/null || break
        sleep 0.5
    done
    [[ -e $LOGS/$1.build.seconds ]]
}
build_time() {  # "built in N s" or "cached N s"
    local s
    s=$(cat "$LOGS/$1.build.seconds" 2>/dev/null || echo "?")
    if grep -q 'chroot .* built in' "$LOGS/$1.build.log"; then printf 'built %6s s' "$s"; else printf 'cached %5s s' "$s"; fi
}

if [[ $mode == build ]]; then
    start_builds
    status=0
    for r in "${releases[@]}"; do
        if build_done "$r"; then
            log "$r: $(build_time "$r")"
        else
            status=1
            log "$r: build failed:"
            cat "$LOGS/$r.build.log" >&2
        fi
    done
    exit "$status"
fi

ports_free() {  # ports_free FIRST COUNT: nothing listens on FIRST..FIRST+COUNT-1
    ! ss -Hltn | awk '{ sub(/.*:/, "", $4); print $4 }' | awk -v a="$1" -v b="$(($1 + $2 - 1))" '$1 >= a && $1 <= b { f = 1 } END { exit !f }'
}

# run_release INDEX SUITE: start that release's cluster (fresh state, free ports), pytest -m
# "slurm and slurm_release", stop it;
# the summary line goes to $LOGS/SUITE.summary. Returns non-zero when anything failed.
run_release() {
    local i=$1 r=$2 build expected start_s tests_s t0 attempt result=passed
    local summary=$LOGS/$r.summary
    export HEALTHD_SLURM_RELEASE=$r HEALTHD_SLURM_DIR=$MATRIX_DIR-$r
    if ! build_done "$r"; then
        cat "$LOGS/$r.build.log" >&2
        printf '%-9s build FAILED\n' "$r" >"$summary"
        return 1
    fi
    build=$(build_time "$r")
    expected=$(expected_release "$r")
    "$CLUSTER" stop >/dev/null 2>&1 || true
    rm -rf "${HEALTHD_SLURM_DIR:?}"
    running_cluster=$HEALTHD_SLURM_DIR
    t0=$(now)
    for attempt in 0 1 2 3; do  # another block of ports when something else holds these
        export HEALTHD_SLURM_CTLD_PORT=$((16900 + 10 * i + 100 * attempt))
        export HEALTHD_SLURM_NODE_PORT=$((17100 + 10 * i + 100 * attempt))
        ports_free "$HEALTHD_SLURM_CTLD_PORT" 1 && ports_free "$HEALTHD_SLURM_NODE_PORT" 8 || continue
        "$CLUSTER" start >"$LOGS/$r.start.log" 2>&1 && break
        "$CLUSTER" stop >/dev/null 2>&1 || true
        grep -q 'Address already in use' "$LOGS/$r.start.log" || attempt=fail
        cat "$LOGS/$r.start.log" >&2
        [[ $attempt == fail ]] && break
        rm -rf "${HEALTHD_SLURM_DIR:?}"
    done
    if ! grep -q 'nodes of .* up in' "$LOGS/$r.start.log" 2>/dev/null; then
        printf '%-9s %-6s %s  cluster start FAILED\n' "$r" "$expected" "$build" >"$summary"
        return 1
    fi
    start_s=$(since "$t0")
    log "$r: Slurm $(grep -o 'slurm-wlm [0-9.]*' "$LOGS/$r.start.log" | head -n 1 | cut -d' ' -f2) up in $start_s s" \
        "(ports $HEALTHD_SLURM_CTLD_PORT, $HEALTHD_SLURM_NODE_PORT+); pytest -m 'slurm and slurm_release'"
    t0=$(now)
    if ! (
        eval "$("$CLUSTER" env)"
        HEALTHD_REQUIRE_SLURM=1 HEALTHD_SLURM_EXPECT_RELEASE=$expected \
            "$PY" -m pytest -m "slurm and slurm_release" -p no:cacheprovider -q "${pytest_args[@]}"
    ); then
        result=FAILED
    fi
    tests_s=$(since "$t0")
    "$CLUSTER" stop >/dev/null 2>&1 || true
    running_cluster=""
    printf '%-9s %-6s %s  start %5.1f s  tests %6.1f s  %s\n' "$r" "$expected" "$build" "$start_s" "$tests_s" \
        "$result" >"$summary"
    [[ $result == passed ]]
}

((${#pytest_args[@]})) || pytest_args=(tests/integration)  # collecting all of tests costs ~15 s a release
trap cleanup EXIT
trap 'exit 130' INT TERM
start_builds
failed=()
total=$(now)
for i in "${!releases[@]}"; do
    r=${releases[$i]}
    rm -f "$LOGS/$r.summary"
    run_release "$i" "$r" || failed+=("$r")
done

log "time per release (chroot builds run in the background, overlapping earlier releases' tests):"
for r in "${releases[@]}"; do printf '   %s\n' "$(cat "$LOGS/$r.summary" 2>/dev/null || echo "$r: no result")" >&2; done
log "total $(since "$total") s"
if ((${#failed[@]})); then
    log "FAILED: ${failed[*]}"
    exit 1
fi
