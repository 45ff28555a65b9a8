//! `rblk-bench` against the real `rblk-target` over rxe: `--verify` passes on data it wrote,
//! fails with the offset of a block changed behind its back, the JSON report (fio's layout,
//! `-o json --output FILE`) carries the figures and the target's CPU time, and bad arguments
//! are refused before any I/O. bench/tests/fio.rs checks the layout against fio's on the host.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use rblk_fabric::Fabric;
use rblk_initiator::{OpenMode, Options, Session};
use rblk_tests::daemon::bin;
use rblk_tests::target::{Spec, Target};

const MIB: u64 = 1 << 20;

fn uri(t: &Target) -> String {
    format!("rblk://{}/v", t.addr())
}

/// Runs rblk-bench with `args` after the URI; echoes its output into the test's.
fn bench(t: &Target, args: &[&str]) -> Output {
    let out = Command::new(bin("rblk-bench"))
        .arg(uri(t))
        .args(["--device", &rblk_tests::rxe::rdma().device])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run rblk-bench (is RBLK_BIN_DIR right?)");
    eprintln!("$ rblk-bench {} -> {}", args.join(" "), out.status);
    eprintln!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    out
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn json(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn scratch(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("rblk-bench-test-{}-{name}", std::process::id()))
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn verify_passes_then_a_block_changed_behind_its_back_fails_with_its_offset() {
    let t = Target::start(Fabric::Verbs, &Spec { volumes: vec![("v", 16 * MIB)], key: None });
    let report = scratch("write.json");
    let out = bench(
        &t,
        &["--rw", "write", "--bs", "64k", "--iodepth", "16", "--size", "16M", "--verify", "--generation", "5"],
    );
    assert!(out.status.success(), "verified write failed:\n{}", text(&out));
    assert!(text(&out).contains("verify: OK: 0 of 4096 blocks bad (generation 5)"), "{}", text(&out));

    let out = bench(
        &t,
        &[
            "--rw",
            "randread",
            "--runtime",
            "2",
            "--verify",
            "--generation",
            "5",
            "-o",
            "json",
            "--output",
            report.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "verified random reads failed:\n{}", text(&out));
    let j = json(&report);
    for field in
        ["\"mismatches\": 0", "\"generation\": 5", "\"rw\": \"randread\"", "\"99.990000\"", "\"share_of_core\""]
    {
        assert!(j.contains(field), "{field} missing from the JSON report:\n{j}");
    }

    // Change one block behind the bench's back, through the initiator library.
    let bad = 5 * MIB + 12 * 1024;
    let opts = Options::default();
    let mut vol = Session::connect(&uri(&t), &opts).unwrap().open(OpenMode::ReadWrite).unwrap();
    vol.write_at(&[0xAB; 4096], bad).unwrap();
    vol.close().unwrap();

    let out = bench(
        &t,
        &[
            "--rw",
            "read",
            "--bs",
            "64k",
            "--size",
            "16M",
            "--verify",
            "-o",
            "json",
            "--output",
            report.to_str().unwrap(),
        ],
    );
    assert!(!out.status.success(), "verification passed over a changed block:\n{}", text(&out));
    let all = text(&out);
    assert!(all.contains(&format!("block at offset {bad} ")), "the bad offset is not reported:\n{all}");
    let j = json(&report);
    assert!(j.contains("\"mismatches\": 1") && j.contains(&format!("\"offset\": {bad}")), "{j}");
    assert!(j.contains("\"blocks_checked\": 4096") && j.contains("\"error\": 84"), "{j}");
    // The text report (the default format) says it too.
    let out = bench(&t, &["--rw", "read", "--bs", "64k", "--size", "16M", "--verify"]);
    assert!(!out.status.success() && text(&out).contains("1 of 4096 blocks bad"), "{}", text(&out));

    // A stale generation is a failure too.
    let out = bench(&t, &["--rw", "randread", "--size", "1M", "--verify", "--generation", "6"]);
    assert!(!out.status.success() && text(&out).contains("expected 6"), "{}", text(&out));
    let _ = std::fs::remove_file(report);
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn random_writes_and_mixed_io_verify_with_several_jobs_and_report_the_target_cpu() {
    let t = Target::start(Fabric::Verbs, &Spec { volumes: vec![("v", 32 * MIB)], key: None });
    let report = scratch("rw.json");
    for rw in ["randwrite", "randrw"] {
        let out = bench(&t, &["--rw", rw, "--jobs", "2", "--iodepth", "8", "--runtime", "2", "--verify"]);
        assert!(out.status.success(), "{rw} --verify failed:\n{}", text(&out));
        assert!(text(&out).contains("verify: OK"), "{}", text(&out));
    }
    let out = bench(
        &t,
        &["--rw", "randread", "--runtime", "2", "--ramp_time", "1", "-o", "json", "--output", report.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", text(&out));
    let j = json(&report);
    assert!(j.contains("\"target_cpu\": {") && j.contains("\"device\": \"rxe0\""), "{j}");
    assert!(j.contains("\"elapsed_s\": 2.0"), "{j}");
    let _ = std::fs::remove_file(report);
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn arguments_the_volume_cannot_take_are_refused_before_any_io() {
    let t = Target::start(Fabric::Verbs, &Spec { volumes: vec![("v", 16 * MIB)], key: None });
    for (args, needle) in [
        (&["--bs", "6k"][..], "--bs 6144 is not a multiple of the volume's block size (4096 bytes)"),
        (&["--bs", "2M"][..], "larger than the volume's largest I/O"),
        (&["--size", "32M"][..], "--size 33554432 is larger than the volume (16777216 bytes)"),
        (&["--iodepth", "0"][..], "'--iodepth <N>': must be a whole number from 1 to 1024"),
        (&["--rw", "read", "--rwmixread", "30"][..], "--rwmixread and --rwmixwrite apply only to --rw randrw"),
    ] {
        let out = bench(&t, args);
        // Issue 43, trap 10: usage errors exit 2, as rblk's and clap's do.
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(needle), "{args:?}: {needle:?} not in\n{}", text(&out));
        assert!(!text(&out).contains("IOPS"), "{args:?} ran I/O:\n{}", text(&out));
    }
}
