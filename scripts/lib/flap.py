"""scripts/flap-rxe.sh's analysis: fio's figures in the guest, the summary and verdict on the host.

    python3 scripts/lib/flap.py fio FIO_JSON       (in the guest) prints
        "TOTAL_ERR FIRST_ERROR READ_IOS CLAT_MAX_MS" of fio's JSON report (text before it skipped)
    python3 scripts/lib/flap.py passes FIO_JSON...   (in the guest) prints "PASSES TOTAL_ERR
        FIRST_ERROR READS MAX_MS" over the read passes' reports (TOTAL_ERR NA when one of them
        holds no report: PASSES and the rest count the reports before it)
    python3 scripts/lib/flap.py summary LOG IF     (on the host) prints the summary of LOG's
        `@@result KEY VALUE` lines (IF: the initiator's veth) and the verdict; exit status 1 on FAIL
        or when LOG holds no results.

PASS needs: the reads finished (not stuck), no fio error under the flap, a clean verify pass
afterwards, and a reconnect that started at most 0.5 s later than --reconnect-delay after the
link came back.
"""
import json
import sys

# How much later than --reconnect-delay the reconnect may start once the link is back.
SLACK_S = 0.5


def fio_figures(text):
    """fio's JSON report (anything before its first "{" skipped) -> its figures as a line."""
    job = json.loads(text[text.index("{"):])["jobs"][0]
    read = job["read"]
    return f'{job["total_err"]} {job["first_error"]} {read["total_ios"]} {round(read["clat_ns"]["max"] / 1e6, 1)}'


def passes(reports):
    """[(name, text)] of the read passes' fio reports -> (passes, total_err or "NA", the first
    pass's first_error that is not 0, reads, the longest read in ms as fio_figures prints it),
    and why a report could not be read (None when all could)."""
    n, err, first, reads, longest = 0, 0, "0", 0, "0"
    for name, text in reports:
        try:
            e1, e2, ios, ms = fio_figures(text).split()
        except (ValueError, KeyError, IndexError, TypeError):
            return (n, "NA", first, reads, longest), f"no fio report in {name}: {text.encode()[:300].decode(errors='replace')}"
        n += 1
        err += int(e1)
        reads += int(ios)
        if first == "0":
            first = e2
        if float(ms) > float(longest):
            longest = ms
    return (n, err, first, reads, longest), None


def results(lines):
    """The `@@result KEY VALUE` lines -> {KEY: VALUE} (the last one wins; VALUE may hold spaces)."""
    out = {}
    for line in lines:
        line = line.rstrip("\r\n")
        if line.startswith("@@result "):
            parts = line.split(" ", 2)
            if len(parts) >= 2:
                out[parts[1]] = parts[2].strip() if len(parts) > 2 else ""
    return out


def started_after_up(r):
    """When the successful reconnect attempt started, in seconds after the link came back ("%.2f"),
    or "NA" without a reconnect."""
    rec, att = r.get("reconnected_after_up_s", "NA"), r.get("reconnect_attempt_ms", "NA")
    if rec == "NA" or att == "NA":
        return "NA"
    return f"{float(rec) - float(att) / 1000:.2f}"


def verdict(r):
    """The reasons the run failed (none: PASS)."""
    why = []
    if r.get("fio_hung") != "0":
        why.append("the reads never finished")
    else:
        if r.get("fio_errors") != "0":
            why.append(f"fio failed {r.get('fio_errors')} I/Os")
        if r.get("verify_pass_errors") != "0":
            why.append(f"the verify pass found {r.get('verify_pass_errors')} errors")
    started, delay = started_after_up(r), r.get("reconnect_delay_s", "")
    if started == "NA":
        why.append("no reconnect")
    elif float(started) > float(delay) + SLACK_S:
        why.append(f"the reconnect started {started} s after the link came back (--reconnect-delay {delay})")
    return why


def summary(r, ini_if):
    """The summary's lines (the first one empty) and the verdict's line."""
    def g(key):
        return r.get(key, "")
    out = [
        "",
        f"flap-rxe: {g('mode')} volume, fio randread 4k QD{g('qd')} with crc32c verify; ip link set {ini_if} "
        f"down for {g('link_down_s')} s",
        f"  fio errors under the flap  {g('fio_errors')} (first error {g('fio_first_error')}; {g('fio_reads')} "
        f"reads in {g('fio_passes')} passes; stuck: {g('fio_hung')})",
        f"  verify pass afterwards     {g('verify_pass_errors')} errors",
        f"  longest read               {g('longest_read_ms')} ms",
        f"  loss seen                  {g('loss_seen_after_down_s')} s after the link went down; "
        f"{g('failed_attempts')} failed reconnect attempts",
        f"  link up -> \"reconnected\"   {g('reconnected_after_up_s')} s (the attempt itself "
        f"{g('reconnect_attempt_ms')} ms, so it started {started_after_up(r)} s after the link came back; "
        f"--reconnect-delay {g('reconnect_delay_s')})",
        f"  packets over {ini_if}         {g('veth_tx_packets')}",
        f"  GSI QPs at the end         {g('gsi_qps')}",
    ]
    why = verdict(r)
    out.append("flap-rxe: FAIL: " + "; ".join(why) if why else "flap-rxe: PASS")
    return out, not why


def main(argv):
    if len(argv) == 3 and argv[1] == "fio":
        try:
            with open(argv[2], errors="replace") as f:
                print(fio_figures(f.read()))
        except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
            print(f"flap.py: {argv[2]}: cannot read fio's report: {e}", file=sys.stderr)
            return 1
        return 0
    if len(argv) >= 2 and argv[1] == "passes":
        reports = []
        for name in argv[2:]:
            try:
                with open(name, errors="replace") as f:
                    reports.append((name, f.read()))
            except OSError:
                reports.append((name, ""))
        figures, why = passes(reports)
        if why:
            print(f"flap-rxe: {why}", file=sys.stderr)
        print(" ".join(str(x) for x in figures))
        return 0
    if len(argv) == 4 and argv[1] == "summary":
        try:
            with open(argv[2], errors="replace") as f:
                r = results(f)
        except OSError as e:
            print(f"flap-rxe: error: cannot read {argv[2]}: {e.strerror}", file=sys.stderr)
            return 1
        if not r:
            print(f"flap-rxe: error: no results in {argv[2]}", file=sys.stderr)
            return 1
        try:
            lines, ok = summary(r, argv[3])
        except ValueError as e:
            print(f"flap-rxe: error: {argv[2]}: a result is not a number: {e}", file=sys.stderr)
            return 1
        print("\n".join(lines))
        return 0 if ok else 1
    print("usage: flap.py fio FIO_JSON | flap.py passes FIO_JSON... | flap.py summary LOG INTERFACE",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
