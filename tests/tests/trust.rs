//! Host identities, per-volume access lists, per-host session caps and slowed-down AUTH
//! failures (issue 11), against a target configured by a config file (the daemon with
//! `--config` over rxe, the same file in-process over the in-memory fabric). Hand-made control
//! messages where the library would never send them, the initiator library where it would.
//!
//! What each would catch:
//! - `hosts_prove_their_own_keys_and_a_mac_binds_host_and_nonce`: a host with its own key let
//!   in with the shared key; a MAC that does not bind the host name (db1's proof passing for web)
//!   or the nonce (a MAC replayed from another connection); a today's-version peer (no host
//!   identity, base AUTH) refused by the new target; a host tail accepted from a peer that did
//!   not announce the feature.
//! - `without_a_shared_key_only_known_hosts_get_in`: unknown hosts, anonymous peers or known
//!   hosts without keys let in when only host keys are configured; an initiator without host
//!   identities not told what it lacks.
//! - `access_lists_refuse_with_the_reason`: volumes' access lists not enforced (a read-only host
//!   taking an exclusive open and so locking every writer out), or `*` and unlisted volumes
//!   handled wrongly; a listed host not told the grant it has.
//! - `auth_refusals_do_not_tell_hosts_apart`: an AUTH refusal whose bytes differ between an
//!   unknown host, a known host without a key and a wrong key (so a peer could find out which
//!   host names exist), or that names the host.
//! - `unlisted_volumes_are_answered_as_unknown_names`: an OPEN of a volume the host is not on the
//!   access list of answered differently from one of a name that does not exist (so a peer
//!   could probe names), an answer that lists the target's volumes, a refusal's text about
//!   a volume that could not be loaded that names its backing store or the OS's error, or one
//!   sent before the access check.
//! - `session_caps_per_host_and_in_all`: a host opening sessions without bound, or a cap that
//!   does not give room back when a session ends.
//! - `repeated_auth_failures_are_slowed_not_refused`: key guessing at full speed, or an address
//!   locked out for its failures (an honest host that mistyped its key must get in).
//! - `rxe_default::a_peer_without_the_key_is_refused_and_the_generated_key_needs_no_flags`: a
//!   daemon without any key configured serving anyone (the old default), a refusal other than
//!   today's AuthRequired, a generated key `rblk` on the same host does not find by itself, or a
//!   start log that does not say where the key is.
//! - `rxe_default::allow_any_host_serves_the_keyless_sequence`: `--allow-any-host` not serving
//!   the keyless sequence (HELLO, then OPEN, no AUTH) that older peers speak, or serving it
//!   without a warning.
//! - `key_files_others_may_read_are_refused_by_both_binaries`: a key file with mode 0644 taken
//!   by `rblk-target` or `rblk` (a key others can read proves nothing), refused without naming
//!   the mode, or refused only after the RDMA device was touched.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rblk_fabric::Fabric;
use rblk_initiator::{Error, Options, Session};
use rblk_proto::{ConnectData, ErrorCode, Message, OpenMode, FEATURE_FLUSH_RANGES};
use rblk_tests::raw::Raw;
use rblk_tests::target::Target;

const SHARED: &[u8] = b"the shared secret, 32 bytes or more";
const DB1: &[u8] = b"db1's own secret, at least 32 bytes";

rblk_tests::on_both_fabrics!(
    hosts_prove_their_own_keys_and_a_mac_binds_host_and_nonce,
    without_a_shared_key_only_known_hosts_get_in,
    access_lists_refuse_with_the_reason,
    session_caps_per_host_and_in_all,
    repeated_auth_failures_are_slowed_not_refused,
    list_needs_authentication_and_the_feature,
    auth_refusals_do_not_tell_hosts_apart,
    unlisted_volumes_are_answered_as_unknown_names,
);

/// What every refused AUTH is told (the target's log says why).
const AUTH_FAILED: &str = rblk_target::access::AUTH_FAILED;

/// Writes `key` to a fresh file and returns its path.
fn key_file(key: &[u8]) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("rblk-trust-{}-{n}.key", std::process::id()));
    rblk_tests::target::write_key_file(&path, key);
    path
}

/// Hosts db1 (its own key) and web (no key of its own), a volume `v`, and the shared key if
/// `shared`.
fn hosts_config(shared: bool) -> String {
    let shared = if shared { format!("key_file = {:?}\n", key_file(SHARED)) } else { String::new() };
    format!(
        "{shared}[[host]]\nname = \"db1\"\nkey_file = {:?}\n[[host]]\nname = \"web\"\n[[volume]]\nname = \"v\"\nsize = \"4M\"\n",
        key_file(DB1)
    )
}

fn raw(t: &Target) -> Raw {
    Raw::connect(t.fabric(), t.addr(), ConnectData::NewSession).expect("connect")
}

/// The library's options for `host` with `key`.
fn opts(t: &Target, host: &str, key: Option<&[u8]>) -> Options {
    Options { fabric: t.fabric(), host_id: Some(host.into()), key: key.map(<[u8]>::to_vec), ..Options::default() }
}

fn uri(t: &Target, volume: &str) -> String {
    format!("rblk://{}/{volume}", t.addr())
}

fn refused(r: Result<(), (ErrorCode, String)>, code: ErrorCode, words: &str) {
    match r {
        Err((c, text)) => {
            assert!(c == code && text.contains(words), "refused with {c:?} {text:?}, not {code:?} {words:?}")
        }
        Ok(()) => panic!("accepted, but should be refused with {code:?} ({words})"),
    }
}

fn hosts_prove_their_own_keys_and_a_mac_binds_host_and_nonce(fabric: Fabric) {
    let t = Target::start_with_config(fabric, &hosts_config(true));
    raw(&t).login(Some(DB1), Some("db1")).expect("db1 with its own key");
    refused(raw(&t).login(Some(SHARED), Some("db1")), ErrorCode::AuthFailed, AUTH_FAILED);
    raw(&t).login(Some(SHARED), Some("web")).expect("a host without its own key proves the shared key");
    raw(&t).login(Some(SHARED), Some("elsewhere")).expect("the shared key admits any host");

    // A MAC from another connection's nonce (a replay), or db1's MAC offered for web.
    let (mut victim, mut attacker) = (raw(&t), raw(&t));
    let features = rblk_proto::FEATURES & !rblk_proto::FEATURE_KEEPALIVE;
    let seen = victim.challenge(features);
    attacker.challenge(features);
    let replayed = rblk_proto::auth_mac(DB1, &seen, Some("db1")).unwrap();
    refused(attacker.auth_with(replayed, Some("db1")), ErrorCode::AuthFailed, "wrong key");
    refused(victim.auth_with(replayed, Some("web")), ErrorCode::AuthFailed, "wrong key");

    // A today's-version peer: no host identity, the base AUTH under the shared key, OPENED's
    // base body.
    let mut old = raw(&t);
    let nonce = old.challenge(FEATURE_FLUSH_RANGES);
    old.auth_with(rblk_proto::auth_mac(SHARED, &nonce, None).unwrap(), None).expect("base AUTH");
    let o = old.open_with("v", OpenMode::ReadWrite, None).expect("a today's peer opens");
    assert_eq!(o.instance, None, "base OPENED");
    // Such a peer may not send the tail it did not announce.
    let mut sneaky = raw(&t);
    let nonce = sneaky.challenge(FEATURE_FLUSH_RANGES);
    let mac = rblk_proto::auth_mac(DB1, &nonce, Some("db1")).unwrap();
    refused(sneaky.auth_with(mac, Some("db1")), ErrorCode::Unexpected, "did not announce host identities");

    // The library, end to end.
    let vol = Session::connect(&uri(&t, "v"), &opts(&t, "db1", Some(DB1))).unwrap().open(OpenMode::ReadOnly);
    vol.expect("the library authenticates db1 with its own key");
    match Session::connect(&uri(&t, "v"), &opts(&t, "db1", Some(SHARED))) {
        Err(Error::Auth { reason, .. }) => assert!(reason.contains(AUTH_FAILED), "{reason}"),
        other => panic!("db1 with the shared key: {other:?}"),
    }
}

fn without_a_shared_key_only_known_hosts_get_in(fabric: Fabric) {
    let t = Target::start_with_config(fabric, &hosts_config(false));
    refused(raw(&t).login(Some(b"guess"), Some("intruder")), ErrorCode::AuthFailed, AUTH_FAILED);
    refused(raw(&t).login(None, Some("web")), ErrorCode::AuthFailed, AUTH_FAILED);
    let mut old = raw(&t);
    let nonce = old.challenge(FEATURE_FLUSH_RANGES);
    let mac = rblk_proto::auth_mac(SHARED, &nonce, None).unwrap();
    refused(old.auth_with(mac, None), ErrorCode::AuthFailed, "sent no host identity");
    let mut db1 = raw(&t);
    db1.login(Some(DB1), Some("db1")).expect("db1 with its own key");
    db1.open_with("v", OpenMode::Exclusive, None).expect("and it opens");
}

fn access_lists_refuse_with_the_reason(fabric: Fabric) {
    // No keys: names are taken as claimed (as NVMe-oF's allowed hosts without DH-HMAC-CHAP).
    let t = Target::start_with_config(
        fabric,
        "[[volume]]\nname = \"db\"\nsize = \"4M\"\nallow = { db1 = \"exclusive\", web = \"ro\" }\n\
         [[volume]]\nname = \"pub\"\nsize = \"4M\"\nallow = { \"*\" = \"ro\" }\n\
         [[volume]]\nname = \"free\"\nsize = \"4M\"\n",
    );
    let open = |host: &str, volume: &str, mode| Session::connect(&uri(&t, volume), &opts(&t, host, None))?.open(mode);
    let denied = |r: Result<rblk_initiator::Volume, Error>, words: &str| match r {
        Err(Error::Target { code: ErrorCode::BadMode, text, .. }) => assert!(text.contains(words), "{text}"),
        other => panic!("expected a refusal naming {words:?}, got {other:?}"),
    };
    let web = open("web", "db", OpenMode::ReadOnly).expect("web may read db");
    denied(open("web", "db", OpenMode::Exclusive), "host web may not open volume db exclusively");
    denied(open("web", "db", OpenMode::ReadWrite), "may not open volume db read-write");
    // A host not on the list is told what a name that does not exist is told.
    match open("stranger", "db", OpenMode::ReadOnly) {
        Err(Error::Target { code: ErrorCode::NoSuchVolume, text, .. }) => assert_eq!(text, "no such volume db"),
        other => panic!("an unlisted host's OPEN: {other:?}"),
    }
    drop(web);
    let db1 = open("db1", "db", OpenMode::Exclusive).expect("db1 may open db exclusively");
    drop(db1);
    // An initiator without host identities is anonymous: not on any list.
    let mut old = raw(&t);
    old.hello_with(FEATURE_FLUSH_RANGES);
    let (code, text) = old.open_with("db", OpenMode::ReadOnly, None).unwrap_err();
    assert!(code == ErrorCode::NoSuchVolume && text == "no such volume db", "{code:?} {text}");
    old.open_with("free", OpenMode::Exclusive, None).expect("a volume without a list is open to all");
    open("anyone", "pub", OpenMode::ReadOnly).expect("* grants read-only to any host");
    denied(open("anyone", "pub", OpenMode::ReadWrite), "grants ro");
}

fn session_caps_per_host_and_in_all(fabric: Fabric) {
    let t = Target::start_with_config(
        fabric,
        "max_sessions_per_host = 2\nmax_sessions = 3\n[[volume]]\nname = \"v\"\nsize = \"4M\"\n",
    );
    let open = |host: &str| Session::connect(&uri(&t, "v"), &opts(&t, host, None))?.open(OpenMode::ReadOnly);
    let full = |r: Result<rblk_initiator::Volume, Error>, words: &str| match r {
        Err(Error::Target { code: ErrorCode::NoResources, text, .. }) => assert!(text.contains(words), "{text}"),
        other => panic!("expected a refusal naming {words:?}, got {other:?}"),
    };
    let a1 = open("a").expect("a's first session");
    let _a2 = open("a").expect("a's second session");
    full(open("a"), "host a have 2 sessions open, the most one host may (max_sessions_per_host)");
    let _b = open("b").expect("another host still gets in");
    full(open("c"), "the target has 3 sessions open, its maximum (max_sessions)");
    // A session that ends gives its room back (its connection's teardown is asynchronous).
    drop(a1);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match open("c") {
            Ok(_) => break,
            Err(e) if Instant::now() < deadline => {
                eprintln!("trust: not yet: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("room did not come back after a session ended: {e}"),
        }
    }
}

fn repeated_auth_failures_are_slowed_not_refused(fabric: Fabric) {
    let t = Target::start_with_config(
        fabric,
        &format!("key_file = {:?}\n[[volume]]\nname = \"v\"\nsize = \"4M\"\n", key_file(SHARED)),
    );
    // One honest login first, from the same address: the target's first AUTH (and the guest's
    // first connection) may be slow for reasons of their own, which the first failure below
    // must not be charged with. It also leaves no failures on record.
    raw(&t).login(Some(SHARED), Some("guesser")).expect("the right key gets in");
    // Each failure on a fresh connection, as a guesser would (one connection's refusals are
    // capped anyway). All come from one address.
    let mut took = Vec::new();
    for _ in 0..6 {
        let mut c = raw(&t);
        let nonce = c.challenge(rblk_proto::FEATURES & !rblk_proto::FEATURE_KEEPALIVE);
        let mac = rblk_proto::auth_mac(b"a guess", &nonce, Some("guesser")).unwrap();
        let start = Instant::now();
        refused(c.auth_with(mac, Some("guesser")), ErrorCode::AuthFailed, "wrong key");
        took.push(start.elapsed());
    }
    eprintln!("trust: AUTH failure replies took {took:?}");
    // Relative, not absolute (a TCG guest under load may pause anywhere): the first failure is
    // not held back while the second is held 250 ms, so the first takes well under half the
    // second. A first failure held back as the second (250 ms) would fail this.
    assert!(took[0] * 2 < took[1], "the first failure is answered at once: {took:?}");
    assert!(took[2] >= Duration::from_millis(450), "the third waits (500 ms): {:?}", took[2]);
    assert!(took[5] >= Duration::from_millis(1900), "the sixth waits the most (2 s): {:?}", took[5]);
    // Uncapped, the sixth would wait 4 s; the slack above 2 s is for a slow guest.
    assert!(took.iter().all(|d| *d < Duration::from_millis(3500)), "at most 2 s: {took:?}");
    // Nothing is refused for it: the right key gets in.
    let mut honest = raw(&t);
    honest.login(Some(SHARED), Some("guesser")).expect("the right key still works");
    honest.open_with("v", OpenMode::ReadOnly, None).expect("and opens");
}

/// Catches LIST answered before AUTH on a keyed target (volume names to anyone), or to a peer
/// that did not announce the feature (which could not parse the reply).
fn list_needs_authentication_and_the_feature(fabric: Fabric) {
    let t = Target::start_with_config(fabric, &hosts_config(true));
    let list = |r: &mut Raw| match rblk_proto::parse(&r.request(&Message::List { start: 0 })) {
        Ok((_, Message::ListReply { total, entries })) => {
            Ok((total, entries.iter().map(|e| e.name().to_owned()).collect::<Vec<_>>()))
        }
        Ok((_, Message::Error { code, text })) => Err((code, text.to_owned())),
        other => panic!("LIST answered with {other:?}"),
    };
    let mut early = raw(&t);
    early.challenge(rblk_proto::FEATURES);
    assert_eq!(list(&mut early).unwrap_err().0, ErrorCode::AuthRequired);
    let mut old = raw(&t);
    let nonce = old.challenge(FEATURE_FLUSH_RANGES);
    old.auth_with(rblk_proto::auth_mac(SHARED, &nonce, None).unwrap(), None).unwrap();
    assert_eq!(list(&mut old).unwrap_err().0, ErrorCode::Unexpected);
    let mut db1 = raw(&t);
    db1.login(Some(DB1), Some("db1")).unwrap();
    assert_eq!(list(&mut db1).unwrap(), (1, vec!["v".to_owned()]));
}

/// AUTH refused for an unknown host, a known host without a key of its own (no shared key) and
/// a known host with a wrong key, each on a fresh connection with the same requests: the ERRORs
/// must be the same bytes, naming no host. With a shared key, unknown hosts prove it: a wrong
/// one is refused as db1's wrong own key is.
fn auth_refusals_do_not_tell_hosts_apart(fabric: Fabric) {
    let refusal = |t: &Target, key: &[u8], host: &str| {
        let mut r = raw(t);
        let nonce = r.challenge(rblk_proto::FEATURES & !rblk_proto::FEATURE_KEEPALIVE);
        r.request(&Message::Auth { mac: rblk_proto::auth_mac(key, &nonce, Some(host)).unwrap(), host: Some(host) })
    };
    let hosts_only = Target::start_with_config(fabric, &hosts_config(false));
    let unknown = refusal(&hosts_only, b"a guess", "intruder");
    assert_eq!(
        rblk_proto::parse(&unknown).map(|(_, m)| m).ok(),
        Some(Message::Error { code: ErrorCode::AuthFailed, text: AUTH_FAILED })
    );
    assert_eq!(refusal(&hosts_only, b"a guess", "web"), unknown, "a known host without a key of its own");
    assert_eq!(refusal(&hosts_only, b"a guess", "db1"), unknown, "a known host with a wrong key");
    let shared = Target::start_with_config(fabric, &hosts_config(true));
    assert_eq!(refusal(&shared, b"a guess", "intruder"), unknown, "an unknown host with a wrong shared key");
    assert_eq!(refusal(&shared, SHARED, "db1"), unknown, "db1 with the shared key instead of its own");
}

/// Unlisted volumes, and a durable volume that could not be loaded (its backing file is smaller
/// than the volume), on a target that serves them and on one that has no such names: a host
/// not on their access lists (or an anonymous one) must get the same bytes from both, naming no
/// other volume. A host on the list learns that the broken volume is unavailable, but not its
/// backing store's path or why, through the raw protocol, the library's error or LIST.
fn unlisted_volumes_are_answered_as_unknown_names(fabric: Fabric) {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rblk-trust-store-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let store = dir.join("secret-store.img");
    std::fs::write(&store, vec![0u8; 4096]).unwrap();
    let pub_volume = "[[volume]]\nname = \"pub\"\nsize = \"4M\"\n";
    let serving = Target::start_with_config(
        fabric,
        &format!(
            "{pub_volume}[[volume]]\nname = \"db\"\nsize = \"4M\"\nallow = {{ db1 = \"exclusive\" }}\n\
             [[volume]]\nname = \"broken\"\nsize = \"4M\"\npath = {store:?}\nallow = {{ db1 = \"rw\" }}\n"
        ),
    );
    let without = Target::start_with_config(fabric, pub_volume);
    let open = |t: &Target, host: Option<&str>, name: &str| {
        let mut r = raw(t);
        match host {
            Some(h) => r.login(None, Some(h)).expect("names are taken as claimed"),
            None => {
                r.hello_with(FEATURE_FLUSH_RANGES);
            }
        }
        r.request(&Message::Open { mode: OpenMode::ReadOnly, name, resume: None })
    };
    for name in ["db", "broken"] {
        for host in [Some("stranger"), None] {
            let unlisted = open(&serving, host, name);
            let text = format!("no such volume {name}");
            assert_eq!(
                rblk_proto::parse(&unlisted).map(|(_, m)| m).ok(),
                Some(Message::Error { code: ErrorCode::NoSuchVolume, text: &text }),
                "{host:?} opening {name}"
            );
            assert_eq!(unlisted, open(&without, host, name), "{host:?} opening {name}: unlisted and unknown differ");
        }
    }

    // db1 is on the list: told the volume is unavailable, not where its store is or why.
    let secret = store.to_str().unwrap();
    let listed = open(&serving, Some("db1"), "broken");
    assert_eq!(
        rblk_proto::parse(&listed).map(|(_, m)| m).ok(),
        Some(Message::Error {
            code: ErrorCode::VolumeFailed,
            text: "volume broken is unavailable (see the target's log)"
        })
    );
    let session = Session::connect(&uri(&serving, "broken"), &opts(&serving, "db1", None)).unwrap();
    let e = session.open(OpenMode::ReadWrite).expect_err("a volume that could not be loaded");
    let shown = format!("{e:?} {}", rblk_fabric::Chain(&e));
    assert!(!shown.contains(secret) && !shown.contains("secret-store") && !shown.contains("4096"), "{shown}");
    let mut db1 = raw(&serving);
    db1.login(None, Some("db1")).unwrap();
    let listing = db1.request(&Message::List { start: 0 });
    assert!(!listing.windows(12).any(|w| w == b"secret-store"), "LIST names the backing store");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The real binaries, as a user runs them, with a key file of mode 0644: both refuse it, exit
/// non-zero and say the mode, before touching RDMA (so this runs on a host without it; there a
/// daemon past the key check would say "no RDMA device", and `rblk` would fail to connect).
/// With mode 0600 the same file passes the daemon's `--check-config`, and `rblk` gets past it
/// to the connect: the mode is what they refused.
#[test]
fn key_files_others_may_read_are_refused_by_both_binaries() {
    use std::os::unix::fs::PermissionsExt as _;
    use std::process::Command;

    use rblk_tests::daemon::bin;

    let dir = std::env::temp_dir().join(format!("rblk-trust-mode-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("shared.key");
    std::fs::write(&key, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n").unwrap();
    let path = key.to_str().unwrap();
    let state = dir.join("state");
    let target = |extra: &[&str]| {
        let out = Command::new(bin("rblk-target"))
            .args(["--key-file", path, "--volume", "v:1M", "--admin-socket", "none", "--state-dir"])
            .arg(&state)
            .args(extra)
            .output()
            .expect("run rblk-target");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let rblk = || {
        let out = Command::new(bin("rblk"))
            .args(["info", "rblk://127.0.0.1:9/v", "--key-file", path, "--host-id", "h", "--timeout", "2"])
            .env_remove("RBLK_KEY_FILE")
            .output()
            .expect("run rblk");
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let refused_for_its_mode = |(ok, text): (bool, String), who: &str| {
        assert!(!ok, "{who} took a key file of mode 0644: {text}");
        assert!(text.contains(path) && text.contains("mode 0644") && text.contains("chmod 600"), "{who}: {text}");
        assert!(!text.contains("RDMA"), "{who} touched RDMA before checking the key file: {text}");
    };

    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    refused_for_its_mode(target(&[]), "rblk-target");
    refused_for_its_mode(target(&["--check-config"]), "rblk-target --check-config");
    refused_for_its_mode(rblk(), "rblk");

    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (ok, text) = target(&["--check-config"]);
    assert!(ok && text.contains("configuration OK"), "rblk-target --check-config with mode 0600: {text}");
    let (_, text) = rblk();
    assert!(!text.contains("mode 06"), "rblk refused the key file of mode 0600: {text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The real daemon with its defaults (no `--allow-any-host` from the test helpers), in the guest.
mod rxe_default {
    use std::process::Command;

    use rblk_tests::daemon::{bin, Daemon};

    /// `rblk-test-client keyless ADDR VOLUME`: its exit status and stdout.
    fn keyless(d: &Daemon, volume: &str) -> (bool, String) {
        let out = Command::new(bin("rblk-test-client"))
            .args(["keyless", &d.addr.to_string(), volume])
            .output()
            .expect("run rblk-test-client");
        eprintln!("rblk-test-client keyless: {out:?}");
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
    }

    #[test]
    #[ignore = "needs rxe: run in the guest by scripts/test.sh"]
    fn a_peer_without_the_key_is_refused_and_the_generated_key_needs_no_flags() {
        let rdma = rblk_tests::rxe::rdma();
        let d = Daemon::start_as_configured(&rdma, &["--volume", "v:4M", "--admin-socket", "none"]);
        let key = std::path::Path::new("/var/lib/rblk/target.key");
        assert!(!d.log_lines(&["/var/lib/rblk/target.key", "scp -p"]).is_empty(), "the log says where the key is");
        let meta = std::fs::metadata(key).expect("the daemon made its key");
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777, 0o600);
        assert_eq!(meta.len(), 65, "64 hex digits and a newline");

        let (ok, out) = keyless(&d, "v");
        assert!(!ok && out.contains("refused AuthRequired"), "a peer without the key: {out}");

        let info = Command::new(bin("rblk"))
            .args(["info", &format!("rblk://{}/v", d.addr)])
            .env_remove("RBLK_KEY_FILE")
            .output()
            .expect("run rblk info");
        let text = format!("{}{}", String::from_utf8_lossy(&info.stdout), String::from_utf8_lossy(&info.stderr));
        assert!(info.status.success(), "rblk info with no flags on the target's host: {text}");
    }

    #[test]
    #[ignore = "needs rxe: run in the guest by scripts/test.sh"]
    fn allow_any_host_serves_the_keyless_sequence() {
        let rdma = rblk_tests::rxe::rdma();
        let state = std::env::temp_dir().join(format!("rblk-any-host-{}", std::process::id()));
        let state = state.to_str().expect("path");
        let args = ["--allow-any-host", "--state-dir", state, "--volume", "v:4M", "--admin-socket", "none"];
        let d = Daemon::start_as_configured(&rdma, &args);
        assert!(!d.log_lines(&["ANY initiator"]).is_empty(), "warned at start");
        let (ok, out) = keyless(&d, "v");
        assert!(ok && out.starts_with("opened 4194304"), "HELLO then OPEN, no AUTH: {out}");
        assert!(!std::path::Path::new(state).join("target.key").exists(), "no key made");
    }
}
