"""Unit tests of scripts/compare-rxe.sh's report (compare.py's tables, timeline part and
summary.json, compare_table.py) on the recorded log of test_compare.py (its docstring says how it
was trimmed), against that run's table.txt (testdata/compare-table.txt) and summary.json. Each
test says what it would catch."""
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import compare
import compare_log
import compare_rows
import compare_table
import report
from test_compare import HERE, LOG, TIMELINE, TIMELINE_SCRIPT, cut_run, parsed, recorded_lines


class Tables(unittest.TestCase):
    """The text of the tables and the lines under them. Would catch: a column or a row of
    table.txt lost, moved or formatted differently from the recorded run's table.txt."""

    @classmethod
    def setUpClass(cls):
        with open(os.path.join(HERE, "testdata", "compare-table.txt")) as f:
            cls.recorded = f.read().split("\n")
        log, f = parsed()
        cls.log, cls.f = log, f
        cls.rows = [compare_rows.workload_row(f, s)[1] for s in compare_rows.WORKLOADS]
        goals, missing = [], []
        cls.brows = [compare_rows.block_row(f, s, goals, missing)[1] for s in compare_log.BLOCK_WORKLOADS]
        cls.goals = goals

    def test_workload_table(self):
        out = compare_table.workload_table(self.rows)
        self.assertEqual(out, self.recorded[:len(out)])
        self.assertEqual(len(out), 15)

    def test_block_table(self):
        out = compare_table.block_table(self.brows)
        self.assertEqual(out, self.recorded[16:16 + len(out)])
        self.assertTrue(out[-1].startswith("guest us/IO: "))

    def test_goals_table(self):
        out, met = compare_table.goals_table(self.goals)
        self.assertEqual(met, 0)
        start = self.recorded.index("goals (medians of this boot): 0 of 8 met") - 1
        self.assertEqual(out, self.recorded[start:start + len(out)])

    def test_lines_under_the_tables(self):
        all_cpu = [x for xs in self.f.cpu.values() for x in xs]
        idle = compare_table.idle_share(self.log.meta)
        self.assertEqual(idle, 0.0)
        cpu = compare_table.target_cpu_lines(all_cpu, idle)
        self.assertEqual(cpu, [next(l for l in self.recorded if l.startswith("target CPU during rblk runs"))])
        self.assertEqual(compare_table.target_cpu_lines([], None), [])
        bcpu = compare_table.blk_cpu_summary(self.log.blk_cpu)
        self.assertEqual(list(bcpu), ["nbd", "fuse", "ublk", "ublk-sleep", "ublk-q2", "ublk-null"])
        self.assertEqual(bcpu["ublk-q2"]["runs"], 4)
        out = compare_table.run_lines(self.log, 4, 2, "-Q 1", bcpu, True, "guest.log")
        start = self.recorded.index(cpu[0]) + 1
        self.assertEqual(out, self.recorded[start:start + len(out)])

    def test_an_incomplete_run_and_a_clock_source_that_changed(self):
        meta = {"clocksource_start": "tsc", "clocksource_end": "hpet", "guest_exit_status": "1",
                "guest_failure": "rxe-guest: the guest kernel panicked"}
        self.assertEqual(compare_table.clocksource_text(meta),
                         "tsc, then hpet (clock reads became system calls: rounds before and after differ)")
        self.assertEqual(compare_table.clocksource_text({}), "?")
        log = compare_log.parse_log(["@@fail target rblk 0 rblk-target exited with status 1: x"])
        log.meta.update(meta)
        out = compare_table.run_lines(log, 2, 1, "-Q 1", {}, False, "build/compare/guest.log")
        self.assertIn("failed: rblk target (round 0): rblk-target exited with status 1: x", out)
        self.assertEqual(out[-1], "INCOMPLETE: the guest run failed (exit status 1; rxe-guest: the guest kernel "
                                  "panicked); the rows after the last one it reported did not run (see "
                                  "build/compare/guest.log)")

    def test_cells(self):
        self.assertEqual(compare_table.cell([20041.0], "ops/s"), "20,041")
        self.assertEqual(compare_table.cell([1.0, 3.0, 2.0], "us"), "2.0 (1.0-3.0)")
        self.assertEqual([compare_table.verdict(x) for x in (None, True, False)], ["n/a", "met", "MISSED"])


class Timeline(unittest.TestCase):
    """The QD1 timeline's part. Would catch: its totals read from the wrong fields, its table not
    appended, a missing or broken summary not reported as FAILED, timeline-rxe.sh's --redraw no
    longer reached with the timeline's raw output."""

    def test_section_from_the_recorded_summary(self):
        lines, t = compare.timeline_section(TIMELINE, 0)
        self.assertEqual(t["paths"]["ublk"], {"total_block_us_median": 208.0, "total_app_us_median": 298.0,
                                              "io_uring_enter_per_io": 1.9746136865342163,
                                              "switches_per_io": 0.07579102281089035, "ios": 2718})
        self.assertIsNone(t["paths"]["bench"]["total_app_us_median"])
        self.assertEqual(t["exit_status"], 0)
        with open(os.path.join(TIMELINE, "table.txt")) as f:
            self.assertEqual(lines[2], f.read().rstrip("\n"))
        self.assertTrue(lines[1].startswith("QD1 per-stage timeline (scripts/timeline-rxe.sh's guest part"))

    def test_a_path_with_an_error_and_a_missing_summary(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "table.txt"), "w") as f:
                f.write("t\n")
            with open(os.path.join(d, "summary.json"), "w") as f:
                json.dump({"paths": {"ublk": {"error": "no trace"}}}, f)
            _, t = compare.timeline_section(d, 1)
            self.assertEqual(t["paths"], {"ublk": {"error": "no trace"}})
            os.remove(os.path.join(d, "summary.json"))
            lines, t = compare.timeline_section(d, 1)
            self.assertTrue(t["error"].startswith("no timeline summary: "))
            self.assertTrue(lines[1].startswith("QD1 per-stage timeline: FAILED (no timeline summary: "))
            with open(os.path.join(d, "summary.json"), "w") as f:
                f.write("{not json")
            _, t = compare.timeline_section(d, 1)
            self.assertIn("error", t)

    def test_redraw_runs_the_timeline_script(self):
        log, _ = parsed()
        with tempfile.TemporaryDirectory() as d:
            status = compare.redraw_part(log.files["timeline-guest.log"], d, TIMELINE_SCRIPT)
            # The recorded log's traces are cut: the timeline analyses no path, and says so.
            self.assertEqual(status, 1)
            with open(os.path.join(d, "guest.log")) as f:
                self.assertIn("@@path bench bench_p50_us 89.919", f.read())
            with open(os.path.join(d, "summary.json")) as f:
                self.assertIn("error", json.load(f)["paths"]["ublk"])


COUNTS_LOG = os.path.join(HERE, "testdata", "counts-guest.log")
COUNTS_SCRIPT = os.path.join(HERE, "..", "counts-rxe.sh")


def with_counts(lines=None):
    """The recorded comparison's log with the recorded counts run in it, as counts_run sends it."""
    with open(COUNTS_LOG) as f:
        counted = f.read().split("\n")
    return (lines or recorded_lines()) + ["@@meta counts_secs 3", "@@file counts-guest.log"] + counted + [
        "@@endfile counts-guest.log"]


class Counts(unittest.TestCase):
    """The counts' part. Would catch: counts-rxe.sh's --redraw not reached with the counts' raw
    output, its table not appended or its goals not in summary.json, a run that asked for counts
    and sent none not reported as FAILED, or a log from before the counts reported as FAILED."""

    def test_redrawn_from_the_recorded_counts(self):
        log, _ = parsed(with_counts())
        with tempfile.TemporaryDirectory() as d:
            lines, c = compare.other_part(log, d, "counts", COUNTS_SCRIPT, compare.counts_section)
            self.assertEqual(c["exit_status"], 0)
            with open(os.path.join(d, "counts", "table.txt")) as f:
                self.assertEqual(lines[2], f.read().rstrip("\n"))
            self.assertTrue(lines[1].startswith("Counts per I/O (scripts/counts-rxe.sh's guest part"))
            enter = next(g for g in c["goals"] if (g["qd"], g["what"]) == (1, "server_io_uring_enter"))
            self.assertEqual((enter["front"], enter["status"]), ("ublk", "missed"))
            self.assertAlmostEqual(enter["value"], 2.5, places=2)
            self.assertTrue(any(r["front"] == "libublk-null" for r in c["rows"]))
        self.assertNotIn("counts-guest.log", log.files)

    def test_missing_and_absent_counts(self):
        log, _ = parsed()
        self.assertEqual(compare.other_part(log, "/nonexistent", "counts", COUNTS_SCRIPT, None), (None, None))
        log, _ = parsed(recorded_lines() + ["@@meta counts_secs 3"])
        lines, c = compare.other_part(log, "/nonexistent", "counts", COUNTS_SCRIPT, None)
        self.assertEqual(lines[1], "Counts per I/O: FAILED (the guest sent no counts output)")
        self.assertEqual(c, {"error": "the guest sent no counts output"})
        with tempfile.TemporaryDirectory() as d:
            lines, c = compare.counts_section(d, 1)
            self.assertTrue(c["error"].startswith("no counts summary: "))
            self.assertTrue(lines[1].startswith("Counts per I/O: FAILED (no counts summary: "))

    def test_summary_and_table_hold_the_counts(self):
        log, _ = parsed(with_counts())
        with tempfile.TemporaryDirectory() as d:
            table, doc, _, _, _ = compare.summarize(log, LOG, d, TIMELINE_SCRIPT, COUNTS_SCRIPT)
        self.assertIn("Counts per I/O (scripts/counts-rxe.sh's guest part", table)
        self.assertLess(table.index("Counts per I/O"), table.index("QD1 per-stage timeline"))
        self.assertEqual(len(doc["counts"]["goals"]), 4)


class Summary(unittest.TestCase):
    """summarize, write_outputs and main on the recorded log. Would catch: a field of summary.json
    lost or taken from the wrong place, the table and table.txt differing, the last round's
    rblk-bench reports (the CDF's input) or the guest's files not written, a missing goal row or an
    unfinished guest not failing the run, a disk that is full passing unnoticed, the guest's
    helpers (bench-lines, merge) computing wrongly."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="compare-test-")
        cls.out = io.StringIO()
        stdout, sys.stdout = sys.stdout, cls.out
        try:
            cls.rc = compare.main(["compare.py", LOG, os.path.join(cls.dir, "summary.json"),
                                   os.path.join(cls.dir, "table.txt"), TIMELINE_SCRIPT])
        finally:
            sys.stdout = stdout
        with open(os.path.join(cls.dir, "summary.json")) as f:
            cls.doc = json.load(f)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def test_summary_fields(self):
        self.assertEqual(self.rc, 0)
        d = self.doc
        self.assertEqual((d["secs"], d["rounds"], d["perftest_bw_args"]), (4, 2, "-Q 1"))
        self.assertEqual(d["guest"]["kernel"], "6.12.95+deb12-amd64")
        self.assertEqual(d["guest"]["clocksource"], ["tsc", "tsc"])
        self.assertEqual(d["guest_run_secs"], 803.6)
        self.assertIs(d["complete"], True)
        self.assertEqual((d["goals_met"], d["goals_total"], d["missing_goal_rows"]), (0, 8, []))
        self.assertEqual(d["target_cpu_share"]["runs"], 22)
        self.assertAlmostEqual(d["target_cpu_share"]["median"], 0.0006412601874369467)
        self.assertEqual(d["target_cpu_share"]["idle"], 0.0)
        self.assertEqual(d["target_cpu_share_ublk"]["runs"], 6)
        self.assertEqual(d["fio"], "fio-3.33")
        self.assertTrue(d["libublk_null"].startswith("libublk 0.4.8 examples/null built offline"))
        self.assertEqual(len(d["workloads"]), len(compare_rows.WORKLOADS))
        self.assertEqual(list(d["block_devices"]),
                         ["block_randread_4k_qd32", "block_randwrite_4k_qd32", "block_randread_4k_qd1_p50"])
        self.assertIn("error", d["timeline"]["paths"]["ublk"])
        self.assertTrue(d["host"]["kernel"])

    def test_table_and_files(self):
        with open(os.path.join(self.dir, "table.txt")) as f:
            table = f.read()
        self.assertEqual(table, self.out.getvalue())
        with open(os.path.join(HERE, "testdata", "compare-table.txt")) as f:
            recorded = f.read()
        head = recorded[:recorded.index("QD1 per-stage timeline")]
        self.assertEqual(table[:len(head)], head)
        for name in ("bench_iops.1.log", "bench.hlog", "rblk-randread_4k_qd1.json", "rblk-randread_4k_2proc.json",
                     "timeline/guest.log"):
            self.assertTrue(os.path.getsize(os.path.join(self.dir, name)) > 0, name)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "timeline-guest.log")))
        with open(os.path.join(self.dir, "rblk-randread_4k_qd1.json")) as f:
            self.assertEqual(json.load(f)["rblk"]["command_line"][-1], "1")

    def test_a_missing_goal_row_or_an_unfinished_guest_fails(self):
        lines = [l for l in recorded_lines() if not l.startswith("@@meta complete")]
        for r in (1, 2):
            lines = cut_run(lines, "fio_randread_4k_qd1", "ublk", r)
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "guest.log")
            with open(log, "w") as f:
                f.write("\n".join(lines))
            run = subprocess.run([sys.executable, os.path.join(HERE, "compare.py"), log, os.path.join(d, "summary.json"),
                                  os.path.join(d, "table.txt"), TIMELINE_SCRIPT], capture_output=True, text=True)
            self.assertEqual(run.returncode, 1)
            self.assertIn("compare: error: goal rows missing (a goal row is ublk, nvmeof or rblk-bench): "
                          "randread 4k QD1 p50: ublk (not run)", run.stderr)
            with open(os.path.join(d, "summary.json")) as f:
                doc = json.load(f)
            self.assertIs(doc["complete"], False)
            self.assertIn("INCOMPLETE; the rows after the last one it reported did not run", run.stdout)

    def test_malformed_log_missing_log_and_a_full_disk(self):
        with tempfile.TemporaryDirectory() as d:
            bad = os.path.join(d, "guest.log")
            with open(bad, "w") as f:
                f.write("@@file ../x\n")
            err = io.StringIO()
            stderr, sys.stderr = sys.stderr, err
            try:
                self.assertEqual(compare.main(["compare.py", bad, os.path.join(d, "s.json"), os.path.join(d, "t.txt"),
                                               TIMELINE_SCRIPT]), 1)
                self.assertEqual(compare.main(["compare.py", os.path.join(d, "none"), os.path.join(d, "s.json"),
                                               os.path.join(d, "t.txt"), TIMELINE_SCRIPT]), 1)
                self.assertEqual(compare.main(["compare.py", "bench-lines"]), 2)
            finally:
                sys.stderr = stderr
            self.assertIn("compare: error: bad file name in the guest's output: '../x'", err.getvalue())
            self.assertIn("compare: error: cannot read the guest's log", err.getvalue())
            self.assertFalse(os.path.exists(os.path.join(d, "s.json")))
        if os.path.exists("/dev/full"):
            run = subprocess.run([sys.executable, os.path.join(HERE, "compare.py"), LOG, "/dev/full", "/dev/full",
                                  TIMELINE_SCRIPT], capture_output=True, text=True, cwd=tempfile.gettempdir())
            self.assertEqual(run.returncode, 1)
            self.assertIn("compare: error: cannot write the summary", run.stderr)
            self.assertNotIn("Traceback", run.stderr)

    def test_the_guests_helpers(self):
        log, _ = parsed()
        doc = json.loads(next(r["text"] for r in log.runs if r["workload"] == "randread_4k_qd32" and r["tool"] == "rblk"))
        lines = compare_log.bench_lines(doc)
        self.assertEqual(len(lines), 2)
        self.assertTrue(lines[0].startswith("    read: IOPS="))
        self.assertTrue(lines[1].startswith("    target cpu: ") and lines[1].endswith("% of one core"))
        merged = compare_log.merge_two(doc, doc)
        one = report.bench_report(doc)
        self.assertAlmostEqual(merged["total"]["iops"], 2 * one["total"]["iops"])
        self.assertAlmostEqual(merged["cpu"]["share_of_core"], 2 * one["cpu"]["share_of_core"])
        self.assertEqual(merged["read"]["lat_us"]["p99"], one["read"]["lat_us"]["p99"])
        self.assertIsNone(merged["write"]["lat_us"])
        other = json.loads(json.dumps(doc))
        other["jobs"][0]["read"]["clat_ns"]["percentile"]["99.000000"] *= 3
        self.assertAlmostEqual(compare_log.merge_two(doc, other)["read"]["lat_us"]["p99"],
                               3 * one["read"]["lat_us"]["p99"])
        # As the guest runs them: compare.py bench-lines FILE, compare.py merge FILE FILE.
        with tempfile.TemporaryDirectory() as d:
            a = os.path.join(d, "a.json")
            with open(a, "w") as f:
                json.dump(doc, f)
            script = os.path.join(HERE, "compare.py")
            run = subprocess.run([sys.executable, script, "bench-lines", a], capture_output=True, text=True)
            self.assertEqual(run.stdout, "\n".join(lines) + "\n")
            run = subprocess.run([sys.executable, script, "merge", a, a], capture_output=True, text=True)
            self.assertEqual(json.loads(run.stdout), json.loads(json.dumps(merged)))


if __name__ == "__main__":
    unittest.main()
