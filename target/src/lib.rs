//! rblk-target: the daemon that exposes volumes held in registered memory over RDMA RC queue
//! pairs. Initiators read and write them with one-sided RDMA READ and WRITE; the daemon only runs
//! the small control channel (hello, authentication, open, flush, close).
//!
//! This crate is the daemon's library half (configuration now; sessions and volumes come with the
//! control protocol) so that tests can drive it in-process over the in-memory fabric.

#![forbid(unsafe_code)]

pub mod config;
