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
# the parsing is done there.
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
# Prints the table and writes build/timeline/summary.json and build/timeline/table.txt; the raw
# output is build/timeline/guest.log. A path that fails (attach, connect, a tool) is recorded
# with its error and the others run. Exit status 0 when at least one path has analysed I/Os.
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
VOLUME_SIZE=256M
RBLK_PORT=7420
WARM_SECS=2
NQN=nqn.2024-12.io.rblk:timeline
PATHS=(ublk nvmeof bench)
# Kprobe candidates; only those in available_filter_functions are set.
KPROBES=(ublk_queue_rq ublk_rq_task_work_cb ublk_cmd_tw_cb ublk_ch_uring_cmd
    rxe_post_send rxe_requester rxe_xmit_packet rxe_receiver rxe_responder rxe_completer rxe_cq_post
    ib_uverbs_comp_handler nvme_rdma_queue_rq nvme_rdma_recv_done nvmet_rdma_recv_done
    nvmet_rdma_queue_response)

SCRIPT_NAME=timeline
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh"

# ---------------------------------------------------------------------------------------------------
# In the guest. Raw results on stdout:
#   @@meta KEY VALUE...
#   @@path PATH KEY VALUE...       per path: dev (MAJ,MIN), dev_name, target_dev, tids, fio_p50_us
#   @@fail PATH MESSAGE
#   @@trace PATH                   the trace file, gzip | base64, then
#   @@endtrace PATH
# Progress goes to stderr.

guest_main() {
    local secs=$1 tsecs=$2 bin=$3
    local addr=${RBLK_ADDR:?RBLK_ADDR: the address of the rxe device} dev=${RBLK_DEVICE:-rxe0}
    local uri="rblk://$addr:$RBLK_PORT/v" work tr=/sys/kernel/tracing
    work=$(mktemp -d /tmp/rblk-timeline.XXXXXX)
    # shellcheck source=lib/target.sh
    source "$REPO_ROOT/scripts/lib/target.sh"

    printf '@@meta secs %s\n@@meta trace_secs %s\n' "$secs" "$tsecs"
    printf '@@meta guest_kernel %s\n' "$(uname -r)"
    printf '@@meta guest_cpus %s\n' "$(nproc)"
    printf '@@meta fio %s\n' "$(fio --version)"
    printf '@@meta rblk %s\n' "$("$bin/rblk" --version 2>&1 | head -n 1)"
    [[ -e $tr/trace ]] || mount -t tracefs nodev "$tr" || die "cannot mount tracefs on $tr"
    [[ -e $tr/trace ]] || die "no $tr/trace"
    local -a iou=("$tr"/events/io_uring/io_uring_*)
    printf '@@meta io_uring_events %s\n' "${iou[*]##*/}"

    fail() { # PATH MESSAGE
        printf '@@fail %s %s\n' "$1" "$2"
        log "  FAILED: $1: $2"
    }
    oneline() { cat "$@" 2>/dev/null | tr -s '\r\n\t' '   ' | cut -c1-400; }

    start_target "$work/target.log" "$bin" 30 --listen "$addr:$RBLK_PORT" --volume "v:$VOLUME_SIZE" ||
        die "rblk-target did not start"
    local tpid=$TARGET_PID
    # shellcheck disable=SC2064 # expand now: the trap must kill this target
    trap "kill -TERM $tpid 2>/dev/null || true" EXIT

    # Modules first: kprobes on module functions need the module loaded.
    local ublk_ok=1 nvmeof_ok=1
    modprobe ublk_drv >&2 || true
    [[ -e /dev/ublk-control ]] || {
        ublk_ok=0
        fail ublk "kernel $(uname -r) has no ublk_drv (/dev/ublk-control)"
    }
    if ! nvmeof_setup "$NQN" "$addr" 2>"$work/nvmet.err"; then
        nvmeof_ok=0
        fail nvmeof "NVMe-oF/RDMA setup: $(oneline "$work/nvmet.err")"
    fi

    # Tracing setup: the kprobes that exist, clock, buffer.
    echo 0 >"$tr/tracing_on"
    echo nop >"$tr/current_tracer"
    echo 0 >"$tr/events/enable"
    echo >"$tr/kprobe_events" 2>/dev/null || true
    echo mono >"$tr/trace_clock" || echo global >"$tr/trace_clock"
    echo 4096 >"$tr/buffer_size_kb"
    local f set="" missing="" funcs
    funcs=$(grep -oE "^($(
        IFS='|'
        echo "${KPROBES[*]}"
    ))( |\$)" "$tr/available_filter_functions" | tr -d ' ' | sort -u) || true
    local -A skip=()
    for f in ${RBLK_TIMELINE_SKIP_KPROBES:-}; do skip[$f]=1; done
    for f in "${KPROBES[@]}"; do
        if [[ -z ${skip[$f]:-} ]] && grep -qx "$f" <<<"$funcs" &&
            echo "p:rblk/$f $f" >>"$tr/kprobe_events" 2>/dev/null; then
            set+="$f "
        else
            missing+="$f "
        fi
    done
    printf '@@meta kprobes %s\n@@meta kprobes_missing %s\n@@meta kprobes_skipped %s\n' "$set" "$missing" \
        "${!skip[*]}"
    printf '@@meta trace_clock %s\n' "$(sed 's/.*\[\(.*\)\].*/\1/' "$tr/trace_clock")"
    local -a events=(block/block_rq_issue block/block_rq_complete io_uring sched/sched_switch
        sched/sched_wakeup raw_syscalls/sys_enter raw_syscalls/sys_exit workqueue/workqueue_execute_start)
    [[ -n $set ]] && events+=(rblk)

    # Sets the filters to the thread ids given ("" clears them).
    filters() {
        # Switches to and from the idle task (pid 0) too: whether rxe's worker had to wake a
        # halted vCPU, and how long it had been idle.
        local sw="prev_pid == 0 || next_pid == 0" wk="" sc="" t
        for t in "$@"; do
            sw+="${sw:+ || }prev_pid == $t || next_pid == $t"
            wk+="${wk:+ || }pid == $t"
            sc+="${sc:+ || }common_pid == $t"
        done
        local -A flt=([sched/sched_switch]=$sw [sched/sched_wakeup]=$wk [raw_syscalls/sys_enter]=$sc
            [raw_syscalls/sys_exit]=$sc)
        for f in "${!flt[@]}"; do
            if [[ -n ${flt[$f]} ]]; then
                echo "${flt[$f]}" >"$tr/events/$f/filter" 2>/dev/null || {
                    log "  warning: filter on $f refused; recording it unfiltered"
                    echo 0 >"$tr/events/$f/filter"
                }
            else
                echo 0 >"$tr/events/$f/filter"
            fi
        done
    }
    # Records TSECS seconds of path $1 with the threads $2... and prints the trace gzipped.
    trace_window() {
        local path=$1 e
        shift
        filters "$@"
        : >"$tr/trace"
        echo 1 >"$tr/tracing_on"
        sleep "$tsecs"
        echo 0 >"$tr/tracing_on"
        cat "$tr/trace" >"$work/trace.txt"
        log "  $path: $(grep -vc '^#' "$work/trace.txt") trace lines, $(du -k "$work/trace.txt" | cut -f1) KiB"
        printf '@@trace %s\n' "$path"
        gzip -c "$work/trace.txt" | base64 -w 100
        printf '@@endtrace %s\n' "$path"
        rm -f "$work/trace.txt"
    }
    # Every event is enabled now, with tracing off and before any workload runs; the windows only
    # switch tracing_on and the filters, which patch no code. Enabling an event patches the
    # kernel's text (static keys; a kprobe's int3 or jump), and under TCG patching code that the
    # other vCPU is running has crashed this guest: a NULL call from rxe_sender, an int3 left in
    # process_one_work, a NULL call from blk_mq_dispatch_rq_list when ublk_queue_rq's kprobe was
    # armed under fio (2026-12-02 to 2026-12-04).
    filters
    for e in "${events[@]}"; do
        echo 1 >"$tr/events/$e/enable"
    done
    # The thread ids of processes $@.
    tids_of() {
        local p t
        for p in "$@"; do
            for t in /proc/"$p"/task/*; do
                [[ -e $t ]] && printf '%s ' "${t##*/}"
            done
        done
        return 0
    }
    # fio randread QD1 on $2 for path $1, traced; the serving process $3 (may be empty).
    fio_traced() {
        local path=$1 blk=$2 server=${3:-} fpid rc=0 p50
        local -a tids pids
        fio --name=qd1 --filename="$blk" --ioengine=libaio --direct=1 --bs=4k --rw=randread --iodepth=1 \
            --numjobs=1 --size="$VOLUME_SIZE" --time_based --runtime="$secs" --output-format=json \
            --output="$work/fio.json" >"$work/fio.err" 2>&1 &
        fpid=$!
        sleep "$WARM_SECS"
        mapfile -t pids < <(pgrep -x fio || true)
        read -r -a tids <<<"$(tids_of "${pids[@]}" ${server:+"$server"})"
        printf '@@path %s tids %s\n' "$path" "${tids[*]}"
        trace_window "$path" "${tids[@]}"
        wait "$fpid" || rc=$?
        if ((rc != 0)) || [[ ! -s $work/fio.json ]]; then
            fail "$path" "fio exited with status $rc: $(oneline "$work/fio.err")"
            return 0
        fi
        p50=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["jobs"][0]["read"]["clat_ns"]["percentile"]["50.000000"]/1000)' \
            "$work/fio.json" 2>/dev/null) || p50=""
        printf '@@path %s fio_p50_us %s\n' "$path" "$p50"
    }
    devno() { tr ':' ',' <"/sys/class/block/${1#/dev/}/dev"; }

    # (a) ublk
    if ((ublk_ok)); then
        log "ublk: rblk attach --queues 1 --depth 32, fio randread 4k QD1 for ${secs}s, traced ${tsecs}s"
        local blk_dev="" blk_pid=""
        # A file, not $(...): the background server could keep a pipe open.
        if ! timeout 120 "$bin/rblk" attach "$uri" --queues 1 --depth 32 --device "$dev" --daemon \
            >"$work/attach.out" 2>"$work/attach.log"; then
            fail ublk "rblk attach --daemon failed: $(oneline "$work/attach.out" "$work/attach.log")"
        else
            blk_dev=$(sed -n 1p "$work/attach.out")
            blk_pid=$(sed -n 's/^rblk: pid \([0-9][0-9]*\) serves .*/\1/p' "$work/attach.log")
            if [[ $blk_dev != /dev/ublkb* || -z $blk_pid ]]; then
                fail ublk "rblk attach printed no /dev/ublkbN line (stdout) and 'rblk: pid N serves' line (stderr): $(oneline "$work/attach.out")"
            elif ! wait_bdev "$blk_dev"; then
                fail ublk "$blk_dev did not appear as a block device"
            else
                printf '@@path ublk dev %s\n@@path ublk dev_name %s\n@@path ublk server %s\n' \
                    "$(devno "$blk_dev")" "$blk_dev" "$blk_pid"
                fio_traced ublk "$blk_dev" "$blk_pid"
            fi
            if [[ -n $blk_pid ]]; then
                timeout 60 "$bin/rblk" detach "$blk_dev" >&2 || fail ublk "rblk detach $blk_dev failed"
                wait_gone "$blk_pid" || kill -KILL "$blk_pid" 2>/dev/null || true
            fi
        fi
    fi

    # (b) NVMe-oF/RDMA
    if ((nvmeof_ok)); then
        log "nvmeof: nvme connect -t rdma, fio randread 4k QD1 for ${secs}s, traced ${tsecs}s"
        if nvmeof_connect "$NQN" "$addr" 2>"$work/nvme.err"; then
            printf '@@path nvmeof dev %s\n@@path nvmeof dev_name %s\n@@path nvmeof target_dev %s\n' \
                "$(devno "$NVMEOF_DEV")" "$NVMEOF_DEV" "$(devno /dev/nullb0)"
            fio_traced nvmeof "$NVMEOF_DEV" ""
            nvme disconnect -n "$NQN" >&2 || fail nvmeof "nvme disconnect failed"
        else
            fail nvmeof "$(oneline "$work/nvme.err")"
        fi
    fi

    # (c) rblk-bench
    log "bench: rblk-bench randread 4k QD1 for ${secs}s, traced ${tsecs}s"
    local bpid rc=0
    "$bin/rblk-bench" "$uri" --device "$dev" --quiet --rw randread --bs 4k --iodepth 1 --runtime "$secs" \
        -o json --output "$work/bench.json" >"$work/bench.out" 2>&1 &
    bpid=$!
    sleep "$WARM_SECS"
    if kill -0 "$bpid" 2>/dev/null; then
        local -a btids
        read -r -a btids <<<"$(tids_of "$bpid")"
        printf '@@path bench tids %s\n@@path bench server %s\n' "${btids[*]}" "$bpid"
        trace_window bench "${btids[@]}"
    fi
    wait "$bpid" || rc=$?
    if ((rc != 0)); then
        fail bench "rblk-bench exited with status $rc: $(oneline "$work/bench.out")"
    else
        # fio's layout, read by scripts/lib/report.py's one converter (compare-rxe.sh's too).
        printf '@@path bench bench_p50_us %s\n' "$(lib_python -c 'import json, sys; from report import bench_report
print(bench_report(json.load(open(sys.argv[1])))["read"]["lat_us"]["p50"])' "$work/bench.json" 2>/dev/null || true)"
    fi

    echo 0 >"$tr/events/enable"
    echo >"$tr/kprobe_events" 2>/dev/null || log "warning: cannot remove the kprobes"
    if ((nvmeof_ok)); then
        nvmeof_teardown "$NQN" || log "warning: cannot tear down NVMe-oF/RDMA"
    fi
    kill -TERM "$tpid" 2>/dev/null || true
    wait "$tpid" || true
    trap - EXIT
    rm -rf "$work"
    printf '@@meta complete yes\n'
}

# ---------------------------------------------------------------------------------------------------
# On the host: decode the traces, build per-I/O timelines, print the table, write summary.json.

summarize() { # LOG SUMMARY_JSON TABLE_TXT
    lib_python - "$@" <<'PY'
import base64, collections, datetime, gzip, json, re, statistics, sys

from report import host_info

log_path, summary_path, table_path = sys.argv[1:4]
meta, paths, fails, traces = {}, collections.defaultdict(dict), [], {}
cur, buf = None, []
with open(log_path, errors="replace") as f:
    for raw in f:
        line = raw.rstrip("\r\n").replace("\r", "")
        if cur is not None:
            if line == f"@@endtrace {cur}":
                try:
                    traces[cur] = gzip.decompress(base64.b64decode("".join(buf))).decode(errors="replace")
                except (ValueError, OSError, EOFError) as e:
                    fails.append({"path": cur, "error": f"cannot decode its trace: {e}"})
                cur, buf = None, []
            else:
                buf.append(line.strip())
        elif line.startswith("@@meta "):
            p = line.split(" ", 2)
            meta[p[1]] = p[2] if len(p) > 2 else ""
        elif line.startswith("@@path "):
            p = line.split(" ", 3)
            paths[p[1]][p[2]] = p[3] if len(p) > 3 else ""
        elif line.startswith("@@fail "):
            p = line.split(" ", 2)
            fails.append({"path": p[1], "error": p[2] if len(p) > 2 else ""})
        elif line.startswith("@@trace "):
            cur, buf = line.split(" ", 1)[1], []
if cur is not None:
    fails.append({"path": cur, "error": "the guest's output ends inside its trace"})

kprobes = set(meta.get("kprobes", "").split())
skipped = set(meta.get("kprobes_skipped", "").split())
SYS = {0: "read", 1: "write", 7: "poll", 16: "ioctl", 19: "readv", 20: "writev", 24: "sched_yield",
       202: "futex", 208: "io_getevents", 209: "io_submit", 228: "clock_gettime", 230: "clock_nanosleep",
       232: "epoll_wait", 233: "epoll_ctl", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait",
       333: "io_pgetevents", 426: "io_uring_enter", 441: "epoll_pwait2", 35: "nanosleep", 23: "select"}
NR_IO_URING_ENTER, NR_IO_SUBMIT, NR_IO_GETEVENTS = 426, 209, 208

LINE = re.compile(r"^\s*(.*?)-(\d+)\s+(?:\(\s*[\d-]+\)\s+)?\[(\d+)\]\s+\S+\s+(\d+\.\d+):\s+(\w+):\s?(.*)$")
BLK = re.compile(r"^(\d+),(\d+) (\S+)(?: \d+)? \((.*?)\) (\d+) \+ (\d+)")


class Ev:
    __slots__ = ("t", "pid", "cpu", "comm", "name", "f", "nr", "dev", "rw", "sector", "a", "b", "state")


def parse(text):
    evs = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = LINE.match(line)
        if not m:
            continue
        e = Ev()
        e.comm, e.pid, e.t, e.name, e.f = m.group(1).strip(), int(m.group(2)), float(m.group(4)) * 1e6, m.group(5), m.group(6)
        e.cpu = int(m.group(3))
        e.nr = e.dev = e.rw = e.sector = e.a = e.b = e.state = None
        if e.name in ("block_rq_issue", "block_rq_complete"):
            b = BLK.match(e.f)
            if not b:
                continue
            e.dev, e.rw, e.sector = f"{b.group(1)},{b.group(2)}", b.group(3), int(b.group(5))
        elif e.name in ("sys_enter", "sys_exit"):
            b = re.match(r"NR (-?\d+)", e.f)
            e.nr = int(b.group(1)) if b else None
        elif e.name == "sched_switch":
            a = re.search(r"prev_pid=(\d+)", e.f)
            b = re.search(r"next_pid=(\d+)", e.f)
            s = re.search(r"prev_state=(\S+)", e.f)
            e.a, e.b, e.state = int(a.group(1)) if a else None, int(b.group(1)) if b else None, s.group(1) if s else ""
        elif e.name in ("sched_wakeup", "sched_waking"):
            a = re.search(r" pid=(\d+)", " " + e.f)
            e.a = int(a.group(1)) if a else None
        evs.append(e)
    evs.sort(key=lambda e: e.t)
    return evs


def kp(name, pid=None):
    def m(e, c):
        return e.name == name and (pid is None or e.pid == c[pid])
    m.needs = name
    return m


def kp_any(names, pid=None):
    def m(e, c):
        return e.name in names and (pid is None or e.pid == c[pid])
    m.needs = [n for n in names if n in kprobes][:1] or names[0]
    return m


def ev(name, pred=None):
    return lambda e, c: e.name == name and (pred is None or pred(e, c))


def woken(who):
    return lambda e, c: e.name == "sched_wakeup" and (e.a == c[who] if who != "fio" else e.a in c["fio"])


def on_cpu(who):
    return lambda e, c: e.name == "sched_switch" and e.b == c[who]


def sysx(kind, nr, who):
    return lambda e, c: e.name == kind and e.nr == nr and (e.pid == c[who] if who != "fio" else e.pid in c["fio"])


def blk(kind, devkey):
    return lambda e, c: e.name == kind and e.dev == c[devkey]


# (label, matcher, requires-label or None)
def rxe_work(e, c):
    return e.name == "workqueue_execute_start" and "rdma_rxe" in e.f


# The first post of an I/O (ublk, bench: the READ; nvmeof: the command SEND) and rxe's first work
# item after it: analyse() asks whether that item's vCPU was idle (halted) at the post.
READ_POSTED = "RDMA READ posted (rxe_post_send)"
SEND_POSTED = "command SEND posted (rxe_post_send)"
FIRST_POSTS = (READ_POSTED, SEND_POSTED)
RXE_WORK = "rxe's first work item starts (workqueue_execute_start)"

RXE_READ = [
    (RXE_WORK, rxe_work, None),
    ("rxe requester runs (rxe_requester)", kp("rxe_requester"), None),
    ("request on the wire (rxe_xmit_packet)", kp("rxe_xmit_packet"), None),
    ("target's responder runs (rxe_receiver)", kp_any(["rxe_receiver", "rxe_responder"]), None),
    ("response on the wire (rxe_xmit_packet)", kp("rxe_xmit_packet"), None),
    ("rxe completer runs (rxe_completer)", kp("rxe_completer"), None),
    ("CQE posted (rxe_cq_post)", kp("rxe_cq_post"), None),
]
SPEC = {
    "ublk": {
        "title": "fio randread 4k QD1 through the ublk device of `rblk attach --queues 1 --depth 32`",
        "pre": [("fio io_submit (sys_enter)", sysx("sys_enter", NR_IO_SUBMIT, "fio"), None),
                ("ublk_queue_rq (kprobe)", kp("ublk_queue_rq"), None)],
        "start": "block_rq_issue",
        "mid": [
            ("queue thread woken (sched_wakeup)", woken("srv"), None),
            ("queue thread on CPU (sched_switch in)", on_cpu("srv"), "queue thread woken (sched_wakeup)"),
            ("ublk task work runs (kprobe)", kp_any(["ublk_rq_task_work_cb", "ublk_cmd_tw_cb"], "srv"), None),
            ("io_uring_enter returns (sys_exit)", sysx("sys_exit", NR_IO_URING_ENTER, "srv"), None),
            (READ_POSTED, kp("rxe_post_send", "srv"), None),
        ] + RXE_READ + [
            ("completion event (ib_uverbs_comp_handler)", kp("ib_uverbs_comp_handler"), None),
            ("poll task work queued (io_uring_task_add)", ev("io_uring_task_add"), "completion event (ib_uverbs_comp_handler)"),
            ("queue thread woken again (sched_wakeup)", woken("srv"), None),
            ("queue thread on CPU again (sched_switch in)", on_cpu("srv"), "queue thread woken again (sched_wakeup)"),
            ("io_uring_enter returns again (sys_exit)", sysx("sys_exit", NR_IO_URING_ENTER, "srv"), None),
            ("COMMIT (ublk_ch_uring_cmd)", kp("ublk_ch_uring_cmd", "srv"), None),
        ],
        "end": "block_rq_complete",
        "post": [
            ("fio woken (sched_wakeup)", woken("fio"), None),
            ("fio io_getevents returns (sys_exit)", sysx("sys_exit", NR_IO_GETEVENTS, "fio"), None),
        ],
    },
    "nvmeof": {
        "title": "fio randread 4k QD1 through Linux NVMe-oF/RDMA (nvme-rdma -> nvmet-rdma -> null_blk)",
        "pre": [("fio io_submit (sys_enter)", sysx("sys_enter", NR_IO_SUBMIT, "fio"), None),
                ("nvme_rdma_queue_rq (kprobe)", kp("nvme_rdma_queue_rq"), None)],
        "start": "block_rq_issue",
        "mid": [
            (SEND_POSTED, kp("rxe_post_send"), None),
            (RXE_WORK, rxe_work, None),
            ("rxe requester runs (rxe_requester)", kp("rxe_requester"), None),
            ("request on the wire (rxe_xmit_packet)", kp("rxe_xmit_packet"), None),
            ("target got the command (nvmet_rdma_recv_done)", kp("nvmet_rdma_recv_done"), None),
            ("target block_rq_issue (null_blk)", blk("block_rq_issue", "tdev"), None),
            ("target block_rq_complete (null_blk)", blk("block_rq_complete", "tdev"), None),
            ("data + response queued (nvmet_rdma_queue_response)", kp("nvmet_rdma_queue_response"), None),
            ("data WRITE posted (rxe_post_send)", kp("rxe_post_send"), None),
            ("rxe requester runs again (rxe_requester)", kp("rxe_requester"), None),
            ("data on the wire (rxe_xmit_packet)", kp("rxe_xmit_packet"), None),
            ("host's responder runs (rxe_receiver)", kp_any(["rxe_receiver", "rxe_responder"]), None),
            ("CQE posted (rxe_cq_post)", kp("rxe_cq_post"), None),
            ("host completion (nvme_rdma_recv_done)", kp("nvme_rdma_recv_done"), None),
        ],
        "end": "block_rq_complete",
        "post": [
            ("fio woken (sched_wakeup)", woken("fio"), None),
            ("fio io_getevents returns (sys_exit)", sysx("sys_exit", NR_IO_GETEVENTS, "fio"), None),
        ],
    },
    "bench": {
        "title": "rblk-bench --rw randread --bs 4k --iodepth 1 (the library, no block device)",
        "pre": [],
        "start": "post",
        "mid": RXE_READ + [
            ("completion event (ib_uverbs_comp_handler)", kp("ib_uverbs_comp_handler"), None),
            ("bench thread woken (sched_wakeup)", woken("srv"), None),
            ("bench thread on CPU (sched_switch in)", on_cpu("srv"), "bench thread woken (sched_wakeup)"),
        ],
        "end": "post",
        "post": [],
    },
}
START_LABEL = {"block_rq_issue": "block_rq_issue", "post": READ_POSTED}
END_LABEL = {"block_rq_complete": "block_rq_complete", "post": "next READ posted (rxe_post_send)"}


def needs_missing(m):
    n = getattr(m, "needs", None)
    if n is None:
        return None
    names = n if isinstance(n, list) else [n]
    return None if any(x in kprobes for x in names) else names[0]


def analyse(path, text, info):
    spec = SPEC[path]
    evs = parse(text)
    tids = [int(x) for x in info.get("tids", "").split()]
    server = int(info["server"]) if info.get("server") else None
    ctx = {"dev": info.get("dev"), "tdev": info.get("target_dev")}
    cnt = collections.Counter
    if path in ("ublk", "nvmeof"):
        is_read = lambda e: e.name == "block_rq_issue" and "R" in e.rw
        issues = [i for i, e in enumerate(evs) if is_read(e) and e.dev == ctx["dev"]]
        if not issues:
            # NVMe multipath: requests are issued on the hidden path device (nvmeXcYnZ), not on
            # nvmeXnY: take the device with the most reads that is not the target's.
            other = cnt(e.dev for e in evs if is_read(e) and e.dev != ctx["tdev"]).most_common(1)
            if other:
                ctx["dev"] = other[0][0]
                info = dict(info, dev_name=f"{info.get('dev_name')} (requests on {other[0][0]})")
                issues = [i for i, e in enumerate(evs) if is_read(e) and e.dev == ctx["dev"]]
        if not issues:
            return {"error": f"no block_rq_issue of a read on {info.get('dev_name')} ({ctx['dev']}) in the trace"}
        fio_job = cnt(evs[i].pid for i in issues).most_common(1)[0][0]
        ctx["fio"] = {e.pid for e in evs if e.comm == "fio"} | {fio_job}
        ctx["fio_job"] = fio_job
        if path == "ublk":
            cand = cnt(e.pid for e in evs if e.name == "ublk_ch_uring_cmd" and (not tids or e.pid in tids))
            if not cand:
                cand = cnt(e.pid for e in evs if e.name == "sys_enter" and e.nr == NR_IO_URING_ENTER and e.pid not in ctx["fio"])
            ctx["srv"] = cand.most_common(1)[0][0] if cand else -1
        else:
            ctx["srv"] = fio_job
        # windows: (start index, end index) per I/O, ends matched by sector
        wins, j = [], 0
        for i in issues:
            s = evs[i].sector
            end = next((k for k in range(i + 1, len(evs)) if evs[k].name == "block_rq_complete"
                        and evs[k].dev == ctx["dev"] and evs[k].sector == s), None)
            if end is not None:
                wins.append((i, end))
    else:
        ctx["fio"] = set()
        posts_by = cnt(e.pid for e in evs if e.name == "rxe_post_send" and (not tids or e.pid in tids))
        if not posts_by:
            return {"error": "no rxe_post_send by rblk-bench's threads in the trace"
                    + ("" if "rxe_post_send" in kprobes else " (no kprobe rxe_post_send on this kernel)")}
        ctx["srv"] = posts_by.most_common(1)[0][0]
        posts = [i for i, e in enumerate(evs) if e.name == "rxe_post_send" and e.pid == ctx["srv"]]
        wins = list(zip(posts, posts[1:]))
    srv_comm = next((e.comm for e in evs if e.pid == ctx["srv"]), "?")

    # Labels must be unique: a stage is keyed by its label.
    labels = [l for l, _, _ in spec["pre"]] + [START_LABEL[spec["start"]]] + [l for l, _, _ in spec["mid"]] \
        + [END_LABEL[spec["end"]]] + [l for l, _, _ in spec["post"]]
    per = {l: [] for l in labels}
    seen = {l: 0 for l in labels}
    totals = {"block": [], "app": []}
    wake = {True: [], False: []}  # post -> rxe's first work item, by whether its vCPU was idle
    idle_for = []  # how long that vCPU had been idle at the post
    ios = 0
    span_lo = span_hi = None
    # I/Os 1..n-2: each has a previous I/O's end and a next I/O's start to bound pre/post searches.
    for w in range(1, len(wins) - 1):
        s, e_ = wins[w]
        lo, hi = wins[w - 1][1], wins[w + 1][0]
        if path == "bench":
            lo = s
        marks = []  # (label, t)
        for label, m, _ in spec["pre"]:
            k = next((k for k in range(s - 1, lo, -1) if m(evs[k], ctx)), None)
            if k is not None:
                marks.append((label, evs[k].t, k))
        marks.append((START_LABEL[spec["start"]], evs[s].t, s))
        pos, found = s, set()
        for label, m, req in spec["mid"]:
            if req and req not in found:
                continue
            k = next((k for k in range(pos + 1, e_) if m(evs[k], ctx)), None)
            if k is not None:
                marks.append((label, evs[k].t, k))
                found.add(label)
                pos = k
        marks.append((END_LABEL[spec["end"]], evs[e_].t, e_))
        pos = e_
        for label, m, _ in spec["post"]:
            k = next((k for k in range(pos + 1, hi) if m(evs[k], ctx)), None)
            if k is not None:
                marks.append((label, evs[k].t, k))
                pos = k
        ios += 1
        post_k = next((k for label, _, k in marks if label in FIRST_POSTS), None)
        work_k = next((k for label, _, k in marks if label == RXE_WORK), None)
        if post_k is not None and work_k is not None and work_k > post_k:
            cpu = evs[work_k].cpu
            idle = any(evs[k].name == "sched_switch" and evs[k].a == 0 and evs[k].cpu == cpu
                       for k in range(post_k + 1, work_k))
            wake[idle].append(evs[work_k].t - evs[post_k].t)
            went = next((k for k in range(post_k - 1, wins[w - 1][0], -1) if evs[k].name == "sched_switch" and evs[k].cpu == cpu), None)
            if idle and went is not None and evs[went].b == 0:
                idle_for.append(evs[post_k].t - evs[went].t)
        for n, (label, t, _) in enumerate(marks):
            seen[label] += 1
            if n > 0:
                per[label].append(t - marks[n - 1][1])
        totals["block"].append(evs[e_].t - evs[s].t)
        if spec["pre"] and spec["post"] and marks[0][0] == spec["pre"][0][0] and marks[-1][0] == spec["post"][-1][0]:
            totals["app"].append(marks[-1][1] - marks[0][1])
        span_lo = s if span_lo is None else span_lo
        span_hi = e_ if path == "bench" else hi
    if not ios:
        return {"error": f"too few complete I/Os in the trace ({len(wins)})"}

    # Per-I/O counts over the analysed span (from the first analysed I/O's start to the last one's end).
    span = evs[span_lo:span_hi]
    srv, fio_job = ctx["srv"], ctx.get("fio_job")
    sc = cnt(SYS.get(e.nr, f"nr{e.nr}") for e in span if e.name == "sys_enter" and e.pid == srv)
    sw_srv = [e for e in span if e.name == "sched_switch" and e.a == srv]
    sw_fio = [e for e in span if e.name == "sched_switch" and fio_job is not None and e.a == fio_job]
    invol = lambda sws: sum(1 for e in sws if e.state.startswith("R"))
    iou = cnt(e.name for e in span if e.name.startswith("io_uring_"))

    def st(xs):
        if not xs:
            return None
        return {"median_us": statistics.median(xs), "mean_us": statistics.fmean(xs), "n": len(xs)}

    stages = []
    matchers = {l: m for l, m, _ in spec["pre"] + spec["mid"] + spec["post"]}
    for n, label in enumerate(labels):
        miss = needs_missing(matchers[label]) if label in matchers else None
        d = {"stage": label, "seen_share": seen[label] / ios, "first": n == 0}
        if miss and not seen[label]:
            d["missing"] = (f"{miss} not probed (RBLK_TIMELINE_SKIP_KPROBES)" if miss in skipped
                            else f"no kprobe {miss} on this kernel")
        s = st(per[label])
        if s:
            d.update(s)
        stages.append(d)
    return {
        "title": spec["title"], "device": info.get("dev_name"), "ios": ios,
        "serving_thread": {"tid": srv, "comm": srv_comm}, "fio_job": fio_job,
        "stages": stages,
        "total_block_us": st(totals["block"]), "total_app_us": st(totals["app"]),
        "io_uring_enter_per_io": sc.get("io_uring_enter", 0) / ios,
        "syscalls_per_io": {k: v / ios for k, v in sc.most_common()},
        "switches_per_io": len(sw_srv) / ios, "involuntary_switches_per_io": invol(sw_srv) / ios,
        "fio_switches_per_io": (len(sw_fio) / ios) if fio_job is not None else None,
        "io_uring_events_per_io": {k: v / ios for k, v in iou.most_common()},
        "rxe_worker": {"idle_share": len(wake[True]) / (len(wake[True]) + len(wake[False])),
                       "from_idle_us": st(wake[True]), "from_busy_us": st(wake[False]),
                       "idle_before_post_us": st(idle_for)} if wake[True] or wake[False] else None,
        "fio_p50_us": float(info["fio_p50_us"]) if info.get("fio_p50_us") else None,
        "bench_p50_us": info.get("bench_p50_us") or None,
        "trace_events": len(evs),
    }


results = {}
for p in SPEC:
    if p in traces:
        try:
            results[p] = analyse(p, traces[p], paths.get(p, {}))
        except Exception as e:  # a parser bug must not lose the other paths
            results[p] = {"error": f"cannot analyse the trace: {type(e).__name__}: {e}"}
    else:
        results[p] = {"error": "no trace (see the failures)"}


def f1(x):
    return "n/a" if x is None else (f"{x:,.0f}" if x >= 1000 else f"{x:.1f}")


out = []
head = f"{'path':<8} {'I/Os':>5}  {'total med us':>12}  {'app med us':>10}  {'io_uring_enter/IO':>17}  {'switches/IO (invol.)':>20}  {'fio switches/IO':>15}  {'untraced-ish p50':>16}"
out.append("QD1 4 KiB randread, one I/O at a time, from the guest kernel's trace (medians over the traced I/Os)")
out.append(head)
out.append("-" * len(head))
for p, r in results.items():
    if "error" in r:
        out.append(f"{p:<8} failed: {r['error']}")
        continue
    tb, ta = r["total_block_us"], r["total_app_us"]
    p50 = r["fio_p50_us"] if r["fio_p50_us"] is not None else r["bench_p50_us"]
    out.append(f"{p:<8} {r['ios']:>5}  {f1(tb['median_us'] if tb else None):>12}  {f1(ta['median_us'] if ta else None):>10}  "
               f"{r['io_uring_enter_per_io']:>17.2f}  {r['switches_per_io']:>12.2f} ({r['involuntary_switches_per_io']:.2f})  "
               f"{'n/a' if r['fio_switches_per_io'] is None else format(r['fio_switches_per_io'], '.2f'):>15}  "
               f"{(f1(float(p50)) if p50 not in (None, '') else 'n/a'):>16}")
out.append("total: block_rq_issue -> block_rq_complete (bench: READ posted -> next READ posted); app: fio io_submit -> "
           "io_getevents returns; switches: sched_switch away from the serving thread (ublk: the queue thread; "
           "nvmeof: fio's job; bench: its I/O thread); p50: fio's / rblk-bench's own over the whole run, tracing included")
for p, r in results.items():
    if "error" in r:
        continue
    out.append("")
    out.append(f"{p}: {r['title']}")
    out.append(f"  {r['ios']} I/Os analysed; device {r['device'] or '-'}; serving thread {r['serving_thread']['tid']} "
               f"({r['serving_thread']['comm']}); {r['trace_events']} trace events")
    out.append(f"  {'boundary (stage = time since the previous boundary seen)':<62} {'median us':>9} {'mean us':>8} {'seen':>6}")
    for s in r["stages"]:
        if s["first"]:
            val, mean = "start", ""
        elif "missing" in s:
            val, mean = "n/a", s["missing"]
        else:
            val, mean = f1(s.get("median_us")), f1(s.get("mean_us"))
        out.append(f"  {s['stage']:<62} {val:>9} {mean:>8} {s['seen_share'] * 100:>5.0f}%")
    sc = ", ".join(f"{k} {v:.2f}" for k, v in list(r["syscalls_per_io"].items())[:8]) or "none traced"
    out.append(f"  serving thread's system calls per I/O: {sc}")
    iu = ", ".join(f"{k[9:]} {v:.2f}" for k, v in r["io_uring_events_per_io"].items()) or "none"
    out.append(f"  io_uring events per I/O: {iu}")
    w = r.get("rxe_worker")
    if w:
        med = lambda x: "n/a" if not x else f1(x["median_us"])
        out.append(f"  rxe's first work item ran on a vCPU idle at the post for {w['idle_share'] * 100:.0f}% of I/Os; "
                   f"post -> that item starts: median {med(w['from_idle_us'])} us from idle, "
                   f"{med(w['from_busy_us'])} us otherwise; idle for a median {med(w['idle_before_post_us'])} us "
                   "before the post")
out.append("")
out.append(f"guest kernel {meta.get('guest_kernel', '?')}, {meta.get('guest_cpus', '?')} vCPUs (qemu TCG); trace clock "
           f"{meta.get('trace_clock', '?')}; kprobes set: {meta.get('kprobes', '').strip() or 'none'}; missing: "
           f"{meta.get('kprobes_missing', '').strip() or 'none'}; guest run {meta.get('guest_run_secs', '?')} s")
if meta.get("complete") != "yes":
    out.append("INCOMPLETE: the guest did not finish (see " + log_path + ")")
for x in fails:
    out.append(f"failed: {x['path']}: {x['error']}")
table = "\n".join(out)
print(table)
doc = {
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "host": host_info(),
    "guest": {"kernel": meta.get("guest_kernel"), "cpus": meta.get("guest_cpus"), "accel": "tcg"},
    "secs": meta.get("secs"), "trace_secs": meta.get("trace_secs"), "trace_clock": meta.get("trace_clock"),
    "kprobes": sorted(kprobes), "kprobes_missing": meta.get("kprobes_missing", "").split(),
    "io_uring_events_available": meta.get("io_uring_events", "").split(),
    "fio": meta.get("fio"), "rblk": meta.get("rblk"),
    "complete": meta.get("complete") == "yes",
    "guest_run_secs": float(meta["guest_run_secs"]) if meta.get("guest_run_secs") else None,
    "paths": results, "failures": fails,
}
with open(summary_path, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
with open(table_path, "w") as f:
    f.write(table + "\n")
if not any("error" not in r for r in results.values()):
    print("timeline: error: no path has analysed I/Os", file=sys.stderr)
    sys.exit(1)
PY
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
        local rlog=${redraw_from[0]:-$OUT/guest.log} rout=${redraw_from[1]:-$OUT}
        [[ -s $rlog ]] || die "no $rlog to summarize"
        mkdir -p "$rout"
        summarize_run "$rlog" "$rout"
        finish_run "$rlog"
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
