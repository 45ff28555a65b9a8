//! What one NBD client is served from: an rblk session run by the block-I/O engine
//! ([`Engine`]), with one [`Lane`] for the client's requests. The lane does the block work
//! (splitting, depth, read-modify-write, FUA, zeroes, flushing exactly what is dirty); the
//! server only translates requests and replies.

use rblk_initiator::engine::{piece_size, Engine, EngineStats, Lane};
use rblk_initiator::Volume;

use super::wire::ExportGeometry;

/// A client's rblk session.
#[derive(Debug)]
pub struct Device {
    // Declaration order is drop order: the lane goes before the session.
    lane: Lane,
    engine: Engine,
    geo: ExportGeometry,
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
        Ok(Device { lane, engine, geo, slot: None, counted: None })
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

    /// Size, block size, read-only.
    pub fn geometry(&self) -> ExportGeometry {
        self.geo
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
