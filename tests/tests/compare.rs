//! `scripts/compare-rxe.sh`'s analysis (`scripts/lib/compare.py` and its parts) on its recorded
//! guest log (`scripts/lib/testdata/compare-guest.log`, a full run trimmed), on the host: python3
//! and bash, no guest. What it would catch: a row of the tables or a field of summary.json
//! computed wrongly or from the wrong runs (the unit tests, each function on its own), and
//! `--redraw LOG OUT_DIR` no longer reaching the analysis or writing something else than the
//! table it prints.

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
    let r = rblk_tests::redraw("compare-rxe.sh", Some(&rblk_tests::testdata("compare-guest.log")), |_| {});
    let text = &r.table;
    assert!(text.contains("goals (medians of this boot): 0 of 8 met"), "{text}");
    let doc = &r.summary;
    let qd32 = &doc["workloads"]["randread_4k_qd32"];
    assert_eq!(qd32["perftest"], 20041.0, "{qd32}");
    assert_eq!(qd32["rblk"], 21493.25, "{qd32}");
    let block = &doc["block_devices"]["block_randread_4k_qd32"];
    assert!((block["ratios"]["ublk_vs_nvmeof"].as_f64().unwrap() - 1.2401416156822094).abs() < 1e-9, "{block}");
    assert_eq!(block["status"]["libublk-null"], "ok", "{block}");
    assert_eq!(doc["goals_total"], 8, "{doc}");
    assert_eq!(doc["rounds"], 2, "{doc}");
    assert_eq!(std::fs::read_to_string(r.dir.join("table.txt")).unwrap().trim_end(), text.trim_end());
    assert!(r.dir.join("rblk-randread_4k_qd1.json").exists());
}
