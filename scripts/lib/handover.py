"""scripts/handover-rxe.sh's analysis: the takeover pause (issue 42's goals).

Three uses:
  handover.py bytes SIZE   (in the guest) prints SIZE (64M, 4G, 512) in bytes.
  handover.py run SIZE WORKLOAD DIR   (in the guest, after one run) reads DIR/d1.log ... (the
      successors' logs, one per takeover), DIR/lat_clat.*.log (fio's log of every completion) and
      DIR/fio.out (fio's terse output); prints the run's `@@` lines:
        @@gap SIZE WORKLOAD LONGEST_GAP_MS COMPLETIONS FIO_ERRORS
        @@takeover SIZE WORKLOAD N BYE_MS AHEAD_MS OPEN_REG_MS OLD_GONE_MS FIRST_OPEN_MS
      BYE_MS: the successor's request to the old daemon's `bye` (its "took over" line), AHEAD_MS:
      its registration before saying ready ("registered the handed volumes ahead"; - when none),
      OPEN_REG_MS: registrations after `bye` (at an OPEN; 0 when none: the pause holds none),
      OLD_GONE_MS: `bye` (the old daemon's "the successor is ready") to its last line (its
      teardown), FIRST_OPEN_MS: `bye` to the successor's first OPEN (the initiator back).
  handover.py table GUEST_LOG   (on the host) reads those lines and `@@reg SIZE REG_MS DEREG_MS
      FRESH_MS` (bare registrations of SIZE, rblk-test-client reg-time: of populated pages, and
      of the same pages mapped afresh and registered, timed together, a successor's case) and
      prints the table and the goals.
"""

import glob
import os
import re
import sys

import guestlog

# The goals (issue 42).
GAP_GOAL_MS = 300.0
GAP_GROWTH_GOAL = 1.1
AHEAD_VS_BARE_GOAL = 1.2

_UNITS = {"s": 1e3, "ms": 1.0, "µs": 1e-3, "us": 1e-3, "ns": 1e-6}
_SUFFIX = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def duration_ms(text):
    """A Rust Duration's Debug text (`1.5s`, `812.3ms`, `45µs`, `7ns`) in milliseconds; None when
    it is not one."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(s|ms|µs|us|ns)", text.strip())
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None


def size_bytes(label):
    """`64M`, `4G`, `512` as bytes (binary suffixes, as rblk's sizes)."""
    m = re.fullmatch(r"([0-9]+)([KMGT]?)", label.strip().upper())
    if not m:
        raise ValueError(f"not a size: {label!r}")
    return int(m.group(1)) * _SUFFIX.get(m.group(2), 1)


def field(line, name):
    """The value of tracing's `name=value` field in a log line, or None."""
    m = re.search(rf"\b{re.escape(name)}=(\S+)", line)
    return m.group(1) if m else None


def successor(lines):
    """What one successor's log says: (bye_ms, ahead_ms, open_reg_ms). bye_ms: its "took over"
    line's `took` (None if it has none); ahead_ms: its registration before ready (None when it
    registered nothing ahead); open_reg_ms: the registrations it made after `bye` (at an OPEN)."""
    bye = ahead = None
    open_reg = 0.0
    for line in lines:
        if "took over" in line and " volume" in line:
            bye = duration_ms(field(line, "took") or "")
        elif "registered the handed volumes ahead" in line:
            ahead = duration_ms(field(line, "took") or "")
        elif "for memory windows in" in line and bye is not None:
            m = re.search(r"for memory windows in (\d+) ms", line)
            open_reg += float(m.group(1)) if m else 0.0
    return bye, ahead, open_reg


def bye_to(old_lines, new_lines):
    """(bye to the old daemon's last stamped line, bye to the successor's first OPEN after it) in
    ms; None where a stamp is missing. `bye` is the old daemon's "the successor is ready"."""
    stamp = guestlog.log_time
    bye = next((stamp(l) for l in old_lines if "the successor is ready" in l), None)
    if bye is None:
        return None, None
    last = max((t for t in map(stamp, old_lines) if t is not None), default=None)
    opened = next((t for t in (stamp(l) for l in new_lines if "control: opened" in l) if t and t >= bye), None)
    ms = lambda t: None if t is None else (t - bye) * 1e3  # noqa: E731
    return ms(last), ms(opened)


def longest_gap(times):
    """The longest gap between two consecutive completion times (None with fewer than two)."""
    return max((b - a for a, b in zip(times, times[1:])), default=None)


def run_lines(size, workload, d):
    """The `@@` lines of one run in directory `d`."""
    times = guestlog.fio_log_times(line for path in sorted(glob.glob(os.path.join(d, "lat_clat.*.log")))
                                   for line in guestlog.read_lines(d, os.path.basename(path)))
    terse = guestlog.fio_terse("\n".join(guestlog.read_lines(d, "fio.out")))
    errors = terse[0] if terse else None
    gap = longest_gap(times)
    out = [f"@@gap {size} {workload} {gap if gap is not None else '-'} {len(times)} "
           f"{errors if errors is not None else '-'}"]
    def lines(n):
        return guestlog.read_lines(d, f"d{n}.log")

    n = 1
    while os.path.exists(os.path.join(d, f"d{n}.log")):
        new = lines(n)
        bye, ahead, open_reg = successor(new)
        gone, opened = bye_to(lines(n - 1), new)
        show = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        out.append(f"@@takeover {size} {workload} {n} {show(bye)} {show(ahead)} {open_reg:.1f} {show(gone)} "
                   f"{show(opened)}")
        n += 1
    return out


def parse(lines):
    """The `@@reg`, `@@gap` and `@@takeover` lines: (reg {size: (ms, fresh mapping ms)}, gaps
    {(size, wl): (gap, n, errors)}, takeovers {size: [(bye, ahead, open_reg, old_gone,
    first_open)]}); `-` and what a line lacks read as None."""
    num = lambda v: None if v == "-" else float(v)  # noqa: E731
    reg, gaps, takeovers = {}, {}, {}
    for line in lines:
        p = line.split()
        if not p or not p[0].startswith("@@"):
            continue
        if p[0] == "@@reg" and len(p) >= 3:
            reg[p[1]] = (num(p[2]), num(p[4]) if len(p) >= 5 else None)
        elif p[0] == "@@gap" and len(p) >= 6:
            gaps[(p[1], p[2])] = (num(p[3]), int(p[4]), None if p[5] == "-" else int(p[5]))
        elif p[0] == "@@takeover" and len(p) >= 7:
            extra = tuple(num(v) for v in p[7:9]) + (None,) * (9 - max(len(p), 7))
            takeovers.setdefault(p[1], []).append((num(p[4]), num(p[5]), num(p[6])) + extra[:2])
    return reg, gaps, takeovers


def median(values):
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def worst_gap(gaps, size):
    """The longest gap of any workload at `size` (None when no run had one)."""
    return max((g for (s, _), (g, _, _) in gaps.items() if s == size and g is not None), default=None)


def goals(reg, gaps, takeovers):
    """[(goal, measured text, met)] for the smallest and the largest size measured."""
    sizes = sorted({s for s, _ in gaps} | set(takeovers), key=size_bytes)
    if not sizes:
        return []
    small, large = sizes[0], sizes[-1]
    out = []
    g_small, g_large = worst_gap(gaps, small), worst_gap(gaps, large)
    if g_small is not None:
        out.append((f"longest gap at {small} <= {GAP_GOAL_MS:.0f} ms", f"{g_small:.0f} ms", g_small <= GAP_GOAL_MS))
    if large != small and None not in (g_small, g_large) and g_small > 0:
        ratio = g_large / g_small
        out.append((f"longest gap at {large} <= {GAP_GROWTH_GOAL}x at {small}", f"{ratio:.2f}x",
                    ratio <= GAP_GROWTH_GOAL))
    b_small = median(t[0] for t in takeovers.get(small, []))
    b_large = median(t[0] for t in takeovers.get(large, []))
    populated, fresh = reg.get(large, (None, None))
    for what, bare in (("with mapping the pages afresh, as a successor must", fresh), ("populated pages", populated)):
        if large != small and None not in (b_small, b_large, bare) and bare > 0:
            ratio = (b_large - b_small) / bare
            out.append((f"work before bye, {large} minus {small} <= {AHEAD_VS_BARE_GOAL}x a bare registration of "
                        f"{large} ({what})", f"{b_large - b_small:.0f} ms / {bare:.0f} ms = {ratio:.2f}x",
                        ratio <= AHEAD_VS_BARE_GOAL))
    errors = sum(e or 0 for _, _, e in gaps.values())
    out.append(("fio errors 0", str(errors), errors == 0))
    late = sum(t[2] or 0 for runs in takeovers.values() for t in runs)
    out.append(("registration after bye (at the first OPEN) 0 ms", f"{late:.0f} ms", late == 0))
    return out


def table(lines):
    reg, gaps, takeovers = parse(lines)
    show = lambda v, unit="": "-" if v is None else f"{v:.0f}{unit}"  # noqa: E731
    out = ["| size | workload | longest gap ms | completions | fio errors |", "|---|---|---|---|---|"]
    for (size, wl), (gap, n, errors) in sorted(gaps.items(), key=lambda kv: (size_bytes(kv[0][0]), kv[0][1])):
        out.append(f"| {size} | {wl} | {show(gap)} | {n} | {show(errors)} |")
    out += ["", "| size | takeovers | request to bye ms (median, max) | registered ahead ms (median) | "
            "registered after bye ms | bye to the old daemon's last line ms (median) | bye to the successor's "
            "first OPEN ms (median, max) | bare ibv_reg_mr ms (populated pages; mapping afresh + ibv_reg_mr) |",
            "|---|---|---|---|---|---|---|---|"]
    for size in sorted(set(takeovers) | set(reg), key=size_bytes):
        runs = takeovers.get(size, [])
        byes = [t[0] for t in runs if t[0] is not None]
        opens = [t[4] for t in runs if t[4] is not None]
        populated, fresh = reg.get(size, (None, None))
        out.append(f"| {size} | {len(runs)} | {show(median(byes))}, {show(max(byes, default=None))} | "
                   f"{show(median(t[1] for t in runs))} | {show(sum(t[2] or 0 for t in runs))} | "
                   f"{show(median(t[3] for t in runs))} | {show(median(opens))}, {show(max(opens, default=None))} | "
                   f"{show(populated)}; {show(fresh)} |")
    out += ["", "| goal | measured | met |", "|---|---|---|"]
    out += [f"| {g} | {m} | {'yes' if ok else 'NO'} |" for g, m, ok in goals(reg, gaps, takeovers)]
    return out


def main(argv):
    if len(argv) == 3 and argv[1] == "bytes":
        try:
            print(size_bytes(argv[2]))
        except ValueError as e:
            print(f"handover.py: {e}", file=sys.stderr)
            return 1
        return 0
    return guestlog.main(argv, __doc__, run_lines, table, 3)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
