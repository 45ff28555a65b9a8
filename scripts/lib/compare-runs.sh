# shellcheck shell=bash disable=SC2154 # guest_main's locals (compare-guest.sh), read through bash's dynamic scope
# scripts/compare-rxe.sh's measured runs, in the guest (sourced by scripts/lib/compare-guest.sh;
# bash). Every measured run goes through ONE function, `measure`: one rblk-bench run (run_rblk,
# run_rblk_2proc: the two processes together), one perftest server-and-client pair (run_perftest),
# one rblk-test-client raw-lat run (run_raw), one fio job on a block device (run_fio, in
# scripts/lib/compare-blk.sh). The functions read guest_main's locals (bash's dynamic scope):
# secs, work, bin, uri, dev, addr, tpid, pt_port, pt_cm.

# measure WORKLOAD TOOL ROUND SAMPLE CMD...: runs CMD, one measured run (WORKLOAD and TOOL as in
# the @@begin line its report gets, ROUND the round; 0 for the picture run), with the caller's
# redirections, and returns its status. SAMPLE "-": CMD alone; "BLK:PID": CMD under `sampled`,
# the guest's CPU over a window of it into $work/gcpu (BLK: the block device whose I/Os are
# counted, PID: the process whose rblk-q* threads' sleeps are counted; either may be empty).
# This is the wrapping point for per-I/O counts (system calls, context switches, doorbells, CQ
# re-arms around a workload): a wrapper here sees every measured run and nothing else (not the
# warm-ups, not the device set-up). For perftest, CMD is the whole server-and-client pair with its
# retries (a failed clock calibration runs it again); for a block device, SAMPLE names the device
# and the process serving it (none for nvmeof: the kernel serves it).
measure() {
    local sample=$4
    shift 4
    if [[ $sample == - ]]; then
        "$@"
    else
        sampled "$work/gcpu" "${sample%%:*}" "${sample#*:}" "$@"
    fi
}

# "exited with status N", "(a timeout)" for timeout(1)'s 124.
status_text() {
    if (($1 == 124)); then echo "timed out (exit status 124)"; else echo "exited with status $1"; fi
}
# A row that failed: recorded for the host (the table and summary.json show it), and the run
# goes on.
fail() { # WORKLOAD TOOL ROUND MESSAGE
    printf '@@fail %s %s %s %s\n' "$1" "$2" "$3" "$4"
    log "  FAILED: $2 $1 (round $3): $4"
}
# The target's threads' CPU time so far, in ns (they all live as long as no session exists).
target_ns() {
    local sum=0 ns _ t
    for t in /proc/"$tpid"/task/*/schedstat; do
        read -r ns _ <"$t" 2>/dev/null && sum=$((sum + ns))
    done
    echo "$sum"
}
# One reading for `sampled`, with shell builtins only (no fork between its parts): sets S_T (us,
# the clock), S_BUSY and S_ALL (clock ticks of all vCPUs from /proc/stat's "cpu" line: busy =
# user + nice + system + irq + softirq + steal, guest time being in user already; all = busy +
# idle + iowait), S_IOS (reads + writes completed on block device $1, /sys/block/DEV/stat; -1
# without one) and S_Q (voluntary context switches of process $2's ublk queue threads, rblk-q0,
# rblk-q1, ...; -1 when it has none).
sample_now() {
    local _ us ni sy id io hi si st t comm status found=0 vcs_re=$'\nvoluntary_ctxt_switches:[[:space:]]*([0-9]+)'
    local -a f
    read -r _ us ni sy id io hi si st _ </proc/stat
    S_T=${EPOCHREALTIME/./}
    S_BUSY=$((us + ni + sy + hi + si + st))
    S_ALL=$((S_BUSY + id + io))
    S_IOS=-1 S_Q=0
    if [[ -n $1 ]] && read -r -a f <"/sys/class/block/${1#/dev/}/stat" 2>/dev/null; then
        S_IOS=$((f[0] + f[4]))
    fi
    if [[ -n $2 ]]; then
        for t in /proc/"$2"/task/*; do
            read -r comm <"$t/comm" 2>/dev/null || continue
            [[ $comm == rblk-q* ]] || continue
            # The whole file in one read: line by line, bash seeks back after each line, and
            # /proc regenerates the file at that offset with other numbers (lines shift).
            status=""
            read -r -d '' status <"$t/status" 2>/dev/null || true
            if [[ $status =~ $vcs_re ]]; then
                S_Q=$((S_Q + BASH_REMATCH[1])) found=1
            fi
        done
    fi
    ((found)) || S_Q=-1
}
# Runs "$@" (a fio or rblk-bench command: a second of ramp, then SECS measured) in the background
# and samples the guest's CPU over a window inside its measured part: from 1.5 s after its
# start (the ramp and its start-up) for SECS - 1 s (at least 1 s). Writes "BUSY_TICKS ALL_TICKS
# WINDOW_NS DEV_IOS QUEUE_SLEEPS OVERRAN" to file $1 (DEV_IOS: I/Os completed on block device $2
# in the window, -1 without one; QUEUE_SLEEPS: voluntary switches of process $3's queue
# threads, -1 without them; OVERRAN: 1 when the command had ended before the window did);
# returns the command's status.
sampled() {
    local out=$1 blk=$2 spid=$3 pid rc=0 win=$((secs > 2 ? secs - 1 : 1)) overran=0
    local b0 a0 t0 i0 q0
    shift 3
    "$@" &
    pid=$!
    sleep 1.5
    sample_now "$blk" "$spid"
    b0=$S_BUSY a0=$S_ALL t0=$S_T i0=$S_IOS q0=$S_Q
    sleep "$win"
    sample_now "$blk" "$spid"
    kill -0 "$pid" 2>/dev/null || overran=1
    wait "$pid" || rc=$?
    local ios=-1 qs=-1
    ((i0 >= 0 && S_IOS >= 0)) && ios=$((S_IOS - i0))
    ((q0 >= 0 && S_Q >= 0)) && qs=$((S_Q - q0))
    echo "$((S_BUSY - b0)) $((S_ALL - a0)) $(((S_T - t0) * 1000)) $ios $qs $overran" >"$out"
    return "$rc"
}

# Waits until a TCP listener on $1 shows up (perftest's out-of-band channel), or the server $2 died.
wait_listen() {
    local hex
    hex=$(printf ':%04X ' "$1")
    for _ in $(seq 1 200); do
        grep -q "${hex}[0-9A-F:]* 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}
# perftest calibrates its clock against the CPU frequency; under TCG that fails now and then
# ("Correlation coefficient r^2: ... < 0.9") and it reports 0 MB/s and 0 usec: run it again.
perftest() { # OUT TOOL ARGS...
    local out=$1 tool=$2 attempt rc spid
    shift 2
    for attempt in 1 2 3 4; do
        pt_port=$((pt_port + 1))
        timeout $((secs * 4 + 90)) "$tool" -d "$dev" -p "$pt_port" -F "${pt_cm[@]}" "$@" >"$work/server.log" 2>&1 &
        spid=$!
        if ((${#pt_cm[@]})); then sleep 1; else wait_listen "$pt_port" "$spid" || true; fi
        rc=0
        timeout $((secs * 4 + 60)) "$tool" -d "$dev" -p "$pt_port" -F "${pt_cm[@]}" "$@" "$addr" >"$out" 2>&1 || rc=$?
        for _ in $(seq 1 100); do
            kill -0 "$spid" 2>/dev/null || break
            sleep 0.1
        done
        kill "$spid" 2>/dev/null || true
        wait "$spid" 2>/dev/null || true
        if ((rc == 0)) && grep -q '#bytes' "$out"; then
            if grep -q 'Correlation coefficient' "$out" && ((attempt < 4)); then
                log "$tool could not calibrate its clock ($(grep -m1 'Correlation coefficient' "$out")); again"
                continue
            fi
            return 0
        fi
        if ((${#pt_cm[@]} == 0)); then
            log "$tool failed (exit status $rc); retrying with -R (rdma_cm):"
            sed 's/^/    /' "$out" >&2
            pt_cm=(-R)
            continue
        fi
        break
    done
    log "$tool $* failed (exit status $rc):"
    sed 's/^/    /' "$out" "$work/server.log" >&2
    PERFTEST_ERR="$tool $(status_text "$rc"); client: $(tail -n 3 "$out" | oneline); server: $(tail -n 3 "$work/server.log" | oneline)"
    return 1
}
emit() { # WORKLOAD TOOL ROUND FILE CMD...
    local w=$1 tool=$2 r=$3 file=$4
    shift 4
    printf '@@begin %s %s %s %s\n' "$w" "$tool" "$r" "$*"
    cat "$file"
    printf '\n@@end %s %s %s\n' "$w" "$tool" "$r"
}
emit_file() { # NAME FILE: a file for the host to write into build/compare/NAME
    printf '@@file %s\n' "$1"
    cat "$2"
    printf '@@endfile %s\n' "$1"
}
# The guest CPU sampled by `sampled` over run $1 of tool $2 in round $3 (file $4).
emit_gcpu() {
    local b a ns ios qs over
    read -r b a ns ios qs over <"$4" || return 0
    printf '@@gcpu %s %s %s %s %s %s %s %s %s\n' "$1" "$2" "$3" "$b" "$a" "$ns" "$ios" "$qs" "$over"
}
# One perftest run of workload $1 in round $2: the tool and its arguments follow.
run_perftest() {
    local w=$1 r=$2 out="$work/pt.out"
    shift 2
    PERFTEST_ERR=""
    measure "$w" perftest "$r" - perftest "$out" "$@" || {
        fail "$w" perftest "$r" "${PERFTEST_ERR:-$1 failed}"
        return 0
    }
    log "  perftest $*: $(grep -A1 '#bytes' "$out" | tail -n 1 | tr -s ' \t' ' ')"
    emit "$w" perftest "$r" "$out" "$@" "${pt_cm[@]}"
}
# rblk-bench against the volume as every measured run uses it: a second of ramp, then SECS;
# its JSON (fio's layout) has one entry for all its jobs.
bench() {
    timeout $((secs * 10 + 120)) "$bin/rblk-bench" "$uri" --device "$dev" --quiet --ramp_time 1 \
        --runtime "$secs" --group_reporting "$@"
}
# The figures of rblk-bench's JSON report $1 (fio's layout), for the log: a line per
# direction and the target's CPU.
bench_lines() {
    python3 "$REPO_ROOT/scripts/lib/compare.py" bench-lines "$1" || true
}
# JSON file $1 on one line into $2 (json+ bins are many lines of guest.log otherwise).
compact() {
    python3 -c 'import json, sys; json.dump(json.load(open(sys.argv[1])), sys.stdout, separators=(",", ":"))' \
        "$1" >"$2"
}
# One rblk-bench run of workload $1 in round $2: rblk-bench's arguments follow. The guest's
# CPU is sampled over it as over the fio runs.
run_rblk() {
    local w=$1 r=$2 json="$work/rblk.json" rc=0
    shift 2
    rm -f "$json"
    measure "$w" rblk "$r" : bench -o json+ --output "$json" "$@" >"$work/rblk.out" 2>&1 || rc=$?
    if ((rc != 0)); then
        fail "$w" rblk "$r" "rblk-bench $* $(status_text "$rc"): $(oneline 400 "$work/rblk.out")"
        return 0
    fi
    [[ -s $json ]] || {
        fail "$w" rblk "$r" "rblk-bench $* wrote no JSON report: $(oneline 400 "$work/rblk.out")"
        return 0
    }
    bench_lines "$json" >&2
    compact "$json" "$work/rblk.min.json" 2>/dev/null || cp "$json" "$work/rblk.min.json"
    log "  rblk-bench $*: done"
    emit_gcpu "$w" rblk "$r" "$work/gcpu"
    emit "$w" rblk "$r" "$work/rblk.min.json" rblk-bench "$@"
}

# rblk-test-client raw-lat (workload $1, round $2, $3 READs per second of SECS): raw-lat's
# arguments (--depth, --threads) follow.
run_raw() {
    local w=$1 r=$2 json="$work/raw.json" count=$((secs * $3)) rc=0
    shift 3
    measure "$w" rblk "$r" - timeout $((secs * 10 + 120)) "$bin/rblk-test-client" raw-lat "$uri" --count "$count" "$@" >"$json" 2>"$work/raw.err" || rc=$?
    if ((rc != 0)); then
        fail "$w" rblk "$r" "rblk-test-client raw-lat $* $(status_text "$rc"): $(oneline 400 "$work/raw.err")"
        return 0
    fi
    log "  rblk-test-client raw-lat $*: $(cat "$json")"
    emit "$w" rblk "$r" "$json" rblk-test-client raw-lat "$uri" --count "$count" "$@"
}
# Two rblk-bench processes at once, each with the arguments given (reports in $work/p1.json and
# p2.json, errors in p1.err and p2.err); fails when either does.
bench_2proc() {
    local pid rc=0
    bench -o json --output "$work/p1.json" "$@" >/dev/null 2>"$work/p1.err" &
    pid=$!
    bench -o json --output "$work/p2.json" "$@" >/dev/null 2>"$work/p2.err" || rc=$?
    wait "$pid" || rc=$?
    return "$rc"
}
# Two rblk-bench processes at once (workload $1, round $2), each with the arguments that
# follow; emits one report (compare.py merge): IOPS and CPU summed, each latency figure the worse
# of the two.
run_rblk_2proc() {
    local w=$1 r=$2 rc=0
    shift 2
    rm -f "$work/p1.json" "$work/p2.json"
    measure "$w" rblk "$r" - bench_2proc "$@" || rc=$?
    if ((rc != 0)) || [[ ! -s $work/p1.json || ! -s $work/p2.json ]]; then
        fail "$w" rblk "$r" "two rblk-bench processes $* failed (status $rc): $(oneline 400 "$work/p1.err" "$work/p2.err")"
        return 0
    fi
    python3 "$REPO_ROOT/scripts/lib/compare.py" merge "$work/p1.json" "$work/p2.json" >"$work/2proc.json" \
        2>"$work/2proc.err" || {
        fail "$w" rblk "$r" "cannot merge the two reports: $(oneline 400 "$work/2proc.err")"
        return 0
    }
    log "  2 x rblk-bench $*: done"
    emit "$w" rblk "$r" "$work/2proc.json" 2 x rblk-bench "$@"
}

# One perftest run and one rblk-bench run of a workload, in the order ORDER says.
pair() { # ROUND WORKLOAD ORDER PERFTEST... -- RBLK...
    local r=$1 w=$2 order=$3
    shift 3
    local -a pt=()
    while [[ $1 != -- ]]; do
        pt+=("$1")
        shift
    done
    shift
    if ((order == 0)); then
        run_perftest "$w" "$r" "${pt[@]}"
        run_rblk "$w" "$r" "$@"
    else
        run_rblk "$w" "$r" "$@"
        run_perftest "$w" "$r" "${pt[@]}"
    fi
}

