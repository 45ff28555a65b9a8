//! Registered I/O buffers: a queue's pool, carved out of one registration, and the [`Buffer`]
//! handles that lend its pieces to callers and to in-flight operations.

use std::sync::{Arc, Mutex, PoisonError};

use rblk_fabric::{Access, Chain, Memory, Mr, Pd};

use crate::{Error, InvalidReason, Result};

struct Pool {
    mr: Mr,
    buf_size: usize,
    count: usize,
    free: Mutex<Vec<u32>>,
}

/// `count` registered buffers of `buf_size` bytes each, in one registration.
///
/// Buffers go back to the pool when their [`Buffer`] handle is dropped, from any thread.
#[derive(Clone)]
pub struct BufferPool {
    shared: Arc<Pool>,
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferPool")
            .field("count", &self.shared.count)
            .field("buf_size", &self.shared.buf_size)
            .field("free", &self.free())
            .finish()
    }
}

impl BufferPool {
    /// Maps and registers `count` buffers of `buf_size` bytes in `pd`.
    pub fn new(pd: &Pd, count: usize, buf_size: usize) -> rblk_fabric::Result<BufferPool> {
        let total = count.checked_mul(buf_size).filter(|&t| t > 0).ok_or_else(|| rblk_fabric::Error::Map {
            len: 0,
            source: std::io::Error::other(format!("bad buffer pool geometry: {count} x {buf_size} bytes")),
        })?;
        let memory = Memory::anonymous(total)?;
        let mr = pd.register(&memory, Access::LOCAL)?;
        let free = Mutex::new((0..count as u32).rev().collect());
        Ok(BufferPool { shared: Arc::new(Pool { mr, buf_size, count, free }) })
    }

    /// Takes a free buffer, or `None` when all are in use.
    pub fn alloc(&self) -> Option<Buffer> {
        let index = self.shared.free.lock().unwrap_or_else(PoisonError::into_inner).pop()?;
        Some(Buffer { pool: Arc::clone(&self.shared), index })
    }

    /// [`alloc`](Self::alloc), or [`Error::NoBuffer`].
    pub(crate) fn get(&self) -> Result<Buffer> {
        self.alloc().ok_or(Error::NoBuffer { count: self.shared.count })
    }

    /// Bytes in each buffer.
    pub fn buf_size(&self) -> usize {
        self.shared.buf_size
    }

    /// Buffers in the pool.
    pub fn count(&self) -> usize {
        self.shared.count
    }

    /// Buffers free right now.
    pub fn free(&self) -> usize {
        self.shared.free.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    pub(crate) fn owns(&self, buf: &Buffer) -> bool {
        Arc::ptr_eq(&self.shared, &buf.pool)
    }
}

/// One registered buffer of a [`BufferPool`]. Registered memory is never borrowed as a slice:
/// copy in and out with [`write_at`](Self::write_at) and [`read_at`](Self::read_at). Dropping it
/// returns it to its pool.
pub struct Buffer {
    pool: Arc<Pool>,
    index: u32,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer").field("index", &self.index).field("len", &self.len()).finish()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        self.pool.free.lock().unwrap_or_else(PoisonError::into_inner).push(self.index);
    }
}

impl Buffer {
    /// Bytes in the buffer.
    pub fn len(&self) -> usize {
        self.pool.buf_size
    }

    /// Never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    fn base(&self) -> usize {
        self.index as usize * self.pool.buf_size
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(Error::Invalid {
                what: "buffer access",
                offset: offset as u64,
                len: len as u64,
                reason: InvalidReason::BufferTooSmall { size: self.len() as u64 },
            }),
        }
    }

    /// Copies `dst.len()` bytes at `offset` of the buffer into `dst`.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len())?;
        self.memory_op(|m, at| m.read_at(at + offset, dst))
    }

    /// Copies `src` into the buffer at `offset`.
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check(offset, src.len())?;
        self.memory_op(|m, at| m.write_at(at + offset, src))
    }

    /// The first `len` bytes as a new vector.
    pub fn to_vec(&self, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0; len];
        self.read_at(0, &mut v)?;
        Ok(v)
    }

    fn memory_op(&self, op: impl FnOnce(&Memory, usize) -> rblk_fabric::Result<()>) -> Result<()> {
        // The range was checked against the buffer, which lies inside the registration.
        op(self.pool.mr.memory(), self.base()).map_err(|e| Error::Invalid {
            what: "buffer access",
            offset: 0,
            len: self.len() as u64,
            reason: {
                tracing::error!(error = %Chain(&e), "buffer access outside its registration");
                InvalidReason::BufferTooSmall { size: self.len() as u64 }
            },
        })
    }

    /// The buffer's address in this process, for handing it to a kernel interface that fills or
    /// drains it (a ublk queue's I/O buffers). Never borrowed as a slice here.
    pub fn addr(&self) -> u64 {
        self.pool.mr.addr() + self.base() as u64
    }

    /// The registration and offset of `len` bytes of this buffer, for a work request.
    pub(crate) fn region(&self) -> (&Mr, usize) {
        (&self.pool.mr, self.base())
    }
}
