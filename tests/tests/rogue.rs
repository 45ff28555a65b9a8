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

use rblk_fabric::channel::{self, Channel, Event};
use rblk_fabric::{Completion, Fabric, Listener, ListenerEvent, QpConfig};
use rblk_proto::{ChallengeFlags, ErrorCode, ListEntry, Message, Opcode, OpenMode};

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
            let cfg = QpConfig { send_depth: 18, recv_depth: 16, max_inline: 128 };
            let mut ep = req.into_endpoint(&pd, &cfg, conn).unwrap();
            let mut chan = Channel::new(&pd).unwrap();
            chan.post_recvs(&mut ep).unwrap();
            ep.accept().unwrap();
            thread::spawn(move || {
                let mut out = [Completion::EMPTY; 8];
                let mut buf = [0u8; rblk_proto::MSG_SIZE];
                let entry = [ListEntry::new(EVIL, 1 << 20, 0, OpenMode::Exclusive).unwrap()];
                let text = format!("volume {EVIL} is gone{EVIL}");
                loop {
                    let Ok(n) = ep.wait(&mut out, Duration::ZERO, Instant::now() + Duration::from_secs(30)) else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    for c in out[..n].iter().filter(|c| channel::is_control(c.wr_id)) {
                        let Ok(Event::Received(len)) = chan.on_completion(&mut ep, c, &mut buf) else { continue };
                        let Ok((tag, msg)) = rblk_proto::parse(&buf[..len]) else { return };
                        let reply = match msg {
                            Message::Hello { .. } => Message::Challenge {
                                flags: ChallengeFlags::empty(),
                                features: rblk_proto::FEATURES,
                                nonce: [0; rblk_proto::NONCE_LEN],
                            },
                            Message::Auth { .. } => Message::Ok { answers: Opcode::Auth },
                            Message::List { .. } => Message::ListReply { total: 1, entries: &entry },
                            Message::Open { .. } => Message::Error { code: ErrorCode::NoSuchVolume, text: &text },
                            Message::Close => Message::Ok { answers: Opcode::Close },
                            _ => continue,
                        };
                        if chan.send(&mut ep, tag, &reply).is_err() {
                            return;
                        }
                    }
                }
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
