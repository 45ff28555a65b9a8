//! What one NBD client is served from: an rblk session run by the block-I/O engine
//! ([`Engine`]), with one [`Lane`] for the client's requests. The lane does the block work
//! (splitting, depth, read-modify-write, FUA, zeroes, flushing exactly what is dirty); the
//! server only translates requests and replies.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rblk_initiator::engine::{piece_size, Engine, EngineStats, Lane};
use rblk_initiator::Volume;

use super::wire::ExportGeometry;

/// An export's size, shared by the request checks (the reader thread) and the volume's
/// size-change callback: the one place a grown volume's new end is known, so a request past the
/// old end is served as soon as the volume grew.
#[derive(Debug, Clone)]
pub struct SharedSize(Arc<AtomicU64>);

impl SharedSize {
    /// Starts at `size` bytes.
    pub fn new(size: u64) -> SharedSize {
        SharedSize(Arc::new(AtomicU64::new(size)))
    }

    /// The size now.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Grows to `size`; false (and nothing changes) unless that is larger: volumes only grow,
    /// and a late report of an older size must not shrink the export.
    pub fn grow_to(&self, size: u64) -> bool {
        self.0.fetch_max(size, Ordering::AcqRel) < size
    }
}

/// What runs when the volume grows, after the request checks took the new size.
type Hook = Box<dyn Fn(u64) + Send + Sync>;

/// [`Device::on_resize`]'s hooks, shared with the session's one callback.
#[derive(Default, Clone)]
struct Hooks(Arc<Mutex<Vec<Hook>>>);

impl Hooks {
    fn add(&self, hook: Hook) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(hook);
    }

    fn call(&self, new: u64) {
        for hook in self.0.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            hook(new);
        }
    }
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} hooks", self.0.lock().unwrap_or_else(PoisonError::into_inner).len())
    }
}

/// What the size-change callback runs: the export's size first (so requests past the old end
/// pass the checks before anyone is told), then `then` once per growth. It must not block: it
/// runs on the volume's I/O thread.
fn on_grow(size: SharedSize, then: impl Fn(u64) + Send + Sync + 'static) -> impl Fn(u64) + Send + Sync + 'static {
    move |new| {
        if size.grow_to(new) {
            then(new);
        }
    }
}

/// A client's rblk session.
#[derive(Debug)]
pub struct Device {
    // Declaration order is drop order: the lane goes before the session.
    lane: Lane,
    engine: Engine,
    /// Size, block size, flags at open; the size is `size`'s.
    geo: ExportGeometry,
    size: SharedSize,
    /// [`on_resize`](Self::on_resize)'s hooks.
    hooks: Hooks,
    /// Held while this client is the export's only one (released when it is done).
    slot: Option<super::Slot>,
    /// The session in the export's `--metrics`, until it closed.
    counted: Option<crate::metrics::Counted>,
}

impl Device {
    /// Pieces in flight per client.
    pub const DEPTH: u32 = 32;
    /// Bytes per piece (less if the volume's largest I/O is smaller): 32 x 128 KiB pins 4 MiB
    /// per client.
    pub const PIECE: u32 = 128 << 10;

    /// Serves `vol` with a lane of [`DEPTH`](Self::DEPTH) pieces of [`PIECE`](Self::PIECE)
    /// bytes.
    pub fn open(vol: Volume) -> rblk_initiator::Result<Device> {
        Device::open_with(vol, Device::DEPTH, Device::PIECE)
    }

    /// Serves `vol` with a lane of `depth` pieces of about `piece` bytes (clamped to the
    /// volume's largest I/O, a multiple of its block size).
    pub fn open_with(vol: Volume, depth: u32, piece: u32) -> rblk_initiator::Result<Device> {
        // No shared lanes: the client's requests go to a lane of their own.
        let engine = Engine::new(vol, 0)?;
        let g = engine.geometry();
        let lane = engine.lane(depth, piece_size(&g, piece))?;
        let geo = ExportGeometry {
            size: g.size,
            block_size: g.block_size,
            read_only: g.read_only,
            discards: engine.discards(),
        };
        // One callback of the session's, from the start: the request checks follow a grow whoever
        // else is told.
        let (size, hooks) = (SharedSize::new(g.size), Hooks::default());
        let told = hooks.clone();
        engine.on_resize(on_grow(size.clone(), move |new| told.call(new)));
        Ok(Device { lane, engine, geo, size, hooks, slot: None, counted: None })
    }

    /// Keeps `slot` until the client is done.
    pub fn with_slot(mut self, slot: Option<super::Slot>) -> Device {
        self.slot = slot;
        self
    }

    /// Counts the session in `metrics` (its final numbers stay there once it closed).
    pub fn counted_in(mut self, metrics: &std::sync::Arc<crate::metrics::Metrics>) -> Device {
        self.counted = Some(metrics.add(self.engine.counters()));
        self
    }

    /// Size (now), block size, read-only.
    pub fn geometry(&self) -> ExportGeometry {
        ExportGeometry { size: self.size.get(), ..self.geo }
    }

    /// The export's size as the request checks see it.
    pub fn size(&self) -> SharedSize {
        self.size.clone()
    }

    /// When the volume grows: the request checks take the new size, then `hook(new size)`
    /// runs, once per grow, on the thread that learnt it (it must not block: hand the size to
    /// a channel).
    pub fn on_resize(&self, hook: impl Fn(u64) + Send + Sync + 'static) {
        self.hooks.add(Box::new(hook));
    }

    /// The lane for the client's requests.
    pub fn lane(&mut self) -> &mut Lane {
        &mut self.lane
    }

    /// The session's counters.
    pub fn stats(&self) -> EngineStats {
        self.engine.stats()
    }

    /// The target's address.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.engine.addr()
    }

    /// Ends the session: the lane goes (anything still in flight is abandoned), then the
    /// engine flushes what was written since the last flush (nothing when clean) and closes.
    pub fn close(self) -> rblk_initiator::Result<()> {
        let Device { lane, engine, slot, counted, .. } = self;
        // The client is done: the next one may start while this session says goodbye.
        drop(slot);
        drop(lane);
        let closed = engine.close().map(|_| ());
        // After the close, so that its last FLUSH counts.
        drop(counted);
        closed
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Catches a callback that tells the kernel before the checks take the new size, one that
    /// reports the same size twice, or a late smaller report that shrinks the export.
    #[test]
    fn the_size_grows_before_the_hook_runs_and_only_grows() {
        let size = SharedSize::new(1 << 20);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let hook = {
            let (size, seen) = (size.clone(), Arc::clone(&seen));
            on_grow(size.clone(), move |new| seen.lock().unwrap().push((new, size.get())))
        };
        hook(2 << 20);
        hook(2 << 20);
        hook(1 << 20);
        hook(3 << 20);
        assert_eq!(*seen.lock().unwrap(), [(2 << 20, 2 << 20), (3 << 20, 3 << 20)]);
        assert_eq!(size.get(), 3 << 20);
    }
}
