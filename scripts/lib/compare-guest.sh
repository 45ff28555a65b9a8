# shellcheck shell=bash
# scripts/compare-rxe.sh's part in the guest, guest_main (`compare-rxe.sh --in-guest SECS ROUNDS
# PERFTEST_BW_ARGS`, run by scripts/rxe-guest.sh): every pair and every block device, then the
# picture run, the counts per I/O and the QD1 timeline, in one boot. Sourced by compare-rxe.sh after
# scripts/lib/script.sh (log, die, fail) and its settings (VOLUME_SIZE, RBLK_PORT, LOG_INTERVAL_MS,
# TIMELINE_SECS, TIMELINE_TRACE_SECS, COUNTS_SECS); bash. The measured runs are in scripts/lib/compare-runs.sh
# (every one goes through its `measure`), the block devices in scripts/lib/compare-blk.sh.
#
# Raw results go to stdout between markers, for the host (scripts/lib/compare.py) to parse:
#   @@meta KEY VALUE...
#   @@begin WORKLOAD TOOL ROUND CMD...      raw output (perftest's client, rblk-bench's or fio's JSON)
#   @@end WORKLOAD TOOL ROUND
#   @@fail WORKLOAD TOOL ROUND ERROR         a run that failed (TOOL: perftest, rblk or a block path)
#   @@unavailable PATH WHY                  a block path that cannot run in this boot
#   @@cpu WORKLOAD PATH ROUND NS WALL_NS    the target's CPU over a fio run
#   @@gcpu WORKLOAD TOOL ROUND BUSY ALL WINDOW_NS IOS QUEUE_SLEEPS OVERRAN   the guest's CPU (`sampled`)
#   @@file NAME ... @@endfile NAME          a file for build/compare/ (timeline-guest.log: the
#                                           timeline's raw output, streamed as it runs)
# Progress and the tools' own reports go to stderr.

# shellcheck source-path=SCRIPTDIR/..
# shellcheck source=lib/target.sh
source "$REPO_ROOT/scripts/lib/target.sh"
# shellcheck source=lib/compare-runs.sh
source "$REPO_ROOT/scripts/lib/compare-runs.sh"
# shellcheck source=lib/compare-blk.sh
source "$REPO_ROOT/scripts/lib/compare-blk.sh"

# The guest's clock source. One other than the TSC makes every clock read a system call (no
# vDSO): the spinning loops slow down, so the rounds' figures would not be comparable. Recorded
# before the rounds and again after them.
clocksource() { cat /sys/devices/system/clocksource/clocksource0/current_clocksource; }

# The @@meta lines about the guest and the tools, before the rounds.
guest_meta() {
    printf '@@meta guest_kernel %s\n' "$(uname -r)"
    printf '@@meta guest_cpus %s\n' "$(nproc)"
    # The idle loop matters under TCG: a halted vCPU takes tens of microseconds to wake.
    printf '@@meta guest_idle %s\n' "$(idle=$(sed -n 's/^\(.* \)\{0,1\}idle=\([a-z]*\).*/\2/p' /proc/cmdline); echo "${idle:-halt}")"
    printf '@@meta clocksource_start %s\n' "$(clocksource)"
    printf '@@meta clk_tck %s\n' "$(getconf CLK_TCK)"
    printf '@@meta perftest %s\n' "$(ib_read_bw --version 2>&1 | head -n 1)"
    printf '@@meta rblk_bench %s\n' "$("$bin/rblk-bench" --version)"
    printf '@@meta active_mtu %s\n' "$(ibv_devinfo -d "$dev" | awk '/active_mtu/ { print $2; exit }')"
}

# The target's CPU while idle with no session, over SECS, for scale.
idle_target() {
    local idle0 idle1 t0 t1
    log "target idle for ${secs}s (no session): its CPU for scale"
    idle0=$(target_ns) t0=${EPOCHREALTIME/./}
    sleep "$secs"
    idle1=$(target_ns) t1=${EPOCHREALTIME/./}
    printf '@@meta target_idle_cpu_ns %s %s\n' "$((idle1 - idle0))" "$(((t1 - t0) * 1000))"
}

# Round $1 of the verbs rows: the perftest/rblk-bench pairs (perftest first in odd rounds, rblk
# first in even ones) and rblk's runs without a perftest twin.
verbs_round() {
    local r=$1 order=$((($1 + 1) % 2))
    # About SECS seconds each under TCG: a read round trip is ~50 us, a write ping-pong ~110 us.
    local read_iters=$((secs * 20000)) write_iters=$((secs * 10000))
    pair "$r" randread_4k_qd32 "$order" ib_read_bw -s 4096 -t 32 -o 32 "${bw[@]}" -D $((secs + 2)) -f 1 -- \
        --rw randread --bs 4k --iodepth 32
    pair "$r" randwrite_4k_qd32 "$order" ib_write_bw -s 4096 -t 32 "${bw[@]}" -D $((secs + 2)) -f 1 -- \
        --rw randwrite --bs 4k --iodepth 32
    pair "$r" read_64k_qd32 "$order" ib_read_bw -s 65536 -t 32 -o 32 "${bw[@]}" -D $((secs + 2)) -f 1 -- \
        --rw read --bs 64k --iodepth 32
    pair "$r" write_64k_qd32 "$order" ib_write_bw -s 65536 -t 32 "${bw[@]}" -D $((secs + 2)) -f 1 -- \
        --rw write --bs 64k --iodepth 32
    pair "$r" randread_4k_qd1 "$order" ib_read_lat -s 4096 -n "$read_iters" -- \
        --rw randread --bs 4k --iodepth 1
    run_rblk randread_4k_qd1_spin "$r" --rw randread --bs 4k --iodepth 1 --spin 1ms
    run_raw randread_4k_qd1_raw "$r" 20000
    pair "$r" randwrite_4k_qd1 "$order" ib_write_lat -s 4096 -n "$write_iters" -- \
        --rw randwrite --bs 4k --iodepth 1
    run_rblk randwrite_4k_qd1_spin "$r" --rw randwrite --bs 4k --iodepth 1 --spin 1ms
    run_rblk randread_4k_2x16 "$r" --rw randread --bs 4k --jobs 2 --iodepth 16
    run_rblk randread_4k_2x16_poll "$r" --rw randread --bs 4k --jobs 2 --iodepth 16 --poll
    run_rblk_2proc randread_4k_2proc "$r" --rw randread --bs 4k --iodepth 16
    run_raw randread_4k_qd32_raw "$r" 12000 --depth 32
    run_raw randread_4k_2x16_raw "$r" 12000 --depth 16 --threads 2
}

# For the pictures: one more rblk-bench run with --log, its files sent to the host.
picture_run() {
    local f
    local -a pic=(--rw randread --bs 4k --iodepth 32 --log "$work/bench" --log-interval "$LOG_INTERVAL_MS")
    log "rblk-bench ${pic[*]} (time series for build/compare/iops.png)"
    if measure picture rblk 0 - bench -o json --output "$work/bench.json" "${pic[@]}" >"$work/pic.out" 2>&1; then
        bench_lines "$work/bench.json" >&2
        for f in "$work"/bench_iops.1.log "$work"/bench_bw.1.log "$work"/bench_lat.1.log "$work"/bench.hlog "$work"/bench.json; do
            if [[ -s $f ]]; then emit_file "${f##*/}" "$f"; fi
        done
    else
        fail picture rblk 0 "rblk-bench ${pic[*]} failed: $(oneline 400 "$work/pic.out")"
    fi
}

# Stops this script's rblk-target; its failure is a row.
stop_target() {
    local rc=0
    kill -TERM "$tpid"
    wait "$tpid" || rc=$?
    trap - EXIT
    if ((rc != 0)); then
        tail -n 20 "$work/target.log" >&2
        fail target rblk 0 "rblk-target exited with status $rc: $(tail -n 3 "$work/target.log" | oneline)"
    fi
}

# The QD1 per-stage timeline (scripts/timeline-rxe.sh's part in the guest, with its own
# rblk-target and NVMe-oF/RDMA export): its raw output goes to the host as a file, streamed, so
# that the paths it finished reach the host even if the guest dies on a later one.
timeline_run() {
    local rc=0
    log "timeline: scripts/timeline-rxe.sh --in-guest $TIMELINE_SECS $TIMELINE_TRACE_SECS (QD1 per-stage timeline)"
    printf '@@file %s\n' timeline-guest.log
    timeout 900 "$REPO_ROOT/scripts/timeline-rxe.sh" --in-guest "$TIMELINE_SECS" "$TIMELINE_TRACE_SECS" "$bin" || rc=$?
    printf '@@endfile %s\n' timeline-guest.log
    ((rc == 0)) || fail timeline timeline 0 "scripts/timeline-rxe.sh --in-guest $(status_text "$rc")"
}

# The counts per I/O of every front end (scripts/counts-rxe.sh's part in the guest, with its own
# rblk-target and NVMe-oF/RDMA export, after this script's are gone), streamed to the host as a
# file like the timeline's. Before the timeline: its kprobes are what panicked this kernel before.
counts_run() {
    local rc=0
    log "counts: scripts/counts-rxe.sh --in-guest $COUNTS_SECS (per-I/O counts, every front end, QD1 and QD32)"
    printf '@@meta counts_secs %s\n@@file %s\n' "$COUNTS_SECS" counts-guest.log
    timeout 900 "$REPO_ROOT/scripts/counts-rxe.sh" --in-guest "$COUNTS_SECS" \
        bench,ublk,ublk-null,libublk-null,nbd,fuse,nvmeof randread "$bin" "${libublk:--}" \
        "${RBLK_LIBUBLK_NULL_WHY:-not built on the host}" || rc=$?
    printf '@@endfile %s\n' counts-guest.log
    ((rc == 0)) || fail counts counts 0 "scripts/counts-rxe.sh --in-guest $(status_text "$rc")"
}

guest_main() {
    local secs=$1 rounds=$2 bw_args=$3
    local bin=${RBLK_BIN_DIR:-$REPO_ROOT/build/release}
    local addr=${RBLK_ADDR:?RBLK_ADDR: the address of the rxe device} dev=${RBLK_DEVICE:-rxe0}
    local work tpid r
    work=$(mktemp -d /tmp/rblk-compare.XXXXXX)
    local uri="rblk://$addr:$RBLK_PORT/v"
    local -a bw
    read -r -a bw <<<"$bw_args"
    # perftest: server in the background, client against $addr; plain first, then -R (rdma_cm).
    local pt_port=18515
    local -a pt_cm=()
    # The block devices (scripts/lib/compare-blk.sh).
    local nqn=nqn.2024-12.io.rblk:compare
    local -a blk_paths=(nvmeof nbd fuse ublk ublk-sleep ublk-null libublk-null ublk-q2)
    local -A blk_why=() # path -> why it cannot run in this boot
    local libublk=${RBLK_LIBUBLK_NULL:-}
    # scripts/lib/target.sh's blk_attach and blk_detach.
    local BLK_BIN=$bin BLK_URI=$uri BLK_RXE=$dev BLK_WORK=$work BLK_NQN=$nqn BLK_ADDR=$addr BLK_LIBUBLK=$libublk
    local BLK_DEV="" BLK_PID="" BLK_ERR="" BLK_LIBUBLK_ID=""

    guest_meta
    log "starting rblk-target --listen $addr:$RBLK_PORT --volume v:$VOLUME_SIZE"
    start_target "$work/target.log" "$bin" 30 --listen "$addr:$RBLK_PORT" --volume "v:$VOLUME_SIZE" ||
        die "rblk-target did not start"
    tpid=$TARGET_PID
    # shellcheck disable=SC2064 # expand now: the trap must kill this target
    trap "kill -TERM $tpid 2>/dev/null || true" EXIT
    idle_target

    log "warm-up (discarded): ib_read_bw and rblk-bench, 2 s each"
    perftest "$work/warm.out" ib_read_bw -s 4096 -t 32 -o 32 -D 4 -f 1 ||
        log "warning: the perftest warm-up failed: ${PERFTEST_ERR:-}"
    timeout 120 "$bin/rblk-bench" "$uri" --device "$dev" --quiet --runtime 2 >/dev/null ||
        log "warning: the rblk-bench warm-up failed"
    printf '@@meta fio %s\n' "$(fio --version 2>&1)"
    printf '@@meta nvme_cli %s\n' "$(nvme version 2>&1 | head -n 1)"
    blk_check

    for r in $(seq 1 "$rounds"); do
        log "round $r/$rounds"
        verbs_round "$r"
        block_round "$r"
    done
    if [[ -z ${blk_why[nvmeof]:-} ]]; then
        nvmeof_teardown "$nqn" 2>"$work/nvmet.err" || fail teardown nvmeof 0 "$(oneline 400 "$work/nvmet.err")"
    fi
    picture_run
    stop_target
    printf '@@meta clocksource_end %s\n' "$(clocksource)"
    counts_run
    timeline_run
    rm -rf "$work"
    printf '@@meta complete yes\n'
}
