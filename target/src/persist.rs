//! Durable volumes: a backing file or block device, loaded into the volume's (anonymous,
//! registered) memory at start and written back from it on FLUSH, with io_uring.
//!
//! The registered memory is never a MAP_SHARED mapping of the file: NIC writes to pinned pages
//! bypass the page tables, so the kernel would never learn they are dirty. Instead FLUSH copies
//! the ranges an initiator wrote (it tracks them; one-sided writes are invisible here) to the
//! backing store, reaps every write, then fdatasyncs, and only then is FLUSHED sent.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rblk_fabric::Memory;

use crate::uring::{Dir, Ring};

/// Bytes per io_uring transfer.
const CHUNK: u64 = 1 << 20;
/// Transfers in flight.
const DEPTH: u32 = 16;
/// Alignment that O_DIRECT accepts on every device we meet (logical blocks of 512 or 4096).
const ALIGN: u64 = 4096;

/// Why a backing store cannot serve a volume. Each variant names the path; the OS error is the
/// source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackingError {
    /// A missing backing file could not be created.
    #[error("cannot create backing file {}", path.display())]
    Create {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A new backing file could not be given the volume's size.
    #[error("cannot size backing file {} to {size} bytes", path.display())]
    Resize {
        /// The file.
        path: PathBuf,
        /// The volume's size.
        size: u64,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The backing store could not be opened for reading and writing.
    #[error("cannot open backing store {} for reading and writing", path.display())]
    Open {
        /// The file or device.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Its size could not be read.
    #[error("cannot size backing store {}", path.display())]
    Size {
        /// The file or device.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// It is smaller than the volume.
    #[error("backing store {} holds {have} bytes, less than the volume's {size}", path.display())]
    TooSmall {
        /// The file or device.
        path: PathBuf,
        /// Its size.
        have: u64,
        /// The volume's size.
        size: u64,
    },
    /// No io_uring for it (an old kernel, or io_uring disabled by sysctl or seccomp).
    #[error("cannot set up io_uring for {}", path.display())]
    Ring {
        /// The file or device.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Reading it into the volume's memory failed.
    #[error("loading volume {name} from {}", path.display())]
    Load {
        /// The volume.
        name: String,
        /// The file or device.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// A volume's backing store.
#[derive(Debug)]
pub struct Backing {
    path: PathBuf,
    file: File,
    direct: bool,
    ring: Mutex<Ring>,
    failed: AtomicBool,
}

impl Backing {
    /// Opens (creating and sizing a missing file) the backing store at `path` for a volume of
    /// `size` bytes. Refuses one that is too small, unreadable or not writable, naming the path.
    pub fn open(path: &Path, size: u64) -> Result<Backing, BackingError> {
        let at = || path.to_owned();
        if !path.exists() {
            let f = File::create_new(path).map_err(|source| BackingError::Create { path: at(), source })?;
            f.set_len(size).map_err(|source| BackingError::Resize { path: at(), size, source })?;
        }
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.read(true).write(true);
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(path)
        };
        // O_DIRECT where the file system allows it (tmpfs does not); every transfer is 4 KiB
        // aligned in memory, offset and length.
        let (mut file, direct) = match open(true) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                (open(false).map_err(|source| BackingError::Open { path: at(), source })?, false)
            }
            Err(source) => return Err(BackingError::Open { path: at(), source }),
        };
        // Seeking to the end sizes regular files and block devices alike.
        let have = file.seek(SeekFrom::End(0)).map_err(|source| BackingError::Size { path: at(), source })?;
        if have < size {
            return Err(BackingError::TooSmall { path: at(), have, size });
        }
        let ring = Ring::new(DEPTH).map_err(|source| BackingError::Ring { path: at(), source })?;
        Ok(Backing { path: path.to_owned(), file, direct, ring: Mutex::new(ring), failed: AtomicBool::new(false) })
    }

    /// The path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The backing store's device, inode and size, for its instance identity.
    pub fn fingerprint(&self) -> io::Result<crate::identity::Fingerprint> {
        crate::identity::Fingerprint::of(&self.file)
    }

    /// Whether transfers bypass the page cache.
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// True once a write-back failed: the volume no longer promises durability.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// Reads the whole backing store into `memory`, logging progress of large loads.
    pub fn load(&self, memory: &Memory, name: &str) -> io::Result<Duration> {
        let started = Instant::now();
        let total = memory.len() as u64;
        let mut next_report = started + Duration::from_secs(1);
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        ring.transfer(self.file.as_raw_fd(), memory, &[(0, total)], Dir::Load, CHUNK, |done| {
            if Instant::now() >= next_report {
                next_report += Duration::from_secs(1);
                tracing::info!(volume = name, "loading: {} of {} MiB", done >> 20, total >> 20);
            }
        })?;
        Ok(started.elapsed())
    }

    /// Writes `ranges` of `memory` to the backing store, waits for every write, then
    /// fdatasyncs. On failure the backing store is marked failed for good.
    pub fn flush(&self, memory: &Memory, ranges: &[(u64, u64)]) -> io::Result<()> {
        if self.failed() {
            return Err(io::Error::other(format!("backing store {} failed earlier", self.path.display())));
        }
        let ranges = coalesce(ranges.iter().copied(), memory.len() as u64);
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let fd = self.file.as_raw_fd();
        let result = ring.transfer(fd, memory, &ranges, Dir::Store, CHUNK, |_| {}).and_then(|()| ring.fdatasync(fd));
        if let Err(e) = &result {
            self.failed.store(true, Ordering::SeqCst);
            tracing::error!(path = %self.path.display(), error = %e, "write-back failed: the volume stops promising durability");
        }
        result
    }
}

/// Sorts ranges, widens them to [`ALIGN`] (clamped to `limit`), and merges overlapping and
/// adjacent ones; empty ranges vanish.
pub fn coalesce(ranges: impl IntoIterator<Item = (u64, u64)>, limit: u64) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = ranges
        .into_iter()
        .filter(|&(_, len)| len > 0)
        .map(|(off, len)| {
            let start = off / ALIGN * ALIGN;
            let end = off.saturating_add(len).div_ceil(ALIGN).saturating_mul(ALIGN).min(limit);
            (start.min(limit), end)
        })
        .filter(|&(s, e)| e > s)
        .collect();
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (s, e) in v {
        match out.last_mut() {
            Some((_, last_end)) if s <= *last_end => *last_end = (*last_end).max(e),
            _ => out.push((s, e)),
        }
    }
    out.into_iter().map(|(s, e)| (s, e - s)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalescing() {
        assert_eq!(coalesce([(0, 4096), (4096, 4096)], 1 << 20), vec![(0, 8192)]);
        assert_eq!(coalesce([(8192, 4096), (0, 4096)], 1 << 20), vec![(0, 4096), (8192, 4096)]);
        assert_eq!(coalesce([(0, 10000), (4096, 100)], 1 << 20), vec![(0, 12288)]);
        assert_eq!(coalesce([(100, 1), (0, 0)], 1 << 20), vec![(0, 4096)]);
        assert_eq!(coalesce([(1 << 20, 4096)], 1 << 20), vec![]);
        assert_eq!(coalesce([((1 << 20) - 4096, u64::MAX)], 1 << 20), vec![((1 << 20) - 4096, 4096)]);
    }

    #[test]
    fn open_creates_sizes_and_refuses_small_files() {
        let dir = std::env::temp_dir().join(format!("rblk-persist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("v.img");
        let b = Backing::open(&path, 1 << 20).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 1 << 20);
        let mem = Memory::anonymous(1 << 20).unwrap();
        mem.write_at(8192, b"durable").unwrap();
        b.flush(&mem, &[(8192, 7)]).unwrap();
        let back = Memory::anonymous(1 << 20).unwrap();
        b.load(&back, "v").unwrap();
        let mut got = [0u8; 7];
        back.read_at(8192, &mut got).unwrap();
        assert_eq!(&got, b"durable");
        drop(b);
        let err = Backing::open(&path, 2 << 20).unwrap_err();
        assert!(matches!(err, BackingError::TooSmall { have: 1048576, size: 2097152, .. }), "{err}");
        assert!(err.to_string().contains("v.img"), "{err}");
        let err = Backing::open(&dir.join("no/such/dir/x"), 4096).unwrap_err();
        let BackingError::Create { path, source } = &err else { panic!("{err}") };
        assert!(path.ends_with("no/such/dir/x") && source.kind() == io::ErrorKind::NotFound, "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
