#!/usr/bin/env bash
# What idle peers cost rblk-target (issue 40, "many hosts per target"), measured in ONE rxe
# guest boot:
#
#   scripts/hosts-rxe.sh
#   scripts/hosts-rxe.sh --redraw [LOG OUT_DIR]   # no guest: summarize LOG again (default
#                                                 # build/hosts/guest.log into build/hosts)
#
# Builds the release binaries (RBLK_BIN_DIR=DIR takes rblk-target, rblk-bench and
# rblk-test-client from DIR instead), boots the guest (RXE_GUEST_MEM default 8G here) under
# `flock /tmp/rblk-guest.lock` (scripts/lib/script.sh's run_guest) and there:
#
#   1. cmtime (rdmacm-utils) with HOSTS_CMTIME connections (default 100) on the same rxe device:
#      rdma_cm's own per-connection cost, the floor rblk's admission is compared with;
#   2. starts rblk-target with a 64M RAM volume, memory windows on and its caps raised
#      (--max-sessions, --max-sessions-per-host, --max-joins, --max-joins-per-host 8192), after
#      raising the fd limit (the defaults are recorded: they would cap it first);
#   3. phase 1qp: `rblk-test-client hold` opens read-only sessions of one QP and keeps them alive
#      with the protocol's keepalives, growing to each of HOSTS_STEPS_1QP (default
#      1,10,100,500,1000 sessions); phase 2qp the same with a second QP per session (one JOIN),
#      HOSTS_STEPS_2QP (default 10,250,1000,2048 sessions: up to 4,096 QPs); phase 2qp-perqp, only
#      with HOSTS_STEPS_PERQP (default -: none), the same again with every QP keeping keepalives
#      of its own (`hold --per-qp-keepalives`, as before session keepalives, feature 512): what
#      sharing a session's keepalives saves, in the same boot; phase 2qp-unsol, only with
#      HOSTS_STEPS_UNSOL (default -: none), 2qp's sessions from initiators that do not mark their
#      requests as solicited events (`hold --unsolicited`, as before feature 1024: the target
#      wakes for every keepalive): what solicited events save. At each step:
#        - the target's threads (/proc/PID/task), fds (/proc/PID/fd), RSS and VmPin
#          (/proc/PID/status);
#        - its CPU (utime + stime of /proc/PID/stat) over HOSTS_IDLE_SECS (default 10) of idle,
#          and the holding client's;
#        - open time: `rblk-test-client open-time --count HOSTS_OPENS` (default 100): connect
#          and OPEN (read-only) one session at a time beside the held ones, median and p99;
#        - rblk-bench randread 4k QD1 for HOSTS_BENCH_SECS (default 5, after a 1 s ramp): IOPS,
#          p50, p99.
#      A session that cannot be opened stops the phase's growth where it is (the reason is
#      recorded: a cap of the target, rxe, memory, fds) and the step is measured as held;
#   4. the storms (issue 40's item 6): with the 2qp phase's last step still held, a successor
#      takes over (`rblk-target --takeover`, the same arguments), and then the daemon restarts
#      (SIGTERM, and a new one with the same arguments: the volume is durable, so its identity
#      outlives the restart and the sessions resume): each time every QP loses its connection
#      at once and every session reconnects; how long until all are back (the initiators'
#      reconnect delay included), the new daemon's most threads meanwhile, sessions that gave up;
#   5. cmtime with HOSTS_CMTIME_STORM connections (default 2000): the storm goal's reference.
#
# Prints the table and writes build/hosts/table.txt and summary.json (scripts/lib/hosts.py:
# ratios against the first 1qp row, the open-time ratios against each phase's 10-session row, per
# QP costs, issue 40's goals beside the figures). Raw output: build/hosts/guest.log. Steps left
# when HOSTS_BUDGET seconds (default 2400) of the guest run have passed are skipped and say so.
# TCG: compare rows of one boot only. It fails only when a tool fails, never on the figures.
set -euo pipefail
shopt -s inherit_errexit

REPO_ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
CALLER_PWD=$PWD
cd "$REPO_ROOT"

OUT=build/hosts
PORT=7422
CMTIME_PORT=7471
BINS=(rblk-target rblk-bench rblk-test-client)

SCRIPT_NAME=hosts
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh"

# ---------------------------------------------------------------------------------------------------
# In the guest. Raw results on stdout (scripts/lib/hosts.py reads them):
#   @@meta KEY VALUE...
#   @@step phase=P sessions=N qps=Q threads=T fds=F rss_kb=R vmpin_kb=V cpu_ticks=C
#          client_cpu_ticks=C window_s=W clk_tck=HZ reconnects=R failed=F (the hold client's
#          sessions' reconnects so far and those that gave up: a row with either is not idle)
#   @@open P N open_ms p50 ... (rblk-test-client open-time's line)
#   @@bench P N JSON           (rblk-bench -o json, on one line)
#   @@stop P N MESSAGE         (why the phase could not grow further)
#   @@skip P N MESSAGE, @@fail WHAT MESSAGE
#   @@storm kind=K phase=P sessions=N qps=Q seconds=S most_threads=T back=B failed=F rejoined=J
#          (K takeover or restart: B sessions reconnected and J JOINed queues rejoined within S
#          seconds, F gave up)
#   @@cmtime N ... @@endcmtime (cmtime's output)
# Progress goes to stderr.

guest_main() {
    local bin=$1 steps1=$2 steps2=$3 opens=$4 idle=$5 bench=$6 cm=$7 storm=$8 budget=$9 steps3=${10} steps4=${11}
    local addr=${RBLK_ADDR:?RBLK_ADDR: the address of the rxe device} dev=${RBLK_DEVICE:-rxe0}
    local work deadline=$((SECONDS + budget))
    work=$(mktemp -d /tmp/rblk-hosts.XXXXXX)
    # shellcheck source=lib/target.sh
    source "$REPO_ROOT/scripts/lib/target.sh"

    printf '@@meta guest_kernel %s\n@@meta guest_cpus %s\n' "$(uname -r)" "$(nproc)"
    printf '@@meta guest_mem_kb %s\n' "$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo)"
    printf '@@meta threads_max %s\n@@meta pid_max %s\n' "$(cat /proc/sys/kernel/threads-max)" \
        "$(cat /proc/sys/kernel/pid_max)"
    printf '@@meta nofile_default %s/%s\n' "$(ulimit -Sn)" "$(ulimit -Hn)"
    printf '@@meta memlock %s\n' "$(ulimit -l)"
    printf '@@meta rblk_target %s\n' "$("$bin/rblk-target" --version 2>&1 | head -n 1)"
    ibv_devinfo -v -d "$dev" 2>/dev/null | awk '
        $1 ~ /^(max_qp|max_qp_wr|max_cq|max_cqe|max_mr|max_pd|max_mw|max_srq):$/ {
            sub(":", "", $1); print "@@meta rxe_" $1, $2 }' || true
    # rdma_cm needs an fd or more per connection, on both sides: the default limit would cap the
    # run at a few hundred QPs (recorded above; the unit's LimitNOFILE is issue 40's item 7).
    ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)"
    printf '@@meta nofile %s\n' "$(ulimit -n)"

    cmtime_run "$addr" "$cm"
    # The storms' daemons (--takeover, and the restart) start with the same arguments. Durable,
    # with a state dir: a clean stop keeps the volume's identity, so sessions resume after the
    # restart (a RAM volume's would be a new volume to them).
    TARGET_ARGS=(--listen "$addr:$PORT" --memory-windows on --volume "v:64M:$work/v.img"
        --state-dir "$work/state" --admin-socket "$work/admin.sock"
        --max-sessions 8192 --max-sessions-per-host 8192 --max-joins 8192 --max-joins-per-host 8192)
    start_target "$work/target.log" "$bin" 60 "${TARGET_ARGS[@]}" || die "rblk-target did not start"
    local tpid=$TARGET_PID
    # TARGET_PID is the successor's after the storm: the trap reads it when it runs.
    trap 'kill -TERM "$TARGET_PID" 2>/dev/null || true' EXIT
    TARGET_BASE_THREADS=$(count_dir "/proc/$tpid/task")
    printf '@@meta target_threads_at_start %s\n' "$TARGET_BASE_THREADS"
    printf '@@meta target_fds_at_start %s\n' "$(count_dir "/proc/$tpid/fd")"

    local phase
    for phase in 1qp 2qp 2qp-perqp 2qp-unsol; do
        local steps=$steps1
        [[ $phase == 2qp ]] && steps=$steps2
        [[ $phase == 2qp-perqp ]] && steps=$steps3
        [[ $phase == 2qp-unsol ]] && steps=$steps4
        [[ $steps == - ]] && continue
        # TARGET_PID, not the first daemon's: after phase 2qp's storms a successor serves.
        hold_phase "$bin" "$work" "$addr" "$TARGET_PID" "$phase" "${phase%%qp*}" "$steps" "$opens" "$idle" \
            "$bench" "$deadline"
    done
    if ((SECONDS < deadline)); then
        cmtime_run "$addr" "$storm"
    else
        printf '@@skip cmtime %s the budget of %s s has passed\n' "$storm" "$budget"
    fi
    grep -i 'warn' "$work/target.log" | head -n 5 | sed 's/^/@@meta target_warning /' || true
    kill -TERM "$TARGET_PID" 2>/dev/null || true
    wait_gone "$TARGET_PID" || true
    trap - EXIT
}

# 0 for a directory that is gone (the process exited): not a failure under pipefail.
count_dir() { { find "$1" -mindepth 1 -maxdepth 1 2>/dev/null || true; } | wc -l; }

status_kb() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }

# cmtime_run ADDR N: cmtime's server and a client making N connections to it on ADDR.
cmtime_run() {
    local addr=$1 n=$2
    command -v cmtime >/dev/null || {
        printf '@@fail cmtime not installed (rdmacm-utils; scripts/deps.sh installs it)\n'
        return 0
    }
    log "cmtime: $n connections"
    timeout 600 cmtime -b "$addr" -p "$CMTIME_PORT" >/dev/null 2>&1 &
    local spid=$! out
    sleep 1
    printf '@@cmtime %s\n' "$n"
    if out=$(timeout 300 cmtime -s "$addr" -p "$CMTIME_PORT" -c "$n" 2>&1); then
        printf '%s\n' "$out"
    else
        printf '@@endcmtime\n@@fail cmtime -c %s: %s\n' "$n" "$(oneline 300 <<<"$out")"
        kill "$spid" 2>/dev/null || true
        wait "$spid" 2>/dev/null || true
        return 0
    fi
    printf '@@endcmtime\n'
    kill "$spid" 2>/dev/null || true
    wait "$spid" 2>/dev/null || true
}

# hold_phase BIN WORK ADDR TPID PHASE QPS STEPS OPENS IDLE BENCH DEADLINE: one hold client
# growing through STEPS (comma-separated session counts), each step measured.
hold_phase() {
    local bin=$1 work=$2 addr=$3 tpid=$4 phase=$5 qps=$6 steps=$7 opens=$8 idle=$9 bench=${10}
    local deadline=${11} uri="rblk://$addr:$PORT/v" fifo=$work/hold.$phase out=$work/hold.$phase.out
    local -a counts
    IFS=, read -r -a counts <<<"$steps"
    mkfifo "$fifo"
    # A tick thread per session, as independent hosts: in a storm every session reconnects at
    # once. (With 32 threads each reconnected its sessions one after another, and while that
    # took longer than the target's 15 s keepalive timeout the sessions it had already
    # reconnected went silent and were ended: the client prolonged its own storm.)
    # Phase 2qp-perqp: every QP keeps keepalives of its own, as before session keepalives.
    # Phase 2qp-unsol: requests not marked as solicited events, as before them.
    local -a extra=()
    [[ $phase == *-perqp ]] && extra=(--per-qp-keepalives)
    [[ $phase == *-unsol ]] && extra=(--unsolicited)
    "$bin/rblk-test-client" hold "$uri" --sessions 1 --qps "$qps" --threads each "${extra[@]}" <"$fifo" >"$out" \
        2>"$out.err" &
    local hpid=$! n held=0 stopped=0
    exec 9>"$fifo" # the client's stdin, open until the phase ends
    if wait_lines "$out" '^held' 1 600 "$hpid"; then
        held=1
    else
        printf '@@fail %s the hold client did not open its first session: %s\n' "$phase" \
            "$(oneline 300 "$out.err")"
        counts=()
    fi
    for n in "${counts[@]}"; do
        if ((SECONDS >= deadline)); then
            printf '@@skip %s %s the budget has passed\n' "$phase" "$n"
            continue
        fi
        if ((n > held)); then
            log "$phase: growing from $held to $n sessions"
            local lines
            lines=$(grep -c '^held' "$out" || true)
            printf 'grow %s\n' "$n" >&9
            if ! wait_lines "$out" '^held' $((lines + 1)) $(((n - held) * 30 + 600)) "$hpid"; then
                printf '@@fail %s the hold client stopped growing at %s sessions: %s\n' "$phase" "$held" \
                    "$(oneline 300 "$out.err")"
                break
            fi
            read -r _ held _ _ < <(grep '^held' "$out" | tail -n 1)
            if grep -q '^stopped' "$out"; then
                stopped=1
                printf '@@stop %s %s %s\n' "$phase" "$held" "$(grep '^stopped' "$out" | head -n 1 | cut -c10-300)"
            fi
        fi
        measure_step "$bin" "$work" "$uri" "$tpid" "$hpid" "$phase" "$held" "$qps" "$opens" "$idle" "$bench"
        ((stopped)) && break
    done
    if [[ $phase == 2qp ]] && ((held > 0 && SECONDS < deadline)); then
        storm_step "$bin" "$work" "$phase" "$held" "$qps" takeover
        ((SECONDS < deadline)) && storm_step "$bin" "$work" "$phase" "$held" "$qps" restart
        tpid=$TARGET_PID
    fi
    exec 9>&- # its stdin closes: it drops its sessions and exits
    if ! wait_gone "$hpid"; then
        printf '@@fail %s-exit the hold client did not exit within 60 s of its stdin closing (killed)\n' "$phase"
        kill -KILL "$hpid" 2>/dev/null || true
    fi
    wait "$hpid" 2>/dev/null || true
    rm -f "$fifo"
    # The target tears the phase's connections down: wait (up to 2 min) for its threads. The
    # daemon serving now: after the storms, the successor.
    local _
    for _ in $(seq 1 1200); do
        (($(count_dir "/proc/$TARGET_PID/task") <= TARGET_BASE_THREADS)) && break
        sleep 0.1
    done
    printf '@@meta %s_threads_after %s\n' "$phase" "$(count_dir "/proc/$TARGET_PID/task")"
}

# hold_status WORK PHASE: asks the phase's hold client (on fd 9) for its status; prints its
# sessions' reconnects so far, those that gave up and its queues that rejoined a reconnected
# session ("-1 -1 -1" when it does not answer in 30 s).
hold_status() {
    local out=$1/hold.$2.out reconnects=-1 failed=-1 rejoins=-1 lines _
    lines=$(grep -c '^status' "$out" || true)
    # In a subshell: a client that exited would make the write's SIGPIPE end this script.
    (printf 'status\n' >&9) 2>/dev/null || true
    wait_lines "$out" '^status' $((lines + 1)) 30 || true
    read -r _ _ _ _ reconnects _ failed _ rejoins _ < <(grep '^status' "$out" | tail -n 1) || true
    printf '%s %s %s\n' "${reconnects:--1}" "${failed:--1}" "${rejoins:--1}"
}

# storm_step BIN WORK PHASE SESSIONS QPS KIND: while the hold client holds SESSIONS sessions,
# KIND takeover hands the target over to a successor (rblk-target --takeover, the same
# arguments); KIND restart stops it (SIGTERM, waiting until it is gone) and starts a new one
# with the same arguments. Either way every QP loses its connection at once and every session
# reconnects (after the initiator's reconnect delay). Records how long from the takeover's start
# (the stop's) until the reconnect count grew by SESSIONS and every JOINed queue rejoined (a
# new QP: QPS x SESSIONS connections back in all), the new daemon's most threads meanwhile,
# and sessions that gave up; sets TARGET_PID.
storm_step() {
    local bin=$1 work=$2 phase=$3 n=$4 qps=$5 kind=$6 r0 f0 j0 r f j t0 most=0 threads _ log
    local -a extra=()
    read -r r0 f0 j0 < <(hold_status "$work" "$phase")
    log "$phase: storm: a $kind with $n sessions x $qps QPs held"
    log=$work/$kind.log
    t0=$EPOCHREALTIME
    if [[ $kind == takeover ]]; then
        extra=(--takeover)
    else
        kill -TERM "$TARGET_PID" 2>/dev/null || true
        wait_gone "$TARGET_PID" || printf '@@fail storm-%s the daemon did not stop within 60 s\n' "$kind"
    fi
    # 9>&-: the new daemon must not inherit the hold client's stdin (fd 9, the FIFO's writer): it
    # would keep the FIFO open after the phase closes it, and the client would never see EOF.
    if ! start_target "$log" "$bin" 120 "${TARGET_ARGS[@]}" "${extra[@]}" 9>&-; then
        printf '@@fail storm-%s the new daemon did not start: %s\n' "$kind" \
            "$(tail -n 3 "$log" | oneline 300)"
        return 0
    fi
    r=$r0 f=$f0 j=$j0
    for _ in $(seq 1 600); do
        if ! kill -0 "$TARGET_PID" 2>/dev/null; then
            printf '@@fail storm-%s the new daemon exited: %s\n' "$kind" \
                "$(tail -n 3 "$log" | oneline 300)"
            break
        fi
        threads=$(count_dir "/proc/$TARGET_PID/task")
        ((threads > most)) && most=$threads
        read -r r f j < <(hold_status "$work" "$phase")
        ((r - r0 >= n && j - j0 >= n * (qps - 1) || f > f0)) && break
        sleep 0.5
    done
    printf '@@storm kind=%s phase=%s sessions=%s qps=%s seconds=%s most_threads=%s back=%s failed=%s rejoined=%s\n' \
        "$kind" "$phase" "$n" $((n * qps)) "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')" \
        "$most" $((r - r0)) $((f - f0)) $((j - j0))
}

# measure_step BIN WORK URI TPID HPID PHASE SESSIONS QPS OPENS IDLE BENCH
measure_step() {
    local bin=$1 work=$2 uri=$3 tpid=$4 hpid=$5 phase=$6 n=$7 qps=$8 opens=$9 idle=${10} bench=${11}
    log "$phase: $n sessions held: idle ${idle}s, $opens opens, rblk-bench"
    local t0 c0 h0 t1 c1 h1
    # A client that exited meanwhile reads as 0 (its failure is the next step's).
    t0=$EPOCHREALTIME c0=$(proc_ticks "$tpid") h0=$(proc_ticks "$hpid" || echo 0)
    sleep "$idle"
    t1=$EPOCHREALTIME c1=$(proc_ticks "$tpid") h1=$(proc_ticks "$hpid" || echo 0)
    # Were the held sessions up all along? (A lost one reconnects: not idle.)
    local reconnects failed
    read -r reconnects failed _ < <(hold_status "$work" "$phase")
    printf '@@step phase=%s sessions=%s qps=%s threads=%s fds=%s rss_kb=%s vmpin_kb=%s cpu_ticks=%s client_cpu_ticks=%s window_s=%s clk_tck=%s reconnects=%s failed=%s\n' \
        "$phase" "$n" $((n * qps)) "$(count_dir "/proc/$tpid/task")" "$(count_dir "/proc/$tpid/fd")" \
        "$(status_kb "$tpid" VmRSS)" "$(status_kb "$tpid" VmPin)" $((c1 - c0)) $((h1 - h0)) \
        "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')" "$(getconf CLK_TCK)" \
        "${reconnects:--1}" "${failed:--1}"
    local line
    if line=$(timeout 900 "$bin/rblk-test-client" open-time "$uri" --count "$opens" 2>"$work/open.err"); then
        printf '@@open %s %s %s\n' "$phase" "$n" "$line"
    else
        printf '@@fail open-%s-%s %s\n' "$phase" "$n" "$(oneline 300 "$work/open.err")"
    fi
    if timeout 120 "$bin/rblk-bench" "$uri" --rw randread --bs 4k --iodepth 1 --runtime "${bench}s" \
        --ramp_time 1s -o json --output "$work/bench.json" >/dev/null 2>"$work/bench.err"; then
        printf '@@bench %s %s %s\n' "$phase" "$n" "$(tr -d '\n' <"$work/bench.json")"
    else
        printf '@@fail bench-%s-%s %s\n' "$phase" "$n" "$(oneline 300 "$work/bench.err")"
    fi
}

# ---------------------------------------------------------------------------------------------------
# On the host.

summarize() { # LOG SUMMARY_JSON TABLE_TXT
    lib_python "$REPO_ROOT/scripts/lib/hosts.py" "$@"
}

host_main() {
    local redraw=0
    local -a redraw_from=()
    while (($#)); do
        case $1 in
        --redraw)
            redraw=1
            if (($# >= 3)); then
                redraw_from=("$2" "$3")
                shift 2
            fi
            ;;
        *) help_or_usage_error "$1" ;;
        esac
        shift
    done
    if ((redraw)); then
        redraw_run "${redraw_from[@]}"
        return
    fi
    local steps1=${HOSTS_STEPS_1QP:-1,10,100,500,1000} steps2=${HOSTS_STEPS_2QP:-10,250,1000,2048}
    local steps3=${HOSTS_STEPS_PERQP:--} steps4=${HOSTS_STEPS_UNSOL:--}
    local opens=${HOSTS_OPENS:-100} idle=${HOSTS_IDLE_SECS:-10} bench=${HOSTS_BENCH_SECS:-5}
    local cm=${HOSTS_CMTIME:-100} storm=${HOSTS_CMTIME_STORM:-2000} budget=${HOSTS_BUDGET:-2400}
    local v
    for v in "$steps1" "$steps2" "$steps3" "$steps4"; do
        [[ $v == - || $v =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] ||
            die "steps must be session counts like 1,10,100, or - for none (got '$v')"
    done
    for v in "$opens" "$idle" "$bench" "$cm" "$storm" "$budget"; do
        is_count "$v" || die "HOSTS_OPENS, HOSTS_IDLE_SECS, HOSTS_BENCH_SECS, HOSTS_CMTIME, HOSTS_CMTIME_STORM and HOSTS_BUDGET must be positive numbers (got '$v')"
    done
    scripts/deps.sh
    release_bins "${BINS[@]}"
    mkdir -p "$OUT"
    snapshot_bins "$OUT/bin" "${BINS[@]}"
    local glog=$OUT/guest.log
    : >"$glog"
    printf '@@meta date %s\n@@meta host_cpus %s\n' "$(date -u +%Y-%m-%dT%H:%MZ)" "$(nproc)" >>"$glog"
    RXE_GUEST_MEM=${RXE_GUEST_MEM:-8G} run_guest "$glog" $((budget + 900)) "$REPO_ROOT/scripts/hosts-rxe.sh" \
        "$BIN_DIR" "$steps1" "$steps2" "$opens" "$idle" "$bench" "$cm" "$storm" "$budget" "$steps3" "$steps4"
    summarize_run "$glog" "$OUT"
    finish_run "$glog"
}

script_main 11 "BIN_DIR STEPS_1QP STEPS_2QP OPENS IDLE_SECS BENCH_SECS CMTIME CMTIME_STORM BUDGET_SECS STEPS_PERQP STEPS_UNSOL" "$@"
