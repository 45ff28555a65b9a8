# shellcheck shell=bash disable=SC2154 # guest_main's locals (compare-guest.sh), read through bash's dynamic scope
# scripts/compare-rxe.sh's block devices, in the guest (sourced by scripts/lib/compare-guest.sh;
# bash): the same fio jobs through every path (nvmeof nbd fuse ublk ublk-sleep ublk-null
# libublk-null ublk-q2; docs/performance.md, "The comparison's block devices", says what each is).
# The functions read guest_main's locals (bash's dynamic scope): secs, work, bin, uri, dev, addr,
# nqn, mnt, blk_paths, blk_why, blk_dev, blk_pid, blk_err, libublk, libublk_id.

unavailable() { # PATH WHY
    blk_why[$1]=$2
    printf '@@unavailable %s %s\n' "$1" "$2"
    log "$1 rows skipped: $2"
}
# Which paths can run here: the tools, the kernel's modules, this rblk's flags.
blk_check() {
    local help p
    command -v nvme >/dev/null || unavailable nvmeof "no nvme here (scripts/deps.sh installs nvme-cli)"
    command -v nbd-client >/dev/null || unavailable nbd "no nbd-client here (scripts/deps.sh installs it)"
    command -v losetup >/dev/null || unavailable fuse "no losetup here"
    if [[ -z ${blk_why[nvmeof]:-} ]]; then
        if nvmeof_setup "$nqn" "$addr" 2>"$work/nvmet.err"; then
            printf '@@meta nvmet %s on /dev/nullb0 (null_blk memory_backed, 1 GiB), rdma port %s:4420\n' "$nqn" "$addr"
        else
            unavailable nvmeof "cannot set up Linux NVMe-oF/RDMA: $(oneline "$work/nvmet.err")"
        fi
    fi
    if ! modprobe ublk_drv >&2 || [[ ! -e /dev/ublk-control ]]; then
        for p in ublk ublk-sleep ublk-null libublk-null ublk-q2; do
            unavailable "$p" "kernel $(uname -r) has no ublk_drv (/dev/ublk-control)"
        done
    elif ! help=$("$bin/rblk" attach --help 2>&1); then
        for p in ublk ublk-sleep ublk-null ublk-q2; do
            unavailable "$p" "this rblk has no 'rblk attach' ($("$bin/rblk" --version): $(head -n 1 <<<"$help"))"
        done
    elif ! grep -q -- '--wait' <<<"$help"; then
        unavailable ublk-sleep "this rblk's 'rblk attach' has no --wait"
    fi
    if [[ -z ${blk_why[libublk-null]:-} ]]; then
        if [[ -z $libublk ]]; then
            unavailable libublk-null "${RBLK_LIBUBLK_NULL_WHY:-not built on the host}"
        elif [[ ! -x $libublk ]]; then
            unavailable libublk-null "no $libublk in the guest"
        fi
    fi
}
# The output of `rblk attach --daemon` in $work/attach.out: sets blk_dev and blk_pid.
attach_daemon() { # ARGS... (after the URI)
    # A file, not $(...): the background server could keep a pipe open.
    if ! timeout 120 "$bin/rblk" attach "$uri" --device "$dev" --daemon "$@" >"$work/attach.out" 2>"$work/attach.log"; then
        blk_err="rblk attach $* --daemon failed: $(oneline "$work/attach.out" "$work/attach.log")"
        return 1
    fi
    blk_dev=$(sed -n 1p "$work/attach.out")
    blk_pid=$(sed -n 's/^rblk: pid \([0-9][0-9]*\) serves .*/\1/p' "$work/attach.log")
    if [[ $blk_dev != /dev/ublkb* || -z $blk_pid ]]; then
        blk_err="rblk attach $* printed no /dev/ublkbN line (stdout) and 'rblk: pid N serves' line (stderr): $(oneline "$work/attach.out" "$work/attach.log")"
        return 1
    fi
}
# Make path $1's block device: sets blk_dev (and blk_pid, the process serving it), or blk_err
# and returns 1.
blk_attach() {
    blk_dev="" blk_pid="" blk_err=""
    case $1 in
    nvmeof)
        nvmeof_connect "$nqn" "$addr" 2>"$work/nvme.err" || {
            blk_err="cannot connect to Linux NVMe-oF/RDMA: $(oneline "$work/nvme.err")"
            return 1
        }
        blk_dev=$NVMEOF_DEV
        ;;
    nbd)
        modprobe nbd >&2 || {
            blk_err="cannot load nbd"
            return 1
        }
        rm -f "$work/nbd.sock"
        # Its one stdout line, once it serves, is the export's URI (nbd+unix:///?socket=PATH).
        "$bin/rblk" nbd "$uri" --device "$dev" --listen "unix:$work/nbd.sock" >"$work/nbd.out" 2>"$work/nbd.log" &
        blk_pid=$!
        for _ in $(seq 1 300); do
            grep -q '^nbd+unix:' "$work/nbd.out" && break
            kill -0 "$blk_pid" 2>/dev/null || break
            sleep 0.1
        done
        grep -q '^nbd+unix:' "$work/nbd.out" || {
            blk_err="rblk nbd printed no nbd+unix: URI (it did not start serving): $(oneline "$work/nbd.out" "$work/nbd.log")"
            return 1
        }
        timeout 60 nbd-client -unix "$work/nbd.sock" /dev/nbd0 -block-size 4096 >"$work/nbdc.log" 2>&1 || {
            blk_err="nbd-client failed: $(oneline "$work/nbdc.log")"
            return 1
        }
        blk_dev=/dev/nbd0
        ;;
    fuse)
        mkdir -p "$mnt"
        # Its one stdout line is the loop device; the pid is on stderr ("rblk: pid N serves
        # MOUNTPOINT", then "rblk: serving in the background (pid N); ...").
        timeout 120 "$bin/rblk" mount "$uri" "$mnt" --device "$dev" --queues 1 --loop --daemon \
            >"$work/mount.out" 2>"$work/mount.log" || {
            blk_err="rblk mount --loop --daemon failed: $(oneline "$work/mount.out" "$work/mount.log")"
            return 1
        }
        blk_dev=$(sed -n 1p "$work/mount.out")
        blk_pid=$(sed -n -e 's/^rblk: pid \([0-9][0-9]*\) serves .*/\1/p' \
            -e 's/^rblk: serving in the background (pid \([0-9][0-9]*\)).*/\1/p' "$work/mount.log" | head -n 1)
        [[ $blk_dev == /dev/loop* && -n $blk_pid ]] || {
            blk_err="rblk mount printed no /dev/loopN line (stdout) or no 'rblk: pid N serves' line (stderr): $(oneline "$work/mount.out" "$work/mount.log")"
            return 1
        }
        ;;
    ublk) attach_daemon --queues 1 --depth 32 || return 1 ;;
    ublk-sleep) attach_daemon --queues 1 --depth 32 --wait sleep || return 1 ;;
    ublk-q2) attach_daemon --queues 2 --depth 32 || return 1 ;;
    ublk-null) RBLK_ALLOW_NULL=1 attach_daemon --queues 1 --depth 32 --null-io || return 1 ;;
    libublk-null)
        libublk_id=9
        while [[ -e /dev/ublkc$libublk_id || -e /dev/ublkb$libublk_id ]]; do
            libublk_id=$((libublk_id + 1))
        done
        "$libublk" add -n "$libublk_id" -q 1 -d 32 --foreground >"$work/libublk.out" 2>&1 &
        blk_pid=$!
        blk_dev=/dev/ublkb$libublk_id
        ;;
    esac
    wait_bdev "$blk_dev" || {
        blk_err="$blk_dev did not appear as a block device${blk_pid:+$(kill -0 "$blk_pid" 2>/dev/null || echo " (its server exited)")}"
        [[ $1 == libublk-null ]] && blk_err+=": $(oneline "$work/libublk.out")"
        return 1
    }
    log "  $1: $blk_dev"
}
# Remove path $1's device (also after a failed blk_attach); returns 1, with blk_err, when that
# did not go cleanly (the serving process is killed then).
blk_detach() {
    local rc=0
    blk_err=""
    case $1 in
    nvmeof)
        nvme disconnect -n "$nqn" >"$work/nvme.err" 2>&1 || blk_err="nvme disconnect failed: $(oneline "$work/nvme.err")"
        ;;
    nbd)
        if [[ -e /sys/block/nbd0/pid ]]; then
            timeout 60 nbd-client -d /dev/nbd0 >"$work/nbdc.log" 2>&1 || blk_err="nbd-client -d failed: $(oneline "$work/nbdc.log")"
            for _ in $(seq 1 300); do
                [[ -e /sys/block/nbd0/pid ]] || break
                sleep 0.1
            done
        fi
        if [[ -n $blk_pid ]]; then
            kill -TERM "$blk_pid" 2>/dev/null || true
            wait "$blk_pid" || rc=$?
            ((rc == 0)) || blk_err+="${blk_err:+; }rblk nbd exited with status $rc after SIGTERM: $(oneline "$work/nbd.log")"
        fi
        ;;
    fuse)
        if mountpoint -q "$mnt"; then
            timeout 60 "$bin/rblk" umount "$mnt" >"$work/umount.log" 2>&1 || blk_err="rblk umount failed: $(oneline "$work/umount.log")"
        fi
        ;;
    ublk*)
        if [[ -n $blk_dev && -e $blk_dev ]]; then
            timeout 60 "$bin/rblk" detach "$blk_dev" >"$work/detach.log" 2>&1 ||
                blk_err="rblk detach $blk_dev failed: $(oneline "$work/detach.log")"
        fi
        ;;
    libublk-null)
        if [[ -n $libublk_id && -e /dev/ublkc$libublk_id ]]; then
            timeout 60 "$libublk" del -n "$libublk_id" >"$work/libublk-del.log" 2>&1 ||
                blk_err="$libublk del -n $libublk_id failed: $(oneline "$work/libublk-del.log")"
        fi
        ;;
    esac
    if [[ -n $blk_pid && $1 != nbd ]] && ! wait_gone "$blk_pid"; then
        blk_err+="${blk_err:+; }its server (pid $blk_pid) did not exit: SIGKILL"
        kill -KILL "$blk_pid" 2>/dev/null || true
        wait_gone "$blk_pid" || true
    fi
    [[ $1 == libublk-null && -n $blk_pid ]] && { wait "$blk_pid" 2>/dev/null || true; }
    [[ -z $blk_err ]]
}
# One fio run of workload $1 through path $2 in round $3: fio's --rw and --iodepth follow.
# The guest's CPU over a window of it (`measure`, `sampled`) and, for the paths served by rblk, the
# target's CPU over the whole run (its threads, session included).
run_fio() {
    local w=$1 path=$2 r=$3 rw=$4 qd=$5 json="$work/fio.json" c0 c1 t0 t1 rc=0
    local -a cmd=(fio --name="$w" --filename="$blk_dev" --ioengine=libaio --direct=1 --bs=4k --rw="$rw"
        --iodepth="$qd" --numjobs=1 --size="$VOLUME_SIZE" --time_based --ramp_time=1 --runtime="$secs"
        --output-format=json --output="$json")
    rm -f "$json"
    c0=$(target_ns) t0=${EPOCHREALTIME/./}
    measure "$w" "$path" "$r" "$blk_dev:$blk_pid" timeout $((secs * 10 + 120)) "${cmd[@]}" >"$work/fio.err" 2>&1 || rc=$?
    c1=$(target_ns) t1=${EPOCHREALTIME/./}
    if ((rc != 0)); then
        fail "$w" "$path" "$r" "fio $(status_text "$rc"): $(oneline "$work/fio.err" "$json")"
        return 0
    fi
    [[ -s $json ]] || {
        fail "$w" "$path" "$r" "fio wrote no JSON report: $(oneline "$work/fio.err")"
        return 0
    }
    case $path in
    nvmeof | libublk-null) ;;
    *) printf '@@cpu %s %s %s %s %s\n' "$w" "$path" "$r" "$((c1 - c0))" "$(((t1 - t0) * 1000))" ;;
    esac
    emit_gcpu "$w" "$path" "$r" "$work/gcpu"
    log "  fio $path $rw QD$qd: done"
    emit "$w" "$path" "$r" "$json" "${cmd[@]}"
}
# Every block-device workload through every path, in round $1 (the paths' order rotates).
block_round() {
    local r=$1 i n=${#blk_paths[@]} path w
    local -a wls
    for i in $(seq 0 $((n - 1))); do
        path=${blk_paths[$(((i + r - 1) % n))]}
        [[ -z ${blk_why[$path]:-} ]] || continue
        # randwrite first: it fills what the reads read. --queues 2: the QD32 rows only.
        wls=("fio_randwrite_4k_qd32 randwrite 32" "fio_randread_4k_qd32 randread 32")
        [[ $path == ublk-q2 ]] || wls+=("fio_randread_4k_qd1 randread 1")
        if ! blk_attach "$path"; then
            for w in "${wls[@]}"; do
                fail "${w%% *}" "$path" "$r" "$blk_err"
            done
            blk_detach "$path" || true
            continue
        fi
        for w in "${wls[@]}"; do
            # shellcheck disable=SC2086 # WORKLOAD RW QD
            run_fio ${w%% *} "$path" "$r" ${w#* }
        done
        blk_detach "$path" || fail detach "$path" "$r" "$blk_err"
    done
}
