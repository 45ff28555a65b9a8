#!/usr/bin/env bash
# System calls per I/O of `rblk attach`'s queue thread, by kind, for two builds of rblk in ONE rxe
# guest boot (issue 45: ublk at QD1 at most 1.0 io_uring_enter and 2.0 system calls per I/O):
#
#   scripts/ublk-syscalls-rxe.sh OLD_BIN_DIR NEW_BIN_DIR [--secs S]
#
# Each directory holds a release `rblk`; NEW_BIN_DIR's `rblk-target` serves a 256M RAM volume.
# For QD 1 and 32, each build in turn: rblk attach --queues 1 --depth 32 --daemon, fio randread
# 4k (libaio, direct) for S+2 seconds (default 5), and from 1.5 s in, for S seconds, tracefs'
# raw_syscalls:sys_enter of the queue thread (rblk-q0) alone, beside the device's completed reads
# (/sys/block/DEV/stat) over the same window. scripts/lib/syscalls.py counts the calls (in the
# guest) and prints the table (on the host): IOPS and p50 (fio's whole run), calls per I/O in all
# and by kind. On rxe a doorbell is a write(2), so writes per I/O are doorbells per I/O.
# Writes build/ublk-syscalls/guest.log and table.txt. Timing: ~15 s boot, then ~4 x (S + 12) s.
set -euo pipefail
shopt -s inherit_errexit

REPO_ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
CALLER_PWD=$PWD
cd "$REPO_ROOT"
OUT=build/ublk-syscalls
RBLK_PORT=7421
SCRIPT_NAME=ublk-syscalls
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh"

# One build at one depth: prints @@row BUILD QD IOPS P50_US IOS and @@counts BUILD QD JSON.
measure() { # WORK URI DEV SECS BUILD BIN QD
    local work=$1 uri=$2 dev=$3 secs=$4 build=$5 bin=$6 qd=$7 tr=/sys/kernel/tracing bdev pid tid r0 r1 fpid
    local ev=$tr/events/raw_syscalls/sys_enter
    if ! timeout 120 "$bin/rblk" attach "$uri" --queues 1 --depth 32 --device "$dev" --daemon \
        >"$work/attach.out" 2>"$work/attach.log"; then
        printf '@@fail %s %s attach: %s\n' "$build" "$qd" "$(tr -s '\n' ' ' <"$work/attach.log" | cut -c1-300)"
        return
    fi
    bdev=$(sed -n 1p "$work/attach.out")
    pid=$(sed -n 's/^rblk: pid \([0-9][0-9]*\) serves .*/\1/p' "$work/attach.log")
    wait_bdev "$bdev" || printf '@@fail %s %s %s did not appear\n' "$build" "$qd" "$bdev"
    tid=$(grep -lx 'rblk-q0' /proc/"$pid"/task/*/comm | head -n 1 | cut -d/ -f5)
    fio --name=sc --filename="$bdev" --ioengine=libaio --direct=1 --bs=4k --rw=randread --iodepth="$qd" \
        --numjobs=1 --size=256M --time_based --runtime=$((secs + 2)) --output-format=json >"$work/fio.json" \
        2>"$work/fio.err" &
    fpid=$!
    sleep 1.5
    echo "common_pid == $tid" >"$ev/filter"
    : >"$tr/trace"
    read -r r0 _ <"/sys/block/${bdev#/dev/}/stat"
    echo 1 >"$ev/enable"
    sleep "$secs"
    echo 0 >"$ev/enable"
    read -r r1 _ <"/sys/block/${bdev#/dev/}/stat"
    wait "$fpid" || printf '@@fail %s %s fio: %s\n' "$build" "$qd" "$(tr -s '\n' ' ' <"$work/fio.err" | cut -c1-300)"
    printf '@@row %s %s %s %s\n' "$build" "$qd" "$(lib_python -c 'import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]["read"]
print("%.0f %.1f" % (j["iops"], j["clat_ns"]["percentile"]["50.000000"] / 1000))' "$work/fio.json")" $((r1 - r0))
    printf '@@counts %s %s %s\n' "$build" "$qd" "$(lib_python "$REPO_ROOT/scripts/lib/syscalls.py" count "$tr/trace")"
    timeout 60 "$bin/rblk" detach "$bdev" >&2 || printf '@@fail %s %s detach\n' "$build" "$qd"
    wait_gone "$pid" || kill -KILL "$pid" 2>/dev/null || true
}

guest_main() { # SECS OLD_DIR NEW_DIR
    local secs=$1 old=$2 new=$3 addr=${RBLK_ADDR:?RBLK_ADDR: the address of the rxe device} work qd
    work=$(mktemp -d /tmp/rblk-syscalls.XXXXXX)
    # shellcheck source=lib/target.sh
    source "$REPO_ROOT/scripts/lib/target.sh"
    printf '@@meta guest_kernel %s\n@@meta secs %s\n' "$(uname -r)" "$secs"
    modprobe ublk_drv >&2 || true
    [[ -d /sys/kernel/tracing/events ]] || mount -t tracefs nodev /sys/kernel/tracing
    echo 16384 >/sys/kernel/tracing/buffer_size_kb
    start_target "$work/target.log" "$new" 30 --listen "$addr:$RBLK_PORT" --volume v:256M ||
        die "rblk-target did not start"
    # shellcheck disable=SC2064 # expand now: the trap must kill this target
    trap "kill -TERM $TARGET_PID 2>/dev/null || true" EXIT
    for qd in 1 32; do
        measure "$work" "rblk://$addr:$RBLK_PORT/v" "${RBLK_DEVICE:-rxe0}" "$secs" old "$old" "$qd"
        measure "$work" "rblk://$addr:$RBLK_PORT/v" "${RBLK_DEVICE:-rxe0}" "$secs" new "$new" "$qd"
    done
}

host_main() {
    (($# >= 2)) || die "usage: $0 OLD_BIN_DIR NEW_BIN_DIR [--secs S]"
    local old=$1 new=$2 secs=5
    [[ ${3:-} == --secs ]] && secs=${4:?--secs needs a value}
    is_count "$secs" || die "--secs must be a positive whole number of seconds (got '$secs')"
    RBLK_BIN_DIR=$old release_bins rblk
    snapshot_bins "$OUT/old" rblk
    old=$BIN_DIR
    RBLK_BIN_DIR=$new release_bins rblk rblk-target
    snapshot_bins "$OUT/new" rblk rblk-target
    new=$BIN_DIR
    local glog=$OUT/guest.log
    : >"$glog"
    run_guest "$glog" $((300 + 4 * (secs + 60))) "$REPO_ROOT/scripts/ublk-syscalls-rxe.sh" "$secs" "$old" "$new"
    grep -a '^@@fail' "$glog" >&2 || true
    lib_python "$REPO_ROOT/scripts/lib/syscalls.py" table "$glog" | tee "$OUT/table.txt"
    ((${GUEST_RC:-0} == 0)) || die "the guest run failed (exit status $GUEST_RC); see $glog"
}

script_main 3 "SECS OLD_DIR NEW_DIR" "$@"
