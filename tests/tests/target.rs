//! rblk-target driven by hand-made control messages and raw one-sided access: what the target
//! enforces itself, whatever an initiator does. Each scenario runs twice: `mem::*` on the host over
//! the in-memory fabric (the server in-process), `rxe::*` in the guest against the real daemon.

use std::time::{Duration, Instant};

use rblk_fabric::{Access, Fabric, Local, Memory, Op, WcStatus, WorkRequest};
use rblk_proto::{ConnectData, ErrorCode, Message, OpenMode, Opened, StatsReply};
use rblk_tests::raw::Raw;
use rblk_tests::target::{Spec, Target};

const MIB: usize = 1 << 20;

rblk_tests::on_both_fabrics!(
    malformed_and_wrong_version_hello_get_errors_and_the_daemon_keeps_serving,
    read_only_rkey_refuses_writes_at_the_target,
    out_of_range_read_kills_only_its_own_connection,
    with_a_key_wrong_and_missing_proofs_get_no_rkey,
    registrations_are_released_after_close_and_disconnect,
);

fn raw(d: &Target) -> Raw {
    Raw::connect(d.fabric(), d.addr(), ConnectData::NewSession).expect("connect to the target")
}

fn volume(name: &'static str, size: usize) -> Spec {
    Spec { volumes: vec![(name, size as u64)], key: None }
}

fn error_of(bytes: &[u8]) -> (ErrorCode, String) {
    match rblk_proto::parse(bytes) {
        Ok((_, Message::Error { code, text })) => (code, text.to_owned()),
        other => panic!("expected ERROR, got {other:?}"),
    }
}

/// One-sided transfer of `len` bytes between `buf` (offset 0) and the volume at `offset`.
fn transfer(r: &mut Raw, o: &Opened, buf: &rblk_fabric::Mr, write: bool, offset: u64, len: usize) -> WcStatus {
    let remote_addr = o.remote_addr + offset;
    let op = if write { Op::Write { remote_addr, rkey: o.rkey } } else { Op::Read { remote_addr, rkey: o.rkey } };
    r.ep.post(&[WorkRequest {
        wr_id: 9,
        op,
        local: Local::Region { mr: buf, offset: 0, len: len as u32 },
        signaled: true,
    }])
    .unwrap();
    r.wait_for(9).expect("wait for the access").status
}

fn filled(r: &Raw, len: usize, byte: u8) -> rblk_fabric::Mr {
    let m = r.ep.pd().register(&Memory::anonymous(len).unwrap(), Access::LOCAL).unwrap();
    m.memory().write_at(0, &vec![byte; len]).unwrap();
    m
}

/// Also catches an OPEN's name logged raw (issue 39): the refusal's text, which the target logs
/// too, must hold the name escaped ([`rblk_proto::printable`]).
fn malformed_and_wrong_version_hello_get_errors_and_the_daemon_keeps_serving(fabric: Fabric) {
    let d = Target::start(fabric, &volume("v", 4 * MIB));

    let mut bad = raw(&d);
    bad.send_bytes(b"this is not an rblk message at all");
    let (code, text) = error_of(&bad.reply());
    assert_eq!(code, ErrorCode::Malformed, "{text}");

    let mut hello = [0u8; 64];
    let n = Message::Hello { features: 0 }.encode(5, &mut hello).unwrap();
    // Bytes 4..6 of the header are the version (little endian): claim version 9.
    hello[4..6].copy_from_slice(&9u16.to_le_bytes());
    bad.send_bytes(&hello[..n]);
    let (code, text) = error_of(&bad.reply());
    assert_eq!(code, ErrorCode::VersionMismatch);
    assert!(text.contains('9') && text.contains(&rblk_proto::VERSION.to_string()), "names both versions: {text}");

    // Everyone else is still served.
    let mut good = raw(&d);
    let o = good.open("v", OpenMode::ReadWrite);
    assert_eq!(o.size, 4 * MIB as u64);
    let (code, _) = error_of(&good.request(&Message::Open { mode: OpenMode::ReadWrite, name: "v", resume: None }));
    assert_eq!(code, ErrorCode::Unexpected, "a second OPEN on an open connection is refused");

    let mut other = raw(&d);
    other.request(&Message::Hello { features: 0 });
    let (code, text) =
        error_of(&other.request(&Message::Open { mode: OpenMode::ReadOnly, name: "nope", resume: None }));
    assert_eq!(code, ErrorCode::NoSuchVolume);
    assert_eq!(text, "no such volume nope", "names no volume the target has");
    // The same text goes into the target's log: a name with a newline must not forge a line
    // there (nor an escape drive the terminal that reads it).
    let mut forger = raw(&d);
    forger.request(&Message::Hello { features: 0 });
    let name = "x\nrblk-target: INFO opened, with a registration\x1b[2J";
    let (code, text) = error_of(&forger.request(&Message::Open { mode: OpenMode::ReadOnly, name, resume: None }));
    assert_eq!(code, ErrorCode::NoSuchVolume);
    assert_eq!(text, r"no such volume x\nrblk-target: INFO opened, with a registration\x1b[2J");
}

fn read_only_rkey_refuses_writes_at_the_target(fabric: Fabric) {
    let d = Target::start(fabric, &volume("v", 4 * MIB));
    let mut rw = raw(&d);
    let orw = rw.open("v", OpenMode::ReadWrite);
    let ones = filled(&rw, 4096, 0x11);
    assert_eq!(transfer(&mut rw, &orw, &ones, true, 0, 4096), WcStatus::SUCCESS);

    let mut ro = raw(&d);
    let oro = ro.open("v", OpenMode::ReadOnly);
    assert!(oro.flags.contains(rblk_proto::VolumeFlags::READ_ONLY));
    let zeros = filled(&ro, 4096, 0);
    assert_eq!(transfer(&mut ro, &oro, &zeros, true, 0, 4096), WcStatus::REM_ACCESS_ERR);

    let back = filled(&rw, 4096, 0xee);
    assert_eq!(transfer(&mut rw, &orw, &back, false, 0, 4096), WcStatus::SUCCESS);
    let mut got = vec![0u8; 4096];
    back.memory().read_at(0, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 0x11), "the read-only session changed the data");
}

fn out_of_range_read_kills_only_its_own_connection(fabric: Fabric) {
    let d = Target::start(fabric, &volume("v", 4 * MIB));
    let mut a = raw(&d);
    let oa = a.open("v", OpenMode::ReadWrite);
    let mut b = raw(&d);
    let ob = b.open("v", OpenMode::ReadWrite);
    let buf = filled(&a, 8192, 0);
    assert_eq!(transfer(&mut a, &oa, &buf, false, 4 * MIB as u64 - 4096, 8192), WcStatus::REM_ACCESS_ERR);

    // The other session goes on with verified I/O.
    for i in 0..50u8 {
        let w = filled(&b, 4096, i);
        assert_eq!(transfer(&mut b, &ob, &w, true, u64::from(i) * 4096, 4096), WcStatus::SUCCESS);
        let r = filled(&b, 4096, 0xff);
        assert_eq!(transfer(&mut b, &ob, &r, false, u64::from(i) * 4096, 4096), WcStatus::SUCCESS);
        let mut got = vec![0u8; 4096];
        r.memory().read_at(0, &mut got).unwrap();
        assert!(got.iter().all(|&x| x == i));
    }
    let s = b.stats();
    assert!(s.sessions >= 1);
}

fn with_a_key_wrong_and_missing_proofs_get_no_rkey(fabric: Fabric) {
    use hmac::Mac as _;
    // The daemon reads the key from a file and ignores the trailing newline.
    let key = b"correct horse battery staple, and more\n".to_vec();
    let d = Target::start(fabric, &Spec { volumes: vec![("v", 4 * MIB as u64)], key: Some(key) });
    let mac = |key: &[u8], nonce: &[u8]| {
        let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
        m.update(nonce);
        let out: [u8; 32] = m.finalize().into_bytes().into();
        out
    };
    let challenge = |r: &mut Raw| match rblk_proto::parse(&r.request(&Message::Hello { features: 0 })) {
        Ok((_, Message::Challenge { flags, nonce, .. })) => {
            assert!(flags.contains(rblk_proto::ChallengeFlags::AUTH_REQUIRED));
            nonce
        }
        other => panic!("HELLO answered with {other:?}"),
    };

    let mut none = raw(&d);
    challenge(&mut none);
    let (code, _) = error_of(&none.request(&Message::Open { mode: OpenMode::ReadWrite, name: "v", resume: None }));
    assert_eq!(code, ErrorCode::AuthRequired);

    let mut wrong = raw(&d);
    let nonce = challenge(&mut wrong);
    let (code, _) = error_of(&wrong.request(&Message::Auth { mac: mac(b"wrong key", &nonce), host: None }));
    assert_eq!(code, ErrorCode::AuthFailed);
    let (code, _) = error_of(&wrong.request(&Message::Open { mode: OpenMode::ReadWrite, name: "v", resume: None }));
    assert_eq!(code, ErrorCode::AuthRequired, "no rkey after a failed proof");

    let mut right = raw(&d);
    let nonce = challenge(&mut right);
    let ok = right.request(&Message::Auth { mac: mac(b"correct horse battery staple, and more", &nonce), host: None });
    assert!(matches!(rblk_proto::parse(&ok), Ok((_, Message::Ok { .. }))), "{ok:?}");
    let opened = right.request(&Message::Open { mode: OpenMode::ReadWrite, name: "v", resume: None });
    assert!(matches!(rblk_proto::parse(&opened), Ok((_, Message::Opened(_)))), "{opened:?}");
}

/// Waits until the target is back at `base` (registrations, pinned bytes, sessions) and, for a
/// daemon process, at its baseline VmPin and PD count (connection teardown is asynchronous),
/// then returns the last STATS.
fn settle(d: &Target, probe: &mut Raw, base: &StatsReply, pin_kb: Option<u64>, pds: Option<usize>) -> StatsReply {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = probe.stats();
        let done = (s.registrations, s.pinned_bytes, s.sessions)
            == (base.registrations, base.pinned_bytes, base.sessions)
            && d.vm_pin_kb() == pin_kb
            && d.pd_count() == pds;
        if done || Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn registrations_are_released_after_close_and_disconnect(fabric: Fabric) {
    let d = Target::start(fabric, &volume("v", 16 * MIB));
    // STATS needs an open session: the probe's own read-only one is the baseline.
    let mut probe = raw(&d);
    probe.open("v", OpenMode::ReadOnly);
    let base = probe.stats();
    let pin_base = d.vm_pin_kb();
    let pd_base = d.pd_count();
    if let Some(n) = pd_base {
        assert!(n >= 2, "the probe's session PD and librdmacm's own are visible in `rdma res show pd` ({n})");
    }
    assert_eq!((base.registrations, base.pinned_bytes), (1, 16 * MIB as u64));

    // CLOSE.
    let mut c = raw(&d);
    c.open("v", OpenMode::ReadWrite);
    let during = probe.stats();
    assert_eq!((during.registrations, during.pinned_bytes), (2, 2 * 16 * MIB as u64));
    if let (Some(now), Some(base)) = (d.vm_pin_kb(), pin_base) {
        assert!(now >= base + 16 * 1024, "VmPin shows the registration: {now} kB, baseline {base} kB");
    }
    let ok = c.request(&Message::Close);
    assert!(matches!(rblk_proto::parse(&ok), Ok((_, Message::Ok { .. }))));
    let after = settle(&d, &mut probe, &base, pin_base, pd_base);
    assert_eq!((after.registrations, after.pinned_bytes), (1, 16 * MIB as u64), "after CLOSE");
    assert_eq!(after.sessions, base.sessions, "the closed session is forgotten");
    assert_eq!(d.pd_count(), pd_base, "its protection domain is gone");
    assert_eq!(d.vm_pin_kb(), pin_base, "VmPin back to baseline after CLOSE");
    drop(c);

    // Disconnect without CLOSE.
    let mut c = raw(&d);
    c.open("v", OpenMode::ReadOnly);
    assert_eq!(probe.stats().registrations, 2);
    drop(c);
    let after = settle(&d, &mut probe, &base, pin_base, pd_base);
    assert_eq!((after.registrations, after.pinned_bytes), (1, 16 * MIB as u64), "after a disconnect");
    assert_eq!(after.sessions, base.sessions, "the disconnected session is forgotten");
    assert_eq!(d.pd_count(), pd_base, "its protection domain is gone");
    assert_eq!(d.vm_pin_kb(), pin_base, "VmPin back to baseline after a disconnect");
}
