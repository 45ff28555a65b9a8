"""Unit tests of timeline.py (scripts/timeline-rxe.sh's analysis). Run from tests/tests/timeline.rs
(cargo test), or: cd scripts/lib && python3 -m unittest test_timeline

testdata/timeline-guest.log is the guest log of compare-rxe.sh's timeline boot of 2026-12-07
(build/compare/timeline/guest.log: 8 s per path, 1 s traced, rxe's task functions not probed)
with each path's trace cut to its first 6,000 events; testdata/timeline-table.txt and
timeline-summary.json are what the script's analysis before issue 45 (69fadfe, a heredoc in
timeline-rxe.sh) made of that log: the module must make the same, byte for byte."""
import base64
import gzip
import os
import unittest

import timeline
import timeline_trace

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata")
LOG = os.path.join(DATA, "timeline-guest.log")


def recorded():
    with open(LOG) as f:
        return timeline.read_log(f)


def expected(name):
    with open(os.path.join(DATA, name)) as f:
        return f.read()


def line(comm, pid, cpu, us, event, fields):
    """One line of ftrace's text output, at 10 s + us."""
    return f"{comm:>16}-{pid:<6} [{cpu:03}] d..2. {10 + us / 1e6:.6f}: {event}: {fields}"


def switch(cpu, us, frm, to, state="S"):
    return line(frm[0], frm[1], cpu, us, "sched_switch",
                f"prev_comm={frm[0]} prev_pid={frm[1]} prev_prio=120 prev_state={state} ==> "
                f"next_comm={to[0]} next_pid={to[1]} next_prio=120")


def traced(body):
    """A @@trace block of tracefs text, as the guest sends it."""
    z = base64.b64encode(gzip.compress(body.encode())).decode()
    return [z[i:i + 100] for i in range(0, len(z), 100)]


IDLE, WORKER, BUSY, BENCH = ("swapper/0", 0), ("kworker/u8:1", 31), ("stress", 77), ("rblk-bench", 100)
ITEM = "work struct 00000000aa: function do_work [rdma_rxe]"


def bench_trace(ios):
    """rblk-bench (pid 100, vCPU 1) posts a READ every 200 us; rxe's worker runs on vCPU 0. Even
    I/Os find vCPU 0 idle since the previous one's end (115 us before the post): the item starts
    45 us after the post. Odd I/Os find it running another task: the item starts after 10 us."""
    t = []
    for i in range(ios):
        at = i * 200
        if i % 2:
            t.append(switch(0, at - 5, IDLE, BUSY))
        t.append(line(*BENCH, 1, at, "rxe_post_send", "(rxe_post_send+0x4/0x860 [rdma_rxe])"))
        if i % 2 == 0:
            t.append(switch(0, at + 40, IDLE, WORKER))
        who = BUSY if i % 2 else WORKER
        t.append(line(*who, 0, at + (10 if i % 2 else 45), "workqueue_execute_start", ITEM))
        t.append(line(*who, 0, at + 80, "rxe_cq_post", "(rxe_cq_post+0x4/0x1e0 [rdma_rxe])"))
        t.append(switch(0, at + 85, who, IDLE))
    return "\n".join(t) + "\n"


KPROBES = {"rxe_post_send", "rxe_cq_post"}


class ReadLog(unittest.TestCase):
    def test_recorded_log(self):
        log = recorded()
        self.assertEqual(log.meta["trace_clock"], "mono")
        self.assertEqual(log.meta["kprobes_skipped"].split()[0], "rxe_responder")
        self.assertEqual(log.paths["ublk"], {"dev": "259,0", "dev_name": "/dev/ublkb0", "server": "3254",
                                             "tids": "3263 3265 3266 3254 3256 3257", "fio_p50_us": "264.192"})
        self.assertEqual(log.paths["nvmeof"]["target_dev"], "253,0")
        self.assertEqual(sorted(log.traces), ["bench", "nvmeof", "ublk"])
        self.assertTrue(log.traces["bench"].startswith("# tracer: nop"))
        self.assertEqual(log.fails, [])

    def test_failures_and_broken_traces(self):
        """A @@fail line, a trace that is not base64+gzip and one the log ends inside (the guest
        killed mid-trace) are failures; CRs (the serial console's) are dropped."""
        lines = ["@@meta secs 4\r\n", "@@fail nvmeof nvme connect failed: no route\n", "@@path ublk dev\n",
                 "@@trace ublk\n", "not base64 at all!\n", "@@endtrace ublk\n",
                 "@@trace bench\n"] + traced("x\n")
        log = timeline.read_log(lines)
        self.assertEqual(log.meta, {"secs": "4"})
        self.assertEqual(log.paths["ublk"], {"dev": ""})
        self.assertEqual(log.fails[0], {"path": "nvmeof", "error": "nvme connect failed: no route"})
        self.assertEqual(log.fails[1]["path"], "ublk")
        self.assertTrue(log.fails[1]["error"].startswith("cannot decode its trace: "), log.fails)
        self.assertEqual(log.fails[2], {"path": "bench", "error": "the guest's output ends inside its trace"})
        self.assertEqual(log.traces, {})


class Parse(unittest.TestCase):
    def test_fields_of_each_event_kind(self):
        text = "\n".join([
            "# tracer: nop",
            line("fio", 7, 1, 30, "block_rq_issue", "259,0 R 4096 () 2048 + 8 none,0,0 [fio]"),
            line("fio", 7, 1, 10, "sys_enter", "NR 209 (7f, 1, 0, 0, 0, 0)"),
            switch(0, 20, ("rblk-q0", 9), IDLE, "R+"),
            line("kworker/0:1", 3, 0, 25, "sched_wakeup", "comm=fio pid=7 prio=120 target_cpu=001"),
            line("fio", 7, 1, 40, "block_rq_complete", "259,0 R () 2048 + 8 none,0,0 [0]"),
            line("fio", 7, 1, 41, "block_rq_issue", "garbled"),
            "not a trace line",
        ])
        evs = timeline.parse(text)
        self.assertEqual([e.name for e in evs],
                         ["sys_enter", "sched_switch", "sched_wakeup", "block_rq_issue", "block_rq_complete"])
        self.assertEqual((evs[0].nr, evs[0].pid, evs[0].cpu, evs[0].comm), (209, 7, 1, "fio"))
        self.assertAlmostEqual(evs[0].t, 10_000_010.0, places=3)
        self.assertEqual((evs[1].a, evs[1].b, evs[1].state), (9, 0, "R+"))
        self.assertEqual(evs[2].a, 7)
        self.assertEqual((evs[3].dev, evs[3].rw, evs[3].sector), ("259,0", "R", 2048))
        self.assertEqual((evs[4].dev, evs[4].sector), ("259,0", 2048))

    def test_recorded_trace(self):
        evs = timeline.parse(recorded().traces["ublk"])
        self.assertEqual(len(evs), 6000)
        self.assertEqual(sorted(evs, key=lambda e: e.t), evs)


class Matchers(unittest.TestCase):
    """Each kind of boundary matches its own event, by the thread or device the context names."""

    def test_each_matcher(self):
        evs = timeline.parse("\n".join([
            line("rblk-q0", 9, 0, 1, "rxe_post_send", "(rxe_post_send+0x4/0x860 [rdma_rxe])"),
            line("kworker/0:1", 3, 0, 2, "sched_wakeup", "comm=rblk-q0 pid=9 prio=120 target_cpu=000"),
            switch(0, 3, IDLE, ("rblk-q0", 9)),
            line("rblk-q0", 9, 0, 4, "sys_exit", "NR 426 = 1"),
            line("fio", 7, 1, 5, "sys_exit", "NR 208 = 1"),
            line("kworker/0:1", 3, 0, 6, "workqueue_execute_start", ITEM),
            line("kworker/0:1", 3, 0, 7, "block_rq_issue", "253,0 R 4096 () 8 + 8 none,0,0 [kworker]"),
            line("kworker/0:1", 3, 0, 8, "io_uring_task_add", "ring 1"),
        ]))
        post, wake, sw, uexit, fexit, item, tblk, tadd = evs
        c = {"srv": 9, "fio": {7}, "tdev": "253,0"}
        other = {"srv": 8, "fio": {6}, "tdev": "253,1"}
        for m, e in [(timeline_trace.kp("rxe_post_send", "srv"), post), (timeline_trace.kp("rxe_post_send"), post),
                     (timeline_trace.kp_any(["rxe_receiver", "rxe_post_send"]), post), (timeline_trace.woken("srv"), wake),
                     (timeline_trace.on_cpu("srv"), sw), (timeline_trace.sysx("sys_exit", 426, "srv"), uexit),
                     (timeline_trace.sysx("sys_exit", 208, "fio"), fexit), (timeline_trace.rxe_work, item),
                     (timeline_trace.blk("block_rq_issue", "tdev"), tblk), (timeline_trace.ev("io_uring_task_add"), tadd)]:
            self.assertEqual([x for x in evs if m(x, c)], [e])
        # Another thread, device or fio: no match.
        self.assertFalse(timeline_trace.kp("rxe_post_send", "srv")(post, other))
        self.assertFalse(timeline_trace.woken("srv")(wake, other))
        self.assertFalse(timeline_trace.on_cpu("srv")(sw, other))
        self.assertFalse(timeline_trace.sysx("sys_exit", 208, "fio")(fexit, other))
        self.assertFalse(timeline_trace.blk("block_rq_issue", "tdev")(tblk, other))
        self.assertFalse(timeline_trace.woken("fio")(wake, c))
        self.assertFalse(timeline_trace.sysx("sys_exit", 426, "fio")(uexit, c))


class Windows(unittest.TestCase):
    def test_ublk_serving_thread_and_fio(self):
        log = recorded()
        evs = timeline.parse(log.traces["ublk"])
        ctx, info, wins = timeline.find_windows("ublk", evs, log.paths["ublk"], set())
        self.assertEqual((ctx["srv"], ctx["fio_job"], ctx["dev"]), (3257, 3266, "259,0"))
        self.assertIn(3263, ctx["fio"])
        self.assertEqual(len(wins), 197)
        for s, e in wins:
            self.assertEqual((evs[s].name, evs[e].name, evs[s].sector),
                             ("block_rq_issue", "block_rq_complete", evs[e].sector))
        self.assertEqual(info["dev_name"], "/dev/ublkb0")

    def test_nvme_multipath_takes_the_device_with_the_reads(self):
        """The @@path device (nvme0n1, 259,1) has no requests; the hidden path device has."""
        log = recorded()
        evs = timeline.parse(log.traces["nvmeof"])
        ctx, info, wins = timeline.find_windows("nvmeof", evs, log.paths["nvmeof"], set())
        self.assertEqual(ctx["dev"], "259,0")
        self.assertEqual(info["dev_name"], "/dev/nvme0n1 (requests on 259,0)")
        self.assertEqual(ctx["srv"], ctx["fio_job"])
        self.assertEqual(len(wins), 167)

    def test_errors(self):
        none = timeline.find_windows("ublk", [], {"dev": "259,0", "dev_name": "/dev/ublkb0"}, set())
        self.assertEqual(none, {"error": "no block_rq_issue of a read on /dev/ublkb0 (259,0) in the trace"})
        evs = timeline.parse(bench_trace(4))
        self.assertEqual(timeline.find_windows("bench", evs, {"tids": "5"}, KPROBES),
                         {"error": "no rxe_post_send by rblk-bench's threads in the trace"})
        self.assertEqual(timeline.find_windows("bench", [], {}, set())["error"],
                         "no rxe_post_send by rblk-bench's threads in the trace "
                         "(no kprobe rxe_post_send on this kernel)")


class Marks(unittest.TestCase):
    def test_a_switch_in_counts_only_after_the_wakeup(self):
        """bench: the thread switched in without a wakeup before (it never slept) must not be
        "on CPU"; after a wakeup it is."""
        t = []
        for i in range(4):
            at = i * 100
            t.append(line(*BENCH, 1, at, "rxe_post_send", "x"))
            if i == 1:
                t.append(line(*WORKER, 0, at + 10, "sched_wakeup", "comm=rblk-bench pid=100 prio=120"))
            t.append(switch(1, at + 20, IDLE, BENCH))
        t.append(line(*BENCH, 1, 400, "rxe_post_send", "x"))
        evs = timeline.parse("\n".join(t))
        ctx, _, wins = timeline.find_windows("bench", evs, {}, KPROBES)
        spec = timeline.SPEC["bench"]
        self.assertEqual([m[0] for m in timeline.io_marks("bench", spec, evs, ctx, wins, 1)],
                         [timeline_trace.READ_POSTED, "bench thread woken (sched_wakeup)",
                          "bench thread on CPU (sched_switch in)", "next READ posted (rxe_post_send)"])
        self.assertEqual([m[0] for m in timeline.io_marks("bench", spec, evs, ctx, wins, 2)],
                         [timeline_trace.READ_POSTED, "next READ posted (rxe_post_send)"])

    def test_pre_and_post_boundaries_of_a_recorded_ublk_io(self):
        log = recorded()
        evs = timeline.parse(log.traces["ublk"])
        ctx, _, wins = timeline.find_windows("ublk", evs, log.paths["ublk"], set())
        marks = timeline.io_marks("ublk", timeline.SPEC["ublk"], evs, ctx, wins, 1)
        names = [m[0] for m in marks]
        self.assertEqual(names[:3], ["fio io_submit (sys_enter)", "ublk_queue_rq (kprobe)", "block_rq_issue"])
        self.assertEqual(names[-3:],
                         ["block_rq_complete", "fio woken (sched_wakeup)", "fio io_getevents returns (sys_exit)"])
        self.assertEqual([m[1] for m in marks], sorted(m[1] for m in marks))
        self.assertTrue(all(wins[0][1] < m[2] < wins[2][0] for m in marks))

    def test_rxe_wakeup_from_idle_and_busy(self):
        evs = timeline.parse(bench_trace(5))
        ctx, _, wins = timeline.find_windows("bench", evs, {}, KPROBES)
        spec = timeline.SPEC["bench"]
        idle = timeline.rxe_wakeup(evs, timeline.io_marks("bench", spec, evs, ctx, wins, 2), wins, 2)
        busy = timeline.rxe_wakeup(evs, timeline.io_marks("bench", spec, evs, ctx, wins, 1), wins, 1)
        self.assertEqual(idle, (True, 45.0, 115.0))
        self.assertEqual(busy, (False, 10.0, None))
        self.assertIsNone(timeline.rxe_wakeup(evs, [(timeline_trace.READ_POSTED, 0.0, 3)], wins, 1))


class Counts(unittest.TestCase):
    def test_span_counts(self):
        evs = timeline.parse("\n".join([
            line("rblk-q0", 9, 0, 1, "sys_enter", "NR 426 (3)"),
            line("rblk-q0", 9, 0, 2, "sys_enter", "NR 426 (3)"),
            line("rblk-q0", 9, 0, 3, "sys_enter", "NR 1 (3)"),
            line("rblk-q0", 9, 0, 4, "sys_enter", "NR 999 (3)"),
            line("fio", 7, 1, 5, "sys_enter", "NR 209 (3)"),
            switch(0, 6, ("rblk-q0", 9), IDLE, "S"),
            switch(0, 7, ("rblk-q0", 9), IDLE, "R+"),
            switch(1, 8, ("fio", 7), IDLE, "S"),
            line("rblk-q0", 9, 0, 9, "io_uring_submit_req", "ring 1"),
        ]))
        c = timeline.span_counts(evs, 9, 7, 2)
        self.assertEqual(c, {"io_uring_enter_per_io": 1.0,
                             "syscalls_per_io": {"io_uring_enter": 1.0, "write": 0.5, "nr999": 0.5},
                             "switches_per_io": 1.0, "involuntary_switches_per_io": 0.5, "fio_switches_per_io": 0.5,
                             "io_uring_events_per_io": {"io_uring_submit_req": 0.5}})
        self.assertIsNone(timeline.span_counts(evs, 9, None, 2)["fio_switches_per_io"])


class StageRows(unittest.TestCase):
    def test_missing_says_why(self):
        spec = timeline.SPEC["bench"]
        names = timeline.labels(spec)
        seen = {n: 0 for n in names}
        per = {n: [] for n in names}
        seen[timeline_trace.READ_POSTED] = seen["CQE posted (rxe_cq_post)"] = 2
        per["CQE posted (rxe_cq_post)"] = [10.0, 30.0]
        rows = {r["stage"]: r for r in timeline.stage_rows(spec, seen, per, 2, {"rxe_cq_post"}, {"rxe_requester"})}
        missing = {k: r.get("missing") for k, r in rows.items()}
        self.assertEqual(missing["rxe requester runs (rxe_requester)"],
                         "rxe_requester not probed (RBLK_TIMELINE_SKIP_KPROBES)")
        self.assertEqual(missing["rxe completer runs (rxe_completer)"], "no kprobe rxe_completer on this kernel")
        self.assertEqual(missing["target's responder runs (rxe_receiver)"], "no kprobe rxe_receiver on this kernel")
        self.assertEqual(rows["CQE posted (rxe_cq_post)"],
                         {"stage": "CQE posted (rxe_cq_post)", "seen_share": 1.0, "first": False,
                          "median_us": 20.0, "mean_us": 20.0, "n": 2})
        self.assertTrue(rows[timeline_trace.READ_POSTED]["first"])
        self.assertNotIn("missing", rows[RXE_WORK := timeline.RXE_WORK])
        self.assertEqual(rows[RXE_WORK]["seen_share"], 0.0)

    def test_either_function_is_enough(self):
        m = timeline_trace.kp_any(["rxe_receiver", "rxe_responder"])
        self.assertIsNone(timeline.needs_missing(m, {"rxe_responder"}))
        self.assertEqual(timeline.needs_missing(m, set()), "rxe_receiver")
        self.assertIsNone(timeline.needs_missing(timeline_trace.rxe_work, set()))


class Analyse(unittest.TestCase):
    def test_recorded_paths(self):
        r = timeline.analyse_all(recorded())
        u, n, b = r["ublk"], r["nvmeof"], r["bench"]
        self.assertEqual((u["ios"], n["ios"], b["ios"]), (195, 165, 620))
        self.assertEqual(u["total_block_us"]["median_us"], 249.0)
        self.assertEqual(u["total_app_us"]["median_us"], 350.0)
        self.assertIsNone(b["total_app_us"])
        self.assertAlmostEqual(u["io_uring_enter_per_io"], 358 / 195)
        self.assertAlmostEqual(u["syscalls_per_io"]["write"], 197 / 195)
        self.assertAlmostEqual(n["fio_switches_per_io"], 183 / 165)
        self.assertEqual(u["serving_thread"], {"tid": 3257, "comm": "rblk-q0"})
        self.assertEqual(b["rxe_worker"]["idle_share"], 0.4)
        self.assertEqual(b["rxe_worker"]["idle_before_post_us"]["median_us"], 8.0)
        self.assertEqual((u["fio_p50_us"], b["bench_p50_us"]), (264.192, "89.919"))
        self.assertEqual(n["device"], "/dev/nvme0n1 (requests on 259,0)")

    def test_synthetic_bench(self):
        """21 posts make 20 windows; 1..18 are analysed: 9 from idle, 9 busy."""
        r = timeline.analyse("bench", bench_trace(21), {"tids": "100"}, KPROBES, set())
        self.assertEqual(r["ios"], 18)
        self.assertEqual(r["rxe_worker"], {"idle_share": 0.5,
                                           "from_idle_us": {"median_us": 45.0, "mean_us": 45.0, "n": 9},
                                           "from_busy_us": {"median_us": 10.0, "mean_us": 10.0, "n": 9},
                                           "idle_before_post_us": {"median_us": 115.0, "mean_us": 115.0, "n": 9}})
        self.assertEqual(r["total_block_us"]["median_us"], 200.0)

    def test_too_few_ios_and_missing_or_broken_traces(self):
        self.assertEqual(timeline.analyse("bench", bench_trace(2), {}, KPROBES, set()),
                         {"error": "too few complete I/Os in the trace (1)"})
        log = timeline_trace.Log({}, {"bench": {"tids": "one"}}, [], {"bench": bench_trace(5)})
        r = timeline.analyse_all(log)
        self.assertEqual(r["ublk"], {"error": "no trace (see the failures)"})
        self.assertEqual(r["bench"], {"error": "cannot analyse the trace: ValueError: "
                                               "invalid literal for int() with base 10: 'one'"})


if __name__ == "__main__":
    unittest.main()
