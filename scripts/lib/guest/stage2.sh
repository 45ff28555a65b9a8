#!/bin/bash
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
SHARE=/.rxe-guest/share

power_off() {
    echo 0 >/proc/sys/kernel/printk # no "reboot: Power down" (panics still print)
    busybox poweroff -f             # syncs first
    sync
    echo o >/proc/sysrq-trigger
    sleep 10
    exit 1 # PID 1 exiting panics the kernel; panic=-1 and qemu -no-reboot end the run
}

# A setup failure: tell the host why (it prints this) and stop.
fail() {
    echo "rxe-guest(guest): FATAL: $*" >&2
    printf '%s\n' "$*" >"$SHARE/error"
    power_off
}

# Stage 1 mounted /proc, /sys, /dev, /dev/pts, /dev/shm and /run. stdout and stderr go to two
# virtio serial ports the host streams.
exec </dev/null >/dev/virtio-ports/rxe.stdout 2>/dev/virtio-ports/rxe.stderr

# shellcheck source=/dev/null # written by rxe-guest.sh for each run
. "$SHARE/cmd" || fail "cannot read the command file"

modprobe -a rdma_rxe ib_uverbs rdma_ucm veth || fail "cannot load rdma_rxe, ib_uverbs, rdma_ucm, veth"
# Optional, for later tests, where the kernel has them (ublk_drv only on 6.12; fuse is built in).
# modprobe -a goes on past a missing module; -q keeps it quiet.
modprobe -qa configfs nbd fuse loop virtio_blk ublk_drv || true
if [[ -d /sys/kernel/config ]]; then
    busybox mount -t configfs configfs /sys/kernel/config || fail "mount configfs"
fi

# rdma_cm does not work with rxe on lo, and rxe on both ends of a veth does not pass traffic: one rxe
# device on one veth end that carries the guest's own address; MTU 9000 makes rxe's MTU 4096.
ip -batch - <<EOT || fail "cannot set up the veth pair"
link set lo up
link add rxe-veth0 mtu 9000 type veth peer name rxe-veth1 mtu 9000
addr add $RXE_ADDR/24 dev rxe-veth0
link set rxe-veth1 up
link set rxe-veth0 up
EOT
rdma link add "$RXE_DEVICE" type rxe netdev rxe-veth0 || fail "rdma link add $RXE_DEVICE failed"
port_state() {
    local s=""
    read -r s 2>/dev/null <"/sys/class/infiniband/$RXE_DEVICE/ports/1/state"
    printf '%s' "$s"
}
for ((i = 0; i < 300; i++)); do
    [[ $(port_state) == *ACTIVE* ]] && break
    sleep 0.1
done
[[ $(port_state) == *ACTIVE* ]] || fail "$RXE_DEVICE port did not become ACTIVE: $(port_state)"

if [[ -n $RXE_DISK ]]; then
    for ((i = 0; i < 100; i++)); do
        [[ -b $RXE_DISK ]] && break
        sleep 0.1
    done
    [[ -b $RXE_DISK ]] || fail "scratch disk $RXE_DISK did not appear"
fi

: >"$SHARE/ready" # the host prints the boot time when it sees this

# loglevel=1 keeps the console quiet (a serial console is slow under TCG), but it also keeps a soft
# lockup's or a hung task's stack (KERN_DEFAULT) off it, and CI keeps only the host's streams: copy
# each such report, with the lines after it, to stderr. (A CI run once showed only "soft lockup -
# CPU#1 stuck for 939s! [kworker/u8:0:12]" and no stack to say what looped.)
kernel_reports() {
    local line n=0
    while IFS= read -r line; do
        case $line in
        *"soft lockup"* | *"blocked for more than"* | *"rcu"*"stall"* | *"WARNING: CPU"* | *"BUG:"*) n=60 ;;
        esac
        if ((n > 0)); then
            printf 'rxe-guest(kernel): %s\n' "$line" >&2
            n=$((n - 1))
        fi
    done < <(exec dmesg --follow --noescape --level=emerg,alert,crit,err,warn)
}
kernel_reports &

ulimit -l unlimited
cd "$RXE_CWD" || fail "cannot cd to $RXE_CWD"
# Run the command with exactly the environment the host chose (like env -i, without its exec), its
# stdout line-buffered (C stdio would buffer it fully on a non-tty and lose it if the run is killed).
(
    for v in $(compgen -e); do unset "$v"; done
    # shellcheck disable=SC2163 # kv is NAME=VALUE
    for kv in "${RXE_ENV[@]}"; do export "$kv"; done
    exec stdbuf -oL "${RXE_CMD[@]}"
)
printf '%d\n' "$?" >"$SHARE/status"
power_off
