//! A completion queue and completion channel shared by many endpoints of one device: an event
//! loop's (the target's workers), as SPDK's poll groups share a CQ per device. One CQ event
//! then covers the completions of every QP on it that arrived meanwhile, one re-arm serves them
//! all, and a QP adds no descriptor and no CQ of its own (created per connection, they were
//! most of an admission's time in a reconnect storm).
//!
//! Completions are routed by QP number into the endpoints' inboxes ([`Inbox`]), whoever polls:
//! the event loop ([`SharedCq::collect`]) or an endpoint that polls its own
//! ([`Endpoint::poll`](super::Endpoint::poll)). The event loop learns which endpoints got
//! completions from [`SharedCq::collect`], which names every one routed to since its last
//! call. A QP is routed from its creation on; its route goes before it is destroyed, and the
//! CQ is drained before a QP is routed, so a QP that reuses a destroyed one's number never gets
//! that one's stale completions.
//!
//! Solicited events: once the peer of every QP on the CQ sets the solicited-event flag on the
//! SENDs that need an answer ([`SharedCq::quiet`]), the CQ is armed for solicited completions
//! only, so a keepalive that arrives or one of our SENDs that completes raises no event: the
//! event loop finds them when it polls ([`SharedCq::poll`]) at its next wake-up. A QP whose peer
//! does not (each is so from its routing until [`SharedCq::quiet`]) has every completion raise
//! one, as before: routing it re-arms the CQ for every completion at once.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rdma_mummy_sys as sys;
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionChannel, CompletionQueue as _};

use super::endpoint::{get_cq_event, other_err, verbs_err, Pd};
use crate::completion::{Completion, WcOpcode, WcStatus};
use crate::{policy, Result};

/// Completions routed to one endpoint, not taken yet.
pub(crate) type Inbox = Arc<Mutex<VecDeque<Completion>>>;

/// See the module docs.
pub(crate) struct SharedCq {
    // Declaration order is drop order: the CQ before its channel.
    cq: Arc<BasicCompletionQueue>,
    comp: Arc<CompletionChannel>,
    device: Arc<str>,
    /// QPs it has room for (each may have `per_qp` completions outstanding).
    room: usize,
    state: Mutex<State>,
}

/// Where one QP's completions go.
struct Route {
    /// The endpoint's tag, named by [`SharedCq::collect`].
    tag: u64,
    inbox: Inbox,
    /// Its peer solicits the completions that need an answer ([`SharedCq::quiet`]).
    quiet: bool,
}

struct State {
    /// QP number -> its route.
    routes: HashMap<u32, Route>,
    /// Routes that are not quiet: while any is, the CQ is armed for every completion.
    loud: usize,
    /// QPs that hold a place (created, or about to be).
    placed: usize,
    /// Tags of the endpoints routed to since the last [`SharedCq::collect`].
    routed: Vec<u64>,
    armed: bool,
    /// The arm asked for solicited completions only.
    armed_solicited: bool,
    unacked: u32,
    wcs: Vec<sys::ibv_wc>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SharedCq {
    /// A CQ on `pd`'s device with room for `room` QPs of `per_qp` completions each, on
    /// completion vector `vector` modulo the device's count, armed.
    pub(crate) fn new(pd: &Pd, room: usize, per_qp: u32, vector: u32) -> Result<Arc<SharedCq>> {
        let dev = pd.device();
        let ctx = pd.context();
        // SAFETY: the context is open (we hold it) and libibverbs filled `num_comp_vectors` at
        // ibv_open_device; it is only read.
        let vectors = unsafe { (*ctx.context().as_ptr()).num_comp_vectors };
        let vector = u32::try_from(vectors).ok().filter(|&n| n > 0).map_or(0, |n| vector % n);
        let comp = ctx.create_comp_channel().map_err(|e| other_err("ibv_create_comp_channel", dev, e))?;
        comp.set_nonblocking(true).map_err(|e| verbs_err("fcntl(O_NONBLOCK) on the completion channel", dev, e))?;
        let cqe = u32::try_from(room)
            .ok()
            .and_then(|r| r.checked_mul(per_qp))
            .ok_or_else(|| verbs_err("sizing a shared completion queue", dev, std::io::Error::other("too large")))?;
        let cq = ctx
            .create_cq_builder()
            .setup_cqe(cqe)
            .setup_comp_channel(&comp, vector)
            .build()
            .map_err(|e| other_err("ibv_create_cq", dev, e))?;
        let shared = Arc::new(SharedCq {
            cq,
            comp,
            device: dev.into(),
            room,
            state: Mutex::new(State {
                routes: HashMap::new(),
                loud: 0,
                placed: 0,
                routed: Vec::new(),
                armed: false,
                armed_solicited: false,
                unacked: 0,
                wcs: Vec::with_capacity(policy::POLL_BATCH),
            }),
        });
        shared.arm(&mut lock(&shared.state))?;
        Ok(shared)
    }

    /// The CQ, for a QP created on it (after [`SharedCq::place`]).
    pub(crate) fn cq(&self) -> &Arc<BasicCompletionQueue> {
        &self.cq
    }

    /// The completion channel (kept by the endpoints on the CQ: a CQ outlives no channel).
    pub(crate) fn channel(&self) -> &Arc<CompletionChannel> {
        &self.comp
    }

    /// The completion channel's descriptor: readable once a completion arrived while armed.
    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&*self.comp)
    }

    /// Takes a place for one more QP; false when it has no room left (a full CQ would
    /// overflow, which errors every QP on it).
    pub(crate) fn place(&self) -> bool {
        let mut st = lock(&self.state);
        if st.placed >= self.room {
            return false;
        }
        st.placed += 1;
        true
    }

    /// Gives a place back (a QP that was not created, or is gone).
    pub(crate) fn unplace(&self) {
        let mut st = lock(&self.state);
        st.placed = st.placed.saturating_sub(1);
    }

    /// Whether it has room for one more QP.
    pub(crate) fn has_room(&self) -> bool {
        let st = lock(&self.state);
        st.placed < self.room
    }

    /// QPs placed on it now.
    pub(crate) fn placed(&self) -> usize {
        lock(&self.state).placed
    }

    /// Routes QP `qp_num`'s completions to `inbox`, naming `tag` in [`SharedCq::collect`].
    /// Drains the CQ first: completions of a destroyed QP that had the same number are dropped.
    /// The route is loud (each completion raises an event) until [`SharedCq::quiet`]: a CQ armed
    /// for solicited completions only is armed again for all of them at once.
    pub(crate) fn route(&self, qp_num: u32, tag: u64, inbox: Inbox) -> Result<()> {
        let mut st = lock(&self.state);
        self.drain(&mut st)?;
        if let Some(old) = st.routes.insert(qp_num, Route { tag, inbox, quiet: false }) {
            st.loud -= usize::from(!old.quiet);
        }
        st.loud += 1;
        if st.armed && st.armed_solicited {
            self.arm(&mut st)?;
        }
        Ok(())
    }

    /// Stops routing QP `qp_num` (before it is destroyed): what it still gets is dropped.
    pub(crate) fn unroute(&self, qp_num: u32) {
        let mut st = lock(&self.state);
        if let Some(old) = st.routes.remove(&qp_num) {
            st.loud -= usize::from(!old.quiet);
        }
    }

    /// QP `qp_num`'s peer sets the solicited-event flag on every SEND that needs an answer:
    /// its other completions need not raise an event. Once every route on the CQ is quiet, the
    /// next arm is for solicited completions only.
    pub(crate) fn quiet(&self, qp_num: u32) {
        let mut st = lock(&self.state);
        if let Some(route) = st.routes.get_mut(&qp_num) {
            if !route.quiet {
                route.quiet = true;
                st.loud -= 1;
            }
        }
    }

    /// Routes what the CQ holds without taking an event or arming it (an event loop's poll at
    /// a wake-up the CQ did not cause: completions that raised no event wait there), and
    /// appends the tags routed to since the last call to `ready`.
    pub(crate) fn poll(&self, ready: &mut Vec<u64>) -> Result<()> {
        let mut st = lock(&self.state);
        self.drain(&mut st)?;
        ready.append(&mut st.routed);
        Ok(())
    }

    /// Polls what is in the CQ into the inboxes (for an endpoint that polls its own).
    pub(crate) fn poll_routes(&self) -> Result<()> {
        let mut st = lock(&self.state);
        self.drain(&mut st)
    }

    /// For the event loop, when [`SharedCq::fd`] is readable (or at any time): takes the CQ
    /// event, routes every completion, arms the CQ again (and routes what landed before the
    /// arm), and appends the tags of the endpoints routed to since the last call to `ready`.
    pub(crate) fn collect(&self, ready: &mut Vec<u64>) -> Result<()> {
        let mut st = lock(&self.state);
        if st.armed {
            self.take_event(&mut st)?;
        }
        self.drain(&mut st)?;
        if !st.armed {
            self.arm(&mut st)?;
            self.drain(&mut st)?;
        }
        ready.append(&mut st.routed);
        Ok(())
    }

    fn drain(&self, st: &mut State) -> Result<()> {
        loop {
            st.wcs.clear();
            let n = policy::POLL_BATCH;
            // SAFETY: `wcs` has capacity for POLL_BATCH entries and ibv_poll_cq writes at most
            // `n` = POLL_BATCH; the CQ is live (we hold it); the state lock makes us its only
            // poller.
            let rc = unsafe { sys::ibv_poll_cq(self.cq.cq().as_ptr(), n as i32, st.wcs.as_mut_ptr()) };
            if rc < 0 {
                return Err(verbs_err("ibv_poll_cq", &self.device, std::io::Error::from_raw_os_error(-rc)));
            }
            // SAFETY: the provider initialised the first `rc` (<= n) entries.
            unsafe { st.wcs.set_len(rc as usize) };
            let State { routes, routed, wcs, .. } = st;
            for wc in wcs.iter() {
                let Some(Route { tag, inbox, .. }) = routes.get(&wc.qp_num) else { continue };
                inbox.lock().unwrap_or_else(PoisonError::into_inner).push_back(Completion {
                    wr_id: wc.wr_id,
                    status: WcStatus(wc.status),
                    opcode: WcOpcode::from_raw(wc.opcode),
                    byte_len: wc.byte_len,
                    vendor_err: wc.vendor_err,
                });
                if routed.last() != Some(tag) {
                    routed.push(*tag);
                }
            }
            if (rc as usize) < n {
                return Ok(());
            }
        }
    }

    /// Arms the CQ: for solicited completions only when every route is quiet, else for any.
    fn arm(&self, st: &mut State) -> Result<()> {
        let solicited = st.loud == 0;
        // SAFETY: the CQ is live and was created with a completion channel.
        let rc = unsafe { sys::ibv_req_notify_cq(self.cq.cq().as_ptr(), i32::from(solicited)) };
        if rc != 0 {
            return Err(verbs_err("ibv_req_notify_cq", &self.device, std::io::Error::from_raw_os_error(rc)));
        }
        st.armed = true;
        st.armed_solicited = solicited;
        Ok(())
    }

    fn take_event(&self, st: &mut State) -> Result<()> {
        if !get_cq_event(&self.comp, &self.device)? {
            return Ok(());
        }
        st.armed = false;
        st.unacked += 1;
        if st.unacked >= 64 {
            // SAFETY: acknowledging exactly the events taken from this CQ's channel.
            unsafe { sys::ibv_ack_cq_events(self.cq.cq().as_ptr(), st.unacked) };
            st.unacked = 0;
        }
        Ok(())
    }
}

impl Drop for SharedCq {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        // An event raised and not taken yet is taken, and acknowledged with the rest.
        if st.armed && matches!(get_cq_event(&self.comp, &self.device), Ok(true)) {
            st.armed = false;
            st.unacked += 1;
        }
        if st.unacked > 0 {
            // SAFETY: acknowledging exactly the events taken and not acknowledged yet, before
            // the CQ is destroyed (ibv_destroy_cq waits for them).
            unsafe { sys::ibv_ack_cq_events(self.cq.cq().as_ptr(), st.unacked) };
        }
    }
}
