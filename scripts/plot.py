#!/usr/bin/python3
"""Draw rblk's benchmark results to PNG, with Debian's python3-matplotlib (no display needed).

Run it with /usr/bin/python3 (the shebang does): a `python3` earlier on PATH (pyenv, a venv) may
not see Debian's packages. scripts/deps.sh installs python3-matplotlib.

  /usr/bin/python3 scripts/plot.py cdf -o OUT.png REPORT.json [REPORT.json...]
      Latency CDF from rblk-bench's (or fio's) JSON reports in fio's layout, -o json+ (each
      job's clat_ns bins; with -o json only its percentiles), or in rblk-bench's earlier
      layout (--json: read/write lat_cdf); one line per job and direction that did I/O;
      latency on a log axis.
  /usr/bin/python3 scripts/plot.py series -o OUT.png LOG [LOG...]
      Over time, from rblk-bench --log (or fio's write_*_log) files: PREFIX_iops.N.log (IOPS),
      PREFIX_bw.N.log (KiB/s) or PREFIX_lat.N.log (mean latency, ns, drawn in us); one kind per
      chart, one line per file and direction.
  /usr/bin/python3 scripts/plot.py compare -o OUT.png SUMMARY.json
      scripts/compare-rxe.sh's build/compare/summary.json as bar charts: rblk/perftest for each
      verbs workload, and each block device against Linux NVMe-oF/RDMA and against rblk-bench,
      with the goals marked (green met, red missed, grey no goal).

  --title TEXT sets the chart's title. Exit status 0 on success, 1 on a missing or malformed
  input (the message names the file and what is wrong), 2 on bad usage.
"""

import argparse
import json
import math
import os
import re
import sys


class InputError(Exception):
    """A missing or malformed input file: the message says which and why."""


def read_text(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text file") from None


def read_json(path):
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not JSON: {e}") from None


def field(doc, path, keys, kind):
    """doc[k0][k1]... checked to be of `kind`, else an InputError naming the file and the key."""
    x = doc
    for k in keys:
        if not isinstance(x, dict) or k not in x:
            raise InputError(f"{path}: no {'.'.join(keys)} (not the expected report?)")
        x = x[k]
    if not isinstance(x, kind):
        raise InputError(f"{path}: {'.'.join(keys)} is {json.dumps(x)[:60]}, not a {kind.__name__}")
    return x


def number(doc, path, keys, optional=False):
    x = doc
    for k in keys:
        if not isinstance(x, dict) or k not in x:
            raise InputError(f"{path}: no {'.'.join(keys)} (not the expected report?)")
        x = x[k]
    if optional and (x is None or isinstance(x, float) and math.isnan(x)):
        return None  # compare-rxe.sh writes null (a path that did not run) or NaN (a zero reference)
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise InputError(f"{path}: {'.'.join(keys)} is {json.dumps(x)[:60]}, not a number")
    return float(x)


# ---------------------------------------------------------------------------------------------
# Inputs


def fio_cdfs(doc, path):
    """[(label, [latency_us...], [fraction...])] of a report in fio's layout: from each job's
    clat_ns bins (json+: the count of each latency bucket, in ns), else from its percentiles."""
    jobs = field(doc, path, ["jobs"], list)
    out = []
    for i, job in enumerate(jobs):
        if not isinstance(job, dict):
            raise InputError(f"{path}: jobs[{i}] is not an object")
        # rblk-bench says each section's parameters with their defaults; fio only those given.
        opts = dict(job.get("job options") or {})
        for sec in (doc.get("rblk") or {}).get("sections") or []:
            if isinstance(sec, dict) and sec.get("name") == job.get("jobname") and isinstance(sec.get("job"), dict):
                opts.update({k: sec["job"][k] for k in ("rw", "bs", "iodepth") if k in sec["job"]})
        desc = f"{opts.get('rw', '?')} bs={opts.get('bs', '?')} QD{opts.get('iodepth', '?')}"
        if len(jobs) > 1:
            desc = f"{job.get('jobname', i)}, {desc}"
        for d in ("read", "write"):
            try:
                clat = job[d]["clat_ns"]
            except (KeyError, TypeError):
                raise InputError(f"{path}: no jobs[{i}].{d}.clat_ns (not the expected report?)") from None
            if not isinstance(clat, dict) or not clat.get("N"):
                continue
            if "bins" in clat:
                try:
                    bins = sorted((int(k), int(v)) for k, v in clat["bins"].items())
                except (ValueError, AttributeError):
                    raise InputError(f"{path}: jobs[{i}].{d}.clat_ns.bins: not {{ns: count}}") from None
                total = sum(n for _, n in bins)
                if total <= 0 or any(n < 0 for _, n in bins):
                    raise InputError(f"{path}: jobs[{i}].{d}.clat_ns.bins: no I/O counted")
                xs, ys, seen = [], [], 0
                for ns, n in bins:
                    seen += n
                    xs.append(ns / 1000.0)
                    ys.append(seen / total)
            else:
                pct = clat.get("percentile")
                if not isinstance(pct, dict) or not pct:
                    raise InputError(f"{path}: jobs[{i}].{d}.clat_ns has neither bins nor percentile")
                try:
                    pts = sorted((float(p) / 100.0, float(v) / 1000.0) for p, v in pct.items())
                    pts.append((1.0, float(clat["max"]) / 1000.0))
                except (ValueError, KeyError, TypeError):
                    raise InputError(f"{path}: jobs[{i}].{d}.clat_ns.percentile: not {{percent: ns}}") from None
                xs, ys = [x for _, x in pts], [y for y, _ in pts]
            out.append((f"{os.path.basename(path)}: {d}, {desc}", xs, ys))
    if not out:
        raise InputError(f"{path}: no I/O in the report (no job's read or write clat_ns has N > 0)")
    return out


def bench_cdfs(path):
    """[(label, [latency_us...], [fraction...])] of an rblk-bench report: fio's layout (-o json+
    or json), or rblk-bench's earlier one (--json)."""
    doc = read_json(path)
    if isinstance(doc, dict) and "jobs" in doc:
        return fio_cdfs(doc, path)
    job = field(doc, path, ["job"], dict)
    desc = f"{field(doc, path, ['job', 'rw'], str)} bs={number(doc, path, ['job', 'bs']):.0f} " \
           f"QD{number(doc, path, ['job', 'iodepth']):.0f}"
    if job.get("jobs", 1) != 1:
        desc += f" x{job['jobs']}"
    out = []
    for d in ("read", "write"):
        cdf = field(doc, path, [d, "lat_cdf"], list)
        if not cdf:
            continue
        xs, ys = [], []
        for i, p in enumerate(cdf):
            if (not isinstance(p, list) or len(p) != 2
                    or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p)):
                raise InputError(f"{path}: {d}.lat_cdf[{i}] is {json.dumps(p)[:60]}, not [us, fraction]")
            if not (0.0 <= p[1] <= 1.0) or p[0] < 0:
                raise InputError(f"{path}: {d}.lat_cdf[{i}] = {p}: not a latency and a fraction in [0, 1]")
            if xs and (p[0] < xs[-1] or p[1] < ys[-1]):
                raise InputError(f"{path}: {d}.lat_cdf[{i}] = {p} falls below the point before it")
            xs.append(float(p[0]))
            ys.append(float(p[1]))
        out.append((f"{os.path.basename(path)}: {d}, {desc}", xs, ys))
    if not out:
        raise InputError(f"{path}: no I/O in the report (read.lat_cdf and write.lat_cdf are empty)")
    return out


# What each fio log kind holds: (y label, divisor of the logged value).
LOG_KINDS = {
    "iops": ("IOPS", 1.0),
    "bw": ("bandwidth, KiB/s", 1.0),
    "lat": ("mean latency, us", 1000.0),  # logged in ns, as fio 3 does
    "clat": ("mean completion latency, us", 1000.0),
    "slat": ("mean submission latency, us", 1000.0),
}
LOG_NAME = re.compile(r"_(iops|bw|lat|clat|slat)(\.\d+)?\.log$")
LOG_LINE = re.compile(r"^\s*(\d+),\s*(\d+),\s*([01]),\s*(\d+)(?:,\s*(\d+))*\s*$")


def log_kind(path):
    m = LOG_NAME.search(os.path.basename(path))
    if not m:
        raise InputError(f"{path}: not a fio log name (PREFIX_iops.N.log, PREFIX_bw.N.log or PREFIX_lat.N.log)")
    return m.group(1)


def fio_log(path):
    """{direction: ([seconds...], [value...])} of a fio-format log: "msec, value, dir, bs[, ...]"."""
    series = {}
    text = read_text(path)
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = LOG_LINE.match(line)
        if not m:
            raise InputError(f"{path}: line {n}: expected 'msec, value, direction (0|1), blocksize, offset', "
                             f"got {line[:80]!r}")
        ms, value, d = int(m.group(1)), int(m.group(2)), int(m.group(3))
        ts, vs = series.setdefault(d, ([], []))
        if ts and ms / 1000.0 < ts[-1]:
            raise InputError(f"{path}: line {n}: time {ms} ms goes back (the line before: {ts[-1] * 1000:.0f} ms)")
        ts.append(ms / 1000.0)
        vs.append(value)
    if not series:
        raise InputError(f"{path}: no samples (an empty log)")
    return series


def compare_summary(path):
    """The bars of compare-rxe.sh's summary.json: [(panel title, unit note, [bar...])], a bar
    being (label, ratio or None, goal text or None, met: True/False/None)."""
    doc = read_json(path)
    workloads = field(doc, path, ["workloads"], dict)
    if not workloads:
        raise InputError(f"{path}: workloads is empty")
    verbs = []
    for key, w in workloads.items():
        ratio = number(workloads, path, [key, "ratio"], optional=True)
        goal = w.get("goal")
        verbs.append((key.replace("_", " "), ratio, goal, w.get("goal_met")))
    panels = [("rblk-bench / perftest (same workload, same device)", "ops/s rows: higher is better; "
               "p50 latency rows: lower is better", verbs)]
    block = doc.get("block_devices")
    if block:
        if not isinstance(block, dict):
            raise InputError(f"{path}: block_devices is not an object")
        bars = []
        for key, b in block.items():
            ratios = field(block, path, [key, "ratios"], dict)
            goals = field(block, path, [key, "goals"], list)
            name = key.removeprefix("block_").replace("_", " ")
            # Every path against NVMe-oF; against rblk-bench only where a goal says so.
            for rkey in ratios:
                if "_vs_" not in rkey:
                    raise InputError(f"{path}: block_devices.{key}.ratios.{rkey}: not PATH_vs_REFERENCE")
                r = number(ratios, path, [rkey], optional=True)
                path_name, ref = rkey.split("_vs_", 1)
                g = [x for x in goals if isinstance(x, dict) and x.get("path") == path_name
                     and str(x.get("goal", "")).startswith(f"{path_name}/{ref} ")]
                if ref != "nvmeof" and not g:
                    continue
                text = g[0].get("text") if g else None
                met = g[0].get("met") if g else None
                bars.append((f"{name}: {path_name} / {ref.replace('rblk_bench', 'bench')}", r, text, met))
        panels.append(("block devices (fio 4k, 1 job): path / reference", "IOPS rows: higher is better; "
                       "p50 rows: lower is better", bars))
    return panels, doc


# ---------------------------------------------------------------------------------------------
# Drawing


def pyplot():
    try:
        import matplotlib
    except ImportError as e:
        raise InputError(f"matplotlib is not importable by {sys.executable} ({e}); "
                         "install Debian's python3-matplotlib (scripts/deps.sh does) and run "
                         "this with /usr/bin/python3") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig, out):
    try:
        fig.savefig(out, dpi=110, bbox_inches="tight")
    except OSError as e:
        raise InputError(f"cannot write {out}: {e.strerror}") from None


def draw_cdf(args):
    lines = [line for p in args.inputs for line in bench_cdfs(p)]
    plt = pyplot()
    fig, (ax, tail) = plt.subplots(1, 2, figsize=(13, 5.5))
    for label, xs, ys in lines:
        ax.step(xs, [y * 100 for y in ys], where="post", label=label)
        # The tail: the share of I/Os slower than x, on a log axis (the last point, 0, has none).
        pts = [(x, 1.0 - y) for x, y in zip(xs, ys) if y < 1.0]
        if pts:
            tail.step([p[0] for p in pts], [p[1] * 100 for p in pts], where="post", label=label)
    for a in (ax, tail):
        a.set_xscale("log")
        a.set_xlabel("latency, us (submission to completion; log scale)")
        a.grid(True, which="both", alpha=0.3)
    ax.set_ylabel("I/Os at or below, %")
    ax.set_ylim(0, 100.5)
    ax.legend(fontsize="small", loc="lower right")
    ax.set_title("CDF")
    tail.set_yscale("log")
    tail.set_ylabel("I/Os slower, % (log scale)")
    tail.set_title("tail: 1 - CDF")
    fig.suptitle(args.title or "rblk-bench latency")
    fig.tight_layout()
    save(fig, args.output)


def draw_series(args):
    kinds = {p: log_kind(p) for p in args.inputs}
    if len(set(kinds.values())) > 1:
        raise InputError("one kind of log per chart, got " + ", ".join(f"{p} ({k})" for p, k in kinds.items()))
    ylabel, div = LOG_KINDS[next(iter(kinds.values()))]
    data = [(p, fio_log(p)) for p in args.inputs]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 5))
    for p, series in data:
        for d, (ts, vs) in sorted(series.items()):
            ax.plot(ts, [v / div for v in vs], marker=".", markersize=3, linewidth=1,
                    label=f"{os.path.basename(p)}: {('read', 'write')[d]}")
    ax.set_xlabel("seconds into the measured window")
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title(args.title or f"rblk-bench {ylabel} over time")
    save(fig, args.output)


def draw_compare(args):
    panels, doc = compare_summary(args.inputs[0])
    plt = pyplot()
    heights = [max(2.0, 0.32 * len(bars) + 1.0) for _, _, bars in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, sum(heights) + 0.6),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (title, note, bars) in zip(axes[:, 0], panels):
        ys = list(range(len(bars)))[::-1]
        colors = {True: "#4c9a2a", False: "#c0392b", None: "#8c8c8c"}
        vals = [b[1] if b[1] is not None else 0.0 for b in bars]
        ax.barh(ys, vals, color=[colors[b[3]] for b in bars], height=0.65)
        top = max([v for v in vals] + [1.0])
        for y, (label, r, goal, met) in zip(ys, bars):
            text = "unavailable" if r is None else f"{r:.3f}"
            if goal:
                text += f"  (goal {goal.removeprefix('ratio ')}{'' if met is None else ', met' if met else ', MISSED'})"
            ax.text((r or 0.0) + top * 0.01, y, text, va="center", fontsize=8)
            m = re.search(r"([<>]=)\s*([0-9.]+)", goal or "")
            if m and r is not None:
                g = float(m.group(2))
                ax.plot([g, g], [y - 0.4, y + 0.4], color="black", linewidth=1.5)
        ax.axvline(1.0, color="black", linewidth=0.6, linestyle=":")
        ax.set_yticks(ys)
        ax.set_yticklabels([b[0] for b in bars], fontsize=8)
        ax.set_xlim(0, top * 1.45)
        ax.set_xlabel(f"ratio ({note}); black tick: goal", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(True, axis="x", alpha=0.3)
    guest = doc.get("guest") or {}
    sub = (f"{doc.get('date', '?')}: {doc.get('rounds', '?')} round(s) of {doc.get('secs', '?')} s, one qemu TCG boot, "
           f"guest kernel {guest.get('kernel', '?')}, rxe MTU {guest.get('active_mtu', '?')}")
    fig.suptitle((args.title or "scripts/compare-rxe.sh") + "\n" + sub, fontsize=10)
    fig.tight_layout()
    save(fig, args.output)


def main(argv):
    ap = argparse.ArgumentParser(prog="plot.py", formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    sub = ap.add_subparsers(dest="what", required=True, metavar="{cdf,series,compare}")
    for name, fn, nargs, helptext in [
        ("cdf", draw_cdf, "+", "latency CDF from rblk-bench's JSON reports (fio's layout, or --json's)"),
        ("series", draw_series, "+", "IOPS (or KiB/s, latency) over time from fio-format logs"),
        ("compare", draw_compare, 1, "compare-rxe.sh's summary.json as bar charts of ratios and goals"),
    ]:
        p = sub.add_parser(name, help=helptext)
        p.add_argument("-o", "--output", required=True, metavar="OUT.png", help="the PNG to write")
        p.add_argument("--title", help="the chart's title")
        p.add_argument("inputs", nargs=nargs, metavar="FILE")
        p.set_defaults(fn=fn)
    args = ap.parse_args(argv)
    try:
        args.fn(args)
    except InputError as e:
        print(f"plot.py: error: {e}", file=sys.stderr)
        return 1
    print(f"plot.py: wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
