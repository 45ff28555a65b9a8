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
use rblk_proto::{ConnectData, ErrorCode, Flush, Message, OpenMode, MAC_LEN, MAX_MALFORMED};
use rblk_target::config::VolumeSpec;
use rblk_target::server::{Config, Running, Server};
use rblk_tests::daemon::Daemon;
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
        if probe.stats().connections == want {
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
    assert_eq!(probe.stats().connections, 3);
    let took = connections_become(&mut probe, 1, Duration::from_secs(5)).expect("both are cut within a few seconds");
    assert!(took >= Duration::from_millis(500), "not before the timeout: {took:?}");
    eprintln!("limits: two connections that opened nothing were cut {took:?} after the check (timeout 1 s)");
    // The probe, which opened within the timeout, is still served long after it.
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(probe.stats().sessions, 1);
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
    assert_eq!(honest.stats().sessions, 2, "the probe's and the honest client's sessions");
    assert_eq!(probe.stats().connections, 4, "probe, honest client and two idle ones");
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
    assert_eq!(c.stats().sessions, 1);
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

// ----- Over rxe, against the daemon process: resources return, whatever the peer does -----

/// What the daemon holds: its threads, RDMA resources and pinned memory, and its sessions and
/// connections as STATS reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    threads: u64,
    pds: usize,
    mrs: usize,
    qps: usize,
    pin_kb: u64,
    sessions: u64,
    connections: u64,
}

fn held(d: &Daemon, probe: &mut Raw) -> Held {
    let s = probe.stats();
    Held {
        threads: d.threads(),
        pds: d.pd_count(),
        mrs: d.rdma_res("mr"),
        qps: d.rdma_res("qp"),
        pin_kb: d.vm_pin_kb(),
        sessions: s.sessions,
        connections: s.connections,
    }
}

/// Polls until the daemon holds `want`, at most `within`: how long it took, or what it held.
fn until_held(d: &Daemon, probe: &mut Raw, want: Held, within: Duration) -> Result<Duration, Held> {
    let start = Instant::now();
    loop {
        let now = held(d, probe);
        if now == want {
            return Ok(start.elapsed());
        }
        if start.elapsed() > within {
            return Err(now);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A daemon with a 1 MiB volume `v` and `args`, and a probe holding a read-only session with
/// memory windows (the baseline everything returns to).
fn daemon_with_probe(args: &[&str]) -> (Daemon, Raw, Held) {
    let mut all = vec!["--volume", "v:1M"];
    all.extend_from_slice(args);
    let d = Daemon::start(&rblk_tests::rxe::rdma(), &all);
    // A session with memory windows: the target's window domain (a PD) and the volume's
    // registration for windows, made at the first such session and kept while the volume is
    // served, are then part of the baseline; a windowed initiator below would add them otherwise.
    let mut probe = Raw::connect(Fabric::Verbs, d.addr, ConnectData::NewWindowSession).expect("connect the probe");
    probe.open("v", OpenMode::ReadOnly);
    let base = held(&d, &mut probe);
    eprintln!("limits: baseline {base:?}");
    (d, probe, base)
}

/// Catches idle connections (no HELLO, or no OPEN) held for as long as the peer likes, and a
/// cap that locks honest clients out: before, 50 such connections were all held indefinitely,
/// each with a thread, a QP, a PD and registered buffers.
#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn rxe_idle_connections_are_capped_and_cut_and_honest_clients_get_in() {
    let (d, mut probe, base) = daemon_with_probe(&["--open-timeout", "3"]);
    let (mut idle, mut peak, mut refused) = (Vec::new(), 0, 0);
    for i in 0..200 {
        match Raw::connect(Fabric::Verbs, d.addr, ConnectData::NewSession) {
            Ok(r) => idle.push(r),
            Err(_) => refused += 1,
        }
        if i % 10 == 9 {
            peak = peak.max(probe.stats().connections);
        }
    }
    let last_connect = Instant::now();
    eprintln!("limits: 200 idle connects ({refused} failed); at most {peak} connections held (probe included)");
    // The probe, the cap, and the connections just evicted, which STATS counts until their
    // threads have torn them down: one, or a few on a loaded host (a fresh-clone CI run saw 19
    // with host builds beside it). Without the cap some 100 would be held (3 s at ~30 ms per
    // connect).
    let bound = 4 + rblk_target::server::MAX_UNOPENED_PER_ADDR as u64;
    assert!(peak <= bound, "the per-address cap holds: {peak} connections held, more than {bound}");
    // While the "attacker" holds its cap, an honest client from the same address gets in.
    let opts = rblk_initiator::Options { fabric: Fabric::Verbs, ..rblk_initiator::Options::default() };
    let honest = rblk_initiator::Session::connect(&format!("rblk://{}/v", d.addr), &opts)
        .and_then(|s| s.open(OpenMode::ReadOnly))
        .expect("an honest client gets in past the idle connections");
    drop(honest);
    until_held(&d, &mut probe, base, Duration::from_secs(20))
        .unwrap_or_else(|h| panic!("not back to the baseline: {h:?} (baseline {base:?})"));
    eprintln!(
        "limits: back to the baseline {:?} after the last idle connect (open timeout 3 s)",
        last_connect.elapsed()
    );
    drop(idle);
}

/// Catches sessions kept by a target that only reaps on a goodbye: before, 200 connections
/// dropped after OPEN, 100 of them keeping their cm_ids, left 100 sessions, +100 threads and
/// 1.6 GB VmPin 60 s later. Half of these vanish (QP to error, no disconnect request, cm_id
/// kept): only the target's own loss detection can reap them.
#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn rxe_dropped_and_vanished_sessions_return_to_the_baseline() {
    let (d, mut probe, base) = daemon_with_probe(&[]);
    let mut vanished = Vec::new();
    for i in 0..60 {
        let mut r = Raw::connect(Fabric::Verbs, d.addr, ConnectData::NewSession).expect("connect");
        r.open("v", OpenMode::ReadWrite);
        if i % 2 == 0 {
            drop(r);
        } else {
            r.ep.vanish();
            vanished.push(r);
        }
    }
    let peak = held(&d, &mut probe);
    let start = Instant::now();
    eprintln!("limits: after 60 sessions (30 dropped, 30 vanished): {peak:?}");
    let within = rblk_proto::KEEPALIVE_TIMEOUT + Duration::from_secs(5);
    let took = until_held(&d, &mut probe, base, within + Duration::from_secs(10))
        .unwrap_or_else(|h| panic!("not back to the baseline: {h:?} (baseline {base:?})"));
    eprintln!("limits: back to the baseline {took:?} later (KEEPALIVE_TIMEOUT {:?})", rblk_proto::KEEPALIVE_TIMEOUT);
    assert!(start.elapsed() <= within, "reaped within KEEPALIVE_TIMEOUT and a margin: {:?}", start.elapsed());
    // Their opens went with them: an exclusive open gets in.
    let mut next = Raw::connect(Fabric::Verbs, d.addr, ConnectData::NewSession).expect("connect");
    next.hello_with(rblk_proto::FEATURE_FLUSH_RANGES);
    next.open_with("v", OpenMode::Exclusive, None).expect("no writer was left behind");
    drop(vanished);
}

/// The SEND-timeout rule alone: a peer that posts no receives gets an endless RNR (the retry
/// policy's RNR retry 7 is "for ever"), so only the target's limit on an uncompleted keepalive
/// ends it. The open timeout is set far out of the way.
#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn rxe_a_peer_that_posts_no_receives_is_cut_by_the_keepalive_send_timeout() {
    let (d, mut probe, base) = daemon_with_probe(&["--keepalive-timeout", "5", "--open-timeout", "120"]);
    let deaf = Raw::connect_without_recvs(Fabric::Verbs, d.addr, ConnectData::NewSession).expect("connect");
    let start = Instant::now();
    let took = until_held(&d, &mut probe, base, Duration::from_secs(30))
        .unwrap_or_else(|h| panic!("the deaf peer was not cut: {h:?} (baseline {base:?})"));
    eprintln!("limits: a peer without receives was cut {:?} after connecting (keepalive timeout 5 s)", start.elapsed());
    assert!(took >= Duration::from_secs(5), "not before the timeout: {took:?}");
    drop(deaf);
}

/// The silence rule alone: a SIGSTOPped initiator that promised keepalives. Its kernel QP
/// still acknowledges everything (its 16 posted receives take the target's keepalives for
/// 32 s), so only the target's silence limit ends the session within 5 s.
#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn rxe_a_stopped_initiator_is_reaped_by_its_silence() {
    use std::process::{Command, Stdio};
    let (d, mut probe, base) = daemon_with_probe(&["--keepalive-timeout", "5"]);
    let mut client = Command::new(rblk_tests::daemon::bin("rblk-test-client"))
        .args(["hammer", &format!("rblk://{}/v", d.addr), "--region", "0:65536:7"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn rblk-test-client");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(client.stdout.take().unwrap()), &mut line).unwrap();
    assert_eq!(line.trim(), "hammering");
    assert_eq!(probe.stats().sessions, 2);
    Command::new("kill").args(["-STOP", &client.id().to_string()]).status().unwrap();
    let start = Instant::now();
    let gone = (0..300).find_map(|_| {
        std::thread::sleep(Duration::from_millis(100));
        (probe.stats().sessions == 1).then(|| start.elapsed())
    });
    Command::new("kill").args(["-KILL", &client.id().to_string()]).status().unwrap();
    let _ = client.wait();
    let took = gone.expect("the stopped initiator's session was reaped");
    eprintln!("limits: a SIGSTOPped initiator's session was reaped {took:?} after the stop (keepalive timeout 5 s)");
    assert!(took >= Duration::from_secs(3) && took <= Duration::from_secs(12), "{took:?}");
    until_held(&d, &mut probe, base, Duration::from_secs(20))
        .unwrap_or_else(|h| panic!("not back to the baseline: {h:?} (baseline {base:?})"));
}

/// An in-process target with a shared key, hosts `a` and `b`, and JOIN caps of 2 per session,
/// 3 per host and 4 in all.
fn serve_join_caps() -> (Running, Vec<u8>) {
    let key = vec![7u8; 32];
    let hosts = ["a", "b"].map(|name| rblk_target::access::HostSpec { name: name.into(), key: None }).to_vec();
    let r = serve_with(Config {
        key: Some(key.clone()),
        hosts,
        max_joins_per_session: 2,
        max_joins_per_host: 3,
        max_joins: 4,
        ..Config::default()
    });
    (r, key)
}

/// HELLO, AUTH as `host`, OPEN `v` read-write: the session's first connection and its OPENED.
fn open_as(r: &Running, key: &[u8], host: &str) -> (Raw, rblk_proto::Opened) {
    let mut c = raw(r);
    c.login(Some(key), Some(host)).expect("AUTH");
    let o = c.open_with("v", OpenMode::ReadWrite, None).expect("OPEN");
    (c, o)
}

/// A further connection of `o`'s session: its JOIN's reply (kept open while the Raw lives).
fn join(r: &Running, o: &rblk_proto::Opened) -> (Raw, Vec<u8>) {
    let data = ConnectData::Join { session_id: o.session_id, token: o.token };
    let mut c = Raw::connect(Fabric::Mem, r.local_addr(), data).expect("connect a JOIN");
    let reply = c.request(&Message::Join { session_id: o.session_id, token: o.token });
    (c, reply)
}

fn joined(reply: &[u8]) -> bool {
    matches!(rblk_proto::parse(reply), Ok((_, Message::Joined { .. } | Message::Ok { .. })))
}

/// Catches JOINs counted by no cap (issue 24): one session's token let a host open hundreds
/// of QPs, each a thread, a QP and about 4 descriptors, until every other tenant's connects
/// failed. Past the per-session, per-host and total caps a JOIN gets an ERROR (out of
/// resources) naming the cap, and another host still opens a session.
#[test]
fn joins_past_the_caps_are_refused_and_another_host_gets_in() {
    let (r, key) = serve_join_caps();
    let refused = |reply: &[u8], cap: &str| match rblk_proto::parse(reply) {
        Ok((_, Message::Error { code, text })) => {
            assert_eq!(code, ErrorCode::NoResources, "{text}");
            assert!(text.contains(cap), "the refusal must name {cap}: {text}");
        }
        other => panic!("a JOIN past {cap} was answered with {other:?}"),
    };
    let mut held = Vec::new();
    // Per session: the first QP is not counted, two JOINs are.
    let (a1, o1) = open_as(&r, &key, "a");
    for _ in 0..2 {
        let (c, reply) = join(&r, &o1);
        assert!(joined(&reply), "{:?}", rblk_proto::parse(&reply));
        held.push(c);
    }
    refused(&join(&r, &o1).1, "max_joins_per_session");
    // Per host: a's second session gets one more, its fourth JOIN in all is refused.
    let (a2, o2) = open_as(&r, &key, "a");
    let (c, reply) = join(&r, &o2);
    assert!(joined(&reply));
    held.push(c);
    refused(&join(&r, &o2).1, "max_joins_per_host");
    // In all: b's session gets the fourth, then the total cap refuses b too.
    let (b1, o3) = open_as(&r, &key, "b");
    let (c, reply) = join(&r, &o3);
    assert!(joined(&reply));
    held.push(c);
    refused(&join(&r, &o3).1, "max_joins");
    // Refused JOINs took nothing: b still opens a session, and a JOIN fits once one left.
    let (_b2, _) = open_as(&r, &key, "b");
    drop(held.remove(0));
    let within = Instant::now() + Duration::from_secs(5);
    loop {
        let (c, reply) = join(&r, &o1);
        if joined(&reply) {
            held.push(c);
            break;
        }
        assert!(Instant::now() < within, "a JOIN still refused after a joined connection left");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop((a1, a2, b1, held));
    r.shutdown();
}

/// Catches `--check-config` silent about caps that need more file descriptors than
/// RLIMIT_NOFILE allows (systemd's default soft limit is 1024; the default caps need about
/// 21000): connections past the limit would fail at random instead of being refused by a cap.
#[test]
fn check_config_warns_when_the_caps_need_more_descriptors_than_the_limit() {
    let check = |caps: &str| {
        let script = format!("ulimit -n 1024 && exec \"$0\" --check-config --allow-any-host --volume v:1M {caps}");
        let out = std::process::Command::new("sh")
            .args(["-c", &script, rblk_tests::daemon::bin("rblk-target").to_str().unwrap()])
            .output()
            .expect("run rblk-target --check-config");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = check("");
    assert!(stderr.contains("warning") && stderr.contains("RLIMIT_NOFILE allows (1024)"), "{stderr}");
    let stderr = check("--max-unopened 16 --max-sessions 64 --max-joins 128");
    assert!(!stderr.contains("RLIMIT_NOFILE"), "caps that fit warned: {stderr}");
}
