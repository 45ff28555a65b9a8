"""Unit tests of timeline.py's report (timeline_table.py: the table and summary.json) and the guest's
p50 helpers, on the recorded log of test_timeline.py. Each test says what it would catch."""
import io
import json
import os
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

import timeline
import timeline_table
from test_timeline import recorded, expected, LOG


class Report(unittest.TestCase):
    def setUp(self):
        self.log = recorded()
        self.results = timeline.analyse_all(self.log)

    def test_table_as_before(self):
        text = timeline.table(self.results, self.log.meta, self.log.fails, LOG)
        self.assertEqual(text + "\n", expected("timeline-table.txt"))

    def test_summary_as_before(self):
        want = expected("timeline-summary.json")
        old = json.loads(want)
        doc = timeline.summary(self.results, self.log.meta, self.log.fails, old["date"], old["host"])
        self.assertEqual(json.dumps(doc, indent=2) + "\n", want)

    def test_rows(self):
        self.assertEqual(timeline_table.overview_row("nvmeof", {"error": "no trace"}), "nvmeof   failed: no trace")
        self.assertEqual(timeline_table.overview_row("bench", self.results["bench"]),
                         "bench      620         122.0         n/a               0.00          0.61 (0.57)"
                         "              n/a              89.9")
        self.assertEqual(timeline_table.stage_line({"stage": "x", "first": True, "seen_share": 1.0}).split(), ["x", "start", "100%"])
        self.assertEqual(timeline_table.stage_line({"stage": "x", "first": False, "seen_share": 0.0, "missing": "why"}).split(),
                         ["x", "n/a", "why", "0%"])
        self.assertEqual(timeline_table.stage_line({"stage": "x", "first": False, "seen_share": 0.5, "median_us": 1234.0,
                                              "mean_us": 2.25}).split(), ["x", "1,234", "2.2", "50%"])
        section = timeline_table.path_section("bench", self.results["bench"])
        self.assertIn("  serving thread's system calls per I/O: write 1.00, poll 0.05, ioctl 0.05, read 0.05", section)
        self.assertIn("  io_uring events per I/O: none", section)
        self.assertTrue(section[-1].startswith("  rxe's first work item ran on a vCPU idle at the post for 40% of I/Os"))

    def test_footer_of_an_incomplete_run(self):
        out = timeline_table.footer({"guest_run_secs": "71.5"}, [{"path": "ublk", "error": "boom"}], "g.log")
        self.assertEqual(out[1], "guest kernel ?, ? vCPUs (qemu TCG); trace clock ?; kprobes set: none; missing: none; "
                                 "guest run 71.5 s")
        self.assertEqual(out[2:], ["INCOMPLETE: the guest did not finish (see g.log)", "failed: ublk: boom"])

    def test_guest_killed_mid_trace(self):
        """The log cut inside nvmeof's trace: ublk is still analysed, nvmeof and bench fail, and
        the table says the run is incomplete."""
        with open(LOG) as f:
            lines = f.readlines()
        cut = lines[:lines.index("@@trace nvmeof\n") + 50]
        log = timeline.read_log(cut)
        r = timeline.analyse_all(log)
        self.assertEqual(r["ublk"]["ios"], 195)
        self.assertEqual(log.fails, [{"path": "nvmeof", "error": "the guest's output ends inside its trace"}])
        text = timeline.table(r, log.meta, log.fails, "cut.log")
        self.assertIn("INCOMPLETE: the guest did not finish (see cut.log)", text)
        self.assertIn("bench    failed: no trace (see the failures)", text)

    def test_summarize_writes_both_files_and_says_when_nothing_was_analysed(self):
        with tempfile.TemporaryDirectory() as d:
            s, t = os.path.join(d, "summary.json"), os.path.join(d, "table.txt")
            with redirect_stdout(io.StringIO()) as out:
                self.assertEqual(timeline.summarize(LOG, s, t), 0)
            with open(t) as f:
                self.assertEqual(f.read(), out.getvalue())
            with open(s) as f:
                self.assertEqual(json.load(f)["paths"]["ublk"]["ios"], 195)
            empty = os.path.join(d, "empty.log")
            with open(empty, "w") as f:
                f.write("@@meta complete yes\n")
            err = io.StringIO()
            with redirect_stdout(io.StringIO()), redirect_stderr(err):
                self.assertEqual(timeline.summarize(empty, s, t), 1)
            self.assertEqual(err.getvalue(), "timeline: error: no path has analysed I/Os\n")

    def test_a_full_disk_or_a_missing_log_is_an_error(self):
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()) as err:
            self.assertEqual(timeline.main(["summarize", LOG, "/dev/full", "/dev/full"]), 1)
        self.assertEqual(err.getvalue(), "timeline: error: cannot write /dev/full: No space left on device\n")
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()) as err:
            self.assertEqual(timeline.main(["summarize", "/nonexistent/g.log", "/dev/full", "/dev/full"]), 1)
        self.assertEqual(err.getvalue(), "timeline: error: cannot read /nonexistent/g.log: No such file or directory\n")


class GuestHelpers(unittest.TestCase):
    def test_p50s(self):
        with tempfile.TemporaryDirectory() as d:
            fio, bench = os.path.join(d, "fio.json"), os.path.join(d, "bench.json")
            with open(fio, "w") as f:
                json.dump({"jobs": [{"read": {"clat_ns": {"percentile": {"50.000000": 264192}}}}]}, f)
            with open(bench, "w") as f:
                json.dump({"read": {"lat_us": {"p50": 89.919}}}, f)
            with redirect_stdout(io.StringIO()) as out:
                self.assertEqual(timeline.main(["fio-p50", fio]), 0)
                self.assertEqual(timeline.main(["bench-p50", bench]), 0)
            self.assertEqual(out.getvalue(), "264.192\n89.919\n")
        with redirect_stderr(io.StringIO()):
            self.assertEqual(timeline.main(["what"]), 2)


if __name__ == "__main__":
    unittest.main()
