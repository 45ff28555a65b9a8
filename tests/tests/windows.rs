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
