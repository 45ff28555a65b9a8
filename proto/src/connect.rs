//! The private data of an rdma_cm connect request: which session a new QP belongs to, checked
//! before the target accepts the connection (and spends a QP on it).

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::fields::wire_enum;
use crate::{EncodeError, ParseError, MAGIC, TOKEN_LEN, VERSION};

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct ConnectWire {
    magic: U32,
    version: U16,
    kind: U16,
    /// Zero for a new session.
    session_id: U64,
    /// Zero for a new session.
    token: [u8; TOKEN_LEN],
}
const _: () = assert!(size_of::<ConnectWire>() == 32);

/// Bytes of [`ConnectData`] on the wire.
pub const CONNECT_DATA_LEN: usize = size_of::<ConnectWire>();
// rdma_cm carries at most 56 bytes of private data in an RC connect request.
const _: () = assert!(CONNECT_DATA_LEN <= 56);

wire_enum! {
    /// [`ConnectData`]'s `kind` field.
    ConnectKind: u16, |value: u16| ParseError::BadEnum { field: "connect.kind", value: value.into() };
    /// The first QP of a new session; HELLO follows.
    NewSession = 1,
    /// A further QP of an existing session; JOIN follows.
    Join = 2,
    /// The first QP of a new session that wants per-QP rkeys (memory windows); HELLO follows.
    /// A target that predates it refuses the connect request (the kind does not parse), and the
    /// initiator connects again with [`ConnectKind::NewSession`].
    NewWindowSession = 3,
}

/// What a QP is for, sent as the rdma_cm connect request's private data (not a framed message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectData {
    /// The first QP of a new session.
    NewSession,
    /// The first QP of a new session, asking for per-QP rkeys through type 2B memory windows
    /// ([`FEATURE_WINDOWS`](crate::FEATURE_WINDOWS)): the target puts the QP in its shared
    /// protection domain where the device has them, and in a domain of the session's own
    /// otherwise (then CHALLENGE does not offer the feature).
    NewWindowSession,
    /// A further QP of the session OPENED named.
    Join {
        /// OPENED's session id.
        session_id: u64,
        /// OPENED's token.
        token: [u8; TOKEN_LEN],
    },
}

/// Parses connect private data. rdma_cm pads private data with zeros to its own size, so `buf`
/// may be longer than [`CONNECT_DATA_LEN`]; the excess must be zero.
pub fn parse_connect_data(buf: &[u8]) -> Result<ConnectData, ParseError> {
    let have = buf.len();
    let (wire, padding) =
        ConnectWire::ref_from_prefix(buf).map_err(|_| ParseError::Truncated { need: CONNECT_DATA_LEN, have })?;
    if wire.magic.get() != MAGIC {
        return Err(ParseError::BadMagic(wire.magic.get()));
    }
    if wire.version.get() != VERSION {
        return Err(ParseError::Version { got: wire.version.get(), supported: VERSION });
    }
    if padding.iter().any(|&byte| byte != 0) {
        return Err(ParseError::Reserved { field: "connect.padding" });
    }
    Ok(match ConnectKind::try_from(wire.kind.get())? {
        kind @ (ConnectKind::NewSession | ConnectKind::NewWindowSession) => {
            if wire.session_id.get() != 0 || wire.token != [0; TOKEN_LEN] {
                return Err(ParseError::Reserved { field: "connect.session_id/token" });
            }
            if kind == ConnectKind::NewSession {
                ConnectData::NewSession
            } else {
                ConnectData::NewWindowSession
            }
        }
        ConnectKind::Join => ConnectData::Join { session_id: wire.session_id.get(), token: wire.token },
    })
}

impl ConnectData {
    /// The kind on the wire.
    pub const fn kind(&self) -> ConnectKind {
        match self {
            Self::NewSession => ConnectKind::NewSession,
            Self::NewWindowSession => ConnectKind::NewWindowSession,
            Self::Join { .. } => ConnectKind::Join,
        }
    }

    /// The [`CONNECT_DATA_LEN`] bytes to pass as private data.
    pub fn to_bytes(&self) -> [u8; CONNECT_DATA_LEN] {
        let (session_id, token) = match *self {
            Self::NewSession | Self::NewWindowSession => (0, [0; TOKEN_LEN]),
            Self::Join { session_id, token } => (session_id, token),
        };
        let wire = ConnectWire {
            magic: U32::new(MAGIC),
            version: U16::new(VERSION),
            kind: U16::new(self.kind().into()),
            session_id: U64::new(session_id),
            token,
        };
        zerocopy::transmute!(wire)
    }

    /// Writes [`to_bytes`](Self::to_bytes) to the front of `out`; returns its length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
        let have = out.len();
        let dst =
            out.get_mut(..CONNECT_DATA_LEN).ok_or(EncodeError::BufferTooSmall { need: CONNECT_DATA_LEN, have })?;
        dst.copy_from_slice(&self.to_bytes());
        Ok(CONNECT_DATA_LEN)
    }
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RejectWire {
    magic: U32,
    version: U16,
    kind: U16,
    retry_after_ms: U32,
    reserved: U32,
}
const _: () = assert!(size_of::<RejectWire>() == 16);

/// Bytes of [`RejectData`] on the wire.
pub const REJECT_DATA_LEN: usize = size_of::<RejectWire>();
// A CM reject carries at most 148 bytes of private data.
const _: () = assert!(REJECT_DATA_LEN <= 148);

/// The `kind` of [`RejectData`] that means busy.
const REJECT_BUSY: u16 = 1;

/// The longest [`RejectData::Busy`] wait a target asks for, and an initiator honours.
pub const MAX_RETRY_AFTER_MS: u32 = 60_000;

/// Why a target rejected a connect request, sent as the reject's private data (rdma_cm carries
/// it to the initiator's REJECTED event). Not negotiated: it comes before HELLO. An initiator
/// that predates it sees the same reject as ever (its private data unread) and retries after
/// its own delay; a target that predates it sends none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectData {
    /// The target is admitting other connections and would not have admitted this one in
    /// time: connect again after `retry_after_ms` (at most [`MAX_RETRY_AFTER_MS`]), when it
    /// expects to be ready for it. In a reconnect storm the target spreads the hosts it
    /// rejects over the time it needs, instead of every host retrying after the same delay.
    Busy {
        /// Milliseconds to wait before connecting again.
        retry_after_ms: u32,
    },
}

impl RejectData {
    /// The [`REJECT_DATA_LEN`] bytes to pass as the reject's private data.
    pub fn to_bytes(&self) -> [u8; REJECT_DATA_LEN] {
        let Self::Busy { retry_after_ms } = *self;
        let wire = RejectWire {
            magic: U32::new(MAGIC),
            version: U16::new(VERSION),
            kind: U16::new(REJECT_BUSY),
            retry_after_ms: U32::new(retry_after_ms.min(MAX_RETRY_AFTER_MS)),
            reserved: U32::new(0),
        };
        zerocopy::transmute!(wire)
    }
}

/// Parses a reject's private data (rdma_cm pads it with zeros). None for anything that is not
/// a [`RejectData`] of this version: a reject without data, another target's, or garbage,
/// which an initiator treats as a plain reject. A wait beyond [`MAX_RETRY_AFTER_MS`] is
/// clamped to it: a hostile or broken target cannot park an initiator for longer.
pub fn parse_reject_data(buf: &[u8]) -> Option<RejectData> {
    let (wire, _) = RejectWire::ref_from_prefix(buf).ok()?;
    if wire.magic.get() != MAGIC || wire.version.get() != VERSION || wire.kind.get() != REJECT_BUSY {
        return None;
    }
    Some(RejectData::Busy { retry_after_ms: wire.retry_after_ms.get().min(MAX_RETRY_AFTER_MS) })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const JOIN: ConnectData = ConnectData::Join { session_id: 0xabcd_0001, token: [9; TOKEN_LEN] };

    fn wire(kind: u16, session_id: u64) -> ConnectWire {
        ConnectWire {
            magic: U32::new(MAGIC),
            version: U16::new(VERSION),
            kind: U16::new(kind),
            session_id: U64::new(session_id),
            token: [0; TOKEN_LEN],
        }
    }

    #[test]
    fn round_trip_with_and_without_padding() {
        for data in [ConnectData::NewSession, ConnectData::NewWindowSession, JOIN] {
            let bytes = data.to_bytes();
            assert_eq!(parse_connect_data(&bytes), Ok(data));
            // rdma_cm hands the target 56 bytes, zero padded.
            let mut padded = [0; 56];
            assert_eq!(data.encode(&mut padded), Ok(CONNECT_DATA_LEN));
            assert_eq!(parse_connect_data(&padded), Ok(data));
            assert_eq!(
                data.encode(&mut [0; CONNECT_DATA_LEN - 1]),
                Err(EncodeError::BufferTooSmall { need: CONNECT_DATA_LEN, have: 31 })
            );
        }
        assert_eq!(JOIN.kind(), ConnectKind::Join);
    }

    #[test]
    fn short_input_is_truncated() {
        let bytes = JOIN.to_bytes();
        for have in 0..CONNECT_DATA_LEN {
            assert_eq!(parse_connect_data(&bytes[..have]), Err(ParseError::Truncated { need: CONNECT_DATA_LEN, have }));
        }
    }

    #[test]
    fn rejections() {
        let parse = |w: ConnectWire| parse_connect_data(w.as_bytes());
        assert_eq!(parse(ConnectWire { magic: U32::new(1), ..wire(1, 0) }), Err(ParseError::BadMagic(1)));
        assert_eq!(
            parse(ConnectWire { version: U16::new(2), ..wire(1, 0) }),
            Err(ParseError::Version { got: 2, supported: VERSION })
        );
        for kind in [0, 4, u16::MAX] {
            assert_eq!(parse(wire(kind, 0)), Err(ParseError::BadEnum { field: "connect.kind", value: kind.into() }));
        }
        assert_eq!(parse(wire(1, 5)), Err(ParseError::Reserved { field: "connect.session_id/token" }));
        assert_eq!(parse(wire(3, 5)), Err(ParseError::Reserved { field: "connect.session_id/token" }));
        let mut padded = [0; 40];
        padded[..CONNECT_DATA_LEN].copy_from_slice(&JOIN.to_bytes());
        padded[39] = 1;
        assert_eq!(parse_connect_data(&padded), Err(ParseError::Reserved { field: "connect.padding" }));
    }

    #[test]
    fn reject_data_round_trips_and_anything_else_is_a_plain_reject() {
        let busy = RejectData::Busy { retry_after_ms: 1234 };
        assert_eq!(parse_reject_data(&busy.to_bytes()), Some(busy));
        // rdma_cm hands the initiator 148 bytes, zero padded.
        let mut padded = [0u8; 148];
        padded[..REJECT_DATA_LEN].copy_from_slice(&busy.to_bytes());
        assert_eq!(parse_reject_data(&padded), Some(busy));
        // No data, short data, zeros (a reject without data, padded), another magic or kind.
        assert_eq!(parse_reject_data(&[]), None);
        assert_eq!(parse_reject_data(&busy.to_bytes()[..REJECT_DATA_LEN - 1]), None);
        assert_eq!(parse_reject_data(&[0; 148]), None);
        let mut other = busy.to_bytes();
        other[0] ^= 1;
        assert_eq!(parse_reject_data(&other), None);
        let mut kind = busy.to_bytes();
        kind[6] = 2;
        assert_eq!(parse_reject_data(&kind), None);
        // A wait longer than the cap is clamped, sent or received.
        let long = RejectData::Busy { retry_after_ms: u32::MAX };
        assert_eq!(parse_reject_data(&long.to_bytes()), Some(RejectData::Busy { retry_after_ms: MAX_RETRY_AFTER_MS }));
        let mut forged = busy.to_bytes();
        forged[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(parse_reject_data(&forged), Some(RejectData::Busy { retry_after_ms: MAX_RETRY_AFTER_MS }));
    }

    proptest! {
        #[test]
        fn join_round_trips(session_id in any::<u64>(), token in any::<[u8; TOKEN_LEN]>()) {
            let data = ConnectData::Join { session_id, token };
            prop_assert_eq!(parse_connect_data(&data.to_bytes()), Ok(data));
        }

        /// Any bytes as reject data, a hostile target's included: parsing never panics, and
        /// whatever parses is a wait within the cap.
        #[test]
        fn any_reject_data_parses_to_a_bounded_wait_or_nothing(buf in proptest::collection::vec(any::<u8>(), 0..160)) {
            if let Some(RejectData::Busy { retry_after_ms }) = parse_reject_data(&buf) {
                prop_assert!(retry_after_ms <= MAX_RETRY_AFTER_MS);
            }
        }

        /// A busy reject with any wait, any reserved word and any padding after it reads as
        /// that wait, clamped to the cap.
        #[test]
        fn a_busy_reject_reads_its_wait_whatever_follows(
            ms in any::<u32>(),
            reserved in any::<u32>(),
            tail in proptest::collection::vec(any::<u8>(), 0..132),
        ) {
            let mut buf = RejectData::Busy { retry_after_ms: 0 }.to_bytes()[..8].to_vec();
            buf.extend_from_slice(&ms.to_le_bytes());
            buf.extend_from_slice(&reserved.to_le_bytes());
            buf.extend_from_slice(&tail);
            prop_assert_eq!(
                parse_reject_data(&buf),
                Some(RejectData::Busy { retry_after_ms: ms.min(MAX_RETRY_AFTER_MS) })
            );
        }

        #[test]
        fn whatever_parses_re_encodes(buf in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok(data) = parse_connect_data(&buf) {
                prop_assert_eq!(&data.to_bytes()[..], &buf[..CONNECT_DATA_LEN]);
            }
        }
    }
}
