#!/usr/bin/env bash
# rblk against raw verbs and against Linux's NVMe-oF/RDMA, side by side, on the same rxe device in
# ONE guest boot:
#
#   scripts/compare-rxe.sh [--quick]
#   scripts/compare-rxe.sh --redraw [LOG OUT_DIR]   # no guest: summarize LOG again (default
#                                                   # build/compare/guest.log into build/compare)
#
# Builds the release binaries on the host (rblk-target, rblk-bench, rblk, rblk-test-client) and
# libublk 0.4.8's examples/null (offline, into build/libublk-null/), boots the rxe guest
# (scripts/rxe-guest.sh) once, and there, COMPARE_ROUNDS times:
#
# 1. perftest in loopback on rxe0 and the matching rblk-bench runs against rblk-target, pair by
#    pair, interleaved: randread and randwrite 4k QD32, read and write 64k QD32 (operations per
#    second), randread 4k QD1 p50 (ib_read_lat; rblk-bench also with --spin 1ms, and the raw fabric
#    with rblk-test-client raw-lat), randwrite 4k QD1 p50 (2 x ib_write_lat), and randread 4k p99
#    with 2 jobs x QD16 against rblk-bench's own 1 job x QD32 (also --poll, two processes, and the
#    raw fabric).
# 2. Block devices: the same fio jobs (4k randwrite QD32, randread QD32, randread QD1; libaio,
#    direct; only --filename differs) through every path, one after the other, each device made
#    and removed every round: nvmeof (Linux NVMe-oF/RDMA over a memory-backed null_blk), nbd
#    (rblk nbd + nbd-client), fuse (rblk mount --loop), ublk (rblk attach), ublk-sleep (--wait
#    sleep), ublk-q2 (--queues 2, QD32 only), ublk-null (--null-io: no RDMA) and libublk-null
#    (libublk's examples/null). A path that cannot run in this boot is "unavailable", with why.
# 3. After the rounds: one more rblk-bench run for the charts, and the QD1 per-stage timeline
#    (scripts/timeline-rxe.sh's guest part, `--in-guest 8 1 BIN_DIR`; the host summarizes it with
#    `scripts/timeline-rxe.sh --redraw` into build/compare/timeline/). rxe's task functions are not
#    probed (RBLK_TIMELINE_SKIP_KPROBES, default "rxe_requester rxe_xmit_packet rxe_receiver
#    rxe_responder rxe_completer"; set it empty to probe them): with them the guest's 6.12 kernel
#    panicked in two runs. Before the timeline: the counts per I/O of every front end at QD1 and
#    QD32 (scripts/counts-rxe.sh's guest part with --secs 3, randread: system calls, context
#    switches, doorbells and CQ re-arms per I/O beside IOPS and CPU, with libublk's null target; the
#    host summarizes them with `scripts/counts-rxe.sh --redraw` into build/compare/counts/).
#
# Prints the tables and writes build/compare/table.txt (the same text) and summary.json: rblk
# against perftest; every block device against NVMe-oF and rblk-bench, with the guest's CPU per
# I/O, vCPU busy, queue thread sleeps per I/O and the target's CPU; the goals (issue 23, medians of
# this boot's rounds: ublk randread QD1 p50 <= 0.5 x NVMe-oF's and <= 1.6 x rblk-bench's; ublk
# randread and randwrite QD32 >= 2 x NVMe-oF, >= 0.75 x rblk-bench and >= 0.85 x ublk-null); the
# failures; the timeline's table. Charts (scripts/plot.py, Debian's python3-matplotlib) in
# build/compare/: compare.png (every ratio with its goal), iops.png (IOPS over time of the extra
# run), latency-cdf.png (the last round's rblk-bench latencies). Raw output: build/compare/guest.log.
# docs/performance.md ("How scripts/compare-rxe.sh measures") says what each row runs and how,
# why so, and what summary.json holds.
#
# A row that fails (a tool's error or timeout, a transport error, a device that cannot be made or
# removed, output that does not parse) is recorded with its error (FAILED in the table, "failures"
# in summary.json) and the run goes on. The run fails (exit status 1, after the tables and
# summary.json are written) only when a goal row is missing (ublk, nvmeof or rblk-bench of a
# block-device workload) or when the guest run itself fails.
#
# Options and environment:
#   --quick            1 round of 2 s (a CI smoke test that the comparison works)
#   --redraw [LOG OUT_DIR]  no guest: parse the guest.log of an earlier run again (its SECS,
#                      ROUNDS and perftest arguments are in it), rewrite the tables and charts
#   COMPARE_SECS       measured seconds per run (default 5)
#   COMPARE_ROUNDS     rounds of every pair (default 4)
#   COMPARE_PERFTEST_BW_ARGS  extra perftest arguments for the bandwidth runs (default "-Q 1")
#   RBLK_BIN_DIR       take rblk-target, rblk-bench, rblk and rblk-test-client from this directory
#                      instead of building them (e.g. a build of a git worktree); default: cargo
#                      build --release --workspace --all-features, then ${CARGO_TARGET_DIR:-build}/release.
#                      The guest runs copies of them in build/compare/bin/ (another build during
#                      the run once swapped rblk under it: every rblk front end failed)
#   RBLK_GUEST_LOCK    the guest runs under `flock /tmp/rblk-guest.lock` (one guest at a time on this
#                      machine; PATH for another lock file, empty for none); a caller that holds
#                      the lock already (`flock /tmp/rblk-guest.lock scripts/compare-rxe.sh`) is
#                      noticed and the lock is not taken twice
#   RXE_GUEST_TIMEOUT  seconds the guest run may take (default: generous, from SECS and ROUNDS)
# Timing: --quick is a guest run of about 8 to 12 minutes (boot included; 16 on 2026-12-07 with
# the host at load 13), after building; building libublk's example the first time adds about 4
# minutes (10 on that loaded host). TCG makes absolute figures
# meaningless and boots vary by ~10% (far more on a busy host): compare ratios from the same boot,
# on an idle host. The guest's 6.12 kernel has panicked in rdma_rxe now and then: the host then
# prints what the guest reported, the reason and INCOMPLETE, and fails.
#
# Where things are: the boot and the host side here; the guest's part in scripts/lib/compare-guest.sh
# (every measured run through `measure` in scripts/lib/compare-runs.sh; the block devices in
# scripts/lib/compare-blk.sh); the analysis in scripts/lib/compare.py (tests: test_compare*.py).
set -euo pipefail
shopt -s inherit_errexit

REPO_ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
CALLER_PWD=$PWD
cd "$REPO_ROOT"

OUT=build/compare
VOLUME_SIZE=256M
LOG_INTERVAL_MS=100 # rblk-bench --log-interval of the picture run
# scripts/timeline-rxe.sh --secs and --trace-secs in this boot: 1 s traced, as its default, but 8 s
# per path rather than 4, so that the trace still falls inside the run when a busy host slows the
# guest's start-up of the window (at 4 s, a run on a loaded host traced fio's and rblk-bench's ends).
TIMELINE_SECS=8
TIMELINE_TRACE_SECS=1
# scripts/counts-rxe.sh --secs in this boot (its default), every front end, randread.
COUNTS_SECS=3
RBLK_PORT=7420

SCRIPT_NAME=compare
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh"
# shellcheck source=lib/compare-guest.sh
source "$REPO_ROOT/scripts/lib/compare-guest.sh"
# shellcheck source=lib/libublk-null.sh
source "$REPO_ROOT/scripts/lib/libublk-null.sh"

# On the host: the guest's log to the tables and summary.json (scripts/lib/compare.py).
summarize() { # LOG SUMMARY_JSON TABLE_TXT
    lib_python "$REPO_ROOT/scripts/lib/compare.py" "$@" "$REPO_ROOT/scripts/timeline-rxe.sh" \
        "$REPO_ROOT/scripts/counts-rxe.sh"
}

host_main() {
    # Passed into the guest with the other RBLK_* variables (see the header, part 3).
    export RBLK_TIMELINE_SKIP_KPROBES="${RBLK_TIMELINE_SKIP_KPROBES-rxe_requester rxe_xmit_packet rxe_receiver rxe_responder rxe_completer}"
    local secs=${COMPARE_SECS:-5} rounds=${COMPARE_ROUNDS:-4} bw_args=${COMPARE_PERFTEST_BW_ARGS:--Q 1}
    local redraw=0
    local -a redraw_from=()
    while (($#)); do
        case $1 in
        --quick)
            secs=2 rounds=1
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
    is_count "$secs" || die "COMPARE_SECS must be a positive whole number of seconds (got '$secs')"
    is_count "$rounds" || die "COMPARE_ROUNDS must be a positive whole number (got '$rounds')"

    scripts/deps.sh
    local glog=$OUT/guest.log
    if ((redraw)); then
        local rlog=${redraw_from[0]:-$glog} rout=${redraw_from[1]:-$OUT}
        # LOG and OUT_DIR relative to where the script was started, not to the repository.
        [[ ${#redraw_from[@]} == 0 || $rlog == /* ]] || rlog=$CALLER_PWD/$rlog
        [[ ${#redraw_from[@]} == 0 || $rout == /* ]] || rout=$CALLER_PWD/$rout
        [[ -s $rlog ]] || die "no $rlog to redraw from"
        mkdir -p "$rout"
        summarize_run "$rlog" "$rout"
        draw "$rout"
        finish_run "$rlog"
        return 0
    fi
    release_bins rblk-target rblk-bench rblk rblk-test-client
    snapshot_bins "$OUT/bin" rblk-target rblk-bench rblk rblk-test-client
    LIBUBLK_NULL_INFO=""
    build_libublk_null || log "libublk-null rows unavailable: $LIBUBLK_NULL_WHY"
    mkdir -p "$OUT"
    rm -rf "$OUT"/summary.json "$OUT"/table.txt "$OUT"/*.png "$OUT"/bench* "$OUT"/rblk-*.json "$OUT"/timeline "$OUT"/counts
    printf '@@meta secs %s\n@@meta rounds %s\n@@meta perftest_bw_args %s\n@@meta libublk_null %s\n' \
        "$secs" "$rounds" "$bw_args" "${LIBUBLK_NULL_INFO:-unavailable: $LIBUBLK_NULL_WHY}" >"$glog"
    log "$rounds round(s) of ${secs}s per run in one guest boot; raw output in $glog"
    # Generous: per round ~110 s at 5 s for the verbs rows, 23 fio runs of SECS + ~4 s and making
    # and removing 8 devices; the timeline; the boot.
    RBLK_BIN_DIR=$BIN_DIR RBLK_LIBUBLK_NULL=$LIBUBLK_NULL RBLK_LIBUBLK_NULL_WHY=$LIBUBLK_NULL_WHY \
        run_guest "$glog" $((600 + rounds * (500 + secs * 80))) "$REPO_ROOT/scripts/compare-rxe.sh" \
        "$secs" "$rounds" "$bw_args"
    summarize_run "$glog" "$OUT"
    draw "$OUT"
    finish_run "$glog"
}

# The charts of OUT_DIR $1, with scripts/plot.py (Debian's matplotlib, hence /usr/bin/python3). A
# chart whose input is missing (its rows failed) is left out, with a warning.
draw() {
    local out=$1 title f
    title="scripts/compare-rxe.sh, $(date -u +%F)"
    plot() {
        /usr/bin/python3 scripts/plot.py "$@" || log "warning: scripts/plot.py $* failed"
    }
    [[ -s $out/summary.json ]] || return 0
    plot compare -o "$out/compare.png" --title "$title: rblk vs perftest and Linux NVMe-oF/RDMA on rxe" \
        "$out/summary.json"
    if [[ -s $out/bench_iops.1.log ]]; then
        plot series -o "$out/iops.png" --title "rblk-bench randread 4k QD32 over rxe, every ${LOG_INTERVAL_MS} ms" \
            "$out/bench_iops.1.log"
    else
        log "warning: no $out/bench_iops.1.log: no iops.png"
    fi
    local -a cdf=()
    for f in randread_4k_qd1 randread_4k_qd1_spin randread_4k_qd32 randwrite_4k_qd1 randwrite_4k_qd32; do
        [[ -s $out/rblk-$f.json ]] && cdf+=("$out/rblk-$f.json")
    done
    if ((${#cdf[@]})); then
        plot cdf -o "$out/latency-cdf.png" --title "rblk-bench latency over rxe (last round)" "${cdf[@]}"
    fi
    log "charts in $out: compare.png, iops.png, latency-cdf.png"
}

script_main 3 "SECS ROUNDS PERFTEST_BW_ARGS" "$@"
