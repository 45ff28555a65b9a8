//! `scripts/flap-rxe.sh`'s analysis (`scripts/lib/flap.py`) on recorded fio reports and the
//! guest's result lines, on the host: python3, no guest. What it would catch: fio's errors, reads
//! or longest read misread, the read passes added up wrongly (a pass without a report counted, the
//! first error lost), and the verdict passing a run whose reads hung, failed or whose reconnect
//! started late, or failing one that passed.

/// scripts/lib/test_flap.py: the unit tests of each function of flap.py.
#[test]
fn the_flap_analysis_passes_its_unit_tests() {
    rblk_tests::python_unittest("test_flap");
}
