//! Work completions as plain values: raw status and opcode kept, converted by total functions
//! (sideway's `From<u32>` conversions panic on values they do not know).

use std::fmt;

/// A work completion status (`enum ibv_wc_status`), kept raw.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct WcStatus(pub u32);

macro_rules! statuses {
    ($($name:ident = $v:expr),* $(,)?) => {
        impl WcStatus {
            $(#[allow(missing_docs)] pub const $name: WcStatus = WcStatus($v);)*
            /// The verbs name of the status, or `UNKNOWN`.
            pub fn name(self) -> &'static str {
                match self.0 { $($v => stringify!($name),)* _ => "UNKNOWN" }
            }
        }
    };
}

statuses! {
    SUCCESS = 0, LOC_LEN_ERR = 1, LOC_QP_OP_ERR = 2, LOC_EEC_OP_ERR = 3, LOC_PROT_ERR = 4,
    WR_FLUSH_ERR = 5, MW_BIND_ERR = 6, BAD_RESP_ERR = 7, LOC_ACCESS_ERR = 8, REM_INV_REQ_ERR = 9,
    REM_ACCESS_ERR = 10, REM_OP_ERR = 11, RETRY_EXC_ERR = 12, RNR_RETRY_EXC_ERR = 13,
    LOC_RDD_VIOL_ERR = 14, REM_INV_RD_REQ_ERR = 15, REM_ABORT_ERR = 16, INV_EECN_ERR = 17,
    INV_EEC_STATE_ERR = 18, FATAL_ERR = 19, RESP_TIMEOUT_ERR = 20, GENERAL_ERR = 21,
    // Not a verbs status: a receive from a shared receive queue beyond its QP's credit (the
    // peer sent more than RECV_COUNT messages its side had not had read); dropped unread.
    CREDIT_OVERRUN = 0x1000,
}

impl WcStatus {
    /// True for `IBV_WC_SUCCESS`.
    pub fn is_success(self) -> bool {
        self == WcStatus::SUCCESS
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

impl fmt::Debug for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// What a successful completion completed. Undefined (reported as `Unknown`) on errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    /// A SEND.
    Send,
    /// An RDMA WRITE.
    Write,
    /// An RDMA READ.
    Read,
    /// A RECV that received a SEND.
    Recv,
    /// A memory window bind.
    BindMw,
    /// A local invalidate.
    LocalInv,
    /// Anything else, with its raw value.
    Unknown(u32),
}

impl WcOpcode {
    /// Total conversion from `enum ibv_wc_opcode`.
    pub fn from_raw(v: u32) -> Self {
        match v {
            0 => WcOpcode::Send,
            1 => WcOpcode::Write,
            2 => WcOpcode::Read,
            5 => WcOpcode::BindMw,
            6 => WcOpcode::LocalInv,
            128 => WcOpcode::Recv,
            other => WcOpcode::Unknown(other),
        }
    }
}

/// One work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The id given when the work request was posted.
    pub wr_id: u64,
    /// Success or the error.
    pub status: WcStatus,
    /// The operation (only meaningful on success).
    pub opcode: WcOpcode,
    /// Bytes received (RECV) or transferred.
    pub byte_len: u32,
    /// Provider detail on errors.
    pub vendor_err: u32,
}

impl Completion {
    /// An empty completion, for preallocated arrays.
    pub const EMPTY: Completion =
        Completion { wr_id: 0, status: WcStatus::SUCCESS, opcode: WcOpcode::Unknown(0), byte_len: 0, vendor_err: 0 };

    /// `Ok(self)` on success, the typed error otherwise.
    pub fn ok(self) -> crate::Result<Self> {
        if self.status.is_success() {
            Ok(self)
        } else {
            Err(crate::Error::Completion { wr_id: self.wr_id, status: self.status, vendor_err: self.vendor_err })
        }
    }
}
