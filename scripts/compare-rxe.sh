#!/usr/bin/env bash
# rblk against raw verbs and against Linux's NVMe-oF/RDMA, side by side, on the same rxe device in
# ONE guest boot:
#
#   scripts/compare-rxe.sh [--quick]
#
# Builds the release binaries on the host (rblk-target, rblk-bench, rblk, ...), boots the rxe guest
# (scripts/rxe-guest.sh) once, and there, COMPARE_ROUNDS times:
#
# 1. perftest in loopback on rxe0 (server and client on the same device) and the matching
#    rblk-bench runs against rblk-target, pair by pair, interleaved:
#
#   workload               perftest                                         rblk-bench
#   randread 4k QD32       ib_read_bw  -s 4096  -t 32 -o 32 -Q 1            --rw randread  --bs 4k  --iodepth 32
#   randwrite 4k QD32      ib_write_bw -s 4096  -t 32 -Q 1                  --rw randwrite --bs 4k  --iodepth 32
#   read 64k QD32          ib_read_bw  -s 65536 -t 32 -o 32 -Q 1            --rw read      --bs 64k --iodepth 32
#   write 64k QD32         ib_write_bw -s 65536 -t 32 -Q 1                  --rw write     --bs 64k --iodepth 32
#   randread 4k QD1 p50    ib_read_lat -s 4096 (t_typical)                  --rw randread  --iodepth 1 [--spin 1ms]
#   randwrite 4k QD1 p50   2 x ib_write_lat -s 4096 (t_typical)             --rw randwrite --iodepth 1 [--spin 1ms]
#   randread 4k QD1 p50    (the same ib_read_lat)                           rblk-test-client raw-lat: one READ at a
#                          time posted and busy-polled on a queue's endpoint (the fabric layer alone: what
#                          rblk's queue, engine and bench add on top shows as the difference), no goal
#   randread 4k p99, 2 jobs (no perftest: against rblk-bench's own 1 job at the same total depth)
#                          rblk-bench --rw randread --bs 4k --iodepth 32 (its QD32 run above)
#                          vs --rw randread --bs 4k --jobs 2 --iodepth 16 [--poll]; goal: p99 <= 2x
#                          and, without a goal, what isolates the tail: two rblk-bench processes with
#                          one job x QD16 each at once (the larger p99 of the two: sharing inside one
#                          process is not the cause if this is as bad), and the raw fabric with
#                          rblk-test-client raw-lat --depth 16 --threads 2 against --depth 32 (busy-
#                          polled verbs with no rblk queue or wait policy: the floor rxe and the
#                          vCPUs set)
#
# 2. Block devices: the same fio jobs on every block device, one path after the other (the paths'
#    order rotates by one every round); each device is made, runs randwrite QD32 (first, so that
#    the reads read written blocks), randread QD32 and randread QD1 (ublk-q2: the QD32 jobs only),
#    and is removed again. Every row runs the SAME fio command line; only --filename differs:
#
#      fio --name=WORKLOAD --filename=DEV --ioengine=libaio --direct=1 --bs=4k --rw=randwrite|randread
#          --iodepth=32|1 --numjobs=1 --size=256M --time_based --ramp_time=1 --runtime=SECS
#          --output-format=json
#
#   path          device        what runs
#   nvmeof        /dev/nvmeXnY  Linux NVMe-oF/RDMA, for scale: null_blk (nr_devices=1
#                               memory_backed=1 gb=1, RAM) exported by nvmet + nvmet-rdma through
#                               configfs (scripts/lib/target.sh; subsystem
#                               nqn.2024-12.io.rblk:compare, port rdma RBLK_ADDR:4420), once per
#                               boot; per round `nvme connect -t rdma ... -i 1` (one I/O queue) and
#                               `nvme disconnect -n NQN`
#   nbd           /dev/nbd0     `rblk nbd URI --listen unix:SOCK` + `nbd-client -unix SOCK /dev/nbd0
#                               -block-size 4096` (one connection); `nbd-client -d`, SIGTERM
#   fuse          /dev/loopN    `rblk mount URI DIR --queues 1 --loop --daemon` (FUSE file + loop
#                               device with direct I/O); `rblk umount`
#   ublk          /dev/ublkbN   `rblk attach URI --queues 1 --depth 32 --daemon` (ublk_drv; the
#                               default wait policy, adaptive); `rblk detach /dev/ublkbN`
#   ublk-sleep    /dev/ublkbN   the same with --wait sleep (the queue thread's old behaviour: it
#                               sleeps at once), for comparison in the same boot
#   ublk-q2       /dev/ublkbN   the same as ublk with --queues 2 (QD32 jobs only)
#   ublk-null     /dev/ublkbN   `RBLK_ALLOW_NULL=1 rblk attach URI --queues 1 --depth 32 --null-io
#                               --daemon`: the same queue loop and wait policy with the RDMA step
#                               removed (reads return zeros, writes are dropped): the ceiling of
#                               `rblk attach` in this guest
#   libublk-null  /dev/ublkbN   libublk 0.4.8's own examples/null (`null add -n ID -q 1 -d 32
#                               --foreground`; `null del -n ID`), built on the host from the crate's
#                               source in ~/.cargo/registry, offline, into build/libublk-null/ (the
#                               crate's dev-dependencies the example does not use are dropped;
#                               env_logger and daemonize, missing from the offline registry, get
#                               stand-ins; the example's source is built unchanged)
#   The rblk paths use the same rblk-target volume as rblk-bench, 256M. A path that cannot run in
#   this boot (no ublk_drv, no nvme-cli, an rblk without --wait, libublk's example not built) is
#   "unavailable", with the reason, in the table and in summary.json ("unavailable": {path: why}).
#
# 3. The QD1 per-stage timeline, after the rounds, in the same boot: scripts/timeline-rxe.sh's
#    guest part (`--in-guest 8 1 BIN_DIR`: ublk, NVMe-oF/RDMA and rblk-bench, one QD1 read at a
#    time, traced; with its own rblk-target and NVMe-oF export, after this script's are gone). The
#    host summarizes its output with `scripts/timeline-rxe.sh --redraw` into build/compare/timeline/
#    and prints its table after the others. Its kprobes on rxe's task functions are left out
#    (RBLK_TIMELINE_SKIP_KPROBES, default "rxe_requester rxe_xmit_packet rxe_receiver
#    rxe_responder rxe_completer"; set it empty to probe them): with them this guest's 6.12 kernel
#    panicked in two of the last runs, which lost the timeline.
#
# What is compared, and why so:
# - Throughput in operations per second. perftest's -t is its send queue depth (the bench's
#   --iodepth) and -o its outstanding RDMA READs. -Q 1 signals every work request, as rblk's queue
#   does: with perftest's default completion moderation (-Q = -t at depth 32) it posts 32, waits for
#   all of them and posts again, so it would not keep 32 in flight (COMPARE_PERFTEST_BW_ARGS="-Q 8"
#   to try others). perftest runs -D SECS+2 with 1 s margins (-f 1); rblk-bench --ramp_time 1
#   --runtime SECS: both measure SECS seconds after a second of warm-up, as fio does. rblk-bench
#   writes fio's JSON layout (-o json+ --group_reporting --output FILE: one entry for all its jobs,
#   latency bins for the CDF), its own and the target's CPU under "rblk"; the host also reads
#   rblk-bench's earlier layout (--json, in the guest.log of an earlier run for --redraw).
# - Latency at depth 1, in microseconds: ib_read_lat's t_typical is a full round trip, like a
#   one-sided read's completion. ib_write_lat reports HALF of a ping-pong, while a one-sided write
#   completes after a full round trip (its ACK): that row compares with 2 x ib_write_lat. perftest
#   busy-polls; rblk-bench is run twice, with the library's default spin and with --spin 1ms (it
#   polls like perftest). For the block devices, fio's p50 completion latency (clat) at iodepth 1.
# - Every block-device workload is compared with the rblk-bench row of the same workload (4k
#   randread/randwrite QD32 IOPS; randread QD1 p50 with the default spin) from the same rounds.
#   Goals (issue 23), medians of this boot's rounds:
#     ublk randread QD1 p50 <= 0.5 x NVMe-oF's and <= 1.6 x rblk-bench's;
#     ublk randread and randwrite QD32 >= 2 x NVMe-oF, >= 0.75 x rblk-bench and >= 0.85 x
#     ublk-null (the same loop without RDMA).
# - Guest CPU per I/O beside every block-device row (and rblk-bench's): while the run goes on, the
#   busy time of all vCPUs (/proc/stat's "cpu" line: user + nice + system + irq + softirq + steal,
#   in clock ticks) is read at 1.5 s after the run starts (after fio's 1 s ramp and its start-up)
#   and SECS - 1 s later (at least 1 s); divided by the I/Os the device completed between the two
#   readings (/sys/block/DEV/stat, reads + writes; for rblk-bench, and a device that counts
#   nothing, its IOPS x the window). Everything the guest spends per I/O: fio's own share, the
#   kernel's block layer, ublk/NBD/FUSE, rxe and rblk. Beside it "vCPU busy" (that busy time over
#   all vCPUs' time: 100% = both vCPUs saturated) and, for `rblk attach`, "q sleeps/IO": the
#   voluntary context switches of its queue threads (rblk-q*, /proc/PID/task/TID/status) per I/O
#   in the window.
# - rblk-bench's own CPU over each of its runs (its "rblk" section's "cpu": what polling costs the
#   initiator), in the "rblk cpu" column.
# - The target's CPU over each rblk-bench run (rblk-bench's STATS before and after), over each fio
#   run on an rblk path (the sum of the target's threads' /proc schedstat before and after, taken
#   while the device's session is open; it includes fio's start and its ramp second), and while
#   idle with no session at all (the same sum over SECS), for scale.
#
# A row that fails (a tool's error or timeout, a transport error, a device that cannot be made or
# removed, output that does not parse) is recorded with its error (`@@fail` in the guest's log;
# FAILED and the error in the table; "failed"/"errors"/"failures" in summary.json) and the run goes
# on. The run fails at the end (exit status 1, after the tables and summary.json are written) only
# when a goal row is missing: ublk, nvmeof or rblk-bench of a block-device workload; or when the
# guest run itself fails.
#
# Prints the tables and writes build/compare/summary.json. The first table: workload, perftest and
# rblk medians with their min-max spread over the rounds, rblk/perftest, the goal; in the JSON, for
# each workload {"perftest": x, "rblk": y, "ratio": y/x, "unit": "ops/s" | "us", ...spreads,
# commands, goal} (or {"failed": [errors]} with nulls), plus the target's CPU share. The second:
# each block-device workload with every path's median (min-max), its ratio to NVMe-oF and to
# rblk-bench, guest CPU per I/O, vCPU busy, queue thread sleeps per I/O, the target's CPU and the
# goals; in the JSON under "block_devices": {"block_randread_4k_qd32" | "block_randwrite_4k_qd32" |
# "block_randread_4k_qd1_p50": {PATH...: median or null, "rblk_bench": median, "status": {path: ok
# | failed | unavailable | not run}, "ratios": {"PATH_vs_nvmeof", "PATH_vs_rblk_bench",
# "ublk_vs_ublk-null"}, "goals": [{"goal", "ratio", "met"}], "guest_cpu": {path: {"us_per_io",
# "busy_share", "queue_sleeps_per_io", ...}}, "errors", "spreads", "cmds", "target_cpu_share"}}.
# Then every goal with its ratio and verdict ("goals", "goals_met", "missing_goal_rows" in the
# JSON), the failures, and the QD1 timeline's table ("timeline" in the JSON: each path's totals and
# the path of its own summary.json). Raw outputs: build/compare/guest.log.
#
# Charts (scripts/plot.py, with /usr/bin/python3 and Debian's python3-matplotlib), in build/compare/:
#   compare.png      summary.json as bar charts: each ratio with its goal (plot.py compare)
#   iops.png         IOPS over time of one more rblk-bench run after the rounds, randread 4k QD32
#                    for SECS with --log --log-interval 100 (plot.py series bench_iops.1.log); that
#                    run's files are kept too: bench_iops.1.log, bench_bw.1.log, bench_lat.1.log,
#                    bench.hlog (HdrHistogram interval log), bench.json (-o json)
#   latency-cdf.png  latency CDF and tail of the last round's rblk-bench reports of randread and
#                    randwrite 4k QD1 (default spin, and --spin 1ms for randread) and QD32
#                    (plot.py cdf, from their json+ latency bins), kept as rblk-WORKLOAD.json
# A chart whose input is missing (its rows failed) is left out with a warning.
#
# Options and environment:
#   --quick            1 round of 2 s (a CI smoke test that the comparison works)
#   --redraw           no guest: parse build/compare/guest.log of an earlier run again (its SECS,
#                      ROUNDS and perftest arguments are in it), rewrite the tables and charts
#   COMPARE_SECS       measured seconds per run (default 5)
#   COMPARE_ROUNDS     rounds of every pair (default 4)
#   COMPARE_PERFTEST_BW_ARGS  extra perftest arguments for the bandwidth runs (default "-Q 1")
#   RBLK_BIN_DIR       take rblk-target, rblk-bench, rblk and rblk-test-client from this directory
#                      instead of building them (e.g. a build of a git worktree); default: cargo
#                      build --release --workspace --all-features, then ${CARGO_TARGET_DIR:-build}/release.
#                      The guest runs copies of them in build/compare/bin/ (another build during
#                      the run once swapped rblk under it: every rblk front end failed)
#   RBLK_GUEST_LOCK    the guest runs under `flock /tmp/rblk-guest.lock` (one guest at a time on this
#                      machine; PATH for another lock file, empty for none); a caller that holds
#                      the lock already (`flock /tmp/rblk-guest.lock scripts/compare-rxe.sh`) is
#                      noticed and the lock is not taken twice
#   RXE_GUEST_TIMEOUT  seconds the guest run may take (default: generous, from SECS and ROUNDS)
# Timing: COMPARE_ROUNDS=3 COMPARE_SECS=4 took 12.3 minutes on 2026-12-02 with four block-device
# paths (about 4 minutes per round); the four paths added since make 23 fio runs of SECS + ~4 s
# per round instead of 12, and the timeline adds about a minute and a half. --quick on
# 2026-12-03: a 7.8-minute guest run (boot included) after about 1.5 minutes of building, 12
# minutes of guest run on a host loaded by other builds; building libublk's example the first
# time adds about 4 minutes. TCG makes absolute figures meaningless and boots
# vary by ~10% (far more when the host is busy, and the kernel's block paths more than the verbs
# rows): compare ratios from the same boot, on an idle host. The guest's 6.12 kernel has panicked
# in rdma_rxe (a NULL call from rxe_sender, in the send work item) in two of three --quick runs,
# once at `rblk detach` of the --queues 2 device and once during the timeline's ublk run: the
# host then prints what the guest reported, the reason and INCOMPLETE, and fails.
set -euo pipefail
shopt -s inherit_errexit

REPO_ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
CALLER_PWD=$PWD
cd "$REPO_ROOT"

OUT=build/compare
VOLUME_SIZE=256M
LOG_INTERVAL_MS=100 # rblk-bench --log-interval of the picture run
# scripts/timeline-rxe.sh --secs and --trace-secs in this boot: 1 s traced, as its default, but 8 s
# per path rather than 4, so that the trace still falls inside the run when a busy host slows the
# guest's start-up of the window (at 4 s, a run on a loaded host traced fio's and rblk-bench's ends).
TIMELINE_SECS=8
TIMELINE_TRACE_SECS=1
RBLK_PORT=7420

SCRIPT_NAME=compare
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh"

# ---------------------------------------------------------------------------------------------------
# In the guest: run every pair, print raw results between markers on stdout for the host to parse.
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

guest_main() {
    local secs=$1 rounds=$2 bw_args=$3
    local bin=${RBLK_BIN_DIR:-$REPO_ROOT/build/release}
    local addr=${RBLK_ADDR:?RBLK_ADDR: the address of the rxe device} dev=${RBLK_DEVICE:-rxe0}
    local work tpid hz
    work=$(mktemp -d /tmp/rblk-compare.XXXXXX)
    hz=$(getconf CLK_TCK)
    local uri="rblk://$addr:$RBLK_PORT/v"
    local -a bw
    read -r -a bw <<<"$bw_args"

    printf '@@meta guest_kernel %s\n' "$(uname -r)"
    printf '@@meta guest_cpus %s\n' "$(nproc)"
    # The idle loop matters under TCG: a halted vCPU takes tens of microseconds to wake.
    printf '@@meta guest_idle %s\n' "$(idle=$(sed -n 's/^\(.* \)\{0,1\}idle=\([a-z]*\).*/\2/p' /proc/cmdline); echo "${idle:-halt}")"
    # A clock source other than the TSC makes every clock read a system call (no vDSO): the
    # spinning loops slow down, so the rounds' figures would not be comparable. Recorded before
    # the rounds and again after them.
    clocksource() { cat /sys/devices/system/clocksource/clocksource0/current_clocksource; }
    printf '@@meta clocksource_start %s\n' "$(clocksource)"
    printf '@@meta clk_tck %s\n' "$hz"
    printf '@@meta perftest %s\n' "$(ib_read_bw --version 2>&1 | head -n 1)"
    printf '@@meta rblk_bench %s\n' "$("$bin/rblk-bench" --version)"
    printf '@@meta active_mtu %s\n' "$(ibv_devinfo -d "$dev" | awk '/active_mtu/ { print $2; exit }')"

    log "starting rblk-target --listen $addr:$RBLK_PORT --volume v:$VOLUME_SIZE"
    # shellcheck source=lib/target.sh
    source "$REPO_ROOT/scripts/lib/target.sh"
    start_target "$work/target.log" "$bin" 30 --listen "$addr:$RBLK_PORT" --volume "v:$VOLUME_SIZE" ||
        die "rblk-target did not start"
    tpid=$TARGET_PID
    # shellcheck disable=SC2064 # expand now: the trap must kill this target
    trap "kill -TERM $tpid 2>/dev/null || true" EXIT

    # "exited with status N", "(a timeout)" for timeout(1)'s 124.
    status_text() {
        if (($1 == 124)); then echo "timed out (exit status 124)"; else echo "exited with status $1"; fi
    }
    # One line of at most 400 characters from the files given (for @@fail).
    oneline() { { cat "$@" 2>/dev/null || true; } | tr -s '\r\n\t' '   ' | cut -c1-400; }
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

    log "target idle for ${secs}s (no session): its CPU for scale"
    local idle0 idle1 t0 t1
    idle0=$(target_ns) t0=${EPOCHREALTIME/./}
    sleep "$secs"
    idle1=$(target_ns) t1=${EPOCHREALTIME/./}
    printf '@@meta target_idle_cpu_ns %s %s\n' "$((idle1 - idle0))" "$(((t1 - t0) * 1000))"

    # perftest: server in the background, client against $addr; plain first, then -R (rdma_cm).
    local pt_port=18515
    local -a pt_cm=()
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
        perftest "$out" "$@" || {
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
        python3 - "$1" <<'LINES' || true
import json, sys
doc = json.load(open(sys.argv[1]))
for job in doc["jobs"]:
    for d in ("read", "write"):
        x = job[d]
        if x["total_ios"]:
            p = x["clat_ns"]["percentile"]
            print(f"    {d}: IOPS={x['iops']:.0f}, BW={x['bw'] / 1024:.1f}MiB/s, "
                  f"lat p50={p['50.000000'] / 1000:.1f} us, p99={p['99.000000'] / 1000:.1f} us")
t = doc["rblk"]["sections"][0]["target_cpu"]
print("    target cpu: " + (f"{t['share_of_core'] * 100:.3f}% of one core" if t else "unknown"))
LINES
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
        sampled "$work/gcpu" "" "" bench -o json+ --output "$json" "$@" >"$work/rblk.out" 2>&1 || rc=$?
        if ((rc != 0)); then
            fail "$w" rblk "$r" "rblk-bench $* $(status_text "$rc"): $(oneline "$work/rblk.out")"
            return 0
        fi
        [[ -s $json ]] || {
            fail "$w" rblk "$r" "rblk-bench $* wrote no JSON report: $(oneline "$work/rblk.out")"
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
        timeout $((secs * 10 + 120)) "$bin/rblk-test-client" raw-lat "$uri" --count "$count" "$@" >"$json" 2>"$work/raw.err" || rc=$?
        if ((rc != 0)); then
            fail "$w" rblk "$r" "rblk-test-client raw-lat $* $(status_text "$rc"): $(oneline "$work/raw.err")"
            return 0
        fi
        log "  rblk-test-client raw-lat $*: $(cat "$json")"
        emit "$w" rblk "$r" "$json" rblk-test-client raw-lat "$uri" --count "$count" "$@"
    }
    # Two rblk-bench processes at once (workload $1, round $2), each with the arguments that
    # follow; emits one report: IOPS and CPU summed, each latency figure the worse of the two.
    run_rblk_2proc() {
        local w=$1 r=$2 pid rc=0
        shift 2
        rm -f "$work/p1.json" "$work/p2.json"
        bench -o json --output "$work/p1.json" "$@" >/dev/null 2>"$work/p1.err" &
        pid=$!
        bench -o json --output "$work/p2.json" "$@" >/dev/null 2>"$work/p2.err" || rc=$?
        wait "$pid" || rc=$?
        if ((rc != 0)) || [[ ! -s $work/p1.json || ! -s $work/p2.json ]]; then
            fail "$w" rblk "$r" "two rblk-bench processes $* failed (status $rc): $(oneline "$work/p1.err" "$work/p2.err")"
            return 0
        fi
        python3 - "$work/p1.json" "$work/p2.json" >"$work/2proc.json" 2>"$work/2proc.err" <<'MERGE' || {
import json, sys
# Two reports in fio's layout (one job entry each) -> one in the shape the host reads (the
# earlier rblk-bench layout's names): IOPS and CPU added, each latency figure the worse one.
a, b = (json.load(open(p)) for p in sys.argv[1:3])
PCT = {"p50": "50.000000", "p90": "90.000000", "p99": "99.000000", "p99_9": "99.900000", "p99_99": "99.990000"}
def lat_us(c):
    return None if not c["N"] else {k: c["percentile"][v] / 1000 for k, v in PCT.items()}
def section(x):
    return x["rblk"]["sections"][0]
ja, jb = a["jobs"][0], b["jobs"][0]
out = {"total": {"iops": sum(j[d]["iops"] for j in (ja, jb) for d in ("read", "write"))},
       "cpu": {"share_of_core": section(a)["cpu"]["share_of_core"] + section(b)["cpu"]["share_of_core"]},
       "target_cpu": section(a)["target_cpu"]}
for d in ("read", "write"):
    la, lb = lat_us(ja[d]["clat_ns"]), lat_us(jb[d]["clat_ns"])
    out[d] = {"lat_us": None if la is None or lb is None else {k: max(la[k], lb[k]) for k in la}}
print(json.dumps(out))
MERGE
            fail "$w" rblk "$r" "cannot merge the two reports: $(oneline "$work/2proc.err")"
            return 0
        }
        log "  2 x rblk-bench $*: done"
        emit "$w" rblk "$r" "$work/2proc.json" 2 x rblk-bench "$@"
    }

    # About SECS seconds each under TCG: a read round trip is ~50 us, a write ping-pong ~110 us.
    local read_iters=$((secs * 20000)) write_iters=$((secs * 10000))
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

    # --- Block devices: fio through every path (see the header), one job, 4 KiB, libaio, O_DIRECT.
    local nqn=nqn.2024-12.io.rblk:compare mnt=$work/mnt
    local -a blk_paths=(nvmeof nbd fuse ublk ublk-sleep ublk-null libublk-null ublk-q2)
    local -A blk_why=() # path -> why it cannot run in this boot
    local blk_dev="" blk_pid="" blk_err=""
    local libublk=${RBLK_LIBUBLK_NULL:-} libublk_id=""
    unavailable() { # PATH WHY
        blk_why[$1]=$2
        printf '@@unavailable %s %s\n' "$1" "$2"
        log "$1 rows skipped: $2"
    }
    # Which paths can run here: the tools, the kernel's modules, this rblk's flags.
    blk_check() {
        local help p
        command -v nvme >/dev/null || unavailable nvmeof "no nvme here (scripts/deps.sh installs nvme-cli)"
        command -v nbd-client >/dev/null || unavailable nbd "no nbd-client here (scripts/deps.sh installs it)"
        command -v losetup >/dev/null || unavailable fuse "no losetup here"
        if [[ -z ${blk_why[nvmeof]:-} ]]; then
            if nvmeof_setup "$nqn" "$addr" 2>"$work/nvmet.err"; then
                printf '@@meta nvmet %s on /dev/nullb0 (null_blk memory_backed, 1 GiB), rdma port %s:4420\n' "$nqn" "$addr"
            else
                unavailable nvmeof "cannot set up Linux NVMe-oF/RDMA: $(oneline "$work/nvmet.err")"
            fi
        fi
        if ! modprobe ublk_drv >&2 || [[ ! -e /dev/ublk-control ]]; then
            for p in ublk ublk-sleep ublk-null libublk-null ublk-q2; do
                unavailable "$p" "kernel $(uname -r) has no ublk_drv (/dev/ublk-control)"
            done
        elif ! help=$("$bin/rblk" attach --help 2>&1); then
            for p in ublk ublk-sleep ublk-null ublk-q2; do
                unavailable "$p" "this rblk has no 'rblk attach' ($("$bin/rblk" --version): $(head -n 1 <<<"$help"))"
            done
        elif ! grep -q -- '--wait' <<<"$help"; then
            unavailable ublk-sleep "this rblk's 'rblk attach' has no --wait"
        fi
        if [[ -z ${blk_why[libublk-null]:-} ]]; then
            if [[ -z $libublk ]]; then
                unavailable libublk-null "${RBLK_LIBUBLK_NULL_WHY:-not built on the host}"
            elif [[ ! -x $libublk ]]; then
                unavailable libublk-null "no $libublk in the guest"
            fi
        fi
    }
    # The output of `rblk attach --daemon` in $work/attach.out: sets blk_dev and blk_pid.
    attach_daemon() { # ARGS... (after the URI)
        # A file, not $(...): the background server could keep a pipe open.
        if ! timeout 120 "$bin/rblk" attach "$uri" --device "$dev" --daemon "$@" >"$work/attach.out" 2>"$work/attach.log"; then
            blk_err="rblk attach $* --daemon failed: $(oneline "$work/attach.out" "$work/attach.log")"
            return 1
        fi
        blk_dev=$(sed -n 1p "$work/attach.out")
        blk_pid=$(sed -n 's/^rblk: pid \([0-9][0-9]*\) serves .*/\1/p' "$work/attach.log")
        if [[ $blk_dev != /dev/ublkb* || -z $blk_pid ]]; then
            blk_err="rblk attach $* printed no /dev/ublkbN line (stdout) and 'rblk: pid N serves' line (stderr): $(oneline "$work/attach.out" "$work/attach.log")"
            return 1
        fi
    }
    # Make path $1's block device: sets blk_dev (and blk_pid, the process serving it), or blk_err
    # and returns 1.
    blk_attach() {
        blk_dev="" blk_pid="" blk_err=""
        case $1 in
        nvmeof)
            nvmeof_connect "$nqn" "$addr" 2>"$work/nvme.err" || {
                blk_err="cannot connect to Linux NVMe-oF/RDMA: $(oneline "$work/nvme.err")"
                return 1
            }
            blk_dev=$NVMEOF_DEV
            ;;
        nbd)
            modprobe nbd >&2 || {
                blk_err="cannot load nbd"
                return 1
            }
            rm -f "$work/nbd.sock"
            # Its one stdout line, once it serves, is the export's URI (nbd+unix:///?socket=PATH).
            "$bin/rblk" nbd "$uri" --device "$dev" --listen "unix:$work/nbd.sock" >"$work/nbd.out" 2>"$work/nbd.log" &
            blk_pid=$!
            for _ in $(seq 1 300); do
                grep -q '^nbd+unix:' "$work/nbd.out" && break
                kill -0 "$blk_pid" 2>/dev/null || break
                sleep 0.1
            done
            grep -q '^nbd+unix:' "$work/nbd.out" || {
                blk_err="rblk nbd printed no nbd+unix: URI (it did not start serving): $(oneline "$work/nbd.out" "$work/nbd.log")"
                return 1
            }
            timeout 60 nbd-client -unix "$work/nbd.sock" /dev/nbd0 -block-size 4096 >"$work/nbdc.log" 2>&1 || {
                blk_err="nbd-client failed: $(oneline "$work/nbdc.log")"
                return 1
            }
            blk_dev=/dev/nbd0
            ;;
        fuse)
            mkdir -p "$mnt"
            # Its one stdout line is the loop device; the pid is on stderr ("rblk: pid N serves
            # MOUNTPOINT", then "rblk: serving in the background (pid N); ...").
            timeout 120 "$bin/rblk" mount "$uri" "$mnt" --device "$dev" --queues 1 --loop --daemon \
                >"$work/mount.out" 2>"$work/mount.log" || {
                blk_err="rblk mount --loop --daemon failed: $(oneline "$work/mount.out" "$work/mount.log")"
                return 1
            }
            blk_dev=$(sed -n 1p "$work/mount.out")
            blk_pid=$(sed -n -e 's/^rblk: pid \([0-9][0-9]*\) serves .*/\1/p' \
                -e 's/^rblk: serving in the background (pid \([0-9][0-9]*\)).*/\1/p' "$work/mount.log" | head -n 1)
            [[ $blk_dev == /dev/loop* && -n $blk_pid ]] || {
                blk_err="rblk mount printed no /dev/loopN line (stdout) or no 'rblk: pid N serves' line (stderr): $(oneline "$work/mount.out" "$work/mount.log")"
                return 1
            }
            ;;
        ublk) attach_daemon --queues 1 --depth 32 || return 1 ;;
        ublk-sleep) attach_daemon --queues 1 --depth 32 --wait sleep || return 1 ;;
        ublk-q2) attach_daemon --queues 2 --depth 32 || return 1 ;;
        ublk-null) RBLK_ALLOW_NULL=1 attach_daemon --queues 1 --depth 32 --null-io || return 1 ;;
        libublk-null)
            libublk_id=9
            while [[ -e /dev/ublkc$libublk_id || -e /dev/ublkb$libublk_id ]]; do
                libublk_id=$((libublk_id + 1))
            done
            "$libublk" add -n "$libublk_id" -q 1 -d 32 --foreground >"$work/libublk.out" 2>&1 &
            blk_pid=$!
            blk_dev=/dev/ublkb$libublk_id
            ;;
        esac
        wait_bdev "$blk_dev" || {
            blk_err="$blk_dev did not appear as a block device${blk_pid:+$(kill -0 "$blk_pid" 2>/dev/null || echo " (its server exited)")}"
            [[ $1 == libublk-null ]] && blk_err+=": $(oneline "$work/libublk.out")"
            return 1
        }
        log "  $1: $blk_dev"
    }
    # Remove path $1's device (also after a failed blk_attach); returns 1, with blk_err, when that
    # did not go cleanly (the serving process is killed then).
    blk_detach() {
        local rc=0
        blk_err=""
        case $1 in
        nvmeof)
            nvme disconnect -n "$nqn" >"$work/nvme.err" 2>&1 || blk_err="nvme disconnect failed: $(oneline "$work/nvme.err")"
            ;;
        nbd)
            if [[ -e /sys/block/nbd0/pid ]]; then
                timeout 60 nbd-client -d /dev/nbd0 >"$work/nbdc.log" 2>&1 || blk_err="nbd-client -d failed: $(oneline "$work/nbdc.log")"
                for _ in $(seq 1 300); do
                    [[ -e /sys/block/nbd0/pid ]] || break
                    sleep 0.1
                done
            fi
            if [[ -n $blk_pid ]]; then
                kill -TERM "$blk_pid" 2>/dev/null || true
                wait "$blk_pid" || rc=$?
                ((rc == 0)) || blk_err+="${blk_err:+; }rblk nbd exited with status $rc after SIGTERM: $(oneline "$work/nbd.log")"
            fi
            ;;
        fuse)
            if mountpoint -q "$mnt"; then
                timeout 60 "$bin/rblk" umount "$mnt" >"$work/umount.log" 2>&1 || blk_err="rblk umount failed: $(oneline "$work/umount.log")"
            fi
            ;;
        ublk*)
            if [[ -n $blk_dev && -e $blk_dev ]]; then
                timeout 60 "$bin/rblk" detach "$blk_dev" >"$work/detach.log" 2>&1 ||
                    blk_err="rblk detach $blk_dev failed: $(oneline "$work/detach.log")"
            fi
            ;;
        libublk-null)
            if [[ -n $libublk_id && -e /dev/ublkc$libublk_id ]]; then
                timeout 60 "$libublk" del -n "$libublk_id" >"$work/libublk-del.log" 2>&1 ||
                    blk_err="$libublk del -n $libublk_id failed: $(oneline "$work/libublk-del.log")"
            fi
            ;;
        esac
        if [[ -n $blk_pid && $1 != nbd ]] && ! wait_gone "$blk_pid"; then
            blk_err+="${blk_err:+; }its server (pid $blk_pid) did not exit: SIGKILL"
            kill -KILL "$blk_pid" 2>/dev/null || true
            wait_gone "$blk_pid" || true
        fi
        [[ $1 == libublk-null && -n $blk_pid ]] && { wait "$blk_pid" 2>/dev/null || true; }
        [[ -z $blk_err ]]
    }
    # One fio run of workload $1 through path $2 in round $3: fio's --rw and --iodepth follow.
    # The guest's CPU over a window of it (`sampled`) and, for the paths served by rblk, the
    # target's CPU over the whole run (its threads, session included).
    run_fio() {
        local w=$1 path=$2 r=$3 rw=$4 qd=$5 json="$work/fio.json" c0 c1 t0 t1 rc=0
        local -a cmd=(fio --name="$w" --filename="$blk_dev" --ioengine=libaio --direct=1 --bs=4k --rw="$rw"
            --iodepth="$qd" --numjobs=1 --size="$VOLUME_SIZE" --time_based --ramp_time=1 --runtime="$secs"
            --output-format=json --output="$json")
        rm -f "$json"
        c0=$(target_ns) t0=${EPOCHREALTIME/./}
        sampled "$work/gcpu" "$blk_dev" "$blk_pid" timeout $((secs * 10 + 120)) "${cmd[@]}" >"$work/fio.err" 2>&1 || rc=$?
        c1=$(target_ns) t1=${EPOCHREALTIME/./}
        if ((rc != 0)); then
            fail "$w" "$path" "$r" "fio $(status_text "$rc"): $(oneline "$work/fio.err" "$json")"
            return 0
        fi
        [[ -s $json ]] || {
            fail "$w" "$path" "$r" "fio wrote no JSON report: $(oneline "$work/fio.err")"
            return 0
        }
        case $path in
        nvmeof | libublk-null) ;;
        *) printf '@@cpu %s %s %s %s %s\n' "$w" "$path" "$r" "$((c1 - c0))" "$(((t1 - t0) * 1000))" ;;
        esac
        emit_gcpu "$w" "$path" "$r" "$work/gcpu"
        log "  fio $path $rw QD$qd: done"
        emit "$w" "$path" "$r" "$json" "${cmd[@]}"
    }
    # Every block-device workload through every path, in round $1 (the paths' order rotates).
    block_round() {
        local r=$1 i n=${#blk_paths[@]} path w
        local -a wls
        for i in $(seq 0 $((n - 1))); do
            path=${blk_paths[$(((i + r - 1) % n))]}
            [[ -z ${blk_why[$path]:-} ]] || continue
            # randwrite first: it fills what the reads read. --queues 2: the QD32 rows only.
            wls=("fio_randwrite_4k_qd32 randwrite 32" "fio_randread_4k_qd32 randread 32")
            [[ $path == ublk-q2 ]] || wls+=("fio_randread_4k_qd1 randread 1")
            if ! blk_attach "$path"; then
                for w in "${wls[@]}"; do
                    fail "${w%% *}" "$path" "$r" "$blk_err"
                done
                blk_detach "$path" || true
                continue
            fi
            for w in "${wls[@]}"; do
                # shellcheck disable=SC2086 # WORKLOAD RW QD
                run_fio ${w%% *} "$path" "$r" ${w#* }
            done
            blk_detach "$path" || fail detach "$path" "$r" "$blk_err"
        done
    }

    log "warm-up (discarded): ib_read_bw and rblk-bench, 2 s each"
    perftest "$work/warm.out" ib_read_bw -s 4096 -t 32 -o 32 -D 4 -f 1 ||
        log "warning: the perftest warm-up failed: ${PERFTEST_ERR:-}"
    timeout 120 "$bin/rblk-bench" "$uri" --device "$dev" --quiet --runtime 2 >/dev/null ||
        log "warning: the rblk-bench warm-up failed"
    printf '@@meta fio %s\n' "$(fio --version 2>&1)"
    printf '@@meta nvme_cli %s\n' "$(nvme version 2>&1 | head -n 1)"
    blk_check

    local r order
    for r in $(seq 1 "$rounds"); do
        order=$(((r + 1) % 2)) # odd rounds: perftest first; even rounds: rblk first
        log "round $r/$rounds"
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
        block_round "$r"
    done
    if [[ -z ${blk_why[nvmeof]:-} ]]; then
        nvmeof_teardown "$nqn" 2>"$work/nvmet.err" || fail teardown nvmeof 0 "$(oneline "$work/nvmet.err")"
    fi

    # For the pictures: one more rblk-bench run with --log, sent to the host as files.
    local -a pic=(--rw randread --bs 4k --iodepth 32 --log "$work/bench" --log-interval "$LOG_INTERVAL_MS")
    log "rblk-bench ${pic[*]} (time series for build/compare/iops.png)"
    local f
    if bench -o json --output "$work/bench.json" "${pic[@]}" >"$work/pic.out" 2>&1; then
        bench_lines "$work/bench.json" >&2
        for f in "$work"/bench_iops.1.log "$work"/bench_bw.1.log "$work"/bench_lat.1.log "$work"/bench.hlog "$work"/bench.json; do
            if [[ -s $f ]]; then emit_file "${f##*/}" "$f"; fi
        done
    else
        fail picture rblk 0 "rblk-bench ${pic[*]} failed: $(oneline "$work/pic.out")"
    fi

    kill -TERM "$tpid"
    local rc=0
    wait "$tpid" || rc=$?
    trap - EXIT
    if ((rc != 0)); then
        tail -n 20 "$work/target.log" >&2
        fail target rblk 0 "rblk-target exited with status $rc: $(tail -n 3 "$work/target.log" | oneline)"
    fi

    # The QD1 per-stage timeline (scripts/timeline-rxe.sh's part in the guest, with its own
    # rblk-target and NVMe-oF/RDMA export): its raw output goes to the host as a file, streamed,
    # so that the paths it finished reach the host even if the guest dies on a later one.
    printf '@@meta clocksource_end %s\n' "$(clocksource)"
    log "timeline: scripts/timeline-rxe.sh --in-guest $TIMELINE_SECS $TIMELINE_TRACE_SECS (QD1 per-stage timeline)"
    rc=0
    printf '@@file %s\n' timeline-guest.log
    timeout 900 "$REPO_ROOT/scripts/timeline-rxe.sh" --in-guest "$TIMELINE_SECS" "$TIMELINE_TRACE_SECS" "$bin" || rc=$?
    printf '@@endfile %s\n' timeline-guest.log
    ((rc == 0)) || fail timeline timeline 0 "scripts/timeline-rxe.sh --in-guest $(status_text "$rc")"

    rm -rf "$work"
    printf '@@meta complete yes\n'
}

# ---------------------------------------------------------------------------------------------------
# On the host: parse the guest's output, print the table, write summary.json.

summarize() { # LOG SUMMARY_JSON TABLE_TXT
    lib_python - "$@" "$REPO_ROOT/scripts/timeline-rxe.sh" <<'PY'
import datetime, json, os, re, statistics, subprocess, sys

from report import bench_report, host_info

log_path, summary_path, table_path, timeline_script = sys.argv[1:5]
out_dir = os.path.dirname(summary_path)

# Each workload: label, unit, how to read perftest's and rblk's figures, the goal.
WORKLOADS = [
    ("randread_4k_qd32", "randread 4k QD32", "ops/s", "bw", "randread_4k_qd32", ("total", "iops"), ">=", 0.95),
    ("randwrite_4k_qd32", "randwrite 4k QD32", "ops/s", "bw", "randwrite_4k_qd32", ("total", "iops"), ">=", 0.95),
    ("read_64k_qd32", "read 64k QD32", "ops/s", "bw", "read_64k_qd32", ("total", "iops"), ">=", 0.97),
    ("write_64k_qd32", "write 64k QD32", "ops/s", "bw", "write_64k_qd32", ("total", "iops"), ">=", 0.97),
    ("randread_4k_qd1_p50", "randread 4k QD1 p50", "us", "lat", "randread_4k_qd1", ("read", "p50"), "<=", 1.1),
    ("randread_4k_qd1_p50_spin", "  same, rblk --spin 1ms", "us", "lat", "randread_4k_qd1_spin", ("read", "p50"),
     "<=", 1.1),
    ("randwrite_4k_qd1_p50", "randwrite 4k QD1 p50 (vs 2x ib_write_lat)", "us", "lat2", "randwrite_4k_qd1",
     ("write", "p50"), None, None),
    ("randwrite_4k_qd1_p50_spin", "  same, rblk --spin 1ms", "us", "lat2", "randwrite_4k_qd1_spin",
     ("write", "p50"), None, None),
    ("randread_4k_qd1_p50_raw", "  same, raw fabric (rblk-test-client raw-lat)", "us", "lat",
     "randread_4k_qd1_raw", ("read", "p50"), None, None),
    # Against rblk itself (the "perftest" column is rblk-bench's 1 job x QD32 p99, RBLK_REF_OF).
    ("randread_4k_2jobs_p99", "randread 4k p99, 2 jobs x QD16 (vs rblk 1 x QD32)", "us", "rblkref",
     "randread_4k_2x16", ("read", "p99"), "<=", 2.0),
    ("randread_4k_2jobs_p99_poll", "  same, rblk --poll", "us", "rblkref",
     "randread_4k_2x16_poll", ("read", "p99"), "<=", 2.0),
    ("randread_4k_2procs_p99", "  2 processes x QD16 (worse p99 of the two)", "us", "rblkref",
     "randread_4k_2proc", ("read", "p99"), None, None),
    ("randread_4k_2jobs_p99_raw", "  raw fabric 2 x QD16 (vs raw 1 x QD32)", "us", "rblkref",
     "randread_4k_2x16_raw", ("read", "p99"), None, None),
]
# The rblk-bench workload an "rblkref" row compares with.
RBLK_REF_OF = {
    "randread_4k_2x16": "randread_4k_qd32",
    "randread_4k_2x16_poll": "randread_4k_qd32",
    "randread_4k_2proc": "randread_4k_qd32",
    "randread_4k_2x16_raw": "randread_4k_qd32_raw",
}
# Which perftest runs a row compares with (the spin variants share the default runs').
PERFTEST_OF = {
    "randread_4k_qd1_raw": "randread_4k_qd1",
    "randread_4k_qd1_spin": "randread_4k_qd1",
    "randwrite_4k_qd1_spin": "randwrite_4k_qd1",
}

# Block devices through fio: the paths, what each is, and the workloads with the rblk-bench row
# (and figure) each compares with, the paths that run it and its goals: (path, reference, op, factor).
BLOCK_PATHS = [
    ("nvmeof", "Linux NVMe-oF/RDMA, null_blk"),
    ("nbd", "rblk nbd + nbd-client"),
    ("fuse", "rblk mount --loop (FUSE)"),
    ("ublk", "rblk attach --queues 1"),
    ("ublk-sleep", "rblk attach --wait sleep"),
    ("ublk-q2", "rblk attach --queues 2"),
    ("ublk-null", "rblk attach --null-io (no RDMA)"),
    ("libublk-null", "libublk examples/null (no I/O)"),
]
PATHS = [p for p, _ in BLOCK_PATHS]
QD32_GOALS = [("ublk", "nvmeof", ">=", 2.0), ("ublk", "rblk_bench", ">=", 0.75), ("ublk", "ublk-null", ">=", 0.85)]
BLOCK_WORKLOADS = [
    ("block_randread_4k_qd32", "randread 4k QD32", "ops/s", "fio_randread_4k_qd32", ("read", "iops"),
     "randread_4k_qd32", PATHS, QD32_GOALS),
    ("block_randwrite_4k_qd32", "randwrite 4k QD32", "ops/s", "fio_randwrite_4k_qd32", ("write", "iops"),
     "randwrite_4k_qd32", PATHS, QD32_GOALS),
    ("block_randread_4k_qd1_p50", "randread 4k QD1 p50", "us", "fio_randread_4k_qd1", ("read", "p50"),
     "randread_4k_qd1", [p for p in PATHS if p != "ublk-q2"],
     [("ublk", "nvmeof", "<=", 0.5), ("ublk", "rblk_bench", "<=", 1.6)]),
]
# Rows whose absence fails the run: the ones the goals are measured with.
GOAL_PATHS = ("ublk", "nvmeof", "rblk_bench")


def fio_job(text):
    job = json.loads(text[text.index("{"):])["jobs"][0]
    if job.get("error"):
        raise ValueError(f"fio reports error {job['error']}")
    return job


def fio_figure(job, section, field):
    """IOPS, or the p50 completion latency in us, of fio's JSON report (one job)."""
    if field == "iops":
        return float(job[section]["iops"])
    return float(job[section]["clat_ns"]["percentile"]["50.000000"]) / 1000.0


def columns(header):
    """perftest's header names, some of which contain one space ("BW peak[MB/sec]")."""
    names, cur = [], []
    for tok in header.split():
        cur.append(tok)
        if tok.startswith("#") or tok.endswith("]"):
            names.append(" ".join(cur))
            cur = []
    if cur:
        names.append(" ".join(cur))
    return names


def perftest_figures(text):
    lines = [l.strip() for l in text.splitlines()]
    for i, line in enumerate(lines):
        if not line.startswith("#bytes"):
            continue
        names = columns(line)
        for values in lines[i + 1:]:
            fields = values.split()
            if fields and re.fullmatch(r"\d+", fields[0]) and len(fields) >= len(names):
                return {n: float(v) for n, v in zip(names, fields)}
    raise ValueError("no '#bytes' result table in perftest's output")


def pick(figs, prefix):
    for name, value in figs.items():
        if name.startswith(prefix):
            return value
    raise ValueError(f"no {prefix} column in {sorted(figs)}")


meta, runs, block = {}, [], None
blk_cpu = {}  # block path, and "WORKLOAD/path" -> [target CPU share per fio run]
gcpu = {}  # (workload, tool, round) -> (busy ticks, all ticks, window ns, I/Os or -1, queue sleeps or -1)
fails = []  # {"workload", "tool", "round", "error"}
unavailable = {}  # path -> why
files, in_file = {}, None  # @@file NAME ... @@endfile NAME: written into the output directory
with open(log_path, errors="replace") as f:
    for raw in f:
        line = raw.rstrip("\r\n").replace("\r", "")
        if in_file is not None:
            if line == f"@@endfile {in_file}":
                in_file = None
            else:
                files[in_file].append(line)
        elif line.startswith("@@file "):
            in_file = line[len("@@file "):]
            if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", in_file):
                print(f"compare: error: bad file name in the guest's output: {in_file!r}", file=sys.stderr)
                sys.exit(1)
            files[in_file] = []
        elif line.startswith("@@meta "):
            parts = line.split(" ", 2)
            meta[parts[1]] = parts[2] if len(parts) > 2 else ""
        elif line.startswith("@@unavailable "):
            parts = line.split(" ", 2)
            unavailable[parts[1]] = parts[2] if len(parts) > 2 else ""
        elif line.startswith("@@fail "):
            parts = line.split(" ", 4)
            fails.append({"workload": parts[1], "tool": parts[2], "round": int(parts[3]),
                          "error": parts[4] if len(parts) > 4 else ""})
        elif line.startswith("@@cpu "):
            w, path, rnd, ns, wall = line.split()[1:6]
            share = int(ns) / int(wall) if int(wall) else 0.0
            blk_cpu.setdefault(path, []).append(share)
            blk_cpu.setdefault(f"{w}/{path}", []).append(share)
        elif line.startswith("@@gcpu "):
            w, tool, rnd, *xs = line.split()[1:]
            xs = [int(x) for x in xs] + [0] * (6 - len(xs))
            gcpu[(w, tool, int(rnd))] = tuple(xs[:6])
        elif line.startswith("@@begin "):
            w, tool, rnd, *cmd = line.split(" ")[1:]
            block = {"workload": w, "tool": tool, "round": int(rnd), "cmd": " ".join(cmd), "text": []}
        elif line.startswith("@@end ") and block is not None:
            block["text"] = "\n".join(block["text"])
            runs.append(block)
            block = None
        elif block is not None:
            block["text"].append(line)
notes = []
if in_file is not None:
    # The guest died while sending it: what came is kept (the timeline analyses the paths it has).
    notes.append(f"the guest's file {in_file} has no @@endfile: the guest died while sending it")
if block is not None:
    fails.append({"workload": block["workload"], "tool": block["tool"], "round": block["round"],
                  "error": "the guest's output ends inside this run's report"})
# An older log: ublk's absence as one meta line.
if meta.get("ublk", "").startswith("unavailable: "):
    unavailable.setdefault("ublk", meta["ublk"][len("unavailable: "):])
complete = meta.get("complete") == "yes"
secs = int(meta.get("secs") or os.environ.get("COMPARE_SECS") or 5)
rounds = int(meta.get("rounds") or os.environ.get("COMPARE_ROUNDS") or 4)
bw_args = meta.get("perftest_bw_args") or os.environ.get("COMPARE_PERFTEST_BW_ARGS") or "-Q 1"
hz = int(meta.get("clk_tck") or 100)

values = {}  # (workload, tool) -> [figure per round]
by_round = {}  # (workload, tool) -> {round: (figure, I/Os per second)}
cmds = {}
cpu = {}  # workload -> [target CPU share per rblk run]
own_cpu = {}  # workload -> [rblk-bench's own CPU share per run]
BLOCK_OF = {b[3]: b for b in BLOCK_WORKLOADS}
for run in runs:
    key = (run["workload"], run["tool"])
    cmds[key] = run["cmd"]
    rate = None
    try:
        if run["tool"] in PATHS:
            wl = BLOCK_OF[run["workload"]]
            job = fio_job(run["text"])
            v = fio_figure(job, *wl[4])
            rate = float(job[wl[4][0]]["iops"])
        elif run["tool"] == "perftest":
            figs = perftest_figures(run["text"])
            if any(n.startswith("MsgRate") for n in figs):
                v = pick(figs, "MsgRate") * 1e6
                if v <= 0:
                    # Its clock calibration failed; the count of the measured SECS is still right.
                    v = pick(figs, "#iterations") / float(secs)
                    notes.append(f"round {run['round']} {run['workload']}: perftest rate from #iterations / {secs} s")
            else:
                v = pick(figs, "t_typical")
                if not v > 0:
                    notes.append(f"round {run['round']} {run['workload']}: perftest latency unusable (t_typical {v}), skipped")
                    continue
        else:
            report = bench_report(json.loads(run["text"]))
            v = report
            rate = (report.get("total") or {}).get("iops")
            share = (report.get("target_cpu") or {}).get("share_of_core")
            if share is not None:
                cpu.setdefault(run["workload"], []).append(share)
            own = (report.get("cpu") or {}).get("share_of_core")
            if own is not None:
                own_cpu.setdefault(run["workload"], []).append(own)
    except (ValueError, KeyError, TypeError, IndexError, StopIteration) as e:
        fails.append({"workload": run["workload"], "tool": run["tool"], "round": run["round"],
                      "error": f"cannot parse its output: {type(e).__name__}: {e}"})
        continue
    values.setdefault(key, []).append(v)
    by_round.setdefault(key, {})[run["round"]] = (v, rate)


def errors_of(*keys):
    return [f"round {x['round']}: {x['error']}" for x in fails if (x["workload"], x["tool"]) in keys]


def spread(xs):
    return [min(xs), max(xs)] if xs else None


def med(xs):
    return statistics.median(xs) if xs else None


# Guest CPU per I/O of a run: busy vCPU time over the sampled window / the I/Os completed in it
# (the device's own count, else the run's I/O rate x the window).
def guest_cpu(workload, tool):
    per_io, busy, sleeps = [], [], []
    for rnd, (_, rate) in sorted(by_round.get((workload, tool), {}).items()):
        g = gcpu.get((workload, tool, rnd))
        if not g:
            continue
        b, a, ns, ios, qs, overran = g
        if overran:
            notes.append(f"round {rnd} {workload} {tool}: the CPU window outlasted the run; no CPU figure")
            continue
        n = ios if ios > 0 else (rate or 0) * ns / 1e9
        if n <= 0 or a <= 0:
            continue
        per_io.append(b / hz * 1e6 / n)
        busy.append(b / a)
        if qs >= 0:
            sleeps.append(qs / n)
    return {"us_per_io": med(per_io), "busy_share": med(busy), "queue_sleeps_per_io": med(sleeps),
            "runs": len(per_io), "us_per_io_spread": spread(per_io)}


rows, summary = [], {}
for key, label, unit, kind, rblk_w, (section, field), op, goal in WORKLOADS:
    pt_w = PERFTEST_OF.get(rblk_w, rblk_w)
    if kind == "rblkref":
        pt_w = RBLK_REF_OF[rblk_w]
        pts = [r[section]["lat_us"][field] for r in values.get((pt_w, "rblk"), [])]
        pt_key = (pt_w, "rblk")
    else:
        pts = values.get((pt_w, "perftest")) or []
        pt_key = (pt_w, "perftest")
    reports = values.get((rblk_w, "rblk")) or []
    entry = {"unit": unit, "perftest": None, "rblk": None, "ratio": None}
    if goal is not None:
        entry["goal"] = f"ratio {op} {goal}"
        entry["goal_met"] = None
    if kind == "lat2":
        pts = [2 * x for x in pts]
    if section == "total":
        rb = [r["total"]["iops"] for r in reports]
    else:
        rb = [r[section]["lat_us"][field] for r in reports]
    p, r = med(pts), med(rb)
    ratio = r / p if p is not None and r is not None else None
    if ratio is None and p == 0:
        ratio = float("nan")
    met = None
    if goal is not None and ratio is not None:
        met = ratio >= goal if op == ">=" else ratio <= goal
    entry.update({
        "perftest": p, "rblk": r, "ratio": ratio,
        "perftest_spread": spread(pts), "rblk_spread": spread(rb), "runs": min(len(pts), len(rb)),
        "perftest_cmd": ("2 x " if kind == "lat2" else "") + cmds[pt_key] if pt_key in cmds else None,
        "rblk_cmd": cmds.get((rblk_w, "rblk")),
    })
    if goal is not None:
        entry["goal_met"] = met
    errs = errors_of(pt_key, (rblk_w, "rblk"))
    if not pts or not reports:
        entry["failed"] = errs or ["no results"]
    elif errs:
        entry["failed_runs"] = errs
    if rblk_w in cpu:
        entry["target_cpu_share"] = statistics.median(cpu[rblk_w])
    if rblk_w in own_cpu:
        entry["rblk_cpu_share"] = statistics.median(own_cpu[rblk_w])
    summary[key] = entry
    rows.append((label, unit, pts, rb, ratio, op, goal, met, entry.get("target_cpu_share"),
                 entry.get("rblk_cpu_share"), entry.get("failed") or errs))

block_rows, block_summary, goals_all, missing = [], {}, [], []
for key, label, unit, fio_w, (section, field), bench_w, paths, goals in BLOCK_WORKLOADS:
    figs, spreads, status, errs, gc = {}, {}, {}, {}, {}
    for path in paths:
        xs = values.get((fio_w, path))
        e = errors_of((fio_w, path))
        if e:
            errs[path] = e
        if xs:
            figs[path], spreads[path], status[path] = statistics.median(xs), xs, "ok"
            gc[path] = guest_cpu(fio_w, path)
        else:
            figs[path] = None
            status[path] = ("unavailable" if path in unavailable else "failed" if e else "not run")
    reports = values.get((bench_w, "rblk")) or []
    bench = [r["total"]["iops"] for r in reports] if field == "iops" else [r[section]["lat_us"]["p50"] for r in reports]
    figs["rblk_bench"] = med(bench)
    if bench:
        spreads["rblk_bench"], status["rblk_bench"] = bench, "ok"
        gc["rblk_bench"] = guest_cpu(bench_w, "rblk")
    else:
        status["rblk_bench"] = "failed"
        errs["rblk_bench"] = errors_of((bench_w, "rblk")) or ["no results"]
    for p in GOAL_PATHS:
        if figs.get(p) is None:
            missing.append(f"{label}: {p} ({status.get(p)})")

    def ratio(a, b):
        x, y = figs.get(a), figs.get(b)
        return x / y if x is not None and y else None

    ratios = {}
    for path in paths:
        if path != "nvmeof":
            ratios[f"{path}_vs_nvmeof"] = ratio(path, "nvmeof")
        ratios[f"{path}_vs_rblk_bench"] = ratio(path, "rblk_bench")
    ratios["ublk_vs_ublk-null"] = ratio("ublk", "ublk-null")
    goal_list = []
    for path, ref, op, factor in goals:
        x = ratio(path, ref)
        met = None if x is None else (x >= factor if op == ">=" else x <= factor)
        refname = "bench" if ref == "rblk_bench" else ref
        g = {"goal": f"{path}/{ref} {op} {factor}", "ratio": x, "met": met, "path": path,
             "text": f"{op} {factor} x {refname}"}
        goal_list.append(g)
        goals_all.append(dict(g, workload=key, label=f"{path} {label} {op} {factor} x {refname}"))
    entry = {"unit": unit, **figs, "status": status, "ratios": ratios, "goals": goal_list,
             "spreads": {k: spread(v) for k, v in spreads.items()}, "runs": {k: len(v) for k, v in spreads.items()},
             "guest_cpu": gc, "errors": errs,
             "cmds": {p: cmds[(fio_w, p)] for p in paths if (fio_w, p) in cmds},
             "rblk_bench_workload": bench_w, "rblk_bench_cmd": cmds.get((bench_w, "rblk"))}
    shares = {p: statistics.median(blk_cpu[f"{fio_w}/{p}"]) for p in paths if f"{fio_w}/{p}" in blk_cpu}
    if shares:
        entry["target_cpu_share"] = shares
    block_summary[key] = entry
    block_rows.append((label, unit, paths, figs, spreads, status, errs, ratios, goal_list, shares, gc))


def fmt(x, unit):
    return f"{x:,.0f}" if unit == "ops/s" else f"{x:,.1f}"


def cell(xs, unit):
    if len(xs) == 1:
        return fmt(xs[0], unit)
    return f"{fmt(statistics.median(xs), unit)} ({fmt(min(xs), unit)}-{fmt(max(xs), unit)})"


def verdict(met):
    return "n/a" if met is None else ("met" if met else "MISSED")


out = []
head = (f"{'workload':<44} {'unit':<6} {'perftest median (min-max)':>27} {'rblk median (min-max)':>27} {'rblk/pt':>8}  "
        f"{'goal':<14} {'target cpu':>10} {'rblk cpu':>9}")
out.append(head)
out.append("-" * len(head))
for label, unit, pts, rb, ratio, op, goal, met, share, own, errs in rows:
    g = "" if goal is None else f"{op} {goal} {verdict(met)}"
    s = "" if share is None else f"{share * 100:.2f}%"
    o = "" if own is None else f"{own * 100:.0f}%"
    pc = cell(pts, unit) if pts else "FAILED"
    rc = cell(rb, unit) if rb else "FAILED"
    rt = "-" if ratio is None else f"{ratio:.3f}"
    out.append(f"{label:<44} {unit:<6} {pc:>27} {rc:>27} {rt:>8}  {g:<14} {s:>10} {o:>9}".rstrip())
    for e in errs:
        out.append(f"      error: {e[:150]}")

out.append("")
bhead = (f"{'block device: fio 4k, 1 job, libaio, direct':<46} {'unit':<6} {'median (min-max)':>25} "
         f"{'/nvmeof':>7} {'/bench':>7} {'guest us/IO':>11} {'vCPU busy':>9} {'q sleeps/IO':>11} {'target cpu':>10}  goal")
out.append(bhead)
out.append("-" * len(bhead))
names = dict(BLOCK_PATHS + [("rblk_bench", "rblk-bench (its rows above)")])
for label, unit, paths, figs, spreads, status, errs, ratios, goal_list, shares, gc in block_rows:
    out.append(label)
    for path in paths + ["rblk_bench"]:
        name = f"  {'bench' if path == 'rblk_bench' else path:<12} {names[path]}"
        vn = vb = gu = gb = qs = "-"
        if figs.get(path) is None:
            c = status[path] if status[path] != "failed" else "FAILED"
        else:
            c = cell(spreads[path], unit)
            rn = 1.0 if path == "nvmeof" else (figs[path] / figs["nvmeof"] if figs.get("nvmeof") else None)
            rb = figs[path] / figs["rblk_bench"] if figs.get("rblk_bench") else None
            vn = "-" if rn is None else f"{rn:.3f}"
            vb = "-" if rb is None else f"{rb:.3f}"
            g = gc.get(path) or {}
            if g.get("us_per_io") is not None:
                gu, gb = f"{g['us_per_io']:,.0f}", f"{g['busy_share'] * 100:.0f}%"
            if g.get("queue_sleeps_per_io") is not None:
                qs = f"{g['queue_sleeps_per_io']:.2f}"
        goal = "; ".join(f"{x['text']} {verdict(x['met'])}" for x in goal_list if x["path"] == path)
        s = f"{shares[path] * 100:.2f}%" if path in shares else ""
        out.append(f"{name:<46} {unit:<6} {c:>25} {vn:>7} {vb:>7} {gu:>11} {gb:>9} {qs:>11} {s:>10}  {goal}".rstrip())
        for e in errs.get(path, []):
            out.append(f"      error: {e[:150]}")
out.append("guest us/IO: busy time of all vCPUs (/proc/stat: user+nice+system+irq+softirq+steal) over a window "
           "inside the run's measured part (from 1.5 s after its start, SECS-1 s long, at least 1 s) / the I/Os "
           "completed in that window (the device's /sys/block/DEV/stat; for rblk-bench its IOPS x the window): "
           "everything the guest spent per I/O, fio's own share included. vCPU busy: that busy time / all vCPUs' "
           "time. q sleeps/IO: voluntary context switches of the rblk-q* queue threads per I/O in the window.")

# The goals of issue 23, all in one place.
out.append("")
met_n = sum(1 for g in goals_all if g["met"])
out.append(f"goals (medians of this boot): {met_n} of {len(goals_all)} met")
for g in goals_all:
    r = "-" if g["ratio"] is None else f"{g['ratio']:.3f}"
    out.append(f"  {g['label']:<58} ratio {r:>7}  {verdict(g['met'])}")

all_cpu = [x for xs in cpu.values() for x in xs]
idle = None
if "target_idle_cpu_ns" in meta:
    ns, wall = (int(x) for x in meta["target_idle_cpu_ns"].split())
    idle = ns / wall if wall else None
out.append("")
if all_cpu:
    out.append(
        f"target CPU during rblk runs (share of one core): median {statistics.median(all_cpu) * 100:.2f}%, "
        f"max {max(all_cpu) * 100:.2f}% over {len(all_cpu)} runs"
        + (f"; idle with no session: {idle * 100:.2f}%" if idle is not None else "")
    )
def clocksource_text(meta):
    start, end = meta.get("clocksource_start"), meta.get("clocksource_end")
    if not start:
        return "?"
    if end and end != start:
        return f"{start}, then {end} (clock reads became system calls: rounds before and after differ)"
    return start


out.append(
    f"{rounds} round(s) of {secs} s per run, interleaved; perftest bandwidth runs with '{bw_args}'; "
    f"guest kernel {meta.get('guest_kernel', '?')}, {meta.get('guest_cpus', '?')} vCPUs (qemu TCG, "
    f"idle vCPUs {meta.get('guest_idle') or 'halt'}, clock source {clocksource_text(meta)}), active MTU {meta.get('active_mtu', '?')}; {meta.get('perftest', '')}; {meta.get('rblk_bench', '')}"
)
blk_cpu_summary = {
    p: {"median": statistics.median(blk_cpu[p]), "max": max(blk_cpu[p]), "runs": len(blk_cpu[p])}
    for p in PATHS if p in blk_cpu
}
if blk_cpu_summary:
    out.append(
        "target CPU during block-device runs (share of one core, each whole fio run): "
        + ", ".join(f"{p} median {c['median'] * 100:.2f}% max {c['max'] * 100:.2f}%" for p, c in blk_cpu_summary.items())
    )
out.append(f"block devices: {meta.get('fio', 'fio ?')}; {meta.get('nvme_cli', '')}; {meta.get('nvmet', '')}")
if meta.get("libublk_null"):
    out.append(f"libublk-null: {meta['libublk_null']}")
out.append(f"guest run {meta.get('guest_run_secs', '?')} s (boot included), after {meta.get('guest_lock_wait_secs', '?')} s "
           f"waiting for the guest lock; host load average before {meta.get('host_load_before', '?')}, "
           f"after {meta.get('host_load_after', '?')}")
for p, why in unavailable.items():
    out.append(f"unavailable: {p}: {why}")
for x in fails:
    out.append(f"failed: {x['tool']} {x['workload']} (round {x['round']}): {x['error']}")
if not complete:
    why = ""
    if meta.get("guest_exit_status"):
        why = f": the guest run failed (exit status {meta['guest_exit_status']}; {meta.get('guest_failure') or '?'})"
    out.append(f"INCOMPLETE{why}; the rows after the last one it reported did not run (see {log_path})")
for n in notes:
    out.append(f"note: {n}")

# The QD1 per-stage timeline: scripts/timeline-rxe.sh's guest part ran in this boot; its own
# summary reads its raw output.
timeline = None
if "timeline-guest.log" in files:
    tdir = os.path.join(out_dir, "timeline")
    os.makedirs(tdir, exist_ok=True)
    tlog = os.path.join(tdir, "guest.log")
    with open(tlog, "w") as f:
        f.write("\n".join(files.pop("timeline-guest.log")) + "\n")
    for name in ("summary.json", "table.txt"):
        try:
            os.remove(os.path.join(tdir, name))
        except FileNotFoundError:
            pass
    proc = subprocess.run([timeline_script, "--redraw", tlog, tdir], stdout=subprocess.DEVNULL)
    timeline = {"summary": os.path.join(tdir, "summary.json"), "exit_status": proc.returncode, "paths": {}}
    try:
        with open(os.path.join(tdir, "table.txt")) as f:
            ttable = f.read().rstrip("\n")
        with open(os.path.join(tdir, "summary.json")) as f:
            tdoc = json.load(f)
        for p, r in tdoc.get("paths", {}).items():
            if "error" in r:
                timeline["paths"][p] = {"error": r["error"]}
                continue
            timeline["paths"][p] = {
                "total_block_us_median": (r.get("total_block_us") or {}).get("median_us"),
                "total_app_us_median": (r.get("total_app_us") or {}).get("median_us"),
                "io_uring_enter_per_io": r.get("io_uring_enter_per_io"),
                "switches_per_io": r.get("switches_per_io"), "ios": r.get("ios"),
            }
        out.append("")
        out.append(f"QD1 per-stage timeline (scripts/timeline-rxe.sh's guest part, in this boot; {tdir}):")
        out.append(ttable)
    except (OSError, ValueError) as e:
        timeline["error"] = f"no timeline summary: {e}"
        out.append("")
        out.append(f"QD1 per-stage timeline: FAILED ({timeline['error']}; see {tlog})")
else:
    timeline = {"error": "the guest sent no timeline output"}
    out.append("")
    out.append("QD1 per-stage timeline: FAILED (the guest sent no timeline output)")

table = "\n".join(out)
print(table)

doc = {
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "host": host_info(),
    "guest": {"kernel": meta.get("guest_kernel"), "cpus": int(meta.get("guest_cpus", "0") or 0), "accel": "tcg",
              "idle": meta.get("guest_idle") or "halt",
              "clocksource": [meta.get("clocksource_start"), meta.get("clocksource_end")], "active_mtu": meta.get("active_mtu"), "clk_tck": hz},
    "guest_run_secs": float(meta["guest_run_secs"]) if meta.get("guest_run_secs") else None,
    "guest_lock_wait_secs": float(meta["guest_lock_wait_secs"]) if meta.get("guest_lock_wait_secs") else None,
    "complete": complete,
    "guest_exit_status": int(meta["guest_exit_status"]) if meta.get("guest_exit_status") else 0,
    "guest_failure": meta.get("guest_failure"),
    "perftest": meta.get("perftest"),
    "rblk_bench": meta.get("rblk_bench"),
    "secs": secs,
    "rounds": rounds,
    "perftest_bw_args": bw_args,
    "workloads": summary,
    "notes": notes,
    "target_cpu_share": {
        "median": med(all_cpu), "max": max(all_cpu) if all_cpu else None, "runs": len(all_cpu), "idle": idle,
    },
    "fio": meta.get("fio"),
    "nvme_cli": meta.get("nvme_cli"),
    "nvmet": meta.get("nvmet"),
    "libublk_null": meta.get("libublk_null"),
    "block_devices": block_summary,
    "goals": goals_all,
    "goals_met": met_n,
    "goals_total": len(goals_all),
    "missing_goal_rows": missing,
    "unavailable": unavailable,
    "ublk_unavailable": unavailable.get("ublk"),
    "failures": fails,
    "target_cpu_share_block": blk_cpu_summary,
    "target_cpu_share_ublk": blk_cpu_summary.get("ublk"),
    "timeline": timeline,
}
with open(summary_path, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
with open(table_path, "w") as f:
    f.write(table + "\n")
# The files the guest sent, and each rblk-bench report of the last round (for the latency CDF).
for name, lines in files.items():
    with open(os.path.join(out_dir, name), "w") as f:
        f.write("\n".join(lines) + "\n")
for run in runs:
    if run["tool"] == "rblk" and run["round"] == rounds:
        with open(os.path.join(out_dir, f"rblk-{run['workload']}.json"), "w") as f:
            f.write(run["text"].strip() + "\n")
if missing:
    print("compare: error: goal rows missing (a goal row is ublk, nvmeof or rblk-bench): " + "; ".join(missing),
          file=sys.stderr)
    sys.exit(1)
if not complete:
    print(f"compare: error: the guest did not finish the comparison (see {log_path})", file=sys.stderr)
    sys.exit(1)
PY
}

# libublk 0.4.8's own examples/null, built from the crate's source in ~/.cargo/registry (a copy in
# build/libublk-null/, its own workspace and target directory), offline. The crate's
# dev-dependencies are all resolved to build an example; those examples/null.rs does not use are
# dropped, and env_logger and daemonize, which it does use but the offline registry lacks, get
# stand-ins (logging off; no daemon mode: it runs with --foreground). examples/null.rs itself is
# built unchanged. Sets LIBUBLK_NULL to the binary and LIBUBLK_NULL_INFO to how it was built, or
# LIBUBLK_NULL_WHY.
build_libublk_null() {
    local src dst=$REPO_ROOT/build/libublk-null crate how
    LIBUBLK_NULL="" LIBUBLK_NULL_WHY=""
    src=$(find "${CARGO_HOME:-$HOME/.cargo}"/registry/src -maxdepth 2 -type d -name libublk-0.4.8 2>/dev/null | head -n 1)
    if [[ -z $src ]]; then
        LIBUBLK_NULL_WHY="no libublk-0.4.8 crate source under ${CARGO_HOME:-$HOME/.cargo}/registry/src"
        return 1
    fi
    crate=$dst/libublk-0.4.8
    # The crate's source never changes: an earlier build from the same source is used again.
    if [[ -x $dst/target/release/examples/null && -s $dst/built-from ]] &&
        [[ $(sed -n 1p "$dst/built-from") == "$src" ]]; then
        LIBUBLK_NULL=$dst/target/release/examples/null
        LIBUBLK_NULL_INFO=$(sed -n 2p "$dst/built-from")
        log "using $LIBUBLK_NULL (built earlier from $src)"
        return 0
    fi
    rm -rf "$crate" "$dst/built-from"
    mkdir -p "$dst"
    cp -r "$src" "$crate"
    chmod -R u+w "$crate"
    printf '\n[workspace]\n' >>"$crate/Cargo.toml" # not a member of rblk's workspace
    log "building libublk 0.4.8's examples/null in $crate (offline)"
    if (cd "$crate" && CARGO_TARGET_DIR=$dst/target cargo build --offline --release --example null) \
        >"$dst/build.log" 2>&1; then
        how="as published"
    else
        mkdir -p "$dst/stand-ins/env_logger/src" "$dst/stand-ins/daemonize/src"
        printf '[package]\nname = "env_logger"\nversion = "0.9.99"\nedition = "2021"\n' >"$dst/stand-ins/env_logger/Cargo.toml"
        cat >"$dst/stand-ins/env_logger/src/lib.rs" <<'RS'
//! A stand-in for env_logger 0.9 (not in the offline registry): logging stays off.
pub struct Builder;
pub enum TimestampPrecision {
    Seconds,
}
pub fn builder() -> Builder {
    Builder
}
impl Builder {
    pub fn format_target(&mut self, _: bool) -> &mut Self {
        self
    }
    pub fn format_timestamp(&mut self, _: Option<TimestampPrecision>) -> &mut Self {
        self
    }
    pub fn init(&mut self) {}
}
RS
        printf '[package]\nname = "daemonize"\nversion = "0.5.99"\nedition = "2021"\n' >"$dst/stand-ins/daemonize/Cargo.toml"
        cat >"$dst/stand-ins/daemonize/src/lib.rs" <<'RS'
//! A stand-in for daemonize 0.5 (not in the offline registry): no daemon mode, use --foreground.
pub struct Daemonize;
pub struct Stdio;
impl Stdio {
    pub fn keep() -> Self {
        Stdio
    }
}
impl Daemonize {
    pub fn new() -> Self {
        Daemonize
    }
    pub fn stdout(self, _: Stdio) -> Self {
        self
    }
    pub fn stderr(self, _: Stdio) -> Self {
        self
    }
    pub fn start(self) -> Result<(), String> {
        Err("no daemon mode in this build: use --foreground".into())
    }
}
RS
        python3 - "$crate/Cargo.toml" <<'TOML' || {
import re, sys
path = sys.argv[1]
out, skip = [], False
for line in open(path).read().splitlines():
    m = re.match(r"^\[\[?([^\]]*)\]\]?\s*$", line)
    if m:
        # Keep clap (in the offline registry); drop the other dev-dependencies and the tests.
        skip = (m.group(1).startswith("dev-dependencies.") and m.group(1) != "dev-dependencies.clap"
                or line.strip() == "[[test]]")
    if not skip:
        out.append(line)
out += ['[dev-dependencies.env_logger]', 'path = "../stand-ins/env_logger"',
        '[dev-dependencies.daemonize]', 'path = "../stand-ins/daemonize"']
open(path, "w").write("\n".join(out) + "\n")
TOML
            LIBUBLK_NULL_WHY="cannot rewrite $crate/Cargo.toml"
            return 1
        }
        rm -f "$crate/Cargo.lock" # its versions are not all in the offline registry
        if ! (cd "$crate" && CARGO_TARGET_DIR=$dst/target cargo build --offline --release --example null) \
            >>"$dst/build.log" 2>&1; then
            LIBUBLK_NULL_WHY="cannot build libublk 0.4.8's examples/null offline: $(grep -m1 '^error' "$dst/build.log" || tail -n 1 "$dst/build.log")"
            return 1
        fi
        how="with stand-ins for env_logger and daemonize (not in the offline registry; logging off, run with --foreground)"
    fi
    LIBUBLK_NULL=$dst/target/release/examples/null
    LIBUBLK_NULL_INFO="libublk 0.4.8 examples/null built offline from $src $how: $LIBUBLK_NULL add -n ID -q 1 -d 32 --foreground"
    printf '%s\n%s\n' "$src" "$LIBUBLK_NULL_INFO" >"$dst/built-from"
    log "built $LIBUBLK_NULL"
}

host_main() {
    # Passed into the guest with the other RBLK_* variables (see the header, part 3).
    export RBLK_TIMELINE_SKIP_KPROBES="${RBLK_TIMELINE_SKIP_KPROBES-rxe_requester rxe_xmit_packet rxe_receiver rxe_responder rxe_completer}"
    local secs=${COMPARE_SECS:-5} rounds=${COMPARE_ROUNDS:-4} bw_args=${COMPARE_PERFTEST_BW_ARGS:--Q 1}
    local redraw=0
    while (($#)); do
        case $1 in
        --quick)
            secs=2 rounds=1
            ;;
        --redraw)
            redraw=1
            ;;
        *) help_or_usage_error "$1" ;;
        esac
        shift
    done
    is_count "$secs" || die "COMPARE_SECS must be a positive whole number of seconds (got '$secs')"
    is_count "$rounds" || die "COMPARE_ROUNDS must be a positive whole number (got '$rounds')"

    scripts/deps.sh
    local glog=$OUT/guest.log
    if ((redraw)); then
        [[ -s $glog ]] || die "no $glog to redraw from"
        summarize_run "$glog" "$OUT"
        draw
        finish_run "$glog"
        return 0
    fi
    release_bins rblk-target rblk-bench rblk rblk-test-client
    snapshot_bins "$OUT/bin" rblk-target rblk-bench rblk rblk-test-client
    LIBUBLK_NULL_INFO=""
    build_libublk_null || log "libublk-null rows unavailable: $LIBUBLK_NULL_WHY"
    mkdir -p "$OUT"
    rm -rf "$OUT"/summary.json "$OUT"/table.txt "$OUT"/*.png "$OUT"/bench* "$OUT"/rblk-*.json "$OUT"/timeline
    printf '@@meta secs %s\n@@meta rounds %s\n@@meta perftest_bw_args %s\n@@meta libublk_null %s\n' \
        "$secs" "$rounds" "$bw_args" "${LIBUBLK_NULL_INFO:-unavailable: $LIBUBLK_NULL_WHY}" >"$glog"
    log "$rounds round(s) of ${secs}s per run in one guest boot; raw output in $glog"
    # Generous: per round ~110 s at 5 s for the verbs rows, 23 fio runs of SECS + ~4 s and making
    # and removing 8 devices; the timeline; the boot.
    RBLK_BIN_DIR=$BIN_DIR RBLK_LIBUBLK_NULL=$LIBUBLK_NULL RBLK_LIBUBLK_NULL_WHY=$LIBUBLK_NULL_WHY \
        run_guest "$glog" $((600 + rounds * (500 + secs * 80))) "$REPO_ROOT/scripts/compare-rxe.sh" \
        "$secs" "$rounds" "$bw_args"
    summarize_run "$glog" "$OUT"
    draw
    finish_run "$glog"
}

# The charts, with scripts/plot.py (Debian's matplotlib, hence /usr/bin/python3). A chart whose
# input is missing (its rows failed) is left out, with a warning.
draw() {
    local title f
    title="scripts/compare-rxe.sh, $(date -u +%F)"
    plot() {
        /usr/bin/python3 scripts/plot.py "$@" || log "warning: scripts/plot.py $* failed"
    }
    [[ -s $OUT/summary.json ]] || return 0
    plot compare -o "$OUT/compare.png" --title "$title: rblk vs perftest and Linux NVMe-oF/RDMA on rxe" \
        "$OUT/summary.json"
    if [[ -s $OUT/bench_iops.1.log ]]; then
        plot series -o "$OUT/iops.png" --title "rblk-bench randread 4k QD32 over rxe, every ${LOG_INTERVAL_MS} ms" \
            "$OUT/bench_iops.1.log"
    else
        log "warning: no $OUT/bench_iops.1.log: no iops.png"
    fi
    local -a cdf=()
    for f in randread_4k_qd1 randread_4k_qd1_spin randread_4k_qd32 randwrite_4k_qd1 randwrite_4k_qd32; do
        [[ -s $OUT/rblk-$f.json ]] && cdf+=("$OUT/rblk-$f.json")
    done
    if ((${#cdf[@]})); then
        plot cdf -o "$OUT/latency-cdf.png" --title "rblk-bench latency over rxe (last round)" "${cdf[@]}"
    fi
    log "charts in $OUT: compare.png, iops.png, latency-cdf.png"
}

script_main 3 "SECS ROUNDS PERFTEST_BW_ARGS" "$@"
