//! Properties: `parse` never panics, encode → parse is the identity, and whatever parses
//! re-encodes to the very bytes parsed (so the parser accepts one encoding per message).

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;

use super::tests::{encode_vec, raw, samples};
use super::*;
use crate::{parse_connect_data, peek_tag, MSG_SIZE};

fn leak<T>(v: Vec<T>) -> &'static [T] {
    v.leak()
}

fn arb_range() -> impl Strategy<Value = Range> {
    (0..u64::MAX)
        .prop_flat_map(|offset| (Just(offset), 1..=u64::MAX - offset))
        .prop_map(|(offset, len)| Range::new(offset, len))
}

/// Segments of a volume of `size` bytes in `block_size` blocks, the first at `first`.
fn arb_segments(size: u64, block_size: u32, first: (u64, u32)) -> impl Strategy<Value = Segments> {
    let blocks = size / u64::from(block_size);
    vec((1..blocks.max(2), any::<u64>(), any::<u32>()), 0..MAX_SEGMENTS).prop_map(move |more| {
        let mut list = vec![Segment { offset: 0, remote_addr: first.0, rkey: first.1 }];
        let mut starts: Vec<u64> = more.iter().map(|m| m.0).filter(|&b| b < blocks).collect();
        starts.sort_unstable();
        starts.dedup();
        for (b, m) in starts.iter().zip(&more) {
            list.push(Segment { offset: b * u64::from(block_size), remote_addr: m.1, rkey: m.2 });
        }
        Segments::new(&list, size).unwrap()
    })
}

fn arb_opened() -> impl Strategy<Value = Opened> {
    let geometry = (0u32..=20, any::<u64>(), 1u32..=1024).prop_map(|(shift, size, ios)| {
        let block_size = 1u32 << shift;
        (size / u64::from(block_size) * u64::from(block_size), block_size, block_size * ios)
    });
    let instance = proptest::option::of(any::<[u8; 16]>().prop_map(VolumeId));
    (geometry, any::<(u64, u32, u64, [u8; TOKEN_LEN])>(), 0..=VolumeFlags::all().bits(), instance)
        .prop_map(|((size, block_size, max_io), (remote_addr, rkey, session_id, token), flags, instance)| Opened {
            remote_addr,
            size,
            rkey,
            block_size,
            max_io,
            flags: VolumeFlags::from_bits(flags).unwrap(),
            session_id,
            token,
            instance,
            segments: None,
        })
        .prop_flat_map(|o| {
            let segments = if o.instance.is_some() {
                proptest::option::of(arb_segments(o.size, o.block_size, (o.remote_addr, o.rkey))).boxed()
            } else {
                Just(None).boxed()
            };
            (Just(o), segments).prop_map(|(o, segments)| Opened { segments, ..o })
        })
}

/// Valid messages of every kind. Borrowed fields are leaked: a few KB per test run.
fn arb_message() -> impl Strategy<Value = Message<'static>> {
    prop_oneof![
        any::<u64>().prop_map(|features| Message::Hello { features }),
        (any::<bool>(), any::<u64>(), any::<[u8; NONCE_LEN]>()).prop_map(|(auth, features, nonce)| {
            let flags = if auth { ChallengeFlags::AUTH_REQUIRED } else { ChallengeFlags::empty() };
            Message::Challenge { flags, features, nonce }
        }),
        (any::<[u8; MAC_LEN]>(), proptest::option::of("[!-~]{1,223}"))
            .prop_map(|(mac, host)| Message::Auth { mac, host: host.map(|h| &*h.leak()) }),
        ("[!-~]{1,223}", any::<[u8; NONCE_LEN]>(), any::<[u8; MAC_LEN]>())
            .prop_map(|(host, nonce, mac)| Message::MutualAuth { host: host.leak(), nonce, mac }),
        any::<([u8; crate::TARGET_ID_LEN], [u8; MAC_LEN])>()
            .prop_map(|(target_id, mac)| Message::AuthProof { target_id, mac }),
        // At most 16 chars of at most 4 bytes: within MAX_VOLUME_NAME.
        (select(OpenMode::ALL), "\\PC{1,16}", proptest::option::of(any::<(u64, [u8; TOKEN_LEN])>())).prop_map(
            |(mode, name, resume)| Message::Open {
                mode,
                name: name.leak(),
                resume: resume.map(|(session_id, token)| Resume { session_id, token })
            }
        ),
        arb_opened().prop_map(Message::Opened),
        any::<(u64, [u8; TOKEN_LEN])>().prop_map(|(session_id, token)| Message::Join { session_id, token }),
        Just(Message::Flush(Flush::All)),
        vec(arb_range(), 0..=MAX_FLUSH_RANGES).prop_map(|ranges| Message::Flush(Flush::Ranges(leak(ranges)))),
        any::<bool>().prop_map(|volatile| Message::Flushed {
            flags: if volatile { FlushedFlags::VOLATILE } else { FlushedFlags::empty() }
        }),
        (any::<u64>(), 1..=crate::MAX_ZERO_LEN)
            .prop_map(|(offset, len)| Message::Discard { offset: offset.min(u64::MAX - len), len }),
        (any::<u64>(), 1..=crate::MAX_ZERO_LEN, 0u32..4).prop_map(|(offset, len, flags)| Message::WriteZeroes {
            offset: offset.min(u64::MAX - len),
            len,
            flags: ZeroFlags::from_bits(flags).unwrap(),
        }),
        Just(Message::Stats),
        (any::<[u64; 6]>(), any::<Option<u64>>()).prop_map(|([a, b, c, d, e, f], windows)| Message::StatsReply(
            StatsReply {
                registrations: a,
                pinned_bytes: b,
                sessions: c,
                connections: d,
                cpu_user_us: e,
                cpu_system_us: f,
                windows,
            }
        )),
        any::<u32>().prop_map(|rkey| Message::Joined { rkey, segments: None }),
        (1u64..1 << 40, any::<u32>())
            .prop_flat_map(|(blocks, rkey)| (Just(rkey), arb_segments(blocks * 4096, 4096, (0, rkey))))
            .prop_map(|(rkey, segments)| Message::Joined { rkey, segments: Some(segments) }),
        (1u64..1 << 40)
            .prop_flat_map(|blocks| (Just(blocks * 4096), arb_segments(blocks * 4096, 4096, (7, 9))))
            .prop_map(|(size, segments)| Message::Resized { size, segments }),
        Just(Message::Close),
        Just(Message::Keepalive),
        any::<u32>().prop_map(|start| Message::List { start }),
        (any::<u32>(), vec(("[a-z0-9]{1,16}", any::<u64>(), 0u8..4, select(OpenMode::ALL)), 0..8)).prop_map(
            |(total, e)| Message::ListReply {
                total,
                entries: leak(e.iter().map(|(n, s, f, g)| ListEntry::new(n, *s, *f, *g).unwrap()).collect()),
            }
        ),
        select(&[Opcode::Auth, Opcode::Join, Opcode::Close, Opcode::Discard, Opcode::WriteZeroes][..])
            .prop_map(|answers| Message::Ok { answers }),
        (select(ErrorCode::ALL), ".{0,200}").prop_map(|(code, text)| Message::Error { code, text: text.leak() }),
    ]
}

/// The body size an opcode's fixed part needs, so random bodies often pass the length check.
fn fixed_len(opcode: Opcode) -> usize {
    match opcode {
        Opcode::Hello => size_of::<HelloBody>(),
        Opcode::Challenge => size_of::<ChallengeBody>(),
        Opcode::Auth => size_of::<AuthBody>(),
        Opcode::Open => size_of::<OpenBody>(),
        Opcode::Opened => size_of::<OpenedBody>(),
        Opcode::Join => size_of::<JoinBody>(),
        Opcode::Flush => size_of::<FlushHead>(),
        Opcode::Flushed => size_of::<FlushedBody>(),
        Opcode::Discard | Opcode::WriteZeroes => size_of::<ZeroBody>(),
        Opcode::StatsReply => size_of::<StatsReplyBody>(),
        Opcode::Ok => size_of::<OkBody>(),
        Opcode::Resized => size_of::<ResizedBody>() + size_of::<SegmentsHead>() + size_of::<SegmentEntry>(),
        Opcode::Error => size_of::<ErrorHead>(),
        Opcode::List => size_of::<ListBody>(),
        Opcode::ListReply => size_of::<ListHead>(),
        Opcode::Stats | Opcode::Close | Opcode::Keepalive => 0,
    }
}

/// Bytes that favour the values validation cares about: zero and small numbers.
fn arb_byte() -> impl Strategy<Value = u8> {
    prop_oneof![2 => any::<u8>(), 2 => Just(0u8), 1 => 1u8..=4]
}

/// Whatever parses must re-encode to exactly `buf`; anything else must be a clean error.
fn check_canonical(buf: &[u8]) -> Result<(), TestCaseError> {
    if let Ok((tag, msg)) = parse(buf) {
        prop_assert_eq!(encode_vec(&msg, tag), buf, "{:?}", msg);
    }
    Ok(())
}

proptest! {
    #[test]
    fn round_trip(msg in arb_message(), tag in any::<u32>()) {
        let buf = encode_vec(&msg, tag);
        prop_assert!(buf.len() <= MSG_SIZE);
        prop_assert_eq!(parse(&buf), Ok((tag, msg)));
    }

    #[test]
    fn encode_into_any_buffer(msg in arb_message(), have in 0..=MSG_SIZE) {
        let need = encode_vec(&msg, 0).len();
        let result = msg.encode(0, &mut vec![0; have]);
        if need <= have {
            prop_assert_eq!(result, Ok(need));
        } else {
            prop_assert_eq!(result, Err(EncodeError::BufferTooSmall { need, have }));
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(buf in vec(any::<u8>(), 0..600)) {
        check_canonical(&buf)?;
        let _ = peek_tag(&buf);
        let _ = parse_connect_data(&buf);
    }

    #[test]
    fn arbitrary_body_behind_a_valid_header(
        (opcode, body) in select(Opcode::ALL).prop_flat_map(|opcode| {
            let len = fixed_len(opcode);
            (Just(opcode), prop_oneof![vec(arb_byte(), len), vec(arb_byte(), 0..len + 64)])
        })
    ) {
        check_canonical(&raw(opcode.into(), &body))?;
    }

    #[test]
    fn mutated_messages(
        msg in arb_message(),
        edits in vec((any::<prop::sample::Index>(), arb_byte()), 1..4),
    ) {
        let mut buf = encode_vec(&msg, 1);
        for (at, byte) in edits {
            let at = at.index(buf.len());
            buf[at] = byte;
        }
        check_canonical(&buf)?;
    }

    #[test]
    fn samples_with_one_byte_changed(pick in any::<prop::sample::Index>(), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let mut buf = encode_vec(pick.get(samples()), 1);
        let at = at.index(buf.len());
        buf[at] = byte;
        check_canonical(&buf)?;
    }
}
