"""scripts/discard-rxe.sh's analysis: its guest log's `@@` lines to the table of issue 41's goals.

Usage: discard.py GUEST_LOG (prints the table on stdout). Lines read:
  @@time LABEL SECONDS
  @@counters LABEL SECONDS SENT_PKTS RCVD_PKTS RDMA_SENDS RDMA_RECVS   (rxe's hw_counters)
  @@blocks LABEL BYTES                                     (the backing file's allocated bytes)
  @@fio LABEL ERRORS
  @@note TEXT, @@fio_note TEXT                             (shown as they are)
"""

import sys

MIB = 1 << 20
# What the durable step writes and then deletes (scripts/discard-rxe.sh).
FREED = 128 * MIB
# The goals (issue 41).
LINK_BYTES_GOAL = 1 * MIB
ZEROOUT_RATIO_GOAL = 3.0
FREED_GOAL = 0.9


def parse(lines):
    """The `@@` lines of a guest log as {kind: {label: values}} (values: a list of strings)."""
    out = {"time": {}, "counters": {}, "blocks": {}, "fio": {}, "note": [], "fio_note": []}
    for line in lines:
        if not line.startswith("@@"):
            continue
        parts = line[2:].split()
        if not parts:
            continue
        kind, rest = parts[0], parts[1:]
        if kind in ("note", "fio_note"):
            out[kind].append(" ".join(rest))
        elif kind in out and rest:
            out[kind][rest[0]] = rest[1:]
    return out


# rxe's largest payload per packet (MTU 4096 on the guest's 9000-byte veth).
PACKET_PAYLOAD = 4096


def delta(counters, before, after):
    """(seconds, packets sent + received, SENDs + RECVs completed) between two `@@counters`
    labels."""
    a, b = counters[before], counters[after]
    seconds = float(b[0]) - float(a[0])
    ints = lambda v: [int(x) for x in v[1:5]]  # noqa: E731
    x, y = ints(a), ints(b)
    return seconds, (y[0] - x[0]) + (y[1] - x[1]), (y[2] - x[2]) + (y[3] - x[3])


def beyond_idle(counters, before, after, idle="idle", idle_end="before-zeroout"):
    """Packets between `before` and `after` beyond the idle window's rate over that time (never
    below 0); the packets alone when there is no idle window."""
    seconds, packets, _ = delta(counters, before, after)
    if {idle, idle_end} <= counters.keys():
        idle_s, idle_p, _ = delta(counters, idle, idle_end)
        if idle_s > 0:
            packets -= round(idle_p * seconds / idle_s)
    return max(packets, 0)


def rows(d):
    """(what, value, goal, met) rows, in the order of the issue's goals."""
    out = []
    t, c, b = d["time"], d["counters"], d["blocks"]
    if {"before-zeroout", "after-zeroout"} <= c.keys():
        _, packets, messages = delta(c, "before-zeroout", "after-zeroout")
        extra = beyond_idle(c, "before-zeroout", "after-zeroout")
        moved = extra * PACKET_PAYLOAD
        what = "blkdiscard -z 1 GiB: bytes over the link, at most (%d packets, %d beyond idle; %d SEND/RECV)"
        out.append((what % (packets, extra, messages), "%.1f KiB" % (moved / 1024), "<= 1 MiB",
                    moved <= LINK_BYTES_GOAL))
    if {"after-zeroout", "after-dd"} <= c.keys():
        _, packets, _ = delta(c, "after-zeroout", "after-dd")
        out.append(("dd of 1 GiB of zeros, for scale: packets", "%d" % packets, "", None))
    if {"rblk-zeroout", "brd-zeroout"} <= t.keys():
        rblk, brd = float(t["rblk-zeroout"][0]), float(t["brd-zeroout"][0])
        ratio = rblk / brd if brd > 0 else float("inf")
        out.append(("blkdiscard -z 1 GiB: rblk %.3f s / brd %.3f s" % (rblk, brd), "%.2fx" % ratio,
                    "<= %.0fx" % ZEROOUT_RATIO_GOAL, ratio <= ZEROOUT_RATIO_GOAL))
    if {"written", "trimmed"} <= b.keys():
        written, trimmed = int(b["written"][0]), int(b["trimmed"][0])
        freed = (written - trimmed) / FREED
        out.append(("fstrim: backing file's blocks freed of the 128 MiB deleted", "%.0f%%" % (100 * freed),
                    ">= 90%", freed >= FREED_GOAL))
        for label in ("stopped", "restarted", "taken-over-and-stopped"):
            if label in b:
                now = int(b[label][0])
                out.append(("allocated after fstrim, then %s" % label, "%.1f MiB (was %.1f)" % (now / MIB, trimmed / MIB),
                            "stays down", now <= trimmed + MIB))
    for label, values in d["fio"].items():
        errors = int(values[0]) if values and values[0].isdigit() else None
        out.append(("fio verify + trim_verify_zero on %s: errors" % label,
                    "?" if errors is None else str(errors), "0", errors == 0))
    return out


def table(d):
    """The rows as text, then the notes."""
    lines = ["%-90s %-22s %-10s %s" % ("", "measured", "goal", "met")]
    for what, value, goal, met in rows(d):
        lines.append("%-90s %-22s %-10s %s" % (what, value, goal, "" if met is None else ("yes" if met else "NO")))
    lines.extend("note: " + n for n in d["note"] + d["fio_note"])
    return "\n".join(lines)


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8", errors="replace") as f:
        print(table(parse(f)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
