"""Unit tests of scripts/compare-rxe.sh's analysis (compare.py, compare_log.py, compare_rows.py,
compare_table.py) on a recorded log: testdata/compare-guest.log is the guest.log of a full run
(COMPARE_ROUNDS=2 COMPARE_SECS=4, 2026-12-07), trimmed to what the analysis reads: every @@ line
as it was; each JSON report keeps a job's name and error and, per direction, iops, bw, total_ios,
runtime and clat_ns without its latency bins (rblk-bench's "rblk" section whole); the timeline's
traces (base64, read only by timeline-rxe.sh) are cut. testdata/compare-timeline/ is the same
run's timeline summary (timeline-rxe.sh --redraw of its untrimmed traces).

The expected figures are that run's table.txt and summary.json, made by the script before it was
split. Each test says what it would catch."""
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

HERE = os.path.dirname(os.path.abspath(__file__))
LOG = os.path.join(HERE, "testdata", "compare-guest.log")
TIMELINE = os.path.join(HERE, "testdata", "compare-timeline")
TIMELINE_SCRIPT = os.path.join(HERE, "..", "timeline-rxe.sh")


def recorded_lines():
    with open(LOG) as f:
        return f.read().split("\n")


def parsed(lines=None):
    log = compare_log.parse_log(lines if lines is not None else recorded_lines())
    secs, _, _, hz, _ = compare_log.settings(log.meta, env={})
    return log, compare_log.parse_runs(log, secs, hz)


def row(f, key):
    spec = next(s for s in compare_rows.WORKLOADS if s[0] == key)
    return compare_rows.workload_row(f, spec)


def block(f, key):
    spec = next(s for s in compare_log.BLOCK_WORKLOADS if s[0] == key)
    goals, missing = [], []
    entry, r = compare_rows.block_row(f, spec, goals, missing)
    return entry, r, goals, missing


def cut_run(lines, workload, tool, rnd):
    """The lines without one run's report (as if the guest never sent it)."""
    out, skip = [], False
    for line in lines:
        if line.startswith(f"@@begin {workload} {tool} {rnd} "):
            skip = True
        if not skip:
            out.append(line)
        if skip and line == f"@@end {workload} {tool} {rnd}":
            skip = False
    return out


class ParseLog(unittest.TestCase):
    """parse_log and settings. Would catch: a kind of @@ line read into the wrong field or not at
    all, a run's report cut or merged with the next, a log that ends inside a run or a file (the
    guest died) passing as whole, a file name that could leave the output directory."""

    def test_the_recorded_log(self):
        log, _ = parsed()
        self.assertEqual(len(log.runs), 86)
        self.assertEqual(log.meta["guest_kernel"], "6.12.95+deb12-amd64")
        self.assertEqual(log.meta["target_idle_cpu_ns"], "0 4063171000")
        self.assertEqual(log.fails, [])
        self.assertEqual(log.unavailable, {})
        self.assertEqual(log.notes, [])
        self.assertEqual(len(log.blk_cpu["ublk"]), 6)
        self.assertEqual(sorted(log.files), ["bench.hlog", "bench.json", "bench_bw.1.log", "bench_iops.1.log",
                                             "bench_lat.1.log", "timeline-guest.log"])
        self.assertIn("@@path ublk dev_name /dev/ublkb0", log.files["timeline-guest.log"])
        first = log.runs[0]
        self.assertEqual((first["workload"], first["tool"], first["round"]), ("randread_4k_qd32", "perftest", 1))
        self.assertEqual(first["cmd"], "ib_read_bw -s 4096 -t 32 -o 32 -Q 1 -D 6 -f 1")
        self.assertIn("#bytes", first["text"])
        g = log.gcpu[("fio_randread_4k_qd32", "ublk", 1)]
        self.assertEqual(len(g), 6)
        self.assertEqual(g[5], 0)
        self.assertEqual(compare_log.settings(log.meta, env={}), (4, 2, "-Q 1", 100, True))

    def test_fail_unavailable_and_an_older_logs_ublk_line(self):
        log = compare_log.parse_log([
            "@@fail fio_randread_4k_qd1 nbd 2 nbd-client failed: no such device",
            "@@unavailable nvmeof no nvme here",
            "@@meta ublk unavailable: no ublk_drv",
            "@@cpu fio_randread_4k_qd1 nbd 2 50 1000",
            "@@gcpu fio_randread_4k_qd1 nbd 2 10 20 30 40",
        ])
        self.assertEqual(log.fails, [{"workload": "fio_randread_4k_qd1", "tool": "nbd", "round": 2,
                                      "error": "nbd-client failed: no such device"}])
        self.assertEqual(log.unavailable, {"nvmeof": "no nvme here", "ublk": "no ublk_drv"})
        self.assertEqual(log.blk_cpu, {"nbd": [0.05], "fio_randread_4k_qd1/nbd": [0.05]})
        # An older guest's @@gcpu without QUEUE_SLEEPS and OVERRAN: zeros.
        self.assertEqual(log.gcpu[("fio_randread_4k_qd1", "nbd", 2)], (10, 20, 30, 40, 0, 0))

    def test_a_guest_that_died_inside_a_run_and_inside_a_file(self):
        lines = recorded_lines()
        end = lines.index("@@end randwrite_4k_qd32 rblk 1")
        log = compare_log.parse_log(lines[:end])
        self.assertEqual(log.fails[-1]["error"], "the guest's output ends inside this run's report")
        self.assertEqual((log.fails[-1]["workload"], log.fails[-1]["round"]), ("randwrite_4k_qd32", 1))
        start = lines.index("@@file timeline-guest.log")
        log = compare_log.parse_log(lines[:start + 20])
        self.assertEqual(log.notes, ["the guest's file timeline-guest.log has no @@endfile: "
                                     "the guest died while sending it"])
        self.assertEqual(len(log.files["timeline-guest.log"]), 19)
        self.assertFalse(compare_log.settings(log.meta, env={})[4])

    def test_a_file_name_that_leaves_the_directory(self):
        with self.assertRaises(compare_log.LogError):
            compare_log.parse_log(["@@file ../../etc/passwd", "x", "@@endfile ../../etc/passwd"])

    def test_settings_of_an_older_log_from_the_environment(self):
        self.assertEqual(compare_log.settings({}, env={"COMPARE_SECS": "3", "COMPARE_ROUNDS": "7"}),
                         (3, 7, "-Q 1", 100, False))


class Figures(unittest.TestCase):
    """Each run's figure. Would catch: perftest's columns split wrongly (its "BW peak[MB/sec]"),
    its message rate read in the wrong unit, the #iterations fallback of a failed clock
    calibration lost, an unusable latency taken as a figure, fio's IOPS or p50 read from the
    wrong direction or unit, rblk-bench's CPU shares lost, output that does not parse taken as
    a figure instead of a failure."""

    def test_perftest_columns_and_figures(self):
        self.assertEqual(compare_log.columns("#bytes #iterations BW peak[MB/sec] MsgRate[Mpps]"),
                         ["#bytes", "#iterations", "BW peak[MB/sec]", "MsgRate[Mpps]"])
        log, _ = parsed()
        run = log.runs[0]
        figs = compare_log.perftest_figures(run["text"])
        self.assertEqual(figs["#bytes"], 4096)
        self.assertAlmostEqual(compare_log.pick(figs, "MsgRate") * 1e6, 21366.0)
        with self.assertRaises(ValueError):
            compare_log.perftest_figures("Couldn't connect to 10.99.0.1:18516")
        with self.assertRaises(ValueError):
            compare_log.pick(figs, "t_typical")

    def test_every_kind_of_run(self):
        log, f = parsed()
        self.assertEqual(f.values[("randread_4k_qd32", "perftest")], [21366.0, 18716.0])
        self.assertEqual(sorted(f.values[("randwrite_4k_qd1", "perftest")]), [78.71, 79.86])
        self.assertAlmostEqual(compare_rows.med(f.values[("fio_randread_4k_qd1", "nvmeof")]), 350.208)
        self.assertAlmostEqual(compare_rows.med(f.values[("fio_randread_4k_qd32", "ublk")]), 10112.3291715)
        v, rate = f.by_round[("fio_randread_4k_qd32", "ublk")][1]
        self.assertEqual(v, rate)
        report = f.values[("randread_4k_qd32", "rblk")][0]
        self.assertIn("lat_us", report["read"])
        self.assertEqual(len(f.cpu["randread_4k_qd32"]), 2)
        self.assertEqual(len(f.own_cpu["randread_4k_qd32"]), 2)
        self.assertEqual(f.cmds[("fio_randread_4k_qd1", "ublk")].split()[0], "fio")
        # raw-lat and the two processes' merge: already in the shape the rows read.
        self.assertEqual(len(f.values[("randread_4k_qd1_raw", "rblk")]), 2)
        self.assertEqual(len(f.values[("randread_4k_2proc", "rblk")]), 2)

    def test_perftest_rate_from_iterations_and_an_unusable_latency(self):
        lines = recorded_lines()
        i = lines.index(next(l for l in lines if l.startswith("@@begin randread_4k_qd32 perftest 1 ")))
        j = next(k for k in range(i, len(lines)) if lines[k].startswith(" 4096 "))
        fields = lines[j].split()
        fields[-1] = "0.000000"  # MsgRate: its clock calibration failed
        lines[j] = " " + "   ".join(fields)
        k = lines.index(next(l for l in lines if l.startswith("@@begin randread_4k_qd1 perftest 1 ")))
        m = next(x for x in range(k, len(lines)) if lines[x].startswith(" 4096 "))
        lat = lines[m].split()
        lat[4] = "0.00"  # t_typical
        lines[m] = " " + "   ".join(lat)
        log, f = parsed(lines)
        self.assertIn(float(fields[1]) / 4, f.values[("randread_4k_qd32", "perftest")])
        self.assertIn("round 1 randread_4k_qd32: perftest rate from #iterations / 4 s", log.notes)
        self.assertEqual(len(f.values[("randread_4k_qd1", "perftest")]), 1)
        self.assertIn("round 1 randread_4k_qd1: perftest latency unusable (t_typical 0.0), skipped", log.notes)

    def test_output_that_does_not_parse_is_a_failure(self):
        lines = recorded_lines()
        i = lines.index(next(l for l in lines if l.startswith("@@begin fio_randread_4k_qd32 ublk 2 ")))
        lines[i + 1] = lines[i + 1][:200]  # a report cut short
        j = lines.index(next(l for l in lines if l.startswith("@@begin randread_4k_qd32 rblk 2 ")))
        lines[j + 1] = lines[j + 1].replace('"error":0', '"error":84', 1)
        log, f = parsed(lines)
        self.assertEqual(len(f.values[("fio_randread_4k_qd32", "ublk")]), 1)
        self.assertEqual(len(f.values[("randread_4k_qd32", "rblk")]), 1)
        errors = {(x["workload"], x["tool"], x["round"]): x["error"] for x in log.fails}
        self.assertTrue(errors[("fio_randread_4k_qd32", "ublk", 2)].startswith("cannot parse its output: "))
        self.assertEqual(errors[("randread_4k_qd32", "rblk", 2)],
                         "cannot parse its output: ValueError: rblk-bench reports error 84")
        with self.assertRaises(ValueError):
            compare_log.fio_job('{"jobs": [{"error": 5}]}')
        job = {"read": {"iops": "12.5", "clat_ns": {"percentile": {"50.000000": 2500}}}}
        self.assertEqual(compare_log.fio_figure(job, "read", "iops"), 12.5)
        self.assertEqual(compare_log.fio_figure(job, "read", "p50"), 2.5)


class Rows(unittest.TestCase):
    """Each row of the first table and of the block devices' table, as summary.json has them.
    Would catch: a median, spread, ratio or goal verdict computed wrongly or from the wrong runs
    (perftest's, the spin variants' shared perftest runs, 2 x ib_write_lat, rblk's own QD32 row for
    the 2-job rows), a failed run not shown, a status, a ratio to NVMe-oF or rblk-bench, a guest
    CPU figure or a missing goal row computed wrongly."""

    def test_bandwidth_row(self):
        _, f = parsed()
        entry, r = row(f, "randread_4k_qd32")
        self.assertEqual(entry["perftest"], 20041.0)
        self.assertEqual(entry["rblk"], 21493.25)
        self.assertAlmostEqual(entry["ratio"], 1.0724639489047452)
        self.assertEqual(entry["goal"], "ratio >= 0.95")
        self.assertIs(entry["goal_met"], True)
        self.assertEqual(entry["perftest_spread"], [18716.0, 21366.0])
        self.assertEqual(entry["runs"], 2)
        self.assertAlmostEqual(entry["target_cpu_share"], 0.0007797315981983911)
        self.assertAlmostEqual(entry["rblk_cpu_share"], 0.49091610763459004)
        self.assertEqual(entry["perftest_cmd"], "ib_read_bw -s 4096 -t 32 -o 32 -Q 1 -D 6 -f 1")
        self.assertEqual(r[0], "randread 4k QD32")
        self.assertNotIn("failed", entry)

    def test_latency_rows(self):
        _, f = parsed()
        spin, _ = row(f, "randread_4k_qd1_p50_spin")
        plain, _ = row(f, "randread_4k_qd1_p50")
        self.assertEqual(spin["perftest"], plain["perftest"])
        self.assertAlmostEqual(plain["perftest"], 63.1)
        self.assertIs(spin["goal_met"], False)
        w, _ = row(f, "randwrite_4k_qd1_p50")
        self.assertAlmostEqual(w["perftest"], 158.57)
        self.assertAlmostEqual(w["ratio"], 0.472012360471716)
        self.assertEqual(w["perftest_cmd"], "2 x ib_write_lat -s 4096 -n 40000")
        self.assertNotIn("goal", w)
        raw, _ = row(f, "randread_4k_qd1_p50_raw")
        self.assertAlmostEqual(raw["rblk"], 76.1135)
        self.assertNotIn("target_cpu_share", raw)

    def test_rows_against_rblk_itself(self):
        _, f = parsed()
        jobs, _ = row(f, "randread_4k_2jobs_p99")
        self.assertAlmostEqual(jobs["perftest"], 3121.151)
        self.assertAlmostEqual(jobs["rblk"], 34168.831)
        self.assertAlmostEqual(jobs["ratio"], 10.947509748807411)
        self.assertEqual(jobs["perftest_cmd"], "rblk-bench --rw randread --bs 4k --iodepth 32")
        raw, _ = row(f, "randread_4k_2jobs_p99_raw")
        self.assertAlmostEqual(raw["ratio"], 4.421, places=3)

    def test_a_row_without_results_says_why(self):
        lines = recorded_lines()
        for r in (1, 2):
            lines = cut_run(lines, "read_64k_qd32", "rblk", r)
        lines.append("@@fail read_64k_qd32 rblk 2 rblk-bench timed out (exit status 124)")
        _, f = parsed(lines)
        entry, r = row(f, "read_64k_qd32")
        self.assertIsNone(entry["rblk"])
        self.assertIsNone(entry["ratio"])
        self.assertIsNone(entry["goal_met"])
        self.assertEqual(entry["failed"], ["round 2: rblk-bench timed out (exit status 124)"])
        self.assertEqual(r[-1], entry["failed"])
        _, f = parsed(cut_run(recorded_lines(), "read_64k_qd32", "rblk", 1))
        entry, _ = row(f, "read_64k_qd32")
        self.assertNotIn("failed", entry)
        self.assertEqual(entry["runs"], 1)

    def test_block_row(self):
        _, f = parsed()
        entry, _, goals, missing = block(f, "block_randread_4k_qd32")
        self.assertAlmostEqual(entry["ublk"], 10112.3291715)
        self.assertAlmostEqual(entry["nvmeof"], 8154.1729135)
        self.assertEqual(entry["rblk_bench"], 21493.25)
        self.assertEqual(set(entry["status"].values()), {"ok"})
        self.assertAlmostEqual(entry["ratios"]["ublk_vs_nvmeof"], 1.2401416156822094)
        self.assertAlmostEqual(entry["ratios"]["ublk_vs_ublk-null"], 0.19855536914470232)
        self.assertAlmostEqual(entry["ratios"]["nvmeof_vs_rblk_bench"], 0.379382965047166)
        self.assertNotIn("nvmeof_vs_nvmeof", entry["ratios"])
        g = entry["guest_cpu"]["ublk"]
        self.assertAlmostEqual(g["us_per_io"], 152.9594530521554)
        self.assertAlmostEqual(g["busy_share"], 0.8341263646878497)
        self.assertAlmostEqual(g["queue_sleeps_per_io"], 0.05580567427886611)
        self.assertIsNone(entry["guest_cpu"]["nvmeof"]["queue_sleeps_per_io"])
        self.assertAlmostEqual(entry["target_cpu_share"]["ublk"], 0.00028230168986381597)
        self.assertNotIn("nvmeof", entry["target_cpu_share"])
        self.assertEqual(goals[0]["goal"], "ublk/nvmeof >= 2.0")
        self.assertIs(goals[0]["met"], False)
        self.assertEqual(goals[0]["label"], "ublk randread 4k QD32 >= 2.0 x nvmeof")
        self.assertEqual(len(goals), 3)
        self.assertEqual(missing, [])
        entry, _, goals, _ = block(f, "block_randread_4k_qd1_p50")
        self.assertNotIn("ublk-q2", entry["status"])
        self.assertAlmostEqual(entry["rblk_bench"], 69.023)
        self.assertAlmostEqual(entry["guest_cpu"]["ublk"]["us_per_io"], 644.423241435505)
        self.assertEqual([g["text"] for g in goals], ["<= 0.5 x nvmeof", "<= 1.6 x bench"])

    def test_block_row_with_paths_failed_unavailable_and_not_run(self):
        lines = recorded_lines()
        for r in (1, 2):
            lines = cut_run(lines, "fio_randwrite_4k_qd32", "ublk", r)
            lines = cut_run(lines, "fio_randwrite_4k_qd32", "nbd", r)
            lines = cut_run(lines, "fio_randwrite_4k_qd32", "nvmeof", r)
        lines += ["@@fail fio_randwrite_4k_qd32 ublk 1 rblk attach --queues 1 --depth 32 --daemon failed: x",
                  "@@unavailable nvmeof no nvme here"]
        _, f = parsed(lines)
        entry, _, goals, missing = block(f, "block_randwrite_4k_qd32")
        self.assertEqual(entry["status"]["ublk"], "failed")
        self.assertEqual(entry["status"]["nbd"], "not run")
        self.assertEqual(entry["status"]["nvmeof"], "unavailable")
        self.assertIsNone(entry["ublk"])
        self.assertIsNone(entry["ratios"]["fuse_vs_nvmeof"])
        self.assertIsNone(goals[0]["met"])
        self.assertEqual(missing, ["randwrite 4k QD32: ublk (failed)", "randwrite 4k QD32: nvmeof (unavailable)"])
        self.assertEqual(entry["errors"]["ublk"], ["round 1: rblk attach --queues 1 --depth 32 --daemon failed: x"])

    def test_guest_cpu_of_a_window_that_outlasted_its_run(self):
        lines = []
        for line in recorded_lines():
            if line.startswith("@@gcpu fio_randread_4k_qd1 ublk 1 "):
                line = line[:-1] + "1"
            lines.append(line)
        log, f = parsed(lines)
        g = compare_rows.guest_cpu(f, "fio_randread_4k_qd1", "ublk")
        self.assertEqual(g["runs"], 1)
        self.assertIn("round 1 fio_randread_4k_qd1 ublk: the CPU window outlasted the run; no CPU figure", log.notes)
        # rblk-bench's runs count no device I/Os: its IOPS x the window.
        g = compare_rows.guest_cpu(f, "randread_4k_qd32", "rblk")
        self.assertEqual(g["runs"], 2)
        self.assertIsNone(g["queue_sleeps_per_io"])
        self.assertGreater(g["us_per_io"], 0)


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
            status = compare.redraw_timeline(log.files["timeline-guest.log"], d, TIMELINE_SCRIPT)
            # The recorded log's traces are cut: the timeline analyses no path, and says so.
            self.assertEqual(status, 1)
            with open(os.path.join(d, "guest.log")) as f:
                self.assertIn("@@path bench bench_p50_us 89.919", f.read())
            with open(os.path.join(d, "summary.json")) as f:
                self.assertIn("error", json.load(f)["paths"]["ublk"])


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
