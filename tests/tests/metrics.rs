//! The target's Prometheus endpoint (`--metrics`): in-process over the in-memory fabric, and the
//! daemon over rxe scraped with curl while clients run.
//!
//! What each would catch:
//! - `counters_move_with_what_happens`: a metric that is missing, misnamed (the `rblk_target_`
//!   prefix, `_total` on counters) or not moved by the event it counts (sessions, flushes and
//!   their latency, malformed messages, AUTH failures), and an endpoint that answers any path.
//! - `rxe_curl_sees_the_counters_move`: the same through the real daemon and flag, as an
//!   operator's scraper sees it.
//! - `rxe_attach_metrics_count_io_and_a_reconnect`: `rblk attach --metrics` whose counters do
//!   not move with I/O through the device (reads, writes, bytes, latency histograms), a reconnect
//!   after the target was killed and restarted that is not counted, or a connection state that
//!   does not say connected again afterwards.

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::process::Command;

use rblk_fabric::Fabric;
use rblk_proto::{ConnectData, Flush, Message, OpenMode};
use rblk_target::config::VolumeSpec;
use rblk_target::server::{Config, Server};
use rblk_tests::raw::Raw;

/// `GET path` on `addr`: the status line and the body.
fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the metrics endpoint");
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    (head.lines().next().unwrap_or_default().to_owned(), body.to_owned())
}

/// The value of the sample `name` (no labels) in a scrape.
fn value(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} in:\n{body}"))
}

#[test]
fn counters_move_with_what_happens() {
    let r = Server::start(Config {
        listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        metrics: Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)),
        fabric: Fabric::Mem,
        volumes: vec![VolumeSpec { name: "v".into(), size: 4 << 20, path: None }],
        key: Some(b"k".to_vec()),
        ..Config::default()
    })
    .unwrap();
    let at = r.metrics_addr().expect("the endpoint's address");
    let (status, before) = get(at, "/metrics");
    assert!(status.contains("200"), "{status}");
    assert_eq!(value(&before, "rblk_target_sessions"), 0.0);
    assert_eq!(value(&before, "rblk_target_flushes_total"), 0.0);

    let mut c = Raw::connect(Fabric::Mem, r.local_addr(), ConnectData::NewSession).unwrap();
    c.login(Some(b"k"), Some("h")).unwrap();
    c.open_with("v", OpenMode::ReadWrite, None).unwrap();
    c.request(&Message::Flush(Flush::All));
    c.request(&Message::Flush(Flush::All));
    c.send_bytes(b"not a message");
    let _ = c.reply();
    let mut wrong = Raw::connect(Fabric::Mem, r.local_addr(), ConnectData::NewSession).unwrap();
    assert!(wrong.login(Some(b"guess"), Some("h")).is_err());

    let (_, after) = get(at, "/metrics");
    assert_eq!(value(&after, "rblk_target_sessions"), 1.0);
    assert_eq!(value(&after, "rblk_target_sessions_opened_total"), 1.0);
    assert_eq!(value(&after, "rblk_target_registrations"), 1.0);
    assert_eq!(value(&after, "rblk_target_pinned_bytes"), f64::from(4u32 << 20));
    assert_eq!(value(&after, "rblk_target_flushes_total"), 2.0);
    assert_eq!(value(&after, "rblk_target_flush_seconds_count"), 2.0);
    assert_eq!(value(&after, "rblk_target_auth_failures_total"), 1.0);
    assert!(value(&after, "rblk_target_malformed_messages_total") >= 2.0, "the garbage and the failed AUTH");
    assert_eq!(value(&after, "rblk_target_connections_accepted_total"), 2.0);
    assert!(after.contains("# HELP rblk_target_flush_seconds"), "{after}");
    let (status, _) = get(at, "/");
    assert!(status.contains("404"), "{status}");

    // A grow shows: the volume's size and its segments.
    let volume = |body: &str, name: &str| value(body, &format!("rblk_target_{name}{{volume=\"v\"}}"));
    assert_eq!((volume(&after, "volume_size_bytes"), volume(&after, "volume_segments")), (f64::from(4u32 << 20), 1.0));
    let grown = Config {
        listen: r.local_addr(),
        metrics: Some(at),
        fabric: Fabric::Mem,
        volumes: vec![VolumeSpec { name: "v".into(), size: 6 << 20, path: None }],
        key: Some(b"k".to_vec()),
        ..Config::default()
    };
    r.reload(grown).expect("the reload that grows v");
    let (_, grown) = get(at, "/metrics");
    assert_eq!((volume(&grown, "volume_size_bytes"), volume(&grown, "volume_segments")), (f64::from(6u32 << 20), 2.0));
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn rxe_curl_sees_the_counters_move() {
    let port = 9400 + (std::process::id() % 500) as u16;
    let metrics = format!("127.0.0.1:{port}");
    let d = rblk_tests::daemon::Daemon::start(&rblk_tests::rxe::rdma(), &["--volume", "v:16M", "--metrics", &metrics]);
    let curl = || {
        let out = Command::new("curl").args(["-sf", &format!("http://{metrics}/metrics")]).output().expect("run curl");
        assert!(out.status.success(), "curl failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let before = curl();
    let uri = format!("rblk://{}/v", d.addr);
    let rblk = rblk_tests::blockdev::rblk();
    rblk_tests::sh(&format!("head -c 1M /dev/urandom | {rblk} write {uri} --offset 0"));
    let bench = rblk_tests::daemon::bin("rblk-bench").display().to_string();
    rblk_tests::sh(&format!("{bench} {uri} --rw randread --runtime 2 -q"));
    let after = curl();
    eprintln!("metrics: after a write and a bench:\n{after}");
    for name in
        ["rblk_target_sessions_opened_total", "rblk_target_flushes_total", "rblk_target_connections_accepted_total"]
    {
        assert!(value(&after, name) > value(&before, name), "{name} did not move");
    }
    // Both clients are gone once their connections are torn down (asynchronously).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while value(&curl(), "rblk_target_sessions") != 0.0 {
        assert!(std::time::Instant::now() < deadline, "sessions of gone clients still counted");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// The value of the sample `name` whose labels contain `labels` (`""` for any) in a scrape.
fn labelled(body: &str, name: &str, labels: &str) -> f64 {
    body.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix('{')?;
            let (set, v) = rest.split_once("} ")?;
            set.contains(labels).then(|| v.trim().parse().ok()).flatten()
        })
        .unwrap_or_else(|| panic!("no sample {name}{{{labels}}} in:\n{body}"))
}

#[test]
#[ignore = "needs rxe and ublk_drv: run in the guest by scripts/test.sh"]
fn rxe_attach_metrics_count_io_and_a_reconnect() {
    use rblk_tests::blockdev::{attach, detach, ublk_drv};
    use rblk_tests::daemon::Daemon;
    use std::time::{Duration, Instant};
    ublk_drv();
    let dir = rblk_tests::scratch::dir();
    let image = dir.join("metrics-attach.img");
    let _ = std::fs::remove_file(&image);
    // Durable: a restarted target serves the same volume again, so the session reconnects.
    let spec = format!("v:16M:{}", image.display());
    let d = Daemon::start(&rblk_tests::rxe::rdma(), &["--volume", &spec]);
    let addr = d.addr;
    let port = 9900 + (std::process::id() % 90) as u16;
    let metrics = format!("127.0.0.1:{port}");
    let a = attach(&format!("rblk://{addr}/v"), &format!("--metrics {metrics} --reconnect-delay 1"));
    let curl = || {
        let out = Command::new("curl").args(["-sf", &format!("http://{metrics}/metrics")]).output().expect("run curl");
        assert!(out.status.success(), "curl failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let get = |body: &str, name: &str| labelled(body, name, "volume=\"v\"");
    let before = curl();
    assert_eq!(get(&before, "rblk_initiator_reconnects_total"), 0.0);
    assert_eq!(labelled(&before, "rblk_initiator_connection_state", "state=\"connected\""), 1.0);
    let dev = &a.dev;
    rblk_tests::sh(&format!("dd if=/dev/urandom of={dev} bs=64k count=16 oflag=direct conv=fsync status=none"));
    rblk_tests::sh(&format!("dd if={dev} of=/dev/null bs=64k count=16 iflag=direct status=none"));
    let io = curl();
    eprintln!("metrics after I/O:\n{io}");
    for name in ["rblk_initiator_writes_total", "rblk_initiator_reads_total", "rblk_initiator_flushes_total"] {
        assert!(get(&io, name) > get(&before, name), "{name} did not move");
    }
    assert!(get(&io, "rblk_initiator_written_bytes_total") >= f64::from(1u32 << 20));
    assert!(get(&io, "rblk_initiator_read_bytes_total") >= f64::from(1u32 << 20));
    assert!(get(&io, "rblk_initiator_write_seconds_count") > 0.0);
    assert_eq!(get(&io, "rblk_initiator_errors_total"), 0.0);

    // Everything is flushed (conv=fsync): a killed durable target loses nothing, and the
    // session reconnects to the restarted one.
    assert!(!d.kill().success());
    std::thread::sleep(Duration::from_secs(1));
    let d = Daemon::start_at(addr, &["--volume", &spec]);
    // I/O after the restart waits for the reconnect and then succeeds.
    rblk_tests::sh(&format!("dd if={dev} of=/dev/null bs=64k count=4 iflag=direct status=none"));
    let deadline = Instant::now() + Duration::from_secs(20);
    let after = loop {
        let m = curl();
        if get(&m, "rblk_initiator_reconnects_total") >= 1.0 || Instant::now() > deadline {
            break m;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    eprintln!("metrics after the restart:\n{after}");
    assert_eq!(get(&after, "rblk_initiator_reconnects_total"), 1.0);
    assert_eq!(labelled(&after, "rblk_initiator_connection_state", "state=\"connected\""), 1.0);
    assert_eq!(labelled(&after, "rblk_initiator_connection_state", "state=\"reconnecting\""), 0.0);
    assert!(get(&after, "rblk_initiator_reads_total") > get(&io, "rblk_initiator_reads_total"));
    let out = detach(dev);
    assert!(!out.contains("not flushed"), "{out}");
    drop(d);
    let _ = std::fs::remove_file(&image);
}
