//! What starting (or reloading) the daemon reports: [`Progress`] while volumes load, and
//! [`StartError`] when it cannot start or a new configuration cannot apply.

use std::net::SocketAddr;

/// What the server is doing while it starts or reloads, for a caller that reports progress
/// (the daemon tells systemd: see [`crate::notify`]).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Progress<'a> {
    /// About to create (RAM) or load (durable) volume `name`, number `index` (from 1) of
    /// `count`, before it is served.
    Loading {
        /// Its name.
        name: &'a str,
        /// Which one, from 1.
        index: usize,
        /// Of how many.
        count: usize,
        /// Its size in bytes.
        size: u64,
        /// Loaded from a backing store (takes as long as reading `size` bytes).
        durable: bool,
    },
}

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// No usable RDMA device.
    #[error(transparent)]
    NoDevice(rblk_fabric::Error),
    /// A volume could not be created.
    #[error("volume {name}")]
    Volume {
        /// Which.
        name: String,
        /// Why.
        #[source]
        source: rblk_fabric::Error,
    },
    /// The same volume name twice.
    #[error("volume {0} is configured twice")]
    DuplicateVolume(String),
    /// A volume's name, size or backing path cannot work.
    #[error("volume {name}")]
    InvalidVolume {
        /// Which.
        name: String,
        /// Why.
        #[source]
        source: Box<crate::config::ConfigError>,
    },
    /// Hosts or access lists do not make sense.
    #[error("access configuration")]
    Access(#[source] crate::access::PolicyError),
    /// A reload would widen access, and the file does not say `confirm_widen = true`.
    #[error(transparent)]
    Widens(#[from] crate::access_changes::Unconfirmed),
    /// The state directory (or a directory above it) is controlled by someone other than root
    /// or this user, who could plant a key or an identity record in it.
    #[error("state directory {} is refused", path.display())]
    StateDir {
        /// The state directory.
        path: std::path::PathBuf,
        /// Which component, and why.
        #[source]
        source: rblk_fabric::trusted::PathError,
    },
    /// A reload would remove RAM volumes that sessions wrote, and the file does not confirm it.
    #[error(
        "the configuration removes RAM volume(s) {} that sessions have written: their contents would be lost; \
         keep them in the configuration, or list them in confirm_remove = [...] to remove them",
        .0.join(", ")
    )]
    WouldLoseData(Vec<String>),
    /// A reload during a handover.
    #[error("a handover is under way: reload once it is over")]
    HandoverUnderWay,
    /// Every volume was refused.
    #[error("no volume to serve: {0}")]
    NoVolumes(String),
    /// The metrics endpoint could not listen.
    #[error("cannot serve metrics on {addr}")]
    Metrics {
        /// Address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The admin socket could not be served.
    #[error(transparent)]
    Admin(crate::admin::SocketError),
    /// Taking the volumes over from the running daemon failed (it serves on, unless it went
    /// away).
    #[error(transparent)]
    Handover(#[from] crate::handover::HandoverError),
    /// The worker threads could not be started.
    #[error("cannot start the worker threads")]
    Workers(#[source] rblk_fabric::Error),
    /// Listening failed.
    #[error("cannot listen on {addr}")]
    Listen {
        /// Address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: rblk_fabric::Error,
    },
}
