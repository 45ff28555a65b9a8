//! Mutual authentication (issue 39, [`rblk_proto::FEATURE_MUTUAL_AUTH`]): a relay between an
//! initiator and a target, a peer that strips or flips what the proofs bind, a target that
//! cannot prove the key, and identities pinned per address. The relay and the rogue targets
//! are hand-made; the initiator is the library, as `rblk` uses it.
//!
//! What each would catch:
//! - `a_relay_logs_in_under_v1_and_not_with_mutual_auth`: a v2 proof that does not bind the
//!   connection's addresses (the relay, which sees other addresses than either end, would log in
//!   as the victim's host and open its volume). Its first half shows the attack working under v1,
//!   so the test proves the relay is real.
//! - `a_keyed_initiator_refuses_what_cannot_prove_the_target`: a keyed initiator that answers a
//!   CHALLENGE with the mutual-authentication bit stripped, or without AUTH required (a proof, or
//!   trust, handed to whoever answers); a keyless initiator that sends a MAC nobody asked for.
//! - `the_target_checks_the_words_and_requires_v2_when_told`: a v2 MAC that does not bind the
//!   HELLO and CHALLENGE words (a peer that flipped a feature bit still logs in), a target proof
//!   that does not verify, and `require_mutual_auth` (global or per host) not refusing v1.
//! - `an_initiator_refuses_a_target_that_cannot_prove_the_key`: an initiator that takes an
//!   OK(AUTH) without a proof, or with a wrong one, from a target claiming mutual authentication.
//! - `target_identities_are_pinned_per_address`: an identity not pinned at the first connection,
//!   a changed one accepted, or `--target-id` ignored.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rblk_fabric::{Fabric, Listener, ListenerEvent};
use rblk_initiator::{Error, Options, Session};
use rblk_proto::{
    ChallengeFlags, ConnectData, Direction, ErrorCode, Message, Opcode, OpenMode, Transcript, FEATURES,
    FEATURE_KEEPALIVE, FEATURE_MUTUAL_AUTH, MAC_LEN, TARGET_ID_LEN,
};
use rblk_tests::raw::{scripted_target, serve_scripted, Raw};
use rblk_tests::target::Target;

const KEY: &[u8] = b"the shared secret, 32 bytes or more";
const HOST: &str = "db1";

rblk_tests::on_both_fabrics!(
    a_relay_logs_in_under_v1_and_not_with_mutual_auth,
    a_keyed_initiator_refuses_what_cannot_prove_the_target,
    the_target_checks_the_words_and_requires_v2_when_told,
);

fn temp_path(what: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("rblk-mutual-{}-{n}-{what}", std::process::id()))
}

/// A target with the shared key, the volume `v`, and `extra` config lines.
fn keyed_target(fabric: Fabric, extra: &str) -> Target {
    let key = temp_path("key");
    rblk_tests::target::write_key_file(&key, KEY);
    let config = format!("key_file = {key:?}\n{extra}\n[[volume]]\nname = \"v\"\nsize = \"4M\"\n");
    Target::start_with_config(fabric, &config)
}

/// The library's options for host db1 with `key`, pinning nothing.
fn opts(fabric: Fabric, key: Option<&[u8]>) -> Options {
    Options {
        fabric,
        host_id: Some(HOST.into()),
        key: key.map(<[u8]>::to_vec),
        timeout: Duration::from_secs(10),
        ..Options::default()
    }
}

fn uri(addr: SocketAddr) -> String {
    format!("rblk://{addr}/v")
}

/// What a relay does to what passes through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tamper {
    /// Forwards every byte's meaning unchanged.
    Nothing,
    /// Takes the mutual-authentication bit out of HELLO and CHALLENGE.
    StripMutual,
    /// Says in CHALLENGE that no AUTH is required.
    ClearAuthRequired,
}

/// What the relay saw and achieved.
#[derive(Debug, Default)]
struct Seen {
    /// Each AUTH the initiator sent: "v1" (with a MAC), "v1 without a MAC" or "v2".
    auths: Vec<&'static str>,
    /// The real target's answer to the relayed AUTH.
    target_said: Option<Result<(), String>>,
    /// Whether the relay then opened the volume read-write at the real target.
    opened: bool,
}

/// A relay on `target`'s IP (another port): it forwards one initiator's HELLO and AUTH to the
/// target over a connection of its own, tampering as told, and on the target's OK opens `v`.
fn relay(fabric: Fabric, target: SocketAddr, tamper: Tamper) -> (SocketAddr, Arc<Mutex<Seen>>) {
    let listener = Listener::bind(fabric, SocketAddr::new(target.ip(), 0), None).expect("relay listens");
    let addr = listener.local_addr().expect("relay address");
    let seen = Arc::new(Mutex::new(Seen::default()));
    let log = seen.clone();
    thread::spawn(move || {
        let req = loop {
            match listener.next_event(Some(Instant::now() + Duration::from_secs(30))) {
                Ok(Some(ListenerEvent::Request(r))) => break r,
                Ok(Some(_)) => continue,
                _ => return,
            }
        };
        let pd = req.alloc_pd().expect("relay pd");
        let mut upstream = Raw::connect(fabric, target, ConnectData::NewSession).expect("relay reaches the target");
        let strip = |f: u64| if tamper == Tamper::StripMutual { f & !FEATURE_MUTUAL_AUTH } else { f };
        serve_scripted(req, &pd, 0, Duration::from_secs(20), |msg| match *msg {
            Message::Hello { features } => {
                // Exactly as sent (the proof binds HELLO): the test is over long before the
                // target misses the relay's keepalives.
                let hello = Message::Hello { features: strip(features) };
                match rblk_proto::parse(&upstream.request(&hello)) {
                    Ok((_, Message::Challenge { flags, features, nonce })) => {
                        let flags = if tamper == Tamper::ClearAuthRequired { ChallengeFlags::empty() } else { flags };
                        Some(Message::Challenge { flags, features: strip(features), nonce })
                    }
                    other => panic!("the target answered HELLO with {other:?}"),
                }
            }
            ref auth @ (Message::Auth { mac, .. } | Message::MutualAuth { mac, .. }) => {
                let kind = match auth {
                    Message::MutualAuth { .. } => "v2",
                    _ if mac == [0; MAC_LEN] => "v1 without a MAC",
                    _ => "v1",
                };
                log.lock().unwrap().auths.push(kind);
                let reply = upstream.request(auth);
                let (said, answer) = match rblk_proto::parse(&reply) {
                    Ok((_, Message::Ok { answers: Opcode::Auth })) => (Ok(()), Message::Ok { answers: Opcode::Auth }),
                    Ok((_, Message::AuthProof { target_id, mac })) => (Ok(()), Message::AuthProof { target_id, mac }),
                    Ok((_, Message::Error { code, text })) => {
                        (Err(format!("{code:?}: {text}")), Message::Error { code, text: "refused at the target" })
                    }
                    other => panic!("the target answered AUTH with {other:?}"),
                };
                let opened = said.is_ok() && upstream.open_with("v", OpenMode::ReadWrite, None).is_ok();
                let mut s = log.lock().unwrap();
                (s.target_said, s.opened) = (Some(said), opened);
                Some(answer)
            }
            _ => None,
        });
    });
    (addr, seen)
}

fn a_relay_logs_in_under_v1_and_not_with_mutual_auth(fabric: Fabric) {
    let target = keyed_target(fabric, "");

    // v1 (the relay strips the bit; the victim allows v1 targets): the relay logs in as db1 and
    // opens its volume read-write. This is the attack.
    let (addr, seen) = relay(fabric, target.addr(), Tamper::StripMutual);
    let v1 = Options { allow_v1_target: true, ..opts(fabric, Some(KEY)) };
    Session::connect(&uri(addr), &v1).expect("under v1 the victim answers the relayed nonce");
    let s = seen.lock().unwrap();
    assert_eq!(s.auths, ["v1"]);
    assert_eq!(s.target_said, Some(Ok(())), "the relay logged in at the target as db1");
    assert!(s.opened, "and opened db1's volume read-write");
    drop(s);

    // v2, relayed unchanged: the target sees other addresses than the victim proved.
    let (addr, seen) = relay(fabric, target.addr(), Tamper::Nothing);
    let e = Session::connect(&uri(addr), &opts(fabric, Some(KEY))).expect_err("the relay must not log in");
    assert!(matches!(e, Error::Auth { .. }), "{e:?}");
    let s = seen.lock().unwrap();
    assert_eq!(s.auths, ["v2"]);
    assert!(
        matches!(&s.target_said, Some(Err(t)) if t.starts_with("AuthFailed")),
        "the target must refuse the relayed proof: {:?}",
        s.target_said
    );
    assert!(!s.opened);
}

fn a_keyed_initiator_refuses_what_cannot_prove_the_target(fabric: Fabric) {
    let target = keyed_target(fabric, "");
    let (addr, seen) = relay(fabric, target.addr(), Tamper::StripMutual);
    let e = Session::connect(&uri(addr), &opts(fabric, Some(KEY))).expect_err("a stripped bit");
    assert!(e.to_string().contains("cannot prove it holds the key"), "{e}");
    assert!(seen.lock().unwrap().auths.is_empty(), "no proof may leave before the target can prove the key");

    let (addr, seen) = relay(fabric, target.addr(), Tamper::ClearAuthRequired);
    let e = Session::connect(&uri(addr), &opts(fabric, Some(KEY))).expect_err("AUTH not required");
    assert!(e.to_string().contains("does not require a key"), "{e}");
    assert!(seen.lock().unwrap().auths.is_empty());

    // Without a key, to a target that asks for none: the host names itself, with no MAC.
    let (addr, seen) = relay(fabric, target.addr(), Tamper::ClearAuthRequired);
    let _ = Session::connect(&uri(addr), &opts(fabric, None));
    assert_eq!(seen.lock().unwrap().auths, ["v1 without a MAC"]);
}

/// HELLO (every feature but keepalive) on a fresh connection: CHALLENGE's flags, features and
/// nonce.
fn challenge(raw: &mut Raw, hello: u64) -> (ChallengeFlags, u64, [u8; rblk_proto::NONCE_LEN]) {
    match rblk_proto::parse(&raw.request(&Message::Hello { features: hello })) {
        Ok((_, Message::Challenge { flags, features, nonce })) => (flags, features, nonce),
        other => panic!("HELLO answered with {other:?}"),
    }
}

/// A v2 AUTH on `raw` whose transcript says HELLO was `claimed` (the HELLO sent is every
/// feature but keepalive): the target's proof, checked, or the ERROR.
fn v2_login(raw: &mut Raw, host: &str, claimed: Option<u64>) -> Result<[u8; TARGET_ID_LEN], (ErrorCode, String)> {
    let hello = FEATURES & !FEATURE_KEEPALIVE;
    let (flags, offered, nonce) = challenge(raw, hello);
    let t = Transcript {
        hello_features: claimed.unwrap_or(hello),
        challenge_flags: flags.bits(),
        challenge_features: offered,
        target_nonce: nonce,
        initiator_nonce: rblk_fabric::random(),
        host,
        target_addr: raw.ep.peer().unwrap(),
        initiator_addr: raw.ep.local().unwrap(),
    };
    let mac = rblk_proto::mutual_mac(KEY, Direction::InitiatorToTarget, &t, None).unwrap();
    let reply = raw.request(&Message::MutualAuth { host, nonce: t.initiator_nonce, mac });
    match rblk_proto::parse(&reply) {
        Ok((_, Message::AuthProof { target_id, mac })) => {
            let ok = rblk_proto::verify_mutual_mac(KEY, Direction::TargetToInitiator, &t, Some(&target_id), &mac);
            assert!(ok, "the target's proof must verify");
            Ok(target_id)
        }
        Ok((_, Message::Error { code, text })) => Err((code, text.to_owned())),
        other => panic!("AUTH v2 answered with {other:?}"),
    }
}

fn the_target_checks_the_words_and_requires_v2_when_told(fabric: Fabric) {
    let raw = |t: &Target| Raw::connect(t.fabric(), t.addr(), ConnectData::NewSession).expect("connect");
    let target = keyed_target(fabric, "[[host]]\nname = \"db1\"\nrequire_mutual_auth = true\n[[host]]\nname = \"web\"");
    let id = v2_login(&mut raw(&target), HOST, None).expect("an honest v2 AUTH");
    assert_ne!(id, [0; TARGET_ID_LEN]);
    // A peer that flipped a bit of HELLO on the way (here: the windows bit) breaks the proof.
    let flipped = FEATURES & !FEATURE_KEEPALIVE & !rblk_proto::FEATURE_WINDOWS;
    let e = v2_login(&mut raw(&target), HOST, Some(flipped)).expect_err("a flipped word");
    assert_eq!(e.0, ErrorCode::AuthFailed, "{e:?}");
    // db1 must use v2; web may still use v1.
    assert_eq!(raw(&target).login(Some(KEY), Some(HOST)).map_err(|e| e.0), Err(ErrorCode::AuthFailed));
    assert_eq!(raw(&target).login(Some(KEY), Some("web")), Ok(()));

    let everywhere = keyed_target(fabric, "require_mutual_auth = true");
    let e = raw(&everywhere).login(Some(KEY), Some("web")).expect_err("v1 anywhere");
    assert!(e.0 == ErrorCode::AuthFailed && e.1 == rblk_target::access::MUTUAL_REQUIRED, "{e:?}");
    v2_login(&mut raw(&everywhere), "web", None).expect("v2 still gets in");
}

/// A target that answers HELLO (AUTH required, every feature) and then AUTH with `answer`.
fn rogue(answer: Message<'static>) -> SocketAddr {
    scripted_target(move |msg| match msg {
        Message::Hello { .. } => Some(Message::Challenge {
            flags: ChallengeFlags::AUTH_REQUIRED,
            features: FEATURES,
            nonce: [5; rblk_proto::NONCE_LEN],
        }),
        Message::MutualAuth { .. } | Message::Auth { .. } => Some(answer),
        _ => None,
    })
}

#[test]
fn an_initiator_refuses_a_target_that_cannot_prove_the_key() {
    let wrong = rogue(Message::AuthProof { target_id: [1; TARGET_ID_LEN], mac: [2; MAC_LEN] });
    let e = Session::connect(&uri(wrong), &opts(Fabric::Mem, Some(KEY))).expect_err("a wrong proof");
    assert!(e.to_string().contains("the target's proof is wrong"), "{e}");
    let none = rogue(Message::Ok { answers: Opcode::Auth });
    let e = Session::connect(&uri(none), &opts(Fabric::Mem, Some(KEY))).expect_err("no proof");
    assert!(!matches!(e, Error::Timeout { .. }), "refused at once, not timed out: {e:?}");
}

#[test]
fn target_identities_are_pinned_per_address() {
    let target = keyed_target(Fabric::Mem, "");
    // In a directory of its own: pins live only in directories no one else may write.
    let pins = temp_path("pins").join("known_targets");
    let pinned = Options { known_targets: Some(pins.clone()), ..opts(Fabric::Mem, Some(KEY)) };
    Session::connect(&uri(target.addr()), &pinned).expect("first connection: pinned");
    let text = std::fs::read_to_string(&pins).expect("the pin file was made");
    let (addr, id) = text.trim().split_once(' ').expect("one pin");
    assert_eq!(addr, target.addr().to_string());
    Session::connect(&uri(target.addr()), &pinned).expect("the same identity again");

    // Another identity at the same address, as a holder of the key that took the address over.
    std::fs::write(&pins, format!("{addr} {}\n", "ab".repeat(TARGET_ID_LEN))).unwrap();
    let e = Session::connect(&uri(target.addr()), &pinned).expect_err("a changed identity");
    assert!(e.to_string().contains("TARGET IDENTITY CHANGED") && e.to_string().contains(":1"), "{e}");

    let id = rblk_initiator::trust::parse_target_id(id).unwrap();
    let given = Options { target_id: Some(id), known_targets: None, ..opts(Fabric::Mem, Some(KEY)) };
    Session::connect(&uri(target.addr()), &given).expect("--target-id names it");
    let wrong = Options { target_id: Some([0xab; TARGET_ID_LEN]), ..given };
    let e = Session::connect(&uri(target.addr()), &wrong).expect_err("--target-id differs");
    assert!(e.to_string().contains("--target-id"), "{e}");
    std::fs::remove_dir_all(pins.parent().unwrap()).unwrap();
}
