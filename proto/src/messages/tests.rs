//! Round trips of every message and rejection of malformed ones with the right error.

use std::sync::LazyLock;

use zerocopy::FromBytes;

use super::*;
use crate::header::Header;
use crate::{peek_tag, FEATURES, MAGIC, MSG_SIZE, VERSION};

const TAG: u32 = 0xfeed_0042;

pub(super) fn encode_vec(msg: &Message<'_>, tag: u32) -> Vec<u8> {
    let mut buf = vec![0; MSG_SIZE];
    let len = msg.encode(tag, &mut buf).expect("valid message encodes");
    buf.truncate(len);
    buf
}

/// A message with a correct header in front of `body`, whatever `opcode` and `body` are.
pub(super) fn raw(opcode: u16, body: &[u8]) -> Vec<u8> {
    let header = Header {
        magic: U32::new(MAGIC),
        version: U16::new(VERSION),
        opcode: U16::new(opcode),
        length: U32::new((HEADER_LEN + body.len()).try_into().unwrap()),
        tag: U32::new(TAG),
    };
    [header.as_bytes(), body].concat()
}

fn header_mut(buf: &mut [u8]) -> &mut Header {
    Header::mut_from_prefix(buf).unwrap().0
}

static ONE_RANGE: [Range; 1] = [Range::new(4096, 8192)];
static EDGE_RANGES: [Range; 2] = [Range::new(0, u64::MAX), Range::new(u64::MAX - 1, 1)];
static MAX_RANGES: [Range; MAX_FLUSH_RANGES] = {
    let mut ranges = [Range::new(0, 1); MAX_FLUSH_RANGES];
    let mut i = 0;
    while i < MAX_FLUSH_RANGES {
        ranges[i] = Range::new(i as u64 * 8192, 4096);
        i += 1;
    }
    ranges
};

const OPENED: Opened = Opened {
    remote_addr: 0x7f00_dead_0000,
    size: 1 << 30,
    rkey: 0x1234_5678,
    block_size: 4096,
    max_io: 1 << 20,
    flags: VolumeFlags::VOLATILE,
    session_id: 0x0102_0304_0506_0708,
    token: [0x5a; TOKEN_LEN],
    instance: None,
    segments: None,
};

/// Three segments of [`OPENED`]'s volume, the first at its address and rkey.
fn three_segments() -> Segments {
    Segments::new(
        &[
            Segment { offset: 0, remote_addr: OPENED.remote_addr, rkey: OPENED.rkey },
            Segment { offset: 256 << 20, remote_addr: 0x7f10_0000_0000, rkey: 0x55 },
            Segment { offset: 768 << 20, remote_addr: 0x7f20_0000_0000, rkey: 0x66 },
        ],
        OPENED.size,
    )
    .unwrap()
}

/// At least one of every message, with edge values.
pub(super) fn samples() -> &'static [Message<'static>] {
    static SAMPLES: LazyLock<Vec<Message<'static>>> = LazyLock::new(make_samples);
    &SAMPLES
}

fn list_entries() -> &'static [ListEntry] {
    static ENTRIES: LazyLock<Vec<ListEntry>> = LazyLock::new(|| {
        let long = "l".repeat(MAX_VOLUME_NAME);
        (0..MAX_LIST_ENTRIES)
            .map(|i| {
                let name = if i == 0 { long.clone() } else { format!("vol-ü{i}") };
                ListEntry::new(&name, (i as u64) << 30, (i % 4) as u8, OpenMode::ALL[i % 3]).unwrap()
            })
            .collect()
    });
    &ENTRIES
}

fn make_samples() -> Vec<Message<'static>> {
    let long_name = "n".repeat(MAX_VOLUME_NAME).leak();
    let long_host = "h".repeat(MAX_HOST_ID).leak();
    let max_text = "e".repeat(MAX_ERROR_TEXT).leak();
    let mut all = vec![
        Message::Hello { features: FEATURES },
        Message::Hello { features: u64::MAX },
        Message::Challenge { flags: ChallengeFlags::AUTH_REQUIRED, features: FEATURES, nonce: [0xa5; NONCE_LEN] },
        Message::Challenge { flags: ChallengeFlags::empty(), features: 0, nonce: [0; NONCE_LEN] },
        Message::Auth { mac: [7; MAC_LEN], host: None },
        Message::Auth { mac: [8; MAC_LEN], host: Some("nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f") },
        Message::Auth { mac: [0; MAC_LEN], host: Some(long_host) },
        Message::MutualAuth { host: "db1", nonce: [1; NONCE_LEN], mac: [2; MAC_LEN] },
        Message::MutualAuth { host: long_host, nonce: [0xff; NONCE_LEN], mac: [0; MAC_LEN] },
        Message::AuthProof { target_id: [3; crate::TARGET_ID_LEN], mac: [4; MAC_LEN] },
        Message::Open { mode: OpenMode::ReadOnly, name: "v", resume: None },
        Message::Open {
            mode: OpenMode::ReadWrite,
            name: "volume-ü€",
            resume: Some(Resume { session_id: 9, token: [3; TOKEN_LEN] }),
        },
        Message::Open { mode: OpenMode::Exclusive, name: long_name, resume: None },
        Message::Opened(OPENED),
        Message::Opened(Opened { instance: Some(VolumeId([0xa5; 16])), ..OPENED }),
        Message::Opened(Opened { instance: Some(VolumeId([0xa5; 16])), segments: Some(three_segments()), ..OPENED }),
        Message::Opened(Opened { size: 0, block_size: 1, max_io: u32::MAX, flags: VolumeFlags::all(), ..OPENED }),
        Message::Join { session_id: u64::MAX, token: [0xff; TOKEN_LEN] },
        Message::Flush(Flush::All),
        Message::Flush(Flush::Ranges(&[])),
        Message::Flush(Flush::Ranges(&ONE_RANGE)),
        Message::Flush(Flush::Ranges(&EDGE_RANGES)),
        Message::Flush(Flush::Ranges(&MAX_RANGES)),
        Message::Flushed { flags: FlushedFlags::VOLATILE },
        Message::Flushed { flags: FlushedFlags::empty() },
        Message::Discard { offset: 0, len: 4096 },
        Message::Discard { offset: u64::MAX - crate::MAX_ZERO_LEN, len: crate::MAX_ZERO_LEN },
        Message::WriteZeroes { offset: 4096, len: 1, flags: ZeroFlags::empty() },
        Message::WriteZeroes { offset: 0, len: crate::MAX_ZERO_LEN, flags: ZeroFlags::all() },
        Message::Stats,
        Message::StatsReply(StatsReply {
            registrations: 3,
            pinned_bytes: 3 << 30,
            sessions: 2,
            connections: 9,
            cpu_user_us: 1,
            cpu_system_us: u64::MAX,
            windows: None,
        }),
        Message::StatsReply(StatsReply { registrations: 1, windows: Some(12), ..StatsReply::default() }),
        Message::StatsReply(StatsReply { windows: Some(u64::MAX), ..StatsReply::default() }),
        Message::Joined { rkey: 0, segments: None },
        Message::Joined { rkey: u32::MAX, segments: None },
        Message::Joined { rkey: OPENED.rkey, segments: Some(three_segments()) },
        Message::Resized { size: 1 << 30, segments: three_segments() },
        Message::Resized { size: 4096, segments: Segments::one(0, 0, 4096) },
        Message::Close,
        Message::Keepalive,
        Message::List { start: 0 },
        Message::List { start: u32::MAX },
        Message::ListReply { total: 0, entries: &[] },
        Message::ListReply { total: 9, entries: list_entries() },
        Message::Error { code: ErrorCode::Malformed, text: "" },
        Message::Error { code: ErrorCode::Busy, text: max_text },
    ];
    all.extend(Opcode::ALL.iter().filter(|op| op.is_acked_by_ok()).map(|&answers| Message::Ok { answers }));
    all.extend(ErrorCode::ALL.iter().map(|&code| Message::Error { code, text: "why: ü" }));
    all
}

#[test]
fn samples_cover_every_opcode() {
    let samples = samples();
    for op in Opcode::ALL {
        assert!(samples.iter().any(|m| m.opcode() == *op), "{op:?} has no sample");
    }
}

#[test]
fn every_message_round_trips() {
    for msg in samples() {
        let buf = encode_vec(msg, TAG);
        assert!(buf.len() <= MSG_SIZE);
        assert_eq!(parse(&buf), Ok((TAG, *msg)), "{msg:?}");
        assert_eq!(peek_tag(&buf), Some(TAG));
    }
}

#[test]
fn largest_messages_fit_exactly() {
    let flush = encode_vec(&Message::Flush(Flush::Ranges(&MAX_RANGES)), 0);
    assert_eq!(flush.len(), HEADER_LEN + 8 + MAX_FLUSH_RANGES * 16);
    assert!(flush.len() + size_of::<Range>() > MSG_SIZE);
    let text = "e".repeat(MAX_ERROR_TEXT);
    let error = encode_vec(&Message::Error { code: ErrorCode::Internal, text: &text }, 0);
    assert_eq!(error.len(), MSG_SIZE);
}

#[test]
fn every_proper_prefix_is_truncated() {
    for msg in samples() {
        let buf = encode_vec(msg, TAG);
        for have in 0..buf.len() {
            let need = if have < HEADER_LEN { HEADER_LEN } else { buf.len() };
            assert_eq!(parse(&buf[..have]), Err(ParseError::Truncated { need, have }), "{msg:?} cut at {have}");
        }
    }
}

#[test]
fn trailing_bytes_are_rejected() {
    for msg in samples() {
        let mut buf = encode_vec(msg, TAG);
        let header = u32::try_from(buf.len()).unwrap();
        buf.push(0);
        let received = buf.len();
        assert_eq!(parse(&buf), Err(ParseError::LengthMismatch { header, received }));
    }
}

#[test]
fn wrong_magic() {
    let mut buf = encode_vec(&Message::Keepalive, TAG);
    header_mut(&mut buf).magic = U32::new(0x5452_5354);
    assert_eq!(parse(&buf), Err(ParseError::BadMagic(0x5452_5354)));
    assert_eq!(peek_tag(&buf), None);
}

#[test]
fn wrong_version_names_both() {
    for got in [0, 2, u16::MAX] {
        let mut buf = encode_vec(&Message::Hello { features: FEATURES }, TAG);
        header_mut(&mut buf).version = U16::new(got);
        let err = parse(&buf).unwrap_err();
        assert_eq!(err, ParseError::Version { got, supported: VERSION });
        assert!(err.to_string().contains(&format!("version {got} ")), "{err}");
        // The tag still reaches the ERROR reply.
        assert_eq!(peek_tag(&buf), Some(TAG));
    }
}

#[test]
fn unknown_opcodes() {
    for op in [0, 0x000d, 0x0100, 0x8002, 0x8008, 0x800a, 0xffff] {
        assert_eq!(parse(&raw(op, &[])), Err(ParseError::UnknownOpcode(op)));
    }
}

#[test]
fn fixed_bodies_of_the_wrong_size() {
    let bad = |opcode: Opcode, body: usize, expected: usize| {
        let err = parse(&raw(opcode.into(), &vec![0; body])).unwrap_err();
        let (expected, got) = (HEADER_LEN + expected, HEADER_LEN + body);
        assert_eq!(err, ParseError::BadLength { opcode, expected, got });
    };
    bad(Opcode::Hello, 15, 16);
    bad(Opcode::Hello, 17, 16);
    bad(Opcode::Auth, 0, 32);
    // With FEATURE_HOST_ID's tail: the base or base + tail.
    bad(Opcode::Auth, 32 + 231, 32);
    bad(Opcode::Auth, 32 + 233, 32);
    bad(Opcode::Open, 73, 72);
    // With FEATURE_RECONNECT's tails: exactly the base or base + tail, nothing between or past.
    bad(Opcode::Open, 72 + 23, 72);
    bad(Opcode::Open, 72 + 25, 72);
    bad(Opcode::Opened, 55, 56);
    bad(Opcode::Opened, 56 + 15, 56);
    // With FEATURE_SEGMENTS' tail after it: at least its head (and then exactly its entries).
    bad(Opcode::Opened, 56 + 17, 56 + 16 + 16);
    bad(Opcode::Resized, 8, 24);
    bad(Opcode::Stats, 1, 0);
    bad(Opcode::Keepalive, 8, 0);
    bad(Opcode::Flush, 7, 8);
    bad(Opcode::Error, 4, 8);
}

fn flush_raw(flags: u32, count: u32, ranges: &[Range]) -> Vec<u8> {
    let head = FlushHead { flags: U32::new(flags), count: U32::new(count) };
    raw(Opcode::Flush.into(), &[head.as_bytes(), ranges.as_bytes()].concat())
}

#[test]
fn flush_counts() {
    let opcode = Opcode::Flush;
    // More ranges than the message holds.
    assert_eq!(
        parse(&flush_raw(0, 3, &ONE_RANGE)),
        Err(ParseError::BadLength { opcode, expected: 16 + 8 + 48, got: 16 + 8 + 16 })
    );
    // Fewer.
    assert_eq!(
        parse(&flush_raw(0, 0, &ONE_RANGE)),
        Err(ParseError::BadLength { opcode, expected: 16 + 8, got: 16 + 8 + 16 })
    );
    let max = MAX_FLUSH_RANGES as u64;
    for count in [MAX_FLUSH_RANGES as u32 + 1, u32::MAX] {
        assert_eq!(
            parse(&flush_raw(0, count, &[])),
            Err(ParseError::BadCount { field: "flush.count", count: count.into(), max })
        );
    }
    let too_many = [Range::new(0, 1); MAX_FLUSH_RANGES + 1];
    assert_eq!(
        parse(&flush_raw(0, too_many.len() as u32, &too_many)),
        Err(ParseError::BadCount { field: "flush.count", count: max + 1, max })
    );
    // ALL covers everything: no ranges with it.
    assert_eq!(
        parse(&flush_raw(FLUSH_ALL, 1, &ONE_RANGE)),
        Err(ParseError::BadCount { field: "flush.count", count: 1, max: 0 })
    );
}

#[test]
fn flush_flags_and_ranges() {
    assert_eq!(parse(&flush_raw(2, 0, &[])), Err(ParseError::UnknownFlags { field: "flush.flags", bits: 2 }));
    assert_eq!(
        parse(&flush_raw(0, 2, &[Range::new(0, 4096), Range::new(8192, 0)])),
        Err(ParseError::BadRange { offset: 8192, len: 0 })
    );
    assert_eq!(
        parse(&flush_raw(0, 1, &[Range::new(u64::MAX, 1)])),
        Err(ParseError::BadRange { offset: u64::MAX, len: 1 })
    );
}

#[test]
fn flush_borrows_the_buffer() {
    let buf = encode_vec(&Message::Flush(Flush::Ranges(&ONE_RANGE)), TAG);
    let Ok((_, Message::Flush(Flush::Ranges(ranges)))) = parse(&buf) else { panic!() };
    assert!(buf.as_ptr_range().contains(&ranges.as_ptr().cast()));
    assert_eq!((ranges[0].offset(), ranges[0].len(), ranges[0].end()), (4096, 8192, Some(12288)));
}

#[test]
fn reconnect_tails_are_optional() {
    // A peer without FEATURE_RECONNECT sends and expects the base bodies: they still parse.
    let base = encode_vec(&Message::Opened(OPENED), TAG);
    assert_eq!(base.len(), HEADER_LEN + 56);
    let with = Opened { instance: Some(VolumeId([7; 16])), ..OPENED };
    let long = encode_vec(&Message::Opened(with), TAG);
    assert_eq!(long.len(), HEADER_LEN + 56 + 16);
    assert_eq!(&long[HEADER_LEN..HEADER_LEN + 56], &base[HEADER_LEN..]);
    assert_eq!(parse(&long).unwrap().1, Message::Opened(with));
    let open = Message::Open { mode: OpenMode::ReadWrite, name: "v", resume: None };
    assert_eq!(encode_vec(&open, TAG).len(), HEADER_LEN + 72);
    let resume = Some(Resume { session_id: 5, token: [1; TOKEN_LEN] });
    let reopen = encode_vec(&Message::Open { mode: OpenMode::ReadWrite, name: "v", resume }, TAG);
    assert_eq!(reopen.len(), HEADER_LEN + 72 + 24);
    assert_eq!(VolumeId([0xab; 16]).to_string(), "ab".repeat(16));
}

fn auth_raw(host_len: u8, host: &[u8], reserved: [u8; 7]) -> Vec<u8> {
    let mut tail = HostBody { host_len, reserved, host: [0; HOST_FIELD] };
    tail.host[..host.len()].copy_from_slice(host);
    raw(Opcode::Auth.into(), &[AuthBody { mac: [1; MAC_LEN] }.as_bytes(), tail.as_bytes()].concat())
}

#[test]
fn list_entries_are_checked() {
    let entry = ListEntry::new("vol0", 1 << 30, ListEntry::VOLATILE, OpenMode::ReadWrite).unwrap();
    assert_eq!(
        (entry.name(), entry.size(), entry.is_volatile(), entry.grant()),
        ("vol0", 1 << 30, true, OpenMode::ReadWrite)
    );
    assert!(ListEntry::new("", 1, 0, OpenMode::ReadOnly).is_none());
    assert!(ListEntry::new(&"n".repeat(MAX_VOLUME_NAME + 1), 1, 0, OpenMode::ReadOnly).is_none());
    assert!(ListEntry::new("v", 1, 4, OpenMode::ReadOnly).is_none(), "unknown flag");
    let reply = |e: &ListEntry| {
        let head = ListHead { total: U32::new(1), count: U32::new(1) };
        raw(Opcode::ListReply.into(), &[head.as_bytes(), e.as_bytes()].concat())
    };
    assert!(parse(&reply(&entry)).is_ok());
    let mut bytes = entry.as_bytes().to_vec();
    bytes[9] = 4; // grant
    assert!(parse(&reply(&ListEntry::read_from_bytes(&bytes).unwrap())).is_err(), "bad grant");
    let mut bytes = entry.as_bytes().to_vec();
    bytes[10] = 0; // name_len
    assert_eq!(parse(&reply(&ListEntry::read_from_bytes(&bytes).unwrap())), Err(ParseError::EmptyName));
    let mut bytes = entry.as_bytes().to_vec();
    bytes[10] = 3; // name_len shorter than the name: padding not zero
    assert!(parse(&reply(&ListEntry::read_from_bytes(&bytes).unwrap())).is_err());
    let too_many = ListHead { total: U32::new(99), count: U32::new(MAX_LIST_ENTRIES as u32 + 1) };
    assert!(parse(&raw(Opcode::ListReply.into(), too_many.as_bytes())).is_err());
    assert_eq!(encode_vec(&Message::List { start: 3 }, TAG).len(), HEADER_LEN + 8);
}

#[test]
fn host_identities() {
    // A peer without FEATURE_HOST_ID sends the base AUTH: 32 bytes, as before.
    let base = encode_vec(&Message::Auth { mac: [1; MAC_LEN], host: None }, TAG);
    assert_eq!(base.len(), HEADER_LEN + 32);
    let with = encode_vec(&Message::Auth { mac: [1; MAC_LEN], host: Some("db1") }, TAG);
    assert_eq!(with.len(), HEADER_LEN + 32 + 232);
    assert_eq!(&with[HEADER_LEN..HEADER_LEN + 32], &base[HEADER_LEN..]);
    assert_eq!(parse(&auth_raw(3, b"db1", [0; 7])).unwrap().1, Message::Auth { mac: [1; MAC_LEN], host: Some("db1") });
    let count = |count: u64| ParseError::BadCount { field: "auth.host_len", count, max: MAX_HOST_ID as u64 };
    assert_eq!(parse(&auth_raw(0, b"", [0; 7])), Err(count(0)));
    assert_eq!(parse(&auth_raw(224, &[b'h'; 224], [0; 7])), Err(count(224)));
    assert_eq!(parse(&auth_raw(255, b"x", [0; 7])), Err(count(255)));
    assert_eq!(parse(&auth_raw(3, b"a b", [0; 7])), Err(ParseError::BadUtf8 { field: "auth.host" }));
    assert_eq!(parse(&auth_raw(2, "ü".as_bytes(), [0; 7])), Err(ParseError::BadUtf8 { field: "auth.host" }));
    assert_eq!(parse(&auth_raw(2, b"abc", [0; 7])), Err(ParseError::Reserved { field: "auth.host padding" }));
    assert_eq!(
        parse(&auth_raw(3, b"abc", [0, 0, 0, 1, 0, 0, 0])),
        Err(ParseError::Reserved { field: "auth.reserved" })
    );
    let enc = |host| Message::Auth { mac: [0; MAC_LEN], host: Some(host) }.encode(0, &mut [0; MSG_SIZE]);
    assert!(enc("").is_err() && enc("a\tb").is_err() && enc(&"h".repeat(MAX_HOST_ID + 1)).is_err());
    assert!(is_valid_host_id("db1.example.com") && !is_valid_host_id("db 1"));
}

fn open_raw(mode: u8, name_len: u8, name: &[u8]) -> Vec<u8> {
    let mut body = OpenBody { mode, name_len, reserved: [0; 6], name: [0; MAX_VOLUME_NAME] };
    body.name[..name.len()].copy_from_slice(name);
    raw(Opcode::Open.into(), body.as_bytes())
}

#[test]
fn open_mode_and_name() {
    assert!(parse(&open_raw(2, 3, b"vol")).is_ok());
    for mode in [0, 4, 0xff] {
        assert_eq!(
            parse(&open_raw(mode, 3, b"vol")),
            Err(ParseError::BadEnum { field: "open.mode", value: mode.into() })
        );
    }
    assert_eq!(parse(&open_raw(1, 0, b"")), Err(ParseError::EmptyName));
    assert_eq!(parse(&open_raw(1, 2, b"\xff\xfe")), Err(ParseError::BadUtf8 { field: "open.name" }));
    // A name cut inside a character.
    assert_eq!(parse(&open_raw(1, 1, &"ü".as_bytes()[..1])), Err(ParseError::BadUtf8 { field: "open.name" }));
    assert_eq!(
        parse(&open_raw(1, 65, b"vol")),
        Err(ParseError::BadCount { field: "open.name_len", count: 65, max: 64 })
    );
    assert_eq!(parse(&open_raw(1, 2, b"vol")), Err(ParseError::Reserved { field: "open.name padding" }));
}

#[test]
fn unknown_flag_bits() {
    let challenge = |flags| ChallengeBody {
        flags: U32::new(flags),
        reserved: U32::ZERO,
        features: U64::ZERO,
        nonce: [0; NONCE_LEN],
    };
    assert_eq!(
        parse(&raw(Opcode::Challenge.into(), challenge(3).as_bytes())),
        Err(ParseError::UnknownFlags { field: "challenge.flags", bits: 2 })
    );
    let flushed = FlushedBody { flags: U32::new(0x8000_0001), reserved: U32::ZERO };
    assert_eq!(
        parse(&raw(Opcode::Flushed.into(), flushed.as_bytes())),
        Err(ParseError::UnknownFlags { field: "flushed.flags", bits: 0x8000_0000 })
    );
    let mut opened = encode_vec(&Message::Opened(OPENED), TAG);
    OpenedBody::mut_from_bytes(&mut opened[HEADER_LEN..]).unwrap().flags = U32::new(8 | 1);
    assert_eq!(parse(&opened), Err(ParseError::UnknownFlags { field: "opened.flags", bits: 8 }));
}

#[test]
fn reserved_fields_must_be_zero() {
    let reserved = |opcode: Opcode, body: &[u8], field| {
        assert_eq!(parse(&raw(opcode.into(), body)), Err(ParseError::Reserved { field }));
    };
    let hello = HelloBody { features: U64::ZERO, reserved: U64::new(1) };
    reserved(Opcode::Hello, hello.as_bytes(), "hello.reserved");
    let ok = OkBody { answers: U16::new(Opcode::Auth.into()), reserved: [0, 0, 0, 0, 0, 1] };
    reserved(Opcode::Ok, ok.as_bytes(), "ok.reserved");
    let error = ErrorHead { status: U32::new(1), text_len: U16::ZERO, reserved: [1, 0] };
    reserved(Opcode::Error, error.as_bytes(), "error.reserved");
    let mut open = open_raw(1, 1, b"v");
    OpenBody::mut_from_bytes(&mut open[HEADER_LEN..]).unwrap().reserved[5] = 1;
    assert_eq!(parse(&open), Err(ParseError::Reserved { field: "open.reserved" }));
}

#[test]
fn opened_geometry() {
    let bad = |size, block_size, max_io| {
        let opened = Opened { size, block_size, max_io, ..OPENED };
        let err = ParseError::BadGeometry { size, block_size, max_io };
        assert_eq!(Message::Opened(opened).encode(0, &mut [0; MSG_SIZE]), Err(err.into()));
        let body = OpenedBody {
            remote_addr: U64::ZERO,
            size: U64::new(size),
            rkey: U32::ZERO,
            block_size: U32::new(block_size),
            max_io: U32::new(max_io),
            flags: U32::ZERO,
            session_id: U64::ZERO,
            token: [0; TOKEN_LEN],
        };
        assert_eq!(parse(&raw(Opcode::Opened.into(), body.as_bytes())), Err(err));
    };
    bad(1 << 20, 0, 4096);
    bad(1 << 20, 3000, 6000);
    bad(4096 + 512, 4096, 4096);
    bad(1 << 20, 4096, 0);
    bad(1 << 20, 4096, 6144);
}

#[test]
fn error_status_and_text() {
    let error = |status: u32, text_len: u16, text: &[u8]| {
        let head = ErrorHead { status: U32::new(status), text_len: U16::new(text_len), reserved: [0; 2] };
        raw(Opcode::Error.into(), &[head.as_bytes(), text].concat())
    };
    let busy = error(7, 2, b"hi");
    assert_eq!(parse(&busy), Ok((TAG, Message::Error { code: ErrorCode::Busy, text: "hi" })));
    for status in [0, 17, u32::MAX] {
        assert_eq!(
            parse(&error(status, 0, b"")),
            Err(ParseError::BadEnum { field: "error.status", value: status.into() })
        );
    }
    assert_eq!(parse(&error(1, 2, b"\xc3\x28")), Err(ParseError::BadUtf8 { field: "error.text" }));
    assert_eq!(
        parse(&error(1, 3, b"hi")),
        Err(ParseError::BadLength { opcode: Opcode::Error, expected: 16 + 8 + 3, got: 16 + 8 + 2 })
    );
    let len = MAX_ERROR_TEXT + 1;
    assert_eq!(
        parse(&error(1, len as u16, &vec![b'x'; len])),
        Err(ParseError::BadCount { field: "error.text_len", count: len as u64, max: MAX_ERROR_TEXT as u64 })
    );
}

#[test]
fn ok_answers_only_auth_join_close() {
    let ok = |answers: u16| raw(Opcode::Ok.into(), OkBody { answers: U16::new(answers), reserved: [0; 6] }.as_bytes());
    assert_eq!(parse(&ok(Opcode::Join.into())), Ok((TAG, Message::Ok { answers: Opcode::Join })));
    for answers in [0, Opcode::Hello.into(), Opcode::Ok.into(), 0x4242] {
        assert_eq!(parse(&ok(answers)), Err(ParseError::BadEnum { field: "ok.answers", value: answers.into() }));
    }
    let err = Message::Ok { answers: Opcode::Open }.encode(0, &mut [0; MSG_SIZE]);
    assert_eq!(err, Err(EncodeError::Invalid(ParseError::BadEnum { field: "ok.answers", value: 3 })));
}

/// JOINED is OK(JOIN) with an rkey tail: the tail on another OK, a nonzero reserved word or a
/// short tail must not parse (a peer would take a garbage rkey or misread an OK).
#[test]
fn joined_is_ok_join_with_an_rkey_tail() {
    let ok = |answers: Opcode, tail: &[u8]| {
        let mut body = OkBody { answers: U16::new(answers.into()), reserved: [0; 6] }.as_bytes().to_vec();
        body.extend_from_slice(tail);
        raw(Opcode::Ok.into(), &body)
    };
    let tail = |rkey: u32, reserved: u32| {
        JoinedBody { rkey: U32::new(rkey), reserved: U32::new(reserved) }.as_bytes().to_vec()
    };
    assert_eq!(parse(&ok(Opcode::Join, &tail(0x1234, 0))), Ok((TAG, Message::Joined { rkey: 0x1234, segments: None })));
    let mut buf = [0; MSG_SIZE];
    let n = Message::Joined { rkey: 0x1234, segments: None }.encode(TAG, &mut buf).unwrap();
    assert_eq!(&buf[..n], &ok(Opcode::Join, &tail(0x1234, 0))[..]);
    assert_eq!(parse(&ok(Opcode::Join, &tail(1, 7))), Err(ParseError::Reserved { field: "joined.reserved" }));
    for answers in [Opcode::Auth, Opcode::Close] {
        assert!(matches!(parse(&ok(answers, &tail(1, 0))), Err(ParseError::BadLength { .. })), "{answers:?}");
    }
    assert!(matches!(parse(&ok(Opcode::Join, &[0; 4])), Err(ParseError::BadLength { .. })));
}

/// Would catch: a v2 AUTH whose zero base MAC is not checked (two encodings of one message), a
/// proof tail accepted on an OK that does not answer AUTH, or a v2 body of the wrong length
/// taken for a v1 one.
#[test]
fn mutual_auth_and_its_proof_are_tails_of_auth_and_ok() {
    let v2 = encode_vec(&Message::MutualAuth { host: "db1", nonce: [1; NONCE_LEN], mac: [2; MAC_LEN] }, TAG);
    let body_len = v2.len() - HEADER_LEN;
    assert_eq!(body_len, size_of::<AuthBody>() + 232 + size_of::<MutualBody>());
    let mut nonzero = v2.clone();
    nonzero[HEADER_LEN] = 1;
    assert_eq!(parse(&nonzero), Err(ParseError::Reserved { field: "auth.mac (v2 carries its MAC in the tail)" }));
    // One byte short of the v2 body is neither v1 nor v2.
    let short = raw(Opcode::Auth.into(), &v2[HEADER_LEN..v2.len() - 1]);
    assert!(matches!(parse(&short), Err(ParseError::BadLength { .. })));
    let proof = encode_vec(&Message::AuthProof { target_id: [3; crate::TARGET_ID_LEN], mac: [4; MAC_LEN] }, TAG);
    for answers in [Opcode::Join, Opcode::Close] {
        let mut other = proof.clone();
        other[HEADER_LEN..HEADER_LEN + 2].copy_from_slice(&u16::from(answers).to_le_bytes());
        // Not a proof (a JOINED with segments may be as long: its tail is checked as one).
        assert!(parse(&other).is_err(), "{answers:?}");
    }
    let mut reserved = proof.clone();
    reserved[HEADER_LEN + 7] = 1;
    assert_eq!(parse(&reserved), Err(ParseError::Reserved { field: "ok.reserved" }));
}

#[test]
fn encode_refuses_what_parse_would() {
    let mut buf = [0; MSG_SIZE];
    let mut enc = |msg: Message<'_>| {
        msg.encode(0, &mut buf).map_err(|e| match e {
            EncodeError::Invalid(e) => e,
            e => panic!("{e}"),
        })
    };
    let long = "n".repeat(MAX_VOLUME_NAME + 1);
    assert_eq!(
        enc(Message::Open { mode: OpenMode::ReadOnly, name: &long, resume: None }),
        Err(ParseError::BadCount { field: "open.name_len", count: 65, max: 64 })
    );
    assert_eq!(enc(Message::Open { mode: OpenMode::ReadOnly, name: "", resume: None }), Err(ParseError::EmptyName));
    let too_many = [Range::new(0, 1); MAX_FLUSH_RANGES + 1];
    assert_eq!(
        enc(Message::Flush(Flush::Ranges(&too_many))),
        Err(ParseError::BadCount {
            field: "flush.count",
            count: MAX_FLUSH_RANGES as u64 + 1,
            max: MAX_FLUSH_RANGES as u64
        })
    );
    assert_eq!(
        enc(Message::Flush(Flush::Ranges(&[Range::new(5, 0)]))),
        Err(ParseError::BadRange { offset: 5, len: 0 })
    );
}

/// DISCARD and WRITE_ZEROES: an empty range, one past `u64::MAX`, one longer than
/// `MAX_ZERO_LEN`, flags in a DISCARD, unknown flags in a WRITE_ZEROES and a set reserved word
/// are refused by the parser (and the first three by the encoder too).
#[test]
fn zeroing_requests_are_checked() {
    let body = |offset: u64, len: u64, flags: u32, reserved: u32| {
        let b = ZeroBody {
            offset: U64::new(offset),
            len: U64::new(len),
            flags: U32::new(flags),
            reserved: U32::new(reserved),
        };
        b.as_bytes().to_vec()
    };
    let max = crate::MAX_ZERO_LEN;
    for op in [Opcode::Discard, Opcode::WriteZeroes] {
        assert_eq!(parse(&raw(op.into(), &body(8, 0, 0, 0))), Err(ParseError::BadRange { offset: 8, len: 0 }));
        assert_eq!(
            parse(&raw(op.into(), &body(u64::MAX, 4096, 0, 0))),
            Err(ParseError::BadRange { offset: u64::MAX, len: 4096 })
        );
        assert_eq!(
            parse(&raw(op.into(), &body(0, max + 1, 0, 0))),
            Err(ParseError::BadCount { field: "zero.len", count: max + 1, max })
        );
        assert_eq!(parse(&raw(op.into(), &body(0, 4096, 0, 1))), Err(ParseError::Reserved { field: "zero.reserved" }));
        assert!(matches!(parse(&raw(op.into(), &body(0, 4096, 0, 0)[..20])), Err(ParseError::BadLength { .. })));
    }
    assert_eq!(
        parse(&raw(Opcode::Discard.into(), &body(0, 4096, 1, 0))),
        Err(ParseError::Reserved { field: "discard.flags" })
    );
    assert_eq!(
        parse(&raw(Opcode::WriteZeroes.into(), &body(0, 4096, 4, 0))),
        Err(ParseError::UnknownFlags { field: "zero.flags", bits: 4 })
    );
    let mut out = [0u8; MSG_SIZE];
    assert_eq!(
        Message::Discard { offset: 0, len: max + 1 }.encode(TAG, &mut out),
        Err(EncodeError::Invalid(ParseError::BadCount { field: "zero.len", count: max + 1, max }))
    );
    assert_eq!(
        Message::WriteZeroes { offset: 1, len: 0, flags: ZeroFlags::FUA }.encode(TAG, &mut out),
        Err(EncodeError::Invalid(ParseError::BadRange { offset: 1, len: 0 }))
    );
}

#[test]
fn encode_needs_room() {
    for msg in samples() {
        let len = encode_vec(msg, TAG).len();
        let mut small = vec![0; len - 1];
        assert_eq!(msg.encode(TAG, &mut small), Err(EncodeError::BufferTooSmall { need: len, have: len - 1 }));
        assert_eq!(msg.encode(TAG, &mut vec![0; len]), Ok(len));
    }
}

#[test]
fn error_text_is_truncated_on_a_char_boundary() {
    let text = "€".repeat(MAX_ERROR_TEXT); // 3 bytes each; MAX_ERROR_TEXT % 3 != 0
    let buf = encode_vec(&Message::Error { code: ErrorCode::Internal, text: &text }, TAG);
    let Ok((_, Message::Error { text: got, .. })) = parse(&buf) else { panic!() };
    assert_eq!(got.len(), MAX_ERROR_TEXT / 3 * 3);
    assert!(text.starts_with(got));
}

#[test]
fn peek_tag_survives_a_broken_body() {
    let mut buf = open_raw(9, 200, b"");
    assert!(parse(&buf).is_err());
    assert_eq!(peek_tag(&buf), Some(TAG));
    assert_eq!(peek_tag(&buf[..HEADER_LEN - 1]), None);
    header_mut(&mut buf).opcode = U16::new(0x7777);
    assert_eq!(peek_tag(&buf), Some(TAG));
}

#[test]
fn flags_and_codes_read_well() {
    let flags = VolumeFlags::VOLATILE | VolumeFlags::EXCLUSIVE;
    assert_eq!(format!("{flags:?}"), "VolumeFlags(VOLATILE | EXCLUSIVE)");
    assert_eq!(format!("{:?}", VolumeFlags::empty()), "VolumeFlags()");
    assert!(flags.contains(VolumeFlags::EXCLUSIVE) && !flags.contains(VolumeFlags::READ_ONLY));
    assert_eq!(VolumeFlags::from_bits(8), None);
    assert_eq!(ErrorCode::Busy.to_string(), "volume is opened exclusively by another session");
    assert!(Opcode::ALL.iter().all(|op| op.is_reply() == (u16::from(*op) & 0x8000 != 0)));
    assert!(!Opcode::Keepalive.is_reply() && Opcode::Error.is_reply());
}

#[test]
fn messages_are_plain_data() {
    fn plain<T: Send + Sync + Copy + 'static>() {}
    plain::<Message<'static>>();
    plain::<ParseError>();
    plain::<EncodeError>();
}

/// FEATURE_SEGMENTS on the wire. Catches a tail a peer without the bit would see (OPENED
/// without instance, JOINED without segments stay today's bytes), a list that does not match
/// OPENED's or JOINED's own address and rkey, a count the bytes do not hold, more than
/// MAX_SEGMENTS, a RESIZED whose segments do not reach its size, and reserved bytes set.
#[test]
fn segments_tails_and_resized() {
    let with_instance = Opened { instance: Some(VolumeId([1; 16])), ..OPENED };
    let today = encode_vec(&Message::Opened(with_instance), TAG);
    let segmented = Opened { segments: Some(three_segments()), ..with_instance };
    let buf = encode_vec(&Message::Opened(segmented), TAG);
    assert_eq!(buf.len(), today.len() + 16 + 3 * 24, "the tail follows today's message");
    assert_eq!(&buf[HEADER_LEN..today.len()], &today[HEADER_LEN..], "today's bytes first");
    assert_eq!(parse(&buf), Ok((TAG, Message::Opened(segmented))));
    assert_eq!(segmented.all_segments().len(), 3);
    assert_eq!(OPENED.all_segments(), Segments::one(OPENED.remote_addr, OPENED.rkey, OPENED.size));
    // Refused when encoding and when parsing: segments without the instance tail, a first
    // segment elsewhere than OPENED's address or rkey, one starting past the size.
    for bad in [
        Opened { segments: Some(three_segments()), ..OPENED },
        Opened { remote_addr: 1, ..segmented },
        Opened { rkey: 1, ..segmented },
        Opened { size: 512 << 20, ..segmented },
    ] {
        assert!(Message::Opened(bad).encode(TAG, &mut [0; MSG_SIZE]).is_err(), "{bad:?}");
    }
    let mut broken = buf.clone();
    broken[today.len()] = 2; // count 2, three entries follow
    assert!(matches!(parse(&broken), Err(ParseError::BadLength { .. })));
    let mut broken = buf.clone();
    broken[today.len()] = 9;
    assert!(matches!(parse(&broken), Err(ParseError::BadCount { field: "segments.count", .. })));
    let mut broken = buf.clone();
    broken[today.len() + 3] = 1;
    assert_eq!(parse(&broken), Err(ParseError::Reserved { field: "segments.reserved" }));
    // JOINED: the first segment's rkey is JOINED's.
    let joined = Message::Joined { rkey: OPENED.rkey, segments: Some(three_segments()) };
    assert_eq!(parse(&encode_vec(&joined, TAG)), Ok((TAG, joined)));
    let wrong = Message::Joined { rkey: 9, segments: Some(three_segments()) };
    assert!(wrong.encode(TAG, &mut [0; MSG_SIZE]).is_err());
    // RESIZED: its segments reach its size.
    let resized = Message::Resized { size: 1 << 30, segments: three_segments() };
    assert_eq!(parse(&encode_vec(&resized, TAG)), Ok((TAG, resized)));
    let past = Message::Resized { size: 768 << 20, segments: three_segments() };
    assert!(past.encode(TAG, &mut [0; MSG_SIZE]).is_err());
    let mut short = encode_vec(&resized, TAG);
    // The segments' size, one block less than RESIZED's.
    let at = HEADER_LEN + 8 + 8;
    short[at..at + 8].copy_from_slice(&((1u64 << 30) - 4096).to_le_bytes());
    assert!(matches!(parse(&short), Err(ParseError::BadSegments { .. })));
    assert!(!Opcode::Resized.is_reply() && !Opcode::Resized.is_acked_by_ok());
}
