//! `scripts/counts-rxe.sh`'s analysis (`scripts/lib/counts.py`) on its recorded guest log, on the
//! host: python3 and bash, no guest. What it would catch: a count per I/O divided by the wrong
//! I/Os, a thread's system calls, doorbells or re-arms charged to the wrong process, a goal of
//! issue 45 read from the wrong row or judged the wrong way, the tracing's cost left out, and
//! `--redraw` no longer reaching the analysis.

/// scripts/lib/test_counts.py: the unit tests of each function of counts.py.
#[test]
fn the_counts_analysis_passes_its_unit_tests() {
    rblk_tests::python_unittest("test_counts");
}

/// The script's `--redraw` on the recorded log: the table on stdout, summary.json beside it.
#[test]
fn counts_rxe_redraws_its_table_and_summary_from_a_recorded_log() {
    let r = rblk_tests::redraw("counts-rxe.sh", Some(&rblk_tests::testdata("counts-guest.log")), |_| {});
    let text = &r.table;
    assert!(text.contains("issue 45's goals"), "{text}");
    let doc = &r.summary;
    let rows = doc["rows"].as_array().unwrap();
    let ublk1 = rows.iter().find(|r| r["label"] == "ublk:randread:1").expect("the ublk QD1 row");
    assert_eq!(ublk1["ios"], 436, "{ublk1}");
    let uring = ublk1["per_io"]["server_io_uring_enter"].as_f64().unwrap();
    assert!((uring - 2.5).abs() < 1e-9, "{ublk1}"); // 1,090 io_uring_enter of rblk-q0 over 436 I/Os
    let goals = doc["goals"].as_array().unwrap();
    assert_eq!(goals.len(), 4, "{doc}");
    assert_eq!(goals[0]["status"], "missed", "{doc}"); // ublk QD1 io_uring_enter <= 1.0
    assert_eq!(doc["overhead"].as_array().unwrap().len(), 2, "{doc}");
    assert_eq!(std::fs::read_to_string(r.dir.join("table.txt")).unwrap().trim_end(), text.trim_end());
}
