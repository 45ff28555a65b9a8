//! The guest's scratch disk (`scripts/rxe-guest.sh --disk`, `RBLK_DISK`), with an ext4 file
//! system mounted at [`MOUNT`]: durability tests need a real disk, because the guest's root is
//! tmpfs, where fdatasync proves nothing.

use std::path::PathBuf;
use std::process::Command;

/// Where the scratch file system is mounted.
pub const MOUNT: &str = "/mnt/rblk-scratch";

/// Runs `cmd`; fails the test unless it succeeds. Its stdout, trimmed.
fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn mounted(path: &str) -> bool {
    std::fs::read_to_string("/proc/mounts").unwrap_or_default().lines().any(|l| l.split(' ').nth(1) == Some(path))
}

/// The mounted scratch file system; formats the disk if it has none. Fails (never skips) when
/// the guest has no scratch disk.
pub fn dir() -> PathBuf {
    let disk = std::env::var("RBLK_DISK").unwrap_or_default();
    assert!(
        !disk.is_empty(),
        "durability tests need the scratch disk: run them through scripts/test.sh (RBLK_DISK unset)"
    );
    if !mounted(MOUNT) {
        std::fs::create_dir_all(MOUNT).expect("create the mount point");
        let probe = Command::new("blkid").args(["-o", "value", "-s", "TYPE", &disk]).output().expect("blkid");
        if String::from_utf8_lossy(&probe.stdout).trim() != "ext4" {
            run(Command::new("mkfs.ext4").args(["-q", "-F", &disk]));
        }
        run(Command::new("mount").args([&disk, MOUNT]));
    }
    PathBuf::from(MOUNT)
}

/// A fresh durable volume `name` of `size` bytes, backed by `{file}.img` on the scratch disk with
/// its state directory `{file}.state` (both removed first): rblk-target's arguments.
pub fn durable(name: &str, size: u64, file: &str) -> Vec<String> {
    let dir = dir();
    let path = dir.join(format!("{file}.img"));
    let state = dir.join(format!("{file}.state"));
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir_all(&state);
    vec![
        "--volume".into(),
        format!("{name}:{size}:{}", path.display()),
        "--state-dir".into(),
        state.display().to_string(),
    ]
}

/// A tmpfs of `size` at a fresh directory under the scratch mount: a tiny file system to fill up.
#[derive(Debug)]
pub struct Tiny {
    /// Its mount point.
    pub path: PathBuf,
}

impl Tiny {
    /// Mounts it.
    pub fn mount(name: &str, size: &str) -> Tiny {
        let path = dir().join(name);
        std::fs::create_dir_all(&path).expect("mount point");
        run(Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(&path));
        Tiny { path }
    }
}

impl Drop for Tiny {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.path).status();
    }
}

/// A slow block device: dm-delay over a loop device on a file of the scratch disk, whose writes
/// each take `write_ms` (reads and flushes are not delayed).
#[derive(Debug)]
pub struct SlowDisk {
    name: String,
    loop_dev: String,
    /// The device-mapper device, a block device to back a volume with.
    pub path: PathBuf,
}

impl SlowDisk {
    /// Makes it, `size` bytes, on the scratch disk.
    pub fn new(name: &str, size: u64, write_ms: u64) -> SlowDisk {
        let file = dir().join(format!("{name}.slow"));
        let _ = std::fs::remove_file(&file);
        std::fs::File::create(&file).unwrap().set_len(size).unwrap();
        run(Command::new("modprobe").arg("dm_delay"));
        let loop_dev = run(Command::new("losetup").args(["--find", "--show"]).arg(&file));
        let dm = format!("rblk-slow-{name}");
        // read, write and flush classes: only writes are slow.
        let table = format!("0 {} delay {loop_dev} 0 0 {loop_dev} 0 {write_ms} {loop_dev} 0 0", size / 512);
        // No udev in the guest: dmsetup makes the device node itself.
        run(Command::new("dmsetup").env("DM_DISABLE_UDEV", "1").args([
            "create",
            "--noudevsync",
            &dm,
            "--table",
            &table,
        ]));
        let path = PathBuf::from(format!("/dev/mapper/{dm}"));
        assert!(path.exists(), "{} missing after dmsetup create", path.display());
        SlowDisk { name: dm, loop_dev, path }
    }
}

impl Drop for SlowDisk {
    fn drop(&mut self) {
        let _ =
            Command::new("dmsetup").env("DM_DISABLE_UDEV", "1").args(["remove", "--noudevsync", &self.name]).status();
        let _ = Command::new("losetup").args(["-d", &self.loop_dev]).status();
    }
}
