//! The Prometheus text endpoint (`--metrics ADDR:PORT`): `GET /metrics` answers the target's
//! counters, named `rblk_target_*` (counters end in `_total`), encoded by `prometheus-client`.
//! Values are read from the same counters STATS reports at each scrape, so the two never
//! disagree. The endpoint is plain HTTP on its own TCP socket (bind it to a management address):
//! one scrape at a time, with read and write timeouts, so a slow client holds nothing else up.

use std::io::{BufRead, BufReader, Read as _, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::server::Shared;

/// Flush latency buckets, in seconds: 50 us to about 13 s.
pub fn flush_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(50e-6, 2.0, 19)
}

/// The metrics text for `shared`, as a scrape returns it.
pub fn render(shared: &Shared) -> String {
    let c = &shared.counters;
    let mut reg = Registry::with_prefix("rblk_target");
    let gauge = |reg: &mut Registry, name: &str, help: &str, v: u64| {
        let g: Gauge = Gauge::default();
        g.set(i64::try_from(v).unwrap_or(i64::MAX));
        reg.register(name, help, g);
    };
    let counter = |reg: &mut Registry, name: &str, help: &str, v: u64| {
        let k: Counter = Counter::default();
        k.inc_by(v);
        reg.register(name, help, k);
    };
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    gauge(&mut reg, "sessions", "Open sessions", shared.session_count() as u64);
    gauge(&mut reg, "connections", "Live connections (queue pairs)", shared.connection_count() as u64);
    gauge(&mut reg, "registrations", "Memory registrations of volumes", load(&c.registrations));
    gauge(&mut reg, "pinned_bytes", "Bytes pinned by those registrations", load(&c.pinned_bytes));
    counter(&mut reg, "connections_accepted", "Connections accepted", load(&c.connections_accepted));
    counter(&mut reg, "sessions_opened", "Sessions opened", load(&c.sessions_opened));
    counter(&mut reg, "auth_failures", "AUTHs refused (wrong key, unknown host)", load(&c.auth_failures));
    counter(
        &mut reg,
        "refused_opens",
        "OPENs refused (access lists, caps, busy, no such volume, ...)",
        load(&c.refused_opens),
    );
    counter(&mut reg, "malformed_messages", "Malformed or refused control messages", load(&c.malformed));
    counter(&mut reg, "flushes", "FLUSH requests answered", load(&c.flushes));
    counter(
        &mut reg,
        "written_back_bytes",
        "Bytes written back to durable volumes' stores",
        load(&c.written_back_bytes),
    );
    counter(
        &mut reg,
        "writeback_failures",
        "Write-backs that failed (the volume is failed)",
        load(&c.writeback_failures),
    );
    reg.register("flush_seconds", "FLUSH latency, write-back and fdatasync included", c.flush_seconds.clone());
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
    out
}

/// Binds `addr` and serves scrapes until the target shuts down. Returns the bound address.
pub fn serve(addr: SocketAddr, shared: Arc<Shared>) -> std::io::Result<(SocketAddr, std::thread::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let thread = std::thread::Builder::new().name("rblk-metrics".into()).spawn(move || {
        while !shared.is_shutting_down() {
            match listener.accept() {
                Ok((stream, _)) => {
                    if let Err(e) = answer(stream, &shared) {
                        tracing::debug!(error = %e, "metrics scrape failed");
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(100)),
                Err(e) => {
                    tracing::warn!(error = %e, "metrics accept failed");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    })?;
    Ok((bound, thread))
}

fn answer(stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut reader = BufReader::new(stream.try_clone()?).take(8192);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    // The rest of the header, up to the empty line (bounded by `take`).
    let mut line = String::new();
    while reader.read_line(&mut line)? > 0 && line != "\r\n" && line != "\n" {
        line.clear();
    }
    let mut parts = request.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, body) = match (method, path) {
        ("GET", "/metrics") => ("200 OK", render(shared)),
        ("GET", _) => ("404 Not Found", "only /metrics is here\n".to_owned()),
        _ => ("405 Method Not Allowed", "GET /metrics\n".to_owned()),
    };
    let mut out = stream;
    write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    out.flush()
}
