#!/bin/busybox sh
# shellcheck shell=dash # busybox ash, which shellcheck checks as dash
/bin/busybox --install -s /bin
export PATH=/bin

log() { echo "rxe-guest(initramfs): $*" >/dev/console; }
die() {
    log "FATAL: $*; powering off"
    for f in /proc/sys/kernel/printk /newroot/proc/sys/kernel/printk; do
        [ -e $f ] && echo 0 >$f # no "reboot: Power down"
    done
    poweroff -f
    echo o >/proc/sysrq-trigger
    exit 1 # init exiting panics the kernel; panic=-1 and qemu -no-reboot end the run
}

mount -t proc proc /proc || die "mount /proc"
mount -t sysfs sysfs /sys || die "mount /sys"
mount -t devtmpfs devtmpfs /dev || die "mount /dev"

while read -r ko; do
    insmod "/modules/$ko" || die "insmod $ko"
done </modules.order

p9='trans=virtio,version=9p2000.L,msize=512000'
mount -t 9p -o "$p9,ro,cache=loose" hostroot /lower || die "mount the host root (9p hostroot)"
mount -t 9p -o "$p9" rxeshare /share || die "mount the writable share (9p rxeshare)"
# shellcheck source=/dev/null # written by rxe-guest.sh for each run
. /share/boot.env || die "read boot.env"
mount -t tmpfs -o mode=0755 tmpfs /upper || die "mount the overlay's tmpfs"
mkdir -p /upper/data /upper/work
mount -t overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work overlay /newroot ||
    die "mount the overlay root"
mkdir -p /newroot/.rxe-guest/share "/newroot/usr/lib/modules/$KVER"
mount -o bind "/newroot$MODDIR" "/newroot/usr/lib/modules/$KVER" || die "bind the module tree"
mount --move /share /newroot/.rxe-guest/share || die "move the share"
cp /stage2 /newroot/.rxe-guest/init || die "install stage 2"
chmod 0755 /newroot/.rxe-guest/init

# The new root's pseudo filesystems. Done here, with the static busybox, because under TCG every exec
# of one of the host's dynamically linked tools over 9p costs ~0.1-0.3 s.
n=/newroot
mkdir -p $n/dev $n/proc $n/sys $n/run $n/tmp
mount --move /dev $n/dev || die "move /dev"
mount --move /proc $n/proc || die "move /proc"
mount --move /sys $n/sys || die "move /sys"
mkdir -p $n/dev/pts $n/dev/shm
mount -t devpts -o gid=5,mode=0620,ptmxmode=0666 devpts $n/dev/pts || die "mount /dev/pts"
mount -t tmpfs -o mode=1777 tmpfs $n/dev/shm || die "mount /dev/shm"
mount -t tmpfs -o mode=0755 tmpfs $n/run || die "mount /run"
# /tmp stays part of the overlay: a checkout under the host's /tmp (CI clones anywhere) must be
# visible in the guest at the same path.
ln -sfn /proc/self/fd $n/dev/fd
ln -sfn /proc/self/fd/0 $n/dev/stdin
ln -sfn /proc/self/fd/1 $n/dev/stdout
ln -sfn /proc/self/fd/2 $n/dev/stderr
hostname rxe-guest
# CMD's stdout and stderr: virtio serial ports named rxe.stdout and rxe.stderr (a serial tty is ~100x
# slower under TCG, a virtio console worse), linked as udev would from /dev/virtio-ports/NAME.
mkdir -p $n/dev/virtio-ports
i=0
while [ ! -e $n/dev/virtio-ports/rxe.stdout ] || [ ! -e $n/dev/virtio-ports/rxe.stderr ]; do
    [ $i -lt 100 ] || die "no virtio serial ports rxe.stdout and rxe.stderr"
    for p in "$n"/sys/class/virtio-ports/*; do
        [ -r "$p/name" ] && read -r name <"$p/name" && ln -sfn "../${p##*/}" "$n/dev/virtio-ports/$name"
    done
    i=$((i + 1))
    sleep 0.05
done

# shellcheck disable=SC2093 # the line after runs only when exec fails
exec switch_root $n /.rxe-guest/init
die "switch_root failed"
