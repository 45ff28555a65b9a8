//! The fabric over real verbs (rxe in the guest): one-sided WRITE and READ, SEND/RECV, error
//! completions, no phantom completions, and the QP attribute policy in force on both ends.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::time::{Duration, Instant};

use rblk_fabric::{
    policy, Access, Completion, Endpoint, Fabric, Local, Memory, Op, QpConfig, Route, WcStatus, WorkRequest,
};
use rblk_tests::rxe::{connect, connect_along, rdma, wait_one, Peer, STEP};

const MIB: usize = 1 << 20;

fn pattern(seed: u64, buf: &mut [u8]) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for b in buf.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

/// Four signaled 1 MiB work requests over `local`, ids `first_id..first_id+4`, ops from `op(i)`.
fn one_mib_each(local: &rblk_fabric::Mr, first_id: u64, op: impl Fn(u64) -> Op) -> Vec<WorkRequest<'_>> {
    (0..4u64)
        .map(|i| WorkRequest {
            wr_id: first_id + i,
            op: op(i),
            local: Local::Region { mr: local, offset: i as usize * MIB, len: MIB as u32 },
            signaled: true,
        })
        .collect()
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn write_read_back_and_send_a_proto_message() {
    let rdma = rdma();
    let peer = Peer::start(&rdma, 4 * MIB);
    let mut ep = connect(&rdma, &peer);
    let (raddr, rkey) = peer.remote();

    let local = ep.pd().register(&Memory::anonymous(4 * MIB).unwrap(), Access::LOCAL).unwrap();
    let mut expect = vec![0u8; 4 * MIB];
    pattern(42, &mut expect);
    local.memory().write_at(0, &expect).unwrap();

    // 4 MiB as four 1 MiB WRITEs in one doorbell, then read it back into a zeroed buffer.
    let writes = one_mib_each(&local, 100, |i| Op::Write { remote_addr: raddr + i * MIB as u64, rkey });
    ep.post(&writes).unwrap();
    let mut ids: Vec<u64> = (0..4).map(|_| wait_one(&mut ep).ok().unwrap().wr_id).collect();
    ids.sort();
    assert_eq!(ids, [100, 101, 102, 103]);

    let mut seen = vec![0u8; 4 * MIB];
    peer.memory.read_at(0, &mut seen).unwrap();
    assert!(seen == expect, "the target's memory holds what was written");

    local.memory().write_at(0, &vec![0u8; 4 * MIB]).unwrap();
    let reads = one_mib_each(&local, 200, |i| Op::Read { remote_addr: raddr + i * MIB as u64, rkey });
    ep.post(&reads).unwrap();
    for _ in 0..4 {
        wait_one(&mut ep).ok().unwrap();
    }
    let mut back = vec![0u8; 4 * MIB];
    local.memory().read_at(0, &mut back).unwrap();
    let first_bad = back.iter().zip(&expect).position(|(a, b)| a != b);
    assert_eq!(first_bad, None, "read back differs from what was written");

    // A control message over SEND/RECV, inline, parsed on the other side.
    let mut msg = [0u8; rblk_proto::MSG_SIZE];
    let n = rblk_proto::Message::Keepalive.encode(77, &mut msg).unwrap();
    ep.post(&[WorkRequest { wr_id: 300, op: Op::Send, local: Local::Inline(&msg[..n]), signaled: true }]).unwrap();
    assert_eq!(wait_one(&mut ep).ok().unwrap().wr_id, 300);
    let (c, bytes) = peer.recv();
    assert_eq!(c.status, WcStatus::SUCCESS);
    assert_eq!(c.wr_id, 7);
    assert_eq!(c.byte_len as usize, n);
    let (tag, parsed) = rblk_proto::parse(&bytes).expect("the peer parses what it received");
    assert_eq!(tag, 77);
    assert_eq!(parsed, rblk_proto::Message::Keepalive);
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn wrong_rkey_is_a_remote_access_error_and_both_qps_go_to_error() {
    let rdma = rdma();
    let peer = Peer::start(&rdma, MIB);
    let mut ep = connect(&rdma, &peer);
    let (raddr, rkey) = peer.remote();
    let local = ep.pd().register(&Memory::anonymous(8192).unwrap(), Access::LOCAL).unwrap();
    let read = |wr_id, rkey| WorkRequest {
        wr_id,
        op: Op::Read { remote_addr: raddr, rkey },
        local: Local::Region { mr: &local, offset: 0, len: 4096 },
        signaled: true,
    };
    ep.post(&[read(1, rkey.wrapping_add(0x100)), read(2, rkey)]).unwrap();
    let first = wait_one(&mut ep);
    assert_eq!((first.wr_id, first.status), (1, WcStatus::REM_ACCESS_ERR));
    assert!(first.ok().unwrap_err().is_remote_access());
    // The READ queued behind it (with the right rkey) is flushed: the connection is dead.
    let second = wait_one(&mut ep);
    assert_eq!((second.wr_id, second.status), (2, WcStatus::WR_FLUSH_ERR));
    let initiator = ep.attributes().unwrap();
    assert_eq!(initiator.state, "ERR");
    // The target's QP: rxe moves the responder to ERR as well (shown here, so the test documents it).
    let deadline = Instant::now() + STEP;
    let target = loop {
        let a = peer.attributes();
        if a.state == "ERR" || Instant::now() > deadline {
            break a;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("after a bad rkey: initiator QP {}, target QP {}", initiator.state, target.state);
    assert_eq!(target.state, "ERR", "one bad access kills the connection on both ends");
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn ten_thousand_writes_complete_exactly_once_with_no_phantoms() {
    const TOTAL: u64 = 10_000;
    const DEPTH: usize = 32;
    const BS: usize = 4096;
    const SLOTS: u64 = 1024; // 4 MiB of target region
    let rdma = rdma();
    let peer = Peer::start(&rdma, SLOTS as usize * BS);
    let mut ep = connect(&rdma, &peer);
    let (raddr, rkey) = peer.remote();
    let local = ep.pd().register(&Memory::anonymous(DEPTH * BS).unwrap(), Access::LOCAL).unwrap();

    let mut seen = HashSet::new();
    let mut free: Vec<usize> = (0..DEPTH).collect();
    let mut slot_of = std::collections::HashMap::new();
    let mut next = 0u64;
    let mut buf = vec![0u8; BS];
    let mut out = [Completion::EMPTY; 32];
    let deadline = Instant::now() + Duration::from_secs(600);
    while seen.len() < TOTAL as usize {
        while next < TOTAL && !free.is_empty() {
            let slot = free.pop().unwrap();
            pattern(next, &mut buf);
            local.memory().write_at(slot * BS, &buf).unwrap();
            let wr_id = next + 1; // unique and nonzero: a phantom wr_id 0 cannot hide
            ep.post(&[WorkRequest {
                wr_id,
                op: Op::Write { remote_addr: raddr + (next % SLOTS) * BS as u64, rkey },
                local: Local::Region { mr: &local, offset: slot * BS, len: BS as u32 },
                signaled: true,
            }])
            .unwrap();
            slot_of.insert(wr_id, slot);
            next += 1;
        }
        let n = ep.wait(&mut out, Duration::from_micros(50), deadline).unwrap();
        assert!(n > 0 || Instant::now() < deadline, "writes stalled at {} of {TOTAL}", seen.len());
        for c in &out[..n] {
            assert_eq!(c.status, WcStatus::SUCCESS, "completion {c:?}");
            assert!(seen.insert(c.wr_id), "wr_id {} completed twice", c.wr_id);
            let slot = slot_of.remove(&c.wr_id).unwrap_or_else(|| panic!("unknown wr_id {}", c.wr_id));
            free.push(slot);
        }
    }
    assert_eq!(seen.len(), TOTAL as usize);
    assert!(seen.iter().all(|&id| (1..=TOTAL).contains(&id)));
    // Nothing more may surface.
    let quiet_until = Instant::now() + Duration::from_millis(100);
    while Instant::now() < quiet_until {
        assert_eq!(ep.poll(&mut out).unwrap(), 0, "phantom completion after all writes: {:?}", out[0]);
    }
    // Each slot holds the pattern of the last write that landed there.
    let mut got = vec![0u8; BS];
    for i in TOTAL - SLOTS..TOTAL {
        pattern(i, &mut buf);
        peer.memory.read_at(((i % SLOTS) as usize) * BS, &mut got).unwrap();
        assert!(got == buf, "slot {} does not hold write {i}", i % SLOTS);
    }
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn read_depth_and_retry_policy_are_in_force_on_both_ends() {
    let rdma = rdma();
    let peer = Peer::start(&rdma, MIB);
    let mut ep = connect(&rdma, &peer);
    let (raddr, rkey) = peer.remote();
    let mine = ep.attributes().unwrap();
    let theirs = peer.attributes();
    eprintln!("initiator QP: {mine:?}\ntarget QP: {theirs:?}");
    assert_eq!(mine.state, "RTS");
    assert!(mine.max_rd_atomic >= policy::READ_DEPTH, "initiator read depth {}", mine.max_rd_atomic);
    assert!(theirs.max_dest_rd_atomic >= policy::READ_DEPTH, "target responder depth {}", theirs.max_dest_rd_atomic);
    for a in [&mine, &theirs] {
        assert_eq!(a.timeout, policy::TIMEOUT);
        assert_eq!(a.retry_cnt, policy::RETRY_COUNT);
        assert_eq!(a.rnr_retry, policy::RNR_RETRY);
    }
    assert_eq!(theirs.min_rnr_timer, policy::MIN_RNR_TIMER);

    // 64 READs posted at once, 16 in flight at a time: all complete well within the deadline
    // (a read depth of 0 would hang here instead of failing, hence the deadline).
    let local = ep.pd().register(&Memory::anonymous(64 * 4096).unwrap(), Access::LOCAL).unwrap();
    let wrs: Vec<_> = (0..64u64)
        .map(|i| WorkRequest {
            wr_id: i + 1,
            op: Op::Read { remote_addr: raddr + i * 4096, rkey },
            local: Local::Region { mr: &local, offset: i as usize * 4096, len: 4096 },
            signaled: true,
        })
        .collect();
    ep.post(&wrs).unwrap();
    let mut done = HashSet::new();
    for _ in 0..64 {
        let c = wait_one(&mut ep).ok().unwrap();
        assert!(done.insert(c.wr_id));
    }
    assert_eq!(done.len(), 64);
}

/// `Route::tos` reaches the wire: rdma_cm turns the type of service set with
/// `rdma_set_option(RDMA_OPTION_ID_TOS)` into the QP's traffic class, which rxe writes into every
/// RoCEv2 packet's IP TOS byte. Without the `set_tos` call the initiator's QP reports 0.
#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn tos_becomes_the_qps_traffic_class() {
    let rdma = rdma();
    for tos in [None, Some(106u8)] {
        let peer = Peer::start(&rdma, MIB);
        let route = Route { device: Some(rdma.device.clone()), tos, ..Route::default() };
        let ep = connect_along(&peer, &route);
        let got = ep.attributes().unwrap().traffic_class;
        eprintln!("tos {tos:?}: initiator QP traffic class {got}");
        assert_eq!(got, tos.unwrap_or(0), "tos {tos:?}");
    }
}

/// An IP address added to the device's netdev for one test, removed again on drop.
struct ExtraAddr {
    addr: IpAddr,
    netdev: String,
}

impl ExtraAddr {
    fn add(rdma: &rblk_tests::rxe::Rdma) -> ExtraAddr {
        let IpAddr::V4(v4) = rdma.addr else { panic!("this test needs an IPv4 RBLK_ADDR, not {}", rdma.addr) };
        let [a, b, c, d] = v4.octets();
        let addr = IpAddr::V4(Ipv4Addr::new(a, b, c, if d == 77 { 78 } else { 77 }));
        let devices = rblk_fabric::list_devices().unwrap();
        let dev = devices.iter().find(|d| d.name == rdma.device).expect("the test device is listed");
        let netdev = dev.ports.iter().flat_map(|p| &p.netdevs).next().expect("an rxe device has a netdev").clone();
        let out = Command::new("ip").args(["addr", "add", &format!("{addr}/32"), "dev", &netdev]).output().unwrap();
        assert!(out.status.success(), "ip addr add: {}", String::from_utf8_lossy(&out.stderr));
        ExtraAddr { addr, netdev }
    }
}

impl Drop for ExtraAddr {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["addr", "del", &format!("{}/32", self.addr), "dev", &self.netdev]).status();
    }
}

/// `Route::source` is rdma_resolve_addr's source: with a second address on the netdev, the
/// passive side sees the connection come from the address asked for, and from the primary one
/// without it (so the test fails if the source were ignored). A source on no RDMA device is
/// refused with an error naming rdma_resolve_addr.
#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn source_addr_picks_the_local_address() {
    let rdma = rdma();
    let extra = ExtraAddr::add(&rdma);
    // rxe adds the GID for a new address asynchronously: retry the first connection briefly.
    let deadline = Instant::now() + Duration::from_secs(15);
    let route = Route { device: Some(rdma.device.clone()), source: Some(extra.addr), ..Route::default() };
    let from = loop {
        let peer = Peer::start(&rdma, 4096);
        let qdeadline = Instant::now() + STEP;
        match Endpoint::resolve(Fabric::Verbs, peer.addr, None, &route, &QpConfig::default(), qdeadline)
            .and_then(|mut ep| ep.connect(&[], qdeadline).map(|()| ep))
        {
            Ok(_ep) => break peer.connected_from(),
            Err(e) if Instant::now() < deadline => {
                eprintln!("not yet: {}", rblk_fabric::Chain(&e));
                std::thread::sleep(Duration::from_millis(500));
                // The peer waits STEP for a request: let it go by connecting normally.
                let _ = connect(&rdma, &peer);
            }
            Err(e) => panic!("connecting from {}: {}", extra.addr, rblk_fabric::Chain(&e)),
        }
    };
    assert_eq!(from.map(|a| a.ip()), Some(extra.addr), "the passive side sees the source address");

    let peer = Peer::start(&rdma, 4096);
    let _ep = connect(&rdma, &peer);
    assert_eq!(peer.connected_from().map(|a| a.ip()), Some(rdma.addr), "without a source, the primary address");

    // 192.0.2.1 (TEST-NET-1) is on no interface here.
    let bad = Route { source: Some("192.0.2.1".parse().unwrap()), ..Route::default() };
    let peer = Peer::start(&rdma, 4096);
    let err = Endpoint::resolve(Fabric::Verbs, peer.addr, None, &bad, &QpConfig::default(), Instant::now() + STEP)
        .map(drop)
        .unwrap_err();
    let text = rblk_fabric::Chain(&err).to_string();
    eprintln!("source on no device: {text}");
    assert!(text.contains("rdma_resolve_addr") || text.contains("address resolution"), "{text}");
    let _ = connect(&rdma, &peer);
}
