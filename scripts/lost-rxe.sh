#!/usr/bin/env bash
# How soon an initiator reports a SIGKILLed target, against a bare rdma_cm peer of the same target,
# over rxe in one guest boot (issue 42's goal: at most 10 ms after the bare peer sees DISCONNECTED;
# outside CI, about 2 minutes):
#
#   scripts/lost-rxe.sh          # builds release binaries; RBLK_BIN_DIR=DIR uses those
#
# For each case a fresh rblk-target (a 64 MiB RAM volume), a bare peer (rblk-test-client watch: one
# connection, an OPEN by hand, then a sleep until rdma_cm reports the disconnect), the initiator
# below, 2 s of settling, then a SIGKILL of the target:
#   library-idle   rblk-test-client idle (an engine's owner asleep in Engine::idle_wait)
#   library-io     rblk-test-client idle --io (4 KiB writes through the engine without pause)
#   ublk-idle      rblk attach, no I/O;        ublk-io   the same under fio randread QD1
#   nbd-idle       rblk nbd + nbd-client;      nbd-io    the same under fio randread QD1
# The initiator's report is its loss log line ("the session to the target was lost"), stamped by
# its own log. The kernel's side comes from tracefs (rdma_cma:cm_event_handler: when it delivered
# DISCONNECTED to each peer's rdma_cm ids, known by `rdma resource show cm_id`), so the table
# tells the target's teardown order apart from each peer's own latency.
# scripts/lib/lost.py makes the table (build/lost/table.txt). Takes
# /tmp/rblk-guest.lock.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SCRIPT_NAME=lost
CALLER_PWD=$PWD
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh"

host_main() {
    (($# == 0)) || help_or_usage_error "$1"
    release_bins rblk-target rblk rblk-test-client
    local out=$REPO_ROOT/build/lost
    mkdir -p "$out"
    snapshot_bins "$out/bin" rblk-target rblk rblk-test-client
    guest_tee "$out/guest.log" "$REPO_ROOT/scripts/lost-rxe.sh" --in-guest
    lib_python "$REPO_ROOT/scripts/lib/lost.py" table "$out/guest.log" | tee "$out/table.txt"
}

one_case() { # CASE
    local case=$1 bin=$RBLK_BIN_DIR addr=$RBLK_ADDR port=7441 d=$WORK/$1 pids=() dev=""
    mkdir -p "$d"
    start_target "$d/target.log" "$bin" 60 --listen "$addr:$port" --volume v:64M --admin-socket none
    local uri=rblk://$addr:$port/v target=$TARGET_PID
    "$bin/rblk-test-client" watch "$addr:$port" v >"$d/watch.out" 2>&1 &
    pids+=($!)
    echo "$!" >"$d/watch.pid"
    wait_for "$d/watch.out" watching 30 || cat "$d/watch.out" >&2
    case $case in
    library-idle | library-io)
        local io=()
        [[ $case == library-io ]] && io=(--io)
        RUST_LOG=warn "$bin/rblk-test-client" idle "$uri" "${io[@]}" </dev/null >"$d/client.out" 2>"$d/init.log" &
        pids+=($!)
        ;;
    ublk-*)
        dev=$(RUST_LOG=warn "$bin/rblk" attach "$uri" --daemon --ctrl-loss-tmo 2 --log-file "$d/init.log")
        ;;
    nbd-*)
        RUST_LOG=warn "$bin/rblk" nbd "$uri" --ctrl-loss-tmo 2 --listen "unix:$d/nbd.sock" 2>"$d/init.log" &
        pids+=($!)
        wait_socket "$d/nbd.sock" 30 || true
        nbd-client -unix "$d/nbd.sock" /dev/nbd0 -block-size 4096 >/dev/null
        dev=/dev/nbd0
        ;;
    esac
    if [[ $case == *-io && -n $dev ]]; then
        fio --name=t --filename="$dev" --ioengine=libaio --direct=1 --rw=randread --bs=4k --iodepth=1 \
            --size=16M --time_based --runtime=30 --output-format=terse >/dev/null 2>&1 &
        pids+=($!)
    fi
    sleep 2
    # Whose each rdma_cm id is (pid, ports), for the kernel's DISCONNECTED events in the trace.
    rdma -j resource show cm_id >"$d/cm_ids.json" 2>/dev/null || true
    local tr=/sys/kernel/tracing
    echo >"$tr/trace"
    echo 1 >"$tr/tracing_on"
    printf '@@kill %s %s\n' "$case" "$(date +%s.%N)"
    echo "rblk-kill $(date +%s.%N)" >"$tr/trace_marker"
    kill -KILL "$target"
    wait_for "$d/watch.out" disconnected 10 || echo "lost: $case: the bare peer saw no disconnect" >&2
    wait_for "$d/init.log" "was lost" 10 || echo "lost: $case: no loss line" >&2
    echo 0 >"$tr/tracing_on"
    cp "$tr/trace" "$d/trace.txt"
    python3 "$REPO_ROOT/scripts/lib/lost.py" run "$case" "$d"
    kill -KILL "${pids[@]}" 2>/dev/null || true
    case $case in
    ublk-*) "$bin/rblk" detach "$dev" >/dev/null 2>&1 || true ;;
    nbd-*) nbd-client -d /dev/nbd0 >/dev/null 2>&1 || true ;;
    esac
    local p
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}

guest_main() {
    # shellcheck source=lib/target.sh
    source "$REPO_ROOT/scripts/lib/target.sh"
    modprobe ublk_drv
    modprobe nbd
    WORK=/tmp/lost-rxe
    rm -rf "$WORK"
    mkdir -p "$WORK"
    export RBLK_RUN_DIR=$WORK/run
    # rdma_cm's events as the kernel delivers them (tracefs rdma_cma:cm_event_handler), to tell
    # the kernel's order of the dying target's disconnects from each peer's own latency.
    local tr=/sys/kernel/tracing
    [[ -d $tr/events ]] || mount -t tracefs tracefs "$tr"
    echo 0 >"$tr/tracing_on"
    echo 1 >"$tr/events/rdma_cma/cm_event_handler/enable"
    local c
    for c in library-idle library-io ublk-idle ublk-io nbd-idle nbd-io; do
        one_case "$c"
    done
}

script_main 0 "" "$@"
