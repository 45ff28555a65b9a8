//! Growing a served volume (issue 44): the target adds a memory segment, binds each QP's
//! window over it and tells initiators that know segments at once (RESIZED); the library splits
//! I/O at the segment boundary; older initiators keep the size they opened. Each runs over the
//! in-memory fabric on the host and over rxe in the guest (the daemon, grown by a SIGHUP).
//!
//! - `the_library_learns_a_grow_at_once_and_io_crosses_the_old_end`: would catch a RESIZED not
//!   sent or not taken (the size stays), a window not bound over the new segment (its rkey
//!   fails), an I/O across the old end sent as one work request under one rkey (a remote
//!   access error, then a reconnect: a window reaches one registration only; checked with the
//!   split removed), a hook not called, and a grow that disturbs I/O running meanwhile (a
//!   verify error or a reconnect of a queue writing and reading the volume as it grows).
//! - `an_older_initiator_keeps_its_size_and_a_fresh_open_gets_the_new_one`: would catch
//!   a RESIZED or a segments tail sent to an initiator without FEATURE_SEGMENTS (it cannot parse
//!   them), a resumed older session told the new size (its continuity check refuses a changed
//!   volume and fails its I/O), and a fresh older OPEN given a window over one segment only.
//! - `the_grow_scripts_analysis`: scripts/lib/test_grow.py, the unit tests of
//!   scripts/grow-rxe.sh's analysis (resize time from the request, the hook's latency, the goals
//!   met or missed) on recorded lines.
//! - `a_revoked_session_loses_every_segment`: would catch a revocation (here a reload that
//!   takes the host off the volume's list) that deallocates a QP's first window only: the rkey
//!   RESIZED gave for the added segment would still READ.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rblk_fabric::{Fabric, WcStatus};
use rblk_initiator::{Done, OpenMode, Options, Session};
use rblk_proto::{ConnectData, Message, Resume, FEATURES, FEATURE_KEEPALIVE, FEATURE_SEGMENTS};
use rblk_tests::raw::Raw;
use rblk_tests::target::Target;

rblk_tests::on_both_fabrics!(
    the_library_learns_a_grow_at_once_and_io_crosses_the_old_end,
    an_older_initiator_keeps_its_size_and_a_fresh_open_gets_the_new_one,
    a_revoked_session_loses_every_segment
);

/// The config file of a target serving RAM volume `a` of `size` bytes (`allow`: its list).
fn toml(size: u64, allow: &str) -> String {
    let allow = if allow.is_empty() { String::new() } else { format!("allow = {{ {allow} }}\n") };
    format!("[[volume]]\nname = \"a\"\nsize = {size}\n{allow}")
}

const MIB: u64 = 1 << 20;

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_add((i / 4096) as u8).wrapping_mul(31).wrapping_add(i as u8)).collect()
}

/// One operation on `q`, waited for.
fn run(q: &mut rblk_initiator::Queue, write: Option<&[u8]>, offset: u64, len: u32) -> Vec<u8> {
    match write {
        Some(data) => q.submit_write(offset, data, 1).expect("submit write"),
        None => q.submit_read(offset, len, 1).expect("submit read"),
    }
    let mut done = [Done::default()];
    let deadline = Instant::now() + Duration::from_secs(10);
    // Held (not failed) while the session reconnects: bounded here.
    while q.wait(&mut done, deadline).expect("wait") == 0 {
        assert!(Instant::now() < deadline, "I/O at {offset} ({len} bytes) did not complete in 10 s");
    }
    done[0].result.as_ref().unwrap_or_else(|e| panic!("I/O at {offset} ({len} bytes): {e}"));
    let mut back = vec![0u8; len as usize];
    if write.is_none() {
        done[0].read_data(&mut back).unwrap();
    }
    back
}

fn the_library_learns_a_grow_at_once_and_io_crosses_the_old_end(fabric: Fabric) {
    let t = Target::start_with_config(fabric, &toml(MIB, ""));
    let uri = format!("rblk://{}/a", t.addr());
    let opts = Options { fabric, ..Options::default() };
    let mut vol = Session::connect(&uri, &opts).unwrap().open(OpenMode::ReadWrite).unwrap();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let hook = Arc::clone(&heard);
    vol.on_resize(move |size| hook.lock().unwrap().push(size));
    let old = pattern(1, MIB as usize);
    vol.write_at(&old, 0).unwrap();
    let mut before = vol.queue_with(8, 128 << 10).unwrap();
    assert_eq!(before.segments().len(), 1);

    // A queue that writes and reads back the first half of the volume while it grows.
    let mut busy = vol.queue_with(4, 64 << 10).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopping = Arc::clone(&stop);
    let io = std::thread::spawn(move || {
        let mut rounds = 0u32;
        while !stopping.load(std::sync::atomic::Ordering::Relaxed) {
            let offset = u64::from(rounds % 8) * (64 << 10);
            let data = pattern(rounds as u8, 64 << 10);
            run(&mut busy, Some(&data), offset, 64 << 10);
            assert_eq!(run(&mut busy, None, offset, 64 << 10), data, "verify at {offset} during the grow");
            rounds += 1;
        }
        rounds
    });

    let report = t.reload(&toml(3 * MIB, "")).expect("the reload that grows a");
    assert!(report.contains("grew a from 1 MiB to 3 MiB"), "{report}");
    // The queue hears RESIZED when it next looks at its completions (the session's size may
    // come first from another queue's).
    let deadline = Instant::now() + Duration::from_secs(5);
    while vol.size() != 3 * MIB || before.segments().len() != 2 {
        assert!(Instant::now() < deadline, "the library never learnt the grow (size {})", vol.size());
        before.tick();
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds = io.join().expect("the I/O during the grow verified");
    assert!(rounds > 0);
    assert_eq!(vol.reconnects(), 0, "the grow cost no reconnect");
    assert_eq!(*heard.lock().unwrap(), [3 * MIB], "the hook hears the new size once");
    assert_eq!(before.segments().len(), 2, "the queue has its window over the new segment");
    assert_eq!(before.geometry().size, 3 * MIB);

    // Across the old end, through the queue opened before the grow: two work requests, one
    // per segment, each under its own window's rkey.
    let straddle = pattern(2, 128 << 10);
    run(&mut before, Some(&straddle), MIB - (64 << 10), 128 << 10);
    assert_eq!(run(&mut before, None, MIB - (64 << 10), 128 << 10), straddle);
    // Past the old end, and through a queue joined after the grow (JOINED's segments).
    let mut after = vol.queue_with(8, 128 << 10).unwrap();
    assert_eq!(after.segments().len(), 2);
    assert_eq!(run(&mut after, None, MIB - (64 << 10), 128 << 10), straddle);
    let tail = pattern(3, 128 << 10);
    run(&mut after, Some(&tail), 3 * MIB - (128 << 10), 128 << 10);
    let mut back = vec![0u8; 128 << 10];
    vol.read_at(&mut back, 3 * MIB - (128 << 10)).unwrap();
    assert_eq!(back, tail, "the synchronous path reads what a queue wrote past the old end");
    // Nothing before the old end moved (the busy queue wrote only its first half).
    let mut head = vec![0u8; (MIB / 2) as usize];
    vol.read_at(&mut head, MIB / 2 - (64 << 10)).unwrap();
    assert_eq!(head[(64 << 10)..], old[(MIB / 2) as usize..(MIB - (64 << 10)) as usize]);
    assert_eq!(vol.reconnects(), 0);
}

fn a_revoked_session_loses_every_segment(fabric: Fabric) {
    let t = Target::start_with_config(fabric, &toml(MIB, "db1 = \"rw\", web = \"rw\""));
    let mut r = Raw::connect(t.fabric(), t.addr(), ConnectData::NewSession).expect("connect");
    r.login(None, Some("db1")).expect("db1 logs in");
    let o = r.open_with("a", OpenMode::ReadWrite, None).expect("OPEN");
    t.reload(&toml(2 * MIB, "db1 = \"rw\", web = \"rw\"")).expect("the reload that grows a");
    let resized = r.try_reply(Duration::from_secs(5)).expect("RESIZED");
    let Ok((_, Message::Resized { size, segments })) = rblk_proto::parse(&resized) else {
        panic!("not a RESIZED: {:?}", rblk_proto::parse(&resized));
    };
    assert_eq!((size, segments.len()), (2 * MIB, 2));
    let [first, added] = [segments.as_slice()[0], segments.as_slice()[1]];
    assert_eq!((first.remote_addr, first.rkey), (o.remote_addr, o.rkey), "the first window is OPENED's");
    assert_eq!(r.read_block(added.remote_addr, added.rkey).ok(), Some(WcStatus::SUCCESS), "the added window READs");
    // db1 off the list: its session ends, both windows with it.
    let report = t.reload(&toml(2 * MIB, "web = \"rw\"")).expect("the reload that revokes");
    assert!(report.contains("released 1 session:"), "{report}");
    let got = r.read_block(added.remote_addr, added.rkey);
    assert!(
        !matches!(got, Ok(WcStatus::SUCCESS)),
        "the added segment's rkey still READs after the revocation: {got:?}"
    );
    let got = r.read_block(first.remote_addr, first.rkey);
    assert!(!matches!(got, Ok(WcStatus::SUCCESS)), "the first segment's rkey still READs: {got:?}");
}

fn an_older_initiator_keeps_its_size_and_a_fresh_open_gets_the_new_one(fabric: Fabric) {
    let older = FEATURES & !FEATURE_SEGMENTS;
    let t = Target::start_with_config(fabric, &toml(MIB, ""));
    let hello = |features: u64| {
        let mut raw = Raw::connect(t.fabric(), t.addr(), ConnectData::NewSession).expect("connect");
        raw.hello_with(features & !FEATURE_KEEPALIVE);
        raw
    };
    let mut a = hello(older);
    let opened = a.open_with("a", OpenMode::ReadWrite, None).expect("OPEN");
    assert_eq!((opened.size, opened.segments), (MIB, None));

    t.reload(&toml(3 * MIB, "")).expect("the reload that grows a");
    assert!(a.try_reply(Duration::from_millis(300)).is_none(), "no RESIZED for an initiator without segments");
    let last = opened.remote_addr + MIB - 4096;
    assert_eq!(a.read_block(last, opened.rkey).ok(), Some(WcStatus::SUCCESS), "its rkey still works");

    let mut fresh = hello(older);
    let now = fresh.open_with("a", OpenMode::ReadOnly, None).expect("a fresh OPEN");
    assert_eq!((now.size, now.segments), (3 * MIB, None), "one rkey over the whole grown volume");
    let end = now.remote_addr + 3 * MIB - 4096;
    assert_eq!(fresh.read_block(end, now.rkey).ok(), Some(WcStatus::SUCCESS), "that rkey reaches the added range");

    let mut knows = hello(FEATURES);
    let seg = knows.open_with("a", OpenMode::ReadOnly, None).expect("OPEN with segments");
    assert_eq!(seg.size, 3 * MIB);
    let segments = seg.segments.expect("OPENED's segments tail");
    assert_eq!(segments.as_slice().iter().map(|s| s.offset).collect::<Vec<_>>(), [0, MIB]);
    assert_eq!(segments.as_slice()[0].rkey, seg.rkey);

    // The older initiator reconnects: its new session keeps the size it had, and works.
    drop(a);
    let mut again = hello(older);
    let resume = Resume { session_id: opened.session_id, token: opened.token };
    let resumed = again.open_with("a", OpenMode::ReadWrite, Some(resume)).expect("the resuming OPEN");
    assert_eq!((resumed.size, resumed.segments), (MIB, None), "a resumed older session keeps its size");
    let last = resumed.remote_addr + MIB - 4096;
    assert_eq!(again.read_block(last, resumed.rkey).ok(), Some(WcStatus::SUCCESS), "and reads without an error");
}

#[test]
fn the_grow_scripts_analysis() {
    rblk_tests::python_unittest("test_grow");
}
