"""Unit tests of guestlog.py (run by tests/tests/lost.rs)."""

import os
import tempfile
import unittest

import guestlog

# 2026-12-07T03:00:00Z is Unix 1796612400.
T0 = 1796612400.0


class Logs(unittest.TestCase):
    def test_log_time(self):
        line = "2026-12-07T03:00:00.250000Z  WARN rblk_initiator::link: lost"
        self.assertAlmostEqual(guestlog.log_time(line), T0 + 0.25)
        self.assertAlmostEqual(guestlog.log_time("[rblk-target] 2026-12-07T03:00:01Z  INFO x"), T0 + 1)
        self.assertIsNone(guestlog.log_time("no stamp"))

    def test_read_lines(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "a.log"), "w") as f:
                f.write("one\ntwo\n")
            self.assertEqual(guestlog.read_lines(d, "a.log"), ["one", "two"])
            self.assertEqual(guestlog.read_lines(d, "missing.log"), [])


class Trace(unittest.TestCase):
    LINES = f"""# tracer: nop
     fio-3 [001] .....    9.000000: block_rq_complete: 259,0 R () 8 + 8 [0]
    bash-2 [000] .....   10.000000: tracing_mark_write: rblk-kill {T0:.6f}
     kw-4  [001] .....   10.050000: block_rq_requeue: 259,0 R () 16 + 8 [0]
    bash-2 [000] .....   10.060000: tracing_mark_write: rblk-kill {T0 + 9:.6f}
""".splitlines()

    def test_events_from_the_marker_in_unix_time(self):
        at, events = guestlog.trace_after_marker(self.LINES, "rblk-kill")
        self.assertEqual(at, T0)
        self.assertEqual([e[1] for e in events], ["block_rq_requeue", "tracing_mark_write"], "the first marker counts")
        self.assertAlmostEqual(events[0][0] - T0, 0.05, places=5)

    def test_without_the_marker(self):
        self.assertEqual(guestlog.trace_after_marker(self.LINES, "other"), (None, []))
        self.assertEqual(guestlog.trace_after_marker([self.LINES[2].replace(f"{T0:.6f}", "soon")], "rblk-kill"),
                         (None, []))


class Fio(unittest.TestCase):
    def test_completion_log(self):
        self.assertEqual(guestlog.fio_log_times(["30, 5, 0, 4096, 0", "x", "", "10, 5, 1, 4096, 8, 0"]), [10, 30])

    def test_terse(self):
        row = ["0"] * 130
        row[4], row[38], row[79] = "2", "6950000", "1500"
        self.assertEqual(guestlog.fio_terse("fio: note\n" + ";".join(row)), (2, 6950.0, 1.5))
        self.assertIsNone(guestlog.fio_terse("nothing"))


class Main(unittest.TestCase):
    def test_run_table_and_usage(self):
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "guest.log")
            with open(log, "w") as f:
                f.write("@@x 1\n")
            calls = []
            run = lambda a, b: calls.append(("run", a, b)) or ["@@x 1"]  # noqa: E731
            table = lambda lines: calls.append(("table", lines)) or ["| x |"]  # noqa: E731
            self.assertEqual(guestlog.main(["p", "run", "A", "B"], "doc", run, table, 2), 0)
            self.assertEqual(guestlog.main(["p", "table", log], "doc", run, table, 2), 0)
            self.assertEqual(calls, [("run", "A", "B"), ("table", ["@@x 1"])])
            self.assertEqual(guestlog.main(["p", "run", "A"], "doc", run, table, 2), 2)


if __name__ == "__main__":
    unittest.main()
