//! The RC queue pair itself, created and posted to through libibverbs' extended API directly:
//! sideway's builder cannot attach a QP to a shared receive queue ([`super::srq`]), and its QP
//! cannot be made from one created here, so every QP is this one type (the posting is what
//! sideway's does: `ibv_wr_start`, one `ibv_wr_*` per request, `ibv_wr_complete`).

use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdma_mummy_sys as sys;
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionQueue as _};

use super::endpoint::{verbs_err, Pd};
use super::srq::Life;
use crate::{Error, Local, Op, QpConfig, Result, WorkRequest};

/// One RC QP on a CQ for both queues; its receives from its own queue, or from `srq`.
pub(super) struct Qp {
    qp: NonNull<sys::ibv_qp>,
    qpx: NonNull<sys::ibv_qp_ex>,
    device: Arc<str>,
    send_depth: u32,
    // Held so that they outlive the QP (dropped after it: see Drop).
    _pd: Pd,
    _cq: Arc<BasicCompletionQueue>,
    _srq: Option<Arc<Life>>,
}

// SAFETY: a QP may be posted to and destroyed from any thread; the Qp has one owner, and posting
// takes `&mut self`.
unsafe impl Send for Qp {}
// SAFETY: through `&self` only the QP number and the pointers are read (and ibv_query_qp or
// ibv_modify_qp called on them, which libibverbs makes thread-safe); posting takes `&mut self`.
unsafe impl Sync for Qp {}

impl Qp {
    /// Creates the QP in `pd` with both queues on `cq`; with `srq` (of the same PD, held until
    /// this QP is destroyed) its receives come from there and it has no receive queue of its own.
    pub(super) fn create(
        pd: &Pd,
        cq: &Arc<BasicCompletionQueue>,
        cfg: &QpConfig,
        srq: Option<Arc<Life>>,
    ) -> Result<Qp> {
        use sys::ibv_qp_create_send_ops_flags as F;
        let mut ops = F::IBV_QP_EX_WITH_SEND.0 | F::IBV_QP_EX_WITH_RDMA_WRITE.0 | F::IBV_QP_EX_WITH_RDMA_READ.0;
        if pd.type2_windows() {
            ops |= F::IBV_QP_EX_WITH_BIND_MW.0 | F::IBV_QP_EX_WITH_LOCAL_INV.0;
        }
        // SAFETY: an all-zero init attribute is valid (null pointers, no flags); the fields
        // that matter are set below.
        let mut attr: sys::ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        // SAFETY: only the pointer is taken; the CQ lives while the Qp holds its Arc.
        let cq_ptr = unsafe { cq.cq() }.as_ptr();
        attr.send_cq = cq_ptr;
        attr.recv_cq = cq_ptr;
        attr.srq = srq.as_ref().map_or(ptr::null_mut(), |s| s.raw().as_ptr());
        attr.cap = sys::ibv_qp_cap {
            max_send_wr: cfg.send_depth,
            max_recv_wr: if srq.is_some() { 0 } else { cfg.recv_depth },
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: cfg.max_inline,
        };
        attr.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
        attr.pd = pd.raw();
        attr.comp_mask = (sys::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD
            | sys::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
            .0;
        attr.send_ops_flags = u64::from(ops);
        // SAFETY: the PD's context is open (the Pd holds it), `attr` names a live PD and CQ (and
        // SRQ, the caller's promise) and outlives the call; a null return is handled below.
        let qp = unsafe { sys::ibv_create_qp_ex(pd.context().context().as_ptr(), &mut attr) };
        let qp = NonNull::new(qp)
            .ok_or_else(|| verbs_err("ibv_create_qp_ex", pd.device(), std::io::Error::last_os_error()))?;
        // SAFETY: the QP was created extended (send_ops_flags in the mask), so it has a qp_ex.
        let qpx = unsafe { sys::ibv_qp_to_qp_ex(qp.as_ptr()) };
        let Some(qpx) = NonNull::new(qpx) else {
            // SAFETY: just created, unused, destroyed once here.
            unsafe { sys::ibv_destroy_qp(qp.as_ptr()) };
            return Err(verbs_err("ibv_qp_to_qp_ex", pd.device(), std::io::Error::other("not an extended QP")));
        };
        Ok(Qp {
            qp,
            qpx,
            device: pd.device().into(),
            send_depth: cfg.send_depth,
            _pd: pd.clone(),
            _cq: Arc::clone(cq),
            _srq: srq,
        })
    }

    pub(super) fn raw(&self) -> *mut sys::ibv_qp {
        self.qp.as_ptr()
    }

    pub(super) fn qpx(&self) -> *mut sys::ibv_qp_ex {
        self.qpx.as_ptr()
    }

    pub(super) fn number(&self) -> u32 {
        // SAFETY: the QP is live; `qp_num` is set at creation and never changes.
        unsafe { self.qp.as_ref().qp_num }
    }

    /// Posts `wrs` with one doorbell (`ibv_wr_complete`); none if any is malformed.
    pub(super) fn post(&mut self, wrs: &[WorkRequest<'_>]) -> Result<()> {
        let qpx = self.qpx.as_ptr();
        // SAFETY: the QP is live and extended; `&mut self` makes this the only poster; every
        // path below ends what ibv_wr_start began, with ibv_wr_complete or ibv_wr_abort.
        unsafe { sys::ibv_wr_start(qpx) };
        for wr in wrs {
            if let Err(e) = Self::add(qpx, wr) {
                // SAFETY: between ibv_wr_start and here nothing was completed: all is dropped.
                unsafe { sys::ibv_wr_abort(qpx) };
                return Err(e);
            }
        }
        // SAFETY: ends the batch begun above.
        match unsafe { sys::ibv_wr_complete(qpx) } {
            0 => Ok(()),
            // The provider's way of saying the send queue is full: a state to wait in.
            libc::ENOMEM => Err(Error::QueueFull { queue: "send", depth: self.send_depth }),
            rc => Err(verbs_err("ibv_wr_complete", &self.device, std::io::Error::from_raw_os_error(rc))),
        }
    }

    /// Adds one work request to the batch begun on `qpx`.
    fn add(qpx: *mut sys::ibv_qp_ex, wr: &WorkRequest<'_>) -> Result<()> {
        let mut flags = if wr.signaled { sys::ibv_send_flags::IBV_SEND_SIGNALED.0 } else { 0 };
        if matches!(wr.local, Local::Inline(_)) {
            // rxe flushes an inline SEND on the extended QP unless the flag is set (trap 2).
            flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        if matches!(wr.op, Op::SendSolicited) {
            flags |= sys::ibv_send_flags::IBV_SEND_SOLICITED.0;
        }
        // The local buffer is checked before anything is added for this request.
        let sge = match wr.local {
            Local::Inline(_) => None,
            Local::Region { mr, offset, len } => Some((mr.sge(offset, len)?, len)),
        };
        // SAFETY: `qpx` is between ibv_wr_start and its end (the caller's); the inline data is
        // copied by ibv_wr_set_inline_data before it returns; the SGE was checked against its
        // registration, whose memory stays mapped while the registration lives (crate::Mr).
        unsafe {
            (*qpx).wr_id = wr.wr_id;
            (*qpx).wr_flags = flags;
            match wr.op {
                Op::Send | Op::SendSolicited => sys::ibv_wr_send(qpx),
                Op::Write { remote_addr, rkey } => sys::ibv_wr_rdma_write(qpx, rkey, remote_addr),
                Op::Read { remote_addr, rkey } => sys::ibv_wr_rdma_read(qpx, rkey, remote_addr),
            }
            match (wr.local, sge) {
                (Local::Inline(data), _) => {
                    sys::ibv_wr_set_inline_data(qpx, data.as_ptr().cast_mut().cast(), data.len())
                }
                (_, Some(((lkey, addr), len))) => sys::ibv_wr_set_sge(qpx, lkey, addr, len),
                (_, None) => {}
            }
        }
        Ok(())
    }

    /// Posts one receive of `len` bytes at `addr` (under `lkey`) to the QP's own receive queue.
    pub(super) fn post_recv(&mut self, wr_id: u64, lkey: u32, addr: u64, len: u32) -> Result<()> {
        let mut sge = sys::ibv_sge { addr, length: len, lkey };
        let mut wr = sys::ibv_recv_wr { wr_id, next: ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is live; `wr` and `sge` outlive the call, which copies them; the buffer
        // was checked against its registration by the caller.
        let rc = unsafe { sys::ibv_post_recv(self.qp.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(verbs_err("ibv_post_recv", &self.device, std::io::Error::from_raw_os_error(rc)));
        }
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: we own the QP and destroy it once; its PD and CQ (fields) outlive it. A
        // failure leaves it allocated: nothing better can be done here.
        unsafe { sys::ibv_destroy_qp(self.qp.as_ptr()) };
    }
}
