"""System calls per I/O of `rblk attach`'s queue thread, for scripts/ublk-syscalls-rxe.sh.

In the guest: `python3 syscalls.py count TRACE` reads tracefs text output of
raw_syscalls:sys_enter (filtered to the queue thread) and prints {"NR": count} as JSON.
On the host: rows() reads the guest log's `@@row` and `@@counts` lines, table() renders them.
On rxe a post to the NIC (a doorbell) is a write(2) on the uverbs descriptor, so doorbells per
I/O are writes per I/O.
"""

import json
import re
import sys
from collections import Counter

# x86_64 numbers of the calls the queue thread makes.
NAMES = {0: "read", 1: "write", 7: "poll", 16: "ioctl", 202: "futex", 230: "clock_nanosleep",
         426: "io_uring_enter", 62: "kill", 3: "close", 232: "epoll_wait", 24: "sched_yield"}
_NR = re.compile(r"sys_enter: NR (\d+) ")


def count(lines):
    """Counter of system call numbers in tracefs sys_enter lines."""
    c = Counter()
    for line in lines:
        m = _NR.search(line)
        if m:
            c[int(m.group(1))] += 1
    return c


def rows(lines):
    """From the guest log: {(build, qd): {"iops", "p50_us", "ios", "per_io": {name: n}}}."""
    out = {}
    for line in lines:
        if line.startswith("@@row "):
            build, qd, iops, p50, ios = line.split()[1:6]
            out.setdefault((build, int(qd)), {}).update(iops=float(iops), p50_us=float(p50), ios=int(ios))
        elif line.startswith("@@counts "):
            _, build, qd, text = line.split(" ", 3)
            r = out.setdefault((build, int(qd)), {})
            r["counts"] = {int(k): v for k, v in json.loads(text).items()}
    for r in out.values():
        ios = r.get("ios", 0)
        per = {}
        for nr, n in sorted(r.get("counts", {}).items(), key=lambda kv: -kv[1]):
            per[NAMES.get(nr, f"nr{nr}")] = n / ios if ios else 0.0
        r["per_io"] = per
        r["total_per_io"] = sum(per.values())
    return out


def table(data):
    """One line per build and depth: IOPS, p50, system calls per I/O in all and by kind."""
    out = [f"{'build':<6} {'qd':>3} {'IOPS':>8} {'p50 us':>8} {'calls/IO':>9} "
           f"{'enter':>6} {'write':>6} {'read':>6} {'ioctl':>6}  other"]
    for (build, qd), r in sorted(data.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        per = r["per_io"]
        main = ("io_uring_enter", "write", "read", "ioctl")
        other = ", ".join(f"{k} {v:.3f}" for k, v in per.items() if k not in main and v >= 0.001)
        out.append(f"{build:<6} {qd:>3} {r.get('iops', 0):>8.0f} {r.get('p50_us', 0):>8.1f} "
                   f"{r['total_per_io']:>9.3f} " + " ".join(f"{per.get(k, 0):>6.3f}" for k in main)
                   + f"  {other}")
    return "\n".join(out)


def main(argv):
    if len(argv) == 3 and argv[1] == "count":
        with open(argv[2], errors="replace") as f:
            print(json.dumps({str(k): v for k, v in count(f).items()}))
        return 0
    if len(argv) == 3 and argv[1] == "table":
        with open(argv[2], errors="replace") as f:
            data = rows(f)
        print(table(data))
        return 0 if data else 1
    print("usage: syscalls.py count TRACE | table GUEST_LOG", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
