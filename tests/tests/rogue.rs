//! A rogue target, over the in-memory fabric: what it sends people's terminals must arrive
//! escaped. ERROR text and volume names are any UTF-8 the protocol allows, and a target (or
//! anyone on its cleartext path) could fill them with terminal escapes.
//!
//! What it would catch:
//! - `a_targets_escapes_are_shown_escaped`: an ERROR's text that reaches the library's error
//!   (and so every front end, `rblk-bench` and the logs) with its control characters raw, or a
//!   volume name from LIST that `rblk discover` prints raw. OpenSSH escapes a server's strings
//!   the same way.

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use rblk_fabric::{Fabric, Listener, ListenerEvent};
use rblk_proto::{ChallengeFlags, ErrorCode, ListEntry, Message, Opcode, OpenMode};
use rblk_tests::raw::serve_scripted;

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
