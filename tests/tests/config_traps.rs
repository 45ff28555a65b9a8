//! Issue 43's traps in the daemon's configuration and its admin command, on the real
//! `rblk-target` binary (host tests: `--check-config`, `--print-config` and the admin client
//! need no RDMA device). Each test names its trap and what it would catch.

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use rblk_tests::daemon::bin;

/// A fresh directory of this test's.
fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rblk-config-traps-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `rblk-target ARGS` run in `cwd`.
fn target_in(cwd: &Path, args: &[&str]) -> Output {
    Command::new(bin("rblk-target")).current_dir(cwd).args(args).output().expect("run rblk-target")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Trap 3: relative paths in a config followed the working directory: `key_file = "k3"` passed
/// `--check-config` run beside the file and failed run elsewhere (the unit runs in `/`), and
/// `--print-config` echoed it relative. Catches any path key of the file (`key_file`, a
/// `[[host]]`'s `key_file`, a `[[volume]]`'s `path`, `state_dir`, `admin_socket`) resolved
/// against the working directory, printed relative, or an error that names neither the file
/// nor the key; and flags that stopped following the working directory.
#[test]
fn relative_paths_in_the_file_follow_the_file_wherever_it_is_checked() {
    let dir = temp_dir("relative");
    let etc = dir.join("etc");
    std::fs::create_dir_all(etc.join("hosts")).unwrap();
    let gen = |path: &Path| assert!(target_in(&dir, &["gen-key", path.to_str().unwrap()]).status.success());
    gen(&etc.join("k3"));
    gen(&etc.join("hosts/db1.key"));
    let config = etc.join("t.toml");
    std::fs::write(
        &config,
        "key_file = \"k3\"\nstate_dir = \"state\"\nadmin_socket = \"run/admin.sock\"\n\
         [[host]]\nname = \"db1\"\nkey_file = \"hosts/db1.key\"\n\
         [[volume]]\nname = \"v\"\nsize = \"1M\"\npath = \"v.img\"\n",
    )
    .unwrap();
    // From the file's directory, from the root (as the unit), and with a relative --config.
    for (cwd, config) in [(&etc, "t.toml"), (&PathBuf::from("/"), config.to_str().unwrap()), (&dir, "etc/t.toml")] {
        let out = target_in(cwd, &["--config", config, "--check-config"]);
        assert!(out.status.success(), "checked in {}: {}", cwd.display(), text(&out));
        let out = target_in(cwd, &["--config", config, "--print-config"]);
        assert!(out.status.success(), "printed in {}: {}", cwd.display(), text(&out));
        let printed = String::from_utf8_lossy(&out.stdout);
        let etc = etc.display();
        for line in [
            format!("key_file = \"{etc}/k3\""),
            format!("state_dir = \"{etc}/state\""),
            format!("admin_socket = \"{etc}/run/admin.sock\""),
            format!("key_file = \"{etc}/hosts/db1.key\""),
            format!("path = \"{etc}/v.img\""),
        ] {
            assert!(
                printed.lines().any(|l| l == line),
                "{line} not in --print-config in {}:\n{printed}",
                cwd.display()
            );
        }
    }
    // A missing key: the error names the file, the key and the path it looked at.
    std::fs::write(&config, "key_file = \"k4\"\nadmin_socket = \"none\"\n").unwrap();
    let out = target_in(Path::new("/"), &["--config", config.to_str().unwrap(), "--check-config"]);
    assert!(!out.status.success());
    let said = text(&out);
    let want = format!("{}: key_file: reading key file {}", config.display(), etc.join("k4").display());
    assert!(said.contains(&want), "wanted {want:?} in: {said}");
    // A flag's path is the working directory's, and its error does not blame the file.
    let out = target_in(&etc, &["--config", "t.toml", "--key-file", "k3", "--print-config"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("key_file = \"k3\""), "{}", text(&out));
    let out = target_in(&dir, &["--config", "etc/t.toml", "--key-file", "k3", "--check-config"]);
    let said = text(&out);
    assert!(!out.status.success() && said.contains("reading key file k3"), "{said}");
    assert!(!said.contains("t.toml: key_file"), "a flag's error blamed the file: {said}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Trap 4: `--check-config` as non-root said OK when the start then failed "cannot create the
/// key /var/lib/rblk/target.key: the state directory is not writable by this user". Catches a
/// check that does not ask whether this user can create the state directory where a start
/// must make the generated key or `target.id`; and one that fails where nothing must be made
/// (only a warning then).
#[test]
fn check_config_fails_when_this_user_cannot_make_the_state_directory() {
    let dir = temp_dir("statedir");
    // Root's and 0755: nobody (65534) may not create anything in it.
    let state = dir.join("state");
    let check = |extra: &[&str]| {
        Command::new("runuser")
            .current_dir("/")
            .args(["-u", "nobody", "--"])
            .arg(bin("rblk-target"))
            .args(["--check-config", "--volume", "v:1M", "--admin-socket", "none", "--state-dir"])
            .arg(&state)
            .args(extra)
            .output()
            .expect("runuser")
    };
    let out = check(&[]);
    let said = text(&out);
    assert!(!out.status.success(), "nobody's check passed though a start must make the key: {said}");
    assert!(said.contains("error: state_dir") && said.contains("target.key"), "{said}");
    // With a key configured and target.id made by an earlier start, nothing must be made: a
    // warning, and OK.
    let key = dir.join("key");
    assert!(target_in(&dir, &["gen-key", key.to_str().unwrap()]).status.success());
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("target.id"), "00112233445566778899aabbccddeeff\n").unwrap();
    std::os::unix::fs::chown(&key, Some(65534), None).unwrap();
    let out = check(&["--key-file", key.to_str().unwrap()]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("warning: state_dir") && said.contains("admin.toml"), "{said}");
    // Root may: no finding.
    let out = target_in(
        &dir,
        &["--check-config", "--volume", "v:1M", "--admin-socket", "none", "--state-dir", state.to_str().unwrap()],
    );
    assert!(out.status.success() && !text(&out).contains("state_dir"), "{}", text(&out));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Trap 2 at start: the daemon raises its soft RLIMIT_NOFILE to the hard one (what
/// `--check-config` judges the caps against), read back from /proc/PID/limits of a daemon
/// started under `prlimit --nofile=1024:HARD`. Catches the raise removed or moved after the
/// point where the daemon waits here (it asks a "running daemon" for a takeover, which this
/// test plays and never answers, so it needs no RDMA device).
#[test]
fn a_start_raises_the_soft_descriptor_limit_to_the_hard_one() {
    let dir = temp_dir("rlimit");
    let socket = dir.join("admin.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let hard = rblk_tests::sh("ulimit -H -n").trim().parse::<u64>().expect("the hard limit");
    assert!(hard > 1024, "this test needs a hard RLIMIT_NOFILE above 1024 (it is {hard})");
    let mut child = Command::new("prlimit")
        .arg(format!("--nofile=1024:{hard}"))
        .arg(bin("rblk-target"))
        .args(["--takeover", "--allow-any-host", "--volume", "v:1M", "--admin-socket"])
        .arg(&socket)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("prlimit rblk-target");
    // It connects when it has started: by then the raise is done.
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let peer = loop {
        match listener.accept() {
            Ok((peer, _)) => break peer,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("the daemon never asked for a takeover: {e}"),
        }
    };
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).expect("Max open files");
    let numbers: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    drop(peer);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(numbers, [hard.to_string(), hard.to_string()], "soft and hard after the start: {line}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Trap 7: a count in the file said `expected usize` (the flag said what it wanted). Catches
/// serde's type names back in the message.
#[test]
fn config_counts_say_what_they_want() {
    let dir = temp_dir("counts");
    for (line, want) in [
        ("max_sessions = \"lots\"", "invalid type: string \"lots\", expected a whole number"),
        ("workers = -2", "expected a whole number"),
        ("listen_backlog = 1.5", "expected a whole number"),
    ] {
        let config = dir.join("c.toml");
        std::fs::write(&config, format!("{line}\n")).unwrap();
        let out = target_in(&dir, &["--config", "c.toml", "--check-config"]);
        let said = text(&out);
        assert!(!out.status.success() && said.contains(want), "{line}: {said}");
        assert!(!said.contains("usize") && !said.contains("u32"), "{line}: {said}");
    }
    let config = dir.join("c.toml");
    std::fs::write(&config, "max_sessions = 12\nlisten_backlog = 64\n").unwrap();
    let out = target_in(&dir, &["--config", "c.toml", "--print-config"]);
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(printed.contains("max_sessions = 12") && printed.contains("listen_backlog = 64"), "{}", text(&out));
    std::fs::remove_dir_all(&dir).unwrap();
}
