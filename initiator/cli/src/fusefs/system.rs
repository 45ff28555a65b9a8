//! Mounts and loop devices as the kernel shows them (`/proc/self/mountinfo`, `/sys/block`), and
//! the helpers that change them (losetup, umount(2) or fusermount3).

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Error, Result};

const MOUNTINFO: &str = "/proc/self/mountinfo";
const SYS_BLOCK: &str = "/sys/block";
/// How long unmounting retries while the file is busy: a detached loop device lets go of its
/// backing file asynchronously.
const UNMOUNT_PATIENCE: Duration = Duration::from_secs(10);

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// `MAJOR:MINOR` of the mounted filesystem's device.
    pub device: String,
    /// Where it is mounted.
    pub mountpoint: PathBuf,
    /// Filesystem type: `fuse` (mounted by root directly) or `fuse.rblk` (through fusermount3)
    /// for rblk.
    pub fstype: String,
    /// The mount source: the volume's URI for rblk.
    pub source: String,
}

impl MountEntry {
    /// Whether this is an rblk FUSE mount.
    pub fn is_rblk(&self) -> bool {
        self.fstype == "fuse.rblk" || (self.fstype == "fuse" && self.source.starts_with("rblk://"))
    }
}

/// The mounts this process sees.
pub fn mounts() -> Result<Vec<MountEntry>> {
    let text = std::fs::read_to_string(MOUNTINFO).map_err(|source| Error::System { path: MOUNTINFO.into(), source })?;
    Ok(text.lines().filter_map(parse_mountinfo_line).collect())
}

/// `ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS`
fn parse_mountinfo_line(line: &str) -> Option<MountEntry> {
    let (head, tail) = line.split_once(" - ")?;
    let head: Vec<&str> = head.split(' ').collect();
    let mut tail = tail.split(' ');
    let (device, mountpoint) = (head.get(2)?, head.get(4)?);
    let (fstype, source) = (tail.next()?, tail.next()?);
    Some(MountEntry {
        device: (*device).to_owned(),
        mountpoint: PathBuf::from(unescape(mountpoint)),
        fstype: unescape(fstype),
        source: unescape(source),
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal =
            bytes.get(i + 1..i + 4).filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(d.iter().fold(0u8, |v, c| v.wrapping_mul(8).wrapping_add(c - b'0')));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The topmost mount at exactly `path` (canonicalized), if any.
pub fn find_mount(path: &Path) -> Result<Option<MountEntry>> {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    Ok(mounts()?.into_iter().rev().find(|m| m.mountpoint == path))
}

/// An attached loop device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopDevice {
    /// `/dev/loopN`.
    pub device: PathBuf,
    /// The file behind it.
    pub backing: PathBuf,
    /// `MAJOR:MINOR` of the device and of its partitions.
    pub devnums: Vec<String>,
    /// Devices stacked on it (device mapper, md): `/sys/block/loopN/holders`.
    pub holders: Vec<String>,
}

/// The loop devices whose backing file is `path` or lies below the directory `path`.
pub fn loops_backed_by(path: &Path) -> Result<Vec<LoopDevice>> {
    let sys = Path::new(SYS_BLOCK);
    let entries = match std::fs::read_dir(sys) {
        Ok(e) => e,
        Err(source) => return Err(Error::System { path: sys.into(), source }),
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let dir = entry.path();
        let Ok(backing) = std::fs::read_to_string(dir.join("loop/backing_file")) else { continue };
        let backing = PathBuf::from(backing.trim_end_matches('\n'));
        if !backing.starts_with(path) {
            continue;
        }
        let read = |p: PathBuf| std::fs::read_to_string(p).map(|s| s.trim().to_owned()).ok();
        let mut devnums: Vec<String> = read(dir.join("dev")).into_iter().collect();
        for part in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if part.file_name().to_string_lossy().starts_with(&name) {
                devnums.extend(read(part.path().join("dev")));
            }
        }
        let holders = std::fs::read_dir(dir.join("holders"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|h| h.file_name().to_string_lossy().into_owned())
            .collect();
        found.push(LoopDevice { device: Path::new("/dev").join(&name), backing, devnums, holders });
    }
    found.sort_by(|a, b| a.device.cmp(&b.device));
    Ok(found)
}

/// Attaches a loop device to `file` with direct I/O (no second page cache over the FUSE file)
/// and the volume's block size as its sector size, read-only if asked: `losetup --find --show
/// --direct-io=on --sector-size BS [--read-only] FILE`. Returns `/dev/loopN`.
pub fn attach_loop(file: &Path, block_size: u32, read_only: bool) -> Result<PathBuf> {
    let mut args = vec!["--find".to_owned(), "--show".into(), "--direct-io=on".into()];
    args.extend(["--sector-size".into(), block_size.to_string()]);
    if read_only {
        args.push("--read-only".into());
    }
    args.push(file.display().to_string());
    let out = run("losetup", &args)?;
    let device = out.lines().next().unwrap_or("").trim();
    if !device.starts_with("/dev/") {
        return Err(Error::Command {
            command: command_line("losetup", &args),
            reason: format!("printed {out:?}, not a device"),
        });
    }
    Ok(PathBuf::from(device))
}

/// Detaches `dev` (`losetup -d`), refusing when it is mounted or has holders: the kernel would
/// only defer the detach until they let go, and unmounting the file would then fail.
pub fn detach_loop(dev: &LoopDevice) -> Result<()> {
    check_unused(dev)?;
    run("losetup", &["-d".to_owned(), dev.device.display().to_string()]).map(drop)
}

/// Refuses a loop device that is mounted or held by another device.
fn check_unused(dev: &LoopDevice) -> Result<()> {
    let busy = |what| Err(Error::LoopBusy { device: dev.device.clone(), backing: dev.backing.clone(), what });
    if let Some(m) = mounts()?.into_iter().find(|m| dev.devnums.contains(&m.device)) {
        return busy(format!("mounted at {}", m.mountpoint.display()));
    }
    if !dev.holders.is_empty() {
        return busy(format!("held by {}", dev.holders.join(", ")));
    }
    Ok(())
}

/// What [`unmount`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unmounted {
    /// The mount point.
    pub mountpoint: PathBuf,
    /// Loop devices detached first.
    pub loops: Vec<PathBuf>,
}

/// Unmounts the rblk mount at `mountpoint`: detaches the loop devices backed by its file (and
/// refuses, changing nothing, if one of them is mounted or held), then unmounts: umount(2) as
/// root, `fusermount3 -u` otherwise. The process serving it then flushes, closes its session and
/// exits.
pub fn unmount(mountpoint: &Path) -> Result<Unmounted> {
    let path =
        mountpoint.canonicalize().map_err(|e| Error::Unmount { path: mountpoint.into(), reason: e.to_string() })?;
    match find_mount(&path)? {
        Some(m) if m.is_rblk() => {}
        found => {
            let found = found.map(|m| format!("a {} mount of {}", m.fstype, m.source));
            return Err(Error::NotMounted { path, found });
        }
    }
    let loops = loops_backed_by(&path)?;
    // Check every one before detaching any, so a refusal changes nothing.
    loops.iter().try_for_each(check_unused)?;
    for dev in &loops {
        detach_loop(dev)?;
    }
    let deadline = Instant::now() + UNMOUNT_PATIENCE;
    loop {
        match unmount_once(&path) {
            Ok(()) => break,
            Err(Busy(reason)) if Instant::now() < deadline => {
                tracing::debug!(%reason, "busy; retrying");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(Busy(reason)) => {
                let reason = format!("{reason} (the file is still open, or a loop device on it is in use)");
                return Err(Error::Unmount { path, reason });
            }
        }
    }
    Ok(Unmounted { mountpoint: path, loops: loops.into_iter().map(|l| l.device).collect() })
}

/// Why one attempt to unmount failed.
struct Busy(String);

fn unmount_once(path: &Path) -> std::result::Result<(), Busy> {
    if nix::unistd::geteuid().is_root() {
        return match nix::mount::umount(path) {
            Ok(()) => Ok(()),
            Err(e) => Err(Busy(io::Error::from(e).to_string())),
        };
    }
    let args = ["-u".to_owned(), path.display().to_string()];
    run("fusermount3", &args).map(drop).map_err(|e| Busy(e.to_string()))
}

/// Runs `program args`; returns its stdout, or its status and stderr as the error.
fn run(program: &str, args: &[String]) -> Result<String> {
    let command = command_line(program, args);
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Command { command: command.clone(), reason: e.to_string() })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        return Err(Error::Command { command, reason: format!("{}: {stderr}", out.status) });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn command_line(program: &str, args: &[String]) -> String {
    std::iter::once(program).chain(args.iter().map(String::as_str)).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines() {
        let line = "52 28 0:47 / /mnt/my\\040vol rw,nosuid,nodev,relatime shared:30 - fuse rblk://10.0.0.1:7420/v \
                    rw,user_id=0,group_id=0";
        let m = parse_mountinfo_line(line).unwrap();
        assert_eq!(m.device, "0:47");
        assert_eq!(m.mountpoint, Path::new("/mnt/my vol"));
        assert_eq!((m.fstype.as_str(), m.source.as_str()), ("fuse", "rblk://10.0.0.1:7420/v"));
        assert!(m.is_rblk());
        let other = "60 28 0:50 / /mnt/x rw - fuse.sshfs host:/ rw";
        assert!(!parse_mountinfo_line(other).unwrap().is_rblk());
        let via_fusermount = "61 28 0:51 / /mnt/y rw - fuse.rblk rblk://h/v rw";
        assert!(parse_mountinfo_line(via_fusermount).unwrap().is_rblk());
        assert_eq!(parse_mountinfo_line("garbage"), None);
        assert_eq!(unescape("a\\011b\\\\"), "a\tb\\\\");
    }

    #[test]
    fn this_process_sees_its_root() {
        assert!(mounts().unwrap().iter().any(|m| m.mountpoint == Path::new("/")));
    }
}
