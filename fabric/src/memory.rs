//! Memory the process owns and may register for RDMA: anonymous mappings, and shared mappings
//! of sealed memfds (volumes, so that their pages can one day be handed to a successor daemon).
//!
//! A NIC (or, in the in-memory fabric, another thread) may write this memory at any time, so it
//! is never borrowed as `&[u8]` or `&mut [u8]`. Bytes move in and out with explicit copies through
//! raw pointers, in the spirit of vm-memory's volatile slices.
//!
//! Never punch holes in, `MADV_DONTNEED` or `MADV_REMOVE` memory that may be registered: the
//! registration keeps the old pages pinned for the NIC while the CPU faults in new ones, so the
//! two would silently see different bytes.

use std::fs::File;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};

use crate::{Error, Result};

/// A populated mapping: anonymous ([`Memory::anonymous`]) or of a sealed memfd
/// ([`Memory::memfd`]). Cheap to share: hold it in an `Arc`.
#[derive(Debug)]
pub struct Memory {
    ptr: NonNull<u8>,
    len: usize,
    // Owns the mapping; dropped (munmap) after every registration of it is gone, because each
    // registration holds an `Arc<Memory>`.
    _map: Mapping,
    // The memfd the mapping shows; None for anonymous memory.
    memfd: Option<File>,
}

/// Who unmaps a [`Memory`].
#[derive(Debug)]
enum Mapping {
    /// memmap2, where the kernel placed it.
    // Held for its drop (munmap).
    Own(#[allow(dead_code)] memmap2::MmapMut),
    /// In a [`Reservation`]: given back to it (mapped `PROT_NONE` again, never left unmapped
    /// for another mapping to land in) when the memory is dropped ([`Memory`]'s `Drop`).
    Reserved(Arc<Reservation>),
    /// A view over consecutive segments of one reservation ([`Memory::span`]): it maps nothing
    /// itself and keeps the segments (and so their mappings) alive.
    Span(Vec<Arc<Memory>>),
}

impl Drop for Memory {
    fn drop(&mut self) {
        if !matches!(self._map, Mapping::Reserved(_)) {
            return;
        }
        let Some(len) = NonZeroUsize::new(self.len) else { return };
        // SAFETY: `ptr..ptr + len` is this segment's range inside its reservation, which is alive
        // (`_map` holds it, and fields drop after this) and reserved for it alone; nothing uses
        // the segment any more (every registration of it holds the `Memory`, so all are gone).
        // MAP_FIXED replaces the segment's pages with inaccessible ones in one call, so the range
        // stays reserved. On failure the segment stays mapped until the reservation's own
        // munmap: a leak of address space, never a use of freed memory.
        let placed = unsafe {
            nix::sys::mman::mmap_anonymous(
                NonZeroUsize::new(self.ptr.as_ptr() as usize),
                len,
                nix::sys::mman::ProtFlags::PROT_NONE,
                nix::sys::mman::MapFlags::MAP_PRIVATE
                    | nix::sys::mman::MapFlags::MAP_FIXED
                    | nix::sys::mman::MapFlags::MAP_NORESERVE,
            )
        };
        match placed {
            // The last segment placed (a grow that failed after placing it) frees its range
            // for the next: otherwise a gap would stay, and no later segment could follow the
            // one before it.
            Ok(_) => {
                if let Mapping::Reserved(r) = &self._map {
                    r.unplace(self.ptr.as_ptr() as usize, len.get());
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, bytes = len.get(), "cannot give a segment's address range back to its reservation");
            }
        }
    }
}

/// Address space reserved for a volume that may grow (issue 44): its segments are mapped one
/// after the other inside it ([`Memory::memfd_in`], [`Memory::from_memfd_in`]), so the volume's
/// bytes stay at consecutive addresses for the CPU while each segment keeps its own memfd,
/// seals and registration, and a growth moves nothing already registered. Reserved
/// inaccessible (`PROT_NONE`, `MAP_NORESERVE`): it costs address space, not memory.
#[derive(Debug)]
pub struct Reservation {
    base: NonNull<u8>,
    len: usize,
    /// Bytes from `base` handed to segments so far: the next one starts there.
    used: Mutex<usize>,
}

// SAFETY: the reservation is an address range; its only state behind a pointer is the range
// itself, which it never reads or writes, and `used` is behind a mutex.
unsafe impl Send for Reservation {}
// SAFETY: as above.
unsafe impl Sync for Reservation {}

impl Reservation {
    /// Reserves `len` bytes of address space (a multiple of the page size), starting on a
    /// 2 MiB boundary, so that segments of whole huge pages can be backed by them.
    pub fn new(len: usize) -> Result<Arc<Reservation>> {
        let fail = |why: &str| Error::Map { len, source: std::io::Error::other(why.to_owned()) };
        if len == 0 || !len.is_multiple_of(page_size()) {
            return Err(fail("not whole pages"));
        }
        let padded = len.checked_add(HUGE_PAGE).and_then(NonZeroUsize::new).ok_or_else(|| fail("too large"))?;
        // SAFETY: a new private anonymous mapping at an address the kernel chooses: it cannot
        // overlap anything of ours. PROT_NONE: nothing can touch it until a segment is mapped
        // over part of it.
        let start = unsafe {
            nix::sys::mman::mmap_anonymous(
                None,
                padded,
                nix::sys::mman::ProtFlags::PROT_NONE,
                nix::sys::mman::MapFlags::MAP_PRIVATE | nix::sys::mman::MapFlags::MAP_NORESERVE,
            )
        }
        .map_err(|e| Error::Map { len, source: e.into() })?;
        let start = start.as_ptr() as usize;
        let base = start.next_multiple_of(HUGE_PAGE);
        // The padding before and after the aligned range goes back.
        for (at, n) in [(start, base - start), (base + len, start + padded.get() - (base + len))] {
            if let Some(at) = NonNull::new(at as *mut std::ffi::c_void).filter(|_| n > 0) {
                // SAFETY: `at..at + n` is padding of the mapping just made, outside the range
                // kept, used by nothing.
                let _ = unsafe { nix::sys::mman::munmap(at, n) };
            }
        }
        let base = NonNull::new(base as *mut u8).ok_or_else(|| fail("a null mapping"))?;
        Ok(Arc::new(Reservation { base, len, used: Mutex::new(0) }))
    }

    /// The first address.
    pub fn addr(&self) -> u64 {
        self.base.as_ptr() as u64
    }

    /// Bytes reserved.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never: empty reservations are refused.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Bytes already given to segments (the next one is mapped there).
    pub fn used(&self) -> usize {
        *self.used.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Maps `len` bytes of `file` (a sealed memfd of exactly that size: checked by the caller)
    /// shared, writable and populated at the reservation's next free address; the address.
    fn place(self: &Arc<Reservation>, file: &File, len: usize) -> Result<NonNull<u8>> {
        let mut used = self.used.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let fits = len.is_multiple_of(page_size()) && used.checked_add(len).is_some_and(|end| end <= self.len);
        let size = NonZeroUsize::new(len).filter(|_| fits).ok_or_else(|| Error::Map {
            len,
            source: std::io::Error::other(format!(
                "a segment of {len} bytes does not fit the {} bytes left of the volume's reserved {} (or is not whole pages)",
                self.len - *used,
                self.len
            )),
        })?;
        let at = self.base.as_ptr() as usize + *used;
        // SAFETY: `at..at + len` is inside this reservation (checked above) and past every
        // segment alive (`used` grows under the lock, and shrinks only when the last segment is
        // gone and its range inaccessible again: `unplace`), so MAP_FIXED replaces only
        // inaccessible reserved pages that nothing else uses. The memfd is sealed against
        // shrinking and growing and is `len` bytes long (the caller checked), so no access
        // through the mapping can fault past its end.
        let ptr = unsafe {
            nix::sys::mman::mmap(
                NonZeroUsize::new(at),
                size,
                nix::sys::mman::ProtFlags::PROT_READ | nix::sys::mman::ProtFlags::PROT_WRITE,
                nix::sys::mman::MapFlags::MAP_SHARED
                    | nix::sys::mman::MapFlags::MAP_FIXED
                    | nix::sys::mman::MapFlags::MAP_POPULATE,
                file,
                0,
            )
        }
        .map_err(|e| Error::Map { len, source: e.into() })?;
        *used += len;
        Ok(ptr.cast())
    }

    /// The segment at `at` of `len` bytes is gone and its range inaccessible again: if it was
    /// the last one placed, the next one goes there.
    fn unplace(&self, at: usize, len: usize) {
        let mut used = self.used.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if at + len == self.base.as_ptr() as usize + *used {
            *used -= len;
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(len) = NonZeroUsize::new(self.len) {
            // SAFETY: the whole range is ours and unused: every segment placed in it holds the
            // reservation (`Mapping::Reserved`), so all of them are gone.
            let _ = unsafe { nix::sys::mman::munmap(self.base.cast(), len.get()) };
        }
    }
}

/// The huge page size reservations are aligned to (x86-64's and arm64's PMD size with 4 KiB
/// pages).
const HUGE_PAGE: usize = 2 << 20;

/// The system's page size.
fn page_size() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok().flatten().map_or(4096, |n| n as usize)
}

// SAFETY: `Memory` is a raw region; every access goes through `read_at`/`write_at`, which copy
// with raw pointers and never create references, so sharing between threads is sound (concurrent
// writers race on bytes, as DMA does, but cannot cause undefined behaviour in Rust terms).
unsafe impl Send for Memory {}
// SAFETY: as above.
unsafe impl Sync for Memory {}

impl Memory {
    /// Maps `len` bytes of zeroed anonymous memory, populated up front (so the first touch does
    /// not land inside an I/O) and with transparent huge pages requested.
    pub fn anonymous(len: usize) -> Result<Arc<Memory>> {
        if len == 0 {
            return Err(Error::Map { len, source: std::io::Error::other("zero-length mapping") });
        }
        let mut map =
            memmap2::MmapOptions::new().len(len).populate().map_anon().map_err(|source| Error::Map { len, source })?;
        // Huge pages are an optimisation; a kernel without THP simply says no.
        let _ = map.advise(memmap2::Advice::HugePage);
        let ptr = NonNull::new(map.as_mut_ptr())
            .ok_or_else(|| Error::Map { len, source: std::io::Error::other("mapping returned a null pointer") })?;
        Ok(Arc::new(Memory { ptr, len, _map: Mapping::Own(map), memfd: None }))
    }

    /// Maps `len` zeroed bytes of a new memfd called `name` (`/proc/PID/fd` shows
    /// `memfd:NAME`), shared, populated up front, with transparent huge pages requested (they
    /// apply where shmem THP is enabled). The memfd is sealed `F_SEAL_SHRINK | F_SEAL_GROW`
    /// before it is mapped: a registered shmem truncated under its mapping would SIGBUS the CPU
    /// side while the NIC keeps the old pages. `F_SEAL_SEAL` follows, so no holder of the
    /// descriptor can add a seal such as `F_SEAL_FUTURE_WRITE` that would keep a successor from
    /// mapping it writable (seals are never removed; this stops new ones).
    pub fn memfd(name: &str, len: usize) -> Result<Arc<Memory>> {
        Self::map_memfd(name, Self::sealed_memfd(name, len)?, len)
    }

    /// [`Memory::memfd`], mapped at the next free address of `reservation`: a volume's first
    /// segment, or one it grows by, right after the one before.
    pub fn memfd_in(name: &str, len: usize, reservation: &Arc<Reservation>) -> Result<Arc<Memory>> {
        let file = Self::sealed_memfd(name, len)?;
        Self::map_memfd_in(name, file, len, reservation)
    }

    /// [`Memory::from_memfd`], mapped at the next free address of `reservation`: a successor
    /// adopts a volume's segments one after the other, as the predecessor had them.
    pub fn from_memfd_in(name: &str, fd: OwnedFd, len: usize, reservation: &Arc<Reservation>) -> Result<Arc<Memory>> {
        Self::map_memfd_in(name, File::from(fd), len, reservation)
    }

    fn map_memfd_in(name: &str, file: File, len: usize, reservation: &Arc<Reservation>) -> Result<Arc<Memory>> {
        Self::check_memfd(name, &file, len)?;
        let ptr = reservation.place(&file, len)?;
        // Huge pages are an optimisation; shmem without THP simply says no.
        // SAFETY: `ptr..ptr + len` is the segment just mapped; MADV_HUGEPAGE changes how its
        // pages are backed, never their contents or their mapping.
        let _ = unsafe { nix::sys::mman::madvise(ptr.cast(), len, nix::sys::mman::MmapAdvise::MADV_HUGEPAGE) };
        let map = Mapping::Reserved(Arc::clone(reservation));
        Ok(Arc::new(Memory { ptr, len, _map: map, memfd: Some(file) }))
    }

    /// One view of `segments`, consecutive in `reservation` from its start (as
    /// [`Memory::memfd_in`] places them): the volume's bytes for the CPU side (loads,
    /// write-backs, zeroing), which cross segment boundaries. It has no memfd of its own
    /// ([`Memory::fd`] is None: hand over the segments). Registering it registers every
    /// segment's pages in one registration.
    pub fn span(reservation: &Arc<Reservation>, segments: Vec<Arc<Memory>>) -> Result<Arc<Memory>> {
        let mut at = reservation.addr();
        for m in &segments {
            let inside = matches!(&m._map, Mapping::Reserved(r) if Arc::ptr_eq(r, reservation));
            if !inside || m.addr() != at {
                return Err(Error::Map {
                    len: m.len,
                    source: std::io::Error::other("a segment that does not follow the one before in the reservation"),
                });
            }
            at += m.len as u64;
        }
        let len = (at - reservation.addr()) as usize;
        if len == 0 {
            return Err(Error::Map { len, source: std::io::Error::other("a span of no segment") });
        }
        Ok(Arc::new(Memory { ptr: reservation.base, len, _map: Mapping::Span(segments), memfd: None }))
    }

    /// The segments a [`Memory::span`] views, in order; empty for any other memory.
    pub fn segments(&self) -> &[Arc<Memory>] {
        match &self._map {
            Mapping::Span(segments) => segments,
            _ => &[],
        }
    }

    /// The reservation a segment ([`Memory::memfd_in`]) or a span sits in; None for memory
    /// the kernel placed.
    pub fn reservation(&self) -> Option<&Arc<Reservation>> {
        match &self._map {
            Mapping::Reserved(r) => Some(r),
            Mapping::Span(segments) => segments.first().and_then(|m| m.reservation()),
            Mapping::Own(_) => None,
        }
    }

    /// A new memfd of `len` zeroed bytes, sealed as [`Memory::memfd`] says.
    fn sealed_memfd(name: &str, len: usize) -> Result<File> {
        let fail = |op, source| Error::Memfd { op, name: name.to_owned(), len, source };
        if len == 0 {
            return Err(fail("memfd_create", std::io::Error::other("zero-length memfd")));
        }
        // Never executable (F_SEAL_EXEC): required where vm.memfd_noexec=2, and harmless
        // elsewhere. Kernels before 6.3 do not know the flag (EINVAL): made without it there.
        let flags = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING;
        let fd: OwnedFd = match memfd_create(name, flags | noexec_seal()) {
            Err(nix::errno::Errno::EINVAL) => memfd_create(name, flags),
            made => made,
        }
        .map_err(|e| fail("memfd_create", e.into()))?;
        let file = File::from(fd);
        file.set_len(len as u64).map_err(|e| fail("ftruncate", e))?;
        fcntl(&file, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL))
            .map_err(|e| fail("fcntl(F_ADD_SEALS)", e.into()))?;
        Ok(file)
    }

    /// Maps a memfd another process made with [`Memory::memfd`] and handed over (its pages, not
    /// a copy: both mappings show the same bytes), after checking that it is what it must be:
    /// sealed against shrinking, growing and further seals (`F_SEAL_SEAL`), and exactly `len`
    /// bytes long. Populated and with
    /// huge pages requested, as [`Memory::memfd`]. `name` is for errors.
    pub fn from_memfd(name: &str, fd: OwnedFd, len: usize) -> Result<Arc<Memory>> {
        Self::map_memfd(name, File::from(fd), len)
    }

    /// Maps `file`, a memfd, shared: after checking it is sealed against resizing and holds
    /// exactly `len` bytes, which is what makes the mapping sound (see the SAFETY comment).
    fn map_memfd(name: &str, file: File, len: usize) -> Result<Arc<Memory>> {
        Self::check_memfd(name, &file, len)?;
        // SAFETY: memmap2 asks that the file not be truncated or resized while it is mapped,
        // which would SIGBUS accesses past the new end. `check_memfd` returned an error unless
        // the memfd carries F_SEAL_SHRINK and F_SEAL_GROW, which bind every holder of it (also
        // one that reopens it through /proc) and can never be removed, and unless its size is
        // the `len` mapped. Writes through other mappings (a predecessor's, a NIC's) are fine:
        // the mapping is never borrowed as a slice (see the module docs).
        let mut map = unsafe { memmap2::MmapOptions::new().len(len).populate().map_mut(&file) }
            .map_err(|source| Error::Map { len, source })?;
        // Huge pages are an optimisation; shmem without THP simply says no.
        let _ = map.advise(memmap2::Advice::HugePage);
        let ptr = NonNull::new(map.as_mut_ptr())
            .ok_or_else(|| Error::Map { len, source: std::io::Error::other("mapping returned a null pointer") })?;
        Ok(Arc::new(Memory { ptr, len, _map: Mapping::Own(map), memfd: Some(file) }))
    }

    /// What makes mapping `file` sound: a memfd sealed against resizing and further seals,
    /// exactly `len` (non-zero) bytes long.
    fn check_memfd(name: &str, file: &File, len: usize) -> Result<()> {
        let fail = |op, source| Error::Memfd { op, name: name.to_owned(), len, source };
        let seals = fcntl(file, FcntlArg::F_GET_SEALS).map_err(|e| fail("fcntl(F_GET_SEALS)", e.into()))?;
        // F_SEAL_SEAL too: without it, another holder of the descriptor could still add
        // F_SEAL_FUTURE_WRITE or F_SEAL_WRITE after our checks.
        let want = (SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL).bits();
        if seals & want != want {
            return Err(fail(
                "fcntl(F_GET_SEALS)",
                std::io::Error::other(
                    "not sealed against resizing and further seals (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL)",
                ),
            ));
        }
        let have = file.metadata().map_err(|e| fail("fstat", e))?.len();
        if have != len as u64 || len == 0 {
            return Err(fail("fstat", std::io::Error::other(format!("it holds {have} bytes, not {len}"))));
        }
        Ok(())
    }

    /// The memfd behind a [`Memory::memfd`] mapping; None for anonymous memory. It is for
    /// handing the volume to a successor daemon (issue 28): whoever receives it must map it
    /// shared and must never truncate it, punch holes in it or drop its pages (it is sealed
    /// against resizing).
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.memfd.as_ref().map(AsFd::as_fd)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: empty mappings are refused.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Start address, as the NIC sees it.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// The start of the mapping as a raw pointer, for I/O engines that move bytes themselves (the
    /// target's io_uring persistence). Getting it is safe; whoever dereferences it must stay
    /// within [`len`](Self::len) bytes and must not create references over the memory.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn check(&self, what: &'static str, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::OutOfRange { what, offset: offset as u64, len: len as u64, size: self.len as u64 }),
        }
    }

    /// Copies `dst.len()` bytes starting at `offset` out of the region.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check("memory read", offset, dst.len())?;
        // SAFETY: the range is inside the mapping (checked above), which lives as long as `self`;
        // `dst` is a distinct Rust buffer, so the two do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.as_ptr().add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Copies `src` into the region starting at `offset`.
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check("memory write", offset, src.len())?;
        // SAFETY: the range is inside the mapping (checked above), which is writable and lives as
        // long as `self`; `src` is a distinct Rust buffer.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.as_ptr().add(offset), src.len()) };
        Ok(())
    }

    /// Sets the `len` bytes at `offset` to zero with stores. Never by giving the pages back
    /// (`MADV_DONTNEED`, `MADV_REMOVE`, a hole punched in the memfd): a registration keeps the
    /// pages it pinned while the CPU would get new zero pages, and the NIC and the CPU would see
    /// two different volumes.
    pub fn zero(&self, offset: usize, len: usize) -> Result<()> {
        self.check("memory zeroing", offset, len)?;
        // SAFETY: the range is inside the mapping (checked above), which is writable and lives as
        // long as `self`; no Rust reference covers it.
        unsafe { std::ptr::write_bytes(self.as_ptr().add(offset), 0, len) };
        Ok(())
    }

    /// Whether the `len` bytes at `offset` are all zero (read through a small copy: no
    /// reference is made over memory a NIC may write).
    pub fn is_zero(&self, offset: usize, len: usize) -> Result<bool> {
        self.check("memory read", offset, len)?;
        let mut buf = [0u64; 512];
        let mut at = offset;
        while at < offset + len {
            let n = (offset + len - at).min(size_of_val(&buf));
            // SAFETY: `at..at + n` is inside the mapping (checked above), `buf` is a distinct
            // local buffer of at least `n` bytes.
            unsafe { std::ptr::copy_nonoverlapping(self.as_ptr().add(at), buf.as_mut_ptr().cast::<u8>(), n) };
            let words = n / 8;
            if buf[..words].iter().any(|&w| w != 0) {
                return Ok(false);
            }
            // The bytes past the last whole word (none when `n` is a multiple of 8).
            let mut tail = [0u8; 8];
            // SAFETY: as above; the tail is within the `n` bytes copied.
            unsafe { std::ptr::copy_nonoverlapping(self.as_ptr().add(at + words * 8), tail.as_mut_ptr(), n % 8) };
            if tail != [0; 8] {
                return Ok(false);
            }
            at += n;
        }
        Ok(true)
    }

    /// Copies `len` bytes between two regions (which may be the same mapping: overlap is allowed).
    pub fn copy_to(&self, offset: usize, dst: &Memory, dst_offset: usize, len: usize) -> Result<()> {
        self.check("memory copy source", offset, len)?;
        dst.check("memory copy destination", dst_offset, len)?;
        // SAFETY: both ranges were checked against their live mappings; `copy` allows overlap.
        unsafe { std::ptr::copy(self.as_ptr().add(offset), dst.as_ptr().add(dst_offset), len) };
        Ok(())
    }
}

/// `MFD_NOEXEC_SEAL` (Linux 6.3): the memfd can never be made executable.
fn noexec_seal() -> MFdFlags {
    MFdFlags::from_bits_retain(libc::MFD_NOEXEC_SEAL as _)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Chain;

    /// `zero` clears exactly its range, and `is_zero` sees a single byte set anywhere in a range
    /// (in a whole word, in the tail past the last word, in a later copy of its buffer).
    #[test]
    fn zero_and_is_zero() {
        let m = Memory::anonymous(3 * 4096).unwrap();
        m.write_at(0, &[0xaa; 3 * 4096]).unwrap();
        m.zero(4096, 4096).unwrap();
        assert!(m.is_zero(4096, 4096).unwrap());
        assert!(!m.is_zero(4095, 2).unwrap() && !m.is_zero(4096, 4097).unwrap());
        for at in [4096, 4103, 8191] {
            m.write_at(at, &[1]).unwrap();
            assert!(!m.is_zero(4096, 4096).unwrap(), "a byte at {at}");
            assert!(!m.is_zero(at, 1).unwrap() && m.is_zero(4096, at - 4096).unwrap());
            m.write_at(at, &[0]).unwrap();
        }
        assert!(matches!(m.zero(8192, 4097), Err(Error::OutOfRange { .. })));
        assert!(matches!(m.is_zero(usize::MAX, 2), Err(Error::OutOfRange { .. })));
    }

    #[test]
    fn read_write_and_bounds() {
        let m = Memory::anonymous(8192).unwrap();
        m.write_at(4090, &[1, 2, 3, 4, 5, 6]).unwrap();
        let mut b = [0u8; 6];
        m.read_at(4090, &mut b).unwrap();
        assert_eq!(b, [1, 2, 3, 4, 5, 6]);
        assert!(matches!(m.write_at(8190, &[0; 3]), Err(Error::OutOfRange { .. })));
        assert!(matches!(m.read_at(usize::MAX, &mut b), Err(Error::OutOfRange { .. })));
        assert!(Memory::anonymous(0).is_err());
        assert!(Memory::anonymous(4096).unwrap().fd().is_none());
    }

    /// A memfd mapping that does not show its writes, or whose offsets are off, would lose volume
    /// data.
    #[test]
    fn memfd_reads_back_what_was_written() {
        let m = Memory::memfd("rblk-test:readback", 3 * 4096).unwrap();
        let mut z = [0xffu8; 16];
        m.read_at(2 * 4096, &mut z).unwrap();
        assert_eq!(z, [0; 16], "a new memfd reads as zeroes");
        m.write_at(4090, &[1, 2, 3, 4, 5, 6]).unwrap();
        let mut b = [0u8; 6];
        m.read_at(4090, &mut b).unwrap();
        assert_eq!(b, [1, 2, 3, 4, 5, 6]);
        // The bytes are in the memfd itself, not only in this mapping: what a successor would see.
        let f = File::from(m.fd().unwrap().try_clone_to_owned().unwrap());
        let mut from_file = [0u8; 6];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut from_file, 4090).unwrap();
        assert_eq!(from_file, [1, 2, 3, 4, 5, 6]);
        assert!(matches!(m.write_at(3 * 4096 - 2, &[0; 3]), Err(Error::OutOfRange { .. })));
        assert!(Memory::memfd("rblk-test:empty", 0).is_err());
    }

    /// Catches a successor that maps a copy instead of the same pages (a handed-over volume
    /// would lose every write made after the handover began), or that maps a memfd of the
    /// wrong size or one that could still be resized.
    #[test]
    fn a_handed_memfd_maps_the_same_pages_and_is_checked() {
        let m = Memory::memfd("rblk-test:handed", 8192).unwrap();
        m.write_at(100, b"before").unwrap();
        let dup = || m.fd().unwrap().try_clone_to_owned().unwrap();
        let n = Memory::from_memfd("handed", dup(), 8192).unwrap();
        let mut got = [0u8; 6];
        n.read_at(100, &mut got).unwrap();
        assert_eq!(&got, b"before");
        m.write_at(4096, b"after").unwrap();
        let mut got = [0u8; 5];
        n.read_at(4096, &mut got).unwrap();
        assert_eq!(&got, b"after", "a write through the old mapping shows in the new one");
        let e = Memory::from_memfd("handed", dup(), 4096).unwrap_err();
        assert!(Chain(&e).to_string().contains("holds 8192 bytes, not 4096"), "{}", Chain(&e));
        let unsealed = nix::sys::memfd::memfd_create("rblk-test:unsealed", MFdFlags::MFD_CLOEXEC).unwrap();
        File::from(unsealed.try_clone().unwrap()).set_len(8192).unwrap();
        let e = Memory::from_memfd("unsealed", unsealed, 8192).unwrap_err();
        assert!(Chain(&e).to_string().contains("not sealed"), "{}", Chain(&e));
    }

    /// Catches a successor that adopts a memfd without `F_SEAL_SEAL`: whoever else holds it
    /// could then add `F_SEAL_WRITE` or `F_SEAL_FUTURE_WRITE` after the check, and the volume's
    /// writes would fail under the new owner.
    #[test]
    fn a_handed_memfd_without_seal_seal_is_refused() {
        let fd = memfd_create("rblk-test:open-seals", MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING).unwrap();
        let file = File::from(fd);
        file.set_len(8192).unwrap();
        fcntl(&file, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW)).unwrap();
        let e = Memory::from_memfd("open-seals", file.try_clone().unwrap().into(), 8192).unwrap_err();
        assert!(Chain(&e).to_string().contains("F_SEAL_SEAL"), "{}", Chain(&e));
        fcntl(&file, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SEAL)).unwrap();
        Memory::from_memfd("sealed", file.into(), 8192).expect("with F_SEAL_SEAL it maps");
    }

    /// Catches a memfd that could be resized under its registration (SIGBUS on the CPU side,
    /// stale pages on the NIC's) or that a holder of the descriptor could seal further.
    #[test]
    fn memfd_is_sealed_against_resizing() {
        let m = Memory::memfd("rblk-test:sealed", 8192).unwrap();
        let fd = m.fd().unwrap();
        let seals = SealFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GET_SEALS).unwrap());
        assert!(seals.contains(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL), "{seals:?}");
        let f = File::from(fd.try_clone_to_owned().unwrap());
        for len in [4096, 0, 16384] {
            let e = f.set_len(len).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EPERM), "ftruncate to {len}: {e}");
        }
        assert_eq!(f.metadata().unwrap().len(), 8192);
        let e = fcntl(fd, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_FUTURE_WRITE)).unwrap_err();
        assert_eq!(e, nix::errno::Errno::EPERM);
        // The same through /proc, as any process that may open it would.
        let path = std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd))).unwrap();
        assert_eq!(path.to_string_lossy(), "/memfd:rblk-test:sealed (deleted)");
        let reopened = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd)))
            .unwrap();
        assert_eq!(reopened.set_len(0).unwrap_err().raw_os_error(), Some(libc::EPERM));
    }

    /// Catches volume memfds made executable-capable: under `vm.memfd_noexec=2` their creation
    /// fails (no volume can be made), and elsewhere a holder could map one executable. On a
    /// kernel that knows `MFD_NOEXEC_SEAL` (6.3 or later) the memfd carries `F_SEAL_EXEC` and
    /// no execute bit.
    #[test]
    fn memfd_is_sealed_against_exec_where_the_kernel_can() {
        use std::os::unix::fs::PermissionsExt as _;
        // An older kernel refuses the flag (EINVAL): there only the fallback's success is checked.
        let kernel_knows = memfd_create("rblk-test:probe", MFdFlags::MFD_CLOEXEC | noexec_seal()).is_ok();
        let m = Memory::memfd("rblk-test:noexec", 4096).unwrap();
        let fd = m.fd().unwrap();
        let seals = fcntl(fd, FcntlArg::F_GET_SEALS).unwrap();
        let mode = File::from(fd.try_clone_to_owned().unwrap()).metadata().unwrap().permissions().mode();
        if kernel_knows {
            assert!(seals & libc::F_SEAL_EXEC != 0, "no F_SEAL_EXEC: {seals:#x}");
            assert_eq!(mode & 0o111, 0, "executable: {mode:o}");
        }
    }

    /// Issue 44's growth: catches a segment mapped elsewhere than right after the one before
    /// (the volume would not be contiguous for the CPU), an earlier segment moved or remapped
    /// by a growth (its registration and its windows would point at stale pages), a segment
    /// not sealed (a holder could resize it under the NIC), a successor's adoption that maps
    /// copies, a growth past the reservation taken, and a dropped segment's range left unmapped
    /// (another mapping could land inside the volume's range).
    #[test]
    fn segments_grow_in_place_inside_a_reservation() {
        let r = Reservation::new(16 * 4096).unwrap();
        let first = Memory::memfd_in("rblk-test:seg0", 4 * 4096, &r).unwrap();
        assert_eq!(first.addr(), r.addr(), "the first segment at the reservation's start");
        assert_eq!(r.addr() % (2 << 20), 0, "on a huge page boundary");
        first.write_at(4 * 4096 - 3, b"old").unwrap();
        let ino = |m: &Memory| File::from(m.fd().unwrap().try_clone_to_owned().unwrap()).metadata().unwrap();
        let first_ino = std::os::unix::fs::MetadataExt::ino(&ino(&first));
        let second = Memory::memfd_in("rblk-test:seg1", 8 * 4096, &r).unwrap();
        assert_eq!(second.addr(), first.addr() + 4 * 4096, "right after the first");
        assert_eq!(r.used(), 12 * 4096);
        // The first is where it was, with its bytes, its memfd and its seals.
        let mut got = [0u8; 3];
        first.read_at(4 * 4096 - 3, &mut got).unwrap();
        assert_eq!(&got, b"old");
        assert_eq!(std::os::unix::fs::MetadataExt::ino(&ino(&first)), first_ino);
        for m in [&first, &second] {
            let seals = SealFlag::from_bits_retain(fcntl(m.fd().unwrap(), FcntlArg::F_GET_SEALS).unwrap());
            assert!(seals.contains(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL));
        }
        assert!(second.is_zero(0, 8 * 4096).unwrap(), "a new segment reads as zeros");
        // Contiguous: one copy across the boundary through raw pointers, as a write-back does.
        second.write_at(0, b"new").unwrap();
        let mut across = [0u8; 6];
        // SAFETY: both segments are mapped and alive; the 6 bytes span the end of the first
        // and the start of the second, consecutive as asserted above.
        unsafe { std::ptr::copy_nonoverlapping(first.as_ptr().add(4 * 4096 - 3), across.as_mut_ptr(), 6) };
        assert_eq!(&across, b"oldnew");
        // Past what is left: refused, nothing placed.
        let e = Memory::memfd_in("rblk-test:seg2", 8 * 4096, &r).unwrap_err();
        assert!(Chain(&e).to_string().contains("does not fit"), "{}", Chain(&e));
        assert_eq!(r.used(), 12 * 4096);
        // A successor adopts both, one after the other in its own reservation: the same pages.
        let adopted = Reservation::new(16 * 4096).unwrap();
        let dup = |m: &Memory| m.fd().unwrap().try_clone_to_owned().unwrap();
        let a0 = Memory::from_memfd_in("seg0", dup(&first), 4 * 4096, &adopted).unwrap();
        let a1 = Memory::from_memfd_in("seg1", dup(&second), 8 * 4096, &adopted).unwrap();
        assert_eq!(a1.addr(), a0.addr() + 4 * 4096);
        a1.write_at(4096, b"through the successor").unwrap();
        let mut seen = [0u8; 21];
        second.read_at(4096, &mut seen).unwrap();
        assert_eq!(&seen, b"through the successor");
        assert!(Memory::from_memfd_in("short", dup(&first), 4096, &adopted).is_err(), "the wrong size");
        // A dropped segment's range stays reserved: inaccessible, not unmapped.
        let at = second.addr() as usize;
        drop(second);
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = maps
            .lines()
            .find(|l| {
                let (range, _) = l.split_once(' ').unwrap();
                let (lo, hi) = range.split_once('-').unwrap();
                let (lo, hi) = (usize::from_str_radix(lo, 16).unwrap(), usize::from_str_radix(hi, 16).unwrap());
                lo <= at && at < hi
            })
            .expect("the dropped segment's range is still mapped");
        assert!(line.split_whitespace().nth(1).unwrap().starts_with("---p"), "{line}");
        // It was the last placed (a grow that failed after placing it): the next one goes
        // where it was, right after the first (a gap would keep every later span from forming).
        assert_eq!(r.used(), 4 * 4096);
        let again = Memory::memfd_in("rblk-test:seg1b", 4 * 4096, &r).unwrap();
        assert_eq!(again.addr(), first.addr() + 4 * 4096);
        Memory::span(&r, vec![Arc::clone(&first), again]).expect("one view over the first and its successor");
        assert!(Reservation::new(4096 + 1).is_err(), "not whole pages");
        // A span over the successor's two segments: one view across the boundary.
        let span = Memory::span(&adopted, vec![Arc::clone(&a0), Arc::clone(&a1)]).unwrap();
        assert_eq!((span.addr(), span.len()), (a0.addr(), 12 * 4096));
        assert!(span.fd().is_none(), "a span has no memfd of its own");
        assert_eq!(span.segments().len(), 2);
        assert!(Arc::ptr_eq(span.reservation().unwrap(), &adopted) && a1.reservation().is_some());
        assert!(Memory::anonymous(4096).unwrap().reservation().is_none() && a0.segments().is_empty());
        let mut across = [0u8; 6];
        span.read_at(4 * 4096 - 3, &mut across).unwrap();
        assert_eq!(&across, b"oldnew");
        assert!(Memory::span(&adopted, vec![Arc::clone(&a1)]).is_err(), "not from the start");
        assert!(Memory::span(&r, vec![Arc::clone(&a0)]).is_err(), "another reservation's segment");
    }
}
