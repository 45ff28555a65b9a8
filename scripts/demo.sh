#!/usr/bin/env bash
# The README's "run" command: build rblk, boot the rxe guest, start rblk-target there, write 4 MiB
# of random data to a volume with `rblk write`, read it back with `rblk read` and compare; attach
# the volume as a block device (`rblk attach`, ublk), put ext4 on it, write files, detach, attach
# again and verify them; the same through a FUSE mount (file + loop device); run a 10-second
# rblk-bench; stop the target cleanly. On a host with a real RDMA NIC, run `scripts/demo.sh --here` instead (no
# guest; RBLK_ADDR must be an address of the NIC).
set -euo pipefail
cd "$(dirname -- "${BASH_SOURCE[0]}")/.."

in_guest() {
    local bin=${RBLK_BIN_DIR:-build/release} addr=${RBLK_ADDR:?RBLK_ADDR: an address of the RDMA device}
    local uri="rblk://$addr:7420/demo" work log pid
    work=$(mktemp -d /tmp/rblk-demo.XXXXXX)
    log=$work/target.log
    say() { printf '\n>>> %s\n' "$*"; }
    # ext4 on device $1 with 20 files of random data, their sums in $work/sums; unmounted after.
    new_fs_with_files() {
        mkfs.ext4 -q "$1"
        mount "$1" /mnt/rblk-demo-fs
        for i in $(seq 1 20); do
            head -c $((RANDOM * 64 + i)) /dev/urandom >"/mnt/rblk-demo-fs/file$i"
        done
        (cd /mnt/rblk-demo-fs && sha256sum file* >"$work/sums")
        sync
        df -h /mnt/rblk-demo-fs | sed 's/^/    /'
        umount /mnt/rblk-demo-fs
    }
    # Mounts device $1 and checks the files against $work/sums.
    check_files() {
        mount "$1" /mnt/rblk-demo-fs
        (cd /mnt/rblk-demo-fs && sha256sum --check --quiet "$work/sums") && echo "    all 20 files verified"
        umount /mnt/rblk-demo-fs
    }

    # No key configured: the target makes /var/lib/rblk/target.key (or keeps the one there) and
    # refuses initiators without it; rblk and rblk-bench on this host read it there, no flags.
    say "start the target: rblk-target --listen $addr:7420 --volume demo:256M (key: /var/lib/rblk/target.key)"
    "$bin/rblk-target" --listen "$addr:7420" --volume demo:256M 2>"$log" &
    pid=$!
    trap 'kill -TERM $pid 2>/dev/null || true' EXIT
    for _ in $(seq 1 300); do
        grep -q 'listening on' "$log" && break
        kill -0 "$pid" 2>/dev/null || { cat "$log"; echo "demo: rblk-target exited"; exit 1; }
        sleep 0.1
    done
    sed 's/^/    target| /' "$log"

    say "rblk info $uri"
    "$bin/rblk" info "$uri"

    say "write 4 MiB of random data at offset 1M"
    head -c 4M /dev/urandom >"$work/f"
    "$bin/rblk" write "$uri" --offset 1M --input "$work/f"

    say "read it back"
    "$bin/rblk" read "$uri" --offset 1M --length 4M --output "$work/g"
    cmp "$work/f" "$work/g"
    echo "    4 MiB read back from the target: identical ($(sha256sum <"$work/g" | cut -c1-16)...)"

    say "attach it as a block device: rblk attach $uri --daemon, then ext4 on it"
    modprobe ublk_drv
    mkdir -p /mnt/rblk-demo-fs
    local dev out
    out=$("$bin/rblk" attach "$uri" --daemon --queues 2)
    printf '    %s\n' "$out"
    dev=$(grep -o '^/dev/ublkb[0-9]*' <<<"$out" | head -n 1)
    [[ -n $dev ]] || { echo "demo: no device in rblk attach's output"; return 1; }
    "$bin/rblk" list | sed 's/^/    /'
    new_fs_with_files "$dev"
    "$bin/rblk" detach "$dev" | sed 's/^/    /'
    echo "    wrote 20 files, unmounted, detached"

    say "attach it again and check every file"
    out=$("$bin/rblk" attach "$uri" --daemon)
    dev=$(grep -o '^/dev/ublkb[0-9]*' <<<"$out" | head -n 1)
    check_files "$dev"
    "$bin/rblk" detach "$dev" | sed 's/^/    /'

    say "mount it: rblk mount $uri /mnt/rblk-demo --loop --daemon, then ext4 on the loop device"
    mkdir -p /mnt/rblk-demo /mnt/rblk-demo-fs
    local loopdev
    # One stdout line: the loop device (as losetup --find --show prints it).
    loopdev=$("$bin/rblk" mount "$uri" /mnt/rblk-demo --loop --daemon)
    printf '    %s\n' "$loopdev"
    [[ $loopdev == /dev/loop* ]] || { echo "demo: rblk mount printed $loopdev, not a loop device"; return 1; }
    new_fs_with_files "$loopdev"
    "$bin/rblk" umount /mnt/rblk-demo
    echo "    wrote 20 files, unmounted everything"

    say "mount it again through a fresh rblk mount and check every file"
    loopdev=$("$bin/rblk" mount "$uri" /mnt/rblk-demo --loop --daemon)
    check_files "$loopdev"
    "$bin/rblk" umount /mnt/rblk-demo

    say "rblk-bench $uri --rw randread --bs 4k --iodepth 32 --runtime 10"
    "$bin/rblk-bench" "$uri" --rw randread --bs 4k --iodepth 32 --runtime 10

    say "stop the target (SIGTERM)"
    kill -TERM "$pid"
    local rc=0
    wait "$pid" || rc=$?
    trap - EXIT
    grep -E 'opened|disconnecting|shut down' "$log" | sed 's/^/    target| /' || true
    echo "    rblk-target exited with status $rc"
    rm -rf "$work"
    return "$rc"
}

case ${1:-} in
--in-guest | --here)
    in_guest
    ;;
"")
    scripts/deps.sh
    cargo build --release --workspace --bins
    RBLK_BIN_DIR=$PWD/build/release exec scripts/rxe-guest.sh scripts/demo.sh --in-guest
    ;;
*)
    echo "usage: $0 [--here]" >&2
    exit 2
    ;;
esac
