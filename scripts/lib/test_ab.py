"""Unit tests of ab.py on a recorded guest log (testdata/ab-guest.log: ab-attach.sh --rounds 2
--secs 4, a warm-up and two rounds per build, fio's JSON reports) and on small variants of it (a
failed step, a report fio never finished, a log cut short). testdata/ab-table.txt is the table
the script's old inline analysis printed from that log. Run from tests/tests/ab.rs (cargo test),
or: cd scripts/lib && python3 -m unittest test_ab"""
import io
import json
import os
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

import ab

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata")
LOG = os.path.join(DATA, "ab-guest.log")


def lines():
    with open(LOG) as f:
        return f.read().splitlines(True)


def run(doc, build, rnd, workload):
    return next(e for e in doc["runs"] if (e["build"], e["round"], e["workload"]) == (build, rnd, workload))


class Parse(unittest.TestCase):
    def test_meta_runs_idles_and_orders(self):
        p = ab.parse(lines())
        self.assertEqual((p["meta"]["secs"], p["meta"]["rounds"], p["meta"]["clk_tck"]), ("4", "2", "100"))
        self.assertEqual(p["meta"]["target"], "/work/main/build/release/rblk-target (new)")
        self.assertEqual(p["meta"]["host_load_after"], "1.92 1.57 1.39")
        self.assertEqual(len(p["runs"]), 10)
        first = p["runs"][0]
        self.assertEqual((first["build"], first["round"], first["workload"], first["ticks"], first["sched_ns"],
                          first["wall_ns"]), ("old", 0, "randwrite_4k_qd32", 108, 1082672971, 3112568000))
        self.assertTrue(first["cmd"].startswith("fio --name=randwrite_4k_qd32 --filename=/dev/ublkb0"))
        self.assertEqual(first["text"][0], "{")
        self.assertEqual(p["orders"], {1: ["old", "new"], 2: ["new", "old"]})
        self.assertEqual([(i["build"], i["round"], i["ticks"]) for i in p["idles"]],
                         [("old", 1, 1), ("new", 1, 1), ("new", 2, 3), ("old", 2, 1)])
        self.assertEqual(p["fails"], [])

    def test_fail_lines_and_a_report_cut_short(self):
        text = lines()[:1000] + ["@@fail new 1 attach rblk attach --daemon failed: no device\n"]
        p = ab.parse(text)
        # The @@fail line is inside old round 1's randread report, which never ends.
        self.assertEqual(p["fails"], [{"build": "old", "round": 1, "step": "randread_4k_qd32",
                                       "error": "the guest's output ends inside this fio report"}])
        p = ab.parse(lines()[:1122] + ["@@fail new 1 attach rblk attach --daemon failed: no device\n"])
        self.assertEqual(p["fails"], [{"build": "new", "round": 1, "step": "attach",
                                       "error": "rblk attach --daemon failed: no device"}])

    def test_carriage_returns_are_dropped(self):
        p = ab.parse(["@@meta clk_tck 250\r\n", "@@order 1 new\r\n"])
        self.assertEqual((p["meta"], p["orders"]), ({"clk_tck": "250"}, {1: ["new"]}))


class Figures(unittest.TestCase):
    def test_cpu_per_io_share_and_fio_figures(self):
        doc = ab.summarize(lines())
        e = run(doc, "old", 1, "randwrite_4k_qd32")
        self.assertEqual((e["iops"], e["total_ios"], e["fio_runtime_ms"]), (7563.968016, 30271, 4001))
        self.assertAlmostEqual(e["clat_p50_us"], 3981.312)
        self.assertAlmostEqual(e["cpu_s"], 2.09)
        self.assertAlmostEqual(e["cpu_us_per_io"], 2.09e6 / 30271)
        self.assertAlmostEqual(e["sched_us_per_io"], 2084115.194 / 30271)
        self.assertAlmostEqual(e["cpu_share"], 2.09 / 5.10058)
        e = run(doc, "new", 2, "randread_4k_qd32")  # the read section, not the write one
        self.assertEqual((e["iops"], e["total_ios"]), (9603.646354, 38453))

    def test_clk_tck_scales_the_cpu(self):
        text = [ln.replace("@@meta clk_tck 100", "@@meta clk_tck 250") for ln in lines()]
        e = run(ab.summarize(text), "old", 1, "randwrite_4k_qd32")
        self.assertAlmostEqual(e["cpu_s"], 209 / 250)

    def test_unreadable_reports_are_failures(self):
        p = ab.parse(lines())
        p["runs"][2]["text"] = ["fio: cannot open /dev/ublkb0"]
        job = json.loads("\n".join(p["runs"][3]["text"]))
        job["jobs"][0]["error"] = 5
        p["runs"][3]["text"] = [json.dumps(job)]
        job["jobs"][0]["error"] = 0
        job["jobs"][0]["read"]["total_ios"] = 0
        p["runs"][5]["text"] = [json.dumps(job)]
        out = ab.results(p)
        self.assertEqual(len(out), 7)
        self.assertEqual([(x["build"], x["round"], x["step"], x["error"]) for x in p["fails"]], [
            ("old", 1, "randwrite_4k_qd32", "cannot read fio's report: substring not found"),
            ("old", 1, "randread_4k_qd32", "cannot read fio's report: fio reports error 5"),
            ("new", 1, "randread_4k_qd32", "cannot read fio's report: fio completed no I/O"),
        ])

    def test_stat(self):
        self.assertIsNone(ab.stat([]))
        self.assertEqual(ab.stat([3.0, 1.0, 2.0]), {"median": 2.0, "min": 1.0, "max": 3.0, "runs": 3,
                                                     "values": [3.0, 1.0, 2.0]})


class Summary(unittest.TestCase):
    def test_medians_spreads_and_ratios(self):
        doc = ab.summarize(lines())
        w = doc["workloads"]["randread_4k_qd32"]
        self.assertEqual(w["old"]["iops"]["values"], [7822.971286, 7467.516242])  # by round, warm-up out
        self.assertAlmostEqual(w["new"]["iops"]["median"], (8532.483758 + 9603.646354) / 2)
        self.assertEqual(w["new"]["rounds_ok"], [1, 2])
        self.assertAlmostEqual(w["ratio_new_old"]["iops"], w["new"]["iops"]["median"] / w["old"]["iops"]["median"])
        self.assertAlmostEqual(w["ratio_new_old"]["iops"], 1.1861054187310278)
        self.assertAlmostEqual(w["ratio_new_old"]["cpu_us_per_io"], 0.8549472752598603)
        self.assertEqual(doc["complete_rounds"], {"old": [1, 2], "new": [1, 2]})
        self.assertEqual(doc["order"], {"1": ["old", "new"], "2": ["new", "old"]})
        self.assertTrue(doc["complete"])
        self.assertEqual((doc["secs"], doc["rounds"], doc["clk_tck"], doc["guest_run_secs"]), (4, 2, 100, 82.0))
        self.assertEqual(doc["guest"], {"kernel": "6.12.95+deb12-amd64", "cpus": 2, "accel": "tcg"})

    def test_idle_share(self):
        idle = ab.summarize(lines())["attach_idle_share"]
        self.assertAlmostEqual(idle["old"]["sched_share"]["median"],
                               (14821140 / 2112122000 + 12494803 / 2084334000) / 2)
        self.assertAlmostEqual(idle["new"]["tick_share"]["max"], 3 / 100 / 2.097608)

    def test_a_failed_round_is_not_complete_and_its_failure_is_listed(self):
        text = [ln for ln in lines()]
        # Drop new round 2's randread report: that round of new is no longer complete.
        start = next(i for i, ln in enumerate(text) if ln.startswith("@@begin new 2 randread"))
        end = next(i for i in range(start, len(text)) if text[i].startswith("@@end"))
        text[start:end + 1] = ["@@fail new 2 randread fio exited with status 1: killed\n"]
        doc = ab.summarize(text)
        self.assertEqual(doc["complete_rounds"], {"old": [1, 2], "new": [1]})
        w = doc["workloads"]["randread_4k_qd32"]["new"]
        self.assertEqual(w["rounds_ok"], [1])
        self.assertEqual(w["failed"], [{"build": "new", "round": 2, "step": "randread",
                                        "error": "fio exited with status 1: killed"}])
        self.assertEqual(doc["workloads"]["randwrite_4k_qd32"]["new"]["failed"], [])

    def test_a_build_without_runs_has_no_ratio(self):
        text, skip = [], False
        for ln in lines():
            skip = skip or ln.startswith("@@begin new")
            if not skip:
                text.append(ln)
            if ln.startswith("@@end"):
                skip = False
        doc = ab.summarize(text)
        self.assertIsNone(doc["workloads"]["randwrite_4k_qd32"]["new"]["iops"])
        self.assertIsNone(doc["workloads"]["randwrite_4k_qd32"]["ratio_new_old"]["iops"])
        self.assertEqual(doc["complete_rounds"]["new"], [])


class Table(unittest.TestCase):
    def test_the_recorded_table(self):
        with open(os.path.join(DATA, "ab-table.txt")) as f:
            self.assertEqual(ab.table(ab.summarize(lines()), LOG) + "\n", f.read())

    def test_numbers(self):
        self.assertEqual(ab.fnum(None, "us"), "-")
        self.assertEqual(ab.fnum(12345.6, "iops"), "12,346")
        self.assertEqual(ab.fnum(0.4123, "pct"), "41.2%")
        self.assertEqual(ab.fnum(1234.56, "us"), "1,234.6")
        self.assertEqual(ab.fnum(70.944, "us"), "70.94")
        self.assertEqual(ab.cell(None, "us"), "no run")
        self.assertEqual(ab.cell(ab.stat([5.0]), "us"), "5.00")
        self.assertEqual(ab.cell(ab.stat([5.0, 7.0]), "us"), "6.00 (5.00-7.00)")

    def test_incomplete_and_failed_runs_are_said(self):
        text = ab.table(ab.summarize(lines()[:1000]), "the.log")
        self.assertIn("INCOMPLETE: the guest did not finish the rounds (see the.log)", text)
        self.assertIn("failed: old round 1 randread_4k_qd32: the guest's output ends inside this fio report", text)
        self.assertIn("randread 4k QD32                          old       0/2", text)


class Main(unittest.TestCase):
    def test_writes_summary_and_table(self):
        with tempfile.TemporaryDirectory() as d:
            sj, tt = os.path.join(d, "summary.json"), os.path.join(d, "table.txt")
            out = io.StringIO()
            with redirect_stdout(out):
                self.assertEqual(ab.main(["ab.py", LOG, sj, tt]), 0)
            with open(tt) as f:
                self.assertEqual(f.read(), out.getvalue())
            with open(sj) as f:
                doc = json.load(f)
        self.assertEqual(list(doc)[:3], ["date", "host", "guest"])
        self.assertEqual((doc["host"]["load_before"], doc["host"]["load_after"]), ("1.70 1.43 1.32", "1.92 1.57 1.39"))
        self.assertNotIn("meta", doc)
        self.assertEqual(len(doc["runs"]), 10)

    def test_fails_without_a_complete_round(self):
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "guest.log")
            with open(log, "w") as f:
                f.writelines(lines()[:1000])
            err = io.StringIO()
            with redirect_stdout(io.StringIO()), redirect_stderr(err):
                rc = ab.main(["ab.py", log, os.path.join(d, "s.json"), os.path.join(d, "t.txt")])
            self.assertTrue(os.path.exists(os.path.join(d, "s.json")))
        self.assertEqual(rc, 1)
        self.assertIn("no complete round (attach and both fio jobs) for: old, new", err.getvalue())

    def test_malformed_log_and_missing_file(self):
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "guest.log")
            with open(log, "w") as f:
                f.write("@@begin old one randwrite_4k_qd32 1 2 3 fio\n")
            err = io.StringIO()
            with redirect_stderr(err):
                self.assertEqual(ab.main(["ab.py", log, os.path.join(d, "s"), os.path.join(d, "t")]), 1)
                self.assertEqual(ab.main(["ab.py", os.path.join(d, "none"), "s", "t"]), 1)
                self.assertEqual(ab.main(["ab.py"]), 2)
        self.assertIn("invalid literal for int()", err.getvalue())
        self.assertIn("No such file", err.getvalue())

    def test_a_full_disk_fails(self):
        err = io.StringIO()
        with redirect_stdout(io.StringIO()), redirect_stderr(err):
            self.assertEqual(ab.main(["ab.py", LOG, "/dev/full", "/dev/full"]), 1)
        self.assertIn("No space left", err.getvalue())


if __name__ == "__main__":
    unittest.main()
