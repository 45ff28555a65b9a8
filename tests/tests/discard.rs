//! DISCARD and WRITE_ZEROES on the target (`FEATURE_DISCARD`), driven by hand-made control
//! messages and checked by one-sided READs: the target zeroes exactly the range asked, and
//! refuses what it must. Each scenario runs on the host over the in-memory fabric (`mem::*`) and
//! in the guest against the daemon (`rxe::*`).

use rblk_fabric::{Access, Fabric, Local, Memory, Op, WcStatus, WorkRequest};
use rblk_proto::{ConnectData, ErrorCode, Message, Opcode, OpenMode, Opened, ZeroFlags};
use rblk_tests::raw::Raw;
use rblk_tests::target::{Spec, Target};

const KIB: u64 = 1 << 10;
const SIZE: u64 = 1 << 20;

rblk_tests::on_both_fabrics!(
    discard_and_write_zeroes_zero_their_range_and_nothing_else,
    zeroing_requests_are_refused_where_they_must_be,
);

fn target(fabric: Fabric) -> Target {
    Target::start(fabric, &Spec { volumes: vec![("v", SIZE)], key: None })
}

fn raw(d: &Target) -> Raw {
    Raw::connect(d.fabric(), d.addr(), ConnectData::NewSession).expect("connect to the target")
}

/// Moves the whole volume between it and `mem` by one one-sided READ or WRITE.
fn transfer(r: &mut Raw, o: &Opened, mem: &std::sync::Arc<Memory>, write: bool) {
    let buf = r.ep.pd().register(mem, Access::LOCAL).unwrap();
    let (remote_addr, rkey) = (o.remote_addr, o.rkey);
    let op = if write { Op::Write { remote_addr, rkey } } else { Op::Read { remote_addr, rkey } };
    let wr =
        WorkRequest { wr_id: 7, op, local: Local::Region { mr: &buf, offset: 0, len: SIZE as u32 }, signaled: true };
    r.ep.post(&[wr]).unwrap();
    assert_eq!(r.wait_for(7).expect("the transfer").status, WcStatus::SUCCESS);
}

/// The whole volume, by one-sided READ.
fn read_all(r: &mut Raw, o: &Opened) -> Vec<u8> {
    let mem = Memory::anonymous(SIZE as usize).unwrap();
    transfer(r, o, &mem, false);
    let mut out = vec![0; SIZE as usize];
    mem.read_at(0, &mut out).unwrap();
    out
}

/// Fills the whole volume with a pattern no block repeats, by one-sided WRITE.
fn fill(r: &mut Raw, o: &Opened) -> Vec<u8> {
    let pattern: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8 | 1).collect();
    let mem = Memory::anonymous(SIZE as usize).unwrap();
    mem.write_at(0, &pattern).unwrap();
    transfer(r, o, &mem, true);
    pattern
}

fn answer(bytes: &[u8]) -> Result<Opcode, (ErrorCode, String)> {
    match rblk_proto::parse(bytes) {
        Ok((_, Message::Ok { answers })) => Ok(answers),
        Ok((_, Message::Error { code, text })) => Err((code, text.to_owned())),
        other => panic!("expected OK or ERROR, got {other:?}"),
    }
}

/// Catches a DISCARD or WRITE_ZEROES answered without zeroing the volume's memory (what the
/// initiators read through their rkeys), one that zeroes more than its range (a block on either
/// side, or the whole volume), and an answer that is not OK of the request.
fn discard_and_write_zeroes_zero_their_range_and_nothing_else(fabric: Fabric) {
    let d = target(fabric);
    let mut r = raw(&d);
    let o = r.open("v", OpenMode::ReadWrite);
    let mut want = fill(&mut r, &o);
    let zeroed = [(64 * KIB, 128 * KIB, None), (256 * KIB, 4 * KIB, Some(ZeroFlags::NO_UNMAP | ZeroFlags::FUA))];
    for (offset, len, flags) in zeroed {
        let (msg, op) = match flags {
            None => (Message::Discard { offset, len }, Opcode::Discard),
            Some(flags) => (Message::WriteZeroes { offset, len, flags }, Opcode::WriteZeroes),
        };
        assert_eq!(answer(&r.request(&msg)), Ok(op));
        want[offset as usize..(offset + len) as usize].fill(0);
    }
    let got = read_all(&mut r, &o);
    let first_wrong = got.iter().zip(&want).position(|(a, b)| a != b);
    assert_eq!(first_wrong, None, "the volume differs from the pattern with exactly the two ranges zeroed");
}

/// Catches a DISCARD honoured on a read-only session, for a range that is not whole blocks or
/// runs past the end (or overflows), from a peer that did not negotiate the feature bit (it
/// must get today's "not expected"), or before OPEN; and a refused one that zeroed anything.
fn zeroing_requests_are_refused_where_they_must_be(fabric: Fabric) {
    let d = target(fabric);
    let mut w = raw(&d);
    let o = w.open("v", OpenMode::ReadWrite);
    let want = fill(&mut w, &o);

    let mut ro = raw(&d);
    ro.open("v", OpenMode::ReadOnly);
    let refused = answer(&ro.request(&Message::Discard { offset: 0, len: 4 * KIB })).unwrap_err();
    assert_eq!(refused.0, ErrorCode::ReadOnly, "{refused:?}");

    let out_of_range = [
        (1, 4 * KIB),
        (4 * KIB, 512),
        (SIZE - 4 * KIB, 8 * KIB),
        (SIZE, 4 * KIB),
        (u64::MAX - 4095, 4 * KIB - 1),
        (u64::MAX - 8191, 4 * KIB),
    ];
    for (offset, len) in out_of_range {
        // A connection of its own: each refusal counts towards the malformed requests after which
        // the target cuts a connection.
        let mut bad = raw(&d);
        bad.open("v", OpenMode::ReadWrite);
        for msg in [Message::Discard { offset, len }, Message::WriteZeroes { offset, len, flags: ZeroFlags::empty() }] {
            let reply = bad.request(&msg);
            let refused = answer(&reply).unwrap_err();
            assert_eq!(refused.0, ErrorCode::OutOfRange, "{msg:?}: {refused:?}");
            assert!(refused.1.contains("volume v"), "names the volume: {refused:?}");
        }
    }

    // HELLO without the bit: the requests are not part of its protocol.
    let mut old = raw(&d);
    let features = rblk_proto::FEATURES & !rblk_proto::FEATURE_KEEPALIVE & !rblk_proto::FEATURE_DISCARD;
    assert_eq!(old.hello_with(features) & rblk_proto::FEATURE_DISCARD, rblk_proto::FEATURE_DISCARD);
    old.open_with("v", OpenMode::ReadWrite, None).expect("open");
    let refused = answer(&old.request(&Message::Discard { offset: 0, len: 4 * KIB })).unwrap_err();
    assert_eq!(refused.0, ErrorCode::Unexpected, "{refused:?}");

    let mut early = raw(&d);
    early.hello_with(rblk_proto::FEATURES & !rblk_proto::FEATURE_KEEPALIVE);
    let refused = answer(&early.request(&Message::WriteZeroes { offset: 0, len: 4 * KIB, flags: ZeroFlags::empty() }))
        .unwrap_err();
    assert_eq!(refused.0, ErrorCode::Unexpected, "{refused:?}");

    assert!(read_all(&mut w, &o) == want, "a refused request changed the volume");
}

/// scripts/lib/test_discard.py: the unit tests of scripts/discard-rxe.sh's analysis (which
/// counters and times a goal reads, the loopback bound on bytes, which steps stay down).
#[test]
fn the_discard_script_s_analysis_passes_its_unit_tests() {
    rblk_tests::python_unittest("test_discard");
}
