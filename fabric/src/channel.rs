//! The control channel: proto messages over SEND/RECV on an endpoint, with registered receive
//! buffers allocated once per connection, and send buffers only once a message too large to go
//! inline is sent (most connections never send one: keepalives, OPENED, FLUSHED, STATS and
//! short ERRORs go inline).
//!
//! Control work requests carry wr_ids with [`CONTROL_BIT`] set, so callers that mix data and
//! control on one QP (the initiator) tell them apart with [`is_control`] and hand control
//! completions to [`Channel::on_completion`].

use std::sync::Arc;

use rblk_proto::{Message, MSG_SIZE, RECV_COUNT, SEND_COUNT};

use crate::{Access, Completion, Endpoint, Error, Local, Memory, Mr, Op, Pd, Result, WcOpcode, WorkRequest};

/// Set in the wr_id of every control work request.
pub const CONTROL_BIT: u64 = 1 << 63;
const SEND_BIT: u64 = 1 << 62;
/// Set in the wr_id of a receive from a shared receive queue (see [`Endpoint::shares_receives`]).
pub(crate) const SHARED_RECV_BIT: u64 = 1 << 61;

/// Bytes of registered (pinned) buffers one channel holds at most: a receive and a send buffer of
/// [`MSG_SIZE`] per credit.
pub const PINNED_BYTES: usize = RECV_BYTES + SEND_BYTES;

/// Bytes of its receive buffers, registered at [`Channel::new`]: what an idle channel pins
/// (none when its endpoint takes receives from a shared queue: [`Channel::for_endpoint`]).
pub const RECV_BYTES: usize = RECV_COUNT * MSG_SIZE;

/// Bytes of its send buffers, registered at the first SEND too large for the endpoint's inline
/// data ([`Endpoint::max_inline`]).
pub const SEND_BYTES: usize = SEND_COUNT * MSG_SIZE;

/// Bytes of the buffer a message is first encoded into (a larger one goes to a [`MSG_SIZE`] one).
const SMALL_MSG: usize = 256;

/// True if a completion belongs to the control channel.
pub fn is_control(wr_id: u64) -> bool {
    wr_id & CONTROL_BIT != 0
}

/// What a control completion meant.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// A message of this many bytes was received and copied into the caller's buffer.
    Received(usize),
    /// One of our SENDs completed; its buffer is free again.
    Sent,
}

/// Receive and send buffers for one endpoint's control messages.
#[derive(Debug)]
pub struct Channel {
    /// None: its endpoint's receives come from a shared receive queue.
    recvs: Option<Mr>,
    /// Registered at the first SEND that does not go inline.
    sends: Option<Mr>,
    free_sends: Vec<usize>,
    /// SENDs but KEEPALIVE carry the solicited-event flag ([`Channel::solicit`]).
    solicit: bool,
}

impl Channel {
    /// Allocates and registers the receive buffers in `pd` (the endpoint's PD).
    pub fn new(pd: &Pd) -> Result<Channel> {
        let memory: Arc<Memory> = Memory::anonymous(RECV_BYTES)?;
        let recvs = pd.register(&memory, Access::LOCAL)?;
        Ok(Channel { recvs: Some(recvs), sends: None, free_sends: (0..SEND_COUNT).rev().collect(), solicit: false })
    }

    /// For `ep`: with receive buffers of its own ([`Channel::new`] in its PD), or none if its
    /// receives come from a shared receive queue ([`Endpoint::shares_receives`]).
    pub fn for_endpoint(ep: &Endpoint) -> Result<Channel> {
        if !ep.shares_receives() {
            return Channel::new(&ep.pd());
        }
        Ok(Channel { recvs: None, sends: None, free_sends: (0..SEND_COUNT).rev().collect(), solicit: false })
    }

    /// From now on, with `on`, every SEND but KEEPALIVE carries the solicited-event flag
    /// (`rblk_proto::FEATURE_SOLICITED`, once negotiated): a peer that arms its completion
    /// queue for solicited completions only wakes for requests, not for keepalives.
    pub fn solicit(&mut self, on: bool) {
        self.solicit = on;
    }

    /// Bytes of buffers it has registered: [`RECV_BYTES`], and [`SEND_BYTES`] once a SEND did
    /// not go inline.
    pub fn pinned_bytes(&self) -> usize {
        self.recvs.as_ref().map_or(0, |_| RECV_BYTES) + self.sends.as_ref().map_or(0, |_| SEND_BYTES)
    }

    /// Posts every receive buffer (none on a shared receive queue, whose are posted). Call
    /// once, before the connection is accepted or connected.
    pub fn post_recvs(&mut self, ep: &mut Endpoint) -> Result<()> {
        (0..RECV_COUNT).try_for_each(|slot| self.repost(ep, slot))
    }

    fn repost(&self, ep: &mut Endpoint, slot: usize) -> Result<()> {
        match &self.recvs {
            Some(recvs) => ep.post_recv(CONTROL_BIT | slot as u64, recvs, slot * MSG_SIZE, MSG_SIZE as u32),
            None => Ok(()),
        }
    }

    /// Encodes `msg` with `tag` and SENDs it. Fails with [`Error::QueueFull`] when every send
    /// buffer is in flight (reap completions first).
    pub fn send(&mut self, ep: &mut Endpoint, tag: u32, msg: &Message<'_>) -> Result<()> {
        let encode_err = |source| Error::Encode { opcode: msg.opcode(), source };
        // Most messages (keepalives, OPENED, FLUSHED, ...) fit a small buffer: no 4 KiB zeroed
        // for each (a keepalive's send did that, 7% of an idle target's samples under TCG).
        let solicited = self.solicit && !matches!(msg, Message::Keepalive);
        let mut small = [0u8; SMALL_MSG];
        match msg.encode(tag, &mut small) {
            Ok(len) => return self.post_bytes(ep, &small[..len], solicited),
            Err(rblk_proto::EncodeError::BufferTooSmall { .. }) => {}
            Err(source) => return Err(encode_err(source)),
        }
        let mut bytes = [0u8; MSG_SIZE];
        let len = msg.encode(tag, &mut bytes).map_err(encode_err)?;
        self.post_bytes(ep, &bytes[..len], solicited)
    }

    /// SENDs `bytes` (at most [`MSG_SIZE`]) as they are, for tests that must send what no
    /// encoder would (solicited when [`Channel::solicit`] is on, whatever they hold).
    pub fn send_bytes(&mut self, ep: &mut Endpoint, bytes: &[u8]) -> Result<()> {
        self.post_bytes(ep, bytes, self.solicit)
    }

    fn post_bytes(&mut self, ep: &mut Endpoint, bytes: &[u8], solicited: bool) -> Result<()> {
        let len = bytes.len();
        if len > MSG_SIZE {
            return Err(Error::MessageTooLarge { len, max: MSG_SIZE });
        }
        let inline = len <= ep.max_inline() as usize;
        if !inline && self.sends.is_none() {
            let memory: Arc<Memory> = Memory::anonymous(SEND_BYTES)?;
            self.sends = Some(ep.pd().register(&memory, Access::LOCAL)?);
        }
        let slot = self.free_sends.pop().ok_or(Error::QueueFull { queue: "control send", depth: SEND_COUNT as u32 })?;
        let wr_id = CONTROL_BIT | SEND_BIT | slot as u64;
        let local = match &self.sends {
            Some(sends) if !inline => {
                sends.memory().write_at(slot * MSG_SIZE, &bytes[..len])?;
                Local::Region { mr: sends, offset: slot * MSG_SIZE, len: len as u32 }
            }
            _ => Local::Inline(&bytes[..len]),
        };
        let op = if solicited { Op::SendSolicited } else { Op::Send };
        let posted = ep.post(&[WorkRequest { wr_id, op, local, signaled: true }]);
        if posted.is_err() {
            self.free_sends.push(slot);
        }
        posted
    }

    /// Handles a control completion: a received message is copied into `buf` (parse it there;
    /// the receive buffer is reposted at once), a completed SEND frees its buffer. Error
    /// completions are returned as errors: the connection is gone.
    pub fn on_completion(&mut self, ep: &mut Endpoint, c: &Completion, buf: &mut [u8; MSG_SIZE]) -> Result<Event> {
        let slot = (c.wr_id & !(CONTROL_BIT | SEND_BIT)) as usize;
        if c.wr_id & SEND_BIT != 0 {
            if slot < SEND_COUNT {
                self.free_sends.push(slot);
            }
            c.ok()?;
            return Ok(Event::Sent);
        }
        c.ok()?;
        let len = (c.byte_len as usize).min(MSG_SIZE);
        match &self.recvs {
            None if c.wr_id & SHARED_RECV_BIT != 0 && c.opcode == WcOpcode::Recv => {
                ep.take_receive(c.wr_id, &mut buf[..len])?;
            }
            Some(recvs) if slot < RECV_COUNT && c.opcode == WcOpcode::Recv => {
                recvs.memory().read_at(slot * MSG_SIZE, &mut buf[..len])?;
                self.repost(ep, slot)?;
            }
            _ => return Err(Error::UnexpectedCompletion { wr_id: c.wr_id, opcode: c.opcode }),
        }
        Ok(Event::Received(len))
    }

    /// SEND buffers currently free.
    pub fn free_sends(&self) -> usize {
        self.free_sends.len()
    }
}
