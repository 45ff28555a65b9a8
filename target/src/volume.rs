//! The volume store: each volume's bytes live in one shared mapping of a sealed memfd
//! ([`Volume::memory`], named `rblk-volume:NAME`), registered once per device for the sessions
//! with memory windows ([`Volume::region`]) and once per session for the others; a durable volume
//! also has a [`Backing`] store. A daemon hands its volumes to a successor by their memfds (see
//! [`crate::handover`]): the successor maps the same pages ([`Volume::adopt`]).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

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
    /// its segments, which sit in address space reserved to grow in ([`reserve_for`]).
    pub memory: Arc<Memory>,
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
    /// The registration memory windows are bound to, by device (see [`Volume::region`]).
    regions: Mutex<HashMap<String, Arc<Registration>>>,
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
    let reservation = Reservation::new(usize::try_from(reserve_for(size)).unwrap_or(usize::MAX))?;
    let first = Memory::memfd_in(&memfd_name(name), size as usize, &reservation)?;
    Memory::span(&reservation, vec![first])
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
            memory,
            block_size,
            backing: None,
            instance: VolumeId(rblk_fabric::random()),
            writeback: Group::default(),
            zeroed: Zeroed::default(),
            opens: Mutex::default(),
            regions: Mutex::default(),
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
            memory,
            block_size,
            backing: Some(backing),
            instance: VolumeId(rblk_fabric::random()),
            writeback: Group::default(),
            zeroed: Zeroed::default(),
            opens: Mutex::default(),
            regions: Mutex::default(),
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
            memory,
            block_size,
            backing,
            instance,
            writeback: Group::default(),
            zeroed: Zeroed::default(),
            opens: Mutex::new(Opens { written, ..Opens::default() }),
            regions: Mutex::default(),
        }
    }

    /// Its memory segments, one sealed memfd each (one until volumes grow, issue 44): what a
    /// handover passes.
    pub fn segments(&self) -> &[Arc<Memory>] {
        self.memory.segments()
    }

    /// The address space reserved for it, and how much of it its segments use.
    pub fn reserved(&self) -> (u64, u64) {
        self.memory.reservation().map_or((0, 0), |r| (r.len() as u64, r.used() as u64))
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

    /// The volume's one registration in `pd` (the target's window domain of its device), with
    /// no remote access of its own: windows bound to QPs grant that ([`Access::BIND_ONLY`]).
    /// Registered at the first OPEN with windows on the device and kept while the volume is
    /// served, so a session costs one window per QP, whatever the volume's size.
    pub fn region(&self, pd: &Pd, counters: &Arc<Counters>) -> rblk_fabric::Result<Arc<Registration>> {
        let mut regions = self.regions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = regions.get(pd.device()) {
            return Ok(Arc::clone(r));
        }
        let started = std::time::Instant::now();
        let mr = pd.register(&self.memory, Access::BIND_ONLY)?;
        tracing::info!(
            volume = %self.name,
            device = pd.device(),
            "registered {} for memory windows in {:.0} ms",
            rblk_proto::Bytes(self.size()),
            started.elapsed().as_secs_f64() * 1e3
        );
        let r = Arc::new(Registration::new(mr, Arc::clone(counters)));
        regions.insert(pd.device().to_owned(), Arc::clone(&r));
        Ok(r)
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
                Some(b) => b.apply(&self.memory, &jobs),
                None => jobs.iter().try_for_each(|job| job.zero_memory(&self.memory)),
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
        self.memory.len() as u64
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
        let fd = v.segments()[0].fd().expect("a volume's memory is a memfd");
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        assert_eq!(link.to_string_lossy(), "/memfd:rblk-volume:vol-a (deleted)");
        let seals = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GET_SEALS).unwrap();
        let want = nix::fcntl::SealFlag::F_SEAL_SHRINK | nix::fcntl::SealFlag::F_SEAL_GROW;
        assert_eq!(seals & want.bits(), want.bits());
        assert_eq!(v.size(), 1 << 20);
        // Issue 44: in address space reserved for growth, the view over its one segment.
        assert_eq!(v.reserved(), (reserve_for(1 << 20), 1 << 20));
        assert_eq!((v.memory.addr(), v.memory.len()), (v.segments()[0].addr(), 1 << 20));
    }

    /// Catches a reservation that leaves a volume no room to grow, or one so large that a
    /// few thousand volumes would exhaust the address space (x86-64 gives a process 128 TiB).
    #[test]
    fn the_reservation_leaves_room_to_grow_within_bounds() {
        assert_eq!(reserve_for(1 << 20), 64 << 30, "at least 64 GiB");
        assert_eq!(reserve_for(16 << 30), 128 << 30, "8 times the size");
        assert_eq!(reserve_for(1 << 40), 4 << 40, "at most 4 TiB");
        assert_eq!(reserve_for(8 << 40), 8 << 40, "never less than the size");
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
        v.memory.read_at(4096, &mut got).unwrap();
        assert_eq!(&got, b"old");
        v.memory.write_at(8192, b"new").unwrap();
        v.backing.as_ref().unwrap().flush(&v.memory, &[(8192, 3)]).unwrap();
        let mut on_disk = [0u8; 3];
        std::fs::File::open(&path).unwrap().read_exact_at(&mut on_disk, 8192).unwrap();
        assert_eq!(&on_disk, b"new");
        drop(v);
        let _ = std::fs::remove_dir_all(dir);
    }
}
