//! rblk-target's side of reconnect (issue 10), driven by hand-made control messages: feature
//! negotiation, a reconnecting OPEN that tears the old session down before it answers, volume
//! instance identities, and the reaping of silent initiators. Scenarios named in
//! `on_both_fabrics!` also run in the guest against the real daemon; the others need the
//! server's configuration (state dir, keepalive timeout) and run in-process only.

use std::time::{Duration, Instant};

use rblk_fabric::channel;
use rblk_fabric::{Access, Completion, Fabric, Local, Memory, Op, WcStatus, WorkRequest};
use rblk_proto::{ConnectData, ErrorCode, Message, OpenMode, Opened, Resume, StatsReply, FEATURES, FEATURE_RECONNECT};
use rblk_tests::raw::Raw;
use rblk_tests::target::{Spec, Target};

const MIB: u64 = 1 << 20;

rblk_tests::on_both_fabrics!(instance_only_with_the_reconnect_feature_and_resume_needs_it,);

fn raw(d: &Target) -> Raw {
    Raw::connect(d.fabric(), d.addr(), ConnectData::NewSession).expect("connect to the target")
}

fn volume(name: &'static str, size: u64) -> Spec {
    Spec { volumes: vec![(name, size)], key: None }
}

fn stats(r: &mut Raw) -> StatsReply {
    match rblk_proto::parse(&r.request(&Message::Stats)) {
        Ok((_, Message::StatsReply(s))) => s,
        other => panic!("STATS answered with {other:?}"),
    }
}

/// A one-sided READ (or WRITE) of one block at offset 0 with `o`'s rkey: its completion status,
/// or the post's error (a QP already torn down). Control completions (keepalives from the
/// target) are skipped.
fn access(r: &mut Raw, o: &Opened, write: bool) -> Result<WcStatus, rblk_fabric::Error> {
    let buf = r.ep.pd().register(&Memory::anonymous(4096).unwrap(), Access::LOCAL).unwrap();
    let op = if write {
        Op::Write { remote_addr: o.remote_addr, rkey: o.rkey }
    } else {
        Op::Read { remote_addr: o.remote_addr, rkey: o.rkey }
    };
    r.ep.post(&[WorkRequest {
        wr_id: 9,
        op,
        local: Local::Region { mr: &buf, offset: 0, len: 4096 },
        signaled: true,
    }])?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut out = [Completion::EMPTY; 8];
    loop {
        let n = r.ep.wait(&mut out, Duration::from_micros(50), deadline)?;
        if let Some(c) = out[..n].iter().find(|c| !channel::is_control(c.wr_id)) {
            return Ok(c.status);
        }
        assert!(Instant::now() < deadline, "no completion for the one-sided access");
    }
}

fn instance_only_with_the_reconnect_feature_and_resume_needs_it(fabric: Fabric) {
    let d = Target::start(fabric, &volume("v", 4 * MIB));

    // An initiator without the feature gets the old OPENED body, whatever the target supports.
    let mut old = raw(&d);
    let announced = old.hello_with(FEATURES);
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
    sneaky.hello_with(FEATURES);
    let resume = Resume { session_id: n.session_id, token: n.token };
    let (code, text) = sneaky.open_with("v", OpenMode::ReadWrite, Some(resume)).unwrap_err();
    assert_eq!(code, ErrorCode::Unexpected, "{text}");
    assert_eq!(access(&mut new, &n, false).unwrap(), WcStatus::SUCCESS, "the named session still works");
    assert_eq!(stats(&mut new).registrations, 2);
}
