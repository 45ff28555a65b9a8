//! rblk-target's limits for peers that do not play along (issue 11), driven by hand-made control
//! messages against the server in-process over the in-memory fabric.
//!
//! What each would catch:
//! - `a_connection_that_opens_nothing_is_cut`: the open timeout. Without it a connection that
//!   never sends HELLO (or stops after it) holds a QP, a thread and buffers for ever.
//! - `past_the_cap_the_oldest_idle_connection_makes_room`: the caps on connections that opened
//!   nothing, with MaxStartups-style eviction; without eviction the honest client is locked out
//!   (or without a cap, the idle ones pile up).
//! - `stats_and_a_needless_auth_are_refused`: STATS answered before OPEN (counters for anyone
//!   who can connect), and AUTH acknowledged by a target without a key.
//! - `refusals_count_and_the_last_error_arrives`: refusals that were unlimited (FLUSH before
//!   OPEN), and the last ERROR lost to the disconnect that followed its post.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use rblk_fabric::Fabric;
use rblk_proto::{ConnectData, ErrorCode, Flush, Message, OpenMode, StatsReply, MAC_LEN, MAX_MALFORMED};
use rblk_target::config::VolumeSpec;
use rblk_target::server::{Config, Running, Server};
use rblk_tests::raw::Raw;
use rblk_tests::target::{Spec, Target};

const MIB: u64 = 1 << 20;

fn serve(auth_timeout: Duration) -> Running {
    serve_with(Config { auth_timeout, ..Config::default() })
}

fn serve_with(cfg: Config) -> Running {
    Server::start(Config {
        listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        fabric: Fabric::Mem,
        volumes: vec![VolumeSpec { name: "v".into(), size: 4 * MIB, path: None }],
        ..cfg
    })
    .expect("start the in-process target")
}

fn raw(r: &Running) -> Raw {
    Raw::connect(Fabric::Mem, r.local_addr(), ConnectData::NewSession).expect("connect")
}

fn stats(r: &mut Raw) -> StatsReply {
    match rblk_proto::parse(&r.request(&Message::Stats)) {
        Ok((_, Message::StatsReply(s))) => s,
        other => panic!("STATS answered with {other:?}"),
    }
}

fn error_code(reply: &[u8]) -> ErrorCode {
    match rblk_proto::parse(reply) {
        Ok((_, Message::Error { code, .. })) => code,
        other => panic!("expected an ERROR, got {other:?}"),
    }
}

/// Polls the probe's STATS until `connections` is `want`, at most `within`; how long it took.
fn connections_become(probe: &mut Raw, want: u64, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < within {
        if stats(probe).connections == want {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

#[test]
fn a_connection_that_opens_nothing_is_cut() {
    let r = serve(Duration::from_secs(1));
    let mut probe = raw(&r);
    probe.open("v", OpenMode::ReadOnly);
    // One that never says HELLO, one that stops after it.
    let _mute = raw(&r);
    let mut halfway = raw(&r);
    halfway.hello_with(rblk_proto::FEATURE_FLUSH_RANGES);
    assert_eq!(stats(&mut probe).connections, 3);
    let took = connections_become(&mut probe, 1, Duration::from_secs(5)).expect("both are cut within a few seconds");
    assert!(took >= Duration::from_millis(500), "not before the timeout: {took:?}");
    eprintln!("limits: two connections that opened nothing were cut {took:?} after the check (timeout 1 s)");
    // The probe, which opened within the timeout, is still served long after it.
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(stats(&mut probe).sessions, 1);
}

#[test]
fn past_the_cap_the_oldest_idle_connection_makes_room() {
    // Two idle connections per address at most (the in-memory fabric's peers share one).
    let r = serve_with(Config { max_unopened_per_addr: 2, max_unopened: 8, ..Config::default() });
    let mut probe = raw(&r);
    probe.open("v", OpenMode::ReadOnly);
    let (_a, _b, _c) = (raw(&r), raw(&r), raw(&r));
    // The third idle one evicted the first: probe + two.
    connections_become(&mut probe, 3, Duration::from_secs(5)).expect("the oldest idle connection was evicted");
    // An honest client still gets in while the "attacker" holds its cap (it evicts the next
    // oldest idle one), and once open it is not idle any more: further idle connections do not
    // evict it.
    let mut honest = raw(&r);
    honest.open("v", OpenMode::ReadOnly);
    let (_d, _e) = (raw(&r), raw(&r));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(stats(&mut honest).sessions, 2, "the probe's and the honest client's sessions");
    assert_eq!(stats(&mut probe).connections, 4, "probe, honest client and two idle ones");
}

#[test]
fn stats_and_a_needless_auth_are_refused() {
    let r = serve(Duration::from_secs(10));
    let mut c = raw(&r);
    c.hello_with(rblk_proto::FEATURE_FLUSH_RANGES);
    assert_eq!(error_code(&c.request(&Message::Stats)), ErrorCode::NotOpen, "STATS before OPEN");
    // No key configured: CHALLENGE said AUTH is not required, so one is refused, not OK'd.
    assert_eq!(error_code(&c.request(&Message::Auth { mac: [0; MAC_LEN], host: None })), ErrorCode::Unexpected);
    // The connection still opens (two refusals are below the limit), and then STATS works.
    c.open_with("v", OpenMode::ReadOnly, None).expect("OPEN after the refusals");
    assert_eq!(stats(&mut c).sessions, 1);
}

rblk_tests::on_both_fabrics!(refusals_count_and_the_last_error_arrives);

/// Over rxe the ERROR posted just before an immediate disconnect was sometimes lost; the
/// in-memory fabric delivers a SEND inside its post, so there only the counting is at stake.
fn refusals_count_and_the_last_error_arrives(fabric: Fabric) {
    let t = Target::start(fabric, &Spec { volumes: vec![("v", 4 * MIB)], key: None });
    let connect = || Raw::connect(t.fabric(), t.addr(), ConnectData::NewSession).expect("connect");
    let mut probe = connect();
    probe.open("v", OpenMode::ReadOnly);
    let mut c = connect();
    c.hello_with(rblk_proto::FEATURE_FLUSH_RANGES);
    // Every one of them gets its ERROR, the last too, although the connection ends after it.
    for i in 0..=MAX_MALFORMED {
        assert_eq!(error_code(&c.request(&Message::Flush(Flush::All))), ErrorCode::NotOpen, "FLUSH {i} before OPEN");
    }
    connections_become(&mut probe, 1, Duration::from_secs(10)).expect("the connection ends after too many refusals");
}
