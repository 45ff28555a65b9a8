"""Unit tests of handover.py (run by tests/tests/handover.rs)."""

import io
import os
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

import guestlog
import handover

# A successor's log as rblk-target writes it (tracing's default format, no colours).
SUCCESSOR = """2026-12-07T02:40:01.100000Z  INFO rblk_target::handover: taking the volume over: the same pages and instance volume=v
2026-12-07T02:40:01.900000Z  INFO rblk_target::volume: registered 4.0 GiB for memory windows in 812 ms volume=v device=rxe0
2026-12-07T02:40:01.901000Z  INFO rblk_target::handover: registered the handed volumes ahead, before saying ready: the first OPENs pin nothing registered=1 took=812.5ms
2026-12-07T02:40:01.950000Z  INFO rblk_target::handover: took over 1 volume from rblk-target 0.1.0 pid=77 took=1.25s
2026-12-07T02:40:02.100000Z  INFO rblk_target::control: opened
""".splitlines()

# One whose registration happened at the first OPEN after bye (no devices in the state).
LATE = """2026-12-07T02:41:00.000000Z  INFO rblk_target::handover: took over 1 volume from rblk-target 0.1.0 pid=78 took=300µs
2026-12-07T02:41:00.500000Z  INFO rblk_target::volume: registered 4.0 GiB for memory windows in 790 ms volume=v device=rxe0
""".splitlines()

GUEST_LOG = """rxe-guest: booted
@@reg 64M 20.0 3.0
@@reg 4G 800.0 90.0 1000.0
@@gap 64M randread 120 5000 0
@@gap 64M randwrite-fsync 180 3000 0
@@gap 4G randread 190 5000 0
@@gap 4G randwrite-fsync - 0 -
@@takeover 64M randread 1 400.0 20.0 0.0 30.0 100.0
@@takeover 64M randread 2 420.0 21.0 0.0 32.0 120.0
@@takeover 4G randread 1 1300.0 810.0 0.0 900.0 150.0
@@takeover 4G randread 2 1350.0 - 5.0
@@gap
""".splitlines()


OLD = """2026-12-07T02:40:01.950000Z  INFO rblk_target::handover: the successor is ready: disconnecting and exiting without a final flush
2026-12-07T02:40:02.450000Z  INFO rblk_target::server: shut down after handing the volumes over: nothing written back here
rblk-target: the volumes were handed over: exiting with status 0
""".splitlines()


class Bye(unittest.TestCase):
    def test_the_old_daemons_teardown_and_the_first_open_after_bye(self):
        gone, opened = handover.bye_to(OLD, SUCCESSOR)
        self.assertAlmostEqual(gone, 500.0, places=2)
        self.assertAlmostEqual(opened, 150.0, places=2)
        self.assertEqual(handover.bye_to(OLD[1:], SUCCESSOR), (None, None), "no bye: nothing")
        self.assertEqual(handover.bye_to(OLD, SUCCESSOR[:4])[1], None, "no OPEN after bye")


class Values(unittest.TestCase):
    def test_durations_in_each_unit(self):
        self.assertEqual(handover.duration_ms("1.25s"), 1250.0)
        self.assertEqual(handover.duration_ms("812.5ms"), 812.5)
        self.assertAlmostEqual(handover.duration_ms("300µs"), 0.3)
        self.assertAlmostEqual(handover.duration_ms("7ns"), 7e-6)
        self.assertIsNone(handover.duration_ms("soon"))
        self.assertIsNone(handover.duration_ms(""))

    def test_sizes_are_binary(self):
        self.assertEqual(handover.size_bytes("64M"), 64 << 20)
        self.assertEqual(handover.size_bytes("4g"), 4 << 30)
        self.assertEqual(handover.size_bytes("512"), 512)
        with self.assertRaises(ValueError):
            handover.size_bytes("4 GiB")

    def test_bytes_command(self):
        """`handover.py bytes SIZE`, which handover-rxe.sh calls for each size (not a bare
        `python3 -c`): the bytes on stdout; a size it cannot read fails with a message."""
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            self.assertEqual(handover.main(["handover.py", "bytes", "4G"]), 0)
            self.assertEqual(handover.main(["handover.py", "bytes", "4 GiB"]), 1)
        self.assertEqual(out.getvalue(), f"{4 << 30}\n")
        self.assertIn("not a size: '4 GiB'", err.getvalue())

    def test_fields_and_stamps(self):
        self.assertEqual(handover.field(SUCCESSOR[3], "took"), "1.25s")
        self.assertEqual(handover.field(SUCCESSOR[3], "pid"), "77")
        self.assertIsNone(handover.field(SUCCESSOR[4], "took"))
        self.assertAlmostEqual(guestlog.log_time(SUCCESSOR[0]) % 3600, 40 * 60 + 1.1, places=5)


class Successor(unittest.TestCase):
    def test_registered_ahead(self):
        self.assertEqual(handover.successor(SUCCESSOR), (1250.0, 812.5, 0.0))

    def test_registration_after_bye_is_counted(self):
        bye, ahead, late = handover.successor(LATE)
        self.assertAlmostEqual(bye, 0.3)
        self.assertIsNone(ahead)
        self.assertEqual(late, 790.0)

    def test_a_log_without_a_takeover(self):
        self.assertEqual(handover.successor(["listening on 10.0.0.1:7431"]), (None, None, 0.0))


class Gap(unittest.TestCase):
    def test_the_longest_gap(self):
        self.assertEqual(handover.longest_gap([3, 10, 400]), 390)
        self.assertIsNone(handover.longest_gap([5]))


class Run(unittest.TestCase):
    def test_a_run_directory_to_lines(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "lat_clat.1.log"), "w") as f:
                f.write("1, 5, 0, 4096, 0\n2, 5, 0, 4096, 0\n250, 5, 0, 4096, 0\n")
            with open(os.path.join(d, "fio.out"), "w") as f:
                f.write(";".join(["3", "fio", "t", "0", "0"] + ["0"] * 120) + "\n")
            for n, lines in ((1, SUCCESSOR), (2, LATE)):
                with open(os.path.join(d, f"d{n}.log"), "w") as f:
                    f.write("\n".join(lines) + "\n")
            out = handover.run_lines("4G", "randread", d)
        # d1 follows d0, which is missing (no bye stamp); d2 follows d1 (SUCCESSOR), which has
        # none either: bye is the old daemon's "the successor is ready".
        self.assertEqual(out, ["@@gap 4G randread 248 3 0", "@@takeover 4G randread 1 1250.0 812.5 0.0 - -",
                               "@@takeover 4G randread 2 0.3 - 790.0 - -"])

    def test_an_empty_run(self):
        with tempfile.TemporaryDirectory() as d:
            self.assertEqual(handover.run_lines("64M", "randread", d), ["@@gap 64M randread - 0 -"])


class Table(unittest.TestCase):
    def test_parse(self):
        reg, gaps, takeovers = handover.parse(GUEST_LOG)
        self.assertEqual(reg, {"64M": (20.0, None), "4G": (800.0, 1000.0)})
        self.assertEqual(gaps[("4G", "randwrite-fsync")], (None, 0, None))
        self.assertEqual(takeovers["4G"][0], (1300.0, 810.0, 0.0, 900.0, 150.0))
        self.assertEqual(takeovers["4G"][1], (1350.0, None, 5.0, None, None))

    def test_goals_against_the_recorded_lines(self):
        got = {g: (m, ok) for g, m, ok in handover.goals(*handover.parse(GUEST_LOG))}
        self.assertEqual(got["longest gap at 64M <= 300 ms"], ("180 ms", True))
        self.assertEqual(got["longest gap at 4G <= 1.1x at 64M"], ("1.06x", True))
        # Medians 410 and 1325 ms: 915 ms over a bare 800 ms registration.
        key = "work before bye, 4G minus 64M <= 1.2x a bare registration of 4G"
        self.assertEqual(got[key + " (populated pages)"], ("915 ms / 800 ms = 1.14x", True))
        self.assertEqual(got[key + " (with mapping the pages afresh, as a successor must)"], ("915 ms / 1000 ms = 0.92x", True))
        self.assertEqual(got["fio errors 0"], ("0", True))
        self.assertEqual(got["registration after bye (at the first OPEN) 0 ms"], ("5 ms", False))

    def test_missed_goals_say_so(self):
        lines = ["@@gap 64M randread 400 10 2", "@@gap 1G randread 900 10 0"]
        got = {g: ok for g, _, ok in handover.goals(*handover.parse(lines))}
        self.assertFalse(got["longest gap at 64M <= 300 ms"])
        self.assertFalse(got["longest gap at 1G <= 1.1x at 64M"])
        self.assertFalse(got["fio errors 0"])
        self.assertEqual(handover.goals({}, {}, {}), [])

    def test_the_table_lists_every_size_in_order(self):
        text = "\n".join(handover.table(GUEST_LOG))
        self.assertLess(text.index("| 64M | randread"), text.index("| 4G | randread"))
        self.assertIn("| 4G | 2 | 1325, 1350 | 810 | 5 | 900 | 150, 150 | 800; 1000 |", text)
        self.assertIn("| registration after bye (at the first OPEN) 0 ms | 5 ms | NO |", text)


if __name__ == "__main__":
    unittest.main()
