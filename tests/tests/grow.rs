//! Growing a served volume (issue 44) over the in-memory fabric: the target adds a memory
//! segment, binds each QP's window over it and tells initiators that know segments at once
//! (RESIZED); the library splits I/O at the segment boundary; older initiators keep the size
//! they opened.
//!
//! - `the_library_learns_a_grow_at_once_and_io_crosses_the_old_end`: would catch a RESIZED not
//!   sent or not taken (the size stays), a window not bound over the new segment (its rkey
//!   fails), an I/O across the old end sent as one work request under one rkey (a remote
//!   access error: a window reaches one registration only), and a hook not called.
//! - `an_older_initiator_keeps_its_size_and_a_fresh_open_gets_the_new_one`: would catch a
//!   RESIZED or a segments tail sent to an initiator without FEATURE_SEGMENTS (it cannot parse
//!   them), a resumed older session told the new size (its continuity check refuses a changed
//!   volume and fails its I/O), and a fresh older OPEN given a window over one segment only.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rblk_fabric::Fabric;
use rblk_initiator::{Done, OpenMode, Options, Session};
use rblk_proto::{ConnectData, Resume, FEATURES, FEATURE_KEEPALIVE, FEATURE_SEGMENTS};
use rblk_target::config::VolumeSpec;
use rblk_target::server::{Config, Running, Server};
use rblk_tests::raw::Raw;

const MIB: u64 = 1 << 20;

fn config(size: u64) -> Config {
    Config {
        listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        fabric: Fabric::Mem,
        volumes: vec![VolumeSpec { name: "a".into(), size, path: None }],
        ..Config::default()
    }
}

fn start(size: u64) -> Running {
    Server::start(config(size)).expect("start the in-process target")
}

fn grow(r: &Running, size: u64) {
    let report = r.reload(config(size)).expect("reload");
    assert!(report.grown.iter().any(|(n, _, s)| n == "a" && *s == size), "{report:?}");
}

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

#[test]
fn the_library_learns_a_grow_at_once_and_io_crosses_the_old_end() {
    let r = start(MIB);
    let uri = format!("rblk://{}/a", r.local_addr());
    let opts = Options { fabric: Fabric::Mem, ..Options::default() };
    let mut vol = Session::connect(&uri, &opts).unwrap().open(OpenMode::ReadWrite).unwrap();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let hook = Arc::clone(&heard);
    vol.on_resize(move |size| hook.lock().unwrap().push(size));
    let old = pattern(1, MIB as usize);
    vol.write_at(&old, 0).unwrap();
    let mut before = vol.queue_with(8, 128 << 10).unwrap();
    assert_eq!(before.segments().len(), 1);

    grow(&r, 3 * MIB);
    // The queue hears RESIZED when it next looks at its completions.
    let deadline = Instant::now() + Duration::from_secs(5);
    while vol.size() != 3 * MIB {
        assert!(Instant::now() < deadline, "the library never learnt the grow (size {})", vol.size());
        before.tick();
        std::thread::sleep(Duration::from_millis(1));
    }
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
    // Nothing before the old end moved.
    let mut head = vec![0u8; (MIB - (64 << 10)) as usize];
    vol.read_at(&mut head, 0).unwrap();
    assert_eq!(head, old[..head.len()]);
}

/// A connection that said HELLO with `features` (never keepalives: it sends nothing unasked).
fn hello(r: &Running, features: u64) -> Raw {
    let mut raw = Raw::connect(Fabric::Mem, r.local_addr(), ConnectData::NewSession).expect("connect");
    raw.hello_with(features & !FEATURE_KEEPALIVE);
    raw
}

#[test]
fn an_older_initiator_keeps_its_size_and_a_fresh_open_gets_the_new_one() {
    let older = FEATURES & !FEATURE_SEGMENTS;
    let r = start(MIB);
    let mut a = hello(&r, older);
    let opened = a.open_with("a", OpenMode::ReadWrite, None).expect("OPEN");
    assert_eq!((opened.size, opened.segments), (MIB, None));

    grow(&r, 3 * MIB);
    assert!(a.try_reply(Duration::from_millis(300)).is_none(), "no RESIZED for an initiator without segments");

    let mut fresh = hello(&r, older);
    let now = fresh.open_with("a", OpenMode::ReadOnly, None).expect("a fresh OPEN");
    assert_eq!((now.size, now.segments), (3 * MIB, None), "one rkey over the whole grown volume");

    let mut knows = hello(&r, FEATURES);
    let seg = knows.open_with("a", OpenMode::ReadOnly, None).expect("OPEN with segments");
    assert_eq!(seg.size, 3 * MIB);
    let segments = seg.segments.expect("OPENED's segments tail");
    assert_eq!(segments.as_slice().iter().map(|s| s.offset).collect::<Vec<_>>(), [0, MIB]);
    assert_eq!(segments.as_slice()[0].rkey, seg.rkey);

    // The older initiator reconnects: its new session keeps the size it had.
    drop(a);
    let mut again = hello(&r, older);
    let resume = Resume { session_id: opened.session_id, token: opened.token };
    let resumed = again.open_with("a", OpenMode::ReadWrite, Some(resume)).expect("the resuming OPEN");
    assert_eq!((resumed.size, resumed.segments), (MIB, None), "a resumed older session keeps its size");
}
