//! The admin socket (issue 12, live volumes): `rblk-target admin add|remove|list`.
//!
//! On the host, the server in-process over the in-memory fabric, its admin socket in a temp dir:
//! - `malformed_requests_are_refused_with_a_reason`: would catch a parser that panics, hangs or
//!   applies something on garbage, a huge line, an unknown op, wrong types or a wrong version.
//! - `a_client_that_vanishes_mid_request_changes_nothing`: would catch a half line applied, or
//!   a daemon thread stuck on a client that is gone.
//! - `the_socket_is_its_owners_only_and_one_daemons`: would catch a socket wider than 0600, a
//!   second daemon taking over a live socket, a stale one not replaced, a file that is not a
//!   socket deleted, and the socket left behind at shutdown.
//! - `volumes_are_added_listed_and_removed`: would catch an add OPEN cannot find, a remove
//!   that pulls a volume from under its session (or never removes it), and wrong list counts.
//! - `a_reload_applies_the_file_again`: would catch runtime changes kept across a SIGHUP,
//!   against what --help and the README say.
//! - `admin_resize_grows_saves_and_refuses_what_it_must`: would catch a grow not saved to
//!   admin.toml before the answer (a restart would serve the old size), a durable volume's
//!   file not extended, a shrink under a session, a resize of a config-file volume (the next
//!   reload would undo it), and a refused resize that changes admin.toml.
//!
//! In the guest, over rxe, the real daemon and the real clients:
//! - `admin_adds_a_volume_rblk_uses_and_removes_it`: would catch the subcommand not reaching the
//!   daemon, a volume added where LIST or OPEN do not look, or removed while a session holds it.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rblk_fabric::Fabric;
use rblk_proto::{ConnectData, OpenMode};
use rblk_target::admin::{self, ClientError, Request};
use rblk_target::config::{FileVolume, VolumeSpec};
use rblk_target::server::{Config, Running, Server, StartError};
use rblk_tests::daemon::{bin, Daemon};
use rblk_tests::raw::Raw;

const MIB: u64 = 1 << 20;

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rblk-admin-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Whatever the umask: the admin socket's directory must not be writable by others.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

fn config(socket: &Path) -> Config {
    Config {
        listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        fabric: Fabric::Mem,
        volumes: vec![VolumeSpec { name: "a".into(), size: 4 * MIB, path: None }],
        admin_socket: Some(socket.to_owned()),
        ..Config::default()
    }
}

fn start(tag: &str) -> (Running, PathBuf) {
    let socket = temp_dir(tag).join("admin.sock");
    let r = Server::start(config(&socket)).expect("start the in-process target");
    assert_eq!(r.admin_socket(), Some(socket.as_path()));
    (r, socket)
}

fn add(socket: &Path, name: &str, size: &str) -> Result<admin::Reply, ClientError> {
    let volume = FileVolume { name: name.into(), size: size.into(), ..FileVolume::default() };
    admin::request(socket, &Request::Add { volume })
}

fn remove(socket: &Path, name: &str) -> Result<admin::Reply, ClientError> {
    admin::request(socket, &Request::Remove { name: name.into() })
}

fn names(socket: &Path) -> Vec<String> {
    let reply = admin::request(socket, &Request::List).expect("list");
    reply.volumes.expect("a list").into_iter().map(|v| v.name).collect()
}

fn refused_code(r: Result<admin::Reply, ClientError>) -> String {
    match r {
        Err(ClientError::Refused { code, .. }) => code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The reply to one raw line, parsed.
fn raw(socket: &Path, line: &[u8]) -> serde_json::Value {
    let reply = admin::request_line(socket, line).expect("a reply");
    serde_json::from_str(&reply).expect("the reply is JSON")
}

/// OPEN `name` read-write on a fresh connection, which holds the session.
fn open(r: &Running, name: &str) -> (Raw, bool) {
    let mut raw = Raw::connect(Fabric::Mem, r.local_addr(), ConnectData::NewSession).expect("connect");
    raw.hello_with(rblk_proto::FEATURES & !rblk_proto::FEATURE_KEEPALIVE);
    let ok = raw.open_with(name, OpenMode::ReadWrite, None).is_ok();
    (raw, ok)
}

#[test]
fn malformed_requests_are_refused_with_a_reason() {
    let (_r, socket) = start("malformed");
    let cases: [(&[u8], &str, &str); 9] = [
        (b"garbage", "malformed", "expected"),
        (b"[1,2]", "malformed", "object"),
        (b"{\"op\":\"list\"}", "malformed", "version"),
        (b"{\"version\":2,\"op\":\"list\"}", "version", "version 2"),
        (b"{\"version\":\"1\",\"op\":\"list\"}", "version", "\"1\""),
        (b"{\"version\":1,\"op\":\"format\"}", "unknown_op", "format"),
        (b"{\"version\":1,\"op\":\"remove\",\"name\":5}", "malformed", "string"),
        (b"{\"version\":1,\"op\":\"add\",\"volume\":{\"name\":\"x\",\"size\":\"12345\"}}", "invalid", "4096"),
        (
            b"{\"version\":1,\"op\":\"add\",\"volume\":{\"name\":\"x\",\"size\":\"4M\",\"colour\":1}}",
            "malformed",
            "colour",
        ),
    ];
    for (line, code, says) in cases {
        let reply = raw(&socket, line);
        let what = String::from_utf8_lossy(line);
        assert_eq!(reply["ok"], false, "{what}: {reply}");
        assert_eq!(reply["version"], admin::VERSION, "{what}: {reply}");
        assert_eq!(reply["error"], code, "{what}: {reply}");
        assert!(reply["message"].as_str().unwrap().contains(says), "{what}: {reply}");
    }
    // A line past the limit: refused, then the connection is closed.
    let mut s = UnixStream::connect(&socket).unwrap();
    let huge = vec![b'x'; admin::MAX_LINE + 10];
    let _ = s.write_all(&huge);
    let mut reader = BufReader::new(s);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let reply: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(reply["error"], "too_long", "{reply}");
    line.clear();
    assert_eq!(reader.read_line(&mut line).unwrap(), 0, "the connection is closed after it");
    // Nothing was added, and the daemon still answers.
    assert_eq!(names(&socket), ["a"]);
    // Several requests on one connection, one reply line each.
    let mut s = UnixStream::connect(&socket).unwrap();
    s.write_all(b"{\"version\":1,\"op\":\"list\"}\nnope\n{\"version\":1,\"op\":\"list\"}\n").unwrap();
    let oks: Vec<bool> = BufReader::new(s)
        .lines()
        .take(3)
        .map(|l| serde_json::from_str::<serde_json::Value>(&l.unwrap()).unwrap()["ok"].as_bool().unwrap())
        .collect();
    assert_eq!(oks, [true, false, true]);
}

#[test]
fn a_client_that_vanishes_mid_request_changes_nothing() {
    let (r, socket) = start("vanish");
    {
        let mut s = UnixStream::connect(&socket).unwrap();
        s.write_all(b"{\"version\":1,\"op\":\"add\",\"volume\":{\"name\":\"x\",\"size\":\"4M\"}}").unwrap();
        // Closed before the newline.
    }
    {
        // A silent one does not hold up the others.
        let _silent = UnixStream::connect(&socket).unwrap();
        assert_eq!(names(&socket), ["a"], "the half request added nothing");
    }
    {
        // One that sends a whole request and goes before the reply: carried out all the same.
        let mut s = UnixStream::connect(&socket).unwrap();
        s.write_all(b"{\"version\":1,\"op\":\"add\",\"volume\":{\"name\":\"y\",\"size\":\"4M\"}}\n").unwrap();
    }
    let start = Instant::now();
    while names(&socket) != ["a", "y"] {
        assert!(start.elapsed() < Duration::from_secs(5), "the whole request was not carried out");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(open(&r, "y").1, "y is served");
}

#[test]
fn the_socket_is_its_owners_only_and_one_daemons() {
    let (r, socket) = start("perm");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");
    match Server::start(config(&socket)) {
        Err(StartError::Admin(admin::SocketError::InUse(p))) => assert_eq!(p, socket),
        other => panic!("a second daemon on a live socket: {other:?}"),
    }
    assert_eq!(names(&socket), ["a"], "the first daemon still serves it");
    r.shutdown();
    assert!(!socket.exists(), "the socket is removed at shutdown");
    assert!(matches!(admin::request(&socket, &Request::List), Err(ClientError::NotRunning(_))));

    // A stale socket (its daemon died) is replaced.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());
    assert!(matches!(admin::request(&socket, &Request::List), Err(ClientError::NotRunning(_))));
    let r = Server::start(config(&socket)).expect("start over a stale socket");
    assert_eq!(names(&socket), ["a"]);
    r.shutdown();

    // Something else at the path is neither used nor deleted, and --check-config says so.
    std::fs::write(&socket, "not a socket").unwrap();
    let err = Server::start(config(&socket)).unwrap_err();
    assert!(err.to_string().contains("not a socket"), "{err}");
    assert!(config(&socket).check().is_err());
    assert_eq!(std::fs::read_to_string(&socket).unwrap(), "not a socket");
    let long = PathBuf::from(format!("/tmp/{}/admin.sock", "d".repeat(120)));
    assert!(Config { admin_socket: Some(long), ..config(&socket) }.check().is_err(), "too long for sun_path");
    // A directory others may write to: they could replace the socket. Would catch the
    // parent directory not being checked (start and --check-config both refuse it).
    use std::os::unix::fs::PermissionsExt as _;
    let open_dir = temp_dir("open-dir");
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let exposed = open_dir.join("admin.sock");
    let err = Server::start(config(&exposed)).unwrap_err();
    assert!(err.to_string().contains("mode 0777"), "{err}");
    assert!(config(&exposed).check().is_err());
    assert!(!exposed.exists(), "nothing was bound there");
}

#[test]
fn volumes_are_added_listed_and_removed() {
    let (r, socket) = start("live");
    let reply = add(&socket, "b", "8M").expect("add b");
    assert!(reply.message.contains("added volume b"), "{}", reply.message);
    assert_eq!(refused_code(add(&socket, "b", "8M")), "exists");
    assert_eq!(refused_code(add(&socket, "a", "4M")), "exists");
    assert_eq!(refused_code(add(&socket, "bad name", "4M")), "invalid");
    let (session, ok) = open(&r, "b");
    assert!(ok, "OPEN finds the added volume");
    let list = admin::request(&socket, &Request::List).unwrap().volumes.unwrap();
    let b = list.iter().find(|v| v.name == "b").expect("b listed");
    assert_eq!((b.size, b.sessions, b.state.as_str(), b.configured), (8 * MIB, 1, "ok", true));
    assert_eq!(list.iter().find(|v| v.name == "a").unwrap().sessions, 0);

    // Refused while the session is open, with the reason; still served.
    match remove(&socket, "b") {
        Err(ClientError::Refused { code, message }) => {
            assert_eq!(code, "busy");
            assert!(message.contains("1 open session"), "{message}");
        }
        other => panic!("remove of an open volume: {other:?}"),
    }
    assert_eq!(names(&socket), ["a", "b"]);
    drop(session);
    let start = Instant::now();
    loop {
        match remove(&socket, "b") {
            Ok(reply) => {
                assert_eq!(reply.message, "removed volume b");
                break;
            }
            Err(e) => {
                assert_eq!(refused_code(Err(e)), "busy");
                assert!(start.elapsed() < Duration::from_secs(10), "b stayed busy after its session closed");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    assert_eq!(names(&socket), ["a"]);
    assert!(!open(&r, "b").1, "OPEN no longer finds b");
    assert_eq!(refused_code(remove(&socket, "b")), "unknown_volume");
    // The last volume goes too: a target may serve none, and takes volumes again.
    remove(&socket, "a").expect("remove the last volume");
    assert!(names(&socket).is_empty());
    add(&socket, "a", "4M").expect("add a volume to an empty target");
    assert_eq!(names(&socket), ["a"]);
}

#[test]
fn a_reload_applies_the_file_again() {
    let (r, socket) = start("reload");
    add(&socket, "x", "4M").expect("add x");
    let report = r.reload(config(&socket)).expect("reload the original configuration");
    assert_eq!(report.removed, ["x"], "{report:?}");
    assert_eq!(names(&socket), ["a"]);
    // And a reload after an admin request keeps the admin request's configuration as the base
    // for the next one: adding twice works after a reload.
    add(&socket, "x", "4M").expect("add x again");
    add(&socket, "z", "4M").expect("add z");
    assert_eq!(names(&socket), ["a", "x", "z"]);
}

/// `rblk` (the client binary) with `args`; its output, asserted successful.
fn rblk(args: &[&str]) -> std::process::Output {
    let out = Command::new(bin("rblk")).args(args).output().expect("run rblk");
    assert!(out.status.success(), "rblk {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn admin_cli(socket: &Path, args: &[&str]) -> std::process::Output {
    Command::new(bin("rblk-target"))
        .arg("admin")
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .expect("run rblk-target admin")
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn admin_adds_a_volume_rblk_uses_and_removes_it() {
    let started = Instant::now();
    let socket = temp_dir("guest").join("admin.sock");
    let socket_arg = format!("--admin-socket={}", socket.display());
    // A state dir of its own: admin changes are saved in STATE_DIR/admin.toml.
    let state_arg = format!("--state-dir={}", socket.with_file_name("state").display());
    let d = Daemon::start(&rblk_tests::rxe::rdma(), &["--volume", "a:4M", &socket_arg, &state_arg]);
    let out = admin_cli(&socket, &["add", "live:8M"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ls = String::from_utf8_lossy(&rblk(&["discover", &format!("rblk://{}", d.addr)]).stdout).into_owned();
    assert!(ls.contains("live"), "rblk discover shows the added volume: {ls}");
    let uri = format!("rblk://{}/live", d.addr);
    let data = temp_dir("guest-data").join("in");
    let block: Vec<u8> = b"written through a volume added at run time ".iter().copied().cycle().take(4096).collect();
    std::fs::write(&data, &block).unwrap();
    rblk(&["write", &uri, "--offset", "4096", "--input", data.to_str().unwrap()]);
    let back = rblk(&["read", &uri, "--offset", "4096", "--length", "4096"]);
    assert!(back.stdout == block, "read back differs");

    // An open session (a real initiator) holds it: remove is refused, with the reason.
    let holder = rblk_initiator::Session::connect(uri.as_str(), &rblk_initiator::Options::default())
        .and_then(|s| s.open(OpenMode::ReadWrite))
        .expect("open the live volume");
    let out = admin_cli(&socket, &["remove", "live"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("open session"), "{stderr}");
    let list = admin_cli(&socket, &["list", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&list.stdout).expect("list --json");
    let live = list.as_array().unwrap().iter().find(|v| v["name"] == "live").expect("live listed").clone();
    assert_eq!((live["sessions"].as_u64(), live["size"].as_u64()), (Some(1), Some(8 * MIB)), "{live}");
    drop(holder);
    let start = Instant::now();
    loop {
        let out = admin_cli(&socket, &["remove", "live"]);
        if out.status.success() {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "{}", String::from_utf8_lossy(&out.stderr));
        std::thread::sleep(Duration::from_millis(200));
    }
    let ls = String::from_utf8_lossy(&rblk(&["discover", &format!("rblk://{}", d.addr)]).stdout).into_owned();
    assert!(!ls.contains("live"), "removed: {ls}");
    let status = d.stop();
    assert!(status.success(), "{status:?}");
    assert!(!socket.exists(), "the daemon removed its socket");
    eprintln!("admin guest test: {:?}", started.elapsed());
}

/// Issue 43, traps 3 and 10: `admin add NAME:SIZE:PATH` with a relative PATH meant the daemon's
/// working directory (`/` under systemd), not the user's, and admin.toml kept it relative;
/// `admin list -o json` was refused (only `--json`). Catches the client sending the path as
/// typed (admin.toml would hold `v.img`, not the absolute path), the daemon taking a relative
/// path from a client that sends one, and `-o` missing or taking an unknown format.
#[test]
fn admin_paths_are_absolute_and_list_takes_dash_o() {
    let dir = temp_dir("paths");
    let socket = dir.join("admin.sock");
    let state = dir.join("state");
    let cfg = Config { state_dir: Some(state.clone()), ..config(&socket) };
    let r = Server::start(cfg).expect("start the in-process target");
    let out = Command::new(bin("rblk-target"))
        .current_dir(&dir)
        .args(["admin", "--socket"])
        .arg(&socket)
        .args(["add", "d:1M:v.img"])
        .output()
        .expect("run rblk-target admin add");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let saved = std::fs::read_to_string(state.join("admin.toml")).expect("admin.toml");
    let want = format!("path = \"{}\"", dir.join("v.img").display());
    assert!(saved.contains(&want), "admin.toml holds {saved:?}, not {want}");
    assert!(dir.join("v.img").exists(), "the backing file is where the user meant");
    // A client that sends a relative path is refused, and nothing is added.
    let volume =
        FileVolume { name: "rel".into(), size: "1M".into(), path: Some("rel.img".into()), ..FileVolume::default() };
    match admin::request(&socket, &Request::Add { volume }) {
        Err(ClientError::Refused { code, message }) => {
            assert_eq!(code, "invalid");
            assert!(message.contains("rel.img is relative"), "{message}");
        }
        other => panic!("a relative path was taken: {other:?}"),
    }
    assert_eq!(names(&socket), ["a", "d"]);
    // -o json, as rblk's and nvme-cli's; --json still; other formats refused as usage errors.
    for args in [&["list", "-o", "json"][..], &["list", "--json"], &["list", "--output-format", "json"]] {
        let out = admin_cli(&socket, args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(list.as_array().map(Vec::len), Some(2), "{args:?}: {list}");
    }
    let out = admin_cli(&socket, &["list", "-o", "yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let out = admin_cli(&socket, &["list"]);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("NAME"), "the table is the default");
    r.shutdown();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn admin_resize_grows_saves_and_refuses_what_it_must() {
    let dir = temp_dir("resize");
    let socket = dir.join("admin.sock");
    let state = dir.join("state");
    let cfg = Config { state_dir: Some(state.clone()), ..config(&socket) };
    let r = Server::start(cfg).expect("start the in-process target");
    let img = dir.join("d.img");
    let add = admin_cli(&socket, &["add", &format!("d:1M:{}", img.display())]);
    assert!(add.status.success(), "{}", String::from_utf8_lossy(&add.stderr));
    add_ram(&socket, "m");
    let (_session, ok) = open(&r, "d");
    assert!(ok, "OPEN d");

    let out = admin_cli(&socket, &["resize", "d", "3M"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("grew volume d"), "{}", String::from_utf8_lossy(&out.stdout));
    let saved = std::fs::read_to_string(state.join("admin.toml")).expect("admin.toml");
    assert!(saved.contains(&format!("size = {}", 3 * MIB)), "admin.toml holds {saved:?}");
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 3 * MIB, "the backing file grew with it");
    let list = admin::request(&socket, &Request::List).unwrap().volumes.unwrap();
    assert_eq!(list.iter().find(|v| v.name == "d").map(|v| v.size), Some(3 * MIB));

    // Refusals change nothing, admin.toml included.
    let refuse = |args: &[&str], says: &str| {
        let out = admin_cli(&socket, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was done");
        assert!(err.contains(says), "{args:?}: {err}");
        assert_eq!(std::fs::read_to_string(state.join("admin.toml")).unwrap(), saved, "{args:?} changed admin.toml");
    };
    refuse(&["resize", "d", "2M"], "cannot shrink while it has 1 open session");
    refuse(&["resize", "a", "8M"], "is in the config file");
    refuse(&["resize", "nope", "8M"], "no volume nope");
    let bad = admin_cli(&socket, &["resize", "d", "lots"]);
    assert_eq!(bad.status.code(), Some(2), "a size that is no size is a usage error");
    // A RAM volume nobody opened shrinks: made again (it holds nothing).
    let out = admin_cli(&socket, &["resize", "m", "512K"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let list = admin::request(&socket, &Request::List).unwrap().volumes.unwrap();
    assert_eq!(list.iter().find(|v| v.name == "m").map(|v| v.size), Some(512 << 10));
    r.shutdown();
    std::fs::remove_dir_all(&dir).unwrap();
}

fn add_ram(socket: &Path, name: &str) {
    add(socket, name, "1M").unwrap_or_else(|e| panic!("add {name}: {e:?}"));
}
