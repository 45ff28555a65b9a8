//! Protection domains, registrations, the listener and RC endpoints over real verbs.

use std::net::SocketAddr;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_mummy_sys as sys;
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionChannel, CompletionQueue as _};
use sideway::ibverbs::device_context::{DeviceCapabilityFlags, DeviceContext};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::AccessFlags;

use super::cm::{self, CmChannel, CmEventKind, CmId, ConnParam};
use super::device;
use super::qp::Qp;
use super::shared_cq::{Inbox, SharedCq};
use crate::completion::{Completion, WcOpcode, WcStatus};
use crate::error::AddrDisplay;
use crate::{policy, Access, Error, ListenerEvent, Memory, QpAttributes, QpConfig, Result, Route, WorkRequest};

pub(super) fn verbs_err(op: &'static str, device: &str, source: std::io::Error) -> Error {
    Error::Verbs { op, device: device.to_owned(), source }
}

/// A sideway error with its whole chain: the errno sits in the source (EMFILE read as "failed
/// to create completion channel" alone).
pub(super) fn other_err(op: &'static str, device: &str, e: impl std::error::Error + 'static) -> Error {
    verbs_err(op, device, std::io::Error::other(crate::Chain(&e).to_string()))
}

/// A protection domain on one device.
#[derive(Clone)]
pub(crate) struct Pd {
    pd: Arc<ProtectionDomain>,
    ctx: Arc<DeviceContext>,
    device: Arc<str>,
    /// The device has type 2B memory windows (QP-bound rkeys).
    windows: bool,
    /// The most RDMA READs the device lets a QP have outstanding, as initiator and responder.
    max_read_depth: u8,
}

impl Pd {
    pub(crate) fn alloc(device: &str) -> Result<Pd> {
        let ctx = device::context(device)?;
        let pd = ctx.alloc_pd().map_err(|e| other_err("ibv_alloc_pd", device, e))?;
        let attr = ctx.query_device().map_err(|e| other_err("ibv_query_device", device, e))?;
        let windows = attr.device_cap_flags().contains(DeviceCapabilityFlags::MemoryWindowType2B);
        let max_read_depth = attr.max_qp_rd_atom().min(attr.max_qp_init_rd_atom()).clamp(1, 255) as u8;
        Ok(Pd { pd, ctx, device: device.into(), windows, max_read_depth })
    }

    /// The device's context (a CQ shared by QPs of this device's PDs is made on it).
    pub(crate) fn context(&self) -> &Arc<DeviceContext> {
        &self.ctx
    }

    pub(crate) fn type2_windows(&self) -> bool {
        self.windows
    }

    /// The ibv_pd, for objects created in it (valid while this Pd or a clone lives).
    pub(crate) fn raw(&self) -> *mut sys::ibv_pd {
        // SAFETY: only the pointer is taken; the PD stays allocated while `self.pd` lives.
        unsafe { self.pd.pd() }.as_ptr()
    }

    /// Whether `other` is the same protection domain (a clone of this one).
    pub(crate) fn same_as(&self, other: &Pd) -> bool {
        Arc::ptr_eq(&self.pd, &other.pd)
    }

    /// Allocates a type 2 memory window: unbound (no rkey works) until a QP binds it.
    pub(crate) fn alloc_mw(&self) -> Result<Mw> {
        if !self.windows {
            return Err(Error::Unsupported { what: "type 2B memory windows", device: self.device.to_string() });
        }
        // SAFETY: the PD is live (we hold its Arc); a null return is handled below.
        let mw = unsafe { sys::ibv_alloc_mw(self.pd.pd().as_ptr(), sys::ibv_mw_type::IBV_MW_TYPE_2) };
        let mw =
            NonNull::new(mw).ok_or_else(|| verbs_err("ibv_alloc_mw", &self.device, std::io::Error::last_os_error()))?;
        // SAFETY: `mw` was just returned by ibv_alloc_mw and is live.
        let rkey = unsafe { mw.as_ref().rkey };
        Ok(Mw { mw, rkey, gone: false, pd: self.clone() })
    }

    pub(crate) fn device(&self) -> &str {
        &self.device
    }

    pub(crate) fn register(&self, memory: &Arc<Memory>, access: Access) -> Result<Mr> {
        let mut flags = AccessFlags::LocalWrite;
        if access.remote_read {
            flags |= AccessFlags::RemoteRead;
        }
        if access.remote_write {
            flags |= AccessFlags::RemoteWrite;
        }
        if access.mw_bind {
            flags |= AccessFlags::MemoryWindowBind;
        }
        // SAFETY: `memory` is a live mapping of `len()` bytes that we own (anonymous, or of a memfd
        // sealed against resizing, so no truncation parts the CPU's pages from the NIC's); the
        // returned `Mr` is stored beside an `Arc<Memory>` (see crate::Mr), and the registration is
        // dropped (deregistered) before that `Arc`, so the NIC never sees unmapped memory.
        let mr =
            unsafe { self.pd.reg_mr(memory.addr() as usize, memory.len(), flags) }.map_err(|e| Error::Register {
                len: memory.len(),
                device: self.device.to_string(),
                memlock: crate::error::memlock_text(),
                source: std::io::Error::other(e.to_string()),
            })?;
        Ok(Mr { mr })
    }
}

/// One registration.
pub(crate) struct Mr {
    mr: Arc<MemoryRegion>,
}

/// A type 2 memory window. Its rkey works only while it is bound, and only on the QP that bound
/// it; deallocating it ([`Mw::dealloc`], or drop) invalidates it.
pub(crate) struct Mw {
    mw: NonNull<sys::ibv_mw>,
    /// The rkey of the last bind (the allocation's before any).
    rkey: u32,
    /// ibv_dealloc_mw was called (whatever it returned): never again.
    gone: bool,
    // Holds the PD (and its device context) alive while the window exists.
    pd: Pd,
}

// SAFETY: an ibv_mw may be used and deallocated from any thread; the Mw has one owner.
unsafe impl Send for Mw {}
// SAFETY: shared references only read `rkey`, a plain copy; binding takes `&mut`.
unsafe impl Sync for Mw {}

impl Mw {
    pub(crate) fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Deallocates the window, which invalidates its rkey if it is bound; the error if
    /// `ibv_dealloc_mw` failed. Then the window may still be valid: it is not deallocated again
    /// (its state is unknown), and its PD is kept allocated for good, since the window may hold
    /// it. The caller must kill the rkey another way: a type 2 window works only through the QP
    /// it is bound to, so taking that QP down (error state, destroy) does.
    pub(crate) fn dealloc(mut self) -> Result<()> {
        self.dealloc_once()
    }

    fn dealloc_once(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.gone, true) {
            return Ok(());
        }
        // SAFETY: `mw` came from ibv_alloc_mw and is deallocated only here, once (`gone`); its
        // PD is alive (held). A bound window is invalidated by deallocation.
        let ret = unsafe { sys::ibv_dealloc_mw(self.mw.as_ptr()) };
        if ret == 0 {
            return Ok(());
        }
        // The window may still be in the PD: the PD must outlive it, so it is never released.
        std::mem::forget(self.pd.clone());
        Err(verbs_err("ibv_dealloc_mw", &self.pd.device, std::io::Error::from_raw_os_error(ret.abs())))
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        // Dropped without `dealloc` (nobody asked for the result): as good an attempt, unheard.
        let _ = self.dealloc_once();
    }
}

impl Mr {
    pub(crate) fn lkey(&self) -> u32 {
        self.mr.lkey()
    }
    pub(crate) fn rkey(&self) -> u32 {
        self.mr.rkey()
    }
}

/// A listening rdma_cm id.
pub(crate) struct Listener {
    channel: Arc<CmChannel>,
    /// None while the port is closed ([`Listener::close_port`]).
    id: Option<CmId>,
    /// The address bound (its port too when 0 was asked for), for reopening.
    addr: SocketAddr,
    device: Option<String>,
    /// `rdma_listen`'s backlog, for reopening too.
    backlog: u32,
}

impl Listener {
    pub(crate) fn bind(addr: SocketAddr, device: Option<&str>, backlog: u32) -> Result<Listener> {
        let channel = CmChannel::new()?;
        let id = Self::listen_on(&channel, addr, device, backlog)?;
        let addr = id.local_addr().unwrap_or(addr);
        Ok(Listener { channel, id: Some(id), addr, device: device.map(str::to_owned), backlog })
    }

    fn listen_on(channel: &Arc<CmChannel>, addr: SocketAddr, device: Option<&str>, backlog: u32) -> Result<CmId> {
        let id = CmId::new(channel)?;
        id.bind(addr)?;
        if let (Some(want), Some(have)) = (device, id.device_name()) {
            if want != have {
                return Err(Error::WrongDevice { addr, found: have.into(), wanted: want.into() });
            }
        }
        id.listen(i32::try_from(backlog).unwrap_or(i32::MAX))?;
        Ok(id)
    }

    /// Destroys the listening id: the port is free for another process, while the connections
    /// accepted so far keep their events on the channel.
    pub(crate) fn close_port(&mut self) {
        self.id = None;
    }

    /// Listens on the same address again.
    pub(crate) fn reopen_port(&mut self) -> Result<()> {
        if self.id.is_none() {
            self.id = Some(Self::listen_on(&self.channel, self.addr, self.device.as_deref(), self.backlog)?);
        }
        Ok(())
    }

    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        Some(self.addr)
    }

    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        self.channel.fd()
    }

    pub(crate) fn next_event(&self, deadline: Option<Instant>) -> Result<Option<ListenerEvent<Request>>> {
        let Some(ev) = self.channel.next_event(deadline)? else { return Ok(None) };
        Ok(Some(match ev.kind {
            CmEventKind::ConnectRequest => {
                let Some(id) = ev.new_id else {
                    return Ok(Some(ListenerEvent::Other { conn: 0, event: "CONNECT_REQUEST without id" }));
                };
                let peer = id.peer_addr();
                let device = id.device_name().unwrap_or_default();
                if self.device.as_deref().is_some_and(|want| want != device) {
                    // A wildcard listener hears every device; the filter applies here.
                    let _ = id.reject(&[]);
                    return Ok(Some(ListenerEvent::Other { conn: 0, event: "request on a filtered-out device" }));
                }
                ListenerEvent::Request(Request { id, peer, device, private_data: ev.private_data })
            }
            CmEventKind::Established => ListenerEvent::Established { conn: ev.context },
            CmEventKind::Disconnected | CmEventKind::TimewaitExit | CmEventKind::Failure(_) => {
                ListenerEvent::Disconnected { conn: ev.context }
            }
            other => ListenerEvent::Other { conn: ev.context, event: other.name() },
        }))
    }
}

/// An incoming connection request.
pub(crate) struct Request {
    id: CmId,
    peer: Option<SocketAddr>,
    device: String,
    private_data: Vec<u8>,
}

impl Request {
    pub(crate) fn private_data(&self) -> &[u8] {
        &self.private_data
    }
    pub(crate) fn peer(&self) -> Option<SocketAddr> {
        self.peer
    }
    pub(crate) fn device(&self) -> &str {
        &self.device
    }
    pub(crate) fn reject(self, private_data: &[u8]) -> Result<()> {
        self.id.reject(private_data)
    }

    /// Creates the QP in `pd`, moves it to RTS, tags the id with `conn` for later events. With
    /// `shared`, the QP's completions go to that CQ (it takes one of its places), routed to the
    /// endpoint by `conn`; else to a CQ of its own.
    pub(crate) fn into_endpoint(
        self,
        pd: &Pd,
        cfg: &QpConfig,
        conn: u64,
        shared: Option<&Arc<SharedCq>>,
    ) -> Result<Endpoint> {
        if pd.device() != self.device {
            return Err(Error::PdDevice {
                what: "the connect request".into(),
                found: self.device.as_str().into(),
                pd: pd.device().into(),
            });
        }
        self.id.set_context(conn);
        let mut ep = Endpoint::create(self.id, None, pd.clone(), cfg, shared.map(|s| (s, conn)))?;
        ep.move_to_init()?;
        ep.move_to_rtr()?;
        ep.move_to_rts()?;
        Ok(ep)
    }
}

/// Takes one CQ event from `comp` (non-blocking), if one is there: true when one was taken.
pub(super) fn get_cq_event(comp: &CompletionChannel, device: &str) -> Result<bool> {
    let mut cq = std::ptr::null_mut();
    let mut ctx = std::ptr::null_mut();
    // SAFETY: the channel is live (borrowed) and non-blocking; the out-parameters are valid.
    let rc = unsafe { sys::ibv_get_cq_event(comp.comp_channel().as_ptr(), &mut cq, &mut ctx) };
    if rc == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    if err.kind() == std::io::ErrorKind::WouldBlock {
        Ok(false)
    } else {
        Err(verbs_err("ibv_get_cq_event", device, err))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Created,
    Connected,
    Closed,
}

/// An RC queue pair with its CQ, completion channel and rdma_cm id.
pub(crate) struct Endpoint {
    // Declaration order is drop order: the QP goes before the CQ, the CM id last.
    qp: Qp,
    cq: Arc<BasicCompletionQueue>,
    comp: Arc<CompletionChannel>,
    pd: Pd,
    id: CmId,
    // The active side owns its CM channel (held by `id` too); the passive side uses the listener's.
    channel: Option<Arc<CmChannel>>,
    wcs: Vec<sys::ibv_wc>,
    unacked: u32,
    armed: bool,
    read_depth: u8,

    max_inline: u32,
    state: State,
    /// rdma_cm reported the peer's disconnect (see [`Endpoint::peer_disconnected`]).
    peer_gone: bool,
    peer: Option<SocketAddr>,
    /// Its completions go to a CQ shared with other endpoints, which routes them here.
    shared: Option<(Arc<SharedCq>, Inbox)>,
    /// Its receives come from that CQ's shared receive queue, not from buffers posted to it.
    shares_receives: bool,
}

// SAFETY: all verbs objects here may be used from any thread; the endpoint has one owner, which
// posts and polls it (`&mut self`).
unsafe impl Send for Endpoint {}

fn expect(
    channel: &Arc<CmChannel>,
    want: CmEventKind,
    what: &'static str,
    addr: SocketAddr,
    deadline: Instant,
    started: Instant,
) -> Result<()> {
    match channel.next_event(Some(deadline))? {
        Some(ev) if ev.kind == want => Ok(()),
        Some(ev) if ev.kind == CmEventKind::Failure(sys::rdma_cm_event_type::RDMA_CM_EVENT_REJECTED) => {
            Err(Error::Rejected {
                addr,
                status: ev.status,
                expected: what,
                private_data: crate::error::reject_data(&ev.private_data),
            })
        }
        Some(ev) => Err(Error::Connect { addr, event: ev.kind.name(), status: ev.status, expected: what }),
        None => Err(Error::Timeout { op: what, after: started.elapsed() }),
    }
}

fn timeout_ms(deadline: Instant) -> i32 {
    i32::try_from(deadline.saturating_duration_since(Instant::now()).as_millis()).unwrap_or(i32::MAX).max(1)
}

impl Endpoint {
    /// Active side, step 1: resolve `dst`, create the QP (in `pd` or a new PD) and move it to INIT.
    /// Post RECVs, then call [`Endpoint::connect`].
    pub(crate) fn resolve(
        dst: SocketAddr,
        pd: Option<&Pd>,
        route: &Route,
        cfg: &QpConfig,
        deadline: Instant,
    ) -> Result<Endpoint> {
        let started = Instant::now();
        let device = route.device.as_deref();
        let channel = CmChannel::new()?;
        let id = CmId::new(&channel)?;
        if let Some(tos) = route.tos {
            id.set_tos(tos, dst)?;
        }
        id.resolve_addr(route.source, dst, timeout_ms(deadline))?;
        expect(&channel, CmEventKind::AddrResolved, "address resolution", dst, deadline, started)?;
        id.resolve_route(timeout_ms(deadline))?;
        expect(&channel, CmEventKind::RouteResolved, "route resolution", dst, deadline, started)?;
        let dev = id.device_name().ok_or(Error::NoDevice { filter: device.map(str::to_owned) })?;
        route.check_resolved(dst, &dev, pd.map(Pd::device))?;
        let pd = match pd {
            Some(pd) => pd.clone(),
            None => Pd::alloc(&dev)?,
        };
        let mut ep = Endpoint::create(id, Some(channel), pd, cfg, None)?;
        ep.move_to_init()?;
        Ok(ep)
    }

    /// `shared`: the CQ the QP's completions go to (which routes them to the endpoint by the
    /// tag), instead of a CQ and channel of its own.
    fn create(
        id: CmId,
        channel: Option<Arc<CmChannel>>,
        pd: Pd,
        cfg: &QpConfig,
        shared: Option<(&Arc<SharedCq>, u64)>,
    ) -> Result<Endpoint> {
        let dev = pd.device.to_string();
        let (cq, comp) = match shared {
            Some((s, _)) => {
                if !s.place() {
                    let full = std::io::Error::other("it has no room left for another QP");
                    return Err(verbs_err("placing a QP on a shared completion queue", &dev, full));
                }
                (Arc::clone(s.cq()), Arc::clone(s.channel()))
            }
            None => {
                let comp = pd.ctx.create_comp_channel().map_err(|e| other_err("ibv_create_comp_channel", &dev, e))?;
                comp.set_nonblocking(true)
                    .map_err(|e| verbs_err("fcntl(O_NONBLOCK) on the completion channel", &dev, e))?;
                let cq = pd
                    .ctx
                    .create_cq_builder()
                    .setup_cqe(cfg.send_depth + cfg.recv_depth)
                    .setup_comp_channel(&comp, 0)
                    .build()
                    .map_err(|e| other_err("ibv_create_cq", &dev, e))?;
                (cq, comp)
            }
        };
        // Its receives from the shared CQ's SRQ, if it has one of this PD.
        let srq = match shared {
            Some((s, _)) => s.attach_receives(&pd).inspect_err(|_| s.unplace())?,
            None => None,
        };
        let shares_receives = srq.is_some();
        // Until the endpoint exists (its drop gives the place back), a failure gives it back.
        let unplace = || {
            if let Some((s, _)) = shared {
                if shares_receives {
                    s.detach_receives();
                }
                s.unplace();
            }
        };
        let qp = Qp::create(&pd, &cq, cfg, srq).inspect_err(|_| unplace())?;
        let peer = id.peer_addr();
        let read_depth = policy::READ_DEPTH.min(pd.max_read_depth);
        let shared = match shared {
            Some((s, tag)) => {
                let inbox = Inbox::default();
                s.route(qp.number(), tag, Arc::clone(&inbox), shares_receives).inspect_err(|_| unplace())?;
                Some((Arc::clone(s), inbox))
            }
            None => None,
        };
        Ok(Endpoint {
            qp,
            cq,
            comp,
            pd,
            id,
            channel,
            // Polled here only without a shared CQ (whose own buffer takes the completions).
            wcs: if shared.is_some() { Vec::new() } else { Vec::with_capacity(policy::POLL_BATCH) },
            unacked: 0,
            armed: false,
            read_depth,
            max_inline: cfg.max_inline,
            state: State::Created,
            peer_gone: false,
            peer,
            shared,
            shares_receives,
        })
    }

    fn modify(
        &mut self,
        state: sys::ibv_qp_state::Type,
        what: &'static str,
        adjust: impl FnOnce(&mut sys::ibv_qp_attr) -> i32,
    ) -> Result<()> {
        let (mut attr, mut mask) = self.id.qp_attr(state)?;
        mask |= adjust(&mut attr);
        // SAFETY: the QP is live; `attr` and `mask` come from rdma_init_qp_attr plus our policy.
        let rc = unsafe { sys::ibv_modify_qp(self.qp.raw(), &mut attr, mask) };
        if rc != 0 {
            return Err(verbs_err(what, &self.pd.device, std::io::Error::from_raw_os_error(rc)));
        }
        Ok(())
    }

    fn move_to_init(&mut self) -> Result<()> {
        self.modify(sys::ibv_qp_state::IBV_QPS_INIT, "ibv_modify_qp(INIT)", |a| {
            a.qp_access_flags = (sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                | sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ
                | sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
                .0;
            sys::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0 as i32
        })
    }

    fn move_to_rtr(&mut self) -> Result<()> {
        let depth = self.read_depth;
        self.modify(sys::ibv_qp_state::IBV_QPS_RTR, "ibv_modify_qp(RTR)", |a| {
            a.max_dest_rd_atomic = depth;
            a.min_rnr_timer = policy::MIN_RNR_TIMER;
            (sys::ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC | sys::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER).0 as i32
        })
    }

    fn move_to_rts(&mut self) -> Result<()> {
        let depth = self.read_depth;
        self.modify(sys::ibv_qp_state::IBV_QPS_RTS, "ibv_modify_qp(RTS)", |a| {
            a.max_rd_atomic = depth;
            a.timeout = policy::TIMEOUT;
            a.retry_cnt = policy::RETRY_COUNT;
            a.rnr_retry = policy::RNR_RETRY;
            (sys::ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC
                | sys::ibv_qp_attr_mask::IBV_QP_TIMEOUT
                | sys::ibv_qp_attr_mask::IBV_QP_RETRY_CNT
                | sys::ibv_qp_attr_mask::IBV_QP_RNR_RETRY)
                .0 as i32
        })
    }

    /// Active side, step 2: connect with `private_data`, then RTR, RTS and establish.
    pub(crate) fn connect(&mut self, private_data: &[u8], deadline: Instant) -> Result<()> {
        let started = Instant::now();
        let addr = self.peer.unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
        let mut param = ConnParam::new(self.qp.number(), self.read_depth, private_data)?;
        self.id.connect(&mut param)?;
        let channel = self.channel.clone().ok_or(Error::State { peer: AddrDisplay(self.peer), state: "passive" })?;
        // We own the QP, so librdmacm reports CONNECT_RESPONSE and leaves RTR/RTS/establish to us.
        expect(&channel, CmEventKind::ConnectResponse, "connection response", addr, deadline, started)?;
        self.move_to_rtr()?;
        self.move_to_rts()?;
        self.id.establish()?;
        self.state = State::Connected;
        Ok(())
    }

    /// Passive side, last step: accept the request (post RECVs first).
    pub(crate) fn accept(&mut self, private_data: &[u8]) -> Result<()> {
        let mut param = ConnParam::new(self.qp.number(), self.read_depth, private_data)?;
        self.id.accept(&mut param)?;
        self.state = State::Connected;
        Ok(())
    }

    pub(crate) fn qp_num(&self) -> u32 {
        self.qp.number()
    }

    pub(crate) fn shares_cq(&self) -> bool {
        self.shared.is_some()
    }
    pub(crate) fn peer_solicits(&self) {
        if let Some((shared, _)) = &self.shared {
            shared.quiet(self.qp.number());
        }
    }
    pub(crate) fn peer(&self) -> Option<SocketAddr> {
        self.peer
    }
    pub(crate) fn local(&self) -> Option<SocketAddr> {
        self.id.local_addr()
    }
    pub(crate) fn pd(&self) -> &Pd {
        &self.pd
    }
    pub(crate) fn port(&self) -> u8 {
        self.id.port()
    }
    pub(crate) fn max_inline(&self) -> u32 {
        self.max_inline
    }

    /// Posts `wrs` with one doorbell.
    pub(crate) fn post(&mut self, wrs: &[WorkRequest<'_>]) -> Result<()> {
        if self.state == State::Closed {
            return Err(Error::State { peer: AddrDisplay(self.peer), state: "closed" });
        }
        self.qp.post(wrs)
    }

    /// Posts a bind of `mw` to `len` bytes at `offset` of `mr` (registered with MW bind access)
    /// with `access`, usable through this QP only, as work request `wr_id` (signaled). The
    /// window's new rkey (its key byte stepped, so an earlier bind's rkey no longer matches).
    pub(crate) fn bind_mw(
        &mut self,
        wr_id: u64,
        mw: &mut Mw,
        mr: &crate::Mr,
        offset: u64,
        len: u64,
        access: Access,
    ) -> Result<u32> {
        #[allow(irrefutable_let_patterns)] // without feature `mem`, Verbs is the only variant
        let crate::MrInner::Verbs(m) = &mr.inner
        else {
            return Err(Error::OtherFabric { what: "the memory region to bind" });
        };
        mr.memory.check("memory window", offset as usize, len as usize)?;
        let mut flags = 0u32;
        if access.remote_read {
            flags |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        }
        if access.remote_write {
            flags |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        }
        // SAFETY: ibv_inc_rkey only computes: the key with its low byte stepped.
        let rkey = unsafe { sys::ibv_inc_rkey(mw.rkey) };
        let info = sys::ibv_mw_bind_info {
            // SAFETY: the registration is live (held by `mr`); the pointer is only read by the bind.
            mr: unsafe { m.mr.mr().as_ptr() },
            addr: mr.addr() + offset,
            length: len,
            mw_access_flags: flags,
        };
        let window = mw.mw.as_ptr();
        // SAFETY: `qpx` is this QP's, between ibv_wr_start and ibv_wr_complete; the window is
        // live (held by `mw`) and `info` outlives the call, which copies it.
        self.post_raw(wr_id, "ibv_wr_bind_mw", |qpx| unsafe { sys::ibv_wr_bind_mw(qpx, window, rkey, &info) })?;
        mw.rkey = rkey;
        Ok(rkey)
    }

    /// Posts a local invalidate of `rkey` (a window bound through this QP) as work request
    /// `wr_id` (signaled): once it completes, the rkey is dead on every QP.
    pub(crate) fn invalidate(&mut self, wr_id: u64, rkey: u32) -> Result<()> {
        // SAFETY: `qpx` is this QP's, between ibv_wr_start and ibv_wr_complete; the work request
        // holds only the rkey value.
        self.post_raw(wr_id, "ibv_wr_local_inv", |qpx| unsafe { sys::ibv_wr_local_inv(qpx, rkey) })
    }

    /// Posts one signaled work request that sideway's builder lacks (a window bind, a local
    /// invalidate): `set` adds it between `ibv_wr_start` and `ibv_wr_complete`.
    fn post_raw(&mut self, wr_id: u64, op: &'static str, set: impl FnOnce(*mut sys::ibv_qp_ex)) -> Result<()> {
        // SAFETY: the QP is live and extended (Qp::create), so `qpx` is its qp_ex; `&mut self`
        // makes this the only poster; ibv_wr_complete ends what ibv_wr_start began on every path.
        let rc = unsafe {
            let qpx = self.qp.qpx();
            sys::ibv_wr_start(qpx);
            (*qpx).wr_id = wr_id;
            (*qpx).wr_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
            set(qpx);
            sys::ibv_wr_complete(qpx)
        };
        if rc != 0 {
            return Err(verbs_err(op, &self.pd.device, std::io::Error::from_raw_os_error(rc)));
        }
        Ok(())
    }

    pub(crate) fn post_recv(&mut self, wr_id: u64, mr: &crate::Mr, offset: usize, len: u32) -> Result<()> {
        let (lkey, addr) = mr.sge(offset, len)?;
        self.qp.post_recv(wr_id, lkey, addr, len)
    }

    /// Whether its receives come from its shared CQ's receive queue ([`Endpoint::take_receive`]).
    pub(crate) fn shares_receives(&self) -> bool {
        self.shares_receives
    }

    /// Copies the message of the shared receive `wr_id` (the first `dst.len()` bytes) and gives
    /// its buffer back to the shared receive queue.
    pub(crate) fn take_receive(&mut self, wr_id: u64, dst: &mut [u8]) -> Result<()> {
        match &self.shared {
            Some((shared, _)) if self.shares_receives => shared.take_receive(self.qp.number(), wr_id, dst),
            _ => Err(Error::OtherFabric { what: "a shared receive on an endpoint without one" }),
        }
    }

    /// Takes up to `out.len()` completions without waiting.
    pub(crate) fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        let n = out.len().min(policy::POLL_BATCH);
        if n == 0 {
            return Ok(0);
        }
        if let Some((shared, inbox)) = &self.shared {
            let take = |inbox: &Inbox, out: &mut [Completion]| {
                let mut q = inbox.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let k = q.len().min(n);
                for (dst, c) in out.iter_mut().zip(q.drain(..k)) {
                    *dst = c;
                }
                k
            };
            let k = take(inbox, out);
            if k > 0 {
                return Ok(k);
            }
            // Nothing routed here yet: route what the CQ holds (the event loop hears of the
            // other endpoints' at its next collect).
            shared.poll_routes()?;
            return Ok(take(inbox, out));
        }
        self.wcs.clear();
        // SAFETY: `wcs` has capacity for POLL_BATCH >= n entries; ibv_poll_cq writes at most n.
        let rc = unsafe { sys::ibv_poll_cq(self.cq.cq().as_ptr(), n as i32, self.wcs.as_mut_ptr()) };
        if rc < 0 {
            return Err(verbs_err("ibv_poll_cq", &self.pd.device, std::io::Error::from_raw_os_error(-rc)));
        }
        // SAFETY: the provider initialised the first `rc` entries.
        unsafe { self.wcs.set_len(rc as usize) };
        for (dst, wc) in out.iter_mut().zip(&self.wcs) {
            *dst = Completion {
                wr_id: wc.wr_id,
                status: WcStatus(wc.status),
                opcode: WcOpcode::from_raw(wc.opcode),
                byte_len: wc.byte_len,
                vendor_err: wc.vendor_err,
            };
        }
        Ok(rc as usize)
    }

    fn arm(&mut self) -> Result<()> {
        // SAFETY: the CQ is live and was created with a completion channel.
        let rc = unsafe { sys::ibv_req_notify_cq(self.cq.cq().as_ptr(), 0) };
        if rc != 0 {
            return Err(verbs_err("ibv_req_notify_cq", &self.pd.device, std::io::Error::from_raw_os_error(rc)));
        }
        self.armed = true;
        Ok(())
    }

    /// Consumes a pending CQ event, if any; true when one was taken.
    fn take_cq_event(&mut self) -> Result<bool> {
        if !get_cq_event(&self.comp, &self.pd.device)? {
            return Ok(false);
        }
        self.armed = false;
        self.unacked += 1;
        if self.unacked >= 64 {
            self.ack_events();
        }
        Ok(true)
    }

    fn ack_events(&mut self) {
        if self.unacked > 0 {
            // SAFETY: acknowledging exactly the events we took from this CQ's channel.
            unsafe { sys::ibv_ack_cq_events(self.cq.cq().as_ptr(), self.unacked) };
            self.unacked = 0;
        }
    }

    /// The completion channel's descriptor, for an event loop of the caller's (io_uring
    /// POLL_ADD, epoll): it becomes readable after [`arm`](Self::arm_events) once a completion
    /// arrives.
    pub(crate) fn event_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&*self.comp)
    }

    /// Takes the CQ event already signalled, if any, and arms the CQ for the next completion.
    /// The caller polls once more afterwards: a completion that landed before the arm raises no
    /// event. An armed CQ raises one event and is disarmed, and is armed again only once that
    /// event is taken: so at most one event waits, and only while `armed`. (Reading on until
    /// EAGAIN cost a read that could only fail after every event: on rxe a system call each.)
    pub(crate) fn arm_events(&mut self) -> Result<()> {
        // A shared CQ is armed by its event loop ([`SharedCq::collect`]).
        if self.shared.is_some() {
            return Ok(());
        }
        if self.armed {
            self.take_cq_event()?;
        }
        if !self.armed {
            self.arm()?;
        }
        Ok(())
    }

    /// Hybrid wait: poll for `spin`, then arm the CQ and sleep on its channel (and on `extra_fd`,
    /// a waker, and on the CM channel of an active side: [`Endpoint::cm_fd`]) until a completion
    /// arrives, the peer disconnects or `deadline` passes. Returns how many completions were
    /// stored in `out` (0 on timeout, wake-up or disconnect).
    pub(crate) fn wait(
        &mut self,
        out: &mut [Completion],
        spin: Duration,
        deadline: Instant,
        extra_fd: Option<std::os::fd::RawFd>,
    ) -> Result<usize> {
        let spin_until = Instant::now() + spin;
        loop {
            let n = self.poll(out)?;
            if n > 0 {
                return Ok(n);
            }
            let now = Instant::now();
            if now < spin_until {
                std::hint::spin_loop();
                continue;
            }
            if self.shared.is_some() {
                // Its CQ's events are its event loop's: this waiter polls, every millisecond.
                if now >= deadline {
                    return Ok(0);
                }
                std::thread::sleep(Duration::from_millis(1).min(deadline - now));
                continue;
            }
            if !self.armed {
                // Arm, then poll once more: a completion that landed between the empty poll and
                // the arm raises no event.
                self.arm()?;
                continue;
            }
            if now >= deadline {
                return Ok(0);
            }
            // The CM channel too: a peer's disconnect ends the wait when it arrives (its QP
            // would only notice once the transport's retries ran out).
            let cm_fd = self.cm_fd();
            let mut fds = [std::os::fd::AsRawFd::as_raw_fd(&*self.comp); 3];
            let mut n = 1;
            for fd in [cm_fd, extra_fd].into_iter().flatten() {
                fds[n] = fd;
                n += 1;
            }
            match cm::wait_any_readable(&fds[..n], Some(deadline))
                .map_err(|e| verbs_err("poll on the completion channel", &self.pd.device, e))?
            {
                None => return Ok(0),
                Some(0) => {
                    self.take_cq_event()?;
                }
                // Taken at once (another event, such as an address change, goes too: the
                // channel is read until empty, so this never spins).
                Some(1) if cm_fd.is_some() => {
                    if self.peer_disconnected() {
                        return Ok(0);
                    }
                }
                Some(_) => return Ok(0),
            }
        }
    }

    pub(crate) fn attributes(&self) -> Result<QpAttributes> {
        // SAFETY: zeroed attribute structs are valid out-parameters.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        let mask = (sys::ibv_qp_attr_mask::IBV_QP_STATE
            | sys::ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC
            | sys::ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | sys::ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | sys::ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | sys::ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | sys::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER
            | sys::ibv_qp_attr_mask::IBV_QP_CAP
            | sys::ibv_qp_attr_mask::IBV_QP_AV)
            .0 as i32;
        // SAFETY: the QP is live and both out-parameters are valid for writes.
        let rc = unsafe { sys::ibv_query_qp(self.qp.raw(), &mut attr, mask, &mut init) };
        if rc != 0 {
            return Err(verbs_err("ibv_query_qp", &self.pd.device, std::io::Error::from_raw_os_error(rc)));
        }
        Ok(QpAttributes {
            state: qp_state_name(attr.qp_state),
            max_rd_atomic: attr.max_rd_atomic,
            max_dest_rd_atomic: attr.max_dest_rd_atomic,
            timeout: attr.timeout,
            retry_cnt: attr.retry_cnt,
            rnr_retry: attr.rnr_retry,
            min_rnr_timer: attr.min_rnr_timer,
            max_inline_data: init.cap.max_inline_data,
            traffic_class: attr.ah_attr.grh.traffic_class,
        })
    }

    /// Disconnects and moves the QP to the error state, which flushes everything posted
    /// (rdma_disconnect alone leaves a QP we own as it is).
    pub(crate) fn disconnect(&mut self) {
        if self.state == State::Connected {
            let _ = self.id.disconnect();
        }
        self.state = State::Closed;
        self.to_error_state();
    }
}

impl Endpoint {
    /// Whether the peer disconnected (or the connection failed) as far as rdma_cm knows: takes
    /// the active side's pending CM events without waiting. The passive side's events go to its
    /// listener, so it always says false. The QP itself does not notice a peer's DREQ: its work
    /// only fails once the transport's retries run out.
    pub(crate) fn peer_disconnected(&mut self) -> bool {
        if self.peer_gone {
            return true;
        }
        let Some(channel) = &self.channel else { return false };
        while let Ok(Some(ev)) = channel.next_event(Some(Instant::now())) {
            if matches!(ev.kind, CmEventKind::Disconnected | CmEventKind::TimewaitExit | CmEventKind::Failure(_)) {
                self.peer_gone = true;
            }
        }
        self.peer_gone
    }

    /// What [`peer_disconnected`](Self::peer_disconnected) found last (also when a
    /// [`wait`](Self::wait) took the event): no system call.
    pub(crate) fn peer_gone(&self) -> bool {
        self.peer_gone
    }

    /// The active side's own CM event channel, readable when rdma_cm has an event for this
    /// endpoint, while it is connected and its peer has not been seen to leave. None on the
    /// passive side (its events go to the listener).
    pub(crate) fn cm_fd(&self) -> Option<std::os::fd::RawFd> {
        let watched = self.state == State::Connected && !self.peer_gone;
        self.channel.as_ref().filter(|_| watched).map(|c| c.fd())
    }

    /// Moves the QP to the error state: everything posted flushes (errors are ignored: a QP
    /// that is already in error stays there).
    fn to_error_state(&self) {
        // SAFETY: zeroed attributes with only the state set are a valid modify request.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = sys::ibv_qp_state::IBV_QPS_ERR;
        // SAFETY: the QP is live.
        let _ = unsafe { sys::ibv_modify_qp(self.qp.raw(), &mut attr, sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32) };
    }

    /// Moves the QP to the error state without a disconnect request: the peer's packets go
    /// unanswered, as to a host that died (tests of the peer's loss detection).
    pub(crate) fn vanish(&mut self) {
        self.state = State::Closed;
        self.to_error_state();
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some((shared, _)) = &self.shared {
            // Its completions from now on are dropped; the CQ is drained before a QP with the
            // same number is routed. The QP is destroyed after this body (field order).
            shared.unroute(self.qp.number());
            shared.unplace();
            return;
        }
        // Drain any CQ event still queued, then acknowledge all: ibv_destroy_cq waits for them.
        while let Ok(true) = self.take_cq_event() {}
        self.ack_events();
    }
}

fn qp_state_name(s: u32) -> &'static str {
    use sys::ibv_qp_state::*;
    match s {
        IBV_QPS_RESET => "RESET",
        IBV_QPS_INIT => "INIT",
        IBV_QPS_RTR => "RTR",
        IBV_QPS_RTS => "RTS",
        IBV_QPS_SQD => "SQD",
        IBV_QPS_SQE => "SQE",
        IBV_QPS_ERR => "ERR",
        _ => "UNKNOWN",
    }
}
