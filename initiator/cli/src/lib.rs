//! rblk: the client of rblk volumes and its front ends, on the initiator library's block-I/O
//! engine ([`rblk_initiator::engine`]):
//!
//! - [`ublk`]: `rblk attach`, a volume as a Linux block device `/dev/ublkbN`: each ublk queue is
//!   served by one thread that owns one queue pair of the session, with the ublk I/O buffers
//!   registered with the NIC (RDMA lands in them directly).
//! - [`nbd`]: `rblk nbd`, a volume as an NBD export (TCP or a Unix socket).
//! - [`mount`]: `rblk mount` and `rblk umount`, a volume as one file in a FUSE filesystem
//!   ([`fusefs`]), optionally behind a loop device.
//! - [`metrics`]: `--metrics ADDR:PORT` of those three, `rblk_initiator_*` in Prometheus' format.
//! - [`list`]: the attachments, mounts and exports on this host (`rblk list`).
//!
//! The library ([`rblk_initiator`]) compiles none of this crate's dependencies (fuser, libublk,
//! clap, anyhow, tracing-subscriber).

#![forbid(unsafe_code)]

pub mod cli;
pub mod common;
pub mod daemon;
pub mod fusefs;
pub mod list;
pub mod metrics;
pub mod mount;
pub mod nbd;
pub mod stages;
pub mod stdio;
pub mod ublk;
