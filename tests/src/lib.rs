//! Shared helpers for rblk's integration tests.
//!
//! Tests that need RDMA are marked `#[ignore = "needs rxe ..."]`, so a plain `cargo test` on a
//! host without RDMA lists them as ignored; `scripts/test.sh` runs them with `--ignored` inside
//! the qemu guest, where `RBLK_DEVICE` and `RBLK_ADDR` name the rxe device and its address.
//! There they **fail**, never skip, if the device is missing.

#![forbid(unsafe_code)]

pub mod blockdev;
pub mod daemon;
pub mod raw;
pub mod rxe;
pub mod scratch;
pub mod target;
pub mod workload;

/// Generates, for each scenario `fn name(fabric: Fabric)` in scope, a host test `mem::name` over
/// the in-memory fabric and a guest test `rxe::name` over verbs (ignored on hosts: needs rxe).
#[macro_export]
macro_rules! on_both_fabrics {
    ($($name:ident),* $(,)?) => {
        mod mem {
            $(#[test] fn $name() { super::$name(rblk_fabric::Fabric::Mem) })*
        }
        mod rxe {
            $(#[test] #[ignore = "needs rxe: run in the guest by scripts/test.sh"]
              fn $name() { super::$name(rblk_fabric::Fabric::Verbs) })*
        }
    };
}

/// Runs a bash script; fails the test with its output unless it succeeds. Returns stdout.
pub fn sh(script: &str) -> String {
    let out = std::process::Command::new("bash")
        .args(["-c", &format!("set -euo pipefail\n{script}")])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run bash");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "script failed ({}):\n{script}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    if !stderr.trim().is_empty() {
        eprintln!("{stderr}");
    }
    stdout.into_owned()
}
