//! Revocation that takes effect (issue 39): a reload that changes keys or access lists ends the
//! sessions it no longer admits, at once, and one that widens access must be confirmed in the
//! file. Against a target configured by a config file and reloaded with another (the daemon's
//! `--config` file and SIGHUP over rxe, the same file in-process and `Running::reload` over the
//! in-memory fabric), with hand-made control messages and one-sided READs.
//!
//! What each would catch (each fails with its mechanism removed):
//! - `a_reload_revokes_at_once_and_widens_only_when_confirmed` (both fabrics): a reload that
//!   applies keys only to the next AUTH (without `Shared::revoke` ending the session the old
//!   rkey still READs and the JOIN with the valid token is answered JOINED), a
//!   replaced key (not only a removed host) overlooked, a host whose key did not change released
//!   too, a report that does not name the change or the released session, an OPEN on a
//!   connection authenticated under the old key let through; then authentication
//!   turned off or `*` added to an allow list by a reload without `confirm_widen = true` (the
//!   check removed, the keyless peer gets in), a refusal that does not say what would widen and
//!   how to confirm it, and a confirmed widening not applied, not reported, or releasing anyone.
//! - `mem_a_host_removed_from_the_hosts_loses_its_sessions`: a host taken out of the hosts (and
//!   so unable to log in) keeping its session.
//! - `mem_a_host_off_an_allow_list_loses_that_volume_only`: access lists rechecked only at OPEN
//!   (the session of the volume it left keeps working), or a host's other sessions released with
//!   it; and, first, a reload that narrows nothing (a host and a volume added) releasing anything.
//! - `check_config_compares_with_the_running_daemon` (host only: the binary's `--check-config`
//!   against an in-process target's admin socket): a check that says "configuration OK" for a
//!   file the running daemon would refuse at the reload `ExecReload=` runs it before, or that
//!   does not print what would widen.

use std::path::PathBuf;

use rblk_fabric::{Fabric, WcStatus};
use rblk_proto::{ConnectData, ErrorCode, Message, OpenMode, Opened, FEATURES, FEATURE_KEEPALIVE};
use rblk_tests::raw::Raw;
use rblk_tests::target::Target;

const DB1: &[u8] = b"db1's own secret, at least 32 bytes";
const DB1_NEW: &[u8] = b"db1's next secret, at least 32 bytes";
const WEB: &[u8] = b"web's own secret, at least 32 bytes!";
const SHARED: &[u8] = b"the shared secret, 32 bytes or more";

rblk_tests::on_both_fabrics!(a_reload_revokes_at_once_and_widens_only_when_confirmed);

// The rest only over the in-memory fabric: what they add is which sessions a policy revokes,
// the same code on both fabrics; the guest budget goes to the one above.
#[test]
fn mem_a_host_removed_from_the_hosts_loses_its_sessions() {
    a_host_removed_from_the_hosts_loses_its_sessions(Fabric::Mem);
}

#[test]
fn mem_a_host_off_an_allow_list_loses_that_volume_only() {
    a_host_off_an_allow_list_loses_that_volume_only(Fabric::Mem);
}

/// Writes `key` to a fresh file (mode 0600) and returns its path.
fn key_file(key: &[u8]) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("rblk-revoke-{}-{n}.key", std::process::id()));
    rblk_tests::target::write_key_file(&path, key);
    path
}

fn volume(name: &str, allow: &str) -> String {
    let allow = if allow.is_empty() { String::new() } else { format!("allow = {{ {allow} }}\n") };
    format!("[[volume]]\nname = \"{name}\"\nsize = \"4M\"\n{allow}")
}

fn host(name: &str, key: Option<&[u8]>) -> String {
    let key = key.map(|k| format!("key_file = {:?}\n", key_file(k))).unwrap_or_default();
    format!("[[host]]\nname = \"{name}\"\n{key}")
}

/// A connection that logged in as `host` with `key` (None: names taken as claimed) and opened
/// `volume` read-write.
fn open(t: &Target, key: Option<&[u8]>, host: &str, volume: &str) -> (Raw, Opened) {
    let mut r = Raw::connect(t.fabric(), t.addr(), ConnectData::NewSession).expect("connect");
    r.login(key, Some(host)).unwrap_or_else(|e| panic!("{host} logs in: {e:?}"));
    let o = r.open_with(volume, OpenMode::ReadWrite, None).unwrap_or_else(|e| panic!("{host} opens {volume}: {e:?}"));
    (r, o)
}

/// A one-sided READ of the volume's first block with the session's rkey: the completion's
/// status, or the post's error (a QP the target already tore down).
fn read(r: &mut Raw, o: &Opened) -> Result<WcStatus, rblk_fabric::Error> {
    r.read_block(o.remote_addr, o.rkey)
}

fn reads(r: &mut Raw, o: &Opened, who: &str) {
    assert_eq!(read(r, o).ok(), Some(WcStatus::SUCCESS), "{who}'s session still READs");
}

fn read_fails(r: &mut Raw, o: &Opened, who: &str) {
    let got = read(r, o);
    assert!(!matches!(got, Ok(WcStatus::SUCCESS)), "{who}'s old rkey still READs after the reload: {got:?}");
}

/// A further QP of `o`'s session, with its valid token: refused at the connect request (the
/// session is gone), or its JOIN answered with an ERROR.
fn join_refused(t: &Target, o: &Opened) {
    let data = ConnectData::Join { session_id: o.session_id, token: o.token };
    match Raw::connect(t.fabric(), t.addr(), data) {
        Err(e) => eprintln!("revoke: JOIN's connect refused: {e}"),
        Ok(mut c) => {
            let reply = c.request(&Message::Join { session_id: o.session_id, token: o.token });
            let reply = rblk_proto::parse(&reply).map(|(_, m)| m);
            assert!(matches!(reply, Ok(Message::Error { .. })), "a JOIN to a revoked session: {reply:?}");
        }
    }
}

fn a_reload_revokes_at_once_and_widens_only_when_confirmed(fabric: Fabric) {
    let keyed = format!("key_file = {:?}\n{}", key_file(SHARED), host("web", Some(WEB)));
    let v = volume("v", "db1 = \"rw\", web = \"rw\"");
    let t = Target::start_with_config(fabric, &format!("{keyed}{}{v}", host("db1", Some(DB1))));
    let (mut db1, o1) = open(&t, Some(DB1), "db1", "v");
    let (mut web, ow) = open(&t, Some(WEB), "web", "v");
    reads(&mut db1, &o1, "db1");
    // A connection of db1's that authenticated and has not opened yet.
    let mut ready = Raw::connect(t.fabric(), t.addr(), ConnectData::NewSession).expect("connect");
    ready.login(Some(DB1), Some("db1")).expect("db1 logs in");

    // db1's key replaced: its session ends now; web's key did not change.
    let report = t.reload(&format!("{keyed}{}{v}", host("db1", Some(DB1_NEW)))).expect("reload");
    assert!(report.contains("access: host db1's key replaced"), "{report}");
    assert!(report.contains("released 1 session:") && report.contains("(host db1)"), "{report}");
    read_fails(&mut db1, &o1, "db1");
    join_refused(&t, &o1);
    reads(&mut web, &ow, "web");
    let (code, text) = ready.open_with("v", OpenMode::ReadOnly, None).expect_err("an OPEN under the old key");
    assert!(code == ErrorCode::AuthFailed && text.contains("keys changed"), "{code:?} {text}");

    // Widenings: refused, nothing changed, unless the file confirms them.
    let keyless_opens = || {
        let mut r = Raw::connect(t.fabric(), t.addr(), ConnectData::NewSession).expect("connect");
        r.hello_with(FEATURES & !FEATURE_KEEPALIVE);
        r.open_with("v", OpenMode::ReadOnly, None).is_ok()
    };
    let db1 = host("db1", Some(DB1_NEW));
    let starred = volume("v", "db1 = \"rw\", web = \"rw\", \"*\" = \"ro\"");
    let e = t.reload(&format!("{keyed}{db1}{starred}")).expect_err("* added");
    assert!(e.contains("widens access (volume v allows * ro)") && e.contains("confirm_widen = true"), "{e}");
    // Authentication off (the test daemons run with --allow-any-host, so no key left means none).
    let open_file = volume("v", "");
    let e = t.reload(&open_file).expect_err("authentication off");
    assert!(e.contains("authentication off") && e.contains("allow list removed"), "{e}");
    assert!(!keyless_opens(), "nothing changed: a peer without the key is still refused");
    reads(&mut web, &ow, "web");

    let report = t.reload(&format!("confirm_widen = true\n{open_file}")).expect("a confirmed widening");
    assert!(report.contains("access: authentication off") && report.contains("shared key removed"), "{report}");
    assert!(!report.contains("released"), "widening takes nothing away: {report}");
    assert!(keyless_opens(), "a confirmed widening applies");
    reads(&mut web, &ow, "web");
}

fn a_host_removed_from_the_hosts_loses_its_sessions(fabric: Fabric) {
    let web = host("web", Some(WEB));
    let t = Target::start_with_config(fabric, &format!("{}{web}{}", host("db1", Some(DB1)), volume("v", "")));
    let (mut db1, o1) = open(&t, Some(DB1), "db1", "v");
    let (mut w, ow) = open(&t, Some(WEB), "web", "v");
    // No shared key: db1 cannot log in at all any more.
    let report = t.reload(&format!("{web}{}", volume("v", ""))).expect("reload");
    assert!(report.contains("host db1 removed") && report.contains("released 1 session:"), "{report}");
    read_fails(&mut db1, &o1, "db1");
    join_refused(&t, &o1);
    reads(&mut w, &ow, "web");
}

fn a_host_off_an_allow_list_loses_that_volume_only(fabric: Fabric) {
    // No keys: names are taken as claimed, so this is about the access lists alone.
    let both = volume("a", "db1 = \"rw\", web = \"rw\"");
    let b = volume("b", "db1 = \"rw\"");
    let t = Target::start_with_config(fabric, &format!("{both}{b}"));
    let (mut db1_a, oa) = open(&t, None, "db1", "a");
    let (mut db1_b, ob) = open(&t, None, "db1", "b");
    let (mut web_a, owa) = open(&t, None, "web", "a");

    // A host and a volume added: nothing narrows, nothing is released.
    let report = t.reload(&format!("{both}{b}{}{}", volume("c", ""), host("app", None))).expect("reload");
    assert!(report.contains("host app added") && !report.contains("released"), "{report}");
    reads(&mut db1_a, &oa, "db1 (a)");

    // db1 off a's list: its session of a ends, its session of b and web's of a go on.
    let report = t.reload(&format!("{}{b}", volume("a", "web = \"rw\""))).expect("reload");
    assert!(report.contains("volume a no longer allows db1 (was rw)"), "{report}");
    assert!(report.contains("released 1 session:") && report.contains("host db1"), "{report}");
    read_fails(&mut db1_a, &oa, "db1 (a)");
    join_refused(&t, &oa);
    reads(&mut db1_b, &ob, "db1 (b)");
    reads(&mut web_a, &owa, "web (a)");
}

/// The daemon binary's `--check-config` against a running target's admin socket (an in-process
/// one over the in-memory fabric, so this runs on the host): a file that widens access without
/// `confirm_widen` fails the check, naming the widening; confirmed, or only narrowing, it passes
/// and says what it would change.
#[test]
fn check_config_compares_with_the_running_daemon() {
    use std::os::unix::fs::PermissionsExt as _;
    use std::process::Command;

    use rblk_target::server::{Config, Server};

    let dir = std::env::temp_dir().join(format!("rblk-revoke-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let socket = dir.join("admin.sock");
    let keyed = format!("key_file = {:?}\n{}{}", key_file(SHARED), host("db1", Some(DB1)), volume("v", "db1 = \"rw\""));
    let file: rblk_target::config::File = toml::from_str(&keyed).unwrap();
    let cfg = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        fabric: Fabric::Mem,
        admin_socket: Some(socket.clone()),
        ..file.server_config().unwrap()
    };
    let _running = Server::start(cfg).expect("start the in-process target");

    let check = |toml: &str| {
        let path = dir.join("next.toml");
        std::fs::write(&path, toml).unwrap();
        let out = Command::new(rblk_tests::daemon::bin("rblk-target"))
            .arg("--check-config")
            .arg("--config")
            .arg(&path)
            .arg("--admin-socket")
            .arg(&socket)
            .output()
            .expect("run rblk-target --check-config");
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        eprintln!("revoke: --check-config: {text}");
        (out.status.success(), text)
    };

    let widening = format!("allow_any_host = true\n{}", volume("v", "db1 = \"rw\", \"*\" = \"rw\""));
    let (ok, text) = check(&widening);
    assert!(!ok && !text.contains("configuration OK"), "a widening the running daemon would refuse passed: {text}");
    assert!(text.contains("authentication off") && text.contains("(widens access)"), "{text}");
    assert!(text.contains("volume v allows * rw") && text.contains("would refuse this configuration"), "{text}");

    let (ok, text) = check(&format!("confirm_widen = true\n{widening}"));
    assert!(ok && text.contains("configuration OK") && text.contains("authentication off"), "{text}");

    let narrowing = format!("key_file = {:?}\n{}", key_file(SHARED), volume("v", "db1 = \"ro\""));
    let (ok, text) = check(&narrowing);
    assert!(ok && text.contains("host db1 removed") && text.contains("volume v allows db1 ro (was rw)"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
