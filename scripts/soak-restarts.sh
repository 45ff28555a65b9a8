#!/usr/bin/env bash
# Restart soak over rxe, kept out of CI (about 5 minutes of guest time with 3 rounds):
#
#   scripts/soak-restarts.sh [ROUNDS]        # default 3
#
# Builds rblk-target, rblk and the recovery tests on the host, then boots the rxe guest with a
# scratch disk and runs tests/tests/recovery.rs's restart tests with RBLK_SOAK_ROUNDS=ROUNDS:
# - `fio_verify_on_ublk_survives_graceful_restarts`: fio verify on a ublk device across ROUNDS
#   graceful target restarts;
# - `flushed_data_reads_back_across_sigkills`: flushed data read back across ROUNDS SIGKILLs;
# - `nbd_and_fuse_loop_keep_ext4_across_restarts`: ext4 on `rblk nbd` and on `rblk mount --loop`,
#   each across ROUNDS graceful restarts and ROUNDS SIGKILLs, checksums and e2fsck.
# CI runs the same tests with one round. Takes /tmp/rblk-guest.lock (one guest boot at a time;
# RBLK_GUEST_LOCK=PATH another, empty none) unless the caller holds it.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SCRIPT_NAME=soak-restarts
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh"
rounds=${1:-3}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "soak-restarts: FAIL: ROUNDS must be a number above 0, not '$rounds'"; exit 2; }
cd "$REPO_ROOT"
cargo build -p rblk-target -p rblk --bins
exe=$(cargo test -p rblk-tests --test recovery --no-run 2>&1 | grep -o 'build/debug/deps/recovery-[0-9a-f]*' | tail -1)
[[ -n $exe ]] || { echo "soak-restarts: FAIL: no recovery test executable"; exit 1; }
mkdir -p build/guest
disk=build/guest/soak-restarts.img
rm -f "$disk"
export RBLK_SOAK_ROUNDS=$rounds RBLK_REQUIRE_RDMA=1
export RXE_GUEST_TIMEOUT=$((rounds * 240 + 600))
if with_guest_lock scripts/rxe-guest.sh --disk "$disk:2G" "$exe" --ignored --test-threads=1 --nocapture \
    --exact fio_verify_on_ublk_survives_graceful_restarts flushed_data_reads_back_across_sigkills \
    nbd_and_fuse_loop_keep_ext4_across_restarts; then
    echo "soak-restarts: PASS: $rounds rounds of restarts and SIGKILLs under fio verify, reads and ext4"
else
    echo "soak-restarts: FAIL: see above"
    exit 1
fi
