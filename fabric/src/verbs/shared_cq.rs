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

use rblk_proto::RECV_COUNT;

use rdma_mummy_sys as sys;
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionChannel, CompletionQueue as _};

use super::endpoint::{get_cq_event, other_err, verbs_err, Pd};
use super::srq::{Life, Srq};
use crate::completion::{Completion, WcOpcode, WcStatus};
use crate::{policy, Result, Waker};

/// Completions routed to one endpoint, not taken yet.
pub(crate) type Inbox = Arc<Mutex<VecDeque<Completion>>>;

/// What becomes of a receive from the SRQ when it is routed.
#[derive(Debug, PartialEq, Eq)]
enum Admit {
    /// Its buffer holds the message until the QP's channel reads it.
    Hold,
    /// Beyond the QP's credit: the message is copied out, the buffer posted again.
    Spill,
    /// Beyond [`MAX_SPILLED`] too: dropped, and the QP's connection told it broke the protocol.
    Overrun,
    /// A failed receive: no message; the buffer goes back, the failure to the QP.
    Release,
    /// Its QP is gone: nobody will read it; the buffer goes back.
    Drop,
}

/// The fate of a receive for a QP holding `held` SRQ buffers and `spilled` messages copied out
/// (None: a QP no longer routed), `ok` if it received a message.
fn admit(route: Option<(usize, usize)>, ok: bool) -> Admit {
    match route {
        None => Admit::Drop,
        Some(_) if !ok => Admit::Release,
        Some((held, _)) if held < RECV_COUNT => Admit::Hold,
        Some((_, spilled)) if spilled < MAX_SPILLED => Admit::Spill,
        Some(_) => Admit::Overrun,
    }
}

/// See the module docs.
pub(crate) struct SharedCq {
    // Declaration order is drop order: the CQ before its channel.
    cq: Arc<BasicCompletionQueue>,
    comp: Arc<CompletionChannel>,
    device: Arc<str>,
    /// QPs it has room for (each may have `per_qp` completions outstanding).
    room: usize,
    state: Mutex<State>,
    /// Wakes the event loop that waits for [`SharedCq::fd`] (its SRQ's low-water event).
    waker: Mutex<Option<Waker>>,
}

/// Where one QP's completions go.
struct Route {
    /// The endpoint's tag, named by [`SharedCq::collect`].
    tag: u64,
    inbox: Inbox,
    /// Its peer solicits the completions that need an answer ([`SharedCq::quiet`]).
    quiet: bool,
    /// It takes its receives from the CQ's SRQ.
    shares_receives: bool,
    /// SRQ buffers holding its messages, routed and not read yet: at most its credit,
    /// [`RECV_COUNT`](rblk_proto::RECV_COUNT).
    held: usize,
    /// Its messages beyond that, copied out of the SRQ (whose buffers went back at once), in
    /// order: at most [`MAX_SPILLED`].
    spilled: VecDeque<Vec<u8>>,
}

/// Messages one QP may have copied out of the SRQ beyond its credit, unread: the most requests
/// an initiator has in flight on one QP (a FLUSH per FUA write at `--depth` 1024). With a
/// receive queue of its own a QP's peer waited (RNR) for a buffer once 16 were unread; on a
/// shared one it would take every buffer from the other QPs, so it may hold 16 and the rest is
/// copied into memory that is not pinned. Past this the peer broke the protocol: the receive
/// completes as [`WcStatus::CREDIT_OVERRUN`] and its connection ends.
pub(crate) const MAX_SPILLED: usize = 1024;

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
    /// The receive buffers of the QPs of one PD on it (see [`super::srq`]), once asked for
    /// ([`SharedCq::share_receives`]).
    srq: Option<Srq>,
    /// Making the SRQ failed: not tried again (the QPs keep receive buffers of their own).
    srq_failed: bool,
    /// SRQs it has had (each is given up when its last QP goes, and made again at the next).
    srq_generation: u64,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SharedCq {
    /// A CQ on `pd`'s device with room for `room` QPs of `per_qp` completions each, on
    /// completion vector `vector` modulo the device's count, armed.
    ///
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
                srq: None,
                srq_failed: false,
                srq_generation: 0,
            }),
            waker: Mutex::new(None),
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
    /// `shares_receives`: it took its receives from [`SharedCq::attach_receives`].
    pub(crate) fn route(&self, qp_num: u32, tag: u64, inbox: Inbox, shares_receives: bool) -> Result<()> {
        let mut st = lock(&self.state);
        self.drain(&mut st)?;
        let route = Route { tag, inbox, quiet: false, shares_receives, held: 0, spilled: VecDeque::new() };
        if let Some(old) = st.routes.insert(qp_num, route) {
            st.loud -= usize::from(!old.quiet);
        }
        st.loud += 1;
        if st.armed && st.armed_solicited {
            self.arm(&mut st)?;
        }
        Ok(())
    }

    /// Stops routing QP `qp_num` (before it is destroyed): what it still gets is dropped.
    /// The SRQ buffers of the messages it was routed and did not read are posted again.
    pub(crate) fn unroute(&self, qp_num: u32) {
        let mut st = lock(&self.state);
        let Some(old) = st.routes.remove(&qp_num) else { return };
        st.loud -= usize::from(!old.quiet);
        if let (true, Some(srq)) = (old.shares_receives, &mut st.srq) {
            srq.remove_qp();
            let held = std::mem::take(&mut *old.inbox.lock().unwrap_or_else(PoisonError::into_inner));
            for c in held {
                if let Some(slot) = srq.slot_of(c.wr_id) {
                    // A failure here is the device's: the buffer is lost to the queue, no more.
                    let _ = srq.repost(slot);
                }
            }
            self.give_up_unused_srq(&mut st);
        }
    }

    /// An SRQ no QP uses any more is given up, buffers and all (a posted buffer cannot be
    /// taken back otherwise); it is destroyed once the last QP attached to it is (each holds
    /// its [`Life`](super::srq::Life)). The next QP of its PD makes another.
    fn give_up_unused_srq(&self, st: &mut State) {
        if st.srq.as_ref().is_some_and(|s| s.qps() == 0) {
            if let Some(srq) = st.srq.take() {
                super::device::unwatch_srq(srq.raw());
            }
        }
    }

    /// QPs of `pd` placed on it from now on take their receives from a shared receive queue in
    /// `pd`, made now if it has none: for a PD that many connections share (the target's
    /// memory-window domain). False if it has one of another PD, or one cannot be made (then
    /// they keep receive buffers of their own; the error is returned once, at the failure).
    pub(crate) fn share_receives(self: &Arc<Self>, pd: &Pd) -> Result<bool> {
        let mut st = lock(&self.state);
        if let Some(srq) = &st.srq {
            return Ok(srq.serves(pd));
        }
        if st.srq_failed {
            return Ok(false);
        }
        // What an earlier SRQ's QPs left in the CQ goes first (their buffers are gone with it).
        self.drain(&mut st)?;
        st.srq_generation += 1;
        // Each QP's credit at most: the CQ has room for that many receive completions of each.
        let srq = Srq::new(pd, self.room.saturating_mul(RECV_COUNT), st.srq_generation)
            .inspect_err(|_| st.srq_failed = true)?;
        super::device::watch_srq(srq.raw(), self);
        st.srq = Some(srq);
        Ok(true)
    }

    /// The SRQ a QP of `pd` about to be created on this CQ takes its receives from, if it has
    /// one of that PD (it counts the QP, and posts more buffers if needed). Until the route
    /// ([`SharedCq::route`] with `shares_receives`) the caller gives the count back with
    /// [`SharedCq::detach_receives`] if the QP is not made.
    pub(crate) fn attach_receives(&self, pd: &Pd) -> Result<Option<Arc<Life>>> {
        let mut st = lock(&self.state);
        let Some(srq) = st.srq.as_mut().filter(|s| s.serves(pd)) else { return Ok(None) };
        srq.add_qp()?;
        Ok(Some(srq.life()))
    }

    /// Gives back what [`SharedCq::attach_receives`] counted, for a QP that was not made.
    pub(crate) fn detach_receives(&self) {
        let mut st = lock(&self.state);
        if let Some(srq) = &mut st.srq {
            srq.remove_qp();
        }
        self.give_up_unused_srq(&mut st);
    }

    /// For QP `qp_num`'s channel: copies the message of SRQ receive `wr_id` into `dst` (its
    /// first `dst.len()` bytes) and posts the buffer again.
    pub(crate) fn take_receive(&self, qp_num: u32, wr_id: u64, dst: &mut [u8]) -> Result<()> {
        let mut st = lock(&self.state);
        let State { srq, routes, .. } = &mut *st;
        let srq = srq.as_mut().ok_or(crate::Error::OtherFabric { what: "a shared receive without a queue" })?;
        let route = routes.get_mut(&qp_num);
        if Srq::is_spilled(wr_id) {
            let msg = route.and_then(|r| r.spilled.pop_front());
            let msg = msg.ok_or(crate::Error::OtherFabric { what: "a spilled receive's message" })?;
            let n = dst.len().min(msg.len());
            dst[..n].copy_from_slice(&msg[..n]);
            return Ok(());
        }
        let slot = srq.slot_of(wr_id).ok_or(crate::Error::OtherFabric { what: "a shared receive's buffer" })?;
        if let Some(route) = route {
            route.held = route.held.saturating_sub(1);
        }
        let read = srq.read(slot, dst);
        srq.repost(slot)?;
        read
    }

    /// The event loop's waker, woken when the SRQ runs low.
    pub(crate) fn set_waker(&self, waker: Waker) {
        *self.waker.lock().unwrap_or_else(PoisonError::into_inner) = Some(waker);
    }

    /// The device raised the SRQ's low-water event: the event loop is woken to route what
    /// holds its buffers (its connections read them and post them again), and the limit is
    /// armed again at its next collect or poll.
    pub(crate) fn receives_low(&self) {
        if let Some(srq) = &mut lock(&self.state).srq {
            srq.limit_reached();
        }
        if let Some(w) = &*self.waker.lock().unwrap_or_else(PoisonError::into_inner) {
            w.wake();
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
        Self::arm_limit(&mut st)
    }

    /// Arms the SRQ's low-water event if it fired (one system call then, none otherwise).
    fn arm_limit(st: &mut State) -> Result<()> {
        st.srq.as_mut().map_or(Ok(()), Srq::arm_limit)
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
        Self::arm_limit(&mut st)
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
            let State { routes, routed, wcs, srq, .. } = st;
            for wc in wcs.iter() {
                let mut status = WcStatus(wc.status);
                let mut wr_id = wc.wr_id;
                // A receive from the SRQ: its buffer holds the message until the QP's channel
                // reads it (Self::take_receive), within the QP's credit; beyond it the message
                // is copied out and the buffer posted again at once.
                let slot = srq.as_mut().and_then(|q| q.slot_of(wc.wr_id).map(|slot| (q, slot)));
                if let Some((q, slot)) = slot {
                    q.consumed(slot);
                    let route = routes.get_mut(&wc.qp_num);
                    let fate = admit(route.as_deref().map(|r| (r.held, r.spilled.len())), status.is_success());
                    match (fate, route) {
                        (Admit::Hold, Some(route)) => route.held += 1,
                        (Admit::Spill, Some(route)) => {
                            let len = (wc.byte_len as usize).min(rblk_proto::MSG_SIZE);
                            let mut msg = vec![0u8; len];
                            let read = q.read(slot, &mut msg);
                            q.repost(slot)?;
                            read?;
                            route.spilled.push_back(msg);
                            wr_id = Srq::spilled_wr_id();
                        }
                        (Admit::Overrun, _) => {
                            q.repost(slot)?;
                            status = WcStatus::CREDIT_OVERRUN;
                        }
                        (Admit::Release, _) => q.repost(slot)?,
                        (Admit::Drop, _) | (_, None) => {
                            q.repost(slot)?;
                            continue;
                        }
                    }
                }
                let Some(Route { tag, inbox, .. }) = routes.get(&wc.qp_num) else { continue };
                inbox.lock().unwrap_or_else(PoisonError::into_inner).push_back(Completion {
                    wr_id,
                    status,
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
        if let Some(srq) = &st.srq {
            super::device::unwatch_srq(srq.raw());
        }
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

#[cfg(test)]
mod tests {
    use super::{admit, Admit, MAX_SPILLED};
    use rblk_proto::RECV_COUNT;

    /// Catches a QP that may hold more than its credit of shared buffers (starving the other
    /// QPs' receives), one cut at its credit (an initiator pipelining FLUSHes at depth would
    /// lose its connection where a receive queue of its own made it wait), one never cut however
    /// much it sends, and a failed or orphaned receive whose buffer is not given back.
    #[test]
    fn a_qp_holds_its_credit_spills_what_an_initiator_may_send_and_no_more() {
        assert_eq!(admit(Some((0, 0)), true), Admit::Hold);
        assert_eq!(admit(Some((RECV_COUNT - 1, 0)), true), Admit::Hold);
        assert_eq!(admit(Some((RECV_COUNT, 0)), true), Admit::Spill);
        assert_eq!(admit(Some((RECV_COUNT, MAX_SPILLED - 1)), true), Admit::Spill);
        assert_eq!(admit(Some((RECV_COUNT, MAX_SPILLED)), true), Admit::Overrun);
        assert_eq!(admit(Some((0, 0)), false), Admit::Release);
        assert_eq!(admit(Some((RECV_COUNT, MAX_SPILLED)), false), Admit::Release);
        assert_eq!(admit(None, true), Admit::Drop);
    }
}
