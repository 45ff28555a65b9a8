# shellcheck shell=bash
# Per-I/O counts around one workload in the rxe guest (issue 45, item 2). Source it (bash, as
# root, with tracefs), then:
#
#   counts_setup                 once, before the first counted workload and while nothing runs
#   counted LABEL DEV SERVER CMD...
#                                runs CMD (a fio or rblk-bench run) and counts over all of it
#   counts_teardown              once, at the end, while nothing runs
#
# counted counts from CMD's start to its end, start-up and exit included (a window inside the run,
# timed by the clock, missed the run when the host was loaded: the guest then crawls), and
# returns CMD's status. DEV: the block device the workload runs on (- for none: rblk-bench);
# SERVER: the pid of the process serving DEV (- for none: the kernel serves nvme-rdma, and
# rblk-bench is its own server). COUNTS_TARGET_PID: rblk-target's pid, counted as "target"
# (optional). With COUNTS_OFF=1 only /proc and the device are read (the uncounted row the
# tracing's cost is measured against). What it prints on stdout (scripts/lib/counts.py reads it):
#
#   @@counts LABEL counting=0|1 window_ns=N ios=N ctxt=N busy=T all=T clk_tck=HZ
#            server_ticks=T gen_ms=MS target_ticks=T       (-1: not measured)
#   @@counts_tids LABEL ROLE TID,TID,...        the threads of the server and the target
#   @@counts_hist LABEL KIND { common_pid: COMM [TID], ... } hitcount: N     a hist line
#   @@counts_meta KEY VALUE...                  what counts_setup armed, or why not
#
# What each count is measured with (system-wide, over the run; counts.py splits them by thread
# into server, load generator (fio, rblk-bench: by name), target, kernel threads):
#   system calls      tracefs hist trigger on raw_syscalls:sys_enter, keys common_pid.execname
#                     (the thread) and id.syscall (KIND syscalls)
#   context switches  tracefs hist trigger on sched:sched_switch keyed by the thread switched out
#                     (KIND switches), and /proc/stat's ctxt (all CPUs)
#   doorbells         kprobe rdma_rxe's rxe_post_send, hist keyed by thread (KIND post_send): every
#                     send-queue post on rxe. A user QP's post reaches it through rdma-core's rxe
#                     provider's doorbell, a write() of IB_USER_VERBS_CMD_POST_SEND on the uverbs
#                     fd (ib_uverbs_post_send); nvme-rdma and nvmet-rdma call it from the kernel
#   receive posts     kprobe rxe_post_recv (KIND post_recv): the kernel's ULPs only (rdma-core's rxe
#                     provider posts receives into the shared queue without a system call)
#   CQ re-arms        kprobe rxe_req_notify_cq (KIND notify_cq): ibv_req_notify_cq is a write() on
#                     rxe (ibv_cmd_req_notify_cq), ib_req_notify_cq from the kernel
#   CPU               /proc/stat's cpu line (busy and all ticks of all vCPUs); utime + stime of
#                     /proc/PID/stat of the server and of the target; the load generator's (CMD and
#                     its children, reaped) from bash's `times`
#   I/Os              /sys/block/DEV/stat, reads + writes completed over the run; without a device
#                     counts.py takes rblk-bench's IOPS x (its ramp + runtime)
# The probes are armed once (counts_setup) and only paused, cleared and continued per run: arming
# patches kernel text, and under TCG patching code the other vCPU runs has crashed this guest
# (scripts/timeline-rxe.sh). The kprobes sit on verbs entry points, not on rxe's task functions.

COUNTS_TR=/sys/kernel/tracing
# KIND|EVENT DIR|hist spec (the same spec pauses, clears and continues it).
COUNTS_HISTS=(
    "syscalls|raw_syscalls/sys_enter|hist:keys=common_pid.execname,id.syscall:vals=hitcount:sort=hitcount.descending:size=8192"
    "switches|sched/sched_switch|hist:keys=common_pid.execname:vals=hitcount:sort=hitcount.descending:size=2048"
)
COUNTS_KPROBES=(post_send:rxe_post_send post_recv:rxe_post_recv notify_cq:rxe_req_notify_cq)
COUNTS_ARMED=()

_counts_meta() { printf '@@counts_meta %s\n' "$*"; }

# counts_setup: mounts tracefs if need be, adds the kprobes (group rblkcounts) and arms every hist
# trigger paused. What is missing is reported (@@counts_meta unavailable KIND WHY) and not
# counted; returns 0 either way.
counts_setup() {
    local tr=$COUNTS_TR h kind ev spec k
    COUNTS_ARMED=()
    if [[ ! -e $tr/trace ]]; then
        mount -t tracefs nodev "$tr" 2>/dev/null || {
            _counts_meta unavailable all "cannot mount tracefs on $tr"
            return 0
        }
    fi
    local -a hists=("${COUNTS_HISTS[@]}")
    for k in "${COUNTS_KPROBES[@]}"; do
        if grep -q "^${k#*:}\b" "$tr/available_filter_functions" 2>/dev/null &&
            echo "p:rblkcounts/${k%%:*} ${k#*:}" >>"$tr/kprobe_events" 2>/dev/null; then
            hists+=("${k%%:*}|rblkcounts/${k%%:*}|hist:keys=common_pid.execname:vals=hitcount:size=2048")
        else
            _counts_meta unavailable "${k%%:*}" "no kprobe on ${k#*:} (rdma_rxe not loaded, or the function is gone)"
        fi
    done
    for h in "${hists[@]}"; do
        IFS='|' read -r kind ev spec <<<"$h"
        if echo "$spec:pause" >>"$tr/events/$ev/trigger" 2>/dev/null; then
            COUNTS_ARMED+=("$kind|$ev|$spec")
            _counts_meta armed "$kind" "$ev" "$spec"
        else
            _counts_meta unavailable "$kind" "the hist trigger on $ev was refused"
        fi
    done
}

# counts_teardown: removes the triggers and the kprobes (before anything else clears kprobe_events:
# a kprobe with a trigger is busy).
counts_teardown() {
    local h kind ev spec
    for h in "${COUNTS_ARMED[@]}"; do
        IFS='|' read -r kind ev spec <<<"$h"
        echo "!$spec" >>"$COUNTS_TR/events/$ev/trigger" 2>/dev/null || true
    done
    COUNTS_ARMED=()
    for kind in "${COUNTS_KPROBES[@]}"; do
        echo "-:rblkcounts/${kind%%:*}" >>"$COUNTS_TR/kprobe_events" 2>/dev/null || true
    done
    rm -f "$COUNTS_TIMES"
}

# _counts_cmd WORD: WORD (pause, clear, cont) to every armed trigger.
_counts_cmd() {
    local h kind ev spec
    for h in "${COUNTS_ARMED[@]}"; do
        IFS='|' read -r kind ev spec <<<"$h"
        echo "$spec:$1" >>"$COUNTS_TR/events/$ev/trigger" 2>/dev/null || true
    done
}

# _counts_ticks NAME PID...: utime + stime of each process PID (all its threads) into the
# associative array NAME, by pid; a process that is gone is left out.
_counts_ticks() {
    local -n _ct_out=$1
    local p line
    local -a f
    shift
    _ct_out=()
    for p in "$@"; do
        read -r line 2>/dev/null <"/proc/$p/stat" || continue
        read -r -a f <<<"${line##*) }" # the fields after comm, which may hold spaces
        # shellcheck disable=SC2004 # associative array: the key needs its $
        _ct_out[$p]=$((f[11] + f[12]))
    done
}

# _counts_delta NAME0 NAME1: the ticks between two _counts_ticks readings, over the processes in
# both; -1 when none is.
_counts_delta() {
    local -n _cd_a=$1 _cd_b=$2
    local p sum=0 n=0
    for p in "${!_cd_a[@]}"; do
        [[ -n ${_cd_b[$p]:-} ]] || continue
        # shellcheck disable=SC2004 # associative arrays: the key needs its $
        sum=$((sum + _cd_b[$p] - _cd_a[$p])) n=$((n + 1))
    done
    ((n)) && echo "$sum" || echo -1
}

# _counts_tids PID...: the thread ids of processes PID..., comma-separated.
_counts_tids() {
    local p t list=""
    for p in "$@"; do
        for t in /proc/"$p"/task/*; do
            [[ -e $t ]] && list+="${list:+,}${t##*/}"
        done
    done
    echo "${list:--}"
}

# _counts_now DEV: sets C_T (us), C_CTXT, C_BUSY, C_ALL (/proc/stat) and C_IOS (reads + writes
# completed on DEV; -1 without one).
_counts_now() {
    local _ us ni sy id io hi si st line
    local -a f
    C_T=${EPOCHREALTIME/./}
    read -r _ us ni sy id io hi si st _ </proc/stat
    C_BUSY=$((us + ni + sy + hi + si + st)) C_ALL=$((us + ni + sy + hi + si + st + id + io))
    while read -r line; do
        [[ $line == ctxt\ * ]] && C_CTXT=${line#ctxt }
    done </proc/stat
    C_IOS=-1
    if [[ $1 != - ]] && read -r -a f 2>/dev/null <"/sys/class/block/${1#/dev/}/stat"; then
        C_IOS=$((f[0] + f[4]))
    fi
}

# _counts_children_ms: sets C_CHILD_MS to the CPU time (user + system, ms) of this shell's reaped
# children so far (bash's `times`, second line: 0m1.234s 0m0.567s). Not in $(...): a subshell's
# children's times start at 0; the output goes through a file.
_counts_children_ms() {
    local _ u s
    times >"$COUNTS_TIMES"
    { read -r _ && read -r u s; } <"$COUNTS_TIMES"
    C_CHILD_MS=$(($(_counts_ms "$u") + $(_counts_ms "$s")))
}

# _counts_ms 1m2.345s: that many milliseconds.
_counts_ms() {
    local m=${1%%m*} sec=${1#*m}
    sec=${sec%s}
    echo $((10#$m * 60000 + 10#${sec%.*} * 1000 + 10#${sec#*.}))
}

COUNTS_CLK_TCK=$(getconf CLK_TCK)
COUNTS_TIMES=${TMPDIR:-/tmp}/rblk-counts-times.$$

# counted LABEL DEV SERVER CMD...: see the top of this file.
counted() {
    local label=$1 dev=$2 server=$3 rc=0 counting=1 tpid=${COUNTS_TARGET_PID:-}
    shift 3
    [[ ${COUNTS_OFF:-0} == 1 || ${#COUNTS_ARMED[@]} == 0 ]] && counting=0
    local -a srv=() tgt=()
    [[ $server =~ ^[0-9]+$ ]] && srv=("$server")
    [[ -n $tpid ]] && tgt=("$tpid")
    local t0 x0 b0 a0 i0 c0 c1
    # shellcheck disable=SC2034 # filled and read through namerefs
    local -A s0 p0 s1 p1
    _counts_children_ms
    c0=$C_CHILD_MS
    _counts_ticks s0 "${srv[@]}"
    _counts_ticks p0 "${tgt[@]}"
    ((counting)) && _counts_cmd clear && _counts_cmd cont
    _counts_now "$dev"
    t0=$C_T x0=$C_CTXT b0=$C_BUSY a0=$C_ALL i0=$C_IOS
    "$@" || rc=$?
    _counts_now "$dev"
    ((counting)) && _counts_cmd pause
    _counts_ticks s1 "${srv[@]}"
    _counts_ticks p1 "${tgt[@]}"
    _counts_children_ms
    c1=$C_CHILD_MS
    local ios=-1
    ((i0 >= 0 && C_IOS >= 0)) && ios=$((C_IOS - i0))
    printf '@@counts %s counting=%s window_ns=%s ios=%s ctxt=%s busy=%s all=%s clk_tck=%s server_ticks=%s gen_ms=%s target_ticks=%s\n' \
        "$label" "$counting" $(((C_T - t0) * 1000)) "$ios" $((C_CTXT - x0)) $((C_BUSY - b0)) $((C_ALL - a0)) \
        "$COUNTS_CLK_TCK" "$(_counts_delta s0 s1)" $((c1 - c0)) "$(_counts_delta p0 p1)"
    printf '@@counts_tids %s server %s\n' "$label" "$(_counts_tids "${srv[@]}")"
    printf '@@counts_tids %s target %s\n' "$label" "$(_counts_tids "${tgt[@]}")"
    if ((counting)); then
        local h kind ev spec
        for h in "${COUNTS_ARMED[@]}"; do
            IFS='|' read -r kind ev spec <<<"$h"
            grep '^{' "$COUNTS_TR/events/$ev/hist" | sed "s/^/@@counts_hist $label $kind /" || true
        done
    fi
    return "$rc"
}
