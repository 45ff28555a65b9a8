//! rdma_cm through sideway's sys crate: sideway 0.4.3 cannot set connection parameters (read
//! depth, retry counts) or private data, and its event conversion panics on unknown values.

use std::ffi::c_void;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::time::Instant;

use rdma_mummy_sys as sys;

use crate::error::AddrDisplay;
use crate::{policy, Error, Result};

/// An rdma_cm event channel (non-blocking; waits use poll(2) with a deadline).
#[derive(Debug)]
pub(crate) struct CmChannel {
    raw: NonNull<sys::rdma_event_channel>,
}

// SAFETY: librdmacm event channels may be used from any thread; we only read events from one
// thread at a time (`&self` methods are called by the owner of the listener or endpoint).
unsafe impl Send for CmChannel {}
// SAFETY: as above.
unsafe impl Sync for CmChannel {}

impl Drop for CmChannel {
    fn drop(&mut self) {
        // SAFETY: every id created on this channel holds an `Arc<CmChannel>`, so none is left.
        unsafe { sys::rdma_destroy_event_channel(self.raw.as_ptr()) };
    }
}

/// The kinds of CM events rblk tells apart; everything else keeps its raw number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmEventKind {
    AddrResolved,
    RouteResolved,
    ConnectRequest,
    ConnectResponse,
    Established,
    Disconnected,
    TimewaitExit,
    Failure(u32),
    Other(u32),
}

impl CmEventKind {
    fn from_raw(v: u32) -> Self {
        use sys::rdma_cm_event_type::*;
        match v {
            RDMA_CM_EVENT_ADDR_RESOLVED => Self::AddrResolved,
            RDMA_CM_EVENT_ROUTE_RESOLVED => Self::RouteResolved,
            RDMA_CM_EVENT_CONNECT_REQUEST => Self::ConnectRequest,
            RDMA_CM_EVENT_CONNECT_RESPONSE => Self::ConnectResponse,
            RDMA_CM_EVENT_ESTABLISHED => Self::Established,
            RDMA_CM_EVENT_DISCONNECTED => Self::Disconnected,
            RDMA_CM_EVENT_TIMEWAIT_EXIT => Self::TimewaitExit,
            RDMA_CM_EVENT_ADDR_ERROR
            | RDMA_CM_EVENT_ROUTE_ERROR
            | RDMA_CM_EVENT_CONNECT_ERROR
            | RDMA_CM_EVENT_UNREACHABLE
            | RDMA_CM_EVENT_REJECTED
            | RDMA_CM_EVENT_DEVICE_REMOVAL => Self::Failure(v),
            other => Self::Other(other),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        use sys::rdma_cm_event_type::*;
        match self {
            Self::AddrResolved => "ADDR_RESOLVED",
            Self::RouteResolved => "ROUTE_RESOLVED",
            Self::ConnectRequest => "CONNECT_REQUEST",
            Self::ConnectResponse => "CONNECT_RESPONSE",
            Self::Established => "ESTABLISHED",
            Self::Disconnected => "DISCONNECTED",
            Self::TimewaitExit => "TIMEWAIT_EXIT",
            Self::Failure(RDMA_CM_EVENT_ADDR_ERROR) => "ADDR_ERROR",
            Self::Failure(RDMA_CM_EVENT_ROUTE_ERROR) => "ROUTE_ERROR",
            Self::Failure(RDMA_CM_EVENT_CONNECT_ERROR) => "CONNECT_ERROR",
            Self::Failure(RDMA_CM_EVENT_UNREACHABLE) => "UNREACHABLE",
            Self::Failure(RDMA_CM_EVENT_REJECTED) => "REJECTED",
            Self::Failure(RDMA_CM_EVENT_DEVICE_REMOVAL) => "DEVICE_REMOVAL",
            Self::Failure(_) | Self::Other(_) => "other CM event",
        }
    }
}

/// One CM event, copied out of librdmacm's struct and acknowledged.
pub(crate) struct CmEvent {
    pub kind: CmEventKind,
    pub status: i32,
    /// `context` of the id the event is about (our connection number; 0 before we set one).
    pub context: u64,
    /// For CONNECT_REQUEST: the new id, owned from here on.
    pub new_id: Option<CmId>,
    pub private_data: Vec<u8>,
}

impl CmChannel {
    pub(crate) fn new() -> Result<Arc<CmChannel>> {
        // SAFETY: plain constructor; a null return is handled.
        let raw = unsafe { sys::rdma_create_event_channel() };
        let raw = NonNull::new(raw).ok_or_else(|| cm_err("rdma_create_event_channel", None))?;
        let ch = Arc::new(CmChannel { raw });
        set_nonblocking(ch.fd()).map_err(|source| Error::Cm {
            op: "fcntl(O_NONBLOCK) on the CM channel",
            addr: AddrDisplay(None),
            source,
        })?;
        Ok(ch)
    }

    pub(crate) fn fd(&self) -> RawFd {
        // SAFETY: the channel is live while `self` is.
        unsafe { self.raw.as_ref().fd }
    }

    /// Takes the next event, waiting until `deadline` (None: do not wait). Returns `Ok(None)`
    /// when none arrived in time.
    pub(crate) fn next_event(self: &Arc<Self>, deadline: Option<Instant>) -> Result<Option<CmEvent>> {
        loop {
            let mut ev: *mut sys::rdma_cm_event = ptr::null_mut();
            // SAFETY: the channel is live; `ev` receives an event we acknowledge below.
            let rc = unsafe { sys::rdma_get_cm_event(self.raw.as_ptr(), &mut ev) };
            if rc == 0 {
                // SAFETY: librdmacm returned a valid event, which stays valid until acked.
                return Ok(Some(unsafe { self.take(ev) }));
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::WouldBlock {
                return Err(Error::Cm { op: "rdma_get_cm_event", addr: AddrDisplay(None), source: err });
            }
            if !wait_readable(self.fd(), deadline).map_err(|source| Error::Cm {
                op: "poll on the CM channel",
                addr: AddrDisplay(None),
                source,
            })? {
                return Ok(None);
            }
        }
    }

    /// Copies what we need out of `ev`, then acknowledges it.
    ///
    /// # Safety
    /// `ev` must be a live event from `rdma_get_cm_event` on this channel, not yet acknowledged.
    unsafe fn take(self: &Arc<Self>, ev: *mut sys::rdma_cm_event) -> CmEvent {
        // SAFETY: guaranteed live by the caller.
        let e = unsafe { &*ev };
        let kind = CmEventKind::from_raw(e.event);
        // SAFETY: for connection events the `conn` member of the union is the valid one; its
        // private data pointer, when not null, covers `private_data_len` bytes until the ack.
        let private_data = unsafe {
            let conn = &e.param.conn;
            if conn.private_data.is_null()
                || !matches!(
                    kind,
                    CmEventKind::ConnectRequest
                        | CmEventKind::Established
                        | CmEventKind::Failure(sys::rdma_cm_event_type::RDMA_CM_EVENT_REJECTED)
                )
            {
                Vec::new()
            } else {
                std::slice::from_raw_parts(conn.private_data.cast::<u8>(), usize::from(conn.private_data_len)).to_vec()
            }
        };
        let (new_id, context) = match (kind, NonNull::new(e.id)) {
            (CmEventKind::ConnectRequest, Some(id)) => (Some(CmId { raw: id, _channel: Arc::clone(self) }), 0),
            // SAFETY: ids named by events are live until the event is acked.
            (_, Some(id)) => (None, unsafe { id.as_ref().context } as u64),
            (_, None) => (None, 0),
        };
        let status = e.status;
        // SAFETY: acknowledging the event we were handed, exactly once.
        unsafe { sys::rdma_ack_cm_event(ev) };
        CmEvent { kind, status, context, new_id, private_data }
    }
}

/// An owned `rdma_cm_id`.
pub(crate) struct CmId {
    raw: NonNull<sys::rdma_cm_id>,
    // The channel must outlive its ids.
    _channel: Arc<CmChannel>,
}

// SAFETY: rdma_cm ids may be used from any thread; each `CmId` has one owner.
unsafe impl Send for CmId {}
// SAFETY: the `&self` methods (address getters, disconnect) are thread-safe in librdmacm.
unsafe impl Sync for CmId {}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: we own the id; it has no rdma_cm-created QP (ours are destroyed separately).
        unsafe { sys::rdma_destroy_id(self.raw.as_ptr()) };
    }
}

/// Connection parameters built from [`policy`]: read depth, retries, private data.
pub(crate) struct ConnParam {
    raw: sys::rdma_conn_param,
    _data: Vec<u8>,
}

impl ConnParam {
    pub(crate) fn new(qp_num: u32, read_depth: u8, private_data: &[u8]) -> Result<Self> {
        if private_data.len() > policy::MAX_PRIVATE_DATA {
            return Err(Error::PrivateDataTooLong { len: private_data.len(), max: policy::MAX_PRIVATE_DATA });
        }
        let data = private_data.to_vec();
        let raw = sys::rdma_conn_param {
            private_data: if data.is_empty() { ptr::null() } else { data.as_ptr().cast::<c_void>() },
            private_data_len: data.len() as u8,
            responder_resources: read_depth,
            initiator_depth: read_depth,
            flow_control: 1,
            retry_count: policy::RETRY_COUNT,
            rnr_retry_count: policy::RNR_RETRY,
            srq: 0,
            qp_num,
        };
        Ok(ConnParam { raw, _data: data })
    }
}

impl CmId {
    pub(crate) fn new(channel: &Arc<CmChannel>) -> Result<CmId> {
        let mut raw = ptr::null_mut();
        // SAFETY: the channel is live; TCP port space gives RC QPs.
        let rc = unsafe {
            sys::rdma_create_id(channel.raw.as_ptr(), &mut raw, ptr::null_mut(), sys::rdma_port_space::RDMA_PS_TCP)
        };
        if rc != 0 {
            return Err(cm_err("rdma_create_id", None));
        }
        let raw = NonNull::new(raw).ok_or_else(|| cm_err("rdma_create_id", None))?;
        Ok(CmId { raw, _channel: Arc::clone(channel) })
    }

    fn id(&self) -> &sys::rdma_cm_id {
        // SAFETY: the id is live while `self` is; librdmacm updates it only inside calls we make.
        unsafe { self.raw.as_ref() }
    }

    pub(crate) fn set_context(&self, value: u64) {
        // SAFETY: `context` is ours to use; librdmacm hands it back in events. We store an
        // integer, not a pointer, so nothing dangles.
        unsafe { (*self.raw.as_ptr()).context = value as usize as *mut c_void };
    }

    pub(crate) fn bind(&self, addr: SocketAddr) -> Result<()> {
        let (sa, _len) = to_sockaddr(addr);
        // SAFETY: `sa` is a valid sockaddr for the duration of the call.
        let rc = unsafe { sys::rdma_bind_addr(self.raw.as_ptr(), sa.as_ptr().cast_mut().cast()) };
        check(rc, "rdma_bind_addr", Some(addr))
    }

    pub(crate) fn listen(&self, backlog: i32) -> Result<()> {
        // SAFETY: the id is live and bound.
        check(unsafe { sys::rdma_listen(self.raw.as_ptr(), backlog) }, "rdma_listen", self.local_addr())
    }

    /// Starts resolving `dst`, from `src` (port 0) when given: the source picks the device and
    /// GID; a null source lets routing choose.
    pub(crate) fn resolve_addr(&self, src: Option<std::net::IpAddr>, dst: SocketAddr, timeout_ms: i32) -> Result<()> {
        let (sa, _len) = to_sockaddr(dst);
        let mut src = src.map(|ip| to_sockaddr(SocketAddr::new(ip, 0)).0);
        let src_ptr = src.as_mut().map_or(ptr::null_mut(), |s| ptr::from_mut(&mut **s).cast());
        // SAFETY: `sa` and `src` (when not null) are valid sockaddr_storage boxes that outlive the
        // call, which copies them.
        let rc =
            unsafe { sys::rdma_resolve_addr(self.raw.as_ptr(), src_ptr, sa.as_ptr().cast_mut().cast(), timeout_ms) };
        check(rc, "rdma_resolve_addr", Some(dst))
    }

    /// Sets the type of service of the connection (RDMA_OPTION_ID_TOS); before resolving the
    /// route, which takes it into the path record and so into the QP's traffic class.
    pub(crate) fn set_tos(&self, tos: u8, dst: SocketAddr) -> Result<()> {
        let mut value = tos;
        // SAFETY: the id is live; `value` is the one byte RDMA_OPTION_ID_TOS reads, live for the call.
        let rc = unsafe {
            sys::rdma_set_option(
                self.raw.as_ptr(),
                RDMA_OPTION_ID,
                RDMA_OPTION_ID_TOS,
                ptr::from_mut(&mut value).cast(),
                size_of::<u8>(),
            )
        };
        check(rc, "rdma_set_option(RDMA_OPTION_ID_TOS)", Some(dst))
    }

    pub(crate) fn resolve_route(&self, timeout_ms: i32) -> Result<()> {
        // SAFETY: the id is live with a resolved address.
        check(unsafe { sys::rdma_resolve_route(self.raw.as_ptr(), timeout_ms) }, "rdma_resolve_route", self.peer_addr())
    }

    pub(crate) fn connect(&self, param: &mut ConnParam) -> Result<()> {
        // SAFETY: `param` and its private data live for the call.
        check(unsafe { sys::rdma_connect(self.raw.as_ptr(), &mut param.raw) }, "rdma_connect", self.peer_addr())
    }

    pub(crate) fn accept(&self, param: &mut ConnParam) -> Result<()> {
        // SAFETY: `param` and its private data live for the call.
        check(unsafe { sys::rdma_accept(self.raw.as_ptr(), &mut param.raw) }, "rdma_accept", self.peer_addr())
    }

    pub(crate) fn reject(&self, private_data: &[u8]) -> Result<()> {
        let len = u8::try_from(private_data.len())
            .map_err(|_| Error::PrivateDataTooLong { len: private_data.len(), max: usize::from(u8::MAX) })?;
        let data = if private_data.is_empty() { ptr::null() } else { private_data.as_ptr().cast() };
        // SAFETY: the id is a live connection request; `data` is null or points at `len` bytes
        // that outlive the call (rdma_reject copies them).
        check(unsafe { sys::rdma_reject(self.raw.as_ptr(), data, len) }, "rdma_reject", self.peer_addr())
    }

    pub(crate) fn establish(&self) -> Result<()> {
        // SAFETY: the id got a CONNECT_RESPONSE and our QP is in RTS.
        check(unsafe { sys::rdma_establish(self.raw.as_ptr()) }, "rdma_establish", self.peer_addr())
    }

    pub(crate) fn disconnect(&self) -> Result<()> {
        // SAFETY: the id is live; disconnecting twice returns an error we report.
        check(unsafe { sys::rdma_disconnect(self.raw.as_ptr()) }, "rdma_disconnect", self.peer_addr())
    }

    /// The QP attributes rdma_cm computes for moving to `state` (INIT, RTR or RTS).
    pub(crate) fn qp_attr(&self, state: sys::ibv_qp_state::Type) -> Result<(sys::ibv_qp_attr, i32)> {
        // SAFETY: ibv_qp_attr is plain old data; zero is a valid bit pattern.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = state;
        let mut mask = 0;
        // SAFETY: both out-parameters are valid for writes.
        let rc = unsafe { sys::rdma_init_qp_attr(self.raw.as_ptr(), &mut attr, &mut mask) };
        check(rc, "rdma_init_qp_attr", self.peer_addr())?;
        Ok((attr, mask))
    }

    pub(crate) fn verbs(&self) -> *mut sys::ibv_context {
        self.id().verbs
    }

    /// The name of the device the id is bound to, once bound.
    pub(crate) fn device_name(&self) -> Option<String> {
        let ctx = self.verbs();
        if ctx.is_null() {
            return None;
        }
        // SAFETY: a bound id's `verbs` is a live context owned by librdmacm, whose device has a
        // NUL-terminated name.
        unsafe {
            let dev = (*ctx).device;
            let name = sys::ibv_get_device_name(dev);
            (!name.is_null()).then(|| std::ffi::CStr::from_ptr(name).to_string_lossy().into_owned())
        }
    }

    pub(crate) fn port(&self) -> u8 {
        self.id().port_num
    }

    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the route's address member is initialised by librdmacm (zeroed when unbound).
        from_sockaddr(unsafe { sys::rdma_get_local_addr(self.id()) })
    }

    pub(crate) fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as above.
        from_sockaddr(unsafe { sys::rdma_get_peer_addr(self.id()) })
    }
}

fn cm_err(op: &'static str, addr: Option<SocketAddr>) -> Error {
    Error::Cm { op, addr: AddrDisplay(addr), source: io::Error::last_os_error() }
}

fn check(rc: i32, op: &'static str, addr: Option<SocketAddr>) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(cm_err(op, addr))
    }
}

/// A sockaddr in a buffer big enough for IPv6.
/// rdma_cma.h's option level and name for the type of service (an enum bindgen does not carry).
const RDMA_OPTION_ID: i32 = 0;
const RDMA_OPTION_ID_TOS: i32 = 0;

fn to_sockaddr(addr: SocketAddr) -> (Box<libc::sockaddr_storage>, usize) {
    // SAFETY: sockaddr_storage is plain old data; zero is valid.
    let mut ss: Box<libc::sockaddr_storage> = Box::new(unsafe { std::mem::zeroed() });
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in.
            unsafe { ptr::write(ptr::from_mut(&mut *ss).cast::<libc::sockaddr_in>(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in6.
            unsafe { ptr::write(ptr::from_mut(&mut *ss).cast::<libc::sockaddr_in6>(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len)
}

trait AsSockPtr {
    fn as_ptr(&self) -> *const libc::sockaddr;
}

impl AsSockPtr for Box<libc::sockaddr_storage> {
    fn as_ptr(&self) -> *const libc::sockaddr {
        ptr::from_ref(&**self).cast()
    }
}

fn from_sockaddr(sa: &libc::sockaddr) -> Option<SocketAddr> {
    match i32::from(sa.sa_family) {
        libc::AF_INET => {
            // SAFETY: the family says this is a sockaddr_in, which librdmacm stores in a
            // sockaddr_storage-sized union, so the read is in bounds.
            let sin = unsafe { &*ptr::from_ref(sa).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &*ptr::from_ref(sa).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

pub(crate) fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own; F_GETFL/F_SETFL take and return plain ints.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Waits until `fd` is readable or `deadline` passes (None: don't wait). True when readable.
pub(crate) fn wait_readable(fd: RawFd, deadline: Option<Instant>) -> io::Result<bool> {
    wait_any_readable(&[fd], deadline).map(|r| r.is_some())
}

/// The most descriptors [`wait_any_readable`] waits for without allocating.
pub(crate) const MAX_WAIT_FDS: usize = 8;

/// Waits until one of `fds` is readable; returns its index, or None at the deadline.
pub(crate) fn wait_any_readable(fds: &[RawFd], deadline: Option<Instant>) -> io::Result<Option<usize>> {
    // Usually a few descriptors: a stack array, so that sleeping allocates nothing.
    const MAX: usize = MAX_WAIT_FDS;
    let pollfd = |fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let mut few = [pollfd(-1); MAX];
    let mut many = Vec::new();
    let pfds: &mut [libc::pollfd] = if fds.len() <= MAX {
        for (p, &fd) in few.iter_mut().zip(fds) {
            *p = pollfd(fd);
        }
        &mut few[..fds.len()]
    } else {
        many.extend(fds.iter().map(|&fd| pollfd(fd)));
        &mut many
    };
    loop {
        let timeout_ms = match deadline {
            None => 0,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                // Round up so we never return before the deadline.
                i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
            }
        };
        // SAFETY: `pfds` is a valid array of `pfds.len()` pollfd structs.
        let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if rc > 0 {
            return Ok(pfds.iter().position(|p| p.revents != 0));
        }
        if deadline.is_none_or(|d| Instant::now() >= d) {
            return Ok(None);
        }
    }
}
