//! The stated hardware projection (issue 45, item 4): `scripts/lib/projection.py` turns rblk's
//! counts per I/O (from scripts/timeline-rxe.sh's summary) and a table of published
//! per-operation costs into the QD1 latency and IOPS per core rblk should reach on a
//! ConnectX-class RNIC. Host only: python3, no guest.
//!
//! - `the_projection_passes_its_unit_tests`: scripts/lib/test_projection.py, on fixture costs
//!   and counts. Would catch a count mapped wrongly to the NIC (a post that stays a system call,
//!   rxe's involuntary switches counted as wake-ups), a formula term dropped or doubled, a
//!   projection made without the instruction counts, a budget that does not reach its goal,
//!   malformed inputs accepted, and a cost without its source.
//! - `the_committed_inputs_project_or_say_what_is_missing`: the command on
//!   scripts/lib/projection-inputs.json as committed. Would catch inputs the projection cannot
//!   read, and a placeholder that is silently projected as zero instructions: while the
//!   instruction counts are not filled in it must exit 1 and say where they come from; once
//!   filled in it must print every goal as met or missed.

use std::path::PathBuf;
use std::process::Command;

fn lib_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").join("scripts/lib")
}

#[test]
fn the_projection_passes_its_unit_tests() {
    rblk_tests::python_unittest("test_projection");
}

#[test]
fn the_committed_inputs_project_or_say_what_is_missing() {
    let dir = lib_dir();
    let inputs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("projection-inputs.json")).unwrap()).unwrap();
    let filled = !inputs["instructions_per_request"]["library"].is_null()
        && !inputs["instructions_per_request"]["ublk_server"].is_null();
    let run = Command::new("python3")
        .arg(dir.join("projection.py"))
        .arg(dir.join("projection-inputs.json"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3");
    let (out, err) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(out.contains("ib_read_lat_4k_us") && out.contains("spdk/spdk/issues/3012"), "{out}\n{err}");
    if filled {
        assert_eq!(run.status.code(), Some(0), "{out}\n{err}");
        assert_eq!(out.matches(" met").count() + out.matches(" MISSED").count(), 4, "{out}");
    } else {
        assert_eq!(run.status.code(), Some(1), "{out}\n{err}");
        assert!(out.contains("filled in from scripts/insns.sh's baseline"), "{out}");
        assert!(err.contains("scripts/insns.sh"), "{err}");
    }
}
