"""Unit tests of scripts/compare-rxe.sh's analysis (compare.py, compare_log.py, compare_rows.py,
compare_table.py) on a recorded log: testdata/compare-guest.log is the guest.log of a full run
(COMPARE_ROUNDS=2 COMPARE_SECS=4, 2026-12-07), trimmed to what the analysis reads: every @@ line
as it was; each JSON report keeps a job's name and error and, per direction, iops, bw, total_ios,
runtime and clat_ns without its latency bins (rblk-bench's "rblk" section whole); the timeline's
traces (base64, read only by timeline-rxe.sh) are cut. testdata/compare-timeline/ is the same
run's timeline summary (timeline-rxe.sh --redraw of its untrimmed traces).

The expected figures are that run's table.txt and summary.json, made by the script before it was
split. This file tests the log's reading and the rows; test_compare_report.py the tables, the
timeline's part and summary.json. Each test says what it would catch."""
import os
import unittest

import compare_log
import compare_rows

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


if __name__ == "__main__":
    unittest.main()
