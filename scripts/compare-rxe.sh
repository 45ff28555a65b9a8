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
# 2. Block devices: the same fio jobs on four block devices, one path after the other (the paths'
#    order rotates by one every round); each device is made, runs randwrite QD32 (first, so that
#    the reads read written blocks), randread QD32 and randread QD1, and is removed again:
#
#      fio --ioengine=libaio --direct=1 --bs=4k --numjobs=1 --size=256M --time_based
#          --ramp_time=1 --runtime=SECS --output-format=json  --rw=randwrite|randread --iodepth=32|1
#
#   path    device        what runs
#   nvmeof  /dev/nvmeXnY  Linux NVMe-oF/RDMA, for scale: null_blk (nr_devices=1 memory_backed=1
#                         gb=1, RAM) exported by nvmet + nvmet-rdma through configfs
#                         (/sys/kernel/config/nvmet: subsystem nqn.2024-12.io.rblk:compare,
#                         namespace 1, port rdma RBLK_ADDR:4420), once per boot; per round
#                         `nvme connect -t rdma -a RBLK_ADDR -s 4420 -n NQN -i 1` (one I/O queue)
#                         and `nvme disconnect -n NQN`
#   nbd     /dev/nbd0     `rblk nbd URI --listen unix:SOCK` + `nbd-client -unix SOCK /dev/nbd0
#                         -block-size 4096` (one connection); `nbd-client -d`, SIGTERM
#   fuse    /dev/loopN    `rblk mount URI DIR --queues 1 --loop --daemon` (FUSE file + loop device
#                         with direct I/O; one queue serves one request at a time); `rblk umount`
#   ublk    /dev/ublkbN   `rblk attach URI --queues 1 --depth 32 --daemon` (ublk_drv);
#                         `rblk detach /dev/ublkbN`. When the kernel has no ublk_drv or the rblk
#                         binary no `rblk attach`, this path is skipped: the guest prints
#                         `@@meta ublk unavailable: WHY`, and its figures and goals are missing
#                         (null in the JSON, "unavailable" in the table); nothing else fails.
#   The rblk paths (nbd, fuse, ublk) use the same rblk-target volume as rblk-bench, 256M.
#
# What is compared, and why so:
# - Throughput in operations per second. perftest's -t is its send queue depth (the bench's
#   --iodepth) and -o its outstanding RDMA READs. -Q 1 signals every work request, as rblk's queue
#   does: with perftest's default completion moderation (-Q = -t at depth 32) it posts 32, waits for
#   all of them and posts again, so it would not keep 32 in flight (COMPARE_PERFTEST_BW_ARGS="-Q 8"
#   to try others). perftest runs -D SECS+2 with 1 s margins (-f 1); rblk-bench --ramp 1
#   --runtime SECS: both measure SECS seconds after a second of warm-up, as fio does.
# - Latency at depth 1, in microseconds: ib_read_lat's t_typical is a full round trip, like a
#   one-sided read's completion. ib_write_lat reports HALF of a ping-pong, while a one-sided write
#   completes after a full round trip (its ACK): that row compares with 2 x ib_write_lat. perftest
#   busy-polls; rblk-bench is run twice, with the library's default spin (20 us, then it sleeps on
#   the completion channel) and with --spin 1ms (it polls like perftest). For the block devices,
#   fio's p50 completion latency (clat) at iodepth 1.
# - Every block-device workload is compared with the rblk-bench row of the same workload (4k
#   randread/randwrite QD32 IOPS; randread QD1 p50 with the default spin) from the same rounds.
#   Goals: ublk randread and randwrite QD32 >= 2 x NVMe-oF and >= 0.75 x rblk-bench; ublk
#   randread QD1 p50 <= 0.6 x NVMe-oF's.
# - rblk-bench's own CPU over each of its runs (its "cpu" report: what polling costs the
#   initiator), in the "rblk cpu" column.
# - The target's CPU over each rblk-bench run (rblk-bench's STATS before and after), over each fio
#   run on an rblk path (the sum of the target's threads' /proc schedstat before and after, taken
#   while the device's session is open; it includes fio's start and its ramp second), and while
#   idle with no session at all (the same sum over SECS), for scale.
#
# Prints two tables and writes build/compare/summary.json. The first: workload, perftest and rblk
# medians with their min-max spread over the rounds, rblk/perftest, the goal; in the JSON, for each
# workload {"perftest": x, "rblk": y, "ratio": y/x, "unit": "ops/s" | "us", ...spreads, commands,
# goal}, plus the target's CPU share. The second: each block-device workload with every path's
# median (min-max), its ratio to NVMe-oF and to rblk-bench, the goals and the target's CPU; in the
# JSON under "block_devices": {"block_randread_4k_qd32" | "block_randwrite_4k_qd32" |
# "block_randread_4k_qd1_p50": {"nvmeof", "nbd", "fuse", "ublk", "rblk_bench": median or null,
# "ratios": {"ublk_vs_nvmeof", "ublk_vs_rblk_bench", ...}, "goals": [{"goal", "ratio", "met"}],
# "spreads", "cmds", "target_cpu_share": {path: share}}}, plus "target_cpu_share_block" (per
# path) and "target_cpu_share_ublk" ({"median", "max", "runs"} or null), "ublk_unavailable" (why,
# or null). Raw outputs: build/compare/guest.log. It fails only on errors (a tool that does not
# run or whose output does not parse), never on the figures.
#
# Charts (scripts/plot.py, with /usr/bin/python3 and Debian's python3-matplotlib), in build/compare/:
#   compare.png      summary.json as bar charts: each ratio with its goal (plot.py compare)
#   iops.png         IOPS over time of one more rblk-bench run after the rounds, randread 4k QD32
#                    for SECS with --log --log-interval 100 (plot.py series bench_iops.1.log); that
#                    run's files are kept too: bench_iops.1.log, bench_bw.1.log, bench_lat.1.log,
#                    bench.hlog (HdrHistogram interval log), bench.json
#   latency-cdf.png  latency CDF and tail of the last round's rblk-bench reports of randread and
#                    randwrite 4k QD1 (default spin, and --spin 1ms for randread) and QD32
#                    (plot.py cdf), kept as rblk-WORKLOAD.json
#
# Options and environment:
#   --quick            1 round of 2 s (a CI smoke test that the comparison works)
#   --redraw           no guest: parse build/compare/guest.log of an earlier run again (give the
#                      same COMPARE_SECS, COMPARE_ROUNDS as that run), rewrite the tables and charts
#   COMPARE_SECS       measured seconds per run (default 5)
#   COMPARE_ROUNDS     rounds of every pair (default 4)
#   COMPARE_PERFTEST_BW_ARGS  extra perftest arguments for the bandwidth runs (default "-Q 1")
#   RBLK_BIN_DIR       take rblk-target, rblk-bench and rblk from this directory instead of building
#                      them (e.g. a build of a git worktree); default: cargo build --release
#                      --workspace --bins, then ${CARGO_TARGET_DIR:-build}/release
# Timing: COMPARE_ROUNDS=3 COMPARE_SECS=4 took 12.3 minutes on 2026-12-02 (about 4 minutes per
# round: the perftest/rblk-bench pairs and the rows without perftest, then the block devices, 12
# fio runs of SECS + ~3 s each plus making and removing the devices), plus ~15 s of boot, a few
# seconds of NVMe-oF setup and SECS + ~3 s for the --log run. TCG makes absolute
# figures meaningless and boots vary by ~10% (far more when the host is busy, and the kernel's block
# paths more than the verbs rows): compare ratios from the same boot, on an idle host.
set -euo pipefail
shopt -s inherit_errexit

REPO_ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
if [[ -n ${RBLK_BIN_DIR:-} && $RBLK_BIN_DIR != /* ]]; then
    RBLK_BIN_DIR=$PWD/$RBLK_BIN_DIR # relative to where we were started
fi
cd "$REPO_ROOT"

OUT=build/compare
VOLUME_SIZE=256M
LOG_INTERVAL_MS=100 # rblk-bench --log-interval of the picture run
RBLK_PORT=7420

SCRIPT_NAME=compare
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh"

# ---------------------------------------------------------------------------------------------------
# In the guest: run every pair, print raw results between markers on stdout for the host to parse.
#   @@meta KEY VALUE...
#   @@begin WORKLOAD TOOL ROUND CMD...      raw output (perftest's client, or rblk-bench's JSON)
#   @@end WORKLOAD TOOL ROUND
# Progress and the tools' own reports go to stderr.

guest_main() {
    local secs=$1 rounds=$2 bw_args=$3
    local bin=${RBLK_BIN_DIR:-$REPO_ROOT/build/release}
    local addr=${RBLK_ADDR:?RBLK_ADDR: the address of the rxe device} dev=${RBLK_DEVICE:-rxe0}
    local work tpid
    work=$(mktemp -d /tmp/rblk-compare.XXXXXX)
    local uri="rblk://$addr:$RBLK_PORT/v"
    local -a bw
    read -r -a bw <<<"$bw_args"

    printf '@@meta guest_kernel %s\n' "$(uname -r)"
    printf '@@meta guest_cpus %s\n' "$(nproc)"
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

    # The target's threads' CPU time so far, in ns (they all live as long as no session exists).
    target_ns() {
        local sum=0 ns _ t
        for t in /proc/"$tpid"/task/*/schedstat; do
            read -r ns _ <"$t" && sum=$((sum + ns))
        done
        echo "$sum"
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
    # One perftest run of workload $1 in round $2: the tool and its arguments follow.
    run_perftest() {
        local w=$1 r=$2 out="$work/pt.out"
        shift 2
        perftest "$out" "$@" || die "perftest failed"
        log "  perftest $*: $(grep -A1 '#bytes' "$out" | tail -n 1 | tr -s ' \t' ' ')"
        emit "$w" perftest "$r" "$out" "$@" "${pt_cm[@]}"
    }
    # rblk-bench against the volume as every measured run uses it: a second of ramp, then SECS.
    bench() {
        "$bin/rblk-bench" "$uri" --device "$dev" --quiet --ramp 1 --runtime "$secs" "$@"
    }
    # One rblk-bench run of workload $1 in round $2: rblk-bench's arguments follow.
    run_rblk() {
        local w=$1 r=$2 json="$work/rblk.json"
        shift 2
        rm -f "$json"
        bench --json "$json" "$@" |
            grep -E 'IOPS|percentiles|target cpu' | sed 's/^ */    /' >&2 ||
            die "rblk-bench $* failed"
        [[ -s $json ]] || die "rblk-bench $* wrote no JSON report"
        log "  rblk-bench $*: done"
        emit "$w" rblk "$r" "$json" rblk-bench "$@"
    }

    # rblk-test-client raw-lat (workload $1, round $2, $3 READs per second of SECS): raw-lat's
    # arguments (--depth, --threads) follow.
    run_raw() {
        local w=$1 r=$2 json="$work/raw.json" count=$((secs * $3))
        shift 3
        "$bin/rblk-test-client" raw-lat "$uri" --count "$count" "$@" >"$json" || die "rblk-test-client raw-lat $* failed"
        log "  rblk-test-client raw-lat $*: $(cat "$json")"
        emit "$w" rblk "$r" "$json" rblk-test-client raw-lat "$uri" --count "$count" "$@"
    }
    # Two rblk-bench processes at once (workload $1, round $2), each with the arguments that
    # follow; emits one report: IOPS and CPU summed, each latency figure the worse of the two.
    run_rblk_2proc() {
        local w=$1 r=$2 pid rc=0
        shift 2
        rm -f "$work/p1.json" "$work/p2.json"
        bench --json "$work/p1.json" "$@" >/dev/null 2>"$work/p1.err" &
        pid=$!
        bench --json "$work/p2.json" "$@" >/dev/null 2>"$work/p2.err" || rc=$?
        wait "$pid" || rc=$?
        ((rc == 0)) && [[ -s $work/p1.json && -s $work/p2.json ]] || {
            cat "$work/p1.err" "$work/p2.err" >&2
            die "two rblk-bench processes $* failed"
        }
        python3 - "$work/p1.json" "$work/p2.json" >"$work/2proc.json" <<'MERGE' || die "cannot merge the two reports"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
out = {"total": {"iops": a["total"]["iops"] + b["total"]["iops"]},
       "cpu": {"share_of_core": a["cpu"]["share_of_core"] + b["cpu"]["share_of_core"]},
       "target_cpu": a["target_cpu"]}
for d in ("read", "write"):
    la, lb = a[d]["lat_us"], b[d]["lat_us"]
    out[d] = {"lat_us": None if la is None or lb is None else {k: max(la[k], lb[k]) for k in la}}
print(json.dumps(out))
MERGE
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

    # --- Block devices: fio through four paths (see the header), one job, 4 KiB, libaio, O_DIRECT.
    local nqn=nqn.2024-12.io.rblk:compare mnt=$work/mnt
    local -a blk_paths=(nvmeof nbd fuse ublk)
    local blk_dev="" blk_pid="" ublk_why=""
    # Linux NVMe-oF/RDMA: nvmet-rdma exporting a memory-backed null_blk on the rxe address, once
    # (scripts/lib/target.sh).
    nvmeof_setup_once() {
        nvmeof_setup "$nqn" "$addr" || die "cannot set up Linux NVMe-oF/RDMA"
        printf '@@meta nvmet %s on /dev/nullb0 (null_blk memory_backed, 1 GiB), rdma port %s:4420\n' "$nqn" "$addr"
    }
    # Is ublk there (the kernel's ublk_drv and this binary's `rblk attach`)? Sets ublk_why if not.
    ublk_check() {
        local help
        if ! modprobe ublk_drv >&2 || [[ ! -e /dev/ublk-control ]]; then
            ublk_why="kernel $(uname -r) has no ublk_drv (/dev/ublk-control)"
        elif ! help=$("$bin/rblk" attach --help 2>&1); then
            ublk_why="this rblk has no 'rblk attach' ($("$bin/rblk" --version): $(head -n 1 <<<"$help"))"
        fi
        if [[ -n $ublk_why ]]; then
            printf '@@meta ublk unavailable: %s\n' "$ublk_why"
            log "ublk rows skipped: $ublk_why"
        fi
    }
    # Make path $1's block device: sets blk_dev (and blk_pid, the rblk process serving it).
    blk_attach() {
        local out
        blk_dev="" blk_pid=""
        case $1 in
        nvmeof)
            nvmeof_connect "$nqn" "$addr" || die "cannot connect to Linux NVMe-oF/RDMA"
            blk_dev=$NVMEOF_DEV
            ;;
        nbd)
            modprobe nbd >&2 || die "cannot load nbd"
            rm -f "$work/nbd.sock"
            "$bin/rblk" nbd "$uri" --device "$dev" --listen "unix:$work/nbd.sock" >"$work/nbd.out" 2>"$work/nbd.log" &
            blk_pid=$!
            for _ in $(seq 1 300); do
                grep -q '^rblk nbd: serving' "$work/nbd.out" && break
                kill -0 "$blk_pid" 2>/dev/null || break
                sleep 0.1
            done
            grep -q '^rblk nbd: serving' "$work/nbd.out" || {
                cat "$work/nbd.out" "$work/nbd.log" >&2
                die "rblk nbd did not start serving"
            }
            nbd-client -unix "$work/nbd.sock" /dev/nbd0 -block-size 4096 >&2 || die "nbd-client failed"
            blk_dev=/dev/nbd0
            ;;
        fuse)
            mkdir -p "$mnt"
            "$bin/rblk" mount "$uri" "$mnt" --device "$dev" --queues 1 --loop --daemon \
                >"$work/mount.out" 2>&1 || {
                cat "$work/mount.out" >&2
                die "rblk mount --loop --daemon failed"
            }
            blk_dev=$(grep -o '/dev/loop[0-9]*' "$work/mount.out" | head -n 1) || true
            blk_pid=$(sed -n 's/.*(pid \([0-9]*\).*/\1/p' "$work/mount.out" | head -n 1)
            [[ -n $blk_dev && -n $blk_pid ]] || {
                cat "$work/mount.out" >&2
                die "no loop device or pid in rblk mount's output"
            }
            ;;
        ublk)
            # A file, not $(...): the background server could keep a pipe open.
            "$bin/rblk" attach "$uri" --queues 1 --depth 32 --device "$dev" --daemon \
                >"$work/attach.out" 2>"$work/attach.log" || {
                cat "$work/attach.out" "$work/attach.log" >&2
                die "rblk attach --daemon failed"
            }
            blk_dev=$(sed -n 1p "$work/attach.out")
            blk_pid=$(sed -n '2s/^pid \([0-9][0-9]*\)$/\1/p' "$work/attach.out")
            [[ $blk_dev == /dev/ublkb* && -n $blk_pid ]] || {
                cat "$work/attach.out" >&2
                die "rblk attach printed no /dev/ublkbN and 'pid N' lines"
            }
            ;;
        esac
        wait_bdev "$blk_dev" || die "$1: $blk_dev did not appear as a block device"
        log "  $1: $blk_dev"
    }
    blk_detach() {
        case $1 in
        nvmeof)
            nvme disconnect -n "$nqn" >&2 || die "nvme disconnect failed"
            ;;
        nbd)
            nbd-client -d /dev/nbd0 >&2 || die "nbd-client -d failed"
            for _ in $(seq 1 300); do
                [[ -e /sys/block/nbd0/pid ]] || break
                sleep 0.1
            done
            kill -TERM "$blk_pid" 2>/dev/null || true
            local rc=0
            wait "$blk_pid" || rc=$?
            ((rc == 0)) || {
                cat "$work/nbd.log" >&2
                die "rblk nbd exited with status $rc after SIGTERM"
            }
            ;;
        fuse)
            "$bin/rblk" umount "$mnt" >&2 || die "rblk umount failed"
            wait_gone "$blk_pid" || die "rblk mount (pid $blk_pid) did not exit after rblk umount"
            ;;
        ublk)
            "$bin/rblk" detach "$blk_dev" >&2 || die "rblk detach $blk_dev failed"
            wait_gone "$blk_pid" || die "rblk attach (pid $blk_pid) did not exit after rblk detach"
            ;;
        esac
    }
    # One fio run of workload $1 through path $2 in round $3: fio's --rw and --iodepth follow.
    # For the paths served by rblk, the target's CPU over the run (its threads, session included).
    run_fio() {
        local w=$1 path=$2 r=$3 rw=$4 qd=$5 json="$work/fio.json" c0 c1 t0 t1
        local -a cmd=(fio --name="$w" --filename="$blk_dev" --ioengine=libaio --direct=1 --bs=4k --rw="$rw"
            --iodepth="$qd" --numjobs=1 --size="$VOLUME_SIZE" --time_based --ramp_time=1 --runtime="$secs"
            --output-format=json --output="$json")
        rm -f "$json"
        c0=$(target_ns) t0=${EPOCHREALTIME/./}
        timeout $((secs * 10 + 120)) "${cmd[@]}" >&2 || die "$path: ${cmd[*]} failed"
        c1=$(target_ns) t1=${EPOCHREALTIME/./}
        [[ -s $json ]] || die "$path: fio wrote no JSON report"
        if [[ $path != nvmeof ]]; then
            printf '@@cpu %s %s %s %s %s\n' "$w" "$path" "$r" "$((c1 - c0))" "$(((t1 - t0) * 1000))"
        fi
        log "  fio $path $rw QD$qd: done"
        emit "$w" "$path" "$r" "$json" "${cmd[@]}"
    }
    # Every block-device workload through every path, in round $1 (the paths' order rotates).
    block_round() {
        local r=$1 i path
        for i in 0 1 2 3; do
            path=${blk_paths[$(((i + r - 1) % 4))]}
            if [[ $path == ublk && -n $ublk_why ]]; then
                continue
            fi
            blk_attach "$path"
            run_fio fio_randwrite_4k_qd32 "$path" "$r" randwrite 32 # first: it fills what the reads read
            run_fio fio_randread_4k_qd32 "$path" "$r" randread 32
            run_fio fio_randread_4k_qd1 "$path" "$r" randread 1
            blk_detach "$path"
        done
    }

    log "warm-up (discarded): ib_read_bw and rblk-bench, 2 s each"
    perftest "$work/warm.out" ib_read_bw -s 4096 -t 32 -o 32 -D 4 -f 1 || die "perftest does not run here"
    "$bin/rblk-bench" "$uri" --device "$dev" --quiet --runtime 2 >/dev/null || die "rblk-bench does not run here"
    local tool
    for tool in fio nvme nbd-client losetup; do
        command -v "$tool" >/dev/null || die "no $tool here (scripts/deps.sh installs it)"
    done
    printf '@@meta fio %s\n' "$(fio --version)"
    printf '@@meta nvme_cli %s\n' "$(nvme version | head -n 1)"
    nvmeof_setup_once
    ublk_check

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
    nvmeof_teardown "$nqn" || die "cannot tear down Linux NVMe-oF/RDMA"

    # For the pictures: one more rblk-bench run with --log, sent to the host as files.
    local -a pic=(--rw randread --bs 4k --iodepth 32 --log "$work/bench" --log-interval "$LOG_INTERVAL_MS")
    log "rblk-bench ${pic[*]} (time series for build/compare/iops.png)"
    bench --json "$work/bench.json" "${pic[@]}" |
        grep -E 'IOPS|percentiles' | sed 's/^ */    /' >&2 || die "rblk-bench ${pic[*]} failed"
    local f
    for f in "$work"/bench_iops.1.log "$work"/bench_bw.1.log "$work"/bench_lat.1.log "$work"/bench.hlog "$work"/bench.json; do
        [[ -s $f ]] || die "rblk-bench --log wrote no $f"
        emit_file "${f##*/}" "$f"
    done

    kill -TERM "$tpid"
    local rc=0
    wait "$tpid" || rc=$?
    trap - EXIT
    ((rc == 0)) || {
        tail -n 20 "$work/target.log" >&2
        die "rblk-target exited with status $rc"
    }
    rm -rf "$work"
    printf '@@meta complete yes\n'
}

# ---------------------------------------------------------------------------------------------------
# On the host: parse the guest's output, print the table, write summary.json.

summarize() { # LOG SUMMARY_JSON TABLE_TXT SECS ROUNDS BW_ARGS
    python3 - "$@" <<'PY'
import datetime, json, os, platform, re, statistics, sys

log_path, summary_path, table_path, secs, rounds, bw_args = sys.argv[1:7]

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
# Which perftest runs a row compares with (the spin variants share the default runs').
# The rblk-bench workload an "rblkref" row compares with.
RBLK_REF_OF = {
    "randread_4k_2x16": "randread_4k_qd32",
    "randread_4k_2x16_poll": "randread_4k_qd32",
    "randread_4k_2proc": "randread_4k_qd32",
    "randread_4k_2x16_raw": "randread_4k_qd32_raw",
}
PERFTEST_OF = {
    "randread_4k_qd1_raw": "randread_4k_qd1",
    "randread_4k_qd1_spin": "randread_4k_qd1",
    "randwrite_4k_qd1_spin": "randwrite_4k_qd1",
}

# Block devices through fio: the paths, what each is, and the workloads with the rblk-bench row
# (and figure) each compares with, and its goals: (path, reference, op, factor).
BLOCK_PATHS = [
    ("nvmeof", "Linux NVMe-oF/RDMA (nvmet-rdma, null_blk)"),
    ("nbd", "rblk nbd + nbd-client, /dev/nbd0"),
    ("fuse", "rblk mount --loop, /dev/loopN"),
    ("ublk", "rblk attach (ublk), /dev/ublkbN"),
]
PATHS = [p for p, _ in BLOCK_PATHS]
BLOCK_WORKLOADS = [
    ("block_randread_4k_qd32", "randread 4k QD32", "ops/s", "fio_randread_4k_qd32", ("read", "iops"),
     "randread_4k_qd32", [("ublk", "nvmeof", ">=", 2.0), ("ublk", "rblk_bench", ">=", 0.75)]),
    ("block_randwrite_4k_qd32", "randwrite 4k QD32", "ops/s", "fio_randwrite_4k_qd32", ("write", "iops"),
     "randwrite_4k_qd32", [("ublk", "nvmeof", ">=", 2.0), ("ublk", "rblk_bench", ">=", 0.75)]),
    ("block_randread_4k_qd1_p50", "randread 4k QD1 p50", "us", "fio_randread_4k_qd1", ("read", "p50"),
     "randread_4k_qd1", [("ublk", "nvmeof", "<=", 0.6)]),
]


def fio_figure(text, section, field):
    """IOPS, or the p50 completion latency in us, of fio's JSON report (one job)."""
    job = json.loads(text[text.index("{"):])["jobs"][0]
    if job.get("error"):
        raise ValueError(f"fio reports error {job['error']}")
    if field == "iops":
        return float(job[section]["iops"])
    return float(job[section]["clat_ns"]["percentile"]["50.000000"]) / 1000.0


def fail(msg):
    print(f"compare: error: {msg}", file=sys.stderr)
    sys.exit(1)


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
blk_cpu = {}  # block path -> [target CPU share per fio run]
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
                fail(f"bad file name in the guest's output: {in_file!r}")
            files[in_file] = []
        elif line.startswith("@@meta "):
            parts = line.split(" ", 2)
            meta[parts[1]] = parts[2] if len(parts) > 2 else ""
        elif line.startswith("@@cpu "):
            w, path, rnd, ns, wall = line.split()[1:6]
            share = int(ns) / int(wall) if int(wall) else 0.0
            blk_cpu.setdefault(path, []).append(share)
            blk_cpu.setdefault(f"{w}/{path}", []).append(share)
        elif line.startswith("@@begin "):
            w, tool, rnd, *cmd = line.split(" ")[1:]
            block = {"workload": w, "tool": tool, "round": int(rnd), "cmd": " ".join(cmd), "text": []}
        elif line.startswith("@@end ") and block is not None:
            block["text"] = "\n".join(block["text"])
            runs.append(block)
            block = None
        elif block is not None:
            block["text"].append(line)
if in_file is not None:
    fail(f"the guest's file {in_file} has no @@endfile (see {log_path})")
if meta.get("complete") != "yes":
    fail(f"the guest did not finish the comparison (see {log_path})")

values = {}  # (workload, tool) -> [figure per round]
notes = []
cmds = {}
cpu = {}  # workload -> [target CPU share per rblk run]
own_cpu = {}  # workload -> [rblk-bench's own CPU share per run]
for run in runs:
    key = (run["workload"], run["tool"])
    cmds[key] = run["cmd"]
    try:
        if run["tool"] in PATHS:
            wl = next(b for b in BLOCK_WORKLOADS if b[3] == run["workload"])
            v = fio_figure(run["text"], *wl[4])
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
            report = json.loads(run["text"])
            v = report
            share = (report.get("target_cpu") or {}).get("share_of_core")
            if share is not None:
                cpu.setdefault(run["workload"], []).append(share)
            own = (report.get("cpu") or {}).get("share_of_core")
            if own is not None:
                own_cpu.setdefault(run["workload"], []).append(own)
    except (ValueError, KeyError, TypeError, IndexError, StopIteration) as e:
        fail(f"round {run['round']} {run['workload']} {run['tool']}: cannot parse the output: {e}\n{run['text']}")
    values.setdefault(key, []).append(v)


def spread(xs):
    return [min(xs), max(xs)]


rows, summary = [], {}
for key, label, unit, kind, rblk_w, (section, field), op, goal in WORKLOADS:
    pt_w = PERFTEST_OF.get(rblk_w, rblk_w)
    if kind == "rblkref":
        pt_w = RBLK_REF_OF[rblk_w]
        pts = [r[section]["lat_us"][field] for r in values.get((pt_w, "rblk"), [])]
    else:
        pts = values.get((pt_w, "perftest"))
    reports = values.get((rblk_w, "rblk"))
    if not pts or not reports:
        fail(f"no results for {key}")
    if kind == "lat2":
        pts = [2 * x for x in pts]
    if section == "total":
        rb = [r["total"]["iops"] for r in reports]
    else:
        rb = [r[section]["lat_us"][field] for r in reports]
    p, r = statistics.median(pts), statistics.median(rb)
    ratio = r / p if p else float("nan")
    met = None
    if goal is not None:
        met = ratio >= goal if op == ">=" else ratio <= goal
    entry = {
        "perftest": p, "rblk": r, "ratio": ratio, "unit": unit,
        "perftest_spread": spread(pts), "rblk_spread": spread(rb), "runs": min(len(pts), len(rb)),
        "perftest_cmd": ("2 x " if kind == "lat2" else "") + cmds[(pt_w, "rblk" if kind == "rblkref" else "perftest")],
        "rblk_cmd": cmds[(rblk_w, "rblk")],
    }
    if goal is not None:
        entry["goal"] = f"ratio {op} {goal}"
        entry["goal_met"] = met
    if rblk_w in cpu:
        entry["target_cpu_share"] = statistics.median(cpu[rblk_w])
    if rblk_w in own_cpu:
        entry["rblk_cpu_share"] = statistics.median(own_cpu[rblk_w])
    summary[key] = entry
    rows.append((label, unit, pts, rb, ratio, op, goal, met, entry.get("target_cpu_share"), entry.get("rblk_cpu_share")))

ublk_why = meta["ublk"][len("unavailable: "):] if meta.get("ublk", "").startswith("unavailable: ") else None
block_rows, block_summary = [], {}
for key, label, unit, fio_w, (section, field), bench_w, goals in BLOCK_WORKLOADS:
    figs, spreads = {}, {}
    for path in PATHS:
        xs = values.get((fio_w, path))
        if not xs:
            if path == "ublk" and ublk_why is not None:
                figs[path] = None
                continue
            fail(f"no {path} results for {key}")
        figs[path], spreads[path] = statistics.median(xs), xs
    reports = values.get((bench_w, "rblk"))
    if not reports:
        fail(f"no rblk-bench results for {key} ({bench_w})")
    bench = [r["total"]["iops"] for r in reports] if field == "iops" else [r[section]["lat_us"]["p50"] for r in reports]
    figs["rblk_bench"], spreads["rblk_bench"] = statistics.median(bench), bench

    def ratio(a, b):
        x, y = figs.get(a), figs.get(b)
        return x / y if x is not None and y else None

    ratios = {}
    for path in PATHS:
        if path != "nvmeof":
            ratios[f"{path}_vs_nvmeof"] = ratio(path, "nvmeof")
        ratios[f"{path}_vs_rblk_bench"] = ratio(path, "rblk_bench")
    goal_list = []
    for path, ref, op, factor in goals:
        x = ratio(path, ref)
        met = None if x is None else (x >= factor if op == ">=" else x <= factor)
        goal_list.append({"goal": f"{path}/{ref} {op} {factor}", "ratio": x, "met": met, "path": path,
                          "text": f"{op} {factor} x {'bench' if ref == 'rblk_bench' else ref}"})
    entry = {"unit": unit, **figs, "ratios": ratios, "goals": goal_list,
             "spreads": {k: spread(v) for k, v in spreads.items()}, "runs": {k: len(v) for k, v in spreads.items()},
             "cmds": {p: cmds[(fio_w, p)] for p in PATHS if (fio_w, p) in cmds},
             "rblk_bench_workload": bench_w, "rblk_bench_cmd": cmds[(bench_w, "rblk")]}
    shares = {p: statistics.median(blk_cpu[f"{fio_w}/{p}"]) for p in PATHS if f"{fio_w}/{p}" in blk_cpu}
    if shares:
        entry["target_cpu_share"] = shares
    block_summary[key] = entry
    block_rows.append((label, unit, figs, spreads, ratios, goal_list, shares))


def fmt(x, unit):
    return f"{x:,.0f}" if unit == "ops/s" else f"{x:,.1f}"


def cell(xs, unit):
    return f"{fmt(statistics.median(xs), unit)} ({fmt(min(xs), unit)}-{fmt(max(xs), unit)})"


out = []
head = (f"{'workload':<44} {'unit':<6} {'perftest median (min-max)':>27} {'rblk median (min-max)':>27} {'rblk/pt':>8}  "
        f"{'goal':<14} {'target cpu':>10} {'rblk cpu':>9}")
out.append(head)
out.append("-" * len(head))
for label, unit, pts, rb, ratio, op, goal, met, share, own in rows:
    g = "" if goal is None else f"{op} {goal} {'met' if met else 'MISSED'}"
    s = "" if share is None else f"{share * 100:.2f}%"
    o = "" if own is None else f"{own * 100:.0f}%"
    out.append(f"{label:<44} {unit:<6} {cell(pts, unit):>27} {cell(rb, unit):>27} {ratio:>8.3f}  {g:<14} {s:>10} {o:>9}".rstrip())

out.append("")
bhead = (f"{'block device: fio 4k, 1 job, libaio, direct':<52} {'unit':<6} {'median (min-max)':>27} "
         f"{'/nvmeof':>8} {'/bench':>8}  {'goal':<46} {'target cpu':>10}")
out.append(bhead)
out.append("-" * len(bhead))
for label, unit, figs, spreads, ratios, goal_list, shares in block_rows:
    out.append(label)
    for path, what in BLOCK_PATHS + [("rblk_bench", "rblk-bench (its row above)")]:
        name = f"  {path if path != 'rblk_bench' else 'bench':<7} {what}"
        if figs.get(path) is None:
            c, vn, vb = "unavailable", "-", "-"
        else:
            c = cell(spreads[path], unit)
            rn = ratios.get(f"{path}_vs_nvmeof") if path != "nvmeof" else 1.0
            if path == "rblk_bench":
                rn = figs["rblk_bench"] / figs["nvmeof"] if figs["nvmeof"] else None
            rb = ratios.get(f"{path}_vs_rblk_bench") if path != "rblk_bench" else 1.0
            vn = "-" if rn is None else f"{rn:.3f}"
            vb = "-" if rb is None else f"{rb:.3f}"
        g = "; ".join(f"{x['text']} {'n/a' if x['met'] is None else ('met' if x['met'] else 'MISSED')}"
                      for x in goal_list if x["path"] == path)
        s = f"{shares[path] * 100:.2f}%" if path in shares else ""
        out.append(f"{name:<52} {unit:<6} {c:>27} {vn:>8} {vb:>8}  {g:<46} {s:>10}".rstrip())

all_cpu = [x for xs in cpu.values() for x in xs]
idle = None
if "target_idle_cpu_ns" in meta:
    ns, wall = (int(x) for x in meta["target_idle_cpu_ns"].split())
    idle = ns / wall if wall else None
out.append("")
out.append(
    f"target CPU during rblk runs (share of one core): median {statistics.median(all_cpu) * 100:.2f}%, "
    f"max {max(all_cpu) * 100:.2f}% over {len(all_cpu)} runs"
    + (f"; idle with no session: {idle * 100:.2f}%" if idle is not None else "")
)
out.append(
    f"{rounds} round(s) of {secs} s per run, interleaved; perftest bandwidth runs with '{bw_args}'; "
    f"guest kernel {meta.get('guest_kernel', '?')}, {meta.get('guest_cpus', '?')} vCPUs (qemu TCG), "
    f"active MTU {meta.get('active_mtu', '?')}; {meta.get('perftest', '')}; {meta.get('rblk_bench', '')}"
)
blk_cpu_summary = {
    p: {"median": statistics.median(blk_cpu[p]), "max": max(blk_cpu[p]), "runs": len(blk_cpu[p])}
    for p in PATHS if p in blk_cpu
}
out.append(
    "target CPU during block-device runs (share of one core, each whole fio run): "
    + ", ".join(f"{p} median {c['median'] * 100:.2f}% max {c['max'] * 100:.2f}%" for p, c in blk_cpu_summary.items())
    + ("" if "ublk" in blk_cpu_summary else "; ublk: no runs")
)
out.append(f"block devices: {meta.get('fio', 'fio ?')}; {meta.get('nvme_cli', '')}; {meta.get('nvmet', '')}")
if ublk_why is not None:
    out.append(f"ublk unavailable: {ublk_why}")
for n in notes:
    out.append(f"note: {n}")
table = "\n".join(out)
print(table)

cpu_model = ""
try:
    with open("/proc/cpuinfo") as f:
        cpu_model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
except OSError:
    pass
doc = {
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "host": {"cpu": cpu_model, "cpus": os.cpu_count(), "kernel": platform.release()},
    "guest": {"kernel": meta.get("guest_kernel"), "cpus": int(meta.get("guest_cpus", "0") or 0), "accel": "tcg",
              "active_mtu": meta.get("active_mtu")},
    "perftest": meta.get("perftest"),
    "rblk_bench": meta.get("rblk_bench"),
    "secs": int(secs),
    "rounds": int(rounds),
    "perftest_bw_args": bw_args,
    "workloads": summary,
    "notes": notes,
    "target_cpu_share": {
        "median": statistics.median(all_cpu), "max": max(all_cpu), "runs": len(all_cpu), "idle": idle,
    },
    "fio": meta.get("fio"),
    "nvme_cli": meta.get("nvme_cli"),
    "nvmet": meta.get("nvmet"),
    "block_devices": block_summary,
    "ublk_unavailable": ublk_why,
    "target_cpu_share_block": blk_cpu_summary,
    "target_cpu_share_ublk": blk_cpu_summary.get("ublk"),
}
with open(summary_path, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
with open(table_path, "w") as f:
    f.write(table + "\n")
# The files the guest sent, and each rblk-bench report of the last round (for the latency CDF).
out_dir = os.path.dirname(summary_path)
for name, lines in files.items():
    with open(os.path.join(out_dir, name), "w") as f:
        f.write("\n".join(lines) + "\n")
for run in runs:
    if run["tool"] == "rblk" and run["round"] == int(rounds):
        with open(os.path.join(out_dir, f"rblk-{run['workload']}.json"), "w") as f:
            f.write(run["text"].strip() + "\n")
PY
}

host_main() {
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
        -h | --help)
            usage
            exit 0
            ;;
        *)
            usage >&2
            exit 2
            ;;
        esac
        shift
    done
    is_count "$secs" || die "COMPARE_SECS must be a positive whole number of seconds (got '$secs')"
    is_count "$rounds" || die "COMPARE_ROUNDS must be a positive whole number (got '$rounds')"

    scripts/deps.sh
    if ((redraw)); then
        [[ -s $OUT/guest.log ]] || die "no $OUT/guest.log to redraw from"
        summarize "$OUT/guest.log" "$OUT/summary.json" "$OUT/table.txt" "$secs" "$rounds" "$bw_args"
        draw
        return 0
    fi
    if pgrep -f '^qemu-system' >/dev/null; then
        log "warning: another qemu is running on this machine: the figures will be disturbed"
    fi
    local bin_dir=${RBLK_BIN_DIR:-}
    if [[ -n $bin_dir ]]; then
        bin_dir=$(cd -- "$bin_dir" && pwd -P) || die "RBLK_BIN_DIR=$RBLK_BIN_DIR is not a directory"
        log "using the binaries in $bin_dir (RBLK_BIN_DIR; not building)"
    else
        log "building release binaries"
        cargo build --release --workspace --bins
        bin_dir=${CARGO_TARGET_DIR:-$REPO_ROOT/build}/release
    fi
    local b
    for b in rblk-target rblk-bench rblk rblk-test-client; do
        [[ -x $bin_dir/$b ]] || die "no $bin_dir/$b"
    done
    mkdir -p "$OUT"
    rm -f "$OUT"/summary.json "$OUT"/table.txt "$OUT"/*.png "$OUT"/bench* "$OUT"/rblk-*.json
    local glog=$OUT/guest.log rc=0
    log "$rounds round(s) of ${secs}s per run in one guest boot; raw output in $glog"
    # Generous: about 110 s per round at 5 s for the verbs rows, plus the block devices, plus boot.
    RBLK_BIN_DIR=$bin_dir RXE_GUEST_TIMEOUT=${RXE_GUEST_TIMEOUT:-$((300 + rounds * (300 + secs * 55)))} \
        scripts/rxe-guest.sh "$REPO_ROOT/scripts/compare-rxe.sh" --in-guest "$secs" "$rounds" "$bw_args" >"$glog" ||
        rc=$?
    ((rc == 0)) || die "the guest run failed (exit status $rc); see $glog"
    summarize "$glog" "$OUT/summary.json" "$OUT/table.txt" "$secs" "$rounds" "$bw_args"
    log "wrote $OUT/summary.json and $OUT/table.txt"
    draw
}

# The charts, with scripts/plot.py (Debian's matplotlib, hence /usr/bin/python3).
draw() {
    local title
    title="scripts/compare-rxe.sh, $(date -u +%F)"
    plot() {
        /usr/bin/python3 scripts/plot.py "$@" || die "scripts/plot.py $* failed"
    }
    plot compare -o "$OUT/compare.png" --title "$title: rblk vs perftest and Linux NVMe-oF/RDMA on rxe" \
        "$OUT/summary.json"
    plot series -o "$OUT/iops.png" --title "rblk-bench randread 4k QD32 over rxe, every ${LOG_INTERVAL_MS} ms" \
        "$OUT/bench_iops.1.log"
    plot cdf -o "$OUT/latency-cdf.png" --title "rblk-bench latency over rxe (last round)" \
        "$OUT/rblk-randread_4k_qd1.json" "$OUT/rblk-randread_4k_qd1_spin.json" "$OUT/rblk-randread_4k_qd32.json" \
        "$OUT/rblk-randwrite_4k_qd1.json" "$OUT/rblk-randwrite_4k_qd32.json"
    log "wrote $OUT/compare.png, $OUT/iops.png and $OUT/latency-cdf.png"
}

case ${1:-} in
--in-guest)
    shift
    (($# == 3)) || die "usage: $0 --in-guest SECS ROUNDS PERFTEST_BW_ARGS"
    guest_main "$@"
    ;;
*)
    host_main "$@"
    ;;
esac
