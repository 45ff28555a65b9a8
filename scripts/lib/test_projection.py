"""Unit tests of projection.py (run by tests/tests/projection.rs). The cost table and the
instruction counts here are fixtures with round numbers, not the committed figures."""

import contextlib
import copy
import io
import json
import os
import tempfile
import unittest

import projection

HERE = os.path.dirname(os.path.abspath(__file__))


def fixture_costs():
    c = {k: (v, "us", "fixture", "test") for k, v in {
        "ib_read_lat_small_us": 2.0, "ib_send_lat_2b_us": 1.0, "ib_send_lat_4k_us": 2.0,
        "nvmeof_qd1_us": 10.0, "spdk_initiator_qd1_us": 4.0, "post_us": 0.1, "doorbell_us": 0.05,
        "cq_poll_us": 0.2, "syscall_us": 0.5, "wakeup_us": 4.0, "switch_cpu_us": 2.0,
        "ublk_transport_us": 1.0, "ublk_vm_qd1_extra_us": 12.0}.items()}
    c["ipc"] = (2.0, "instructions/cycle", "fixture", "test")
    c["clock_ghz"] = (1.0, "GHz", "fixture", "test")  # 2,000 instructions per us
    return c


COSTS = fixture_costs()
LIB = {"syscalls_per_io": {"write": 2.0, "ioctl": 0.5, "read": 0.5, "poll": 0.5},
       "switches_per_io": 0.75, "involuntary_switches_per_io": 0.5, "post_syscall": "write", "rearm_syscall": "ioctl"}
UBLK = {"syscalls_per_io": {"io_uring_enter": 2.0, "write": 1.0},
        "switches_per_io": 0.5, "involuntary_switches_per_io": 0.5, "post_syscall": "write", "rearm_syscall": "ioctl"}


def inputs(library=2000, ublk_server=4000):
    return {"paths": {"library": copy.deepcopy(LIB), "ublk": copy.deepcopy(UBLK)},
            "instructions_per_request": {"library": library, "ublk_server": ublk_server}}


def run_main(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = projection.main(["projection.py", *args])
    return rc, out.getvalue(), err.getvalue()


class Projection(unittest.TestCase):
    def test_derived_figures(self):
        d = projection.derived(COSTS)
        self.assertAlmostEqual(d["ib_read_lat_4k_us"], 3.0)  # 2.0 + (2.0 - 1.0)
        self.assertAlmostEqual(d["kernel_initiator_us"], 6.0)  # 10.0 - 4.0

    def test_rxe_counts_become_doorbells_syscalls_and_wakeups(self):
        hw = projection.on_hardware(LIB)
        self.assertEqual(hw, {"doorbells": 2.0, "rearms": 0.5, "io_uring_enter": 0.0, "other_syscalls": 1.0, "wakeups": 0.25})
        hw = projection.on_hardware(UBLK)
        self.assertEqual((hw["io_uring_enter"], hw["doorbells"], hw["other_syscalls"], hw["wakeups"]), (2.0, 1.0, 0.0, 0.0))

    def test_instructions_at_the_stated_ipc_and_clock(self):
        self.assertAlmostEqual(projection.instructions_us(3000, COSTS), 1.5)

    def test_library_latency(self):
        hw = projection.on_hardware(LIB)
        # 3.0 + 1 extra post 0.1 + 0.5 re-arm 0.025 + 1.0 syscall 0.5 + 0.25 wake-up 1.0 + 1.0 of instructions
        self.assertAlmostEqual(projection.library_latency_us(hw, 2000, COSTS), 5.625)
        self.assertAlmostEqual(projection.library_latency_us(hw, 0, COSTS), 4.625)

    def test_ublk_latency(self):
        hw = projection.on_hardware(UBLK)
        # library part 3.0 + 2 io_uring_enter 1.0 + 1.0; client kernel 6.0, ublk 1.0, server 2.0
        self.assertAlmostEqual(projection.ublk_latency_us(hw, 2000, 4000, COSTS), 14.0)
        self.assertAlmostEqual(projection.ublk_latency_us(hw, 2000, 4000, COSTS, vm_transport=True), 19.0)

    def test_cpu_per_io(self):
        self.assertAlmostEqual(projection.cpu_us_per_io(projection.on_hardware(LIB), 2000, COSTS), 2.425)
        self.assertAlmostEqual(projection.cpu_us_per_io(projection.on_hardware(UBLK), 6000, COSTS, ublk=True), 5.3)

    def test_project(self):
        r = projection.project(inputs(), COSTS)
        self.assertAlmostEqual(r["library_qd1_us"], 5.625)
        self.assertAlmostEqual(r["ublk_qd1_us"], 14.0)
        self.assertAlmostEqual(r["library_iops_per_core"], 1e6 / 2.425)
        self.assertAlmostEqual(r["ublk_iops_per_core"], 1e6 / 5.3)

    def test_instructions_at_depth_count_for_iops_per_core_only(self):
        """Would catch the QD32 instruction counts ignored, or used for the QD1 latencies."""
        doc = inputs()
        doc["instructions_per_request"].update(library_qd32=1000, ublk_server_qd32=2000)
        r = projection.project(doc, COSTS)
        self.assertAlmostEqual(r["library_qd1_us"], 5.625)
        self.assertAlmostEqual(r["ublk_qd1_us"], 14.0)
        self.assertAlmostEqual(r["library_iops_per_core"], 1e6 / 1.925)
        self.assertAlmostEqual(r["ublk_iops_per_core"], 1e6 / 3.8)
        doc["instructions_per_request"]["ublk_server_qd32"] = "many"
        with self.assertRaises(projection.InputError):
            projection.project(doc, COSTS)

    def test_project_refuses_without_instructions(self):
        for lib, srv in ((None, 4000), (2000, None), (None, None)):
            with self.assertRaises(projection.MissingInstructions) as e:
                projection.project(inputs(lib, srv), COSTS)
            self.assertIn("scripts/insns.sh", str(e.exception))

    def test_floor_budgets_reach_each_goal_exactly(self):
        f = projection.floor(inputs(None, None), COSTS)
        b = f["budgets"]
        self.assertAlmostEqual(f["library_qd1_us"], 4.625)
        self.assertAlmostEqual(b["library latency"], (4.5 - 4.625) * 2000)  # missed without instructions
        r = projection.project(inputs(0, b["ublk latency"]), COSTS)
        self.assertAlmostEqual(r["ublk_qd1_us"], 13.0)
        self.assertAlmostEqual(b["library IOPS per core"], (1.0 - 1.425) * 2000)
        self.assertAlmostEqual(b["ublk IOPS per core"], (1.0 - 2.3) * 2000)

    def test_goal_checks(self):
        r = {"ublk_qd1_us": 13.0, "library_qd1_us": 4.6, "library_iops_per_core": 1e6, "ublk_iops_per_core": 0.9e6}
        checks = projection.goal_checks(r, COSTS)
        self.assertEqual([met for _, _, _, met in checks], [True, False, True, False])
        self.assertEqual([limit for _, _, limit, _ in checks], [13.0, 4.5, 1e6, 1e6])

    def test_malformed_inputs_say_what_is_wanted(self):
        cases = [([], "paths"), ({"paths": {"library": LIB}}, "paths.ublk"),
                 ({"paths": {"library": dict(LIB, syscalls_per_io=[1]), "ublk": UBLK}}, "syscalls_per_io"),
                 ({"paths": {"library": dict(LIB, switches_per_io=-1), "ublk": UBLK}}, "switches_per_io"),
                 ({"paths": {"library": dict(LIB, switches_per_io="1"), "ublk": UBLK}}, "switches_per_io"),
                 ({"paths": {"library": dict(LIB, syscalls_per_io={"write": True}), "ublk": UBLK}}, "syscalls_per_io.write"),
                 ({"paths": {"library": dict(LIB, post_syscall=None), "ublk": UBLK}}, "post_syscall"),
                 ({"paths": {"library": LIB, "ublk": UBLK}}, "instructions_per_request"),
                 (dict(inputs(), instructions_per_request={"library": "many", "ublk_server": 1}), "instructions_per_request.library")]
        for doc, field in cases:
            with self.assertRaises(projection.InputError) as e:
                projection.project(doc, COSTS)
            self.assertIn(field, str(e.exception))
            self.assertNotIsInstance(e.exception, projection.MissingInstructions)

    def test_inputs_from_a_recorded_timeline(self):
        with open(os.path.join(HERE, "testdata/projection-timeline-summary.json")) as f:
            summary = json.load(f)
        doc = projection.inputs_from_timeline(summary)
        lib, ub = doc["paths"]["library"], doc["paths"]["ublk"]
        self.assertEqual(lib["syscalls_per_io"]["write"], 1.0014)
        self.assertEqual(ub["syscalls_per_io"]["io_uring_enter"], 1.9746)
        self.assertEqual((ub["switches_per_io"], ub["involuntary_switches_per_io"]), (0.0758, 0.0629))
        self.assertIsNone(doc["instructions_per_request"]["library"])
        projection.validate(doc)
        # The committed inputs are this run's counts.
        with open(os.path.join(HERE, "projection-inputs.json")) as f:
            self.assertEqual(json.load(f)["paths"], doc["paths"])
        del summary["paths"]["bench"]
        with self.assertRaises(projection.InputError) as e:
            projection.inputs_from_timeline(summary)
        self.assertIn("paths.bench", str(e.exception))

    def test_every_cost_has_a_value_unit_kind_and_source(self):
        for key, (value, unit, kind, source) in projection.COSTS.items():
            self.assertGreater(value, 0, key)
            self.assertTrue(unit and source, key)
            self.assertIn(kind, ("measured", "model", "estimate", "assumption"), key)
            if kind in ("measured", "model"):
                self.assertTrue("http" in source or "/" in source, key)
        text = projection.render_costs(projection.COSTS)
        for key, (_, _, _, source) in projection.COSTS.items():
            self.assertIn(key, text)
            self.assertIn(source, text)
        self.assertIn("ib_read_lat_4k_us", text)

    def test_command_line(self):
        with tempfile.TemporaryDirectory() as d:
            def write(name, doc):
                path = os.path.join(d, name)
                with open(path, "w") as f:
                    f.write(doc if isinstance(doc, str) else json.dumps(doc))
                return path
            rc, out, err = run_main(write("empty.json", inputs(None, None)))
            self.assertEqual(rc, 1, err)
            self.assertIn("a floor", out)
            self.assertIn("filled in from scripts/insns.sh's baseline", out)
            self.assertIn("scripts/insns.sh", err)
            rc, out, err = run_main(write("full.json", inputs(400, 800)))
            self.assertEqual(rc, 0, err)
            self.assertIn("ublk QD1 <= 1.3 x NVMe-oF's", out)
            self.assertTrue("met" in out and "MISSED" in out, out)
            rc, out, err = run_main(write("bad.json", "{"))
            self.assertEqual((rc, out), (2, ""))
            self.assertIn("cannot read", err)
            rc, _, err = run_main(write("shape.json", {"paths": {}}))
            self.assertEqual(rc, 2)
            self.assertIn("paths.library", err)
            rc, out, _ = run_main("--inputs-from", os.path.join(HERE, "testdata/projection-timeline-summary.json"))
            self.assertEqual(rc, 0)
            self.assertIn("library", json.loads(out)["paths"])
            self.assertEqual(run_main()[0], 2)
            self.assertEqual(run_main(os.path.join(d, "missing.json"))[0], 2)


if __name__ == "__main__":
    unittest.main()
