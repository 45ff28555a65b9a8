"""Unit tests of grow.py (run by tests/tests/grow.rs)."""

import unittest

import grow

MIB = 1 << 20
T0 = 1796612400.0


def log(case, rnd, frm, to, resized, past, hwm_mib, inodes_after="11 12", done="done ios 40 errors 0 reconnects 0"):
    return [
        f"@@client {case} {rnd} ready {frm}",
        f"@@before {case} {rnd} {(frm // MIB + 30) * 1024} inodes 11",
        f"@@request {case} {rnd} {T0:.6f} {to // MIB}M",
        f"@@client {case} {rnd} resized {to} {T0 + resized / 1e3:.6f}",
        f"@@client {case} {rnd} past {to} {T0 + past / 1e3:.6f}",
        f"@@after {case} {rnd} {hwm_mib * 1024} inodes {inodes_after}",
        f"@@client {case} {rnd} {done}",
    ]


class Grow(unittest.TestCase):
    def rows(self, lines):
        return [grow.measure(g) for g in grow.parse(lines).values()]

    def test_one_grow_is_measured_from_the_request(self):
        (r,) = self.rows(log("small", 1, 256 * MIB, 1280 * MIB, 4.0, 250.0, 1300))
        self.assertAlmostEqual(r["notify_ms"], 4.0, places=2)
        self.assertAlmostEqual(r["resize_ms"], 250.0, places=2)
        self.assertEqual((r["rss"], r["rss_goal"]), (1300 * MIB, 1280 * MIB + 64 * MIB))
        self.assertTrue(r["same_memfd"])
        self.assertEqual((r["ios"], r["errors"], r["reconnects"]), (40, 0, 0))

    def test_goals_met_and_missed(self):
        lines = []
        for rnd, (s, l) in enumerate([(200.0, 240.0), (210.0, 250.0), (190.0, 900.0)], 1):
            lines += log("small", rnd, 256 * MIB, 1280 * MIB, 3.0, s, 1300)
            lines += log("large", rnd, 2048 * MIB, 3072 * MIB, 5.0, l, 3100)
        s = grow.summarize(self.rows(lines))
        self.assertAlmostEqual(s["resize_ms_median"]["small"], 200.0, places=2)
        self.assertAlmostEqual(s["resize_ms_median"]["large"], 250.0, places=2)
        self.assertLess(s["resize_ratio"], 1.2501)
        self.assertTrue(all(s["goals"].values()), s["goals"])
        # A slow hook, an RSS over the goal, a changed memfd, a reconnect: each goal says so.
        bad = log("small", 4, 256 * MIB, 1280 * MIB, 150.0, 200.0, 1400, inodes_after="13 12",
                  done="done ios 40 errors 1 reconnects 1")
        s = grow.summarize(self.rows(lines + bad))
        for goal in ("notify max <= 100 ms", "rss <= old + added + 64 MiB", "old memfd unchanged", "0 errors", "0 reconnects"):
            self.assertFalse(s["goals"][goal], goal)

    def test_a_grow_without_its_write_past_the_end_is_not_measured(self):
        lines = [l for l in log("large", 1, 2048 * MIB, 3072 * MIB, 5.0, 300.0, 3100) if " past " not in l]
        rows = self.rows(lines)
        self.assertIsNone(rows[0]["resize_ms"])
        s = grow.summarize(rows)
        self.assertFalse(s["goals"]["every grow measured"])
        self.assertFalse(s["goals"]["resize ratio <= 1.25"])
        self.assertIn("MISSED every grow measured", grow.table(rows, s))

    def test_the_targets_stages(self):
        lines = log("small", 1, 256 * MIB, 1280 * MIB, 4.0, 250.0, 1300) + [
            "@@target small 1 2026-12-07T03:00:00.000000Z  INFO rblk_target::volume: registered 256 MiB for memory windows in 9 ms",
            "@@target small 1 2026-12-07T03:00:00.002000Z  INFO rblk_target::volume: grew from 256 MiB to 1.25 GiB (2 segments)",
            "@@target small 1 2026-12-07T03:00:00.003500Z  INFO rblk_target::volume: registered 1 GiB for memory windows in 1 ms",
        ]
        (r,) = self.rows([l.replace(f"{T0:.6f}", f"{T0 - 0.001:.6f}") if l.startswith("@@request") else l for l in lines])
        self.assertAlmostEqual(r["made_ms"], 3.0, places=1)
        self.assertAlmostEqual(r["registered_ms"], 4.5, places=1)
        self.assertEqual(grow.stamp("not a time"), None)

    def test_the_table_names_each_grow(self):
        rows = self.rows(log("small", 1, 256 * MIB, 1280 * MIB, 4.0, 250.0, 1300))
        text = grow.table(rows, grow.summarize(rows))
        self.assertIn("256 MiB -> 1,280 MiB", text)
        self.assertIn("250.0", text)


if __name__ == "__main__":
    unittest.main()
