//! `rblk mount` and `rblk umount`: a volume as one file in a FUSE filesystem (the library's
//! `mount` module), optionally behind a loop device, in the foreground or as a daemon.
//!
//! `--daemon` works as in `daemon.rs`: the binary runs again, detached, and says when it is ready.

use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use rblk_initiator::Chain;

use crate::daemon::{self, READY};
use crate::fusefs::{self, MountOptions};
use crate::list::{self, Entry};

/// Mount a volume as one file in a FUSE filesystem, optionally behind a loop device
///
/// MOUNTPOINT then holds one file, named after the volume, whose size is the volume's.
/// Reads and writes of the file are one-sided RDMA READs and WRITEs to the volume, at any offset
/// and length (partial blocks are read-modify-written); nothing is cached (FUSE direct_io), so
/// every read sees the target. fsync, and close after writes, send a FLUSH of the ranges written
/// since the last one. With --loop, a loop device is attached to the file (direct I/O, the
/// volume's block size), for mkfs and mount.
///
/// Runs in the foreground until the filesystem is unmounted (`rblk umount MOUNTPOINT`) or
/// SIGINT/SIGTERM; then it flushes, closes the session and exits 0. With --daemon it returns as
/// soon as the volume is mounted, leaving a background process to serve it.
///
/// Once mounted it prints exactly one line on stdout, the path to do I/O on: the loop device
/// with --loop, else the volume's file (as `losetup --find --show` prints its device); with
/// -o json, one JSON object {"mountpoint", "file", "loop_device", "pid"}. Everything else
/// (what was mounted, the serving pid) goes to stderr.
///
/// When the volume grows on the target, the file grows with it at once (stat, reads and writes
/// past the old end); `losetup -c /dev/loopN` then `resize2fs /dev/loopN` grow a filesystem on
/// the loop device online.
///
/// Examples:
///   rblk mount rblk://10.0.0.1/vol0 /mnt/vol0                   # prints /mnt/vol0/vol0
///   rblk mount rblk://10.0.0.1/vol0 /mnt/vol0 --loop --daemon   # prints /dev/loopN
///   mkfs.ext4 /dev/loop0 && mount /dev/loop0 /srv/data
///   umount /srv/data && rblk umount /mnt/vol0
///
/// Root mounts with mount(2) directly; other users need fusermount3 (Debian package fuse3), and
/// --loop needs root.
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct MountArgs {
    /// The volume: rblk://HOST[:PORT]/VOLUME
    #[arg(value_parser = crate::common::volume_uri_arg)]
    uri: String,
    /// An existing directory to mount on; the volume appears in it as one file
    mountpoint: PathBuf,
    /// Open the volume read-only (writes fail with EROFS)
    ///
    /// Writes to the file fail (EROFS), and a --loop device is read-only too.
    #[arg(long, conflicts_with = "exclusive")]
    read_only: bool,
    /// Open the volume exclusively: no other session may write it
    #[arg(long)]
    exclusive: bool,
    /// Serve requests from N threads with a queue pair each
    ///
    /// N requests in flight.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = |t: &str| rblk_initiator::parse_bounded(t, 1, Some(64)).map(|n| n as u32))]
    queues: u32,
    /// Also attach a loop device to the file and print its path
    ///
    /// `losetup --direct-io=on`; its path is printed instead of the file's. `rblk umount` detaches
    /// it.
    #[arg(long = "loop")]
    loop_device: bool,
    #[command(flatten)]
    format: crate::common::Format,
    #[command(flatten)]
    metrics: crate::metrics::MetricsArgs,
    #[command(flatten)]
    run: crate::daemon::DaemonArgs,
    #[command(flatten)]
    conn: crate::common::Connection,
    #[command(flatten, next_help_heading = "Reconnect")]
    reconnect: rblk_initiator::ReconnectArgs,
}

/// Unmount a volume mounted by `rblk mount`, detaching its loop devices first.
///
/// Detaches the loop devices backed by the volume's file, then unmounts it; the serving process
/// then flushes, closes its session and exits 0.
///
/// Refuses, changing nothing, while a loop device on the file is mounted or in use (unmount the
/// filesystem on it first), or when MOUNTPOINT is not an rblk mount.
#[derive(Debug, clap::Args)]
pub struct UmountArgs {
    /// Where the volume is mounted.
    mountpoint: PathBuf,
}

/// `rblk mount`.
pub fn mount(args: MountArgs) -> anyhow::Result<()> {
    // Local arguments before any connection (or background process).
    check_mountpoint(&args.mountpoint)?;
    if args.run.daemon && !args.run.detached {
        // The background process printed the one stdout line (relayed) and the rest to stderr.
        let pid = daemon::spawn_detached("the volume was mounted")?;
        let mountpoint = args.mountpoint.display();
        eprintln!("rblk: serving in the background (pid {pid}); `rblk umount {mountpoint}` unmounts");
        return Ok(());
    }
    if args.run.detached {
        daemon::become_detached()?;
    }
    serve(&args)
}

/// Refuses a mount point that is not an existing directory, saying so (not the connect's error).
fn check_mountpoint(dir: &Path) -> anyhow::Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => anyhow::bail!("the mount point {} is not a directory", dir.display()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            anyhow::bail!("the mount point {} does not exist (mkdir it first)", dir.display())
        }
        Err(e) => anyhow::bail!("the mount point {}: {}", dir.display(), crate::common::io_text(&e)),
    }
}

/// `rblk umount`.
pub fn umount(args: UmountArgs) -> anyhow::Result<()> {
    let done = fusefs::unmount(&args.mountpoint)?;
    for dev in &done.loops {
        eprintln!("rblk: detached {}", dev.display());
    }
    eprintln!("rblk: unmounted {}", done.mountpoint.display());
    Ok(())
}

fn serve(args: &MountArgs) -> anyhow::Result<()> {
    let mode = crate::common::open_mode(args.read_only, args.exclusive);
    let vol = crate::common::open(&args.uri, &args.conn, mode, args.reconnect.reconnect())?;
    let describe = format!(
        "{} ({}, block size {}, {}, {})",
        vol.uri(),
        crate::common::human(vol.size()),
        vol.block_size(),
        if vol.is_read_only() { "read-only" } else { "read-write" },
        if vol.is_volatile() { "volatile" } else { "durable" },
    );
    let opts = MountOptions { queues: args.queues, ..MountOptions::default() };
    // Listening before the mount: a port in use fails here, with nothing to undo.
    let metrics = crate::metrics::Metrics::new(vol.uri());
    let _endpoint = args.metrics.serve(&metrics)?;
    let mounted = fusefs::mount(vol, &args.mountpoint, &opts)?;
    let _counted = metrics.add(mounted.volume_file().counters());
    let mountpoint = mounted.mountpoint().to_owned();
    let file = mounted.file().to_owned();

    let loop_dev = if args.loop_device {
        let vf = mounted.volume_file();
        match fusefs::attach_loop(&file, vf.block_size(), vf.is_read_only()) {
            Ok(dev) => Some(dev),
            Err(e) => {
                let undone = mounted.unmount().map(drop);
                return Err(anyhow::Error::new(e).context(match undone {
                    Ok(()) => "attaching a loop device (the volume was unmounted again)".to_owned(),
                    Err(u) => format!("attaching a loop device (and unmounting failed too: {u})"),
                }));
            }
        }
    } else {
        None
    };

    let signals = watch_signals(&mountpoint)?;
    let mut out = io::stdout().lock();
    // Exactly one line on stdout: the path to do I/O on (or JSON); the rest to stderr.
    let line = if args.format.json() {
        serde_json::json!({
            "mountpoint": mountpoint.display().to_string(),
            "file": file.display().to_string(),
            "loop_device": loop_dev.as_ref().map(|d| d.display().to_string()),
            "pid": std::process::id(),
        })
        .to_string()
    } else {
        loop_dev.as_deref().unwrap_or(&file).display().to_string()
    };
    writeln!(out, "{line}")?;
    eprintln!("rblk: mounted {describe} at {} with {} queues", mountpoint.display(), args.queues);
    eprintln!("rblk: file {}", file.display());
    if let Some(dev) = &loop_dev {
        eprintln!("rblk: loop device {}", dev.display());
    }
    eprintln!("rblk: pid {} serves {}", std::process::id(), mountpoint.display());
    if args.run.detached {
        writeln!(out, "{READY}")?;
        out.flush()?;
        drop(out);
        daemon::detach_stdio(args.run.log_file.as_deref())?;
    } else {
        out.flush()?;
        drop(out);
        eprintln!("rblk: serving until `rblk umount {}` or Ctrl-C", mountpoint.display());
    }

    let entry =
        Entry::new("fuse", &args.uri).mountpoint(&mountpoint).device(loop_dev.as_deref().or(Some(file.as_path())));
    let _registered = list::register(entry);
    let summary = mounted.wait()?;
    signals.close();
    let s = summary.stats;
    let note = if summary.volatile { "the volume is volatile (RAM only)" } else { "flushed to durable storage" };
    eprintln!(
        "rblk: unmounted {}: {} reads, {} writes ({} read-modify-write), {} flushes, {} failed requests; {note}",
        mountpoint.display(),
        s.reads,
        s.writes,
        s.read_modify_writes,
        s.flushes,
        summary.errors
    );
    Ok(())
}

/// SIGINT, SIGTERM and SIGHUP unmount (detaching our loop devices first). While the file or a
/// loop device on it is still in use, that fails: the server says why and keeps serving.
fn watch_signals(mountpoint: &Path) -> anyhow::Result<signal_hook::iterator::Handle> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]).context("installing signal handlers")?;
    let handle = signals.handle();
    let mountpoint = mountpoint.to_owned();
    std::thread::Builder::new()
        .name("rblk-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                tracing::info!(signal = sig, "unmounting");
                match fusefs::unmount(&mountpoint) {
                    Ok(_) => break,
                    Err(e) => eprintln!("rblk: cannot unmount yet, still serving: {}", Chain(&e)),
                }
            }
        })
        .context("starting the signal thread")?;
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use std::ffi::OsString;

    use super::*;

    fn parse(args: &[&str]) -> Result<MountArgs, String> {
        let argv = ["rblk", "mount"].iter().chain(args);
        match crate::cli::Args::try_parse_from(argv).map_err(|e| e.to_string())?.command {
            crate::cli::Command::Mount(m) => Ok(m),
            other => Err(format!("{other:?}")),
        }
    }

    #[test]
    fn mount_flags() {
        let m = parse(&["rblk://h/v", "/mnt/v", "--loop", "--daemon", "--queues", "4", "--log-file", "/l"]).unwrap();
        assert!(m.loop_device && m.run.daemon && !m.read_only && !m.run.detached);
        assert_eq!((m.queues, m.mountpoint.as_path()), (4, Path::new("/mnt/v")));
        assert_eq!(m.run.log_file.as_deref(), Some(Path::new("/l")));
        assert_eq!(parse(&["rblk://h/v", "/m"]).unwrap().queues, 2);
        assert!(parse(&["rblk://h/v", "/m", "--queues", "0"]).is_err());
        let e = parse(&["rblk://h/v", "/m", "--log-file", "/l"]).unwrap_err();
        assert!(e.contains("--daemon"), "--log-file needs --daemon: {e}");
        assert!(parse(&["rblk://h/v"]).is_err(), "the mount point is required");
        let x = parse(&["rblk://h/v", "/m", "--exclusive"]).unwrap();
        assert_eq!(crate::common::open_mode(x.read_only, x.exclusive), rblk_initiator::OpenMode::Exclusive);
        assert!(parse(&["rblk://h/v", "/m", "--exclusive", "--read-only"]).is_err());
    }

    #[test]
    fn the_background_process_runs_the_same_command_detached() {
        let argv = ["mount", "rblk://h/v", "/m", "--daemon", "--loop", "--log-file", "/l"].map(OsString::from);
        let child = daemon::child_args(argv.into_iter());
        let want = ["mount", "rblk://h/v", "/m", "--daemon", "--loop", "--log-file", "/l", "--detached"];
        assert_eq!(child, want.map(OsString::from));
        // It parses (--log-file still has its --daemon), and --detached makes it serve.
        let reparsed = parse(&want[1..]).unwrap();
        assert!(reparsed.run.detached && reparsed.run.daemon);
    }
}
