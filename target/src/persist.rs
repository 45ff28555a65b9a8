//! Durable volumes: a backing file or block device, loaded into the volume's (registered,
//! sealed memfd) memory at start and written back from it on FLUSH, with io_uring.
//!
//! The registered memory is never a MAP_SHARED mapping of the file: NIC writes to pinned pages
//! bypass the page tables, so the kernel would never learn they are dirty. Instead FLUSH copies
//! the ranges an initiator wrote (it tracks them; one-sided writes are invisible here) to the
//! backing store, reaps every write, then fdatasyncs, and only then is FLUSHED sent.
//!
//! A backing store is claimed for as long as it is served: a file with an exclusive OFD lock, a
//! block device by opening it O_EXCL (as LIO and mount do). Both belong to the open file
//! description, not to the process, so a descriptor handed on (to a successor daemon) carries
//! the claim, and a second daemon, or a second volume of this one, is refused naming the path.
//! New image files are made with mode 0600: they hold a volume's data.
//!
//! FLUSHes of one volume are group-committed ([`Group`]): one write-back pass runs at a time,
//! off the connections' threads, and each pass takes every range asked for while the one before
//! it ran. DISCARD and WRITE_ZEROES ([`Job::Zero`]) run in the same passes, in the order they
//! came among the FLUSHes: the pass zeroes the volume's memory with stores and then punches the
//! backing store's range (or zeroes it in place), so a punch and a later write of the same range
//! reach the backing store in that order.
//!
//! Holes: the backing store's ranges known to be unallocated (found with `SEEK_HOLE` at the
//! load, punched since) whose memory may still be all zeros. A write-back skips the blocks of a
//! hole whose memory is still zero instead of filling the hole with zeros, and writes (and
//! forgets as holes) those written since; so neither a FLUSH of a range that was discarded nor
//! a final flush of the whole volume gives back the space a discard freed.
//!
//! Growth (issue 44, [`Backing::grow`]): a volume grows by a new memory segment, and its backing
//! store with it, never the other way round: a file is extended sparse and the added range is a
//! hole; a block device must have been grown by the operator first (`lvextend`), and its added
//! range is loaded. Nothing here ever makes a backing store shorter (`extend` is the one way a
//! file is sized). The size written back is the memory's: once the volume's view covers the new
//! segment, every write-back, the final flush included, covers the added range.

use std::fs::File;
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rblk_fabric::{Memory, Waker};

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
    /// Another open file description holds it: another daemon (or a volume of this one) serves
    /// it, or (a block device) it is mounted or otherwise opened exclusively.
    #[error(
        "backing store {} is in use by another process (another rblk-target serves it?) or mounted: it is not \
         opened twice, so that one does not overwrite the other's data",
        path.display()
    )]
    InUse {
        /// The file or device.
        path: PathBuf,
    },
    /// A directory or symlink on its path, or the entry itself, is controlled by someone other
    /// than root or this user: it could be pointed at another file or device.
    #[error("backing store {} is not opened", path.display())]
    Untrusted {
        /// The path.
        path: PathBuf,
        /// Which component, and why.
        #[source]
        source: rblk_fabric::trusted::PathError,
    },
    /// Neither a regular file nor a block device.
    #[error("backing store {} is neither a regular file nor a block device", path.display())]
    Kind {
        /// The path.
        path: PathBuf,
    },
    /// Its claim could not be taken for another reason.
    #[error("cannot lock backing store {}", path.display())]
    Lock {
        /// The file.
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
    /// A growth of a block device's volume past what the device holds: the operator grows the
    /// device first (nothing is changed).
    #[error(
        "grow the device first, e.g. lvextend -L {size}b {}: {} holds {have} bytes, the volume needs {size}",
        path.display(),
        path.display()
    )]
    DeviceTooSmall {
        /// The device.
        path: PathBuf,
        /// Its size.
        have: u64,
        /// The volume's new size.
        size: u64,
    },
    /// A growth to less than the volume holds: a durable volume's backing store is never
    /// shrunk (nothing is changed).
    #[error("backing store {} is never shrunk: the volume holds {size} bytes, not {to}", path.display())]
    Shrink {
        /// The file or device.
        path: PathBuf,
        /// The volume's size.
        size: u64,
        /// The size asked for.
        to: u64,
    },
    /// A growth from or to a size that is not in 4 KiB blocks (O_DIRECT's unit; volume sizes
    /// are multiples of the block size).
    #[error("backing store {} is not grown from {size} to {to} bytes: not whole 4 KiB blocks", path.display())]
    Unaligned {
        /// The file or device.
        path: PathBuf,
        /// The volume's size.
        size: u64,
        /// The size asked for.
        to: u64,
    },
    /// A growth of a volume whose write-back failed: it promises no durability any more.
    #[error("backing store {} failed a write-back earlier: the volume is not grown", path.display())]
    Failed {
        /// The file or device.
        path: PathBuf,
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
    /// The ring, and the holes (see the module docs), taken together by a pass.
    ring: Mutex<(Ring, Holes)>,
    failed: AtomicBool,
}

/// What a write-back pass does, in the order the requests came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Job {
    /// Write the `len` bytes of memory at `offset` to the backing store (a FLUSH's range).
    Store(u64, u64),
    /// Zero the `len` bytes at `offset`: the volume's memory with stores, then the backing
    /// store's range, punched, or with `keep` zeroed in place and left allocated (DISCARD,
    /// WRITE_ZEROES).
    Zero {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u64,
        /// Keep the range allocated (WRITE_ZEROES with `NO_UNMAP`).
        keep: bool,
    },
}

impl Job {
    /// Zeroes a [`Job::Zero`]'s range of `memory`; nothing for a store.
    pub fn zero_memory(&self, memory: &Memory) -> io::Result<()> {
        match *self {
            Job::Store(..) => Ok(()),
            Job::Zero { offset, len, .. } => memory.zero(offset as usize, len as usize).map_err(io::Error::other),
        }
    }
}

/// Sorted, disjoint, non-adjacent `(start, end)` byte ranges: a backing store's holes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Holes(Vec<(u64, u64)>);

impl Holes {
    /// Adds `start..end`, merging with what it touches.
    pub(crate) fn add(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut s, mut e) = (start, end);
        self.0.retain(|&(a, b)| {
            let touches = a <= e && s <= b;
            if touches {
                s = s.min(a);
                e = e.max(b);
            }
            !touches
        });
        let at = self.0.partition_point(|&(a, _)| a < s);
        self.0.insert(at, (s, e));
    }

    /// Removes `start..end`.
    pub(crate) fn remove(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let mut out = Vec::with_capacity(self.0.len() + 1);
        for &(a, b) in &self.0 {
            if b <= start || a >= end {
                out.push((a, b));
                continue;
            }
            if a < start {
                out.push((a, start));
            }
            if b > end {
                out.push((end, b));
            }
        }
        self.0 = out;
    }

    /// The parts of `start..end` that are holes, in order.
    pub(crate) fn within(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let first = self.0.partition_point(|&(_, b)| b <= start);
        self.0[first..].iter().take_while(|&&(a, _)| a < end).map(|&(a, b)| (a.max(start), b.min(end))).collect()
    }

    /// Bytes in holes.
    pub(crate) fn bytes(&self) -> u64 {
        self.0.iter().map(|(a, b)| b - a).sum()
    }

    /// Of the `(offset, len)` store ranges (4 KiB aligned, sorted, disjoint), those to write:
    /// the blocks of a hole whose memory is still zero are left out (the hole reads zeros
    /// already), and the blocks of a hole written since are kept and stop being holes.
    pub(crate) fn filter_stores(&mut self, memory: &Memory, ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
        if self.0.is_empty() {
            return ranges;
        }
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        let push = |s: u64, e: u64, out: &mut Vec<(u64, u64)>| match out.last_mut() {
            Some((o, l)) if *o + *l == s => *l += e - s,
            _ => out.push((s, e - s)),
        };
        for (offset, len) in ranges {
            let end = offset + len;
            let mut at = offset;
            for (hs, he) in self.within(offset, end) {
                if at < hs {
                    push(at, hs, &mut out);
                }
                let mut block = hs;
                while block < he {
                    let next = (block + ALIGN).min(he);
                    // A block beyond the memory cannot be written: keep it a hole.
                    let zero = memory.is_zero(block as usize, (next - block) as usize).unwrap_or(true);
                    if !zero {
                        push(block, next, &mut out);
                        self.remove(block, next);
                    }
                    block = next;
                }
                at = he;
            }
            if at < end {
                push(at, end, &mut out);
            }
        }
        out
    }
}

/// The holes of regular file `file` within `start..end` (`SEEK_HOLE`/`SEEK_DATA`), in whole
/// [`ALIGN`] blocks; none for a block device, or where the file system cannot say.
fn find_holes(file: &File, start: u64, end: u64) -> Holes {
    use nix::unistd::{lseek, Whence};
    let mut holes = Holes::default();
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return holes;
    }
    let mut at = i64::try_from(start).unwrap_or(i64::MAX);
    let size = i64::try_from(end).unwrap_or(i64::MAX);
    while at < size {
        let Ok(hole) = lseek(file, at, Whence::SeekHole) else { break };
        if hole >= size {
            break;
        }
        // ENXIO: no data after the hole, which runs to the end.
        let data = lseek(file, hole, Whence::SeekData).unwrap_or(size).min(size);
        // Whole blocks only: a write-back's unit.
        let (s, e) = ((hole as u64).div_ceil(ALIGN) * ALIGN, data as u64 / ALIGN * ALIGN);
        holes.add(s, e);
        at = data;
    }
    holes
}

/// Makes regular file `file` at least `size` bytes long, sparse (nothing is written). Never
/// shorter: the one way rblk sizes a backing file, so that no path can cut a volume's data
/// off (a file longer already, say extended by the operator, is left as it is).
fn extend(file: &File, size: u64) -> io::Result<()> {
    if file.metadata()?.len() < size {
        file.set_len(size)?;
    }
    Ok(())
}

/// Reads `ranges` of the backing store `fd` into the same offsets of `memory` with `ring`,
/// logging progress of large loads as volume `name`'s.
fn read(ring: &mut Ring, fd: std::os::fd::RawFd, memory: &Memory, ranges: &[(u64, u64)], name: &str) -> io::Result<()> {
    let total: u64 = ranges.iter().map(|&(_, len)| len).sum();
    let mut next_report = Instant::now() + Duration::from_secs(1);
    let run = move || {
        ring.transfer(fd, memory, ranges, Dir::Load, CHUNK, |done| {
            if Instant::now() >= next_report {
                next_report += Duration::from_secs(1);
                tracing::info!(
                    volume = name,
                    "loading: {:.1} of {}",
                    rblk_proto::Bytes(done),
                    rblk_proto::Bytes(total)
                );
            }
        })
    };
    // On a thread of its own: the kernel's io_uring workers (`iou-wrk`) that the reads may
    // start belong to the thread that submitted them, and the last of them stays until that
    // thread exits. Loaded on the main thread (at start, at a reload), it stayed a thread of
    // the daemon for good, beyond the `workers` + 4 that docs/DESIGN.md promises.
    std::thread::scope(|s| {
        let loading = std::thread::Builder::new().name("rblk-load".into()).spawn_scoped(s, run)?;
        loading.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

impl Backing {
    /// Opens (creating, with mode 0600, and sizing a missing file) the backing store at `path`
    /// for a volume of `size` bytes, and claims it (see the module docs). The path is walked
    /// with [`rblk_fabric::trusted::walk`]: a symlink or directory on it that someone other than
    /// root or this user controls is refused. Whether it is a file or a block device is decided
    /// from the descriptor opened (a block device is claimed by that same open), never from the
    /// name. Refuses one that is too small, unreadable, not writable or claimed already, naming
    /// the path.
    pub fn open(path: &Path, size: u64) -> Result<Backing, BackingError> {
        let at = || path.to_owned();
        let walked = rblk_fabric::trusted::walk(path, rblk_fabric::trusted::Last::Any).map_err(|e| match e {
            // A missing directory: the file cannot be made.
            e if e.is_not_found() => BackingError::Create { path: at(), source: e.into() },
            source => BackingError::Untrusted { path: at(), source },
        })?;
        Backing::open_walked(&walked, path, size, true)
    }

    /// [`Backing::open`] without O_DIRECT: the tests' way to the buffered path where the file
    /// system offers O_DIRECT.
    #[cfg(test)]
    fn open_buffered(path: &Path, size: u64) -> Result<Backing, BackingError> {
        let walked = rblk_fabric::trusted::walk(path, rblk_fabric::trusted::Last::Any).unwrap();
        Backing::open_walked(&walked, path, size, false)
    }

    /// [`Backing::open`] once the path is walked: what is opened is the entry the walk found
    /// (one replaced since is refused), its kind taken from the descriptor; with O_DIRECT
    /// where the file system allows it and `try_direct`.
    fn open_walked(
        walked: &rblk_fabric::trusted::Walked,
        path: &Path,
        size: u64,
        try_direct: bool,
    ) -> Result<Backing, BackingError> {
        use nix::fcntl::OFlag;
        let at = || path.to_owned();
        if walked.stat().is_none() {
            let f = walked.create(0o600).map_err(|source| BackingError::Create { path: at(), source })?;
            extend(&f, size).map_err(|source| BackingError::Resize { path: at(), size, source })?;
        }
        // O_EXCL without O_CREAT claims a block device (EBUSY while anyone else holds it so, or
        // it is mounted) and means nothing for a regular file: so the kind need not be known
        // before the open, and is taken from the descriptor it gives.
        let open = |direct: bool| {
            let flags = OFlag::O_RDWR | OFlag::O_EXCL | OFlag::O_NONBLOCK;
            walked.open(if direct { flags | OFlag::O_DIRECT } else { flags })
        };
        let failed = |source: io::Error| match source.raw_os_error() {
            Some(libc::EBUSY) => BackingError::InUse { path: at() },
            _ => BackingError::Open { path: at(), source },
        };
        // O_DIRECT where the file system allows it (tmpfs does not); every transfer is 4 KiB
        // aligned in memory, offset and length.
        let (mut file, direct) = match open(try_direct) {
            Ok(f) => (f, try_direct),
            Err(e) if try_direct && e.raw_os_error() == Some(libc::EINVAL) => (open(false).map_err(failed)?, false),
            Err(source) => return Err(failed(source)),
        };
        let kind = file.metadata().map_err(|source| BackingError::Open { path: at(), source })?.file_type();
        if kind.is_file() {
            claim(&file).map_err(|source| match source.raw_os_error() {
                Some(libc::EAGAIN | libc::EACCES) => BackingError::InUse { path: at() },
                _ => BackingError::Lock { path: at(), source },
            })?;
        } else if !kind.is_block_device() {
            return Err(BackingError::Kind { path: at() });
        }
        // Back to blocking I/O (O_NONBLOCK only kept the open of a FIFO swapped in from waiting).
        clear_nonblock(&file).map_err(|source| BackingError::Open { path: at(), source })?;
        // Seeking to the end sizes regular files and block devices alike.
        let have = file.seek(SeekFrom::End(0)).map_err(|source| BackingError::Size { path: at(), source })?;
        if have < size {
            return Err(BackingError::TooSmall { path: at(), have, size });
        }
        Backing::with_ring(path, file, direct, size, false)
    }

    /// The backing store of an open (and claimed) `file`: its ring, and its holes within `size`
    /// (`SEEK_HOLE`; at adoption, what the predecessor punched is in the file by now, since a
    /// pass ends before a handover).
    fn with_ring(path: &Path, file: File, direct: bool, size: u64, failed: bool) -> Result<Backing, BackingError> {
        let ring = Ring::new(DEPTH).map_err(|source| BackingError::Ring { path: path.to_owned(), source })?;
        let holes = find_holes(&file, 0, size);
        let ring = Mutex::new((ring, holes));
        Ok(Backing { path: path.to_owned(), file, direct, ring, failed: AtomicBool::new(failed) })
    }

    /// A backing store a predecessor daemon handed over: `file` is its open file description,
    /// so its claim (see the module docs) comes with it and is not taken again. Refuses a file
    /// that is no longer the one at `path` (replaced meanwhile, or reached through a path that
    /// someone else controls: [`rblk_fabric::trusted::walk`]), or smaller than the volume.
    /// `failed`: a write-back failed in the predecessor, and the volume stays failed.
    pub fn adopt(path: &Path, file: File, size: u64, failed: bool) -> Result<Backing, BackingError> {
        use std::os::unix::fs::MetadataExt as _;
        let at = || path.to_owned();
        let walked = rblk_fabric::trusted::walk(path, rblk_fabric::trusted::Last::Any)
            .map_err(|source| BackingError::Untrusted { path: at(), source })?;
        let there = walked.stat().map(|st| (st.st_dev, st.st_ino, st.st_rdev));
        let handed = file.metadata().map_err(|source| BackingError::Size { path: at(), source })?;
        if there != Some((handed.dev(), handed.ino(), handed.rdev())) {
            let source = io::Error::other("the path names another file than the one handed over (replaced meanwhile?)");
            return Err(BackingError::Open { path: at(), source });
        }
        let have = (&file).seek(SeekFrom::End(0)).map_err(|source| BackingError::Size { path: at(), source })?;
        if have < size {
            return Err(BackingError::TooSmall { path: at(), have, size });
        }
        let flags = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_GETFL)
            .map_err(|e| BackingError::Open { path: at(), source: e.into() })?;
        let direct = flags & libc::O_DIRECT != 0;
        Backing::with_ring(path, file, direct, size, failed)
    }

    /// The open backing store, for handing it to a successor daemon (the claim is its open
    /// file description's).
    pub fn file(&self) -> &File {
        &self.file
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
        let mut guard = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        read(&mut guard.0, self.file.as_raw_fd(), memory, &[(0, memory.len() as u64)], name)?;
        Ok(started.elapsed())
    }

    /// Whether [`Backing::grow`] from `from` to `to` bytes would be refused for what it can
    /// know before it reads anything: a shrink, sizes not in 4 KiB blocks, a failed store, one
    /// that shrank below `from`, a block device smaller than `to`. Changes nothing. Call it
    /// before placing the new segment, so that the likeliest refusal (a device not grown yet)
    /// uses none of the volume's reserved address space.
    pub fn check_growth(&self, from: u64, to: u64) -> Result<(), BackingError> {
        self.measure_growth(from, to).map(drop)
    }

    /// [`Backing::check_growth`]; then whether the store is a regular file, and its size.
    fn measure_growth(&self, from: u64, to: u64) -> Result<(bool, u64), BackingError> {
        let at = || self.path.clone();
        if to < from {
            return Err(BackingError::Shrink { path: at(), size: from, to });
        }
        if !from.is_multiple_of(ALIGN) || !to.is_multiple_of(ALIGN) {
            return Err(BackingError::Unaligned { path: at(), size: from, to });
        }
        if self.failed() {
            return Err(BackingError::Failed { path: at() });
        }
        let size_err = |source| BackingError::Size { path: at(), source };
        let is_file = self.file.metadata().map_err(size_err)?.is_file();
        // Seeking to the end sizes regular files and block devices alike.
        let have = (&self.file).seek(SeekFrom::End(0)).map_err(size_err)?;
        if have < from {
            return Err(BackingError::TooSmall { path: at(), have, size: from });
        }
        if !is_file && have < to {
            return Err(BackingError::DeviceTooSmall { path: at(), have, size: to });
        }
        Ok((is_file, have))
    }

    /// Grows the backing store with its volume `name`, from `from` bytes to `memory.len()`,
    /// and loads the added range into `memory` at the same offsets. `memory` is the volume's
    /// whole view after the growth ([`Memory::span`] over its segments, the new one last),
    /// whose added range reads zeros, as a new segment ([`Memory::memfd_in`]) does: holes are
    /// not read. Both sizes are multiples of 4 KiB (O_DIRECT's unit).
    ///
    /// - A regular file shorter than the new size is extended sparse (nothing is written) and
    ///   the added range is a hole from then on (see the module docs), so no write-back, the
    ///   final flush included, fills it with zeros. A file longer already (the operator
    ///   extended it) has that range loaded, its holes found.
    /// - A block device must hold the new size already (`lvextend` first; a smaller one is
    ///   refused with [`BackingError::DeviceTooSmall`]). The added range is loaded: LVM does
    ///   not zero new extents, and the memory must hold what the device does.
    /// - Nothing is ever shrunk: a size below `from` is refused ([`BackingError::Shrink`]), as
    ///   is a store that holds less than `from` ([`BackingError::TooSmall`]: it shrank while
    ///   served), and a failed one ([`BackingError::Failed`]); see [`Backing::check_growth`],
    ///   which the caller runs first.
    ///
    /// It runs beside write-back passes (they write below `from`; its reads use a ring of their
    /// own), and records its holes only once it succeeded. On error the volume stays at `from`
    /// (the caller drops the new segment) and nothing it knows changed; a file may be left
    /// extended sparse, which every open and adoption accepts (longer than the volume). Calls
    /// for one volume must not overlap. Returns how long it took.
    pub fn grow(&self, memory: &Memory, from: u64, name: &str) -> Result<Duration, BackingError> {
        let started = Instant::now();
        let at = || self.path.clone();
        let to = memory.len() as u64;
        let (is_file, have) = self.measure_growth(from, to)?;
        let mut holes = Holes::default();
        if is_file {
            if have < to {
                // Synced: a power cut before the next FLUSH must not leave the file shorter than
                // the size the configuration (admin.toml, a reload's file) already says, which
                // the next start would refuse.
                extend(&self.file, to).and_then(|()| self.file.sync_data()).map_err(|source| BackingError::Resize {
                    path: at(),
                    size: to,
                    source,
                })?;
                // Past the old end: a hole, whether or not the file system can say so.
                holes.add(have.div_ceil(ALIGN) * ALIGN, to);
            }
            for &(s, e) in &find_holes(&self.file, from, have.min(to)).0 {
                holes.add(s, e);
            }
        }
        // What is not a hole is read.
        let mut data = Vec::new();
        let mut next = from;
        for &(s, e) in holes.within(from, to).iter().chain([(to, to)].iter()) {
            if next < s {
                data.push((next, s - next));
            }
            next = e;
        }
        let load_err = |source| BackingError::Load { name: name.to_owned(), path: at(), source };
        if !data.is_empty() {
            let mut ring = Ring::new(DEPTH).map_err(|source| BackingError::Ring { path: at(), source })?;
            read(&mut ring, self.file.as_raw_fd(), memory, &data, name).map_err(load_err)?;
        }
        let loaded: u64 = data.iter().map(|&(_, len)| len).sum();
        let mut guard = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        // Anything recorded past `from` (by an earlier growth the volume did not keep) is
        // replaced by what was found now.
        guard.1.remove(from, u64::MAX);
        for &(s, e) in &holes.0 {
            guard.1.add(s, e);
        }
        drop(guard);
        let took = started.elapsed();
        tracing::info!(
            volume = name,
            path = %self.path.display(),
            direct = self.direct,
            "backing store grown to {}: {} loaded, {} sparse, in {:.3} s",
            rblk_proto::Bytes(to),
            rblk_proto::Bytes(loaded),
            rblk_proto::Bytes(holes.bytes()),
            took.as_secs_f64()
        );
        Ok(took)
    }

    /// Writes `ranges` of `memory` to the backing store, waits for every write, then
    /// fdatasyncs ([`Backing::apply`] of stores).
    pub fn flush(&self, memory: &Memory, ranges: &[(u64, u64)]) -> io::Result<()> {
        let jobs: Vec<Job> = ranges.iter().map(|&(offset, len)| Job::Store(offset, len)).collect();
        self.apply(memory, &jobs)
    }

    /// Carries out a write-back pass's `jobs` in order (consecutive stores as one transfer;
    /// see [`Job`] and the module docs on holes), then fdatasyncs. On failure the backing store
    /// is marked failed for good.
    pub fn apply(&self, memory: &Memory, jobs: &[Job]) -> io::Result<()> {
        if self.failed() {
            return Err(io::Error::other(format!("backing store {} failed earlier", self.path.display())));
        }
        let mut guard = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let (ring, holes) = &mut *guard;
        let fd = self.file.as_raw_fd();
        let mut result = Ok(());
        let mut rest = jobs;
        while let (Some(first), Ok(())) = (rest.first(), &result) {
            let stores = rest.iter().take_while(|j| matches!(j, Job::Store(..))).count();
            if stores == 0 {
                result = first.zero_memory(memory).and_then(|()| self.zero(ring, holes, memory, first));
                rest = &rest[1..];
                continue;
            }
            let ranges = rest[..stores].iter().map(|j| match *j {
                Job::Store(offset, len) => (offset, len),
                Job::Zero { .. } => (0, 0),
            });
            let ranges = holes.filter_stores(memory, coalesce(ranges, memory.len() as u64));
            result = ring.transfer(fd, memory, &ranges, Dir::Store, CHUNK, |_| {});
            rest = &rest[stores..];
        }
        let result = result.and_then(|()| ring.fdatasync(fd));
        if let Err(e) = &result {
            self.failed.store(true, Ordering::SeqCst);
            tracing::error!(path = %self.path.display(), error = %e, "write-back failed: the volume stops promising durability");
        }
        result
    }

    /// A [`Job::Zero`] on the backing store, whose memory is zero by now: the range punched
    /// (`FALLOC_FL_PUNCH_HOLE`, a hole from now on) or zeroed in place (`FALLOC_FL_ZERO_RANGE`,
    /// with `keep`). Where the file or device supports neither, the zeroed memory is written
    /// (never a bare `BLKDISCARD`, whose blocks need not read as zeros: the next load would
    /// serve whatever they hold).
    fn zero(&self, ring: &mut Ring, holes: &mut Holes, memory: &Memory, job: &Job) -> io::Result<()> {
        use nix::fcntl::{fallocate, FallocateFlags};
        let Job::Zero { offset, len, keep } = *job else { return Ok(()) };
        let how = if keep { FallocateFlags::FALLOC_FL_ZERO_RANGE } else { FallocateFlags::FALLOC_FL_PUNCH_HOLE };
        let (Ok(at), Ok(n)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Err(io::Error::other("a range beyond what the file offsets hold"));
        };
        match fallocate(&self.file, how | FallocateFlags::FALLOC_FL_KEEP_SIZE, at, n) {
            Ok(()) => {
                if keep {
                    holes.remove(offset, offset + len);
                } else {
                    holes.add(offset, offset + len);
                }
                Ok(())
            }
            Err(nix::errno::Errno::EOPNOTSUPP | nix::errno::Errno::EINVAL) => {
                tracing::debug!(path = %self.path.display(), "no fallocate here: writing the zeros");
                holes.remove(offset, offset + len);
                ring.transfer(self.file.as_raw_fd(), memory, &[(offset, len)], Dir::Store, CHUNK, |_| {})
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Bytes of the backing store known to be holes (for tests and the log).
    pub fn hole_bytes(&self) -> u64 {
        self.ring.lock().unwrap_or_else(|p| p.into_inner()).1.bytes()
    }
}

fn clear_nonblock(file: &File) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = OFlag::from_bits_retain(fcntl(file, FcntlArg::F_GETFL)?);
    fcntl(file, FcntlArg::F_SETFL(flags - OFlag::O_NONBLOCK))?;
    Ok(())
}

/// Takes an exclusive OFD lock on the whole of `file`, without waiting. It belongs to the open
/// file description: it goes when the last descriptor of it is closed, wherever that is.
fn claim(file: &File) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg};
    let whole =
        libc::flock { l_type: libc::F_WRLCK as _, l_whence: libc::SEEK_SET as _, l_start: 0, l_len: 0, l_pid: 0 };
    fcntl(file, FcntlArg::F_OFD_SETLK(&whole)).map(drop).map_err(io::Error::from)
}

/// Group commit of one volume's FLUSHes. A FLUSH adds its ranges to the next write-back pass
/// and waits for that pass to finish; one pass runs at a time, and each takes every range added
/// while the one before it ran. So concurrent FLUSHes share one pass instead of queueing a pass
/// each, and a FLUSH is covered by a pass that started after it arrived (a pass already running
/// when it arrives may have copied the memory before its writes were made).
#[derive(Debug, Default)]
pub struct Group {
    state: Mutex<GroupState>,
    finished: Condvar,
}

#[derive(Debug, Default)]
struct GroupState {
    /// The jobs of the FLUSHes (and DISCARDs) that wait for the next pass, in order.
    pending: Vec<Job>,
    /// Passes started and finished (pass `n` is the `n`th, from 1).
    started: u64,
    finished: u64,
    /// A runner ([`Group::run`]) is at work.
    running: bool,
    /// No pass starts ([`Group::hold`]): FLUSHes queue until [`Group::release`].
    held: bool,
    /// The first pass that failed, and why.
    failed: Option<(u64, String)>,
    /// Who to wake when pass `n` finished.
    wakers: Vec<(u64, Waker)>,
}

/// A FLUSH's place in its volume's [`Group`]: the pass that covers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

/// Pending ranges past which they are merged as they arrive (a flood of FLUSHes during a long
/// pass stays one short list).
const PENDING_MERGE: usize = 1024;

impl Group {
    fn state(&self) -> std::sync::MutexGuard<'_, GroupState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `jobs` to the next pass; `waker` is woken once that pass finished. Returns its
    /// ticket, and true when no runner is at work: then the caller must call [`Group::run`]
    /// (on a thread of its own, or its own thread).
    pub fn enqueue(&self, jobs: &[Job], waker: Option<Waker>) -> (Ticket, bool) {
        let mut st = self.state();
        st.pending.extend_from_slice(jobs);
        if st.pending.len() > PENDING_MERGE {
            st.pending = merge_stores(std::mem::take(&mut st.pending));
        }
        let ticket = st.started + 1;
        if let Some(w) = waker {
            st.wakers.push((ticket, w));
        }
        let start = !st.running && !st.held;
        st.running |= start;
        (Ticket(ticket), start)
    }

    /// Starts no more passes, and waits for the one running (if any) to finish: then no
    /// write-back of this group is under way until [`Group::release`]. FLUSHes that arrive
    /// meanwhile queue their ranges and wait. A daemon handing its volumes to a successor holds
    /// them, so that no FLUSH runs in both.
    pub fn hold(&self) {
        let mut st = self.state();
        st.held = true;
        while st.running {
            st = self.finished.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Undoes [`Group::hold`]. Returns true when FLUSHes queued meanwhile: then the caller
    /// must call [`Group::run`], as after [`Group::enqueue`].
    pub fn release(&self) -> bool {
        let mut st = self.state();
        st.held = false;
        let start = !st.running && !st.pending.is_empty();
        st.running |= start;
        start
    }

    /// Runs passes with `pass` while FLUSHes wait for one, then stops (the next
    /// [`enqueue`](Group::enqueue) asks for a new runner).
    pub fn run(&self, mut pass: impl FnMut(Vec<Job>) -> io::Result<()>) {
        let mut st = self.state();
        while !st.pending.is_empty() && !st.held {
            let ranges = std::mem::take(&mut st.pending);
            st.started += 1;
            let n = st.started;
            drop(st);
            let result = pass(ranges);
            st = self.state();
            st.finished = n;
            if let Err(e) = result {
                st.failed.get_or_insert((n, e.to_string()));
            }
            st.wakers.retain(|(t, w)| {
                let done = *t <= n;
                if done {
                    w.wake();
                }
                !done
            });
            self.finished.notify_all();
        }
        st.running = false;
        // A hold waits for this.
        self.finished.notify_all();
    }

    /// The outcome of the FLUSH holding `ticket`, once its pass finished.
    pub fn result(&self, ticket: Ticket) -> Option<io::Result<()>> {
        Self::outcome(&self.state(), ticket)
    }

    fn outcome(st: &GroupState, Ticket(t): Ticket) -> Option<io::Result<()>> {
        (st.finished >= t).then(|| match &st.failed {
            Some((n, why)) if *n <= t => Err(io::Error::other(why.clone())),
            _ => Ok(()),
        })
    }

    /// Waits for the pass that covers `ticket`.
    pub fn wait(&self, ticket: Ticket) -> io::Result<()> {
        let mut st = self.state();
        loop {
            if let Some(r) = Self::outcome(&st, ticket) {
                return r;
            }
            st = self.finished.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Passes started so far.
    pub fn passes(&self) -> u64 {
        self.state().started
    }
}

/// `jobs` with each run of consecutive stores coalesced ([`coalesce`]); zeroing jobs stay where
/// they were among them.
fn merge_stores(jobs: Vec<Job>) -> Vec<Job> {
    let mut out = Vec::with_capacity(jobs.len());
    let mut run: Vec<(u64, u64)> = Vec::new();
    let flush = |run: &mut Vec<(u64, u64)>, out: &mut Vec<Job>| {
        out.extend(coalesce(run.drain(..), u64::MAX).into_iter().map(|(o, l)| Job::Store(o, l)));
    };
    for job in jobs {
        match job {
            Job::Store(offset, len) => run.push((offset, len)),
            zero @ Job::Zero { .. } => {
                flush(&mut run, &mut out);
                out.push(zero);
            }
        }
    }
    flush(&mut run, &mut out);
    out
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

/// A test hook on FLUSH: holds write-back passes back, as a slow backing store would (while it
/// is held, a pass waits before it writes anything back; connections go on, FLUSHes arriving
/// meanwhile wait for the next pass), counts the passes, and records what every FLUSH answered
/// FLUSHED covered. With it, RAM volumes' FLUSHes go through write-back passes too (that write
/// nothing). Set it in [`Config::flush_hook`](crate::config::Config::flush_hook); the
/// initiator's tests use it to show that a FLUSH in flight stops nothing else, and that a FLUSH
/// completes only after write-backs that cover every write completed before it.
#[doc(hidden)]
#[derive(Debug, Clone, Default)]
pub struct FlushHook(Arc<(std::sync::Mutex<HookState>, std::sync::Condvar)>);

#[derive(Debug, Default)]
struct HookState {
    held: bool,
    waiting: usize,
    passes: u64,
    /// Per FLUSH answered FLUSHED: its `(start, end)` ranges, or None for the whole volume.
    answered: Vec<Option<Vec<(u64, u64)>>>,
}

impl FlushHook {
    fn state(&self) -> std::sync::MutexGuard<'_, HookState> {
        self.0 .0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds write-back passes from now on.
    pub fn hold(&self) {
        self.state().held = true;
    }

    /// Lets the waiting pass (and later ones) through.
    pub fn release(&self) {
        self.state().held = false;
        self.0 .1.notify_all();
    }

    /// FLUSHes waiting for their write-back now.
    pub fn waiting(&self) -> usize {
        self.state().waiting
    }

    /// Write-back passes started so far (held ones included).
    pub fn passes(&self) -> u64 {
        self.state().passes
    }

    /// What the FLUSHes answered FLUSHED so far covered, in the order they were answered.
    pub fn answered(&self) -> Vec<Option<Vec<(u64, u64)>>> {
        self.state().answered.clone()
    }

    /// A FLUSH waits for a write-back.
    pub(crate) fn arrived(&self) {
        self.state().waiting += 1;
    }

    /// A waiting FLUSH went unanswered (its connection ended).
    pub(crate) fn gone(&self) {
        let mut st = self.state();
        st.waiting = st.waiting.saturating_sub(1);
    }

    /// A pass starts: waits while held.
    pub(crate) fn pass(&self) {
        let mut st = self.state();
        st.passes += 1;
        while st.held {
            st = self.0 .1.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// A waiting FLUSH was answered: FLUSHED (`flushed`) covering `covered`, or an ERROR.
    pub(crate) fn answered_with(&self, covered: Option<Vec<(u64, u64)>>, flushed: bool) {
        let mut st = self.state();
        st.waiting = st.waiting.saturating_sub(1);
        if flushed {
            st.answered.push(covered);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `g`'s passes on a thread that says when a pass starts (`entered`) and finishes it
    /// only when told (`go`); the thread returns the passes' ranges.
    #[allow(clippy::type_complexity)]
    fn gated_runner(
        g: &std::sync::Arc<Group>,
    ) -> (std::thread::JoinHandle<Vec<Vec<Job>>>, std::sync::mpsc::Receiver<()>, std::sync::mpsc::Sender<()>) {
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        let g = std::sync::Arc::clone(g);
        let runner = std::thread::spawn(move || {
            let mut passes = Vec::new();
            g.run(|ranges| {
                passes.push(ranges);
                entered_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                Ok(())
            });
            passes
        });
        (runner, entered, go)
    }

    #[test]
    fn concurrent_flushes_share_the_next_pass() {
        let g = std::sync::Arc::new(Group::default());
        let (t1, start) = g.enqueue(&[Job::Store(0, 4096)], None);
        assert!(start, "nobody runs passes yet");
        let (runner, entered, go) = gated_runner(&g);
        entered.recv().unwrap();
        // Three FLUSHes arrive while pass 1 runs: none is covered by it, all share pass 2.
        let later: Vec<Ticket> = (1..4u64)
            .map(|i| {
                let (t, start) = g.enqueue(&[Job::Store(i * 4096, 4096)], None);
                assert!(!start, "a runner is at work");
                t
            })
            .collect();
        assert!(later.iter().all(|&t| t == later[0] && t != t1));
        assert!(g.result(t1).is_none() && g.result(later[0]).is_none());
        go.send(()).unwrap();
        assert!(g.wait(t1).is_ok());
        entered.recv().unwrap();
        assert!(g.result(later[0]).is_none(), "pass 2 still runs");
        go.send(()).unwrap();
        let passes = runner.join().unwrap();
        let stores = |r: &[(u64, u64)]| r.iter().map(|&(o, l)| Job::Store(o, l)).collect::<Vec<_>>();
        assert_eq!(passes, vec![stores(&[(0, 4096)]), stores(&[(4096, 4096), (8192, 4096), (12288, 4096)])]);
        assert_eq!(g.passes(), 2);
        assert!(later.iter().all(|&t| g.wait(t).is_ok()));
    }

    /// Catches a FLUSH that starts a write-back while its volume is being handed to a
    /// successor (both daemons would write the same ranges), and a hold that returns while a
    /// pass still runs or that loses the FLUSHes queued behind it.
    #[test]
    fn a_hold_waits_for_the_running_pass_and_starts_none() {
        let g = std::sync::Arc::new(Group::default());
        let (t1, start) = g.enqueue(&[Job::Store(0, 4096)], None);
        assert!(start);
        let (runner, entered, go) = gated_runner(&g);
        entered.recv().unwrap();
        let (held_tx, held) = std::sync::mpsc::channel();
        let holder = {
            let g = std::sync::Arc::clone(&g);
            std::thread::spawn(move || {
                g.hold();
                held_tx.send(()).unwrap();
            })
        };
        // Queued while pass 1 runs and the hold waits: the runner must not take it.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let (t2, start) = g.enqueue(&[Job::Store(4096, 4096)], None);
        assert!(!start);
        assert!(held.try_recv().is_err(), "the hold returned while pass 1 ran");
        go.send(()).unwrap();
        held.recv().unwrap();
        holder.join().unwrap();
        assert_eq!(runner.join().unwrap(), vec![vec![Job::Store(0, 4096)]], "a pass started under the hold");
        assert!(g.wait(t1).is_ok());
        assert!(g.result(t2).is_none());
        let (t3, start) = g.enqueue(&[Job::Store(8192, 4096)], None);
        assert!(!start, "no runner starts while held");
        assert!(g.release(), "FLUSHes queued under the hold need a runner");
        let mut passes = Vec::new();
        g.run(|r| {
            passes.push(r);
            Ok(())
        });
        assert_eq!(passes, vec![vec![Job::Store(4096, 4096), Job::Store(8192, 4096)]]);
        assert!(g.wait(t2).is_ok() && g.wait(t3).is_ok());
        assert!(!g.release(), "nothing queued: no runner needed");
    }

    #[test]
    fn a_failed_pass_fails_its_flushes_and_later_ones() {
        let g = Group::default();
        let (t1, _) = g.enqueue(&[Job::Store(0, 4096)], None);
        g.run(|_| Err(io::Error::other("disk gone")));
        let (t2, start) = g.enqueue(&[Job::Store(0, 4096)], None);
        assert!(start);
        g.run(|_| Ok(()));
        assert!(g.wait(t1).is_err());
        assert!(g.wait(t2).unwrap_err().to_string().contains("disk gone"));
    }

    #[test]
    fn holes_add_remove_and_within() {
        let mut h = Holes::default();
        h.add(8192, 12288);
        h.add(0, 4096);
        h.add(4096, 8192);
        assert_eq!(h.0, vec![(0, 12288)], "touching ranges merge");
        h.remove(4096, 8192);
        assert_eq!(h.0, vec![(0, 4096), (8192, 12288)]);
        h.add(20480, 24576);
        assert_eq!(h.within(2048, 22528), vec![(2048, 4096), (8192, 12288), (20480, 22528)]);
        assert_eq!(h.within(12288, 20480), vec![]);
        h.remove(0, 1 << 20);
        assert_eq!(h.bytes(), 0);
    }

    /// Catches a write-back that fills a hole with zeros (the blocks a discard gave back would
    /// come back at the next FLUSH or final flush), one that skips a block of a hole written
    /// since (data lost), and one that goes on skipping it once written.
    #[test]
    fn stores_skip_the_zero_blocks_of_holes_and_write_the_rest() {
        let mem = Memory::anonymous(64 << 10).unwrap();
        let mut h = Holes::default();
        h.add(8192, 32768);
        mem.write_at(16384 + 5, b"x").unwrap();
        let out = h.filter_stores(&mem, vec![(0, 65536)]);
        assert_eq!(out, vec![(0, 8192), (16384, 4096), (32768, 32768)]);
        assert_eq!(h.0, vec![(8192, 16384), (20480, 32768)], "the written block is no hole any more");
        assert_eq!(Holes::default().filter_stores(&mem, vec![(0, 4096)]), vec![(0, 4096)]);
    }

    /// The mechanism end to end on a file: a zeroing job punches (the file's blocks drop and
    /// `SEEK_HOLE` finds the hole at the next open), a whole-volume flush afterwards does not
    /// refill it, and a write inside it later is written back. Catches a punch that is not made
    /// (blocks stay), a flush that writes zeros into the hole, and holes not found at open (a
    /// restart's final flush would refill them).
    #[test]
    fn a_zeroing_job_punches_and_flushes_keep_the_hole() {
        use std::os::unix::fs::{FileExt as _, MetadataExt as _};
        let dir = std::env::temp_dir().join(format!("rblk-punch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("v.img");
        let _ = std::fs::remove_file(&path);
        let size = 4u64 << 20;
        std::fs::File::create(&path).unwrap().write_all_at(&vec![0xab; size as usize], 0).unwrap();
        let b = Backing::open(&path, size).unwrap();
        let mem = Memory::anonymous(size as usize).unwrap();
        b.load(&mem, "v").unwrap();
        assert_eq!(b.hole_bytes(), 0, "a fully written file has no holes");
        let blocks = || std::fs::metadata(&path).unwrap().blocks();
        let before = blocks();
        let (offset, len) = (1u64 << 20, 2u64 << 20);
        b.apply(&mem, &[Job::Store(0, 4096), Job::Zero { offset, len, keep: false }]).unwrap();
        assert!(mem.is_zero(offset as usize, len as usize).unwrap(), "the job zeroes memory");
        // Where tests run (ext4, the guest's tmpfs) punching works.
        let freed = (before - blocks()) * 512;
        assert!(freed >= len * 9 / 10, "punched {freed} of {len} bytes");
        b.flush(&mem, &[(0, size)]).unwrap();
        assert_eq!((before - blocks()) * 512, freed, "a whole flush filled the hole again");
        drop(b);
        let b = Backing::open(&path, size).unwrap();
        assert_eq!(b.hole_bytes(), len, "the hole is found at the next open");
        mem.write_at(offset as usize + 8192, b"new").unwrap();
        b.flush(&mem, &[(0, size)]).unwrap();
        let mut got = [0u8; 3];
        std::fs::File::open(&path).unwrap().read_exact_at(&mut got, offset + 8192).unwrap();
        assert_eq!(&got, b"new");
        assert_eq!(b.hole_bytes(), len - 4096);
        let _ = std::fs::remove_dir_all(dir);
    }

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

    /// Catches a backing file opened twice (a second daemon, or two volumes of one: each would
    /// overwrite the other's data with its own snapshot) and image files that others may read.
    #[test]
    fn a_backing_file_is_claimed_once_and_made_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("rblk-claim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("v.img");
        let first = Backing::open(&path, 1 << 20).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let err = Backing::open(&path, 1 << 20).unwrap_err();
        assert!(matches!(err, BackingError::InUse { .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains(&path.display().to_string()) && text.contains("in use by another process"), "{text}");
        // The claim goes with the open file description (and a child forked meanwhile holds it
        // until it execs: no Loop is made meanwhile).
        let _forks = FORKS.lock().unwrap_or_else(|p| p.into_inner());
        drop(first);
        Backing::open(&path, 1 << 20).expect("free again");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Held while `losetup` runs, and by a test that needs the last descriptor it drops to be
    /// the last one: a child shares the parent's open file descriptions until it execs.
    static FORKS: Mutex<()> = Mutex::new(());

    fn losetup(args: &[&std::ffi::OsStr]) -> std::process::Output {
        let _forks = FORKS.lock().unwrap_or_else(|p| p.into_inner());
        std::process::Command::new("losetup").args(args).output().unwrap()
    }

    /// A loop device over a 1 MiB file, detached on drop.
    struct Loop {
        dev: PathBuf,
        dir: PathBuf,
    }

    impl Loop {
        fn new(name: &str) -> Loop {
            use std::os::unix::fs::PermissionsExt as _;
            let dir = std::env::temp_dir().join(format!("rblk-loop-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
            let file = dir.join("disk");
            std::fs::File::create(&file).unwrap().set_len(1 << 20).unwrap();
            let out = losetup(&["--find".as_ref(), "--show".as_ref(), file.as_os_str()]);
            assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
            let dev = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
            Loop { dev, dir }
        }

        /// A node for the device in the loop's (root-owned, 0755) directory.
        fn node(&self, name: &str) -> PathBuf {
            use std::os::unix::fs::MetadataExt as _;
            let rdev = std::fs::metadata(&self.dev).unwrap().rdev();
            let node = self.dir.join(name);
            nix::sys::stat::mknod(
                &node,
                nix::sys::stat::SFlag::S_IFBLK,
                nix::sys::stat::Mode::from_bits_truncate(0o600),
                rdev,
            )
            .unwrap();
            node
        }
    }

    impl Loop {
        /// Gives the loop's file `len` bytes (`pattern` written from the old end, if any) and
        /// tells the device (`losetup -c`), as `lvextend` or `lvreduce` would change an LV.
        fn resize(&self, len: u64, pattern: Option<&[u8]>) {
            let file = self.dir.join("disk");
            let f = std::fs::File::options().write(true).open(&file).unwrap();
            let old = f.metadata().unwrap().len();
            f.set_len(len).unwrap();
            if let Some(p) = pattern {
                std::os::unix::fs::FileExt::write_all_at(&f, p, old).unwrap();
            }
            f.sync_all().unwrap();
            let out = losetup(&["-c".as_ref(), self.dev.as_os_str()]);
            assert!(out.status.success(), "losetup -c: {}", String::from_utf8_lossy(&out.stderr));
        }
    }

    impl Drop for Loop {
        fn drop(&mut self) {
            losetup(&["-d".as_ref(), self.dev.as_os_str()]);
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// Would catch a block device opened without `O_EXCL` (served while mounted or while
    /// another daemon serves it), and a `/dev/VG/LV`-style root-owned link refused.
    #[test]
    fn a_block_device_is_claimed_through_a_root_owned_link() {
        let lp = Loop::new("claim");
        std::fs::create_dir(lp.dir.join("vg")).unwrap();
        std::os::unix::fs::symlink(&lp.dev, lp.dir.join("vg/lv")).unwrap();
        let b = Backing::open(&lp.dir.join("vg/lv"), 1 << 20).expect("a root-owned link to a block device");
        let err = Backing::open(&lp.dev, 1 << 20).unwrap_err();
        assert!(matches!(err, BackingError::InUse { .. }), "{err}");
        drop(b);
        Backing::open(&lp.dev, 1 << 20).expect("free again");
    }

    /// Would catch the kind of a backing store decided before it is opened: a regular file
    /// when the path was looked at, swapped for a block device node before the open, would be
    /// opened without the block device's claim. The open must refuse what it did not check.
    #[test]
    fn a_block_device_swapped_in_after_the_check_is_refused() {
        let lp = Loop::new("swap");
        let path = lp.dir.join("v.img");
        std::fs::File::create(&path).unwrap().set_len(1 << 20).unwrap();
        let walked = rblk_fabric::trusted::walk(&path, rblk_fabric::trusted::Last::Any).unwrap();
        std::fs::rename(lp.node("node"), &path).unwrap();
        let err = Backing::open_walked(&walked, &path, 1 << 20, true).unwrap_err();
        assert!(rblk_fabric::Chain(&err).to_string().contains("replaced while being opened"), "{err}");
        // Opened afresh it is a block device, and claimed.
        let b = Backing::open(&path, 1 << 20).unwrap();
        assert!(b.file().metadata().unwrap().file_type().is_block_device());
        assert!(matches!(Backing::open(&lp.dev, 1 << 20).unwrap_err(), BackingError::InUse { .. }));
    }

    /// Would catch a backing path followed through a symlink that another user planted in a
    /// directory they may write to: the daemon would serve (and write on FLUSH) whatever it
    /// points at.
    #[test]
    fn a_planted_link_is_not_followed() {
        use std::os::unix::fs::PermissionsExt as _;
        let lp = Loop::new("planted");
        let victim = lp.dir.join("victim");
        std::fs::write(&victim, vec![7u8; 1 << 20]).unwrap();
        let public = lp.dir.join("public");
        std::fs::create_dir(&public).unwrap();
        std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o1777)).unwrap();
        for (name, to) in [("v.img", &victim), ("d.img", &lp.dev)] {
            let link = public.join(name);
            std::os::unix::fs::symlink(to, &link).unwrap();
            std::os::unix::fs::lchown(&link, Some(4321), None).unwrap();
            let err = Backing::open(&link, 1 << 20).unwrap_err();
            assert!(matches!(err, BackingError::Untrusted { .. }), "{err}");
            let text = rblk_fabric::Chain(&err).to_string();
            assert!(text.contains("symlink owned by uid 4321"), "{text}");
        }
        assert_eq!(std::fs::read(&victim).unwrap(), vec![7u8; 1 << 20]);
    }

    /// Issue 44's growth: a volume's memory as it grows, `old` bytes in a first segment of a
    /// reservation, then the view after a second segment of `added` bytes (zeros) is mapped
    /// right after it: (the view before, the view after).
    fn grown_memory(old: u64, added: u64) -> (Arc<Memory>, Arc<Memory>) {
        let r = rblk_fabric::Reservation::new(64 << 20).unwrap();
        let first = Memory::memfd_in("rblk-test:grow0", old as usize, &r).unwrap();
        let before = Memory::span(&r, vec![Arc::clone(&first)]).unwrap();
        let second = Memory::memfd_in("rblk-test:grow1", added as usize, &r).unwrap();
        (before, Memory::span(&r, vec![first, second]).unwrap())
    }

    /// A directory of this test's own under the temporary directory, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir = std::env::temp_dir().join(format!("rblk-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn blocks(path: &Path) -> u64 {
        std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(path).unwrap())
    }

    fn read_file(path: &Path, offset: u64, len: usize) -> Vec<u8> {
        let mut got = vec![0u8; len];
        std::os::unix::fs::FileExt::read_exact_at(&std::fs::File::open(path).unwrap(), &mut got, offset).unwrap();
        got
    }

    fn read_memory(memory: &Memory, offset: u64, len: usize) -> Vec<u8> {
        let mut got = vec![0u8; len];
        memory.read_at(offset as usize, &mut got).unwrap();
        got
    }

    /// Catches a growth that does not extend the backing file (the first write-back past the
    /// old end, or the next load, would fail), one that writes the added range (space taken on
    /// every grow, and a full disk would refuse it), one that leaves the added range out of the
    /// holes (a whole-volume flush, as the final one is, would allocate it with zeros), a
    /// write-back past the old end landing at the wrong offset, and a successor's adoption that
    /// refuses the grown size or forgets the hole. On the O_DIRECT path and the buffered one.
    #[test]
    fn a_file_grows_sparse_and_writes_back_past_the_old_end() {
        let (from, to) = (1u64 << 20, 4u64 << 20);
        for direct in [true, false] {
            let dir = Scratch::new(&format!("grow-file-{direct}"));
            let path = dir.0.join("v.img");
            std::fs::write(&path, vec![0xa5; from as usize]).unwrap();
            let b = if direct { Backing::open(&path, from) } else { Backing::open_buffered(&path, from) }.unwrap();
            assert_eq!(b.direct(), direct, "the path under test");
            let (before, after) = grown_memory(from, to - from);
            b.load(&before, "v").unwrap();
            let allocated = blocks(&path);
            b.grow(&after, from, "v").unwrap();
            assert_eq!(std::fs::metadata(&path).unwrap().len(), to, "extended to the new size");
            assert_eq!(blocks(&path), allocated, "extended sparse: nothing written");
            assert_eq!(b.hole_bytes(), to - from, "the added range is a hole");
            assert!(after.is_zero(from as usize, (to - from) as usize).unwrap());
            assert_eq!(read_memory(&after, from - 4096, 4096), vec![0xa5; 4096], "the old range is untouched");
            // A whole flush, as the final one: the hole stays one.
            b.flush(&after, &[(0, to)]).unwrap();
            assert_eq!(blocks(&path), allocated, "a whole flush filled the added range");
            // A write past the old end lands where it belongs, and only its block is taken.
            let at = from + (2 << 20) + 100;
            after.write_at(at as usize, b"past the old end").unwrap();
            b.flush(&after, &[(at, 16)]).unwrap();
            assert_eq!(read_file(&path, at, 16), b"past the old end");
            assert_eq!(read_file(&path, at - 100, 100), vec![0; 100]);
            assert!(blocks(&path) - allocated <= 16, "one block written, not the range: {}", blocks(&path));
            assert_eq!(b.hole_bytes(), to - from - 4096);
            // A successor adopts the grown store at the grown size, its hole found again.
            let handed = b.file().try_clone().unwrap();
            let adopted = Backing::adopt(&path, handed, to, false).unwrap();
            assert_eq!(adopted.hole_bytes(), to - from - 4096);
            let again = Memory::anonymous(to as usize).unwrap();
            adopted.load(&again, "v").unwrap();
            assert_eq!(read_memory(&again, at, 16), b"past the old end");
        }
    }

    /// Catches a growth that reads nothing from a file the operator extended (its data in the
    /// added range would be lost at the next write-back of that range) or that cuts the file
    /// back to the volume's size; a shrink that is carried out; and a failed load that records
    /// holes or changes the file (the volume stays at its old size, and a second try works).
    #[test]
    fn a_file_extended_by_the_operator_is_loaded_and_never_shrunk() {
        let (from, to) = (1u64 << 20, 2u64 << 20);
        let dir = Scratch::new("grow-longer");
        let path = dir.0.join("v.img");
        std::fs::write(&path, vec![0x11; from as usize]).unwrap();
        let b = Backing::open(&path, from).unwrap();
        let (before, after) = grown_memory(from, to - from);
        b.load(&before, "v").unwrap();
        // The operator extends the file past the new size and writes into the added range.
        {
            let f = std::fs::File::options().write(true).open(&path).unwrap();
            f.set_len(3 << 20).unwrap();
            std::os::unix::fs::FileExt::write_all_at(&f, &[0x22; 8192], from + 4096).unwrap();
        }
        // Never shrunk: a smaller size is refused, naming both sizes.
        let err = b.grow(&Memory::anonymous(4096).unwrap(), from, "v").unwrap_err();
        assert!(matches!(err, BackingError::Shrink { size, to: 4096, .. } if size == from), "{err}");
        assert!(err.to_string().contains("is never shrunk: the volume holds 1048576 bytes, not 4096"), "{err}");
        let err = b.check_growth(from, from + 512).unwrap_err();
        assert!(matches!(err, BackingError::Unaligned { .. }), "{err}");
        assert!(err.to_string().ends_with("from 1048576 to 1049088 bytes: not whole 4 KiB blocks"), "{err}");
        // A read that fails half-way (as a failing disk's would): nothing recorded.
        crate::uring::FAIL_WAITS.set(1);
        let err = b.grow(&after, from, "v").unwrap_err();
        assert!(matches!(err, BackingError::Load { .. }), "{err}");
        assert!(rblk_fabric::Chain(&err).to_string().contains("loading volume v from"), "{err}");
        assert_eq!(b.hole_bytes(), 0, "no holes recorded by a failed growth");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 3 << 20);
        assert!(!b.failed(), "a failed growth is no failed write-back");
        // The caller's second try: a new segment.
        let (before, after) = grown_memory(from, to - from);
        b.load(&before, "v").unwrap();
        b.grow(&after, from, "v").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 3 << 20, "the file was cut back");
        assert_eq!(read_memory(&after, from + 4096, 8192), vec![0x22; 8192], "the operator's data");
        assert_eq!(read_memory(&after, from - 8, 8), vec![0x11; 8]);
        assert_eq!(b.hole_bytes(), to - from - 8192, "the rest of the added range is a hole");
        b.flush(&after, &[(0, to)]).unwrap();
        assert_eq!(read_file(&path, from + 4096, 8192), vec![0x22; 8192]);
    }

    /// Catches the one way rblk sizes backing files shortening one that is longer already.
    #[test]
    fn extending_never_shortens() {
        let dir = Scratch::new("extend");
        let path = dir.0.join("f");
        std::fs::write(&path, vec![7u8; 8192]).unwrap();
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        extend(&f, 4096).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), vec![7u8; 8192]);
        extend(&f, 16384).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 16384);
    }

    /// Catches a block device's growth before the device holds the new size (the volume would
    /// serve bytes the device cannot keep; refused, saying what to do, with nothing changed),
    /// a growth that does not load the added range (LVM does not zero new extents: the memory
    /// must hold what the device holds), one that writes back past the old end at the wrong
    /// offset, and a device that shrank while served grown anyway. Over a loop device resized
    /// with `losetup -c`, as an LV is by `lvextend`; O_DIRECT and buffered.
    #[test]
    fn a_block_device_grows_once_the_device_did() {
        let (from, to) = (1u64 << 20, 2u64 << 20);
        for direct in [true, false] {
            let lp = Loop::new(&format!("grow-{direct}"));
            let dev = lp.dev.clone();
            let b = if direct { Backing::open(&dev, from) } else { Backing::open_buffered(&dev, from) }.unwrap();
            assert_eq!(b.direct(), direct, "the path under test");
            let (before, after) = grown_memory(from, to - from);
            b.load(&before, "v").unwrap();
            let err = b.grow(&after, from, "v").unwrap_err();
            assert!(matches!(err, BackingError::DeviceTooSmall { have, size, .. } if have == from && size == to));
            let d = dev.display();
            let want = format!(
                "grow the device first, e.g. lvextend -L 2097152b {d}: {d} holds 1048576 bytes, the volume needs 2097152"
            );
            assert_eq!(err.to_string(), want);
            let early = b.check_growth(from, to).unwrap_err();
            assert_eq!(early.to_string(), want, "the check before a segment is placed refuses the same");
            assert!(after.is_zero(from as usize, (to - from) as usize).unwrap(), "nothing loaded");
            // The device grows, with bytes in its new extents (not zeroed, as LVM's are not).
            let pattern: Vec<u8> = (0..to - from).map(|i| (i / 4096 + i % 251) as u8 | 1).collect();
            lp.resize(to, Some(&pattern));
            b.check_growth(from, to).expect("the device holds the new size now");
            b.grow(&after, from, "v").unwrap();
            assert_eq!(read_memory(&after, from, pattern.len()), pattern, "the device's bytes, loaded");
            assert_eq!(b.hole_bytes(), 0, "a device has no holes");
            after.write_at((from + 12288) as usize, b"written back").unwrap();
            b.flush(&after, &[(from + 12288, 12)]).unwrap();
            assert_eq!(read_file(&lp.dir.join("disk"), from + 12288, 12), b"written back");
            // The device shrinks under the volume: its next growth is refused.
            lp.resize(from / 2, None);
            let (_, bigger) = grown_memory(to, from);
            let err = b.grow(&bigger, to, "v").unwrap_err();
            assert!(matches!(err, BackingError::TooSmall { have: 524288, size: 2097152, .. }), "{err}");
            assert!(err.to_string().contains(&format!("{d} holds 524288 bytes, less than the volume's 2097152")));
        }
    }

    /// Catches a growth that writes the added range (on a full file system it would fail, and
    /// anywhere it takes the space), and a final flush that fills the new hole with zeros (it
    /// would fail here with ENOSPC); a write-back that does not fit fails and marks the store
    /// failed, after which no growth is made. On a 1 MiB tmpfs in a mount namespace of the
    /// test's own (gone with its thread).
    #[test]
    fn a_full_disk_grows_sparse_and_fails_only_the_write_back() {
        use nix::mount::{mount, MsFlags};
        let dir = Scratch::new("grow-full");
        let mnt = dir.0.clone();
        std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).expect("a mount namespace (root)");
            mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>).unwrap();
            mount(Some("rblk-test"), &mnt, Some("tmpfs"), MsFlags::empty(), Some("size=1m,mode=0700")).unwrap();
            let path = mnt.join("v.img");
            let (from, to) = (512u64 << 10, 8u64 << 20);
            let b = Backing::open(&path, from).unwrap();
            let (before, after) = grown_memory(from, to - from);
            before.write_at(0, &vec![0x33; from as usize]).unwrap();
            b.flush(&before, &[(0, from)]).unwrap();
            b.grow(&after, from, "v").expect("a sparse growth on a nearly full file system");
            assert_eq!(std::fs::metadata(&path).unwrap().len(), to);
            b.flush(&after, &[(0, to)]).expect("a final flush that leaves the hole alone fits");
            after.write_at(from as usize, &vec![0x44; 2 << 20]).unwrap();
            let err = b.flush(&after, &[(from, 2 << 20)]).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::StorageFull, "{err}");
            assert!(b.failed());
            let (_, more) = grown_memory(to, 1 << 20);
            let err = b.grow(&more, to, "v").unwrap_err();
            assert!(matches!(err, BackingError::Failed { .. }), "{err}");
            assert_eq!(std::fs::metadata(&path).unwrap().len(), to, "nothing changed");
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    }

    /// Catches a final flush that still covers the size the volume was loaded at once it grew
    /// (what was written past the old end would be lost at the restart), one that fills the
    /// added hole, and a restart at the grown size that refuses the store or presents another
    /// instance (the identity is kept with the grown store's fingerprint). Grows the way
    /// `Volume::grow` does: a new segment after the last, the store grown, the view replaced.
    #[test]
    fn after_a_growth_the_final_flush_and_a_restart_cover_the_new_size() {
        let (from, to) = (1u64 << 20, 3u64 << 20);
        let dir = Scratch::new("grow-restart");
        let path = dir.0.join("v.img");
        std::fs::write(&path, vec![0x5a; from as usize]).unwrap();
        std::fs::create_dir(dir.0.join("state")).unwrap();
        let identity = crate::identity::Store::new(Some(dir.0.join("state")));
        let spec = |size| crate::config::VolumeSpec { name: "v".into(), size, path: Some(path.clone()) };
        let mut v = crate::registry::load_volume(&spec(from), 4096, &identity).unwrap();
        let r = Arc::clone(v.memory().reservation().unwrap());
        let mut segments = v.segments();
        segments.push(Memory::memfd_in("rblk-volume:v", (to - from) as usize, &r).unwrap());
        let after = Memory::span(&r, segments).unwrap();
        let b = v.backing.take().unwrap();
        b.grow(&after, from, "v").unwrap();
        after.write_at(from as usize + 5000, b"grown data").unwrap();
        let grown = crate::volume::Volume::adopt("v", after, 4096, Some(b), v.instance, true);
        let instance = v.instance;
        drop(v);
        let allocated = blocks(&path);
        crate::registry::final_flush(&identity, &grown);
        assert_eq!(read_file(&path, from + 5000, 10), b"grown data");
        assert!(blocks(&path) - allocated <= 16, "the final flush filled the hole: {}", blocks(&path));
        drop(grown);
        let again = crate::registry::load_volume(&spec(to), 4096, &identity).unwrap();
        assert_eq!(again.size(), to);
        assert_eq!(again.instance, instance, "the same instance after a clean restart at the grown size");
        assert_eq!(read_memory(&again.memory(), from + 5000, 10), b"grown data");
        assert_eq!(read_memory(&again.memory(), from - 10, 10), vec![0x5a; 10]);
        assert_eq!(again.backing.as_ref().unwrap().hole_bytes(), to - from - 4096);
    }

    /// Catches a growth whose on-disk state, if the daemon is killed right after it (the file
    /// extended, nothing written back, the config or the handover state at either size),
    /// cannot be opened again at the old size or at the new one, or loses the old bytes.
    #[test]
    fn a_store_grown_then_abandoned_opens_at_either_size() {
        let (from, to) = (1u64 << 20, 2u64 << 20);
        let dir = Scratch::new("grow-killed");
        let path = dir.0.join("v.img");
        std::fs::write(&path, vec![0x66; from as usize]).unwrap();
        let b = Backing::open(&path, from).unwrap();
        let (before, after) = grown_memory(from, to - from);
        b.load(&before, "v").unwrap();
        b.grow(&after, from, "v").unwrap();
        drop(b);
        for size in [from, to] {
            let b = Backing::open(&path, size).unwrap();
            let m = Memory::anonymous(size as usize).unwrap();
            b.load(&m, "v").unwrap();
            assert_eq!(read_memory(&m, 0, from as usize), vec![0x66; from as usize], "at {size} bytes");
            assert!(m.is_zero(from as usize, (size - from) as usize).unwrap());
            assert_eq!(b.hole_bytes(), size - from);
        }
    }
}
