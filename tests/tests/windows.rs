//! Type 2B memory windows over rxe (issue 14's fabric part): a region registered once with no
//! remote access of its own, and per-QP windows over it in one protection domain.
//!
//! The scenario runs over rxe in the guest and over the in-memory fabric on the host (whose
//! windows the target's host tests will rely on). It would catch:
//! - a window usable on another QP of the same PD (what a type 1 window or a shared MR rkey
//!   allows: with one registration in one PD, QP B's READ with QP A's rkey would succeed);
//! - a registration that grants remote access by itself (BIND_ONLY must not);
//! - a read-only window that lets a WRITE through;
//! - an rkey that still works after its local invalidate completed.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rblk_fabric::{
    Access, Completion, Endpoint, Fabric, Listener, ListenerEvent, Local, Memory, Op, Pd, QpConfig, Route, WcOpcode,
    WcStatus, WorkRequest,
};
use rblk_tests::rxe::{rdma, wait_one, STEP};

const LEN: usize = 1 << 20;

/// What the passive side tells the test about each accepted connection.
struct Granted {
    /// The window's rkey, if one was bound for the connection.
    rkey: Option<u32>,
    /// The region's own rkey (its registration grants nothing remote).
    mr_rkey: u32,
    addr: u64,
}

/// The grants of the four connections, in order.
const GRANTS: [Option<Access>; 4] = [Some(Access::REMOTE_READ_WRITE), None, Some(Access::REMOTE_READ), None];

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn windows_are_bound_to_their_qp_and_die_when_invalidated() {
    let rdma = rdma();
    scenario(Fabric::Verbs, rdma.addr, &rdma.device);
}

#[test]
fn windows_in_memory() {
    scenario(Fabric::Mem, "127.0.0.1".parse().unwrap(), "mem0");
}

fn scenario(fabric: Fabric, ip: std::net::IpAddr, device: &str) {
    let listener = Listener::bind(fabric, SocketAddr::new(ip, 0), Some(device)).unwrap();
    let addr = listener.local_addr().unwrap();
    let (granted_tx, granted) = mpsc::channel::<Granted>();
    let (invalidate_tx, invalidate) = mpsc::channel::<u32>();
    let (invalidated_tx, invalidated) = mpsc::channel::<Completion>();
    let memory = Memory::anonymous(LEN).unwrap();
    memory.write_at(4096, b"window contents").unwrap();
    let target_memory = Arc::clone(&memory);
    let dev = device.to_owned();
    let target = thread::spawn(move || {
        // One PD for the region, the windows and every QP (the spec requires it; isolation
        // comes from the windows being bound to one QP each).
        let pd = Pd::alloc(fabric, &dev).unwrap();
        assert!(pd.type2_windows(), "rxe in 6.12 reports MEM_WINDOW_TYPE_2B");
        let mr = pd.register(&target_memory, Access::BIND_ONLY).unwrap();
        let mut eps = Vec::new();
        let mut windows = Vec::new();
        for (conn, grant) in GRANTS.iter().enumerate() {
            let req = loop {
                match listener.next_event(Some(Instant::now() + STEP)).unwrap() {
                    Some(ListenerEvent::Request(r)) => break r,
                    Some(_) => continue,
                    None => panic!("no connection request within {STEP:?}"),
                }
            };
            let mut ep = req.into_endpoint(&pd, &QpConfig::default(), conn as u64).unwrap();
            ep.accept().unwrap();
            let rkey = grant.map(|access| {
                let mut mw = pd.alloc_mw().unwrap();
                let before = mw.rkey();
                let rkey = ep.bind_mw(100 + conn as u64, &mut mw, &mr, 0, LEN as u64, access).unwrap();
                assert_ne!(rkey, before, "a bind steps the key byte");
                let c = wait_one(&mut ep);
                assert_eq!((c.wr_id, c.status, c.opcode), (100 + conn as u64, WcStatus::SUCCESS, WcOpcode::BindMw));
                windows.push(mw);
                rkey
            });
            granted_tx.send(Granted { rkey, mr_rkey: mr.rkey(), addr: mr.addr() }).unwrap();
            eps.push(ep);
        }
        // Invalidate the first connection's window on its own QP when asked.
        if let Ok(rkey) = invalidate.recv_timeout(STEP * 4) {
            eps[0].invalidate(200, rkey).unwrap();
            invalidated_tx.send(wait_one(&mut eps[0])).unwrap();
        }
        // Keep everything until the test is done (the channel closes).
        let _ = invalidate.recv_timeout(STEP * 4);
        drop(windows);
    });

    let connect = || {
        let deadline = Instant::now() + STEP;
        let route = Route { device: Some(device.to_owned()), ..Route::default() };
        let mut ep = Endpoint::resolve(fabric, addr, None, &route, &QpConfig::default(), deadline).unwrap();
        ep.connect(&[], deadline).unwrap();
        let g = granted.recv_timeout(STEP).expect("the target granted");
        (ep, g)
    };
    let (mut a, ga) = connect();
    let (mut b, _) = connect();
    let (mut c, gc) = connect();
    let (mut d, gd) = connect();
    let rkey_a = ga.rkey.unwrap();
    let rkey_c = gc.rkey.unwrap();

    let local = |ep: &Endpoint| ep.pd().register(&Memory::anonymous(4096).unwrap(), Access::LOCAL).unwrap();
    let access = |ep: &mut Endpoint, write: bool, rkey: u32, raddr: u64| -> Completion {
        let buf = local(ep);
        buf.memory().write_at(0, b"written through").unwrap();
        let op = if write { Op::Write { remote_addr: raddr, rkey } } else { Op::Read { remote_addr: raddr, rkey } };
        ep.post(&[WorkRequest {
            wr_id: 1,
            op,
            local: Local::Region { mr: &buf, offset: 0, len: 4096 },
            signaled: true,
        }])
        .unwrap();
        let c = wait_one(ep);
        if c.status.is_success() && !write {
            let mut got = [0u8; 15];
            buf.memory().read_at(0, &mut got).unwrap();
            assert_eq!(&got, b"window contents");
        }
        c
    };

    // A's own window works on A, for reads and writes.
    assert_eq!(access(&mut a, false, rkey_a, ga.addr + 4096).status, WcStatus::SUCCESS);
    assert_eq!(access(&mut a, true, rkey_a, ga.addr + 8192).status, WcStatus::SUCCESS);
    let mut landed = [0u8; 15];
    memory.read_at(8192, &mut landed).unwrap();
    assert_eq!(&landed, b"written through");

    // A's rkey on B, a QP of the same PD: refused (only a QP-bound window makes this fail).
    assert_eq!(access(&mut b, false, rkey_a, ga.addr + 4096).status, WcStatus::REM_ACCESS_ERR);

    // C's read-only window reads, and refuses a WRITE.
    assert_eq!(access(&mut c, false, rkey_c, gc.addr + 4096).status, WcStatus::SUCCESS);
    assert_eq!(access(&mut c, true, rkey_c, gc.addr + 4096).status, WcStatus::REM_ACCESS_ERR);

    // The registration's own rkey grants nothing remote.
    assert_eq!(access(&mut d, false, gd.mr_rkey, gd.addr + 4096).status, WcStatus::REM_ACCESS_ERR);

    // Invalidated on the target, A's rkey dies on A too.
    invalidate_tx.send(rkey_a).unwrap();
    let inv = invalidated.recv_timeout(STEP).expect("the invalidate completed");
    assert_eq!((inv.status, inv.opcode), (WcStatus::SUCCESS, WcOpcode::LocalInv));
    assert_eq!(access(&mut a, false, rkey_a, ga.addr + 4096).status, WcStatus::REM_ACCESS_ERR);
    eprintln!("window rkeys: A {rkey_a:#x}, C {rkey_c:#x}; MR rkey {:#x}", gd.mr_rkey);

    drop(invalidate_tx);
    target.join().unwrap();
    // Give rxe a moment to tear the QPs down before the next test reuses the device.
    thread::sleep(Duration::from_millis(100));
}

// The target's use of windows (issue 14): sessions opened with `ConnectData::NewWindowSession`
// get one window per QP over the volume's one registration. Each scenario runs on both fabrics:
// over the in-memory fabric on the host, against the real daemon over rxe in the guest.
rblk_tests::on_both_fabrics!(
    session_rkeys_work_only_on_their_own_qp_and_die_at_close,
    windows_keep_one_registration_per_volume_and_refuse_a_hello_without_them,
    a_target_with_windows_off_gives_todays_session_registration,
);

mod session {
    use rblk_fabric::Local;
    use rblk_fabric::{Access, Memory, Mr, Op, WcStatus, WorkRequest};
    use rblk_proto::{ConnectData, Message, Opened};
    use rblk_tests::raw::Raw;
    use rblk_tests::target::Target;

    pub const VOL: u64 = 4 << 20;

    /// HELLO with every feature but keepalive (this client sends nothing unasked).
    pub const FEATURES: u64 = rblk_proto::FEATURES & !rblk_proto::FEATURE_KEEPALIVE;

    pub fn connect(t: &Target, data: ConnectData) -> Raw {
        Raw::connect(t.fabric(), t.addr(), data).expect("connect to the target")
    }

    /// A QP that joins `o`'s session: the rkey JOIN's answer carries (None: a plain OK(JOIN)).
    pub fn join(t: &Target, o: &Opened) -> (Raw, Option<u32>) {
        let mut r = connect(t, ConnectData::Join { session_id: o.session_id, token: o.token });
        let reply = r.request(&Message::Join { session_id: o.session_id, token: o.token });
        let rkey = match rblk_proto::parse(&reply) {
            Ok((_, Message::Joined { rkey, .. })) => Some(rkey),
            Ok((_, Message::Ok { answers: rblk_proto::Opcode::Join })) => None,
            other => panic!("JOIN answered with {other:?}"),
        };
        (r, rkey)
    }

    fn buffer(r: &Raw, byte: u8) -> Mr {
        let m = r.ep.pd().register(&Memory::anonymous(4096).unwrap(), Access::LOCAL).unwrap();
        m.memory().write_at(0, &[byte; 4096]).unwrap();
        m
    }

    /// One 4 KiB READ or WRITE through `r`'s QP with `rkey` at `offset` of the volume; the
    /// completion status, and for a read the first byte read.
    pub fn access(r: &mut Raw, o: &Opened, rkey: u32, write: Option<u8>, offset: u64) -> (WcStatus, u8) {
        let buf = buffer(r, write.unwrap_or(0xee));
        let remote_addr = o.remote_addr + offset;
        let op = if write.is_some() { Op::Write { remote_addr, rkey } } else { Op::Read { remote_addr, rkey } };
        r.ep.post(&[WorkRequest {
            wr_id: 9,
            op,
            local: Local::Region { mr: &buf, offset: 0, len: 4096 },
            signaled: true,
        }])
        .unwrap();
        let status = r.wait_for(9).expect("wait for the access").status;
        let mut first = [0u8; 1];
        buf.memory().read_at(0, &mut first).unwrap();
        (status, first[0])
    }
}

/// Would catch: a session-wide rkey (one registration for all QPs: A's rkey would work on B and
/// C), a window not bound to its QP, windows shared across sessions, and windows that outlive
/// CLOSE (B's own rkey still working on B's live QP after A closed the session: only the
/// target's revocation at CLOSE kills it, since B's QP stays connected).
fn session_rkeys_work_only_on_their_own_qp_and_die_at_close(fabric: Fabric) {
    use rblk_proto::{ConnectData, Message, OpenMode};
    use session::{access, connect, join, FEATURES, VOL};
    let t =
        rblk_tests::target::Target::start(fabric, &rblk_tests::target::Spec { volumes: vec![("v", VOL)], key: None });
    let mut a = connect(&t, ConnectData::NewWindowSession);
    let features = a.hello_with(FEATURES);
    assert_ne!(features & rblk_proto::FEATURE_WINDOWS, 0, "a windows connection is offered windows");
    let oa = a.open_with("v", OpenMode::ReadWrite, None).expect("OPEN");
    let (mut b, rb) = join(&t, &oa);
    let rb = rb.expect("OK(JOIN) carries the joining QP's rkey");
    let (mut c, rc) = join(&t, &oa);
    let rc = rc.expect("OK(JOIN) carries the joining QP's rkey");
    assert!(oa.rkey != rb && rb != rc && oa.rkey != rc, "three QPs, three rkeys: {:#x} {rb:#x} {rc:#x}", oa.rkey);

    // Each QP's own rkey works on it: A writes, B reads A's data back.
    assert_eq!(access(&mut a, &oa, oa.rkey, Some(0x5a), 8192).0, WcStatus::SUCCESS);
    assert_eq!(access(&mut b, &oa, rb, None, 8192), (WcStatus::SUCCESS, 0x5a));
    let s = a.stats();
    assert_eq!(s.windows, Some(3), "one window per QP of the session: {s:?}");
    assert_eq!((s.registrations, s.pinned_bytes), (1, VOL), "one registration for the volume: {s:?}");

    // A's rkey on C, a QP of the same session (and of the same PD on the target): refused.
    assert_eq!(access(&mut c, &oa, oa.rkey, None, 8192).0, WcStatus::REM_ACCESS_ERR);

    // Another session's QP with A's rkey: refused too; its own works.
    let mut other = connect(&t, ConnectData::NewWindowSession);
    other.hello_with(FEATURES);
    let oo = other.open_with("v", OpenMode::ReadOnly, None).expect("OPEN");
    assert_eq!(access(&mut other, &oo, oo.rkey, None, 8192), (WcStatus::SUCCESS, 0x5a));
    // Its window is read-only, as its open.
    assert_eq!(access(&mut other, &oo, oo.rkey, Some(1), 8192).0, WcStatus::REM_ACCESS_ERR);
    let mut other2 = connect(&t, ConnectData::NewWindowSession);
    other2.hello_with(FEATURES);
    let oo2 = other2.open_with("v", OpenMode::ReadOnly, None).expect("OPEN");
    assert_eq!(access(&mut other2, &oo2, oa.rkey, None, 8192).0, WcStatus::REM_ACCESS_ERR);

    // CLOSE on A: B is still connected, and its own rkey, which worked a moment ago, dies.
    assert_eq!(access(&mut b, &oa, rb, None, 0).0, WcStatus::SUCCESS);
    let ok = a.request(&Message::Close);
    assert!(matches!(rblk_proto::parse(&ok), Ok((_, Message::Ok { .. }))), "{ok:?}");
    assert_eq!(access(&mut b, &oa, rb, None, 0).0, WcStatus::REM_ACCESS_ERR, "B's window outlived CLOSE");
}

/// Would catch: a registration per session creeping back in with windows (registrations and
/// pinned bytes growing with sessions), windows not revoked when their QPs go, and a QP placed in
/// the shared domain without windows (a HELLO that does not announce them must be refused: a
/// session registration there would work on every QP of the domain).
fn windows_keep_one_registration_per_volume_and_refuse_a_hello_without_them(fabric: Fabric) {
    use rblk_proto::{ConnectData, ErrorCode, Message, OpenMode};
    use session::{connect, join, FEATURES, VOL};
    let t =
        rblk_tests::target::Target::start(fabric, &rblk_tests::target::Spec { volumes: vec![("v", VOL)], key: None });
    let mut probe = connect(&t, ConnectData::NewWindowSession);
    probe.hello_with(FEATURES);
    probe.open_with("v", OpenMode::ReadOnly, None).expect("OPEN");
    let base = probe.stats();
    assert_eq!((base.registrations, base.windows), (1, Some(1)), "{base:?}");
    let mut sessions = Vec::new();
    for _ in 0..4 {
        let mut s = connect(&t, ConnectData::NewWindowSession);
        s.hello_with(FEATURES);
        let o = s.open_with("v", OpenMode::ReadWrite, None).expect("OPEN");
        let joined = join(&t, &o);
        sessions.push((s, joined));
    }
    let s = probe.stats();
    assert_eq!((s.registrations, s.pinned_bytes, s.windows), (1, VOL, Some(9)), "{s:?}");
    drop(sessions);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut s = probe.stats();
    while s.windows != Some(1) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
        s = probe.stats();
    }
    assert_eq!((s.registrations, s.windows), (1, Some(1)), "the departed QPs' windows are revoked: {s:?}");

    // Connected for windows, HELLO without them: refused, and the connection ends.
    let mut bad = connect(&t, ConnectData::NewWindowSession);
    let reply = bad.request(&Message::Hello { features: FEATURES & !rblk_proto::FEATURE_WINDOWS });
    match rblk_proto::parse(&reply) {
        Ok((_, Message::Error { code, text })) => {
            assert_eq!(code, ErrorCode::Unexpected);
            assert!(text.contains("memory windows"), "{text}");
        }
        other => panic!("HELLO without windows on a windows connection answered with {other:?}"),
    }
    assert!(bad.try_reply(std::time::Duration::from_secs(20)).is_none(), "the connection ends");

    // A peer that predates windows (NewSession, HELLO without the bit) gets today's session:
    // a registration of its own, a plain OK(JOIN), STATS without the window count.
    let mut old = connect(&t, ConnectData::NewSession);
    let offered = old.hello_with(FEATURES & !rblk_proto::FEATURE_WINDOWS & !rblk_proto::FEATURE_SEGMENTS);
    assert_eq!(offered & rblk_proto::FEATURE_WINDOWS, 0, "windows are not offered without the connect kind");
    let o = old.open_with("v", OpenMode::ReadWrite, None).expect("OPEN");
    let (_j, rkey) = join(&t, &o);
    assert_eq!(rkey, None, "a plain OK(JOIN)");
    let s = old.stats();
    assert_eq!((s.registrations, s.windows), (2, None), "{s:?}");
}

/// Would catch: `memory_windows = false` not honoured (windows offered anyway), or a windows
/// connect request refused instead of served the old way.
fn a_target_with_windows_off_gives_todays_session_registration(fabric: Fabric) {
    use rblk_proto::{ConnectData, OpenMode};
    use session::{access, connect, join, FEATURES};
    let t = rblk_tests::target::Target::start_with_config(
        fabric,
        "memory_windows = false\n[[volume]]\nname = \"v\"\nsize = \"4M\"\n",
    );
    let mut a = connect(&t, ConnectData::NewWindowSession);
    assert_eq!(a.hello_with(FEATURES) & rblk_proto::FEATURE_WINDOWS, 0);
    let o = a.open_with("v", OpenMode::ReadWrite, None).expect("OPEN");
    let (mut b, rkey) = join(&t, &o);
    // JOINED names the session's own rkey (with the segments: FEATURE_SEGMENTS).
    assert_eq!(rkey, Some(o.rkey), "the session's own rkey");
    // The session-wide rkey works on the joined QP, as before windows.
    assert_eq!(access(&mut b, &o, o.rkey, None, 0).0, rblk_fabric::WcStatus::SUCCESS);
    let s = a.stats();
    assert_eq!((s.registrations, s.windows), (1, None), "{s:?}");
}

/// A target from before memory windows, as a windows-capable initiator meets it: it refuses
/// connect data it cannot parse (the windows kind, 3), and serves HELLO (without
/// FEATURE_WINDOWS), AUTH, OPEN (one read-write registration of its volume in the session's PD,
/// one rkey), JOIN (a plain OK), FLUSH, STATS and CLOSE over the in-memory fabric, one session at
/// a time. Returns its address and the connect kinds it saw, in order.
fn old_target(size: usize) -> (SocketAddr, Arc<std::sync::Mutex<Vec<u16>>>) {
    use rblk_proto::{ChallengeFlags, ConnectData, FlushedFlags, Message, Opcode, Opened, StatsReply, VolumeFlags};
    use rblk_tests::raw::serve_scripted;
    let listener = Listener::bind(Fabric::Mem, "127.0.0.1:0".parse().unwrap(), None).unwrap();
    let addr = listener.local_addr().unwrap();
    let kinds = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&kinds);
    thread::spawn(move || {
        let memory = Memory::anonymous(size).unwrap();
        let mut session: Option<(Pd, Arc<rblk_fabric::Mr>)> = None;
        for conn in 0.. {
            let req = match listener.next_event(Some(Instant::now() + STEP * 4)) {
                Ok(Some(ListenerEvent::Request(r))) => r,
                Ok(Some(_)) => continue,
                _ => return,
            };
            let data = req.private_data();
            seen.lock().unwrap().push(u16::from_le_bytes([data[6], data[7]]));
            let (pd, mr) = match rblk_proto::parse_connect_data(data) {
                Ok(ConnectData::NewSession) => {
                    let pd = req.alloc_pd().unwrap();
                    let mr = Arc::new(pd.register(&memory, Access::REMOTE_READ_WRITE).unwrap());
                    session = Some((pd.clone(), Arc::clone(&mr)));
                    (pd, mr)
                }
                Ok(ConnectData::Join { .. }) if session.is_some() => session.clone().unwrap(),
                // What a target before windows does with kind 3: it does not parse.
                _ => {
                    req.reject().unwrap();
                    continue;
                }
            };
            thread::spawn(move || {
                serve_scripted(req, &pd, conn, STEP * 4, |msg| match msg {
                    Message::Hello { .. } => Some(Message::Challenge {
                        flags: ChallengeFlags::empty(),
                        features: rblk_proto::FEATURES & !rblk_proto::FEATURE_WINDOWS,
                        nonce: [0; rblk_proto::NONCE_LEN],
                    }),
                    Message::Auth { .. } => Some(Message::Ok { answers: Opcode::Auth }),
                    Message::Open { .. } => Some(Message::Opened(Opened {
                        remote_addr: mr.addr(),
                        size: size as u64,
                        rkey: mr.rkey(),
                        block_size: 4096,
                        max_io: 1 << 20,
                        flags: VolumeFlags::VOLATILE,
                        session_id: 7,
                        token: [7; rblk_proto::TOKEN_LEN],
                        instance: Some(rblk_proto::VolumeId([1; 16])),
                        segments: None,
                    })),
                    Message::Join { .. } => Some(Message::Ok { answers: Opcode::Join }),
                    Message::Flush(_) => Some(Message::Flushed { flags: FlushedFlags::VOLATILE }),
                    Message::Stats => Some(Message::StatsReply(StatsReply::default())),
                    Message::Close => Some(Message::Ok { answers: Opcode::Close }),
                    _ => None,
                });
            });
        }
    });
    (addr, kinds)
}

/// Would catch: an initiator that gives up on a target from before windows (its connect request
/// with the windows kind is refused), one that does not connect again the old way, or one that
/// then expects per-QP rkeys (its joined queue would use a window rkey it never got).
#[test]
fn the_initiator_falls_back_to_a_session_registration_on_a_target_from_before_windows() {
    let (addr, kinds) = old_target(1 << 20);
    let opts = rblk_initiator::Options { fabric: Fabric::Mem, ..rblk_initiator::Options::default() };
    let session = rblk_initiator::Session::connect(&format!("rblk://{addr}/v"), &opts).expect("connect");
    assert_eq!(session.features() & rblk_proto::FEATURE_WINDOWS, 0);
    let mut vol = session.open(rblk_proto::OpenMode::ReadWrite).expect("open");
    assert!(!vol.memory_windows());
    vol.write_at(&[0x3c; 8192], 4096).expect("write through a joined queue with the session's rkey");
    let mut back = [0u8; 8192];
    vol.read_at(&mut back, 4096).expect("read");
    assert!(back.iter().all(|&b| b == 0x3c));
    let kinds = kinds.lock().unwrap().clone();
    assert_eq!(&kinds[..3], &[3, 1, 2], "windows kind refused, then the old kind, then a join: {kinds:?}");
}

/// Would catch: a failed write-back that leaves writers' windows bound (a joined QP, still
/// connected, could go on writing into data the target will not keep), or that revokes readers'
/// windows too.
#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn a_failed_write_back_revokes_the_writers_windows_at_once() {
    use rblk_proto::{ConnectData, ErrorCode, Flush, Message, OpenMode};
    use session::{access, connect, join, FEATURES};
    // A 16 MiB durable volume on a 4 MiB file system: writing it back runs out of space.
    let tiny = rblk_tests::scratch::Tiny::mount("windows-tiny", "4M");
    let toml = format!(
        "state_dir = \"{0}\"\n[[volume]]\nname = \"f\"\nsize = \"16M\"\npath = \"{0}/f.img\"\n",
        tiny.path.display()
    );
    let t = rblk_tests::target::Target::start_with_config(Fabric::Verbs, &toml);
    let mut w = connect(&t, ConnectData::NewWindowSession);
    w.hello_with(FEATURES);
    let ow = w.open_with("f", OpenMode::ReadWrite, None).expect("OPEN");
    let (mut wj, rj) = join(&t, &ow);
    let rj = rj.expect("a windows session");
    let mut r = connect(&t, ConnectData::NewWindowSession);
    r.hello_with(FEATURES);
    let or = r.open_with("f", OpenMode::ReadOnly, None).expect("OPEN");
    assert_eq!(access(&mut wj, &ow, rj, Some(0x42), 0).0, WcStatus::SUCCESS);
    // 8 MiB of data (the write-back skips the zero blocks of the new, sparse backing file: only
    // data can fill the 4 MiB file system), in 1 MiB WRITEs through the joined QP.
    let data = wj.ep.pd().register(&Memory::anonymous(1 << 20).unwrap(), Access::LOCAL).unwrap();
    data.memory().write_at(0, &[0x42; 1 << 20]).unwrap();
    for i in 0..8u64 {
        let op = Op::Write { remote_addr: ow.remote_addr + (i << 20), rkey: rj };
        let wr = WorkRequest {
            wr_id: 10 + i,
            op,
            local: Local::Region { mr: &data, offset: 0, len: 1 << 20 },
            signaled: true,
        };
        wj.ep.post(&[wr]).unwrap();
        assert_eq!(wj.wait_for(10 + i).expect("the data's WRITE").status, WcStatus::SUCCESS);
    }

    let reply = w.request(&Message::Flush(Flush::All));
    match rblk_proto::parse(&reply) {
        Ok((_, Message::Error { code, .. })) => assert_eq!(code, ErrorCode::VolumeFailed),
        other => panic!("FLUSH onto a full file system answered with {other:?}"),
    }
    assert_eq!(access(&mut wj, &ow, rj, Some(0x43), 4096).0, WcStatus::REM_ACCESS_ERR, "the writer's window");
    assert_eq!(access(&mut r, &or, or.rkey, None, 0), (WcStatus::SUCCESS, 0x42), "the reader's window still reads");
}

/// Would catch: a window whose deallocation fails going unnoticed (logged as revoked, counted
/// nowhere) while the connection it is bound to stays up, so that its rkey outlives the CLOSE
/// that revoked it. Host only: the in-memory fabric's `mem::fail_dealloc` makes the
/// deallocation fail and leaves the window valid, as a failed `ibv_dealloc_mw` may; without the
/// target's disconnect of B, B's QP stays up and its WRITE with its rkey still succeeds.
#[test]
fn a_window_that_fails_to_deallocate_takes_its_connection_down() {
    use rblk_proto::{ConnectData, Message, OpenMode};
    use rblk_tests::target::{Spec, Target};
    use session::{access, connect, join, FEATURES, VOL};
    let t = Target::start(Fabric::Mem, &Spec { volumes: vec![("v", VOL)], key: None });
    let mut a = connect(&t, ConnectData::NewWindowSession);
    a.hello_with(FEATURES);
    let oa = a.open_with("v", OpenMode::ReadWrite, None).expect("OPEN");
    let (mut b, rb) = join(&t, &oa);
    let rb = rb.expect("a windows session gives B a window of its own");
    assert_eq!(access(&mut b, &oa, rb, Some(0x11), 0).0, WcStatus::SUCCESS);
    let target_qp = rblk_fabric::mem::peer_qp_num(b.ep.qp_num()).expect("B's QP at the target");
    rblk_fabric::mem::fail_dealloc(target_qp, 1);

    // CLOSE on A revokes every window of the session: B's fails to deallocate.
    let ok = a.request(&Message::Close);
    assert!(matches!(rblk_proto::parse(&ok), Ok((_, Message::Ok { .. }))), "{ok:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.ep.attributes().expect("B's QP").state != "ERR" {
        assert!(Instant::now() < deadline, "B is still connected, with a window that was not deallocated");
        thread::sleep(Duration::from_millis(10));
    }
    assert_ne!(access(&mut b, &oa, rb, Some(0x22), 0).0, WcStatus::SUCCESS, "B's rkey outlived the CLOSE");
    let Target::InProcess(r) = &t else { unreachable!("the in-memory fabric's target runs in-process") };
    assert_eq!(r.window_dealloc_failures(), 1, "the failure is counted (rblk_target_window_dealloc_failures)");
}
