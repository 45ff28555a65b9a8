#!/usr/bin/env bash
# Where a request's microseconds go inside `rblk attach`'s queue thread, from the thread's own
# timestamps (`rblk attach --stage-log`), for the RDMA server and the same loop with the RDMA
# step removed, in ONE rxe guest boot (issue 23; the kernel's side is scripts/timeline-rxe.sh):
#
#   scripts/stages-rxe.sh [--secs S]
#   scripts/stages-rxe.sh --redraw [LOG OUT_DIR]   # no guest: summarize LOG (default
#                                                  # build/stages/guest.log) into OUT_DIR again
#
# Builds the release binaries (RBLK_BIN_DIR=DIR takes rblk and rblk-target from DIR instead),
# boots the guest under `flock /tmp/rblk-guest.lock` (as scripts/lib/script.sh's run_guest), starts
# one rblk-target serving a 256M RAM volume, and for each row
#
#   rdma  qd1    rblk attach URI --queues 1 --depth 32 --device rxe0 --stage-log F --daemon
#   rdma  qd32   the same
#   null  qd1    the same with --null-io (RBLK_ALLOW_NULL=1): no RDMA, the ceiling
#   null  qd32
#   sleep qd1    the RDMA server with --wait sleep (a sleep per wait: the old behaviour)
#
# runs compare-rxe.sh's fio line on the device (libaio, direct=1, bs=4k, randread, numjobs=1,
# size=256M, time_based, ramp 1 s) for S seconds (default 5), detaches (the thread writes F.q0),
# and reads the log with scripts/lib/stages.py over the last S seconds (fio's measured run, not the
# reads of the partition scan at attach). Per row: fio's IOPS and p50, and the stages' medians
# and means (see scripts/lib/stages.py for what each stage holds), the thread's time waiting,
# asleep and running its tasks, and per request its loop passes, io_uring_enter calls, sleeps and
# doorbells.
#
# Prints the tables and writes build/stages/table.txt and summary.json (scripts/lib/stages.py
# summarize); the guest's raw output is build/stages/guest.log, and each row's stage log
# build/stages/ROW.q0 (e.g. rdma-qd1.q0). A row that fails is recorded with its error and the
# others run.
# Timing: a boot of ~15 s, then per row S + ~6 s. TCG: compare rows of one boot only.
set -euo pipefail
shopt -s inherit_errexit

REPO_ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
CALLER_PWD=$PWD
cd "$REPO_ROOT"

OUT=build/stages
RBLK_PORT=7420
ROWS=("rdma 1" "rdma 32" "null 1" "null 32" "sleep 1")

SCRIPT_NAME=stages
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh"

guest_main() {
    local secs=$1 bin=$2
    local addr=${RBLK_ADDR:?RBLK_ADDR: the address of the rxe device} dev=${RBLK_DEVICE:-rxe0}
    local uri="rblk://$addr:$RBLK_PORT/v" work row kind qd
    work=$(mktemp -d /tmp/rblk-stages.XXXXXX)
    # shellcheck source=lib/target.sh
    source "$REPO_ROOT/scripts/lib/target.sh"
    printf '@@meta guest_kernel %s\n@@meta guest_cpus %s\n@@meta secs %s\n' "$(uname -r)" "$(nproc)" "$secs"
    command -v fio >/dev/null || die "no fio here (scripts/deps.sh installs it)"
    modprobe ublk_drv >&2 || true
    [[ -e /dev/ublk-control ]] || die "kernel $(uname -r) has no ublk_drv"
    start_target "$work/target.log" "$bin" 30 --listen "$addr:$RBLK_PORT" --volume v:256M ||
        die "rblk-target did not start"
    local tpid=$TARGET_PID
    # shellcheck disable=SC2064 # expand now: the trap must kill this target
    trap "kill -TERM $tpid 2>/dev/null || true" EXIT
    for row in "${ROWS[@]}"; do
        read -r kind qd <<<"$row"
        local name="$kind qd$qd" log="$work/stages-$kind-$qd" extra=()
        case $kind in
        null) extra=(--null-io) ;;
        sleep) extra=(--wait sleep) ;;
        esac
        log "$name: attach, fio randread 4k QD$qd for ${secs}s"
        if ! RBLK_ALLOW_NULL=1 attach_daemon "$work" "$bin" "$uri" --queues 1 --depth 32 --device "$dev" \
            "${extra[@]}" --stage-log "$log"; then
            printf '@@fail %s rblk attach failed: %s\n' "$name" "$(tr -s '\n' ' ' <"$work/attach.log" | cut -c1-300)"
            continue
        fi
        local bdev=$ATTACH_DEV
        if ! wait_bdev "$bdev"; then
            printf '@@fail %s %s did not appear\n' "$name" "$bdev"
        elif ! fio --name=stages --filename="$bdev" --ioengine=libaio --direct=1 --bs=4k --rw=randread \
            --iodepth="$qd" --numjobs=1 --size=256M --time_based --runtime="$secs" --ramp_time=1 \
            --output-format=json >"$work/fio.json" 2>"$work/fio.err"; then
            printf '@@fail %s fio failed: %s\n' "$name" "$(tr -s '\n' ' ' <"$work/fio.err" | cut -c1-300)"
        fi
        detach_daemon "$bin" "$bdev" "$ATTACH_PID" || printf '@@fail %s rblk detach failed\n' "$name"
        [[ -s $work/fio.json ]] || continue
        printf '@@row %s %s\n' "$name" "$(lib_python "$REPO_ROOT/scripts/lib/stages.py" fio-row "$work/fio.json")"
        if [[ -s $log.q0 ]]; then
            # Read on the host: python over a QD32 log takes minutes under TCG.
            printf '@@stagelog %s\n' "$name"
            gzip -c "$log.q0" | base64 -w0
            printf '\n@@endstagelog\n'
        else
            printf '@@fail %s no stage log %s.q0\n' "$name" "$log"
        fi
        rm -f "$work/fio.json" "$log".q*
    done
}

# On the host: scripts/lib/stages.py reads the log.
summarize() { # LOG SUMMARY_JSON TABLE_TXT
    lib_python "$REPO_ROOT/scripts/lib/stages.py" summarize "$@"
}

host_main() {
    local secs=5 redraw=0
    local -a redraw_from=()
    while (($#)); do
        case $1 in
        --secs)
            (($# >= 2)) || die "$1 needs a value"
            secs=$2
            shift
            ;;
        --redraw)
            redraw=1
            if (($# >= 3)) && [[ $2 != -* ]]; then
                redraw_from=("$2" "$3")
                shift 2
            fi
            ;;
        *) help_or_usage_error "$1" ;;
        esac
        shift
    done
    if ((redraw)); then
        redraw_run "${redraw_from[@]}"
        return
    fi
    mkdir -p "$OUT"
    is_count "$secs" || die "--secs must be a positive whole number of seconds (got '$secs')"
    release_bins rblk-target rblk
    snapshot_bins "$OUT/bin" rblk-target rblk
    local glog=$OUT/guest.log
    : >"$glog"
    run_guest "$glog" $((300 + ${#ROWS[@]} * (secs + 60))) "$REPO_ROOT/scripts/stages-rxe.sh" "$secs" "$BIN_DIR"
    summarize_run "$glog" "$OUT"
    finish_run "$glog"
}

script_main 2 "SECS BIN_DIR" "$@"
