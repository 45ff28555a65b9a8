//! rblk-initiator: the client side of rblk. A [`Session`] connects to an `rblk-target` over
//! rdma_cm, authenticates with a pre-shared key when the target asks, and opens a [`Volume`];
//! reads and writes are one-sided RDMA READs and WRITEs straight into the target's registered
//! memory, which the target's CPU never touches.
//!
//! - Control path: [`Session`] (HELLO, CHALLENGE/AUTH, OPEN) and [`Volume`]'s FLUSH, STATS and
//!   CLOSE, as request/reply over SEND/RECV with tags (`conn.rs`).
//! - Data path: [`Volume::read_at`] / [`Volume::write_at`], synchronous, through a registered
//!   bounce buffer; [`Queue`], a further QP of the session for asynchronous I/O from a
//!   [`BufferPool`] of registered [`Buffer`]s.
//! - Checks: every access passes [`Geometry::check`] before it is posted, because one bad RDMA
//!   access puts both ends' queue pairs into error.
//!
//! ```no_run
//! use std::time::{Duration, Instant};
//! use rblk_initiator::{Done, OpenMode, Options, Session};
//!
//! let opts = Options { key: Some(Options::key_from_file("/etc/rblk/key")?), ..Options::default() };
//! let mut vol = Session::connect("rblk://10.0.0.1/vol0", &opts)?.open(OpenMode::ReadWrite)?;
//!
//! // Synchronous: any block-aligned range, split into chunks of at most max_io.
//! vol.write_at(&[7u8; 8192], 0)?;
//! let mut back = vec![0u8; 8192];
//! vol.read_at(&mut back, 0)?;
//!
//! // Asynchronous: a queue of depth 32 with 4 KiB pool buffers.
//! let mut q = vol.queue_with(32, 4096)?;
//! for i in 0..32u64 {
//!     q.submit_read(i * 4096, 4096, i)?;
//! }
//! let mut done: Vec<Done> = std::iter::repeat_with(Done::default).take(32).collect();
//! let mut left = 32;
//! while left > 0 {
//!     let n = q.wait(&mut done, Instant::now() + Duration::from_secs(30))?;
//!     for d in &mut done[..n] {
//!         d.result.as_ref().map_err(|e| format!("read {}: {e}", d.user_data))?;
//!         d.read_data(&mut back[..4096])?;
//!         d.release();
//!     }
//!     left -= n;
//! }
//! let volatile = vol.flush()?;
//! println!("flushed ({})", if volatile { "volatile: RAM only" } else { "durable" });
//! vol.close()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Threads and cleanup
//!
//! No hidden threads: every call runs on the caller's thread, and waits spin briefly on the
//! completion queue, then sleep on its completion channel, always until a deadline
//! ([`Options::timeout`] for control exchanges, [`Options::io_timeout`] for synchronous I/O).
//! A [`Session`], [`Volume`] and [`Queue`] each own one queue pair and are `Send`, not `Sync`:
//! give each thread its own queue. [`Buffer`]s may go anywhere; dropping one returns it to its
//! pool.
//!
//! Dropping a volume or queue disconnects its QP (the target then drops the connection and its
//! memory window, or, for a session without windows, its registration with the last one); [`Volume::close`] asks the target to revoke the
//! session's access first. Buffers a failed connection had posted are not reused until the NIC
//! has let go of them.
//!
//! # Faults
//!
//! A session notices a lost target from rdma_cm when it says so (the target disconnected or its
//! process died: every wait watches the connections' CM channels, and an event loop of the
//! caller's watches [`Lane::cm_fds`] or [`Queue::cm_fd`]), from any queue pair's error completion, from keepalives
//! stopping (every QP sends KEEPALIVE every [`KEEPALIVE_INTERVAL`] and expects the target's;
//! silence for `KEEPALIVE_TIMEOUT` is loss), or from a failed control exchange. It then
//! reconnects every [`Reconnect::delay`] through the URI's addresses in turn: a new session
//! whose OPEN names the old one, which the target tears down first (its QPs, its registration,
//! its open) so that no late write of an old QP can land after a replayed one. Operations in
//! flight and submitted meanwhile are parked and posted again on new queue pairs; nothing fails
//! until [`Reconnect::fast_io_fail_tmo`] (EIO while reconnecting goes on) or
//! [`Reconnect::ctrl_loss_tmo`] (the session gives up). The volume instance's identity in
//! OPENED decides what may continue: a RAM volume that restarted fails ("volume contents lost");
//! a durable volume that crashed lost the unflushed writes, and the next flush fails with
//! [`Error::WritesLost`]. Threads that own idle queues call [`Queue::tick`] (or
//! [`Lane::tick`], [`Engine::tick`], [`Volume::keepalive`]) every second or so, so that
//! keepalives go out and a lost session is reconnected while nobody does I/O; between ticks
//! they sleep on the CM channels too ([`Lane::idle_wait`], [`Engine::idle_wait`], or their own
//! loop over [`Lane::cm_fds`] calling [`Lane::cm_event`]), so a loss is seen when it happens.
//! Targets without `FEATURE_RECONNECT`, and `ctrl_loss_tmo` 0, get the old behaviour: a failed
//! connection is final ([`Error::ConnectionLost`]).
//!
//! Durability: a completed write is in target memory; [`Volume::flush`] (after reaping every
//! queue's writes it should cover) makes it durable, and returns whether the volume is RAM only.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod buffer;
mod conn;
mod control;
mod dirty;
pub mod engine;
mod error;
mod holds;
mod io_state;
mod link;
mod options;
mod queue;
mod range;
mod session;
mod size;
mod stats;
pub mod trust;
mod uri;
mod volume;
mod wait;

pub use buffer::{Buffer, BufferPool};
pub use conn::{periodic_checks, NO_TICKS_ENV};
pub use control::Control;
pub use dirty::Dirty;
pub use engine::{Engine, EngineCounters, Lane};
pub use error::{busy_after, Direction, Error, InvalidReason, Result};
pub use link::{Continuity, LinkState};
pub use options::{
    check_host_id, first_connect_pause, KeySearch, Options, Reconnect, DEFAULT_CTRL_LOSS_TMO, DEFAULT_IO_TIMEOUT,
    DEFAULT_RECONNECT_DELAY, DEFAULT_TIMEOUT, EXACT_RECONNECT_DELAY, FIRST_CONNECT_MAX_PAUSE, MAX_RECONNECT_TIME,
    MAX_SPIN, MAX_TIMEOUT,
};
#[cfg(feature = "clap")]
pub use options::{ReconnectArgs, RouteArgs, TrustArgs};
pub use options::{ETC_TARGET_KEY, HOST_KEYS_DIR, KEY_FILE_ENV, KEY_ROOT_ENV, LOCAL_TARGET_KEY};
pub use queue::{Done, Queue, MAX_DEPTH};
pub use range::Geometry;
pub use rblk_fabric::{list_devices, process_cpu_time, why_no_device, Chain, DeviceInfo, Fabric};
/// The longest range one DISCARD or WRITE_ZEROES names on the wire: what front ends advertise as
/// their largest discard and write-zeroes request (the engine splits longer ones).
pub use rblk_proto::MAX_ZERO_LEN;
pub use rblk_proto::{
    check_duration, format_duration, from_hex, parse_bounded, parse_duration, parse_duration_bounded,
    parse_duration_in, printable, to_hex, Bytes, ErrorCode, ListEntry, OpenMode, StatsReply, VolumeFlags, VolumeId,
    BLOCK_SIZE, KEEPALIVE_INTERVAL,
};
pub use session::{Predecessor, Session, MAX_LISTED};
pub use size::parse_size;
pub use stats::{EngineStats, Latency};
pub use trust::{KNOWN_TARGETS, KNOWN_TARGETS_ENV};
pub use uri::{ToUri, Uri};
pub use volume::Volume;
pub use wait::{Wait, Waiter, MAX_ADAPTIVE_SPIN};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_move_between_threads() {
        fn send<T: Send>() {}
        fn send_sync<T: Send + Sync>() {}
        send::<Session>();
        send::<Volume>();
        send::<Queue>();
        send::<Done>();
        send_sync::<Buffer>();
        send_sync::<BufferPool>();
        send_sync::<Error>();
    }
}
