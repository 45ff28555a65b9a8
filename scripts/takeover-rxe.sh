#!/usr/bin/env bash
# What a ublk takeover costs, measured over rxe in one guest boot (outside CI, ~2 minutes):
#
#   scripts/takeover-rxe.sh
#
# For a RAM and a durable 256 MiB volume: `rblk attach`, fio 4 KiB randrw at QD16 for 12 s, the
# serving process SIGKILLed at 3 s and `rblk attach URI` run again at once. Prints how long the
# second attach took, fio's errors and longest read and write latency (the longest an I/O waited
# across the kill and the takeover), then the cost of the first FLUSH after the takeover (a
# `sync` of the device: on a durable volume a whole-volume write-back) against a FLUSH of one
# 4 KiB write (after the takeover, and before it for comparison), with the bytes the target
# wrote back (its written_back_bytes metric).
# Takes /tmp/rblk-guest.lock (one guest boot at a time).
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if [[ ${1:-} != --in-guest ]]; then
    cd "$REPO_ROOT"
    cargo build --workspace --bins
    mkdir -p build/guest
    disk=build/guest/takeover.img
    rm -f "$disk"
    exec flock /tmp/rblk-guest.lock env RBLK_BIN_DIR="$REPO_ROOT/build/debug" \
        scripts/rxe-guest.sh --disk "$disk:2G" "$REPO_ROOT/scripts/takeover-rxe.sh" --in-guest
fi

bin=${RBLK_BIN_DIR:?}
addr=${RBLK_ADDR:?}
modprobe ublk_drv
mnt=/mnt/takeover
mkdir -p "$mnt"
mkfs.ext4 -q -F "${RBLK_DISK:?}"
mount "$RBLK_DISK" "$mnt"
export RBLK_RUN_DIR=/run/rblk-takeover

written_back() {
    curl -s "http://127.0.0.1:9464/metrics" | awk '/^rblk_target_written_back_bytes(_total)? /{print $2}'
}

ms_since() {
    echo $((($(date +%s%N) - $1) / 1000000))
}

run() {
    local kind=$1 spec=$2
    "$bin/rblk-target" --allow-any-host --listen "$addr:7421" --state-dir "$mnt/state-$kind" \
        --metrics 127.0.0.1:9464 --volume "$spec" >"$mnt/target-$kind.log" 2>&1 &
    local target=$!
    for _ in $(seq 100); do
        grep -q "listening on" "$mnt/target-$kind.log" && break
        sleep 0.2
    done
    local uri=rblk://$addr:7421/v out dev pid
    out=$("$bin/rblk" attach "$uri" --daemon 2>&1)
    dev=$(grep -m1 '^/dev/ublkb' <<<"$out")
    pid=$(sed -n "s/^rblk: pid \([0-9]*\) serves .*/\1/p" <<<"$out")
    # The same FLUSH before any takeover, for comparison.
    local fb t00
    dd if=/dev/urandom of="$dev" bs=4k count=1 oflag=direct status=none
    t00=$(date +%s%N)
    sync "$dev"
    fb=$(ms_since "$t00")
    fio --name=t --filename="$dev" --ioengine=libaio --direct=1 --rw=randrw --bs=4k --iodepth=16 \
        --time_based --runtime=12 --output-format=terse --terse-version=3 >"$mnt/fio-$kind.out" &
    local fio=$!
    sleep 3
    local t0
    t0=$(date +%s%N)
    kill -KILL "$pid"
    "$bin/rblk" attach "$uri" --daemon >/dev/null 2>&1
    local took
    took=$(ms_since "$t0")
    wait "$fio" || true
    # Terse v3: 5 error, 39 read lat max (us), 80 write lat max (us).
    local line
    line=$(tail -n 1 "$mnt/fio-$kind.out")
    local errors rmax wmax
    errors=$(cut -d';' -f5 <<<"$line")
    rmax=$(cut -d';' -f39 <<<"$line")
    wmax=$(cut -d';' -f80 <<<"$line")
    # fio wrote without fsync: the next FLUSH is the takeover's first, the whole volume.
    local b0 b1 b2 f1 f2
    b0=$(written_back)
    t0=$(date +%s%N)
    sync "$dev"
    f1=$(ms_since "$t0")
    b1=$(written_back)
    dd if=/dev/urandom of="$dev" bs=4k count=1 oflag=direct status=none
    t0=$(date +%s%N)
    sync "$dev"
    f2=$(ms_since "$t0")
    b2=$(written_back)
    printf 'takeover %-7s: second attach %5d ms after SIGKILL; fio errors %s; longest read %d ms, write %d ms\n' \
        "$kind" "$took" "$errors" $((rmax / 1000)) $((wmax / 1000))
    printf 'takeover %-7s: first FLUSH after it %5d ms, %s bytes written back; a 4 KiB write'"'"'s FLUSH %d ms, %s bytes (before the takeover: %d ms)\n' \
        "$kind" "$f1" "$((${b1:-0} - ${b0:-0}))" "$f2" "$((${b2:-0} - ${b1:-0}))" "$fb"
    "$bin/rblk" detach "$dev" >/dev/null
    kill -TERM "$target"
    wait "$target" || true
}

run ram v:256M
run durable "v:256M:$mnt/v.img"
