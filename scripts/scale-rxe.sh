#!/usr/bin/env bash
# How the one-sided path's cost of granting access scales, measured in ONE rxe guest boot:
#
#   scripts/scale-rxe.sh
#
# Builds the binaries on the host (debug; RBLK_BIN_DIR=DIR takes them from DIR instead), boots
# the rxe guest (scripts/rxe-guest.sh, RXE_GUEST_MEM default 8G here: the volumes are RAM) and
# there starts rblk-target with three RAM volumes, s64m (64 MiB), s1g (1 GiB) and s4g (4 GiB),
# twice, one after the other: with --memory-windows off (a registration per session: the
# "before") and on (one registration per volume, a window per QP). For each it prints three tables:
#
#   1. OPEN time by volume size: `rblk-test-client open-time URI --count SCALE_OPENS` connects,
#      OPENs (read-only) and closes sessions one after the other; median, min and max of the
#      connect + OPEN time. With a registration per session, OPEN pins and maps the whole
#      volume, so it grows with the size; with one registration per volume and a memory window
#      per QP it should not (issue 14's goal: within 20% of each other).
#   2. The target's VmPin (/proc/PID/status) and STATS registrations and windows with 0, 1, 4
#      and 8 sessions held open on s4g (`rblk-test-client hold`): per-session registrations pin
#      sessions x 4 GiB of accounting; the goal is flat.
#   3. Connection setup rate: sessions opened and closed per second on s64m, from table 1's run.
#
# Environment: SCALE_OPENS (default 10), RBLK_BIN_DIR, RXE_GUEST_MEM. Raw output:
# build/scale/guest.log; the tables: build/scale/table.txt. TCG makes absolute times meaningless:
# compare rows of one run. It fails only when a tool fails, never on the figures.
set -euo pipefail
shopt -s inherit_errexit

REPO_ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
if [[ -n ${RBLK_BIN_DIR:-} && $RBLK_BIN_DIR != /* ]]; then
    RBLK_BIN_DIR=$PWD/$RBLK_BIN_DIR
fi
CALLER_PWD=$PWD
cd "$REPO_ROOT"
OUT=build/scale
PORT=7421

SCRIPT_NAME=scale
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh"

# In the guest: both modes, one after the other, each with a target of its own.
guest_main() {
    local opens=$1 mode
    for mode in off on; do
        guest_mode "$opens" "$mode"
    done
}

# One mode: rblk-target --memory-windows MODE, the three tables.
guest_mode() {
    local opens=$1 mode=$2 bin=${RBLK_BIN_DIR:?} addr=${RBLK_ADDR:?RBLK_ADDR: the rxe address}
    local work tpid
    work=$(mktemp -d /tmp/rblk-scale.XXXXXX)
    # shellcheck source=lib/target.sh
    source "$REPO_ROOT/scripts/lib/target.sh"
    start_target "$work/target.log" "$bin" 60 --listen "$addr:$PORT" --memory-windows "$mode" \
        --volume s64m:64M --volume s1g:1G --volume s4g:4G || die "rblk-target did not start"
    tpid=$TARGET_PID
    local base="rblk://$addr:$PORT"
    vm_pin() { awk '/^VmPin:/ { print $2 }' "/proc/$tpid/status"; }
    # One STATS field (a session of its own on s64m asks).
    stat() { "$bin/rblk" stats "$base/s64m" -o json | sed -n "s/.*\"$1\": *\([0-9a-z]*\).*/\1/p"; }

    echo "== [memory windows $mode] open time by volume size (connect + OPEN, $opens sessions each)"
    printf '%-8s %10s %10s %10s %14s\n' volume p50_ms min_ms max_ms sessions_per_s
    local v line
    for v in s64m s1g s4g; do
        line=$("$bin/rblk-test-client" open-time "$base/$v" --count "$opens")
        read -r _ _ p50 _ min _ max _ rate _ <<<"$line"
        printf '%-8s %10s %10s %10s %14s\n' "$v" "$p50" "$min" "$max" "$rate"
    done

    # registrations and windows are STATS' (target-wide, the asking session's own included);
    # with windows each volume opened so far has its one registration, whatever the sessions.
    echo "== [memory windows $mode] target VmPin with sessions held on s4g"
    printf '%-9s %12s %14s %8s\n' sessions vmpin_kb registrations windows
    printf '%-9s %12s %14s %8s\n' 0 "$(vm_pin)" "$(stat registrations)" "$(stat windows)"
    local n fifo
    for n in 1 4 8; do
        fifo=$work/hold.$n
        mkfifo "$fifo"
        "$bin/rblk-test-client" hold "$base/s4g" --sessions "$n" <"$fifo" >"$work/hold.$n.out" &
        local hpid=$!
        exec 9>"$fifo" # holds the client's stdin open
        wait_for "$work/hold.$n.out" '^held' 60 "$hpid" || kill -0 "$hpid" 2>/dev/null ||
            die "rblk-test-client hold $n failed"
        local pin
        pin=$(vm_pin)
        printf '%-9s %12s %14s %8s\n' "$n" "$pin" "$(stat registrations)" "$(stat windows)"
        exec 9>&-
        wait "$hpid"
    done
    kill -TERM "$tpid" 2>/dev/null || true
    wait "$tpid" 2>/dev/null || true
}

host_main() {
    (($# == 0)) || help_or_usage_error "$1"
    local opens=${SCALE_OPENS:-10}
    [[ $opens =~ ^[1-9][0-9]*$ ]] || die "SCALE_OPENS must be a positive number (got '$opens')"
    scripts/deps.sh
    local bin_dir=${RBLK_BIN_DIR:-}
    if [[ -z $bin_dir ]]; then
        cargo build --workspace --all-features --bins
        bin_dir=${CARGO_TARGET_DIR:-$REPO_ROOT/build}/debug
    fi
    local b
    for b in rblk-target rblk rblk-test-client; do
        [[ -x $bin_dir/$b ]] || die "no $bin_dir/$b"
    done
    mkdir -p "$OUT"
    : >"$OUT/guest.log"
    RBLK_BIN_DIR=$bin_dir RXE_GUEST_MEM=${RXE_GUEST_MEM:-8G} \
        run_guest "$OUT/guest.log" 1800 "$REPO_ROOT/scripts/scale-rxe.sh" "$opens"
    ((GUEST_RC == 0)) || die "the guest run failed; see $OUT/guest.log"
    sed -n '/^== /,$p' "$OUT/guest.log" | grep -v '^rxe-guest:\|^@@meta ' | tee "$OUT/table.txt"
}

script_main 1 OPENS "$@"
