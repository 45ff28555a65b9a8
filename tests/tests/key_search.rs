//! Issue 43, trap 10 (the first of the smaller ones): every initiator command needed
//! `--key-file` even after the README's own `scp` of the target's key to /etc/rblk/target.key.
//! The initiator now searches, in order: `--key-file`, `RBLK_KEY_FILE`,
//! `/etc/rblk/keys/HOST.key`, the local target's key (this host's addresses only), then
//! `/etc/rblk/target.key`; `--no-key` connects without any. Run against targets over the
//! in-memory fabric, with the search's fixed paths under a tree of the test's own
//! ([`Options::key_root`]).
//!
//! What each would catch:
//! - `a_keyed_target_is_reached_through_keys_host_key_with_no_flag`: the search not looking
//!   in /etc/rblk/keys (today: refused for want of a key), looking there under another name
//!   than the URI's host, or /etc/rblk/target.key winning over the host's own key.
//! - `the_copied_target_key_is_found_and_no_key_reaches_an_open_target`: /etc/rblk/target.key
//!   not found (the README's scp then needing a flag), or a found key with no way left to reach
//!   a target that serves anyone (`--no-key` missing, or not dropping the key).
//! - `the_local_targets_key_is_never_proved_to_another_host`: the local target's key proved to
//!   a target at an address that is not this host's (the relay's start), or it hiding
//!   /etc/rblk/target.key from such a target.
//! - `a_bad_key_file_found_by_the_search_is_named_before_connecting`: a found file with group or
//!   others' read bits skipped silently (or used), or reported only after the RDMA connect.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;

use rblk_fabric::Fabric;
use rblk_initiator::{Error, OpenMode, Options, Session, Uri};
use rblk_target::config::VolumeSpec;
use rblk_target::server::{Config, Running, Server};

const HOST_KEY: &[u8] = b"the key in /etc/rblk/keys/HOST.key, 32 bytes or more";
const ETC_KEY: &[u8] = b"the key copied to /etc/rblk/target.key, 32 bytes+";
const LOCAL_KEY: &[u8] = b"the key the local target made, at least 32 bytes";

/// A fresh tree standing for `/`, with etc/rblk/keys and var/lib/rblk made.
fn root(name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let root = std::env::temp_dir().join(format!("rblk-key-search-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for dir in ["etc/rblk/keys", "var/lib/rblk"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    // Whatever the umask: a key in a directory others may write to is refused.
    for dir in ["", "etc", "etc/rblk", "etc/rblk/keys", "var", "var/lib", "var/lib/rblk"] {
        std::fs::set_permissions(root.join(dir), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    root
}

fn put(root: &Path, path: &str, key: &[u8]) {
    rblk_tests::target::write_key_file(&root.join(path), key);
}

/// An in-process target at `ip` (the in-memory fabric's addresses are names only: nothing is
/// sent anywhere) with volume `v`, requiring `key` if given.
fn target(ip: IpAddr, key: Option<&[u8]>) -> Running {
    Server::start(Config {
        listen: SocketAddr::new(ip, 0),
        fabric: Fabric::Mem,
        volumes: vec![VolumeSpec { name: "v".into(), size: 1 << 20, path: None }],
        key: key.map(<[u8]>::to_vec),
        ..Config::default()
    })
    .expect("start an in-process target")
}

/// Options as `rblk` makes them without --key-file (or with --no-key), the search under `root`.
fn options(root: &Path, uri: &str, no_key: bool) -> Options {
    assert!(std::env::var_os("RBLK_KEY_FILE").is_none(), "run without RBLK_KEY_FILE");
    let mut o = Options { fabric: Fabric::Mem, key_root: root.to_owned(), ..Options::default() };
    if no_key {
        o.no_key();
    } else {
        o.find_key_for(None, Some(&Uri::parse(uri).unwrap())).unwrap();
    }
    o
}

fn open(uri: &str, o: &Options) -> Result<(), Error> {
    Session::connect(uri, o)?.open(OpenMode::ReadOnly)?.close().map(drop)
}

#[test]
fn a_keyed_target_is_reached_through_keys_host_key_with_no_flag() {
    let r = target(Ipv4Addr::LOCALHOST.into(), Some(HOST_KEY));
    let uri = format!("rblk://{}/v", r.local_addr());
    let root = root("host");
    // Without any file: refused, and the refusal lists where it looked.
    let e = open(&uri, &options(&root, &uri, false)).unwrap_err().to_string();
    assert!(e.contains("etc/rblk/keys/127.0.0.1.key (not found)") && e.contains("target.key"), "{e}");
    put(&root, "etc/rblk/keys/127.0.0.1.key", HOST_KEY);
    put(&root, "etc/rblk/target.key", ETC_KEY);
    let o = options(&root, &uri, false);
    assert_eq!(o.key_file.as_deref(), Some(root.join("etc/rblk/keys/127.0.0.1.key").as_path()));
    open(&uri, &o).expect("reached with the host's key and no flag");
    // The second host of a URI is looked for too, after the first.
    let two = format!("rblk://storage-a,127.0.0.1:{}/v", r.local_addr().port());
    assert_eq!(options(&root, &two, false).key.as_deref(), Some(HOST_KEY));
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn the_copied_target_key_is_found_and_no_key_reaches_an_open_target() {
    let keyed = target(Ipv4Addr::LOCALHOST.into(), Some(ETC_KEY));
    let open_target = target(Ipv4Addr::LOCALHOST.into(), None);
    let keyed_uri = format!("rblk://{}/v", keyed.local_addr());
    let open_uri = format!("rblk://{}/v", open_target.local_addr());
    let root = root("etc");
    put(&root, "etc/rblk/target.key", ETC_KEY);
    open(&keyed_uri, &options(&root, &keyed_uri, false)).expect("/etc/rblk/target.key found with no flag");
    // A keyed initiator refuses a target that asks for no key, and says how to go on.
    let e = open(&open_uri, &options(&root, &open_uri, false)).unwrap_err().to_string();
    assert!(e.contains("does not require a key") && e.contains("--no-key") && e.contains("etc/rblk/target.key"), "{e}");
    open(&open_uri, &options(&root, &open_uri, true)).expect("--no-key reaches the open target");
    let e = open(&keyed_uri, &options(&root, &keyed_uri, true)).unwrap_err().to_string();
    assert!(e.contains("requires a key") && e.contains("--no-key given"), "{e}");
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn the_local_targets_key_is_never_proved_to_another_host() {
    // 203.0.113.7 (TEST-NET-3) is on no interface here: a remote host's address to rblk.
    let remote_ip: IpAddr = "203.0.113.7".parse().unwrap();
    let remote = target(remote_ip, Some(LOCAL_KEY));
    let local = target(Ipv4Addr::LOCALHOST.into(), Some(LOCAL_KEY));
    let remote_uri = format!("rblk://{}/v", remote.local_addr());
    let local_uri = format!("rblk://{}/v", local.local_addr());
    let root = root("local");
    put(&root, "var/lib/rblk/target.key", LOCAL_KEY);
    open(&local_uri, &options(&root, &local_uri, false)).expect("the local target's key on this host");
    let e = open(&remote_uri, &options(&root, &remote_uri, false)).unwrap_err().to_string();
    assert!(e.contains("requires a key") && e.contains("not used for other hosts"), "{e}");
    // /etc/rblk/target.key is still proved to the other host; the local one still to this host.
    put(&root, "etc/rblk/target.key", LOCAL_KEY);
    let e = open(&remote_uri, &options(&root, &remote_uri, false));
    assert!(e.is_ok(), "a copied key is for any host: {e:?}");
    // The same file reached through /etc/rblk/target.key is still the local target's key.
    std::fs::remove_file(root.join("etc/rblk/target.key")).unwrap();
    std::os::unix::fs::symlink(root.join("var/lib/rblk/target.key"), root.join("etc/rblk/target.key")).unwrap();
    let o = options(&root, &remote_uri, false);
    assert!(o.key.is_none() && o.local_target_key.is_some(), "{o:?}");
    assert!(open(&remote_uri, &o).is_err(), "the local key, linked from /etc, proved to another host");
    let _ = std::fs::remove_dir_all(&root);
}

/// Through the real binary: the fixed paths under RBLK_TEST_KEY_ROOT (for tests only).
#[test]
fn a_bad_key_file_found_by_the_search_is_named_before_connecting() {
    use std::os::unix::fs::PermissionsExt as _;
    let root = root("mode");
    let path = root.join("etc/rblk/keys/127.0.0.1.key");
    put(&root, "etc/rblk/keys/127.0.0.1.key", HOST_KEY);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let run = |extra: &[&str]| {
        let out = Command::new(rblk_tests::daemon::bin("rblk"))
            .args(["info", "rblk://127.0.0.1:9/v", "--host-id", "h", "--timeout", "1"])
            .args(extra)
            .env_remove("RBLK_KEY_FILE")
            .env("RBLK_TEST_KEY_ROOT", &root)
            .output()
            .expect("run rblk");
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, text) = run(&[]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains(&path.display().to_string()) && text.contains("mode 0644"), "{text}");
    assert!(!text.contains("RDMA") && !text.contains("rdma"), "connected before checking the key: {text}");
    // --no-key looks for nothing: it gets to the connect (which fails here: no RDMA device).
    let (_, text) = run(&["--no-key"]);
    assert!(!text.contains("mode 0644"), "--no-key read the key file: {text}");
    // It overrides RBLK_KEY_FILE (not a conflict: the variable may be set for the whole shell).
    let out = Command::new(rblk_tests::daemon::bin("rblk"))
        .args(["info", "rblk://127.0.0.1:9/v", "--host-id", "h", "--timeout", "1", "--no-key"])
        .env("RBLK_KEY_FILE", root.join("nowhere.key"))
        .output()
        .expect("run rblk");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() != Some(2) && !text.contains("nowhere.key"), "--no-key with RBLK_KEY_FILE set: {text}");
    let (code, text) = run(&["--no-key", "--key-file", "/k"]);
    assert_eq!(code, Some(2), "--no-key with --key-file is a usage error: {text}");
    let _ = std::fs::remove_dir_all(&root);
}

/// rblk-bench finds keys as rblk does (issue 43, trap 10: it read only --key-file and the
/// local target's key, so a bench against a keyed remote target needed the flag): the first
/// job's target's /etc/rblk/keys/HOST.key is read, here one with a bad mode, named before any
/// connect; --no-key reads none.
#[test]
fn rblk_bench_searches_the_keys_as_rblk_does() {
    use std::os::unix::fs::PermissionsExt as _;
    let root = root("bench");
    let path = root.join("etc/rblk/keys/127.0.0.1.key");
    put(&root, "etc/rblk/keys/127.0.0.1.key", HOST_KEY);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let run = |extra: &[&str]| {
        let out = Command::new(rblk_tests::daemon::bin("rblk-bench"))
            .args(["rblk://127.0.0.1:9/v", "--runtime", "1", "--host-id", "h"])
            .args(extra)
            .env_remove("RBLK_KEY_FILE")
            .env("RBLK_TEST_KEY_ROOT", &root)
            .output()
            .expect("run rblk-bench");
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, text) = run(&[]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains(&path.display().to_string()) && text.contains("mode 0644"), "{text}");
    assert!(!text.contains("rdma_"), "connected before checking the key: {text}");
    let (_, text) = run(&["--no-key"]);
    assert!(!text.contains("mode 0644"), "--no-key read the key file: {text}");
    let (code, text) = run(&["--no-key", "--key-file", "/k"]);
    assert_eq!(code, Some(2), "--no-key with --key-file is a usage error: {text}");
    let _ = std::fs::remove_dir_all(&root);
}
