#!/usr/bin/env bash
# Before/after: `rblk attach`'s own CPU per I/O and its IOPS, for two builds of rblk's binaries, in
# ONE rxe guest boot:
#
#   scripts/ab-attach.sh OLD_BIN_DIR NEW_BIN_DIR [--rounds N] [--secs S] [--target old|new]
#   scripts/ab-attach.sh --redraw        # no guest: summarize build/ab-attach/guest.log again
#
# OLD_BIN_DIR and NEW_BIN_DIR each hold release builds of `rblk-target` and `rblk` (e.g.
# build/release of two git worktrees; the same directory twice measures the harness's own noise).
# Nothing is built here.
#
# What runs: scripts/rxe-guest.sh boots the rxe guest (6.12: it needs ublk_drv) once, under
# `flock /tmp/rblk-guest.lock` (one guest at a time on this machine; RBLK_GUEST_LOCK=PATH to use
# another lock file, RBLK_GUEST_LOCK= to take none; a caller that holds it already is noticed). In the
# guest, ONE rblk-target (NEW's by default, --target old for OLD's: the data path is one-sided, so
# the target's CPU is ~0 whichever it is) serves a 256M RAM volume on the rxe address. Then, for
# every round, each build in turn (odd rounds OLD first, even rounds NEW first), with that build's
# own `rblk`:
#
#   rblk attach rblk://ADDR:7420/v --queues 1 --depth 32 --device rxe0 --daemon   (prints DEV; the pid on stderr)
#   2 s idle: the attach process's CPU with no I/O, for information
#   fio --name=W --filename=DEV --ioengine=libaio --direct=1 --bs=4k --numjobs=1 --size=256M
#       --time_based --runtime=SECS --output-format=json --rw=randwrite --iodepth=32
#   the same with --rw=randread
#   rblk detach DEV, and wait until the attach process has exited
#
# A discarded warm-up (each build attached once, 2 s of randwrite) comes before round 1.
#
# What is measured, and why so:
# - IOPS: fio's JSON `jobs[0].write.iops` / `jobs[0].read.iops`.
# - CPU per I/O of the attach process (the ublk server: all its threads, io_uring workers included):
#   its utime + stime (/proc/PID/stat fields 14 and 15, clock ticks of `getconf CLK_TCK`) read just
#   before fio starts and just after it exits; (delta / CLK_TCK) / total I/Os completed, where the
#   total is fio's `total_ios`. The CPU window must cover the same interval as the I/O count, so fio
#   runs here WITHOUT --ramp_time (compare-rxe.sh's rows have --ramp_time=1, whose I/Os fio leaves
#   out of its counts but which the CPU window would include). The window also holds fio's own
#   start and exit (a few hundred ms under TCG) with no I/O in flight: that adds the attach
#   process's idle CPU, which the 2 s idle reading shows to be small (or not). As a cross-check with
#   ns resolution, the sum of its threads' /proc/PID/task/*/schedstat run time over the same
#   window ("sched us/IO" in the table; it misses threads that exit within the window).
# - fio's completion latency p50 (clat, us), for information.
# - Per build and workload: median over the rounds and the spread (min-max); the ratio new/old of
#   the medians. IOPS new/old > 1 and CPU new/old < 1 are improvements.
#
# Prints the table on the host and writes build/ab-attach/summary.json (every run, each failure
# with its error, medians, spreads, ratios) and build/ab-attach/table.txt; the guest's raw output
# (fio's JSON reports between markers) is build/ab-attach/guest.log. A round that fails (attach,
# fio, detach) is recorded with its error and the run goes on; figures of the jobs that did
# complete in a failed round still count. Exit status: 0 when every build has at least one round
# whose attach and both fio jobs succeeded; 1 otherwise, or when the guest run failed.
#
# Timing: about 15 s of boot, then per round and build SECS + ~4 s per fio job, ~2-5 s to attach
# and detach and 2 s idle: --rounds 3 --secs 10 took 4 minutes (241 s of guest run) on 2026-12-02,
# --rounds 1 --secs 2 35 s, the kernel already downloaded. TCG makes absolute figures
# meaningless and they swing with the host's load (another qemu, a cargo build): compare the
# ratios from the same boot, on an idle host, and look at the spreads. utime/stime are sampled
# at the tick (CLK_TCK, usually 100 Hz): over SECS seconds that is fine for CPU shares above a
# few percent.
set -euo pipefail
shopt -s inherit_errexit

REPO_ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
CALLER_PWD=$PWD
cd "$REPO_ROOT"

OUT=build/ab-attach
VOLUME_SIZE=256M
RBLK_PORT=7420
WARMUP_SECS=2
IDLE_SECS=2
BUILDS=(old new)
WORKLOADS=(randwrite randread) # randwrite first: the reads then read written blocks

SCRIPT_NAME=ab-attach
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh"

# ---------------------------------------------------------------------------------------------------
# In the guest: the rounds; raw results on stdout between markers, for the host to parse.
#   @@meta KEY VALUE...
#   @@idle BUILD ROUND TICKS SCHED_NS WALL_NS           the attach process idle for IDLE_SECS
#   @@begin BUILD ROUND WORKLOAD TICKS SCHED_NS WALL_NS CMD...   fio's JSON report follows
#   @@end
#   @@fail BUILD ROUND STEP MESSAGE                     STEP: attach, randwrite, randread, detach
# Round 0 is the warm-up. Progress goes to stderr.

guest_main() {
    local secs=$1 rounds=$2 target_build=$5
    local -A bin=([old]=$3 [new]=$4)
    local addr=${RBLK_ADDR:?RBLK_ADDR: the address of the rxe device} dev=${RBLK_DEVICE:-rxe0}
    local uri="rblk://$addr:$RBLK_PORT/v" work tpid hz b
    work=$(mktemp -d /tmp/rblk-ab.XXXXXX)
    hz=$(getconf CLK_TCK)

    printf '@@meta guest_kernel %s\n' "$(uname -r)"
    printf '@@meta guest_cpus %s\n' "$(nproc)"
    printf '@@meta clk_tck %s\n' "$hz"
    command -v fio >/dev/null || die "no fio here (scripts/deps.sh installs it)"
    printf '@@meta fio %s\n' "$(fio --version)"
    for b in "${BUILDS[@]}"; do
        printf '@@meta version_%s %s\n' "$b" "$({ "${bin[$b]}/rblk" --version 2>&1 || true; } | head -n 1)"
    done
    modprobe ublk_drv >&2 || true
    [[ -e /dev/ublk-control ]] || die "kernel $(uname -r) has no ublk_drv (/dev/ublk-control)"

    log "starting ${bin[$target_build]}/rblk-target --listen $addr:$RBLK_PORT --volume v:$VOLUME_SIZE"
    # shellcheck source=lib/target.sh
    source "$REPO_ROOT/scripts/lib/target.sh"
    start_target "$work/target.log" "${bin[$target_build]}" 30 --listen "$addr:$RBLK_PORT" \
        --volume "v:$VOLUME_SIZE" || die "rblk-target did not start"
    tpid=$TARGET_PID
    # shellcheck disable=SC2064 # expand now: the trap must kill this target
    trap "kill -TERM $tpid 2>/dev/null || true" EXIT
    printf '@@meta target %s/rblk-target (%s)\n' "${bin[$target_build]}" "$target_build"

    # The run time of process $1's live threads, in ns (first field of each task's schedstat).
    proc_sched_ns() {
        local sum=0 ns _ t
        for t in /proc/"$1"/task/*/schedstat; do
            read -r ns _ <"$t" 2>/dev/null && sum=$((sum + ns))
        done
        echo "$sum"
    }
    fail() { # BUILD ROUND STEP MESSAGE
        printf '@@fail %s %s %s %s\n' "$1" "$2" "$3" "$4"
        log "  FAILED: $1 round $2 $3: $4"
    }

    local blk_dev blk_pid
    # Attach with build $1's rblk (round $2): sets blk_dev and blk_pid, or records the failure.
    attach() {
        local b=$1 r=$2
        blk_dev="" blk_pid=""
        # A file, not $(...): the background server could keep a pipe open.
        if ! timeout 120 "${bin[$b]}/rblk" attach "$uri" --queues 1 --depth 32 --device "$dev" --daemon \
            >"$work/attach.out" 2>"$work/attach.log"; then
            fail "$b" "$r" attach "rblk attach --daemon failed: $(oneline 400 "$work/attach.out" "$work/attach.log")"
            return 1
        fi
        blk_dev=$(sed -n 1p "$work/attach.out")
        # This rblk says its pid on stderr; an older one on stdout's second line.
        blk_pid=$(sed -n 's/^rblk: pid \([0-9][0-9]*\) serves .*/\1/p' "$work/attach.log")
        [[ -n $blk_pid ]] || blk_pid=$(sed -n '2s/^pid \([0-9][0-9]*\)$/\1/p' "$work/attach.out")
        if [[ $blk_dev != /dev/ublkb* || -z $blk_pid ]]; then
            fail "$b" "$r" attach "rblk attach printed no /dev/ublkbN line (stdout) and 'rblk: pid N serves' line (stderr): $(oneline 400 "$work/attach.out")"
            [[ -n $blk_pid ]] && kill -TERM "$blk_pid" 2>/dev/null && wait_gone "$blk_pid"
            return 1
        fi
        if ! wait_bdev "$blk_dev"; then
            fail "$b" "$r" attach "$blk_dev did not appear as a block device"
            detach "$b" "$r" || true
            return 1
        fi
    }
    # Detach build $1's device (round $2); records a failure and kills the attach process if need be.
    detach() {
        local b=$1 r=$2
        if ! timeout 60 "${bin[$b]}/rblk" detach "$blk_dev" >"$work/detach.log" 2>&1; then
            fail "$b" "$r" detach "rblk detach $blk_dev failed: $(oneline 400 "$work/detach.log")"
            kill -TERM "$blk_pid" 2>/dev/null || true
        fi
        if ! wait_gone "$blk_pid"; then
            fail "$b" "$r" detach "rblk attach (pid $blk_pid) did not exit after rblk detach: SIGKILL"
            kill -KILL "$blk_pid" 2>/dev/null || true
            wait_gone "$blk_pid" || true
            return 1
        fi
    }
    # fio workload $3 (randwrite|randread) for $4 s on build $1's device, round $2; the attach
    # process's CPU over exactly fio's lifetime.
    run_fio() {
        local b=$1 r=$2 rw=$3 s=$4 json="$work/fio.json" c0 c1 n0 n1 t0 t1 rc=0
        local -a cmd=(fio --name="${rw}_4k_qd32" --filename="$blk_dev" --ioengine=libaio --direct=1 --bs=4k
            --numjobs=1 --size="$VOLUME_SIZE" --time_based --runtime="$s" --output-format=json
            --rw="$rw" --iodepth=32)
        rm -f "$json"
        if ! c0=$(proc_ticks "$blk_pid") || ! n0=$(proc_sched_ns "$blk_pid"); then
            fail "$b" "$r" "$rw" "rblk attach (pid $blk_pid) is gone before fio"
            return 1
        fi
        t0=${EPOCHREALTIME/./}
        timeout $((s * 10 + 120)) "${cmd[@]}" --output="$json" >"$work/fio.err" 2>&1 || rc=$?
        t1=${EPOCHREALTIME/./}
        if ! c1=$(proc_ticks "$blk_pid") || ! n1=$(proc_sched_ns "$blk_pid"); then
            fail "$b" "$r" "$rw" "rblk attach (pid $blk_pid) exited during fio (fio status $rc): $(oneline 400 "$work/fio.err")"
            return 1
        fi
        if ((rc != 0)) || [[ ! -s $json ]]; then
            fail "$b" "$r" "$rw" "fio exited with status $rc: $(oneline 400 "$work/fio.err" "$json")"
            return 1
        fi
        printf '@@begin %s %s %s %s %s %s %s\n' "$b" "$r" "${rw}_4k_qd32" "$((c1 - c0))" "$((n1 - n0))" \
            "$(((t1 - t0) * 1000))" "${cmd[*]}"
        cat "$json"
        printf '\n@@end\n'
    }
    # One attach of build $1 in round $2 (0: the warm-up) with fio jobs of $3 s each: WORKLOAD... follow.
    one_build() {
        local b=$1 r=$2 s=$3 c0 c1 n0 n1 t0 t1 w
        shift 3
        if ((r > 0)); then log "round $r/$rounds: $b (${bin[$b]}/rblk)"; else log "warm-up: $b (${bin[$b]}/rblk)"; fi
        attach "$b" "$r" || return 0
        log "  $blk_dev, pid $blk_pid"
        if ((r > 0)) && c0=$(proc_ticks "$blk_pid") && n0=$(proc_sched_ns "$blk_pid"); then
            t0=${EPOCHREALTIME/./}
            sleep "$IDLE_SECS"
            t1=${EPOCHREALTIME/./}
            if c1=$(proc_ticks "$blk_pid") && n1=$(proc_sched_ns "$blk_pid"); then
                printf '@@idle %s %s %s %s %s\n' "$b" "$r" "$((c1 - c0))" "$((n1 - n0))" "$(((t1 - t0) * 1000))"
            fi
        fi
        for w in "$@"; do
            run_fio "$b" "$r" "$w" "$s" && log "  fio $w: done"
        done
        detach "$b" "$r" || true
    }

    log "warm-up (discarded): each build attached once, ${WARMUP_SECS} s of randwrite"
    for b in "${BUILDS[@]}"; do
        one_build "$b" 0 "$WARMUP_SECS" randwrite
    done
    local r
    local -a order
    for r in $(seq 1 "$rounds"); do
        if ((r % 2)); then order=(old new); else order=(new old); fi
        for b in "${order[@]}"; do
            printf '@@order %s %s\n' "$r" "$b"
            one_build "$b" "$r" "$secs" "${WORKLOADS[@]}"
        done
    done

    kill -TERM "$tpid"
    local rc=0
    wait "$tpid" || rc=$?
    trap - EXIT
    ((rc == 0)) || {
        tail -n 20 "$work/target.log" >&2
        log "warning: rblk-target exited with status $rc after SIGTERM"
        printf '@@meta target_exit %s\n' "$rc"
    }
    rm -rf "$work"
    printf '@@meta complete yes\n'
}

# ---------------------------------------------------------------------------------------------------
# On the host: scripts/lib/ab.py parses the guest's output, prints the table, writes summary.json;
# it exits 1 when a build has no complete round (or the log has no results at all).

summarize() { # LOG SUMMARY_JSON TABLE_TXT
    lib_python "$REPO_ROOT/scripts/lib/ab.py" "$@"
}

host_main() {
    local secs=10 rounds=3 target=new redraw=0
    local -a dirs=()
    while (($#)); do
        case $1 in
        --rounds | --secs | --target)
            (($# >= 2)) || die "$1 needs a value"
            case $1 in
            --rounds) rounds=$2 ;;
            --secs) secs=$2 ;;
            --target) target=$2 ;;
            esac
            shift
            ;;
        --rounds=*) rounds=${1#*=} ;;
        --secs=*) secs=${1#*=} ;;
        --target=*) target=${1#*=} ;;
        --redraw) redraw=1 ;;
        -*) help_or_usage_error "$1" ;;
        *) dirs+=("$1") ;;
        esac
        shift
    done
    if ((redraw)); then
        [[ -s $OUT/guest.log ]] || die "no $OUT/guest.log to summarize"
        summarize "$OUT/guest.log" "$OUT/summary.json" "$OUT/table.txt"
        return
    fi
    ((${#dirs[@]} == 2)) || {
        usage >&2
        exit 2
    }
    is_count "$secs" || die "--secs must be a positive whole number of seconds (got '$secs')"
    is_count "$rounds" || die "--rounds must be a positive whole number (got '$rounds')"
    [[ $target == old || $target == new ]] || die "--target must be old or new (got '$target')"
    local -A dir=()
    local i b f
    for i in 0 1; do
        b=${BUILDS[$i]}
        f=${dirs[$i]}
        [[ $f == /* ]] || f=$CALLER_PWD/$f
        dir[$b]=$(cd -- "$f" 2>/dev/null && pwd -P) || die "$b: ${dirs[$i]} is not a directory"
        for f in rblk-target rblk; do
            [[ -x ${dir[$b]}/$f ]] || die "$b: no ${dir[$b]}/$f"
        done
    done

    mkdir -p "$OUT"
    rm -f "$OUT"/summary.json "$OUT"/table.txt
    local glog=$OUT/guest.log
    {
        printf '@@meta secs %s\n@@meta rounds %s\n' "$secs" "$rounds"
        for b in "${BUILDS[@]}"; do
            printf '@@meta dir_%s %s\n' "$b" "${dir[$b]}"
            printf '@@meta sha_%s %s\n' "$b" "$(sha256sum "${dir[$b]}/rblk" | cut -d' ' -f1)"
        done
    } >"$glog"
    log "old: ${dir[old]}; new: ${dir[new]}; $rounds round(s) of ${secs} s per fio job; raw output in $glog"
    # Guest run: boot + warm-up + per round and build: attach/detach, idle, two fio jobs; generous.
    run_guest "$glog" $((300 + rounds * (240 + secs * 8))) "$REPO_ROOT/scripts/ab-attach.sh" \
        "$secs" "$rounds" "${dir[old]}" "${dir[new]}" "$target"
    summarize_run "$glog" "$OUT"
    finish_run "$glog"
}

script_main 5 "SECS ROUNDS OLD_BIN_DIR NEW_BIN_DIR old|new" "$@"
