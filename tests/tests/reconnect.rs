//! Reconnect and replay (the session link under the engine) against the target in-process over
//! the in-memory fabric: restarts, crashes, fast failure and giving up, decided by the target's
//! volume identity. The same paths run over rxe in the guest in `recovery.rs`.
//!
//! What each would catch:
//! - `a_queue_pair_forced_into_error_is_replaced_without_failing_io`: replay. The writes the
//!   fault fails never reached the volume; without parking and posting them again on the new
//!   queue pair they fail, or read back as zeros.
//! - `a_severed_connection_is_replaced_without_failing_io`: the same when both ends of the queue
//!   pair fail and the target sees the disconnect (a link flap).
//! - `a_graceful_restart_is_invisible_to_io`: waiting while the target is down (I/O submitted
//!   then is parked, not failed) and the identity check letting a durable volume continue.
//! - `writes_around_a_graceful_restart_are_in_the_file_after_the_next_flush`: a write completed
//!   or replayed across three graceful restarts that the next FLUSH does not write back (the
//!   backing file is read while the target runs: only FLUSH writes it then).
//! - `a_restarted_ram_volume_fails_with_contents_lost`: the identity check; without it the new
//!   instance's zeros would be served as the old data.
//! - `a_crash_fails_the_next_flush_once`: the loss of unflushed writes on a new durable instance
//!   reaches the FLUSH that promised them, once; `a_crash_found_by_the_flush_itself_fails_it`
//!   when that FLUSH is what finds the crash (its own ranges are the loss).
//! - `fast_io_fail_fails_io_and_the_device_comes_back`: fast_io_fail_tmo fails I/O after its
//!   time (not before), reconnecting goes on, and a loss found after that is not reported again.
//! - `ctrl_loss_tmo_fails_waiting_io_after_the_timeout_not_before` and
//!   `ctrl_loss_tmo_0_fails_at_once`: giving up.
//! - `an_idle_session_keeps_its_connections`: initiator keepalives; without them the target
//!   (keepalive timeout 3 s) ends the idle connections and the session reconnects.
//! - `a_queue_of_a_session_the_target_reaped_reconnects_it`: a join refused because the target
//!   reaped the session (its idle first queue pair went silent) reconnects instead of failing.
//! - `a_dead_first_address_is_skipped`: multi-address URIs, for the session and its queues.
//!
//! A process taking over from one that died (`Session::take_over`, `rblk attach`'s ublk
//! recovery) follows the same rules:
//! - `a_successor_flushes_the_whole_volume_first`: the predecessor's dirty set died with it; a
//!   successor that started clean would answer the re-issued FLUSH with "nothing to flush"
//!   and only the target's RAM would hold what the filesystem took as durable.
//! - `a_successor_ends_its_predecessors_exclusive_session`: the OPEN resumes the dead session,
//!   so an exclusive open is not refused as busy until the target reaps it.
//! - `a_successor_of_a_lost_instance_fails`: a RAM volume's new instance fails every I/O; a
//!   durable volume's fails the first FLUSH.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use rblk_fabric::{Fabric, WcStatus};
use rblk_initiator::engine::{Data, IoOp, Lane, Request};
use rblk_initiator::{Continuity, Engine, Error, OpenMode, Options, Reconnect, Session};
use rblk_target::config::VolumeSpec;
use rblk_target::server::{Config, Running, Server};
use rblk_tests::workload::pattern;

const MIB: u64 = 1 << 20;
const PIECE: u64 = 16 << 10;

static PORT: AtomicU16 = AtomicU16::new(0);

/// A target in this process that can be stopped and started again on its address.
struct Target {
    cfg: Config,
    running: Option<Running>,
    dir: PathBuf,
}

impl Target {
    fn new(durable: bool, keepalive_timeout: Duration) -> Target {
        let port = 46000 + PORT.fetch_add(1, Ordering::Relaxed) + (std::process::id() % 500) as u16 * 20;
        let dir = std::env::temp_dir().join(format!("rblk-reconnect-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = durable.then(|| dir.join("v.img"));
        let cfg = Config {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
            volumes: vec![VolumeSpec { name: "v".into(), size: 4 * MIB, path }],
            fabric: Fabric::Mem,
            state_dir: Some(dir.join("state")),
            keepalive_timeout,
            ..Config::default()
        };
        let mut t = Target { cfg, running: None, dir };
        t.start();
        t
    }

    fn start(&mut self) {
        assert!(self.running.is_none());
        self.running = Some(Server::start(self.cfg.clone()).expect("start the target"));
    }

    /// A graceful stop: flushes, and a durable volume keeps its identity.
    fn stop(&mut self) {
        self.running.take().expect("running").shutdown();
    }

    /// As if the last run had crashed: its identity record is gone.
    fn forget_identity(&self) {
        let state = self.dir.join("state");
        for e in std::fs::read_dir(&state).unwrap() {
            std::fs::remove_file(e.unwrap().path()).unwrap();
        }
    }

    fn uri(&self) -> String {
        format!("rblk://{}/v", self.cfg.listen)
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        drop(self.running.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn policy(ctrl_loss: Option<Duration>, fast_fail: Option<Duration>) -> Reconnect {
    Reconnect {
        delay: Duration::from_millis(100),
        ctrl_loss_tmo: ctrl_loss,
        fast_io_fail_tmo: fast_fail,
        connect_timeout: Duration::ZERO,
    }
}

fn engine(t: &Target, reconnect: Reconnect) -> Engine {
    let opts = Options { fabric: Fabric::Mem, timeout: Duration::from_secs(2), reconnect, ..Options::default() };
    let vol = Session::connect(&t.uri(), &opts).unwrap().open(OpenMode::ReadWrite).unwrap();
    assert!(vol.can_reconnect(), "the target announces reconnect and the volume's identity");
    Engine::new(vol, 1).unwrap()
}

fn data(seed: u64, offset: u64, len: u64) -> Vec<u8> {
    let mut v = vec![0; len as usize];
    pattern(seed, offset, &mut v);
    v
}

/// Submits writes of `count` pieces from `at`, without waiting.
fn submit_writes(lane: &mut Lane, seed: u64, at: u64, count: u64) {
    for i in 0..count {
        let offset = at + i * PIECE;
        let r = Request {
            tag: i,
            op: IoOp::Write,
            offset,
            len: PIECE,
            fua: false,
            data: Data::Bytes(data(seed, offset, PIECE)),
        };
        lane.submit(r);
    }
}

/// Waits for `count` requests; returns their results.
fn finish(lane: &mut Lane, count: usize) -> Vec<rblk_initiator::Result<()>> {
    let mut out = Vec::new();
    while out.len() < count {
        lane.wait().unwrap();
        while let Some(f) = lane.next() {
            out.push(f.result);
        }
    }
    out
}

fn check(e: &Engine, seed: u64, at: u64, count: u64) {
    let mut got = vec![0; (count * PIECE) as usize];
    e.read_at(&mut got, at).unwrap();
    for i in 0..count {
        let offset = at + i * PIECE;
        let s = (i * PIECE) as usize;
        assert!(got[s..s + PIECE as usize] == data(seed, offset, PIECE)[..], "piece at {offset} differs");
    }
}

/// Issue 42, `--connect-timeout`: a first connect to a target that does not listen yet keeps
/// trying until it does (here 1.5 s late) and opens; without it, the first connect fails at once;
/// a refusal (a key the target wants and the client lacks) ends the wait at once however long
/// the timeout. Catches a connect that does not retry, one that gives up early, and one that
/// retries an answer as if it were silence.
#[test]
fn a_first_connect_waits_for_a_target_that_starts_late_but_not_for_a_refusal() {
    let mut t = Target::new(false, rblk_proto::KEEPALIVE_TIMEOUT);
    t.stop();
    let uri = t.uri();
    let patient = Reconnect { connect_timeout: Duration::from_secs(20), ..Reconnect::default() };
    let opts =
        |reconnect| Options { fabric: Fabric::Mem, timeout: Duration::from_secs(2), reconnect, ..Options::default() };
    let started = Instant::now();
    let Err(err) = Session::connect(&uri, &opts(Reconnect::default())) else { panic!("connected to no target") };
    assert!(matches!(err, Error::Connect { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(1), "one attempt: {:?}", started.elapsed());

    let waiting = {
        let (uri, opts) = (uri.clone(), opts(patient));
        std::thread::spawn(move || {
            let started = Instant::now();
            let vol = Session::connect(&uri, &opts).and_then(|s| s.open(OpenMode::ReadOnly));
            (vol.map(|v| v.size()), started.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(1500));
    t.start();
    let (size, took) = waiting.join().unwrap();
    assert_eq!(size.expect("opened once the target listened"), 4 * MIB);
    assert!(took >= Duration::from_millis(1500) && took < Duration::from_secs(10), "took {took:?}");

    // A target with a key, a client without one: the refusal is an answer.
    let keyed = Config {
        listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), t.cfg.listen.port() + 1),
        key: Some(b"0123456789abcdef0123456789abcdef".to_vec()),
        ..t.cfg.clone()
    };
    let keyed = Server::start(Config { state_dir: None, ..keyed }).expect("a keyed target");
    let started = Instant::now();
    let Err(err) = Session::connect(&format!("rblk://{}/v", keyed.local_addr()), &opts(patient)) else {
        panic!("connected without the key")
    };
    assert!(matches!(err, Error::Auth { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5), "a refusal waited: {:?}", started.elapsed());
    keyed.shutdown();
}

#[test]
fn a_queue_pair_forced_into_error_is_replaced_without_failing_io() {
    let t = Target::new(true, rblk_proto::KEEPALIVE_TIMEOUT);
    let e = engine(&t, policy(Some(Duration::from_secs(30)), None));
    let mut lane = e.lane(8, PIECE as usize).unwrap();
    // The next two work requests on the lane's queue pair fail as if the peer stopped answering.
    rblk_fabric::mem::fail_next(lane.qp_num(), 2, WcStatus::RETRY_EXC_ERR);
    submit_writes(&mut lane, 1, 0, 16);
    for r in finish(&mut lane, 16) {
        r.expect("a write across a replaced queue pair");
    }
    assert_eq!(e.reconnects(), 1, "the session reconnected once");
    check(&e, 1, 0, 16);
    e.flush().expect("flush after the reconnect");
}

#[test]
fn a_severed_connection_is_replaced_without_failing_io() {
    let t = Target::new(false, rblk_proto::KEEPALIVE_TIMEOUT);
    let e = engine(&t, policy(Some(Duration::from_secs(30)), None));
    let mut lane = e.lane(8, PIECE as usize).unwrap();
    // Both ends of the lane's queue pair go to error, and the target sees the disconnect.
    rblk_fabric::mem::sever(lane.qp_num());
    submit_writes(&mut lane, 11, 0, 16);
    for r in finish(&mut lane, 16) {
        r.expect("a write across a severed connection");
    }
    assert_eq!(e.reconnects(), 1);
    check(&e, 11, 0, 16);
}

#[test]
fn a_graceful_restart_is_invisible_to_io() {
    let mut t = Target::new(true, rblk_proto::KEEPALIVE_TIMEOUT);
    let e = engine(&t, policy(Some(Duration::from_secs(30)), None));
    let mut lane = e.lane(8, PIECE as usize).unwrap();
    submit_writes(&mut lane, 2, 0, 8);
    finish(&mut lane, 8).into_iter().for_each(|r| r.unwrap());
    t.stop();
    // Submitted while the target is down: parked, not failed.
    submit_writes(&mut lane, 3, MIB, 8);
    let restart = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        t.start();
        t
    });
    let started = Instant::now();
    for r in finish(&mut lane, 8) {
        r.expect("a write submitted while the target was down");
    }
    assert!(started.elapsed() >= Duration::from_millis(400), "the writes waited for the target");
    let _t = restart.join().unwrap();
    assert_eq!(e.reconnects(), 1);
    check(&e, 2, 0, 8);
    check(&e, 3, MIB, 8);
    e.flush().expect("nothing was lost");
}

#[test]
fn a_restarted_ram_volume_fails_with_contents_lost() {
    let mut t = Target::new(false, rblk_proto::KEEPALIVE_TIMEOUT);
    let e = engine(&t, policy(Some(Duration::from_secs(30)), None));
    e.write_at(&data(4, 0, PIECE), 0).unwrap();
    t.stop();
    t.start();
    let mut back = vec![0xee; PIECE as usize];
    let err = e.read_at(&mut back, 0).expect_err("a read of a volume whose contents are gone");
    assert!(err.to_string().contains("volume contents lost"), "{err}");
    assert_eq!(err.errno(), 5, "EIO");
    assert!(back.iter().all(|&b| b == 0xee), "nothing of the new, empty volume was served");
    assert_eq!(e.reconnects(), 0);
}

#[test]
fn a_crash_fails_the_next_flush_once() {
    let mut t = Target::new(true, rblk_proto::KEEPALIVE_TIMEOUT);
    let e = engine(&t, policy(Some(Duration::from_secs(30)), None));
    e.write_at(&data(5, 0, PIECE), 0).unwrap();
    e.flush().unwrap();
    e.write_at(&data(6, MIB, 2 * PIECE), MIB).unwrap();
    t.stop();
    t.forget_identity();
    t.start();
    // The next I/O reconnects to a new instance: the unflushed 32 KiB are gone.
    let mut back = vec![0; PIECE as usize];
    e.read_at(&mut back, 0).unwrap();
    assert_eq!(back, data(5, 0, PIECE));
    let err = e.flush().expect_err("the flush that promised the lost writes");
    assert!(matches!(err, Error::WritesLost { bytes: Some(b), .. } if b == 2 * PIECE), "{err}");
    assert_eq!(err.errno(), 5, "EIO");
    e.flush().expect("the loss is reported once");
    assert_eq!(e.unflushed_bytes(), Some(0));
}

#[test]
fn a_crash_found_by_the_flush_itself_fails_it() {
    // The FLUSH is the first I/O after the crash: it has already taken the dirty ranges when its
    // reconnect finds the new instance, and those ranges are the loss.
    let mut t = Target::new(true, rblk_proto::KEEPALIVE_TIMEOUT);
    let e = engine(&t, policy(Some(Duration::from_secs(30)), None));
    e.write_at(&data(12, 0, PIECE), 0).unwrap();
    t.stop();
    t.forget_identity();
    t.start();
    let err = e.flush().expect_err("the flush that finds the crash");
    assert!(matches!(err, Error::WritesLost { bytes: Some(b), .. } if b == PIECE), "{err}");
    assert_eq!(e.unflushed_bytes(), Some(0), "the lost ranges are forgotten, not flushed again");
    e.flush().expect("reported once");
}

#[test]
fn fast_io_fail_fails_io_and_the_device_comes_back() {
    let mut t = Target::new(true, rblk_proto::KEEPALIVE_TIMEOUT);
    let e = engine(&t, policy(Some(Duration::from_secs(60)), Some(Duration::from_secs(1))));
    e.write_at(&data(7, 0, PIECE), 0).unwrap();
    t.stop();
    t.forget_identity();
    let started = Instant::now();
    let mut back = vec![0; PIECE as usize];
    let err = e.read_at(&mut back, 0).expect_err("I/O fails after fast_io_fail_tmo");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(10), "failed after {took:?}");
    assert!(err.to_string().contains("fast_io_fail_tmo"), "{err}");
    assert_eq!(err.errno(), 5);
    // Failing now is immediate.
    let again = Instant::now();
    e.read_at(&mut back, 0).expect_err("still no target");
    assert!(again.elapsed() < Duration::from_millis(500));
    t.start();
    // The same engine works again once the session is back (a due reconnect runs on the call).
    let deadline = Instant::now() + Duration::from_secs(10);
    while e.read_at(&mut back, 0).is_err() {
        assert!(Instant::now() < deadline, "the session did not come back");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(back, data(7, 0, PIECE));
    assert_eq!(e.reconnects(), 1);
    // The write lost in the "crash" was already reported by failed I/O (md re-adds the leg).
    e.flush().expect("a loss already reported by fast_io_fail does not fail the flush");
}

#[test]
fn ctrl_loss_tmo_fails_waiting_io_after_the_timeout_not_before() {
    let mut t = Target::new(true, rblk_proto::KEEPALIVE_TIMEOUT);
    let e = engine(&t, policy(Some(Duration::from_secs(2)), None));
    e.write_at(&data(8, 0, PIECE), 0).unwrap();
    t.stop();
    let started = Instant::now();
    let mut back = vec![0; PIECE as usize];
    let err = e.read_at(&mut back, 0).expect_err("the session gives up");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(1900) && took < Duration::from_secs(10), "gave up after {took:?}");
    assert!(err.to_string().contains("ctrl_loss_tmo"), "{err}");
    t.start();
    std::thread::sleep(Duration::from_millis(300));
    e.read_at(&mut back, 0).expect_err("a session that gave up stays gone");
    // Closing does not hang on a gone session.
    let closing = Instant::now();
    let _ = e.close();
    assert!(closing.elapsed() < Duration::from_secs(2));
}

#[test]
fn ctrl_loss_tmo_0_fails_at_once() {
    let mut t = Target::new(true, rblk_proto::KEEPALIVE_TIMEOUT);
    let opts = Options { fabric: Fabric::Mem, reconnect: Reconnect::NEVER, ..Options::default() };
    let vol = Session::connect(&t.uri(), &opts).unwrap().open(OpenMode::ReadWrite).unwrap();
    assert!(!vol.can_reconnect());
    let e = Engine::new(vol, 1).unwrap();
    t.stop();
    t.start();
    let started = Instant::now();
    let mut back = vec![0; PIECE as usize];
    e.read_at(&mut back, 0).expect_err("no reconnect");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(e.reconnects(), 0);
}

#[test]
fn an_idle_session_keeps_its_connections() {
    let t = Target::new(false, Duration::from_secs(3));
    let e = engine(&t, policy(Some(Duration::from_secs(30)), None));
    let mut lane = e.lane(4, PIECE as usize).unwrap();
    e.write_at(&data(9, 0, PIECE), 0).unwrap();
    // Idle for more than twice the target's keepalive timeout, with the housekeeping a front
    // end runs (a tick a second on each lane and on the engine).
    let until = Instant::now() + Duration::from_secs(7);
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(500));
        lane.tick().unwrap();
        e.tick().unwrap();
    }
    assert_eq!(e.reconnects(), 0, "the target kept every connection of the idle session");
    let mut back = vec![0; PIECE as usize];
    lane.read_at(&mut back, 0).unwrap();
    e.read_at(&mut back, 0).unwrap();
    assert_eq!(back, data(9, 0, PIECE));
}

#[test]
fn a_queue_of_a_session_the_target_reaped_reconnects_it() {
    // Nobody ticks the volume: its first queue pair goes silent, the target (keepalive timeout
    // 3 s) cuts it and, with no other connection, reaps the session. Opening a queue then finds
    // the session gone; it must reconnect rather than fail (the join is refused otherwise).
    let t = Target::new(false, Duration::from_secs(3));
    let opts = Options { fabric: Fabric::Mem, timeout: Duration::from_secs(2), ..Options::default() };
    let vol = Session::connect(&t.uri(), &opts).unwrap().open(OpenMode::ReadWrite).unwrap();
    std::thread::sleep(Duration::from_secs(5));
    let mut q = vol.queue_with(4, PIECE as usize).expect("a queue of a reaped session");
    q.submit_write(0, &data(13, 0, PIECE), 1).unwrap();
    let mut done: Vec<rblk_initiator::Done> = std::iter::repeat_with(Default::default).take(4).collect();
    let n = q.wait(&mut done, Instant::now() + Duration::from_secs(10)).unwrap();
    assert_eq!(n, 1);
    done[0].result.as_ref().expect("the write on the new session");
    assert_eq!(vol.reconnects(), 1);
}

#[test]
fn a_dead_first_address_is_skipped() {
    let t = Target::new(false, rblk_proto::KEEPALIVE_TIMEOUT);
    // Nothing listens on port 1 of the in-memory fabric.
    let uri = format!("rblk://127.0.0.1:1,{}/v", t.cfg.listen);
    let opts = Options { fabric: Fabric::Mem, ..Options::default() };
    let vol = Session::connect(&uri, &opts).unwrap().open(OpenMode::ReadWrite).unwrap();
    assert_eq!(vol.addr(), t.cfg.listen);
    let e = Engine::new(vol, 2).unwrap();
    let mut lane = e.lane(4, PIECE as usize).unwrap();
    lane.write_at(&data(10, 0, PIECE), 0, false).unwrap();
    let mut back = vec![0; PIECE as usize];
    e.read_at(&mut back, 0).unwrap();
    assert_eq!(back, data(10, 0, PIECE));
}

fn opts(reconnect: Reconnect) -> Options {
    Options { fabric: Fabric::Mem, timeout: Duration::from_secs(2), reconnect, ..Options::default() }
}

/// A predecessor's session (open, wrote `len` bytes at 0 without flushing) and what it knew.
fn predecessor(t: &Target, mode: OpenMode, len: u64) -> (rblk_initiator::Volume, rblk_initiator::Predecessor) {
    let mut vol = Session::connect(&t.uri(), &opts(policy(None, None))).unwrap().open(mode).unwrap();
    if len > 0 {
        vol.write_at(&data(20, 0, len), 0).unwrap();
    }
    let prev = vol.predecessor();
    (vol, prev)
}

#[test]
fn a_successor_flushes_the_whole_volume_first() {
    let t = Target::new(true, rblk_proto::KEEPALIVE_TIMEOUT);
    let (dead, prev) = predecessor(&t, OpenMode::ReadWrite, PIECE);
    // The predecessor dies with its dirty set (its session is left for the successor to end).
    std::mem::forget(dead);
    let base = t.running.as_ref().unwrap().written_back_bytes();
    let session = Session::connect(&t.uri(), &opts(policy(None, None))).unwrap();
    let (mut vol, verdict) = session.take_over(OpenMode::ReadWrite, &prev).unwrap();
    assert_eq!(verdict, Continuity::Same);
    vol.flush().unwrap();
    let written = t.running.as_ref().unwrap().written_back_bytes() - base;
    assert_eq!(written, 4 * MIB, "the first FLUSH wrote the whole volume back");
    vol.flush().unwrap();
    assert_eq!(t.running.as_ref().unwrap().written_back_bytes() - base, 4 * MIB, "then nothing is dirty");
    let mut back = vec![0; PIECE as usize];
    vol.read_at(&mut back, 0).unwrap();
    assert_eq!(back, data(20, 0, PIECE));
}

#[test]
fn a_successor_ends_its_predecessors_exclusive_session() {
    let t = Target::new(false, rblk_proto::KEEPALIVE_TIMEOUT);
    let (dead, prev) = predecessor(&t, OpenMode::Exclusive, 0);
    std::mem::forget(dead);
    let o = opts(policy(None, None));
    let busy = Session::connect(&t.uri(), &o).unwrap().open(OpenMode::Exclusive);
    assert!(busy.is_err(), "the dead session still holds the volume");
    let (mut vol, verdict) = Session::connect(&t.uri(), &o).unwrap().take_over(OpenMode::Exclusive, &prev).unwrap();
    assert_eq!(verdict, Continuity::Same);
    vol.write_at(&data(21, 0, PIECE), 0).unwrap();
}

#[test]
fn a_successor_of_a_lost_instance_fails() {
    // RAM: the target restarted, its volume is new and empty.
    let mut t = Target::new(false, rblk_proto::KEEPALIVE_TIMEOUT);
    let (dead, prev) = predecessor(&t, OpenMode::ReadWrite, PIECE);
    drop(dead);
    t.stop();
    t.start();
    let o = opts(policy(None, None));
    let (mut vol, verdict) = Session::connect(&t.uri(), &o).unwrap().take_over(OpenMode::ReadWrite, &prev).unwrap();
    assert!(matches!(&verdict, Continuity::Refused(r) if r.contains("volume contents lost")), "{verdict:?}");
    let mut back = vec![0xee; PIECE as usize];
    let err = vol.read_at(&mut back, 0).expect_err("a read of a volume whose contents are gone");
    assert!(err.to_string().contains("volume contents lost"), "{err}");
    assert!(back.iter().all(|&b| b == 0xee), "nothing of the new, empty volume was served");
    // Durable: a crash made a new instance; what was not flushed is gone.
    let mut t = Target::new(true, rblk_proto::KEEPALIVE_TIMEOUT);
    let (dead, prev) = predecessor(&t, OpenMode::ReadWrite, PIECE);
    drop(dead);
    t.stop();
    t.forget_identity();
    t.start();
    let (mut vol, verdict) = Session::connect(&t.uri(), &o).unwrap().take_over(OpenMode::ReadWrite, &prev).unwrap();
    assert_eq!(verdict, Continuity::WritesLost);
    let err = vol.flush().expect_err("the first FLUSH after the lost writes");
    assert!(matches!(err, Error::WritesLost { .. }), "{err}");
    vol.flush().expect("reported once");
}

/// Catches a write lost for durability around a graceful restart: one that completed (or was
/// replayed) while the target went down and came back, and that the next FLUSH then did not
/// write back. After that FLUSH the backing file must hold every piece's last write, read
/// straight from the file while the target still runs (nothing but FLUSH writes it then).
#[test]
fn writes_around_a_graceful_restart_are_in_the_file_after_the_next_flush() {
    let t = Target::new(true, rblk_proto::KEEPALIVE_TIMEOUT);
    let e = engine(&t, policy(Some(Duration::from_secs(30)), None));
    let mut lane = e.lane(8, PIECE as usize).unwrap();
    let pieces = 4 * MIB / PIECE;
    let mut model = vec![0u64; pieces as usize];
    let path = t.dir.join("v.img");
    let t = std::sync::Arc::new(std::sync::Mutex::new(t));
    let restarter = {
        let t = std::sync::Arc::clone(&t);
        std::thread::spawn(move || {
            for _ in 0..3 {
                std::thread::sleep(Duration::from_millis(40));
                t.lock().unwrap().stop();
                std::thread::sleep(Duration::from_millis(60));
                t.lock().unwrap().start();
            }
        })
    };
    let mut round = 0u64;
    let mut after = 0;
    while after < 20 {
        round += 1;
        if restarter.is_finished() {
            after += 1;
        }
        for i in 0..8 {
            let piece = (round * 8 + i + round / 3) % pieces;
            let offset = piece * PIECE;
            lane.submit(Request {
                tag: i,
                op: IoOp::Write,
                offset,
                len: PIECE,
                fua: false,
                data: Data::Bytes(data(round, offset, PIECE)),
            });
        }
        for r in finish(&mut lane, 8) {
            r.expect("a write across graceful restarts");
        }
        for i in 0..8 {
            model[((round * 8 + i + round / 3) % pieces) as usize] = round;
        }
    }
    restarter.join().unwrap();
    assert!(e.reconnects() >= 3, "the session reconnected at each restart");
    e.flush().expect("the flush after the restarts");
    let file = std::fs::read(&path).unwrap();
    let mut wrong = Vec::new();
    for (piece, &seed) in model.iter().enumerate() {
        if seed == 0 {
            continue;
        }
        let offset = piece as u64 * PIECE;
        if file[offset as usize..(offset + PIECE) as usize] != data(seed, offset, PIECE)[..] {
            wrong.push(piece);
        }
    }
    assert!(wrong.is_empty(), "pieces not in the file after the FLUSH: {wrong:?}");
}
