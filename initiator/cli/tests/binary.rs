//! The `rblk` binary as users start it. Besides what it checks, this integration test makes
//! `cargo test --workspace` build `build/<profile>/rblk`, which the tests crate's host tests run
//! (`tests/tests/cli_spelling.rs`, `trust.rs`): cargo builds a package's binaries for its own
//! integration tests only.

use std::process::Command;

/// Catches a binary that does not start, or whose --version is not its package's.
#[test]
fn the_binary_starts_and_says_its_version() {
    let out = Command::new(env!("CARGO_BIN_EXE_rblk")).arg("--version").output().expect("run rblk");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.trim(), format!("rblk {}", env!("CARGO_PKG_VERSION")), "{text}");
}
