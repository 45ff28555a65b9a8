//! Fuzzing the control channel (issue 11): the proto parser on arbitrary and mutated bytes,
//! and the target's control state machine on arbitrary sequences of messages, connect data and
//! connections, against the real server over the in-memory fabric.
//!
//! Each target first replays its committed corpus (`tests/fuzz/<target>/`), then generates
//! cases for `RBLK_FUZZ_SECS` seconds (default 3; `scripts/test.sh` runs a bounded pass, and a
//! long run is `RBLK_FUZZ_SECS=3600 cargo test -p rblk-tests --test fuzz -- --nocapture`). A
//! failing case is shrunk and written to the corpus as `crash-<hash>`: commit it with its fix.
//! `RBLK_FUZZ_SEED` repeats a run's generation.
//!
//! What they would catch:
//! - `proto_parser`: a panic on any input, and an input that parses to a message which does
//!   not re-encode to the same bytes (two encodings of one message, or a parser accepting
//!   garbage a re-encode would not produce).
//! - `control_state_machine`: a panic or a wedged connection thread in the target, and any
//!   leak once the fuzzing peer's connections are gone: sessions, connections, registrations,
//!   pinned bytes, or an open mode (afterwards a fresh client must get an exclusive open).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use rblk_fabric::Fabric;
use rblk_proto::{
    ChallengeFlags, ConnectData, ErrorCode, Flush, FlushedFlags, Message, Opcode, OpenMode, Opened, Range, Resume,
    StatsReply, VolumeFlags, MSG_SIZE, NONCE_LEN, TOKEN_LEN,
};
use rblk_target::access::{Grant, HostSpec};
use rblk_target::config::VolumeSpec;
use rblk_target::server::{Config, Running, Server};
use rblk_tests::raw::Raw;

/// How long each target generates cases.
fn budget() -> Duration {
    let secs = std::env::var("RBLK_FUZZ_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    Duration::from_secs(secs)
}

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz").join(target)
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// Replays `target`'s corpus through `check`, then generates cases from `strategy` until the
/// budget is spent. A failure is saved (shrunk) to the corpus before the test fails.
fn fuzz<S: Strategy>(
    target: &str,
    strategy: S,
    save: impl Fn(&S::Value) -> Vec<u8>,
    load: impl Fn(&[u8]) -> Option<S::Value>,
    check: impl Fn(&S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let dir = corpus_dir(target);
    let mut replayed = 0;
    let mut files: Vec<_> =
        std::fs::read_dir(&dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    files.sort();
    for path in files {
        let bytes = std::fs::read(&path).expect("read a corpus file");
        let case = load(&bytes).unwrap_or_else(|| panic!("corpus file {} does not load", path.display()));
        if let Err(e) = check(&case) {
            panic!("corpus case {} fails: {e}\n{case:?}", path.display());
        }
        replayed += 1;
    }
    let seed = std::env::var("RBLK_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| u64::from_le_bytes(rblk_target::session::random()));
    let deadline = Instant::now() + budget();
    let (mut rounds, mut cases) = (0u64, 0u64);
    while Instant::now() < deadline {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&seed.to_le_bytes());
        key[8..16].copy_from_slice(&rounds.to_le_bytes());
        let config = RunnerConfig { cases: 32, failure_persistence: None, ..RunnerConfig::default() };
        let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &key));
        match runner.run(&strategy, |case| check(&case)) {
            Ok(()) => {}
            Err(TestError::Fail(why, case)) => {
                let bytes = save(&case);
                std::fs::create_dir_all(&dir).expect("create the corpus dir");
                let path = dir.join(format!("crash-{:016x}", fnv(&bytes)));
                std::fs::write(&path, &bytes).expect("save the failing case");
                panic!("{target}: {why}\nshrunk case saved to {} (commit it with the fix):\n{case:?}", path.display());
            }
            Err(TestError::Abort(why)) => panic!("{target}: aborted: {why}"),
        }
        rounds += 1;
        cases += 32;
    }
    eprintln!("fuzz {target}: {replayed} corpus cases, then {cases} generated in {:?} (seed {seed})", budget());
}

// ----- The parser -----

/// Valid encodings of many kinds of message, to mutate.
fn arb_valid_bytes() -> impl Strategy<Value = Vec<u8>> {
    let range = (0u64..1 << 40, 1u64..1 << 30).prop_map(|(o, l)| Range::new(o, l));
    let msg = prop_oneof![
        any::<u64>().prop_map(|features| Message::Hello { features }),
        any::<[u8; NONCE_LEN]>().prop_map(|nonce| Message::Challenge {
            flags: ChallengeFlags::AUTH_REQUIRED,
            features: rblk_proto::FEATURES,
            nonce
        }),
        (any::<[u8; 32]>(), proptest::option::of("[!-~]{1,40}"))
            .prop_map(|(mac, host)| (mac, host.map(|h| &*h.leak())))
            .prop_map(|(mac, host)| Message::Auth { mac, host }),
        ("[!-~]{1,40}", any::<[u8; NONCE_LEN]>(), any::<[u8; 32]>())
            .prop_map(|(host, nonce, mac)| Message::MutualAuth { host: host.leak(), nonce, mac }),
        any::<([u8; 16], [u8; 32])>().prop_map(|(target_id, mac)| Message::AuthProof { target_id, mac }),
        ("[a-z]{1,8}", any::<bool>()).prop_map(|(name, resume)| Message::Open {
            mode: OpenMode::ReadWrite,
            name: name.leak(),
            resume: resume.then_some(Resume { session_id: 7, token: [7; TOKEN_LEN] }),
        }),
        any::<(u64, [u8; TOKEN_LEN])>().prop_map(|(session_id, token)| Message::Join { session_id, token }),
        vec(range, 0..20).prop_map(|r| Message::Flush(Flush::Ranges(r.leak()))),
        Just(Message::Flush(Flush::All)),
        Just(Message::Stats),
        Just(Message::Close),
        Just(Message::Keepalive),
        ".{0,40}".prop_map(|t| Message::Error { code: ErrorCode::Busy, text: t.leak() }),
        (0u64..1 << 40, 1u64..=rblk_proto::MAX_ZERO_LEN).prop_map(|(offset, len)| Message::Discard { offset, len }),
        (0u64..1 << 40, 1u64..=rblk_proto::MAX_ZERO_LEN, 0u32..4).prop_map(|(offset, len, f)| {
            Message::WriteZeroes { offset, len, flags: rblk_proto::ZeroFlags::from_bits(f).unwrap() }
        }),
    ];
    (msg, any::<u32>()).prop_map(|(m, tag)| {
        let mut buf = vec![0u8; MSG_SIZE];
        let len = m.encode(tag, &mut buf).expect("valid messages encode");
        buf.truncate(len);
        buf
    })
}

fn arb_parser_input() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        vec(any::<u8>(), 0..=300),
        // A valid message with bytes changed, cut or extended.
        (arb_valid_bytes(), vec((any::<u16>(), any::<u8>()), 1..4), 0usize..3, any::<u8>()).prop_map(
            |(mut b, flips, how, extra)| {
                for (at, xor) in flips {
                    let i = usize::from(at) % b.len();
                    b[i] ^= xor.max(1);
                }
                match how {
                    0 => b.truncate(b.len() * 3 / 4),
                    1 => b.push(extra),
                    _ => {}
                }
                b
            }
        ),
    ]
}

#[test]
fn proto_parser() {
    fuzz(
        "proto",
        arb_parser_input(),
        Clone::clone,
        |b| Some(b.to_vec()),
        |bytes| {
            let _ = rblk_proto::peek_tag(bytes);
            if let Ok((tag, msg)) = rblk_proto::parse(bytes) {
                let mut out = vec![0u8; MSG_SIZE];
                let len =
                    msg.encode(tag, &mut out).map_err(|e| TestCaseError::fail(format!("{msg:?} re-encodes: {e}")))?;
                prop_assert_eq!(&out[..len], &bytes[..], "{:?} re-encodes differently", msg);
            }
            if let Ok(data) = rblk_proto::parse_connect_data(bytes) {
                prop_assert_eq!(rblk_proto::parse_connect_data(&data.to_bytes()), Ok(data));
            }
            Ok(())
        },
    );
}

// ----- The control state machine -----

/// The shared key of the keyed target, and host db1's own key there.
const KEY: &[u8] = b"fuzz shared key";
const DB1_KEY: &[u8] = b"fuzz db1 key";
/// Volume names OPEN picks from: the targets' volumes, and one they lack.
const VOLUMES: [&str; 3] = ["v", "acl", "nope"];
/// Host names AUTH picks from (db1 has its own key on the keyed target; acl lists both).
const HOSTS: [&str; 3] = ["db1", "web", "stranger"];

/// One control message, with session ids, tokens and MACs taken from what the target said.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
enum Msg {
    Hello(u64),
    /// A right MAC (`true`) for the connection's nonce, or a wrong one; as host `HOSTS[i]`.
    Auth(bool, Option<u8>),
    /// AUTH v2 as host `HOSTS[i]` with a MAC that proves nothing (the right one needs the
    /// connection's addresses: tests/tests/mutual.rs sends it).
    MutualAuth(u8),
    /// Mode 1-3, `VOLUMES[i]`, resume: 0 none, 1 the last session, 2 a made-up one.
    Open(u8, u8, u8),
    /// JOIN the last session (`true`) or a made-up one.
    Join(bool),
    /// FLUSH these (offset, length) ranges; none: the whole volume.
    Flush(Option<Vec<(u64, u64)>>),
    Stats,
    Close,
    Keepalive,
    /// LIST from this index.
    List(u32),
    /// A target-to-initiator message sent as a request: 0 CHALLENGE, 1 OPENED, 2 OK, 3 ERROR,
    /// 4 STATS_REPLY, 5 FLUSHED, 6 OK(AUTH) with a proof.
    Reply(u8),
    /// DISCARD (`true`) or WRITE_ZEROES with these flag bits (of 0-3), of (offset, length).
    Zero(bool, u8, u64, u64),
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
enum Op {
    Send(Msg),
    /// The message's encoding with the byte at (index mod length) XORed.
    Flip(Msg, u16, u8),
    Garbage(Vec<u8>),
    /// A new connection: 0 new session, 1 join the last session, 2 join a made-up one, 3 these
    /// bytes as connect data.
    Connect(u8, Vec<u8>),
    /// Send what follows on connection (i mod count).
    Switch(u8),
    /// Drop connection (i mod count) without CLOSE.
    Drop(u8),
}

/// A case: which target (keyed or open), and the operations.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Case {
    keyed: bool,
    ops: Vec<Op>,
}

fn arb_msg() -> impl Strategy<Value = Msg> {
    prop_oneof![
        4 => prop_oneof![Just(rblk_proto::FEATURES), Just(0u64), any::<u64>()].prop_map(Msg::Hello),
        4 => (any::<bool>(), proptest::option::of(0u8..3)).prop_map(|(good, host)| Msg::Auth(good, host)),
        2 => (0u8..3).prop_map(Msg::MutualAuth),
        4 => (1u8..=3, 0u8..3, 0u8..3).prop_map(|(m, v, r)| Msg::Open(m, v, r)),
        2 => any::<bool>().prop_map(Msg::Join),
        2 => proptest::option::of(vec((0u64..1 << 24, 1u64..1 << 23), 0..4)).prop_map(Msg::Flush),
        1 => Just(Msg::Stats),
        1 => Just(Msg::Close),
        1 => Just(Msg::Keepalive),
        1 => prop_oneof![Just(0u32), any::<u32>()].prop_map(Msg::List),
        1 => (0u8..9).prop_map(Msg::Reply),
        // Mostly whole blocks inside the 1 MiB volumes, some not.
        2 => (any::<bool>(), 0u8..4, prop_oneof![(0u64..256).prop_map(|b| b * 4096), any::<u64>()],
              prop_oneof![(1u64..64).prop_map(|b| b * 4096), 0u64..1 << 29])
            .prop_map(|(d, f, o, l)| Msg::Zero(d, f, o, l)),
    ]
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => arb_msg().prop_map(Op::Send),
        2 => (arb_msg(), any::<u16>(), 1u8..).prop_map(|(m, at, x)| Op::Flip(m, at, x)),
        1 => vec(any::<u8>(), 0..64).prop_map(Op::Garbage),
        2 => (0u8..4, vec(any::<u8>(), 0..64)).prop_map(|(k, b)| Op::Connect(k, b)),
        1 => any::<u8>().prop_map(Op::Switch),
        1 => any::<u8>().prop_map(Op::Drop),
    ]
}

/// Most cases start with a valid handshake, so that the random part also explores the open
/// states (joins, flushes, resumes, closes) and not only HELLO's neighbourhood.
fn arb_case() -> impl Strategy<Value = Case> {
    (any::<bool>(), 0u8..6, 0u8..3, 1u8..=3, 0u8..2, vec(arb_op(), 1..24)).prop_map(
        |(keyed, prelude, host, mode, volume, rest)| {
            let steps = [
                Op::Send(Msg::Hello(rblk_proto::FEATURES)),
                Op::Send(Msg::Auth(true, Some(host))),
                Op::Send(Msg::Open(mode, volume, 0)),
                Op::Connect(1, Vec::new()),
                Op::Send(Msg::Join(true)),
            ];
            let mut ops: Vec<Op> = steps.into_iter().take(usize::from(prelude)).collect();
            ops.extend(rest);
            Case { keyed, ops }
        },
    )
}

/// The two targets every case runs against, started once.
struct Targets {
    keyed: Running,
    open: Running,
}

fn start(keyed: bool) -> Running {
    let acl = [("db1".to_owned(), Grant::Exclusive), ("web".to_owned(), Grant::ReadOnly)].into();
    let volume = |name: &str| VolumeSpec { name: name.into(), size: 1 << 20, path: None };
    Server::start(Config {
        listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        fabric: Fabric::Mem,
        volumes: vec![volume("v"), volume("acl")],
        key: keyed.then(|| KEY.to_vec()),
        hosts: if keyed {
            vec![HostSpec { name: "db1".into(), key: Some(DB1_KEY.to_vec()), ..HostSpec::default() }]
        } else {
            Vec::new()
        },
        acls: [("acl".to_owned(), acl)].into(),
        // Guessing is what the fuzzer does: no holding back here.
        max_auth_delay: Duration::ZERO,
        ..Config::default()
    })
    .expect("start a fuzz target")
}

/// What the peer knows of the target's answers.
#[derive(Default)]
struct Known {
    /// The last CHALLENGE nonce per connection.
    nonces: Vec<Option<[u8; NONCE_LEN]>>,
    session: Option<(u64, [u8; TOKEN_LEN])>,
}

const OPENED: Opened = Opened {
    remote_addr: 0,
    size: 1 << 20,
    rkey: 1,
    block_size: 4096,
    max_io: 1 << 20,
    flags: VolumeFlags::empty(),
    session_id: 1,
    token: [1; TOKEN_LEN],
    instance: None,
    segments: None,
};

/// Encodes `msg` for connection `conn` into `buf`; None if it cannot be encoded (a range that
/// overflows).
fn encode(msg: &Msg, keyed: bool, conn: usize, known: &Known, buf: &mut [u8]) -> Option<usize> {
    let made_up = (0x5eed_u64, [0x5e; TOKEN_LEN]);
    let ranges: Vec<Range>;
    let message = match msg {
        Msg::Hello(f) => Message::Hello { features: *f },
        Msg::Auth(good, host) => {
            let host = host.map(|h| HOSTS[usize::from(h) % HOSTS.len()]);
            let nonce = known.nonces.get(conn).copied().flatten().unwrap_or([0; NONCE_LEN]);
            let key = if host == Some("db1") && keyed { DB1_KEY } else { KEY };
            let mac = if *good { rblk_proto::auth_mac(key, &nonce, host)? } else { [0xa5; 32] };
            Message::Auth { mac, host }
        }
        Msg::MutualAuth(host) => Message::MutualAuth {
            host: HOSTS[usize::from(*host) % HOSTS.len()],
            nonce: [0x11; NONCE_LEN],
            mac: [0xa5; 32],
        },
        Msg::Open(mode, volume, resume) => Message::Open {
            mode: OpenMode::try_from(*mode).ok()?,
            name: VOLUMES[usize::from(*volume) % VOLUMES.len()],
            resume: match resume {
                0 => None,
                1 => known.session.map(|(session_id, token)| Resume { session_id, token }),
                _ => Some(Resume { session_id: made_up.0, token: made_up.1 }),
            },
        },
        Msg::Join(good) => {
            let (session_id, token) = if *good { known.session.unwrap_or(made_up) } else { made_up };
            Message::Join { session_id, token }
        }
        Msg::Flush(None) => Message::Flush(Flush::All),
        Msg::Flush(Some(r)) => {
            ranges = r.iter().map(|&(o, l)| Range::new(o, l)).collect();
            Message::Flush(Flush::Ranges(&ranges))
        }
        Msg::Stats => Message::Stats,
        Msg::Close => Message::Close,
        Msg::Keepalive => Message::Keepalive,
        Msg::List(start) => Message::List { start: *start },
        Msg::Zero(true, _, offset, len) => Message::Discard { offset: *offset, len: *len },
        Msg::Zero(false, flags, offset, len) => Message::WriteZeroes {
            offset: *offset,
            len: *len,
            flags: rblk_proto::ZeroFlags::from_bits(u32::from(*flags) & 3)?,
        },
        Msg::Reply(k) => match k {
            0 => Message::Challenge { flags: ChallengeFlags::empty(), features: 0, nonce: [0; NONCE_LEN] },
            1 => Message::Opened(OPENED),
            2 => Message::Ok { answers: Opcode::Close },
            3 => Message::Error { code: ErrorCode::Internal, text: "from the initiator" },
            4 => Message::StatsReply(StatsReply::default()),
            6 => Message::AuthProof { target_id: [6; 16], mac: [6; 32] },
            // Issue 44's notices, which only the target sends.
            7 => Message::Resized { size: 2 << 20, segments: rblk_proto::Segments::one(0, 1, 2 << 20) },
            8 => Message::Joined { rkey: 1, segments: Some(rblk_proto::Segments::one(0, 1, 2 << 20)) },
            _ => Message::Flushed { flags: FlushedFlags::VOLATILE },
        },
    };
    message.encode(1, buf).ok()
}

/// How long a message may take to be answered; messages without an answer (KEEPALIVE, or
/// after the target ended the connection) cost this much.
const ANSWER: Duration = Duration::from_millis(100);

/// How far cases got: OPENED and OK(JOIN) replies seen (printed at the end, to see that the
/// generator reaches the open states at all).
static OPENED_SEEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static JOINED_SEEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn run_case(t: &Running, case: &Case) {
    let addr = t.local_addr();
    let mut conns: Vec<Raw> = Vec::new();
    let mut known = Known::default();
    let mut cur = 0usize;
    let connect = |data: &[u8]| Raw::connect_bytes(Fabric::Mem, addr, data, Duration::from_secs(2)).ok();
    if let Some(c) = connect(&ConnectData::NewSession.to_bytes()) {
        conns.push(c);
        known.nonces.push(None);
    }
    let mut buf = [0u8; MSG_SIZE];
    for op in &case.ops {
        let bytes: Vec<u8> = match op {
            Op::Connect(kind, data) => {
                if conns.len() >= 4 {
                    continue;
                }
                let data = match kind {
                    0 => ConnectData::NewSession.to_bytes().to_vec(),
                    1 | 2 => {
                        let (session_id, token) =
                            known.session.filter(|_| *kind == 1).unwrap_or((0x5eed, [0x5e; TOKEN_LEN]));
                        ConnectData::Join { session_id, token }.to_bytes().to_vec()
                    }
                    _ => data.clone(),
                };
                if let Some(c) = connect(&data) {
                    conns.push(c);
                    known.nonces.push(None);
                    cur = conns.len() - 1;
                }
                continue;
            }
            Op::Switch(i) => {
                if !conns.is_empty() {
                    cur = usize::from(*i) % conns.len();
                }
                continue;
            }
            Op::Drop(i) => {
                if !conns.is_empty() {
                    let i = usize::from(*i) % conns.len();
                    drop(conns.remove(i));
                    known.nonces.remove(i);
                    cur = 0;
                }
                continue;
            }
            Op::Garbage(b) => b.clone(),
            Op::Send(m) | Op::Flip(m, ..) => {
                let Some(len) = encode(m, case.keyed, cur, &known, &mut buf) else { continue };
                let mut b = buf[..len].to_vec();
                if let Op::Flip(_, at, xor) = op {
                    let i = usize::from(*at) % b.len();
                    b[i] ^= *xor;
                }
                b
            }
        };
        let Some(c) = conns.get_mut(cur) else { continue };
        if !c.try_send_bytes(&bytes) {
            continue;
        }
        if matches!(op, Op::Send(Msg::Keepalive)) {
            continue;
        }
        let reply = c.try_reply(ANSWER).unwrap_or_default();
        match rblk_proto::parse(&reply) {
            Ok((_, Message::Challenge { nonce, .. })) => known.nonces[cur] = Some(nonce),
            Ok((_, Message::Opened(o))) => {
                known.session = Some((o.session_id, o.token));
                OPENED_SEEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok((_, Message::Ok { answers: Opcode::Join })) => {
                JOINED_SEEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            _ => {}
        }
    }
}

/// The target is back where it started once the case's connections are gone: only the
/// probe's session, connection and registration, and no open mode left behind (a fresh client
/// gets an exclusive open of every volume).
fn check_baseline(t: &Running, probe: &mut Raw, keyed: bool) -> Result<(), TestCaseError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let baseline = |s: &StatsReply| (s.sessions, s.connections, s.registrations, s.pinned_bytes) == (1, 1, 1, 1 << 20);
    loop {
        let reply = probe.try_send_bytes(&stats_bytes()).then(|| probe.try_reply(Duration::from_secs(5))).flatten();
        match reply.as_deref().map(rblk_proto::parse) {
            Some(Ok((_, Message::StatsReply(s)))) if baseline(&s) => break,
            Some(Ok((_, Message::StatsReply(s)))) if Instant::now() > deadline => {
                return Err(TestCaseError::fail(format!("not back to the baseline within 10 s: {s:?}")));
            }
            Some(Ok((_, Message::StatsReply(_)))) => {}
            other => return Err(TestCaseError::fail(format!("the probe's STATS got {other:?}"))),
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for volume in ["v", "acl"] {
        let mut c = Raw::connect(Fabric::Mem, t.local_addr(), ConnectData::NewSession)
            .map_err(|e| TestCaseError::fail(format!("connect after the case: {e}")))?;
        let key = if keyed { Some(DB1_KEY) } else { None };
        c.login(key, Some("db1")).map_err(|e| TestCaseError::fail(format!("AUTH after the case: {e:?}")))?;
        c.open_with(volume, OpenMode::Exclusive, None)
            .map_err(|e| TestCaseError::fail(format!("an open mode was left behind on {volume}: {e:?}")))?;
        let _ = c.request(&Message::Close);
    }
    Ok(())
}

fn stats_bytes() -> Vec<u8> {
    let mut buf = [0u8; MSG_SIZE];
    let len = Message::Stats.encode(1, &mut buf).expect("STATS encodes");
    buf[..len].to_vec()
}

fn probe(t: &Running, keyed: bool) -> Raw {
    let mut p = Raw::connect(Fabric::Mem, t.local_addr(), ConnectData::NewSession).expect("connect the probe");
    p.login(keyed.then_some(KEY), Some("probe")).expect("the probe authenticates");
    p.open_with("v", OpenMode::ReadOnly, None).expect("the probe opens");
    p
}

#[test]
fn control_state_machine() {
    let targets = Targets { keyed: start(true), open: start(false) };
    let probes = std::sync::Mutex::new((probe(&targets.keyed, true), probe(&targets.open, false)));
    let save = |c: &Case| serde_json::to_vec_pretty(c).expect("serialize a case");
    let load = |b: &[u8]| serde_json::from_slice(b).ok();
    fuzz("control", arb_case(), save, load, |case| {
        let t = if case.keyed { &targets.keyed } else { &targets.open };
        run_case(t, case);
        let mut probes = probes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let probe = if case.keyed { &mut probes.0 } else { &mut probes.1 };
        check_baseline(t, probe, case.keyed)
    });
    let seen = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("fuzz control: {} OPENED and {} OK(JOIN) replies seen", seen(&OPENED_SEEN), seen(&JOINED_SEEN));
    assert!(seen(&OPENED_SEEN) > 0 && seen(&JOINED_SEEN) > 0, "the cases never reached an open session");
}
