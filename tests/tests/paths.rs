//! Backing stores, key files and the state directory on paths that no one but root and the
//! daemon's user controls (issue 39), refused alike by a start and by `--check-config`. Host
//! tests: they run as root, and give files to another uid with chown.
//!
//! What they would catch:
//! - `planted_paths_are_refused_by_start_and_check_config`: a backing path that is a symlink
//!   another user planted in a world-writable (sticky) directory followed to the file it names
//!   (served to initiators, overwritten on FLUSH); a 0600 key file owned by another user
//!   adopted (only its mode was checked); a state directory that anyone may write to used, so
//!   that a `target.key` planted in it is adopted. Each must be refused by both.
//! - `root_owned_links_still_work`: the walk refusing what it must not: a `/dev/VG/LV`-style
//!   chain of root-owned links (relative, through `..`) to the backing store.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::{chown, lchown, symlink, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;

use rblk_fabric::{Chain, Fabric};
use rblk_target::config::VolumeSpec;
use rblk_target::server::{Config, Server};
use rblk_tests::daemon::bin;

const MIB: u64 = 1 << 20;
/// Neither root nor the tests' user.
const OTHER: u32 = 4321;

/// A root-owned 0755 directory of this test's.
fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rblk-paths-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    chmod(&dir, 0o755);
    dir
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn config(path: &Path) -> Config {
    Config {
        listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        fabric: Fabric::Mem,
        volumes: vec![VolumeSpec { name: "v".into(), size: MIB, path: Some(path.to_owned()) }],
        admin_socket: None,
        ..Config::default()
    }
}

/// `rblk-target --check-config ARGS`: Ok(stdout) or Err(stderr).
fn check_config(args: &[&str]) -> Result<String, String> {
    let out = Command::new(bin("rblk-target")).arg("--check-config").args(args).output().expect("run rblk-target");
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    if out.status.success() {
        Ok(text(out.stdout))
    } else {
        Err(text(out.stderr))
    }
}

#[test]
fn planted_paths_are_refused_by_start_and_check_config() {
    let dir = temp_dir("planted");
    let victim = dir.join("victim.img");
    std::fs::write(&victim, vec![7u8; MIB as usize]).unwrap();
    let public = dir.join("public");
    std::fs::create_dir(&public).unwrap();
    chmod(&public, 0o1777);
    let link = public.join("v.img");
    symlink(&victim, &link).unwrap();
    lchown(&link, Some(OTHER), None).unwrap();
    let volume = format!("v:1M:{}", link.display());
    let e = check_config(&["--allow-any-host", "--volume", &volume]).expect_err("--check-config of a planted link");
    assert!(e.contains("v.img is a symlink owned by uid 4321") && e.contains("not trusted"), "{e}");
    let e = Server::start(config(&link)).expect_err("a start with a planted link");
    let e = Chain(&e).to_string();
    assert!(e.contains("v.img is a symlink owned by uid 4321"), "{e}");
    assert_eq!(std::fs::read(&victim).unwrap(), vec![7u8; MIB as usize], "the file linked to is untouched");

    // A 0600 key owned by someone else.
    let key = dir.join("k");
    std::fs::write(&key, [b'k'; 40]).unwrap();
    chmod(&key, 0o600);
    chown(&key, Some(OTHER), None).unwrap();
    let key_arg = key.display().to_string();
    let e = check_config(&["--key-file", &key_arg, "--volume", "v:1M"]).expect_err("--check-config of their key");
    assert!(e.contains("belongs to uid 4321"), "{e}");
    let file = rblk_target::config::File { key_file: Some(key.clone()), ..Default::default() };
    let e = file.server_config().expect_err("a start with their key");
    assert!(Chain(&e).to_string().contains("belongs to uid 4321"), "{}", Chain(&e));

    // A state directory anyone may write to (sticky, so the key walk alone would accept a
    // root-owned key in it), holding a key.
    let state = dir.join("state");
    std::fs::create_dir(&state).unwrap();
    chmod(&state, 0o1777);
    std::fs::write(state.join("target.key"), [b's'; 40]).unwrap();
    chmod(&state.join("target.key"), 0o600);
    let state_arg = state.display().to_string();
    let e = check_config(&["--state-dir", &state_arg, "--volume", "v:1M"]).expect_err("--check-config");
    assert!(e.contains("state directory") && e.contains("mode 1777"), "{e}");
    let file = rblk_target::config::File { state_dir: Some(state.clone()), ..Default::default() };
    // A start reads its configuration so, and runs the same check.
    let e = file.server_config().expect_err("a start");
    assert!(Chain(&e).to_string().contains("mode 1777"), "{}", Chain(&e));
    let e = Server::start(Config { state_dir: Some(state.clone()), ..config(&victim) }).expect_err("a start");
    assert!(Chain(&e).to_string().contains("mode 1777"), "{}", Chain(&e));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn root_owned_links_still_work() {
    let dir = temp_dir("lv");
    // /dev/VG/LV -> ../dm-0, and a link to /dev/VG.
    std::fs::create_dir_all(dir.join("dev/vg")).unwrap();
    chmod(&dir.join("dev"), 0o755);
    chmod(&dir.join("dev/vg"), 0o755);
    std::fs::File::create(dir.join("dev/dm-0")).unwrap().set_len(MIB).unwrap();
    symlink("../dm-0", dir.join("dev/vg/lv")).unwrap();
    symlink(dir.join("dev/vg"), dir.join("vg")).unwrap();
    let lv = dir.join("vg/lv");
    let volume = format!("v:1M:{}", lv.display());
    let out = check_config(&["--allow-any-host", "--volume", &volume]).expect("--check-config of root's links");
    assert!(out.contains("configuration OK"), "{out}");
    let running = Server::start(config(&lv)).expect("a start through root's links");
    assert_eq!(running.volumes().len(), 1);
    running.shutdown();
    std::fs::remove_dir_all(&dir).unwrap();
}
