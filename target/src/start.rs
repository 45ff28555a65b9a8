//! What starting (or reloading) the daemon reports: [`Progress`] while volumes load, and
//! [`StartError`] when it cannot start or a new configuration cannot apply.

pub use crate::errors::StartError;

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
