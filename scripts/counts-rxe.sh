#!/usr/bin/env bash
# What each front end does per I/O (issue 45, item 2), counted in ONE rxe guest boot:
#
#   scripts/counts-rxe.sh [--secs S] [--rows LIST] [--rw LIST]
#   scripts/counts-rxe.sh --redraw [LOG OUT_DIR]   # no guest: summarize LOG again (default
#                                                  # build/counts/guest.log into build/counts)
#
# Takes rblk-target, rblk-bench and rblk from RBLK_BIN_DIR (else builds them in release; see
# scripts/lib/script.sh's release_bins), boots the guest under `flock /tmp/rblk-guest.lock`
# (run_guest) and there, with one rblk-target (a 256M RAM volume), runs 4k random I/O at QD1 and
# QD32 through each front end of LIST (--rows, default all, in this order):
#
#   bench         rblk-bench against rblk-target (no block device; it is its own load generator)
#   ublk          `rblk attach URI --queues 1 --depth 32 --daemon`
#   ublk-null     the same with --null-io (RBLK_ALLOW_NULL=1): no RDMA, reads return zeros
#   libublk-null  libublk's examples/null (`null add -n ID -q 1 -d 32 --foreground`): the binary
#                 LIBUBLK_NULL names (default build/libublk-null/target/release/examples/null, which
#                 scripts/compare-rxe.sh builds); "unavailable", with the reason, when missing
#   nbd           `rblk nbd URI --listen unix:SOCK` + `nbd-client -unix SOCK /dev/nbd0`
#   fuse          `rblk mount URI DIR --queues 1 --loop --daemon` (FUSE file + loop device)
#   nvmeof        Linux NVMe-oF/RDMA: nvmet-rdma exporting null_blk, nvme-rdma connected with one
#                 I/O queue (scripts/lib/target.sh's nvmeof_* functions)
#
# The devices are made by scripts/lib/target.sh's blk_attach (compare-rxe.sh's front ends), and
# each runs compare-rxe.sh's fio line (rblk-bench the same workload):
#
#   fio --name=LABEL --filename=DEV --ioengine=libaio --direct=1 --bs=4k --rw=RW --iodepth=1|32
#       --numjobs=1 --size=256M --time_based --ramp_time=1 --runtime=S --output-format=json
#
# for each RW of --rw (default randread; randwrite,randread runs both, the writes first). Every run
# is counted from its start to its end (scripts/lib/counts.sh, whose header
# says where each count comes from: tracefs hist triggers on raw_syscalls:sys_enter and
# sched:sched_switch, kprobes on rxe_post_send, rxe_post_recv and rxe_req_notify_cq, /proc/stat,
# /proc/PID/stat, /sys/block/DEV/stat). Before the counting is armed, the first front end of LIST
# (ublk when it is in LIST) runs its last RW at QD1 and QD32 uncounted: the table gives IOPS
# counted / uncounted, what the tracing costs under TCG.
#
# scripts/lib/counts.py makes the table (one row per front end, RW and depth: IOPS, CPU, and per
# I/O context switches, system calls of the server and of the load generator, io_uring_enter,
# doorbells, CQ re-arms) and issue 45's goals, met or missed; it prints the table and writes
# build/counts/table.txt and summary.json. Raw output: build/counts/guest.log. A front end that
# cannot run is "unavailable" with the reason; the script fails only when the guest run or the
# summary does, never on the figures. TCG: compare rows of one boot only.
set -euo pipefail
shopt -s inherit_errexit

REPO_ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
CALLER_PWD=$PWD
cd "$REPO_ROOT"

OUT=build/counts
PORT=7424
VOLUME_SIZE=256M
NQN=nqn.2024-12.io.rblk:counts
BINS=(rblk-target rblk-bench rblk)
ALL_ROWS=bench,ublk,ublk-null,libublk-null,nbd,fuse,nvmeof

SCRIPT_NAME=counts
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh"

# ---------------------------------------------------------------------------------------------------
# In the guest. Raw results on stdout (scripts/lib/counts.py reads them): scripts/lib/counts.sh's
# @@counts lines, and
#   @@meta KEY VALUE...
#   @@counts_json LABEL JSON        the workload's JSON report, on one line
#   @@unavailable FRONT WHY         a front end that cannot run in this boot
#   @@fail LABEL MESSAGE            a run that failed
# LABEL is FRONT:RW:QD (FRONT:RW:QD:uncounted for the uncounted run). Progress goes to stderr.

guest_main() {
    local secs=$1 rows=$2 rws=$3 bin=$4 libublk=$5 libublk_why=$6
    local addr=${RBLK_ADDR:?RBLK_ADDR: the address of the rxe device} rdev=${RBLK_DEVICE:-rxe0}
    local work
    work=$(mktemp -d /tmp/rblk-counts.XXXXXX)
    # shellcheck source=lib/target.sh
    source "$REPO_ROOT/scripts/lib/target.sh"
    # shellcheck source=lib/counts.sh
    source "$REPO_ROOT/scripts/lib/counts.sh"
    BLK_BIN=$bin BLK_URI="rblk://$addr:$PORT/v" BLK_RXE=$rdev BLK_WORK=$work BLK_NQN=$NQN
    BLK_ADDR=$addr BLK_LIBUBLK=$libublk
    COUNTS_SECS=$secs

    printf '@@meta guest_kernel %s\n@@meta guest_cpus %s\n' "$(uname -r)" "$(nproc)"
    printf '@@meta secs %s\n@@meta rblk %s\n' "$secs" "$("$bin/rblk" --version 2>&1 | head -n 1)"
    printf '@@meta fio %s\n' "$(fio --version 2>&1)"
    # perf: the host's, over 9p; whether it can count this kernel's tracepoints (not used: tracefs).
    if command -v perf >/dev/null; then
        printf '@@meta perf %s: %s\n' "$(perf --version 2>&1 | head -n 1)" \
            "$(timeout 60 perf stat -x, -e raw_syscalls:sys_enter true 2>&1 | tail -n 1 | cut -c1-200)"
    fi
    local -a fronts rwl
    IFS=, read -r -a fronts <<<"$rows"
    IFS=, read -r -a rwl <<<"$rws"
    local -A why=()
    unavailable() { # FRONT WHY
        why[$1]=$2
        printf '@@unavailable %s %s\n' "$1" "$2"
        log "$1 skipped: $2"
    }
    local f need_ublk=0
    for f in "${fronts[@]}"; do
        case $f in
        nvmeof)
            if ! command -v nvme >/dev/null; then
                unavailable nvmeof "no nvme here (scripts/deps.sh installs nvme-cli)"
            elif ! nvmeof_setup "$NQN" "$addr" 2>"$work/nvmet.err"; then
                unavailable nvmeof "cannot set up Linux NVMe-oF/RDMA: $(oneline 400 "$work/nvmet.err")"
            fi
            ;;
        nbd) command -v nbd-client >/dev/null || unavailable nbd "no nbd-client here (scripts/deps.sh installs it)" ;;
        fuse) command -v losetup >/dev/null || unavailable fuse "no losetup here" ;;
        libublk-null)
            need_ublk=1
            if [[ $libublk == - ]]; then
                unavailable libublk-null "$libublk_why"
            elif [[ ! -x $libublk ]]; then
                unavailable libublk-null "no $libublk in the guest"
            fi
            ;;
        ublk*) need_ublk=1 ;;
        esac
    done
    if ((need_ublk)) && { ! modprobe ublk_drv >&2 || [[ ! -e /dev/ublk-control ]]; }; then
        for f in ublk ublk-null libublk-null; do
            unavailable "$f" "kernel $(uname -r) has no ublk_drv (/dev/ublk-control)"
        done
    fi

    start_target "$work/target.log" "$bin" 30 --listen "$addr:$PORT" --volume "v:$VOLUME_SIZE" ||
        die "rblk-target did not start"
    COUNTS_TARGET_PID=$TARGET_PID
    # shellcheck disable=SC2064 # expand now: the trap must kill this target
    trap "kill -TERM $TARGET_PID 2>/dev/null || true" EXIT
    log "warm-up (discarded): rblk-bench, 2 s"
    timeout 120 "$bin/rblk-bench" "$BLK_URI" --device "$rdev" --quiet --runtime 2 >/dev/null ||
        log "warning: the rblk-bench warm-up failed"

    # The uncounted run, before anything is armed.
    local first=""
    for f in "${fronts[@]}"; do
        [[ -z ${why[$f]:-} ]] || continue
        [[ -z $first || $f == ublk ]] && first=$f
    done
    if [[ -n $first ]]; then
        log "$first ${rwl[-1]} QD1 and QD32 uncounted (the tracing's cost)"
        COUNTS_OFF=1 front_rows "$first" "${rwl[-1]}" 1,32 :uncounted
    fi
    counts_setup
    for f in "${fronts[@]}"; do
        [[ -z ${why[$f]:-} ]] || continue
        front_rows "$f" "${rwl[@]}"
    done
    counts_teardown
    if [[ " ${fronts[*]} " == *" nvmeof "* && -z ${why[nvmeof]:-} ]]; then
        nvmeof_teardown "$NQN" || log "warning: the NVMe-oF/RDMA export was not removed"
    fi
    kill -TERM "$TARGET_PID" 2>/dev/null || true
    wait_gone "$TARGET_PID" || true
    trap - EXIT
}

# front_rows FRONT RW... [QDS SUFFIX]: makes FRONT's device, runs each RW at QD1 and QD32 (or at
# the depths QDS, comma-separated, labels ending in SUFFIX) and removes the device.
front_rows() {
    local f=$1 rw qd
    shift
    local -a rwl=() qds=(1 32)
    local suffix=""
    while (($#)) && [[ $1 != [0-9]* ]]; do
        rwl+=("$1")
        shift
    done
    (($#)) && IFS=, read -r -a qds <<<"$1" && suffix=$2
    if [[ $f != bench ]] && ! blk_attach "$f"; then
        for rw in "${rwl[@]}"; do
            for qd in "${qds[@]}"; do printf '@@fail %s:%s:%s%s %s\n' "$f" "$rw" "$qd" "$suffix" "$BLK_ERR"; done
        done
        blk_detach "$f" || true
        return 0
    fi
    for rw in "${rwl[@]}"; do
        for qd in "${qds[@]}"; do
            workload "$f" "$rw" "$qd" "$f:$rw:$qd$suffix"
        done
    done
    [[ $f == bench ]] || blk_detach "$f" || printf '@@fail %s:detach %s\n' "$f" "$BLK_ERR"
}

# quiet CMD...: CMD with its output in BLK_WORK/run.out and run.err (counted's lines go to stdout).
quiet() { "$@" >"$BLK_WORK/run.out" 2>"$BLK_WORK/run.err"; }

# workload FRONT RW QD LABEL: one counted run through FRONT's device (BLK_DEV, served by BLK_PID).
workload() {
    local f=$1 rw=$2 qd=$3 label=$4 json=$BLK_WORK/out.json rc=0
    local -a cmd
    rm -f "$json"
    if [[ $f == bench ]]; then
        cmd=("$BLK_BIN/rblk-bench" "$BLK_URI" --device "$BLK_RXE" --quiet --ramp_time 1 --runtime "$COUNTS_SECS"
            --group_reporting --rw "$rw" --bs 4k --iodepth "$qd" -o json --output "$json")
        counted "$label" - - quiet timeout $((COUNTS_SECS * 10 + 120)) "${cmd[@]}" || rc=$?
    else
        cmd=(fio --name="$label" --filename="$BLK_DEV" --ioengine=libaio --direct=1 --bs=4k --rw="$rw"
            --iodepth="$qd" --numjobs=1 --size="$VOLUME_SIZE" --time_based --ramp_time=1 --runtime="$COUNTS_SECS"
            --output-format=json --output="$json")
        counted "$label" "$BLK_DEV" "${BLK_PID:--}" quiet timeout $((COUNTS_SECS * 10 + 120)) "${cmd[@]}" || rc=$?
    fi
    if ((rc != 0)) || [[ ! -s $json ]]; then
        printf '@@fail %s %s exited with status %s: %s\n' "$label" "${cmd[0]##*/}" "$rc" "$(oneline 400 "$BLK_WORK/run.out" "$BLK_WORK/run.err")"
        return 0
    fi
    printf '@@counts_json %s %s\n' "$label" "$(tr -s '\n\t ' ' ' <"$json")"
    log "  $label: done (${SECONDS} s into the guest script)"
}

# ---------------------------------------------------------------------------------------------------
# On the host.

summarize() { # LOG SUMMARY_JSON TABLE_TXT
    lib_python "$REPO_ROOT/scripts/lib/counts.py" "$@"
}

host_main() {
    local redraw=0 secs=3 rows=$ALL_ROWS rws=randread f
    local -a redraw_from=()
    while (($#)); do
        case $1 in
        --redraw)
            redraw=1
            if (($# >= 3)); then
                redraw_from=("$2" "$3")
                shift 2
            fi
            ;;
        --secs)
            is_count "${2:-}" || die "--secs takes a number of seconds (got '${2:-}')"
            secs=$2
            shift
            ;;
        --rows)
            rows=${2:-}
            shift
            ;;
        --rw)
            rws=${2:-}
            shift
            ;;
        *) help_or_usage_error "$1" ;;
        esac
        shift
    done
    if ((redraw)); then
        redraw_run "${redraw_from[@]}"
        return
    fi
    local -a list
    IFS=, read -r -a list <<<"$rows"
    ((${#list[@]})) || die "--rows takes front ends from $ALL_ROWS"
    for f in "${list[@]}"; do
        [[ ,$ALL_ROWS, == *",$f,"* ]] || die "--rows: no front end '$f' (they are $ALL_ROWS)"
    done
    [[ $rws =~ ^(randread|randwrite)(,(randread|randwrite))?$ ]] || die "--rw takes randread, randwrite or both (got '$rws')"
    local libublk=${LIBUBLK_NULL:-$REPO_ROOT/build/libublk-null/target/release/examples/null} why=""
    if [[ ! -x $libublk ]]; then
        why="no libublk null example at $libublk (LIBUBLK_NULL; scripts/compare-rxe.sh builds it)"
        libublk=-
    fi
    release_bins "${BINS[@]}"
    mkdir -p "$OUT"
    snapshot_bins "$OUT/bin" "${BINS[@]}"
    local glog=$OUT/guest.log
    : >"$glog"
    printf '@@meta date %s\n@@meta host_cpus %s\n@@meta command %s\n' "$(date -u +%Y-%m-%dT%H:%MZ)" "$(nproc)" \
        "scripts/counts-rxe.sh --secs $secs --rows $rows --rw $rws" >>"$glog"
    printf '@@meta build %s\n' "$(git -C "$REPO_ROOT" describe --always --dirty 2>/dev/null || echo unknown)" >>"$glog"
    run_guest "$glog" 900 "$REPO_ROOT/scripts/counts-rxe.sh" "$secs" "$rows" "$rws" "$BIN_DIR" "$libublk" "${why:--}"
    summarize_run "$glog" "$OUT"
    finish_run "$glog"
}

script_main 6 "SECS ROWS RW BIN_DIR LIBUBLK_NULL WHY" "$@"
