"""Unit tests of stages.py (the stage log's reader and scripts/stages-rxe.sh's summary). Run from
tests/tests/stages.rs (cargo test), or: cd scripts/lib && python3 -m unittest test_stages

testdata/stages-guest.log is the guest log of `scripts/stages-rxe.sh --secs 2` of 2026-12-07
(the five rows; each stage log cut to its header and last 4,000 events); testdata/stages-table.txt
and stages-summary.json are what the script's summary before issue 45 (69fadfe, a heredoc in
stages-rxe.sh) made of that log: the module must make the same, byte for byte."""
import base64
import gzip
import io
import json
import os
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

import stages

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata")
LOG = os.path.join(DATA, "stages-guest.log")
HEADER = ("# rblk stage log 1: queue 0; dropped 0; stages 0=seen,1=submitted,2=posted,3=done,4=resumed,"
          "5=enter_post,6=enter_collect,7=sleep,8=woke,9=run_ops,10=run_ops_end,11=wait,12=wait_end\n")


def expected(name):
    with open(os.path.join(DATA, name)) as f:
        return f.read()


def recorded():
    with open(LOG) as f:
        return stages.read_guest_log(f)


def stage_log(d, body, header=HEADER):
    path = os.path.join(d, "s.q0")
    with open(path, "w") as f:
        f.write(header + body)
    return path


# One request at depth 1, tag 3, in ns: seen 0, submitted 1000, posted 3000, done 10000, resumed
# 11000; the loop's wait from 11500 to 13500 (4 passes of its spin) holds a sleep from 12000 to
# 13000, which carries the COMMIT; the tasks run from 14000 to 15000; the next request is seen at
# 40000.
ONE = """0 0 3
1000 1 3
3000 2 0
10000 3 3
11000 4 3
11500 11 0
12000 7 0
13000 8 0
13500 12 4
14000 9 0
15000 10 0
40000 0 3
"""


class StageLog(unittest.TestCase):
    def test_read_and_analyse_one_request(self):
        with tempfile.TemporaryDirectory() as d:
            events, fields = stages.read(stage_log(d, ONE))
        self.assertEqual(fields["dropped"], "0")
        self.assertEqual(events[:2], [(0, "seen", 3), (1000, "submitted", 3)])
        r = stages.analyse(events)
        us = {k: (v["median_us"] if v else None) for k, v in r["stages"].items()}
        self.assertEqual(us, {"seen -> submitted": 1.0, "submitted -> posted": 2.0, "posted -> done": 7.0,
                              "done -> resumed": 1.0, "resumed -> entered": 1.0, "entered -> next seen": 28.0})
        self.assertEqual(r["requests"], 2)
        self.assertEqual(r["per_request"], {"loop_passes": 0.5, "io_uring_enter": 0.5, "sleeps": 0.5, "posts": 0.5})
        self.assertEqual(r["thread_share"], {"wait": 2000 / 40000, "run_ops": 1000 / 40000, "asleep": 1000 / 40000})
        self.assertEqual(r["spin_pass_us"], 0.25)

    def test_malformed_logs(self):
        with tempfile.TemporaryDirectory() as d:
            for header, body, want in [
                ("# something else\n", "", "not an rblk stage log"),
                ("# rblk stage log 1: queue 0; stages 0=seen\n", "", "the header names no submitted"),
                (HEADER, "1 2\n", "not 'NS STAGE ARG'"),
                (HEADER, "1 99 0\n", "unknown stage 99"),
            ]:
                with self.assertRaises(stages.StageLogError) as e:
                    stages.read(stage_log(d, body, header))
                self.assertIn(want, str(e.exception))
        with self.assertRaises(stages.StageLogError):
            stages.analyse([])


class GuestLog(unittest.TestCase):
    def test_recorded_rows_and_logs(self):
        meta, rows, fails, logs = recorded()
        self.assertEqual((meta["secs"], meta["guest_cpus"]), ("2", "2"))
        self.assertEqual(rows["rdma qd1"], {"iops": 132.0, "p50_us": 5406.7})
        self.assertEqual(list(rows), ["rdma qd1", "rdma qd32", "null qd1", "null qd32", "sleep qd1"])
        self.assertEqual([n for n, _ in logs], list(rows))
        self.assertEqual(fails, [])

    def test_failures_and_a_broken_stage_log(self):
        """A @@fail line is a failure of its row; a stage log that is not gzip+base64, or not a
        stage log (cut short: the guest killed mid-output), is its row's failure and the other rows still get their stages."""
        good = base64.b64encode(gzip.compress((HEADER + ONE).encode())).decode()
        bad = base64.b64encode(gzip.compress(b"# nothing\n")).decode()
        lines = ["@@meta secs 5", "@@fail null qd32 fio failed: boom", "@@row rdma qd1 100 9.5",
                 "@@stagelog rdma qd1", good, "@@endstagelog", "@@stagelog null qd1", good[:40], "@@endstagelog",
                 "@@stagelog sleep qd1", bad, "@@endstagelog"]
        meta, rows, fails, logs = stages.read_guest_log(lines)
        self.assertEqual(fails, [{"row": "null qd32", "error": "fio failed: boom"}])
        with tempfile.TemporaryDirectory() as d:
            stages.analyse_stage_logs(meta, rows, fails, logs, d)
            self.assertEqual(sorted(os.listdir(d)), ["rdma-qd1.q0", "sleep-qd1.q0"])
        self.assertEqual(rows["rdma qd1"]["stages"]["requests"], 2)
        self.assertEqual([f["row"] for f in fails], ["null qd32", "null qd1", "sleep qd1"])
        self.assertTrue(fails[1]["error"].startswith("its stage log: "), fails)
        self.assertIn("not an rblk stage log", fails[2]["error"])
        text = stages.report(meta, rows, fails)
        self.assertIn("rdma qd1: fio 100 IOPS, p50 9.5 us", text)
        self.assertNotIn("null qd1: fio", text)  # no @@row and no stages: only its failure
        self.assertTrue(text.endswith("failed: sleep qd1: its stage log: " + fails[2]["error"][len("its stage log: "):]))

    def test_report_and_summary_as_before(self):
        with tempfile.TemporaryDirectory() as d:
            s, t = os.path.join(d, "summary.json"), os.path.join(d, "table.txt")
            with redirect_stdout(io.StringIO()) as out:
                self.assertEqual(stages.summarize(LOG, s, t), 0)
            with open(t) as f:
                self.assertEqual(f.read(), expected("stages-table.txt"))
            self.assertEqual(out.getvalue(), expected("stages-table.txt"))
            with open(s) as f:
                self.assertEqual(f.read(), expected("stages-summary.json"))
            self.assertEqual(len(os.listdir(d)), 7)  # the five stage logs kept beside

    def test_no_row_with_stages_fails(self):
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "g.log")
            with open(log, "w") as f:
                f.write("@@row rdma qd1 1 2\n")
            with redirect_stdout(io.StringIO()):
                self.assertEqual(stages.summarize(log, os.path.join(d, "s.json"), os.path.join(d, "t.txt")), 1)

    def test_a_full_disk_is_an_error(self):
        """Writing summary.json on a full disk: exit status 1 and the reason in words."""
        with tempfile.TemporaryDirectory() as d:
            full = os.path.join(d, "summary.json")
            os.symlink("/dev/full", full)
            err = io.StringIO()
            with redirect_stdout(io.StringIO()), redirect_stderr(err):
                self.assertEqual(stages.main(["summarize", LOG, full, os.path.join(d, "table.txt")]), 1)
            self.assertEqual(err.getvalue(), f"stages: {full}: No space left on device\n")
            with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()) as err:
                self.assertEqual(stages.main(["summarize", os.path.join(d, "none.log"), full, full]), 1)
            self.assertIn("none.log: No such file or directory", err.getvalue())

    def test_table_of_a_recorded_row(self):
        _, rows, fails, logs = recorded()
        with tempfile.TemporaryDirectory() as d:
            stages.analyse_stage_logs({"secs": "2"}, rows, fails, logs, d)
        text = stages.table(rows["rdma qd1"]["stages"], "rdma qd1")
        self.assertIn("  posted -> done              1682.1    2490.4     226", text)
        self.assertIn("per request: 2.04 loop passes, 2.74 io_uring_enter, 1.62 sleeps, 1.00 doorbells", text)

    def test_fio_row(self):
        doc = {"jobs": [{"read": {"iops": 1234.56, "clat_ns": {"percentile": {"50.000000": 98765}}}}]}
        self.assertEqual(stages.fio_row(doc), "1235 98.8")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "fio.json")
            with open(path, "w") as f:
                json.dump(doc, f)
            with redirect_stdout(io.StringIO()) as out:
                self.assertEqual(stages.main(["fio-row", path]), 0)
        self.assertEqual(out.getvalue(), "1235 98.8\n")


if __name__ == "__main__":
    unittest.main()
