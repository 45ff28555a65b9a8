"""Unit tests of insns.py (run by tests/tests/insns.rs), on the callgrind outputs of one recorded
run of scripts/insns.sh (testdata/insns/: lane-read-qd1 for 256 and 2816 requests, the driver's
thread part -01 and another thread's -02, trimmed to the functions the analysis reads)."""

import contextlib
import io
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import insns

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata", "insns")
REGION = ["*insns_region*"]
TOGGLES = ["rblk_fabric::mem::Endpoint::*"]
LEAVES = ["__memcpy_*", "__memmove_*"]
SCENARIO = {"regions": REGION, "toggle_out": TOGGLES, "subtract": LEAVES}
# Ir inside Driver::insns_region_lane in the recorded runs (the warm-up's call and the rest), the
# memcpy collected in them, and the figure.
SMALL_REGION, SMALL_MEMCPY = 393348 + 785234, 153312
LARGE_REGION, LARGE_MEMCPY = 391848 + 8604346, 1137188
PER_REQUEST = ((LARGE_REGION - LARGE_MEMCPY) - (SMALL_REGION - SMALL_MEMCPY)) / 2560


def part(n, thread=1):
    with open(os.path.join(DATA, f"lane-read-qd1-{n}.out-{thread:02d}")) as f:
        return insns.parse_part(f.read())


def text(name):
    with open(os.path.join(DATA, name)) as f:
        return f.read()


def versions():
    return insns.parse_versions(text("rustc.txt"), text("valgrind.txt"), text("ldd.txt"))


# A part where a toggled-out function calls another one (both match a pattern).
NESTED = """events: Ir
fn=main
cfn=rblk_lane_bench::Driver::insns_region_lane
calls=1 0
0 900
fn=rblk_lane_bench::Driver::insns_region_lane
0 500
cfn=rblk_fabric::Endpoint::post
calls=4 0
0 400
fn=rblk_fabric::Endpoint::post
cfn=rblk_fabric::mem::Endpoint::post
calls=4 0
0 400
totals: 900
"""


class Parse(unittest.TestCase):
    def test_a_recorded_part_gives_its_thread_totals_costs_and_calls(self):
        p = part(256)
        self.assertEqual((p["thread"], p["totals"]), (1, 1202245))
        self.assertEqual(p["costs"]["rblk_lane_bench::Driver::insns_region_lane"], 15186)
        arcs = [a for a in p["arcs"] if a[1] == "rblk_lane_bench::Driver::insns_region_lane"]
        self.assertEqual(sorted(c for _, _, c in arcs), [393348, 785234])
        self.assertTrue(all(caller == "rblk_lane_bench::main" for caller, _, _ in arcs))

    def test_the_cost_after_calls_is_the_call_s_not_the_function_s(self):
        p = insns.parse_part(NESTED)
        self.assertEqual(p["costs"]["main"], 0)
        self.assertEqual(p["costs"]["rblk_lane_bench::Driver::insns_region_lane"], 500)

    def test_compressed_names_are_resolved(self):
        p = insns.parse_part("events: Ir\nfn=(1) outer\ncfn=(2) my_insns_region\ncalls=1 0\n0 70\n"
                             "fn=(2)\n0 70\nfn=(1)\n0 5\ntotals: 75\n")
        self.assertEqual(p["costs"], {"outer": 5, "my_insns_region": 70})
        self.assertEqual(p["arcs"], [("outer", "my_insns_region", 70)])

    def test_an_unfinished_or_foreign_file_is_refused(self):
        with self.assertRaisesRegex(ValueError, "no totals"):
            insns.parse_part("events: Ir\nfn=a\n0 1\n")
        with self.assertRaisesRegex(ValueError, "Ir"):
            insns.parse_part("events: Dr\nfn=a\n0 1\ntotals: 1\n")


class Region(unittest.TestCase):
    def test_the_region_cost_is_the_calls_into_it(self):
        self.assertEqual(insns.region_cost(part(256), REGION), SMALL_REGION)
        self.assertEqual(insns.region_cost(part(2816), REGION), LARGE_REGION)

    def test_the_thread_s_cost_outside_the_region_stays_out(self):
        p = part(256)
        self.assertLess(insns.region_cost(p, REGION), p["totals"])

    def test_memcpy_collected_is_the_calls_into_it(self):
        self.assertEqual(insns.subtracted(part(256), LEAVES), SMALL_MEMCPY)
        self.assertEqual(insns.subtracted(part(2816), LEAVES), LARGE_MEMCPY)
        p = insns.parse_part("events: Ir\nfn=f\ncfn=__memcpy_avx\ncalls=1 0\n0 30\n"
                             "fn=__memcpy_avx\n0 30\ncfn=__memmove_x\ncalls=1 0\n0 10\ntotals: 30\n")
        self.assertEqual(insns.subtracted(p, LEAVES), 30, "a leaf calling a leaf is counted once")

    def test_a_region_calling_itself_is_counted_once(self):
        p = insns.parse_part("events: Ir\nfn=x\ncfn=insns_region\ncalls=1 0\n0 100\n"
                             "fn=insns_region\n0 60\ncfn=insns_region\ncalls=1 0\n0 40\ntotals: 100\n")
        self.assertEqual(insns.region_cost(p, REGION), 100)

    def test_the_driver_thread_is_the_one_that_ran_the_region(self):
        driver, other = part(256, 1), part(256, 2)
        self.assertIs(insns.driver_part([other, driver], REGION), driver)
        with self.assertRaisesRegex(ValueError, "0 threads ran the region"):
            insns.driver_part([other], REGION)
        with self.assertRaisesRegex(ValueError, "2 threads"):
            insns.driver_part([driver, driver], REGION)

    def test_per_request_is_the_difference_over_ten_n(self):
        got = insns.per_request(part(256), part(2816), SCENARIO, 256)
        self.assertAlmostEqual(got, PER_REQUEST)
        self.assertAlmostEqual(got, 2669.43, places=2)
        with_memcpy = insns.per_request(part(256), part(2816), dict(SCENARIO, subtract=[]), 256)
        self.assertAlmostEqual(with_memcpy - got, (LARGE_MEMCPY - SMALL_MEMCPY) / 2560)

    def test_nested_toggle_patterns_are_found(self):
        self.assertEqual(insns.nested_toggles(part(2816), TOGGLES), [])
        nested = insns.nested_toggles(insns.parse_part(NESTED), TOGGLES + ["rblk_fabric::Endpoint::post"])
        self.assertEqual(nested, [("rblk_fabric::Endpoint::post", "rblk_fabric::mem::Endpoint::post")])


class Scenarios(unittest.TestCase):
    def test_the_committed_scenarios_load_and_make_valgrind_commands(self):
        path = os.path.join(os.path.dirname(DATA), "..", "..", "insns-scenarios.json")
        with open(path) as f:
            scenarios, common = insns.load_scenarios(f.read())
        self.assertEqual([s["name"] for s in scenarios],
                         ["lane-read-qd1", "lane-write-qd1", "lane-read-qd32", "lane-write-qd32",
                          "ublk-read-qd1", "ublk-write-qd1", "ublk-read-qd32"])
        self.assertEqual(common, {"toggle_out": TOGGLES, "subtract": LEAVES})
        self.assertEqual((scenarios[0]["toggle_out"], scenarios[0]["subtract"]), (TOGGLES, LEAVES))
        cmd = insns.valgrind_command(scenarios[0], 256, "/o/x.out", "/b")
        self.assertEqual(cmd[:2], ["valgrind", "--tool=callgrind"])
        for want in ("--separate-threads=yes", "--collect-atstart=no", "--callgrind-out-file=/o/x.out",
                     "--toggle-collect=*insns_region*", "--toggle-collect=rblk_fabric::mem::Endpoint::*"):
            self.assertIn(want, cmd)
        self.assertFalse([a for a in cmd if "memcpy" in a], "memcpy is subtracted, never toggled")
        self.assertEqual(cmd[-5:], ["/b/rblk-lane-bench", "--insns", "randread-qd1-registered",
                                    "--requests", "256"])

    def test_the_subcommands_insns_sh_reads(self):
        path = os.path.join(os.path.dirname(DATA), "..", "..", "insns-scenarios.json")

        def run(*args):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                self.assertEqual(insns.main(list(args)), 0)
            return out.getvalue().splitlines()
        self.assertEqual(run("builds", path), ["rblk-lane-bench rblk-lane-bench", "rblk-tests rblk-ublk-path-bench"],
                         "each binary built once")
        self.assertEqual(run("names", path)[0], "lane-read-qd1")
        cmd = run("command", path, "lane-write-qd32", "2816", "/o/w.out", "/b")
        self.assertEqual(cmd[0], "valgrind")
        self.assertEqual(cmd[-4:], ["--insns", "randwrite-qd32-registered", "--requests", "2816"])
        with self.assertRaises(SystemExit):
            run("command", path, "nope", "1", "/o", "/b")

    def test_a_malformed_scenario_is_refused(self):
        one = {"name": "a", "package": "p", "binary": "b", "args": [], "regions": ["f_insns_region"]}
        insns.load_scenarios(json.dumps({"scenarios": [one]}))
        with self.assertRaisesRegex(ValueError, "twice"):
            insns.load_scenarios(json.dumps({"scenarios": [one, one]}))
        with self.assertRaisesRegex(ValueError, "insns_region"):
            insns.load_scenarios(json.dumps({"scenarios": [dict(one, regions=["main"])]}))
        with self.assertRaisesRegex(ValueError, "no 'binary'"):
            insns.load_scenarios(json.dumps({"scenarios": [{k: v for k, v in one.items() if k != "binary"}]}))


class Gate(unittest.TestCase):
    def test_versions_from_the_tools_output(self):
        self.assertEqual(versions(), {"rustc": "1.95.0", "rustc_commit": "59807616e1fa2540724bfbac14d7976d7e4a3860",
                                      "valgrind": "3.19.0", "glibc": "2.36"})
        with self.assertRaisesRegex(ValueError, "glibc"):
            insns.parse_versions(text("rustc.txt"), "valgrind-3.19.0", "")

    def test_other_versions_are_not_compared_and_say_why(self):
        base = versions()
        self.assertIsNone(insns.version_mismatch(base, dict(base, rustc_commit="other")))
        self.assertEqual(insns.version_mismatch(base, dict(base, rustc="1.96.0")),
                         "rustc 1.96.0 != 1.95.0 of the baseline")
        why = insns.version_mismatch(base, dict(base, valgrind="3.22.0", glibc="2.41"))
        self.assertIn("valgrind 3.22.0 != 3.19.0", why)
        self.assertIn("glibc 2.41 != 2.36", why)

    def test_more_than_five_percent_either_way_fails(self):
        base = {"scenarios": {"up": 1000.0, "down": 1000.0, "near": 1000.0}}
        rows, failures = insns.compare({"up": 1060.0, "down": 940.0, "near": 1049.0, "new": 5.0}, base)
        self.assertEqual([r[0] for r in rows], ["up", "down", "near", "new"])
        self.assertEqual(len(failures), 3, failures)
        self.assertIn("up: rose by +6.0% (1000.0 -> 1060.0", failures[0])
        self.assertIn("down: fell by -6.0%", failures[1])
        self.assertIn("new: no baseline", failures[2])
        self.assertIn("+4.9%", insns.table(rows))

    def test_the_baseline_is_committed_alone_with_a_reason(self):
        path = insns.BASELINE_PATH
        self.assertIsNone(insns.commit_check("x", ["a.rs"]))
        self.assertIsNone(insns.commit_check("insns: lane\n\nReason: the lane posts in batches\n", [path]))
        self.assertIn("together with other files (a.rs)", insns.commit_check("Reason: x", [path, "a.rs"]))
        self.assertIn("without a 'Reason:' line", insns.commit_check("new baseline", [path]))


class HeadCommit(unittest.TestCase):
    def test_head_s_message_and_files_or_none_without_history(self):
        with tempfile.TemporaryDirectory(prefix="insns-git-") as d:
            self.assertIsNone(insns.head_commit(d))

            def git(*args):
                subprocess.run(["git", "-C", d, "-c", "user.name=t", "-c", "user.email=t@t", *args],
                               check=True, capture_output=True)
            git("init", "-q")
            os.makedirs(os.path.join(d, "scripts"))
            for name in (insns.BASELINE_PATH, "a.rs"):
                with open(os.path.join(d, name), "w") as f:
                    f.write("x\n")
            git("add", ".")
            git("commit", "-q", "-m", "first\n\nReason: a test")
            message, files = insns.head_commit(d)
            self.assertIn("Reason: a test", message)
            self.assertEqual(sorted(files), ["a.rs", insns.BASELINE_PATH])
            self.assertIn("together with other files (a.rs)", insns.commit_check(message, files))


class Report(unittest.TestCase):
    """report() over the recorded outputs: compared, failing, not compared, updating."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="insns-test-")
        self.scenarios = os.path.join(self.dir, "scenarios.json")
        with open(self.scenarios, "w") as f:
            json.dump({"toggle_out": TOGGLES, "subtract": LEAVES, "scenarios": [
                {"name": "lane-read-qd1", "package": "rblk-lane-bench", "binary": "rblk-lane-bench",
                 "args": [], "regions": REGION}]}, f)
        self.baseline = os.path.join(self.dir, "baseline.json")
        self.repo = os.path.join(self.dir, "no-git")
        os.mkdir(self.repo)

    def tearDown(self):
        shutil.rmtree(self.dir)

    def run_report(self, figure, vers=None, update=False):
        with open(self.baseline, "w") as f:
            json.dump({"versions": vers or versions(), "scenarios": {"lane-read-qd1": figure}}, f)
        out, err = io.StringIO(), io.StringIO()
        args = [self.scenarios, self.baseline, DATA, "256", "--repo", self.repo] + (["--update"] if update else [])
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = insns.report(args)
        return rc, out.getvalue(), err.getvalue()

    def test_within_the_tolerance_passes(self):
        rc, out, err = self.run_report(2680.0)
        self.assertEqual(rc, 0, err)
        self.assertIn("2669.4", out)
        self.assertIn("-0.4%", out)
        self.assertIn("not checking that the baseline was committed on its own", err)

    def test_a_baseline_ten_percent_off_fails_and_says_how_to_update(self):
        rc, _, err = self.run_report(round(PER_REQUEST * 1.1, 1))
        self.assertEqual(rc, 1)
        self.assertIn("lane-read-qd1: fell by -9.1%", err)
        self.assertIn("scripts/insns.sh --update", err)

    def test_no_baseline_fails_saying_how_to_make_one(self):
        self.run_report(1.0)
        os.remove(self.baseline)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = insns.report([self.scenarios, self.baseline, DATA, "256", "--repo", self.repo])
        self.assertEqual(rc, 1)
        self.assertIn("no baseline at", err.getvalue())
        self.assertIn("2669.4", out.getvalue())

    def test_other_versions_pass_saying_not_compared(self):
        rc, out, err = self.run_report(1.0, vers=dict(versions(), rustc="1.94.0"))
        self.assertEqual(rc, 0)
        self.assertIn("not compared: rustc 1.95.0 != 1.94.0 of the baseline", err)
        self.assertIn("2669.4", out)

    def test_update_writes_the_figures_and_versions(self):
        rc, _, err = self.run_report(1.0, update=True)
        self.assertEqual(rc, 0)
        with open(self.baseline) as f:
            doc = json.load(f)
        self.assertEqual(doc["scenarios"], {"lane-read-qd1": 2669.4})
        self.assertEqual(doc["versions"], versions())
        self.assertIn("Reason:", err)


if __name__ == "__main__":
    unittest.main()
