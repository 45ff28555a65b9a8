#!/usr/bin/env bash
# Run a command as root inside a throwaway qemu guest (TCG) that has a working Soft-RoCE device.
#
#   scripts/rxe-guest.sh [--disk PATH[:SIZE]] [CMD [ARGS...]]
#
# The host kernel has no RDMA, so this boots Debian's own kernel (6.12 from bookworm-backports, or
# bookworm's 6.1 when backports cannot be reached) under qemu TCG with a tiny busybox initramfs. The
# host's root filesystem is shared read-only over 9p with a tmpfs overlay on top, so the host's
# rdma-core, perftest and the binaries cargo just built run in the guest unchanged, at the same paths.
# In the guest: rdma_rxe on one end of a veth pair (MTU 9000, 10.99.0.1/24) as `rxe0`, port ACTIVE,
# `ulimit -l unlimited`; then CMD runs with cwd = the repository root and this environment:
#   RBLK_DEVICE=rxe0 RBLK_ADDR=10.99.0.1 [RBLK_DISK=/dev/vda] RXE_GUEST=1
#   plus the caller's other RBLK_* variables and its RUST_*, PATH and CI variables.
# CMD's stdout and stderr stream live to ours (through two virtio serial ports, stdout line-buffered
# with stdbuf; the kernel console, ttyS0, goes to our stderr), and we exit with CMD's exit status.
# Without CMD, it prints `ibv_devinfo -d rxe0` and `rdma link`. Guest and host share the repository
# paths (a checkout under /tmp too); the guest's writes outside the scratch disk land in the
# overlay's tmpfs and are lost at power-off.
#
# Options:
#   --disk PATH[:SIZE]  attach the host file PATH as a raw virtio disk, /dev/vda in the guest,
#                       unformatted; created sparse with SIZE (default 1G, e.g. 512M) if missing and
#                       kept across boots.
# Environment:
#   RXE_GUEST_TIMEOUT   seconds the whole qemu run may take (default 1800)
#   RXE_GUEST_MEM       guest memory (default 4G); RXE_GUEST_SMP: vCPUs (default 2)
#   RXE_GUEST_APPEND    more of the guest kernel's command line (e.g. idle=poll)
#   RXE_GUEST_SUITES    Debian suites to take the kernel from, in order of preference
#                       (default "bookworm-backports bookworm", CI's 6.12). Another list, e.g.
#                       trixie-backports for a newer kernel (7.3 in December 2026; scripts/kernel-rxe.sh),
#                       keeps a cache pointer of its own, so it never changes the default's kernel.
#   RXE_GUEST_REFRESH=1 look up the newest kernel again instead of using the cached one
#   RXE_GUEST_KEEP=1    keep the per-run directory build/guest/run-* (kept anyway on failure)
#   RXE_GUEST_POWER_CUT_ON=TEXT
#                       a power cut: as soon as CMD prints TEXT on stdout, kill qemu with SIGKILL
#                       (the guest gets no chance to flush anything) and exit 0
# Exit status: CMD's, or 125 when the guest failed (boot failure, setup failure, panic, timeout).
#
# The guest kernel runs with tsc=reliable: TCG's TSC follows the host's clock, but the kernel's
# clocksource watchdog, which compares it with the HPET, misjudges it when the vCPUs are starved
# and switches to the HPET (it did in a compare-rxe.sh run on 2026-12-04), after which every
# clock read in the guest is a system call and spinning loops slow down mid-run.
#
# Everything downloaded or built is cached under build/guest/: the private apt state, the kernel .debs,
# the unpacked kernel + modules (after depmod) and the initramfs (keyed on kernel version and on a
# hash of the guest init scripts below, so editing them rebuilds it). Which kernel a suite list
# resolved to is kept in kernel.current (the default list) or kernel.current.SUITE[+SUITE...].
#
# Two package layouts are handled. Up to 6.12 (bookworm-backports) linux-image-VER holds the kernel
# as boot/vmlinuz-VER and the modules under lib/modules/VER. Newer ones (trixie-backports' 6.19 and
# 7.x) make linux-image-VER a meta package over linux-binary-VER (usr/lib/modules/VER/vmlinuz),
# linux-modules-VER (the modules) and linux-base-VER (modules.order, modules.builtin, config,
# System.map: depmod needs the first two); those three are unpacked into one tree, and a link
# lib -> usr/lib lets bookworm's depmod -b and modprobe -d, which look in BASE/lib/modules, find them.
set -euo pipefail
shopt -s inherit_errexit

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd -P)
GUEST_DIR=$REPO_ROOT/build/guest

TIMEOUT=${RXE_GUEST_TIMEOUT:-1800}
MEM=${RXE_GUEST_MEM:-4G}
SMP=${RXE_GUEST_SMP:-2}
APPEND=${RXE_GUEST_APPEND:-}
DEFAULT_SUITES="bookworm-backports bookworm"
SUITES=${RXE_GUEST_SUITES:-$DEFAULT_SUITES}

# Fixed facts about the guest, shared by the host side and the guest scripts.
GUEST_ADDR=10.99.0.1
GUEST_DEVICE=rxe0
# Modules the initramfs needs to mount the 9p root and the overlay and to find the virtio serial ports
# (their dependencies are added; built-in ones are skipped).
INITRAMFS_MODULES=(virtio_pci 9pnet_virtio 9p overlay virtio_console)
# The harness's own failures (as opposed to CMD's exit status).
readonly EXIT_HARNESS=125

T0=$EPOCHREALTIME

log() { printf 'rxe-guest: %s\n' "$*" >&2; }
die() {
    log "$*"
    exit "$EXIT_HARNESS"
}

# Seconds since START (default: since the script started), one decimal, from the host clock (the
# guest clock drifts under TCG).
elapsed() { # [START]
    local now=${EPOCHREALTIME/./} start=${1:-$T0}
    start=${start/./}
    local ds=$(((now - start) / 100000))
    printf '%d.%d' $((ds / 10)) $((ds % 10))
}

# Quote a string for a POSIX shell (busybox ash reads boot.env).
sh_quote() { printf "'%s'" "${1//\'/\'\\\'\'}"; }

# Escape a value for a qemu -option list (commas are doubled).
qemu_escape() { printf '%s' "${1//,/,,}"; }

# ---------------------------------------------------------------------------------------------------
# Guest side. These two functions print the scripts that run in the guest (scripts/lib/guest/); the
# initramfs embeds both, and its cache key hashes them, so editing either file builds a new one.
# ---------------------------------------------------------------------------------------------------

# Stage 1: /init of the initramfs (busybox sh). Loads the 9p/overlay modules, mounts the host root
# read-only with a tmpfs overlay on top, binds the unpacked module tree onto /usr/lib/modules/<ver>,
# moves the writable share to /.rxe-guest/share and switch_roots into stage 2.
# Any failure powers the guest off at once, so a broken boot cannot hang CI.
guest_stage1() {
    cat -- "$SCRIPT_DIR/lib/guest/stage1.sh" || die "no $SCRIPT_DIR/lib/guest/stage1.sh"
}

# Stage 2: PID 1 in the new root (the host's bash). Loads the RDMA modules, sets up rxe0 and runs the
# command from the share; writes its exit status to the share and powers off.
guest_stage2() {
    cat -- "$SCRIPT_DIR/lib/guest/stage2.sh" || die "no $SCRIPT_DIR/lib/guest/stage2.sh"
}

# ---------------------------------------------------------------------------------------------------
# Host side: kernel, initramfs.
# ---------------------------------------------------------------------------------------------------

# The Debian archive URI of this machine, from its own apt sources (never hard-coded here).
debian_mirror() {
    local uri=""
    if [[ -r /etc/apt/sources.list.d/debian.sources ]]; then
        # deb822: the first enabled "deb" stanza whose Suites include bookworm.
        uri=$(awk 'BEGIN { RS = ""; FS = "\n" }
            {
                types = ""; suites = ""; uris = ""; enabled = "yes"
                for (i = 1; i <= NF; i++) {
                    if ($i ~ /^[ \t]*#/) continue
                    split($i, kv, ":[ \t]*")
                    key = tolower(kv[1]); val = substr($i, index($i, ":") + 1)
                    if (key == "types") types = val
                    else if (key == "suites") suites = val
                    else if (key == "uris") uris = val
                    else if (key == "enabled") enabled = tolower(val)
                }
                if (enabled ~ /no/ || types !~ /(^|[ \t])deb([ \t]|$)/) next
                if (suites ~ /(^|[ \t])bookworm([ \t]|$)/) { split(uris, u, " "); print u[1]; exit }
            }' /etc/apt/sources.list.d/debian.sources)
    fi
    if [[ -z $uri && -r /etc/apt/sources.list ]]; then
        uri=$(awk '$1 == "deb" { i = 2; if ($2 ~ /^\[/) while ($i !~ /\]$/) i++; if ($2 ~ /^\[/) i++;
                                 if ($(i + 1) == "bookworm") { print $i; exit } }' /etc/apt/sources.list)
    fi
    [[ -n $uri ]] || die "no Debian bookworm source in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list"
    printf '%s\n' "$uri"
}

# apt-get/apt-cache with a private state for one suite, so /etc/apt and the system lists stay untouched.
apt_private() { # SUITE TOOL ARGS...
    local suite=$1 tool=$2 dir=$GUEST_DIR/apt/$1
    shift 2
    "$tool" -q -o Dir::Etc::sourcelist="$dir/sources.list" -o Dir::Etc::sourceparts=- \
        -o Dir::State::Lists="$dir/lists" -o Dir::Cache="$dir/cache" \
        -o APT::Sandbox::User=root -o Acquire::Languages=none \
        -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false "$@" </dev/null
}

# Print the kernel image package (linux-image-<version>) of SUITE, or fail if it cannot be reached.
resolve_kernel_package() { # SUITE
    local suite=$1 dir=$GUEST_DIR/apt/$1 mirror keyring opts=""
    mirror=$(debian_mirror)
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    [[ -r $keyring ]] && opts="[signed-by=$keyring] "
    mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
    printf 'deb %s%s %s main\n' "$opts" "$mirror" "$suite" >"$dir/sources.list"
    apt_private "$suite" apt-get update >"$dir/update.log" 2>&1 || return 1
    apt_private "$suite" apt-cache depends linux-image-amd64 2>/dev/null |
        awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; found = 1; exit }
             END { exit !found }'
}

# The cache file naming the kernel the suite list resolved to: kernel.current for the default list
# (CI's, as it always was), kernel.current.SUITE[+SUITE...] for another one.
kernel_pointer() {
    local suites
    read -r -a suites <<<"$SUITES"
    ((${#suites[@]})) || die "RXE_GUEST_SUITES is empty"
    local suite
    for suite in "${suites[@]}"; do
        [[ $suite =~ ^[a-z0-9][a-z0-9.-]*$ ]] ||
            die "RXE_GUEST_SUITES must name Debian suites (e.g. trixie-backports), got '$suite'"
    done
    if [[ "${suites[*]}" == "$DEFAULT_SUITES" ]]; then
        printf '%s\n' "$GUEST_DIR/kernel.current"
    else
        local IFS=+
        printf '%s\n' "$GUEST_DIR/kernel.current.${suites[*]}"
    fi
}

# The packages that hold linux-image-VER's files: itself (up to 6.12), or for a meta package the
# linux-binary-VER, linux-modules-VER and linux-base-VER it depends on.
kernel_packages() { # SUITE PKG
    local suite=$1 pkg=$2 kver=${2#linux-image-} parts
    parts=$(apt_private "$suite" apt-cache depends "$pkg" 2>/dev/null |
        awk -v v="$kver" '$1 == "Depends:" && ($2 == "linux-binary-" v || $2 == "linux-modules-" v ||
                                               $2 == "linux-base-" v) { print $2 }' | sort -u)
    if [[ -z $parts ]]; then
        printf '%s\n' "$pkg"
        return 0
    fi
    local want
    for want in binary modules base; do
        grep -qx "linux-$want-$kver" <<<"$parts" ||
            die "$pkg is a meta package without linux-$want-$kver (it depends on: ${parts//$'\n'/, })"
    done
    printf '%s\n' "$parts"
}

# The kernel image in an unpacked tree: boot/vmlinuz-VER (up to 6.12) or usr/lib/modules/VER/vmlinuz.
kernel_image() { # TREE KVER
    local f
    for f in "$1/boot/vmlinuz-$2" "$1/usr/lib/modules/$2/vmlinuz"; do
        if [[ -f $f ]]; then
            printf '%s\n' "$f"
            return 0
        fi
    done
    return 1
}

# Download, unpack and depmod the kernel; print its version. Uses the cached one when present.
prepare_kernel() {
    local kver pointer
    pointer=$(kernel_pointer)
    if [[ ${RXE_GUEST_REFRESH:-0} != 1 && -r $pointer ]]; then
        kver=$(<"$pointer")
        if [[ -e $GUEST_DIR/linux-$kver/.complete ]]; then
            printf '%s\n' "$kver"
            return 0
        fi
    fi

    local suite pkg=""
    for suite in $SUITES; do
        if pkg=$(resolve_kernel_package "$suite"); then
            break
        fi
        log "no kernel from $suite (see $GUEST_DIR/apt/$suite/update.log); trying the next suite"
        pkg=""
    done
    [[ -n $pkg ]] || die "cannot find a Debian kernel in: $SUITES"
    kver=${pkg#linux-image-}

    local tree=$GUEST_DIR/linux-$kver
    if [[ ! -e $tree/.complete ]]; then
        local -a pkgs
        mapfile -t pkgs < <(kernel_packages "$suite" "$pkg")
        ((${#pkgs[@]})) || die "cannot list the packages of $pkg"
        log "fetching ${pkgs[*]} from $suite"
        mkdir -p "$GUEST_DIR/debs"
        (cd "$GUEST_DIR/debs" && apt_private "$suite" apt-get download "${pkgs[@]}" >&2) ||
            die "apt-get download ${pkgs[*]} failed"
        rm -rf "$tree.tmp"
        local p deb
        for p in "${pkgs[@]}"; do
            deb=$(find "$GUEST_DIR/debs" -maxdepth 1 -name "${p}_*.deb" -printf '%T@ %p\n' |
                sort -n | tail -n 1 | cut -d' ' -f2-)
            [[ -n $deb ]] || die "downloaded $p but cannot find its .deb"
            dpkg -x "$deb" "$tree.tmp"
        done
        if [[ ! -d $tree.tmp/lib/modules/$kver ]]; then
            [[ -d $tree.tmp/usr/lib/modules/$kver && ! -e $tree.tmp/lib ]] ||
                die "${pkgs[*]} hold neither lib/modules/$kver nor usr/lib/modules/$kver"
            # bookworm's depmod -b and modprobe -d look in BASE/lib/modules only.
            ln -s usr/lib "$tree.tmp/lib"
        fi
        [[ -e $tree.tmp/lib/modules/$kver/modules.order ]] ||
            die "${pkgs[*]} hold no modules.order for $kver (depmod needs it)"
        kernel_image "$tree.tmp" "$kver" >/dev/null ||
            die "${pkgs[*]} hold neither boot/vmlinuz-$kver nor usr/lib/modules/$kver/vmlinuz"
        depmod -b "$tree.tmp" "$kver"
        touch "$tree.tmp/.complete"
        rm -rf "$tree"
        mv "$tree.tmp" "$tree"
    fi
    printf '%s\n' "$kver" >"$pointer"
    printf '%s\n' "$kver"
}

# Build the initramfs for KVER unless cached; print its path.
prepare_initramfs() { # KVER
    local kver=$1 tree=$GUEST_DIR/linux-$1 hash out
    hash=$({
        guest_stage1
        guest_stage2
        printf '%s\n' "${INITRAMFS_MODULES[@]}"
    } | sha256sum | cut -c1-16)
    out=$GUEST_DIR/initramfs-$kver-$hash.cpio.gz
    if [[ -e $out ]]; then
        printf '%s\n' "$out"
        return 0
    fi

    local root
    root=$(mktemp -d "$GUEST_DIR/initramfs.XXXXXX")
    mkdir -p "$root"/{bin,dev,proc,sys,modules,lower,upper,newroot,share}
    cp -L /bin/busybox "$root/bin/busybox"
    guest_stage1 >"$root/init"
    guest_stage2 >"$root/stage2"
    chmod 0755 "$root/init" "$root/stage2"

    # The modules in the order modprobe would load them (deduplicated), decompressed for busybox insmod.
    local line ko name
    declare -A seen=()
    while read -r line; do
        [[ $line == insmod\ * ]] || continue # "builtin NAME" needs nothing
        ko=${line#insmod }
        ko=${ko%% *}
        name=$(basename "$ko")
        name=${name%.xz}
        name=${name%.zst}
        [[ -n ${seen[$name]:-} ]] && continue
        seen[$name]=1
        case $ko in
        *.xz) xz -dc "$ko" >"$root/modules/$name" ;;
        *.zst) zstd -qdc "$ko" >"$root/modules/$name" ;;
        *) cp "$ko" "$root/modules/$name" ;;
        esac
        printf '%s\n' "$name" >>"$root/modules.order"
    done < <(modprobe -d "$tree" -S "$kver" -a --show-depends "${INITRAMFS_MODULES[@]}")
    touch "$root/modules.order"

    (cd "$root" && find . -print0 | cpio --null -o -H newc -R 0:0 --quiet) | gzip -1 >"$out.tmp"
    mv "$out.tmp" "$out"
    rm -rf "$root"
    # Drop this kernel's images of other script versions once they are an hour old (a concurrent
    # run of another version may be about to boot one). Other kernels' images stay: the default
    # and a newer kernel (RXE_GUEST_SUITES) are booted in turn.
    find "$GUEST_DIR" -maxdepth 1 -name "initramfs-$kver-*.cpio.gz" ! -path "$out" -mmin +60 -delete
    printf '%s\n' "$out"
}

# ---------------------------------------------------------------------------------------------------
# Host side: one run.
# ---------------------------------------------------------------------------------------------------

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
}

DISK=""
parse_args() { # sets DISK and CMD
    while (($#)); do
        case $1 in
        --disk)
            (($# >= 2)) || die "--disk needs PATH[:SIZE]"
            DISK=$2
            shift 2
            ;;
        --disk=*)
            DISK=${1#--disk=}
            shift
            ;;
        -h | --help)
            usage
            exit 0
            ;;
        --)
            shift
            break
            ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) break ;;
        esac
    done
    CMD=("$@")
}

# Create the scratch disk if missing; print its absolute path.
prepare_disk() { # PATH[:SIZE]
    local path=$1 size=1G
    if [[ $path =~ ^(.*):([0-9]+[KMGTkmgt]?)$ ]]; then
        path=${BASH_REMATCH[1]}
        size=${BASH_REMATCH[2]^^}
    fi
    [[ -n $path ]] || die "--disk: empty path"
    [[ $path == /* ]] || path=$PWD/$path
    if [[ ! -e $path ]]; then
        mkdir -p "$(dirname "$path")"
        truncate -s "$size" "$path" || die "cannot create $path"
    fi
    [[ -f $path || -b $path ]] || die "--disk $path is not a file or block device"
    printf '%s\n' "$path"
}

# Write the guest's command file: cwd, environment and argv, bash-quoted with printf %q.
write_cmd_file() { # FILE
    local -a env=() names
    local name path
    mapfile -t names < <(compgen -e)
    for name in "${names[@]}"; do
        case $name in
        RBLK_DEVICE | RBLK_ADDR | RBLK_DISK) ;; # facts about the guest, set below
        RBLK_* | RUST_* | CI) env+=("$name=${!name}") ;;
        esac
    done
    # The caller's PATH, plus the sbin directories root tools live in.
    path=${PATH:-/usr/local/bin:/usr/bin:/bin}
    [[ :$path: == *:/usr/sbin:* ]] || path+=:/usr/sbin
    [[ :$path: == *:/sbin:* ]] || path+=:/sbin
    env+=("PATH=$path" HOME=/root USER=root LOGNAME=root SHELL=/bin/bash TERM=dumb LANG=C.UTF-8
        RXE_GUEST=1 "RBLK_DEVICE=$GUEST_DEVICE" "RBLK_ADDR=$GUEST_ADDR")
    [[ -n $DISK ]] && env+=(RBLK_DISK=/dev/vda)
    {
        printf 'RXE_CWD=%q\n' "$REPO_ROOT"
        printf 'RXE_DEVICE=%q\nRXE_ADDR=%q\n' "$GUEST_DEVICE" "$GUEST_ADDR"
        printf 'RXE_DISK=%q\n' "${DISK:+/dev/vda}"
        printf 'RXE_ENV=('
        printf ' %q' "${env[@]}"
        printf ' )\nRXE_CMD=('
        printf ' %q' "${CMD[@]}"
        printf ' )\n'
    } >"$1"
}

QEMU_PID=""
TAIL_PIDS=()
RUN_DIR=""
# shellcheck disable=SC2317 # called from the EXIT trap
cleanup() {
    if [[ -n $QEMU_PID ]] && kill -0 "$QEMU_PID" 2>/dev/null; then
        kill -TERM "$QEMU_PID" 2>/dev/null || true # timeout(1) passes it on to qemu
        wait "$QEMU_PID" 2>/dev/null || true
    fi
    local pid
    for pid in "${TAIL_PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
}

# Print the last lines of the guest's console and of CMD's output.
last_console_lines() {
    local f
    for f in "$RUN_DIR/console.log" "$RUN_DIR/stdout.log" "$RUN_DIR/stderr.log"; do
        [[ -s $f ]] || continue
        printf -- '--- %s (last 25 lines) ---\n' "$f"
        tail -n 25 "$f" | tr -d '\r'
    done
    printf -- '--- end ---\n'
}

main() {
    parse_args "$@"
    # shellcheck disable=SC2016 # expanded by the guest's bash
    ((${#CMD[@]})) || CMD=(bash -c 'ibv_devinfo -d "$RBLK_DEVICE" && rdma link')
    [[ $TIMEOUT =~ ^[0-9]+$ ]] || die "RXE_GUEST_TIMEOUT must be a number of seconds"

    "$SCRIPT_DIR/deps.sh"
    [[ -n $DISK ]] && DISK=$(prepare_disk "$DISK")

    mkdir -p "$GUEST_DIR"
    local kver initramfs lockfd
    exec {lockfd}>"$GUEST_DIR/.lock"
    flock "$lockfd" # one builder of the cache at a time
    kver=$(prepare_kernel)
    initramfs=$(prepare_initramfs "$kver")
    exec {lockfd}>&-

    local tree=$GUEST_DIR/linux-$kver share image
    image=$(kernel_image "$tree" "$kver") || die "no kernel image in $tree (remove it to unpack again)"
    RUN_DIR=$(mktemp -d "$GUEST_DIR/run-XXXXXX")
    share=$RUN_DIR/share
    mkdir "$share"
    {
        printf 'KVER=%s\n' "$(sh_quote "$kver")"
        # The real directory (a newer kernel's lib is a link to usr/lib).
        printf 'MODDIR=%s\n' "$(sh_quote "$(cd -- "$tree/lib/modules/$kver" && pwd -P)")"
    } >"$share/boot.env"
    write_cmd_file "$share/cmd"
    local f
    for f in console.log stdout.log stderr.log; do
        : >"$RUN_DIR/$f"
    done

    # shellcheck disable=SC2054 # commas separate qemu sub-options
    local -a qemu=(
        qemu-system-x86_64 -accel tcg -cpu max -m "$MEM" -smp "$SMP"
        -nodefaults -no-user-config -display none -no-reboot -nic none
        -kernel "$image" -initrd "$initramfs"
        -append "console=ttyS0 quiet loglevel=1 panic=-1 oops=panic mitigations=off tsc=reliable${APPEND:+ $APPEND}"
        # Three output files the host tails (files, not stdio, so a closed stdin is no issue):
        # ttyS0, the kernel console; two virtio serial ports, CMD's stdout and stderr.
        -chardev "file,id=con,path=$(qemu_escape "$RUN_DIR/console.log"),append=on" -serial chardev:con
        -device virtio-serial-pci,id=vser
        -chardev "file,id=out,path=$(qemu_escape "$RUN_DIR/stdout.log"),append=on"
        -device virtserialport,bus=vser.0,chardev=out,name=rxe.stdout
        -chardev "file,id=err,path=$(qemu_escape "$RUN_DIR/stderr.log"),append=on"
        -device virtserialport,bus=vser.0,chardev=err,name=rxe.stderr
        -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap
        -virtfs "local,path=$(qemu_escape "$share"),mount_tag=rxeshare,security_model=none,multidevs=remap"
    )
    [[ -n $DISK ]] && qemu+=(-drive "file=$(qemu_escape "$DISK"),if=virtio,format=raw,discard=unmap")

    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    local t_qemu attempt
    # A kernel that panics while booting under TCG (seen: an int3 oops in sched_clock_cpu at
    # 3 s) never ran CMD, so booting again is safe: once.
    for attempt in 1 2; do
        t_qemu=$EPOCHREALTIME
        timeout -k 10 "$TIMEOUT" "${qemu[@]}" </dev/null >>"$RUN_DIR/console.log" 2>&1 &
        QEMU_PID=$!
        # Stream the outputs live; each tail exits once qemu is gone and its file is drained.
        tail -n +1 -s 0.1 --pid="$QEMU_PID" -f "$RUN_DIR/stdout.log" &
        TAIL_PIDS+=($!)
        tail -n +1 -s 0.1 --pid="$QEMU_PID" -f "$RUN_DIR/stderr.log" >&2 &
        TAIL_PIDS+=($!)
        tail -n +1 -s 0.1 --pid="$QEMU_PID" -f "$RUN_DIR/console.log" >&2 &
        TAIL_PIDS+=($!)

        while kill -0 "$QEMU_PID" 2>/dev/null; do
            if [[ -e $share/ready ]]; then
                log "$GUEST_DEVICE ACTIVE after $(elapsed "$t_qemu") s (kernel $kver)"
                break
            fi
            sleep 0.1
        done
        if ((attempt == 1)) && [[ ! -e $share/ready && ! -e $share/error && ! -e $share/status ]] &&
            ! kill -0 "$QEMU_PID" 2>/dev/null && grep -qa 'Kernel panic - ' "$RUN_DIR/console.log"; then
            wait "$QEMU_PID" || true
            wait "${TAIL_PIDS[@]}" 2>/dev/null || true
            TAIL_PIDS=()
            mv "$RUN_DIR/console.log" "$RUN_DIR/console.boot1.log"
            : >"$RUN_DIR/console.log"
            log "the guest kernel panicked while booting, before CMD ran ($RUN_DIR/console.boot1.log): booting again"
            continue
        fi
        break
    done
    local power_cut=0
    if [[ -n ${RXE_GUEST_POWER_CUT_ON:-} ]]; then
        while kill -0 "$QEMU_PID" 2>/dev/null; do
            if grep -qaF -- "$RXE_GUEST_POWER_CUT_ON" "$RUN_DIR/stdout.log"; then
                # qemu is the child of `timeout`: kill it, not the wrapper.
                pkill -KILL -P "$QEMU_PID" || true
                power_cut=1
                break
            fi
            sleep 0.05
        done
    fi
    local qrc=0
    wait "$QEMU_PID" || qrc=$?
    QEMU_PID=""
    wait "${TAIL_PIDS[@]}" 2>/dev/null || true
    TAIL_PIDS=()
    if ((power_cut)); then
        log "power cut: qemu killed $(elapsed "$t_qemu") s after boot, when the guest printed '$RXE_GUEST_POWER_CUT_ON'"
        rm -rf "$RUN_DIR"
        exit 0
    fi

    local status
    if [[ -r $share/status ]]; then
        status=$(<"$share/status")
        [[ $status =~ ^[0-9]+$ ]] || die "bad exit status from the guest: $status"
        log "guest command exited with status $status after $(elapsed) s"
        [[ ${RXE_GUEST_KEEP:-0} == 1 ]] || rm -rf "$RUN_DIR"
        exit "$status"
    fi
    local panic
    panic=$(grep -m1 -a -o 'Kernel panic - .*' "$RUN_DIR/console.log" | tr -d '\r') || true
    if [[ -r $share/error ]]; then
        log "guest setup failed: $(<"$share/error")"
    elif [[ -n $panic ]]; then
        log "guest did not report an exit status (guest $panic); last console lines:"
    elif ((qrc == 124 || qrc == 137)); then
        log "guest did not report an exit status (timeout after $TIMEOUT s, see RXE_GUEST_TIMEOUT);" \
            "last console lines:"
    else
        log "guest did not report an exit status (boot failure or guest panic: qemu exited with" \
            "status $qrc after $(elapsed "$t_qemu") s, before the timeout of $TIMEOUT s); last console lines:"
    fi
    {
        last_console_lines
        printf 'rxe-guest: run directory kept: %s\n' "$RUN_DIR"
    } >&2
    exit "$EXIT_HARNESS"
}

main "$@"
