//! rblk-target: the daemon that exposes volumes held in registered memory over RDMA RC queue
//! pairs. Initiators read and write them with one-sided RDMA READ and WRITE; the daemon runs only
//! the small control channel (hello, authentication, open, join, flush, stats, close) and never
//! touches the data path.
//!
//! Layout, in tiers (docs/DESIGN.md draws them; `tests/tiers.rs` keeps them): a module imports
//! only its own tier and those below, and no driver imports another.
//!
//! - Base: [`config`] (the configuration: command line, config file and its checks), [`cli`]
//!   (the flags), [`saved`] (`admin.toml`), [`lint`] and [`resources`] (`--check-config`'s
//!   findings, and what the caps need from the host's limits), [`access`] (keys, host identities
//!   and volume access lists), [`access_changes`] (what a reload changes about them, and which
//!   changes widen access), [`admission`] (connections not authenticated yet), [`identity`]
//!   (volume instance identities, kept across clean shutdowns in the state dir), [`counters`],
//!   [`reload`] (what a configuration change at run time reports), [`start`] (what starting
//!   reports), [`persist`] and [`uring`] (durable volumes: backing store, io_uring load and
//!   write-back), [`notify`] (systemd readiness, for the binary), [`admin_protocol`] (the admin
//!   socket's requests, replies and client) and [`errors`] (the errors the modules hand each
//!   other).
//! - Core: [`volume`] (the volume store: memory and open modes), [`session`] (a session's
//!   protection domain and its access to the volume: a memory window per QP over the volume's
//!   one registration, or a registration of its own), [`registry`] (what every thread shares:
//!   volumes, limits, sessions, connections), [`control`] (one connection's control protocol),
//!   `connection` (admission and the connection's turns: control messages, keepalives, loss
//!   detection).
//! - Drivers: `worker` (the threads that serve connections), [`admin`] (the admin socket:
//!   volumes added, removed and listed at run time), [`handover`] (the volumes handed to a
//!   successor daemon: `--takeover`, `admin handover`), [`metrics`] (the Prometheus text).
//! - Top: [`server`] (start, the rdma_cm listener, shutdown, and configuration changes at run
//!   time: SIGHUP).
//!
//! ```no_run
//! use rblk_target::{config::Config, server::Server};
//! let running = Server::start(Config::default())?;
//! println!("listening on {}", running.local_addr());
//! running.shutdown();
//! # Ok::<(), rblk_target::start::StartError>(())
//! ```
//!
//! Threads: one listener thread, [`config::Config::workers`] worker threads that each serve
//! many connections (waiting on all their completion channels at once; data transfers complete
//! without them), one slow-work thread for the steps that may block (an OPEN's registration, a
//! CLOSE's deregistration, a connection's teardown), plus a durable volume's write-back thread
//! while FLUSHes wait: [`persist::Group`] runs one pass at a time on a
//! thread of its own, and the connections whose FLUSHes it covers go on sending and taking
//! keepalives meanwhile. Connections (a session's JOINs included) are capped, see
//! [`config::Config::max_joins_per_session`]. Cleanup: a session's
//! windows (or its own registration) are dropped on CLOSE, when its last connection goes, or when
//! a reconnecting OPEN replaces the session (before OPENED is sent, after its QPs are gone); a
//! connection that leaves takes its own window along. A volume's registration for windows lives
//! as long as the volume is served. A connection goes when
//! its initiator vanishes: a keepalive of ours fails or stays uncompleted, or an initiator that
//! negotiated keepalives sends nothing, for [`config::Config::keepalive_timeout`].
//! [`server::Running::shutdown`] disconnects everyone, deregisters everything, flushes durable
//! volumes and then records their identities in the state dir. [`server::Running::reload`]
//! (callable from any thread, one at a time) removes only volumes nobody has open, flushing
//! durable ones the same way first.

// Only the io_uring module may use `unsafe` (the kernel writes our memory asynchronously).
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

pub mod access;
pub mod access_changes;
pub mod admin;
pub mod admin_protocol;
pub mod admission;
pub mod cli;
pub mod config;
mod connection;
pub mod control;
pub mod counters;
pub mod errors;
pub mod handover;
pub mod identity;
pub mod lint;
pub mod metrics;
pub mod notify;
pub mod persist;
pub mod registry;
pub mod reload;
pub mod resources;
pub mod saved;
pub mod server;
pub mod session;
pub mod start;
#[allow(unsafe_code)]
pub mod uring;
pub mod volume;
mod worker;

/// `n` and the noun, singular for one ("1 volume", "3 volumes"): messages say what they count,
/// not "volume(s)".
pub fn counted(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}
