//! rblk's fabric: RDMA verbs over `sideway`, and (feature `mem`) an in-memory fabric with the same
//! interface for fast tests of target and initiator logic on machines without RDMA.
//!
//! The pieces, in the order a connection uses them:
//! - [`list_devices`]: what RDMA devices, ports and addresses there are.
//! - [`Memory`]: a mapping we own, anonymous or of a memfd sealed against resizing (volumes).
//!   Never borrowed as a slice: bytes are copied in and out with [`Memory::read_at`] /
//!   [`Memory::write_at`], because a NIC may write it at any time. Never hole-punched or
//!   `MADV_DONTNEED`ed while registered: the NIC would keep the old pages.
//! - [`Pd`] and [`Mr`]: a protection domain and a registration of a whole [`Memory`] in it, with
//!   the [`Access`] chosen by the caller. An `Mr` holds its `Memory` alive.
//! - [`Listener`] / [`Request`] (passive side) and [`Endpoint::resolve`] (active side): rdma_cm
//!   connections carrying up to 56 bytes of private data. Device, port and GID follow from the
//!   IP address; a device name only filters.
//! - [`Endpoint`]: one RC queue pair with its own CQ and completion channel. Post SEND, RDMA WRITE
//!   and RDMA READ in batches ([`Endpoint::post`]), post RECVs, poll completions, or wait for them
//!   with hybrid polling (spin briefly, then arm the CQ and sleep) and a deadline.
//!
//! Beside the fabric, the pieces target and initiator share: [`liveness`] (the keepalive rules)
//! and [`keyfile`] (the one reader and generator of key files, with their length and mode rules).
//!
//! Every QP gets the attributes of [`policy`]: read depth 16, retries, RNR retry, so an RDMA READ
//! never silently hangs on a read depth of 0 and a late RECV does not kill the connection.
//!
//! ```no_run
//! use std::time::{Duration, Instant};
//! use rblk_fabric::{Access, Endpoint, Fabric, Local, Memory, Op, QpConfig, Route, WorkRequest};
//!
//! # fn main() -> rblk_fabric::Result<()> {
//! let deadline = Instant::now() + Duration::from_secs(5);
//! let mut ep = Endpoint::resolve(Fabric::Verbs, "10.0.0.1:7420".parse().unwrap(), None,
//!                                &Route::default(), &QpConfig::default(), deadline)?;
//! ep.connect(&[], deadline)?;
//! let buf = ep.pd().register(&Memory::anonymous(4096)?, Access::LOCAL)?;
//! // Read 4 KiB at the peer's address 0x1000 with its rkey 0x1234 into `buf`.
//! ep.post(&[WorkRequest {
//!     wr_id: 1,
//!     op: Op::Read { remote_addr: 0x1000, rkey: 0x1234 },
//!     local: Local::Region { mr: &buf, offset: 0, len: 4096 },
//!     signaled: true,
//! }])?;
//! let mut done = [rblk_fabric::Completion::EMPTY; 1];
//! let n = ep.wait(&mut done, Duration::from_micros(20), deadline)?;
//! assert_eq!(n, 1);
//! done[0].ok()?;
//! # Ok(()) }
//! ```
//!
//! Threads and cleanup: an [`Endpoint`] has one owner, the thread that posts and polls it. A
//! [`Waker`] (any thread) interrupts its wait. [`Pd`] and [`Mr`] are `Send + Sync` and reference
//! counted; dropping the last handle deregisters or deallocates. An [`Mw`] is deallocated by
//! [`Mw::dealloc`], which says whether that worked, or by a drop. Dropping an endpoint destroys its
//! QP, CQ and rdma_cm id (which disconnects). A buffer handed to the NIC must stay untouched by
//! the caller until the completion of its work request is polled.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

pub mod channel;
mod completion;
mod error;
pub mod fdpass;
pub mod keyfile;
pub mod liveness;
#[cfg(feature = "mem")]
pub mod mem;
mod memory;
pub mod policy;
pub mod poller;
pub mod private;
pub mod trusted;
mod verbs;

use std::collections::VecDeque;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd as _, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use completion::{Completion, WcOpcode, WcStatus};
pub use error::{memlock_limit, process_cpu_time, run_only_when_idle, AddrDisplay, Chain, Error, RejectBytes, Result};
pub use keyfile::random;
pub use memory::{Memory, Reservation};

/// Which fabric to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fabric {
    /// Real RDMA verbs (InfiniBand, RoCE, rxe).
    #[default]
    Verbs,
    /// The in-memory fabric: peers in the same process, one-sided operations emulated with copies.
    #[cfg(feature = "mem")]
    Mem,
}

/// One RDMA device.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// Device name, e.g. `mlx5_0` or `rxe0`.
    pub name: String,
    /// Its ports.
    pub ports: Vec<PortInfo>,
}

/// One port of a device.
#[derive(Debug, Clone)]
pub struct PortInfo {
    /// Port number (from 1).
    pub port: u8,
    /// True when the port is ACTIVE.
    pub active: bool,
    /// The port state, as text.
    pub state: String,
    /// IP addresses in the port's GID table (RoCE).
    pub addrs: Vec<IpAddr>,
    /// `Ethernet` (RoCE) or `InfiniBand`.
    pub link_layer: String,
    /// The port's active MTU in bytes (256 to 4096).
    pub active_mtu: u32,
    /// The network devices behind its GIDs (RoCE), e.g. `eth0`.
    pub netdevs: Vec<String>,
    /// The kinds of its GIDs: `RoCE v2`, `RoCE v1`, `IB`.
    pub gid_types: Vec<String>,
}

/// Lists RDMA devices. An empty list (not an error) when the machine has none or lacks the
/// RDMA libraries: [`why_no_device`] then says which.
pub fn list_devices() -> Result<Vec<DeviceInfo>> {
    verbs::device::list()
}

/// Why [`list_devices`] finds nothing here, for a user: no RDMA driver loaded, a driver but no
/// device, or devices whose verbs files this user may not open.
pub fn why_no_device() -> String {
    verbs::device::why_none(std::path::Path::new("/sys/class/infiniband"), std::path::Path::new("/dev/infiniband"))
}

/// Remote access granted by a registration (local write is always granted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Access {
    /// Peers may RDMA READ it.
    pub remote_read: bool,
    /// Peers may RDMA WRITE it.
    pub remote_write: bool,
    /// Memory windows may be bound to it (`IBV_ACCESS_MW_BIND`): remote access then goes
    /// through the windows' rkeys, which can be narrower than the registration's.
    pub mw_bind: bool,
}

impl Access {
    /// Local buffers only.
    pub const LOCAL: Access = Access { remote_read: false, remote_write: false, mw_bind: false };
    /// Peers may read.
    pub const REMOTE_READ: Access = Access { remote_read: true, remote_write: false, mw_bind: false };
    /// Peers may read and write.
    pub const REMOTE_READ_WRITE: Access = Access { remote_read: true, remote_write: true, mw_bind: false };
    /// No remote access of its own, but memory windows may be bound to it: the registration
    /// under type 2 windows, so that only a window's rkey (bound to one QP) reaches it.
    pub const BIND_ONLY: Access = Access { remote_read: false, remote_write: false, mw_bind: true };
}

/// Queue pair sizing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpConfig {
    /// Send queue depth (SEND, WRITE and READ work requests outstanding).
    pub send_depth: u32,
    /// Receive queue depth.
    pub recv_depth: u32,
    /// Largest inline payload.
    pub max_inline: u32,
}

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig { send_depth: 64, recv_depth: 16, max_inline: 128 }
    }
}

/// How the active side reaches a target, besides its address: the device to insist on, the local
/// address to connect from, and the type of service. For RoCE users these are perftest's `-d`,
/// `-x` (by address rather than GID index) and `-T`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Route {
    /// Only use this RDMA device; the address decides the device, this checks it.
    pub device: Option<String>,
    /// Connect from this local address (`rdma_resolve_addr`'s source): it picks the device,
    /// port and GID. None lets routing choose.
    pub source: Option<std::net::IpAddr>,
    /// Type of service (`rdma_set_option` RDMA_OPTION_ID_TOS) of the connection: on RoCEv2
    /// the IP header's DSCP and ECN bits (the QP's traffic class), on InfiniBand it selects the
    /// service level. None keeps the kernel's default (0, or the rdma_cm default_roce_tos).
    pub tos: Option<u8>,
}

impl Route {
    /// The checks of an active connection's resolution, once `dst` turned out to be reached
    /// through device `found`: it must be the `device` asked for, and a PD given must be on it.
    pub(crate) fn check_resolved(&self, dst: SocketAddr, found: &str, pd_device: Option<&str>) -> Result<()> {
        if let Some(wanted) = self.device.as_deref().filter(|&want| want != found) {
            return Err(Error::WrongDevice { addr: dst, found: found.into(), wanted: wanted.into() });
        }
        match pd_device {
            Some(pd) if pd != found => {
                Err(Error::PdDevice { what: format!("the route to {dst}").into(), found: found.into(), pd: pd.into() })
            }
            _ => Ok(()),
        }
    }
}

/// QP attributes as the device reports them (`ibv_query_qp`), for checks and diagnostics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpAttributes {
    /// `RESET`, `INIT`, `RTR`, `RTS`, `SQD`, `SQE` or `ERR`.
    pub state: &'static str,
    /// RDMA READs this QP may have outstanding as initiator.
    pub max_rd_atomic: u8,
    /// Incoming RDMA READs this QP serves at once as responder.
    pub max_dest_rd_atomic: u8,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Transport retry count.
    pub retry_cnt: u8,
    /// RNR retry count (7 = forever).
    pub rnr_retry: u8,
    /// Minimum RNR NAK timer code.
    pub min_rnr_timer: u8,
    /// Inline data capacity.
    pub max_inline_data: u32,
    /// The traffic class of the QP's address vector (RoCE: the IP TOS byte its packets carry).
    pub traffic_class: u8,
}

macro_rules! dispatch {
    ($enum:ident, $value:expr, $x:ident => $body:expr) => {
        match $value {
            $enum::Verbs($x) => $body,
            #[cfg(feature = "mem")]
            $enum::Mem($x) => $body,
        }
    };
}

#[derive(Clone)]
enum PdInner {
    Verbs(verbs::Pd),
    #[cfg(feature = "mem")]
    Mem(mem::Pd),
}

/// A protection domain. Registrations and queue pairs in one PD may be used together only.
#[derive(Clone)]
pub struct Pd {
    inner: PdInner,
}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pd").field("device", &self.device()).finish()
    }
}

impl Pd {
    /// Allocates a protection domain on `device` (verbs) or in the in-memory fabric.
    pub fn alloc(fabric: Fabric, device: &str) -> Result<Pd> {
        let inner = match fabric {
            Fabric::Verbs => PdInner::Verbs(verbs::Pd::alloc(device)?),
            #[cfg(feature = "mem")]
            Fabric::Mem => PdInner::Mem(mem::Pd::alloc(device)?),
        };
        Ok(Pd { inner })
    }

    /// The device the PD belongs to.
    pub fn device(&self) -> &str {
        dispatch!(PdInner, &self.inner, p => p.device())
    }

    /// Whether `other` is this same protection domain (a clone of it).
    pub fn same_as(&self, other: &Pd) -> bool {
        match (&self.inner, &other.inner) {
            (PdInner::Verbs(a), PdInner::Verbs(b)) => a.same_as(b),
            #[cfg(feature = "mem")]
            (PdInner::Mem(a), PdInner::Mem(b)) => a.id() == b.id(),
            #[cfg(feature = "mem")]
            _ => false,
        }
    }

    /// Whether the device has type 2B memory windows (rkeys bound to one QP, see [`Mw`]). The
    /// in-memory fabric has them.
    pub fn type2_windows(&self) -> bool {
        match &self.inner {
            PdInner::Verbs(p) => p.type2_windows(),
            #[cfg(feature = "mem")]
            PdInner::Mem(_) => true,
        }
    }

    /// Allocates a type 2 memory window in this PD; it grants nothing until an endpoint of the
    /// PD binds it ([`Endpoint::bind_mw`]). Fails with [`Error::Unsupported`] where
    /// [`Pd::type2_windows`] is false.
    pub fn alloc_mw(&self) -> Result<Mw> {
        match &self.inner {
            PdInner::Verbs(p) => Ok(Mw { inner: MwInner::Verbs(p.alloc_mw()?) }),
            #[cfg(feature = "mem")]
            PdInner::Mem(p) => Ok(Mw { inner: MwInner::Mem(p.alloc_mw()) }),
        }
    }

    /// Registers all of `memory` with `access`.
    pub fn register(&self, memory: &Arc<Memory>, access: Access) -> Result<Mr> {
        let inner = match &self.inner {
            PdInner::Verbs(p) => MrInner::Verbs(p.register(memory, access)?),
            #[cfg(feature = "mem")]
            PdInner::Mem(p) => MrInner::Mem(p.register(memory, access)?),
        };
        Ok(Mr { inner, memory: Arc::clone(memory), access })
    }
}

/// A type 2 memory window: an rkey over part of a registration (made with
/// [`Access::BIND_ONLY`]) that works only on the QP that bound it, until it is invalidated
/// ([`Endpoint::invalidate`]), rebound, or dropped (deallocated). Granting a peer access this way
/// costs one work request, whatever the size of the memory, and revoking it is deterministic.
pub struct Mw {
    inner: MwInner,
}

enum MwInner {
    Verbs(verbs::Mw),
    #[cfg(feature = "mem")]
    Mem(mem::Mw),
}

impl std::fmt::Debug for Mw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mw").field("rkey", &self.rkey()).finish()
    }
}

impl Mw {
    /// The rkey of the last bind (peers use it with the bound range's addresses).
    pub fn rkey(&self) -> u32 {
        dispatch!(MwInner, &self.inner, m => m.rkey())
    }

    /// Deallocates the window (`ibv_dealloc_mw`), which kills its rkey at once if it is bound,
    /// from any thread, whether its QP is alive or in error. Dropping it does the same but
    /// cannot tell. On an error the window may still be valid (and is not deallocated again):
    /// the caller must take down the QP it is bound to, through which alone its rkey works.
    pub fn dealloc(self) -> Result<()> {
        match self.inner {
            MwInner::Verbs(m) => m.dealloc(),
            #[cfg(feature = "mem")]
            MwInner::Mem(m) => m.dealloc(),
        }
    }
}

enum MrInner {
    Verbs(verbs::Mr),
    #[cfg(feature = "mem")]
    Mem(mem::Mr),
}

/// A registration of a whole [`Memory`]. Dropping it deregisters; it keeps the memory mapped.
pub struct Mr {
    // Field order matters: the registration is dropped before the memory it covers.
    inner: MrInner,
    memory: Arc<Memory>,
    access: Access,
}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .field("access", &self.access)
            .finish()
    }
}

impl Mr {
    /// Local key, for this side's work requests.
    pub fn lkey(&self) -> u32 {
        dispatch!(MrInner, &self.inner, m => m.lkey())
    }
    /// Remote key, for the peer's RDMA READ/WRITE.
    pub fn rkey(&self) -> u32 {
        dispatch!(MrInner, &self.inner, m => m.rkey())
    }
    /// The address peers use for the first byte.
    pub fn addr(&self) -> u64 {
        self.memory.addr()
    }
    /// Registered length.
    pub fn len(&self) -> usize {
        self.memory.len()
    }
    /// Never empty.
    pub fn is_empty(&self) -> bool {
        false
    }
    /// The access it grants.
    pub fn access(&self) -> Access {
        self.access
    }
    /// The memory it covers.
    pub fn memory(&self) -> &Arc<Memory> {
        &self.memory
    }

    /// The local key and address of `offset..offset+len`, checked against the registration.
    pub(crate) fn sge(&self, offset: usize, len: u32) -> Result<(u32, u64)> {
        self.memory.check("local buffer", offset, len as usize)?;
        Ok((self.lkey(), self.addr() + offset as u64))
    }
}

/// What a work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A two-sided SEND.
    Send,
    /// A SEND with the solicited-event flag (`IBV_SEND_SOLICITED`): its receive completion
    /// wakes a peer whose completion queue is armed for solicited completions only
    /// ([`Endpoint::peer_solicits`]); otherwise the same as [`Op::Send`].
    SendSolicited,
    /// An RDMA WRITE of the local buffer to `remote_addr`.
    Write {
        /// Peer address.
        remote_addr: u64,
        /// Peer's rkey.
        rkey: u32,
    },
    /// An RDMA READ from `remote_addr` into the local buffer.
    Read {
        /// Peer address.
        remote_addr: u64,
        /// Peer's rkey.
        rkey: u32,
    },
}

/// The local side of a work request.
#[derive(Debug, Clone, Copy)]
pub enum Local<'a> {
    /// `len` bytes at `offset` in a registration of this endpoint's PD.
    Region {
        /// The registration.
        mr: &'a Mr,
        /// Offset into it.
        offset: usize,
        /// Bytes.
        len: u32,
    },
    /// Small data copied into the work request at post time (SEND and WRITE only).
    Inline(&'a [u8]),
}

/// One work request for [`Endpoint::post`].
#[derive(Debug, Clone, Copy)]
pub struct WorkRequest<'a> {
    /// Returned in its completion.
    pub wr_id: u64,
    /// The operation.
    pub op: Op,
    /// The local buffer.
    pub local: Local<'a>,
    /// Ask for a completion (errors complete regardless).
    pub signaled: bool,
}

/// Events of a [`Listener`].
#[derive(Debug)]
pub enum ListenerEvent<R = Request> {
    /// A peer wants to connect.
    Request(R),
    /// Connection `conn` (the number given to [`Request::accept`]) is established.
    Established {
        /// Connection number.
        conn: u64,
    },
    /// Connection `conn` was disconnected by the peer or lost.
    Disconnected {
        /// Connection number.
        conn: u64,
    },
    /// Something else, for the log.
    Other {
        /// Connection number, or 0.
        conn: u64,
        /// What happened.
        event: &'static str,
    },
    /// An RDMA device reported an asynchronous event (over verbs, any device this process has
    /// opened; the in-memory fabric's are injected by tests: [`mem::device_event`]).
    Device(DeviceEvent),
}

/// An asynchronous event of an RDMA device (`ibv_get_async_event`), already acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceEvent {
    /// The device's name.
    pub device: String,
    /// What it is about, and what it means.
    pub kind: DeviceEventKind,
    /// Its name, for the log ("QP fatal error", "port down", ...).
    pub what: &'static str,
}

/// What a [`DeviceEvent`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceEventKind {
    /// QP `qp_num` hit an error the device found (fatal, invalid request, access): it is in the
    /// error state, and its connection is over.
    QpFailed {
        /// The QP's number.
        qp_num: u32,
    },
    /// Something about QP `qp_num` that needs nothing done (communication established, send
    /// queue drained, last WQE reached, path migration).
    Qp {
        /// The QP's number.
        qp_num: u32,
    },
    /// Port `port` went down (`active` false) or came up (true), or changed otherwise (None:
    /// its GID table, LID, P_Key table, subnet manager, speed).
    Port {
        /// The port's number.
        port: u8,
        /// Its new state, if that is what changed.
        active: Option<bool>,
    },
    /// A completion queue failed (an overrun): the QPs on it stop completing.
    CqFailed,
    /// The device failed: every QP on it is lost.
    DeviceFatal,
    /// A shared receive queue ran low on buffers: its event loop was woken to give back the
    /// ones its connections hold (see [`SharedCq`]); nothing else to do.
    SrqLimit,
    /// Anything else (shared receive queue and work queue events, types unknown to us).
    Other,
}

enum ListenerInner {
    Verbs(verbs::Listener),
    #[cfg(feature = "mem")]
    Mem(mem::Listener),
}

/// A passive rdma_cm endpoint accepting connections on an address.
pub struct Listener {
    inner: ListenerInner,
    wake: WakePair,
    /// Device events read and not yet returned by [`Listener::next_event`].
    device_events: Mutex<VecDeque<DeviceEvent>>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener").field("addr", &self.local_addr()).finish()
    }
}

impl Listener {
    /// Binds and listens on `addr` (a wildcard address hears every device), accepting only
    /// requests arriving on `device` when given, with [`policy::LISTEN_BACKLOG`].
    pub fn bind(fabric: Fabric, addr: SocketAddr, device: Option<&str>) -> Result<Listener> {
        Listener::bind_backlog(fabric, addr, device, policy::LISTEN_BACKLOG)
    }

    /// [`Listener::bind`] with `backlog` connect requests at most waiting to be taken (by
    /// [`Listener::next_event`]): later ones are rejected, as the kernel's rdma_cm does (which
    /// also caps `backlog` at `net.rdma_ucm.max_backlog`); the in-memory fabric keeps the same
    /// count. 0 is taken as 1.
    pub fn bind_backlog(fabric: Fabric, addr: SocketAddr, device: Option<&str>, backlog: u32) -> Result<Listener> {
        let backlog = backlog.max(1);
        let inner = match fabric {
            Fabric::Verbs => ListenerInner::Verbs(verbs::Listener::bind(addr, device, backlog)?),
            #[cfg(feature = "mem")]
            Fabric::Mem => ListenerInner::Mem(mem::Listener::bind(addr, device, backlog)?),
        };
        Ok(Listener { inner, wake: WakePair::new()?, device_events: Mutex::default() })
    }

    /// A handle that interrupts [`Listener::next_event`] from another thread (which then returns
    /// `Ok(None)`), e.g. to shut down a daemon whose listener sleeps without a deadline.
    pub fn waker(&self) -> Waker {
        self.wake.waker()
    }

    /// The bound address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        dispatch!(ListenerInner, &self.inner, l => l.local_addr())
    }

    /// A descriptor that becomes readable when an event is pending (for poll/epoll).
    pub fn fd(&self) -> RawFd {
        dispatch!(ListenerInner, &self.inner, l => l.fd())
    }

    /// Stops listening: the port is free (another daemon may bind it) and new connect requests
    /// are refused, while the connections accepted so far keep their events here. A target
    /// closes it while it hands its volumes to a successor.
    pub fn close_port(&mut self) {
        dispatch!(ListenerInner, &mut self.inner, l => l.close_port())
    }

    /// Listens on the same address (and port) again after [`Listener::close_port`]; nothing to
    /// do when it is open.
    pub fn reopen_port(&mut self) -> Result<()> {
        dispatch!(ListenerInner, &mut self.inner, l => l.reopen_port())
    }

    /// The next event, waiting until `deadline` (None: don't wait). `Ok(None)` when none came.
    /// Over verbs this includes the asynchronous events of every RDMA device the process has
    /// opened ([`ListenerEvent::Device`]), read when the wait finds one (so only with a
    /// deadline) and returned first.
    ///
    /// A [`Waker`] ends the wait early (with `Ok(None)`): a daemon can sleep here with a far
    /// deadline and still shut down at once.
    pub fn next_event(&self, deadline: Option<Instant>) -> Result<Option<ListenerEvent>> {
        let verbs = matches!(self.inner, ListenerInner::Verbs(_));
        loop {
            if verbs {
                let mut pending = self.device_events.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Some(e) = pending.pop_front() {
                    return Ok(Some(ListenerEvent::Device(e)));
                }
            }
            let ev = match &self.inner {
                ListenerInner::Verbs(l) => l.next_event(None)?.map(|e| e.map(RequestInner::Verbs)),
                #[cfg(feature = "mem")]
                ListenerInner::Mem(l) => l.next_event(None)?.map(|e| e.map(RequestInner::Mem)),
            };
            if let Some(ev) = ev {
                return Ok(Some(ev.map(|inner| Request { inner })));
            }
            let Some(deadline) = deadline else { return Ok(None) };
            // Sleep until the listener's descriptor, the waker or a device's event descriptor is
            // readable, or the deadline.
            // A stack array: sleeping allocates nothing.
            let mut fds = [-1; verbs::cm::MAX_WAIT_FDS];
            fds[0] = self.fd();
            fds[1] = self.wake.rx.as_raw_fd();
            let devices = if verbs { verbs::device::async_fds(&mut fds[2..]) } else { 0 };
            let ready = verbs::cm::wait_any_readable(&fds[..2 + devices], Some(deadline))
                .map_err(|source| Error::Os { op: "poll on the listener", source })?;
            match ready {
                Some(1) => {
                    self.wake.drain();
                    return Ok(None);
                }
                Some(0) => continue,
                // A device's event descriptor (read only when the poll says so: a read per
                // device at every event would cost a system call each in a reconnect storm).
                Some(_) => {
                    let mut pending = self.device_events.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    verbs::device::async_events(&mut pending);
                }
                None => return Ok(None),
            }
        }
    }
}

impl<R> ListenerEvent<R> {
    fn map<S>(self, f: impl FnOnce(R) -> S) -> ListenerEvent<S> {
        match self {
            ListenerEvent::Request(r) => ListenerEvent::Request(f(r)),
            ListenerEvent::Established { conn } => ListenerEvent::Established { conn },
            ListenerEvent::Disconnected { conn } => ListenerEvent::Disconnected { conn },
            ListenerEvent::Other { conn, event } => ListenerEvent::Other { conn, event },
            ListenerEvent::Device(e) => ListenerEvent::Device(e),
        }
    }
}

enum RequestInner {
    Verbs(verbs::Request),
    #[cfg(feature = "mem")]
    Mem(mem::Request),
}

/// A connection request. Accept it (into an [`Endpoint`]) or reject it; dropping it rejects.
pub struct Request {
    inner: RequestInner,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request").field("peer", &self.peer()).field("device", &self.device()).finish()
    }
}

impl Request {
    /// The private data the peer sent with its request (zero-padded by rdma_cm).
    pub fn private_data(&self) -> &[u8] {
        dispatch!(RequestInner, &self.inner, r => r.private_data())
    }
    /// The peer's address.
    pub fn peer(&self) -> Option<SocketAddr> {
        dispatch!(RequestInner, &self.inner, r => r.peer())
    }
    /// The device the request arrived on.
    pub fn device(&self) -> &str {
        dispatch!(RequestInner, &self.inner, r => r.device())
    }
    /// Allocates a new protection domain on the request's device.
    pub fn alloc_pd(&self) -> Result<Pd> {
        let inner = match &self.inner {
            RequestInner::Verbs(r) => PdInner::Verbs(verbs::Pd::alloc(r.device())?),
            #[cfg(feature = "mem")]
            RequestInner::Mem(r) => PdInner::Mem(mem::Pd::alloc(r.device())?),
        };
        Ok(Pd { inner })
    }
    /// Refuses the connection.
    pub fn reject(self) -> Result<()> {
        self.reject_with(&[])
    }

    /// Refuses the connection, telling the peer why in `private_data` (at most 148 bytes on
    /// RoCE; the peer's connect fails with [`Error::Connect`] carrying it).
    pub fn reject_with(self, private_data: &[u8]) -> Result<()> {
        dispatch!(RequestInner, self.inner, r => r.reject(private_data))
    }

    /// [`Request::into_endpoint`] with the QP's completions on `shared` (it takes one of its
    /// places, given back when the endpoint is dropped; an error if it is full), routed to the
    /// endpoint and named `conn` by [`SharedCq::collect`]. With `shared` None, and on the
    /// in-memory fabric (where there are no shared CQs), this is [`Request::into_endpoint`].
    pub fn into_endpoint_shared(
        self,
        pd: &Pd,
        cfg: &QpConfig,
        conn: u64,
        shared: Option<&SharedCq>,
    ) -> Result<Endpoint> {
        let inner = match (self.inner, &pd.inner) {
            (RequestInner::Verbs(r), PdInner::Verbs(p)) => {
                EndpointInner::Verbs(r.into_endpoint(p, cfg, conn, shared.map(|s| &s.inner))?)
            }
            #[cfg(feature = "mem")]
            (RequestInner::Mem(r), PdInner::Mem(p)) => EndpointInner::Mem(r.into_endpoint(p, cfg, conn)?),
            #[cfg(feature = "mem")]
            _ => return Err(Error::OtherFabric { what: "the connect request" }),
        };
        Endpoint::new(inner)
    }

    /// Creates the endpoint's QP in `pd` (which must be on the request's device) and makes it
    /// ready. Later listener events about it carry `conn`. Post RECVs on the returned endpoint,
    /// then call [`Endpoint::accept`].
    pub fn into_endpoint(self, pd: &Pd, cfg: &QpConfig, conn: u64) -> Result<Endpoint> {
        self.into_endpoint_shared(pd, cfg, conn, None)
    }
}

/// A completion queue and channel shared by many endpoints of one device: an event loop's,
/// as SPDK's poll groups share a CQ per device. One CQ event covers the completions of every QP
/// on it that arrived meanwhile, one re-arm serves them all, and a QP on it brings no
/// descriptor and no CQ of its own. Endpoints on it ([`Request::into_endpoint_shared`]) are
/// polled as any ([`Endpoint::poll`]: their completions are routed to them by QP number); their
/// event loop waits for [`SharedCq::fd`] and learns which endpoints have completions from
/// [`SharedCq::collect`], not from their own [`Endpoint::event_fd`]. Only over verbs: the
/// in-memory fabric's endpoints keep their own.
#[derive(Clone)]
pub struct SharedCq {
    inner: Arc<verbs::shared_cq::SharedCq>,
}

impl std::fmt::Debug for SharedCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCq").field("fd", &self.fd()).field("placed", &self.placed()).finish()
    }
}

impl SharedCq {
    /// A shared CQ on `pd`'s device, with room for `room` QPs of `per_qp` completions
    /// outstanding each (their send and receive depths: a CQ that overflows errors every QP on
    /// it, so an endpoint beyond `room` is refused), on the device's completion vector `vector`
    /// (modulo the device's count). None on the in-memory fabric.
    pub fn new(pd: &Pd, room: usize, per_qp: u32, vector: u32) -> Result<Option<SharedCq>> {
        match &pd.inner {
            PdInner::Verbs(p) => {
                Ok(Some(SharedCq { inner: verbs::shared_cq::SharedCq::new(p, room, per_qp, vector)? }))
            }
            #[cfg(feature = "mem")]
            PdInner::Mem(_) => Ok(None),
        }
    }

    /// The descriptor an event loop waits for: readable once a completion arrived after the
    /// last [`collect`](Self::collect).
    pub fn fd(&self) -> RawFd {
        self.inner.fd()
    }

    /// QPs on it (each endpoint made on it takes a place and gives it back when dropped).
    pub fn placed(&self) -> usize {
        self.inner.placed()
    }

    /// Endpoints of `pd` made on it from now on take their control channel's receive buffers
    /// from a shared receive queue in `pd` ([`Endpoint::shares_receives`]), made now if it has
    /// none: for a PD many connections share (the target's memory-window domain). Its buffers
    /// follow the QPs that use it: one 4 KiB buffer per two, at least 32, registered in chunks
    /// of 8 as QPs come and given back as they go (a retired buffer once a message has used it).
    /// Each QP may hold `RECV_COUNT` of them unread; what it gets beyond that is copied out, at
    /// most 1,024 messages, and a receive past those completes with
    /// [`WcStatus::CREDIT_OVERRUN`](crate::WcStatus::CREDIT_OVERRUN). When the queue runs low
    /// the device's event wakes the event loop through [`SharedCq::set_waker`]. False if it has
    /// one of another PD, or one cannot be made (the error once, at the failure): the endpoints
    /// keep receive buffers of their own.
    pub fn share_receives(&self, pd: &Pd) -> Result<bool> {
        match &pd.inner {
            PdInner::Verbs(p) => self.inner.share_receives(p),
            #[cfg(feature = "mem")]
            PdInner::Mem(_) => Ok(false),
        }
    }

    /// The event loop's waker: woken when the shared receive queue runs low (the device's
    /// low-water event), so that it routes what its connections have to read.
    pub fn set_waker(&self, waker: Waker) {
        self.inner.set_waker(waker);
    }

    /// Whether it has room for one more QP (an endpoint made on a full one fails).
    pub fn has_room(&self) -> bool {
        self.inner.has_room()
    }

    /// Takes the CQ's event, routes its completions to their endpoints, arms it again, and
    /// appends to `ready` the tags (see [`Request::into_endpoint_shared`]) of the endpoints that
    /// got completions since the last call.
    pub fn collect(&self, ready: &mut Vec<u64>) -> Result<()> {
        self.inner.collect(ready)
    }

    /// Routes what the CQ holds to its endpoints without taking an event or arming it, and
    /// appends to `ready` the tags of the endpoints that got completions since the last call:
    /// at every wake-up of the event loop, for the completions that raised no event (see
    /// [`Endpoint::peer_solicits`]).
    pub fn poll(&self, ready: &mut Vec<u64>) -> Result<()> {
        self.inner.poll(ready)
    }
}

enum EndpointInner {
    Verbs(verbs::Endpoint),
    #[cfg(feature = "mem")]
    Mem(mem::Endpoint),
}

/// Waits until one of `fds` is readable (returns its index) or `deadline` passes (`None`): for
/// an endpoint's owner that sleeps on its endpoints' descriptors ([`Endpoint::event_fd`],
/// [`Endpoint::cm_fd`]) beside one of its own. Up to 8 descriptors allocate nothing.
pub fn wait_readable(fds: &[RawFd], deadline: Instant) -> Result<Option<usize>> {
    verbs::cm::wait_any_readable(fds, Some(deadline)).map_err(|source| Error::Os { op: "poll", source })
}

/// One reliable-connected queue pair with its completion queue.
pub struct Endpoint {
    inner: EndpointInner,
    wake: Wake,
}

/// How an endpoint's waiter is woken.
#[derive(Debug)]
enum Wake {
    /// Its own socket pair, which [`Endpoint::wait`] watches.
    Pair(WakePair),
    /// The waker of an event loop that waits for [`Endpoint::event_fd`] itself (see
    /// [`Endpoint::set_waker`]).
    External(Waker),
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("qpn", &self.qp_num()).field("peer", &self.peer()).finish()
    }
}

/// A socket pair: the waiting side polls `rx`, [`Waker`]s write to `tx`.
#[derive(Debug)]
struct WakePair {
    rx: UnixStream,
    tx: Arc<UnixStream>,
}

impl WakePair {
    fn new() -> Result<WakePair> {
        let err = |source| Error::Os { op: "socketpair for a waker", source };
        let (tx, rx) = UnixStream::pair().map_err(err)?;
        for s in [&tx, &rx] {
            s.set_nonblocking(true).map_err(err)?;
        }
        Ok(WakePair { rx, tx: Arc::new(tx) })
    }

    fn waker(&self) -> Waker {
        Waker { inner: WakerInner::Pair(Arc::clone(&self.tx)) }
    }

    /// Empties the pipe; true if a wake-up was pending.
    fn drain(&self) -> bool {
        let mut buf = [0u8; 64];
        let mut woken = false;
        while let Ok(n) = (&self.rx).read(&mut buf) {
            if n == 0 {
                break;
            }
            woken = true;
        }
        woken
    }
}

/// Interrupts an [`Endpoint::wait`] or a [`Listener::next_event`] from another thread, or
/// queues its tag on a [`poller::WakeQueue`] (an event loop serving many endpoints).
#[derive(Debug, Clone)]
pub struct Waker {
    inner: WakerInner,
}

#[derive(Debug, Clone)]
enum WakerInner {
    Pair(Arc<UnixStream>),
    Tagged(Arc<poller::WakeQueue>, u64),
}

impl Waker {
    pub(crate) fn tagged(queue: Arc<poller::WakeQueue>, tag: u64) -> Waker {
        Waker { inner: WakerInner::Tagged(queue, tag) }
    }

    /// Wakes the endpoint's waiter (now, or at its next wait).
    pub fn wake(&self) {
        match &self.inner {
            WakerInner::Pair(tx) => {
                let _ = (&**tx).write(&[1]);
            }
            WakerInner::Tagged(queue, tag) => queue.wake(*tag),
        }
    }
}

impl Endpoint {
    fn new(inner: EndpointInner) -> Result<Endpoint> {
        Ok(Endpoint { inner, wake: Wake::Pair(WakePair::new()?) })
    }

    /// For an event loop that waits for [`Endpoint::event_fd`] itself (a [`poller::Poller`]):
    /// [`Endpoint::waker`] returns `waker` from now on, and the endpoint's own wake-up
    /// descriptors are closed ([`Endpoint::wait`] then wakes for completions and its deadline
    /// only, and [`Endpoint::take_wake`] is false).
    pub fn set_waker(&mut self, waker: Waker) {
        self.wake = Wake::External(waker);
    }

    /// Active side, step 1: resolves `dst` (along `route`), creates a QP (in `pd`, or in a new
    /// PD on the device that reaches `dst`) and readies it for RECVs. Step 2 is
    /// [`Endpoint::connect`].
    pub fn resolve(
        fabric: Fabric,
        dst: SocketAddr,
        pd: Option<&Pd>,
        route: &Route,
        cfg: &QpConfig,
        deadline: Instant,
    ) -> Result<Endpoint> {
        if let Some(source_addr) = route.source.filter(|s| s.is_ipv4() != dst.is_ipv4()) {
            return Err(Error::SourceFamily { source_addr, dst });
        }
        let inner = match (fabric, pd.map(|p| &p.inner)) {
            (Fabric::Verbs, None) => EndpointInner::Verbs(verbs::Endpoint::resolve(dst, None, route, cfg, deadline)?),
            (Fabric::Verbs, Some(PdInner::Verbs(p))) => {
                EndpointInner::Verbs(verbs::Endpoint::resolve(dst, Some(p), route, cfg, deadline)?)
            }
            #[cfg(feature = "mem")]
            (Fabric::Mem, None) => EndpointInner::Mem(mem::Endpoint::resolve(dst, None, route, cfg, deadline)?),
            #[cfg(feature = "mem")]
            (Fabric::Mem, Some(PdInner::Mem(p))) => {
                EndpointInner::Mem(mem::Endpoint::resolve(dst, Some(p), route, cfg, deadline)?)
            }
            #[cfg(feature = "mem")]
            _ => return Err(Error::OtherFabric { what: "the fabric to connect on" }),
        };
        Endpoint::new(inner)
    }

    /// Active side, step 2: connects, sending `private_data` (at most 56 bytes).
    pub fn connect(&mut self, private_data: &[u8], deadline: Instant) -> Result<()> {
        dispatch!(EndpointInner, &mut self.inner, e => e.connect(private_data, deadline))
    }

    /// Passive side, last step: accepts the connection.
    pub fn accept(&mut self) -> Result<()> {
        dispatch!(EndpointInner, &mut self.inner, e => e.accept(&[]))
    }

    /// Local QP number.
    pub fn qp_num(&self) -> u32 {
        dispatch!(EndpointInner, &self.inner, e => e.qp_num())
    }
    /// Peer address.
    pub fn peer(&self) -> Option<SocketAddr> {
        dispatch!(EndpointInner, &self.inner, e => e.peer())
    }
    /// Local address.
    pub fn local(&self) -> Option<SocketAddr> {
        dispatch!(EndpointInner, &self.inner, e => e.local())
    }
    /// Device port in use.
    pub fn port(&self) -> u8 {
        dispatch!(EndpointInner, &self.inner, e => e.port())
    }
    /// Largest payload a SEND may carry inline ([`Local::Inline`]): its [`QpConfig::max_inline`].
    pub fn max_inline(&self) -> u32 {
        dispatch!(EndpointInner, &self.inner, e => e.max_inline())
    }
    /// The endpoint's protection domain.
    pub fn pd(&self) -> Pd {
        let inner = match &self.inner {
            EndpointInner::Verbs(e) => PdInner::Verbs(e.pd().clone()),
            #[cfg(feature = "mem")]
            EndpointInner::Mem(e) => PdInner::Mem(e.pd().clone()),
        };
        Pd { inner }
    }

    /// Posts work requests with one doorbell. Registrations must belong to this endpoint's PD.
    pub fn post(&mut self, wrs: &[WorkRequest<'_>]) -> Result<()> {
        dispatch!(EndpointInner, &mut self.inner, e => e.post(wrs))
    }

    /// Binds `mw` to `len` bytes at `offset` of `mr` for `access` (remote read, and write if
    /// asked), usable only through this endpoint's QP (type 2B), as signaled work request
    /// `wr_id`: the window works once that completes ([`WcOpcode::BindMw`]). Returns the rkey;
    /// an earlier bind's rkey of the same window stops working.
    pub fn bind_mw(&mut self, wr_id: u64, mw: &mut Mw, mr: &Mr, offset: u64, len: u64, access: Access) -> Result<u32> {
        match (&mut self.inner, &mut mw.inner) {
            (EndpointInner::Verbs(e), MwInner::Verbs(w)) => e.bind_mw(wr_id, w, mr, offset, len, access),
            #[cfg(feature = "mem")]
            (EndpointInner::Mem(e), MwInner::Mem(w)) => e.bind_mw(wr_id, w, mr, offset, len, access),
            #[cfg(feature = "mem")]
            _ => Err(Error::OtherFabric { what: "the memory window" }),
        }
    }

    /// Invalidates `rkey`, a window bound through this endpoint, as signaled work request
    /// `wr_id` ([`WcOpcode::LocalInv`]): from its completion on, no QP can use it.
    pub fn invalidate(&mut self, wr_id: u64, rkey: u32) -> Result<()> {
        dispatch!(EndpointInner, &mut self.inner, e => e.invalidate(wr_id, rkey))
    }

    /// Posts one RECV into `len` bytes at `offset` of `mr`.
    pub fn post_recv(&mut self, wr_id: u64, mr: &Mr, offset: usize, len: u32) -> Result<()> {
        dispatch!(EndpointInner, &mut self.inner, e => e.post_recv(wr_id, mr, offset, len))
    }

    /// Whether its receives come from a [`SharedCq`]'s shared receive queue (see
    /// [`SharedCq::new`]): then RECVs are not posted to it, and a receive's message is read
    /// with [`Endpoint::take_receive`]. The control [`channel`] does both.
    pub fn shares_receives(&self) -> bool {
        match &self.inner {
            EndpointInner::Verbs(e) => e.shares_receives(),
            #[cfg(feature = "mem")]
            EndpointInner::Mem(_) => false,
        }
    }

    /// Copies the first `dst.len()` bytes of the message that shared receive `wr_id` (a
    /// completion's) holds, and gives the buffer back to the shared receive queue.
    pub fn take_receive(&mut self, wr_id: u64, dst: &mut [u8]) -> Result<()> {
        match &mut self.inner {
            EndpointInner::Verbs(e) => e.take_receive(wr_id, dst),
            #[cfg(feature = "mem")]
            EndpointInner::Mem(_) => Err(Error::OtherFabric { what: "a shared receive on the in-memory fabric" }),
        }
    }

    /// Takes up to `out.len()` completions without waiting.
    pub fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        dispatch!(EndpointInner, &mut self.inner, e => e.poll(out))
    }

    /// Hybrid wait: polls for up to `spin`, then arms the CQ and sleeps until a completion,
    /// a [`Waker`], the peer's disconnect ([`Endpoint::cm_fd`]: then
    /// [`Endpoint::peer_gone`] is true) or `deadline`. Returns the number of completions stored
    /// (0: deadline, woken, see [`Endpoint::take_wake`], or disconnected).
    pub fn wait(&mut self, out: &mut [Completion], spin: Duration, deadline: Instant) -> Result<usize> {
        let fd = match &self.wake {
            Wake::Pair(pair) => Some(pair.rx.as_raw_fd()),
            Wake::External(_) => None,
        };
        dispatch!(EndpointInner, &mut self.inner, e => e.wait(out, spin, deadline, fd))
    }

    /// A descriptor that becomes readable when a completion arrives after
    /// [`arm_events`](Self::arm_events): for callers that wait in an event loop of their own
    /// (io_uring POLL_ADD, epoll) instead of [`wait`](Self::wait).
    pub fn event_fd(&self) -> RawFd {
        dispatch!(EndpointInner, &self.inner, e => e.event_fd())
    }

    /// Whether its completions go to a [`SharedCq`] (whose event loop watches the CQ's
    /// descriptor, not [`event_fd`](Self::event_fd)).
    pub fn shares_cq(&self) -> bool {
        match &self.inner {
            EndpointInner::Verbs(e) => e.shares_cq(),
            #[cfg(feature = "mem")]
            EndpointInner::Mem(_) => false,
        }
    }

    /// Its peer sets the solicited-event flag on every SEND that needs an answer
    /// (`rblk_proto::FEATURE_SOLICITED`): on a [`SharedCq`], this QP's other completions (a
    /// KEEPALIVE received, one of our SENDs completed) then raise no event, and wait in the CQ
    /// for the event loop's next [`SharedCq::poll`] or [`Endpoint::poll`]. Nothing for an
    /// endpoint with a CQ of its own, or on the in-memory fabric.
    pub fn peer_solicits(&self) {
        match &self.inner {
            EndpointInner::Verbs(e) => e.peer_solicits(),
            #[cfg(feature = "mem")]
            EndpointInner::Mem(_) => {}
        }
    }

    /// Consumes the events signalled so far and asks for one at the next completion. Poll once
    /// more after arming, then wait for [`event_fd`](Self::event_fd): a completion that arrived
    /// before the arm raises no event. Nothing for an endpoint on a [`SharedCq`].
    pub fn arm_events(&mut self) -> Result<()> {
        dispatch!(EndpointInner, &mut self.inner, e => e.arm_events())
    }

    /// A handle that interrupts [`Endpoint::wait`] from another thread (or the one given to
    /// [`Endpoint::set_waker`]).
    pub fn waker(&self) -> Waker {
        match &self.wake {
            Wake::Pair(pair) => pair.waker(),
            Wake::External(w) => w.clone(),
        }
    }

    /// True (once) if a [`Waker`] fired since the last call.
    pub fn take_wake(&mut self) -> bool {
        match &self.wake {
            Wake::Pair(pair) => pair.drain(),
            Wake::External(_) => false,
        }
    }

    /// The QP's attributes as the device reports them.
    pub fn attributes(&self) -> Result<QpAttributes> {
        dispatch!(EndpointInner, &self.inner, e => e.attributes())
    }

    /// Whether the peer has disconnected, as rdma_cm reports it (the active side only): takes
    /// every event waiting on the endpoint's CM channel, never waits (a system call). A QP does
    /// not notice the peer's disconnect request by itself: its work fails only when the
    /// transport's retries run out (seconds), so a connection's owner asks this when
    /// [`cm_fd`](Self::cm_fd) becomes readable. On the in-memory fabric a disconnect flushes
    /// the QP at once: false.
    pub fn peer_disconnected(&mut self) -> bool {
        match &mut self.inner {
            EndpointInner::Verbs(e) => e.peer_disconnected(),
            #[cfg(feature = "mem")]
            EndpointInner::Mem(_) => false,
        }
    }

    /// What the last look at the CM channel found ([`peer_disconnected`](Self::peer_disconnected),
    /// or a [`wait`](Self::wait) that the disconnect ended), without a system call.
    pub fn peer_gone(&self) -> bool {
        match &self.inner {
            EndpointInner::Verbs(e) => e.peer_gone(),
            #[cfg(feature = "mem")]
            EndpointInner::Mem(_) => false,
        }
    }

    /// The endpoint's own rdma_cm event channel, for an event loop of the caller's beside
    /// [`event_fd`](Self::event_fd): readable when rdma_cm has an event for it (the peer
    /// disconnected, the connection failed); then call
    /// [`peer_disconnected`](Self::peer_disconnected), which empties it. [`wait`](Self::wait)
    /// watches it itself. None on the passive side (its events go to the [`Listener`]), once
    /// the endpoint is disconnected or its peer was seen to leave (nothing more to learn), and
    /// on the in-memory fabric (a disconnect flushes the QP at once there).
    pub fn cm_fd(&self) -> Option<RawFd> {
        match &self.inner {
            EndpointInner::Verbs(e) => e.cm_fd(),
            #[cfg(feature = "mem")]
            EndpointInner::Mem(_) => None,
        }
    }

    /// Over verbs: moves the QP to the error state and sends no disconnect request, so the
    /// peer hears nothing more, as from a host that died (the cm_id stays until the endpoint is
    /// dropped). For tests of a peer's loss detection; on the in-memory fabric it does
    /// nothing (its fault injection is `mem::fail_next`, `mem::fail_dealloc` and `mem::sever`).
    pub fn vanish(&mut self) {
        match &mut self.inner {
            EndpointInner::Verbs(e) => e.vanish(),
            #[cfg(feature = "mem")]
            EndpointInner::Mem(_) => {}
        }
    }

    /// Disconnects and moves the QP to the error state: everything posted completes with
    /// `WR_FLUSH_ERR`.
    pub fn disconnect(&mut self) {
        dispatch!(EndpointInner, &mut self.inner, e => e.disconnect())
    }
}
