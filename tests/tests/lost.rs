//! A lost connection is an event (issue 42): over rxe in the guest, with the initiator's periodic
//! checks turned off (`RBLK_TEST_NO_TICKS=1`: no 100 ms disconnect throttle, no keepalive rule,
//! no ublk, NBD or FUSE tick; docs/tests.md), a SIGKILLed target must still be reported within
//! a second, by the library (an engine idle, its owner sleeping in `Lane::idle_wait`, and one
//! under I/O, sleeping in the queue's own wait), by `rblk attach` (ublk: the serving process's
//! loss line) and by `rblk nbd` (idle, a client connected). The kernel disconnects a dying
//! process's connections, so rdma_cm tells the initiator at once; only the CM channels in the
//! waits can have noticed it here.
//!
//! What it would catch: a CM channel missing from one of the waits (the endpoint's own
//! `wait`, the lanes' `cm_fds`, the ublk ring's POLL_ADDs, NBD's idle wait), a CM event taken
//! without the liveness check acting on it, or a loss seen only on a tick. With the CM channel
//! taken out of `Lane::cm_fds` and `Endpoint::wait`, every case fails (nothing is reported
//! within 5 s).

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::fd::AsFd as _;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rblk_initiator::engine::LinkState;
use rblk_initiator::{Engine, OpenMode, Options, Reconnect, Session};
use rblk_tests::blockdev::{attach, detach, ublk_drv};
use rblk_tests::daemon::{bin, Daemon};
use rblk_tests::rxe::rdma;

/// How soon a loss must be reported.
const WITHIN: Duration = Duration::from_secs(1);
/// How long a test looks for the report before it fails.
const GIVE_UP: Duration = Duration::from_secs(5);
const LOST: &str = "the session to the target was lost";

/// scripts/lib/test_lost.py: the unit tests of scripts/lost-rxe.sh's analysis (the bare
/// peer's and the initiator's times, the difference against the goal), on recorded lines.
#[test]
fn the_lost_scripts_analysis() {
    rblk_tests::python_unittest("test_lost");
}

/// scripts/lib/test_guestlog.py: what the two-step analyses share (log stamps, the trace tied to
/// Unix time by its marker, fio's logs, the command line).
#[test]
fn the_guest_log_helpers() {
    rblk_tests::python_unittest("test_guestlog");
}

/// Turns the initiator's periodic checks off, in this process and in the clients it starts.
fn no_ticks() {
    std::env::set_var(rblk_initiator::NO_TICKS_ENV, "1");
    assert!(!rblk_initiator::periodic_checks(), "RBLK_TEST_NO_TICKS=1 must turn the periodic checks off");
}

/// A target with a 16 MiB RAM volume `v`.
fn target() -> Daemon {
    Daemon::start(&rdma(), &["--volume", "v:16777216"])
}

/// SIGKILLs `d`, then waits until `reported` says so; how long that took from the kill.
fn kill_and_time(d: Daemon, what: &str, reported: impl Fn() -> bool) -> Duration {
    let t0 = Instant::now();
    assert!(!d.kill().success());
    while !reported() {
        assert!(t0.elapsed() < GIVE_UP, "{what}: the SIGKILLed target was not reported within {GIVE_UP:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
    let took = t0.elapsed();
    eprintln!("lost: {what}: reported {:.1} ms after the SIGKILL", took.as_secs_f64() * 1e3);
    took
}

fn engine(d: &Daemon, reconnect: Reconnect) -> Engine {
    let opts = Options { reconnect, ..Options::default() };
    let vol = Session::connect(&format!("rblk://{}/v", d.addr), &opts).unwrap().open(OpenMode::ReadWrite).unwrap();
    Engine::new(vol, 0).unwrap()
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn the_library_reports_a_sigkilled_target_idle_and_under_io() {
    no_ticks();
    // Idle: the lane's owner sleeps in idle_wait on a descriptor of its own that never rings.
    let d = target();
    let e = engine(&d, Reconnect::default());
    let mut lane = e.lane(4, 64 << 10).unwrap();
    lane.write_at(&[7; 4096], 0, false).unwrap();
    let counters = e.counters();
    let (_ring, quiet) = UnixStream::pair().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let owner = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // Err once the loss is seen: the report, as Lane::tick's.
                let _ = lane.idle_wait(quiet.as_fd(), Instant::now() + Duration::from_millis(500));
            }
            drop(lane);
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let took = kill_and_time(d, "library, idle", || counters.link_state() != LinkState::Connected);
    stop.store(true, Ordering::Relaxed);
    owner.join().unwrap();
    drop(e);
    assert!(took < WITHIN, "the idle library reported the loss {took:?} after the SIGKILL");

    // Under I/O: a thread writes through the engine, waiting in the queue's own wait. Its I/O
    // fails a second after the loss, which ends it.
    let d = target();
    let fail_fast = Reconnect { fast_io_fail_tmo: Some(Duration::from_secs(1)), ..Reconnect::default() };
    let e = Arc::new(engine(&d, fail_fast));
    let counters = e.counters();
    let writer = {
        let e = Arc::clone(&e);
        std::thread::spawn(move || {
            let mut n = 0u64;
            while e.write_at(&[n as u8; 4096], (n % 1024) * 4096).is_ok() {
                n += 1;
            }
            n
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let took = kill_and_time(d, "library, under I/O", || counters.link_state() != LinkState::Connected);
    let writes = writer.join().unwrap();
    assert!(writes > 0, "the writer wrote nothing before the SIGKILL");
    assert!(took < WITHIN, "the library under I/O reported the loss {took:?} after the SIGKILL");
}

/// Whether the file at `path` has a line containing `needle`.
fn logged(path: &str, needle: &str) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| t.contains(needle))
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn rblk_attach_reports_a_sigkilled_target_while_idle() {
    no_ticks();
    ublk_drv();
    // A durable volume (its file in the guest's tmpfs), so the target's restart below serves
    // the same contents and the device may go on.
    let image = format!("/tmp/rblk-lost-ublk-{}.img", std::process::id());
    let spec = format!("v:16M:{image}");
    let args = ["--volume", spec.as_str()];
    let d = Daemon::start(&rdma(), &args);
    let addr = d.addr;
    let log = format!("/tmp/rblk-lost-ublk-{}.log", std::process::id());
    let _ = std::fs::remove_file(&log);
    // ctrl_loss_tmo bounds the detach's wait for a target that never comes back.
    let a = attach(&format!("rblk://{addr}/v"), &format!("--ctrl-loss-tmo 20 --log-file {log}"));
    std::thread::sleep(Duration::from_millis(300));
    let took = kill_and_time(d, "rblk attach (ublk), idle", || logged(&log, LOST));
    assert!(took < WITHIN, "rblk attach logged the loss {took:?} after the SIGKILL");
    // The event that reported the loss must leave the queue able to go on once the target is
    // back, also at a second loss (after a reconnect, when the session's first queue pair's
    // channel is watched too). Catches a loss taken from the event as the queue's own failure
    // (every later request then failed with EIO: seen at takeovers).
    let mut d = Daemon::start_at(addr, &args);
    for round in 0..2 {
        let read = Command::new("dd")
            .args([&format!("if={}", a.dev), "of=/dev/null", "bs=4k", "count=1", "iflag=direct"])
            .output()
            .expect("dd");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(read.status.success(), "a read after the target came back ({round}) failed: {read:?}\n{text}");
        assert!(!text.contains("fail with EIO"), "the queue gave up at the loss:\n{text}");
        if round == 0 {
            let before = text.matches(LOST).count();
            kill_and_time(d, "rblk attach (ublk), idle, again", || {
                std::fs::read_to_string(&log).unwrap_or_default().matches(LOST).count() > before
            });
            d = Daemon::start_at(addr, &args);
        }
    }
    detach(&a.dev);
    drop(d);
    let _ = std::fs::remove_file(&image);
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn rblk_nbd_reports_a_sigkilled_target_while_idle() {
    no_ticks();
    let d = target();
    let socket = std::env::temp_dir().join(format!("rblk-lost-nbd-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&socket);
    let mut nbd = Command::new(bin("rblk"))
        .args(["nbd", &format!("rblk://{}/v", d.addr), "--listen", &format!("unix:{}", socket.display())])
        .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rblk nbd");
    let (tx, rx) = mpsc::channel();
    let stderr = nbd.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[rblk nbd] {line}");
            let _ = tx.send(line);
        }
    });
    let mut listening = String::new();
    BufReader::new(nbd.stdout.take().unwrap()).read_line(&mut listening).unwrap();
    assert!(listening.starts_with("nbd+unix://"), "rblk nbd printed {listening:?}");
    // The client's session opens when it enters transmission (NBD_OPT_GO).
    let client = nbd_go(&socket);
    std::thread::sleep(Duration::from_millis(300));
    let seen = std::cell::Cell::new(false);
    let took = kill_and_time(d, "rblk nbd, idle", || {
        while let Ok(line) = rx.try_recv() {
            seen.set(seen.get() || line.contains(LOST));
        }
        seen.get()
    });
    drop(client);
    let _ = nbd.kill();
    let _ = nbd.wait();
    let _ = std::fs::remove_file(&socket);
    assert!(took < WITHIN, "rblk nbd logged the loss {took:?} after the SIGKILL");
}

/// An NBD client in transmission: the fixed newstyle greeting and NBD_OPT_GO for the default
/// export.
fn nbd_go(socket: &std::path::Path) -> UnixStream {
    let mut s = UnixStream::connect(socket).expect("connect to rblk nbd");
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).unwrap();
    assert_eq!(&greeting[..16], b"NBDMAGICIHAVEOPT");
    s.write_all(&3u32.to_be_bytes()).unwrap();
    let mut go = 0x4948_4156_454f_5054u64.to_be_bytes().to_vec();
    go.extend(7u32.to_be_bytes());
    go.extend(6u32.to_be_bytes());
    go.extend([0, 0, 0, 0, 0, 0]); // no name, no info request
    s.write_all(&go).unwrap();
    loop {
        let mut hdr = [0u8; 20];
        s.read_exact(&mut hdr).unwrap();
        let mut data = vec![0; u32::from_be_bytes(hdr[16..].try_into().unwrap()) as usize];
        s.read_exact(&mut data).unwrap();
        match u32::from_be_bytes(hdr[12..16].try_into().unwrap()) {
            1 => return s,
            3 => {}
            err => panic!("NBD_OPT_GO refused: {err:#x} {}", String::from_utf8_lossy(&data)),
        }
    }
}
