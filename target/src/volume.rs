//! The volume store: each volume's bytes live in one shared mapping of a sealed memfd
//! ([`Volume::memory`], named `rblk-volume:NAME`), registered once per device for the sessions
//! with memory windows ([`Volume::region`]) and once per session for the others; a durable volume
//! also has a [`Backing`] store. A daemon hands its volumes to a successor by their memfds (see
//! [`crate::handover`]): the successor maps the same pages ([`Volume::adopt`]).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};

use rblk_fabric::{Access, Memory, Mr, Pd, Reservation};
use rblk_proto::{OpenMode, VolumeId};

use crate::counters::Counters;
use crate::persist::{Backing, BackingError, Group, Job, Ticket};

/// Why a volume could not be created or loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// Its memory could not be mapped.
    #[error("cannot map the volume's memory")]
    Memory(#[source] rblk_fabric::Error),
    /// Its backing store could not be opened or read.
    #[error(transparent)]
    Backing(#[from] BackingError),
}

/// One RAM volume.
#[derive(Debug)]
pub struct Volume {
    /// Name initiators open it by.
    pub name: String,
    /// Its bytes (never borrowed as a slice: NICs write it): one view ([`Memory::span`]) over
    /// its segments, which sit in address space reserved to grow in ([`reserve_for`]);
    /// replaced by a wider one when the volume grows ([`Volume::grow`]).
    memory: RwLock<Arc<Memory>>,
    /// Block size in bytes.
    pub block_size: u32,
    /// The backing store of a durable volume; None for RAM volumes.
    pub backing: Option<Backing>,
    /// This instance's identity, sent in OPENED: random at creation; a durable volume's is
    /// replaced by the one kept across a clean shutdown (see [`crate::identity`]).
    pub instance: VolumeId,
    /// Its FLUSHes' write-back passes (see [`Volume::write_back`]).
    writeback: Group,
    /// Bytes DISCARDs and WRITE_ZEROES zeroed in it, for the metrics.
    pub zeroed: Zeroed,
    /// Open sessions by mode, for exclusivity.
    opens: Mutex<Opens>,
    /// The registrations memory windows are bound to, by device, one per segment (see
    /// [`Volume::region`]).
    regions: Mutex<HashMap<String, Vec<Arc<Registration>>>>,
    /// Serializes grows ([`Volume::grow`]).
    growing: Mutex<()>,
}

/// Bytes a volume's DISCARDs and WRITE_ZEROES zeroed (counted when answered).
#[derive(Debug, Default)]
pub struct Zeroed {
    /// By DISCARD.
    pub discarded: std::sync::atomic::AtomicU64,
    /// By WRITE_ZEROES.
    pub zeroed: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Default)]
struct Opens {
    exclusive: Option<u64>,
    writers: usize,
    /// A session with write access opened since the last complete write-back (the load is
    /// one): only then may the memory differ from the backing store.
    written: bool,
}

/// The name of a volume's memfd, as `/proc/PID/fd` shows it (after `memfd:`).
fn memfd_name(volume: &str) -> String {
    format!("rblk-volume:{volume}")
}

/// The address space reserved for a volume of `size` bytes: room to grow to 8 times its size,
/// at least 64 GiB and at most 4 TiB (never less than the size). Address space only: nothing
/// is committed (issue 44's growth maps segments into it).
pub fn reserve_for(size: u64) -> u64 {
    size.saturating_mul(8).clamp(64 << 30, 4 << 40).max(size)
}

/// A new volume's memory: its first segment (zeroed, sealed) in a reservation of its own, and
/// the view over it.
fn fresh_memory(name: &str, size: u64) -> rblk_fabric::Result<Arc<Memory>> {
    let want = usize::try_from(reserve_for(size)).unwrap_or(usize::MAX);
    let reservation = reserve_shrinking(want, size, Reservation::new)?;
    let first = Memory::memfd_in(&memfd_name(name), size as usize, &reservation)?;
    Memory::span(&reservation, vec![first])
}

/// `reserve(len)` from `want` bytes down, halving while the half still holds `size`: a process
/// whose address space is smaller than the reservation (`ulimit -v`; valgrind's, which refuses
/// 64 GiB in one piece) still serves the volume, with less room to grow (a grow past it fails
/// with [`GrowError::Reservation`]). The last error when even the smallest try fails.
fn reserve_shrinking<R>(
    want: usize,
    size: u64,
    mut reserve: impl FnMut(usize) -> rblk_fabric::Result<R>,
) -> rblk_fabric::Result<R> {
    let mut len = want;
    loop {
        match reserve(len) {
            Ok(r) => return Ok(r),
            Err(e) if (len / 2) as u64 >= size && len / 2 > 0 => {
                tracing::debug!(len, error = %rblk_fabric::Chain(&e), "reserving address space: trying half");
                len /= 2;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Why a volume could not grow ([`Volume::grow`]); nothing changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GrowError {
    /// The new size is not larger (a shrink is refused elsewhere, before this).
    #[error("{size} bytes is not larger than its {was}")]
    NotLarger {
        /// Its size.
        was: u64,
        /// The size asked for.
        size: u64,
    },
    /// The new size is not a multiple of the block size.
    #[error("{size} bytes is not a multiple of its block size, {block_size}")]
    Unaligned {
        /// The size asked for.
        size: u64,
        /// The volume's block size.
        block_size: u32,
    },
    /// It already has the most segments a volume can have.
    #[error(
        "it has grown {} times already, the most a served volume can (it has {max} memory segments): \
         to grow it further, remove it and add it again at the new size (a durable volume keeps its data; \
         a RAM volume's is lost), or restart the daemon with the new size in its configuration",
        max - 1
    )]
    TooManySegments {
        /// [`rblk_proto::MAX_SEGMENTS`].
        max: usize,
    },
    /// Its address space has no room for the added range.
    #[error(
        "its reserved address space ({reserved} bytes) holds at most {most} bytes, not {size}: \
         remove it and add it again at the new size, or restart the daemon with the new size"
    )]
    Reservation {
        /// The address space reserved for it.
        reserved: u64,
        /// The largest size it can grow to.
        most: u64,
        /// The size asked for.
        size: u64,
    },
    /// It was not made in a reservation (cannot happen to a served volume).
    #[error("its memory has no address space reserved to grow in")]
    NoReservation,
    /// The added segment could not be made.
    #[error("cannot map the added memory")]
    Memory(#[source] rblk_fabric::Error),
    /// A durable volume's backing store could not grow with it.
    #[error(transparent)]
    Backing(BackingError),
}

/// Why an open was refused.
#[derive(Debug, PartialEq, Eq)]
pub struct Busy(pub String);

impl Volume {
    /// Maps a zeroed RAM volume of `size` bytes.
    pub fn new(name: &str, size: u64, block_size: u32) -> rblk_fabric::Result<Volume> {
        let memory = fresh_memory(name, size)?;
        Ok(Volume {
            name: name.to_owned(),
            memory: RwLock::new(memory),
            block_size,
            backing: None,
            instance: VolumeId(rblk_fabric::random()),
            writeback: Group::default(),
            zeroed: Zeroed::default(),
            opens: Mutex::default(),
            regions: Mutex::default(),
            growing: Mutex::default(),
        })
    }

    /// A durable volume: maps it and loads it from `backing`.
    pub fn durable(name: &str, size: u64, block_size: u32, backing: Backing) -> Result<Volume, LoadError> {
        let memory = fresh_memory(name, size).map_err(LoadError::Memory)?;
        let took = backing.load(&memory, name).map_err(|source| BackingError::Load {
            name: name.to_owned(),
            path: backing.path().to_owned(),
            source,
        })?;
        tracing::info!(
            volume = name,
            path = %backing.path().display(),
            direct = backing.direct(),
            "loaded {} in {:.2} s ({:.0} MiB/s)",
            rblk_proto::Bytes(size),
            took.as_secs_f64(),
            (size >> 20) as f64 / took.as_secs_f64().max(1e-6)
        );
        Ok(Volume {
            name: name.to_owned(),
            memory: RwLock::new(memory),
            block_size,
            backing: Some(backing),
            instance: VolumeId(rblk_fabric::random()),
            writeback: Group::default(),
            zeroed: Zeroed::default(),
            opens: Mutex::default(),
            regions: Mutex::default(),
            growing: Mutex::default(),
        })
    }

    /// A volume a predecessor daemon handed over: its `memory` (the view over the same pages,
    /// each segment mapped after the one before by [`Memory::from_memfd_in`]), its backing
    /// store, its instance identity, and whether a session could have written it since it was
    /// last written back whole ([`Volume::written`]), which decides what a final flush writes.
    pub fn adopt(
        name: &str,
        memory: Arc<Memory>,
        block_size: u32,
        backing: Option<Backing>,
        instance: VolumeId,
        written: bool,
    ) -> Volume {
        Volume {
            name: name.to_owned(),
            memory: RwLock::new(memory),
            block_size,
            backing,
            instance,
            writeback: Group::default(),
            zeroed: Zeroed::default(),
            opens: Mutex::new(Opens { written, ..Opens::default() }),
            regions: Mutex::default(),
            growing: Mutex::default(),
        }
    }

    /// Its bytes now: the view over every segment (a grow replaces it; a holder of an older
    /// view keeps reaching the range it had, which never moves).
    pub fn memory(&self) -> Arc<Memory> {
        Arc::clone(&self.memory.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Its memory segments, one sealed memfd each, in order: what a handover passes, and what
    /// is registered (and windowed) one by one.
    pub fn segments(&self) -> Vec<Arc<Memory>> {
        self.memory().segments().to_vec()
    }

    /// How many segments it has (without copying their list: every connection's turn asks).
    pub fn segment_count(&self) -> usize {
        self.memory.read().unwrap_or_else(|p| p.into_inner()).segments().len()
    }

    /// Where each segment starts in the volume, in bytes, in order.
    pub fn segment_offsets(&self) -> Vec<u64> {
        let mut at = 0;
        self.segments()
            .iter()
            .map(|m| {
                let start = at;
                at += m.len() as u64;
                start
            })
            .collect()
    }

    /// The address space reserved for it, and how much of it its segments use.
    pub fn reserved(&self) -> (u64, u64) {
        self.memory().reservation().map_or((0, 0), |r| (r.len() as u64, r.used() as u64))
    }

    /// Grows the volume to `size` bytes while it is served: a new sealed memfd segment for the
    /// added range, mapped right after the last one in the volume's reserved address space (so
    /// nothing already in the volume moves or is copied, and every registration and window
    /// over the old segments stays valid), loaded from a durable volume's backing store, and a
    /// new view over all segments. The caller then registers the segment where sessions need it
    /// and tells the sessions ([`crate::registry::Shared::grow_volume`]). Refuses a size that
    /// is not larger, not a multiple of the block size, a ninth segment, or more than the
    /// reservation holds; on any error nothing changed.
    pub fn grow(&self, size: u64) -> Result<Arc<Memory>, GrowError> {
        let _one = self.growing.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.memory();
        let was = old.len() as u64;
        if size <= was {
            return Err(GrowError::NotLarger { was, size });
        }
        if !size.is_multiple_of(u64::from(self.block_size)) {
            return Err(GrowError::Unaligned { size, block_size: self.block_size });
        }
        let mut segments = old.segments().to_vec();
        if segments.len() >= rblk_proto::MAX_SEGMENTS {
            return Err(GrowError::TooManySegments { max: rblk_proto::MAX_SEGMENTS });
        }
        let reservation = old.reservation().cloned().ok_or(GrowError::NoReservation)?;
        let room = (reservation.len() - reservation.used()) as u64;
        if size - was > room {
            return Err(GrowError::Reservation { reserved: reservation.len() as u64, most: was + room, size });
        }
        let added = usize::try_from(size - was).map_err(|_| GrowError::Reservation {
            reserved: reservation.len() as u64,
            most: was + room,
            size,
        })?;
        // What the backing store refuses without reading, before address space is taken.
        if let Some(b) = &self.backing {
            b.check_growth(was, size).map_err(GrowError::Backing)?;
        }
        let segment = Memory::memfd_in(&memfd_name(&self.name), added, &reservation).map_err(GrowError::Memory)?;
        segments.push(segment);
        let view = Memory::span(&reservation, segments).map_err(GrowError::Memory)?;
        // A durable volume's added range holds what its backing store holds there (a file
        // extended sparse: zeros; a block device the operator grew: its bytes), before any
        // initiator can reach it.
        if let Some(b) = &self.backing {
            b.grow(&view, was, &self.name).map_err(GrowError::Backing)?;
        }
        *self.memory.write().unwrap_or_else(|p| p.into_inner()) = Arc::clone(&view);
        tracing::info!(
            volume = %self.name,
            "grew from {} to {} ({} segments)",
            rblk_proto::Bytes(was),
            rblk_proto::Bytes(size),
            view.segments().len()
        );
        Ok(view)
    }

    /// Starts no more write-back passes and waits for the running one (see [`Group::hold`]).
    pub fn hold_write_back(&self) {
        self.writeback.hold();
    }

    /// Undoes [`Volume::hold_write_back`]: FLUSHes queued meanwhile get their pass.
    pub fn release_write_back(self: &Arc<Self>) {
        if self.writeback.release() {
            self.spawn_passes(None);
        }
    }

    /// The registration of the volume's segment `index` in `pd` (the target's window domain of
    /// its device), with no remote access of its own: windows bound to QPs grant that
    /// ([`Access::BIND_ONLY`]). A type 2B window binds within one registration, so each segment
    /// has its own. Registered at the first OPEN with windows on the device (or when the volume
    /// grows while such sessions are open) and kept while the volume is served, so a session
    /// costs one window per QP and segment, whatever the volume's size.
    pub fn region(&self, pd: &Pd, counters: &Arc<Counters>, index: usize) -> rblk_fabric::Result<Arc<Registration>> {
        let segments = self.segments();
        let Some(segment) = segments.get(index) else {
            return Err(rblk_fabric::Error::Map {
                len: 0,
                source: std::io::Error::other(format!("volume {} has no segment {index}", self.name)),
            });
        };
        let mut regions = self.regions.lock().unwrap_or_else(|p| p.into_inner());
        let on_device = regions.entry(pd.device().to_owned()).or_default();
        // Registered in order: a later segment's registration implies every earlier one's.
        while on_device.len() <= index {
            let i = on_device.len();
            let started = std::time::Instant::now();
            let mr = pd.register(&segments[i], Access::BIND_ONLY)?;
            tracing::info!(
                volume = %self.name,
                device = pd.device(),
                segment = i,
                "registered {} for memory windows in {:.0} ms",
                rblk_proto::Bytes(segments[i].len() as u64),
                started.elapsed().as_secs_f64() * 1e3
            );
            on_device.push(Arc::new(Registration::new(mr, Arc::clone(counters))));
        }
        debug_assert!(Arc::ptr_eq(on_device[index].mr().memory(), segment));
        Ok(Arc::clone(&on_device[index]))
    }

    /// The devices the volume is registered on for memory windows ([`Volume::region`]), by
    /// name: what a handover names for the successor to register ahead.
    pub fn registered_on(&self) -> Vec<String> {
        let mut devices: Vec<String> = self.regions.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
        devices.sort_unstable();
        devices
    }

    /// Runs `jobs` (a FLUSH's ranges to write back, a DISCARD's or WRITE_ZEROES' range to zero:
    /// [`Job`]) in the next write-back pass (group commit, see [`Group`]) on a thread of its own,
    /// started unless one runs passes already, so that no connection's thread waits for the
    /// backing store or for zeroing memory; `waker` is woken once the pass covering them
    /// finished ([`Volume::written_back`]). A RAM volume's passes only zero. `before_pass` (a test
    /// hook) runs at the start of every pass.
    pub fn write_back(
        self: &Arc<Self>,
        jobs: &[Job],
        waker: rblk_fabric::Waker,
        before_pass: Option<crate::persist::FlushHook>,
    ) -> Ticket {
        let (ticket, start) = self.writeback.enqueue(jobs, Some(waker));
        if start {
            self.spawn_passes(before_pass);
        }
        ticket
    }

    fn spawn_passes(self: &Arc<Self>, before_pass: Option<crate::persist::FlushHook>) {
        let v = Arc::clone(self);
        let hook = before_pass.clone();
        let spawned =
            std::thread::Builder::new().name("rblk-writeback".into()).spawn(move || v.run_passes(hook.as_ref()));
        if let Err(e) = spawned {
            tracing::warn!(volume = %self.name, error = %e, "no thread for the write-back: it runs on this thread");
            self.run_passes(before_pass.as_ref());
        }
    }

    /// The outcome of the write-back holding `ticket`, once it finished.
    pub fn written_back(&self, ticket: Ticket) -> Option<std::io::Result<()>> {
        self.writeback.result(ticket)
    }

    /// Write-back passes started so far (each may serve many FLUSHes).
    pub fn write_back_passes(&self) -> u64 {
        self.writeback.passes()
    }

    fn run_passes(&self, before_pass: Option<&crate::persist::FlushHook>) {
        self.writeback.run(|jobs| {
            if let Some(hook) = before_pass {
                hook.pass();
            }
            match &self.backing {
                Some(b) => b.apply(&self.memory(), &jobs),
                None => jobs.iter().try_for_each(|job| job.zero_memory(&self.memory())),
            }
        });
    }

    /// True for RAM volumes (FLUSH is only an ordering point).
    pub fn is_volatile(&self) -> bool {
        self.backing.is_none()
    }

    /// True once writing back to the backing store failed: no durability promises any more.
    pub fn failed(&self) -> bool {
        self.backing.as_ref().is_some_and(Backing::failed)
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.memory.read().unwrap_or_else(|p| p.into_inner()).len() as u64
    }

    /// Records an open by `session`; refuses a second exclusive opener, and writers while an
    /// exclusive opener holds the volume.
    pub fn acquire(&self, session: u64, mode: OpenMode) -> Result<(), Busy> {
        let mut o = self.opens.lock().unwrap_or_else(|p| p.into_inner());
        match mode {
            OpenMode::ReadOnly => Ok(()),
            OpenMode::ReadWrite if o.exclusive.is_some() => {
                Err(Busy(format!("volume {} is open exclusively by another session", self.name)))
            }
            OpenMode::Exclusive if o.exclusive.is_some() || o.writers > 0 => Err(Busy(format!(
                "volume {} is already open {} by another session",
                self.name,
                if o.exclusive.is_some() { "exclusively" } else { "for writing" }
            ))),
            OpenMode::ReadWrite => {
                o.writers += 1;
                o.written = true;
                Ok(())
            }
            OpenMode::Exclusive => {
                o.exclusive = Some(session);
                o.written = true;
                Ok(())
            }
        }
    }

    /// Whether a session with write access opened since the volume was loaded or last written
    /// back whole ([`Volume::written_back_whole`]): if not, a final flush has nothing to write.
    pub fn written(&self) -> bool {
        self.opens.lock().unwrap_or_else(|p| p.into_inner()).written
    }

    /// The whole volume was written back while no session could write it.
    pub fn written_back_whole(&self) {
        let mut o = self.opens.lock().unwrap_or_else(|p| p.into_inner());
        o.written = o.writers > 0 || o.exclusive.is_some();
    }

    /// Undoes [`Volume::acquire`].
    pub fn release(&self, session: u64, mode: OpenMode) {
        let mut o = self.opens.lock().unwrap_or_else(|p| p.into_inner());
        match mode {
            OpenMode::ReadOnly => {}
            OpenMode::ReadWrite => o.writers = o.writers.saturating_sub(1),
            OpenMode::Exclusive => {
                if o.exclusive == Some(session) {
                    o.exclusive = None;
                }
            }
        }
    }
}

/// A registration of volume memory, counted in [`Counters::registrations`] and
/// [`Counters::pinned_bytes`] while it lives; dropping it deregisters.
#[derive(Debug)]
pub struct Registration {
    mr: Mr,
    counters: Arc<Counters>,
}

impl Registration {
    /// Counts `mr` in.
    pub fn new(mr: Mr, counters: Arc<Counters>) -> Registration {
        counters.registrations.fetch_add(1, Ordering::SeqCst);
        counters.pinned_bytes.fetch_add(mr.len() as u64, Ordering::SeqCst);
        Registration { mr, counters }
    }

    /// The registration.
    pub fn mr(&self) -> &Mr {
        &self.mr
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.counters.registrations.fetch_sub(1, Ordering::SeqCst);
        self.counters.pinned_bytes.fetch_sub(self.mr.len() as u64, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclusivity() {
        let v = Volume::new("v", 1 << 20, 4096).unwrap();
        v.acquire(1, OpenMode::Exclusive).unwrap();
        assert!(v.acquire(2, OpenMode::Exclusive).is_err());
        assert!(v.acquire(2, OpenMode::ReadWrite).is_err());
        v.acquire(2, OpenMode::ReadOnly).unwrap();
        v.release(1, OpenMode::Exclusive);
        v.acquire(2, OpenMode::ReadWrite).unwrap();
        assert!(v.acquire(3, OpenMode::Exclusive).is_err());
        v.release(2, OpenMode::ReadWrite);
        v.acquire(3, OpenMode::Exclusive).unwrap();
    }

    /// Catches a volume mapped anonymously again (its pages could not be handed to a successor,
    /// issue 28), or a memfd without its name or its size seals.
    #[test]
    fn a_volume_is_a_sealed_memfd_named_after_it() {
        use std::os::fd::AsRawFd;
        let v = Volume::new("vol-a", 1 << 20, 4096).unwrap();
        assert_eq!(v.segments().len(), 1, "one segment until volumes grow");
        let segments = v.segments();
        let fd = segments[0].fd().expect("a volume's memory is a memfd");
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        assert_eq!(link.to_string_lossy(), "/memfd:rblk-volume:vol-a (deleted)");
        let seals = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GET_SEALS).unwrap();
        let want = nix::fcntl::SealFlag::F_SEAL_SHRINK | nix::fcntl::SealFlag::F_SEAL_GROW;
        assert_eq!(seals & want.bits(), want.bits());
        assert_eq!(v.size(), 1 << 20);
        // Issue 44: in address space reserved for growth, the view over its one segment.
        assert_eq!(v.reserved(), (reserve_for(1 << 20), 1 << 20));
        assert_eq!((v.memory().addr(), v.memory().len()), (v.segments()[0].addr(), 1 << 20));
    }

    /// Catches a reservation that leaves a volume no room to grow, or one so large that a
    /// few thousand volumes would exhaust the address space (x86-64 gives a process 128 TiB).
    /// Catches a grow that copies or moves what the volume holds (the old segment's address
    /// and memfd must stay, with their bytes, so registrations and windows over them stay
    /// valid), a new segment not right after the last (the view would not be one range), and
    /// a grow past the eighth segment or to a size that is not larger or not whole blocks.
    #[test]
    fn a_volume_grows_by_a_segment_after_the_last_and_keeps_what_it_holds() {
        let v = Volume::new("grows", 1 << 20, 4096).unwrap();
        v.memory().write_at(4096, b"kept").unwrap();
        let first = v.segments()[0].clone();
        let inode = |m: &Memory| {
            use std::os::{fd::AsRawFd as _, unix::fs::MetadataExt as _};
            std::fs::metadata(format!("/proc/self/fd/{}", m.fd().unwrap().as_raw_fd())).unwrap().ino()
        };
        let first_inode = inode(&first);
        v.grow(3 << 20).unwrap();
        let segments = v.segments();
        assert_eq!(segments.len(), 2);
        assert!(Arc::ptr_eq(&segments[0], &first), "the first segment is the same memory");
        assert_eq!(inode(&segments[0]), first_inode, "and the same memfd");
        assert_eq!(segments[1].addr(), first.addr() + (1 << 20), "the new one follows it");
        assert_eq!((v.size(), v.segment_offsets()), (3 << 20, vec![0, 1 << 20]));
        let mut got = [0u8; 4];
        v.memory().read_at(4096, &mut got).unwrap();
        assert_eq!(&got, b"kept");
        // One view across the boundary: the CPU side reads and writes the volume as one range.
        v.memory().write_at((1 << 20) - 2, b"span").unwrap();
        let mut got = [0u8; 2];
        segments[1].read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"an");
        assert!(matches!(v.grow(3 << 20), Err(GrowError::NotLarger { .. })));
        assert!(matches!(v.grow((3 << 20) + 512), Err(GrowError::Unaligned { .. })));
        for i in 0..6u64 {
            v.grow((4 + i) << 20).unwrap();
        }
        assert_eq!(v.segments().len(), rblk_proto::MAX_SEGMENTS);
        let ninth = v.grow(64 << 20).unwrap_err();
        assert!(matches!(ninth, GrowError::TooManySegments { .. }));
        assert!(ninth.to_string().contains("remove it and add it again"), "{ninth}");
        assert_eq!(v.size(), 9 << 20, "a refused grow changes nothing");
    }

    #[test]
    fn the_reservation_leaves_room_to_grow_within_bounds() {
        assert_eq!(reserve_for(1 << 20), 64 << 30, "at least 64 GiB");
        assert_eq!(reserve_for(16 << 30), 128 << 30, "8 times the size");
        assert_eq!(reserve_for(1 << 40), 4 << 40, "at most 4 TiB");
        assert_eq!(reserve_for(8 << 40), 8 << 40, "never less than the size");
    }

    /// Catches a volume that fails to load where the address space cannot hold its whole
    /// reservation (valgrind's, `ulimit -v`), halving that goes below the volume's size, and a
    /// failure that is not the last try's.
    #[test]
    fn a_reservation_too_large_for_the_address_space_is_halved_down_to_the_size() {
        let map_err = |len: usize| rblk_fabric::Error::Map { len, source: std::io::Error::other("no room") };
        let mut tries = Vec::new();
        let got = reserve_shrinking(64 << 30, 1 << 30, |len| {
            tries.push(len);
            if len > 20 << 30 {
                Err(map_err(len))
            } else {
                Ok(len)
            }
        });
        assert_eq!(got.unwrap(), 16 << 30);
        assert_eq!(tries, [64 << 30, 32 << 30, 16 << 30]);
        tries.clear();
        let err = reserve_shrinking(64 << 30, 20 << 30, |len| -> rblk_fabric::Result<usize> {
            tries.push(len);
            Err(map_err(len))
        })
        .unwrap_err();
        assert_eq!(tries, [64 << 30, 32 << 30], "never below the size");
        assert!(matches!(err, rblk_fabric::Error::Map { len, .. } if len == 32 << 30), "{err}");
    }

    /// Catches a durable volume left on anonymous memory, or io_uring loads and write-backs
    /// (O_DIRECT where aligned) that do not work on the memfd's shared pages.
    #[test]
    fn a_durable_volume_is_a_memfd_loaded_and_written_back() {
        use std::os::unix::fs::FileExt as _;
        let dir = std::env::temp_dir().join(format!("rblk-memfd-volume-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("d.img");
        let b = Backing::open(&path, 1 << 20).unwrap();
        std::fs::File::options().write(true).open(&path).unwrap().write_all_at(b"old", 4096).unwrap();
        let v = Volume::durable("vol-d", 1 << 20, 4096, b).unwrap();
        assert!(v.segments()[0].fd().is_some(), "a durable volume's memory is a memfd");
        let mut got = [0u8; 3];
        v.memory().read_at(4096, &mut got).unwrap();
        assert_eq!(&got, b"old");
        v.memory().write_at(8192, b"new").unwrap();
        v.backing.as_ref().unwrap().flush(&v.memory(), &[(8192, 3)]).unwrap();
        let mut on_disk = [0u8; 3];
        std::fs::File::open(&path).unwrap().read_exact_at(&mut on_disk, 8192).unwrap();
        assert_eq!(&on_disk, b"new");
        drop(v);
        let _ = std::fs::remove_dir_all(dir);
    }
}
