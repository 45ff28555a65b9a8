//! scripts/insns.sh's analysis (`scripts/lib/insns.py`) on recorded callgrind outputs, on the
//! host: python3, no valgrind. What it would catch: instructions per request taken from the
//! wrong thread, from the whole thread instead of the calls into the counted region, with memcpy
//! left in or the two runs' difference divided wrongly; toggle patterns that nest unnoticed; a
//! gate that compares across rustc, valgrind or glibc versions, passes a change of more than 5%
//! either way, or lets a baseline be committed with other files or without a reason.

/// scripts/lib/test_insns.py: the unit tests of each function of insns.py.
#[test]
fn the_instruction_gate_passes_its_unit_tests() {
    rblk_tests::python_unittest("test_insns");
}
