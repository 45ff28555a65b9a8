//! What the NBD server needs from a volume ([`BlockDevice`]): asynchronous block-aligned reads
//! and writes, flush, and liveness. [`VolumeDevice`] is an rblk session (a [`Volume`] for the
//! control path and one [`Queue`] for data); tests use an in-memory device.

use std::io;
use std::time::Instant;

use rblk_initiator::{Done, Queue, Volume};

use super::wire::ExportGeometry;

/// Copies a finished read's data out.
pub trait ReadOut {
    /// Copies the first `dst.len()` bytes read into `dst`.
    fn copy_to(&self, dst: &mut [u8]) -> io::Result<()>;
}

impl ReadOut for Vec<u8> {
    fn copy_to(&self, dst: &mut [u8]) -> io::Result<()> {
        let src = self.get(..dst.len()).ok_or_else(|| io::Error::other("read data shorter than asked"))?;
        dst.copy_from_slice(src);
        Ok(())
    }
}

impl ReadOut for Done {
    fn copy_to(&self, dst: &mut [u8]) -> io::Result<()> {
        self.read_data(dst).map_err(io_error)
    }
}

/// A block device with a queue of asynchronous operations, owned by one thread.
///
/// Offsets and lengths passed to `submit_*` are multiples of the geometry's block size, inside
/// the device, and at most [`max_op`](Self::max_op) long; at most [`depth`](Self::depth)
/// operations are outstanding. Each tag is a caller's value echoed by the completion.
pub trait BlockDevice {
    /// Size, block size, read-only.
    fn geometry(&self) -> ExportGeometry;
    /// Operations allowed outstanding.
    fn depth(&self) -> usize;
    /// Largest single operation, a multiple of the block size.
    fn max_op(&self) -> usize;
    /// Starts reading `len` bytes at `offset`. An error means nothing was started.
    fn submit_read(&mut self, tag: u64, offset: u64, len: usize) -> io::Result<()>;
    /// Starts writing a copy of `data` at `offset`. An error means nothing was started.
    fn submit_write(&mut self, tag: u64, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Waits until at least one outstanding operation finished (or `deadline`: an error),
    /// and calls `done` with each finished one's tag and result (a read's data for reads).
    fn complete(&mut self, deadline: Instant, done: &mut dyn FnMut(u64, io::Result<&dyn ReadOut>)) -> io::Result<()>;
    /// Makes every write completed so far durable; operations may be outstanding meanwhile.
    fn flush(&mut self) -> io::Result<()>;
    /// Housekeeping while idle or busy, at least every couple of seconds (rblk keepalives).
    fn tick(&mut self) -> io::Result<()>;
    /// Ends the session (nothing outstanding): flushes writes, then says goodbye.
    fn close(&mut self) -> io::Result<()>;
}

/// An initiator error as an `io::Error`, keeping its text. Refused accesses (never expected:
/// the server checks first) are `InvalidInput`.
pub fn io_error(e: rblk_initiator::Error) -> io::Error {
    match e {
        rblk_initiator::Error::Invalid { .. } => io::Error::new(io::ErrorKind::InvalidInput, e),
        e => io::Error::other(e),
    }
}

/// An rblk session as a block device: data through one [`Queue`], FLUSH and keepalives on the
/// [`Volume`]'s own queue pair.
#[derive(Debug)]
pub struct VolumeDevice {
    // Declaration order is drop order: the queue goes before the session's first QP.
    queue: Option<Queue>,
    vol: Option<Volume>,
    done: Vec<Done>,
    geo: ExportGeometry,
    max_op: usize,
    depth: usize,
    /// Writes since the last flush: closing flushes only then.
    dirty: bool,
    /// Held while this client is the export's only one (released when it is done).
    _slot: Option<super::Slot>,
}

impl VolumeDevice {
    /// Operations in flight per client.
    pub const DEPTH: u32 = 32;
    /// Bytes per queue operation (less if the volume's largest I/O is smaller): 32 x 128 KiB
    /// pins 4 MiB per client.
    pub const OP_SIZE: u32 = 128 << 10;

    /// Opens the data queue of `vol`.
    pub fn new(vol: Volume) -> rblk_initiator::Result<VolumeDevice> {
        let bs = vol.block_size();
        let op = Self::OP_SIZE.min(vol.max_io()).max(bs) / bs * bs;
        let queue = vol.queue_with(Self::DEPTH, op as usize)?;
        let geo = ExportGeometry { size: vol.size(), block_size: bs, read_only: vol.is_read_only() };
        let done = std::iter::repeat_with(Done::default).take(Self::DEPTH as usize).collect();
        Ok(VolumeDevice {
            queue: Some(queue),
            vol: Some(vol),
            done,
            geo,
            max_op: op as usize,
            depth: Self::DEPTH as usize,
            dirty: false,
            _slot: None,
        })
    }

    /// Keeps `slot` until the client is done.
    pub fn with_slot(self, slot: Option<super::Slot>) -> VolumeDevice {
        VolumeDevice { _slot: slot, ..self }
    }

    fn parts(&mut self) -> io::Result<(&mut Volume, &mut Queue)> {
        match (&mut self.vol, &mut self.queue) {
            (Some(v), Some(q)) => Ok((v, q)),
            _ => Err(io::Error::new(io::ErrorKind::NotConnected, "the rblk session is closed")),
        }
    }
}

impl BlockDevice for VolumeDevice {
    fn geometry(&self) -> ExportGeometry {
        self.geo
    }

    fn depth(&self) -> usize {
        self.depth
    }

    fn max_op(&self) -> usize {
        self.max_op
    }

    fn submit_read(&mut self, tag: u64, offset: u64, len: usize) -> io::Result<()> {
        let (_, q) = self.parts()?;
        let len = u32::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        q.submit_read(offset, len, tag).map_err(io_error)
    }

    fn submit_write(&mut self, tag: u64, offset: u64, data: &[u8]) -> io::Result<()> {
        self.dirty = true;
        let (_, q) = self.parts()?;
        q.submit_write(offset, data, tag).map_err(io_error)
    }

    fn complete(&mut self, deadline: Instant, done: &mut dyn FnMut(u64, io::Result<&dyn ReadOut>)) -> io::Result<()> {
        let q = self.queue.as_mut().ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))?;
        let n = q.wait(&mut self.done, deadline).map_err(io_error)?;
        for d in &mut self.done[..n] {
            match &d.result {
                Ok(()) => done(d.user_data, Ok(&*d)),
                Err(e) => done(d.user_data, Err(io::Error::other(e.to_string()))),
            }
            d.release();
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        let (vol, q) = self.parts()?;
        // Post whatever is staged; the flush covers only what completed before it anyway.
        q.commit();
        vol.flush().map_err(io_error)?;
        self.dirty = false;
        Ok(())
    }

    fn tick(&mut self) -> io::Result<()> {
        let (vol, q) = self.parts()?;
        // Takes the queue's control messages (keepalives) when nothing is in flight.
        q.reap(&mut []);
        vol.keepalive().map_err(io_error)
    }

    fn close(&mut self) -> io::Result<()> {
        // The client is done: the next one may start while this session says goodbye.
        self._slot = None;
        let flushed = if self.dirty { self.flush() } else { Ok(()) };
        self.queue = None;
        let closed = match self.vol.take() {
            Some(vol) => vol.close().map_err(io_error),
            None => Ok(()),
        };
        flushed.and(closed)
    }
}

#[cfg(test)]
pub mod mem {
    //! An in-memory device for the server's tests: completes out of order, checks alignment,
    //! counts flushes, fails on request.

    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// What a test sees of a [`MemDevice`] while the server owns it.
    #[derive(Debug, Default)]
    pub struct State {
        pub data: Vec<u8>,
        pub flushes: u32,
        pub closed: bool,
        pub max_in_flight: usize,
        pub ops: u64,
        /// Operations touching this byte range fail with EIO.
        pub fail: Option<(u64, u64)>,
    }

    /// A RAM block device; every operation finishes at the next `complete`, newest first.
    #[derive(Debug)]
    pub struct MemDevice {
        pub state: Arc<Mutex<State>>,
        geo: ExportGeometry,
        depth: usize,
        max_op: usize,
        pending: VecDeque<(u64, u64, Option<Vec<u8>>, usize)>,
    }

    impl MemDevice {
        pub fn new(geo: ExportGeometry, depth: usize, max_op: usize) -> MemDevice {
            let state = State { data: vec![0; geo.size as usize], ..State::default() };
            MemDevice { state: Arc::new(Mutex::new(state)), geo, depth, max_op, pending: VecDeque::new() }
        }

        fn check(&self, offset: u64, len: usize) {
            let bs = u64::from(self.geo.block_size);
            assert!(len > 0 && len <= self.max_op, "op of {len} bytes (max {})", self.max_op);
            assert!(offset % bs == 0 && len as u64 % bs == 0, "unaligned op {offset}+{len}");
            assert!(offset + len as u64 <= self.geo.size, "op past the end: {offset}+{len}");
            assert!(self.pending.len() < self.depth, "more than {} ops outstanding", self.depth);
        }

        fn started(&mut self) {
            let mut s = self.state.lock().unwrap();
            s.ops += 1;
            s.max_in_flight = s.max_in_flight.max(self.pending.len());
        }
    }

    impl BlockDevice for MemDevice {
        fn geometry(&self) -> ExportGeometry {
            self.geo
        }
        fn depth(&self) -> usize {
            self.depth
        }
        fn max_op(&self) -> usize {
            self.max_op
        }
        fn submit_read(&mut self, tag: u64, offset: u64, len: usize) -> io::Result<()> {
            self.check(offset, len);
            self.pending.push_back((tag, offset, None, len));
            self.started();
            Ok(())
        }
        fn submit_write(&mut self, tag: u64, offset: u64, data: &[u8]) -> io::Result<()> {
            assert!(!self.geo.read_only, "write to a read-only device");
            self.check(offset, data.len());
            self.pending.push_back((tag, offset, Some(data.to_vec()), data.len()));
            self.started();
            Ok(())
        }
        fn complete(
            &mut self,
            _deadline: Instant,
            done: &mut dyn FnMut(u64, io::Result<&dyn ReadOut>),
        ) -> io::Result<()> {
            assert!(!self.pending.is_empty(), "complete() with nothing outstanding would wait forever");
            while let Some((tag, offset, write, len)) = self.pending.pop_back() {
                let mut s = self.state.lock().unwrap();
                let range = offset as usize..offset as usize + len;
                if s.fail.is_some_and(|(a, b)| offset < b && offset + len as u64 > a) {
                    drop(s);
                    done(tag, Err(io::Error::other("injected failure")));
                    continue;
                }
                match write {
                    Some(data) => {
                        s.data[range].copy_from_slice(&data);
                        drop(s);
                        done(tag, Ok(&Vec::new()));
                    }
                    None => {
                        let data = s.data[range].to_vec();
                        drop(s);
                        done(tag, Ok(&data));
                    }
                }
            }
            Ok(())
        }
        fn flush(&mut self) -> io::Result<()> {
            self.state.lock().unwrap().flushes += 1;
            Ok(())
        }
        fn tick(&mut self) -> io::Result<()> {
            Ok(())
        }
        fn close(&mut self) -> io::Result<()> {
            assert!(self.pending.is_empty(), "closed with operations outstanding");
            self.state.lock().unwrap().closed = true;
            Ok(())
        }
    }
}
