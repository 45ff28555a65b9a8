"""scripts/takeover-rxe.sh's analysis: a ublk takeover's pause, stage by stage (issue 42, item 4).

Two uses:
  recovery.py run KIND DIR   (in the guest, after one run) reads DIR/attach2.err and
      DIR/attach2.log (the new `rblk attach`'s log, tracing's format, before and after it became
      a daemon), DIR/target.log, DIR/trace.txt (tracefs: the
      `rblk-kill UNIX_SECONDS` marker and block:block_rq_* events of the ublk device),
      DIR/lat_*.log (fio's completions, Unix ms) and DIR/fio.out (terse v3); prints
        @@stage KIND NAME UNIX_SECONDS     one per stage found
        @@fio KIND ERRORS READ_MAX_MS WRITE_MAX_MS LONGEST_GAP_MS
  recovery.py table GUEST_LOG   (on the host) reads those lines, the script's own `@@stage` lines
      (kill, gone, exec, attached) and `@@flush KIND BEFORE_MS FIRST_MS FIRST_BYTES SMALL_MS
      SMALL_BYTES`, and prints each kind's stages in time order, from the SIGKILL, with whose each
      step is (the kernel's, rblk's, or the workload's).
"""

import glob
import os
import sys

import guestlog

# The new attach's log lines (initiator/cli/src/ublk.rs) and the stage each marks.
ATTACH_STAGES = (
    ("recovery: found the dead server's device", "found"),
    ("recovery: session taken over", "session"),
    ("recovery: START_USER_RECOVERY done", "start_recovery"),
    ("recovery: serving again", "serving"),
)

# Whose time each step (from the stage before) is, for the table.
OWNER = {
    "gone": "kernel: the process's exit",
    "requeue": "kernel: the dead server's requests requeued",
    "exec": "script: the next `rblk attach` starts",
    "found": "rblk: start, find the dead server's device",
    "target_open": "rblk + target: connect, resume the session (target's OPEN)",
    "session": "rblk: the session taken over",
    "start_recovery": "kernel: START_USER_RECOVERY",
    "serving": "rblk + kernel: queues up, END_USER_RECOVERY",
    "first_complete": "kernel: reissue, the first request completed again",
    "fio_first": "fio: its first completion after the kill",
    "attached": "script: `rblk attach --daemon` returned",
}


def attach_stages(lines):
    """{stage: unix} from the new attach's log (the first line of each)."""
    out = {}
    for line in lines:
        for text, name in ATTACH_STAGES:
            if text in line and name not in out:
                t = guestlog.log_time(line)
                if t is not None:
                    out[name] = t
    return out


def target_open(lines, after):
    """The first OPEN the target answered after Unix time `after`, or None."""
    for line in lines:
        if "control: opened" in line:
            t = guestlog.log_time(line)
            if t is not None and t > after:
                return t
    return None


def trace_stages(lines):
    """{stage: unix} from tracefs output: the marker `rblk-kill UNIX` ties the trace clock to Unix
    time (its stage `kill`); then the first block_rq_requeue and the first block_rq_complete after it."""
    kill, events = guestlog.trace_after_marker(lines, "rblk-kill")
    out = {} if kill is None else {"kill": kill}
    for t, event, _ in events:
        name = {"block_rq_requeue": "requeue", "block_rq_complete": "first_complete"}.get(event)
        if name and name not in out:
            out[name] = t
    return out


def run_lines(kind, d, kill):
    """The `@@` lines of one run in `d`; `kill` is the SIGKILL's Unix time (None: from the trace)."""
    def read(name):
        return guestlog.read_lines(d, name)

    stages = {}
    stages.update(trace_stages(read("trace.txt")))
    # Before it serves, the new attach logs to stderr; then to its log file.
    stages.update(attach_stages(read("attach2.err") + read("attach2.log")))
    base = kill if kill is not None else stages.get("kill", min(stages.values(), default=0.0))
    t = target_open(read("target.log"), base)
    if t is not None:
        stages["target_open"] = t
    times = guestlog.fio_log_times(line for path in sorted(glob.glob(os.path.join(d, "lat_clat.*.log")))
                                   for line in read(os.path.basename(path)))
    after = [x for x in times if x / 1e3 > base]
    if after:
        stages["fio_first"] = after[0] / 1e3
    out = [f"@@stage {kind} {name} {t:.6f}" for name, t in sorted(stages.items(), key=lambda kv: kv[1])]
    gap = max((b - a for a, b in zip(times, times[1:])), default=None)
    terse = guestlog.fio_terse("\n".join(read("fio.out")))
    e, rmax, wmax = terse if terse else ("-", "-", "-")
    fmt = lambda v: v if isinstance(v, str) else f"{v:.0f}"  # noqa: E731
    out.append(f"@@fio {kind} {fmt(e)} {fmt(rmax)} {fmt(wmax)} {'-' if gap is None else gap}")
    return out


def parse(lines):
    """({kind: {stage: unix}}, {kind: fio fields}, {kind: flush fields}) from a guest log."""
    stages, fio, flush = {}, {}, {}
    for line in lines:
        p = line.split()
        if len(p) >= 4 and p[0] == "@@stage":
            try:
                t = float(p[3])
            except ValueError:
                continue
            stages.setdefault(p[1], {}).setdefault(p[2], t)
        elif len(p) >= 6 and p[0] == "@@fio":
            fio[p[1]] = p[2:6]
        elif len(p) >= 7 and p[0] == "@@flush":
            flush[p[1]] = p[2:7]
    return stages, fio, flush


def breakdown(stages):
    """[(stage, ms since the kill, ms since the stage before, whose)] in time order; [] without
    a kill."""
    kill = stages.get("kill")
    if kill is None:
        return []
    rows, prev = [], kill
    for name, t in sorted(stages.items(), key=lambda kv: kv[1]):
        if name == "kill":
            continue
        rows.append((name, (t - kill) * 1e3, (t - prev) * 1e3, OWNER.get(name, "")))
        prev = t
    return rows


def table(lines):
    stages, fio, flush = parse(lines)
    out = []
    for kind in sorted(stages):
        out += [f"## {kind}", "", "| stage | ms after SIGKILL | step ms | whose step |", "|---|---|---|---|"]
        out += [f"| {n} | {at:.0f} | {step:.0f} | {who} |" for n, at, step, who in breakdown(stages[kind])]
        if kind in fio:
            e, rmax, wmax, gap = fio[kind]
            out.append(f"\nfio: errors {e}; longest read {rmax} ms, write {wmax} ms; longest gap between "
                       f"completions {gap} ms")
        if kind in flush:
            before, first, first_b, small, small_b = flush[kind]
            out.append(f"first FLUSH after the takeover {first} ms ({first_b} bytes written back); a 4 KiB "
                       f"write's FLUSH {small} ms ({small_b} bytes); before the takeover {before} ms")
        out.append("")
    return out


def main(argv):
    return guestlog.main(argv, __doc__, lambda kind, d: run_lines(kind, d, None), table, 2)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
