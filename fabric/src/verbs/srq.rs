//! A shared receive queue: the control channel's receive buffers for every QP of one protection
//! domain on one shared CQ ([`super::shared_cq`]), as SPDK's poll groups keep an SRQ per device,
//! instead of [`RECV_COUNT`] buffers of [`MSG_SIZE`] posted per QP (64 KiB pinned by each idle
//! QP). Buffers are registered in chunks of [`CHUNK`] as QPs join, one per two QPs (at least
//! [`MIN_BUFFERS`]). As QPs leave, the buffers beyond what the rest need are retired: not posted
//! again once a message has used them, and a chunk whose every buffer is retired is
//! deregistered (a posted buffer cannot be taken back from an SRQ, so the queue shrinks as
//! messages come).
//!
//! A buffer is posted at most once at a time ([`Slot`]), whoever gives it back: the QP's
//! channel once it has read the message, the shared CQ for a completion of a QP that is gone,
//! or for one beyond its QP's credit.
//!
//! [`RECV_COUNT`]: rblk_proto::RECV_COUNT

use std::ptr::{self, NonNull};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rblk_proto::{MSG_SIZE, RECV_COUNT};
use rdma_mummy_sys as sys;

use super::endpoint::{other_err, verbs_err, Mr, Pd};
use crate::{Access, Memory, Result};

/// The slot number that names no buffer: a message copied out ([`Srq::spilled_wr_id`]), under
/// generation 0, which no queue has.
const SPILLED: u64 = u32::MAX as u64;

/// A receive's wr_id: the control channel's bits, the queue's generation (bits 32-60) and the
/// buffer's slot (bits 0-31).
const GENERATION_MASK: u64 = (1 << 29) - 1;

fn wr_id(generation: u64, slot: u64) -> u64 {
    crate::channel::CONTROL_BIT | crate::channel::SHARED_RECV_BIT | ((generation & GENERATION_MASK) << 32) | slot
}

/// The SRQ itself and its buffers' registrations, alive while the queue or any QP attached to
/// it is ([`Srq::life`]): a QP holds it so that it is destroyed after the QP (an SRQ a QP
/// uses cannot be destroyed), and the registrations go after it (its posted receives name them).
pub(crate) struct Life {
    srq: NonNull<sys::ibv_srq>,
    /// The registered buffers, [`CHUNK`] per registration (a tuple drops in order: each
    /// registration before its memory). Locked by the queue's owner only, under its own lock.
    chunks: Mutex<Vec<(Mr, Arc<Memory>)>>,
}

// SAFETY: an SRQ may be posted to and destroyed from any thread; posting happens under the
// owning shared CQ's lock, destruction once, at the last drop.
unsafe impl Send for Life {}
// SAFETY: as above; shared references only read the pointer (posting is under that lock).
unsafe impl Sync for Life {}

impl Life {
    pub(crate) fn raw(&self) -> NonNull<sys::ibv_srq> {
        self.srq
    }

    fn chunks(&self) -> MutexGuard<'_, Vec<(Mr, Arc<Memory>)>> {
        self.chunks.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Life {
    fn drop(&mut self) {
        // SAFETY: the last holder: the queue and every QP attached to it are gone (each QP
        // holds this until after it is destroyed); destroyed once, before its buffers'
        // registrations (a field, dropped after this body).
        unsafe { sys::ibv_destroy_srq(self.srq.as_ptr()) };
    }
}

/// Buffers registered at once (one registration each chunk): 32 KiB.
pub(crate) const CHUNK: usize = 8;

/// Buffers posted however few QPs it serves: two QPs' worth of credit.
pub(crate) const MIN_BUFFERS: usize = 2 * RECV_COUNT;

/// Buffers wanted for `qps` QPs: one per two, at least [`MIN_BUFFERS`], whole chunks.
pub(crate) fn wanted(qps: usize) -> usize {
    qps.div_ceil(2).max(MIN_BUFFERS).next_multiple_of(CHUNK)
}

/// Where one buffer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Posted: the device may put a message in it.
    Posted,
    /// A message was put in it (its completion was seen); not posted until given back.
    Taken,
    /// Registered, not posted: retired, or a new chunk's before its posting.
    Idle,
}

/// See the module docs.
pub(crate) struct Srq {
    life: Arc<Life>,
    /// Its number among the queues its shared CQ has had, in each receive's wr_id: a
    /// completion of an earlier queue's (of a QP still being torn down) is not taken for one of
    /// this one's buffers.
    generation: u64,
    pd: Pd,
    /// The most buffers it can hold posted (the device's limit, or what was asked).
    max_wr: usize,
    /// Per buffer, where it is.
    slots: Vec<Slot>,
    /// Buffers posted now.
    posted_count: usize,
    /// QPs that take their receives from it.
    qps: usize,
    /// The low-water limit is armed: the device raises `IBV_EVENT_SRQ_LIMIT_REACHED` once
    /// fewer than `limit()` buffers are posted, and disarms it.
    limit_armed: bool,
}

impl Srq {
    /// An SRQ in `pd` for up to `max_wr` buffers (fewer if the device allows fewer), with
    /// [`MIN_BUFFERS`] posted.
    /// `generation` (from 1) names it among its shared CQ's queues.
    pub(crate) fn new(pd: &Pd, max_wr: usize, generation: u64) -> Result<Srq> {
        let dev = pd.device();
        let attr = pd.context().query_device().map_err(|e| other_err("ibv_query_device", dev, e))?;
        let max_wr = max_wr.min(usize::try_from(attr.max_srq_wr()).unwrap_or(0));
        if max_wr < MIN_BUFFERS {
            let why = std::io::Error::other(format!("the device allows {max_wr} receives per SRQ"));
            return Err(verbs_err("ibv_create_srq", dev, why));
        }
        let mut init = sys::ibv_srq_init_attr {
            srq_context: ptr::null_mut(),
            attr: sys::ibv_srq_attr { max_wr: max_wr as u32, max_sge: 1, srq_limit: 0 },
        };
        // SAFETY: the PD is live (held by `pd`); `init` outlives the call; null is handled.
        let srq = unsafe { sys::ibv_create_srq(pd.raw(), &mut init) };
        let srq = NonNull::new(srq).ok_or_else(|| verbs_err("ibv_create_srq", dev, std::io::Error::last_os_error()))?;
        let mut me = Srq {
            life: Arc::new(Life { srq, chunks: Mutex::new(Vec::new()) }),
            generation: generation & GENERATION_MASK,
            pd: pd.clone(),
            max_wr,
            slots: Vec::new(),
            posted_count: 0,
            qps: 0,
            limit_armed: false,
        };
        me.grow(MIN_BUFFERS)?;
        Ok(me)
    }

    pub(crate) fn raw(&self) -> NonNull<sys::ibv_srq> {
        self.life.srq
    }

    /// What a QP attached to it holds until it is destroyed.
    pub(crate) fn life(&self) -> Arc<Life> {
        Arc::clone(&self.life)
    }

    /// QPs that take their receives from it.
    pub(crate) fn qps(&self) -> usize {
        self.qps
    }

    /// Whether it belongs to `pd` (a QP takes receives only from an SRQ of its own PD).
    pub(crate) fn serves(&self, pd: &Pd) -> bool {
        self.pd.same_as(pd)
    }

    /// One more QP takes its receives from here: more buffers if it needs them (whole chunks,
    /// within the device's limit).
    pub(crate) fn add_qp(&mut self) -> Result<()> {
        self.qps += 1;
        self.grow(wanted(self.qps))
    }

    /// A QP that took its receives from here is gone: buffers beyond what the others need are
    /// retired as messages use them.
    pub(crate) fn remove_qp(&mut self) {
        self.qps = self.qps.saturating_sub(1);
        self.trim();
    }

    /// Buffers it keeps for the QPs it serves now, within the device's limit.
    fn target(&self) -> usize {
        self.within_device(wanted(self.qps))
    }

    /// `want` buffers, or as many whole chunks as the device lets the queue hold.
    fn within_device(&self, want: usize) -> usize {
        want.min(self.max_wr / CHUNK * CHUNK)
    }

    /// Posts the retired buffers below `want` again, then registers chunks up to it.
    fn grow(&mut self, want: usize) -> Result<()> {
        let want = self.within_device(want);
        for slot in 0..want.min(self.slots.len()) {
            if self.slots[slot] == Slot::Idle {
                self.post(slot)?;
            }
        }
        while self.slots.len() < want {
            let memory = Memory::anonymous(CHUNK * MSG_SIZE)?;
            let mr = self.pd.register(&memory, Access::LOCAL)?;
            let first = self.slots.len();
            self.life.chunks().push((mr, memory));
            self.slots.resize(first + CHUNK, Slot::Idle);
            (first..first + CHUNK).try_for_each(|slot| self.post(slot))?;
        }
        Ok(())
    }

    /// Deregisters the last chunks while every buffer of theirs is retired and the QPs served
    /// need fewer.
    fn trim(&mut self) {
        let target = self.target();
        while self.slots.len() > target && self.slots.len() >= CHUNK {
            let last = self.slots.len() - CHUNK;
            if self.slots[last..].iter().any(|&s| s != Slot::Idle) {
                return;
            }
            self.slots.truncate(last);
            self.life.chunks().pop();
        }
    }

    /// The slot a receive's `wr_id` names, if it is one of this queue's.
    pub(crate) fn slot_of(&self, wr_id: u64) -> Option<usize> {
        if wr_id & crate::channel::SHARED_RECV_BIT == 0 {
            return None;
        }
        if (wr_id >> 32) & GENERATION_MASK != self.generation {
            return None;
        }
        let slot = (wr_id & u64::from(u32::MAX)) as usize;
        (slot < self.slots.len()).then_some(slot)
    }

    /// The wr_id of a receive whose message was copied out of the queue (see
    /// [`super::shared_cq::MAX_SPILLED`]): no buffer's.
    pub(crate) fn spilled_wr_id() -> u64 {
        wr_id(0, SPILLED)
    }

    /// Whether receive `wr_id` is one whose message was copied out ([`Srq::spilled_wr_id`]).
    pub(crate) fn is_spilled(wr_id: u64) -> bool {
        wr_id == Self::spilled_wr_id()
    }

    /// A completion took buffer `slot` (it holds a message, or nothing if the receive failed).
    pub(crate) fn consumed(&mut self, slot: usize) {
        if let Some(p) = self.slots.get_mut(slot) {
            if std::mem::replace(p, Slot::Taken) == Slot::Posted {
                self.posted_count -= 1;
                if self.posted_count < self.limit() {
                    // The device raised the event (or will at the next consumption) and
                    // disarmed the limit.
                    self.limit_armed = false;
                }
            }
        }
    }

    /// Copies the first `dst.len()` bytes of buffer `slot`'s message out.
    pub(crate) fn read(&self, slot: usize, dst: &mut [u8]) -> Result<()> {
        let chunks = self.life.chunks();
        let (_, memory) = &chunks[slot / CHUNK];
        memory.read_at((slot % CHUNK) * MSG_SIZE, dst)
    }

    /// Gives buffer `slot` back once its message is read (or it holds none): posted again, or
    /// retired if the QPs served need fewer buffers (its chunk deregistered once all of it is).
    /// Nothing if it is not taken.
    pub(crate) fn repost(&mut self, slot: usize) -> Result<()> {
        if self.slots.get(slot) != Some(&Slot::Taken) {
            return Ok(());
        }
        if slot >= self.target() {
            self.slots[slot] = Slot::Idle;
            self.trim();
            return Ok(());
        }
        self.post(slot)
    }

    fn post(&mut self, slot: usize) -> Result<()> {
        let (lkey, addr) = {
            let chunks = self.life.chunks();
            let (mr, memory) = &chunks[slot / CHUNK];
            (mr.lkey(), memory.addr() + ((slot % CHUNK) * MSG_SIZE) as u64)
        };
        let mut sge = sys::ibv_sge { addr, length: MSG_SIZE as u32, lkey };
        let wr_id = wr_id(self.generation, slot as u64);
        let mut wr = sys::ibv_recv_wr { wr_id, next: ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
        let mut bad = ptr::null_mut();
        // SAFETY: the SRQ is live (we hold its Life); `wr` and `sge` outlive the call, which
        // copies them; the buffer is inside a registration the Life holds until after the SRQ is
        // destroyed (Life's Drop).
        let rc = unsafe { sys::ibv_post_srq_recv(self.life.srq.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(verbs_err("ibv_post_srq_recv", self.pd.device(), std::io::Error::from_raw_os_error(rc)));
        }
        self.slots[slot] = Slot::Posted;
        self.posted_count += 1;
        Ok(())
    }

    /// The low-water mark: a quarter of the buffers it keeps.
    fn limit(&self) -> usize {
        (self.target() / 4).max(1)
    }

    /// Arms the low-water limit if it is not armed (the device disarms it when it fires).
    pub(crate) fn arm_limit(&mut self) -> Result<()> {
        if self.limit_armed {
            return Ok(());
        }
        let mut attr = sys::ibv_srq_attr { max_wr: 0, max_sge: 0, srq_limit: self.limit() as u32 };
        // SAFETY: the SRQ is live; `attr` outlives the call; only the limit is modified.
        let rc = unsafe {
            sys::ibv_modify_srq(self.life.srq.as_ptr(), &mut attr, sys::ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 as i32)
        };
        if rc != 0 {
            return Err(verbs_err("ibv_modify_srq(limit)", self.pd.device(), std::io::Error::from_raw_os_error(rc)));
        }
        self.limit_armed = true;
        Ok(())
    }

    /// The device said the limit was reached (and disarmed it).
    pub(crate) fn limit_reached(&mut self) {
        self.limit_armed = false;
    }
}

#[cfg(test)]
mod tests {
    use super::{wanted, CHUNK, MIN_BUFFERS};

    /// Catches sizing that pins more than 4 KiB per QP at scale (one 4 KiB buffer per two
    /// QPs), or too few buffers for a session's burst when it is alone.
    #[test]
    fn buffers_grow_with_qps_at_one_per_two() {
        assert_eq!(wanted(0), MIN_BUFFERS);
        assert_eq!(wanted(1), MIN_BUFFERS);
        assert_eq!(wanted(256), 128);
        assert_eq!(wanted(257), 136);
        assert!((1..2000).all(|n| wanted(n).is_multiple_of(CHUNK) && wanted(n) >= n / 2));
        assert!((200..2000).all(|n| wanted(n) * rblk_proto::MSG_SIZE <= n * 4096));
    }
}
