#!/usr/bin/env bash
# rblk against raw verbs, side by side, on the same rxe device in ONE guest boot:
#
#   scripts/compare-rxe.sh [--quick]
#
# Builds the release binaries on the host, boots the rxe guest (scripts/rxe-guest.sh) once, and there
# runs perftest in loopback on rxe0 (server and client on the same device) and the matching
# rblk-bench runs against rblk-target, pair by pair, interleaved, COMPARE_ROUNDS times:
#
#   workload               perftest                                         rblk-bench
#   randread 4k QD32       ib_read_bw  -s 4096  -t 32 -o 32 -Q 1            --rw randread  --bs 4k  --iodepth 32
#   randwrite 4k QD32      ib_write_bw -s 4096  -t 32 -Q 1                  --rw randwrite --bs 4k  --iodepth 32
#   read 64k QD32          ib_read_bw  -s 65536 -t 32 -o 32 -Q 1            --rw read      --bs 64k --iodepth 32
#   write 64k QD32         ib_write_bw -s 65536 -t 32 -Q 1                  --rw write     --bs 64k --iodepth 32
#   randread 4k QD1 p50    ib_read_lat -s 4096 (t_typical)                  --rw randread  --iodepth 1 [--spin 1ms]
#   randwrite 4k QD1 p50   2 x ib_write_lat -s 4096 (t_typical)             --rw randwrite --iodepth 1 [--spin 1ms]
#
# What is compared, and why so:
# - Throughput in operations per second. perftest's -t is its send queue depth (the bench's
#   --iodepth) and -o its outstanding RDMA READs. -Q 1 signals every work request, as rblk's queue
#   does: with perftest's default completion moderation (-Q = -t at depth 32) it posts 32, waits for
#   all of them and posts again, so it would not keep 32 in flight (COMPARE_PERFTEST_BW_ARGS="-Q 8"
#   to try others). perftest runs -D SECS+2 with 1 s margins (-f 1); rblk-bench --ramp 1
#   --runtime SECS: both measure SECS seconds after a second of warm-up.
# - Latency at depth 1, in microseconds: ib_read_lat's t_typical is a full round trip, like a
#   one-sided read's completion. ib_write_lat reports HALF of a ping-pong, while a one-sided write
#   completes after a full round trip (its ACK): that row compares with 2 x ib_write_lat. perftest
#   busy-polls; rblk-bench is run twice, with the library's default spin (20 us, then it sleeps on
#   the completion channel) and with --spin 1ms (it polls like perftest).
# - The target's CPU over each rblk run (rblk-bench's STATS before and after), and its CPU while
#   idle with no session at all (the sum of its threads' /proc schedstat over SECS), for scale.
#
# Prints a table (workload, perftest and rblk medians with their min-max spread over the rounds,
# rblk/perftest, the goal) and writes build/compare/summary.json: for each workload
# {"perftest": x, "rblk": y, "ratio": y/x, "unit": "ops/s" | "us", ...spreads, commands, goal},
# plus the target's CPU share. Raw outputs: build/compare/guest.log. It fails only on errors
# (a tool that does not run or whose output does not parse), never on the figures.
#
# Options and environment:
#   --quick            1 round of 2 s (a CI smoke test that the comparison works)
#   COMPARE_SECS       measured seconds per run (default 5)
#   COMPARE_ROUNDS     rounds of every pair (default 4)
#   COMPARE_PERFTEST_BW_ARGS  extra perftest arguments for the bandwidth runs (default "-Q 1")
# About 110 s per round at 5 s, plus ~15 s of boot; TCG makes absolute figures meaningless and boots
# vary by ~10%: compare ratios from the same boot.
set -euo pipefail
shopt -s inherit_errexit

REPO_ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$REPO_ROOT"

OUT=build/compare
VOLUME_SIZE=256M
RBLK_PORT=7420

log() { printf 'compare: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
}

is_count() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }

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
    "$bin/rblk-target" --listen "$addr:$RBLK_PORT" --volume "v:$VOLUME_SIZE" 2>"$work/target.log" &
    tpid=$!
    # shellcheck disable=SC2064 # expand now: the trap must kill this target
    trap "kill -TERM $tpid 2>/dev/null || true" EXIT
    for _ in $(seq 1 300); do
        grep -q 'listening on' "$work/target.log" && break
        kill -0 "$tpid" 2>/dev/null || {
            cat "$work/target.log" >&2
            die "rblk-target exited"
        }
        sleep 0.1
    done
    grep -q 'listening on' "$work/target.log" || die "rblk-target did not start listening"

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
    # One perftest run of workload $1 in round $2: the tool and its arguments follow.
    run_perftest() {
        local w=$1 r=$2 out="$work/pt.out"
        shift 2
        perftest "$out" "$@" || die "perftest failed"
        log "  perftest $*: $(grep -A1 '#bytes' "$out" | tail -n 1 | tr -s ' \t' ' ')"
        emit "$w" perftest "$r" "$out" "$@" "${pt_cm[@]}"
    }
    # One rblk-bench run of workload $1 in round $2: rblk-bench's arguments follow.
    run_rblk() {
        local w=$1 r=$2 json="$work/rblk.json"
        shift 2
        rm -f "$json"
        "$bin/rblk-bench" "$uri" --device "$dev" --quiet --ramp 1 --runtime "$secs" --json "$json" "$@" |
            grep -E 'IOPS|percentiles|target cpu' | sed 's/^ */    /' >&2 ||
            die "rblk-bench $* failed"
        [[ -s $json ]] || die "rblk-bench $* wrote no JSON report"
        log "  rblk-bench $*: done"
        emit "$w" rblk "$r" "$json" rblk-bench "$@"
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

    log "warm-up (discarded): ib_read_bw and rblk-bench, 2 s each"
    perftest "$work/warm.out" ib_read_bw -s 4096 -t 32 -o 32 -D 4 -f 1 || die "perftest does not run here"
    "$bin/rblk-bench" "$uri" --device "$dev" --quiet --runtime 2 >/dev/null || die "rblk-bench does not run here"

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
        pair "$r" randwrite_4k_qd1 "$order" ib_write_lat -s 4096 -n "$write_iters" -- \
            --rw randwrite --bs 4k --iodepth 1
        run_rblk randwrite_4k_qd1_spin "$r" --rw randwrite --bs 4k --iodepth 1 --spin 1ms
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
]
# Which perftest runs a row compares with (the spin variants share the default runs').
PERFTEST_OF = {"randread_4k_qd1_spin": "randread_4k_qd1", "randwrite_4k_qd1_spin": "randwrite_4k_qd1"}


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
with open(log_path, errors="replace") as f:
    for raw in f:
        line = raw.rstrip("\r\n").replace("\r", "")
        if line.startswith("@@meta "):
            parts = line.split(" ", 2)
            meta[parts[1]] = parts[2] if len(parts) > 2 else ""
        elif line.startswith("@@begin "):
            w, tool, rnd, *cmd = line.split(" ")[1:]
            block = {"workload": w, "tool": tool, "round": int(rnd), "cmd": " ".join(cmd), "text": []}
        elif line.startswith("@@end ") and block is not None:
            block["text"] = "\n".join(block["text"])
            runs.append(block)
            block = None
        elif block is not None:
            block["text"].append(line)
if meta.get("complete") != "yes":
    fail(f"the guest did not finish the comparison (see {log_path})")

values = {}  # (workload, tool) -> [figure per round]
notes = []
cmds = {}
cpu = {}  # workload -> [target CPU share per rblk run]
for run in runs:
    key = (run["workload"], run["tool"])
    cmds[key] = run["cmd"]
    try:
        if run["tool"] == "perftest":
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
    except (ValueError, KeyError, TypeError) as e:
        fail(f"round {run['round']} {run['workload']} {run['tool']}: cannot parse the output: {e}\n{run['text']}")
    values.setdefault(key, []).append(v)


def spread(xs):
    return [min(xs), max(xs)]


rows, summary = [], {}
for key, label, unit, kind, rblk_w, (section, field), op, goal in WORKLOADS:
    pt_w = PERFTEST_OF.get(rblk_w, rblk_w)
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
        "perftest_cmd": ("2 x " if kind == "lat2" else "") + cmds[(pt_w, "perftest")],
        "rblk_cmd": cmds[(rblk_w, "rblk")],
    }
    if goal is not None:
        entry["goal"] = f"ratio {op} {goal}"
        entry["goal_met"] = met
    if rblk_w in cpu:
        entry["target_cpu_share"] = statistics.median(cpu[rblk_w])
    summary[key] = entry
    rows.append((label, unit, pts, rb, ratio, op, goal, met, entry.get("target_cpu_share")))


def fmt(x, unit):
    return f"{x:,.0f}" if unit == "ops/s" else f"{x:,.1f}"


def cell(xs, unit):
    return f"{fmt(statistics.median(xs), unit)} ({fmt(min(xs), unit)}-{fmt(max(xs), unit)})"


out = []
head = f"{'workload':<44} {'unit':<6} {'perftest median (min-max)':>27} {'rblk median (min-max)':>27} {'rblk/pt':>8}  {'goal':<14} {'target cpu':>10}"
out.append(head)
out.append("-" * len(head))
for label, unit, pts, rb, ratio, op, goal, met, share in rows:
    g = "" if goal is None else f"{op} {goal} {'met' if met else 'MISSED'}"
    s = "" if share is None else f"{share * 100:.2f}%"
    out.append(f"{label:<44} {unit:<6} {cell(pts, unit):>27} {cell(rb, unit):>27} {ratio:>8.3f}  {g:<14} {s:>10}")

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
}
with open(summary_path, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
with open(table_path, "w") as f:
    f.write(table + "\n")
PY
}

host_main() {
    local secs=${COMPARE_SECS:-5} rounds=${COMPARE_ROUNDS:-4} bw_args=${COMPARE_PERFTEST_BW_ARGS:--Q 1}
    while (($#)); do
        case $1 in
        --quick)
            secs=2 rounds=1
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
    if pgrep -f '^qemu-system' >/dev/null; then
        log "warning: another qemu is running on this machine: the figures will be disturbed"
    fi
    log "building release binaries"
    cargo build --release -p rblk-target -p rblk-bench
    mkdir -p "$OUT"
    rm -f "$OUT/summary.json" "$OUT/table.txt"
    local glog=$OUT/guest.log rc=0
    log "$rounds round(s) of ${secs}s per run in one guest boot; raw output in $glog"
    # Generous: about 110 s per round at 5 s, plus boot.
    RBLK_BIN_DIR=$REPO_ROOT/build/release RXE_GUEST_TIMEOUT=${RXE_GUEST_TIMEOUT:-$((300 + rounds * (60 + secs * 40)))} \
        scripts/rxe-guest.sh "$REPO_ROOT/scripts/compare-rxe.sh" --in-guest "$secs" "$rounds" "$bw_args" >"$glog" ||
        rc=$?
    ((rc == 0)) || die "the guest run failed (exit status $rc); see $glog"
    summarize "$glog" "$OUT/summary.json" "$OUT/table.txt" "$secs" "$rounds" "$bw_args"
    log "wrote $OUT/summary.json and $OUT/table.txt"
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
