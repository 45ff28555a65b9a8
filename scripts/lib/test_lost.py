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
            self.assertEqual(lost.run_line("ublk-idle", d), f"@@lost ublk-idle {T0 + 0.013:.6f} {T0 + 0.02:.6f}")
        with tempfile.TemporaryDirectory() as d:
            self.assertEqual(lost.run_line("nbd-io", d), "@@lost nbd-io - -")


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
        text = "\n".join(lost.table(self.LOG))
        self.assertIn("| ublk-idle | 13.0 | 20.0 | 7.0 | yes |", text)
        self.assertIn("| library-idle | - | - | - | NO |", text)


if __name__ == "__main__":
    unittest.main()
