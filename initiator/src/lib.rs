//! rblk-initiator: the client side of rblk. Sessions connect to an `rblk-target` over rdma_cm,
//! authenticate and open a volume; reads and writes are one-sided RDMA READ and WRITE into the
//! target's registered memory.
//!
//! Sessions, volumes and queues arrive with the control protocol; today the crate offers the
//! `rblk devices` listing through [`rblk_fabric::list_devices`].

#![forbid(unsafe_code)]

pub use rblk_fabric::{list_devices, DeviceInfo};
