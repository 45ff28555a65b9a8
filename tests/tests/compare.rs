//! `scripts/compare-rxe.sh`'s analysis (`scripts/lib/compare.py` and its parts) on its recorded
//! guest log (`scripts/lib/testdata/compare-guest.log`, a full run trimmed), on the host: python3
//! and bash, no guest. What it would catch: a row of the tables or a field of summary.json
//! computed wrongly or from the wrong runs (the unit tests, each function on its own), and
//! `--redraw LOG OUT_DIR` no longer reaching the analysis or writing something else than the
//! table it prints.

use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

/// scripts/lib/test_compare.py: the unit tests of the analysis's reading of the log and its rows.
#[test]
fn the_comparison_analysis_passes_its_unit_tests() {
    rblk_tests::python_unittest("test_compare");
}

/// scripts/lib/test_compare_report.py: the unit tests of the tables, the timeline's part and
/// summary.json.
#[test]
fn the_comparison_report_passes_its_unit_tests() {
    rblk_tests::python_unittest("test_compare_report");
}

/// scripts/lib/test_libublk_null.py: the offline manifest of libublk's null example.
#[test]
fn the_libublk_null_manifest_rewrite_passes_its_unit_tests() {
    rblk_tests::python_unittest("test_libublk_null");
}

/// The script's `--redraw` on the recorded log: the table on stdout and in table.txt, summary.json
/// beside it with the recorded run's figures.
#[test]
fn compare_rxe_redraws_its_tables_and_summary_from_a_recorded_log() {
    let dir = std::env::temp_dir().join(format!("rblk-compare-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let run = Command::new("bash")
        .arg(repo().join("scripts/compare-rxe.sh"))
        .arg("--redraw")
        .arg(repo().join("scripts/lib/testdata/compare-guest.log"))
        .arg(&dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("bash");
    let text = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{text}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(text.contains("goals (medians of this boot): 0 of 8 met"), "{text}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let qd32 = &doc["workloads"]["randread_4k_qd32"];
    assert_eq!(qd32["perftest"], 20041.0, "{qd32}");
    assert_eq!(qd32["rblk"], 21493.25, "{qd32}");
    let block = &doc["block_devices"]["block_randread_4k_qd32"];
    assert!((block["ratios"]["ublk_vs_nvmeof"].as_f64().unwrap() - 1.2401416156822094).abs() < 1e-9, "{block}");
    assert_eq!(block["status"]["libublk-null"], "ok", "{block}");
    assert_eq!(doc["goals_total"], 8, "{doc}");
    assert_eq!(doc["rounds"], 2, "{doc}");
    assert_eq!(std::fs::read_to_string(dir.join("table.txt")).unwrap().trim_end(), text.trim_end());
    assert!(dir.join("rblk-randread_4k_qd1.json").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
