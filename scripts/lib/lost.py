"""scripts/lost-rxe.sh's analysis: how soon each initiator reports a SIGKILLed target (issue 42).

Two uses:
  lost.py run CASE DIR   (in the guest, after one case) reads DIR/watch.out (the bare peer's
      `disconnected UNIX_SECONDS`) and DIR/init.log (the initiator's log, tracing's format: its
      first "the session to the target was lost" line); prints
        @@lost CASE WATCH_UNIX LOSS_UNIX     (- for what is missing)
  lost.py table GUEST_LOG   (on the host) reads those and `@@kill CASE UNIX_SECONDS` and prints
      per case the bare peer's and the initiator's time after the SIGKILL and their difference,
      against the goal.
"""

import datetime
import os
import re
import sys

# The goal (issue 42): the initiator's report at most this long after the bare peer's.
GOAL_MS = 10.0
LOSS_LINE = "the session to the target was lost"


def unix(line):
    """The Unix time of a tracing line's RFC 3339 stamp, or None."""
    m = re.search(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z", line)
    if not m:
        return None
    return datetime.datetime.fromisoformat(m.group(1)).replace(tzinfo=datetime.timezone.utc).timestamp()


def watched(lines):
    """The bare peer's `disconnected UNIX` time, or None."""
    for line in lines:
        p = line.split()
        if len(p) == 2 and p[0] == "disconnected":
            try:
                return float(p[1])
            except ValueError:
                return None
    return None


def reported(lines):
    """The stamp of the initiator's first loss line, or None."""
    for line in lines:
        if LOSS_LINE in line:
            t = unix(line)
            if t is not None:
                return t
    return None


def run_line(case, d):
    def read(name):
        try:
            with open(os.path.join(d, name), errors="replace") as f:
                return f.read().splitlines()
        except OSError:
            return []

    show = lambda t: "-" if t is None else f"{t:.6f}"  # noqa: E731
    return f"@@lost {case} {show(watched(read('watch.out')))} {show(reported(read('init.log')))}"


def parse(lines):
    """{case: {"kill": t, "watch": t, "loss": t}} (None for `-`), in the order cases appear."""
    out = {}
    num = lambda v: None if v == "-" else float(v)  # noqa: E731
    for line in lines:
        p = line.split()
        try:
            if len(p) == 3 and p[0] == "@@kill":
                out.setdefault(p[1], {})["kill"] = float(p[2])
            elif len(p) == 4 and p[0] == "@@lost":
                out.setdefault(p[1], {}).update(watch=num(p[2]), loss=num(p[3]))
        except ValueError:
            continue
    return out


def rows(cases):
    """[(case, bare peer ms after the kill, initiator ms after the kill, difference ms, met)]; a
    missing time is None and the goal is not met."""
    out = []
    for case, t in cases.items():
        kill, watch, loss = t.get("kill"), t.get("watch"), t.get("loss")
        after = lambda x: None if x is None or kill is None else (x - kill) * 1e3  # noqa: E731
        diff = None if watch is None or loss is None else (loss - watch) * 1e3
        out.append((case, after(watch), after(loss), diff, diff is not None and diff <= GOAL_MS))
    return out


def table(lines):
    show = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    out = ["| case | bare peer sees DISCONNECTED, ms after SIGKILL | initiator's loss line, ms after SIGKILL | "
           f"difference ms (goal <= {GOAL_MS:.0f}) | met |", "|---|---|---|---|---|"]
    for case, w, l, d, ok in rows(parse(lines)):
        out.append(f"| {case} | {show(w)} | {show(l)} | {show(d)} | {'yes' if ok else 'NO'} |")
    return out


def main(argv):
    if len(argv) == 4 and argv[1] == "run":
        print(run_line(argv[2], argv[3]))
        return 0
    if len(argv) == 3 and argv[1] == "table":
        with open(argv[2], errors="replace") as f:
            print("\n".join(table(f.read().splitlines())))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
