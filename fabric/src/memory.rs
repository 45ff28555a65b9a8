//! Memory the process owns and may register for RDMA: anonymous mappings.
//!
//! A NIC (or, in the in-memory fabric, another thread) may write this memory at any time, so it
//! is never borrowed as `&[u8]` or `&mut [u8]`. Bytes move in and out with explicit copies through
//! raw pointers, in the spirit of vm-memory's volatile slices.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::{Error, Result};

/// An anonymous, populated mapping. Cheap to share: hold it in an `Arc`.
#[derive(Debug)]
pub struct Memory {
    ptr: NonNull<u8>,
    len: usize,
    // Owns the mapping; dropped (munmap) after every registration of it is gone, because each
    // registration holds an `Arc<Memory>`.
    _map: memmap2::MmapMut,
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
        Ok(Arc::new(Memory { ptr, len, _map: map }))
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

    /// Copies `len` bytes between two regions (which may be the same mapping: overlap is allowed).
    pub fn copy_to(&self, offset: usize, dst: &Memory, dst_offset: usize, len: usize) -> Result<()> {
        self.check("memory copy source", offset, len)?;
        dst.check("memory copy destination", dst_offset, len)?;
        // SAFETY: both ranges were checked against their live mappings; `copy` allows overlap.
        unsafe { std::ptr::copy(self.as_ptr().add(offset), dst.as_ptr().add(dst_offset), len) };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
