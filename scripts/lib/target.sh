# Shell helpers shared by the guest-side scripts (source it; bash).

# start_target LOG BIN ARGS...: starts BIN/rblk-target ARGS... in the background with its stderr
# in LOG, waits until it says it is listening (60 s at most) and sets TARGET_PID. Dies (returns 1
# after printing the log) if it exits or does not listen in time.
start_target() {
    local log=$1 bin=$2
    shift 2
    "$bin/rblk-target" "$@" 2>"$log" &
    TARGET_PID=$!
    local _
    for _ in $(seq 1 600); do
        grep -q 'listening on' "$log" && return 0
        if ! kill -0 "$TARGET_PID" 2>/dev/null; then
            cat "$log" >&2
            echo "rblk-target exited before it listened" >&2
            return 1
        fi
        sleep 0.1
    done
    echo "rblk-target did not start listening within 60 s" >&2
    return 1
}
