//! rblk-target's side of reconnect (issue 10), driven by hand-made control messages: feature
//! negotiation, a reconnecting OPEN that tears the old session down before it answers, volume
//! instance identities, and the reaping of silent initiators. Scenarios named in
//! `on_both_fabrics!` also run in the guest against the real daemon; the others need the
//! server's configuration (state dir, keepalive timeout) and run in-process only.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rblk_fabric::{Access, Fabric, Local, Memory, Op, WcStatus, WorkRequest};
use rblk_proto::{
    ConnectData, ErrorCode, Message, OpenMode, Opened, Resume, StatsReply, VolumeId, FEATURES, FEATURE_RECONNECT,
};
use rblk_target::config::VolumeSpec;
use rblk_target::server::{Config, Running, Server};
use rblk_tests::raw::Raw;
use rblk_tests::target::{Spec, Target};

const MIB: u64 = 1 << 20;

rblk_tests::on_both_fabrics!(
    instance_only_with_the_reconnect_feature_and_resume_needs_it,
    a_reconnect_tears_the_old_session_down_before_opened,
    a_resume_with_a_wrong_token_or_an_unknown_id_touches_no_session,
);

fn raw(d: &Target) -> Raw {
    Raw::connect(d.fabric(), d.addr(), ConnectData::NewSession).expect("connect to the target")
}

fn volume(name: &'static str, size: u64) -> Spec {
    Spec { volumes: vec![(name, size)], key: None }
}

/// A one-sided READ (or WRITE) of one block at offset 0 with `o`'s rkey: its completion status,
/// or the post's error (a QP already torn down). Control completions (keepalives from the
/// target) are skipped.
fn access(r: &mut Raw, o: &Opened, write: bool) -> Result<WcStatus, rblk_fabric::Error> {
    access_all(std::slice::from_mut(r), o, write).pop().expect("one result")
}

/// [`access`] on every one of `rs` at once: all posted first, then each completion waited for.
/// Over rxe an access on a QP whose peer has gone fails only when the transport's retries run
/// out (about 2 s, `rblk_fabric::policy`), so one at a time that is 2 s per QP.
fn access_all(rs: &mut [Raw], o: &Opened, write: bool) -> Vec<Result<WcStatus, rblk_fabric::Error>> {
    let op = if write {
        Op::Write { remote_addr: o.remote_addr, rkey: o.rkey }
    } else {
        Op::Read { remote_addr: o.remote_addr, rkey: o.rkey }
    };
    // The buffers stay registered until every completion is in.
    let mut bufs = Vec::new();
    let mut posted: Vec<Result<(), rblk_fabric::Error>> = Vec::new();
    for r in rs.iter_mut() {
        let buf = r.ep.pd().register(&Memory::anonymous(4096).unwrap(), Access::LOCAL).unwrap();
        posted.push(r.ep.post(&[WorkRequest {
            wr_id: 9,
            op,
            local: Local::Region { mr: &buf, offset: 0, len: 4096 },
            signaled: true,
        }]));
        bufs.push(buf);
    }
    let results = rs
        .iter_mut()
        .zip(posted)
        .map(|(r, posted)| {
            posted?;
            Ok(r.wait_for(9)?.status)
        })
        .collect();
    drop(bufs);
    results
}

fn instance_only_with_the_reconnect_feature_and_resume_needs_it(fabric: Fabric) {
    let d = Target::start(fabric, &volume("v", 4 * MIB));

    // An initiator without the feature gets the old OPENED body, whatever the target supports.
    let mut old = raw(&d);
    let announced = old.hello_with(rblk_proto::FEATURE_FLUSH_RANGES);
    assert_ne!(announced & FEATURE_RECONNECT, 0, "CHALLENGE announces reconnect");
    assert_ne!(announced & rblk_proto::FEATURE_KEEPALIVE, 0, "CHALLENGE announces keepalive");
    let o = old.open_with("v", OpenMode::ReadWrite, None).unwrap();
    assert_eq!(o.instance, None, "no instance without FEATURE_RECONNECT");

    let mut new = raw(&d);
    new.hello_with(FEATURES | FEATURE_RECONNECT);
    let n = new.open_with("v", OpenMode::ReadWrite, None).unwrap();
    assert!(n.instance.is_some(), "an initiator with FEATURE_RECONNECT learns the instance");

    // Catches a resume honoured without the feature: it would end `new`'s session.
    let mut sneaky = raw(&d);
    sneaky.hello_with(rblk_proto::FEATURE_FLUSH_RANGES);
    let resume = Resume { session_id: n.session_id, token: n.token };
    let (code, text) = sneaky.open_with("v", OpenMode::ReadWrite, Some(resume)).unwrap_err();
    assert_eq!(code, ErrorCode::Unexpected, "{text}");
    assert_eq!(access(&mut new, &n, false).unwrap(), WcStatus::SUCCESS, "the named session still works");
    assert_eq!(new.stats().registrations, 2);
}

/// Catches a reconnecting OPEN answered before the old session is gone: its registration still
/// pinned, its rkey still working on its QPs (a late WRITE could land after a replayed one), its
/// connections still up, or its exclusive open still held (the new exclusive OPEN fails Busy).
/// Several rounds, each session with joined QPs, because connections that were not waited for
/// may still end in time by chance.
fn a_reconnect_tears_the_old_session_down_before_opened(fabric: Fabric) {
    const ROUNDS: usize = 8;
    const JOINED: usize = 3;
    let d = Target::start(fabric, &volume("v", 4 * MIB));
    // STATS needs an open session: the probe's read-only one counts in every figure.
    let mut probe = raw(&d);
    probe.open("v", OpenMode::ReadOnly);
    let mut first = raw(&d);
    first.hello_with(FEATURES | FEATURE_RECONNECT);
    let mut o = first.open_with("v", OpenMode::Exclusive, None).unwrap();
    for round in 0..ROUNDS {
        let mut qps = vec![first];
        for _ in 0..JOINED {
            let join = ConnectData::Join { session_id: o.session_id, token: o.token };
            let mut joined = Raw::connect(d.fabric(), d.addr(), join).expect("join connect");
            let ok = joined.request(&Message::Join { session_id: o.session_id, token: o.token });
            // OK(JOIN), or JOINED with the segments (the same registration's rkey).
            assert!(matches!(rblk_proto::parse(&ok), Ok((_, Message::Ok { .. } | Message::Joined { .. }))), "{ok:?}");
            assert_eq!(access(&mut joined, &o, true).unwrap(), WcStatus::SUCCESS);
            qps.push(joined);
        }
        let s = probe.stats();
        assert_eq!((s.registrations, s.sessions, s.connections), (2, 2, 2 + JOINED as u64));

        let mut new = raw(&d);
        new.hello_with(FEATURES | FEATURE_RECONNECT);
        let resume = Resume { session_id: o.session_id, token: o.token };
        let n =
            new.open_with("v", OpenMode::Exclusive, Some(resume)).expect("the old exclusive open is released first");
        assert_ne!(n.session_id, o.session_id);
        // Asked right after OPENED: nothing of the old session may be left by then.
        let s = new.stats();
        assert_eq!(s.registrations, 2, "round {round}: the old registration is gone");
        assert_eq!(s.sessions, 2, "round {round}: the old session is forgotten");
        assert_eq!(s.connections, 2, "round {round}: the old session's connections have ended (probe and new remain)");
        // All old QPs at once (over rxe each access fails only after the transport's retries).
        for (i, status) in access_all(&mut qps, &o, true).into_iter().enumerate() {
            assert!(!matches!(status, Ok(WcStatus::SUCCESS)), "round {round}: old rkey on old QP {i}: {status:?}");
        }
        assert_eq!(access(&mut new, &n, true).unwrap(), WcStatus::SUCCESS);
        (first, o) = (new, n);
    }
}

/// Catches a resume that ends a session without holding its token, or one that ends a session
/// only because its id matches (after a target restart ids may be reused).
fn a_resume_with_a_wrong_token_or_an_unknown_id_touches_no_session(fabric: Fabric) {
    let d = Target::start(fabric, &volume("v", 4 * MIB));
    let mut victim = raw(&d);
    victim.hello_with(FEATURES | FEATURE_RECONNECT);
    let v = victim.open_with("v", OpenMode::ReadWrite, None).unwrap();

    let mut token = v.token;
    token[0] ^= 1;
    let mut wrong = raw(&d);
    wrong.hello_with(FEATURES | FEATURE_RECONNECT);
    let resume = Resume { session_id: v.session_id, token };
    wrong.open_with("v", OpenMode::ReadWrite, Some(resume)).expect("opens as usual");
    assert_eq!(access(&mut victim, &v, false).unwrap(), WcStatus::SUCCESS, "after a wrong token");

    let mut unknown = raw(&d);
    unknown.hello_with(FEATURES | FEATURE_RECONNECT);
    let resume = Resume { session_id: v.session_id.wrapping_add(1000), token: v.token };
    unknown.open_with("v", OpenMode::ReadWrite, Some(resume)).expect("opens as usual");
    assert_eq!(access(&mut victim, &v, false).unwrap(), WcStatus::SUCCESS, "after an unknown id");
    let s = victim.stats();
    assert_eq!((s.registrations, s.sessions), (3, 3));
}

/// The server in-process on the in-memory fabric, on a free port.
fn serve(volumes: &[VolumeSpec], state_dir: Option<&Path>) -> Running {
    serve_with(Config { volumes: volumes.to_vec(), state_dir: state_dir.map(Path::to_owned), ..Config::default() })
}

fn serve_with(cfg: Config) -> Running {
    let listen = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    Server::start(Config { listen, fabric: Fabric::Mem, ..cfg }).expect("start the in-process target")
}

/// A target whose connections end after 1 s of silence (with the keepalive feature) or of an
/// uncompleted keepalive, with a RAM volume `v`, and a probe connection for STATS.
fn quick_keepalive_target() -> (Running, Raw) {
    let r = serve_with(Config {
        volumes: vec![VolumeSpec { name: "v".into(), size: 4 * MIB, path: None }],
        keepalive_timeout: KEEPALIVE_TIMEOUT,
        ..Config::default()
    });
    // STATS needs an open session: the probe's read-only one counts in every figure.
    let mut probe = Raw::connect(Fabric::Mem, r.local_addr(), ConnectData::NewSession).unwrap();
    probe.open("v", OpenMode::ReadOnly);
    (r, probe)
}

const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(1);

/// Polls STATS until `done` holds, at most `within`; returns the time it took, or None.
fn until(probe: &mut Raw, within: Duration, done: impl Fn(&StatsReply) -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < within {
        if done(&probe.stats()) {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Catches a target that never notices an initiator which promised keepalives and went silent
/// (a vanished host whose QP nobody tears down): its registration and pinned memory would stay.
#[test]
fn a_silent_initiator_with_keepalives_is_reaped() {
    let (r, mut probe) = quick_keepalive_target();
    let mut silent = Raw::connect(Fabric::Mem, r.local_addr(), ConnectData::NewSession).unwrap();
    silent.hello_with(FEATURES | rblk_proto::FEATURE_KEEPALIVE);
    let o = silent.open_with("v", OpenMode::Exclusive, None).unwrap();
    assert_eq!(probe.stats().registrations, 2);
    let took = until(&mut probe, 5 * KEEPALIVE_TIMEOUT, |s| (s.registrations, s.sessions, s.connections) == (1, 1, 1))
        .expect("the silent initiator's connection and session are gone within a few seconds");
    assert!(took >= KEEPALIVE_TIMEOUT / 2, "not before the timeout: {took:?}");
    assert!(!matches!(access(&mut silent, &o, false), Ok(WcStatus::SUCCESS)), "its QP is disconnected");
    // The exclusive open went with it.
    let mut next = Raw::connect(Fabric::Mem, r.local_addr(), ConnectData::NewSession).unwrap();
    next.hello_with(rblk_proto::FEATURE_FLUSH_RANGES);
    next.open_with("v", OpenMode::Exclusive, None).expect("the reaped session's exclusive open is released");
}

/// Catches silence taken for loss on an initiator that never promised keepalives (today's
/// initiators): they would lose their sessions whenever idle.
#[test]
fn a_silent_initiator_without_keepalives_stays_connected() {
    let (r, mut probe) = quick_keepalive_target();
    let mut quiet = Raw::connect(Fabric::Mem, r.local_addr(), ConnectData::NewSession).unwrap();
    quiet.hello_with(FEATURES & !rblk_proto::FEATURE_KEEPALIVE);
    let o = quiet.open_with("v", OpenMode::ReadWrite, None).unwrap();
    std::thread::sleep(3 * KEEPALIVE_TIMEOUT);
    let s = probe.stats();
    assert_eq!((s.registrations, s.sessions, s.connections), (2, 2, 2), "still connected after 3 s of silence");
    assert_eq!(access(&mut quiet, &o, false).unwrap(), WcStatus::SUCCESS);
}

/// Catches a target that waits for ever on a keepalive SEND that cannot complete (a peer that
/// posts no RECVs, or rxe retrying for ever): the connection must end whatever the features.
#[test]
fn a_keepalive_that_does_not_complete_ends_the_connection() {
    let (r, mut probe) = quick_keepalive_target();
    let _deaf = Raw::connect_without_recvs(Fabric::Mem, r.local_addr(), ConnectData::NewSession).unwrap();
    // Admitted a moment after the connect returns.
    until(&mut probe, Duration::from_secs(1), |s| s.connections == 2).expect("the target serves the deaf connection");
    // The first keepalive goes out after KEEPALIVE_INTERVAL, then may stay uncompleted for 1 s.
    let within = rblk_proto::KEEPALIVE_INTERVAL + 4 * KEEPALIVE_TIMEOUT;
    until(&mut probe, within, |s| s.connections == 1).expect("the connection ends");
}

/// The instance OPENED reports for `name`.
fn instance(r: &Running, name: &str) -> VolumeId {
    let mut c = Raw::connect(Fabric::Mem, r.local_addr(), ConnectData::NewSession).unwrap();
    c.hello_with(FEATURES | FEATURE_RECONNECT);
    c.open_with(name, OpenMode::ReadOnly, None).unwrap().instance.expect("OPENED names the instance")
}

/// A fresh scratch directory for this test.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rblk-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The files in `dir` (none if it does not exist).
fn files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir).map(|d| d.map(|e| e.unwrap().path()).collect()).unwrap_or_default()
}

/// Makes `to` hold exactly the files of `from`.
fn copy_dir(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).unwrap();
    for f in files(from) {
        std::fs::copy(&f, to.join(f.file_name().unwrap())).unwrap();
    }
}

/// Catches a RAM volume presenting the same instance after a restart (an initiator would take
/// the new, zeroed volume for its old data), also when a state dir is configured.
#[test]
fn a_ram_volume_is_a_new_instance_at_every_start() {
    let dir = scratch("ram-instance");
    let spec = [VolumeSpec { name: "r".into(), size: MIB, path: None }];
    let a = instance(&serve(&spec, Some(&dir)), "r");
    let b = instance(&serve(&spec, Some(&dir)), "r");
    assert_ne!(a, b);
    assert!(files(&dir).is_empty(), "nothing is kept for RAM volumes: {:?}", files(&dir));
    let _ = std::fs::remove_dir_all(dir);
}

/// Catches session ids that start at the same value at every start: a resume from before a
/// restart would then name a live session of the new run.
#[test]
fn session_ids_start_at_random_values() {
    let spec = [VolumeSpec { name: "r".into(), size: MIB, path: None }];
    let first_id = || {
        let r = serve(&spec, None);
        let mut c = Raw::connect(Fabric::Mem, r.local_addr(), ConnectData::NewSession).unwrap();
        c.hello_with(rblk_proto::FEATURE_FLUSH_RANGES);
        c.open_with("r", OpenMode::ReadOnly, None).unwrap().session_id
    };
    let (a, b) = (first_id(), first_id());
    assert!(a != 0 && b != 0 && a != b, "{a} {b}");
}

/// Catches a durable volume that loses its instance across a clean shutdown (needless "writes
/// lost" reports), or keeps it after a crash or a replaced backing file (hidden data loss).
#[test]
fn a_durable_volume_keeps_its_instance_across_clean_shutdowns_only() {
    let dir = scratch("durable-instance");
    let (state, image) = (dir.join("state"), dir.join("d.img"));
    let spec = [VolumeSpec { name: "d".into(), size: MIB, path: Some(image.clone()) }];

    let r = serve(&spec, Some(&state));
    let a = instance(&r, "d");
    r.shutdown();
    assert_eq!(files(&state).len(), 1, "a clean shutdown records the identity");

    let r = serve(&spec, Some(&state));
    assert!(files(&state).is_empty(), "the record is gone while the volume is served");
    assert_eq!(instance(&r, "d"), a, "kept across a clean shutdown");
    // What the state dir holds while serving is what a crash leaves behind.
    copy_dir(&state, &dir.join("at-crash"));
    r.shutdown();
    copy_dir(&dir.join("at-crash"), &state);

    let r = serve(&spec, Some(&state));
    let b = instance(&r, "d");
    assert_ne!(b, a, "a new instance after a crash");
    r.shutdown();
    let r = serve(&spec, Some(&state));
    assert_eq!(instance(&r, "d"), b);
    r.shutdown();

    // The same bytes in another file.
    std::fs::copy(&image, dir.join("copy.img")).unwrap();
    std::fs::rename(dir.join("copy.img"), &image).unwrap();
    let r = serve(&spec, Some(&state));
    assert_ne!(instance(&r, "d"), b, "a new instance on a replaced backing file");
    r.shutdown();
    let _ = std::fs::remove_dir_all(dir);
}

/// A connection JOINed to `o`'s session on `r`.
fn joined(r: &Running, o: &Opened) -> Raw {
    let data = ConnectData::Join { session_id: o.session_id, token: o.token };
    let mut j = Raw::connect(Fabric::Mem, r.local_addr(), data).expect("connect to join");
    match rblk_proto::parse(&j.request(&Message::Join { session_id: o.session_id, token: o.token })) {
        Ok((_, Message::Ok { .. } | Message::Joined { .. })) => j,
        other => panic!("JOIN answered with {other:?}"),
    }
}

/// A [`quick_keepalive_target`] (with its probe) and a session opened with `features` (on
/// `first`) with one connection JOINed to it.
fn session_with_a_join(features: u64) -> (Running, Raw, Raw, Raw, Opened) {
    let (r, probe) = quick_keepalive_target();
    let mut first = Raw::connect(Fabric::Mem, r.local_addr(), ConnectData::NewSession).unwrap();
    first.hello_with(features);
    let o = first.open_with("v", OpenMode::ReadWrite, None).unwrap();
    let join = joined(&r, &o);
    (r, probe, first, join, o)
}

/// For `dur`: `first` sends a KEEPALIVE every 200 ms, and `other` listens (and sends them too
/// if `both`). Whether a KEEPALIVE from the target arrived on `other`.
fn keep_alive(first: &mut Raw, other: &mut Raw, both: bool, dur: Duration) -> bool {
    let mut bytes = [0u8; 64];
    let len = Message::Keepalive.encode(0, &mut bytes).unwrap();
    let start = Instant::now();
    let mut heard = false;
    while start.elapsed() < dur {
        assert!(first.try_send_bytes(&bytes[..len]), "the first connection is still there");
        if both {
            assert!(other.try_send_bytes(&bytes[..len]), "the other connection is still there");
        }
        heard |= other.keepalive(Duration::from_millis(200));
    }
    heard
}

/// Session keepalives (`FEATURE_SESSION_KEEPALIVE`). Catches a target that keeps per-QP
/// keepalives on a JOINed connection of a session with the feature (sends them there, or ends
/// it for a silence of its own: here 3 s against a timeout of 1 s), and one that keeps such a
/// connection once its whole session went silent.
#[test]
fn with_session_keepalives_a_joined_qp_lives_and_dies_with_its_session() {
    let (r, mut probe, mut first, mut join, o) = session_with_a_join(FEATURES);
    assert!(!keep_alive(&mut first, &mut join, false, 3 * KEEPALIVE_TIMEOUT), "no keepalive on the JOINed connection");
    assert_eq!(probe.stats().connections, 3, "the JOINed connection, silent for 3 s, is still served");
    assert_eq!(access(&mut join, &o, false).unwrap(), WcStatus::SUCCESS);
    let (_, received) = r.keepalives();
    assert!(received >= 10, "the first connection's keepalives were taken: {received}");
    // The session goes silent: both its connections end.
    until(&mut probe, 5 * KEEPALIVE_TIMEOUT, |s| s.connections == 1).expect("the silent session's connections end");
}

/// Catches per-QP keepalives lost for a peer without the feature (today's initiators, whose
/// JOINed connections expect the target's keepalives and send their own).
#[test]
fn without_session_keepalives_a_joined_qp_keeps_its_own() {
    let (_r, mut probe, mut first, mut join, _) =
        session_with_a_join(FEATURES & !rblk_proto::FEATURE_SESSION_KEEPALIVE);
    keep_alive(&mut first, &mut join, false, 3 * KEEPALIVE_TIMEOUT);
    assert_eq!(probe.stats().connections, 2, "the silent JOINed connection ended while its session was heard");
}

/// Catches a JOINed connection that cannot opt out of its session's liveness: one through
/// another path than the session's first must keep its own keepalives, from its first KEEPALIVE.
#[test]
fn a_joined_qp_that_sends_keepalives_keeps_its_own() {
    let (_r, mut probe, mut first, mut join, _) = session_with_a_join(FEATURES);
    let interval = rblk_proto::KEEPALIVE_INTERVAL;
    assert!(keep_alive(&mut first, &mut join, true, interval + KEEPALIVE_TIMEOUT), "the target's keepalives there");
    keep_alive(&mut first, &mut join, false, 3 * KEEPALIVE_TIMEOUT);
    assert_eq!(probe.stats().connections, 2, "its own silence ended it while its session was heard");
}

/// The initiator's side of session keepalives. Catches an initiator that sends KEEPALIVE on
/// queues joined through the session's first address (the target counts every KEEPALIVE it
/// takes: per QP, 4 connections over 17 s would send about 34, the first alone about 9), and
/// one whose joined queues take the target's silence there for loss (they hear nothing for
/// longer than the initiator's 15 s timeout, and would reconnect).
#[test]
fn an_initiator_keeps_a_session_alive_on_its_first_connection_only() {
    let r = serve_with(Config {
        volumes: vec![VolumeSpec { name: "v".into(), size: 4 * MIB, path: None }],
        keepalive_timeout: rblk_target::config::MIN_KEEPALIVE_TIMEOUT,
        ..Config::default()
    });
    let opts = rblk_initiator::Options { fabric: Fabric::Mem, ..rblk_initiator::Options::default() };
    let uri = format!("rblk://{}/v", r.local_addr());
    let mut vol = rblk_initiator::Session::connect(&uri, &opts).unwrap().open(OpenMode::ReadWrite).unwrap();
    let mut queues: Vec<_> = (0..3).map(|_| vol.queue_with(1, 4096).unwrap()).collect();
    let qpns: Vec<u32> = queues.iter().map(rblk_initiator::Queue::qp_num).collect();
    let (_, before) = r.keepalives();
    let start = Instant::now();
    while start.elapsed() < rblk_proto::KEEPALIVE_TIMEOUT + Duration::from_secs(2) {
        queues.iter_mut().for_each(rblk_initiator::Queue::tick);
        vol.keepalive().expect("the session stays up");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, after) = r.keepalives();
    assert!(after - before <= 12, "KEEPALIVEs came on the first connection only: {}", after - before);
    assert_eq!(r.connection_count(), 4, "every queue still connected");
    assert_eq!(vol.reconnects(), 0);
    let mut done: Vec<rblk_initiator::Done> = std::iter::repeat_with(Default::default).take(1).collect();
    for (q, qpn) in queues.iter_mut().zip(qpns) {
        assert_eq!(q.qp_num(), qpn, "the queue was not rejoined");
        q.submit_read(0, 4096, 1).unwrap();
        assert_eq!(q.wait(&mut done, Instant::now() + Duration::from_secs(5)).unwrap(), 1);
        done[0].result.as_ref().expect("a read on the queue succeeds");
        done[0].release();
    }
}

/// Catches a target that leaves a connection whose QP its device reported failed (a QP fatal
/// or access error: the QP is in the error state) to be found by the keepalives, up to
/// `keepalive_timeout` later (here none would: the in-memory QP is not really broken, and the
/// silence rule is off), and one that ends connections for a port event or a QP's harmless one.
#[test]
fn a_device_event_that_fails_a_qp_ends_its_connection_at_once() {
    use rblk_fabric::DeviceEventKind as K;
    let r = serve(&[VolumeSpec { name: "v".into(), size: 4 * MIB, path: None }], None);
    let mut probe = Raw::connect(Fabric::Mem, r.local_addr(), ConnectData::NewSession).unwrap();
    probe.open("v", OpenMode::ReadOnly);
    let mut victim = Raw::connect(Fabric::Mem, r.local_addr(), ConnectData::NewSession).unwrap();
    victim.hello_with(FEATURES & !rblk_proto::FEATURE_KEEPALIVE);
    victim.open_with("v", OpenMode::ReadOnly, None).unwrap();
    let target_qpn = rblk_fabric::mem::peer_qp_num(victim.ep.qp_num()).expect("the target's QP");
    let before = r.device_events();
    assert!(rblk_fabric::mem::device_event(target_qpn, K::Port { port: 1, active: Some(false) }, "port down"));
    assert!(rblk_fabric::mem::device_event(target_qpn, K::Qp { qp_num: target_qpn }, "last WQE reached"));
    assert!(until(&mut probe, Duration::from_secs(2), |_| r.device_events() == before + 2).is_some(), "both taken");
    assert_eq!(probe.stats().connections, 2, "neither ends a connection");
    assert!(rblk_fabric::mem::device_event(target_qpn, K::QpFailed { qp_num: target_qpn }, "QP fatal error"));
    let took = until(&mut probe, Duration::from_secs(2), |s| s.connections == 1);
    assert!(took.is_some(), "the connection of the failed QP ends at once");
    assert_eq!(r.device_events(), before + 3);
}
