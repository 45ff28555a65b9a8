"""Per-I/O counts of scripts/counts-rxe.sh's guest log (issue 45, item 2): what each front end
does per I/O (system calls of the server and of the load generator, io_uring_enter, context
switches, doorbells, CQ re-arms) beside its IOPS and CPU, and issue 45's goals on them.

    python3 counts.py LOG SUMMARY_JSON TABLE_TXT   the table on stdout and in TABLE_TXT
    python3 counts.py --trim REPORT_JSON           (in the guest) fio's or rblk-bench's JSON
                                                   report, one line, only what is read here

The log's lines come from scripts/lib/counts.sh (@@counts, @@counts_tids, @@counts_hist,
@@counts_meta; its header says what each count is measured with) and scripts/counts-rxe.sh
(@@meta, @@counts_json, @@unavailable, @@fail). A label is FRONT:RW:QD, FRONT:RW:QD:uncounted
for the run made before the counting was armed. Stdlib only."""
import json
import re
import sys

# Threads of no process the row names: the kernel's own (rxe's work runs in kworkers).
KERNEL_COMMS = ("kworker/", "ksoftirqd/", "rcu", "migration/", "kthreadd", "idle_inject/", "cpuhp/")
# The load generators, by name, for threads that were gone when the window ended.
GEN_COMMS = ("fio", "rblk-bench")
IO_URING_ENTER = "sys_io_uring_enter"
# issue 45's goals: (front end, depth, what, at most).
GOALS = (
    ("ublk", 1, "server_io_uring_enter", 1.0),
    ("ublk", 1, "server_syscalls", 2.0),
    ("ublk", 32, "server_syscalls", 0.25),
    ("ublk", 32, "server_doorbells", 0.25),
)
FRONTS = ("bench", "ublk", "ublk-null", "libublk-null", "nbd", "fuse", "nvmeof")
HIST_RE = re.compile(r"common_pid:\s*(?P<comm>.*?)\s*\[\s*(?P<tid>\d+)\]"
                     r"(?:,\s*id:\s*(?P<name>\S+)\s*\[\s*(?P<nr>\d+)\])?.*?hitcount:\s*(?P<count>\d+)")


def parse_hist_line(text):
    """One hist line ({ common_pid: COMM [TID], id: NAME [NR] } hitcount: N) as {"comm", "tid",
    "name", "nr", "count"} (name and nr None without an id key); ValueError if it is none."""
    m = HIST_RE.search(text)
    if not m:
        raise ValueError(f"not a hist line: {text.strip()[:120]}")
    return {"comm": m["comm"], "tid": int(m["tid"]), "name": m["name"],
            "nr": int(m["nr"]) if m["nr"] is not None else None, "count": int(m["count"])}


def parse(lines):
    """The log's lines into {"meta", "runs": {label: {"window", "tids", "hist", "report"}},
    "unavailable": {front: why}, "fails": {label: message}, "armed": [kind], "not_counted":
    {kind: why}}. A line that cannot be read is a ValueError naming its number."""
    doc = {"meta": {}, "runs": {}, "unavailable": {}, "fails": {}, "armed": [], "not_counted": {}}

    def run(label):
        return doc["runs"].setdefault(label, {"window": None, "tids": {}, "hist": {}, "report": None})

    for n, line in enumerate(lines, 1):
        line = line.rstrip("\r\n")
        if not line.startswith("@@"):
            continue
        tag, _, rest = line.partition(" ")
        try:
            if tag == "@@meta":
                k, _, v = rest.partition(" ")
                doc["meta"][k] = v
            elif tag == "@@counts":
                label, _, kvs = rest.partition(" ")
                run(label)["window"] = {k: int(v) for k, v in (kv.split("=", 1) for kv in kvs.split())}
            elif tag == "@@counts_tids":
                label, role, tids = rest.split(" ")
                run(label)["tids"][role] = set() if tids == "-" else {int(t) for t in tids.split(",")}
            elif tag == "@@counts_hist":
                label, kind, text = rest.split(" ", 2)
                run(label)["hist"].setdefault(kind, []).append(parse_hist_line(text))
            elif tag == "@@counts_json":
                label, _, text = rest.partition(" ")
                run(label)["report"] = json.loads(text)
            elif tag == "@@counts_meta":
                what, kind, why = (rest.split(" ", 2) + [""])[:3]
                if what == "armed":
                    doc["armed"].append(kind)
                elif what == "unavailable":
                    doc["not_counted"][kind] = why
            elif tag == "@@unavailable":
                front, _, why = rest.partition(" ")
                doc["unavailable"][front] = why
            elif tag == "@@fail":
                label, _, msg = rest.partition(" ")
                doc["fails"][label] = msg
        except (ValueError, KeyError) as e:
            raise ValueError(f"line {n}: {tag}: {e}") from e
    return doc


def role_of(tid, comm, tids):
    """The roles a thread counts for: "server", "gen", "target" (by the thread ids the guest
    listed; rblk-bench is both server and gen), else "gen" for a load generator's name, "kernel"
    for a kernel thread's, "other"."""
    roles = {r for r in ("server", "gen", "target") if tid in tids.get(r, ())}
    if not roles:
        if comm in GEN_COMMS:
            roles = {"gen"}
        elif comm.startswith(KERNEL_COMMS):
            roles = {"kernel"}
        else:
            roles = {"other"}
    return roles


def by_role(entries, tids, name=None):
    """Sums hist entries' counts per role (and "all"); with name, only that system call's."""
    out = {"all": 0}
    for e in entries:
        if name is not None and e["name"] != name:
            continue
        out["all"] += e["count"]
        for r in role_of(e["tid"], e["comm"], tids):
            out[r] = out.get(r, 0) + e["count"]
    return out


def report_iops(report):
    """IOPS (reads + writes) of fio's or rblk-bench's trimmed JSON report (one job)."""
    jobs = report["jobs"]
    if len(jobs) != 1:
        raise ValueError(f"{len(jobs)} jobs in the report (one is run)")
    job = jobs[0]
    if job.get("error"):
        raise ValueError(f"the workload reports error {job['error']}")
    return float(job["read"]["iops"]) + float(job["write"]["iops"])


def per_io(value, ios):
    return None if value is None or not ios else value / ios


RAMP_S = 1  # fio's and rblk-bench's --ramp_time in scripts/counts-rxe.sh


def row(label, run, run_s=None):
    """One table row from a run: IOPS, I/Os and CPU over the run, and the counts per I/O. Without
    a device's count (rblk-bench) the I/Os are its IOPS x run_s (its ramp + runtime). rblk-bench
    is its own server: its threads (by name) count as the server's."""
    parts = label.split(":")
    if len(parts) < 3:
        raise ValueError(f"label {label}: not FRONT:RW:QD")
    w = run["window"]
    if w is None:
        raise ValueError(f"{label}: no @@counts line")
    if run["report"] is None:
        raise ValueError(f"{label}: no report")
    iops = report_iops(run["report"])
    secs = w["window_ns"] / 1e9
    if w["ios"] >= 0:
        ios = w["ios"]
    elif run_s:
        ios = round(iops * run_s)
    else:
        raise ValueError(f"{label}: no device's I/O count and no run time")
    hz = w["clk_tck"]
    bench = parts[0] == "bench"

    def share(ticks, per_sec):  # % of one core over the run
        return None if ticks < 0 or secs <= 0 else 100.0 * ticks / per_sec / secs

    r = {"label": label, "front": parts[0], "rw": parts[1], "qd": int(parts[2]),
         "uncounted": parts[3:] == ["uncounted"], "iops": iops, "ios": ios, "run_s": secs,
         "cpu_pct": 100.0 * w["busy"] / w["all"] if w["all"] > 0 else None,
         "server_cpu_pct": share(w["server_ticks"], hz), "gen_cpu_pct": share(w["gen_ms"], 1000),
         "target_cpu_pct": share(w["target_ticks"], hz), "per_io": {"ctxt": per_io(w["ctxt"], ios)}}
    if bench:
        r["server_cpu_pct"] = r["gen_cpu_pct"]
    if not w["counting"]:
        return r
    tids, hist, p = run["tids"], run["hist"], r["per_io"]
    srole = "gen" if bench else "server"
    has_server = bench or bool(tids.get("server"))

    def server(c):
        return per_io(c.get(srole, 0), ios) if has_server else None

    if "syscalls" in hist:
        s = by_role(hist["syscalls"], tids)
        p["server_syscalls"] = server(s)
        p["server_io_uring_enter"] = server(by_role(hist["syscalls"], tids, IO_URING_ENTER))
        p["gen_syscalls"] = per_io(s.get("gen", 0), ios)
        p["target_syscalls"] = per_io(s.get("target", 0), ios)
        p["all_syscalls"] = per_io(s["all"], ios)
        names = {}
        for e in hist["syscalls"]:
            if has_server and srole in role_of(e["tid"], e["comm"], tids):
                names[e["name"]] = names.get(e["name"], 0) + e["count"]
        r["server_syscalls_by_name"] = {k: v / ios for k, v in sorted(names.items(), key=lambda x: -x[1])} if ios else {}
    if "switches" in hist:
        c = by_role(hist["switches"], tids)
        p["server_switches"] = server(c)
        p["switches"] = per_io(c["all"], ios)
    for kind, key in (("post_send", "doorbells"), ("post_recv", "recv_posts"), ("notify_cq", "cq_rearms")):
        if kind in hist:
            c = by_role(hist[kind], tids)
            p[key] = per_io(c["all"], ios)
            p["server_" + key] = server(c)
        elif kind in run.get("armed", [kind]):
            p[key] = per_io(0, ios)  # armed, no hit in the run
    return r


def goals(rows):
    """issue 45's goals on the counted rows: one entry per goal and RW that ran (or "no row")."""
    out = []
    rws = sorted({r["rw"] for r in rows}) or ["randread"]
    for front, qd, what, limit in GOALS:
        for rw in rws:
            r = next((x for x in rows if (x["front"], x["rw"], x["qd"], x["uncounted"]) == (front, rw, qd, False)), None)
            v = None if r is None else r["per_io"].get(what)
            out.append({"front": front, "rw": rw, "qd": qd, "what": what, "at_most": limit, "value": v,
                        "status": "no row" if v is None else ("met" if v <= limit else "missed")})
    return out


def overhead(rows):
    """IOPS counted / uncounted for each row run both ways: what the tracing costs."""
    out = []
    for u in (r for r in rows if r["uncounted"]):
        c = next((r for r in rows if not r["uncounted"] and (r["front"], r["rw"], r["qd"]) == (u["front"], u["rw"], u["qd"])), None)
        if c and u["iops"]:
            out.append({"front": u["front"], "rw": u["rw"], "qd": u["qd"], "uncounted_iops": u["iops"],
                        "counted_iops": c["iops"], "ratio": c["iops"] / u["iops"]})
    return out


def summarize(lines):
    """The whole summary: meta, rows (in FRONTS order, then RW, QD), goals, overhead,
    unavailable front ends, failed runs, counts that could not be armed."""
    doc = parse(lines)
    rows, errors = [], dict(doc["fails"])
    try:
        run_s = float(doc["meta"]["secs"]) + RAMP_S
    except (KeyError, ValueError):
        run_s = None
    for label, run in doc["runs"].items():
        run["armed"] = doc["armed"]
        try:
            rows.append(row(label, run, run_s))
        except (ValueError, KeyError) as e:
            errors.setdefault(label, str(e))
    order = {f: i for i, f in enumerate(FRONTS)}
    rows.sort(key=lambda r: (order.get(r["front"], 99), r["rw"], r["qd"], r["uncounted"]))
    return {"meta": doc["meta"], "rows": rows, "goals": goals(rows), "overhead": overhead(rows),
            "unavailable": doc["unavailable"], "failed": errors, "not_counted": doc["not_counted"]}


def fmt(v, digits=2):
    return "-" if v is None else f"{v:.{digits}f}"


COLUMNS = (("CPU%", "cpu_pct", 0), ("srvCPU%", "server_cpu_pct", 0), ("cs/IO", "ctxt", 2),
           ("srv sys", "server_syscalls", 2), ("uring", "server_io_uring_enter", 2), ("gen sys", "gen_syscalls", 2),
           ("tgt sys", "target_syscalls", 2), ("srv db", "server_doorbells", 2), ("all db", "doorbells", 2),
           ("re-arm", "cq_rearms", 2), ("recv", "recv_posts", 2))


def table(s):
    """The summary as text lines: the rows, the goals, the tracing's cost, what is missing."""
    m = s["meta"]
    out = [f"per-I/O counts, 4k, 1 job ({m.get('command', 'scripts/counts-rxe.sh')}; {m.get('date', '?')}; "
           f"{m.get('rblk', 'rblk ?')}; guest {m.get('guest_kernel', '?')}, {m.get('guest_cpus', '?')} vCPUs)"]
    head = f"{'front end':<13} {'rw':<9} {'QD':>3} {'IOPS':>7}" + "".join(f" {c[0]:>7}" for c in COLUMNS)
    out += [head, "-" * len(head)]
    for r in s["rows"]:
        if r["uncounted"]:
            continue
        cells = []
        for _, key, d in COLUMNS:
            v = r.get(key) if key.endswith("_pct") else r["per_io"].get(key)
            cells.append(f" {fmt(v, d):>7}")
        out.append(f"{r['front']:<13} {r['rw']:<9} {r['qd']:>3} {r['iops']:>7.0f}" + "".join(cells))
    out.append("counted over each whole run (start-up and exit included). per I/O: cs = context switches (/proc/stat ctxt, all CPUs); srv/gen/tgt sys = system calls of the "
               "server (the process serving the device; rblk-bench itself), the load generator (fio, rblk-bench), "
               "rblk-target; uring = the server's io_uring_enter; srv/all db = doorbells (rxe_post_send) by the "
               "server / by anyone; re-arm = rxe_req_notify_cq; recv = rxe_post_recv (kernel ULPs). CPU% = all "
               "vCPUs busy; srvCPU% = the server's share of one core (rblk-bench: its own)")
    out.append("issue 45's goals:")
    for g in s["goals"]:
        out.append(f"  {g['front']} {g['rw']} QD{g['qd']}: {g['what']} per I/O <= {g['at_most']}: "
                   f"{fmt(g['value'])} {g['status']}")
    for o in s["overhead"]:
        out.append(f"tracing's cost: {o['front']} {o['rw']} QD{o['qd']} IOPS counted / uncounted = "
                   f"{o['counted_iops']:.0f} / {o['uncounted_iops']:.0f} = {o['ratio']:.2f}")
    for f, why in s["unavailable"].items():
        out.append(f"unavailable: {f}: {why}")
    for label, why in s["failed"].items():
        out.append(f"failed: {label}: {why}")
    for kind, why in s["not_counted"].items():
        out.append(f"not counted: {kind}: {why}")
    return out


def trim(report):
    """fio's or rblk-bench's JSON report cut to what is read here (jobs' IOPS, I/Os, error, p50)."""
    jobs = []
    for j in report["jobs"]:
        t = {"jobname": j.get("jobname"), "error": j.get("error", 0)}
        for d in ("read", "write"):
            x = j[d]
            p50 = x.get("clat_ns", {}).get("percentile", {}).get("50.000000")
            t[d] = {"iops": x["iops"], "total_ios": x.get("total_ios"), "clat_p50_ns": p50}
        jobs.append(t)
    return {"jobs": jobs}


def main(argv):
    if len(argv) == 3 and argv[1] == "--trim":
        with open(argv[2]) as f:
            print(json.dumps(trim(json.load(f)), separators=(",", ":")))
        return 0
    if len(argv) != 4:
        print("usage: counts.py LOG SUMMARY_JSON TABLE_TXT | counts.py --trim REPORT_JSON", file=sys.stderr)
        return 2
    with open(argv[1], errors="replace") as f:
        s = summarize(f)
    text = "\n".join(table(s)) + "\n"
    sys.stdout.write(text)
    for path, write in ((argv[2], lambda f: json.dump(s, f, indent=1)), (argv[3], lambda f: f.write(text))):
        try:
            with open(path, "w") as f:
                write(f)
        except OSError as e:
            print(f"counts: error: cannot write {path}: {e.strerror}", file=sys.stderr)
            return 1
    if not s["rows"]:
        print("counts: error: no counted run in the log", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
