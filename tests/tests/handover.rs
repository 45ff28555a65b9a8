//! A target handing its volumes to a successor (`rblk-target --takeover`, `rblk-target admin
//! handover` through systemd's fd store), with both servers in this process over the in-memory
//! fabric and an initiator engine that keeps writing across it; and between two daemon
//! processes over rxe in the guest (`guest::*`): `rblk attach` under fio verify across three
//! takeovers by a copy of the binary, and a durable volume's write-back and crash after one.
//!
//! What each would catch:
//! - `mem_a_takeover_keeps_a_ram_volume_and_its_instance`: the successor serving fresh memory,
//!   or a new instance (the engine's reconnect would find "contents lost" and fail), or an old
//!   daemon that keeps its port (the successor's bind fails).
//! - `mem_a_durable_volume_writes_back_only_what_is_dirty_after_a_takeover`: a successor that
//!   loads or writes back the whole volume, or loses the written state (its final flush would
//!   skip the volume: `written` travelled as false).
//! - `mem_a_takeover_adds_and_removes_volumes_as_a_reload_does`: volumes only in the new
//!   configuration created, those only in the old one removed (a durable one written back).
//! - `mem_unflushed_writes_reach_the_file_at_the_successors_stop`: the written state lost on
//!   the way (the successor's stop would skip a volume nobody flushed).
//! - `mem_a_changed_size_is_refused_and_the_old_daemon_serves_on`: a successor serving a volume
//!   at another size, and an old daemon that stays deaf (port closed, write-backs held) after a
//!   refusal: the FLUSH after it would hang.
//! - `mem_a_successor_that_dies_before_ready_changes_nothing`: the same when the successor
//!   vanishes with the descriptors before it said ready.
//! - `mem_a_successor_whose_old_daemon_vanishes_before_bye_refuses`: a successor that serves
//!   after its old daemon died mid-handover (half-serving what nobody can vouch for).
//! - `mem_an_unknown_state_format_is_refused_on_both_sides`: a successor that reads a format it
//!   does not know, and an old daemon that hands over one its successor cannot read.
//! - `mem_a_handover_through_the_fd_store`: the systemd path: descriptors under their names, the
//!   state record last, the exit status systemd restarts on, and the successor taking them from
//!   `LISTEN_FDS` (emulated: the names and descriptors the sink got).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rblk_fabric::Fabric;
use rblk_initiator::{Engine, OpenMode, Options, Reconnect, Session};
use rblk_target::config::VolumeSpec;
use rblk_target::handover::{Handed, HandoverError, EXIT_HANDED_OVER, STATE_FDNAME};
use rblk_target::server::{Config, Running, Server};
use rblk_target::start::StartError;
use rblk_tests::workload::pattern;

const MIB: u64 = 1 << 20;
const PIECE: u64 = 16 << 10;

static PORT: AtomicU16 = AtomicU16::new(0);

/// A temp dir, an address and a config for one test.
struct Setup {
    cfg: Config,
    dir: PathBuf,
}

impl Setup {
    fn new(durable: bool) -> Setup {
        let port = 47000 + PORT.fetch_add(1, Ordering::Relaxed) + (std::process::id() % 500) as u16 * 20;
        let dir = std::env::temp_dir().join(format!("rblk-handover-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = durable.then(|| dir.join("v.img"));
        let cfg = Config {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
            volumes: vec![VolumeSpec { name: "v".into(), size: 4 * MIB, path }],
            fabric: Fabric::Mem,
            state_dir: Some(dir.join("state")),
            admin_socket: Some(dir.join("admin.sock")),
            ..Config::default()
        };
        Setup { cfg, dir }
    }

    fn engine(&self) -> Engine {
        let reconnect = Reconnect {
            delay: Duration::from_millis(50),
            ctrl_loss_tmo: Some(Duration::from_secs(30)),
            fast_io_fail_tmo: None,
            connect_timeout: Duration::ZERO,
        };
        let opts = Options { fabric: Fabric::Mem, timeout: Duration::from_secs(2), reconnect, ..Options::default() };
        let uri = format!("rblk://{}/v", self.cfg.listen);
        let vol = Session::connect(&uri, &opts).unwrap().open(OpenMode::ReadWrite).unwrap();
        Engine::new(vol, 1).unwrap()
    }

    fn socket(&self) -> PathBuf {
        self.cfg.admin_socket.clone().unwrap()
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn data(seed: u64, offset: u64, len: u64) -> Vec<u8> {
    let mut v = vec![0; len as usize];
    pattern(seed, offset, &mut v);
    v
}

fn write(e: &Engine, seed: u64, at: u64, count: u64) {
    for i in 0..count {
        let offset = at + i * PIECE;
        e.write_at(&data(seed, offset, PIECE), offset).expect("write");
    }
}

fn check(e: &Engine, seed: u64, at: u64, count: u64) {
    let mut got = vec![0; (count * PIECE) as usize];
    e.read_at(&mut got, at).expect("read");
    for i in 0..count {
        let offset = at + i * PIECE;
        let s = (i * PIECE) as usize;
        assert!(got[s..s + PIECE as usize] == data(seed, offset, PIECE)[..], "piece at {offset} differs");
    }
}

/// `--takeover` as the daemon does it: asks `old`'s admin socket, takes over with `cfg`, and
/// once `old` handed over, stops it (the old daemon's exit) and finishes.
fn take_over(old: Running, cfg: Config) -> Result<Running, Box<(StartError, Running)>> {
    let socket = cfg.admin_socket.clone().unwrap();
    let path = socket.clone();
    let successor = std::thread::spawn(move || {
        let handed = Handed::request(&socket)?;
        Server::take_over(cfg, handed, &mut |_| {})
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while old.handed_over().is_none() && !successor.is_finished() {
        assert!(Instant::now() < deadline, "neither a handover nor an error within 30 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    let new = if old.handed_over().is_some() {
        assert_eq!(old.handed_over(), Some(0), "--takeover: the old daemon exits 0");
        old.shutdown();
        // The old daemon leaves its socket file for the successor to replace. Catches an old
        // daemon that removes it at exit: racing the successor's replacement, that removal
        // can take the successor's socket away (seen in CI: the next takeover found no daemon).
        assert!(std::fs::symlink_metadata(&path).is_ok(), "the old daemon removed the admin socket it handed over");
        successor.join().unwrap().expect("the successor serves")
    } else {
        return Err(Box::new((successor.join().unwrap().expect_err("no handover, so an error"), old)));
    };
    let mut new = new;
    assert!(new.finish_takeover().is_empty(), "nothing in an fd store");
    Ok(new)
}

/// scripts/lib/test_handover.py: the unit tests of scripts/handover-rxe.sh's analysis (its
/// log parsing, the longest gap, the goals of issue 42), on recorded lines.
#[test]
fn the_handover_scripts_analysis() {
    rblk_tests::python_unittest("test_handover");
}

#[test]
fn mem_a_takeover_keeps_a_ram_volume_and_its_instance() {
    let s = Setup::new(false);
    let old = Server::start(s.cfg.clone()).unwrap();
    let e = s.engine();
    write(&e, 1, 0, 16);
    let new = take_over(old, s.cfg.clone()).map_err(|b| b.0).expect("takeover");
    // The engine's next I/O finds its connection gone, reconnects to the successor, finds the
    // same instance and goes on.
    write(&e, 2, 16 * PIECE, 16);
    check(&e, 1, 0, 16);
    check(&e, 2, 16 * PIECE, 16);
    assert!(e.reconnects() >= 1, "the engine reconnected to the successor");
    assert_eq!(new.volumes(), vec!["v".to_owned()]);
    assert!(new.admin_socket().is_some(), "the successor serves the admin socket once the old one is gone");
    let list = rblk_target::admin::request(&s.socket(), &rblk_target::admin::Request::List).unwrap();
    assert_eq!(list.volumes.unwrap()[0].sessions, 1, "the engine's session is the successor's now");
    // A second takeover, of the successor.
    let third = take_over(new, s.cfg.clone()).map_err(|b| b.0).expect("a second takeover");
    write(&e, 3, 32 * PIECE, 4);
    check(&e, 1, 0, 16);
    check(&e, 3, 32 * PIECE, 4);
    drop(e);
    third.shutdown();
}

/// Issue 42, register before `bye`: the successor registers each handed volume that the old
/// daemon had registered for memory windows, on the same device, before it says ready, so the
/// first OPEN after the takeover pins nothing (the pause the initiators see holds nothing that
/// grows with size); a volume nobody opened stays unregistered (nothing pinned for it), and a
/// successor with memory windows off registers nothing ahead (each session's own PD, at its
/// OPEN). Catches a successor that registers at the first OPEN again (the registration count
/// is 0 right after the takeover), one that pins every volume, and one that registers in a
/// window domain it does not use.
#[test]
fn mem_a_successor_registers_the_opened_volumes_before_it_is_ready() {
    let mut s = Setup::new(false);
    s.cfg.volumes.push(VolumeSpec { name: "idle".into(), size: 8 * MIB, path: None });
    let old = Server::start(s.cfg.clone()).unwrap();
    let e = s.engine();
    write(&e, 1, 0, 4);
    assert_eq!(old.registrations(), (1, 4 * MIB), "the old daemon registered the opened volume once");
    let new = take_over(old, s.cfg.clone()).map_err(|b| b.0).expect("takeover");
    assert_eq!(new.registrations(), (1, 4 * MIB), "registered ahead, before any OPEN; the idle volume not");
    write(&e, 2, 4 * PIECE, 4);
    check(&e, 1, 0, 4);
    assert!(e.reconnects() >= 1, "the engine reconnected to the successor");
    assert_eq!(new.registrations(), (1, 4 * MIB), "the OPEN after the takeover found the registration made");
    // Windows off in the next successor: nothing registered ahead; the OPEN registers in the
    // session's own PD.
    let mut off = s.cfg.clone();
    off.memory_windows = false;
    let third = take_over(new, off).map_err(|b| b.0).expect("a takeover by a successor without windows");
    assert_eq!(third.registrations(), (0, 0), "no window domain: nothing registered ahead");
    check(&e, 2, 4 * PIECE, 4);
    assert_eq!(third.registrations(), (1, 4 * MIB), "the OPEN registered it in its own PD");
    drop(e);
    third.shutdown();
}

/// Catches a successor that serves only what it was handed (a volume new in its configuration
/// missing), one that drops a handed volume its configuration lacks without `confirm_remove`
/// (the loss of issue 39: its contents gone) or keeps serving one it confirmed dropping, and a
/// removed durable volume whose unflushed writes are not written back at its removal (a
/// reload's rule).
#[test]
fn mem_a_takeover_adds_and_removes_volumes_as_a_reload_does() {
    let s = Setup::new(false);
    let mut old_cfg = s.cfg.clone();
    let gone = s.dir.join("gone.img");
    old_cfg.volumes.push(VolumeSpec { name: "gone".into(), size: MIB, path: Some(gone.clone()) });
    let old = Server::start(old_cfg).unwrap();
    let opts = Options { fabric: Fabric::Mem, timeout: Duration::from_secs(2), ..Options::default() };
    let mut v =
        Session::connect(&format!("rblk://{}/gone", s.cfg.listen), &opts).unwrap().open(OpenMode::ReadWrite).unwrap();
    v.write_at(&data(9, 0, PIECE), 0).unwrap();
    drop(v);
    let mut new_cfg = s.cfg.clone();
    new_cfg.volumes.push(VolumeSpec { name: "added".into(), size: MIB, path: None });
    let (err, old) = *take_over(old, new_cfg.clone()).expect_err("dropping a volume unconfirmed is refused");
    let text = rblk_fabric::Chain(&err).to_string();
    assert!(text.contains("volume gone is not in the configuration") && text.contains("confirm_remove"), "{text}");
    new_cfg.confirm_remove = vec!["gone".into()];
    let new = take_over(old, new_cfg).map_err(|b| b.0).expect("takeover");
    assert_eq!(new.volumes(), vec!["added".to_owned(), "v".to_owned()]);
    let file = std::fs::read(&gone).unwrap();
    assert!(file[..PIECE as usize] == data(9, 0, PIECE)[..], "the removed volume was written back at its removal");
    new.shutdown();
}

#[test]
fn mem_a_durable_volume_writes_back_only_what_is_dirty_after_a_takeover() {
    let s = Setup::new(true);
    let old = Server::start(s.cfg.clone()).unwrap();
    let e = s.engine();
    write(&e, 1, 0, 64);
    e.flush().expect("a flush before");
    write(&e, 2, 0, 2);
    assert!(old.written_back_bytes() == 64 * PIECE, "{}", old.written_back_bytes());
    let new = take_over(old, s.cfg.clone()).map_err(|b| b.0).expect("takeover");
    assert_eq!(new.written_back_bytes(), 0, "a takeover reads and writes nothing");
    assert!(!e.flush().expect("the flush after the takeover"), "durable");
    assert_eq!(new.written_back_bytes(), 2 * PIECE, "the first FLUSH writes exactly the dirty pieces");
    // A graceful stop of the successor writes the volume back whole (it was written since
    // its load): the file holds everything.
    drop(e);
    new.shutdown();
    let file = std::fs::read(s.cfg.volumes[0].path.as_ref().unwrap()).unwrap();
    let piece = |i: u64| &file[(i * PIECE) as usize..((i + 1) * PIECE) as usize];
    for i in 0..64 {
        let seed = if i < 2 { 2 } else { 1 };
        assert!(piece(i) == &data(seed, i * PIECE, PIECE)[..], "piece {i} of the backing file");
    }
}

/// Issue 41: a discard gives a durable volume's blocks back at once (its pass punches the file),
/// and they stay given back through a FLUSH, a takeover and the successor's clean stop (a final
/// flush of the whole volume), and a start and stop again with a writer. Catches a final flush
/// or write-back that fills the hole with zeros again (`stat`'s blocks come back), a successor
/// or restart that does not find the holes in the file, and a discard whose range does not read
/// as zeros or whose neighbours changed.
#[test]
fn mem_a_discarded_range_stays_unallocated_through_a_takeover_and_a_restart() {
    use std::os::unix::fs::MetadataExt as _;
    let s = Setup::new(true);
    let path = s.cfg.volumes[0].path.clone().unwrap();
    let blocks = || std::fs::metadata(&path).unwrap().blocks() * 512;
    let old = Server::start(s.cfg.clone()).unwrap();
    let e = s.engine();
    assert!(e.discards(), "the in-memory target zeroes ranges itself");
    write(&e, 3, 0, 256);
    e.flush().expect("flush");
    let full = blocks();
    assert!(full >= 4 * MIB, "the file holds the volume: {full} bytes allocated");
    e.discard(MIB, 2 * MIB).expect("discard");
    let freed = full - blocks();
    assert!(freed >= 2 * MIB * 9 / 10, "the discard's pass punched {freed} of 2 MiB");
    let mut zeros = vec![1u8; (2 * MIB) as usize];
    e.read_at(&mut zeros, MIB).unwrap();
    assert!(zeros.iter().all(|&b| b == 0), "the discarded range reads zeros");
    check(&e, 3, 0, 64);
    check(&e, 3, 3 * MIB, 64);
    e.flush().expect("a flush after");
    let new = take_over(old, s.cfg.clone()).map_err(|b| b.0).expect("takeover");
    drop(e);
    new.shutdown();
    assert_eq!(full - blocks(), freed, "the successor's final flush filled the hole");
    // A start, a writer (so the stop writes back the whole volume), a stop.
    let again = Server::start(s.cfg.clone()).unwrap();
    let e = s.engine();
    write(&e, 4, 0, 1);
    drop(e);
    again.shutdown();
    assert_eq!(full - blocks(), freed, "a restart's final flush filled the hole");
}

/// Catches the written state lost on the way (sent as false, or not sent): the successor's
/// stop would skip the volume, and writes nobody flushed, made before the handover by an
/// initiator that then went away, would never reach the backing store.
#[test]
fn mem_unflushed_writes_reach_the_file_at_the_successors_stop() {
    let s = Setup::new(true);
    let old = Server::start(s.cfg.clone()).unwrap();
    let e = s.engine();
    write(&e, 7, 0, 2);
    drop(e);
    let new = take_over(old, s.cfg.clone()).map_err(|b| b.0).expect("takeover");
    new.shutdown();
    let file = std::fs::read(s.cfg.volumes[0].path.as_ref().unwrap()).unwrap();
    assert!(file[..PIECE as usize] == data(7, 0, PIECE)[..], "the successor's stop did not write the volume back");
}

/// Catches a shrink taken over (the successor would map less than the initiators reach).
#[test]
fn mem_a_smaller_size_is_refused_and_the_old_daemon_serves_on() {
    let s = Setup::new(true);
    let old = Server::start(s.cfg.clone()).unwrap();
    let e = s.engine();
    write(&e, 1, 0, 4);
    let mut smaller = s.cfg.clone();
    smaller.volumes[0].size = 2 * MIB;
    let (err, old) = *take_over(old, smaller).expect_err("a smaller size is refused");
    let text = rblk_fabric::Chain(&err).to_string();
    assert!(text.contains("volume v size 4194304 -> 2097152 (a served volume cannot shrink)"), "{text}");
    assert!(matches!(err, StartError::Handover(HandoverError::Changed(_))), "{err:?}");
    assert_eq!(old.handed_over(), None);
    serves_on(&s, &old, &e);
    drop(e);
    old.shutdown();
}

/// Catches a grown volume handed over at its first segment only (the state's segment list, and
/// the successor's mapping of each memfd after the one before: I/O past the old end would then
/// fail after the reconnect), and a successor whose configuration grows the volume refused as a
/// change or not grown; the data on both sides of each old end is checked.
#[test]
fn mem_a_grown_volume_is_handed_over_whole_and_a_larger_config_grows_it_again() {
    let s = Setup::new(true);
    let old = Server::start(s.cfg.clone()).unwrap();
    let e = s.engine();
    write(&e, 1, 0, 4);
    let mut grown = s.cfg.clone();
    grown.volumes[0].size = 6 * MIB;
    old.reload(grown.clone()).expect("the reload that grows v");
    let deadline = Instant::now() + Duration::from_secs(10);
    while e.size() != 6 * MIB {
        assert!(Instant::now() < deadline, "the engine never heard the grow");
        e.tick().expect("tick");
        std::thread::sleep(Duration::from_millis(2));
    }
    write(&e, 2, 4 * MIB - 2 * PIECE, 4);
    let mut bigger = grown.clone();
    bigger.volumes[0].size = 8 * MIB;
    let new = take_over(old, bigger).map_err(|b| b.0).expect("a takeover whose configuration grows v");
    check(&e, 1, 0, 4);
    check(&e, 2, 4 * MIB - 2 * PIECE, 4);
    assert_eq!(e.size(), 8 * MIB, "the reconnect found the volume grown again");
    write(&e, 3, 8 * MIB - 4 * PIECE, 4);
    check(&e, 3, 8 * MIB - 4 * PIECE, 4);
    assert!(!e.flush().expect("flush"));
    drop(e);
    new.shutdown();
    let file = std::fs::read(s.cfg.volumes[0].path.as_ref().unwrap()).unwrap();
    assert_eq!(file.len() as u64, 8 * MIB, "the backing file grew with it");
    let at = (8 * MIB - 4 * PIECE) as usize;
    assert!(file[at..at + PIECE as usize] == data(3, at as u64, PIECE)[..], "the successor's write-back");
}

/// The old daemon after a handover fell through: its sessions go on, FLUSHes are written back,
/// and it listens again (a new session opens).
fn serves_on(s: &Setup, old: &Running, e: &Engine) {
    write(e, 5, 8 * PIECE, 4);
    let before = old.written_back_bytes();
    assert!(!e.flush().expect("a flush after the handover fell through"));
    assert!(old.written_back_bytes() > before, "the write-backs run again");
    assert_eq!(e.reconnects(), 0, "the engine never lost its session");
    let ro = Session::connect(
        &format!("rblk://{}/v", s.cfg.listen),
        &Options { fabric: Fabric::Mem, timeout: Duration::from_secs(2), ..Options::default() },
    )
    .expect("the old daemon listens again")
    .open(OpenMode::ReadOnly)
    .unwrap();
    drop(ro);
}

#[test]
fn mem_a_successor_that_dies_before_ready_changes_nothing() {
    let s = Setup::new(true);
    let old = Server::start(s.cfg.clone()).unwrap();
    let e = s.engine();
    write(&e, 1, 0, 4);
    let handed = Handed::request(&s.socket()).expect("the old daemon hands over");
    assert_eq!(handed.state().volumes.len(), 1);
    assert!(handed.state().volumes[0].written, "a writer has it open");
    // The successor dies holding the descriptors, before it said ready.
    drop(handed);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let listening = Session::connect(
            &format!("rblk://{}/v", s.cfg.listen),
            &Options { fabric: Fabric::Mem, timeout: Duration::from_secs(1), ..Options::default() },
        );
        if listening.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "the old daemon did not listen again");
        std::thread::sleep(Duration::from_millis(20));
    }
    serves_on(&s, &old, &e);
    // And a real takeover still works afterwards.
    let new = take_over(old, s.cfg.clone()).map_err(|b| b.0).expect("takeover after a failed one");
    check(&e, 1, 0, 4);
    drop(e);
    new.shutdown();
}

/// Catches a successor that serves after its old daemon died mid-handover (before it confirmed
/// with `bye`): nobody can tell what the old daemon did last, so the successor must refuse and
/// must not be listening. The old daemon here is a stand-in that hands over one memfd and
/// vanishes at `takeover-ready`, as a SIGKILL would leave it.
#[test]
fn mem_a_successor_whose_old_daemon_vanishes_before_bye_refuses() {
    use std::io::BufRead as _;
    use std::os::fd::AsFd as _;
    let s = Setup::new(false);
    let listener = std::os::unix::net::UnixListener::bind(s.socket()).unwrap();
    let stand_in = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert!(line.contains("\"op\":\"takeover\""), "{line}");
        let memory = rblk_fabric::Memory::memfd("rblk-volume:v", (4 * MIB) as usize).unwrap();
        let reply = serde_json::json!({
            "version": 1, "ok": true, "message": "handing over 1 volume(s)", "fds": 1,
            "state": {"format": 1, "pid": 1, "daemon": "stand-in", "block_size": 4096, "volumes": [
                {"name": "v", "size": 4 * MIB, "instance": "00112233445566778899aabbccddeeff",
                 "written": false, "failed": false, "memfd": 0}]},
        });
        let payload = serde_json::to_vec(&reply).unwrap();
        let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(&payload);
        rblk_fabric::fdpass::send(&stream, &frame, &[memory.fd().unwrap().as_fd()]).unwrap();
        line.clear();
        while line.is_empty() || line.contains("takeover-progress") {
            line.clear();
            reader.read_line(&mut line).unwrap();
        }
        assert!(line.contains("takeover-ready"), "{line}");
        // Gone without a bye.
    });
    let handed = Handed::request(&s.socket()).expect("the stand-in hands over");
    let err = Server::take_over(s.cfg.clone(), handed, &mut |_| {}).expect_err("no bye: the successor must refuse");
    stand_in.join().unwrap();
    assert!(matches!(err, StartError::Handover(HandoverError::OldDaemonGone)), "{err:?}");
    let opts = Options {
        fabric: Fabric::Mem,
        timeout: Duration::from_secs(1),
        reconnect: Reconnect::NEVER,
        ..Options::default()
    };
    assert!(
        Session::connect(&format!("rblk://{}/v", s.cfg.listen), &opts).is_err(),
        "the refusing successor must not be listening"
    );
}

#[test]
fn mem_an_unknown_state_format_is_refused_on_both_sides() {
    let s = Setup::new(false);
    let old = Server::start(s.cfg.clone()).unwrap();
    // A successor that reads only format 3.
    let mut stream = rblk_target::admin::connect(&s.socket()).unwrap();
    std::io::Write::write_all(&mut stream, b"{\"version\":1,\"op\":\"takeover\",\"formats\":[3]}\n").unwrap();
    let mut len = [0u8; 4];
    assert!(rblk_fabric::fdpass::recv(&stream, &mut len).unwrap().is_empty(), "no descriptors with a refusal");
    let mut reply = vec![0u8; u32::from_le_bytes(len) as usize];
    rblk_fabric::fdpass::recv(&stream, &mut reply).unwrap();
    let reply: serde_json::Value = serde_json::from_slice(&reply).unwrap();
    assert_eq!(reply["ok"], false);
    assert_eq!(reply["error"], "format");
    assert_eq!(old.handed_over(), None);
    // A state record of format 3 in the fd store: the successor refuses before reading it.
    let path = s.dir.join("state-format-3");
    std::fs::write(&path, br#"{"format":3}"#).unwrap();
    let record = OwnedFd::from(std::fs::File::open(&path).unwrap());
    let err = Handed::from_store(vec![(STATE_FDNAME.to_owned(), record)]).unwrap_err();
    assert!(matches!(err, HandoverError::Format(ref f) if f == "3"), "{err}");
    old.shutdown();
}

#[test]
fn mem_a_handover_through_the_fd_store() {
    let s = Setup::new(true);
    let old = Server::start(s.cfg.clone()).unwrap();
    let store: Arc<Mutex<Vec<(String, OwnedFd)>>> = Arc::default();
    let sink = Arc::clone(&store);
    old.set_fd_store(Box::new(move |name, fd| {
        sink.lock().unwrap().push((name.to_owned(), fd.try_clone_to_owned()?));
        Ok(())
    }));
    let e = s.engine();
    write(&e, 1, 0, 4);
    let reply = rblk_target::admin::request(&s.socket(), &rblk_target::admin::Request::Handover { expect: None })
        .expect("handover");
    assert!(reply.message.contains(&format!("status {EXIT_HANDED_OVER}")), "{}", reply.message);
    assert_eq!(old.handed_over(), Some(EXIT_HANDED_OVER));
    old.shutdown();
    let stored = std::mem::take(&mut *store.lock().unwrap());
    let names: Vec<&str> = stored.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["rblk-fd-0", "rblk-fd-1", STATE_FDNAME], "memfd, backing store, then the state record last");
    let handed = Handed::from_store(stored).unwrap().expect("a handover in the store");
    let mut new = Server::take_over(s.cfg.clone(), handed, &mut |_| {}).expect("the successor serves");
    assert_eq!(new.finish_takeover().len(), 3, "every stored name is to be removed from the store");
    write(&e, 2, 4 * PIECE, 4);
    check(&e, 1, 0, 4);
    assert!(!e.flush().unwrap());
    assert_eq!(new.written_back_bytes(), 8 * PIECE, "the dirty pieces from before and after");
    drop(e);
    new.shutdown();
}

mod guest {
    use super::*;
    use rblk_tests::blockdev::{attach, detach, fio_errors, fio_paced_verified_writes, ublk_drv, wait_child};
    use rblk_tests::daemon::{bin, Daemon};
    use rblk_tests::rxe::rdma;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rblk-handover-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// An engine on `uri` that reconnects every 200 ms for a minute: across a takeover.
    fn engine_over_rxe(uri: &str, mode: OpenMode) -> Engine {
        let reconnect = Reconnect {
            delay: Duration::from_millis(200),
            ctrl_loss_tmo: Some(Duration::from_secs(60)),
            fast_io_fail_tmo: None,
            connect_timeout: Duration::ZERO,
        };
        let opts = Options { reconnect, ..Options::default() };
        Engine::new(Session::connect(uri, &opts).unwrap().open(mode).unwrap(), 1).unwrap()
    }

    /// The successor from a copy of the binary at another path (as an upgrade installs one):
    /// takes over from `old` with `args`, and `old` exits 0. Returns it and how long from its
    /// start to listening.
    fn take_over(program: &std::path::Path, mut old: Daemon, args: &[&str]) -> (Daemon, Duration) {
        let t0 = Instant::now();
        let new = Daemon::start_program_at(program, old.addr, &[args, &["--takeover"]].concat());
        let took = t0.elapsed();
        let status = old.wait_exit(Duration::from_secs(30)).expect("the old daemon exits after the handover");
        assert!(status.success(), "the old daemon exits 0 after a takeover: {status}");
        assert!(new.wait_log(&["took over 1 volume from"], Duration::from_secs(1)), "the successor says it took over");
        // Issue 42: every caller had the volume open with memory windows, so the state names
        // rxe0 and the successor registers the volume there before it says ready (on a real
        // device, in a PD it allocates by the device's name, not from a connection).
        assert!(
            new.wait_log(&["registered the handed volumes ahead"], Duration::from_secs(1)),
            "the successor registers the volume before it is ready"
        );
        (new, took)
    }

    /// Catches a handover that loses or reorders I/O on the block device users mount (fio
    /// errors, verify mismatches), serves a new instance (the device would fail I/O as
    /// "contents lost"), or leaves the device waiting (fio's time runs out).
    #[test]
    #[ignore = "needs rxe: run in the guest by scripts/test.sh"]
    fn a_ram_volume_under_fio_verify_survives_three_takeovers() {
        ublk_drv();
        let d = dir("fio");
        let next = d.join("rblk-target-next");
        std::fs::copy(bin("rblk-target"), &next).unwrap();
        let sock = d.join("admin.sock").display().to_string();
        let args = ["--volume", "v:32M", "--admin-socket", &sock];
        let mut target = Daemon::start(&rdma(), &args);
        let log = d.join("attach.log").display().to_string();
        let a = attach(&format!("rblk://{}/v", target.addr), &format!("--reconnect-delay 1 --log-file {log}"));
        // Four jobs on 6 MiB each, writes paced (150/s each: about 10 s of writes) so the run
        // spans the three takeovers, each a second of I/O, the takeover and its reconnect.
        let mut job = fio_paced_verified_writes(&a.dev, 6);
        let mut took = Vec::new();
        let mut back = Vec::new();
        let reconnects = || std::fs::read_to_string(&log).unwrap_or_default().matches("reconnected after").count();
        for round in 0..3 {
            std::thread::sleep(Duration::from_secs(1));
            if job.try_wait().unwrap().is_some() {
                let attach_log = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("fio ended before takeover {round}; the attach log:\n{attach_log}");
            }
            let (t, d) = take_over(&next, target, &args);
            let start = Instant::now();
            target = t;
            took.push(d);
            // Each takeover gets its own reconnect: the next waits for it (else two takeovers
            // close together are one pause to the initiator, and one reconnect).
            while reconnects() <= round {
                assert!(start.elapsed() < Duration::from_secs(60), "no reconnect 60 s after takeover {round}");
                std::thread::sleep(Duration::from_millis(50));
            }
            back.push(start.elapsed());
        }
        let out = wait_child(&mut job, Duration::from_secs(300), "fio");
        let terse = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "fio failed: {terse}");
        assert_eq!(fio_errors(&terse), 0, "fio reported errors: {terse}");
        let attach_log = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            !attach_log.contains("new instance") && !attach_log.contains("contents lost"),
            "the device saw a new instance:\n{attach_log}"
        );
        assert!(attach_log.matches("reconnected after").count() >= 3, "three reconnects:\n{attach_log}");
        eprintln!("handover: successor start to listening, per takeover: {took:?}; takeover to reconnect: {back:?}");
        detach(&a.dev);
        drop(target);
        let _ = std::fs::remove_dir_all(d);
    }

    /// Issue 42, the takeover pause at two sizes through the library: QD1 reads run across a
    /// takeover of a 32 MiB and of a 128 MiB RAM volume; the successor registers each before it
    /// is ready (its `take_over` checks), and the reconnect's OPEN after `bye` registers nothing
    /// (one registration line in the successor's log, not two). Catches a successor that pins
    /// at the first OPEN again, inside the pause that grows with size. The pauses are printed,
    /// not asserted (times under TCG: scripts/handover-rxe.sh measures them against the goals).
    #[test]
    #[ignore = "needs rxe: run in the guest by scripts/test.sh"]
    fn the_pause_after_bye_registers_nothing_at_either_size() {
        let mut pauses = Vec::new();
        for size in ["32M", "128M"] {
            let d = dir(&format!("pause-{size}"));
            let sock = d.join("admin.sock").display().to_string();
            let spec = format!("v:{size}");
            let args = ["--volume", &spec, "--admin-socket", &sock];
            let old = Daemon::start(&rdma(), &args);
            let e = engine_over_rxe(&format!("rblk://{}/v", old.addr), OpenMode::ReadOnly);
            let stop = std::sync::atomic::AtomicBool::new(false);
            let (new, gap) = std::thread::scope(|s| {
                let reader = s.spawn(|| {
                    let (mut last, mut gap, mut buf) = (Instant::now(), Duration::ZERO, vec![0u8; 4096]);
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        e.read_at(&mut buf, (i % 4096) * 4096).expect("a read across the takeover");
                        gap = gap.max(last.elapsed());
                        last = Instant::now();
                        i += 1;
                    }
                    gap
                });
                std::thread::sleep(Duration::from_millis(500));
                let (new, _) = take_over(&bin("rblk-target"), old, &args);
                let t0 = Instant::now();
                while e.reconnects() == 0 {
                    assert!(t0.elapsed() < Duration::from_secs(30), "no reconnect 30 s after the takeover");
                    std::thread::sleep(Duration::from_millis(20));
                }
                std::thread::sleep(Duration::from_millis(300));
                stop.store(true, Ordering::Relaxed);
                (new, reader.join().unwrap())
            });
            let regs = new.log_lines(&["for memory windows in"]);
            assert_eq!(regs.len(), 1, "registered once, before ready, not again at the OPEN: {regs:?}");
            pauses.push((size, gap));
            drop(e);
            drop(new);
            let _ = std::fs::remove_dir_all(d);
        }
        eprintln!("handover: the longest read across the takeover, by size: {pauses:?}");
    }

    fn written_back(metrics: &str) -> u64 {
        let out = std::process::Command::new("curl")
            .args(["-sf", &format!("http://{metrics}/metrics")])
            .output()
            .expect("run curl");
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .find(|l| l.starts_with("rblk_target_written_back_bytes"))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no written_back_bytes in {text}")) as u64
    }

    /// Catches a successor that writes back more than the initiator left dirty (the whole
    /// volume: the dirty state did not travel), and a FLUSH after a takeover whose bytes do not
    /// reach the backing store (a SIGKILL right after it would lose them).
    #[test]
    #[ignore = "needs rxe: run in the guest by scripts/test.sh"]
    fn a_durable_volume_after_a_takeover_flushes_only_what_is_dirty_and_survives_a_kill() {
        let durable = rblk_tests::scratch::durable("v", 8 * MIB, "handover-durable");
        let d = dir("durable");
        let sock = d.join("admin.sock").display().to_string();
        let mut args: Vec<&str> = durable.iter().map(String::as_str).collect();
        args.extend(["--admin-socket", &sock]);
        let old = Daemon::start(&rdma(), &args);
        let addr = old.addr;
        let uri = format!("rblk://{addr}/v");
        let e = engine_over_rxe(&uri, OpenMode::ReadWrite);
        write(&e, 1, 0, 32);
        e.flush().unwrap();
        write(&e, 2, 0, 2);
        let metrics = format!("127.0.0.1:{}", 9600 + std::process::id() % 300);
        let mut with_metrics = args.clone();
        with_metrics.extend(["--metrics", &metrics]);
        let (new, _) = take_over(&bin("rblk-target"), old, &with_metrics);
        // The successor serves its metrics once the old daemon is gone.
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::process::Command::new("curl")
            .args(["-sf", &format!("http://{metrics}/metrics")])
            .output()
            .map_or(true, |o| !o.status.success())
        {
            assert!(Instant::now() < deadline, "no metrics from the successor");
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(written_back(&metrics), 0, "the takeover wrote nothing back");
        assert!(!e.flush().expect("the FLUSH after the takeover"), "durable");
        assert_eq!(written_back(&metrics), 2 * PIECE, "the FLUSH wrote exactly the dirty pieces");
        drop(e);
        assert!(!new.kill().success(), "SIGKILL");
        let again = Daemon::start_at(addr, &args);
        let vol = Session::connect(&uri, &Options::default()).unwrap().open(OpenMode::ReadOnly).unwrap();
        let e = Engine::new(vol, 1).unwrap();
        check(&e, 2, 0, 2);
        check(&e, 1, 2 * PIECE, 30);
        drop(e);
        drop(again);
        let _ = std::fs::remove_dir_all(d);
    }
}
