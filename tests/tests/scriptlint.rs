//! `scripts/lib/scriptlint.py`, the size rules scripts/test.sh's scripts step enforces (issue 45:
//! no heredoc over 20 lines, no script over 400 lines but rxe-guest.sh), on small fixture files;
//! python3 on the host. What it would catch: a long heredoc or script passing unreported, one
//! reported at the wrong line or with the wrong length, here-strings and shifts taken for
//! heredocs, and the default file list missing a folder or checking the test fixtures.

/// scripts/lib/test_scriptlint.py: the unit tests of each function of scriptlint.py.
#[test]
fn the_script_size_checker_passes_its_unit_tests() {
    rblk_tests::python_unittest("test_scriptlint");
}
