//! Durable volumes over rxe, on the guest's scratch disk: what a completed FLUSH promises
//! survives a target crash; a graceful stop keeps everything; a backing store that fails makes
//! the volume stop promising; a slow backing store (dm-delay) neither costs a FLUSH its
//! connection nor lets a read-only session's FLUSHes delay another session's.
//!
//! On the host (`mem_*`, the server in-process over the in-memory fabric, backing files in the
//! temp dir): a backing file is served by one server at a time, and a stop rewrites a volume
//! only when a session with write access opened it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rblk_initiator::{Error, ErrorCode, OpenMode, Options, Session, Volume};
use rblk_tests::daemon::Daemon;
use rblk_tests::rxe::rdma;
use rblk_tests::scratch;
use rblk_tests::workload::pattern;

const MIB: u64 = 1 << 20;

/// An in-process server over the in-memory fabric with durable volume `v` backed by `path`.
fn serve_file(path: &Path) -> Result<rblk_target::server::Running, rblk_target::start::StartError> {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    rblk_target::server::Server::start(rblk_target::config::Config {
        listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        fabric: rblk_fabric::Fabric::Mem,
        volumes: vec![rblk_target::config::VolumeSpec { name: "v".into(), size: MIB, path: Some(path.to_owned()) }],
        ..Default::default()
    })
}

fn host_backing(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rblk-durable-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    path
}

/// The error with its sources, as the daemon logs it.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut at = e.source();
    while let Some(s) = at {
        text += &format!(": {s}");
        at = s.source();
    }
    text
}

/// Catches a backing file served by two servers at once (no OFD lock): the second one's final
/// flush would overwrite whatever the first wrote since with its own snapshot from its start.
#[test]
fn mem_a_second_server_on_one_backing_file_is_refused() {
    let path = host_backing("claimed.img");
    let first = serve_file(&path).expect("the first server");
    let err = serve_file(&path).err().map(|e| chain(&e)).expect("a second server on the same file must be refused");
    assert!(err.contains(&path.display().to_string()) && err.contains("in use by another process"), "{err}");
    first.shutdown();
    serve_file(&path).expect("free once the first server stopped").shutdown();
    let _ = std::fs::remove_file(&path);
}

/// Catches the whole-volume rewrite at every stop: a volume nobody could write since it was
/// loaded is left as it is on disk (here the file changed under the server, which a rewrite
/// would undo); once a session with write access opened it, the stop writes it back.
#[test]
fn mem_a_stop_rewrites_a_volume_only_after_a_writer_opened_it() {
    let path = host_backing("rewrite.img");
    let opened = |r: &rblk_target::server::Running, mode| {
        let mut raw = rblk_tests::raw::Raw::connect(
            rblk_fabric::Fabric::Mem,
            r.local_addr(),
            rblk_proto::ConnectData::NewSession,
        )
        .expect("connect");
        raw.open("v", mode);
        raw
    };
    let poke = |bytes: &[u8]| {
        use std::os::unix::fs::FileExt as _;
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().write_all_at(bytes, 0).unwrap();
    };
    let first_block = || std::fs::read(&path).unwrap()[..8].to_vec();

    let r = serve_file(&path).expect("start");
    poke(b"outside!");
    drop(opened(&r, OpenMode::ReadOnly));
    r.shutdown();
    assert_eq!(first_block(), b"outside!", "a stop with no writer since the load rewrote the volume");

    let r = serve_file(&path).expect("start again");
    poke(b"changed!");
    drop(opened(&r, OpenMode::ReadWrite));
    r.shutdown();
    assert_eq!(first_block(), b"outside!", "a stop after a writer opened the volume must write it back whole");
    let _ = std::fs::remove_file(&path);
}

fn backing(name: &str) -> PathBuf {
    let path = scratch::dir().join(name);
    let _ = std::fs::remove_file(&path);
    path
}

fn volume_arg(name: &str, size: u64, path: &Path) -> String {
    format!("{name}:{size}:{}", path.display())
}

fn open(d: &Daemon, name: &str, mode: OpenMode) -> rblk_initiator::Result<Volume> {
    Session::connect(&format!("rblk://{}/{name}", d.addr), &Options::default())?.open(mode)
}

/// Writes `count` chunks of `chunk` bytes of fresh data at random aligned offsets of a volume of
/// `size` bytes, applying them to `model` too.
fn random_writes(vol: &mut Volume, model: &mut [u8], count: u64, chunk: u64, seed: u64) {
    let mut x = seed | 1;
    let mut buf = vec![0u8; chunk as usize];
    for i in 0..count {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let offset = (x % (model.len() as u64 / chunk)) * chunk;
        pattern(seed ^ i, offset, &mut buf);
        vol.write_at(&buf, offset).unwrap();
        model[offset as usize..(offset + chunk) as usize].copy_from_slice(&buf);
    }
}

fn verify(vol: &mut Volume, model: &[u8]) {
    let mut got = vec![0u8; model.len()];
    for (i, piece) in got.chunks_mut(MIB as usize).enumerate() {
        vol.read_at(piece, i as u64 * MIB).unwrap();
    }
    if let Some(at) = got.iter().zip(model).position(|(a, b)| a != b) {
        panic!("volume differs from what was written at offset {at}");
    }
}

/// How the target goes down between the writes and the check.
enum Down {
    /// FLUSH, then SIGKILL: only flushed data is promised.
    FlushThenKill,
    /// No FLUSH, then SIGTERM: a graceful stop flushes everything itself.
    GracefulStop,
}

/// Writes `count` random 64 KiB chunks to a fresh durable volume of `size`, takes the target down
/// as `down` says, restarts it on the same backing file and verifies every byte.
fn survives(file: &str, size: u64, count: u64, seed: u64, down: Down) {
    let rdma = rdma();
    let spec = volume_arg("d", size, &backing(file));
    let d = Daemon::start(&rdma, &["--volume", &spec]);
    let addr = d.addr;
    let mut vol = open(&d, "d", OpenMode::ReadWrite).unwrap();
    assert!(!vol.is_volatile(), "a volume with a backing file is durable");
    let mut model = vec![0u8; size as usize];
    random_writes(&mut vol, &mut model, count, 64 * 1024, seed);
    match down {
        Down::FlushThenKill => {
            assert!(!vol.flush().unwrap(), "FLUSH of a durable volume reports durable");
            drop(vol);
            assert!(!d.kill().success());
        }
        Down::GracefulStop => {
            drop(vol);
            assert!(d.stop().success(), "SIGTERM exits 0");
        }
    }
    let d = Daemon::start_at(addr, &["--volume", &spec]);
    let mut vol = open(&d, "d", OpenMode::ReadOnly).unwrap();
    verify(&mut vol, &model);
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn flushed_data_survives_a_killed_target() {
    // 8 MiB of fresh data at random offsets (some overlapping) of a 16 MiB volume: up to 128
    // ranges to write back, eight times the target's 16 transfers in flight (512 writes over
    // 64 MiB proved the same in four times the guest's time).
    survives("killed.img", 16 * MIB, 128, 7, Down::FlushThenKill);
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn a_graceful_stop_keeps_unflushed_data() {
    survives("graceful.img", 16 * MIB, 64, 11, Down::GracefulStop);
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn a_failed_write_back_fails_the_volume() {
    let rdma = rdma();
    // A 16 MiB volume on a 4 MiB file system: the write-back runs out of space.
    let tiny = rblk_tests::scratch::Tiny::mount("tiny", "4M");
    let spec = volume_arg("f", 16 * MIB, &tiny.path.join("f.img"));
    let d = Daemon::start(&rdma, &["--volume", &spec]);
    let mut vol = open(&d, "f", OpenMode::ReadWrite).unwrap();
    let data = vec![0x5au8; 8 * MIB as usize];
    vol.write_at(&data, 0).unwrap();
    let err = vol.flush().expect_err("FLUSH onto a full file system must fail");
    assert_eq!(err.code(), Some(ErrorCode::VolumeFailed), "{err}");
    assert!(vol.failed());
    let w = vol.write_at(&data[..4096], 0);
    assert!(matches!(w, Err(Error::VolumeFailed { .. })), "later writes fail as volume failed: {w:?}");
    // The target no longer promises: read-write opens and FLUSHes are refused, reads still work.
    let again = open(&d, "f", OpenMode::ReadWrite);
    assert_eq!(again.as_ref().err().and_then(Error::code), Some(ErrorCode::VolumeFailed), "{:?}", again.err());
    let mut ro = open(&d, "f", OpenMode::ReadOnly).unwrap();
    let mut back = vec![0u8; 4096];
    ro.read_at(&mut back, 0).unwrap();
    assert!(back.iter().all(|&b| b == 0x5a));
    // A session that wrote nothing sends no FLUSH (flush() covers its own writes); asked to
    // flush everything, the target refuses.
    assert!(!ro.flush().expect("nothing written: nothing to flush"));
    let e = ro.flush_all().expect_err("FLUSH of a failed volume is refused");
    assert_eq!(e.code(), Some(ErrorCode::VolumeFailed));
    drop(vol);
    drop(ro);
    drop(d);
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn flush_throughput_of_a_64_mib_dirty_set() {
    let rdma = rdma();
    let path = backing("throughput.img");
    let spec = volume_arg("t", 256 * MIB, &path);
    let started = Instant::now();
    let d = Daemon::start(&rdma, &["--volume", &spec]);
    eprintln!("target up with a fresh 256 MiB durable volume after {:?}", started.elapsed());
    let mut vol = open(&d, "t", OpenMode::ReadWrite).unwrap();
    let mut buf = vec![0u8; MIB as usize];
    for i in 0..64 {
        pattern(i, i * MIB, &mut buf);
        vol.write_at(&buf, i * MIB).unwrap();
    }
    let t = Instant::now();
    assert!(!vol.flush().unwrap());
    let took = t.elapsed();
    eprintln!("FLUSH of a 64 MiB dirty set: {took:?} = {:.1} MiB/s", 64.0 / took.as_secs_f64());
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 256 * MIB);

    // For the record: all 256 MiB dirty, flushed; then a restart loads 256 MiB of real data
    // (the target logs its load time); next to dd of the same size with O_DIRECT.
    for i in 64..256 {
        pattern(i, i * MIB, &mut buf);
        vol.write_at(&buf, i * MIB).unwrap();
    }
    let t = Instant::now();
    assert!(!vol.flush().unwrap());
    let took = t.elapsed();
    eprintln!("FLUSH of a 256 MiB dirty set: {took:?} = {:.1} MiB/s", 256.0 / took.as_secs_f64());
    drop(vol);
    let addr = d.addr;
    assert!(d.stop().success());
    let t = Instant::now();
    let d = Daemon::start_at(addr, &["--volume", &spec]);
    eprintln!("restart with 256 MiB to load: listening after {:?} (see the target's 'loaded' line)", t.elapsed());
    let mut vol = open(&d, "t", OpenMode::ReadOnly).unwrap();
    vol.read_at(&mut buf, 255 * MIB).unwrap();
    let mut want = vec![0u8; MIB as usize];
    pattern(255, 255 * MIB, &mut want);
    assert!(buf == want, "the last MiB survived the restart");
    let dd_path = backing("dd.img");
    let dd = std::process::Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "count=256", "oflag=direct", "conv=fdatasync"])
        .arg(format!("of={}", dd_path.display()))
        .output()
        .expect("dd");
    eprintln!("dd of 256 MiB with oflag=direct: {}", String::from_utf8_lossy(&dd.stderr).lines().last().unwrap_or(""));
    let _ = std::fs::remove_file(dd_path);
}

/// How long the slow write-back takes: `RBLK_SLOW_FLUSH_SECS` (scripts/soak-flush.sh sets 60),
/// or 20 s.
fn slow_flush_secs() -> u64 {
    std::env::var("RBLK_SLOW_FLUSH_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(20)
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn a_slow_write_back_keeps_its_connection() {
    // A FLUSH whose write-back takes 20 s (a 4 KiB write that dm-delay holds that long), past
    // the keepalive timeout of both sides (15 s), from a session of one connection with the
    // initiator's default options. Would catch: the target's connection thread writing back
    // itself (it sends no keepalives meanwhile, and the initiator, which sends none while it
    // waits for the reply, takes the silent connection for lost after 15 s and reconnects), and
    // the target counting the initiator's silence while it waits (the connection ends).
    let rdma = rdma();
    let secs = slow_flush_secs();
    let disk = scratch::SlowDisk::new("long", 16 * MIB, secs * 1000);
    let spec = volume_arg("s", 16 * MIB, &disk.path);
    let d = Daemon::start(&rdma, &["--volume", &spec]);
    let mut vol = open(&d, "s", OpenMode::ReadWrite).unwrap();
    let mut data = vec![0u8; 4096];
    pattern(1, 0, &mut data);
    vol.write_at(&data, 0).unwrap();
    let t = Instant::now();
    assert!(!vol.flush().expect("a FLUSH longer than the keepalive timeout"), "durable");
    let took = t.elapsed();
    eprintln!("FLUSH through a {secs} s write delay took {took:?}");
    assert!(took >= Duration::from_secs(secs), "the write-back was not slow: {took:?}");
    // A target that took the write-back for the initiator's silence ends the connection right
    // after FLUSHED: look for a few seconds.
    std::thread::sleep(Duration::from_secs(3));
    let mut back = vec![0u8; 4096];
    vol.read_at(&mut back, 0).unwrap();
    assert!(back == data);
    vol.stats().expect("the connection still answers");
    assert_eq!(vol.reconnects(), 0, "the connection was lost during or right after its FLUSH");
    drop(vol);
    // No final flush through the slow device.
    d.kill();
    let mut on_disk = vec![0u8; 4096];
    use std::io::Read;
    std::fs::File::open(&disk.path).unwrap().read_exact(&mut on_disk).unwrap();
    assert!(on_disk == data, "the FLUSHED block is on the device");
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn a_read_only_flush_flood_does_not_delay_another_flush() {
    // Each write to the device takes 3 s. A read-only session sends FLUSH of the whole volume
    // again and again; 300 ms into that, a read-write session FLUSHes the 4 KiB it wrote: one
    // write, so about 3 s. Would catch read-only FLUSHes that write back (each rewrote the whole
    // volume: 3 s a pass, and the read-write FLUSH waited for the one running, about 6 s).
    let rdma = rdma();
    const DELAY: Duration = Duration::from_secs(3);
    let disk = scratch::SlowDisk::new("flood", 16 * MIB, DELAY.as_millis() as u64);
    let spec = volume_arg("f", 16 * MIB, &disk.path);
    let d = Daemon::start(&rdma, &["--volume", &spec]);
    let mut rw = open(&d, "f", OpenMode::ReadWrite).unwrap();
    let mut ro = open(&d, "f", OpenMode::ReadOnly).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                assert!(!ro.flush_all().expect("a read-only FLUSH"), "durable");
                n += 1;
            }
            n
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    rw.write_at(&[9u8; 4096], 8192).unwrap();
    let t = Instant::now();
    assert!(!rw.flush().expect("the read-write FLUSH"), "durable");
    let took = t.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let n = flood.join().unwrap();
    eprintln!("read-write FLUSH took {took:?} next to {n} read-only FLUSHes of everything");
    assert!(took >= DELAY, "the write-back was not slow: {took:?}");
    assert!(took < DELAY + DELAY / 2, "the read-only FLUSHes delayed the read-write one: {took:?}");
    assert!(n >= 10, "the read-only FLUSHes were not answered at once: {n} in {took:?}");
    drop(rw);
    d.kill();
}
