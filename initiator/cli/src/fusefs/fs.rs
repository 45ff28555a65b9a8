//! The FUSE filesystem: a root directory with one file, the volume.

use std::ffi::{OsStr, OsString};
use std::os::fd::AsFd as _;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner,
    MountOption, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, WriteFlags,
};

use rblk_initiator::{Chain, Engine, EngineStats, InvalidReason, Volume};

use super::{Error, Result};

const ROOT: INodeNo = INodeNo::ROOT;
const FILE: INodeNo = INodeNo(2);
/// How long the kernel may cache names and attributes. They change only when the volume grows,
/// and then the file's inode is invalidated at once ([`follow_growth`]).
const TTL: Duration = Duration::from_secs(60);
/// Largest read or write request the kernel sends (it splits larger ones).
const MAX_REQUEST: u32 = 1 << 20;
/// Housekeeping period: the target sends keepalives every 2 s.
const TICK: Duration = rblk_initiator::KEEPALIVE_INTERVAL;

/// How to mount.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// FUSE worker threads, each serving one request at a time through its own queue pair.
    pub queues: u32,
    /// The file's name; by default the volume's name (`volume` if that is no valid file name).
    pub file_name: Option<String>,
    /// How long one request may wait for its RDMA operations.
    pub io_timeout: Duration,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions { queues: 1, file_name: None, io_timeout: rblk_initiator::DEFAULT_IO_TIMEOUT }
    }
}

/// A mounted volume. See the [module documentation](super) for threads and cleanup.
#[derive(Debug)]
pub struct Mounted {
    mountpoint: PathBuf,
    file: PathBuf,
    /// Taken by `wait`.
    vf: Option<Arc<Engine>>,
    session: Option<fuser::BackgroundSession>,
    ticker: Option<Ticker>,
    /// Tells the kernel the file's new size when the volume grows.
    follower: Option<Follower>,
    errors: Arc<AtomicU64>,
}

/// The thread that passes a grown volume's size on to the kernel ([`follow_growth`]).
#[derive(Debug)]
struct Follower {
    /// `None` stops it; the engine's resize hook sends `Some(size)`.
    tx: mpsc::Sender<Option<u64>>,
    thread: JoinHandle<()>,
}

/// The housekeeping thread, and how to stop it.
#[derive(Debug)]
struct Ticker {
    /// Closed to stop it: the thread sleeps on the other end.
    stop: UnixStream,
    thread: JoinHandle<()>,
}

/// How a mount ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Whether the volume is RAM only (the last FLUSH only ordered).
    pub volatile: bool,
    /// Requests answered with an error (EIO and the like) while mounted.
    pub errors: u64,
    /// What the file did.
    pub stats: EngineStats,
}

/// Mounts `vol` at `mountpoint` (an existing directory) as one file, and serves it from
/// `opts.queues` threads until it is unmounted. Returns once the kernel has the filesystem: the
/// file can be used at once.
pub fn mount(vol: Volume, mountpoint: &Path, opts: &MountOptions) -> Result<Mounted> {
    let bad = |reason: String| Error::Mountpoint { path: mountpoint.to_owned(), reason };
    match std::fs::metadata(mountpoint) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(bad("not a directory".into())),
        Err(e) => return Err(bad(e.to_string())),
    }
    let mountpoint = mountpoint.canonicalize().map_err(|e| bad(e.to_string()))?;
    if let Some(m) = super::find_mount(&mountpoint)?.filter(super::MountEntry::is_rblk) {
        return Err(bad(format!("{} is already mounted there", m.source)));
    }
    let name = opts.file_name.clone().unwrap_or_else(|| file_name(vol.uri().volume()));
    if !valid_name(&name) {
        return Err(bad(format!("{name:?} is not a valid file name")));
    }
    let source = vol.uri().to_string();
    let read_only = vol.is_read_only();
    let vf = Arc::new(Engine::new(vol, opts.queues)?.with_io_timeout(opts.io_timeout));
    let errors = Arc::new(AtomicU64::new(0));
    let fs = Fs::new(Arc::clone(&vf), OsString::from(&name), Arc::clone(&errors));

    let mut options = vec![
        MountOption::FSName(source),
        MountOption::Subtype("rblk".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoExec,
        MountOption::NoAtime,
    ];
    options.push(if read_only { MountOption::RO } else { MountOption::RW });
    let mut config = fuser::Config::default();
    config.mount_options = options;
    config.n_threads = Some(opts.queues.max(1) as usize);
    config.clone_fd = opts.queues > 1;
    let session = fuser::Session::new(fs, &mountpoint, &config)
        .and_then(fuser::Session::spawn)
        .map_err(|source| Error::Fuse { path: mountpoint.clone(), source })?;

    let ticker = UnixStream::pair().and_then(|(stop, stopped)| {
        let vf = Arc::clone(&vf);
        // Keepalives and the queues' control messages, and rdma_cm's events (a lost target),
        // while the session threads wait for requests.
        let thread =
            std::thread::Builder::new().name("rblk-keepalive".into()).spawn(move || housekeeping(&vf, &stopped))?;
        Ok((stop, thread))
    });
    let ticker = match ticker {
        Ok((stop, thread)) => Some(Ticker { stop, thread }),
        Err(e) => {
            tracing::warn!(error = %e, "no housekeeping thread: idle sessions rely on the target's patience");
            None
        }
    };
    let file = mountpoint.join(&name);
    let follower = follow_growth(&vf, session.notifier(), file.clone());
    tracing::info!(mountpoint = %mountpoint.display(), file = %file.display(), queues = opts.queues, "mounted");
    Ok(Mounted { mountpoint, file, vf: Some(vf), session: Some(session), ticker, follower, errors })
}

/// Makes the kernel see the file's new size as soon as the volume grows, instead of after the
/// attribute [`TTL`]: the engine's resize hook (on an I/O thread, which must not block) hands
/// the size to a thread of its own, which invalidates the file's inode and then stats the file.
/// The stat is what makes the kernel fetch the attributes again (from a FUSE worker thread) and
/// update the inode's size: a loop device's `LOOP_SET_CAPACITY` (`losetup -c`) reads that size
/// without asking the filesystem on kernels before 6.15.
fn follow_growth(vf: &Engine, notifier: fuser::Notifier, file: PathBuf) -> Option<Follower> {
    let (tx, rx) = mpsc::channel::<Option<u64>>();
    let thread = std::thread::Builder::new().name("rblk-grow".into()).spawn(move || {
        while let Ok(Some(size)) = rx.recv() {
            if let Err(e) = notifier.inval_inode(FILE, 0, 0) {
                tracing::warn!(
                    error = %e, size,
                    "the volume grew, but the kernel was not told: stat shows the new size within a minute"
                );
                continue;
            }
            match std::fs::metadata(&file) {
                Ok(m) => tracing::info!(file = %file.display(), size = m.len(), "the volume grew: the file follows"),
                Err(e) => {
                    tracing::warn!(file = %file.display(), error = %e, "the volume grew, but its file cannot be read")
                }
            }
        }
    });
    match thread {
        Ok(thread) => {
            let hook = tx.clone();
            vf.on_resize(move |size| {
                let _ = hook.send(Some(size));
            });
            Some(Follower { tx, thread })
        }
        Err(e) => {
            tracing::warn!(
                error = %e,
                "no thread to follow a growing volume: the file shows a new size within a minute of a grow"
            );
            None
        }
    }
}

/// Bytes of an access of `len` at `offset` that lie inside a file of `size` bytes.
fn clamp(size: u64, offset: u64, len: usize) -> usize {
    if offset >= size {
        return 0;
    }
    len.min(usize::try_from(size - offset).unwrap_or(usize::MAX))
}

/// Every [`TICK`], [`Engine::tick`]; between ticks, [`Engine::idle_wait`] on `stopped` (readable
/// once [`Ticker::stop`] is closed) and the session's rdma_cm channels.
fn housekeeping(vf: &Engine, stopped: &UnixStream) {
    let mut warned = false;
    let mut next_tick = Instant::now() + TICK;
    loop {
        let periodic = rblk_initiator::periodic_checks();
        let deadline = if periodic { next_tick } else { Instant::now() + Duration::from_secs(3600) };
        let result = match vf.idle_wait(stopped.as_fd(), deadline) {
            Ok(true) => return,
            // rdma_cm's events were taken.
            Ok(false) if !periodic || Instant::now() < next_tick => Ok(()),
            Ok(false) => {
                next_tick = Instant::now() + TICK;
                vf.tick()
            }
            Err(e) => {
                // Not a busy loop if the wait itself keeps failing.
                std::thread::sleep(Duration::from_millis(100));
                Err(e)
            }
        };
        match result {
            Ok(()) => warned = false,
            Err(e) if !warned => {
                tracing::error!(error = %Chain(&e), "the rblk session failed: requests fail with EIO");
                warned = true;
            }
            Err(_) => {}
        }
    }
}

impl Mounted {
    /// The mount point (canonical).
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The file that is the volume.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The volume as a file, as the filesystem serves it.
    pub fn volume_file(&self) -> &Engine {
        self.vf.as_ref().expect("a Mounted holds its file until wait")
    }

    /// Waits until the filesystem is unmounted (by [`unmount`](super::unmount), `rblk umount`,
    /// fusermount3 -u or umount), then flushes what was written since the last flush and closes
    /// the session.
    pub fn wait(mut self) -> Result<Summary> {
        let ended = self.session.take().map_or(Ok(()), join_session);
        self.stop_ticker();
        let errors = self.errors.load(Ordering::Relaxed);
        let (closed, stats) = match self.vf.take().map(Arc::try_unwrap) {
            Some(Ok(vf)) => {
                let stats = vf.stats();
                (vf.close(), stats)
            }
            // Never expected: the session thread is gone, and its reference with it.
            Some(Err(vf)) => (vf.flush(), vf.stats()),
            None => (Ok(true), EngineStats::default()),
        };
        ended.map_err(|source| Error::Session { path: self.mountpoint.clone(), source })?;
        let volatile = closed?;
        Ok(Summary { volatile, errors, stats })
    }

    /// Unmounts (detaching loop devices backed by the file first, see [`super::unmount`]), then
    /// [`wait`](Self::wait)s.
    pub fn unmount(self) -> Result<Summary> {
        super::unmount(&self.mountpoint)?;
        self.wait()
    }

    fn stop_ticker(&mut self) {
        if let Some(Ticker { stop, thread }) = self.ticker.take() {
            drop(stop);
            let _ = thread.join();
        }
        if let Some(Follower { tx, thread }) = self.follower.take() {
            let _ = tx.send(None);
            let _ = thread.join();
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        self.stop_ticker();
        if self.session.is_some() {
            if let Err(e) = super::unmount(&self.mountpoint) {
                tracing::warn!(error = %e, "unmounting on drop failed");
            } else if let Some(session) = self.session.take() {
                let _ = join_session(session);
            }
        }
    }
}

/// Waits for the FUSE session to end (the filesystem was unmounted).
///
/// fuser's handle must not be dropped: its drop unmounts the mount point once more, after a
/// check that takes POLLERR on /dev/fuse (which means the kernel has already unmounted) for
/// "still mounted" (fuser 0.17 and 0.18), so it would unmount whatever was mounted at the same
/// path meanwhile, such as the next `rblk mount` there. The handle is leaked instead: one
/// /dev/fuse descriptor of a finished connection per mount, until the process exits.
fn join_session(mut session: fuser::BackgroundSession) -> std::io::Result<()> {
    let panicked = || std::io::Error::other("the FUSE session thread panicked");
    let Ok(stand_in) = std::thread::Builder::new().spawn(|| Ok(())) else {
        // No thread for the swap: join through the handle (and risk that second unmount).
        return session.join();
    };
    let thread = std::mem::replace(&mut session.guard, stand_in);
    std::mem::forget(session);
    thread.join().unwrap_or_else(|_| Err(panicked()))
}

/// The volume's name as a file name: itself when it is one, else `volume`.
fn file_name(volume: &str) -> String {
    if valid_name(volume) {
        volume.to_owned()
    } else {
        "volume".to_owned()
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0']) && name.len() <= 255
}

/// The filesystem.
#[derive(Debug)]
struct Fs {
    vf: Arc<Engine>,
    name: OsString,
    uid: u32,
    gid: u32,
    mounted_at: SystemTime,
    errors: Arc<AtomicU64>,
}

impl Fs {
    fn new(vf: Arc<Engine>, name: OsString, errors: Arc<AtomicU64>) -> Fs {
        let uid = nix::unistd::getuid().as_raw();
        let gid = nix::unistd::getgid().as_raw();
        Fs { vf, name, uid, gid, mounted_at: SystemTime::now(), errors }
    }

    fn attr(&self, ino: INodeNo) -> FileAttr {
        let t = self.mounted_at;
        let (kind, perm, size, nlink) = if ino == ROOT {
            (FileType::Directory, 0o755, 0, 2)
        } else if self.vf.is_read_only() {
            (FileType::RegularFile, 0o444, self.vf.size(), 1)
        } else {
            (FileType::RegularFile, 0o644, self.vf.size(), 1)
        };
        FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: self.vf.block_size(),
            flags: 0,
        }
    }

    /// An error for the kernel; logs the first few and then every thousandth.
    fn fail(&self, op: &str, offset: u64, len: usize, e: &rblk_initiator::Error) -> Errno {
        let errno = Errno::from_i32(e.errno());
        let n = self.errors.fetch_add(1, Ordering::Relaxed);
        if n < 10 || n.is_multiple_of(1000) {
            tracing::warn!(op, offset, len, error = %Chain(e), errors = n + 1, "request failed");
        }
        errno
    }

    /// Zeroes `start..end` of the volume (nothing when empty): with `unmap` and a target that
    /// discards, its whole blocks by a DISCARD and the partial ones at its edges by writing
    /// zeros; otherwise all by WRITE_ZEROES (done by the target where it can).
    fn zero(&self, start: u64, end: u64, unmap: bool) -> std::result::Result<(), Errno> {
        if end <= start {
            return Ok(());
        }
        let fail = |e: rblk_initiator::Error| self.fail("fallocate", start, (end - start) as usize, &e);
        let bs = u64::from(self.vf.block_size().max(1));
        let (inner_start, inner_end) = (start.div_ceil(bs) * bs, end / bs * bs);
        if !unmap || !self.vf.discards() || inner_end <= inner_start {
            return self.vf.write_zeroes(start, end - start).map_err(fail);
        }
        for (s, e) in [(start, inner_start), (inner_end, end)] {
            if e > s {
                self.vf.write_zeroes(s, e - s).map_err(fail)?;
            }
        }
        self.vf.discard(inner_start, inner_end - inner_start).map_err(fail)
    }

    fn flush_file(&self, op: &str) -> std::result::Result<(), Errno> {
        self.vf.flush().map(drop).map_err(|e| self.fail(op, 0, 0, &e))
    }
}

impl fuser::Filesystem for Fs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Large requests become large RDMA operations; ignore a kernel that caps them lower.
        let _ = config.set_max_write(MAX_REQUEST);
        // O_TRUNC arrives with open (and is ignored, as by a block device) instead of as a
        // truncating setattr; direct I/O from aio callers (loop) is split in parallel; mmap of
        // the direct_io file works through the page cache where the kernel allows it.
        for flag in [InitFlags::FUSE_ATOMIC_O_TRUNC, InitFlags::FUSE_ASYNC_DIO, InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP] {
            let _ = config.add_capabilities(flag);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == ROOT && name == self.name {
            reply.entry(&TTL, &self.attr(FILE), Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match ino {
            ROOT | FILE => reply.attr(&TTL, &self.attr(ino)),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if ino != ROOT && ino != FILE {
            return reply.error(Errno::ENOENT);
        }
        // A volume's size, owner and mode are fixed; touching its times is harmless.
        if mode.is_some() || uid.is_some() || gid.is_some() {
            return reply.error(Errno::EPERM);
        }
        match size {
            Some(s) if ino != FILE || s != self.vf.size() => reply.error(Errno::EINVAL),
            _ => reply.attr(&TTL, &self.attr(ino)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        if self.vf.is_read_only() && flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        // Fewer bytes at the end of the file, none past it.
        let len = clamp(self.vf.size(), offset, size as usize);
        if len == 0 {
            return reply.data(&[]);
        }
        let mut buf = vec![0; len];
        match self.vf.read_at(&mut buf, offset) {
            Ok(()) => reply.data(&buf),
            Err(e) => reply.error(self.fail("read", offset, size as usize, &e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        // A write that starts at or past the end is refused; one that runs past it is cut short.
        let len = clamp(self.vf.size(), offset, data.len()).max(usize::from(data.is_empty()));
        if len == 0 && !data.is_empty() {
            let e = rblk_initiator::Error::Invalid {
                what: "write",
                offset,
                len: data.len() as u64,
                reason: InvalidReason::OutOfRange { size: self.vf.size() },
            };
            return reply.error(self.fail("write", offset, data.len(), &e));
        }
        if data.is_empty() {
            return reply.written(0);
        }
        match self.vf.write_at(&data[..len], offset) {
            Ok(()) => reply.written(len as u32),
            Err(e) => reply.error(self.fail("write", offset, data.len(), &e)),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // Every close: writes made through this file become durable before close returns.
        match self.flush_file("flush") {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.flush_file("fsync") {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        if ino != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [(ROOT, FileType::Directory, OsStr::new(".")), (ROOT, FileType::Directory, OsStr::new(".."))];
        let all = entries.into_iter().chain([(FILE, FileType::RegularFile, self.name.as_os_str())]);
        for (i, (ino, kind, name)) in all.enumerate().skip(offset as usize) {
            if reply.add(ino, i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let bs = self.vf.block_size();
        reply.statfs(self.vf.size() / u64::from(bs), 0, 0, 2, 0, bs, 255, bs);
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        match ino {
            FILE if self.vf.is_read_only() && mask.contains(fuser::AccessFlags::W_OK) => reply.error(Errno::EROFS),
            ROOT | FILE => reply.ok(),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        // Plain or keep-size allocation inside the volume succeeds (every byte of it is there).
        // PUNCH_HOLE (with KEEP_SIZE, as Linux requires) zeroes the range, past the end cut
        // off: its whole blocks by a DISCARD where the target has it (a loop device's discards
        // and fstrim come this way), the partial ones at its edges by writing zeros. ZERO_RANGE
        // zeroes it, the blocks kept allocated.
        const KEEP_SIZE: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH_HOLE: i32 = libc::FALLOC_FL_PUNCH_HOLE;
        const ZERO_RANGE: i32 = libc::FALLOC_FL_ZERO_RANGE;
        let size = self.vf.size();
        let end = offset.checked_add(length);
        let result = match mode {
            _ if ino != FILE => Err(Errno::EISDIR),
            m if m & !(KEEP_SIZE | PUNCH_HOLE | ZERO_RANGE) != 0 => Err(Errno::EOPNOTSUPP),
            m if m & PUNCH_HOLE != 0 && (m & KEEP_SIZE == 0 || m & ZERO_RANGE != 0) => Err(Errno::EOPNOTSUPP),
            m if m & PUNCH_HOLE != 0 => self.zero(offset, end.unwrap_or(u64::MAX).min(size), true),
            _ if end.is_none_or(|e| e > size) => Err(Errno::EFBIG),
            m if m & ZERO_RANGE != 0 => self.zero(offset, end.unwrap_or(size), false),
            _ => Ok(()),
        };
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    // Quiet refusals of what one fixed file does not have (fuser's defaults log a warning).
    fn getxattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS);
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EPERM);
    }

    fn mkdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, _mode: u32, _umask: u32, reply: ReplyEntry) {
        reply.error(Errno::EPERM);
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EPERM);
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EPERM);
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EPERM);
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: fuser::ReplyCreate,
    ) {
        reply.error(Errno::EPERM);
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: fuser::ReplyLseek,
    ) {
        // SEEK_DATA/SEEK_HOLE: the kernel then treats the whole file as data.
        reply.error(Errno::ENOSYS);
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        // The kernel falls back to reads and writes.
        reply.error(Errno::ENOSYS);
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names() {
        assert_eq!(file_name("vol0"), "vol0");
        assert_eq!(file_name(".."), "volume");
        assert_eq!(file_name("a/b"), "volume");
        assert!(!valid_name(""));
    }
}
