#!/usr/bin/env bash
# The power-cut test of durable volumes, in two guest boots on one scratch disk:
#   1. format the disk, start rblk-target with a volume backed by a file on it, write 16 MiB with
#      `rblk write` (which FLUSHes: acknowledged = durable), write more without flushing, then
#      print a marker; the host kills qemu on the spot (scripts/rxe-guest.sh RXE_GUEST_POWER_CUT_ON).
#   2. boot again with the same disk, start the target on the same file, read the 16 MiB back and
#      compare. Unflushed data may be lost; nothing is assumed about it.
# Usage: scripts/powercut.sh (on the host; builds nothing: expects build/debug binaries, or
# RBLK_BIN_DIR). Prints `powercut: ok` and exits 0 when the flushed data survived.
set -euo pipefail
cd "$(dirname -- "${BASH_SOURCE[0]}")/.."

MARKER=RBLK-POWER-CUT-NOW
MNT=/mnt/rblk-powercut
PORT=7421
MIB=$((1 << 20))

start_target() { # LOG
    local bin=$RBLK_BIN_DIR log=$1
    "$bin/rblk-target" --listen "$RBLK_ADDR:$PORT" --volume "p:64M:$MNT/p.img" 2>"$log" &
    for _ in $(seq 1 600); do
        grep -q 'listening on' "$log" && return 0
        kill -0 $! 2>/dev/null || break
        sleep 0.1
    done
    cat "$log" >&2
    echo "powercut: rblk-target did not start" >&2
    exit 1
}

guest_write() {
    mkfs.ext4 -q -F "${RBLK_DISK:?no scratch disk}"
    mkdir -p "$MNT"
    mount "$RBLK_DISK" "$MNT"
    # The reference copy is made durable first, the ordinary way.
    head -c $((16 * MIB)) /dev/urandom >"$MNT/expect.bin"
    sync
    start_target /tmp/target.log
    local uri="rblk://$RBLK_ADDR:$PORT/p"
    "$RBLK_BIN_DIR/rblk" write "$uri" --offset 4M --input "$MNT/expect.bin"
    head -c $((8 * MIB)) /dev/urandom >/tmp/unflushed.bin
    "$RBLK_BIN_DIR/rblk" write "$uri" --offset 32M --input /tmp/unflushed.bin --no-flush
    echo "$MARKER"
    sleep 600
}

guest_verify() {
    mkdir -p "$MNT"
    mount "${RBLK_DISK:?no scratch disk}" "$MNT"
    start_target /tmp/target.log
    "$RBLK_BIN_DIR/rblk" read "rblk://$RBLK_ADDR:$PORT/p" --offset 4M --length 16M --output /tmp/got.bin
    if cmp "$MNT/expect.bin" /tmp/got.bin; then
        echo "powercut: the 16 MiB flushed before the power cut are intact"
    else
        echo "powercut: FAIL: flushed data lost or damaged by the power cut" >&2
        exit 1
    fi
}

case ${1:-} in
--phase)
    case ${2:-} in
    write) guest_write ;;
    verify) guest_verify ;;
    *) exit 2 ;;
    esac
    ;;
"")
    export RBLK_BIN_DIR=${RBLK_BIN_DIR:-$PWD/build/debug}
    disk=build/guest/powercut.img
    rm -f "$disk"
    RXE_GUEST_POWER_CUT_ON=$MARKER scripts/rxe-guest.sh --disk "$disk:256M" scripts/powercut.sh --phase write
    scripts/rxe-guest.sh --disk "$disk:256M" scripts/powercut.sh --phase verify
    echo "powercut: ok"
    ;;
*)
    echo "usage: $0" >&2
    exit 2
    ;;
esac
