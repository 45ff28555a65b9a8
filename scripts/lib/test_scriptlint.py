"""Unit tests of scriptlint.py (the size rules of scripts/: heredocs of at most 20 lines, scripts
of at most 400 lines, rxe-guest.sh excepted) on the small fixtures in testdata/scriptlint/. Run
from tests/tests/scriptlint.rs (cargo test), or: cd scripts/lib && python3 -m unittest test_scriptlint"""
import io
import os
import tempfile
import unittest
from contextlib import redirect_stdout

import scriptlint

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata", "scriptlint")


def breaches(name, rel=None):
    return scriptlint.check_file(os.path.join(FIX, name), rel or "scripts/" + name)


class Heredocs(unittest.TestCase):
    def test_twenty_lines_here_strings_shifts_and_comments_pass(self):
        with open(os.path.join(FIX, "ok.sh")) as f:
            self.assertEqual(scriptlint.heredocs(f.readlines()), [(3, 20, "EOF")])
        self.assertEqual(breaches("ok.sh"), [])

    def test_a_long_heredoc_is_reported_at_its_line_with_its_length(self):
        self.assertEqual(breaches("long-heredoc.sh"), [(
            "scripts/long-heredoc.sh", 3,
            "heredoc PY of 21 lines (limit 20): move it into a file of its own (Python under scripts/lib)")])

    def test_tab_stripped_heredocs_end_at_their_indented_word(self):
        with open(os.path.join(FIX, "tabs.sh")) as f:
            self.assertEqual(scriptlint.heredocs(f.readlines()), [(3, 21, "EOT")])

    def test_two_heredocs_on_one_line_are_read_in_turn(self):
        with open(os.path.join(FIX, "two.sh")) as f:
            self.assertEqual(scriptlint.heredocs(f.readlines()), [(2, 20, "A"), (2, 21, "B")])
        self.assertEqual([b[1] for b in breaches("two.sh")], [2])

    def test_an_unterminated_heredoc_runs_to_the_end(self):
        self.assertEqual([(b[1], b[2][:22]) for b in breaches("unterminated.sh")], [(2, "heredoc EOF of 21 line")])

    def test_a_shell_script_without_sh_is_known_by_its_shebang(self):
        self.assertEqual([b[1] for b in breaches("ci-run", ".ci/run")], [2])


class Length(unittest.TestCase):
    def test_401_lines_are_too_many_for_shell_and_python(self):
        self.assertEqual(breaches("long.sh"), [("scripts/long.sh", 1, "script of 401 lines (limit 400): split it or "
                                                "move code into scripts/lib")])
        self.assertEqual([b[2][:19] for b in breaches("long.py")], ["script of 401 lines"])

    def test_400_lines_pass(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "x.sh")
            with open(p, "w") as f:
                f.write("true\n" * 400)
            self.assertEqual(scriptlint.check_file(p, "scripts/x.sh"), [])

    def test_rxe_guest_may_be_long_but_not_its_heredocs(self):
        self.assertEqual(breaches("long.sh", "scripts/rxe-guest.sh"), [])
        self.assertEqual([b[1] for b in breaches("long-heredoc.sh", "scripts/rxe-guest.sh")], [3])

    def test_an_unreadable_file_is_a_breach(self):
        self.assertEqual(scriptlint.check_file(os.path.join(FIX, "none.sh"), "scripts/none.sh"),
                         [("scripts/none.sh", 0, "cannot read: No such file or directory")])


class Main(unittest.TestCase):
    def test_prints_file_line_and_fails(self):
        out = io.StringIO()
        with redirect_stdout(out):
            rc = scriptlint.main(["scriptlint.py", "ok.sh", "long-heredoc.sh", "long.sh"], root=FIX)
        self.assertEqual(rc, 1)
        self.assertEqual(out.getvalue().splitlines(), [
            "long-heredoc.sh:3: heredoc PY of 21 lines (limit 20): move it into a file of its own (Python under "
            "scripts/lib)",
            "long.sh:1: script of 401 lines (limit 400): split it or move code into scripts/lib",
        ])

    def test_clean_files_pass_silently(self):
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(scriptlint.main(["scriptlint.py", "ok.sh"], root=FIX), 0)
        self.assertEqual(out.getvalue(), "")

    def test_the_default_files_are_the_scripts_and_ci_but_not_testdata(self):
        with tempfile.TemporaryDirectory() as d:
            for rel in ("scripts/a.sh", "scripts/lib/b.py", "scripts/lib/guest/c.sh", "scripts/lib/testdata/d.sh",
                        "scripts/README.md", ".ci/run"):
                os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
                open(os.path.join(d, rel), "w").close()
            got = sorted(os.path.relpath(p, d) for p in scriptlint.default_files(d))
        self.assertEqual(got, [".ci/run", "scripts/a.sh", "scripts/lib/b.py", "scripts/lib/guest/c.sh"])


if __name__ == "__main__":
    unittest.main()
