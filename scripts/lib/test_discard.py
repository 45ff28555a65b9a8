"""Unit tests of discard.py (run by tests/tests/discard.rs)."""

import unittest

import discard

LOG = """rxe-guest: rxe0 ACTIVE
@@counters idle 10.0 90 90 4 4
@@counters before-zeroout 12.0 100 100 6 6
@@time rblk-zeroout 0.50
@@counters after-zeroout 13.0 140 108 10 10
@@time rblk-dd-zeros 4.0
@@counters after-dd 17.0 300140 300108 14 14
@@time brd-zeroout 0.25
@@blocks written 140509184
@@note /tmp/discard-rxe/fs: 300 MiB (314572800 bytes) trimmed
@@blocks trimmed 6291456
@@blocks stopped 6291456
@@blocks restarted 6291456
@@blocks taken-over-and-stopped 140509184
@@fio ublk 0
@@fio nbd 3
@@fio fuse-loop
""".splitlines()


class Parse(unittest.TestCase):
    def test_reads_each_kind_by_label(self):
        d = discard.parse(LOG)
        self.assertEqual(d["time"]["brd-zeroout"], ["0.25"])
        self.assertEqual(d["counters"]["after-dd"][1], "300140")
        self.assertEqual(d["blocks"]["trimmed"], ["6291456"])
        self.assertEqual(d["note"], ["/tmp/discard-rxe/fs: 300 MiB (314572800 bytes) trimmed"])
        self.assertEqual(d["fio"]["fuse-loop"], [])

    def test_skips_other_lines_and_empty_markers(self):
        self.assertEqual(discard.parse(["@@", "noise", "@@time"])["time"], {})


class Rows(unittest.TestCase):
    def setUp(self):
        self.all = discard.rows(discard.parse(LOG))

    def find(self, start):
        return next(r for r in self.all if r[0].startswith(start))

    def test_link_bytes_are_packets_beyond_the_idle_rate_at_4_kib(self):
        # 48 packets in 1 s; idle: 20 in 2 s, so 10 of them; 38 x 4 KiB.
        what, value, _, met = self.find("blkdiscard -z 1 GiB: bytes")
        self.assertIn("48 packets, 38 beyond idle; 8 SEND/RECV", what)
        self.assertEqual(value, "152.0 KiB")
        self.assertTrue(met)

    def test_beyond_idle_never_below_zero_and_without_an_idle_window(self):
        c = discard.parse(LOG)["counters"]
        self.assertEqual(discard.beyond_idle(c, "idle", "before-zeroout"), 0)
        del c["idle"]
        self.assertEqual(discard.beyond_idle(c, "before-zeroout", "after-zeroout"), 48)

    def test_too_many_packets_miss_the_goal(self):
        d = discard.parse(LOG)
        d["counters"]["after-zeroout"][1] = "400"
        row = next(r for r in discard.rows(d) if r[0].startswith("blkdiscard -z 1 GiB: bytes"))
        self.assertFalse(row[3])

    def test_zeroout_ratio_against_brd(self):
        _, value, _, met = self.find("blkdiscard -z 1 GiB: rblk")
        self.assertEqual(value, "2.00x")
        self.assertTrue(met)

    def test_freed_share_and_which_steps_stay_down(self):
        _, value, _, met = self.find("fstrim")
        self.assertEqual(value, "100%")
        self.assertTrue(met)
        self.assertTrue(self.find("allocated after fstrim, then restarted")[3])
        self.assertFalse(self.find("allocated after fstrim, then taken-over")[3])

    def test_fio_errors_and_a_missing_count(self):
        self.assertTrue(self.find("fio verify + trim_verify_zero on ublk")[3])
        self.assertFalse(self.find("fio verify + trim_verify_zero on nbd")[3])
        self.assertEqual(self.find("fio verify + trim_verify_zero on fuse-loop")[1], "?")

    def test_table_marks_misses(self):
        text = discard.table(discard.parse(LOG))
        self.assertIn("NO", text)
        self.assertIn("note: /tmp/discard-rxe/fs", text)


if __name__ == "__main__":
    unittest.main()
