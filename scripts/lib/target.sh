# shellcheck shell=bash
# Shell helpers shared by the guest-side scripts (source it; bash).

# start_target LOG BIN SECS ARGS...: starts BIN/rblk-target ARGS... in the background with its
# stderr in LOG, waits up to SECS seconds until it says it is listening and sets TARGET_PID.
# Returns 1 (after printing the log) if it exits first; kills it and returns 1 if it does not
# listen in time.
start_target() {
    local log=$1 bin=$2 secs=$3
    shift 3
    "$bin/rblk-target" "$@" 2>"$log" &
    TARGET_PID=$!
    local _
    for _ in $(seq 1 $((secs * 10))); do
        grep -q 'listening on' "$log" && return 0
        if ! kill -0 "$TARGET_PID" 2>/dev/null; then
            cat "$log" >&2
            echo "rblk-target exited before it listened" >&2
            return 1
        fi
        sleep 0.1
    done
    kill -TERM "$TARGET_PID" 2>/dev/null || true
    echo "rblk-target did not start listening within $secs s" >&2
    return 1
}

# wait_gone PID: waits (up to 60 s) until process PID (not necessarily our child) has exited.
wait_gone() {
    local _
    for _ in $(seq 1 600); do
        [[ -e /proc/$1 ]] || return 0
        sleep 0.1
    done
    return 1
}

# wait_bdev DEV: waits (up to 30 s) until DEV is a block device with a non-zero size.
wait_bdev() {
    local size=0 _
    for _ in $(seq 1 300); do
        if [[ -b $1 ]]; then
            read -r size <"/sys/class/block/${1#/dev/}/size" 2>/dev/null || size=0
            ((size > 0)) && return 0
        fi
        sleep 0.1
    done
    return 1
}
