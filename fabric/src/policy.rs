//! The one place where RC queue pair attributes are chosen. Both ends of every rblk connection
//! apply these, and tests read them back with `query`.
//!
//! sideway's `ConnectionParameter::new()` leaves read depth, retry and RNR retry at 0: the first
//! RDMA READ then hangs forever, and one lost packet or one SEND without a posted RECV kills both
//! QPs. rblk sets all of them explicitly.

/// Outstanding RDMA READs the initiator may have in flight per QP (`max_rd_atomic`), and the
/// responder resources the target grants (`max_dest_rd_atomic`). Clamped to the device's limits.
pub const READ_DEPTH: u8 = 16;
/// Local ACK timeout exponent: 4.096 us * 2^16 = 268 ms per try. At 2^14 (67 ms, so 0.5 s of
/// retries in all) a busy rxe guest under TCG failed a healthy connection with RETRY_EXC_ERR in
/// CI. Longer makes every access to a dead peer hang that much longer before it fails (a peer
/// that disconnected is noticed sooner, from rdma_cm: `Endpoint::peer_disconnected`).
pub const TIMEOUT: u8 = 16;
/// Transport retries before a QP errors out (about 7 x 268 ms = 1.9 s, to notice a vanished peer
/// with work outstanding). Not 7: rxe's completer decrements the count only when it is not 7, so 7
/// means "retry forever" there and a SEND to a vanished peer never fails (the IB spec says 7
/// retries). Loss detection never relies on this alone: see `rblk_proto::KEEPALIVE_TIMEOUT`.
pub const RETRY_COUNT: u8 = 6;
/// RNR retries; 7 means "retry forever", so a SEND that finds no RECV waits instead of failing.
pub const RNR_RETRY: u8 = 7;
/// Minimum RNR NAK timer code: 12 = 0.64 ms.
pub const MIN_RNR_TIMER: u8 = 12;
/// Largest connection private data on the TCP port space (`RDMA_PS_TCP`).
pub const MAX_PRIVATE_DATA: usize = 56;
/// Completions taken per poll call.
pub const POLL_BATCH: usize = 32;
/// Connect requests a listener lets wait for the target to take them ([`crate::Listener::bind`]):
/// `rdma_listen`'s backlog. Past it the kernel rejects new requests, which a reconnect storm of
/// many sessions would hit. The kernel caps it at `net.rdma_ucm.max_backlog` (1024 by default).
pub const LISTEN_BACKLOG: u32 = 1024;
/// How long a waiter spins on its CQ before arming it and sleeping.
pub const SPIN: std::time::Duration = std::time::Duration::from_micros(20);
