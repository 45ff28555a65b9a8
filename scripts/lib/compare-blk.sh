# shellcheck shell=bash disable=SC2154 # guest_main's locals (compare-guest.sh), read through bash's dynamic scope
# scripts/compare-rxe.sh's block devices, in the guest (sourced by scripts/lib/compare-guest.sh;
# bash): the same fio jobs through every path (nvmeof nbd fuse ublk ublk-sleep ublk-null
# libublk-null ublk-q2; docs/performance.md, "The comparison's block devices", says what each is).
# The functions read guest_main's locals (bash's dynamic scope): secs, work, bin, uri, dev, addr,
# nqn, blk_paths, blk_why, libublk. Devices are made and removed by scripts/lib/target.sh's
# blk_attach and blk_detach (BLK_* set by guest_main).

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
            unavailable nvmeof "cannot set up Linux NVMe-oF/RDMA: $(oneline 400 "$work/nvmet.err")"
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
# One fio run of workload $1 through path $2 in round $3: fio's --rw and --iodepth follow.
# The guest's CPU over a window of it (`measure`, `sampled`) and, for the paths served by rblk, the
# target's CPU over the whole run (its threads, session included).
run_fio() {
    local w=$1 path=$2 r=$3 rw=$4 qd=$5 json="$work/fio.json" c0 c1 t0 t1 rc=0
    local -a cmd=(fio --name="$w" --filename="$BLK_DEV" --ioengine=libaio --direct=1 --bs=4k --rw="$rw"
        --iodepth="$qd" --numjobs=1 --size="$VOLUME_SIZE" --time_based --ramp_time=1 --runtime="$secs"
        --output-format=json --output="$json")
    rm -f "$json"
    c0=$(target_ns) t0=${EPOCHREALTIME/./}
    measure "$w" "$path" "$r" "$BLK_DEV:$BLK_PID" timeout $((secs * 10 + 120)) "${cmd[@]}" >"$work/fio.err" 2>&1 || rc=$?
    c1=$(target_ns) t1=${EPOCHREALTIME/./}
    if ((rc != 0)); then
        fail "$w" "$path" "$r" "fio $(status_text "$rc"): $(oneline 400 "$work/fio.err" "$json")"
        return 0
    fi
    [[ -s $json ]] || {
        fail "$w" "$path" "$r" "fio wrote no JSON report: $(oneline 400 "$work/fio.err")"
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
                fail "${w%% *}" "$path" "$r" "$BLK_ERR"
            done
            blk_detach "$path" || true
            continue
        fi
        for w in "${wls[@]}"; do
            # shellcheck disable=SC2086 # WORKLOAD RW QD
            run_fio ${w%% *} "$path" "$r" ${w#* }
        done
        blk_detach "$path" || fail detach "$path" "$r" "$BLK_ERR"
    done
}
