//! `scripts/stages-rxe.sh`'s analysis (`scripts/lib/stages.py`) on its recorded guest log, on the
//! host: python3 and bash, no guest. What it would catch: a stage, a thread share or a per-request
//! count of the table or summary.json computed wrongly, a row's stage log or failure lost or read
//! into the wrong row, the table or summary.json no longer what the script made before it moved out
//! of its heredoc (issue 45), and `--redraw` no longer reaching the analysis.

/// scripts/lib/test_stages.py: the unit tests of each function of stages.py.
#[test]
fn the_stages_analysis_passes_its_unit_tests() {
    rblk_tests::python_unittest("test_stages");
}

/// The script's `--redraw` on the recorded log: the table on stdout and in table.txt, summary.json
/// beside it, as the analysis made them before it moved out of the script.
#[test]
fn stages_rxe_redraws_its_table_and_summary_from_a_recorded_log() {
    let r = rblk_tests::redraw("stages-rxe.sh", None, |d| {
        std::fs::copy(rblk_tests::testdata("stages-guest.log"), d.join("guest.log")).unwrap();
    });
    let text = &r.table;
    let want = std::fs::read_to_string(rblk_tests::testdata("stages-table.txt")).unwrap();
    assert_eq!(*text, want);
    assert_eq!(std::fs::read_to_string(r.dir.join("table.txt")).unwrap(), want);
    let summary = std::fs::read_to_string(r.dir.join("summary.json")).unwrap();
    assert_eq!(summary, std::fs::read_to_string(rblk_tests::testdata("stages-summary.json")).unwrap());
    assert!(r.dir.join("rdma-qd32.q0").exists());
}
