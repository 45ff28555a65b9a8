//! A volume as one file in a FUSE filesystem (`rblk mount`), optionally behind a loop device.
//!
//! - The volume is served by the library's block-I/O engine ([`Engine`]): reads and writes of
//!   any offset and length go straight to one-sided RDMA, one lane per FUSE worker thread;
//!   partial blocks are read-modify-written under the session's range locks, so writes that
//!   share a block never lose each other's bytes. Nothing is cached. A flush sends a FLUSH of
//!   the ranges written since the last one, only if there were any.
//! - [`mount`] / [`Mounted`] (`fs.rs`): the FUSE filesystem over it: one directory holding one
//!   file named after the volume, with the volume's size. The file is opened in FUSE's
//!   `direct_io` mode: the kernel keeps no page cache of it, so every read sees the target (other
//!   sessions' writes included), every acknowledged write is in target memory, requests keep the
//!   caller's offsets and sizes (up to 1 MiB), and a filesystem or loop device on top is not
//!   cached twice. `fsync` and `close` after writes become a FLUSH.
//! - [`unmount`], [`attach_loop`] (`system.rs`): what `rblk umount` does (detach the loop devices
//!   backed by the file, then unmount), from `/proc/self/mountinfo` and `/sys/block/loop*`.
//!
//! ```no_run
//! use rblk::fusefs::{self, MountOptions};
//! use rblk_initiator::{OpenMode, Options, Session};
//!
//! let vol = Session::connect("rblk://10.0.0.1/vol0", &Options::default())?.open(OpenMode::ReadWrite)?;
//! let mounted = fusefs::mount(vol, "/mnt/vol0".as_ref(), &MountOptions::default())?;
//! println!("the volume is {}", mounted.file().display()); // /mnt/vol0/vol0
//! // ... until someone runs `rblk umount /mnt/vol0` (or call mounted.unmount()):
//! let summary = mounted.wait()?; // flushes and closes the session
//! println!("{} FLUSHes while mounted", summary.stats.flushes);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Threads and cleanup
//!
//! [`Mounted`] runs the FUSE session on `queues` threads (each borrowing one lane per request)
//! plus one housekeeping thread (keepalives every 2 s). [`Mounted::wait`] returns once the
//! filesystem is unmounted, after a last FLUSH and the session's CLOSE. Dropping a [`Mounted`]
//! without waiting unmounts (if still mounted) and disconnects without that last FLUSH. Each
//! mount leaves one /dev/fuse descriptor of its finished connection open until the process
//! exits (a workaround for fuser unmounting the path a second time; see `fs::join_session`).
//!
//! [`Engine`]: rblk_initiator::Engine

mod fs;
mod system;

use std::io;
use std::path::PathBuf;

pub use fs::{mount, MountOptions, Mounted, Summary};
pub use system::{
    attach_loop, detach_loop, find_mount, loops_backed_by, mounts, unmount, LoopDevice, MountEntry, Unmounted,
};

/// Why mounting, serving or unmounting failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The volume refused or failed (opening queues, the final FLUSH, CLOSE).
    #[error(transparent)]
    Volume(#[from] rblk_initiator::Error),
    /// The mount point cannot be used.
    #[error("mount point {}: {reason}", path.display())]
    Mountpoint {
        /// The path given.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Mounting the FUSE filesystem failed (no /dev/fuse, no permission, no fusermount3 for a
    /// non-root user, ...).
    #[error("mounting FUSE at {}{}", path.display(), fuse_hint(source))]
    Fuse {
        /// The mount point.
        path: PathBuf,
        /// The error from /dev/fuse, mount(2) or fusermount3.
        #[source]
        source: io::Error,
    },
    /// The FUSE session ended with an error (it is unmounted).
    #[error("serving FUSE at {}", path.display())]
    Session {
        /// The mount point.
        path: PathBuf,
        /// What the session loop reported.
        #[source]
        source: io::Error,
    },
    /// The path is not an rblk FUSE mount.
    #[error("{} is not an rblk mount{}", path.display(), found.as_ref().map(|f| format!(" (it is {f})")).unwrap_or_default())]
    NotMounted {
        /// The path given.
        path: PathBuf,
        /// What is mounted there instead, if anything.
        found: Option<String>,
    },
    /// A loop device backed by the file is still in use (mounted, or held open).
    #[error("{} (backed by {}) is in use: {what}; unmount it first", device.display(), backing.display())]
    LoopBusy {
        /// The loop device.
        device: PathBuf,
        /// Its backing file.
        backing: PathBuf,
        /// Who uses it.
        what: String,
    },
    /// Unmounting failed (the file or a loop device on it is still open).
    #[error("unmounting {}: {reason}", path.display())]
    Unmount {
        /// The mount point.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A helper program (losetup, fusermount3) failed or could not run.
    #[error("{command}: {reason}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status and stderr, or why it did not start.
        reason: String,
    },
    /// Reading /proc or /sys failed.
    #[error("reading {}", path.display())]
    System {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

fn fuse_hint(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::NotFound => " (is the fuse module loaded, /dev/fuse present, and fusermount3 installed?)",
        io::ErrorKind::PermissionDenied => " (mount as root, or install fusermount3 from the fuse3 package)",
        _ => "",
    }
}

/// Result alias for this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;
