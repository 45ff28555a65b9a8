"""scripts/kernel-rxe.sh's analysis: a newer guest kernel's boot and its rxe test runs (issue 44).

Two uses:
  kernel.py exes CARGO_JSON TEST...   (on the host) reads `cargo test --no-run
      --message-format=json` and prints the executable of each test target TEST (tests/tests/TEST.rs),
      one a line, in the order asked; fails naming a TEST cargo did not build.
  kernel.py summary GUEST_LOG STDERR_LOG SUMMARY_JSON   (on the host, after the boot) reads the
      guest's stdout (`@@kernel`, `@@ublk`, `@@rxe`, `@@test-start`/`@@test-end` lines, libtest's
      own output and the host's `@@meta guest_started|guest_ended UNIX` stamps) and the host-stamped
      lines of rxe-guest.sh's stderr (`UNIX LINE`), prints the kernel, the ublk driver's features,
      how long the boot took and each test run, writes the same as JSON, and exits 1 when the
      guest did not boot, the ublk driver did not answer, or a test run failed or ran no test.
"""

import json
import re
import sys

# rxe-guest.sh's lines on stderr.
_ACTIVE = re.compile(r"rxe-guest: \S+ ACTIVE after ([0-9.]+) s \(kernel (\S+)\)")
_FETCH = re.compile(r"rxe-guest: fetching (.+) from (\S+)$")
_PANICKED = "rxe-guest: the guest kernel panicked while booting"
_EXITED = re.compile(r"rxe-guest: guest command exited with status (\d+) after ([0-9.]+) s")
# libtest's.
_RESULT = re.compile(r"^test result: \w+\. (\d+) passed; (\d+) failed;")
_TEST = re.compile(r"^test (\S+) \.\.\. (ok|FAILED|ignored)(?: <([0-9.]+)s>)?$")


def executables(lines, names):
    """{TEST: executable} of the test targets named in `names`, from cargo's JSON messages."""
    found = {}
    for line in lines:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        target = msg.get("target", {})
        if "test" in target.get("kind", []) and target.get("name") in names:
            found[target["name"]] = msg["executable"]
    return found


def stamped(lines):
    """[(unix, text)] of `UNIX TEXT` lines; lines without a stamp are skipped."""
    out = []
    for line in lines:
        stamp, _, text = line.partition(" ")
        try:
            out.append((float(stamp), text))
        except ValueError:
            continue
    return out


def boot(stderr_lines, started):
    """How long the boot took: {"kernel", "fetched" (the packages downloaded, or None for a cached
    kernel), "qemu_to_rxe_s" (qemu's start to rxe0 ACTIVE, rxe-guest.sh's own count), "total_s"
    (the guest lock held to rxe0 ACTIVE, host clock: the kernel's download, unpacking and depmod,
    the initramfs, qemu), "prepare_s" (total less qemu's part), "panicked" (boots that panicked
    before the guest's command ran, which rxe-guest.sh boots again: their time is in prepare_s),
    "exit_status"}; None for what the lines do not say."""
    out = {"kernel": None, "fetched": None, "qemu_to_rxe_s": None, "total_s": None, "prepare_s": None,
           "panicked": 0, "exit_status": None}
    for t, text in stamped(stderr_lines):
        if text.startswith(_PANICKED):
            out["panicked"] += 1
            continue
        m = _FETCH.search(text)
        if m:
            out["fetched"] = m.group(1).split()
            continue
        m = _ACTIVE.search(text)
        if m and out["qemu_to_rxe_s"] is None:
            out["qemu_to_rxe_s"] = float(m.group(1))
            out["kernel"] = m.group(2)
            if started is not None:
                out["total_s"] = round(t - started, 1)
                out["prepare_s"] = round(max(0.0, out["total_s"] - out["qemu_to_rxe_s"]), 1)
            continue
        m = _EXITED.search(text)
        if m:
            out["exit_status"] = int(m.group(1))
    return out


def meta(lines, key):
    """The value of the last `@@meta KEY UNIX` line as a float, or None."""
    value = None
    for line in lines:
        p = line.split()
        if len(p) == 3 and p[0] == "@@meta" and p[1] == key:
            try:
                value = float(p[2])
            except ValueError:
                pass
    return value


def guest(lines):
    """What the guest reported: {"kernel", "rxe", "ublk": {"bits", "names", "update_size"} or
    None, "ublk_error", "runs": [{"test", "filter", "rc", "secs", "passed", "failed", "tests":
    [(name, result, secs)]}]}."""
    out = {"kernel": None, "rxe": None, "ublk": None, "ublk_error": None, "runs": []}
    run = None
    for line in lines:
        line = line.rstrip("\r")
        p = line.split()
        if not p:
            continue
        if p[0] == "@@kernel" and len(p) == 2:
            out["kernel"] = p[1]
        elif p[0] == "@@rxe":
            out["rxe"] = " ".join(p[1:])
        elif p[0] == "@@ublk" and len(p) >= 3 and p[1] == "features":
            out["ublk"] = {"bits": p[2], "names": p[3:], "update_size": None}
        elif p[0] == "@@ublk" and len(p) == 3 and p[1] == "update_size" and out["ublk"] is not None:
            out["ublk"]["update_size"] = p[2] == "yes"
        elif p[0] == "@@ublk-error":
            out["ublk_error"] = " ".join(p[1:])
        elif p[0] == "@@test-start" and len(p) == 4:
            run = {"test": p[1], "filter": None if p[2] == "-" else p[2], "rc": None, "secs": None,
                   "passed": 0, "failed": 0, "results": 0, "tests": [], "_t0": float(p[3])}
            out["runs"].append(run)
        elif p[0] == "@@test-end" and len(p) == 3 and run is not None:
            run["rc"] = int(p[1])
            run["secs"] = round(float(p[2]) - run.pop("_t0"), 1)
            run = None
        elif run is not None:
            m = _RESULT.match(line)
            if m:
                run["passed"] += int(m.group(1))
                run["failed"] += int(m.group(2))
                run["results"] += 1
                continue
            m = _TEST.match(line)
            if m:
                run["tests"].append((m.group(1), m.group(2), float(m.group(3)) if m.group(3) else None))
    for r in out["runs"]:
        r.pop("_t0", None)
    return out


def problems(summary):
    """What makes the run a failure, as sentences (none: it passed)."""
    out = []
    b, g = summary["boot"], summary["guest"]
    if b["qemu_to_rxe_s"] is None:
        out.append("the guest did not boot to rxe0 ACTIVE (see rxe-guest.sh's messages)")
    if g["kernel"] is None:
        out.append("the guest printed no kernel version (its part did not run)")
    if g["ublk"] is None:
        out.append("the ublk driver's features were not read: " + (g["ublk_error"] or "no @@ublk line"))
    for r in g["runs"]:
        name = r["test"] + (":" + r["filter"] if r["filter"] else "")
        if r["rc"] is None:
            out.append(f"{name} did not finish (the guest stopped during it)")
        elif r["failed"]:
            out.append(f"{name}: {r['failed']} test(s) failed")
        elif r["results"] == 0 or r["rc"] != 0:
            out.append(f"{name} exited with status {r['rc']} and {r['results']} result line(s)")
        elif r["passed"] == 0:
            out.append(f"{name} ran no test (is the filter right?)")
    return out


def table(summary):
    """The summary as text lines."""
    b, g = summary["boot"], summary["guest"]

    def fmt(v, unit=""):
        return "-" if v is None else f"{v}{unit}"

    lines = [f"kernel              {g['kernel'] or b['kernel'] or '-'}"]
    if b["fetched"]:
        lines.append(f"downloaded          {' '.join(b['fetched'])}")
    lines.append(f"boot                {fmt(b['total_s'], ' s')} to rxe0 ACTIVE "
                 f"({fmt(b['prepare_s'], ' s')} kernel and initramfs"
                 f"{' with the download' if b['fetched'] else ' from the cache'}, "
                 f"{fmt(b['qemu_to_rxe_s'], ' s')} qemu)")
    if b["panicked"]:
        lines.append(f"                    after {b['panicked']} boot(s) that panicked and were booted "
                     "again (counted in the kernel and initramfs time)")
    lines.append(f"rxe                 {g['rxe'] or '-'}")
    u = g["ublk"]
    if u is None:
        lines.append(f"ublk features       - ({g['ublk_error'] or 'not read'})")
    else:
        lines.append(f"ublk features       {u['bits']} {' '.join(u['names'])}")
        lines.append(f"ublk UPDATE_SIZE    {fmt({True: 'yes', False: 'no'}.get(u['update_size']))}")
    for r in g["runs"]:
        name = r["test"] + (":" + r["filter"] if r["filter"] else "")
        lines.append(f"test {name}: {r['passed']} passed, {r['failed']} failed in {fmt(r['secs'], ' s')}"
                     " (guest clock)")
        for t, result, secs in r["tests"]:
            lines.append(f"    {t} {result}{'' if secs is None else f' {secs} s'}")
    if summary["run_s"] is not None:
        lines.append(f"whole run           {summary['run_s']} s (host clock, boot included)")
    return lines


def summarize(guest_lines, stderr_lines):
    started = meta(guest_lines, "guest_started")
    ended = meta(guest_lines, "guest_ended")
    summary = {"boot": boot(stderr_lines, started), "guest": guest(guest_lines),
               "run_s": round(ended - started, 1) if started is not None and ended is not None else None}
    summary["problems"] = problems(summary)
    return summary


def _lines(path):
    with open(path, errors="replace") as f:
        return f.read().splitlines()


def main(argv):
    if len(argv) >= 3 and argv[1] == "exes":
        names = argv[3:]
        found = executables(_lines(argv[2]), set(names))
        missing = [n for n in names if n not in found]
        if missing:
            print(f"kernel.py: cargo built no test target {', '.join(missing)} (tests/tests/NAME.rs)",
                  file=sys.stderr)
            return 1
        for n in names:
            print(found[n])
        return 0
    if len(argv) == 5 and argv[1] == "summary":
        summary = summarize(_lines(argv[2]), _lines(argv[3]))
        with open(argv[4], "w") as f:
            json.dump(summary, f, indent=1)
            f.write("\n")
        for line in table(summary):
            print(line)
        for p in summary["problems"]:
            print(f"kernel-rxe: FAIL: {p}", file=sys.stderr)
        return 1 if summary["problems"] else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
