#!/usr/bin/env bash
# Before/after: `rblk attach`'s own CPU per I/O and its IOPS, for two builds of rblk's binaries, in
# ONE rxe guest boot:
#
#   scripts/ab-attach.sh OLD_BIN_DIR NEW_BIN_DIR [--rounds N] [--secs S] [--target old|new]
#   scripts/ab-attach.sh --redraw        # no guest: summarize build/ab-attach/guest.log again
#
# OLD_BIN_DIR and NEW_BIN_DIR each hold release builds of `rblk-target` and `rblk` (e.g.
# build/release of two git worktrees; the same directory twice measures the harness's own noise).
# Nothing is built here.
#
# What runs: scripts/rxe-guest.sh boots the rxe guest (6.12: it needs ublk_drv) once, under
# `flock /tmp/rblk-guest.lock` (one guest at a time on this machine; RBLK_GUEST_LOCK=PATH to use
# another lock file, RBLK_GUEST_LOCK= to take none; a caller that holds it already is noticed). In the
# guest, ONE rblk-target (NEW's by default, --target old for OLD's: the data path is one-sided, so
# the target's CPU is ~0 whichever it is) serves a 256M RAM volume on the rxe address. Then, for
# every round, each build in turn (odd rounds OLD first, even rounds NEW first), with that build's
# own `rblk`:
#
#   rblk attach rblk://ADDR:7420/v --queues 1 --depth 32 --device rxe0 --daemon   (prints DEV; the pid on stderr)
#   2 s idle: the attach process's CPU with no I/O, for information
#   fio --name=W --filename=DEV --ioengine=libaio --direct=1 --bs=4k --numjobs=1 --size=256M
#       --time_based --runtime=SECS --output-format=json --rw=randwrite --iodepth=32
#   the same with --rw=randread
#   rblk detach DEV, and wait until the attach process has exited
#
# A discarded warm-up (each build attached once, 2 s of randwrite) comes before round 1.
#
# What is measured, and why so:
# - IOPS: fio's JSON `jobs[0].write.iops` / `jobs[0].read.iops`.
# - CPU per I/O of the attach process (the ublk server: all its threads, io_uring workers included):
#   its utime + stime (/proc/PID/stat fields 14 and 15, clock ticks of `getconf CLK_TCK`) read just
#   before fio starts and just after it exits; (delta / CLK_TCK) / total I/Os completed, where the
#   total is fio's `total_ios`. The CPU window must cover the same interval as the I/O count, so fio
#   runs here WITHOUT --ramp_time (compare-rxe.sh's rows have --ramp_time=1, whose I/Os fio leaves
#   out of its counts but which the CPU window would include). The window also holds fio's own
#   start and exit (a few hundred ms under TCG) with no I/O in flight: that adds the attach
#   process's idle CPU, which the 2 s idle reading shows to be small (or not). As a cross-check with
#   ns resolution, the sum of its threads' /proc/PID/task/*/schedstat run time over the same
#   window ("sched us/IO" in the table; it misses threads that exit within the window).
# - fio's completion latency p50 (clat, us), for information.
# - Per build and workload: median over the rounds and the spread (min-max); the ratio new/old of
#   the medians. IOPS new/old > 1 and CPU new/old < 1 are improvements.
#
# Prints the table on the host and writes build/ab-attach/summary.json (every run, each failure
# with its error, medians, spreads, ratios) and build/ab-attach/table.txt; the guest's raw output
# (fio's JSON reports between markers) is build/ab-attach/guest.log. A round that fails (attach,
# fio, detach) is recorded with its error and the run goes on; figures of the jobs that did
# complete in a failed round still count. Exit status: 0 when every build has at least one round
# whose attach and both fio jobs succeeded; 1 otherwise, or when the guest run failed.
#
# Timing: about 15 s of boot, then per round and build SECS + ~4 s per fio job, ~2-5 s to attach
# and detach and 2 s idle: --rounds 3 --secs 10 took 4 minutes (241 s of guest run) on 2026-12-02,
# --rounds 1 --secs 2 35 s, the kernel already downloaded. TCG makes absolute figures
# meaningless and they swing with the host's load (another qemu, a cargo build): compare the
# ratios from the same boot, on an idle host, and look at the spreads. utime/stime are sampled
# at the tick (CLK_TCK, usually 100 Hz): over SECS seconds that is fine for CPU shares above a
# few percent.
set -euo pipefail
shopt -s inherit_errexit

REPO_ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
CALLER_PWD=$PWD
cd "$REPO_ROOT"

OUT=build/ab-attach
VOLUME_SIZE=256M
RBLK_PORT=7420
WARMUP_SECS=2
IDLE_SECS=2
BUILDS=(old new)
WORKLOADS=(randwrite randread) # randwrite first: the reads then read written blocks

SCRIPT_NAME=ab-attach
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh"

# ---------------------------------------------------------------------------------------------------
# In the guest: the rounds; raw results on stdout between markers, for the host to parse.
#   @@meta KEY VALUE...
#   @@idle BUILD ROUND TICKS SCHED_NS WALL_NS           the attach process idle for IDLE_SECS
#   @@begin BUILD ROUND WORKLOAD TICKS SCHED_NS WALL_NS CMD...   fio's JSON report follows
#   @@end
#   @@fail BUILD ROUND STEP MESSAGE                     STEP: attach, randwrite, randread, detach
# Round 0 is the warm-up. Progress goes to stderr.

guest_main() {
    local secs=$1 rounds=$2 target_build=$5
    local -A bin=([old]=$3 [new]=$4)
    local addr=${RBLK_ADDR:?RBLK_ADDR: the address of the rxe device} dev=${RBLK_DEVICE:-rxe0}
    local uri="rblk://$addr:$RBLK_PORT/v" work tpid hz b
    work=$(mktemp -d /tmp/rblk-ab.XXXXXX)
    hz=$(getconf CLK_TCK)

    printf '@@meta guest_kernel %s\n' "$(uname -r)"
    printf '@@meta guest_cpus %s\n' "$(nproc)"
    printf '@@meta clk_tck %s\n' "$hz"
    command -v fio >/dev/null || die "no fio here (scripts/deps.sh installs it)"
    printf '@@meta fio %s\n' "$(fio --version)"
    for b in "${BUILDS[@]}"; do
        printf '@@meta version_%s %s\n' "$b" "$({ "${bin[$b]}/rblk" --version 2>&1 || true; } | head -n 1)"
    done
    modprobe ublk_drv >&2 || true
    [[ -e /dev/ublk-control ]] || die "kernel $(uname -r) has no ublk_drv (/dev/ublk-control)"

    log "starting ${bin[$target_build]}/rblk-target --listen $addr:$RBLK_PORT --volume v:$VOLUME_SIZE"
    # shellcheck source=lib/target.sh
    source "$REPO_ROOT/scripts/lib/target.sh"
    start_target "$work/target.log" "${bin[$target_build]}" 30 --listen "$addr:$RBLK_PORT" \
        --volume "v:$VOLUME_SIZE" || die "rblk-target did not start"
    tpid=$TARGET_PID
    # shellcheck disable=SC2064 # expand now: the trap must kill this target
    trap "kill -TERM $tpid 2>/dev/null || true" EXIT
    printf '@@meta target %s/rblk-target (%s)\n' "${bin[$target_build]}" "$target_build"

    # One line of at most 400 characters from the files given (for @@fail).
    oneline() { cat "$@" 2>/dev/null | tr -s '\r\n\t' '   ' | cut -c1-400; }
    # utime + stime of process $1, all its threads (/proc/PID/stat fields 14 and 15), in ticks.
    # The comm field (2) may hold spaces and parentheses: the fields after its last ')' start at 3.
    proc_ticks() {
        local line rest
        local -a f
        read -r line <"/proc/$1/stat" || return 1
        rest=${line##*) }
        read -r -a f <<<"$rest"
        echo $((f[11] + f[12]))
    }
    # The run time of process $1's live threads, in ns (first field of each task's schedstat).
    proc_sched_ns() {
        local sum=0 ns _ t
        for t in /proc/"$1"/task/*/schedstat; do
            read -r ns _ <"$t" 2>/dev/null && sum=$((sum + ns))
        done
        echo "$sum"
    }
    fail() { # BUILD ROUND STEP MESSAGE
        printf '@@fail %s %s %s %s\n' "$1" "$2" "$3" "$4"
        log "  FAILED: $1 round $2 $3: $4"
    }

    local blk_dev blk_pid
    # Attach with build $1's rblk (round $2): sets blk_dev and blk_pid, or records the failure.
    attach() {
        local b=$1 r=$2
        blk_dev="" blk_pid=""
        # A file, not $(...): the background server could keep a pipe open.
        if ! timeout 120 "${bin[$b]}/rblk" attach "$uri" --queues 1 --depth 32 --device "$dev" --daemon \
            >"$work/attach.out" 2>"$work/attach.log"; then
            fail "$b" "$r" attach "rblk attach --daemon failed: $(oneline "$work/attach.out" "$work/attach.log")"
            return 1
        fi
        blk_dev=$(sed -n 1p "$work/attach.out")
        # This rblk says its pid on stderr; an older one on stdout's second line.
        blk_pid=$(sed -n 's/^rblk: pid \([0-9][0-9]*\) serves .*/\1/p' "$work/attach.log")
        [[ -n $blk_pid ]] || blk_pid=$(sed -n '2s/^pid \([0-9][0-9]*\)$/\1/p' "$work/attach.out")
        if [[ $blk_dev != /dev/ublkb* || -z $blk_pid ]]; then
            fail "$b" "$r" attach "rblk attach printed no /dev/ublkbN line (stdout) and 'rblk: pid N serves' line (stderr): $(oneline "$work/attach.out")"
            [[ -n $blk_pid ]] && kill -TERM "$blk_pid" 2>/dev/null && wait_gone "$blk_pid"
            return 1
        fi
        if ! wait_bdev "$blk_dev"; then
            fail "$b" "$r" attach "$blk_dev did not appear as a block device"
            detach "$b" "$r" || true
            return 1
        fi
    }
    # Detach build $1's device (round $2); records a failure and kills the attach process if need be.
    detach() {
        local b=$1 r=$2
        if ! timeout 60 "${bin[$b]}/rblk" detach "$blk_dev" >"$work/detach.log" 2>&1; then
            fail "$b" "$r" detach "rblk detach $blk_dev failed: $(oneline "$work/detach.log")"
            kill -TERM "$blk_pid" 2>/dev/null || true
        fi
        if ! wait_gone "$blk_pid"; then
            fail "$b" "$r" detach "rblk attach (pid $blk_pid) did not exit after rblk detach: SIGKILL"
            kill -KILL "$blk_pid" 2>/dev/null || true
            wait_gone "$blk_pid" || true
            return 1
        fi
    }
    # fio workload $3 (randwrite|randread) for $4 s on build $1's device, round $2; the attach
    # process's CPU over exactly fio's lifetime.
    run_fio() {
        local b=$1 r=$2 rw=$3 s=$4 json="$work/fio.json" c0 c1 n0 n1 t0 t1 rc=0
        local -a cmd=(fio --name="${rw}_4k_qd32" --filename="$blk_dev" --ioengine=libaio --direct=1 --bs=4k
            --numjobs=1 --size="$VOLUME_SIZE" --time_based --runtime="$s" --output-format=json
            --rw="$rw" --iodepth=32)
        rm -f "$json"
        if ! c0=$(proc_ticks "$blk_pid") || ! n0=$(proc_sched_ns "$blk_pid"); then
            fail "$b" "$r" "$rw" "rblk attach (pid $blk_pid) is gone before fio"
            return 1
        fi
        t0=${EPOCHREALTIME/./}
        timeout $((s * 10 + 120)) "${cmd[@]}" --output="$json" >"$work/fio.err" 2>&1 || rc=$?
        t1=${EPOCHREALTIME/./}
        if ! c1=$(proc_ticks "$blk_pid") || ! n1=$(proc_sched_ns "$blk_pid"); then
            fail "$b" "$r" "$rw" "rblk attach (pid $blk_pid) exited during fio (fio status $rc): $(oneline "$work/fio.err")"
            return 1
        fi
        if ((rc != 0)) || [[ ! -s $json ]]; then
            fail "$b" "$r" "$rw" "fio exited with status $rc: $(oneline "$work/fio.err" "$json")"
            return 1
        fi
        printf '@@begin %s %s %s %s %s %s %s\n' "$b" "$r" "${rw}_4k_qd32" "$((c1 - c0))" "$((n1 - n0))" \
            "$(((t1 - t0) * 1000))" "${cmd[*]}"
        cat "$json"
        printf '\n@@end\n'
    }
    # One attach of build $1 in round $2 (0: the warm-up) with fio jobs of $3 s each: WORKLOAD... follow.
    one_build() {
        local b=$1 r=$2 s=$3 c0 c1 n0 n1 t0 t1 w
        shift 3
        if ((r > 0)); then log "round $r/$rounds: $b (${bin[$b]}/rblk)"; else log "warm-up: $b (${bin[$b]}/rblk)"; fi
        attach "$b" "$r" || return 0
        log "  $blk_dev, pid $blk_pid"
        if ((r > 0)) && c0=$(proc_ticks "$blk_pid") && n0=$(proc_sched_ns "$blk_pid"); then
            t0=${EPOCHREALTIME/./}
            sleep "$IDLE_SECS"
            t1=${EPOCHREALTIME/./}
            if c1=$(proc_ticks "$blk_pid") && n1=$(proc_sched_ns "$blk_pid"); then
                printf '@@idle %s %s %s %s %s\n' "$b" "$r" "$((c1 - c0))" "$((n1 - n0))" "$(((t1 - t0) * 1000))"
            fi
        fi
        for w in "$@"; do
            run_fio "$b" "$r" "$w" "$s" && log "  fio $w: done"
        done
        detach "$b" "$r" || true
    }

    log "warm-up (discarded): each build attached once, ${WARMUP_SECS} s of randwrite"
    for b in "${BUILDS[@]}"; do
        one_build "$b" 0 "$WARMUP_SECS" randwrite
    done
    local r
    local -a order
    for r in $(seq 1 "$rounds"); do
        if ((r % 2)); then order=(old new); else order=(new old); fi
        for b in "${order[@]}"; do
            printf '@@order %s %s\n' "$r" "$b"
            one_build "$b" "$r" "$secs" "${WORKLOADS[@]}"
        done
    done

    kill -TERM "$tpid"
    local rc=0
    wait "$tpid" || rc=$?
    trap - EXIT
    ((rc == 0)) || {
        tail -n 20 "$work/target.log" >&2
        log "warning: rblk-target exited with status $rc after SIGTERM"
        printf '@@meta target_exit %s\n' "$rc"
    }
    rm -rf "$work"
    printf '@@meta complete yes\n'
}

# ---------------------------------------------------------------------------------------------------
# On the host: parse the guest's output, print the table, write summary.json. Exits 1 when a build
# has no complete round (or the log has no results at all).

summarize() { # LOG SUMMARY_JSON TABLE_TXT
    lib_python - "$@" <<'PY'
import datetime, json, statistics, sys

from report import host_info

log_path, summary_path, table_path = sys.argv[1:4]
BUILDS = ["old", "new"]
WORKLOADS = [("randwrite_4k_qd32", "randwrite 4k QD32", "write"), ("randread_4k_qd32", "randread 4k QD32", "read")]

meta, runs, fails, idles, orders = {}, [], [], [], {}
block = None
with open(log_path, errors="replace") as f:
    for raw in f:
        line = raw.rstrip("\r\n").replace("\r", "")
        if block is not None:
            if line == "@@end":
                runs.append(block)
                block = None
            else:
                block["text"].append(line)
        elif line.startswith("@@meta "):
            parts = line.split(" ", 2)
            meta[parts[1]] = parts[2] if len(parts) > 2 else ""
        elif line.startswith("@@begin "):
            b, rnd, w, ticks, sched_ns, wall_ns, *cmd = line.split(" ")[1:]
            block = {"build": b, "round": int(rnd), "workload": w, "ticks": int(ticks), "sched_ns": int(sched_ns),
                     "wall_ns": int(wall_ns), "cmd": " ".join(cmd), "text": []}
        elif line.startswith("@@fail "):
            b, rnd, step, *msg = line.split(" ")[1:]
            fails.append({"build": b, "round": int(rnd), "step": step, "error": " ".join(msg)})
        elif line.startswith("@@idle "):
            b, rnd, ticks, sched_ns, wall_ns = line.split()[1:6]
            idles.append({"build": b, "round": int(rnd), "ticks": int(ticks), "sched_ns": int(sched_ns),
                          "wall_ns": int(wall_ns)})
        elif line.startswith("@@order "):
            _, rnd, b = line.split()
            orders.setdefault(int(rnd), []).append(b)
if block is not None:
    fails.append({"build": block["build"], "round": block["round"], "step": block["workload"],
                  "error": "the guest's output ends inside this fio report"})

hz = int(meta.get("clk_tck", "100") or 100)
secs, rounds = int(meta.get("secs", "0")), int(meta.get("rounds", "0"))
results = []  # every measured run, warm-up included
for run in runs:
    w = run["workload"]
    section = next((s for k, _, s in WORKLOADS if k == w), None)
    entry = {k: run[k] for k in ("build", "round", "workload", "ticks", "sched_ns", "wall_ns", "cmd")}
    try:
        text = "\n".join(run["text"])
        job = json.loads(text[text.index("{"):])["jobs"][0]
        if job.get("error"):
            raise ValueError(f"fio reports error {job['error']}")
        s = job[section]
        ios = int(s["total_ios"])
        if ios <= 0:
            raise ValueError("fio completed no I/O")
        cpu_s = run["ticks"] / hz
        entry.update({
            "iops": float(s["iops"]), "total_ios": ios,
            "clat_p50_us": float(s["clat_ns"]["percentile"]["50.000000"]) / 1000.0,
            "cpu_s": cpu_s, "cpu_us_per_io": cpu_s * 1e6 / ios,
            "sched_us_per_io": run["sched_ns"] / 1000.0 / ios,
            "cpu_share": cpu_s / (run["wall_ns"] / 1e9) if run["wall_ns"] else None,
            "fio_runtime_ms": int(job.get("job_runtime", s.get("runtime", 0))),
        })
    except (ValueError, KeyError, TypeError, IndexError) as e:
        fails.append({"build": run["build"], "round": run["round"], "step": w,
                      "error": f"cannot read fio's report: {e}"})
        continue
    results.append(entry)

measured = [e for e in results if e["round"] > 0]
real_fails = [x for x in fails if x["round"] > 0]


def stat(xs):
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": len(xs), "values": xs}


FIGS = ["iops", "cpu_us_per_io", "sched_us_per_io", "clat_p50_us", "cpu_share"]
summary = {}
for key, label, _ in WORKLOADS:
    entry = {}
    for b in BUILDS:
        mine = [e for e in measured if e["build"] == b and e["workload"] == key]
        mine.sort(key=lambda e: e["round"])
        entry[b] = {fig: stat([e[fig] for e in mine if e.get(fig) is not None]) for fig in FIGS}
        entry[b]["rounds_ok"] = [e["round"] for e in mine]
        entry[b]["failed"] = [x for x in real_fails if x["build"] == b and x["step"] in (key.split("_")[0], "attach")]
    ratio = {}
    for fig in FIGS:
        o, n = entry["old"][fig], entry["new"][fig]
        ratio[fig] = n["median"] / o["median"] if o and n and o["median"] else None
    entry["ratio_new_old"] = ratio
    summary[key] = entry

# A round of a build is complete when its attach and both fio jobs succeeded.
done = {(e["build"], e["round"], e["workload"]) for e in measured}
complete = {b: [r for r in range(1, rounds + 1) if all((b, r, k) in done for k, _, _ in WORKLOADS)] for b in BUILDS}
idle = {}
for b in BUILDS:
    xs = [i["sched_ns"] / i["wall_ns"] for i in idles if i["build"] == b and i["wall_ns"]]
    ts = [i["ticks"] / hz / (i["wall_ns"] / 1e9) for i in idles if i["build"] == b and i["wall_ns"]]
    idle[b] = {"sched_share": stat(xs), "tick_share": stat(ts)}


def fnum(x, kind):
    if x is None:
        return "-"
    if kind == "iops":
        return f"{x:,.0f}"
    if kind == "pct":
        return f"{x * 100:.1f}%"
    return f"{x:,.1f}" if x >= 100 else f"{x:.2f}"


def cell(st, kind):
    if st is None:
        return "no run"
    if st["runs"] == 1:
        return fnum(st["median"], kind)
    return f"{fnum(st['median'], kind)} ({fnum(st['min'], kind)}-{fnum(st['max'], kind)})"


out = []
head = (f"{'workload (fio 4k, 1 job, libaio, direct)':<41} {'build':<7} {'ok':>5}  {'IOPS median (min-max)':>25}  "
        f"{'CPU us/IO median (min-max)':>27}  {'sched us/IO':>11}  {'cpu/core':>8}  {'clat p50 us':>11}")
out.append(head)
out.append("-" * len(head))
for key, label, _ in WORKLOADS:
    e = summary[key]
    for i, b in enumerate(BUILDS):
        d = e[b]
        ok = f"{len(d['rounds_ok'])}/{rounds}"
        med = lambda fig, kind: fnum(d[fig]["median"], kind) if d[fig] else "-"
        out.append(f"{label if i == 0 else '':<41} {b:<7} {ok:>5}  {cell(d['iops'], 'iops'):>25}  "
                   f"{cell(d['cpu_us_per_io'], 'us'):>27}  {med('sched_us_per_io', 'us'):>11}  "
                   f"{med('cpu_share', 'pct'):>8}  {med('clat_p50_us', 'us'):>11}")
    r = e["ratio_new_old"]
    rt = lambda fig: "-" if r[fig] is None else f"{r[fig]:.3f}"
    out.append(f"{'':<41} {'new/old':<7} {'':>5}  {rt('iops'):>25}  {rt('cpu_us_per_io'):>27}  "
               f"{rt('sched_us_per_io'):>11}  {rt('cpu_share'):>8}  {rt('clat_p50_us'):>11}")
out.append("")
out.append("CPU us/IO: the attach process's utime+stime (/proc/PID/stat, CLK_TCK " + str(hz) + ") over fio's whole run"
           " / fio's total_ios (no ramp); sched us/IO: the same from its threads' schedstat (ns).")
out.append("attach process idle (no I/O, share of a core, median of rounds, schedstat): "
           + ", ".join(f"{b} {fnum(idle[b]['sched_share']['median'], 'pct') if idle[b]['sched_share'] else '-'}"
                       for b in BUILDS))
for b in BUILDS:
    out.append(f"{b}: {meta.get('dir_' + b, '?')} ({meta.get('version_' + b, '?')}; sha256 of rblk "
               f"{meta.get('sha_' + b, '?')[:12]})")
out.append(f"target: {meta.get('target', '?')}; order per round: "
           + ", ".join(f"{r}: {'-'.join(orders[r])}" for r in sorted(orders)))
out.append(f"{rounds} round(s) of {secs} s per fio job; guest kernel {meta.get('guest_kernel', '?')}, "
           f"{meta.get('guest_cpus', '?')} vCPUs (qemu TCG); {meta.get('fio', '')}; "
           f"host load average before {meta.get('host_load_before', '?')}, after "
           f"{meta.get('host_load_after', '?')}; guest run "
           f"{meta.get('guest_run_secs', '?')} s")
if meta.get("complete") != "yes":
    out.append("INCOMPLETE: the guest did not finish the rounds (see " + log_path + ")")
for x in fails:
    what = "warm-up" if x["round"] == 0 else f"round {x['round']}"
    out.append(f"failed: {x['build']} {what} {x['step']}: {x['error']}")
table = "\n".join(out)
print(table)

doc = {
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "host": {**host_info(), "load_before": meta.get("host_load_before"), "load_after": meta.get("host_load_after")},
    "guest": {"kernel": meta.get("guest_kernel"), "cpus": int(meta.get("guest_cpus", "0") or 0), "accel": "tcg"},
    "builds": {b: {"dir": meta.get("dir_" + b), "version": meta.get("version_" + b),
                   "rblk_sha256": meta.get("sha_" + b)} for b in BUILDS},
    "target": meta.get("target"),
    "secs": secs, "rounds": rounds, "clk_tck": hz, "fio": meta.get("fio"),
    "complete": meta.get("complete") == "yes",
    "guest_run_secs": float(meta["guest_run_secs"]) if "guest_run_secs" in meta else None,
    "order": {str(r): orders[r] for r in sorted(orders)},
    "workloads": summary,
    "complete_rounds": complete,
    "attach_idle_share": idle,
    "runs": results,
    "failures": fails,
}
with open(summary_path, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
with open(table_path, "w") as f:
    f.write(table + "\n")
missing = [b for b in BUILDS if not complete[b]]
if missing:
    print(f"ab-attach: error: no complete round (attach and both fio jobs) for: {', '.join(missing)}", file=sys.stderr)
    sys.exit(1)
PY
}

host_main() {
    local secs=10 rounds=3 target=new redraw=0
    local -a dirs=()
    while (($#)); do
        case $1 in
        --rounds | --secs | --target)
            (($# >= 2)) || die "$1 needs a value"
            case $1 in
            --rounds) rounds=$2 ;;
            --secs) secs=$2 ;;
            --target) target=$2 ;;
            esac
            shift
            ;;
        --rounds=*) rounds=${1#*=} ;;
        --secs=*) secs=${1#*=} ;;
        --target=*) target=${1#*=} ;;
        --redraw) redraw=1 ;;
        -*) help_or_usage_error "$1" ;;
        *) dirs+=("$1") ;;
        esac
        shift
    done
    if ((redraw)); then
        [[ -s $OUT/guest.log ]] || die "no $OUT/guest.log to summarize"
        summarize "$OUT/guest.log" "$OUT/summary.json" "$OUT/table.txt"
        return
    fi
    ((${#dirs[@]} == 2)) || {
        usage >&2
        exit 2
    }
    is_count "$secs" || die "--secs must be a positive whole number of seconds (got '$secs')"
    is_count "$rounds" || die "--rounds must be a positive whole number (got '$rounds')"
    [[ $target == old || $target == new ]] || die "--target must be old or new (got '$target')"
    local -A dir=()
    local i b f
    for i in 0 1; do
        b=${BUILDS[$i]}
        f=${dirs[$i]}
        [[ $f == /* ]] || f=$CALLER_PWD/$f
        dir[$b]=$(cd -- "$f" 2>/dev/null && pwd -P) || die "$b: ${dirs[$i]} is not a directory"
        for f in rblk-target rblk; do
            [[ -x ${dir[$b]}/$f ]] || die "$b: no ${dir[$b]}/$f"
        done
    done

    mkdir -p "$OUT"
    rm -f "$OUT"/summary.json "$OUT"/table.txt
    local glog=$OUT/guest.log
    {
        printf '@@meta secs %s\n@@meta rounds %s\n' "$secs" "$rounds"
        for b in "${BUILDS[@]}"; do
            printf '@@meta dir_%s %s\n' "$b" "${dir[$b]}"
            printf '@@meta sha_%s %s\n' "$b" "$(sha256sum "${dir[$b]}/rblk" | cut -d' ' -f1)"
        done
    } >"$glog"
    log "old: ${dir[old]}; new: ${dir[new]}; $rounds round(s) of ${secs} s per fio job; raw output in $glog"
    # Guest run: boot + warm-up + per round and build: attach/detach, idle, two fio jobs; generous.
    run_guest "$glog" $((300 + rounds * (240 + secs * 8))) "$REPO_ROOT/scripts/ab-attach.sh" \
        "$secs" "$rounds" "${dir[old]}" "${dir[new]}" "$target"
    summarize_run "$glog" "$OUT"
    finish_run "$glog"
}

script_main 5 "SECS ROUNDS OLD_BIN_DIR NEW_BIN_DIR old|new" "$@"
