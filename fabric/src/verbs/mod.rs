//! Real verbs: sideway for devices, protection domains, registrations, CQs and QPs; its sys crate
//! for rdma_cm and for the CQ calls sideway does not wrap.

pub(crate) mod cm;
pub(crate) mod device;
pub(crate) mod endpoint;
pub(crate) mod qp;
pub(crate) mod shared_cq;
pub(crate) mod srq;

pub(crate) use endpoint::{Endpoint, Listener, Mr, Mw, Pd, Request};
