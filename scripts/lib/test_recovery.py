"""Unit tests of recovery.py (run by tests/tests/ublk_recovery.rs)."""

import os
import tempfile
import unittest

import recovery

# 2026-12-07T03:00:00Z is Unix 1796612400.
T0 = 1796612400.0

ATTACH = """2026-12-07T03:00:00.150000Z  INFO rblk::ublk: recovery: found the dead server's device dev=/dev/ublkb0
2026-12-07T03:00:00.400000Z  INFO rblk::ublk: recovery: session taken over took=250ms
2026-12-07T03:00:00.420000Z  INFO rblk::ublk: recovery: START_USER_RECOVERY done
2026-12-07T03:00:00.600000Z  INFO rblk::ublk: recovery: serving again dev=/dev/ublkb0
2026-12-07T03:00:00.700000Z  INFO rblk::ublk: recovery: serving again dev=/dev/ublkb0
""".splitlines()

TARGET = """2026-12-07T02:59:50.000000Z  INFO conn{conn=1}: rblk_target::control: opened, with a memory window per QP
2026-12-07T03:00:00.390000Z  INFO conn{conn=3}: rblk_target::control: opened, with a memory window per QP
""".splitlines()

# Trace clock 100.0 is Unix T0 (the marker).
TRACE = f"""# tracer: nop
             fio-300     [001] .....    99.990000: block_rq_complete: 259,0 R () 8 + 8 [0]
            bash-200     [000] .....   100.000000: tracing_mark_write: rblk-kill {T0:.6f}
     kworker/0:1-20      [000] .....   100.050000: block_rq_requeue: 259,0 R () 16 + 8 [0]
     kworker/0:1-20      [000] .....   100.060000: block_rq_requeue: 259,0 R () 24 + 8 [0]
          rblk-q0-400    [001] .....   100.650000: block_rq_complete: 259,0 R () 16 + 8 [0]
""".splitlines()


class Parts(unittest.TestCase):
    def test_attach_stages_take_the_first_line_of_each(self):
        got = recovery.attach_stages(ATTACH)
        self.assertAlmostEqual(got["found"] - T0, 0.15, places=5)
        self.assertAlmostEqual(got["serving"] - T0, 0.6, places=5)
        self.assertEqual(set(got), {"found", "session", "start_recovery", "serving"})

    def test_the_target_open_after_the_kill(self):
        self.assertAlmostEqual(recovery.target_open(TARGET, T0) - T0, 0.39, places=5)
        self.assertIsNone(recovery.target_open(TARGET, T0 + 1))

    def test_the_trace_is_tied_to_unix_time_by_the_marker(self):
        got = recovery.trace_stages(TRACE)
        self.assertAlmostEqual(got["kill"], T0)
        self.assertAlmostEqual(got["requeue"] - T0, 0.05, places=5)
        self.assertAlmostEqual(got["first_complete"] - T0, 0.65, places=5)
        self.assertEqual(recovery.trace_stages(["no marker", TRACE[1]]), {})


class Run(unittest.TestCase):
    def test_a_run_directory_to_lines(self):
        with tempfile.TemporaryDirectory() as d:
            for name, lines in (("attach2.log", ATTACH), ("target.log", TARGET), ("trace.txt", TRACE)):
                with open(os.path.join(d, name), "w") as f:
                    f.write("\n".join(lines) + "\n")
            with open(os.path.join(d, "lat_clat.1.log"), "w") as f:
                f.write(f"{int(T0 * 1000) - 10}, 5, 0, 4096, 0\n{int(T0 * 1000) + 660}, 5, 0, 4096, 0\n")
            out = recovery.run_lines("ram", d, None)
        names = [line.split()[2] for line in out if line.startswith("@@stage")]
        self.assertEqual(names, ["kill", "requeue", "found", "target_open", "session", "start_recovery",
                                 "serving", "first_complete", "fio_first"])
        self.assertEqual(out[-1], "@@fio ram - - - 670")


class Table(unittest.TestCase):
    LOG = [f"@@stage ram kill {T0}", f"@@stage ram gone {T0 + 0.02}", f"@@stage ram kill {T0 + 5}",
           f"@@stage ram found {T0 + 0.15}", f"@@stage ram serving {T0 + 0.6}", "@@fio ram 0 700 650 690",
           "@@flush ram 3 900 268435456 4 4096", "@@stage durable oops x"]

    def test_parse_keeps_the_first_of_each_stage(self):
        stages, fio, flush = recovery.parse(self.LOG)
        self.assertEqual(stages["ram"]["kill"], T0)
        self.assertEqual(fio["ram"], ["0", "700", "650", "690"])
        self.assertEqual(flush["ram"][2], "268435456")
        self.assertNotIn("durable", stages)

    def test_breakdown_in_time_order_with_steps(self):
        rows = recovery.breakdown(recovery.parse(self.LOG)[0]["ram"])
        self.assertEqual([r[0] for r in rows], ["gone", "found", "serving"])
        self.assertAlmostEqual(rows[1][1], 150, places=3)
        self.assertAlmostEqual(rows[2][2], 450, places=3)
        self.assertTrue(rows[0][3].startswith("kernel"))
        self.assertEqual(recovery.breakdown({"found": 1.0}), [])

    def test_table(self):
        text = "\n".join(recovery.table(self.LOG))
        self.assertIn("| found | 150 | 130 | rblk: start, find the dead server's device |", text)
        self.assertIn("longest read 700 ms, write 650 ms", text)
        self.assertIn("first FLUSH after the takeover 900 ms (268435456 bytes", text)


if __name__ == "__main__":
    unittest.main()
