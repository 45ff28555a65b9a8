#!/usr/bin/env bash
# What a ublk takeover costs (`rblk attach` SIGKILLed and run again), measured over rxe in one guest
# boot, with its pause broken into stages (outside CI, about 3 minutes):
#
#   scripts/takeover-rxe.sh          # builds release binaries; RBLK_BIN_DIR=DIR uses those
#
# For a RAM and a durable 256 MiB volume: `rblk attach`, fio 4 KiB randrw at QD16 for 12 s (every
# completion logged, in Unix time), the serving process SIGKILLed at 3 s and `rblk attach URI` run
# again at once. The stages, on one clock: the SIGKILL; the process gone; the kernel requeueing
# the dead server's requests (tracefs block:block_rq_requeue on the ublk device); the new
# attach's own log lines (the dead server's device found, the session taken over,
# START_USER_RECOVERY done, serving again: END_USER_RECOVERY done); the target's OPEN of the new
# session; the first request the kernel completes again (block:block_rq_complete) and fio's first
# completion after the kill. Then the first FLUSH after the takeover (a `sync` of the device: on a
# durable volume a whole-volume write-back) against a FLUSH of one 4 KiB write, with the bytes the
# target wrote back (its written_back_bytes metric).
# scripts/lib/recovery.py makes the table (build/takeover/table.txt; the guest's lines in
# guest.log). Takes /tmp/rblk-guest.lock.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SCRIPT_NAME=takeover
CALLER_PWD=$PWD
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh"

host_main() {
    (($# == 0)) || help_or_usage_error "$1"
    release_bins rblk-target rblk
    local out=$REPO_ROOT/build/takeover
    mkdir -p "$out"
    snapshot_bins "$out/bin" rblk-target rblk
    rm -f "$out/scratch.img"
    guest_tee "$out/guest.log" --disk "$out/scratch.img:2G" "$REPO_ROOT/scripts/takeover-rxe.sh" --in-guest
    lib_python "$REPO_ROOT/scripts/lib/recovery.py" table "$out/guest.log" | tee "$out/table.txt"
}

now() { date +%s.%N; }

written_back() {
    curl -s "http://127.0.0.1:9464/metrics" | awk '/^rblk_target_written_back_bytes(_total)? /{print $2}'
}

# flush_ms DEV: a `sync` of DEV (one FLUSH), in ms.
flush_ms() {
    local t0
    t0=$(now)
    sync "$1"
    echo "($(now) - $t0) * 1000 / 1" | bc
}

# The block layer's view of the ublk device: its requeues, issues and completions.
trace_on() { # MAJOR:MINOR
    local tr=/sys/kernel/tracing major=${1%%:*} minor=${1##*:} ev
    [[ -d $tr/events ]] || mount -t tracefs tracefs "$tr"
    echo 0 >"$tr/tracing_on"
    echo >"$tr/trace"
    echo 16384 >"$tr/buffer_size_kb"
    for ev in block_rq_requeue block_rq_issue block_rq_complete; do
        echo "dev == $(((major << 20) | minor))" >"$tr/events/block/$ev/filter"
        echo 1 >"$tr/events/block/$ev/enable"
    done
}

trace_off() { # OUT
    local tr=/sys/kernel/tracing ev
    echo 0 >"$tr/tracing_on"
    cp "$tr/trace" "$1"
    for ev in block_rq_requeue block_rq_issue block_rq_complete; do
        echo 0 >"$tr/events/block/$ev/enable"
    done
}

run() {
    local kind=$1 spec=$2 bin=$RBLK_BIN_DIR addr=$RBLK_ADDR d=$WORK/$1
    mkdir -p "$d"
    RUST_LOG=info start_target "$d/target.log" "$bin" 20 --listen "$addr:7421" --state-dir "$d/state" \
        --metrics 127.0.0.1:9464 --volume "$spec" || die "$kind: rblk-target did not start"
    local target=$TARGET_PID
    local uri=rblk://$addr:7421/v out dev pid
    out=$(RUST_LOG=info "$bin/rblk" attach "$uri" --daemon --log-file "$d/attach1.log" 2>&1)
    dev=$(grep -m1 '^/dev/ublkb' <<<"$out")
    pid=$(sed -n "s/^rblk: pid \([0-9]*\) serves .*/\1/p" <<<"$out")
    # The same FLUSH before any takeover, for comparison.
    dd if=/dev/urandom of="$dev" bs=4k count=1 oflag=direct status=none
    local fb
    fb=$(flush_ms "$dev")
    # Events only from the SIGKILL on (a ring buffer: fio's seconds before would overwrite the
    # marker), until the takeover is over.
    trace_on "$(cat "/sys/class/block/${dev#/dev/}/dev")"
    fio --name=t --filename="$dev" --ioengine=libaio --direct=1 --rw=randrw --bs=4k --iodepth=16 \
        --time_based --runtime=12 --write_lat_log="$d/lat" --log_avg_msec=0 --log_unix_epoch=1 \
        --output-format=terse --terse-version=3 >"$d/fio.out" &
    local fio=$!
    sleep 3
    echo 1 >/sys/kernel/tracing/tracing_on
    printf '@@stage %s kill %s\n' "$kind" "$(now)"
    echo "rblk-kill $(now)" >/sys/kernel/tracing/trace_marker
    kill -KILL "$pid"
    (
        while [[ -e /proc/$pid ]]; do sleep 0.005; done
        printf '@@stage %s gone %s\n' "$kind" "$(now)"
    ) &
    local watcher=$!
    printf '@@stage %s exec %s\n' "$kind" "$(now)"
    # Until it serves, its log goes to stderr (the log file takes over once it is a daemon).
    RUST_LOG=info "$bin/rblk" attach "$uri" --daemon --log-file "$d/attach2.log" >/dev/null 2>"$d/attach2.err"
    printf '@@stage %s attached %s\n' "$kind" "$(now)"
    wait "$watcher" || true
    sleep 2
    trace_off "$d/trace.txt"
    wait "$fio" || true
    # fio wrote without fsync: the next FLUSH is the takeover's first, the whole volume.
    local b0 b1 b2 f1 f2
    b0=$(written_back)
    f1=$(flush_ms "$dev")
    b1=$(written_back)
    dd if=/dev/urandom of="$dev" bs=4k count=1 oflag=direct status=none
    f2=$(flush_ms "$dev")
    b2=$(written_back)
    printf '@@flush %s %s %s %s %s %s\n' "$kind" "$fb" "$f1" "$((${b1:-0} - ${b0:-0}))" "$f2" "$((${b2:-0} - ${b1:-0}))"
    python3 "$REPO_ROOT/scripts/lib/recovery.py" run "$kind" "$d"
    "$bin/rblk" detach "$dev" >/dev/null
    kill -TERM "$target"
    wait "$target" || true
}

guest_main() {
    # shellcheck source=lib/target.sh
    source "$REPO_ROOT/scripts/lib/target.sh"
    modprobe ublk_drv
    WORK=/tmp/takeover-rxe
    rm -rf "$WORK"
    mkdir -p "$WORK/mnt"
    mkfs.ext4 -q -F "${RBLK_DISK:?}"
    mount "$RBLK_DISK" "$WORK/mnt"
    export RBLK_RUN_DIR=$WORK/run
    run ram v:256M
    run durable "v:256M:$WORK/mnt/v.img"
}

script_main 0 "" "$@"
