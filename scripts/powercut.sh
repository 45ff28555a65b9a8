#!/usr/bin/env bash
# The power-cut test of durable volumes, in two guest boots on one scratch disk:
#   1. format the disk, start rblk-target with a volume backed by a file on it, write 16 MiB with
#      `rblk write` (which FLUSHes: acknowledged = durable), write more without flushing, then
#      print a marker; the host kills qemu on the spot (scripts/rxe-guest.sh RXE_GUEST_POWER_CUT_ON).
#   2. boot again with the same disk, start the target on the same file, read the 16 MiB back and
#      compare. Unflushed data may be lost; nothing is assumed about it.
# And discards (issue 41; the rule is in docs/DESIGN.md, "Zeroing is stores"), in the same boots:
#   (a) 4 MiB written and flushed at 40M, then discarded: zeros after the cut, and a hole in the
#       backing file (SEEK_DATA finds no data in it);
#   (b) 4 MiB written and flushed at 44M, discarded, then 1 MiB written (and flushed) at 45M:
#       that 1 MiB intact after the cut (the punch reached the file before the write), the rest
#       of the 4 MiB zeros;
#   (c) 4 MiB written and flushed at 48M, discarded with no FLUSH after it: each block the old
#       data or zeros, nothing else (a DISCARD is durable at its answer, so zeros here).
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
    head -c $((12 * MIB)) /dev/urandom >"$MNT/old.bin"
    head -c $((1 * MIB)) /dev/urandom >"$MNT/y.bin"
    sync
    "$RBLK_BIN_DIR/rblk" write "$uri" --offset 40M --input "$MNT/old.bin"
    "$RBLK_BIN_DIR/rblk" discard "$uri" --offset 40M --length 8M
    "$RBLK_BIN_DIR/rblk" write "$uri" --offset 45M --input "$MNT/y.bin"
    "$RBLK_BIN_DIR/rblk" discard "$uri" --offset 48M --length 4M
    echo "$MARKER"
    sleep 600
}

guest_verify() {
    mkdir -p "$MNT"
    mount "${RBLK_DISK:?no scratch disk}" "$MNT"
    # (a): no data in the backing file from 40M to 44M (read before the target opens it).
    local next_data
    next_data=$(python3 -c "import os; fd = os.open('$MNT/p.img', os.O_RDONLY); print(os.lseek(fd, 40 << 20, os.SEEK_DATA))")
    start_target /tmp/target.log
    local uri="rblk://$RBLK_ADDR:$PORT/p"
    "$RBLK_BIN_DIR/rblk" read "$uri" --offset 4M --length 16M --output /tmp/got.bin
    if cmp "$MNT/expect.bin" /tmp/got.bin; then
        echo "powercut: the 16 MiB flushed before the power cut are intact"
    else
        echo "powercut: FAIL: flushed data lost or damaged by the power cut" >&2
        exit 1
    fi
    "$RBLK_BIN_DIR/rblk" read "$uri" --offset 40M --length 12M --output /tmp/disc.bin
    local fail=0
    if ((next_data < 44 * MIB)); then
        echo "powercut: FAIL: (a) the discarded range holds data at $next_data" >&2
        fail=1
    fi
    cmp -n 5M /tmp/disc.bin /dev/zero || { echo "powercut: FAIL: (a)/(b) discarded bytes are not zeros" >&2; fail=1; }
    cmp -n 1M -i 5M:0 /tmp/disc.bin "$MNT/y.bin" || { echo "powercut: FAIL: (b) the write after the discard is lost" >&2; fail=1; }
    cmp -n 6M -i 6M:0 /tmp/disc.bin /dev/zero || { echo "powercut: FAIL: (b)/(c) discarded bytes are not zeros" >&2; fail=1; }
    ((fail == 0)) || exit 1
    echo "powercut: discarded ranges read zeros and are holes; the write after a discard is intact"
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
