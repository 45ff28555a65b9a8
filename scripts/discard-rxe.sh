#!/usr/bin/env bash
# Discard and write-zeroes measured over rxe in one guest boot (issue 41's goals; outside CI,
# about 3 minutes):
#
#   scripts/discard-rxe.sh            # builds release binaries; RBLK_BIN_DIR=DIR uses those
#
# 1. `blkdiscard --zeroout` of a 1 GiB RAM volume on `rblk attach`: its time, and the packets rxe
#    moved meanwhile (rxe's hw_counters, not rblk's own statistics), beyond those of an idle
#    window of 2 s just before (keepalives); then the same on a 1 GiB brd RAM disk in the same
#    boot, and a 1 GiB dd of zeros to the rblk device for scale. rxe counts packets, not bytes, and
#    target and initiator share the one rxe device (its traffic loops back without the netdev):
#    bytes are bounded by the packets at rxe's largest payload, 4 KiB each. With --force: without
#    it, blkdiscard first reads the device to look for a filesystem's signature (libblkid), about
#    300 packets of reads that are not the zeroing's.
# 2. A durable volume backed by a sparse file on the scratch disk: ext4 on `rblk attach`, a
#    128 MiB file written and deleted, `fstrim`: the backing file's allocated bytes (stat %b)
#    before and after, then after a clean stop and start of the target and after a --takeover.
# 3. fio with verify=crc32c trim_percentage=50 trim_verify_zero=1 trim_backlog=64 on ublk, NBD and
#    the FUSE loop device: fio's error count for each.
# The guest prints `@@` lines; scripts/lib/discard.py makes the table (goals read, not asserted).
# Takes /tmp/rblk-guest.lock (one guest boot at a time).
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SCRIPT_NAME=discard
CALLER_PWD=$PWD
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh"

host_main() {
    (($# == 0)) || help_or_usage_error "$1"
    release_bins rblk-target rblk
    local out=$REPO_ROOT/build/discard
    mkdir -p "$out"
    rm -f "$out/scratch.img"
    RXE_GUEST_MEM=${RXE_GUEST_MEM:-6G} guest_tee "$out/guest.log" --disk "$out/scratch.img:2G" \
        "$REPO_ROOT/scripts/discard-rxe.sh" --in-guest
    lib_python "$REPO_ROOT/scripts/lib/discard.py" "$out/guest.log" | tee "$out/table.txt"
}

# counters LABEL: one `@@counters LABEL SECONDS SENT_PKTS RCVD_PKTS RDMA_SENDS RDMA_RECVS` line.
counters() {
    local hw=/sys/class/infiniband/$RBLK_DEVICE/ports/1/hw_counters
    printf '@@counters %s %s %s %s %s %s\n' "$1" "$(date +%s.%N)" "$(cat "$hw/sent_pkts")" "$(cat "$hw/rcvd_pkts")" \
        "$(cat "$hw/rdma_sends")" "$(cat "$hw/rdma_recvs")"
}

# timed LABEL CMD...: runs CMD, prints `@@time LABEL SECONDS`.
timed() {
    local label=$1 start end
    shift
    start=$(date +%s.%N)
    "$@"
    end=$(date +%s.%N)
    printf '@@time %s %s\n' "$label" "$(echo "$end - $start" | bc)"
}

blocks() { printf '@@blocks %s %s\n' "$1" "$(($(stat -c %b "$2") * 512))"; }

fio_trim() { # LABEL FILE
    local out
    out=$(fio --name=trim --filename="$2" --rw=randwrite --bs=4k --size=64M --direct=1 --ioengine=libaio \
        --iodepth=16 --verify=crc32c --trim_percentage=50 --trim_verify_zero=1 --trim_backlog=64 \
        --output-format=terse --terse-version=3 2>&1) || true
    printf '@@fio %s %s\n' "$1" "$(awk -F';' 'NF > 100 { print $5 }' <<<"$out" | head -n 1)"
    printf '%s\n' "$out" | grep -i 'error\|verify' | head -n 5 | sed 's/^/@@fio_note /' || true
}

guest_main() {
    local bin=$RBLK_BIN_DIR addr=$RBLK_ADDR r=$RBLK_BIN_DIR/rblk work=/tmp/discard-rxe
    # shellcheck source=lib/target.sh
    source "$REPO_ROOT/scripts/lib/target.sh"
    modprobe ublk_drv
    modprobe nbd
    rm -rf "$work"
    mkdir -p "$work"
    export RBLK_RUN_DIR=$work/run

    # 1. Zeroing 1 GiB: rblk attach, brd, and a dd of zeros for scale.
    start_target "$work/t1.log" "$bin" 60 --listen "$addr:7431" --volume v:1G --admin-socket none
    local dev
    dev=$("$r" attach "rblk://$addr:7431/v" --daemon)
    sleep 3
    counters idle
    sleep 2
    counters before-zeroout
    timed rblk-zeroout blkdiscard --force --zeroout "$dev"
    counters after-zeroout
    timed rblk-dd-zeros dd if=/dev/zero of="$dev" bs=1M count=1024 oflag=direct status=none
    counters after-dd
    "$r" detach "$dev" >/dev/null 2>&1
    kill -TERM "$TARGET_PID"
    wait_gone "$TARGET_PID"
    modprobe brd rd_nr=1 rd_size=1048576
    timed brd-zeroout blkdiscard --force --zeroout /dev/ram0
    rmmod brd

    # 2. fstrim on a durable volume's sparse backing file.
    mkfs.ext4 -q -F "${RBLK_DISK:?no scratch disk}"
    mkdir -p /mnt/discard
    mount "$RBLK_DISK" /mnt/discard
    local args=(--listen "$addr:7432" --volume "d:512M:/mnt/discard/d.img" --state-dir "$work/state"
        --admin-socket "$work/admin.sock")
    start_target "$work/t2.log" "$bin" 60 "${args[@]}"
    dev=$("$r" attach "rblk://$addr:7432/d" --daemon)
    mkfs.ext4 -q -E nodiscard "$dev"
    mkdir -p "$work/fs"
    mount "$dev" "$work/fs"
    head -c 128M /dev/urandom >"$work/fs/big"
    sync
    blocks written /mnt/discard/d.img
    rm "$work/fs/big"
    sync
    fstrim -v "$work/fs" | sed 's/^/@@note /'
    sync
    blocks trimmed /mnt/discard/d.img
    umount "$work/fs"
    "$r" detach "$dev" >/dev/null 2>&1
    kill -TERM "$TARGET_PID"
    wait_gone "$TARGET_PID"
    blocks stopped /mnt/discard/d.img
    start_target "$work/t3.log" "$bin" 60 "${args[@]}"
    local old=$TARGET_PID
    blocks restarted /mnt/discard/d.img
    "$bin/rblk-target" --allow-any-host "${args[@]}" --takeover 2>"$work/t4.log" &
    local new=$!
    wait_for "$work/t4.log" 'listening on' 60 || true
    wait_gone "$old"
    kill -TERM "$new"
    wait_gone "$new"
    blocks taken-over-and-stopped /mnt/discard/d.img
    umount /mnt/discard

    # 3. fio's trim verification on each front end.
    start_target "$work/t5.log" "$bin" 60 --listen "$addr:7433" --volume f:128M --admin-socket none
    dev=$("$r" attach "rblk://$addr:7433/f" --daemon)
    fio_trim ublk "$dev"
    "$r" detach "$dev" >/dev/null 2>&1
    "$r" nbd "rblk://$addr:7433/f" --listen "unix:$work/nbd.sock" 2>"$work/nbd.log" &
    local nbd=$!
    wait_socket "$work/nbd.sock" 30 || true
    nbd-client -unix "$work/nbd.sock" /dev/nbd0 -block-size 4096 >/dev/null
    fio_trim nbd /dev/nbd0
    nbd-client -d /dev/nbd0 >/dev/null
    kill -TERM "$nbd"
    wait "$nbd" || true
    mkdir -p "$work/mnt"
    local line loopdev
    line=$("$r" mount "rblk://$addr:7433/f" "$work/mnt" --daemon --loop -o json)
    loopdev=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["loop_device"])' "$line")
    fio_trim fuse-loop "$loopdev"
    "$r" umount "$work/mnt" >/dev/null 2>&1
    kill -TERM "$TARGET_PID"
    wait_gone "$TARGET_PID"
}

script_main 0 "" "$@"
