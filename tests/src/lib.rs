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
pub mod ublk_path;
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

/// How many rounds a repeated fault scenario (a target restarted or killed again and again) runs:
/// `RBLK_SOAK_ROUNDS` when set (`scripts/soak-restarts.sh` sets 3), else `ci` (what CI runs).
/// Panics on 0 or on a value that is not a number: a soak that ran no round must not pass.
pub fn rounds(ci: usize) -> usize {
    rounds_from(std::env::var("RBLK_SOAK_ROUNDS"), ci)
}

fn rounds_from(var: Result<String, std::env::VarError>, ci: usize) -> usize {
    let n = match var {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("RBLK_SOAK_ROUNDS={v:?}: not a number of rounds")),
        Err(std::env::VarError::NotPresent) => ci,
        Err(e) => panic!("RBLK_SOAK_ROUNDS: {e}"),
    };
    assert!(n > 0, "RBLK_SOAK_ROUNDS=0 (or a default of 0): a soak needs at least one round");
    n
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

/// Runs `python3 -m unittest -v MODULE` in `scripts/lib` (the analysis of the measurement
/// scripts) and fails with its output unless it passed and ran at least one test (none found
/// would pass vacuously).
pub fn python_unittest(module: &str) {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root");
    let run = std::process::Command::new("python3")
        .args(["-m", "unittest", "-v", module])
        .current_dir(repo.join("scripts/lib"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3");
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{err}");
    assert!(err.contains("Ran ") && !err.contains("Ran 0 tests"), "{err}");
}

/// What a measurement script's `--redraw LOG DIR` made of a guest log (scripts/lib/testdata/ holds
/// the recorded ones): the table it printed, its summary.json, and DIR (removed on drop).
#[derive(Debug)]
pub struct Redrawn {
    pub table: String,
    pub summary: serde_json::Value,
    pub dir: std::path::PathBuf,
}

impl Drop for Redrawn {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `bash scripts/SCRIPT --redraw LOG DIR` (DIR a fresh temporary directory; LOG as given,
/// or DIR/guest.log when `log` is None, for a script that the caller set up) and returns what
/// it made. Panics with its output unless it succeeded, wrote summary.json, and wrote table.txt
/// equal to what it printed.
pub fn redraw(script: &str, log: Option<&std::path::Path>, prepare: impl FnOnce(&std::path::Path)) -> Redrawn {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root");
    let dir =
        std::env::temp_dir().join(format!("rblk-redraw-{}-{}", script.trim_end_matches(".sh"), std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    prepare(&dir);
    let log = log.map_or_else(|| dir.join("guest.log"), std::path::Path::to_path_buf);
    let run = std::process::Command::new("bash")
        .arg(repo.join("scripts").join(script))
        .arg("--redraw")
        .arg(&log)
        .arg(&dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("bash");
    let table = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(
        run.status.success(),
        "{script} --redraw {}: {table}\n{}",
        log.display(),
        String::from_utf8_lossy(&run.stderr)
    );
    let written = std::fs::read_to_string(dir.join("table.txt")).expect("table.txt");
    assert_eq!(written.trim_end(), table.trim_end(), "{script}: table.txt differs from what it printed");
    let summary = std::fs::read_to_string(dir.join("summary.json")).expect("summary.json");
    let summary = serde_json::from_str(&summary).expect("summary.json is JSON");
    Redrawn { table, summary, dir }
}

/// A file of scripts/lib/testdata/.
pub fn testdata(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .join("scripts/lib/testdata")
        .join(name)
}

#[cfg(test)]
mod tests {
    use super::rounds_from;
    use std::env::VarError;

    #[test]
    fn rounds_default_and_override() {
        assert_eq!(rounds_from(Err(VarError::NotPresent), 1), 1);
        assert_eq!(rounds_from(Ok("3".into()), 1), 3);
        assert_eq!(rounds_from(Ok(" 5\n".into()), 1), 5);
    }

    #[test]
    #[should_panic(expected = "at least one round")]
    fn zero_rounds_fail() {
        rounds_from(Ok("0".into()), 1);
    }

    #[test]
    #[should_panic(expected = "not a number of rounds")]
    fn garbage_rounds_fail() {
        rounds_from(Ok("three".into()), 1);
    }

    #[test]
    #[should_panic(expected = "not a number of rounds")]
    fn empty_rounds_fail() {
        rounds_from(Ok(String::new()), 1);
    }
}
