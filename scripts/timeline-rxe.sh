#!/usr/bin/env bash
# Where the microseconds of one QD1 4 KiB read go: a per-stage timeline from the guest kernel's own
# trace records, for three paths, in ONE rxe guest boot (issue 23, deliverable 1):
#
#   scripts/timeline-rxe.sh [--secs S] [--trace-secs T]
#   scripts/timeline-rxe.sh --redraw [LOG OUT_DIR]   # no guest: summarize LOG (default
#                                                     # build/timeline/guest.log) into OUT_DIR again
#
# Builds the release binaries (cargo build --release --workspace --all-features; RBLK_BIN_DIR=DIR
# takes rblk, rblk-target and rblk-bench from DIR instead), boots the guest (scripts/rxe-guest.sh,
# 6.12) under `flock /tmp/rblk-guest.lock` (RBLK_GUEST_LOCK=PATH for another lock file,
# RBLK_GUEST_LOCK= for none; a caller that holds it already is noticed), and there, one after the
# other, runs for S seconds (default 4) each:
#
#   ublk    fio --ioengine=libaio --direct=1 --bs=4k --rw=randread --iodepth=1 --numjobs=1 --size=256M
#           on the /dev/ublkbN of `rblk attach URI --queues 1 --depth 32 --daemon`
#   nvmeof  the same fio line on /dev/nvmeXnY: Linux NVMe-oF/RDMA, nvmet-rdma exporting a RAM
#           null_blk over the same rxe device, `nvme connect -t rdma -i 1` (scripts/lib/target.sh,
#           as compare-rxe.sh sets it up)
#   bench   rblk-bench URI --rw randread --bs 4k --iodepth 1 (the library, no block device)
#
# against one rblk-target serving a 256M RAM volume. While each runs, after 2 s of warm-up, tracefs
# (/sys/kernel/tracing, mounted if need be; trace_clock mono, 4 MiB per CPU) records for T seconds
# (default 1):
#   block:block_rq_issue, block:block_rq_complete        all devices (the parser picks the path's
#                                                        device, and null_blk's on the NVMe-oF target)
#   io_uring:*                                           every io_uring event 6.12 has
#   sched:sched_switch, sched:sched_wakeup               filtered to the path's own threads (fio's
#                                                        processes, the attach process's or
#                                                        rblk-bench's threads) when the filter takes;
#                                                        sched_switch also to and from the idle task
#                                                        (pid 0), on every vCPU
#   workqueue:workqueue_execute_start                    every work item (rxe's run as work items)
#   raw_syscalls:sys_enter, raw_syscalls:sys_exit        the same threads (io_uring_enter, io_submit,
#                                                        io_getevents, write, ...)
#   kprobes (group rblk) on the functions below that     ublk_drv and rxe have no tracepoints in 6.12
#   available_filter_functions lists
# All of them are enabled once, before the first path runs, with tracing off; each window only
# switches tracing on and sets the filters (enabling an event patches kernel code, and under TCG
# patching code the other vCPU runs has crashed the guest). So the kprobes' traps also cost
# outside the windows: the "untraced-ish p50" is fio's over the whole run, probes included.
# The trace goes to the host gzipped (base64 between @@trace markers in build/timeline/guest.log);
# the parsing is done there (scripts/lib/timeline.py; the guest's part is
# scripts/lib/timeline-guest.sh).
#
# Per I/O (QD1: one read in flight at a time). For ublk and NVMe-oF an I/O runs from a read's
# block_rq_issue on the path's device to the block_rq_complete of the same sector; for rblk-bench
# from one rxe_post_send of its I/O thread to the next. Between those anchors each boundary below is
# the FIRST event of its kind after the previous boundary that was seen (one marked "after X" is
# only looked for when X was seen in this I/O: a sched_switch into a thread counts only after that
# thread's wakeup, else a thread that never slept would match a later switch). Before the issue,
# fio's io_submit is the last one since the previous I/O completed; after the completion, fio's
# wakeup and io_getevents return are the first ones before the next issue. A stage's time is from
# the previous boundary SEEN in that I/O to this one, so per I/O the stages add up to the total;
# the table gives each stage's median and mean over the I/Os where its boundary was seen, and in
# what share of I/Os it was seen (medians do not add up; means do, over the I/Os that saw them).
#
#   ublk boundaries                        event
#   fio io_submit                          raw_syscalls:sys_enter NR 209 by fio
#   ublk_queue_rq                          kprobe ublk_queue_rq (blk-mq's queue_rq of ublk_drv; it
#                                          starts the request, so it comes BEFORE block_rq_issue)
#   block_rq_issue                         block:block_rq_issue on /dev/ublkbN
#   queue thread woken                     sched:sched_wakeup of the queue thread (the FETCH
#                                          command's completion is task work for it; 6.12 traces no
#                                          io_uring event for a uring_cmd's task work, only for polls)
#   queue thread on CPU (after woken)      sched:sched_switch to the queue thread
#   ublk task work runs                    kprobe ublk_rq_task_work_cb / ublk_cmd_tw_cb (which one
#                                          6.12 has) in the queue thread
#   io_uring_enter returns                 raw_syscalls:sys_exit NR 426 of the queue thread
#   RDMA READ posted                       kprobe rxe_post_send by the queue thread (the doorbell
#                                          write on the uverbs fd)
#   rxe's first work item starts           workqueue:workqueue_execute_start of an rdma_rxe function
#                                          (6.12: do_work, the QP's send task: the post queued it)
#   rxe requester runs                     kprobe rxe_requester (called by rxe_sender, rxe's send
#                                          task, a work item)
#   request on the wire                    kprobe rxe_xmit_packet (loopback: straight to rxe_rcv)
#   target's responder runs                kprobe rxe_receiver (6.12: the receive task, rxe's
#                                          responder; rxe_responder on older kernels) for the
#                                          target's QP; no target thread is involved (one-sided)
#   response on the wire                   kprobe rxe_xmit_packet (the read response)
#   rxe completer runs                     kprobe rxe_completer (since 6.7 rxe's send task calls it
#                                          after every rxe_requester too; the first call after
#                                          the response's xmit is taken)
#   CQE posted                             kprobe rxe_cq_post
#   completion event                       kprobe ib_uverbs_comp_handler (only when the completion
#                                          channel is armed: seen = the thread slept on it)
#   poll task work queued                  io_uring:io_uring_task_add (the POLL_ADD on the channel)
#   queue thread woken / on CPU / io_uring_enter returns: as above, the second time
#   COMMIT (ublk_ch_uring_cmd)             kprobe ublk_ch_uring_cmd by the queue thread
#   block_rq_complete                      block:block_rq_complete of the sector
#   fio woken                              sched:sched_wakeup of fio's job
#   fio io_getevents returns               raw_syscalls:sys_exit NR 208 by fio
#
#   nvmeof: fio io_submit, nvme_rdma_queue_rq (kprobe, before the issue), block_rq_issue (on the
#   multipath path device nvmeXcYnZ when the kernel has multipath: the parser takes the device
#   with the most reads that is not null_blk when /dev/nvmeXnY has none), command SEND
#   posted (rxe_post_send), rxe's first work item, rxe requester, request on the wire,
#   nvmet_rdma_recv_done (kprobe: the target's CQ handler got the command), block_rq_issue and block_rq_complete on null_blk (the
#   target's backing device), nvmet_rdma_queue_response (kprobe: data + response posted),
#   rxe_post_send, rxe requester again, on the wire, initiator's responder runs (rxe_receiver:
#   the data WRITE and the response SEND land), CQE posted, nvme_rdma_recv_done (kprobe: the host's
#   completion, in softirq), block_rq_complete, fio woken, fio io_getevents returns.
#   bench: RDMA READ posted (rxe_post_send by rblk-bench's I/O thread), rxe's first work item,
#   rxe requester, on the wire,
#   target's responder, response on the wire, rxe completer, CQE posted, completion event, bench
#   thread woken, on CPU, and the next READ posted (the end: that stage holds noticing the CQE by
#   polling it in user space, which leaves no kernel record, and issuing the next I/O).
#
# Per path also: the totals (block_rq_issue -> block_rq_complete, io_submit -> io_getevents return;
# for rblk-bench post -> next post), and per I/O over the analysed I/Os: io_uring_enter calls and
# all system calls of the serving thread (ublk: the thread that calls ublk_ch_uring_cmd; NVMe-oF:
# fio's job, the kernel serves it in softirq and work items; rblk-bench: its posting thread) and
# its context switches (sched_switch away from it; "voluntary" = it was not runnable), and fio's.
# And rxe's worker: in what share of I/Os rxe's first work item after the post (ublk, rblk-bench:
# the READ; NVMe-oF: the command SEND) ran on a vCPU that was idle at the post (a switch from the
# idle task on that vCPU between the post and the item), the post -> item time from idle and
# otherwise, and how long that vCPU had been idle before the post. Under TCG waking a halted vCPU
# is slow, so this separates a slow wakeup from slow work.
#
# What may be missing or doubtful:
# - A function with no kprobe on the running kernel (not in available_filter_functions, renamed,
#   inlined, or the probe refused) makes its boundary "n/a"; the run goes on. The guest log lists
#   the probes set and those missing (@@meta kprobes / kprobes_missing).
# - Kprobes on rxe's task functions have crashed this guest's 6.12 kernel (a NULL call from
#   rxe_sender, a panic in interrupt, on 2026-12-02 and 2026-12-03): RBLK_TIMELINE_SKIP_KPROBES="F ..."
#   leaves those functions unprobed (they are then "missing"), e.g. "rxe_requester rxe_xmit_packet
#   rxe_receiver rxe_responder rxe_completer" keeps only rxe_post_send and rxe_cq_post of rxe's.
# - rxe_requester, rxe_receiver and rxe_completer run in loops until they return -EAGAIN: only
#   their first call after the previous boundary counts, so a stage ends when the work item
#   starts, not when it did the work. rxe_xmit_packet stands for "on the wire".
# - The sched filters need the threads' ids before tracing starts; threads started later (a new
#   io_uring worker) are not traced. If a filter is refused, the event is recorded unfiltered.
# - Tracing costs: under TCG every event takes a few us of vCPU, so the traced I/Os are slower
#   than untraced ones (fio's own p50 over the whole run is printed beside for scale), and the
#   trace's timestamps have 1 us resolution.
# - The queue thread's own user-space timestamps (issue 23 asks for them too) need code in rblk
#   and are not part of this script.
#
# Prints the table and writes build/timeline/summary.json and build/timeline/table.txt
# (scripts/lib/timeline.py summarize); the raw output is build/timeline/guest.log. A path that
# fails (attach, connect, a tool) is recorded with its error and the others run. Exit status 0
# when at least one path has analysed I/Os.
# scripts/compare-rxe.sh runs this script's guest part (`--in-guest S T BIN_DIR`, with no rblk-target
# of its own running and NVMe-oF/RDMA torn down) in its own boot after its fio rows, and its
# summary with --redraw LOG OUT_DIR.
# Timing: a boot of ~15 s plus, per path, S + ~5 s of run and a few seconds to copy the trace;
# NVMe-oF setup a few seconds.
set -euo pipefail
shopt -s inherit_errexit

REPO_ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
CALLER_PWD=$PWD
cd "$REPO_ROOT"

OUT=build/timeline
PATHS=(ublk nvmeof bench)

SCRIPT_NAME=timeline
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh"

# shellcheck source=lib/timeline-guest.sh
source "$REPO_ROOT/scripts/lib/timeline-guest.sh"

# On the host: scripts/lib/timeline.py decodes the traces, builds the per-I/O timelines, prints the
# table and writes summary.json.
summarize() { # LOG SUMMARY_JSON TABLE_TXT
    lib_python "$REPO_ROOT/scripts/lib/timeline.py" summarize "$@"
}

host_main() {
    local secs=4 tsecs=1 redraw=0
    local -a redraw_from=()
    while (($#)); do
        case $1 in
        --secs | --trace-secs)
            (($# >= 2)) || die "$1 needs a value"
            if [[ $1 == --secs ]]; then secs=$2; else tsecs=$2; fi
            shift
            ;;
        --secs=*) secs=${1#*=} ;;
        --trace-secs=*) tsecs=${1#*=} ;;
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
    is_count "$secs" || die "--secs must be a positive whole number of seconds (got '$secs')"
    is_count "$tsecs" || die "--trace-secs must be a positive whole number of seconds (got '$tsecs')"
    ((secs >= WARM_SECS + tsecs + 1)) || die "--secs must be at least --trace-secs + $((WARM_SECS + 1))"

    release_bins rblk-target rblk-bench rblk
    snapshot_bins "$OUT/bin" rblk-target rblk-bench rblk
    mkdir -p "$OUT"
    rm -f "$OUT"/summary.json "$OUT"/table.txt
    local glog=$OUT/guest.log
    : >"$glog"
    log "${PATHS[*]}: ${secs} s each, traced ${tsecs} s; raw output in $glog"
    run_guest "$glog" $((300 + 3 * (secs + 60))) "$REPO_ROOT/scripts/timeline-rxe.sh" "$secs" "$tsecs" "$BIN_DIR"
    summarize_run "$glog" "$OUT"
    finish_run "$glog"
}

script_main 3 "SECS TRACE_SECS BIN_DIR" "$@"
