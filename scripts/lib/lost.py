"""scripts/lost-rxe.sh's analysis: how soon each initiator reports a SIGKILLed target (issue 42).

Two uses:
  lost.py run CASE DIR   (in the guest, after one case) reads DIR/watch.out (the bare peer's
      `disconnected UNIX_SECONDS`), DIR/init.log (the initiator's log, tracing's format: its
      first "the session to the target was lost" line), DIR/trace.txt (tracefs: the marker
      `rblk-kill UNIX_SECONDS` and rdma_cma:cm_event_handler events), DIR/cm_ids.json (`rdma -j
      resource show cm_id`) and DIR/watch.pid; prints
        @@lost CASE WATCH_UNIX LOSS_UNIX     (- for what is missing)
        @@kernel CASE WATCH_EVENT_UNIX INIT_EVENT_UNIX
      the second: when the kernel delivered DISCONNECTED to the bare peer's id and first to one
      of the initiator's (its ids: the other active ones, toward the target's port).
  lost.py table GUEST_LOG   (on the host) reads those and `@@kill CASE UNIX_SECONDS` and prints
      per case the bare peer's and the initiator's time after the SIGKILL and their difference,
      against the goal.
"""

import json
import re
import sys

import guestlog

# The goal (issue 42): the initiator's report at most this long after the bare peer's.
GOAL_MS = 10.0
LOSS_LINE = "the session to the target was lost"


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
            t = guestlog.log_time(line)
            if t is not None:
                return t
    return None


def disconnects(trace):
    """[(unix, src "addr:port")] of the DISCONNECTED events after the `rblk-kill UNIX` marker
    (which ties the trace clock to Unix time), in order."""
    _, events = guestlog.trace_after_marker(trace, "rblk-kill")
    out = []
    for t, event, rest in events:
        if event == "cm_event_handler" and "DISCONNECTED" in rest:
            src = re.search(r"src=(\S+)", rest)
            out.append((t, src.group(1) if src else ""))
    return out


def owners(cm_ids, watcher_pid):
    """{src "addr:port": "watch" | "initiator"} of the rdma_cm ids connected to a listener (their
    `dst-addr` is a LISTEN id's `src-addr`) in `rdma -j resource show cm_id` output: the bare
    peer's (pid `watcher_pid`) and the initiator's (the others)."""
    listening = {e.get("src-addr") for e in cm_ids if e.get("state") == "LISTEN"}
    out = {}
    for e in cm_ids:
        if e.get("state") != "LISTEN" and e.get("dst-addr") in listening and e.get("src-addr"):
            out[e["src-addr"]] = "watch" if str(e.get("pid")) == str(watcher_pid) else "initiator"
    return out


def kernel_times(trace, cm_ids, watcher_pid):
    """(first DISCONNECTED to the bare peer, first to the initiator), Unix times or None."""
    who = owners(cm_ids, watcher_pid)
    first = {}
    for t, src in disconnects(trace):
        first.setdefault(who.get(src), t)
    return first.get("watch"), first.get("initiator")


def run_line(case, d):
    def read(name):
        return guestlog.read_lines(d, name)

    try:
        cm_ids = json.loads("\n".join(read("cm_ids.json")) or "[]")
    except ValueError:
        cm_ids = []
    pid = (read("watch.pid") or [""])[0].strip()
    show = lambda t: "-" if t is None else f"{t:.6f}"  # noqa: E731
    kw, ki = kernel_times(read("trace.txt"), cm_ids if isinstance(cm_ids, list) else [], pid)
    return (f"@@lost {case} {show(watched(read('watch.out')))} {show(reported(read('init.log')))}\n"
            f"@@kernel {case} {show(kw)} {show(ki)}")


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
            elif len(p) == 4 and p[0] == "@@kernel":
                out.setdefault(p[1], {}).update(kwatch=num(p[2]), kinit=num(p[3]))
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


def kernel_rows(cases):
    """[(case, kernel to bare peer ms, kernel to initiator ms, the bare peer's own ms (event to
    its print), the initiator's own ms (event to its loss line))] after the kill; None where a
    time is missing."""
    out = []
    for case, t in cases.items():
        kill = t.get("kill")
        d = lambda a, b: None if a is None or b is None else (b - a) * 1e3  # noqa: E731
        out.append((case, d(kill, t.get("kwatch")), d(kill, t.get("kinit")), d(t.get("kwatch"), t.get("watch")),
                    d(t.get("kinit"), t.get("loss"))))
    return out


def table(lines):
    show = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    cases = parse(lines)
    out = ["| case | bare peer sees DISCONNECTED, ms after SIGKILL | initiator's loss line, ms after SIGKILL | "
           f"difference ms (goal <= {GOAL_MS:.0f}) | met |", "|---|---|---|---|---|"]
    for case, w, l, d, ok in rows(cases):
        out.append(f"| {case} | {show(w)} | {show(l)} | {show(d)} | {'yes' if ok else 'NO'} |")
    out += ["", "The kernel's side (tracefs rdma_cma:cm_event_handler): when it delivered DISCONNECTED, and each "
            "peer's own time from that event to its report.", "",
            "| case | kernel to the bare peer, ms after SIGKILL | kernel to the initiator, ms after SIGKILL | "
            "bare peer's own ms | initiator's own ms |", "|---|---|---|---|---|"]
    for case, kw, ki, ow, oi in kernel_rows(cases):
        if kw is None and ki is None:
            continue
        out.append(f"| {case} | {show(kw)} | {show(ki)} | {show(ow)} | {show(oi)} |")
    return out


def main(argv):
    return guestlog.main(argv, __doc__, lambda case, d: run_line(case, d).splitlines(), table, 2)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
