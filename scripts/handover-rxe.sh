#!/usr/bin/env bash
# The takeover pause (`rblk-target --takeover`), measured over rxe in one guest boot with 8 GiB of
# memory against issue 42's goals (outside CI, about 5 minutes):
#
#   scripts/handover-rxe.sh [SIZE...]    # default: 64M 4G; builds release binaries,
#                                        # RBLK_BIN_DIR=DIR uses those
#
# First bare registrations of each size (rblk-test-client reg-time: one ibv_reg_mr of a memfd's
# pages as a RAM volume is made, mapped and populated; then of the same pages mapped afresh, as a
# successor maps and registers a handed RAM volume). Then for each RAM volume size and each
# workload, fio 4 KiB at QD1 on `rblk attach` (defaults), every completion logged, across three
# takeovers 6 s apart, each by a copy of the binary (as an upgrade installs one):
#   randread          --rw=randread
#   randwrite-fsync   --rw=randwrite --fsync=1
# scripts/lib/handover.py makes the table: the longest gap between fio completions (the worst of
# the three takeovers), each successor's request to the old daemon's `bye`, its registration
# before saying ready, any registration after `bye`, and the goals (read, not asserted).
# Writes build/handover/guest.log and table.txt. Takes /tmp/rblk-guest.lock.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SCRIPT_NAME=handover
CALLER_PWD=$PWD
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh"

host_main() {
    local size
    for size in "$@"; do
        [[ $size =~ ^[1-9][0-9]*[KMG]$ ]] || help_or_usage_error "$size"
    done
    local sizes=${*:-64M 4G}
    release_bins rblk-target rblk rblk-test-client
    local out=$REPO_ROOT/build/handover
    mkdir -p "$out"
    snapshot_bins "$out/bin" rblk-target rblk rblk-test-client
    RXE_GUEST_MEM=${RXE_GUEST_MEM:-8G} guest_tee "$out/guest.log" "$REPO_ROOT/scripts/handover-rxe.sh" --in-guest "$sizes"
    lib_python "$REPO_ROOT/scripts/lib/handover.py" table "$out/guest.log" | tee "$out/table.txt"
}

# wait_log FILE TEXT: waits (up to 120 s) until FILE has a line with TEXT.
wait_log() {
    wait_for "$1" "$2" 120 && return 0
    echo "handover: no '$2' in $1" >&2
    cat "$1" >&2
    return 1
}

# one_run SIZE WORKLOAD FIO_ARGS...: a volume of SIZE on `rblk attach`, fio at QD1 across three
# takeovers; prints the run's @@ lines (scripts/lib/handover.py run).
one_run() {
    local size=$1 wl=$2 bin=$RBLK_BIN_DIR addr=$RBLK_ADDR port=7431
    shift 2
    local d=$WORK/$size-$wl
    mkdir -p "$d"
    local args=(--listen "$addr:$port" --admin-socket "$d/admin.sock" --volume "v:$size" --state-dir "$d/state")
    start_target "$d/d0.log" "$bin" 120 "${args[@]}"
    local old=$TARGET_PID dev
    dev=$("$bin/rblk" attach "rblk://$addr:$port/v" --daemon)
    fio --name=t --filename="$dev" --ioengine=libaio --direct=1 --bs=4k --iodepth=1 --size=64M \
        --time_based --runtime=24 --write_lat_log="$d/lat" --log_avg_msec=0 \
        --output-format=terse --terse-version=3 "$@" >"$d/fio.out" 2>&1 &
    local fio=$! n next new
    sleep 4
    for n in 1 2 3; do
        next=$(date +%s.%N)
        cp "$bin/rblk-target" "$d/rblk-target-$n"
        "$d/rblk-target-$n" --allow-any-host "${args[@]}" --takeover 2>"$d/d$n.log" &
        new=$!
        wait_gone "$old"
        wait_log "$d/d$n.log" "took over"
        old=$new
        sleep "$(echo "6 - ($(date +%s.%N) - $next)" | bc | sed 's/^-.*/0/')"
    done
    wait "$fio" || true
    "$bin/rblk" detach "$dev" >/dev/null 2>&1 || true
    kill -TERM "$old"
    wait_gone "$old"
    python3 "$REPO_ROOT/scripts/lib/handover.py" run "$size" "$wl" "$d"
}

guest_main() {
    local sizes=$1 size bin=$RBLK_BIN_DIR
    # shellcheck source=lib/target.sh
    source "$REPO_ROOT/scripts/lib/target.sh"
    modprobe ublk_drv
    WORK=/tmp/handover-rxe
    rm -rf "$WORK"
    mkdir -p "$WORK"
    export RBLK_RUN_DIR=$WORK/run RUST_LOG=info
    for size in $sizes; do
        local bytes
        bytes=$(python3 "$REPO_ROOT/scripts/lib/handover.py" bytes "$size")
        printf '@@reg %s %s\n' "$size" "$("$bin/rblk-test-client" reg-time "$RBLK_DEVICE" --size "$bytes" |
            awk '{ print $2, $4, $6 }')"
    done
    for size in $sizes; do
        one_run "$size" randread --rw=randread
        one_run "$size" randwrite-fsync --rw=randwrite --fsync=1
    done
}

script_main 1 "SIZES" "$@"
