//! rblk-metrics: the one HTTP endpoint behind every `--metrics ADDR:PORT` of rblk (the target's
//! `rblk_target_*`, the initiator front ends' `rblk_initiator_*`). `GET /metrics` answers the
//! text a caller's closure renders at each scrape; other paths get 404, other methods 405.
//!
//! ```no_run
//! let endpoint = rblk_metrics::Endpoint::serve("127.0.0.1:9442".parse()?, || "up 1\n".to_owned())?;
//! println!("scrape http://{}/metrics", endpoint.local_addr());
//! endpoint.stop(); // wakes the accept, joins the thread
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! One thread, blocked in accept(2) while no scraper is connected; one scrape at a time, with
//! one deadline for the whole exchange (request line, headers and answer, as Go's
//! `ReadHeaderTimeout` plus `WriteTimeout` bound node_exporter's) and a bounded request, so a
//! client that connects and says nothing, trickles a byte at a time, or sends garbage, holds it
//! up for at most [`TIMEOUT`] and breaks nothing. Plain HTTP: bind it to
//! a management address. Dropping the [`Endpoint`] stops it: shutdown(2) of the listening socket
//! wakes the accept, and the thread is joined.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::io::{BufRead, BufReader, Read as _, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long one scrape may take in all: from its accept to the last byte of the answer.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// The largest request (request line and headers) read.
const MAX_REQUEST: u64 = 8192;

/// The content type of Prometheus' text format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A running endpoint: see the [crate documentation](crate).
#[derive(Debug)]
pub struct Endpoint {
    addr: SocketAddr,
    listener: Arc<TcpListener>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Endpoint {
    /// Binds `addr` (port 0 picks one: see [`local_addr`](Self::local_addr)) and serves
    /// `render()` at `GET /metrics` on a thread of its own until stopped.
    pub fn serve(addr: SocketAddr, render: impl Fn() -> String + Send + 'static) -> std::io::Result<Endpoint> {
        let listener = Arc::new(TcpListener::bind(addr)?);
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s) = (Arc::clone(&listener), Arc::clone(&stop));
        let thread = std::thread::Builder::new().name("rblk-metrics".into()).spawn(move || {
            loop {
                let accepted = l.accept();
                if s.load(Ordering::Acquire) {
                    return;
                }
                match accepted {
                    Ok((stream, peer)) => {
                        if let Err(e) = answer(stream, &render) {
                            tracing::debug!(%peer, error = %e, "metrics scrape failed");
                        }
                    }
                    Err(e) => {
                        // Out of descriptors and the like: try again shortly.
                        tracing::warn!(error = %e, "metrics accept failed");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        })?;
        Ok(Endpoint { addr, listener, stop, thread: Some(thread) })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving (a scrape in progress finishes first) and joins the thread.
    pub fn stop(self) {}
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the blocked accept (it fails with EINVAL); the thread then sees the flag.
        if let Err(e) = nix::sys::socket::shutdown(self.listener.as_raw_fd(), nix::sys::socket::Shutdown::Both) {
            tracing::warn!(error = %e, "stopping the metrics endpoint: shutdown failed");
            return;
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A stream whose every read and write may only use what is left until one deadline: the
/// socket timeout is set to the time remaining before each call, so a peer trickling bytes
/// cannot stretch the exchange past it.
struct Timed<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
}

impl Timed<'_> {
    fn remaining(&self) -> std::io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the scrape's deadline passed"));
        }
        Ok(left)
    }
}

impl std::io::Read for Timed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.stream.set_read_timeout(Some(self.remaining()?))?;
        (&mut &*self.stream).read(buf)
    }
}

impl Write for Timed<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.set_write_timeout(Some(self.remaining()?))?;
        (&mut &*self.stream).write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One scrape: the request line, the headers up to the empty line, then the answer, all
/// within [`TIMEOUT`] of its accept.
fn answer(stream: TcpStream, render: &impl Fn() -> String) -> std::io::Result<()> {
    let deadline = Instant::now() + TIMEOUT;
    let mut reader = BufReader::new(Timed { stream: &stream, deadline }).take(MAX_REQUEST);
    // Bytes, not text: a request that is not UTF-8 is answered 405 or 400 like any other.
    let mut request = Vec::new();
    reader.read_until(b'\n', &mut request)?;
    let mut line = Vec::new();
    while reader.read_until(b'\n', &mut line)? > 0 && line != b"\r\n" && line != b"\n" {
        line.clear();
    }
    let request = String::from_utf8_lossy(&request);
    let mut parts = request.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, body) = match (method, path, parts.next()) {
        (_, _, None) | ("", _, _) => ("400 Bad Request", "expected GET /metrics HTTP/1.1\n".to_owned()),
        ("GET", "/metrics", _) => ("200 OK", render()),
        ("GET", _, _) => ("404 Not Found", "only /metrics is here\n".to_owned()),
        _ => ("405 Method Not Allowed", "GET /metrics\n".to_owned()),
    };
    let mut out = Timed { stream: &stream, deadline };
    write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    out.flush()
}

#[cfg(test)]
mod tests {
    //! What each would catch:
    //! - `answers_scrapes_and_refuses_the_rest`: a wrong status for bad paths, methods and
    //!   garbage, or a body that is not the render's.
    //! - `survives_clients_that_vanish_or_stall`: an endpoint that a client which connects and
    //!   goes away, or sends half a request and stalls, or sends a huge line, leaves dead or
    //!   stuck (the next scrape must still be answered).
    //! - `stop_joins_a_blocked_accept`: a stop that hangs (an accept nobody wakes) or leaves
    //!   the port served.

    use super::*;
    use std::net::{Ipv4Addr, Shutdown};
    use std::time::Instant;

    fn endpoint() -> Endpoint {
        let n = std::sync::atomic::AtomicU64::new(0);
        Endpoint::serve((Ipv4Addr::LOCALHOST, 0).into(), move || {
            format!("scrapes_total {}\n", n.fetch_add(1, Ordering::Relaxed) + 1)
        })
        .unwrap()
    }

    fn send(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(request).unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text
    }

    #[test]
    fn answers_scrapes_and_refuses_the_rest() {
        let e = endpoint();
        let ok = send(e.local_addr(), b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains(CONTENT_TYPE), "{ok}");
        assert!(ok.ends_with("\r\n\r\nscrapes_total 1\n"), "{ok}");
        assert!(send(e.local_addr(), b"GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(send(e.local_addr(), b"POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        assert!(send(e.local_addr(), b"\x16\x03\x01 garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
        assert!(send(e.local_addr(), b"\xff\xfe /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        assert!(send(e.local_addr(), b"\r\n\r\n").starts_with("HTTP/1.1 400"));
        assert!(send(e.local_addr(), b"GET\r\n\r\n").starts_with("HTTP/1.1 400"));
        // Only the one real scrape rendered.
        assert!(send(e.local_addr(), b"GET /metrics HTTP/1.0\r\n\r\n").ends_with("scrapes_total 2\n"));
    }

    #[test]
    fn survives_clients_that_vanish_or_stall() {
        let e = endpoint();
        let at = e.local_addr();
        // Connects and goes away at once.
        drop(TcpStream::connect(at).unwrap());
        // Half a request, then gone without reading the answer.
        let mut half = TcpStream::connect(at).unwrap();
        half.write_all(b"GET /metr").unwrap();
        half.shutdown(Shutdown::Write).unwrap();
        drop(half);
        // A line longer than the bound, without an end.
        let mut long = TcpStream::connect(at).unwrap();
        let _ = long.write_all(&vec![b'A'; 64 << 10]);
        drop(long);
        // Stalls: connected, says nothing; the endpoint gives up on it after TIMEOUT.
        let stalled = TcpStream::connect(at).unwrap();
        let started = Instant::now();
        let ok = send(at, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(started.elapsed() < TIMEOUT * 3, "a stalled client held the endpoint for {:?}", started.elapsed());
        drop(stalled);
        assert!(send(at, b"GET /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200"));
    }

    /// Would catch a timeout per read instead of one deadline per scrape: a client that sends a
    /// byte every 500 ms (each read well within TIMEOUT) held the only thread for as long as it
    /// kept trickling (10 s here; hours in the wild).
    #[test]
    fn a_trickling_client_is_cut_at_the_deadline() {
        let e = endpoint();
        let at = e.local_addr();
        let trickler = std::thread::spawn(move || {
            let mut s = TcpStream::connect(at).unwrap();
            let started = Instant::now();
            for b in b"GET /metrics HTTP/1.1\r\nX-Slow: ".iter().chain(std::iter::repeat(&b'a')) {
                if s.write_all(&[*b]).is_err() || started.elapsed() > Duration::from_secs(10) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            started.elapsed()
        });
        std::thread::sleep(Duration::from_millis(200)); // the trickler is being served
        let started = Instant::now();
        let ok = send(at, b"GET /metrics HTTP/1.1\r\n\r\n");
        let waited = started.elapsed();
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(waited < TIMEOUT + Duration::from_secs(1), "a trickling client held the endpoint for {waited:?}");
        let trickled = trickler.join().unwrap();
        assert!(trickled < Duration::from_secs(10), "the trickler was never cut off ({trickled:?})");
    }

    #[test]
    fn stop_joins_a_blocked_accept() {
        let e = endpoint();
        let at = e.local_addr();
        std::thread::sleep(Duration::from_millis(50)); // blocked in accept by now
        let started = Instant::now();
        e.stop();
        assert!(started.elapsed() < Duration::from_secs(1), "stop took {:?}", started.elapsed());
        assert!(TcpStream::connect(at).is_err(), "still listening after stop");
    }
}
