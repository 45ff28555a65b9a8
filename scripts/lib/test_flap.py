"""Unit tests of flap.py (scripts/flap-rxe.sh's analysis) on recorded fio reports
(testdata/flap-pass-ok.json: a clean randread pass with crc32c verify and continue_on_error, as
flap-rxe.sh runs it; flap-pass-bad.json: the same after two blocks were zeroed, 2 verify errors,
EILSEQ) and on the guest's @@result lines as flap-rxe.sh prints them. Run from
tests/tests/flap.rs (cargo test), or: cd scripts/lib && python3 -m unittest test_flap"""
import io
import os
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

import flap

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata")


def read(name):
    with open(os.path.join(DATA, name)) as f:
        return f.read()


OK, BAD = read("flap-pass-ok.json"), read("flap-pass-bad.json")

# The @@result lines of a passing run, as flap-rxe.sh's guest_main prints them.
PASS = """@@meta guest_kernel 6.12.95+deb12-amd64
@@result mode durable
@@result qd 16
@@result reconnect_delay_s 1
@@result link_down_s 5.81
@@result fio_hung 0
@@result fio_errors 0
@@result fio_first_error 0
@@result fio_passes 3
@@result fio_reads 12288
@@result longest_read_ms 6312.4
@@result verify_pass_errors 0
@@result loss_seen_after_down_s 0.31
@@result failed_attempts 2
@@result reconnected_after_up_s 0.57
@@result reconnect_attempt_ms 92
@@result veth_tx_packets 34567
@@result gsi_qps rxe-ini:1 rxe-tgt:1 \n""".splitlines(True)


def with_results(**kv):
    r = flap.results(PASS)
    r.update({k: str(v) for k, v in kv.items()})
    return r


class Fio(unittest.TestCase):
    def test_errors_reads_and_longest_read(self):
        self.assertEqual(flap.fio_figures(OK), "0 0 256 0.0")
        self.assertEqual(flap.fio_figures(BAD), "2 84 256 8.0")

    def test_text_before_the_report_is_skipped(self):
        self.assertEqual(flap.fio_figures("fio: io_u error on file /dev/ublkb0: Input/output error\n" + BAD),
                         "2 84 256 8.0")

    def test_no_report(self):
        with self.assertRaises(ValueError):
            flap.fio_figures("fio: engine libaio not loadable\n")

    def test_passes_add_up_and_keep_the_first_error(self):
        self.assertEqual(flap.passes([("1", OK), ("2", BAD), ("3", OK)]), ((3, 2, "84", 768, "8.0"), None))
        self.assertEqual(flap.passes([("1", OK)]), ((1, 0, "0", 256, "0"), None))

    def test_a_pass_without_a_report_stops_the_count(self):
        figures, why = flap.passes([("1", BAD), ("2", "killed\n"), ("3", OK)])
        self.assertEqual(figures, (1, "NA", "84", 256, "8.0"))
        self.assertEqual(why, "no fio report in 2: killed\n")
        self.assertEqual(flap.passes([("x", "")]), ((0, "NA", "0", 0, "0"), "no fio report in x: "))


class Verdict(unittest.TestCase):
    def test_results_keep_spaces_and_the_last_value(self):
        r = flap.results(PASS + ["@@result qd 8\r\n", "@@resultless line\n"])
        self.assertEqual((r["qd"], r["gsi_qps"], len(r)), ("8", "rxe-ini:1 rxe-tgt:1", 17))

    def test_pass(self):
        self.assertEqual(flap.started_after_up(flap.results(PASS)), "0.48")
        self.assertEqual(flap.verdict(flap.results(PASS)), [])

    def test_each_reason_to_fail(self):
        self.assertEqual(flap.verdict(with_results(fio_hung=1, fio_errors=5)), ["the reads never finished"])
        self.assertEqual(flap.verdict(with_results(fio_errors=3, verify_pass_errors=7)),
                         ["fio failed 3 I/Os", "the verify pass found 7 errors"])
        self.assertEqual(flap.verdict(with_results(reconnected_after_up_s="NA")), ["no reconnect"])
        # 0.5 s of slack after --reconnect-delay: 1.50 passes, 1.51 does not.
        self.assertEqual(flap.verdict(with_results(reconnected_after_up_s=1.592)), [])
        self.assertEqual(flap.verdict(with_results(reconnected_after_up_s=1.602)),
                         ["the reconnect started 1.51 s after the link came back (--reconnect-delay 1)"])

    def test_summary_lines(self):
        lines, ok = flap.summary(flap.results(PASS), "flap-i")
        self.assertTrue(ok)
        self.assertEqual(lines[0], "")
        self.assertEqual(lines[1], "flap-rxe: durable volume, fio randread 4k QD16 with crc32c verify; "
                                   "ip link set flap-i down for 5.81 s")
        self.assertEqual(lines[6], '  link up -> "reconnected"   0.57 s (the attempt itself 92 ms, so it started '
                                   '0.48 s after the link came back; --reconnect-delay 1)')
        self.assertEqual(lines[-1], "flap-rxe: PASS")
        lines, ok = flap.summary(with_results(fio_errors=3), "flap-i")
        self.assertFalse(ok)
        self.assertEqual(lines[-1], "flap-rxe: FAIL: fio failed 3 I/Os")


class Main(unittest.TestCase):
    def run_main(self, *args):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            rc = flap.main(["flap.py", *args])
        return rc, out.getvalue(), err.getvalue()

    def test_fio_and_passes(self):
        ok, bad = os.path.join(DATA, "flap-pass-ok.json"), os.path.join(DATA, "flap-pass-bad.json")
        self.assertEqual(self.run_main("fio", bad), (0, "2 84 256 8.0\n", ""))
        self.assertEqual(self.run_main("passes", ok, bad), (0, "2 2 84 512 8.0\n", ""))
        rc, out, err = self.run_main("passes", bad, "/nonexistent/pass.1.json")
        self.assertEqual((rc, out), (0, "1 NA 84 256 8.0\n"))
        self.assertIn("no fio report in /nonexistent/pass.1.json", err)
        rc, _, err = self.run_main("fio", "/nonexistent/verify.json")
        self.assertEqual(rc, 1)
        self.assertIn("cannot read fio's report", err)

    def test_summary_exit_status(self):
        with tempfile.TemporaryDirectory() as d:
            good, bad, empty = (os.path.join(d, n) for n in ("good.log", "bad.log", "empty.log"))
            with open(good, "w") as f:
                f.writelines(PASS)
            with open(bad, "w") as f:
                f.writelines(PASS + ["@@result fio_hung 1\n"])
            with open(empty, "w") as f:
                f.write("rxe-guest: kernel panic\n")
            rc, out, _ = self.run_main("summary", good, "flap-i")
            self.assertEqual((rc, out.splitlines()[-1]), (0, "flap-rxe: PASS"))
            rc, out, _ = self.run_main("summary", bad, "flap-i")
            self.assertEqual((rc, out.splitlines()[-1]), (1, "flap-rxe: FAIL: the reads never finished"))
            self.assertEqual(self.run_main("summary", empty, "flap-i"),
                             (1, "", f"flap-rxe: error: no results in {empty}\n"))
            with open(bad, "a") as f:
                f.write("@@result reconnect_delay_s soon\n")
            rc, _, err = self.run_main("summary", bad, "flap-i")
            self.assertEqual(rc, 1)
            self.assertIn("a result is not a number", err)
        self.assertEqual(self.run_main()[0], 2)


if __name__ == "__main__":
    unittest.main()
