//! The daemon's command line on a host without RDMA (this machine's kernel has none).

use std::process::Command;

#[test]
fn without_rdma_it_exits_non_zero_saying_no_device() {
    if !rblk_fabric::list_devices().unwrap().is_empty() {
        // On an RDMA host this test would start a real daemon; it belongs to RDMA-less hosts.
        panic!("this host has RDMA devices; run this test where there are none (CI host)");
    }
    // Its own state dir: the key a start makes goes there, not into this host's /var/lib/rblk.
    let state = std::env::temp_dir().join(format!("rblk-cli-no-device-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_rblk-target")).arg("--state-dir").arg(&state).output().unwrap();
    let _ = std::fs::remove_dir_all(&state);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no RDMA device found"), "stderr: {stderr}");
}

#[test]
fn bad_flags_are_refused_with_a_reason() {
    let out = Command::new(env!("CARGO_BIN_EXE_rblk-target")).args(["--volume", "v:12345"]).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("multiple of 4096"), "stderr: {stderr}");
}

#[test]
fn help_explains_each_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_rblk-target")).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in
        ["--listen", "--device", "--volume", "--key-file", "--state-dir", "--config", "--check-config", "SIGHUP"]
    {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
}

#[test]
fn print_config_shows_the_state_dir() {
    let print = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_rblk-target")).arg("--print-config").args(args).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(print(&[]).contains("state_dir = \"/var/lib/rblk\""), "the default is shown");
    assert!(print(&["--state-dir", "/srv/rblk-state"]).contains("state_dir = \"/srv/rblk-state\""));
    assert!(print(&["--memory-windows", "off"]).contains("memory_windows = false"));
    // Every effective setting, defaults included (as `sshd -T`): would catch --print-config
    // printing only what was configured.
    let all = print(&[]);
    for line in [
        "listen = \"0.0.0.0:7420\"",
        "memory_windows = true",
        "keepalive_timeout = 15",
        "open_timeout = 10",
        "max_sessions = 1024",
        "max_joins_per_session = 128",
        "allow_any_host = false",
        "admin_socket = ",
        "# metrics: not served",
    ] {
        assert!(all.contains(line), "--print-config lacks {line:?}:\n{all}");
    }
    // ... in a form --config reads back, meaning the same.
    let path = config_file("print-back", &all);
    let again = print(&["--config", path.to_str().unwrap()]);
    assert_eq!(again, all, "--print-config's output read back by --config prints the same");
    assert!(!target(&["--print-config", "--memory-windows", "sometimes"]).status.success());
}

/// A config file in a fresh temp dir.
fn config_file(tag: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("rblk-cli-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("target.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn target(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rblk-target")).args(args).output().unwrap()
}

/// Would catch: --check-config missing, or not saying so (a unit's ExecStartPre and the
/// install script rely on the exit status and the line).
#[test]
fn check_config_says_ok() {
    let path = config_file("ok", "[[volume]]\nname = \"v\"\nsize = 1048576\n");
    let out = target(&["--check-config", "--config", path.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "configuration OK\n");
    // The integer size is printed back as given.
    let out = target(&["--print-config", "--config", path.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("size = 1048576"), "{out:?}");
}

/// Would catch: a listen address in the file that only the start (after the RDMA probe)
/// parses: --check-config and --print-config would pass it.
#[test]
fn check_and_print_config_refuse_a_bad_listen_address() {
    let path = config_file("listen", "listen = \"10.0.0.1:abc\"\n");
    for flag in ["--check-config", "--print-config"] {
        let out = target(&[flag, "--config", path.to_str().unwrap()]);
        assert!(!out.status.success(), "{flag}: {out:?}");
        assert!(out.stdout.is_empty(), "{flag} printed something: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("10.0.0.1:abc"), "{flag}: {stderr}");
    }
}

/// Would catch: key files read only at start, or a missing one not named.
#[test]
fn check_config_names_a_missing_key_file() {
    let path = config_file("key", "[[host]]\nname = \"db1\"\nkey_file = \"/nonexistent/rblk/db1.key\"\n");
    let out = target(&["--check-config", "--config", path.to_str().unwrap()]);
    assert!(!out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/rblk/db1.key"), "{out:?}");
}

/// Would catch: the duplicate check made after the RDMA device probe, so a host without RDMA
/// reports "no RDMA device" for a configuration that could never start anywhere.
#[test]
fn a_duplicate_volume_is_reported_as_such_without_rdma() {
    for flag in [None, Some("--check-config")] {
        let mut args = vec!["--volume", "a:1M", "--volume", "a:2M"];
        args.extend(flag);
        let out = target(&args);
        assert!(!out.status.success(), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("volume a is configured twice"), "{flag:?}: {stderr}");
        assert!(!stderr.contains("no RDMA device"), "{flag:?}: {stderr}");
    }
}

/// Would catch: a backing path that cannot work passing the checks (found only at the first
/// start on the real host).
#[test]
fn check_config_refuses_a_backing_file_in_a_missing_directory() {
    let out = target(&["--check-config", "--volume", "d:1M:/nonexistent/rblk/d.img"]);
    assert!(!out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/rblk"), "{out:?}");
}

/// Would catch: an example config shipped in dist/ (installed as /etc/rblk/target.toml) that
/// the daemon it ships with refuses.
#[test]
fn the_shipped_example_config_checks() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../dist/rblk-target.toml");
    let out = target(&["--check-config", "--config", path]);
    assert!(out.status.success(), "{out:?}");
}

/// Would catch: `rblk-target admin` without a daemon hanging, exiting 0, or not saying which
/// socket it tried; a bad --allow taken; --admin-socket not checked by --check-config.
#[test]
fn admin_says_when_no_daemon_serves_the_socket() {
    let dir = std::env::temp_dir().join(format!("rblk-cli-admin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("admin.sock");
    let out = target(&["admin", "--socket", socket.to_str().unwrap(), "list"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no rblk-target is serving") && stderr.contains("admin.sock"), "{stderr}");
    let out = target(&["admin", "--socket", socket.to_str().unwrap(), "add", "v:4M", "--allow", "h=write"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("ro, rw or exclusive"), "{out:?}");
    let file = dir.join("file");
    std::fs::write(&file, "x").unwrap();
    let out = target(&["--check-config", "--admin-socket", file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a socket"), "{out:?}");
    let out = target(&["--print-config"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("admin_socket = \"/run/rblk-target/admin.sock\""), "{out:?}");
    let out = target(&["--check-config", "--admin-socket", "none"]);
    assert!(out.status.success(), "{out:?}");
}

/// The unit's reload as systemd runs it: every `ExecReload=` line in order, stopping at the
/// first that fails (`systemctl reload` then fails), with `$MAINPID` the daemon's pid. Would
/// catch an `ExecReload=` that only sends SIGHUP (`systemctl reload` exited 0 on a broken
/// config, which the daemon then refused where only the journal said so), and an
/// `ExecStartPre=` without the same check.
#[test]
fn the_units_reload_checks_the_config_before_the_sighup() {
    use std::os::unix::process::ExitStatusExt as _;
    let unit = include_str!("../../dist/systemd/rblk-target.service");
    let lines = |key: &str| -> Vec<Vec<String>> {
        unit.lines()
            .filter_map(|l| l.strip_prefix(key))
            .map(|c| c.split_whitespace().map(str::to_owned).collect())
            .collect()
    };
    let pre = lines("ExecStartPre=");
    assert!(pre.iter().any(|c| c.iter().any(|a| a == "--check-config")), "ExecStartPre= checks the config: {pre:?}");
    let reload = lines("ExecReload=");
    let run = |config: &std::path::Path, mainpid: u32| -> Result<(), String> {
        for cmd in &reload {
            let argv: Vec<String> = cmd
                .iter()
                .map(|a| match a.as_str() {
                    "/usr/local/bin/rblk-target" => env!("CARGO_BIN_EXE_rblk-target").to_owned(),
                    "/etc/rblk/target.toml" => config.display().to_string(),
                    "$MAINPID" => mainpid.to_string(),
                    other => other.to_owned(),
                })
                .collect();
            let out = Command::new(&argv[0]).args(&argv[1..]).output().unwrap();
            if !out.status.success() {
                return Err(format!("{argv:?}: {}", String::from_utf8_lossy(&out.stderr)));
            }
        }
        Ok(())
    };
    let dir = std::env::temp_dir().join(format!("rblk-cli-reload-{}", std::process::id()));
    let good = config_file(
        "reload-good",
        &format!("allow_any_host = true\nstate_dir = \"{}\"\n[[volume]]\nname = \"v\"\nsize = \"1M\"\n", dir.display()),
    );
    let broken = config_file("reload-broken", "allow_any_host = true\n[[volume]]\nname = \"v\"\nsize = \"12345\"\n");

    // A stand-in for the daemon: SIGHUP kills it (sleep's default action), so it shows one came.
    // SIGHUP's default action even where it is inherited ignored (nohup, some CI runners).
    let mut daemon = Command::new("env").args(["--default-signal=HUP", "sleep", "60"]).spawn().unwrap();
    let refused = run(&broken, daemon.id()).expect_err("a reload with a broken config must fail");
    assert!(refused.contains("multiple of 4096"), "the failure says why: {refused}");
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(daemon.try_wait().unwrap().is_none(), "no SIGHUP reached the daemon for a broken config");

    run(&good, daemon.id()).expect("a reload with a good config");
    let status = daemon.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGHUP), "the good config's reload sent SIGHUP: {status:?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `--check-config` on what a start accepts but cannot work as meant (issue 27): each would
/// pass the check ("configuration OK") without `rblk_target::lint`.
mod configs_nobody_can_use {
    use super::*;

    fn check(path: &std::path::Path) -> (bool, String) {
        let out = target(&["--check-config", "--config", path.to_str().unwrap()]);
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    }

    /// An access list naming a host that can never log in: only db1 has a key, no shared key.
    #[test]
    fn an_allow_list_naming_a_host_that_cannot_log_in() {
        let dir = std::env::temp_dir().join(format!("rblk-cli-lint-hosts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("db1.key");
        assert!(target(&["gen-key", key.to_str().unwrap()]).status.success());
        let text = format!(
            "state_dir = \"{d}\"\n[[host]]\nname = \"db1\"\nkey_file = \"{k}\"\n[[volume]]\nname = \"db\"\nsize = \"1M\"\nallow = {{ \"db-1\" = \"rw\" }}\n",
            d = dir.display(),
            k = key.display()
        );
        let (ok, stderr) = check(&config_file("lint-hosts", &text));
        assert!(!ok, "{stderr}");
        assert!(stderr.contains("volume db: allow names host db-1, which can never log in"), "{stderr}");
        assert!(stderr.contains("did you mean db1?"), "{stderr}");
        let fixed = text.replace("db-1", "db1");
        let (ok, stderr) = check(&config_file("lint-hosts-fixed", &fixed));
        assert!(ok, "{stderr}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A backing file in a directory the daemon's user cannot write. As root (CI), the check
    /// runs as nobody through setpriv(1), since root may write nearly anywhere.
    #[test]
    fn a_backing_file_in_a_directory_this_user_cannot_write() {
        let root = nix::unistd::Uid::effective().is_root();
        let dir = std::env::temp_dir().join(format!("rblk-cli-lint-backing-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let backing = if root { dir.join("d.img") } else { std::path::PathBuf::from("/rblk-lint-d.img") };
        let config = dir.join("target.toml");
        std::fs::write(
            &config,
            format!(
                "allow_any_host = true\nadmin_socket = \"none\"\nstate_dir = \"{}\"\n[[volume]]\nname = \"d\"\nsize = \"1M\"\npath = \"{}\"\n",
                dir.display(),
                backing.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
        let bin = env!("CARGO_BIN_EXE_rblk-target");
        let mut cmd = if root {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", bin]);
            c
        } else {
            Command::new(bin)
        };
        let out =
            cmd.args(["--check-config", "--config", config.to_str().unwrap()]).output().expect("setpriv (util-linux)");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        let parent = backing.parent().unwrap().display().to_string();
        assert!(stderr.contains("volume d: this user (uid"), "{stderr}");
        assert!(stderr.contains(&format!("cannot create its backing file in {parent}")), "{stderr}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Volumes larger than the host's memory (every volume is held in memory).
    #[test]
    fn volumes_larger_than_this_hosts_memory() {
        let text = "allow_any_host = true\nadmin_socket = \"none\"\n[[volume]]\nname = \"big\"\nsize = \"16T\"\n";
        let (ok, stderr) = check(&config_file("lint-memory", text));
        assert!(!ok && stderr.contains("more than this host has"), "{stderr}");
    }
}
