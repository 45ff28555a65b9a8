"""scripts/hosts-rxe.sh's analysis: what idle peers cost rblk-target (issue 40), from the guest's
log to a table and summary.json.

    python3 scripts/lib/hosts.py LOG SUMMARY_JSON TABLE_TXT

The log's lines are described in hosts-rxe.sh (@@meta, @@step, @@open, @@bench, @@storm, @@stop,
@@skip, @@fail, @@cmtime ... @@endcmtime). Rows are steps (a phase, 1qp or 2qp, and the sessions held);
ratios are against the first 1qp row (the bench beside the fewest idle peers), the open-time
ratios against each phase's 10-session row (the goal's "10 sessions held"), per-QP costs against
each phase's first row. Goals are shown beside the figures, never asserted.
"""
import json
import sys

from report import bench_report, host_info

# cmtime's steps (rdmacm-utils' examples/cmtime.c, "%-13s: total ms, max ms, min us, us / conn").
CMTIME_SETUP = ("resolve addr", "resolve route", "create qp", "connect")


class LogError(ValueError):
    """A line of the guest's log that does not read as hosts-rxe.sh writes it."""


# The fields of a @@step line that must be numbers: the table and the goals compute with them.
STEP_NUMBERS = ("sessions", "qps", "threads", "fds", "rss_kb", "vmpin_kb", "cpu_ticks")


def parse_pairs(words):
    """["k=v", ...] -> {k: number or text}."""
    out = {}
    for w in words:
        k, sep, v = w.partition("=")
        if not sep:
            raise LogError(f"{w!r}: expected KEY=VALUE")
        out[k] = number(v)
    return out


def number(text):
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def parse_open(words):
    """rblk-test-client open-time's "open_ms p50 P min MIN max MAX rate R [p99 Q]" -> {p50, ...}."""
    if not words or words[0] != "open_ms" or len(words) % 2 != 1:
        raise LogError(f"{' '.join(words)!r}: not open-time's line")
    return {k: float(v) for k, v in zip(words[1::2], words[2::2])}


def parse_cmtime(lines):
    """cmtime's table -> {step: {total_ms, max_ms, min_us, us_per_conn}}."""
    out = {}
    for line in lines:
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or len(fields) != 4:
            continue
        try:
            total, mx, mn, per = (float(f) for f in fields)
        except ValueError:
            continue
        out[name.strip()] = {"total_ms": total, "max_ms": mx, "min_us": mn, "us_per_conn": per}
    return out


def bench_row(doc):
    """rblk-bench's JSON -> {iops, p50_us, p99_us}."""
    r = bench_report(doc)
    lat = r["read"]["lat_us"] or {}
    return {"iops": r["total"]["iops"], "p50_us": lat.get("p50"), "p99_us": lat.get("p99")}


def parse(lines):
    """The guest's log -> {meta, steps: [row], cmtime: {N: table}, stops, skips, failures}."""
    doc = {"meta": {}, "steps": [], "storms": [], "cmtime": {}, "stops": [], "skips": [], "failures": []}
    rows = {}
    cm, cm_lines = None, []
    for line in lines:
        line = line.rstrip("\r\n")
        if cm is not None:
            if line == "@@endcmtime":
                doc["cmtime"][cm] = parse_cmtime(cm_lines)
                cm = None
            else:
                cm_lines.append(line)
            continue
        if not line.startswith("@@"):
            continue
        tag, _, rest = line.partition(" ")
        words = rest.split()
        if tag == "@@meta":
            k, _, v = rest.partition(" ")
            doc["meta"][k] = v
        elif tag == "@@step":
            row = parse_pairs(words)
            for k in STEP_NUMBERS:
                if not isinstance(row.get(k), (int, float)):
                    raise LogError(f"{line!r}: {k} is {row.get(k)!r}, not a number "
                                   "(was the target gone when the step was measured?)")
            rows[(row["phase"], row["sessions"])] = row
            doc["steps"].append(row)
        elif tag in ("@@open", "@@bench"):
            if len(words) < 3:
                raise LogError(f"{line!r}: expected PHASE SESSIONS ...")
            row = rows.get((words[0], number(words[1])))
            if row is None:
                raise LogError(f"{line!r}: no @@step for {words[0]} {words[1]} before it")
            if tag == "@@open":
                row["open"] = parse_open(words[2:])
            else:
                row["bench"] = bench_row(json.loads(rest.split(" ", 2)[2]))
        elif tag == "@@storm":
            storm = parse_pairs(words)
            storm.setdefault("kind", "takeover")  # logs from before the restart storm
            doc["storms"].append(storm)
        elif tag == "@@cmtime":
            cm, cm_lines = int(words[0]), []
        elif tag in ("@@stop", "@@skip"):
            phase, n, msg = (rest.split(" ", 2) + ["", ""])[:3]
            doc["stops" if tag == "@@stop" else "skips"].append(
                {"phase": phase, "sessions": number(n), "reason": msg})
        elif tag == "@@fail":
            what, _, msg = rest.partition(" ")
            doc["failures"].append({"what": what, "error": msg})
    if cm is not None:
        doc["failures"].append({"what": "cmtime", "error": f"cmtime -c {cm}: its output ended early"})
    return doc


def cpu_pct(ticks, row):
    """Ticks over the row's idle window -> percent of one core."""
    return 100.0 * ticks / row["clk_tck"] / row["window_s"] if row.get("window_s") else None


def ratio(a, b):
    return a / b if a is not None and b else None


def per_qp(row, base, key):
    """(row's KEY - base's) per QP added since base."""
    dq = row["qps"] - base["qps"]
    return (row[key] - base[key]) / dq if dq > 0 else None


def derive(doc):
    """Adds each row's CPU shares, ratios and per-QP costs, and doc["cmtime_conn_us"]."""
    steps = doc["steps"]
    first = next((r for r in steps if r["phase"] == "1qp"), steps[0] if steps else None)
    base_bench = (first or {}).get("bench")
    for phase in dict.fromkeys(r["phase"] for r in steps):
        rows = [r for r in steps if r["phase"] == phase]
        ten = next((r for r in rows if r["sessions"] == 10), rows[0])
        for r in rows:
            r["cpu_pct"] = cpu_pct(r["cpu_ticks"], r)
            r["client_cpu_pct"] = cpu_pct(r["client_cpu_ticks"], r)
            for key, out in (("rss_kb", "rss_kb_per_qp"), ("vmpin_kb", "vmpin_kb_per_qp"),
                             ("fds", "fds_per_qp"), ("threads", "threads_per_qp")):
                r[out] = per_qp(r, rows[0], key)
            if "open" in r and "open" in ten:
                r["open_p50_ratio"] = ratio(r["open"]["p50"], ten["open"]["p50"])
                r["open_p99_ratio"] = ratio(r["open"].get("p99"), ten["open"].get("p99"))
            if "bench" in r and base_bench:
                r["iops_ratio"] = ratio(r["bench"]["iops"], base_bench["iops"])
                r["p99_ratio"] = ratio(r["bench"]["p99_us"], base_bench["p99_us"])
    cm = doc["cmtime"]
    small = cm[min(cm)] if cm else {}
    if all(s in small for s in CMTIME_SETUP):
        doc["cmtime_connect_us"] = small["connect"]["us_per_conn"]
        doc["cmtime_conn_us"] = sum(small[s]["us_per_conn"] for s in CMTIME_SETUP)
    return doc


def lost(row):
    """Did the held sessions reconnect or give up by the end of the row's idle window (then it
    was no idle step)? Unknown (a log before the hold client said) reads as no."""
    return row.get("reconnects", 0) > 0 or row.get("failed", 0) > 0


def compared(row):
    """Is the row a comparison phase's (PHASE-VARIANT: 2qp-perqp, 2qp-unsol), today's sessions
    with one of their defaults turned off? Goals read the default phases' rows only."""
    return "-" in row["phase"]


def nearest(steps, qps):
    """The row of the most QPs at most `qps` (the goal's row, or the nearest below it) whose
    sessions stayed up, of a default phase."""
    rows = [r for r in steps if r["qps"] <= qps and not lost(r) and not compared(r)]
    return max(rows, key=lambda r: (r["qps"], r["phase"])) if rows else None


def goals(doc):
    """Issue 40's goals beside what this run measured: [{goal, bound, measured, row}]."""
    steps, out = doc["steps"], []

    def add(goal, bound, measured, row):
        out.append({"goal": goal, "bound": bound, "measured": measured,
                    "row": f"{row['phase']} {row['sessions']} sessions, {row['qps']} QPs" if row else None})

    up = [r for r in steps if not lost(r) and not compared(r)]
    top = max(up, key=lambda r: r["qps"]) if up else None
    most = max(steps, key=lambda r: r["threads"]) if steps else None
    add("target threads, most over the run", "workers + 4", most and most["threads"], most)
    for s in doc["storms"]:
        row = {"phase": f"storm ({s['kind']}) {s['phase']}", "sessions": s["sessions"], "qps": s["qps"]}
        add(f"new daemon's threads, most during the {s['kind']} storm", "workers + 4", s["most_threads"], row)
        storm_cm = doc["cmtime"].get(max(doc["cmtime"])) if doc["cmtime"] else None
        total = storm_cm and storm_cm.get("connect", {}).get("total_ms")
        # Every QP back: the sessions, and their JOINed queues (logs from before rejoined was
        # recorded count the sessions only).
        joined = s["qps"] - s["sessions"]
        all_back = s["back"] >= s["sessions"] and s.get("rejoined", joined) >= joined
        back = s["seconds"] if s["failed"] == 0 and all_back else None
        add(f"{s['kind']} storm: every session back / cmtime -c {max(doc['cmtime']) if doc['cmtime'] else '?'}'s total "
            "(the reconnect delay included)", 1.5, ratio(back * 1000.0, total) if back and total else None, row)
    for qps, bound in ((2000, 1.0), (4096, 2.0)):  # the most QPs up to the goal's
        r = nearest(steps, qps)
        add(f"target CPU idle at {qps} QPs, % of a core", bound, r and r["cpu_pct"], r)
    r = top if top and "open_p50_ratio" in top else None
    add("open time p50 at the most QPs / with 10 sessions", 1.1, r and r["open_p50_ratio"], r)
    add("open time p99 at the most QPs / with 10 sessions", 1.5, r and r["open_p99_ratio"], r)
    ten = next((x for x in steps if x["phase"] == "1qp" and x["sessions"] == 10 and "open" in x), None)
    conn = doc.get("cmtime_conn_us")
    add("open time p50 (10 sessions held) / cmtime's per-connection setup", 2.0,
        ratio(ten["open"]["p50"] * 1000.0, conn) if ten and conn else None, ten)
    r = nearest(steps, 2000)
    add("rblk-bench QD1 IOPS beside 2000 idle QPs / beside the first row's", 0.95,
        r and r.get("iops_ratio"), r)
    add("rblk-bench QD1 p99 beside 2000 idle QPs / beside the first row's", 1.25,
        r and r.get("p99_ratio"), r)
    return out


def fmt(v, spec, none="-"):
    return none if v is None else format(v, spec)


def table(doc):
    """The report: the rows, cmtime, the goals, what stopped or failed."""
    m = doc["meta"]
    out = [f"rblk-target with idle sessions held, one boot {m.get('date', '?')}: guest kernel "
           f"{m.get('guest_kernel', '?')}, {m.get('guest_cpus', '?')} vCPUs (TCG), "
           f"{int(m.get('guest_mem_kb', 0)) >> 20} GiB; {m.get('rblk_target', '')}",
           f"fd limit raised from {m.get('nofile_default', '?')} (soft/hard) to {m.get('nofile', '?')}; "
           f"rxe max_qp {m.get('rxe_max_qp', '?')}, max_cq {m.get('rxe_max_cq', '?')}, "
           f"max_mr {m.get('rxe_max_mr', '?')}, max_mw {m.get('rxe_max_mw', '?')}; "
           f"threads-max {m.get('threads_max', '?')}", ""]
    head = ("phase", "sessions", "QPs", "threads", "fds", "RSS MB", "VmPin MB", "CPU %", "client %",
            "open p50 ms", "open p99 ms", "bench IOPS", "p50 us", "p99 us", "IOPS x", "p99 x")
    rows = []
    for r in doc["steps"]:
        o, b = r.get("open", {}), r.get("bench", {})
        rows.append((r["phase"], str(r["sessions"]), str(r["qps"]), str(r["threads"]), str(r["fds"]),
                     fmt(r["rss_kb"] / 1024, ".0f"), fmt(r["vmpin_kb"] / 1024, ".0f"),
                     fmt(r["cpu_pct"], ".1f"), fmt(r["client_cpu_pct"], ".1f"),
                     fmt(o.get("p50"), ".1f"), fmt(o.get("p99"), ".1f"), fmt(b.get("iops"), ",.0f"),
                     fmt(b.get("p50_us"), ".1f"), fmt(b.get("p99_us"), ".1f"),
                     fmt(r.get("iops_ratio"), ".2f"), fmt(r.get("p99_ratio"), ".2f")))
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    for line in (head, *rows):
        out.append("  ".join(x.rjust(w) for x, w in zip(line, widths)).rstrip())
    out.append("")
    out.append("per QP added since each phase's first row:")
    for r in doc["steps"]:
        if r.get("rss_kb_per_qp") is not None:
            out.append(f"  {r['phase']} {r['qps']:>5} QPs: {r['rss_kb_per_qp']:.1f} KiB RSS, "
                       f"{r['vmpin_kb_per_qp']:.1f} KiB pinned, {r['fds_per_qp']:.2f} fds, "
                       f"{r['threads_per_qp']:.2f} threads")
    for n, t in sorted(doc["cmtime"].items()):
        if "connect" in t:
            setup = sum(t[s]["us_per_conn"] for s in CMTIME_SETUP if s in t)
            out.append(f"cmtime -c {n}: connect {t['connect']['us_per_conn']:.0f} us/conn "
                       f"(total {t['connect']['total_ms']:.0f} ms, slowest {t['connect']['max_ms']:.1f} ms), "
                       f"resolve + create qp + connect {setup:.0f} us/conn")
    out.append("")
    out.append("issue 40's goals (read, not asserted):")
    for g in doc["goals"]:
        v = g["measured"]
        shown = "-" if v is None else (f"{v:,.2f}" if isinstance(v, float) else str(v))
        out.append(f"  {g['goal']}: {shown} (goal {g['bound']}){' at ' + g['row'] if g['row'] else ''}")
    for s in doc["storms"]:
        out.append(f"storm ({s['phase']}, a {s['kind']} with {s['sessions']} sessions x "
                   f"{s['qps'] // max(s['sessions'], 1)} QPs held): {s['back']} sessions"
                   f"{' and ' + str(s['rejoined']) + ' JOINed queues' if 'rejoined' in s else ''} back in "
                   f"{s['seconds']:.1f} s, {s['failed']} gave up; the new daemon's threads at most "
                   f"{s['most_threads']}")
    for r in doc["steps"]:
        if lost(r):
            out.append(f"not idle: {r['phase']} {r['sessions']} sessions: the held sessions reconnected "
                       f"{r.get('reconnects')} times, {r.get('failed')} gave up (the goals skip this row)")
    for s in doc["stops"]:
        out.append(f"stopped growing: {s['phase']} at {s['sessions']} sessions: {s['reason']}")
    for s in doc["skips"]:
        out.append(f"skipped: {s['phase']} {s['sessions']}: {s['reason']}")
    for f in doc["failures"]:
        out.append(f"failed: {f['what']}: {f['error']}")
    return "\n".join(out)


def summarize(lines):
    doc = derive(parse(lines))
    doc["goals"] = goals(doc)
    return doc


def main(argv):
    if len(argv) != 4:
        print("usage: hosts.py LOG SUMMARY_JSON TABLE_TXT", file=sys.stderr)
        return 2
    log_path, summary_path, table_path = argv[1:]
    try:
        with open(log_path, errors="replace") as f:
            doc = summarize(f)
    except (OSError, LogError, ValueError, KeyError) as e:
        print(f"hosts.py: {log_path}: {e}", file=sys.stderr)
        return 1
    doc["host"] = host_info()
    text = table(doc)
    print(text)
    with open(table_path, "w") as f:
        f.write(text + "\n")
    with open(summary_path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    return 0 if doc["steps"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
