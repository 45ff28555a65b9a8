//! The bench's engine end to end against the real server, in-process over the in-memory fabric:
//! figures add up, --verify passes on good data and names the offset of a bad block, and bad
//! arguments are refused before any I/O; --log's time series add up to the report, and
//! scripts/plot.py draws them.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
use hdrhistogram::serialization::Deserializer;
use rblk_bench::{Error, Logs, Run, Spec, Workload};
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
    Spec { workload, iodepth: 8, runtime: Some(Duration::from_millis(300)), ..Spec::default() }
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
    // Two jobs polling for 300 ms use CPU: a report of zero would mean the marks were not taken
    // (or were taken at the same moment).
    let cpu = r.cpu.expect("rblk-bench's own CPU");
    assert!(cpu.user_s + cpu.system_s > 0.0 && (cpu.wall_s - r.elapsed_s).abs() < 0.25, "{cpu:?}");
    assert_eq!((r.volume.size, r.volume.block_size, r.job.slice), (16 * MIB, 4096, 8 * MIB));
    let text = r.text();
    assert!(text.contains("read: IOPS=") && text.contains("99.99th=") && text.contains("target cpu"), "{text}");
    assert!(text.contains("\n  cpu: "), "{text}");
    let json = serde_json_text(&r);
    assert!(json.contains("\"share_of_core\"") && json.contains("\"p99_9\""), "{json}");
}

/// Issue 41: `--rw trim` and `randtrim` send DISCARDs through an engine lane over each job's
/// queue, reported under `trim` (and fio's JSON `trim`), and the volume reads zeros where they
/// went. Catches trims counted as writes or not at all, trims that do not reach the target (the
/// bytes stay), a trim workload with --verify, and one against a target without discard that
/// runs instead of failing with the reason.
#[test]
fn trims_discard_their_blocks_and_report_under_trim() {
    let t = target(8 * MIB);
    // Fill the volume first, with the pattern (plain writes send whatever their buffers hold).
    let fill = Spec { bs: 64 << 10, size: Some(8 * MIB), runtime: None, verify: true, ..short(Workload::Write) };
    run(&t, &fill).unwrap();
    let spec = Spec { bs: 64 << 10, jobs: 2, size: Some(2 * MIB), runtime: None, ..short(Workload::Trim) };
    let r = run(&t, &spec).unwrap();
    assert!(r.passed(), "{r:?}");
    assert_eq!((r.read.ios, r.write.ios, r.trim.ios), (0, 0, 64), "2 jobs x 2 MiB in 64 KiB discards");
    assert_eq!(r.trim.bytes, 4 * MIB);
    assert!(r.trim.lat_us.is_some() && r.total.ios == 64, "{r:?}");
    assert!(r.text().contains("trim: IOPS="), "{}", r.text());
    // Each job trimmed its slice of 2 MiB (--size bounds the slice): zeros up to 4 MiB, the data
    // beyond.
    let vol = Session::connect(&t.uri, &options()).unwrap().open(OpenMode::ReadOnly).unwrap();
    let e = rblk_initiator::Engine::new(vol, 1).unwrap();
    for (at, zeros) in [(0, true), (2 * MIB, true), (4 * MIB - 4096, true), (4 * MIB, false), (7 * MIB, false)] {
        let mut b = vec![1u8; 4096];
        e.read_at(&mut b, at).unwrap();
        assert_eq!(b.iter().all(|&x| x == 0), zeros, "at {at}");
    }
    e.close().unwrap();
    let rand = run(&t, &Spec { bs: 4096, ..short(Workload::RandTrim) }).unwrap();
    assert!(rand.trim.ios > 0 && rand.write.ios == 0, "{rand:?}");
    let e = run(&t, &Spec { verify: true, ..short(Workload::Trim) }).unwrap_err();
    assert!(e.to_string().contains("--rw trim has none"), "{e}");
    let old = Options { discard: false, ..options() };
    let e = Run::default().run(&t.uri, &old, &short(Workload::Trim)).unwrap_err();
    assert!(e.to_string().contains("does not support DISCARD"), "{e}");
}

#[test]
fn polling_jobs_verify_and_say_so() {
    // --poll changes how every wait of a deep queue spins (wait.rs's tests hold the
    // rule); here two polling jobs write and read back through it, and the report says so.
    let t = target(16 * MIB);
    let opts = Options { wait: rblk_initiator::Wait::Poll, ..options() };
    let spec = Spec { jobs: 2, iodepth: 16, verify: true, ..short(Workload::RandWrite) };
    let r = Run::default().run(&t.uri, &opts, &spec).unwrap();
    assert!(r.passed() && r.write.ios > 0, "{r:?}");
    assert!(r.job.wait == "poll" && r.text().lines().next().unwrap().ends_with(" wait=poll"), "{}", r.text());
    assert_eq!(run(&t, &short(Workload::RandRead)).unwrap().job.wait, "adaptive");
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
        runtime: None,
        size: Some(4 * MIB),
        verify: true,
        generation: Some(7),
        ..Spec::default()
    };
    let r = run(&t, &write).unwrap();
    let v = r.verify.as_ref().unwrap();
    assert!(r.passed(), "{}", r.text());
    assert_eq!((r.write.bytes, v.blocks_checked, v.generation), (4 * MIB, 1024, Some(7)));

    let read = Spec { workload: Workload::RandRead, runtime: None, size: Some(MIB), verify: true, ..Spec::default() };
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
    let seq = Spec { workload: Workload::Read, runtime: None, size: Some(2 * MIB), jobs: 2, ..read };
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

/// Issue 43, trap 5: bssplit under --verify and --size. Catches a written block tracked at the
/// wrong granularity (a 64 KiB write marking one 4 KiB unit: its other blocks never read back,
/// or reads of them checked against a pattern not written), a pattern filled over the wrong
/// length, and a --size that no longer ends a job with I/Os of several sizes.
#[test]
fn bssplit_writes_verify_and_end_at_their_size() {
    let t = target(8 * MIB);
    let split = rblk_bench::BsSplit::parse("4k/50:16k/25:64k/25").unwrap();
    for workload in [Workload::Write, Workload::RandWrite, Workload::RandRw] {
        let spec = Spec { verify: true, bssplit: Some(split.clone()), ..short(workload) };
        let r = run(&t, &spec).unwrap();
        let v = r.verify.as_ref().unwrap();
        assert!(r.passed(), "{workload}: {}", r.text());
        assert!(r.write.bytes > r.write.ios * 4096, "{workload}: sizes above 4k were written");
        assert!(v.blocks_checked > 0, "{workload}: {}", r.text());
        assert!(r.text().contains("bssplit=4k/50:16k/25:64k/25"), "{}", r.text());
    }
    // 2 MiB written in order: every one of its 512 blocks is read back and checked (but for
    // the few at the end a last large I/O may have skipped when it wrapped).
    let spec = Spec {
        verify: true,
        runtime: None,
        size: Some(2 * MIB),
        bssplit: Some(split.clone()),
        ..short(Workload::Write)
    };
    let r = run(&t, &spec).unwrap();
    let checked = r.verify.as_ref().unwrap().blocks_checked;
    assert!(r.passed() && (496..=512).contains(&checked), "{checked} blocks checked:\n{}", r.text());
    let spec = Spec { runtime: None, size: Some(MIB), bssplit: Some(split), ..short(Workload::Read) };
    let r = run(&t, &spec).unwrap();
    assert!((MIB..MIB + 64 * 1024).contains(&r.read.bytes), "size=1M moved {}", r.read.bytes);
}

#[test]
fn reads_of_a_never_written_volume_fail_verification() {
    let t = target(MIB);
    let spec = Spec { workload: Workload::Read, runtime: None, size: Some(MIB), verify: true, ..Spec::default() };
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
        (Spec { runtime: None, size: Some(8 * MIB), ..Spec::default() }, "larger than the volume"),
        (Spec { iodepth: 0, ..Spec::default() }, "--iodepth"),
        (Spec { jobs: 2000, ..Spec::default() }, "--numjobs"),
    ] {
        match run(&t, &spec) {
            Err(Error::Invalid(text) | Error::Value { text, .. }) => {
                assert!(text.contains(needle), "{needle:?} not in {text:?}")
            }
            other => panic!("{spec:?}: expected a refusal, got {other:?}"),
        }
    }
}

/// A fresh empty directory for a test's files.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rblk-bench-engine-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A fio log line: msec, value, direction, blocksize, offset.
fn fio_lines(path: &Path) -> Vec<[u64; 5]> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|l| {
            let f: Vec<u64> = l.split(", ").map(|x| x.parse().unwrap_or_else(|_| panic!("{l:?}"))).collect();
            f.try_into().unwrap_or_else(|_| panic!("not 5 fields: {l:?}"))
        })
        .collect()
}

/// `sum(value * interval)` per direction, checking that the times of each direction rise.
fn integrate(path: &Path, bs: u64) -> [f64; 2] {
    let mut sum = [0.0; 2];
    let mut last = [0u64; 2];
    for [ms, v, d, b, offset] in fio_lines(path) {
        let d = d as usize;
        assert!(d < 2 && b == bs && offset == 0, "{}: {ms}, {v}, {d}, {b}, {offset}", path.display());
        assert!(ms > last[d], "{}: time {ms} after {}", path.display(), last[d]);
        sum[d] += v as f64 * (ms - last[d]) as f64 / 1000.0;
        last[d] = ms;
    }
    sum
}

/// A 1 s randrw run of 2 jobs after a 200 ms ramp, logged every 100 ms under `dir/run`.
fn logged_run(dir: &Path) -> (rblk_bench::Report, PathBuf) {
    let t = target(16 * MIB);
    let spec = Spec {
        jobs: 2,
        ramp: Duration::from_millis(200),
        runtime: Some(Duration::from_secs(1)),
        ..short(Workload::RandRw)
    };
    let prefix = dir.join("run");
    let mut logs = Logs::create(&prefix, Duration::from_millis(100), &spec).unwrap();
    let r = Run::default().run_with_logs(&t.uri, &options(), &spec, Some(&mut logs)).unwrap();
    // Nothing is in place before the run succeeded and the logs are committed.
    assert!(!file(&prefix, "_iops.1.log").exists(), "a log in place before commit");
    logs.commit().unwrap();
    (r, prefix)
}

fn file(prefix: &Path, suffix: &str) -> PathBuf {
    PathBuf::from(format!("{}{suffix}", prefix.display()))
}

#[test]
fn logs_sample_the_measured_window_and_add_up_to_the_report() {
    let dir = scratch("logs");
    let (r, prefix) = logged_run(&dir);
    assert!(r.read.ios > 0 && r.write.ios > 0, "{}", r.text());
    let (mut ios, mut kib) = ([0.0; 2], [0.0; 2]);
    for n in 1..=2 {
        let iops = file(&prefix, &format!("_iops.{n}.log"));
        let lines = fio_lines(&iops);
        for d in 0..2 {
            let times: Vec<u64> = lines.iter().filter(|l| l[2] == d).map(|l| l[0]).collect();
            // About every 100 ms, and the last line at the window's end (1 s after the ramp).
            assert!(times.len() >= 3, "{}: {lines:?}", iops.display());
            assert_eq!(times.last(), Some(&1000), "{}: {lines:?}", iops.display());
        }
        let (a, b) = (integrate(&iops, 4096), integrate(&file(&prefix, &format!("_bw.{n}.log")), 4096));
        for d in 0..2 {
            ios[d] += a[d];
            kib[d] += b[d];
        }
        let (lo, hi) = (r.read.lat_us.unwrap().min.min(r.write.lat_us.unwrap().min), r.total.ios);
        for [ms, ns, ..] in fio_lines(&file(&prefix, &format!("_lat.{n}.log"))) {
            assert!(ns as f64 >= lo * 1000.0 - 1.0 && ms <= 1000 && hi > 0, "{ms}, {ns}");
        }
    }
    // Sum of IOPS x interval: the I/Os of the report, to the rounding of the logged integers.
    for (d, dir_report) in [&r.read, &r.write].into_iter().enumerate() {
        let want = dir_report.ios as f64;
        assert!((ios[d] - want).abs() <= want * 0.02 + 40.0, "direction {d}: {} vs {want}", ios[d]);
        let want = dir_report.bytes as f64 / 1024.0;
        assert!((kib[d] - want).abs() <= want * 0.02 + 160.0, "direction {d}: {} KiB vs {want}", kib[d]);
    }

    // The HdrHistogram interval log holds every measured I/O exactly once.
    let hlog = std::fs::read(file(&prefix, ".hlog")).unwrap();
    let text = String::from_utf8_lossy(&hlog);
    assert!(text.contains("#[StartTime: ") && text.contains("latencies in nanoseconds"), "{text}");
    let mut counts = [0u64; 2];
    let mut intervals = 0;
    let mut de = Deserializer::new();
    for entry in IntervalLogIterator::new(&hlog) {
        let LogEntry::Interval(h) = entry.expect("a well-formed interval log") else { continue };
        let tag = h.tag().expect("a tag").as_str().to_owned();
        let d = if tag.starts_with("read.") { 0 } else { 1 };
        assert!(["read.1", "read.2", "write.1", "write.2"].contains(&tag.as_str()), "{tag}");
        let bytes = STANDARD.decode(h.encoded_histogram()).expect("base64");
        let hist: hdrhistogram::Histogram<u64> = de.deserialize(&mut bytes.as_slice()).unwrap();
        assert!(h.start_timestamp() + h.duration() <= Duration::from_millis(1001), "{tag}: {:?}", h.start_timestamp());
        counts[d] += hist.len();
        intervals += 1;
    }
    assert_eq!(counts, [r.read.ios, r.write.ios]);
    assert!(intervals >= 4 * 3, "{intervals} intervals");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_log_prefix_that_cannot_be_created_is_refused_before_the_run() {
    let spec = Spec { jobs: 2, ..Spec::default() };
    match Logs::create(Path::new("/nonexistent-dir/run"), Duration::from_secs(1), &spec) {
        Err(e @ Error::Log { .. }) => {
            assert!(e.to_string().starts_with("creating the log /nonexistent-dir/run_iops.1.log: "), "{e}")
        }
        other => panic!("expected a log error, got {other:?}"),
    }
    for ms in [0, 9, 3_600_001] {
        let e = Logs::create(Path::new("x"), Duration::from_millis(ms), &spec).unwrap_err();
        let e = e.to_string();
        assert!(
            e.starts_with("--log-interval: ") && e.contains("is out of range: it must be between 10 ms and 1 h"),
            "{e}"
        );
    }
}

/// Runs /usr/bin/python3 scripts/plot.py (Debian's matplotlib: scripts/deps.sh installs it; a
/// missing matplotlib fails this test).
fn plot(args: &[&std::ffi::OsStr]) -> std::process::Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/plot.py");
    let out = Command::new("/usr/bin/python3").arg(&script).args(args).output().expect("run /usr/bin/python3");
    eprintln!("plot.py {args:?}: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    out
}

fn assert_png(path: &Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 10_000, "{}: not a PNG", path.display());
}

#[test]
fn plot_py_draws_the_logs_the_report_and_the_comparison_and_names_bad_input() {
    let dir = scratch("plot");
    let (r, prefix) = logged_run(&dir);
    let json = dir.join("report.json");
    std::fs::write(&json, serde_json::to_string(&r).unwrap()).unwrap();
    let os = |p: &Path| p.as_os_str().to_owned();
    let (iops1, iops2) = (file(&prefix, "_iops.1.log"), file(&prefix, "_iops.2.log"));

    let png = dir.join("iops.png");
    let out = plot(&["series".as_ref(), "-o".as_ref(), &os(&png), &os(&iops1), &os(&iops2)]);
    assert!(out.status.success());
    assert_png(&png);
    let png = dir.join("cdf.png");
    assert!(plot(&["cdf".as_ref(), "-o".as_ref(), &os(&png), &os(&json)]).status.success());
    assert_png(&png);
    // The comparison committed with the README (compare-rxe.sh's summary.json of that run).
    let summary = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/compare-rxe.json");
    let png = dir.join("compare.png");
    assert!(plot(&["compare".as_ref(), "-o".as_ref(), &os(&png), &os(&summary)]).status.success());
    assert_png(&png);

    // Bad input: exit status 1 and a message naming the file and what is wrong.
    let bad = dir.join("bad_iops.1.log");
    std::fs::write(&bad, "100, 5, 0, 4096, 0\n200, five, 0, 4096, 0\n").unwrap();
    let back = dir.join("back_iops.1.log");
    std::fs::write(&back, "200, 5, 0, 4096, 0\n100, 5, 0, 4096, 0\n").unwrap();
    let not_json = dir.join("not.json");
    std::fs::write(&not_json, "{\"job\": ").unwrap();
    let out_png = os(&dir.join("never.png"));
    for (args, needle) in [
        (vec!["series".into(), os(&dir.join("missing_iops.1.log"))], "cannot read".to_owned()),
        (vec!["series".into(), os(&bad)], format!("{}: line 2: expected", bad.display())),
        (vec!["series".into(), os(&back)], "line 2: time 100 ms goes back".into()),
        (vec!["series".into(), os(&json)], "not a fio log name".into()),
        (vec!["cdf".into(), os(&not_json)], format!("{}: not JSON", not_json.display())),
        (vec!["cdf".into(), os(&iops1)], "not JSON".into()),
        (vec!["compare".into(), os(&json)], "no workloads".into()),
    ] {
        let mut full: Vec<std::ffi::OsString> = vec![args[0].clone(), "-o".into(), out_png.clone()];
        full.extend(args[1..].iter().cloned());
        let refs: Vec<&std::ffi::OsStr> = full.iter().map(|a| a.as_os_str()).collect();
        let out = plot(&refs);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(&needle), "{args:?}: {needle:?} not in {stderr}");
    }
    assert!(!dir.join("never.png").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
