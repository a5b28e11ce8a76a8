#!/usr/bin/env bash
# Install the Debian packages of scripts/debian-packages.txt that are missing, in one `apt-get update`
# and one `apt-get install`.
#
#   scripts/install-debian-deps.sh [ROLE...]        install the packages of these roles (default: all)
#   scripts/install-debian-deps.sh --list [ROLE...] print their names, one a line
#
# Every run holds an exclusive lock ($HEALTHD_APT_LOCK, default /run/lock/healthd-apt.lock) from the
# check of what is missing to the end of the install, so runs of this script never overlap: apt's
# DPkg::Lock::Timeout waits for the dpkg lock but not for the lists lock of `apt-get update`, and
# two overlapping runs fail with "Could not get lock /var/lib/apt/lists/lock". An `apt-get update`
# that meets that lock held by some other apt (not ours) is retried. Without root, a missing package
# is an error that names the command to run. Exit status 0 when everything asked for is installed.
set -Eeuo pipefail
trap 'printf "install-debian-deps: error: line %s: \`%s\` exited %s\n" "$LINENO" "$BASH_COMMAND" "$?" >&2' ERR
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
LIST=$HERE/debian-packages.txt
LOCK=${HEALTHD_APT_LOCK:-/run/lock/healthd-apt.lock}
LOCK_WAIT=${HEALTHD_APT_LOCK_WAIT:-1800}

log() { printf 'install-debian-deps: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

list=0
if [[ ${1:-} == --list ]]; then list=1; shift; fi
roles=("$@")
for r in "${roles[@]}"; do
    grep -Eq "^[a-z0-9][a-z0-9.+-]*([[:space:]]+[a-z]+)*[[:space:]]+$r([[:space:]]|$)" "$LIST" \
        || die "no package has role '$r' in $LIST"
done
packages=()
while read -r name rest; do
    [[ -z $name || $name == \#* ]] && continue
    rest=${rest%%#*}
    if ((${#roles[@]} == 0)); then
        packages+=("$name")
        continue
    fi
    for r in "${roles[@]}"; do
        [[ " $rest " == *" $r "* ]] && { packages+=("$name"); break; }
    done
done <"$LIST"
if ((list)); then
    printf '%s\n' "${packages[@]}"
    exit 0
fi

missing_packages() {
    local p
    for p in "${packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || printf '%s\n' "$p"
    done
}

if [[ $(id -u) != 0 ]]; then
    mapfile -t missing < <(missing_packages)
    ((${#missing[@]} == 0)) && exit 0
    die "missing Debian packages ${missing[*]}; run as root or: apt-get install --no-install-recommends ${missing[*]}"
fi

mkdir -p "$(dirname "$LOCK")"
exec 8>>"$LOCK"
if ! flock -n 8; then
    log "waiting for another install (lock $LOCK)"
    flock -w "$LOCK_WAIT" 8 || die "another install held $LOCK for more than $LOCK_WAIT s"
fi
mapfile -t missing < <(missing_packages)
((${#missing[@]} == 0)) && exit 0
t0=$(date +%s.%N)
log "installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt=(apt-get -o DPkg::Lock::Timeout=300)
for attempt in 1 2 3 4 5 6 7 8 9 10; do
    if out=$("${apt[@]}" update -qq 2>&1); then break; fi
    grep -q 'Could not get lock' <<<"$out" && ((attempt < 10)) || { printf '%s\n' "$out" >&2; die "apt-get update failed"; }
    log "apt-get update: the lists lock is held by another apt; retrying in 10 s"
    sleep 10
done
"${apt[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/tmp/healthd-apt-install.log 2>&1 || {
    tail -n 30 /tmp/healthd-apt-install.log >&2
    die "apt-get install ${missing[*]} failed; log in /tmp/healthd-apt-install.log"
}
mapfile -t still < <(missing_packages)
((${#still[@]} == 0)) || die "still not installed after apt-get install: ${still[*]}"
log "installed ${#missing[@]} packages in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
