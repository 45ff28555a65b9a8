"""Where the microseconds of one QD1 4 KiB read go: the analysis of scripts/timeline-rxe.sh's guest
log (issue 23; its header says what the guest records and what each boundary is). On the host:

    python3 scripts/lib/timeline.py summarize LOG SUMMARY_JSON TABLE_TXT

reads the log (@@meta KEY VALUE, @@path PATH KEY VALUE, @@fail PATH MESSAGE, and each path's
tracefs text, gzip and base64 between @@trace PATH and @@endtrace PATH), builds the per-I/O
timelines of the paths ublk, nvmeof and bench, prints the table and writes it to TABLE_TXT and the
figures to SUMMARY_JSON; exit status 1 when no path has analysed I/Os. In the guest:

    python3 scripts/lib/timeline.py fio-p50 FIO_JSON      # fio's read p50 in us
    python3 scripts/lib/timeline.py bench-p50 BENCH_JSON  # rblk-bench's (scripts/lib/report.py)

Per I/O (between its anchors: block_rq_issue and the block_rq_complete of the same sector, for
bench one post and the next), each boundary of SPEC is the first event of its kind after the
previous boundary seen (one with a required label only after that label was seen in this I/O);
the "pre" boundaries are the last ones before the anchor since the previous I/O ended, the "post"
ones the first after the end before the next I/O starts. A stage is the time from the previous
boundary seen to its own.
"""
import collections
import datetime
import json
import statistics
import sys

from report import bench_report, host_info
from timeline_table import summary, table
from timeline_trace import (NR_IO_URING_ENTER, END_LABEL, FIRST_POSTS, PATHS, RXE_WORK, SPEC, START_LABEL, SYS, labels, needs_missing, parse, read_log)

# ---------------------------------------------------------------------------------------------------
# One path's trace.

def stat(xs):
    """{"median_us", "mean_us", "n"} of microsecond values, None for none."""
    if not xs:
        return None
    return {"median_us": statistics.median(xs), "mean_us": statistics.fmean(xs), "n": len(xs)}


def find_windows(path, evs, info, kprobes):
    """(context, info, windows) of a path's events, or an {"error"} dict (kprobes: the functions
    probed, for the error's reason). Windows are the (start, end) event indexes of each I/O; the
    context has the path's device ("dev", the NVMe-oF target's "tdev"), fio's pids ("fio"), its
    job ("fio_job") and the serving thread ("srv"). info comes back with dev_name amended when the
    reads were found on another device (NVMe multipath)."""
    tids = [int(x) for x in info.get("tids", "").split()]
    ctx = {"dev": info.get("dev"), "tdev": info.get("target_dev")}
    cnt = collections.Counter
    if path in ("ublk", "nvmeof"):
        def is_read(e):
            return e.name == "block_rq_issue" and "R" in e.rw
        issues = [i for i, e in enumerate(evs) if is_read(e) and e.dev == ctx["dev"]]
        if not issues:
            # NVMe multipath: requests are issued on the hidden path device (nvmeXcYnZ), not on
            # nvmeXnY: take the device with the most reads that is not the target's.
            other = cnt(e.dev for e in evs if is_read(e) and e.dev != ctx["tdev"]).most_common(1)
            if other:
                ctx["dev"] = other[0][0]
                info = dict(info, dev_name=f"{info.get('dev_name')} (requests on {other[0][0]})")
                issues = [i for i, e in enumerate(evs) if is_read(e) and e.dev == ctx["dev"]]
        if not issues:
            return {"error": f"no block_rq_issue of a read on {info.get('dev_name')} ({ctx['dev']}) in the trace"}
        fio_job = cnt(evs[i].pid for i in issues).most_common(1)[0][0]
        ctx["fio"] = {e.pid for e in evs if e.comm == "fio"} | {fio_job}
        ctx["fio_job"] = fio_job
        if path == "ublk":
            cand = cnt(e.pid for e in evs if e.name == "ublk_ch_uring_cmd" and (not tids or e.pid in tids))
            if not cand:
                cand = cnt(e.pid for e in evs
                           if e.name == "sys_enter" and e.nr == NR_IO_URING_ENTER and e.pid not in ctx["fio"])
            ctx["srv"] = cand.most_common(1)[0][0] if cand else -1
        else:
            ctx["srv"] = fio_job
        # An I/O ends at the completion of its sector.
        wins = []
        for i in issues:
            s = evs[i].sector
            end = next((k for k in range(i + 1, len(evs)) if evs[k].name == "block_rq_complete"
                        and evs[k].dev == ctx["dev"] and evs[k].sector == s), None)
            if end is not None:
                wins.append((i, end))
    else:
        ctx["fio"] = set()
        posts_by = cnt(e.pid for e in evs if e.name == "rxe_post_send" and (not tids or e.pid in tids))
        if not posts_by:
            return {"error": "no rxe_post_send by rblk-bench's threads in the trace"
                    + ("" if "rxe_post_send" in kprobes else " (no kprobe rxe_post_send on this kernel)")}
        ctx["srv"] = posts_by.most_common(1)[0][0]
        posts = [i for i, e in enumerate(evs) if e.name == "rxe_post_send" and e.pid == ctx["srv"]]
        wins = list(zip(posts, posts[1:]))
    return ctx, info, wins


def io_marks(path, spec, evs, ctx, wins, w):
    """The boundaries seen in I/O w (1 <= w < len(wins) - 1: the I/Os before and after bound the
    search of the "pre" and "post" boundaries), [(label, t, event index)] in order."""
    s, e_ = wins[w]
    lo, hi = wins[w - 1][1], wins[w + 1][0]
    if path == "bench":
        lo = s
    marks = []
    for label, m, _ in spec["pre"]:
        k = next((k for k in range(s - 1, lo, -1) if m(evs[k], ctx)), None)
        if k is not None:
            marks.append((label, evs[k].t, k))
    marks.append((START_LABEL[spec["start"]], evs[s].t, s))
    pos, found = s, set()
    for label, m, req in spec["mid"]:
        if req and req not in found:
            continue
        k = next((k for k in range(pos + 1, e_) if m(evs[k], ctx)), None)
        if k is not None:
            marks.append((label, evs[k].t, k))
            found.add(label)
            pos = k
    marks.append((END_LABEL[spec["end"]], evs[e_].t, e_))
    pos = e_
    for label, m, _ in spec["post"]:
        k = next((k for k in range(pos + 1, hi) if m(evs[k], ctx)), None)
        if k is not None:
            marks.append((label, evs[k].t, k))
            pos = k
    return marks


def rxe_wakeup(evs, marks, wins, w):
    """For I/O w: (whether rxe's first work item after the first post ran on a vCPU that was idle
    at the post: a switch from the idle task there in between, post -> item us, how long that
    vCPU had been idle before the post in us or None), or None when the I/O saw no post and
    item in that order."""
    post_k = next((k for label, _, k in marks if label in FIRST_POSTS), None)
    work_k = next((k for label, _, k in marks if label == RXE_WORK), None)
    if post_k is None or work_k is None or work_k <= post_k:
        return None
    cpu = evs[work_k].cpu
    idle = any(evs[k].name == "sched_switch" and evs[k].a == 0 and evs[k].cpu == cpu
               for k in range(post_k + 1, work_k))
    went = next((k for k in range(post_k - 1, wins[w - 1][0], -1)
                 if evs[k].name == "sched_switch" and evs[k].cpu == cpu), None)
    idle_for = evs[post_k].t - evs[went].t if idle and went is not None and evs[went].b == 0 else None
    return idle, evs[work_k].t - evs[post_k].t, idle_for


def span_counts(span, srv, fio_job, ios):
    """Per I/O over the analysed events: the serving thread's system calls (io_uring_enter and
    all, by name, most first), its context switches (sched_switch away from it) and the
    involuntary ones (it was runnable), fio's job's (None without one) and the io_uring events."""
    cnt = collections.Counter
    sc = cnt(SYS.get(e.nr, f"nr{e.nr}") for e in span if e.name == "sys_enter" and e.pid == srv)
    sw_srv = [e for e in span if e.name == "sched_switch" and e.a == srv]
    sw_fio = [e for e in span if e.name == "sched_switch" and fio_job is not None and e.a == fio_job]
    invol = sum(1 for e in sw_srv if e.state.startswith("R"))
    iou = cnt(e.name for e in span if e.name.startswith("io_uring_"))
    return {
        "io_uring_enter_per_io": sc.get("io_uring_enter", 0) / ios,
        "syscalls_per_io": {k: v / ios for k, v in sc.most_common()},
        "switches_per_io": len(sw_srv) / ios, "involuntary_switches_per_io": invol / ios,
        "fio_switches_per_io": (len(sw_fio) / ios) if fio_job is not None else None,
        "io_uring_events_per_io": {k: v / ios for k, v in iou.most_common()},
    }


def stage_rows(spec, seen, per, ios, kprobes, skipped):
    """The stages of a path's table and summary: per boundary its label, the share of I/Os that
    saw it, whether it is the first, why it is missing (its function not probed: skipped or not
    on this kernel) and the median, mean and count of its stage's microseconds."""
    stages = []
    matchers = {lb: m for lb, m, _ in spec["pre"] + spec["mid"] + spec["post"]}
    for n, label in enumerate(labels(spec)):
        miss = needs_missing(matchers[label], kprobes) if label in matchers else None
        d = {"stage": label, "seen_share": seen[label] / ios, "first": n == 0}
        if miss and not seen[label]:
            d["missing"] = (f"{miss} not probed (RBLK_TIMELINE_SKIP_KPROBES)" if miss in skipped
                            else f"no kprobe {miss} on this kernel")
        s = stat(per[label])
        if s:
            d.update(s)
        stages.append(d)
    return stages


def analyse(path, text, info, kprobes, skipped):
    """One path's figures from its trace text and its @@path values (summary.json's paths.PATH),
    or {"error"}."""
    spec = SPEC[path]
    evs = parse(text)
    found = find_windows(path, evs, info, kprobes)
    if isinstance(found, dict):
        return found
    ctx, info, wins = found
    srv_comm = next((e.comm for e in evs if e.pid == ctx["srv"]), "?")
    names = labels(spec)
    per = {lb: [] for lb in names}
    seen = {lb: 0 for lb in names}
    totals = {"block": [], "app": []}
    wake = {True: [], False: []}  # post -> rxe's first work item, by whether its vCPU was idle
    idle_for = []  # how long that vCPU had been idle at the post
    ios = 0
    span_lo = span_hi = None
    # I/Os 1..n-2: each has a previous I/O's end and a next I/O's start to bound pre/post searches.
    for w in range(1, len(wins) - 1):
        s, e_ = wins[w]
        marks = io_marks(path, spec, evs, ctx, wins, w)
        ios += 1
        wk = rxe_wakeup(evs, marks, wins, w)
        if wk is not None:
            wake[wk[0]].append(wk[1])
            if wk[2] is not None:
                idle_for.append(wk[2])
        for n, (label, t, _) in enumerate(marks):
            seen[label] += 1
            if n > 0:
                per[label].append(t - marks[n - 1][1])
        totals["block"].append(evs[e_].t - evs[s].t)
        if spec["pre"] and spec["post"] and marks[0][0] == spec["pre"][0][0] and marks[-1][0] == spec["post"][-1][0]:
            totals["app"].append(marks[-1][1] - marks[0][1])
        span_lo = s if span_lo is None else span_lo
        span_hi = e_ if path == "bench" else wins[w + 1][0]
    if not ios:
        return {"error": f"too few complete I/Os in the trace ({len(wins)})"}

    # Per-I/O counts over the analysed span (from the first analysed I/O's start to the last one's end).
    counts = span_counts(evs[span_lo:span_hi], ctx["srv"], ctx.get("fio_job"), ios)
    return {
        "title": spec["title"], "device": info.get("dev_name"), "ios": ios,
        "serving_thread": {"tid": ctx["srv"], "comm": srv_comm}, "fio_job": ctx.get("fio_job"),
        "stages": stage_rows(spec, seen, per, ios, kprobes, skipped),
        "total_block_us": stat(totals["block"]), "total_app_us": stat(totals["app"]),
        **counts,
        "rxe_worker": {"idle_share": len(wake[True]) / (len(wake[True]) + len(wake[False])),
                       "from_idle_us": stat(wake[True]), "from_busy_us": stat(wake[False]),
                       "idle_before_post_us": stat(idle_for)} if wake[True] or wake[False] else None,
        "fio_p50_us": float(info["fio_p50_us"]) if info.get("fio_p50_us") else None,
        "bench_p50_us": info.get("bench_p50_us") or None,
        "trace_events": len(evs),
    }


def analyse_all(log):
    """analyse() of every path of the log, in PATHS' order: a path without a trace, or whose
    analysis failed (a parser bug must not lose the other paths), gets an {"error"}."""
    kprobes = set(log.meta.get("kprobes", "").split())
    skipped = set(log.meta.get("kprobes_skipped", "").split())
    results = {}
    for p in PATHS:
        if p in log.traces:
            try:
                results[p] = analyse(p, log.traces[p], log.paths.get(p, {}), kprobes, skipped)
            except Exception as e:
                results[p] = {"error": f"cannot analyse the trace: {type(e).__name__}: {e}"}
        else:
            results[p] = {"error": "no trace (see the failures)"}
    return results


# ---------------------------------------------------------------------------------------------------
# The table and summary.json.

class SummaryError(Exception):
    """A file summarize() cannot read or write, in words for the user."""


def write_file(path, text):
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        raise SummaryError(f"cannot write {path}: {e.strerror}") from e


def summarize(log_path, summary_path, table_path):
    """The guest's log to table.txt (also printed) and summary.json; 0 when a path has analysed
    I/Os, else 1 (with the reason on stderr)."""
    try:
        with open(log_path, errors="replace") as f:
            log = read_log(f)
    except OSError as e:
        raise SummaryError(f"cannot read {log_path}: {e.strerror}") from e
    results = analyse_all(log)
    text = table(results, log.meta, log.fails, log_path)
    print(text)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    doc = summary(results, log.meta, log.fails, date, host_info())
    write_file(summary_path, json.dumps(doc, indent=2) + "\n")
    write_file(table_path, text + "\n")
    if not any("error" not in r for r in results.values()):
        print("timeline: error: no path has analysed I/Os", file=sys.stderr)
        return 1
    return 0


def fio_p50(doc):
    """fio's read completion latency p50 in us from its JSON output (its first job)."""
    return doc["jobs"][0]["read"]["clat_ns"]["percentile"]["50.000000"] / 1000


def main(argv):
    if len(argv) == 4 and argv[0] == "summarize":
        try:
            return summarize(*argv[1:])
        except SummaryError as e:
            print(f"timeline: error: {e}", file=sys.stderr)
            return 1
    if len(argv) == 2 and argv[0] in ("fio-p50", "bench-p50"):
        with open(argv[1]) as f:
            doc = json.load(f)
        print(fio_p50(doc) if argv[0] == "fio-p50" else bench_report(doc)["read"]["lat_us"]["p50"])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
