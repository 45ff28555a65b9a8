//! A rogue target, over the in-memory fabric: what it sends people's terminals must arrive
//! escaped, and what it says about sizes and addresses must be checked. ERROR text and volume names are any UTF-8 the protocol allows, and a target (or
//! anyone on its cleartext path) could fill them with terminal escapes.
//!
//! What it would catch:
//! - `a_targets_escapes_are_shown_escaped`: an ERROR's text that reaches the library's error
//!   (and so every front end, `rblk-bench` and the logs) with its control characters raw, or a
//!   volume name from LIST that `rblk discover` prints raw. OpenSSH escapes a server's strings
//!   the same way.
//! - `a_hostile_list_total_is_refused`: a LIST whose `total` the initiator follows without bound
//!   (a target claiming four billion volumes grows `rblk discover`'s memory until it dies), or
//!   whose pages run past their own total.
//! - `a_reconnects_overflowing_opened_is_refused`: a reconnect's OPENED taken without checking
//!   `remote_addr + size` (only the first OPENED was checked).

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use rblk_fabric::{Fabric, Listener, ListenerEvent};
use rblk_proto::{ChallengeFlags, ErrorCode, ListEntry, Message, Opcode, OpenMode};
use rblk_tests::raw::{scripted_target, serve_scripted};

/// Retitles an xterm and rings its bell.
const EVIL: &str = "\x1b]0;pwned\x07";

/// Serves HELLO, AUTH and LIST (one volume, named [`EVIL`]) and refuses every OPEN with an
/// ERROR whose text holds [`EVIL`], for as long as connections come.
fn rogue_target() -> SocketAddr {
    let listener = Listener::bind(Fabric::Mem, "127.0.0.1:0".parse().unwrap(), None).unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for conn in 0.. {
            let req = match listener.next_event(Some(Instant::now() + Duration::from_secs(30))) {
                Ok(Some(ListenerEvent::Request(r))) => r,
                Ok(Some(_)) => continue,
                _ => return,
            };
            let pd = req.alloc_pd().unwrap();
            thread::spawn(move || {
                let entry = [ListEntry::new(EVIL, 1 << 20, 0, OpenMode::Exclusive).unwrap()];
                let text = format!("volume {EVIL} is gone{EVIL}");
                serve_scripted(req, &pd, conn, Duration::from_secs(30), |msg| match msg {
                    Message::Hello { .. } => Some(Message::Challenge {
                        flags: ChallengeFlags::empty(),
                        features: rblk_proto::FEATURES,
                        nonce: [0; rblk_proto::NONCE_LEN],
                    }),
                    Message::Auth { .. } => Some(Message::Ok { answers: Opcode::Auth }),
                    Message::List { .. } => Some(Message::ListReply { total: 1, entries: &entry }),
                    Message::Open { .. } => Some(Message::Error { code: ErrorCode::NoSuchVolume, text: &text }),
                    Message::Close => Some(Message::Ok { answers: Opcode::Close }),
                    _ => None,
                });
            });
        }
    });
    addr
}

fn assert_escaped(shown: &str, what: &str) {
    assert!(!shown.contains(['\x1b', '\x07']), "{what} holds the target's raw escapes: {shown:?}");
    assert!(shown.contains(r"\x1b]0;pwned\x07"), "{what} does not show them escaped: {shown:?}");
}

#[test]
fn a_targets_escapes_are_shown_escaped() {
    let addr = rogue_target();
    let opts = rblk_initiator::Options { fabric: Fabric::Mem, ..rblk_initiator::Options::default() };

    let e = rblk_initiator::Session::connect(&format!("rblk://{addr}/v"), &opts)
        .expect("connect")
        .open(OpenMode::ReadOnly)
        .expect_err("the rogue target refuses every OPEN");
    assert!(matches!(e, rblk_initiator::Error::Target { code: ErrorCode::NoSuchVolume, .. }), "{e:?}");
    // What `rblk` prints (its error and the chain of causes), and what a log line holds.
    assert_escaped(&rblk_fabric::Chain(&e).to_string(), "the error");

    let target = rblk_initiator::Uri::parse_target(&format!("rblk://{addr}")).unwrap();
    let mut session = rblk_initiator::Session::connect(&target, &opts).expect("connect");
    let volumes = session.list().expect("LIST");
    assert_eq!(volumes[0].name(), EVIL, "the library hands the name over as it is (it names the volume)");
    assert_escaped(&rblk::cli::discover_table(&volumes).join("\n"), "rblk discover's table");
}

/// Serves HELLO, AUTH and a LIST that claims `total` volumes, a full page per request, until
/// more than [`rblk_initiator::MAX_LISTED`] entries were sent, then empty pages.
fn listing_target(total: u32) -> SocketAddr {
    // Leaked: the replies borrow it for as long as the target thread lives.
    let page: &'static [ListEntry] = (0..rblk_proto::MAX_LIST_ENTRIES)
        .map(|i| ListEntry::new(&format!("v{i}"), 1 << 20, 0, OpenMode::Exclusive).unwrap())
        .collect::<Vec<_>>()
        .leak();
    scripted_target(move |msg| match msg {
        Message::Hello { .. } => Some(Message::Challenge {
            flags: ChallengeFlags::empty(),
            features: rblk_proto::FEATURES,
            nonce: [0; rblk_proto::NONCE_LEN],
        }),
        Message::Auth { .. } => Some(Message::Ok { answers: Opcode::Auth }),
        Message::List { start }
            if usize::try_from(start.to_owned()).unwrap_or(usize::MAX) <= rblk_initiator::MAX_LISTED =>
        {
            Some(Message::ListReply { total, entries: page })
        }
        Message::List { .. } => Some(Message::ListReply { total, entries: &[] }),
        _ => None,
    })
}

/// Catches an initiator that trusts LIST's `total`: a hostile target that claims four billion
/// volumes would grow `rblk discover`'s memory without bound (here it stops after
/// [`rblk_initiator::MAX_LISTED`], and the list must not get that far), and one whose pages run
/// past the total it gave.
#[test]
fn a_hostile_list_total_is_refused() {
    let opts = rblk_initiator::Options { fabric: Fabric::Mem, ..rblk_initiator::Options::default() };
    for total in [u32::MAX, 3] {
        let target = rblk_initiator::Uri::parse_target(&format!("rblk://{}", listing_target(total))).unwrap();
        let mut session = rblk_initiator::Session::connect(&target, &opts).expect("connect");
        let e = session.list().expect_err("a LIST beyond the bound, or beyond its own total");
        assert!(matches!(e, rblk_initiator::Error::Protocol { .. }), "{e:?}");
        assert!(e.to_string().contains(&format!("of {total}")), "{e}");
    }
}

/// Catches a reconnect that takes the target's new OPENED without checking its address range:
/// `remote_addr + size` past 64 bits made the data path's address arithmetic overflow (a panic
/// in debug builds, wrapped addresses in release). The first OPENED is sound, the reconnect's
/// is not: the reconnect must be refused, never succeed.
#[test]
fn a_reconnects_overflowing_opened_is_refused() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    let listener = Listener::bind(Fabric::Mem, "127.0.0.1:0".parse().unwrap(), None).unwrap();
    let addr = listener.local_addr().unwrap();
    let resumed = Arc::new(AtomicU32::new(0));
    let seen = Arc::clone(&resumed);
    thread::spawn(move || {
        for conn in 0.. {
            let req = match listener.next_event(Some(Instant::now() + Duration::from_secs(30))) {
                Ok(Some(ListenerEvent::Request(r))) => r,
                Ok(Some(_)) => continue,
                _ => return,
            };
            let pd = req.alloc_pd().unwrap();
            let seen = Arc::clone(&seen);
            thread::spawn(move || {
                // The first connection goes quiet (the initiator's keepalive finds it gone).
                let idle = if conn == 0 { Duration::from_millis(300) } else { Duration::from_secs(30) };
                serve_scripted(req, &pd, conn, idle, |msg| match msg {
                    Message::Hello { .. } => Some(Message::Challenge {
                        flags: ChallengeFlags::empty(),
                        features: rblk_proto::FEATURE_RECONNECT | rblk_proto::FEATURE_KEEPALIVE,
                        nonce: [0; rblk_proto::NONCE_LEN],
                    }),
                    Message::Auth { .. } => Some(Message::Ok { answers: Opcode::Auth }),
                    Message::Open { resume, .. } => {
                        let remote_addr = if resume.is_some() {
                            seen.fetch_add(1, Ordering::SeqCst);
                            u64::MAX - 4095
                        } else {
                            0x1000
                        };
                        Some(Message::Opened(rblk_proto::Opened {
                            remote_addr,
                            size: 1 << 20,
                            rkey: 1,
                            block_size: 4096,
                            max_io: 1 << 20,
                            flags: rblk_proto::VolumeFlags::empty(),
                            session_id: 1 + u64::from(resume.is_some()),
                            token: [7; rblk_proto::TOKEN_LEN],
                            instance: Some(rblk_proto::VolumeId([9; 16])),
                            segments: None,
                        }))
                    }
                    _ => None,
                });
            });
        }
    });
    let reconnect = rblk_initiator::Reconnect {
        delay: Duration::from_millis(100),
        ctrl_loss_tmo: Some(Duration::from_secs(2)),
        fast_io_fail_tmo: None,
        connect_timeout: Duration::ZERO,
    };
    let opts = rblk_initiator::Options {
        fabric: Fabric::Mem,
        timeout: Duration::from_secs(1),
        reconnect,
        ..rblk_initiator::Options::default()
    };
    let mut vol = rblk_initiator::Session::connect(&format!("rblk://{addr}/v"), &opts)
        .expect("connect")
        .open(OpenMode::ReadWrite)
        .expect("the first OPENED is sound");
    assert!(vol.can_reconnect());
    thread::sleep(Duration::from_millis(500));
    // Keepalives find the first connection gone; then every resume is answered so, until
    // ctrl_loss_tmo ends the session.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = Ok(());
    while Instant::now() < deadline && (resumed.load(Ordering::SeqCst) == 0 || last.is_ok()) {
        last = vol.keepalive();
        thread::sleep(Duration::from_millis(100));
    }
    assert!(resumed.load(Ordering::SeqCst) >= 1, "the initiator never tried to resume");
    assert_eq!(vol.reconnects(), 0, "a reconnect to an overflowing address range succeeded");
    let e = last.expect_err("the session is not back");
    let mut buf = vec![0u8; 4096];
    assert!(vol.read_at(&mut buf, 0).is_err(), "I/O after the refused reconnect: {e}");
}
