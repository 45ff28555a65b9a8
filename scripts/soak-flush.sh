#!/usr/bin/env bash
# Slow-flush soak over rxe, kept out of CI (about 2 minutes of guest time):
#
#   scripts/soak-flush.sh [SECONDS]        # default 60
#
# Builds rblk-target and the durable tests on the host, then boots the rxe guest with a scratch
# disk and runs tests/tests/durable.rs's `a_slow_write_back_keeps_its_connection` with a
# write-back of SECONDS (RBLK_SLOW_FLUSH_SECS): a FLUSH through dm-delay from a session of one
# connection with the initiator's default options must complete, and the connection stay. CI
# runs the same test with 20 s. Takes /tmp/rblk-guest.lock (one guest boot at a time; RBLK_GUEST_LOCK=PATH another, empty
# none) unless the caller holds it.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SCRIPT_NAME=soak-flush
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh"
secs=${1:-60}
cd "$REPO_ROOT"
cargo build -p rblk-target --bins
exe=$(cargo test -p rblk-tests --test durable --no-run 2>&1 | grep -o 'build/debug/deps/durable-[0-9a-f]*' | tail -1)
[[ -n $exe ]] || { echo "soak-flush: FAIL: no durable test executable"; exit 1; }
mkdir -p build/guest
disk=build/guest/soak-flush.img
rm -f "$disk"
export RBLK_SLOW_FLUSH_SECS=$secs
export RXE_GUEST_TIMEOUT=$((secs * 3 + 600))
if with_guest_lock scripts/rxe-guest.sh --disk "$disk:1G" "$exe" --ignored --test-threads=1 --nocapture \
    --exact a_slow_write_back_keeps_its_connection; then
    echo "soak-flush: PASS: a ${secs} s write-back completed and the connection stayed"
else
    echo "soak-flush: FAIL: see above"
    exit 1
fi
