"""scripts/ab-attach.sh's analysis: `rblk attach`'s CPU per I/O and IOPS for two builds (old and
new) from the guest's log to a table and summary.json.

    python3 scripts/lib/ab.py LOG SUMMARY_JSON TABLE_TXT

The log's lines are described in ab-attach.sh (@@meta, @@order, @@idle, @@begin ... @@end with
fio's JSON report between them, @@fail). Round 0 is the warm-up: recorded, never counted. Exits 1
when a build has no complete round (its attach and both fio jobs succeeded).
"""
import datetime
import json
import statistics
import sys

from report import host_info

BUILDS = ["old", "new"]
# (the workload's name in the log, its label in the table, the section of fio's job report)
WORKLOADS = [("randwrite_4k_qd32", "randwrite 4k QD32", "write"), ("randread_4k_qd32", "randread 4k QD32", "read")]
FIGS = ["iops", "cpu_us_per_io", "sched_us_per_io", "clat_p50_us", "cpu_share"]


def parse(lines):
    """The guest's log -> {"meta", "runs", "fails", "idles", "orders"}: @@meta KEY VALUE, each
    @@begin's fields and the text up to its @@end, each @@fail and @@idle, the builds of each
    round in order. A report cut short by the log's end is a failure of that workload."""
    meta, runs, fails, idles, orders = {}, [], [], [], {}
    block = None
    for raw in lines:
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
    return {"meta": meta, "runs": runs, "fails": fails, "idles": idles, "orders": orders}


def clk_tck(meta):
    return int(meta.get("clk_tck", "100") or 100)


def run_figures(run, hz):
    """One @@begin block -> its entry: IOPS, total I/Os and clat p50 from fio's report, the attach
    process's CPU (ticks / hz) per I/O and share of a core over the block's wall time, and the
    schedstat run time per I/O. Raises ValueError (KeyError, ...) for a report fio did not finish."""
    w = run["workload"]
    section = next((s for k, _, s in WORKLOADS if k == w), None)
    entry = {k: run[k] for k in ("build", "round", "workload", "ticks", "sched_ns", "wall_ns", "cmd")}
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
    return entry


def results(parsed):
    """Every measured run (warm-up included) with its figures; a report that cannot be read is
    appended to parsed["fails"] instead."""
    hz = clk_tck(parsed["meta"])
    out = []
    for run in parsed["runs"]:
        try:
            out.append(run_figures(run, hz))
        except (ValueError, KeyError, TypeError, IndexError) as e:
            parsed["fails"].append({"build": run["build"], "round": run["round"], "step": run["workload"],
                                    "error": f"cannot read fio's report: {e}"})
    return out


def stat(xs):
    """Median, min, max, count and the values themselves; None for no values."""
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": len(xs), "values": xs}


def workloads(measured, real_fails):
    """Per workload and build: each figure's stat over the rounds, the rounds that ran, the
    failures of that workload (or of the attach); and the ratio new/old of the medians."""
    summary = {}
    for key, _, _ in WORKLOADS:
        entry = {}
        for b in BUILDS:
            mine = [e for e in measured if e["build"] == b and e["workload"] == key]
            mine.sort(key=lambda e: e["round"])
            entry[b] = {fig: stat([e[fig] for e in mine if e.get(fig) is not None]) for fig in FIGS}
            entry[b]["rounds_ok"] = [e["round"] for e in mine]
            entry[b]["failed"] = [x for x in real_fails
                                  if x["build"] == b and x["step"] in (key.split("_")[0], "attach")]
        ratio = {}
        for fig in FIGS:
            o, n = entry["old"][fig], entry["new"][fig]
            ratio[fig] = n["median"] / o["median"] if o and n and o["median"] else None
        entry["ratio_new_old"] = ratio
        summary[key] = entry
    return summary


def complete_rounds(measured, rounds):
    """Per build, the rounds whose attach and both fio jobs succeeded."""
    done = {(e["build"], e["round"], e["workload"]) for e in measured}
    return {b: [r for r in range(1, rounds + 1) if all((b, r, k) in done for k, _, _ in WORKLOADS)] for b in BUILDS}


def idle_shares(idles, hz):
    """Per build, the attach process's share of a core with no I/O: from schedstat and from ticks."""
    idle = {}
    for b in BUILDS:
        xs = [i["sched_ns"] / i["wall_ns"] for i in idles if i["build"] == b and i["wall_ns"]]
        ts = [i["ticks"] / hz / (i["wall_ns"] / 1e9) for i in idles if i["build"] == b and i["wall_ns"]]
        idle[b] = {"sched_share": stat(xs), "tick_share": stat(ts)}
    return idle


def summarize(lines):
    """The guest's log -> summary.json's document (without "date" and "host", which main adds)."""
    parsed = parse(lines)
    meta, orders = parsed["meta"], parsed["orders"]
    hz = clk_tck(meta)
    secs, rounds = int(meta.get("secs", "0")), int(meta.get("rounds", "0"))
    runs = results(parsed)
    fails = parsed["fails"]
    measured = [e for e in runs if e["round"] > 0]
    real_fails = [x for x in fails if x["round"] > 0]
    return {
        "meta": meta,
        "guest": {"kernel": meta.get("guest_kernel"), "cpus": int(meta.get("guest_cpus", "0") or 0), "accel": "tcg"},
        "builds": {b: {"dir": meta.get("dir_" + b), "version": meta.get("version_" + b),
                       "rblk_sha256": meta.get("sha_" + b)} for b in BUILDS},
        "target": meta.get("target"),
        "secs": secs, "rounds": rounds, "clk_tck": hz, "fio": meta.get("fio"),
        "complete": meta.get("complete") == "yes",
        "guest_run_secs": float(meta["guest_run_secs"]) if "guest_run_secs" in meta else None,
        "order": {str(r): orders[r] for r in sorted(orders)},
        "workloads": workloads(measured, real_fails),
        "complete_rounds": complete_rounds(measured, rounds),
        "attach_idle_share": idle_shares(parsed["idles"], hz),
        "runs": runs,
        "failures": fails,
    }


def fnum(x, kind):
    """A figure for the table: IOPS with thousands separators, shares in %, else 2 decimals
    below 100 and 1 above."""
    if x is None:
        return "-"
    if kind == "iops":
        return f"{x:,.0f}"
    if kind == "pct":
        return f"{x * 100:.1f}%"
    return f"{x:,.1f}" if x >= 100 else f"{x:.2f}"


def cell(st, kind):
    """A stat as "median (min-max)", the median alone for one run, "no run" for none."""
    if st is None:
        return "no run"
    if st["runs"] == 1:
        return fnum(st["median"], kind)
    return f"{fnum(st['median'], kind)} ({fnum(st['min'], kind)}-{fnum(st['max'], kind)})"


def table(doc, log_path):
    """summarize's document -> the table ab-attach.sh prints (without a final newline)."""
    meta, rounds, hz, orders = doc["meta"], doc["rounds"], doc["clk_tck"], doc["order"]
    idle = doc["attach_idle_share"]
    out = []
    head = (f"{'workload (fio 4k, 1 job, libaio, direct)':<41} {'build':<7} {'ok':>5}  {'IOPS median (min-max)':>25}  "
            f"{'CPU us/IO median (min-max)':>27}  {'sched us/IO':>11}  {'cpu/core':>8}  {'clat p50 us':>11}")
    out.append(head)
    out.append("-" * len(head))
    for key, label, _ in WORKLOADS:
        e = doc["workloads"][key]
        for i, b in enumerate(BUILDS):
            d = e[b]
            ok = f"{len(d['rounds_ok'])}/{rounds}"

            def med(fig, kind):
                return fnum(d[fig]["median"], kind) if d[fig] else "-"
            out.append(f"{label if i == 0 else '':<41} {b:<7} {ok:>5}  {cell(d['iops'], 'iops'):>25}  "
                       f"{cell(d['cpu_us_per_io'], 'us'):>27}  {med('sched_us_per_io', 'us'):>11}  "
                       f"{med('cpu_share', 'pct'):>8}  {med('clat_p50_us', 'us'):>11}")
        r = e["ratio_new_old"]

        def rt(fig):
            return "-" if r[fig] is None else f"{r[fig]:.3f}"
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
               + ", ".join(f"{r}: {'-'.join(orders[r])}" for r in orders))
    out.append(f"{rounds} round(s) of {doc['secs']} s per fio job; guest kernel {meta.get('guest_kernel', '?')}, "
               f"{meta.get('guest_cpus', '?')} vCPUs (qemu TCG); {meta.get('fio', '')}; "
               f"host load average before {meta.get('host_load_before', '?')}, after "
               f"{meta.get('host_load_after', '?')}; guest run "
               f"{meta.get('guest_run_secs', '?')} s")
    if meta.get("complete") != "yes":
        out.append("INCOMPLETE: the guest did not finish the rounds (see " + log_path + ")")
    for x in doc["failures"]:
        what = "warm-up" if x["round"] == 0 else f"round {x['round']}"
        out.append(f"failed: {x['build']} {what} {x['step']}: {x['error']}")
    return "\n".join(out)


def document(doc, host):
    """summary.json: summarize's document with the date and the host, in the order it always had."""
    meta = doc["meta"]
    out = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": {**host, "load_before": meta.get("host_load_before"), "load_after": meta.get("host_load_after")},
    }
    out.update((k, v) for k, v in doc.items() if k != "meta")
    return out


def main(argv):
    if len(argv) != 4:
        print("usage: ab.py LOG SUMMARY_JSON TABLE_TXT", file=sys.stderr)
        return 2
    log_path, summary_path, table_path = argv[1:]
    try:
        with open(log_path, errors="replace") as f:
            doc = summarize(f)
    except (OSError, ValueError) as e:
        print(f"ab.py: {log_path}: {e}", file=sys.stderr)
        return 1
    text = table(doc, log_path)
    print(text)
    try:
        with open(summary_path, "w") as f:
            json.dump(document(doc, host_info()), f, indent=2)
            f.write("\n")
        with open(table_path, "w") as f:
            f.write(text + "\n")
    except OSError as e:
        print(f"ab.py: cannot write the summary: {e}", file=sys.stderr)
        return 1
    missing = [b for b in BUILDS if not doc["complete_rounds"][b]]
    if missing:
        print(f"ab-attach: error: no complete round (attach and both fio jobs) for: {', '.join(missing)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
