"""scripts/compare-rxe.sh's rows (part of scripts/lib/compare.py's analysis): each workload's
medians, ratios and goals, as summary.json's entries and the tables' rows."""
import statistics

# Each workload: key, label, unit, how to read perftest's figure (bw: its message rate; lat: its
# t_typical; lat2: 2 x t_typical; rblkref: another rblk-bench row's), the rblk workload, rblk's
# figure (section, field), the goal (op, factor).
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

# Rows whose absence fails the run: the ones the goals are measured with.
GOAL_PATHS = ("ublk", "nvmeof", "rblk_bench")


def errors_of(fails, *keys):
    """The failures of the (workload, tool) keys, as "round N: ERROR"."""
    return [f"round {x['round']}: {x['error']}" for x in fails if (x["workload"], x["tool"]) in keys]


def spread(xs):
    return [min(xs), max(xs)] if xs else None


def med(xs):
    return statistics.median(xs) if xs else None


def guest_cpu(f, workload, tool):
    """Guest CPU per I/O of a workload's runs: busy vCPU time over the sampled window / the I/Os
    completed in it (the device's own count, else the run's I/O rate x the window), the busy
    share and the queue threads' sleeps per I/O, medians over the rounds."""
    per_io, busy, sleeps = [], [], []
    for rnd, (_, rate) in sorted(f.by_round.get((workload, tool), {}).items()):
        g = f.log.gcpu.get((workload, tool, rnd))
        if not g:
            continue
        b, a, ns, ios, qs, overran = g
        if overran:
            f.log.notes.append(f"round {rnd} {workload} {tool}: the CPU window outlasted the run; no CPU figure")
            continue
        n = ios if ios > 0 else (rate or 0) * ns / 1e9
        if n <= 0 or a <= 0:
            continue
        per_io.append(b / f.hz * 1e6 / n)
        busy.append(b / a)
        if qs >= 0:
            sleeps.append(qs / n)
    return {"us_per_io": med(per_io), "busy_share": med(busy), "queue_sleeps_per_io": med(sleeps),
            "runs": len(per_io), "us_per_io_spread": spread(per_io)}


def goal_met(ratio, op, factor):
    return None if ratio is None else (ratio >= factor if op == ">=" else ratio <= factor)


def workload_row(f, spec):
    """One row of the first table (spec: a WORKLOADS entry) -> (summary.json's entry, the table's
    row: label, unit, perftest figures, rblk figures, ratio, op, goal, met, target CPU, rblk CPU,
    errors)."""
    key, label, unit, kind, rblk_w, (section, field), op, goal = spec
    pt_w = PERFTEST_OF.get(rblk_w, rblk_w)
    if kind == "rblkref":
        pt_w = RBLK_REF_OF[rblk_w]
        pts = [r[section]["lat_us"][field] for r in f.values.get((pt_w, "rblk"), [])]
        pt_key = (pt_w, "rblk")
    else:
        pts = f.values.get((pt_w, "perftest")) or []
        pt_key = (pt_w, "perftest")
    reports = f.values.get((rblk_w, "rblk")) or []
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
    met = goal_met(ratio, op, goal) if goal is not None else None
    entry.update({
        "perftest": p, "rblk": r, "ratio": ratio,
        "perftest_spread": spread(pts), "rblk_spread": spread(rb), "runs": min(len(pts), len(rb)),
        "perftest_cmd": ("2 x " if kind == "lat2" else "") + f.cmds[pt_key] if pt_key in f.cmds else None,
        "rblk_cmd": f.cmds.get((rblk_w, "rblk")),
    })
    if goal is not None:
        entry["goal_met"] = met
    errs = errors_of(f.log.fails, pt_key, (rblk_w, "rblk"))
    if not pts or not reports:
        entry["failed"] = errs or ["no results"]
    elif errs:
        entry["failed_runs"] = errs
    if rblk_w in f.cpu:
        entry["target_cpu_share"] = statistics.median(f.cpu[rblk_w])
    if rblk_w in f.own_cpu:
        entry["rblk_cpu_share"] = statistics.median(f.own_cpu[rblk_w])
    row = (label, unit, pts, rb, ratio, op, goal, met, entry.get("target_cpu_share"),
           entry.get("rblk_cpu_share"), entry.get("failed") or errs)
    return entry, row


def block_row(f, spec, goals_all, missing):
    """One block-device workload (spec: a BLOCK_WORKLOADS entry) -> (summary.json's entry under
    "block_devices", the table's row). Its goals go into goals_all, its missing goal rows into
    missing."""
    key, label, unit, fio_w, (section, field), bench_w, paths, goals = spec
    figs, spreads, status, errs, gc = {}, {}, {}, {}, {}
    for path in paths:
        xs = f.values.get((fio_w, path))
        e = errors_of(f.log.fails, (fio_w, path))
        if e:
            errs[path] = e
        if xs:
            figs[path], spreads[path], status[path] = statistics.median(xs), xs, "ok"
            gc[path] = guest_cpu(f, fio_w, path)
        else:
            figs[path] = None
            status[path] = ("unavailable" if path in f.log.unavailable else "failed" if e else "not run")
    reports = f.values.get((bench_w, "rblk")) or []
    bench = [r["total"]["iops"] for r in reports] if field == "iops" else [r[section]["lat_us"]["p50"] for r in reports]
    figs["rblk_bench"] = med(bench)
    if bench:
        spreads["rblk_bench"], status["rblk_bench"] = bench, "ok"
        gc["rblk_bench"] = guest_cpu(f, bench_w, "rblk")
    else:
        status["rblk_bench"] = "failed"
        errs["rblk_bench"] = errors_of(f.log.fails, (bench_w, "rblk")) or ["no results"]
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
        refname = "bench" if ref == "rblk_bench" else ref
        g = {"goal": f"{path}/{ref} {op} {factor}", "ratio": x, "met": goal_met(x, op, factor), "path": path,
             "text": f"{op} {factor} x {refname}"}
        goal_list.append(g)
        goals_all.append(dict(g, workload=key, label=f"{path} {label} {op} {factor} x {refname}"))
    entry = {"unit": unit, **figs, "status": status, "ratios": ratios, "goals": goal_list,
             "spreads": {k: spread(v) for k, v in spreads.items()}, "runs": {k: len(v) for k, v in spreads.items()},
             "guest_cpu": gc, "errors": errs,
             "cmds": {p: f.cmds[(fio_w, p)] for p in paths if (fio_w, p) in f.cmds},
             "rblk_bench_workload": bench_w, "rblk_bench_cmd": f.cmds.get((bench_w, "rblk"))}
    shares = {p: statistics.median(f.log.blk_cpu[f"{fio_w}/{p}"]) for p in paths if f"{fio_w}/{p}" in f.log.blk_cpu}
    if shares:
        entry["target_cpu_share"] = shares
    return entry, (label, unit, paths, figs, spreads, status, errs, ratios, goal_list, shares, gc)
