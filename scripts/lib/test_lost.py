"""Unit tests of lost.py (run by tests/tests/lost.rs)."""

import os
import tempfile
import unittest

import lost

# 2026-12-07T03:00:00Z is Unix 1796612400.
T0 = 1796612400.0
INIT = """2026-12-07T03:00:00.020000Z  WARN rblk_initiator::link: the session to the target was lost (the target disconnected); reconnecting about every 2 s volume=v
2026-12-07T03:00:02.000000Z  WARN rblk_initiator::link: the session to the target was lost (again)
""".splitlines()


class Parts(unittest.TestCase):
    def test_the_bare_peer(self):
        self.assertEqual(lost.watched(["watching", f"disconnected {T0 + 0.013:.6f}"]), T0 + 0.013)
        self.assertIsNone(lost.watched(["watching"]))
        self.assertIsNone(lost.watched(["disconnected soon"]))

    def test_the_initiators_first_loss_line(self):
        self.assertAlmostEqual(lost.reported(INIT), T0 + 0.02)
        self.assertIsNone(lost.reported(["no stamp: the session to the target was lost"]))

    def test_a_case_directory(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "watch.out"), "w") as f:
                f.write(f"watching\ndisconnected {T0 + 0.013:.6f}\n")
            with open(os.path.join(d, "init.log"), "w") as f:
                f.write("\n".join(INIT) + "\n")
            self.assertEqual(lost.run_line("ublk-idle", d).splitlines()[0],
                             f"@@lost ublk-idle {T0 + 0.013:.6f} {T0 + 0.02:.6f}")
        with tempfile.TemporaryDirectory() as d:
            self.assertEqual(lost.run_line("nbd-io", d), "@@lost nbd-io - -\n@@kernel nbd-io - -")


# Trace clock 50.0 is Unix T0 (the marker); the bare peer's id (port 40001) hears first.
TRACE = f"""# tracer: nop
            bash-90      [000] .....    50.000000: tracing_mark_write: rblk-kill {T0:.6f}
    kworker/u4:2-30      [001] .....    50.012000: cm_event_handler: cm.id=4 src=10.99.0.1:40001 dst=10.99.0.1:7441 tos=0 DISCONNECTED (10/0)
    kworker/u4:2-30      [001] .....    50.015000: cm_event_handler: cm.id=5 src=10.99.0.1:40002 dst=10.99.0.1:7441 tos=0 ESTABLISHED (9/0)
    kworker/u4:2-30      [001] .....    50.019000: cm_event_handler: cm.id=6 src=10.99.0.1:40003 dst=10.99.0.1:7441 tos=0 DISCONNECTED (10/0)
    kworker/u4:2-30      [001] .....    50.030000: cm_event_handler: cm.id=5 src=10.99.0.1:40002 dst=10.99.0.1:7441 tos=0 DISCONNECTED (10/0)
""".splitlines()
# As `rdma -j resource show cm_id` prints them (rdma-core 44): ports inside the addresses.
CM_IDS = [
    {"ifname": "rxe0", "cm-idn": 0, "state": "LISTEN", "pid": 200, "comm": "rblk-target",
     "src-addr": "10.99.0.1:7441", "dst-addr": "0.0.0.0:0"},
    {"ifname": "rxe0", "cm-idn": 1, "state": "CONNECT", "pid": 300, "comm": "rblk-test-clien",
     "src-addr": "10.99.0.1:40001", "dst-addr": "10.99.0.1:7441"},
    {"ifname": "rxe0", "cm-idn": 2, "state": "CONNECT", "pid": 301, "comm": "rblk",
     "src-addr": "10.99.0.1:40002", "dst-addr": "10.99.0.1:7441"},
    {"ifname": "rxe0", "cm-idn": 3, "state": "CONNECT", "pid": 301, "comm": "rblk",
     "src-addr": "10.99.0.1:40003", "dst-addr": "10.99.0.1:7441"},
    {"ifname": "rxe0", "cm-idn": 4, "state": "CONNECT", "pid": 200, "comm": "rblk-target",
     "src-addr": "10.99.0.1:7441", "dst-addr": "10.99.0.1:40001"},
]


class Kernel(unittest.TestCase):
    def test_disconnects_after_the_marker_in_unix_time(self):
        got = lost.disconnects(TRACE)
        self.assertEqual([src for _, src in got], ["10.99.0.1:40001", "10.99.0.1:40003", "10.99.0.1:40002"])
        self.assertAlmostEqual(got[0][0] - T0, 0.012, places=5)
        self.assertEqual(lost.disconnects(TRACE[2:]), [], "no marker: no times")

    def test_owners_and_first_times(self):
        self.assertEqual(lost.owners(CM_IDS, "300"), {"10.99.0.1:40001": "watch", "10.99.0.1:40002": "initiator",
                                                      "10.99.0.1:40003": "initiator"})
        kw, ki = lost.kernel_times(TRACE, CM_IDS, 300)
        self.assertAlmostEqual(kw - T0, 0.012, places=5)
        self.assertAlmostEqual(ki - T0, 0.019, places=5)
        self.assertEqual(lost.kernel_times([], CM_IDS, 300), (None, None))

    def test_a_case_directory_with_the_kernels_side(self):
        import json
        with tempfile.TemporaryDirectory() as d:
            for name, text in (("trace.txt", "\n".join(TRACE)), ("cm_ids.json", json.dumps(CM_IDS)),
                               ("watch.pid", "300\n"), ("cm_ids.bad", "")):
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)
            out = lost.run_line("ublk-idle", d).splitlines()
        self.assertEqual(out[1], f"@@kernel ublk-idle {T0 + 0.012:.6f} {T0 + 0.019:.6f}")


class Table(unittest.TestCase):
    LOG = [f"@@kill ublk-idle {T0}", f"@@lost ublk-idle {T0 + 0.013} {T0 + 0.020}",
           f"@@kill nbd-io {T0 + 10}", f"@@lost nbd-io {T0 + 10.013} {T0 + 10.500}",
           f"@@kill library-idle {T0 + 20}", "@@lost library-idle - -", "@@kill bad x"]

    def test_rows_and_goals(self):
        got = {r[0]: r[1:] for r in lost.rows(lost.parse(self.LOG))}
        w, loss, diff, ok = got["ublk-idle"]
        self.assertAlmostEqual(w, 13, places=2)
        self.assertAlmostEqual(diff, 7, places=2)
        self.assertTrue(ok)
        self.assertFalse(got["nbd-io"][3], "487 ms later misses the goal")
        self.assertEqual(got["library-idle"], (None, None, None, False))
        self.assertNotIn("bad", got)

    def test_table(self):
        text = "\n".join(lost.table(self.LOG + [f"@@kernel ublk-idle {T0 + 0.010} {T0 + 0.015}"]))
        self.assertIn("| ublk-idle | 13.0 | 20.0 | 7.0 | yes |", text)
        self.assertIn("| ublk-idle | 10.0 | 15.0 | 3.0 | 5.0 |", text)
        self.assertIn("| library-idle | - | - | - | NO |", text)


if __name__ == "__main__":
    unittest.main()
