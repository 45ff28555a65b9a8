//! The Python behind `scripts/test.sh` itself, on the host (python3, no guest):
//! - `scripts/lib/scriptlint.py`, the size rules its scripts step enforces (issue 45: no heredoc
//!   over 20 lines, no script over 400 lines but rxe-guest.sh), on small fixture files. What it
//!   would catch: a long heredoc or script passing unreported, one reported at the wrong line or
//!   with the wrong length, here-strings and shifts taken for heredocs, and the default file list
//!   missing a folder or checking the test fixtures.
//! - `scripts/lib/cargo_tests.py`, the test executables it sends to the guest, from cargo's JSON
//!   messages. What it would catch: a test executable left out (its rxe tests never run), a
//!   binary or a duplicate sent, cargo's non-JSON lines breaking the list.
//! - the shell library the measurement scripts share (`scripts/lib/target.sh`'s waits,
//!   proc_ticks and oneline, `scripts/lib/script.sh`'s with_guest_lock and guest_tee), in bash.
//!   What it would catch: a wait that returns before its line (or Nth line) is there, never
//!   times out, or waits on for a process that is gone; a comm with spaces or parentheses
//!   misread; a guest run without the lock, or waiting forever for a lock its caller holds.

/// scripts/lib/test_scriptlint.py: the unit tests of each function of scriptlint.py.
#[test]
fn the_script_size_checker_passes_its_unit_tests() {
    rblk_tests::python_unittest("test_scriptlint");
}

/// scripts/lib/test_cargo_tests.py: the unit tests of cargo_tests.py.
#[test]
fn the_test_executables_list_passes_its_unit_tests() {
    rblk_tests::python_unittest("test_cargo_tests");
}

/// scripts/lib/test_shlib.py: the shared shell helpers, each run in bash.
#[test]
fn the_shared_shell_helpers_pass_their_unit_tests() {
    rblk_tests::python_unittest("test_shlib");
}
