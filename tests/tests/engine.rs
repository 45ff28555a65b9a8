//! The block-I/O engine (`rblk_initiator::engine`) against a real target: on the host over the
//! in-memory fabric, and in the guest over rxe (the same scenarios).
//!
//! What each would catch:
//! - `unaligned_requests_match_a_byte_array`: splitting, covering-block reads and
//!   read-modify-write; a wrong edge, offset or trim shows as a byte that differs from the model.
//! - `concurrent_writes_to_one_block_keep_every_byte`: the range locks. Four threads write their
//!   own bytes of the same blocks (read-modify-writes) and aligned writes land in between; without
//!   the exclusive hold a write-back of an old block copy loses another thread's bytes.
//! - `a_waiting_read_modify_write_is_not_starved`: the barrier's ordering. With requests that
//!   keep arriving, an unaligned write must still finish.
//! - `flush_sends_only_what_is_dirty`: nothing is sent when clean; FUA flushes.
//! - `without_reconnect_a_vanished_peer_fails_requests_instead_of_hanging`: a severed connection
//!   (mem) with ctrl_loss_tmo 0 ends every request with an error.

use std::sync::Arc;
use std::time::Duration;

use rblk_fabric::Fabric;
use rblk_initiator::engine::{Data, IoOp, Request};
use rblk_initiator::{Engine, OpenMode, Options, Session};
use rblk_tests::on_both_fabrics;
use rblk_tests::target::{Spec, Target};

const MIB: u64 = 1 << 20;

fn engine(t: &Target, lanes: u32) -> Engine {
    let opts = Options { fabric: t.fabric(), ..Options::default() };
    let vol = Session::connect(&format!("rblk://{}/v", t.addr()), &opts).unwrap().open(OpenMode::ReadWrite).unwrap();
    Engine::new(vol, lanes).unwrap()
}

fn target(fabric: Fabric, size: u64) -> Target {
    Target::start(fabric, &Spec { volumes: vec![("v", size)], key: None })
}

/// xorshift64*.
fn rng(x: &mut u64) -> u64 {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

fn unaligned_requests_match_a_byte_array(fabric: Fabric) {
    let t = target(fabric, 4 * MIB);
    let e = engine(&t, 1);
    // Small pieces (16 KiB), so requests of up to 80 KiB split into several, 8 in flight.
    let mut lane = e.lane(8, 16 << 10).unwrap();
    let size = e.size();
    let mut model = vec![0u8; size as usize];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut pending = Vec::new();
    for step in 0..300u64 {
        let len = 1 + rng(&mut x) % (80 << 10);
        let offset = rng(&mut x) % (size - len + 1);
        let (o, n) = (offset as usize, len as usize);
        if rng(&mut x).is_multiple_of(3) {
            // A read sees every write submitted before it only once those finished: drain first.
            while lane.pending() > 0 {
                lane.wait().unwrap();
                while let Some(f) = lane.next() {
                    f.result.unwrap();
                }
            }
            let mut back = vec![0; n];
            lane.read_at(&mut back, offset).unwrap();
            assert!(back == model[o..o + n], "step {step}: read of {len} at {offset} differs");
        } else {
            let data: Vec<u8> = (0..n).map(|i| (step as u8).wrapping_mul(31).wrapping_add(i as u8)).collect();
            model[o..o + n].copy_from_slice(&data);
            // Overlapping writes in flight together finish in any order: keep them disjoint by
            // draining whenever this one overlaps one still pending.
            if pending.iter().any(|&(a, b)| a < offset + len && offset < b) {
                while lane.pending() > 0 {
                    lane.wait().unwrap();
                    while let Some(f) = lane.next() {
                        f.result.unwrap();
                    }
                }
                pending.clear();
            }
            pending.push((offset, offset + len));
            lane.submit(Request { tag: step, op: IoOp::Write, offset, len, fua: false, data: Data::Bytes(data) });
        }
    }
    while lane.pending() > 0 {
        lane.wait().unwrap();
        while let Some(f) = lane.next() {
            f.result.unwrap();
        }
    }
    let mut all = vec![0; size as usize];
    e.read_at(&mut all, 0).unwrap();
    assert!(all == model, "the volume holds the model");
    let s = e.stats();
    assert!(s.read_modify_writes > 100, "{s:?}");
    drop(lane);
    e.close().unwrap();
}

fn concurrent_writes_to_one_block_keep_every_byte(fabric: Fabric) {
    let t = target(fabric, MIB);
    let e = Arc::new(engine(&t, 4));
    let bs = u64::from(e.block_size());
    // Blocks 0..4; thread k owns bytes k, k+4, k+8, ... of each.
    let threads = 4u64;
    let rounds = 40u64;
    std::thread::scope(|s| {
        for k in 0..threads {
            let e = Arc::clone(&e);
            s.spawn(move || {
                for r in 0..rounds {
                    for block in 0..4u64 {
                        for i in (k..bs).step_by(threads as usize * 97) {
                            e.write_at(&[(k * 50 + r) as u8], block * bs + i).unwrap();
                        }
                    }
                }
            });
        }
        // Aligned writes of block 5, in between, from another lane of their own.
        let e2 = Arc::clone(&e);
        s.spawn(move || {
            let mut lane = e2.lane(4, bs as usize).unwrap();
            for r in 0..rounds {
                lane.write_at(&vec![r as u8; bs as usize], 5 * bs, false).unwrap();
            }
        });
    });
    let mut back = vec![0; (4 * bs) as usize];
    e.read_at(&mut back, 0).unwrap();
    for block in 0..4u64 {
        for k in 0..threads {
            for i in (k..bs).step_by(threads as usize * 97) {
                let got = back[(block * bs + i) as usize];
                assert_eq!(got, (k * 50 + rounds - 1) as u8, "block {block} byte {i} (thread {k}) lost its last write");
            }
        }
    }
    let e = Arc::try_unwrap(e).unwrap();
    assert!(e.stats().read_modify_writes >= threads * rounds, "{:?}", e.stats());
    e.close().unwrap();
}

fn a_waiting_read_modify_write_is_not_starved(fabric: Fabric) {
    let t = target(fabric, MIB);
    let e = engine(&t, 1);
    let mut lane = e.lane(2, 4096).unwrap();
    let read = |tag| Request {
        tag,
        op: IoOp::Read,
        offset: (tag % 64) * 4096,
        len: 4096,
        fua: false,
        data: Data::Bytes(Vec::new()),
    };
    for tag in 0..4 {
        lane.submit(read(tag));
    }
    // Two waiting read-modify-writes: the second one's parts must not queue behind requests the
    // first one holds back.
    lane.submit(Request {
        tag: 998,
        op: IoOp::Write,
        offset: 8200,
        len: 10,
        fua: false,
        data: Data::Bytes(vec![8; 10]),
    });
    lane.submit(Request { tag: 999, op: IoOp::Write, offset: 10, len: 10, fua: false, data: Data::Bytes(vec![7; 10]) });
    let mut next = 4;
    let mut written = false;
    for _ in 0..1000 {
        lane.wait().unwrap();
        while let Some(f) = lane.next() {
            f.result.unwrap();
            if f.tag == 999 {
                written = true;
            }
            // A new read for every one finished: the lane is never idle of its own accord.
            lane.submit(read(next));
            next += 1;
        }
        if written {
            break;
        }
    }
    assert!(written, "the unaligned write never ran while reads kept coming");
    drop(lane);
    e.close().unwrap();
}

fn flush_sends_only_what_is_dirty(fabric: Fabric) {
    let t = target(fabric, MIB);
    let e = engine(&t, 1);
    e.flush().unwrap();
    assert_eq!((e.stats().flushes, e.stats().flushes_skipped), (0, 1), "clean: nothing sent");
    e.write_at(&[1; 8192], 4096).unwrap();
    assert_eq!(e.unflushed_bytes(), Some(8192));
    e.flush().unwrap();
    assert_eq!(e.unflushed_bytes(), Some(0));
    assert_eq!(e.stats().flushes, 1);
    let mut lane = e.lane(4, 4096).unwrap();
    lane.write_at(&[2; 4096], 0, true).unwrap();
    assert_eq!(e.stats().flushes, 2, "FUA flushes");
    // An unaligned FUA write flushes its covering block.
    lane.write_at(&[3; 5], 100, true).unwrap();
    assert_eq!(e.stats().flushes, 3);
    drop(lane);
    e.close().unwrap();
}

/// An engine made with no shared lanes opens one only when a synchronous call needs it (ublk and
/// NBD give their threads lanes of their own and should not pay for an idle one).
fn no_shared_lane_until_a_synchronous_call(fabric: Fabric) {
    let t = target(fabric, MIB);
    let e = engine(&t, 0);
    assert_eq!(e.queues(), 0);
    let mut lane = e.lane(4, 4096).unwrap();
    lane.write_at(&[9; 4096], 0, false).unwrap();
    assert_eq!(e.queues(), 0, "a lane of its own is not a shared one");
    let mut back = [0u8; 4096];
    e.read_at(&mut back, 0).unwrap();
    assert_eq!((back, e.queues()), ([9; 4096], 1));
    drop(lane);
    e.close().unwrap();
}

/// In-memory only: it severs the connection by fault injection (over rxe, the ublk tests kill
/// processes instead). Without reconnecting (ctrl_loss_tmo 0); `reconnect.rs` severs with it.
#[test]
fn without_reconnect_a_vanished_peer_fails_requests_instead_of_hanging() {
    let t = target(Fabric::Mem, MIB);
    let opts = Options { fabric: Fabric::Mem, reconnect: rblk_initiator::Reconnect::NEVER, ..Options::default() };
    let vol = Session::connect(&format!("rblk://{}/v", t.addr()), &opts).unwrap().open(OpenMode::ReadWrite).unwrap();
    let e = Engine::new(vol, 1).unwrap();
    let mut lane = e.lane(4, 4096).unwrap();
    lane.set_io_timeout(Duration::from_secs(5));
    rblk_fabric::mem::sever(lane.qp_num());
    for tag in 0..4 {
        lane.submit(Request {
            tag,
            op: IoOp::Write,
            offset: tag * 4096,
            len: 4096,
            fua: false,
            data: Data::Bytes(vec![1; 4096]),
        });
    }
    let mut failed = 0;
    while lane.pending() > 0 {
        if lane.wait().is_err() {
            break;
        }
        while let Some(f) = lane.next() {
            assert!(f.result.is_err(), "a write on a severed connection succeeded");
            failed += 1;
        }
    }
    assert_eq!(failed, 4, "every request ends with an error");
}

on_both_fabrics!(
    unaligned_requests_match_a_byte_array,
    concurrent_writes_to_one_block_keep_every_byte,
    a_waiting_read_modify_write_is_not_starved,
    flush_sends_only_what_is_dirty,
    no_shared_lane_until_a_synchronous_call,
);
