#!/usr/bin/env bash
# Growing a served volume under I/O (issue 44's goals), over rxe in one guest boot with 8 GiB
# (RXE_GUEST_MEM=8G unless set; outside CI, a few minutes):
#
#   scripts/grow-rxe.sh [--rounds N]   # builds release binaries; RBLK_BIN_DIR=DIR uses those
#
# Two cases, each N times (default 3) with a fresh rblk-target: a RAM volume added with
# `rblk-target admin add`, grown with `admin resize` while rblk-test-client grow-watch (a library
# user: a queue writing and verifying 64 KiB pieces at random offsets, opened before the grow)
# runs on it:
#   small   256 MiB -> 1,280 MiB          large   2 GiB -> 3 GiB   (both add 1 GiB)
# Per grow: the request's time (@@request, just before `admin resize`), when the library's
# on_resize hook heard the new size (`resized`), when the first write past the old end completed
# through the queue opened before (`past`), the target's peak RSS (VmHWM) and its memfds' inodes
# before and after, the target's log lines for the segment made and registered, and the client's
# I/O, verify errors and reconnects at the end.
# scripts/lib/grow.py makes the table (build/grow/table.txt) and summary.json: the resize time
# (request to `past`), median per case and large/small (goal: at most 1.25), the hook's latency
# (median at most 10 ms, max at most 100 ms) and where it goes (the segment made, registered,
# told), RSS at most old + added + 64 MiB, 0 errors, 0 reconnects, the old segment's memfd
# inode unchanged. Takes /tmp/rblk-guest.lock.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SCRIPT_NAME=grow
CALLER_PWD=$PWD
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh"

host_main() {
    local rounds=3
    while (($#)); do
        case $1 in
        --rounds)
            is_count "${2:-}" || die "--rounds takes a count"
            rounds=$2
            shift 2
            ;;
        *) help_or_usage_error "$1" ;;
        esac
    done
    release_bins rblk-target rblk-test-client
    local out=$REPO_ROOT/build/grow
    mkdir -p "$out"
    snapshot_bins "$out/bin" rblk-target rblk-test-client
    RXE_GUEST_MEM=${RXE_GUEST_MEM:-8G} guest_tee "$out/guest.log" "$REPO_ROOT/scripts/grow-rxe.sh" --in-guest "$rounds"
    lib_python "$REPO_ROOT/scripts/lib/grow.py" "$out/guest.log" "$out/summary.json" | tee "$out/table.txt"
}

# The inodes of the target's volume memfds, in fd order.
memfd_inodes() {
    local f
    for f in /proc/"$1"/fd/*; do
        [[ $(readlink "$f" 2>/dev/null) == *"rblk-volume:v (deleted)" ]] && stat -L -c %i "$f"
    done | tr '\n' ' '
}

one_grow() { # CASE ROUND FROM TO
    local case=$1 round=$2 from=$3 to=$4 bin=$RBLK_BIN_DIR d=$WORK/$1-$2
    mkdir -p "$d"
    local sock=$d/admin.sock
    # A config file without volumes (without one the daemon serves vol0, 1 GiB).
    : >"$d/target.toml"
    start_target "$d/target.log" "$bin" 120 --config "$d/target.toml" --listen "$RBLK_ADDR:7442" \
        --admin-socket "$sock" --state-dir "$d/state"
    local target=$TARGET_PID
    "$bin/rblk-target" admin --socket "$sock" add "v:$from" >/dev/null
    exec 7> >("$bin/rblk-test-client" grow-watch "rblk://$RBLK_ADDR:7442/v" >"$d/client.out" 2>&1)
    wait_for "$d/client.out" '^ready' 60 || die "$case: the client did not start: $(cat "$d/client.out")"
    sleep 1
    printf '@@before %s %s %s inodes %s\n' "$case" "$round" "$(grep VmHWM /proc/"$target"/status | awk '{print $2}')" "$(memfd_inodes "$target")"
    printf '@@request %s %s %s %s\n' "$case" "$round" "$(date +%s.%N)" "$to"
    "$bin/rblk-target" admin --socket "$sock" resize v "$to" >"$d/resize.out" 2>&1 || cat "$d/resize.out" >&2
    wait_for "$d/client.out" '^past' 120 || echo "grow: $case $round: no write past the old end" >&2
    sleep 2
    printf '@@after %s %s %s inodes %s\n' "$case" "$round" "$(grep VmHWM /proc/"$target"/status | awk '{print $2}')" "$(memfd_inodes "$target")"
    exec 7>&-
    wait_for "$d/client.out" '^done' 60 || echo "grow: $case $round: the client did not finish" >&2
    sed "s/^/@@client $case $round /" "$d/client.out"
    # The target's stages, on its own clock: the segment made, registered for the windows.
    grep -E 'grew from|for memory windows' "$d/target.log" | sed "s/^/@@target $case $round /" || true
    kill -TERM "$target" 2>/dev/null || true
    wait_gone "$target" || true
}

guest_main() {
    local rounds=$1 r
    # shellcheck source=lib/target.sh
    source "$REPO_ROOT/scripts/lib/target.sh"
    WORK=/tmp/grow-rxe
    rm -rf "$WORK"
    mkdir -p "$WORK"
    for r in $(seq "$rounds"); do
        one_grow small "$r" 256M 1280M
        one_grow large "$r" 2G 3G
    done
}

script_main 1 "ROUNDS" "$@"
