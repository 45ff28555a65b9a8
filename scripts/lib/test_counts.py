"""Unit tests of counts.py on a recorded guest log (testdata/counts-guest.log: scripts/counts-rxe.sh
--secs 3, one boot on 2026-12-07; trimmed: the hist lines of threads of no role (the script's own
bash, sleep, ...) left out, runs of spaces squeezed, the reports cut by counts.trim; its table is
the run's) and on small made-up lines. Run from tests/tests/counts.rs (cargo test), or:
cd scripts/lib && python3 -m unittest test_counts"""
import json
import os
import tempfile
import unittest

import counts

LOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata", "counts-guest.log")

SYSCALL = ("{ common_pid: rblk-q0         [       364], id: sys_io_uring_enter            [426] } "
           "hitcount:        101")
SWITCH = "{ common_pid: kworker/u8:1    [        52] } hitcount:          7"
REPORT = {"jobs": [{"jobname": "x", "error": 0, "read": {"iops": 900.0, "total_ios": 2700},
                    "write": {"iops": 100.0, "total_ios": 300}}]}


def window(**kw):
    w = {"counting": 1, "window_ns": 2_000_000_000, "ios": 1000, "ctxt": 4000, "busy": 300, "all": 400,
         "clk_tck": 100, "server_ticks": 50, "gen_ms": 400, "target_ticks": 20}
    w.update(kw)
    return w


def made_up_run(**kw):
    """A ublk run: server threads 10 and 11, fio 20, the target 30, a kworker."""
    def e(comm, tid, n, name=None):
        return {"comm": comm, "tid": tid, "name": name, "nr": None, "count": n}
    return {"window": window(**kw), "report": REPORT, "armed": ["syscalls", "switches", "post_send", "notify_cq"],
            "tids": {"server": {10, 11}, "gen": {20}, "target": {30}},
            "hist": {"syscalls": [e("rblk-q0", 11, 1500, "sys_io_uring_enter"), e("rblk", 10, 500, "sys_write"),
                                  e("fio", 20, 2000, "sys_io_submit"), e("fio", 21, 7, "sys_exit"),
                                  e("rblk-worker-0", 30, 300, "sys_write")],
                     "switches": [e("rblk-q0", 11, 800), e("kworker/u8:1", 52, 200)],
                     "post_send": [e("rblk-q0", 11, 1000), e("rblk-worker-0", 30, 1000)]}}


def recorded():
    with open(LOG) as f:
        return counts.summarize(f)


class HistLines(unittest.TestCase):
    def test_a_syscall_line(self):
        self.assertEqual(counts.parse_hist_line(SYSCALL),
                         {"comm": "rblk-q0", "tid": 364, "name": "sys_io_uring_enter", "nr": 426, "count": 101})

    def test_a_line_without_an_id(self):
        self.assertEqual(counts.parse_hist_line(SWITCH),
                         {"comm": "kworker/u8:1", "tid": 52, "name": None, "nr": None, "count": 7})

    def test_malformed(self):
        with self.assertRaisesRegex(ValueError, "not a hist line"):
            counts.parse_hist_line("Totals:")


class Parse(unittest.TestCase):
    def test_lines_to_runs(self):
        lines = ["noise", "@@meta secs 3", "@@counts_meta armed syscalls raw_syscalls/sys_enter hist:x",
                 "@@counts_meta unavailable notify_cq no kprobe on rxe_req_notify_cq",
                 "@@counts a:randread:1 counting=1 ios=5", "@@counts_tids a:randread:1 server 1,2",
                 "@@counts_tids a:randread:1 gen -", "@@counts_hist a:randread:1 syscalls " + SYSCALL,
                 '@@counts_json a:randread:1 {"jobs": []}', "@@unavailable nbd no nbd-client here",
                 "@@fail b:randread:32 fio exited with status 1: boom"]
        doc = counts.parse(lines)
        self.assertEqual(doc["meta"], {"secs": "3"})
        self.assertEqual(doc["armed"], ["syscalls"])
        self.assertEqual(doc["not_counted"], {"notify_cq": "no kprobe on rxe_req_notify_cq"})
        run = doc["runs"]["a:randread:1"]
        self.assertEqual(run["window"], {"counting": 1, "ios": 5})
        self.assertEqual(run["tids"], {"server": {1, 2}, "gen": set()})
        self.assertEqual(run["hist"]["syscalls"][0]["count"], 101)
        self.assertEqual(run["report"], {"jobs": []})
        self.assertEqual(doc["unavailable"], {"nbd": "no nbd-client here"})
        self.assertEqual(doc["fails"], {"b:randread:32": "fio exited with status 1: boom"})

    def test_malformed_lines_name_their_number(self):
        for bad in ("@@counts a:randread:1 ios=x", "@@counts_json a:randread:1 {", "@@counts_hist a:randread:1 syscalls ?",
                    "@@counts_tids a:randread:1 server"):
            with self.assertRaisesRegex(ValueError, "line 2"):
                counts.parse(["@@meta x y", bad])


class Roles(unittest.TestCase):
    TIDS = {"server": {10}, "gen": {20}, "target": {30}}

    def test_by_thread_id_then_by_name(self):
        self.assertEqual(counts.role_of(10, "rblk-q0", self.TIDS), {"server"})
        self.assertEqual(counts.role_of(30, "rblk-worker-0", self.TIDS), {"target"})
        self.assertEqual(counts.role_of(99, "fio", self.TIDS), {"gen"})  # a job gone before the window ended
        self.assertEqual(counts.role_of(52, "kworker/u8:1", self.TIDS), {"kernel"})
        self.assertEqual(counts.role_of(77, "bash", self.TIDS), {"other"})

    def test_rblk_bench_is_server_and_generator(self):
        self.assertEqual(counts.role_of(5, "rblk-bench", {"server": {5}, "gen": {5}}), {"server", "gen"})

    def test_by_role_sums_and_filters_by_name(self):
        e = made_up_run()["hist"]["syscalls"]
        tids = made_up_run()["tids"]
        self.assertEqual(counts.by_role(e, tids), {"all": 4307, "server": 2000, "gen": 2007, "target": 300})
        self.assertEqual(counts.by_role(e, tids, "sys_io_uring_enter"), {"all": 1500, "server": 1500})


class Rows(unittest.TestCase):
    def test_report_iops(self):
        self.assertEqual(counts.report_iops(REPORT), 1000.0)
        with self.assertRaisesRegex(ValueError, "error 5"):
            counts.report_iops({"jobs": [dict(REPORT["jobs"][0], error=5)]})
        with self.assertRaisesRegex(ValueError, "2 jobs"):
            counts.report_iops({"jobs": REPORT["jobs"] * 2})

    def test_per_io_figures(self):
        r = counts.row("ublk:randread:1", made_up_run())
        self.assertEqual((r["front"], r["rw"], r["qd"], r["uncounted"], r["iops"], r["ios"]),
                         ("ublk", "randread", 1, False, 1000.0, 1000))
        self.assertEqual((r["cpu_pct"], r["server_cpu_pct"], r["gen_cpu_pct"], r["target_cpu_pct"]), (75.0, 25.0, 20.0, 10.0))
        self.assertEqual(r["per_io"], {"ctxt": 4.0, "server_syscalls": 2.0, "server_io_uring_enter": 1.5,
                                       "gen_syscalls": 2.007, "target_syscalls": 0.3, "all_syscalls": 4.307,
                                       "server_switches": 0.8, "switches": 1.0, "doorbells": 2.0,
                                       "server_doorbells": 1.0, "cq_rearms": 0.0})
        self.assertEqual(r["server_syscalls_by_name"], {"sys_io_uring_enter": 1.5, "sys_write": 0.5})

    def test_rblk_bench_counts_its_ios_from_its_iops_and_is_its_own_server(self):
        r = counts.row("bench:randread:32", made_up_run(ios=-1), run_s=4)
        self.assertEqual(r["ios"], 4000)
        self.assertEqual(r["per_io"]["ctxt"], 1.0)
        # fio's threads stand in for rblk-bench's here: the load generator's counts are the server's.
        self.assertEqual(r["per_io"]["server_syscalls"], r["per_io"]["gen_syscalls"])
        self.assertEqual(r["server_cpu_pct"], 20.0)
        with self.assertRaisesRegex(ValueError, "no run time"):
            counts.row("bench:randread:32", made_up_run(ios=-1))

    def test_uncounted_and_serverless_rows(self):
        r = counts.row("ublk:randread:32:uncounted", made_up_run(counting=0))
        self.assertTrue(r["uncounted"])
        self.assertEqual(r["per_io"], {"ctxt": 4.0})
        run = made_up_run()
        run["tids"]["server"] = set()
        r = counts.row("nvmeof:randread:1", run)
        self.assertIsNone(r["per_io"]["server_syscalls"])
        self.assertIsNone(r["per_io"]["server_doorbells"])
        self.assertEqual(r["per_io"]["doorbells"], 2.0)

    def test_malformed_runs(self):
        with self.assertRaisesRegex(ValueError, "not FRONT:RW:QD"):
            counts.row("ublk", made_up_run())
        run = made_up_run()
        run["report"] = None
        with self.assertRaisesRegex(ValueError, "no report"):
            counts.row("ublk:randread:1", run)


class Summary(unittest.TestCase):
    def rows(self, **per_io):
        base = {"front": "ublk", "rw": "randread", "uncounted": False, "iops": 100.0}
        return [dict(base, qd=1, per_io={"server_io_uring_enter": 0.9, "server_syscalls": 2.5}),
                dict(base, qd=32, per_io={"server_syscalls": 0.2, "server_doorbells": None}),
                dict(base, qd=32, uncounted=True, iops=125.0, per_io={})]

    def test_goals(self):
        g = {(x["qd"], x["what"]): x["status"] for x in counts.goals(self.rows())}
        self.assertEqual(g, {(1, "server_io_uring_enter"): "met", (1, "server_syscalls"): "missed",
                             (32, "server_syscalls"): "met", (32, "server_doorbells"): "no row"})

    def test_overhead(self):
        self.assertEqual(counts.overhead(self.rows()), [{"front": "ublk", "rw": "randread", "qd": 32,
                                                          "uncounted_iops": 125.0, "counted_iops": 100.0, "ratio": 0.8}])

    def test_recorded_log(self):
        s = recorded()
        by = {r["label"]: r for r in s["rows"]}
        self.assertEqual(len(by), 16)  # 7 front ends x 2 depths, and ublk's 2 uncounted runs
        ublk = by["ublk:randread:1"]
        self.assertEqual((ublk["ios"], ublk["per_io"]["server_io_uring_enter"]), (436, 2.5))  # 1090 / 436
        self.assertEqual(ublk["server_syscalls_by_name"]["sys_io_uring_enter"], 2.5)
        self.assertEqual(by["bench:randread:1"]["ios"], 861)  # 215.33 IOPS x (1 s ramp + 3 s)
        self.assertAlmostEqual(by["nvmeof:randread:32"]["per_io"]["doorbells"], 21446 / 10722)
        self.assertIsNone(by["nvmeof:randread:32"]["per_io"]["server_syscalls"])  # the kernel serves it
        self.assertIn("ublk:randread:32:uncounted", by)
        self.assertEqual(s["failed"], {})
        self.assertEqual(len(s["goals"]), 4)
        self.assertTrue(all(g["status"] in ("met", "missed") for g in s["goals"]))
        self.assertEqual([o["qd"] for o in s["overhead"]], [1, 32])

    def test_table(self):
        text = "\n".join(counts.table(recorded()))
        self.assertIn("issue 45's goals:", text)
        self.assertIn("tracing's cost: ublk randread QD1", text)
        ublk = next(l for l in text.splitlines() if l.startswith("ublk ") and " 32 " in l)
        self.assertEqual(len(ublk.split()), 3 + 1 + len(counts.COLUMNS))

    def test_trim(self):
        full = {"fio version": "fio-3.33", "jobs": [{"jobname": "j", "error": 0, "usr_cpu": 1.0,
                "read": {"iops": 5.5, "total_ios": 11, "clat_ns": {"percentile": {"50.000000": 1000}}},
                "write": {"iops": 0, "total_ios": 0, "clat_ns": {"N": 0}}}]}
        self.assertEqual(counts.trim(full), {"jobs": [{"jobname": "j", "error": 0,
                         "read": {"iops": 5.5, "total_ios": 11, "clat_p50_ns": 1000},
                         "write": {"iops": 0, "total_ios": 0, "clat_p50_ns": None}}]})

    def test_main_writes_the_summary_and_the_table(self):
        with tempfile.TemporaryDirectory() as d:
            sj, tt = os.path.join(d, "s.json"), os.path.join(d, "t.txt")
            with open(os.devnull, "w") as null:
                import contextlib
                with contextlib.redirect_stdout(null):
                    self.assertEqual(counts.main(["counts.py", LOG, sj, tt]), 0)
            with open(sj) as f:
                doc = json.load(f)
            self.assertEqual(len(doc["rows"]), len(recorded()["rows"]))
            with open(tt) as f:
                self.assertIn("issue 45's goals:", f.read())
            empty = os.path.join(d, "empty.log")
            with open(empty, "w") as f:
                f.write("@@meta x y\n")
            with open(os.devnull, "w") as null:
                with contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
                    self.assertEqual(counts.main(["counts.py", empty, sj, tt]), 1)
                    self.assertEqual(counts.main(["counts.py"]), 2)

    def test_main_fails_on_a_full_disk(self):
        """A summary that cannot be written is an error (exit status 1), not a silent success."""
        import contextlib
        import io
        err = io.StringIO()
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(err):
            self.assertEqual(counts.main(["counts.py", LOG, "/dev/full", os.devnull]), 1)
        self.assertIn("cannot write /dev/full: No space left on device", err.getvalue())

    def test_failed_and_unavailable_runs_show_in_the_table(self):
        s = counts.summarize(["@@meta secs 3", "@@unavailable nbd no nbd-client here",
                              "@@fail fuse:randread:1 fio exited with status 124: timed out",
                              "@@counts ublk:randread:1 counting=0 window_ns=1 ios=1 ctxt=1 busy=1 all=1 clk_tck=100 "
                              "server_ticks=1 gen_ms=1 target_ticks=1"])
        self.assertEqual(s["failed"], {"fuse:randread:1": "fio exited with status 124: timed out",
                                       "ublk:randread:1": "ublk:randread:1: no report"})
        text = "\n".join(counts.table(s))
        self.assertIn("unavailable: nbd: no nbd-client here", text)
        self.assertIn("failed: fuse:randread:1: fio exited with status 124: timed out", text)


if __name__ == "__main__":
    unittest.main()
