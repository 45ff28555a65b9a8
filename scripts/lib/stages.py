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
"""
import json
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


def main(argv):
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
