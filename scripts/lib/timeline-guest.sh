# shellcheck shell=bash
# scripts/timeline-rxe.sh's part in the guest (`timeline-rxe.sh --in-guest SECS TRACE_SECS BIN_DIR`;
# its header says what runs and what is traced): sourced by that script after scripts/lib/script.sh.
# Raw results on stdout, read on the host by scripts/lib/timeline.py:
#   @@meta KEY VALUE...
#   @@path PATH KEY VALUE...       per path: dev (MAJ,MIN), dev_name, target_dev, tids, fio_p50_us
#   @@fail PATH MESSAGE
#   @@trace PATH                   the trace file, gzip | base64, then
#   @@endtrace PATH
# Progress goes to stderr. The functions below run inside guest_main and use its locals (secs,
# tsecs, bin, work, tr, ...).

VOLUME_SIZE=256M
RBLK_PORT=7420
WARM_SECS=2
NQN=nqn.2024-12.io.rblk:timeline
# Kprobe candidates; only those in available_filter_functions are set.
KPROBES=(ublk_queue_rq ublk_rq_task_work_cb ublk_cmd_tw_cb ublk_ch_uring_cmd
    rxe_post_send rxe_requester rxe_xmit_packet rxe_receiver rxe_responder rxe_completer rxe_cq_post
    ib_uverbs_comp_handler nvme_rdma_queue_rq nvme_rdma_recv_done nvmet_rdma_recv_done
    nvmet_rdma_queue_response)

guest_main() {
    local secs=$1 tsecs=$2 bin=$3
    local addr=${RBLK_ADDR:?RBLK_ADDR: the address of the rxe device} dev=${RBLK_DEVICE:-rxe0}
    local uri="rblk://$addr:$RBLK_PORT/v" work tr=/sys/kernel/tracing
    work=$(mktemp -d /tmp/rblk-timeline.XXXXXX)
    # shellcheck source=target.sh
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
        fail nvmeof "NVMe-oF/RDMA setup: $(oneline 400 "$work/nvmet.err")"
    fi

    trace_setup
    if ((ublk_ok)); then run_ublk; fi
    if ((nvmeof_ok)); then run_nvmeof; fi
    run_bench

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

fail() { # PATH MESSAGE
    printf '@@fail %s %s\n' "$1" "$2"
    log "  FAILED: $1: $2"
}

# Tracing setup: the kprobes that exist, clock, buffer; then every event is enabled, with tracing
# off and before any workload runs; the windows only switch tracing_on and the filters, which
# patch no code. Enabling an event patches the kernel's text (static keys; a kprobe's int3 or
# jump), and under TCG patching code that the other vCPU is running has crashed this guest: a NULL
# call from rxe_sender, an int3 left in process_one_work, a NULL call from blk_mq_dispatch_rq_list
# when ublk_queue_rq's kprobe was armed under fio (2026-12-02 to 2026-12-04).
trace_setup() {
    echo 0 >"$tr/tracing_on"
    echo nop >"$tr/current_tracer"
    echo 0 >"$tr/events/enable"
    echo >"$tr/kprobe_events" 2>/dev/null || true
    echo mono >"$tr/trace_clock" || echo global >"$tr/trace_clock"
    echo 4096 >"$tr/buffer_size_kb"
    local f set="" missing="" funcs e
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
    filters
    for e in "${events[@]}"; do
        echo 1 >"$tr/events/$e/enable"
    done
}

# Sets the filters to the thread ids given ("" clears them).
filters() {
    # Switches to and from the idle task (pid 0) too: whether rxe's worker had to wake a
    # halted vCPU, and how long it had been idle.
    local sw="prev_pid == 0 || next_pid == 0" wk="" sc="" t f
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
    local path=$1
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
    # fio's job is a process of its own, forked once fio has set up: on a loaded host that can
    # take longer than the warm-up, and a job missing from the ids goes untraced.
    local _
    for _ in $(seq 1 300); do
        (($(pgrep -cx fio || true) >= 2)) && break
        kill -0 "$fpid" 2>/dev/null || break
        sleep 0.1
    done
    sleep "$WARM_SECS"
    mapfile -t pids < <(pgrep -x fio || true)
    read -r -a tids <<<"$(tids_of "${pids[@]}" ${server:+"$server"})"
    printf '@@path %s tids %s\n' "$path" "${tids[*]}"
    trace_window "$path" "${tids[@]}"
    wait "$fpid" || rc=$?
    if ((rc != 0)) || [[ ! -s $work/fio.json ]]; then
        fail "$path" "fio exited with status $rc: $(oneline 400 "$work/fio.err")"
        return 0
    fi
    p50=$(lib_python "$REPO_ROOT/scripts/lib/timeline.py" fio-p50 "$work/fio.json" 2>/dev/null) || p50=""
    printf '@@path %s fio_p50_us %s\n' "$path" "$p50"
}

devno() { tr ':' ',' <"/sys/class/block/${1#/dev/}/dev"; }

# (a) ublk
run_ublk() {
    log "ublk: rblk attach --queues 1 --depth 32, fio randread 4k QD1 for ${secs}s, traced ${tsecs}s"
    if ! attach_daemon "$work" "$bin" "$uri" --queues 1 --depth 32 --device "$dev"; then
        fail ublk "rblk attach --daemon failed: $(oneline 400 "$work/attach.out" "$work/attach.log")"
        return 0
    fi
    local blk_dev=$ATTACH_DEV blk_pid=$ATTACH_PID
    if [[ $blk_dev != /dev/ublkb* || -z $blk_pid ]]; then
        fail ublk "rblk attach printed no /dev/ublkbN line (stdout) and 'rblk: pid N serves' line (stderr): $(oneline 400 "$work/attach.out")"
    elif ! wait_bdev "$blk_dev"; then
        fail ublk "$blk_dev did not appear as a block device"
    else
        printf '@@path ublk dev %s\n@@path ublk dev_name %s\n@@path ublk server %s\n' \
            "$(devno "$blk_dev")" "$blk_dev" "$blk_pid"
        fio_traced ublk "$blk_dev" "$blk_pid"
    fi
    if [[ -n $blk_pid ]]; then
        detach_daemon "$bin" "$blk_dev" "$blk_pid" || fail ublk "rblk detach $blk_dev failed"
    fi
}

# (b) NVMe-oF/RDMA
run_nvmeof() {
    log "nvmeof: nvme connect -t rdma, fio randread 4k QD1 for ${secs}s, traced ${tsecs}s"
    if nvmeof_connect "$NQN" "$addr" 2>"$work/nvme.err"; then
        printf '@@path nvmeof dev %s\n@@path nvmeof dev_name %s\n@@path nvmeof target_dev %s\n' \
            "$(devno "$NVMEOF_DEV")" "$NVMEOF_DEV" "$(devno /dev/nullb0)"
        fio_traced nvmeof "$NVMEOF_DEV" ""
        nvme disconnect -n "$NQN" >&2 || fail nvmeof "nvme disconnect failed"
    else
        fail nvmeof "$(oneline 400 "$work/nvme.err")"
    fi
}

# (c) rblk-bench
run_bench() {
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
        fail bench "rblk-bench exited with status $rc: $(oneline 400 "$work/bench.out")"
    else
        # fio's layout, read by scripts/lib/report.py's one converter (compare-rxe.sh's too).
        printf '@@path bench bench_p50_us %s\n' \
            "$(lib_python "$REPO_ROOT/scripts/lib/timeline.py" bench-p50 "$work/bench.json" 2>/dev/null || true)"
    fi
}
