//! `scripts/hosts-rxe.sh`'s analysis (`scripts/lib/hosts.py`) on its recorded guest log, on the
//! host: python3 and bash, no guest. What it would catch: a figure of the table or summary.json
//! (CPU share of a core, per-QP costs, the ratios against the first row, the 10-session row and
//! cmtime, which row a goal reads) computed wrongly or from the wrong row, a line of the guest's
//! log read into the wrong step, and `--redraw` no longer reaching the analysis.

/// scripts/lib/test_hosts.py: the unit tests of each function of hosts.py.
#[test]
fn the_hosts_analysis_passes_its_unit_tests() {
    rblk_tests::python_unittest("test_hosts");
}

/// The script's `--redraw` on the recorded log: the table on stdout, summary.json beside it.
#[test]
fn hosts_rxe_redraws_its_table_and_summary_from_a_recorded_log() {
    let r = rblk_tests::redraw("hosts-rxe.sh", Some(&rblk_tests::testdata("hosts-guest.log")), |_| {});
    let text = &r.table;
    assert!(text.contains("issue 40's goals"), "{text}");
    let doc = &r.summary;
    let steps = doc["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 6, "{doc}");
    let top = &steps[4];
    assert_eq!(top["qps"], 2000, "{top}");
    assert_eq!(top["bench"]["iops"], 6900.0, "{top}");
    assert!((top["cpu_pct"].as_f64().unwrap() - 37.7).abs() < 1e-9, "{top}");
    assert_eq!(doc["cmtime_conn_us"], 6500.0, "{doc}");
    assert_eq!(std::fs::read_to_string(r.dir.join("table.txt")).unwrap().trim_end(), text.trim_end());
}
