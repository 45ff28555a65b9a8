//! Faults and recovery over rxe in the guest, through the block devices users mount: the target
//! restarted gracefully and SIGKILLed under load, a crash that loses unflushed writes, a RAM
//! volume that comes back empty, an idle device, ctrl_loss_tmo, and a failed path. Durable
//! volumes live on the guest's scratch disk.
//!
//! No link flap (`ip link set down`) here: it needs two rxe devices that are not one loopback,
//! which `scripts/flap-rxe.sh` sets up outside CI. The in-memory `reconnect.rs` severs
//! connections instead, and `a_failed_path_moves_to_the_other_address` takes an address away.
//!
//! What each would catch:
//! - `fio_verify_on_ublk_survives_graceful_restarts`: replay and waiting across restarts
//!   (an I/O failed or lost shows as a fio error or a verify failure); the stall is printed.
//!   CI restarts once; the soak (`scripts/soak-restarts.sh`) restarts 3 times.
//! - `flushed_data_reads_back_across_sigkills`: reconnect to a crashed durable volume whose data
//!   was flushed (a new instance with nothing dirty must continue). CI kills once; the soak 3
//!   times.
//! - `nbd_and_fuse_loop_keep_ext4_across_restarts`: the same for `rblk nbd` and `rblk mount`
//!   (files written across a graceful restart, a SIGKILL after sync, checksums read back from
//!   the device, e2fsck). CI runs one round of both per front end; the soak 3 rounds.
//! - `bench_verify_across_a_restart_has_no_mismatch`: the library path (rblk-bench's queues).
//! - `a_crash_with_unflushed_writes_fails_the_next_fsync`: the write loss reaches fsync, and the
//!   region reads back as last flushed.
//! - `a_restarted_ram_volume_fails_io_instead_of_reading_zeros`: the identity check.
//! - `an_idle_device_keeps_its_session`: keepalives from an idle ublk queue thread, and the
//!   target's (19 s of silence: three of the target's limit, set to its 5 s minimum, and more
//!   than the initiator's 15 s).
//! - `ctrl_loss_tmo_fails_io_after_the_timeout_and_the_device_detaches`: giving up.
//! - `a_failed_path_moves_to_the_other_address`: multi-address failover.
//!
//! The first three take their number of rounds from `RBLK_SOAK_ROUNDS` ([`rblk_tests::rounds`]).

use std::fs::{File, OpenOptions};
use std::net::SocketAddr;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rblk_tests::blockdev::{attach, detach, fio_errors, fio_paced_verified_writes, rblk, ublk_drv, wait_child};
use rblk_tests::daemon::{bin, Daemon};
use rblk_tests::rxe::rdma;
use rblk_tests::scratch;
use rblk_tests::sh;

const MIB: u64 = 1 << 20;
const O_DIRECT: i32 = 0o40000;
const NETDEV: &str = "rxe-veth0";

/// A durable volume `v` on the scratch disk, with its state directory: the target's arguments.
fn durable(tag: &str, size: u64) -> Vec<String> {
    scratch::durable("v", size, &format!("recovery-{tag}"))
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn uri(addr: SocketAddr) -> String {
    format!("rblk://{addr}/v")
}

fn log_file(tag: &str) -> String {
    let path = format!("/tmp/rblk-recovery-{tag}-{}.log", std::process::id());
    let _ = std::fs::remove_file(&path);
    path
}

fn count_in(path: &str, needle: &str) -> usize {
    std::fs::read_to_string(path).unwrap_or_default().matches(needle).count()
}

/// Reads 64 KiB blocks of a region in a loop with O_DIRECT, checks each against what the region
/// must hold, and records when reads complete (to measure stalls).
struct Reader {
    stop: Arc<AtomicBool>,
    done: Arc<Mutex<Vec<Instant>>>,
    errors: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Reader {
    fn start(dev: &str, offset: u64, expect: Arc<Vec<u8>>) -> Reader {
        let file = OpenOptions::new().read(true).custom_flags(O_DIRECT).open(dev).expect("open the device O_DIRECT");
        let (stop, done, errors) = (Arc::default(), Arc::default(), Arc::default());
        let (s, d, e) = (Arc::clone(&stop), Arc::clone(&done), Arc::clone(&errors));
        let thread = std::thread::spawn(move || read_loop(&file, offset, &expect, &s, &d, &e));
        Reader { stop, done, errors, thread: Some(thread) }
    }

    /// From `t` to the first read that completed after it.
    fn stall_after(&self, t: Instant) -> Option<Duration> {
        self.done.lock().unwrap().iter().find(|&&d| d > t).map(|&d| d - t)
    }

    /// The longest gap between reads completed after `t` (and from `t` to the first).
    fn longest_gap_after(&self, t: Instant) -> Duration {
        let done = self.done.lock().unwrap();
        let mut last = t;
        let mut gap = Duration::ZERO;
        for &d in done.iter().filter(|&&d| d > t) {
            gap = gap.max(d - last);
            last = d;
        }
        gap
    }

    /// From `t` (a kill) to the first read that completed after `up` (the new target listens).
    fn stall_across(&self, t: Instant, up: Instant) -> Option<Duration> {
        self.done.lock().unwrap().iter().find(|&&d| d > up).map(|&d| d - t)
    }

    fn reads(&self) -> usize {
        self.done.lock().unwrap().len()
    }

    /// Stops; returns (reads, errors).
    fn finish(mut self) -> (usize, u64) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        (self.reads(), self.errors.load(Ordering::SeqCst))
    }
}

fn read_loop(
    file: &File,
    offset: u64,
    expect: &[u8],
    stop: &AtomicBool,
    done: &Mutex<Vec<Instant>>,
    errors: &AtomicU64,
) {
    const BLOCK: usize = 64 << 10;
    // O_DIRECT wants an aligned buffer: cut one out of a larger allocation.
    let mut raw = vec![0u8; BLOCK + 4096];
    let skew = raw.as_ptr().align_offset(4096);
    let buf = &mut raw[skew..skew + BLOCK];
    let blocks = expect.len() / BLOCK;
    let mut i = 0usize;
    while !stop.load(Ordering::SeqCst) {
        let at = (i * 7919) % blocks * BLOCK;
        i += 1;
        match file.read_exact_at(buf, offset + at as u64) {
            Ok(()) if buf[..] == expect[at..at + BLOCK] => done.lock().unwrap().push(Instant::now()),
            Ok(()) => {
                eprintln!("recovery: block at {} differs", offset + at as u64);
                errors.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => {
                eprintln!("recovery: read at {} failed: {e}", offset + at as u64);
                errors.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `len` pseudo-random bytes from `seed` (xorshift, eight bytes a step: a debug build under TCG
/// makes megabytes of them).
fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut data = Vec::with_capacity(len + 8);
    while data.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    data.truncate(len);
    data
}

/// `len` random bytes, written to `dev` at `offset` with O_DIRECT and flushed (fsync).
fn fill(dev: &str, offset: u64, len: usize, seed: u64) -> Arc<Vec<u8>> {
    let data = random(len, seed);
    let path = format!("/tmp/rblk-recovery-fill-{}-{seed}", std::process::id());
    std::fs::write(&path, &data).unwrap();
    sh(&format!(
        "dd if={path} of={dev} bs=1M seek={} oflag=direct,seek_bytes conv=fsync status=none; rm {path}",
        offset
    ));
    Arc::new(data)
}

/// `len` bytes at `offset` of `dev`, read with O_DIRECT.
fn read_direct(dev: &str, offset: u64, len: usize) -> Vec<u8> {
    let mut raw = vec![0u8; len + 4096];
    let skew = raw.as_ptr().align_offset(4096);
    let file = OpenOptions::new().read(true).custom_flags(O_DIRECT).open(dev).unwrap();
    file.read_exact_at(&mut raw[skew..skew + len], offset).unwrap();
    raw[skew..skew + len].to_vec()
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn fio_verify_on_ublk_survives_graceful_restarts() {
    ublk_drv();
    let rounds = rblk_tests::rounds(1);
    // Four jobs on their own regions, writes paced (150/s each) so the run spans the restarts:
    // 7 MiB a job for each restart (about 12 s; a round is 4 s and a stall of about 7 s under
    // TCG) and 1 MiB more. Every block is verified at the end.
    let job_size = 7 * MIB * rounds as u64 + MIB;
    // 128 MiB, the probe at 96 MiB, unless many rounds need more: the volume's size is part of
    // the stall (a restart flushes it and loads it again), so the stall stays comparable.
    let probe_at = (4 * job_size).max(96 * MIB);
    let a_ = durable("fio", probe_at + 32 * MIB);
    let mut d = Daemon::start(&rdma(), &args(&a_));
    let addr = d.addr;
    let log = log_file("fio");
    let a = attach(&uri(addr), &format!("--queues 2 --depth 32 --reconnect-delay 1 --log-file {log}"));
    // A region outside fio's, flushed, for the stall probe.
    let probe_data = fill(&a.dev, probe_at, 4 * MIB as usize, 1);
    let probe = Reader::start(&a.dev, probe_at, probe_data);
    let mut job = fio_paced_verified_writes(&a.dev, job_size / MIB);
    let mut stalls = Vec::new();
    for round in 0..rounds {
        std::thread::sleep(Duration::from_secs(4));
        assert!(job.try_wait().unwrap().is_none(), "fio ended before restart {round}");
        let t0 = Instant::now();
        assert!(d.stop().success(), "a graceful stop exits 0");
        d = Daemon::start_at(addr, &args(&a_));
        let up = Instant::now();
        let deadline = Instant::now() + Duration::from_secs(60);
        let stall = loop {
            if let Some(s) = probe.stall_across(t0, up) {
                break s;
            }
            assert!(Instant::now() < deadline, "no I/O completed within 60 s of restart {round}");
            std::thread::sleep(Duration::from_millis(100));
        };
        stalls.push(stall);
    }
    let out = wait_child(&mut job, Duration::from_secs(300), "fio");
    let terse = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "fio failed: {terse}");
    assert_eq!(fio_errors(&terse), 0, "fio reported errors: {terse}");
    let (reads, errors) = probe.finish();
    assert_eq!(errors, 0, "the probe's reads failed or differed ({reads} good)");
    eprintln!(
        "recovery: I/O stall across a graceful restart (SIGTERM to the first read through the new target): {stalls:?}"
    );
    assert!(count_in(&log, "reconnected after") >= rounds, "{rounds} reconnects logged in {log}");
    detach(&a.dev);
    drop(d);
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn flushed_data_reads_back_across_sigkills() {
    ublk_drv();
    let rounds = rblk_tests::rounds(1);
    let a_ = durable("kill", 64 * MIB);
    let mut d = Daemon::start(&rdma(), &args(&a_));
    let addr = d.addr;
    let log = log_file("kill");
    let a = attach(&uri(addr), &format!("--reconnect-delay 1 --log-file {log}"));
    let data = fill(&a.dev, 0, 16 * MIB as usize, 2);
    let reader = Reader::start(&a.dev, 0, data);
    let mut stalls = Vec::new();
    for round in 0..rounds {
        std::thread::sleep(Duration::from_secs(3));
        let before = reader.reads();
        let t0 = Instant::now();
        assert!(!d.kill().success());
        d = Daemon::start_at(addr, &args(&a_));
        let up = Instant::now();
        let deadline = Instant::now() + Duration::from_secs(60);
        while reader.reads() <= before || reader.stall_across(t0, up).is_none() {
            assert!(Instant::now() < deadline, "no read completed within 60 s of SIGKILL {round}");
            std::thread::sleep(Duration::from_millis(100));
        }
        stalls.push(reader.stall_across(t0, up).unwrap());
    }
    std::thread::sleep(Duration::from_secs(2));
    let (reads, errors) = reader.finish();
    assert_eq!(errors, 0, "reads of flushed data failed or differed across SIGKILLs ({reads} good)");
    eprintln!("recovery: I/O stall across a SIGKILL and restart (SIGKILL to the first read through the new target): {stalls:?}");
    assert!(count_in(&log, "reconnected after") >= rounds, "{rounds} reconnects logged in {log}");
    detach(&a.dev);
    drop(d);
}

/// ext4 with files on `dev`, then `rounds` times: the target restarted gracefully while more
/// files are written, SIGKILLed after a sync, and every file checked against its checksum with
/// the page cache dropped; then e2fsck. Returns the running target.
///
/// The files are written from here, not by a shell loop: under TCG each exec of a host tool over
/// 9p costs 0.1-0.3 s, and the loop's 100 execs per front end were most of this test's time.
fn ext4_across_restarts(dev: &str, mut d: Daemon, target_args: &[String], tag: &str, rounds: usize) -> Daemon {
    let dir = format!("/tmp/rblk-recovery-{tag}-mnt");
    let sums = format!("/tmp/rblk-recovery-{tag}.sums");
    sh(&format!("mkfs.ext4 -q -F {dev}; mkdir -p {dir}; mount {dev} {dir}"));
    // Sizes up to 256 KiB, as `head -c $((RANDOM * 8))` made them.
    let write = {
        let dir = dir.clone();
        move |name: &str, seed: u64| {
            std::fs::write(format!("{dir}/{name}"), random((seed * 7919 % 262_144) as usize + 1, seed)).unwrap();
        }
    };
    for i in 0..20 {
        write(&format!("a{i}"), i + 1);
    }
    sh("sync");
    let mut files: u64 = 20;
    let addr = d.addr;
    for round in 0..rounds {
        // Writes before, during and after the restart: the writer goes on until it has written
        // three files through the new target.
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(0));
        let writer = {
            let (stop, written, write) = (Arc::clone(&stop), Arc::clone(&written), write.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    write(&format!("b{round}-{n}"), 1000 * (round as u64 + 1) + n);
                    n += 1;
                    written.store(n, Ordering::SeqCst);
                    // Four files a second: a few dozen a round, which 64 MiB hold for many rounds.
                    std::thread::sleep(Duration::from_millis(250));
                }
                n
            })
        };
        std::thread::sleep(Duration::from_secs(1));
        assert!(d.stop().success());
        d = Daemon::start_at(addr, &args(target_args));
        let after = written.load(Ordering::SeqCst) + 3;
        let deadline = Instant::now() + Duration::from_secs(60);
        while written.load(Ordering::SeqCst) < after {
            assert!(Instant::now() < deadline, "no file written within 60 s of restart {round}");
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, Ordering::SeqCst);
        files += writer.join().unwrap();
        // Two syncs before the SIGKILL. sync(2) commits ext4's journal with a FLUSH and then
        // writes the metadata's home locations through the block device's page cache without
        // one; only the second sync's FLUSH (ext4_sync_fs issues one even with nothing to
        // commit) makes those durable. With one sync, the SIGKILL loses them, as a disk with a
        // volatile cache would lose them at power loss, and e2fsck after the umount (which
        // clears the journal that held them) finds the inodes stale.
        sh(&format!("(cd {dir} && sha256sum a* b* > {sums}); sync; sync"));
        assert!(!d.kill().success());
        d = Daemon::start_at(addr, &args(target_args));
        sh(&format!(
            "echo 3 > /proc/sys/vm/drop_caches; (cd {dir} && sha256sum --check --quiet {sums})
             test $(ls {dir} | grep -c '^[ab]') = {files}"
        ));
    }
    sh(&format!("umount {dir}; e2fsck -fn {dev}"));
    d
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn nbd_and_fuse_loop_keep_ext4_across_restarts() {
    let rounds = rblk_tests::rounds(1);
    // rblk nbd + the kernel's NBD client.
    let a_ = durable("nbd", 64 * MIB);
    let d = Daemon::start(&rdma(), &args(&a_));
    let sock = format!("/tmp/rblk-recovery-{}.sock", std::process::id());
    let log = log_file("nbd");
    let mut nbd = Command::new(bin("rblk"))
        .args(["nbd", &uri(d.addr), "--listen", &format!("unix:{sock}"), "--reconnect-delay", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&log).unwrap())
        .spawn()
        .unwrap();
    sh(&format!(
        "modprobe nbd; for i in $(seq 100); do test -S {sock} && break; sleep 0.1; done
         # A test that failed earlier may have left nbd0 attached: one failure, not a cascade.
         if test -e /sys/block/nbd0/pid; then nbd-client -d /dev/nbd0; sleep 1; fi
         nbd-client -unix {sock} /dev/nbd0 -block-size 4096
         for i in $(seq 100); do test $(cat /sys/block/nbd0/size) != 0 && break; sleep 0.1; done"
    ));
    let d = ext4_across_restarts("/dev/nbd0", d, &a_, "nbd", rounds);
    sh("nbd-client -d /dev/nbd0");
    let _ = Command::new("kill").arg(nbd.id().to_string()).status();
    let _ = nbd.wait();
    assert!(count_in(&log, "reconnected after") >= 2 * rounds, "rblk nbd reconnected twice a round: {log}");
    drop(d);

    // rblk mount --loop (FUSE, then a loop device on its file).
    let a_ = durable("fuse", 64 * MIB);
    let d = Daemon::start(&rdma(), &args(&a_));
    let mnt = format!("/tmp/rblk-recovery-fuse-{}", std::process::id());
    let log = log_file("fuse");
    std::fs::create_dir_all(&mnt).unwrap();
    let out =
        sh(&format!("{} mount {} {mnt} --loop --daemon --log-file {log} --reconnect-delay 1", rblk(), uri(d.addr)));
    // `rblk mount --loop` prints exactly one stdout line: the loop device.
    let dev = out.trim_end();
    assert!(dev.starts_with("/dev/loop") && !dev.contains('\n'), "stdout must be exactly the loop device: {out:?}");
    let d = ext4_across_restarts(dev, d, &a_, "fuse", rounds);
    sh(&format!("{} umount {mnt}", rblk()));
    assert!(count_in(&log, "reconnected after") >= 2 * rounds, "rblk mount reconnected twice a round: {log}");
    drop(d);
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn bench_verify_across_a_restart_has_no_mismatch() {
    let a_ = durable("bench", 64 * MIB);
    let d = Daemon::start(&rdma(), &args(&a_));
    let addr = d.addr;
    let json = format!("/tmp/rblk-recovery-bench-{}.json", std::process::id());
    let mut bench = Command::new(bin("rblk-bench"))
        .args([&uri(addr), "--rw", "randrw", "--verify", "--runtime", "12", "--iodepth", "8", "--numjobs", "2"])
        .args(["-o", "json", "--group_reporting", "--output", &json, "--quiet", "--reconnect-delay", "1"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(4));
    assert!(d.stop().success());
    let d = Daemon::start_at(addr, &args(&a_));
    let out = wait_child(&mut bench, Duration::from_secs(120), "rblk-bench");
    assert!(out.status.success(), "rblk-bench failed: {}", String::from_utf8_lossy(&out.stdout));
    // fio's layout: the verify figures are rblk-bench's own, in its section of the report.
    let text = std::fs::read_to_string(&json).unwrap();
    let report: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{json}: {e}: {text}"));
    assert_eq!(report["jobs"][0]["error"], 0, "the job's error: {text}");
    let verify = &report["rblk"]["sections"][0]["verify"];
    assert_eq!(verify["mismatches"].as_u64(), Some(0), "mismatches in {verify}");
    assert!(verify["blocks_checked"].as_u64().is_some_and(|n| n > 0), "nothing was checked: {verify}");
    drop(d);
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn a_crash_with_unflushed_writes_fails_the_next_fsync() {
    ublk_drv();
    let a_ = durable("crash", 64 * MIB);
    let d = Daemon::start(&rdma(), &args(&a_));
    let addr = d.addr;
    let log = log_file("crash");
    let a = attach(&uri(addr), &format!("--reconnect-delay 1 --log-file {log}"));
    let flushed = fill(&a.dev, 8 * MIB, MIB as usize, 3);
    // Written (O_DIRECT: it is in target memory) and never flushed. The device stays open: the
    // last close of a block device written to may flush it.
    let file = OpenOptions::new().read(true).write(true).custom_flags(O_DIRECT).open(&a.dev).unwrap();
    let mut raw = vec![b'X'; MIB as usize + 4096];
    let skew = raw.as_ptr().align_offset(4096);
    file.write_all_at(&raw[skew..skew + MIB as usize], 8 * MIB).unwrap();
    raw.clear();
    assert!(!d.kill().success());
    let d = Daemon::start_at(addr, &args(&a_));
    let synced = file.sync_all();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(synced.as_ref().map_err(|e| e.raw_os_error()), Err(Some(5)), "the fsync after the crash: {text}");
    assert!(text.contains("bytes of writes that were not flushed"), "the loss is logged in {log}: {text}");
    if let Err(e) = file.sync_all() {
        panic!("the next fsync: the loss is reported once: {e}: {}", std::fs::read_to_string(&log).unwrap_or_default());
    }
    drop(file);
    // The region reads back as last flushed.
    assert!(read_direct(&a.dev, 8 * MIB, MIB as usize) == flushed[..], "the region holds what was last flushed");
    detach(&a.dev);
    drop(d);
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn a_restarted_ram_volume_fails_io_instead_of_reading_zeros() {
    ublk_drv();
    let ram = vec!["--volume".to_owned(), format!("v:{}", 64 * MIB)];
    let d = Daemon::start(&rdma(), &args(&ram));
    let addr = d.addr;
    let log = log_file("ram");
    let a = attach(&uri(addr), &format!("--reconnect-delay 1 --log-file {log}"));
    fill(&a.dev, 0, MIB as usize, 4);
    assert!(d.stop().success());
    let d = Daemon::start_at(addr, &args(&ram));
    let out = Command::new("dd")
        .args([&format!("if={}", a.dev), "of=/tmp/rblk-recovery-ram", "bs=64k", "count=1", "iflag=direct"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("Input/output error"), "a read of a lost volume: {err}");
    assert!(count_in(&log, "volume contents lost") >= 1, "the reason is logged in {log}");
    detach(&a.dev);
    drop(d);
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn an_idle_device_keeps_its_session() {
    ublk_drv();
    // The target's silence limit at its minimum (5 s, not 15 s): the same rule, three times
    // sooner.
    let ram = vec!["--volume".to_owned(), format!("v:{}", 64 * MIB), "--keepalive-timeout".to_owned(), "5".to_owned()];
    let d = Daemon::start(&rdma(), &args(&ram));
    let log = log_file("idle");
    let a = attach(&uri(d.addr), &format!("--queues 2 --log-file {log}"));
    let data = fill(&a.dev, 0, MIB as usize, 6);
    // Silence from the device's users: three of the target's timeouts (it would end a queue
    // pair whose idle thread sent no keepalives), and longer than the initiator's own
    // KEEPALIVE_TIMEOUT plus two keepalive intervals (it would reconnect if the target's
    // keepalives stopped).
    let target_timeout = Duration::from_secs(5);
    std::thread::sleep((3 * target_timeout).max(rblk_proto::KEEPALIVE_TIMEOUT + 2 * rblk_proto::KEEPALIVE_INTERVAL));
    assert!(read_direct(&a.dev, 0, MIB as usize) == data[..], "the idle device still reads its data");
    assert_eq!(count_in(&log, "reconnected after"), 0, "no reconnect was needed: {log}");
    assert!(d.log_lines(&["silent"]).is_empty(), "the target never saw the initiator go silent");
    detach(&a.dev);
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn ctrl_loss_tmo_fails_io_after_the_timeout_and_the_device_detaches() {
    ublk_drv();
    let a_ = durable("loss", 64 * MIB);
    let d = Daemon::start(&rdma(), &args(&a_));
    let a = attach(&uri(d.addr), "--reconnect-delay 1 --ctrl-loss-tmo 6");
    fill(&a.dev, 0, MIB as usize, 7);
    assert!(!d.kill().success());
    let started = Instant::now();
    let out = Command::new("dd")
        .args([&format!("if={}", a.dev), "of=/dev/null", "bs=64k", "count=1", "iflag=direct"])
        .output()
        .unwrap();
    let took = started.elapsed();
    assert!(!out.status.success(), "a read with the target gone for good succeeded");
    assert!(took >= Duration::from_secs(5), "failed before ctrl_loss_tmo: after {took:?}");
    assert!(took < Duration::from_secs(40), "failed long after ctrl_loss_tmo: after {took:?}");
    let t = Instant::now();
    detach(&a.dev);
    assert!(t.elapsed() < Duration::from_secs(20), "detach took {:?}", t.elapsed());
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn a_failed_path_moves_to_the_other_address() {
    ublk_drv();
    let r = rdma();
    let second = "10.99.0.2";
    sh(&format!("ip addr add {second}/24 dev {NETDEV} 2>/dev/null || true"));
    let a_ = durable("path", 64 * MIB);
    let any: SocketAddr = format!("0.0.0.0:{}", 7600 + std::process::id() % 300).parse().unwrap();
    let d = Daemon::start_at(any, &args(&a_));
    let log = log_file("path");
    let uri = format!("rblk://{second}:{port},{}:{port}/v", r.addr, port = any.port());
    let a = attach(&uri, &format!("--queues 2 --reconnect-delay 1 --log-file {log}"));
    let data = fill(&a.dev, 0, 8 * MIB as usize, 8);
    let reader = Reader::start(&a.dev, 0, data);
    std::thread::sleep(Duration::from_secs(2));
    let t0 = Instant::now();
    sh(&format!("ip addr del {second}/24 dev {NETDEV}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while reader.stall_after(t0 + Duration::from_secs(3)).is_none() {
        assert!(Instant::now() < deadline, "no read completed within 60 s of the path failing");
        std::thread::sleep(Duration::from_millis(100));
    }
    let gap = reader.longest_gap_after(t0);
    let (reads, errors) = reader.finish();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(errors, 0, "reads failed when a path went away ({reads} good): {text}");
    eprintln!("recovery: I/O stall when a path went away (longest gap between reads): {gap:?}");
    assert!(text.contains("reconnected after"), "the session moved to the other address: {text}");
    detach(&a.dev);
    drop(d);
}
