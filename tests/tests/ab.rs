//! `scripts/ab-attach.sh`'s analysis (`scripts/lib/ab.py`) on its recorded guest log, on the host:
//! python3, no guest. What it would catch: a figure of the table or summary.json (CPU per I/O from
//! the attach process's ticks, the schedstat cross-check, IOPS and clat from fio's report, the
//! medians, spreads and new/old ratios, the idle share, which rounds are complete) computed wrongly
//! or from the wrong run, the warm-up counted, a failure or a cut-short report not reported, and the
//! table drifting from what the script printed before its analysis moved out of the shell.

/// scripts/lib/test_ab.py: the unit tests of each function of ab.py.
#[test]
fn the_ab_attach_analysis_passes_its_unit_tests() {
    rblk_tests::python_unittest("test_ab");
}
