//! What this host serves: every `rblk attach`, `rblk mount` and `rblk nbd` process registers
//! itself in the run directory (`/run/rblk`, or `$RBLK_RUN_DIR`) as one JSON file, removed when
//! it exits cleanly. `rblk list` reads them and checks that each process is still alive; an
//! entry whose process died (SIGKILL, a crash) shows as `dead` until `rblk detach` or
//! `rblk umount` cleans up.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

/// One serving process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// `ublk`, `fuse` or `nbd`.
    pub kind: String,
    /// The volume.
    pub uri: String,
    /// The block device (`/dev/ublkbN`, a loop device or the FUSE file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Where a FUSE mount is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mountpoint: Option<String>,
    /// Where an NBD export listens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// The ublk device id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev_id: Option<u32>,
    /// The serving process.
    pub pid: u32,
    /// When it started (`/proc/PID/stat`'s field 22, clock ticks after boot): a pid reused by
    /// another process after the server died does not match, so `rblk detach` never signals
    /// it. None in entries of an rblk that did not record it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<u64>,
    /// `serving`, `stopping`, `failed: ...` (written by the process), or `dead` (its process is
    /// gone; filled in by the reader).
    pub state: String,
    /// After a failed final FLUSH: the bytes written and not flushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unflushed_bytes: Option<u64>,
    /// The stable name of the block device (`/dev/rblk/NAME`, a symlink to `device`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
    /// What a process that takes the device over needs when this one dies (ublk devices made
    /// with user recovery): see [`crate::ublk::Handover`]. It holds the session's token, so
    /// entries are readable by their owner only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handover: Option<crate::ublk::Handover>,
}

impl Entry {
    /// A serving entry of this process.
    pub fn new(kind: &str, uri: &str) -> Entry {
        Entry {
            kind: kind.into(),
            uri: uri.into(),
            device: None,
            mountpoint: None,
            listen: None,
            dev_id: None,
            pid: std::process::id(),
            started: process_start(std::process::id()),
            state: "serving".into(),
            unflushed_bytes: None,
            link: None,
            handover: None,
        }
    }

    /// With a device.
    pub fn device(mut self, dev: Option<&Path>) -> Entry {
        self.device = dev.map(|d| d.display().to_string());
        self
    }

    /// With a mount point.
    pub fn mountpoint(mut self, m: &Path) -> Entry {
        self.mountpoint = Some(m.display().to_string());
        self
    }

    /// With a listen address.
    pub fn listen(mut self, l: &str) -> Entry {
        self.listen = Some(l.into());
        self
    }

    /// The same entry, served by this process from now on (a takeover).
    pub fn served_by_me(self) -> Entry {
        let pid = std::process::id();
        Entry { pid, started: process_start(pid), ..self }
    }

    /// Whether its process is alive: the pid runs (not a zombie) and, where the entry recorded
    /// it, started when the server did (so is not another process that got the pid later).
    pub fn alive(&self) -> bool {
        process_start(self.pid).is_some_and(|t| self.started.is_none_or(|s| s == t))
    }
}

/// When process `pid` started (field 22 of `/proc/PID/stat`), None if there is no such process
/// or it is a zombie.
pub fn process_start(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command (field 2) may hold spaces and parentheses: fields 3.. follow its last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    if fields.next()? == "Z" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// The run directory.
pub fn run_dir() -> PathBuf {
    std::env::var_os("RBLK_RUN_DIR").map_or_else(|| PathBuf::from("/run/rblk"), PathBuf::from)
}

/// This process's entry in the run directory; removed on drop unless [`keep`](Self::keep)
/// says otherwise.
#[derive(Debug)]
pub struct Registration {
    path: PathBuf,
    entry: Entry,
    keep: bool,
}

impl Registration {
    /// Rewrites the entry.
    pub fn update(&mut self, f: impl FnOnce(&mut Entry)) {
        f(&mut self.entry);
        if let Err(e) = write_entry(&self.path, &self.entry) {
            tracing::warn!(path = %self.path.display(), error = %e, "updating the run directory entry failed");
        }
    }

    /// The entry as written.
    pub fn entry(&self) -> &Entry {
        &self.entry
    }

    /// Leaves the entry behind at exit (a failure for `rblk detach` to report).
    pub fn keep(&mut self) {
        self.keep = true;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if !self.keep {
            let _ = fs::remove_file(&self.path);
        }
    }
}

fn entry_path(dir: &Path, kind: &str, pid: u32) -> PathBuf {
    dir.join(format!("{kind}-{pid}.json"))
}

fn write_entry(path: &Path, e: &Entry) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    // Owner only (a ublk entry holds a session token), and never through a planted symlink.
    let mut f = rblk_fabric::private::create_new(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    serde_json::to_writer_pretty(&mut f, e)?;
    f.write_all(b"\n")?;
    fs::rename(&tmp, path).with_context(|| format!("renaming {}", tmp.display()))?;
    Ok(())
}

/// Registers this process. A run directory that cannot be written is a warning: serving goes
/// on, `rblk list` just does not show it.
pub fn register(entry: Entry) -> Option<Registration> {
    let dir = run_dir();
    let path = entry_path(&dir, &entry.kind, entry.pid);
    let made = fs::create_dir_all(&dir).map_err(anyhow::Error::from).and_then(|()| write_entry(&path, &entry));
    match made {
        Ok(()) => Some(Registration { path, entry, keep: false }),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot register in the run directory: `rblk list` will not show this");
            None
        }
    }
}

/// The claim on a ublk device: a lock file in the run directory, flock(2)ed for as long as a
/// process serves the device (its `rblk attach`, then any process that took it over). The
/// kernel drops the lock when that process dies, however it dies, so a held lock means a live
/// server and a second recovery of one device is refused.
#[derive(Debug)]
pub struct DeviceClaim {
    _lock: nix::fcntl::Flock<fs::File>,
}

/// Why a device could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// Another live process holds it.
    #[error("ublk device {0} is served by another live process (or another recovery of it runs)")]
    Held(u32),
    /// The lock file failed.
    #[error("the lock file {path} of ublk device {dev_id}: {source}")]
    File {
        /// The device.
        dev_id: u32,
        /// The lock file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl DeviceClaim {
    /// Claims ublk device `dev_id` for this process, or says who has it.
    pub fn take(dev_id: u32) -> Result<DeviceClaim, ClaimError> {
        let dir = run_dir();
        let path = dir.join(format!("ublk-{dev_id}.lock"));
        let file_err = |source| ClaimError::File { dev_id, path: path.clone(), source };
        fs::create_dir_all(&dir).map_err(file_err)?;
        let file = rblk_fabric::private::lock_file(&path).map_err(file_err)?;
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(DeviceClaim { _lock: lock }),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(ClaimError::Held(dev_id)),
            Err((_, e)) => Err(file_err(e.into())),
        }
    }

    /// Whether a live process serves ublk device `dev_id` (holds its claim).
    pub fn held(dev_id: u32) -> bool {
        matches!(DeviceClaim::take(dev_id), Err(ClaimError::Held(_)))
    }
}

/// Every entry, with `state` = `dead` where the process is gone; sorted by kind and pid.
pub fn entries() -> Vec<(PathBuf, Entry)> {
    let Ok(dir) = fs::read_dir(run_dir()) else { return Vec::new() };
    let mut v: Vec<(PathBuf, Entry)> = dir
        .filter_map(Result::ok)
        .map(|d| d.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .filter_map(|p| {
            let text = fs::read_to_string(&p).ok()?;
            let mut e: Entry = serde_json::from_str(&text).ok()?;
            if !e.alive() && !e.state.starts_with("failed") {
                e.state = "dead".into();
            }
            Some((p, e))
        })
        .collect();
    v.sort_by(|a, b| (&a.1.kind, a.1.pid).cmp(&(&b.1.kind, b.1.pid)));
    v
}

/// Forgets the entries of earlier ublk devices numbered `dev_id` whose processes are gone: the
/// kernel hands an id out again only once its device was deleted, so a new device `dev_id`
/// makes them stale, and `rblk detach` or a takeover by device name would otherwise find a dead
/// predecessor's entry instead of this device's.
pub fn forget_earlier(dev_id: u32) {
    let me = std::process::id();
    for (path, e) in entries() {
        if e.kind == "ublk" && e.dev_id == Some(dev_id) && e.pid != me && !e.alive() {
            tracing::debug!(path = %path.display(), "forgetting the entry of an earlier device {dev_id}");
            let _ = fs::remove_file(&path);
        }
    }
}

/// List the ublk attachments, FUSE mounts and NBD exports on this host
///
/// One line each: kind, device or mount point, stable name (/dev/rblk/NAME), URI, pid, state
/// (`serving`; `recovering` while a process takes a dead server's ublk device over; `dead` when
/// the serving process is gone: `rblk attach URI` takes a ublk device over, `rblk detach` or
/// `rblk umount` cleans up; `failed: ...`). With --json, a JSON array of objects with the fields
/// kind, uri, device, link, mountpoint, listen, dev_id, pid, state.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    format: crate::common::Format,
}

/// `rblk list`.
pub fn list(args: ListArgs) -> anyhow::Result<()> {
    // The handover holds the session's token: it stays in the run directory.
    let all: Vec<Entry> = entries().into_iter().map(|(_, e)| Entry { handover: None, started: None, ..e }).collect();
    if args.format.json() {
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    if all.is_empty() {
        eprintln!("rblk: nothing attached, mounted or exported on this host");
        return Ok(());
    }
    println!("{:<5} {:<24} {:<20} {:<40} {:>8}  STATE", "KIND", "DEVICE", "NAME", "URI", "PID");
    for e in &all {
        let place = e.device.as_deref().or(e.mountpoint.as_deref()).or(e.listen.as_deref()).unwrap_or("-");
        let name = e.link.as_deref().unwrap_or("-");
        println!("{:<5} {:<24} {:<20} {:<40} {:>8}  {}", e.kind, place, name, e.uri, e.pid, e.state);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_dead_processes_show() {
        let dir = std::env::temp_dir().join(format!("rblk-list-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        // The only test of this crate that sets RBLK_RUN_DIR.
        std::env::set_var("RBLK_RUN_DIR", &dir);
        let mut r = register(Entry::new("ublk", "rblk://h/v").device(Some(Path::new("/dev/ublkb3")))).unwrap();
        r.update(|e| e.dev_id = Some(3));
        let dead = Entry { pid: u32::MAX - 1, ..Entry::new("nbd", "rblk://h/w") };
        write_entry(&entry_path(&dir, "nbd", dead.pid), &dead).unwrap();
        // A recorded start time that is not the running process's: its pid was reused.
        let reused = Entry { started: r.entry().started.map(|t| t + 1), ..r.entry().clone() };
        assert!(r.entry().alive() && r.entry().started.is_some());
        assert!(!reused.alive(), "a pid reused by another process passes for the server");
        let all = entries();
        assert_eq!(all.len(), 2, "{all:?}");
        assert_eq!(all[0].1.kind, "nbd");
        assert_eq!(all[0].1.state, "dead", "a pid that does not exist");
        assert_eq!((all[1].1.state.as_str(), all[1].1.dev_id), ("serving", Some(3)));
        // A dead server's entry for an earlier device 3 is forgotten once this process has a
        // device 3 (the kernel deleted the earlier one to hand the id out again); other devices'
        // dead entries stay (`rblk detach` or a takeover still needs them).
        let earlier = Entry { pid: u32::MAX - 2, dev_id: Some(3), ..Entry::new("ublk", "rblk://h/old") };
        let other = Entry { pid: u32::MAX - 3, dev_id: Some(4), ..Entry::new("ublk", "rblk://h/x") };
        write_entry(&entry_path(&dir, "ublk", earlier.pid), &earlier).unwrap();
        write_entry(&entry_path(&dir, "ublk", other.pid), &other).unwrap();
        forget_earlier(3);
        let pids: Vec<u32> = entries().iter().map(|(_, e)| e.pid).collect();
        assert!(!pids.contains(&earlier.pid) && pids.contains(&other.pid), "{pids:?}");
        assert!(pids.contains(&std::process::id()), "this process's own entry stays: {pids:?}");
        let _ = fs::remove_file(entry_path(&dir, "ublk", other.pid));
        drop(r);
        assert_eq!(entries().len(), 1, "a clean exit removes the entry");
        let _ = fs::remove_dir_all(&dir);
    }
}
