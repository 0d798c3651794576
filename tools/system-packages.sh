#!/bin/sh
# Install the Debian packages the suite uses for real, when missing and when run as root (CI is).
# Usage: tools/system-packages.sh PACKAGE...
#
# Another apt-get or dpkg on the machine (an unattended upgrade, a second suite) holds apt's locks:
# wait for them (DPkg::Lock::Timeout covers dpkg's lock for install; `apt-get update` is retried
# while it reports a held lock) rather than fail. When an install fails all the same, apt's own
# last lines are printed, never hidden.
set -u

missing=""
for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "not installed (tests that need them skip):$missing"
    exit 0
fi

WAIT=${APT_LOCK_WAIT:-600}  # seconds to wait for another apt-get or dpkg to finish
log=$(mktemp)
trap 'rm -f "$log"' EXIT

apt() {
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout="$WAIT" -y -q "$@" >>"$log" 2>&1
}

update() {  # the lists' lock is not covered by DPkg::Lock::Timeout on every apt: retry on it
    waited=0
    while ! apt update; do
        if ! tail -n 5 "$log" | grep -qi "lock" || [ "$waited" -ge "$WAIT" ]; then
            return 1
        fi
        sleep 5
        waited=$((waited + 5))
    done
}

echo "installing$missing"
# shellcheck disable=SC2086  # one word a package
if apt install $missing || { update && apt install $missing; }; then
    exit 0
fi
echo "apt-get could not install$missing; its last lines:" >&2
tail -n 20 "$log" >&2
exit 1
