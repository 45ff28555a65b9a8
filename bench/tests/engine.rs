//! The bench's engine end to end against the real server, in-process over the in-memory fabric:
//! figures add up, --verify passes on good data and names the offset of a bad block, and bad
//! arguments are refused before any I/O.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use rblk_bench::{Error, Run, Spec, Stop, Workload};
use rblk_initiator::{Fabric, OpenMode, Options, Session};
use rblk_target::config::VolumeSpec;
use rblk_target::server::{Config, Running, Server};

const MIB: u64 = 1 << 20;

struct Target {
    running: Option<Running>,
    uri: String,
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown();
        }
    }
}

fn target(size: u64) -> Target {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let port = 41000 + NEXT.fetch_add(1, Ordering::Relaxed);
    let cfg = Config {
        listen: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        volumes: vec![VolumeSpec { name: "v".into(), size, path: None }],
        fabric: Fabric::Mem,
        ..Config::default()
    };
    let running = Server::start(cfg).expect("in-process target");
    let uri = format!("rblk://{}/v", running.local_addr());
    Target { running: Some(running), uri }
}

fn options() -> Options {
    Options { fabric: Fabric::Mem, ..Options::default() }
}

fn run(t: &Target, spec: &Spec) -> rblk_bench::Result<rblk_bench::Report> {
    Run::default().run(&t.uri, &options(), spec)
}

fn short(workload: Workload) -> Spec {
    Spec { workload, iodepth: 8, stop: Stop::Runtime(Duration::from_millis(300)), ..Spec::default() }
}

#[test]
fn random_reads_report_consistent_figures() {
    let t = target(16 * MIB);
    let r = run(&t, &Spec { jobs: 2, ..short(Workload::RandRead) }).unwrap();
    assert!(r.passed() && r.verify.is_none());
    assert!(r.read.ios > 0 && r.write.ios == 0, "{r:?}");
    assert_eq!(r.read.bytes, r.read.ios * 4096);
    assert!((r.elapsed_s - 0.3).abs() < 1e-6, "{}", r.elapsed_s);
    assert!((r.read.iops - r.read.ios as f64 / r.elapsed_s).abs() < 1e-6);
    let lat = r.read.lat_us.expect("read latencies");
    assert!(lat.min <= lat.p50 && lat.p50 <= lat.p99 && lat.p99 <= lat.max, "{lat:?}");
    assert!(r.write.lat_us.is_none());
    assert!(r.target_cpu.is_some());
    assert_eq!((r.volume.size, r.volume.block_size, r.job.slice), (16 * MIB, 4096, 8 * MIB));
    let text = r.text();
    assert!(text.contains("read: IOPS=") && text.contains("99.99th=") && text.contains("target cpu"), "{text}");
    let json = serde_json_text(&r);
    assert!(json.contains("\"share_of_core\"") && json.contains("\"p99_9\""), "{json}");
}

fn serde_json_text(r: &rblk_bench::Report) -> String {
    // The binary's --json writes exactly this.
    serde_json::to_string(r).unwrap()
}

#[test]
fn verified_writes_read_back_then_a_changed_block_is_named_by_its_offset() {
    let t = target(4 * MIB);
    let write = Spec {
        workload: Workload::Write,
        bs: 65536,
        stop: Stop::Size(4 * MIB),
        verify: true,
        generation: Some(7),
        ..Spec::default()
    };
    let r = run(&t, &write).unwrap();
    let v = r.verify.as_ref().unwrap();
    assert!(r.passed(), "{}", r.text());
    assert_eq!((r.write.bytes, v.blocks_checked, v.generation), (4 * MIB, 1024, Some(7)));

    let read = Spec { workload: Workload::RandRead, stop: Stop::Size(MIB), verify: true, ..Spec::default() };
    let r = run(&t, &read).unwrap();
    assert!(r.passed(), "{}", r.text());
    assert_eq!(r.verify.as_ref().unwrap().generations_seen, Some([7, 7]));
    let r = run(&t, &Spec { generation: Some(8), ..read.clone() }).unwrap();
    assert!(!r.passed());
    assert!(r.verify.as_ref().unwrap().first_mismatches[0].problem.contains("generation 7, expected 8"));

    // Change one block behind the bench's back.
    let bad = 3 * MIB + 8192;
    let mut vol = Session::connect(&t.uri, &options()).unwrap().open(OpenMode::ReadWrite).unwrap();
    vol.write_at(&[0xAB; 4096], bad).unwrap();
    vol.close().unwrap();
    // --size is per job: two jobs of 2 MiB cover the volume once.
    let seq = Spec { workload: Workload::Read, stop: Stop::Size(2 * MIB), jobs: 2, ..read };
    let r = run(&t, &seq).unwrap();
    let v = r.verify.as_ref().unwrap();
    assert!(!r.passed());
    assert_eq!((v.mismatches, v.blocks_checked), (1, 1024));
    assert_eq!(v.first_mismatches[0].offset, bad);
    assert!(v.first_mismatches[0].problem.contains("foreign data"), "{:?}", v.first_mismatches);
    assert!(r.text().contains(&format!("offset {bad} ")), "{}", r.text());
}

#[test]
fn random_writes_and_mixed_runs_verify() {
    let t = target(8 * MIB);
    for (workload, jobs) in [(Workload::RandWrite, 1), (Workload::RandRw, 3)] {
        let spec = Spec { jobs, verify: true, ..short(workload) };
        let r = run(&t, &spec).unwrap();
        let v = r.verify.as_ref().unwrap();
        assert!(r.passed(), "{}", r.text());
        assert!(r.write.ios > 0 && v.blocks_checked > 0, "{}", r.text());
        if workload == Workload::RandRw {
            assert!(r.read.ios > 0);
            let share = r.read.ios as f64 / r.total.ios as f64;
            assert!((0.35..0.65).contains(&share), "rwmixread 50 gave {share}");
        }
    }
}

#[test]
fn reads_of_a_never_written_volume_fail_verification() {
    let t = target(MIB);
    let spec = Spec { workload: Workload::Read, stop: Stop::Size(MIB), verify: true, ..Spec::default() };
    let r = run(&t, &spec).unwrap();
    let v = r.verify.unwrap();
    assert_eq!(v.mismatches, 256);
    assert_eq!(v.first_mismatches.len(), 10);
    assert_eq!(v.first_mismatches[0].offset, 0);
    assert!(v.first_mismatches[0].problem.contains("all zeros"));
}

#[test]
fn arguments_the_volume_cannot_take_are_refused_before_any_io() {
    let t = target(4 * MIB);
    for (spec, needle) in [
        (Spec { bs: 6144, ..Spec::default() }, "not a multiple of the volume's block size"),
        (Spec { bs: 2 * MIB, ..Spec::default() }, "largest I/O"),
        (Spec { stop: Stop::Size(8 * MIB), ..Spec::default() }, "larger than the volume"),
        (Spec { iodepth: 0, ..Spec::default() }, "--iodepth"),
        (Spec { jobs: 2000, ..Spec::default() }, "--jobs"),
    ] {
        match run(&t, &spec) {
            Err(Error::Invalid(text)) => assert!(text.contains(needle), "{needle:?} not in {text:?}"),
            other => panic!("{spec:?}: expected a refusal, got {other:?}"),
        }
    }
}
