//! The in-memory fabric: the verbs interface with both ends of every connection in one process,
//! so target and initiator logic is tested anywhere, in milliseconds.
//!
//! It keeps the rules of an RC queue pair that our code can observe:
//! - RDMA WRITE and READ are copies between [`Memory`](crate::Memory) regions, checked as a
//!   responder does: the rkey exists, belongs to the PD of the peer's QP, grants the access and
//!   covers the whole range. A failed check completes the WR with `REM_ACCESS_ERR` and puts
//!   **both** QPs in the error state. A local buffer whose lkey is not in this QP's PD (or was
//!   deregistered since the post) gives `LOC_PROT_ERR` and errors this QP only.
//! - In the error state every queued or later WR and every posted RECV completes with
//!   `WR_FLUSH_ERR`, signaled or not. Posts still succeed, except after a local `disconnect`.
//! - A SEND takes the peer's oldest RECV; without one it waits (RNR retry forever) and the WRs
//!   behind it wait too. A SEND larger than the RECV gives `LOC_LEN_ERR` to the receiver and
//!   `REM_INV_REQ_ERR` to the sender, and errors both. Work to a peer whose QP is in error gives
//!   `RETRY_EXC_ERR` (nobody answers).
//! - Work runs inside `post`, or for a waiting SEND inside the peer's `post_recv`: deterministic.
//! - Queue slots as in providers: a send slot is freed only when the completion of its WR, or of
//!   a later one, is polled, so a QP that posts only unsignaled WRs fills up and `post` returns
//!   `QueueFull`, as real verbs do. A RECV slot is freed when its completion is polled.
//! - rdma_cm: listeners bind addresses in a process-wide table (port 0 picks a free port).
//!   `resolve` fails with `UNREACHABLE` when nothing listens at the address; the device is the
//!   listener's device filter, or `mem0`. A rejected or dropped request fails `connect` with
//!   `REJECTED`. Disconnecting or dropping either end errors both QPs and gives the listener
//!   `Disconnected` once.
//!
//! - A memory window's rkey works only on the QP it is bound to; deallocating it removes it, and
//!   so does destroying that QP (a window whose deallocation failed dies with its QP).
//!
//! Fault injection, by QP number ([`Endpoint::qp_num`](crate::Endpoint::qp_num); [`peer_qp_num`]
//! finds the other end's): [`fail_next`], [`fail_dealloc`] and [`sever`]. Slow registration,
//! by length: [`hold_registrations`].

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::Range;
use std::os::fd::{AsRawFd as _, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use crate::completion::{Completion, WcOpcode, WcStatus};
use crate::error::AddrDisplay;
use crate::verbs::cm;
use crate::{
    policy, Access, Error, ListenerEvent, Local, Memory, Op, QpAttributes, QpConfig, Result, Route, WorkRequest,
};

const DEFAULT_DEVICE: &str = "mem0";
/// lkeys differ from rkeys, so using one for the other fails as on hardware.
const LKEY_BIT: u32 = 1 << 31;
/// IB CM reject reasons, as rdma_cm reports them in the event status.
const REJ_NO_LISTENER: i32 = 8;
const REJ_CONSUMER: i32 = 28;
const FLUSH: WcStatus = WcStatus::WR_FLUSH_ERR;

static NEXT_KEY: AtomicU32 = AtomicU32::new(0x100);
static NEXT_QPN: AtomicU32 = AtomicU32::new(0x11);
static NEXT_PD: AtomicU64 = AtomicU64::new(1);
static NEXT_PORT: AtomicU32 = AtomicU32::new(0);
static MRS: Mutex<BTreeMap<u32, Reg>> = Mutex::new(BTreeMap::new());
static LISTENERS: Mutex<BTreeMap<SocketAddr, Weak<ListenerShared>>> = Mutex::new(BTreeMap::new());
static QPS: Mutex<BTreeMap<u32, Weak<Shared>>> = Mutex::new(BTreeMap::new());
static FAULTS: Mutex<BTreeMap<u32, (u32, WcStatus)>> = Mutex::new(BTreeMap::new());
static DEALLOC_FAULTS: Mutex<BTreeMap<u32, u32>> = Mutex::new(BTreeMap::new());
/// QPs whose host went silent (see [`silence`]).
static SILENT: Mutex<std::collections::BTreeSet<u32>> = Mutex::new(std::collections::BTreeSet::new());
/// Lengths whose registrations are held, and how many registrations wait at each.
static HELD: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());
static HELD_CHANGED: Condvar = Condvar::new();

/// Holds (`true`) or lets go (`false`) every registration of memory of exactly `len` bytes, as
/// registering a large volume takes time on a real NIC: [`Pd::register`](crate::Pd::register)
/// of such memory waits, on the thread that called it, until it is let go.
pub fn hold_registrations(len: usize, hold: bool) {
    let mut held = lock(&HELD);
    if hold {
        held.entry(len).or_insert(0);
    } else {
        held.remove(&len);
    }
    HELD_CHANGED.notify_all();
}

/// Listener addresses whose admissions are slowed (see [`slow_admissions`]), and by how much.
static SLOW_ADMISSIONS: Mutex<BTreeMap<SocketAddr, Duration>> = Mutex::new(BTreeMap::new());

/// Makes every connect request to the listener at `addr` take `delay` longer to turn into an
/// endpoint ([`Request::into_endpoint`](crate::Request::into_endpoint), on the thread that
/// calls it), as creating a QP takes milliseconds under load on rxe; a zero delay ends it. A
/// reconnect storm in small.
pub fn slow_admissions(addr: SocketAddr, delay: Duration) {
    let mut slow = lock(&SLOW_ADMISSIONS);
    if delay.is_zero() {
        slow.remove(&addr);
    } else {
        slow.insert(addr, delay);
    }
}

/// Registrations of `len` bytes waiting at [`hold_registrations`] now.
pub fn registrations_held(len: usize) -> usize {
    lock(&HELD).get(&len).copied().unwrap_or(0)
}

/// Makes the next `count` send-queue work requests that run on QP `qp_num` complete with
/// `status` (an error) instead of executing, whether the QP is healthy or already flushing. As
/// with a real error, the QP goes to the error state, and a remote status (`REM_ACCESS_ERR`,
/// `REM_INV_REQ_ERR`, `REM_OP_ERR`) errors the peer's QP too. RECVs are not affected. A count of
/// 0 cancels.
pub fn fail_next(qp_num: u32, count: u32, status: WcStatus) {
    lock(&FAULTS).insert(qp_num, (count, status));
}

/// Makes the next `count` deallocations ([`Mw::dealloc`](crate::Mw::dealloc), or a drop) of
/// windows bound to QP `qp_num` fail, as `ibv_dealloc_mw` can: the window stays, and its rkey
/// keeps working on that QP until the QP is destroyed. A count of 0 cancels.
pub fn fail_dealloc(qp_num: u32, count: u32) {
    lock(&DEALLOC_FAULTS).insert(qp_num, count);
}

fn take_dealloc_fault(qp_num: u32) -> bool {
    let mut faults = lock(&DEALLOC_FAULTS);
    let Some(left) = faults.get_mut(&qp_num).filter(|left| **left > 0) else { return false };
    *left -= 1;
    true
}

/// The number of the QP connected to QP `qp_num` (a test at one end aims faults at the other's).
pub fn peer_qp_num(qp_num: u32) -> Option<u32> {
    let shared = lock(&QPS).get(&qp_num).and_then(Weak::upgrade)?;
    let c = lock(&shared.conn);
    c.qp.iter().map(|q| q.num).find(|&n| n != qp_num && n != 0)
}

/// Cuts the connection of QP `qp_num` as if the peer vanished: both QPs go to the error state
/// (everything posted flushes) and the passive side's listener gets `Disconnected`.
pub fn sever(qp_num: u32) {
    let shared = lock(&QPS).get(&qp_num).and_then(Weak::upgrade);
    if let Some(shared) = shared {
        shared.close();
    }
}

/// Makes QP `qp_num`'s host vanish without a disconnect, its NIC acknowledging nothing: from
/// now on the work requests its peer runs towards it wait (a transport retrying, unanswered),
/// so none of the peer's SENDs complete; nobody hears a disconnect. Unlike [`sever`], neither
/// QP errors: only a liveness rule of the peer's notices (its keepalive that stays
/// unacknowledged).
pub fn silence(qp_num: u32) {
    lock(&SILENT).insert(qp_num);
}

/// Reports device event `kind` (named `what`) to the listener that accepted QP `qp_num`'s
/// connection, as a device's asynchronous event would reach it; nothing else happens to the QP
/// (a device that reports a QP's error has moved it to the error state: [`sever`] does that).
/// False if no listener took it (no such QP, or it was not accepted by a listener).
pub fn device_event(qp_num: u32, kind: crate::DeviceEventKind, what: &'static str) -> bool {
    let Some(shared) = lock(&QPS).get(&qp_num).and_then(Weak::upgrade) else { return false };
    let listener = lock(&shared.conn).listener.as_ref().and_then(|(l, _)| l.upgrade());
    let Some(listener) = listener else { return false };
    listener.push(ListenerEvent::Device(crate::DeviceEvent { device: "mem0".into(), kind, what }));
    true
}

/// Poisoning would turn one failed test into many: the data stays consistent at every unlock.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn take_fault(qp_num: u32) -> Option<WcStatus> {
    let mut faults = lock(&FAULTS);
    let (left, status) = faults.get_mut(&qp_num).filter(|(left, _)| *left > 0)?;
    *left -= 1;
    Some(*status)
}

/// Errors the responder detects; it moves to the error state too.
fn is_remote(status: WcStatus) -> bool {
    matches!(status, WcStatus::REM_ACCESS_ERR | WcStatus::REM_INV_REQ_ERR | WcStatus::REM_OP_ERR)
}

fn sock_err(op: &'static str, source: io::Error) -> Error {
    Error::Os { op, source }
}

fn check_private_data(data: &[u8]) -> Result<()> {
    let (len, max) = (data.len(), policy::MAX_PRIVATE_DATA);
    if len > max {
        return Err(Error::PrivateDataTooLong { len, max });
    }
    Ok(())
}

/// A nonblocking socket pair: the write end rings, the read end is polled.
fn bell() -> Result<(UnixStream, UnixStream)> {
    let (rx, tx) = UnixStream::pair().map_err(|e| sock_err("socketpair", e))?;
    for s in [&rx, &tx] {
        s.set_nonblocking(true).map_err(|e| sock_err("socketpair", e))?;
    }
    Ok((rx, tx))
}

fn ephemeral_port() -> u16 {
    32768 + (NEXT_PORT.fetch_add(1, Relaxed) % 28000) as u16
}

struct Reg {
    pd: u64,
    memory: Arc<Memory>,
    access: Access,
    /// A memory window's: the QP it is bound to (type 2B), and the bytes of `memory` it covers.
    window: Option<(u32, Range<u64>)>,
}

fn local_memory(lkey: u32, pd: u64) -> Option<Arc<Memory>> {
    let mrs = lock(&MRS);
    let reg = mrs.get(&(lkey & !LKEY_BIT)).filter(|r| lkey & LKEY_BIT != 0 && r.pd == pd)?;
    Some(Arc::clone(&reg.memory))
}

/// The responder's check of an RDMA access arriving on QP `qpn`; the memory and the offset of
/// `addr` in it. A window's rkey works only on the QP it is bound to, within its range.
fn remote_memory(rkey: u32, pd: u64, qpn: u32, addr: u64, len: u32, write: bool) -> Option<(Arc<Memory>, usize)> {
    let mrs = lock(&MRS);
    let reg =
        mrs.get(&rkey).filter(|r| r.pd == pd && if write { r.access.remote_write } else { r.access.remote_read })?;
    let offset = addr.checked_sub(reg.memory.addr())?;
    let end = offset.checked_add(u64::from(len))?;
    let inside = match &reg.window {
        Some((bound, range)) => *bound == qpn && range.start <= offset && end <= range.end,
        None => end <= reg.memory.len() as u64,
    };
    inside.then(|| (Arc::clone(&reg.memory), offset as usize))
}

/// A key no registration or window has.
fn fresh_key(mrs: &BTreeMap<u32, Reg>) -> u32 {
    loop {
        let k = NEXT_KEY.fetch_add(1, Relaxed) & !LKEY_BIT;
        if k != 0 && !mrs.contains_key(&k) {
            return k;
        }
    }
}

/// A protection domain: a number that registrations and QPs are tagged with.
#[derive(Clone)]
pub(crate) struct Pd {
    id: u64,
    device: Arc<str>,
}

impl Pd {
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn alloc(device: &str) -> Result<Pd> {
        Ok(Pd { id: NEXT_PD.fetch_add(1, Relaxed), device: device.into() })
    }

    pub(crate) fn device(&self) -> &str {
        &self.device
    }

    pub(crate) fn register(&self, memory: &Arc<Memory>, access: Access) -> Result<Mr> {
        let mut held = lock(&HELD);
        if let Some(waiting) = held.get_mut(&memory.len()) {
            *waiting += 1;
            while held.contains_key(&memory.len()) {
                held = HELD_CHANGED.wait(held).unwrap_or_else(PoisonError::into_inner);
            }
        }
        drop(held);
        let mut mrs = lock(&MRS);
        let rkey = fresh_key(&mrs);
        mrs.insert(rkey, Reg { pd: self.id, memory: Arc::clone(memory), access, window: None });
        Ok(Mr { rkey })
    }

    /// A type 2 window: a key that works once an endpoint of this PD binds it.
    pub(crate) fn alloc_mw(&self) -> Mw {
        Mw { rkey: fresh_key(&lock(&MRS)), pd: self.id, device: Arc::clone(&self.device), gone: false }
    }
}

/// A memory window: `rkey` is in the table only while it is bound.
pub(crate) struct Mw {
    rkey: u32,
    pd: u64,
    device: Arc<str>,
    /// Deallocated (or the attempt failed): never again.
    gone: bool,
}

impl Mw {
    pub(crate) fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Deallocates the window: its rkey stops working, unless [`fail_dealloc`] makes this fail.
    pub(crate) fn dealloc(mut self) -> Result<()> {
        self.dealloc_once()
    }

    fn dealloc_once(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.gone, true) {
            return Ok(());
        }
        let mut mrs = lock(&MRS);
        let bound_to = mrs.get(&self.rkey).and_then(|r| r.window.as_ref().map(|(qpn, _)| *qpn));
        if let Some(qpn) = bound_to {
            if take_dealloc_fault(qpn) {
                let source = io::Error::other(format!("injected fault (mem::fail_dealloc on QP {qpn:#x})"));
                return Err(Error::Verbs { op: "ibv_dealloc_mw", device: self.device.to_string(), source });
            }
            mrs.remove(&self.rkey);
        }
        Ok(())
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        let _ = self.dealloc_once();
    }
}

/// One registration; dropping it removes it from the table, so its keys stop working.
pub(crate) struct Mr {
    rkey: u32,
}

impl Mr {
    pub(crate) fn lkey(&self) -> u32 {
        self.rkey | LKEY_BIT
    }
    pub(crate) fn rkey(&self) -> u32 {
        self.rkey
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        lock(&MRS).remove(&self.rkey);
    }
}

struct ListenerShared {
    addr: SocketAddr,
    device: Option<String>,
    events: Mutex<VecDeque<ListenerEvent<Request>>>,
    // One byte per queued event, so the read end is readable exactly while events are pending.
    tx: UnixStream,
    /// Connect requests queued at most, as `rdma_listen`'s backlog (ucma counts the requests
    /// not yet taken off the channel).
    backlog: usize,
}

impl ListenerShared {
    fn push(&self, ev: ListenerEvent<Request>) {
        let mut events = lock(&self.events);
        events.push_back(ev);
        let _ = (&self.tx).write(&[1]);
    }

    /// Queues a connect request unless `backlog` of them wait already: then it is dropped,
    /// which rejects it, as the kernel does past the backlog.
    fn push_request(&self, request: Request) {
        let mut events = lock(&self.events);
        if events.iter().filter(|e| matches!(e, ListenerEvent::Request(_))).count() >= self.backlog {
            drop(events);
            drop(request);
            return;
        }
        events.push_back(ListenerEvent::Request(request));
        let _ = (&self.tx).write(&[1]);
    }
}

/// The listener at `dst`, or a wildcard one on its port.
fn find_listener(dst: SocketAddr) -> Option<Arc<ListenerShared>> {
    let table = lock(&LISTENERS);
    let mut hits =
        table.iter().filter(|(a, _)| a.port() == dst.port() && (a.ip() == dst.ip() || a.ip().is_unspecified()));
    hits.find_map(|(_, l)| l.upgrade())
}

/// A bound address in the process-wide table.
pub(crate) struct Listener {
    shared: Arc<ListenerShared>,
    rx: UnixStream,
}

impl Listener {
    pub(crate) fn bind(addr: SocketAddr, device: Option<&str>, backlog: u32) -> Result<Listener> {
        let mut table = lock(&LISTENERS);
        // As in the kernel, a wildcard address takes its port on every address.
        let taken = |a: SocketAddr, table: &BTreeMap<SocketAddr, Weak<ListenerShared>>| {
            table.keys().any(|b| {
                b.port() == a.port() && (b.ip() == a.ip() || b.ip().is_unspecified() || a.ip().is_unspecified())
            })
        };
        let mut addr = addr;
        if addr.port() == 0 {
            addr.set_port(ephemeral_port());
            while taken(addr, &table) {
                addr.set_port(ephemeral_port());
            }
        } else if taken(addr, &table) {
            let source = io::Error::from_raw_os_error(libc::EADDRINUSE);
            return Err(Error::Cm { op: "rdma_bind_addr", addr: AddrDisplay(Some(addr)), source });
        }
        let (rx, tx) = bell()?;
        let events = Mutex::new(VecDeque::new());
        let backlog = usize::try_from(backlog).unwrap_or(usize::MAX);
        let shared = Arc::new(ListenerShared { addr, device: device.map(str::to_owned), events, tx, backlog });
        table.insert(addr, Arc::downgrade(&shared));
        Ok(Listener { shared, rx })
    }

    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        Some(self.shared.addr)
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.rx.as_raw_fd()
    }

    pub(crate) fn next_event(&self, deadline: Option<Instant>) -> Result<Option<ListenerEvent<Request>>> {
        loop {
            {
                let mut events = lock(&self.shared.events);
                if let Some(ev) = events.pop_front() {
                    let _ = (&self.rx).read(&mut [0u8]);
                    return Ok(Some(ev));
                }
            }
            if !cm::wait_readable(self.fd(), deadline).map_err(|e| sock_err("poll on the listener", e))? {
                return Ok(None);
            }
        }
    }
}

impl Listener {
    /// Takes the address out of the table (connects are refused, as by a closed port); the
    /// connections accepted so far keep their events.
    pub(crate) fn close_port(&mut self) {
        let mut table = lock(&LISTENERS);
        if table.get(&self.shared.addr).is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&self.shared))) {
            table.remove(&self.shared.addr);
        }
    }

    /// Puts the address back, unless another listener took it meanwhile (EADDRINUSE).
    pub(crate) fn reopen_port(&mut self) -> Result<()> {
        let mut table = lock(&LISTENERS);
        match table.get(&self.shared.addr) {
            Some(w) if std::ptr::eq(w.as_ptr(), Arc::as_ptr(&self.shared)) => Ok(()),
            Some(w) if w.strong_count() > 0 => {
                let source = io::Error::from_raw_os_error(libc::EADDRINUSE);
                Err(Error::Cm { op: "rdma_bind_addr", addr: AddrDisplay(Some(self.shared.addr)), source })
            }
            _ => {
                table.insert(self.shared.addr, Arc::downgrade(&self.shared));
                Ok(())
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Only our own entry: after a handover the address may be another listener's.
        self.close_port();
    }
}

/// A connection request, queued at a listener. Dropping it rejects.
pub(crate) struct Request {
    shared: Option<Arc<Shared>>,
    listener: Weak<ListenerShared>,
    private_data: Vec<u8>,
    peer: SocketAddr,
    local: SocketAddr,
    device: String,
}

impl Request {
    pub(crate) fn private_data(&self) -> &[u8] {
        &self.private_data
    }
    pub(crate) fn peer(&self) -> Option<SocketAddr> {
        Some(self.peer)
    }
    pub(crate) fn device(&self) -> &str {
        &self.device
    }
    pub(crate) fn reject(mut self, private_data: &[u8]) -> Result<()> {
        check_private_data(private_data)?;
        if let Some(shared) = self.shared.take() {
            shared.reject_with(REJ_CONSUMER, private_data);
        }
        Ok(())
    }

    pub(crate) fn into_endpoint(mut self, pd: &Pd, cfg: &QpConfig, conn: u64) -> Result<Endpoint> {
        let delay = lock(&SLOW_ADMISSIONS).get(&self.local).copied();
        if let Some(delay) = delay {
            std::thread::sleep(delay);
        }
        if pd.device() != self.device {
            return Err(Error::PdDevice {
                what: "the connect request".into(),
                found: self.device.as_str().into(),
                pd: pd.device().into(),
            });
        }
        let (qpn, (bell, tx), local, peer) = (NEXT_QPN.fetch_add(1, Relaxed), bell()?, self.local, self.peer);
        let shared = self.shared.take().expect("a request holds its connection until it is consumed");
        {
            let mut c = lock(&shared.conn);
            if c.phase != Phase::Requested {
                return Err(Error::State { peer: AddrDisplay(Some(peer)), state: "abandoned by the connecting side" });
            }
            c.qp[1] = Qp { num: qpn, pd: pd.id, state: State::Rts, bell: Some(tx), ..Qp::default() };
            c.listener = Some((self.listener.clone(), conn));
        }
        lock(&QPS).insert(qpn, Arc::downgrade(&shared));
        Ok(Endpoint { shared, side: 1, qpn, pd: pd.clone(), cfg: *cfg, tos: 0, local, peer, bell, closed: false })
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.reject(REJ_CONSUMER);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    Requested,
    Rejected(i32),
    Established,
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum State {
    #[default]
    Init,
    Rts,
    Err,
}

enum Data {
    Inline(Vec<u8>),
    Region { lkey: u32, offset: usize, len: u32 },
}

struct Wr {
    wr_id: u64,
    op: Op,
    data: Data,
    signaled: bool,
}

struct Recv {
    wr_id: u64,
    lkey: u32,
    offset: usize,
    len: u32,
}

/// A completion and the queue slots that polling it frees.
struct Cqe {
    wc: Completion,
    sq: u32,
    rq: u32,
}

#[derive(Default)]
struct Qp {
    num: u32,
    pd: u64,
    state: State,
    sq: VecDeque<Wr>,
    rq: VecDeque<Recv>,
    cq: VecDeque<Cqe>,
    sq_used: u32,
    rq_used: u32,
    // Executed unsignaled WRs whose slots the next send completion frees.
    unsignaled: u32,
    bell: Option<UnixStream>,
}

impl Qp {
    fn push(&mut self, cqe: Cqe) {
        // A waiter drains the bell and then polls before it sleeps, so only the first entry rings.
        if let Some(bell) = self.bell.as_ref().filter(|_| self.cq.is_empty()) {
            let _ = (&*bell).write(&[1]);
        }
        self.cq.push_back(cqe);
    }

    fn complete_send(&mut self, wr: &Wr, status: WcStatus, byte_len: u32) {
        if status.is_success() && !wr.signaled {
            self.unsignaled += 1;
            return;
        }
        let opcode = match wr.op {
            Op::Send | Op::SendSolicited => WcOpcode::Send,
            Op::Write { .. } => WcOpcode::Write,
            Op::Read { .. } => WcOpcode::Read,
        };
        let wc = Completion { wr_id: wr.wr_id, status, opcode, byte_len, vendor_err: 0 };
        let sq = 1 + std::mem::take(&mut self.unsignaled);
        self.push(Cqe { wc, sq, rq: 0 });
    }

    fn complete_recv(&mut self, r: &Recv, status: WcStatus, byte_len: u32) {
        let wc = Completion { wr_id: r.wr_id, status, opcode: WcOpcode::Recv, byte_len, vendor_err: 0 };
        self.push(Cqe { wc, sq: 0, rq: 1 });
    }
}

enum Step {
    Done(u32),
    Wait,
    Fail(WcStatus),
}

enum Src<'a> {
    Bytes(&'a [u8]),
    Mem(Arc<Memory>, usize),
}

impl Src<'_> {
    fn put(&self, len: u32, dst: &Memory, at: usize) -> Result<()> {
        match self {
            Src::Bytes(b) => dst.write_at(at, b),
            Src::Mem(m, offset) => m.copy_to(*offset, dst, at, len as usize),
        }
    }
}

/// Both QPs of a connection: index 0 is the active side, 1 the passive side.
struct Conn {
    qp: [Qp; 2],
    phase: Phase,
    listener: Option<(Weak<ListenerShared>, u64)>,
    /// The private data of the passive side's reject, once it rejected.
    reject_data: Vec<u8>,
}

impl Conn {
    /// Runs side `s`'s send queue in order until it is empty or a SEND waits for a RECV.
    fn progress(&mut self, s: usize) {
        while let Some(wr) = self.qp[s].sq.pop_front() {
            let step = match take_fault(self.qp[s].num) {
                Some(status) => Step::Fail(status),
                None if self.qp[s].state == State::Err => Step::Fail(FLUSH),
                None => self.execute(s, &wr),
            };
            match step {
                Step::Wait => return self.qp[s].sq.push_front(wr),
                Step::Done(len) => self.qp[s].complete_send(&wr, WcStatus::SUCCESS, len),
                Step::Fail(status) => {
                    self.qp[s].complete_send(&wr, status, 0);
                    self.fail(s);
                    if is_remote(status) {
                        self.fail(1 - s);
                    }
                }
            }
        }
    }

    fn execute(&mut self, s: usize, wr: &Wr) -> Step {
        let [a, b] = &mut self.qp;
        let (me, peer) = if s == 0 { (a, b) } else { (b, a) };
        if peer.state == State::Err {
            // Nobody answers: the transport retries run out.
            return Step::Fail(WcStatus::RETRY_EXC_ERR);
        }
        if lock(&SILENT).contains(&peer.num) {
            return Step::Wait;
        }
        // Looked up when the WR runs, as a NIC does: a registration dropped since the post fails.
        let (src, len) = match &wr.data {
            Data::Inline(bytes) => (Src::Bytes(bytes), bytes.len() as u32),
            Data::Region { lkey, offset, len } => match local_memory(*lkey, me.pd) {
                Some(m) => (Src::Mem(m, *offset), *len),
                None => return Step::Fail(WcStatus::LOC_PROT_ERR),
            },
        };
        let copied = match wr.op {
            // The in-memory fabric wakes a waiter for every completion: solicited or not alike.
            Op::Send | Op::SendSolicited => {
                let Some(recv) = peer.rq.pop_front() else { return Step::Wait };
                if len > recv.len {
                    peer.complete_recv(&recv, WcStatus::LOC_LEN_ERR, 0);
                    return Step::Fail(WcStatus::REM_INV_REQ_ERR);
                }
                let Some(dst) = local_memory(recv.lkey, peer.pd) else {
                    peer.complete_recv(&recv, WcStatus::LOC_PROT_ERR, 0);
                    return Step::Fail(WcStatus::REM_OP_ERR);
                };
                let copied = src.put(len, &dst, recv.offset);
                peer.complete_recv(&recv, WcStatus::SUCCESS, len);
                copied
            }
            Op::Write { remote_addr, rkey } => match remote_memory(rkey, peer.pd, peer.num, remote_addr, len, true) {
                Some((dst, at)) => src.put(len, &dst, at),
                None => return Step::Fail(WcStatus::REM_ACCESS_ERR),
            },
            Op::Read { remote_addr, rkey } => {
                match (remote_memory(rkey, peer.pd, peer.num, remote_addr, len, false), &src) {
                    (Some((from, at)), Src::Mem(dst, offset)) => from.copy_to(at, dst, *offset, len as usize),
                    (None, _) => return Step::Fail(WcStatus::REM_ACCESS_ERR),
                    (_, Src::Bytes(_)) => return Step::Fail(WcStatus::LOC_QP_OP_ERR),
                }
            }
        };
        // Every range was checked against the same mappings, so a failed copy is a bug here.
        match copied {
            Ok(()) => Step::Done(len),
            Err(_) => Step::Fail(WcStatus::GENERAL_ERR),
        }
    }

    /// Moves side `s` to the error state, flushing its RECVs and its send queue.
    fn fail(&mut self, s: usize) {
        let qp = &mut self.qp[s];
        if qp.state == State::Err {
            return;
        }
        qp.state = State::Err;
        while let Some(r) = qp.rq.pop_front() {
            qp.complete_recv(&r, FLUSH, 0);
        }
        self.progress(s);
    }

    /// Errors both QPs, as a DREQ or a lost peer does; returns the listener to tell, if any.
    fn close(&mut self) -> Option<(Weak<ListenerShared>, u64)> {
        self.fail(0);
        self.fail(1);
        match self.phase {
            Phase::Requested => self.phase = Phase::Rejected(REJ_CONSUMER),
            Phase::Established => {
                self.phase = Phase::Closed;
                return self.listener.take();
            }
            _ => {}
        }
        None
    }
}

struct Shared {
    conn: Mutex<Conn>,
    // Signals the end of the handshake to `connect`.
    handshake: Condvar,
}

impl Shared {
    fn close(&self) {
        // Listener events are pushed after unlocking: dropping a listener drops queued requests,
        // which lock their own connections.
        let tell = lock(&self.conn).close();
        self.handshake.notify_all();
        if let Some((listener, conn)) = tell {
            if let Some(l) = listener.upgrade() {
                l.push(ListenerEvent::Disconnected { conn });
            }
        }
    }

    fn reject(&self, status: i32) {
        self.reject_with(status, &[]);
    }

    fn reject_with(&self, status: i32, private_data: &[u8]) {
        let mut c = lock(&self.conn);
        if c.phase == Phase::Requested {
            c.phase = Phase::Rejected(status);
            c.reject_data = private_data.to_vec();
        }
        drop(c);
        self.handshake.notify_all();
    }
}

/// One end of an in-memory RC connection.
pub(crate) struct Endpoint {
    shared: Arc<Shared>,
    side: usize,
    qpn: u32,
    pd: Pd,
    cfg: QpConfig,
    // The traffic class, as rdma_cm would put it in the address vector.
    tos: u8,
    local: SocketAddr,
    peer: SocketAddr,
    // Readable when a completion was queued since the last drain.
    bell: UnixStream,
    closed: bool,
}

impl Endpoint {
    pub(crate) fn resolve(
        dst: SocketAddr,
        pd: Option<&Pd>,
        route: &Route,
        cfg: &QpConfig,
        _deadline: Instant,
    ) -> Result<Endpoint> {
        let listener = find_listener(dst).ok_or(Error::Connect {
            addr: dst,
            event: "UNREACHABLE",
            status: -libc::EHOSTUNREACH,
            expected: "address resolution",
        })?;
        let dev = listener.device.as_deref().unwrap_or(DEFAULT_DEVICE);
        route.check_resolved(dst, dev, pd.map(Pd::device))?;
        let pd = match pd {
            Some(pd) => pd.clone(),
            None => Pd::alloc(dev)?,
        };
        // Loopback unless a source is asked for: every in-memory address is local.
        let loopback = if dst.is_ipv4() { IpAddr::V4(Ipv4Addr::LOCALHOST) } else { IpAddr::V6(Ipv6Addr::LOCALHOST) };
        let ip = route.source.unwrap_or(loopback);
        let qpn = NEXT_QPN.fetch_add(1, Relaxed);
        let (rx, tx) = bell()?;
        let qp = Qp { num: qpn, pd: pd.id, bell: Some(tx), ..Qp::default() };
        let conn = Conn { qp: [qp, Qp::default()], phase: Phase::Idle, listener: None, reject_data: Vec::new() };
        let shared = Arc::new(Shared { conn: Mutex::new(conn), handshake: Condvar::new() });
        lock(&QPS).insert(qpn, Arc::downgrade(&shared));
        let local = SocketAddr::new(ip, ephemeral_port());
        let tos = route.tos.unwrap_or(0);
        Ok(Endpoint { shared, side: 0, qpn, pd, cfg: *cfg, tos, local, peer: dst, bell: rx, closed: false })
    }

    fn state_err(&self, state: &'static str) -> Error {
        Error::State { peer: AddrDisplay(Some(self.peer)), state }
    }

    fn einval(&self, op: &'static str) -> Error {
        Error::Verbs { op, device: self.pd.device().into(), source: io::Error::from_raw_os_error(libc::EINVAL) }
    }

    pub(crate) fn connect(&mut self, private_data: &[u8], deadline: Instant) -> Result<()> {
        check_private_data(private_data)?;
        if self.side != 0 {
            return Err(self.state_err("passive"));
        }
        let rejected = |status, private_data| Error::Rejected {
            addr: self.peer,
            status,
            expected: "connection response",
            private_data,
        };
        let started = Instant::now();
        {
            let mut c = lock(&self.shared.conn);
            if c.phase != Phase::Idle {
                return Err(self.state_err("already connecting or connected"));
            }
            c.phase = Phase::Requested;
        }
        let Some(listener) = find_listener(self.peer) else {
            lock(&self.shared.conn).phase = Phase::Rejected(REJ_NO_LISTENER);
            return Err(rejected(REJ_NO_LISTENER, None));
        };
        let mut data = private_data.to_vec();
        data.resize(policy::MAX_PRIVATE_DATA, 0);
        let request = Request {
            shared: Some(Arc::clone(&self.shared)),
            listener: Arc::downgrade(&listener),
            private_data: data,
            peer: self.local,
            local: self.peer,
            device: self.pd.device().to_owned(),
        };
        listener.push_request(request);
        drop(listener);
        let mut c = lock(&self.shared.conn);
        loop {
            match c.phase {
                Phase::Requested => {}
                Phase::Established => {
                    if c.qp[0].state == State::Init {
                        c.qp[0].state = State::Rts;
                    }
                    return Ok(());
                }
                Phase::Rejected(status) => return Err(rejected(status, crate::error::reject_data(&c.reject_data))),
                Phase::Idle | Phase::Closed => return Err(rejected(REJ_CONSUMER, None)),
            }
            let now = Instant::now();
            if now >= deadline {
                // Gives up like rdma_cm: a later accept of this request fails.
                c.close();
                return Err(Error::Timeout { op: "connection response", after: started.elapsed() });
            }
            c = self.shared.handshake.wait_timeout(c, deadline - now).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    pub(crate) fn accept(&mut self, private_data: &[u8]) -> Result<()> {
        check_private_data(private_data)?;
        if self.side != 1 {
            return Err(self.state_err("active"));
        }
        let tell = {
            let mut c = lock(&self.shared.conn);
            if c.phase != Phase::Requested {
                return Err(self.state_err("abandoned by the connecting side"));
            }
            c.phase = Phase::Established;
            c.listener.clone()
        };
        self.shared.handshake.notify_all();
        if let Some((l, conn)) = tell.and_then(|(l, conn)| Some((l.upgrade()?, conn))) {
            l.push(ListenerEvent::Established { conn });
        }
        Ok(())
    }

    pub(crate) fn qp_num(&self) -> u32 {
        self.qpn
    }
    pub(crate) fn peer(&self) -> Option<SocketAddr> {
        Some(self.peer)
    }
    pub(crate) fn local(&self) -> Option<SocketAddr> {
        Some(self.local)
    }
    pub(crate) fn pd(&self) -> &Pd {
        &self.pd
    }
    pub(crate) fn port(&self) -> u8 {
        1
    }
    pub(crate) fn max_inline(&self) -> u32 {
        self.cfg.max_inline
    }

    pub(crate) fn post(&mut self, wrs: &[WorkRequest<'_>]) -> Result<()> {
        if self.closed {
            return Err(self.state_err("closed"));
        }
        // Everything is checked before anything runs: like ibv_wr_complete, a bad batch posts nothing.
        let mut batch = Vec::with_capacity(wrs.len());
        for wr in wrs {
            let data = match wr.local {
                Local::Inline(bytes) => {
                    if matches!(wr.op, Op::Read { .. }) || bytes.len() > self.cfg.max_inline as usize {
                        return Err(self.einval("ibv_wr_set_inline_data"));
                    }
                    Data::Inline(bytes.to_vec())
                }
                Local::Region { mr, offset, len } => Data::Region { lkey: mr.sge(offset, len)?.0, offset, len },
            };
            batch.push(Wr { wr_id: wr.wr_id, op: wr.op, data, signaled: wr.signaled });
        }
        let mut c = lock(&self.shared.conn);
        let qp = &mut c.qp[self.side];
        if qp.state == State::Init {
            return Err(self.einval("ibv_wr_complete (QP not connected)"));
        }
        if qp.sq_used as usize + batch.len() > self.cfg.send_depth as usize {
            return Err(Error::QueueFull { queue: "send", depth: self.cfg.send_depth });
        }
        qp.sq_used += batch.len() as u32;
        qp.sq.extend(batch);
        c.progress(self.side);
        Ok(())
    }

    /// Binds `mw` to a range of `mr` on this QP. Done at once (not queued behind earlier work
    /// requests, as a NIC would): the completion is queued like any other.
    pub(crate) fn bind_mw(
        &mut self,
        wr_id: u64,
        mw: &mut Mw,
        mr: &crate::Mr,
        offset: u64,
        len: u64,
        access: Access,
    ) -> Result<u32> {
        let crate::MrInner::Mem(m) = &mr.inner else {
            return Err(Error::OtherFabric { what: "the memory region to bind" });
        };
        mr.memory.check("memory window", offset as usize, len as usize)?;
        let status = {
            let mut mrs = lock(&MRS);
            let bindable =
                mrs.get(&m.rkey).is_some_and(|r| r.access.mw_bind && r.pd == self.pd.id && mw.pd == self.pd.id);
            if bindable {
                mrs.remove(&mw.rkey);
                mw.rkey = fresh_key(&mrs);
                let window = Some((self.qpn, offset..offset + len));
                let access = Access { mw_bind: false, ..access };
                mrs.insert(mw.rkey, Reg { pd: self.pd.id, memory: Arc::clone(mr.memory()), access, window });
                WcStatus::SUCCESS
            } else {
                WcStatus::MW_BIND_ERR
            }
        };
        self.complete_local(wr_id, status, WcOpcode::BindMw);
        Ok(mw.rkey)
    }

    /// Invalidates a window bound through this QP, at once.
    pub(crate) fn invalidate(&mut self, wr_id: u64, rkey: u32) -> Result<()> {
        let status = {
            let mut mrs = lock(&MRS);
            match mrs.get(&rkey).and_then(|r| r.window.as_ref()) {
                Some((qpn, _)) if *qpn == self.qpn => {
                    mrs.remove(&rkey);
                    WcStatus::SUCCESS
                }
                _ => WcStatus::LOC_PROT_ERR,
            }
        };
        self.complete_local(wr_id, status, WcOpcode::LocalInv);
        Ok(())
    }

    fn complete_local(&mut self, wr_id: u64, status: WcStatus, opcode: WcOpcode) {
        let mut c = lock(&self.shared.conn);
        let wc = Completion { wr_id, status, opcode, byte_len: 0, vendor_err: 0 };
        c.qp[self.side].push(Cqe { wc, sq: 0, rq: 0 });
    }

    pub(crate) fn post_recv(&mut self, wr_id: u64, mr: &crate::Mr, offset: usize, len: u32) -> Result<()> {
        let (lkey, _) = mr.sge(offset, len)?;
        let recv = Recv { wr_id, lkey, offset, len };
        let mut c = lock(&self.shared.conn);
        let qp = &mut c.qp[self.side];
        if qp.rq_used >= self.cfg.recv_depth {
            return Err(Error::QueueFull { queue: "recv", depth: self.cfg.recv_depth });
        }
        qp.rq_used += 1;
        if qp.state == State::Err {
            qp.complete_recv(&recv, FLUSH, 0);
        } else {
            qp.rq.push_back(recv);
            c.progress(1 - self.side);
        }
        Ok(())
    }

    pub(crate) fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        let n = out.len().min(policy::POLL_BATCH);
        let mut c = lock(&self.shared.conn);
        let qp = &mut c.qp[self.side];
        for (i, slot) in out[..n].iter_mut().enumerate() {
            let Some(cqe) = qp.cq.pop_front() else { return Ok(i) };
            qp.sq_used -= cqe.sq;
            qp.rq_used -= cqe.rq;
            *slot = cqe.wc;
        }
        Ok(n)
    }

    pub(crate) fn event_fd(&self) -> RawFd {
        self.bell.as_raw_fd()
    }

    /// Empties the bell: the next completion rings it again (the caller polls afterwards).
    pub(crate) fn arm_events(&mut self) -> Result<()> {
        while matches!((&self.bell).read(&mut [0u8; 64]), Ok(n) if n > 0) {}
        Ok(())
    }

    /// No spinning: completions are queued under the connection lock, which rings the bell.
    pub(crate) fn wait(
        &mut self,
        out: &mut [Completion],
        _spin: Duration,
        deadline: Instant,
        extra_fd: Option<RawFd>,
    ) -> Result<usize> {
        loop {
            // Drain before polling: a completion queued after the poll rings again.
            while matches!((&self.bell).read(&mut [0u8; 64]), Ok(n) if n > 0) {}
            let n = self.poll(out)?;
            if n > 0 || Instant::now() >= deadline {
                return Ok(n);
            }
            let bell = self.bell.as_raw_fd();
            let fds: &[RawFd] = match extra_fd {
                Some(fd) => &[bell, fd],
                None => &[bell],
            };
            match cm::wait_any_readable(fds, Some(deadline)).map_err(|e| sock_err("poll on the completion bell", e))? {
                Some(0) => {}
                _ => return Ok(0),
            }
        }
    }

    pub(crate) fn attributes(&self) -> Result<QpAttributes> {
        let state = match lock(&self.shared.conn).qp[self.side].state {
            State::Init => "INIT",
            State::Rts => "RTS",
            State::Err => "ERR",
        };
        Ok(QpAttributes {
            state,
            max_rd_atomic: policy::READ_DEPTH,
            max_dest_rd_atomic: policy::READ_DEPTH,
            timeout: policy::TIMEOUT,
            retry_cnt: policy::RETRY_COUNT,
            rnr_retry: policy::RNR_RETRY,
            min_rnr_timer: policy::MIN_RNR_TIMER,
            max_inline_data: self.cfg.max_inline,
            traffic_class: self.tos,
        })
    }

    pub(crate) fn disconnect(&mut self) {
        self.closed = true;
        self.shared.close();
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.shared.close();
        lock(&self.shared.conn).qp[self.side].bell = None;
        lock(&QPS).remove(&self.qpn);
        lock(&FAULTS).remove(&self.qpn);
        lock(&DEALLOC_FAULTS).remove(&self.qpn);
        // Windows still bound to the QP (a failed deallocation) die with it.
        lock(&MRS).retain(|_, r| r.window.as_ref().is_none_or(|(qpn, _)| *qpn != self.qpn));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Endpoint as Ep, Fabric, Listener as L, Mr as M};

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    fn cfg() -> QpConfig {
        QpConfig { send_depth: 4, recv_depth: 4, max_inline: 64 }
    }

    fn bind() -> L {
        L::bind(Fabric::Mem, "127.0.0.1:0".parse().unwrap(), None).unwrap()
    }

    /// A connected (initiator, target) pair; the listener has seen Established for conn 7.
    fn pair() -> (L, Ep, Ep) {
        pair_with(cfg())
    }

    /// [`pair`] with both QPs made with `cfg`.
    fn pair_with(cfg: QpConfig) -> (L, Ep, Ep) {
        let l = bind();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let mut ep = Ep::resolve(Fabric::Mem, addr, None, &Route::default(), &cfg, soon()).unwrap();
            ep.connect(b"hello", soon()).map(|()| ep)
        });
        let Some(ListenerEvent::Request(req)) = l.next_event(Some(soon())).unwrap() else { panic!("no request") };
        assert_eq!(req.private_data().len(), policy::MAX_PRIVATE_DATA);
        assert_eq!(&req.private_data()[..6], b"hello\0");
        let pd = req.alloc_pd().unwrap();
        let mut target = req.into_endpoint(&pd, &cfg, 7).unwrap();
        target.accept().unwrap();
        let initiator = t.join().unwrap().unwrap();
        assert!(matches!(l.next_event(None).unwrap(), Some(ListenerEvent::Established { conn: 7 })));
        assert_eq!(target.peer(), initiator.local());
        (l, initiator, target)
    }

    fn reg(ep: &Ep, len: usize, access: Access) -> M {
        ep.pd().register(&Memory::anonymous(len).unwrap(), access).unwrap()
    }

    fn wr<'a>(wr_id: u64, op: Op, local: Local<'a>) -> WorkRequest<'a> {
        WorkRequest { wr_id, op, local, signaled: true }
    }

    fn write(mr: &M, at: u64) -> Op {
        Op::Write { remote_addr: mr.addr() + at, rkey: mr.rkey() }
    }

    /// Every completion queued now, as (wr_id, status).
    fn drain(ep: &mut Ep) -> Vec<(u64, WcStatus)> {
        let mut out = [Completion::EMPTY; 8];
        let n = ep.poll(&mut out).unwrap();
        out[..n].iter().map(|c| (c.wr_id, c.status)).collect()
    }

    fn state(ep: &Ep) -> &'static str {
        ep.attributes().unwrap().state
    }

    /// Catches a channel that registers its send buffers before a message needs them (an idle
    /// connection pins only its receive buffers), one that inlines a message larger than the QP
    /// allows (this fabric refuses it, as verbs do), and a message from the send buffers that
    /// arrives other than it was sent.
    #[test]
    fn a_channel_registers_send_buffers_only_for_a_message_too_large_to_inline() {
        use crate::channel::{Channel, Event, PINNED_BYTES, RECV_BYTES};
        let (_l, mut a, mut b) = pair_with(QpConfig { send_depth: 18, recv_depth: 16, max_inline: 64 });
        let mut ca = Channel::new(&a.pd()).unwrap();
        let mut cb = Channel::new(&b.pd()).unwrap();
        cb.post_recvs(&mut b).unwrap();
        assert_eq!(ca.pinned_bytes(), RECV_BYTES);
        let small = [7u8; 64];
        ca.send_bytes(&mut a, &small).unwrap();
        assert_eq!(ca.pinned_bytes(), RECV_BYTES, "an inline SEND registers nothing");
        let large: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
        ca.send_bytes(&mut a, &large).unwrap();
        assert_eq!(ca.pinned_bytes(), PINNED_BYTES, "a SEND too large to inline registers the send buffers");
        let mut got = Vec::new();
        let mut buf = [0u8; rblk_proto::MSG_SIZE];
        let deadline = soon();
        while got.len() < 2 && Instant::now() < deadline {
            let mut out = [Completion::EMPTY; 4];
            let n = b.poll(&mut out).unwrap();
            for c in &out[..n] {
                if let Event::Received(len) = cb.on_completion(&mut b, c, &mut buf).unwrap() {
                    got.push(buf[..len].to_vec());
                }
            }
        }
        assert_eq!(got, vec![small.to_vec(), large]);
    }

    #[test]
    fn write_then_read_back() {
        let (_l, mut a, mut b) = pair();
        let vol = reg(&b, 8192, Access::REMOTE_READ_WRITE);
        let buf = reg(&a, 4096, Access::LOCAL);
        buf.memory().write_at(0, b"region").unwrap();
        a.post(&[
            wr(1, write(&vol, 4096), Local::Inline(b"inline")),
            wr(2, write(&vol, 100), Local::Region { mr: &buf, offset: 0, len: 6 }),
        ])
        .unwrap();
        let read = Op::Read { remote_addr: vol.addr() + 4096, rkey: vol.rkey() };
        a.post(&[wr(3, read, Local::Region { mr: &buf, offset: 10, len: 6 })]).unwrap();
        let mut out = [Completion::EMPTY; 4];
        assert_eq!(a.wait(&mut out, Duration::ZERO, soon()).unwrap(), 3);
        assert_eq!(
            out[..3].iter().map(|c| (c.wr_id, c.opcode, c.byte_len)).collect::<Vec<_>>(),
            [(1, WcOpcode::Write, 6), (2, WcOpcode::Write, 6), (3, WcOpcode::Read, 6)]
        );
        let mut got = [0u8; 6];
        buf.memory().read_at(10, &mut got).unwrap();
        assert_eq!(&got, b"inline");
        vol.memory().read_at(100, &mut got).unwrap();
        assert_eq!(&got, b"region");
        assert!(drain(&mut b).is_empty());
        assert_eq!(state(&a), "RTS");
        let attr = b.attributes().unwrap();
        assert_eq!((attr.max_rd_atomic, attr.rnr_retry, attr.max_inline_data), (policy::READ_DEPTH, 7, 64));
    }

    /// Volumes are sealed memfds (issue 28): catches a memfd mapping that cannot be registered,
    /// or whose registration and CPU side do not see the same bytes.
    #[test]
    fn memfd_memory_registers_and_serves_rdma() {
        let (_l, mut a, b) = pair();
        let memory = Memory::memfd("rblk-test:registered", 8192).unwrap();
        memory.write_at(0, b"cpu").unwrap();
        let vol = b.pd().register(&memory, Access::REMOTE_READ_WRITE).unwrap();
        let buf = reg(&a, 4096, Access::LOCAL);
        a.post(&[wr(1, write(&vol, 4096), Local::Inline(b"nic"))]).unwrap();
        let read = Op::Read { remote_addr: vol.addr(), rkey: vol.rkey() };
        a.post(&[wr(2, read, Local::Region { mr: &buf, offset: 0, len: 3 })]).unwrap();
        let mut out = [Completion::EMPTY; 2];
        assert_eq!(a.wait(&mut out, Duration::ZERO, soon()).unwrap(), 2);
        assert!(out.iter().all(|c| c.status == WcStatus::SUCCESS));
        let mut got = [0u8; 3];
        memory.read_at(4096, &mut got).unwrap();
        assert_eq!(&got, b"nic");
        buf.memory().read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"cpu");
        assert!(vol.memory().fd().is_some());
    }

    #[test]
    fn send_waits_for_recv_and_keeps_order() {
        let (_l, mut a, mut b) = pair();
        let vol = reg(&b, 4096, Access::REMOTE_READ_WRITE);
        let rbuf = reg(&b, 4096, Access::LOCAL);
        a.post(&[wr(1, Op::Send, Local::Inline(b"ping!")), wr(2, write(&vol, 0), Local::Inline(b"after"))]).unwrap();
        assert!(drain(&mut a).is_empty());
        let mut got = [0u8; 5];
        vol.memory().read_at(0, &mut got).unwrap();
        assert_eq!(got, [0; 5], "the WRITE ran before the SEND ahead of it");
        b.post_recv(9, &rbuf, 64, 128).unwrap();
        assert_eq!(drain(&mut a), [(1, WcStatus::SUCCESS), (2, WcStatus::SUCCESS)]);
        let mut c = [Completion::EMPTY];
        assert_eq!(b.poll(&mut c).unwrap(), 1);
        assert_eq!((c[0].wr_id, c[0].opcode, c[0].byte_len), (9, WcOpcode::Recv, 5));
        rbuf.memory().read_at(64, &mut got).unwrap();
        assert_eq!(&got, b"ping!");
        vol.memory().read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"after");
    }

    #[test]
    fn wrong_rkey_errors_both_sides_and_flushes() {
        let (_l, mut a, mut b) = pair();
        let rbuf = reg(&b, 4096, Access::LOCAL);
        b.post_recv(1, &rbuf, 0, 64).unwrap();
        b.post_recv(2, &rbuf, 64, 64).unwrap();
        let bad = Op::Write { remote_addr: rbuf.addr(), rkey: 0x7eed_beef };
        a.post(&[
            WorkRequest { signaled: false, ..wr(5, bad, Local::Inline(b"x")) },
            wr(6, Op::Send, Local::Inline(b"y")),
        ])
        .unwrap();
        assert_eq!(drain(&mut a), [(5, WcStatus::REM_ACCESS_ERR), (6, FLUSH)]);
        assert_eq!(drain(&mut b), [(1, FLUSH), (2, FLUSH)]);
        assert_eq!((state(&a), state(&b)), ("ERR", "ERR"));
        // Posting on an errored QP succeeds and flushes, signaled or not, on both queues.
        a.post(&[WorkRequest { signaled: false, ..wr(7, Op::Send, Local::Inline(b"z")) }]).unwrap();
        b.post_recv(3, &rbuf, 0, 64).unwrap();
        assert_eq!(drain(&mut a), [(7, FLUSH)]);
        assert_eq!(drain(&mut b), [(3, FLUSH)]);
    }

    #[test]
    fn responder_refuses_bad_accesses() {
        for case in 0..6 {
            let (_l, mut a, b) = pair();
            let [rw, ro, local, gone] =
                [Access::REMOTE_READ_WRITE, Access::REMOTE_READ, Access::LOCAL, Access::REMOTE_READ_WRITE]
                    .map(|access| reg(&b, 4096, access));
            let foreign = reg(&a, 4096, Access::REMOTE_READ_WRITE);
            let (what, op) = [
                ("WRITE to a read-only registration", write(&ro, 0)),
                ("READ of a local-only registration", Op::Read { remote_addr: local.addr(), rkey: local.rkey() }),
                ("past the end", write(&rw, 4094)),
                ("before the start", Op::Write { remote_addr: rw.addr() - 1, rkey: rw.rkey() }),
                ("rkey of another PD", write(&foreign, 0)),
                ("deregistered", write(&gone, 0)),
            ][case];
            drop(gone);
            let buf = reg(&a, 4096, Access::LOCAL);
            a.post(&[wr(1, op, Local::Region { mr: &buf, offset: 0, len: 4 })]).unwrap();
            assert_eq!(drain(&mut a), [(1, WcStatus::REM_ACCESS_ERR)], "{what}");
            assert_eq!(state(&b), "ERR", "{what}");
        }
    }

    #[test]
    fn local_checks() {
        let (_l, mut a, mut b) = pair();
        let vol = reg(&b, 4096, Access::REMOTE_READ_WRITE);
        let buf = reg(&a, 4096, Access::LOCAL);
        let read = Op::Read { remote_addr: vol.addr(), rkey: vol.rkey() };
        assert!(matches!(
            a.post(&[
                wr(1, read, Local::Region { mr: &buf, offset: 0, len: 8 }),
                wr(2, read, Local::Region { mr: &buf, offset: 4090, len: 8 })
            ]),
            Err(Error::OutOfRange { .. })
        ));
        assert!(a.post(&[wr(3, read, Local::Inline(b"no"))]).is_err());
        assert!(a.post(&[wr(4, write(&vol, 0), Local::Inline(&[0; 65]))]).is_err());
        assert!(drain(&mut a).is_empty(), "a refused batch posts nothing");
        // A buffer from another PD: a local protection error, which the responder never sees.
        let foreign = reg(&b, 4096, Access::LOCAL);
        a.post(&[wr(5, write(&vol, 0), Local::Region { mr: &foreign, offset: 0, len: 8 })]).unwrap();
        assert_eq!(drain(&mut a), [(5, WcStatus::LOC_PROT_ERR)]);
        assert_eq!((state(&a), state(&b)), ("ERR", "RTS"));
        // The peer's work now finds nobody answering.
        b.post(&[wr(6, Op::Send, Local::Inline(b"hi"))]).unwrap();
        assert_eq!(drain(&mut b), [(6, WcStatus::RETRY_EXC_ERR)]);
    }

    #[test]
    fn send_larger_than_recv() {
        let (_l, mut a, mut b) = pair();
        let rbuf = reg(&b, 4096, Access::LOCAL);
        b.post_recv(1, &rbuf, 0, 4).unwrap();
        b.post_recv(2, &rbuf, 4, 64).unwrap();
        a.post(&[wr(3, Op::Send, Local::Inline(b"too long"))]).unwrap();
        assert_eq!(drain(&mut a), [(3, WcStatus::REM_INV_REQ_ERR)]);
        assert_eq!(drain(&mut b), [(1, WcStatus::LOC_LEN_ERR), (2, FLUSH)]);
    }

    #[test]
    fn unsignaled_work_and_queue_depth() {
        let (_l, mut a, mut b) = pair();
        let vol = reg(&b, 4096, Access::REMOTE_READ_WRITE);
        let quiet = |id| WorkRequest { signaled: false, ..wr(id, write(&vol, id), Local::Inline(b"q")) };
        a.post(&[quiet(0), quiet(1), quiet(2)]).unwrap();
        assert!(drain(&mut a).is_empty());
        let mut got = [0u8; 3];
        vol.memory().read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"qqq");
        a.post(&[wr(3, write(&vol, 3), Local::Inline(b"s"))]).unwrap();
        // Unsignaled slots stay taken until a later completion is polled, as in providers.
        assert!(matches!(a.post(&[quiet(4)]), Err(Error::QueueFull { queue: "send", depth: 4 })));
        assert_eq!(drain(&mut a), [(3, WcStatus::SUCCESS)]);
        a.post(&[quiet(4), quiet(5), quiet(6), quiet(7)]).unwrap();
        let rbuf = reg(&b, 4096, Access::LOCAL);
        for i in 0..4 {
            b.post_recv(i, &rbuf, 0, 8).unwrap();
        }
        assert!(matches!(b.post_recv(4, &rbuf, 0, 8), Err(Error::QueueFull { queue: "recv", depth: 4 })));
    }

    #[test]
    fn reject_and_nothing_listening() {
        let l = bind();
        let addr = l.local_addr().unwrap();
        assert!(matches!(L::bind(Fabric::Mem, addr, None), Err(Error::Cm { .. })));
        for drop_it in [false, true] {
            let t = std::thread::spawn(move || {
                let mut ep = Ep::resolve(Fabric::Mem, addr, None, &Route::default(), &cfg(), soon()).unwrap();
                ep.connect(&[], soon())
            });
            let Some(ListenerEvent::Request(req)) = l.next_event(Some(soon())).unwrap() else { panic!() };
            if drop_it {
                drop(req);
            } else {
                req.reject().unwrap();
            }
            assert!(matches!(t.join().unwrap(), Err(Error::Rejected { .. })));
        }
        drop(l);
        let err = Ep::resolve(Fabric::Mem, addr, None, &Route::default(), &cfg(), soon()).unwrap_err();
        assert!(matches!(err, Error::Connect { event: "UNREACHABLE", .. }), "{err}");
    }

    /// The route's source address is the one the passive side sees the connection come from,
    /// and its TOS is the QP's traffic class; a source of the other family is refused before
    /// anything is resolved.
    #[test]
    fn route_source_and_tos() {
        let l = bind();
        let addr = l.local_addr().unwrap();
        let source: IpAddr = "127.0.0.9".parse().unwrap();
        let route = Route { source: Some(source), tos: Some(106), ..Route::default() };
        let t = std::thread::spawn(move || {
            let mut ep = Ep::resolve(Fabric::Mem, addr, None, &route, &cfg(), soon()).unwrap();
            ep.connect(&[], soon()).unwrap();
            ep
        });
        let Some(ListenerEvent::Request(req)) = l.next_event(Some(soon())).unwrap() else { panic!() };
        assert_eq!(req.peer().map(|a| a.ip()), Some(source));
        let pd = req.alloc_pd().unwrap();
        let mut b = req.into_endpoint(&pd, &cfg(), 1).unwrap();
        b.accept().unwrap();
        let a = t.join().unwrap();
        assert_eq!(a.attributes().unwrap().traffic_class, 106);
        assert_eq!(b.peer().map(|a| a.ip()), Some(source));

        let v6 = Route { source: Some("::1".parse().unwrap()), ..Route::default() };
        let err = Ep::resolve(Fabric::Mem, addr, None, &v6, &cfg(), soon()).unwrap_err();
        assert!(matches!(err, Error::SourceFamily { .. }), "{err}");
    }

    /// Would catch a backlog that is not passed to the listener, or not counted: with a
    /// backlog of 2, a third waiting request is rejected at once (not queued), and once the
    /// target takes one off the channel there is room for another.
    #[test]
    fn the_backlog_bounds_waiting_requests() {
        let l = L::bind_backlog(Fabric::Mem, "127.0.0.1:0".parse().unwrap(), None, 2).unwrap();
        let addr = l.local_addr().unwrap();
        let connect = move || {
            std::thread::spawn(move || {
                let mut ep = Ep::resolve(Fabric::Mem, addr, None, &Route::default(), &cfg(), soon()).unwrap();
                ep.connect(&[], soon())
            })
        };
        let waiting = [connect(), connect()];
        while lock(&l_shared(&l).events).len() < 2 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let third = connect().join().unwrap();
        assert!(matches!(third, Err(Error::Rejected { .. })), "{third:?}");
        let Some(ListenerEvent::Request(taken)) = l.next_event(None).unwrap() else { panic!() };
        let fourth = connect();
        while lock(&l_shared(&l).events).len() < 2 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut requests = vec![taken];
        while let Some(ListenerEvent::Request(r)) = l.next_event(None).unwrap() {
            requests.push(r);
        }
        assert_eq!(requests.len(), 3, "two queued after the first was taken");
        let pd = requests[0].alloc_pd().unwrap();
        let mut accepted = Vec::new();
        for (conn, r) in requests.into_iter().enumerate() {
            accepted.push(r.into_endpoint(&pd, &cfg(), conn as u64).unwrap());
            accepted.last_mut().unwrap().accept().unwrap();
        }
        for t in waiting.into_iter().chain([fourth]) {
            t.join().unwrap().expect("a request within the backlog is served");
        }
    }

    fn l_shared(l: &L) -> Arc<ListenerShared> {
        match &l.inner {
            crate::ListenerInner::Mem(m) => Arc::clone(&m.shared),
            crate::ListenerInner::Verbs(_) => unreachable!("an in-memory listener"),
        }
    }

    #[test]
    fn connect_times_out_without_answer() {
        let l = bind();
        let mut ep =
            Ep::resolve(Fabric::Mem, l.local_addr().unwrap(), None, &Route::default(), &cfg(), soon()).unwrap();
        let err = ep.connect(&[], Instant::now() + Duration::from_millis(20)).unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        let Some(ListenerEvent::Request(req)) = l.next_event(None).unwrap() else { panic!() };
        let pd = req.alloc_pd().unwrap();
        assert!(req.into_endpoint(&pd, &cfg(), 1).is_err());
    }

    #[test]
    fn disconnect_flushes_peer_and_tells_listener() {
        let (l, mut a, mut b) = pair();
        let rbuf = reg(&a, 4096, Access::LOCAL);
        a.post_recv(1, &rbuf, 0, 64).unwrap();
        b.disconnect();
        assert_eq!(drain(&mut a), [(1, FLUSH)]);
        assert!(matches!(l.next_event(Some(soon())).unwrap(), Some(ListenerEvent::Disconnected { conn: 7 })));
        a.post(&[wr(2, Op::Send, Local::Inline(b"x"))]).unwrap();
        assert_eq!(drain(&mut a), [(2, FLUSH)]);
        assert!(matches!(b.post(&[wr(3, Op::Send, Local::Inline(b"x"))]), Err(Error::State { .. })));
        drop(b);
        a.disconnect();
        assert!(l.next_event(None).unwrap().is_none(), "Disconnected comes once");
    }

    #[test]
    fn wait_deadline_waker_and_cross_thread() {
        let (_l, mut a, b) = pair();
        let mut out = [Completion::EMPTY; 2];
        let t0 = Instant::now();
        assert_eq!(a.wait(&mut out, Duration::from_micros(20), t0 + Duration::from_millis(30)).unwrap(), 0);
        assert!(t0.elapsed() >= Duration::from_millis(30));
        let waker = a.waker();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(10));
            waker.wake();
        });
        assert_eq!(a.wait(&mut out, Duration::ZERO, soon()).unwrap(), 0);
        assert!(a.take_wake());
        t.join().unwrap();
        let rbuf = reg(&a, 4096, Access::LOCAL);
        a.post_recv(1, &rbuf, 0, 64).unwrap();
        let t = std::thread::spawn(move || {
            let mut b = b;
            std::thread::sleep(Duration::from_millis(10));
            b.post(&[wr(2, Op::Send, Local::Inline(b"late"))]).unwrap();
            b
        });
        assert_eq!(a.wait(&mut out, Duration::ZERO, soon()).unwrap(), 1);
        assert_eq!((out[0].wr_id, out[0].byte_len), (1, 4));
        drop(t.join().unwrap());
    }

    #[test]
    fn fault_injection() {
        let (l, mut a, mut b) = pair();
        let vol = reg(&b, 4096, Access::REMOTE_READ_WRITE);
        fail_next(a.qp_num(), 1, WcStatus::RETRY_EXC_ERR);
        a.post(&[wr(1, write(&vol, 0), Local::Inline(b"x")), wr(2, write(&vol, 0), Local::Inline(b"x"))]).unwrap();
        assert_eq!(drain(&mut a), [(1, WcStatus::RETRY_EXC_ERR), (2, FLUSH)]);
        assert_eq!((state(&a), state(&b)), ("ERR", "RTS"));
        let mut got = [0u8];
        vol.memory().read_at(0, &mut got).unwrap();
        assert_eq!(got, [0]);
        let rbuf = reg(&b, 4096, Access::LOCAL);
        b.post_recv(3, &rbuf, 0, 8).unwrap();
        sever(b.qp_num());
        assert_eq!(drain(&mut b), [(3, FLUSH)]);
        assert!(matches!(l.next_event(Some(soon())).unwrap(), Some(ListenerEvent::Disconnected { conn: 7 })));
    }

    /// Catches `Mw::dealloc` that cannot fail here (the target's handling of a failed
    /// `ibv_dealloc_mw` would go untested), a failed one that still kills the rkey (tests would
    /// pass without the target's disconnect), or a window that outlives its QP.
    #[test]
    fn a_failed_window_dealloc_keeps_the_rkey_until_the_qp_goes() {
        // A window over a region of the target's, bound to its QP; the initiator's WRITE with it.
        let window = |b: &mut Ep| {
            let region = reg(b, 8192, Access::BIND_ONLY);
            let mut mw = b.pd().alloc_mw().unwrap();
            b.bind_mw(2, &mut mw, &region, 0, 8192, Access::REMOTE_READ_WRITE).unwrap();
            assert_eq!(drain(b), [(2, WcStatus::SUCCESS)]);
            (mw, region.addr())
        };
        let access = |a: &mut Ep, addr: u64, rkey: u32| {
            a.post(&[wr(1, Op::Write { remote_addr: addr, rkey }, Local::Inline(b"x"))]).unwrap();
            drain(a)[0].1
        };
        let (_l, mut a, mut b) = pair();
        let (ok, addr) = window(&mut b);
        let rkey = ok.rkey();
        assert_eq!(access(&mut a, addr, rkey), WcStatus::SUCCESS);
        ok.dealloc().expect("a plain dealloc works");
        assert_eq!(access(&mut a, addr, rkey), WcStatus::REM_ACCESS_ERR, "a deallocated window's rkey");

        let (_l, mut a, mut b) = pair();
        let (stuck, addr) = window(&mut b);
        let rkey = stuck.rkey();
        assert_eq!(peer_qp_num(a.qp_num()), Some(b.qp_num()));
        fail_dealloc(b.qp_num(), 1);
        let e = stuck.dealloc().expect_err("injected");
        assert!(e.to_string().contains("ibv_dealloc_mw"), "{e}");
        assert_eq!(access(&mut a, addr, rkey), WcStatus::SUCCESS, "the window is still there");
        drop(b);
        assert!(lock(&MRS).get(&rkey).is_none(), "it died with its QP");
    }
}
