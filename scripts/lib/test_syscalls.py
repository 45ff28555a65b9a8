"""Unit tests of syscalls.py (run by tests/tests/ublk_path.rs)."""

import os
import unittest

import syscalls

HERE = os.path.dirname(os.path.abspath(__file__))
TRACE = """# tracer: nop
         rblk-q0-812     [001] ..... 101.000001: sys_enter: NR 426 (3, 1, 1, 1, 0, 8)
         rblk-q0-812     [001] ..... 101.000009: sys_enter: NR 1 (9, 7ffd, 18, 0, 0, 0)
         rblk-q0-812     [000] ..... 101.000020: sys_enter: NR 426 (3, 0, 1, 1, 0, 8)
         rblk-q0-812     [000] ..... 101.000031: sys_enter: NR 0 (11, 7ffd, 10, 0, 0, 0)
""".splitlines()


class Counting(unittest.TestCase):
    def test_calls_are_counted_by_number(self):
        self.assertEqual(syscalls.count(TRACE), {426: 2, 1: 1, 0: 1})
        self.assertEqual(syscalls.count(["# tracer: nop", "no event here"]), {})


class Table(unittest.TestCase):
    def setUp(self):
        with open(os.path.join(HERE, "testdata", "ublk-syscalls-guest.log")) as f:
            self.data = syscalls.rows(f)

    def test_counts_per_io_by_kind(self):
        # Recorded 2026-12-07 (a loaded host): main's build against issue 45's.
        old = self.data[("old", 1)]
        self.assertEqual((old["ios"], old["iops"], old["p50_us"]), (456, 78.0, 8224.8))
        self.assertAlmostEqual(old["per_io"]["io_uring_enter"], 1090 / 456)
        self.assertAlmostEqual(old["per_io"]["write"], 513 / 456)
        self.assertAlmostEqual(old["per_io"]["poll"], 56 / 456)
        self.assertAlmostEqual(old["total_per_io"], (513 + 56 + 1090 + 381 + 381) / 456)
        self.assertEqual(list(old["per_io"])[0], "io_uring_enter", "the most frequent first")
        self.assertAlmostEqual(self.data[("old", 32)]["per_io"]["nr219"], 1 / 11566)
        self.assertAlmostEqual(self.data[("new", 1)]["per_io"]["io_uring_enter"], 1011 / 722)

    def test_the_table_has_a_line_per_build_and_depth(self):
        lines = syscalls.table(self.data).splitlines()
        self.assertEqual(len(lines), 5)
        self.assertTrue(lines[1].startswith("new      1      123   4489.2     3.443  1.400  1.008"), lines[1])
        self.assertTrue(lines[2].startswith("old      1       78   8224.8     5.309  2.390  1.125"), lines[2])
        self.assertIn("poll 0.123", lines[2])

    def test_no_ios_is_no_division(self):
        r = syscalls.rows(["@@row old 1 0 0 0", '@@counts old 1 {"426": 5}'])
        self.assertEqual(r[("old", 1)]["per_io"], {"io_uring_enter": 0.0})


if __name__ == "__main__":
    unittest.main()
