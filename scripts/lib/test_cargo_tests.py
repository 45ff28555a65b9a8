"""Unit tests of cargo_tests.py (scripts/test.sh's list of test executables) on cargo's JSON
messages as `cargo test --no-run --message-format=json` writes them. Run from
tests/tests/scriptlint.rs (cargo test), or: cd scripts/lib && python3 -m unittest test_cargo_tests"""
import io
import json
import unittest
from contextlib import redirect_stdout

import cargo_tests

# As cargo 1.95 writes them (trimmed to the fields read, one of each kind of line).
MSGS = [
    {"reason": "compiler-artifact", "target": {"name": "rblk_proto", "kind": ["lib"]},
     "profile": {"test": False}, "executable": None},
    {"reason": "compiler-artifact", "target": {"name": "rblk_proto", "kind": ["lib"]},
     "profile": {"test": True}, "executable": "/b/debug/deps/rblk_proto-1"},
    {"reason": "compiler-artifact", "target": {"name": "rblk-test-client", "kind": ["bin"]},
     "profile": {"test": False}, "executable": "/b/debug/rblk-test-client"},
    {"reason": "compiler-message", "message": {"rendered": "warning"}},
    {"reason": "compiler-artifact", "target": {"name": "ab", "kind": ["test"]},
     "profile": {"test": True}, "executable": "/b/debug/deps/ab-2"},
    {"reason": "compiler-artifact", "target": {"name": "ab", "kind": ["test"]},
     "profile": {"test": True}, "executable": "/b/debug/deps/ab-2"},
    {"reason": "build-finished", "success": True},
]


class Executables(unittest.TestCase):
    def test_test_artifacts_once_in_order(self):
        lines = [json.dumps(m) for m in MSGS]
        self.assertEqual(cargo_tests.test_executables(lines), ["/b/debug/deps/rblk_proto-1", "/b/debug/deps/ab-2"])

    def test_other_lines_are_skipped(self):
        lines = ["   Compiling rblk v0.1.0", "", "[1, 2]", "{not json", json.dumps(MSGS[4])]
        self.assertEqual(cargo_tests.test_executables(lines), ["/b/debug/deps/ab-2"])

    def test_main_prints_one_a_line(self):
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(cargo_tests.main(["cargo_tests.py"], io.StringIO("\n".join(json.dumps(m) for m in MSGS))), 0)
        self.assertEqual(out.getvalue(), "/b/debug/deps/rblk_proto-1\n/b/debug/deps/ab-2\n")


if __name__ == "__main__":
    unittest.main()
