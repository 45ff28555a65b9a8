"""What the analyses of the guest scripts that run in two steps share (handover.py, lost.py,
recovery.py): `SCRIPT.py run ...` in the guest turns one run's files into `@@` lines, and
`SCRIPT.py table GUEST_LOG` on the host turns those lines into the table.

- log_time: the time of a tracing log line (rblk's logs: an RFC 3339 stamp in UTC);
- read_lines: a run directory's file as lines, none when it is missing;
- trace_after_marker: tracefs output tied to Unix time by a `trace_marker` line;
- fio_log_times, fio_terse: fio's completion log and terse v3 output;
- main: the `run` / `table` command line.
"""

import datetime
import os
import re
import sys

_STAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z")
_TRACE = re.compile(r"\s(\d+\.\d+):\s+(\w+):\s*(.*)$")


def log_time(line):
    """The Unix time (float seconds) of the RFC 3339 UTC stamp in a tracing log line, or None."""
    m = _STAMP.search(line)
    if not m:
        return None
    return datetime.datetime.fromisoformat(m.group(1)).replace(tzinfo=datetime.timezone.utc).timestamp()


def read_lines(d, name):
    """The lines of file `name` in directory `d`; [] when it cannot be read."""
    try:
        with open(os.path.join(d, name), errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return []


def trace_after_marker(lines, marker):
    """(the marker's Unix time, [(unix, event, text)] of the events from the marker on) from
    tracefs output, where a `tracing_mark_write: MARKER UNIX_SECONDS` line ties the trace clock to
    Unix time; (None, []) without the marker."""
    offset, at, out = None, None, []
    for line in lines:
        m = _TRACE.search(line)
        if not m:
            continue
        ts, event, rest = float(m.group(1)), m.group(2), m.group(3)
        if offset is None:
            words = rest.split()
            if event == "tracing_mark_write" and len(words) == 2 and words[0] == marker:
                try:
                    at = float(words[1])
                except ValueError:
                    continue
                offset = at - ts
            continue
        out.append((ts + offset, event, rest))
    return at, out


def fio_log_times(lines):
    """The times of fio's completion log lines (`time, value, dir, bs, offset[, prio]`: ms since
    the job's start, or Unix ms with log_unix_epoch=1), sorted."""
    out = []
    for line in lines:
        first = line.split(",", 1)[0].strip()
        if first.isdigit():
            out.append(int(first))
    return sorted(out)


def fio_terse(text):
    """(errors, read max ms, write max ms) from fio's terse v3 output (fields 5, 39 and 80 of its
    last result line; the latencies in us there); None when it has none."""
    rows = [line.split(";") for line in text.splitlines() if line.count(";") > 100]
    if not rows:
        return None
    r = rows[-1]
    return int(r[4]), float(r[38]) / 1e3, float(r[79]) / 1e3


def main(argv, doc, run, table, run_args):
    """`run ARGS...` (run_args of them: prints what run(*args) returns, a list of lines) or
    `table GUEST_LOG` (prints table(lines)); anything else prints `doc` and returns 2."""
    if len(argv) == 2 + run_args and argv[1] == "run":
        print("\n".join(run(*argv[2:])))
        return 0
    if len(argv) == 3 and argv[1] == "table":
        with open(argv[2], errors="replace") as f:
            print("\n".join(table(f.read().splitlines())))
        return 0
    print(doc, file=sys.stderr)
    return 2
