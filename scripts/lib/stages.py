"""Where a request's time goes inside `rblk attach`'s queue thread: the reader of the stage log
that `rblk attach --stage-log FILE` writes per queue (FILE.q0, ...; initiator/cli/src/stages.rs),
for scripts/stages-rxe.sh (issue 23).

    python3 scripts/lib/stages.py FILE.q0 [--window SECS] [--json]

Per request (one tag's stages, in order), the median and mean microseconds of:
    seen -> submitted       the tag's task read the request and staged it on the lane
    submitted -> posted     until the lane posted it to the queue pair (its doorbell included)
    posted -> done          the RDMA operation, until the thread saw it finished
    done -> resumed         until the tag's task ran again and queued its COMMIT_AND_FETCH
    resumed -> entered      until an io_uring_enter (or the sleep's) carried that COMMIT to the
                            kernel (the system call included)
    entered -> next seen    only at queue depth 1 (no other request outstanding when the COMMIT
                            was entered): the kernel's completion, fio's turnaround and the next
                            request reaching the thread
and, for the thread: the share of its time in the loop's wait (spinning and asleep) and in running
the tasks, and per request how many loop passes, io_uring_enter calls and sleeps it took.

--window SECS keeps only the last SECS seconds before the last request (leaving out the reads of
the partition scan at attach and anything before the measured run); default: everything from the
first request to the last.

scripts/stages-rxe.sh also runs, in the guest and on the host:

    python3 scripts/lib/stages.py fio-row FIO_JSON          # "IOPS P50_US" of fio's read, one line
    python3 scripts/lib/stages.py summarize LOG SUMMARY_JSON TABLE_TXT

summarize reads the guest's log (@@meta, @@row, @@fail lines and each row's stage log, gzip and
base64 between @@stagelog NAME and @@endstagelog), keeps each stage log beside SUMMARY_JSON
(NAME with - for spaces, .q0), prints the table and writes both files; its exit status is 1 when
no row has stages.
"""
import base64
import gzip
import json
import os
import statistics
import sys

# The stage names this reader needs; their numbers come from the file's header.
NEEDED = ("seen", "submitted", "posted", "done", "resumed", "enter_post", "enter_collect", "sleep", "woke",
          "run_ops", "run_ops_end", "wait", "wait_end")
PER_REQUEST = ("seen -> submitted", "submitted -> posted", "posted -> done", "done -> resumed",
               "resumed -> entered", "entered -> next seen")


class StageLogError(Exception):
    pass


def read(path):
    """(names by number, [(ns, stage name, arg)], header fields) of one stage log."""
    with open(path) as f:
        head = f.readline()
        if not head.startswith("# rblk stage log 1:"):
            raise StageLogError(f"{path}: not an rblk stage log (format 1): {head.strip()[:80]!r}")
        fields = {}
        for part in head.split(";")[1:]:
            k, _, v = part.strip().partition(" ")
            fields[k] = v
        names = {}
        for item in fields.get("stages", "").split(","):
            num, _, name = item.partition("=")
            if num.isdigit():
                names[int(num)] = name
        missing = [n for n in NEEDED if n not in names.values()]
        if missing:
            raise StageLogError(f"{path}: the header names no {', '.join(missing)}")
        events = []
        for lineno, line in enumerate(f, 2):
            parts = line.split()
            if len(parts) != 3 or not all(p.isdigit() for p in parts):
                raise StageLogError(f"{path}:{lineno}: not 'NS STAGE ARG': {line.strip()[:80]!r}")
            ns, num, arg = map(int, parts)
            if num not in names:
                raise StageLogError(f"{path}:{lineno}: unknown stage {num}")
            events.append((ns, names[num], arg))
    return events, fields


def _summary(xs):
    if not xs:
        return None
    return {"n": len(xs), "median_us": statistics.median(xs) / 1000, "mean_us": statistics.mean(xs) / 1000}


def analyse(events, window_s=None):
    """The figures the module's documentation lists, as a dict."""
    seen_ts = [t for t, s, _ in events if s == "seen"]
    if not seen_ts:
        raise StageLogError("no request in the log")
    end = seen_ts[-1]
    start = seen_ts[0] if window_s is None else max(seen_ts[0], end - int(window_s * 1e9))
    ev = [e for e in events if start <= e[0] <= end]

    stages = {k: [] for k in PER_REQUEST}
    at = {}  # tag -> (stage, ns) of its last event
    outstanding = set()  # tags between seen and their COMMIT's enter
    staged, committing = [], []  # tags submitted and not yet posted; resumed and not yet entered
    next_seen_from = None
    counts = {s: 0 for s in NEEDED}
    loop_ns = {"wait": 0, "run_ops": 0, "asleep": 0}
    opened = {}
    spin_passes = 0
    for t, s, arg in ev:
        counts[s] += 1
        if s in ("seen", "submitted", "done", "resumed"):
            tag = arg
            prev = at.get(tag)
            if s == "seen":
                outstanding.add(tag)
                if next_seen_from is not None:
                    stages["entered -> next seen"].append(t - next_seen_from)
                    next_seen_from = None
            elif prev is not None:
                # seen -> submitted, posted -> done (from the post), done -> resumed
                if s == "submitted" and prev[0] == "seen":
                    stages["seen -> submitted"].append(t - prev[1])
                elif s == "done" and prev[0] == "posted":
                    stages["posted -> done"].append(t - prev[1])
                elif s == "resumed" and prev[0] == "done":
                    stages["done -> resumed"].append(t - prev[1])
            at[tag] = (s, t)
            if s == "submitted":
                staged.append(tag)
            elif s == "resumed":
                committing.append(tag)
        elif s == "posted":
            for tag in staged:
                prev = at.get(tag)
                if prev and prev[0] == "submitted":
                    stages["submitted -> posted"].append(t - prev[1])
                    at[tag] = ("posted", t)
            staged = []
        elif s in ("enter_post", "enter_collect", "sleep"):
            for tag in committing:
                prev = at.get(tag)
                if prev and prev[0] == "resumed":
                    stages["resumed -> entered"].append(t - prev[1])
                outstanding.discard(tag)
            # Depth 1: this enter carried the only outstanding request's COMMIT.
            if committing and not outstanding:
                next_seen_from = t
            committing = []
        if s == "wait_end":
            spin_passes += arg
        if s in ("wait", "run_ops", "sleep"):
            opened[s] = t
        elif s in ("wait_end", "run_ops_end", "woke"):
            key = {"wait_end": "wait", "run_ops_end": "run_ops", "woke": "sleep"}[s]
            if key in opened:
                loop_ns["asleep" if key == "sleep" else key] += t - opened.pop(key)
    span = max(end - start, 1)
    n = counts["seen"]
    return {
        "requests": n,
        "span_s": span / 1e9,
        "stages": {k: _summary(v) for k, v in stages.items()},
        "thread_share": {k: v / span for k, v in loop_ns.items()},
        # Time waiting but not asleep, per pass of the spin: what noticing work costs.
        "spin_pass_us": ((loop_ns["wait"] - loop_ns["asleep"]) / spin_passes / 1000) if spin_passes else None,
        "per_request": {
            "loop_passes": counts["wait"] / n,
            "io_uring_enter": (counts["enter_post"] + counts["enter_collect"] + counts["sleep"]) / n,
            "sleeps": counts["sleep"] / n,
            "posts": counts["posted"] / n,
        },
    }


def table(r, title):
    out = [f"{title}: {r['requests']} requests in {r['span_s']:.1f} s, from the queue thread's own timestamps"]
    out.append(f"  {'stage':<24} {'median us':>9} {'mean us':>9} {'n':>7}")
    for k in PER_REQUEST:
        s = r["stages"][k]
        if s is None:
            out.append(f"  {k:<24} {'n/a':>9} {'':>9} {0:>7}")
        else:
            out.append(f"  {k:<24} {s['median_us']:>9.1f} {s['mean_us']:>9.1f} {s['n']:>7}")
    sh, pr = r["thread_share"], r["per_request"]
    out.append(f"  thread: waiting {sh['wait'] * 100:.0f}% (asleep {sh['asleep'] * 100:.0f}%), running tasks "
               f"{sh['run_ops'] * 100:.0f}%; per request: {pr['loop_passes']:.2f} loop passes, "
               f"{pr['io_uring_enter']:.2f} io_uring_enter, {pr['sleeps']:.2f} sleeps, {pr['posts']:.2f} doorbells")
    if r.get("spin_pass_us") is not None:
        out.append(f"  one pass of the wait's spin (time waiting awake / passes): {r['spin_pass_us']:.1f} us")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------
# scripts/stages-rxe.sh: the guest's log of one boot to its table and summary.json.

def fio_row(doc):
    """'IOPS P50_US' of the read side of fio's JSON output (its first job): the @@row line's
    figures."""
    j = doc["jobs"][0]["read"]
    return "%.0f %.1f" % (j["iops"], j["clat_ns"]["percentile"]["50.000000"] / 1000)


def read_guest_log(lines):
    """(meta, rows, failures, stage logs) of the guest's log: rows {name: {"iops", "p50_us"}} from
    @@row, failures [{"row", "error"}] from @@fail, stage logs [(name, [base64 lines])] in their
    order."""
    meta, rows, fails, logs, block, name = {}, {}, [], [], None, None
    for line in lines:
        line = line.rstrip("\r\n")
        if block is not None:
            if line == "@@endstagelog":
                logs.append((name, block))
                block = None
            else:
                block.append(line)
        elif line.startswith("@@meta "):
            k, _, v = line[7:].partition(" ")
            meta[k] = v
        elif line.startswith("@@row "):
            *n, iops, p50 = line[6:].split()
            rows.setdefault(" ".join(n), {}).update(iops=float(iops), p50_us=float(p50))
        elif line.startswith("@@stagelog "):
            name, block = line[11:], []
        elif line.startswith("@@fail "):
            kind, qd, msg = line[7:].split(" ", 2)
            fails.append({"row": f"{kind} {qd}", "error": msg})
    return meta, rows, fails, logs


def analyse_stage_logs(meta, rows, fails, logs, out_dir):
    """Decodes each stage log into out_dir (NAME.q0, spaces as -: kept for another reading with
    `stages.py FILE`) and adds its analyse() over the last `secs` seconds (@@meta secs, default 5)
    to its row as "stages"; a log that cannot be decoded or read adds a failure instead."""
    for name, block in logs:
        path = os.path.join(out_dir, name.replace(" ", "-") + ".q0")
        try:
            data = gzip.decompress(base64.b64decode("".join(block)))
            with open(path, "wb") as g:
                g.write(data)
            events, _ = read(path)
            rows.setdefault(name, {})["stages"] = analyse(events, float(meta.get("secs", "5")))
        except (OSError, ValueError, EOFError, StageLogError) as e:
            fails.append({"row": name, "error": f"its stage log: {e}"})


def report(meta, rows, fails):
    """The text of table.txt: a heading with the guest, then per row fio's IOPS and p50 and its
    stages' table, then the failures."""
    out = [f"rblk attach's queue thread, fio randread 4k, one boot: guest kernel {meta.get('guest_kernel', '?')}, "
           f"{meta.get('guest_cpus', '?')} vCPUs (TCG)"]
    for n, r in rows.items():
        out.append("")
        out.append(f"{n}: fio {r.get('iops', 0):,.0f} IOPS, p50 {r.get('p50_us', 0):,.1f} us")
        if "stages" in r:
            out.append(table(r["stages"], n))
    for x in fails:
        out.append(f"failed: {x['row']}: {x['error']}")
    return "\n".join(out)


def _write(path, text):
    """Writes text to path; an OSError names the path (a full disk fails at close, where Python's
    error has none)."""
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        raise OSError(e.errno, e.strerror, path) from e


def summarize(log_path, summary_path, table_path):
    """The guest's log to table.txt (also printed) and summary.json; 0 when a row has stages,
    else 1."""
    with open(log_path, errors="replace") as f:
        meta, rows, fails, logs = read_guest_log(f)
    analyse_stage_logs(meta, rows, fails, logs, os.path.dirname(summary_path))
    text = report(meta, rows, fails)
    print(text)
    _write(table_path, text + "\n")
    _write(summary_path, json.dumps({"meta": meta, "rows": rows, "failures": fails}, indent=2) + "\n")
    return 0 if any("stages" in r for r in rows.values()) else 1


def main(argv):
    if len(argv) == 2 and argv[0] == "fio-row":
        with open(argv[1]) as f:
            print(fio_row(json.load(f)))
        return 0
    if len(argv) == 4 and argv[0] == "summarize":
        try:
            return summarize(*argv[1:])
        except OSError as e:
            print(f"stages: {e.filename}: {e.strerror}", file=sys.stderr)
            return 1
    import argparse
    p = argparse.ArgumentParser(description="Summarize an rblk attach --stage-log file.")
    p.add_argument("log")
    p.add_argument("--window", type=float, help="only the last SECS seconds before the last request")
    p.add_argument("--title", default=None)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    try:
        events, fields = read(a.log)
        r = analyse(events, a.window)
    except (OSError, StageLogError) as e:
        print(f"stages: {e}", file=sys.stderr)
        return 1
    r["dropped"] = int(fields.get("dropped", "0") or 0)
    if a.json:
        print(json.dumps(r, indent=2))
    else:
        print(table(r, a.title or a.log))
        if r["dropped"]:
            print(f"  (the log was full: {r['dropped']} events were not kept)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
