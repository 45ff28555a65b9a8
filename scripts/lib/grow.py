"""scripts/grow-rxe.sh's analysis: growing a served volume under I/O (issue 44's goals).

    grow.py GUEST_LOG SUMMARY_JSON   prints the table, writes the summary

The guest's log has, per grow (CASE small or large, ROUND 1..N):
  @@before CASE ROUND VMHWM_KB inodes INODE...   the target's peak RSS and memfd inodes before
  @@request CASE ROUND UNIX_SECONDS TO           just before `rblk-target admin resize v TO`
  @@after CASE ROUND VMHWM_KB inodes INODE...    the same, after the grow
  @@client CASE ROUND LINE                       each line of rblk-test-client grow-watch:
      ready SIZE, resized SIZE UNIX, past SIZE UNIX, error TEXT, done ios N errors E reconnects R
  @@target CASE ROUND LOG_LINE                   the target's "grew from" line (the segment made
      and the view swapped) and its "registered ... for memory windows" lines (tracing's
      format: an RFC 3339 UTC time first)
"""

import datetime
import json
import statistics
import sys

# The goals (issue 44).
RATIO_GOAL = 1.25
NOTIFY_MEDIAN_MS = 10.0
NOTIFY_MAX_MS = 100.0
RSS_SLACK = 64 << 20
CASES = {"small": "256 MiB -> 1,280 MiB", "large": "2 GiB -> 3 GiB"}


def stamp(text):
    """Unix seconds of tracing's RFC 3339 UTC time (2026-12-07T08:46:34.066768Z), or None."""
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def parse(lines):
    """{(case, round): grow} from the log's lines, in order of first appearance."""
    grows = {}

    def grow(case, rnd):
        return grows.setdefault((case, int(rnd)), {"case": case, "round": int(rnd), "errors": []})

    for line in lines:
        p = line.split()
        if len(p) < 4 or not p[0].startswith("@@"):
            continue
        g = grow(p[1], p[2])
        if p[0] in ("@@before", "@@after") and len(p) >= 5 and p[4] == "inodes":
            g[p[0][2:] + "_hwm"] = int(p[3]) * 1024
            g[p[0][2:] + "_inodes"] = p[5:]
        elif p[0] == "@@request" and len(p) >= 4:
            g["request"] = float(p[3])
        elif p[0] == "@@target":
            t = stamp(p[3])
            if t is not None and "grew from" in line:
                g["grew"] = t
            elif t is not None:
                # The last registration: the added segment's (the first were the volume's own).
                g["registered"] = t
        elif p[0] == "@@client":
            what = p[3:]
            if what[0] == "ready" and len(what) == 2:
                g["from"] = int(what[1])
            elif what[0] in ("resized", "past") and len(what) == 3:
                g.setdefault(what[0], float(what[2]))
                g["to"] = int(what[1])
            elif what[0] == "error":
                g["errors"].append(" ".join(what[1:]))
            elif what[0] == "done" and len(what) == 7:
                g["ios"], g["io_errors"], g["reconnects"] = int(what[2]), int(what[4]), int(what[6])
    return grows


def measure(g):
    """One grow's figures: ms from the request to the hook and to the first write past the old
    end, the peak RSS against the goal, and whether the old memfd is the same inode."""
    ms = lambda key: (g[key] - g["request"]) * 1e3 if key in g and "request" in g else None
    before, after = g.get("before_inodes", []), g.get("after_inodes", [])
    added = g.get("to", 0) - g.get("from", 0)
    return {
        "case": g["case"],
        "round": g["round"],
        "from": g.get("from"),
        "to": g.get("to"),
        "notify_ms": ms("resized"),
        # Where the notice's time goes: the segment made, registered for the windows (both in
        # the target), then bound and told (RESIZED) to the hook.
        "made_ms": ms("grew"),
        "registered_ms": ms("registered") if g.get("registered", 0) > g.get("request", 0) else None,
        "resize_ms": ms("past"),
        "rss": g.get("after_hwm"),
        "rss_goal": g["from"] + added + RSS_SLACK if "from" in g and "to" in g else None,
        "same_memfd": bool(before) and len(after) == len(before) + 1 and after[0] == before[0],
        "errors": g.get("io_errors", len(g["errors"])) if "io_errors" in g else None,
        "reconnects": g.get("reconnects"),
        "ios": g.get("ios"),
    }


def summarize(rows):
    """The goals over every grow: the median resize time per case and their ratio, the hook's
    latency, RSS, errors, reconnects and the memfd; each goal met or not (None: not measured)."""
    def median(case):
        v = [r["resize_ms"] for r in rows if r["case"] == case and r["resize_ms"] is not None]
        return statistics.median(v) if v else None

    small, large = median("small"), median("large")
    ratio = large / small if small and large is not None else None
    notify = [r["notify_ms"] for r in rows if r["notify_ms"] is not None]
    complete = bool(rows) and all(r["resize_ms"] is not None and r["notify_ms"] is not None for r in rows)
    s = {
        "grows": len(rows),
        "resize_ms_median": {"small": small, "large": large},
        "resize_ratio": ratio,
        "notify_ms_median": statistics.median(notify) if notify else None,
        "notify_ms_max": max(notify) if notify else None,
    }
    s["goals"] = {
        "every grow measured": complete,
        "resize ratio <= 1.25": ratio is not None and ratio <= RATIO_GOAL,
        "notify median <= 10 ms": s["notify_ms_median"] is not None and s["notify_ms_median"] <= NOTIFY_MEDIAN_MS,
        "notify max <= 100 ms": s["notify_ms_max"] is not None and s["notify_ms_max"] <= NOTIFY_MAX_MS,
        "rss <= old + added + 64 MiB": bool(rows) and all(r["rss"] is not None and r["rss"] <= r["rss_goal"] for r in rows),
        "0 errors": bool(rows) and all(r["errors"] == 0 for r in rows),
        "0 reconnects": bool(rows) and all(r["reconnects"] == 0 for r in rows),
        "old memfd unchanged": bool(rows) and all(r["same_memfd"] for r in rows),
    }
    return s


def table(rows, s):
    fmt = lambda v, f="{:.1f}": "-" if v is None else f.format(v)
    out = ["case   round  grow                  resize ms  notify ms  (made  registered)  rss MiB (goal)   ios  errors  reconnects  memfd"]
    for r in rows:
        rss = f"{fmt(r['rss'] and r['rss'] / 2**20, '{:.0f}')} ({fmt(r['rss_goal'] and r['rss_goal'] / 2**20, '{:.0f}')})"
        out.append(
            f"{r['case']:<6} {r['round']:>5}  {CASES.get(r['case'], '?'):<20} {fmt(r['resize_ms']):>10} "
            f"{fmt(r['notify_ms']):>10}  ({fmt(r.get('made_ms')):>5} {fmt(r.get('registered_ms')):>10})  {rss:<15} {fmt(r['ios'], '{}'):>5} {fmt(r['errors'], '{}'):>7} "
            f"{fmt(r['reconnects'], '{}'):>11}  {'same' if r['same_memfd'] else 'CHANGED'}"
        )
    m = s["resize_ms_median"]
    out.append(f"resize median: small {fmt(m['small'])} ms, large {fmt(m['large'])} ms, ratio {fmt(s['resize_ratio'], '{:.3f}')} (goal <= {RATIO_GOAL})")
    out.append(f"notify: median {fmt(s['notify_ms_median'])} ms (goal <= 10), max {fmt(s['notify_ms_max'])} ms (goal <= 100)")
    for goal, met in s["goals"].items():
        out.append(f"  {'met   ' if met else 'MISSED'} {goal}")
    return "\n".join(out)


def main(argv):
    if len(argv) != 3:
        print("usage: grow.py GUEST_LOG SUMMARY_JSON", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        rows = [measure(g) for g in parse(f.read().splitlines()).values()]
    s = summarize(rows)
    with open(argv[2], "w") as f:
        json.dump({"grows": rows, "summary": s}, f, indent=2)
    print(table(rows, s))
    return 0 if rows and s["goals"]["every grow measured"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
