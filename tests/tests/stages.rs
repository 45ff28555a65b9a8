//! `scripts/stages-rxe.sh`'s analysis (`scripts/lib/stages.py`) on its recorded guest log, on the
//! host: python3 and bash, no guest. What it would catch: a stage, a thread share or a per-request
//! count of the table or summary.json computed wrongly, a row's stage log or failure lost or read
//! into the wrong row, the table or summary.json no longer what the script made before it moved out
//! of its heredoc (issue 45), and `--redraw` no longer reaching the analysis.

use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

/// scripts/lib/test_stages.py: the unit tests of each function of stages.py.
#[test]
fn the_stages_analysis_passes_its_unit_tests() {
    rblk_tests::python_unittest("test_stages");
}

/// The script's `--redraw` on the recorded log: the table on stdout and in table.txt, summary.json
/// beside it, as the analysis made them before it moved out of the script.
#[test]
fn stages_rxe_redraws_its_table_and_summary_from_a_recorded_log() {
    let dir = std::env::temp_dir().join(format!("rblk-stages-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let data = repo().join("scripts/lib/testdata");
    std::fs::copy(data.join("stages-guest.log"), dir.join("guest.log")).unwrap();
    let run = Command::new("bash")
        .arg(repo().join("scripts/stages-rxe.sh"))
        .arg("--redraw")
        .arg(dir.join("guest.log"))
        .arg(&dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("bash");
    let text = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{text}\n{}", String::from_utf8_lossy(&run.stderr));
    let want = std::fs::read_to_string(data.join("stages-table.txt")).unwrap();
    assert_eq!(text, want);
    assert_eq!(std::fs::read_to_string(dir.join("table.txt")).unwrap(), want);
    let summary = std::fs::read_to_string(dir.join("summary.json")).unwrap();
    assert_eq!(summary, std::fs::read_to_string(data.join("stages-summary.json")).unwrap());
    assert!(dir.join("rdma-qd32.q0").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
