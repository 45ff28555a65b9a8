//! `--metrics ADDR:PORT` of the initiator front ends (`rblk attach`, `rblk nbd`, `rblk mount`):
//! Prometheus text at `GET /metrics`, named `rblk_initiator_*` (counters end in `_total`),
//! labelled with the volume and the target (`volume="vol0"`, `target="rblk://10.0.0.1:4791/vol0"`).
//!
//! The numbers are the engine's own lock-free counters ([`EngineCounters`]), read at each scrape:
//! the I/O path takes no lock for them. A front end whose sessions come and go (`rblk nbd`, one
//! per client) adds each to [`Metrics`] and, when it closes, its final counts stay in the totals,
//! so every counter only grows. The HTTP side is [`rblk_metrics::Endpoint`], the target's too.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use rblk_initiator::engine::IoOp;
use rblk_initiator::{EngineCounters, EngineStats, Latency, LinkState, Uri};

/// The `--metrics` flag, one definition for every front end.
#[derive(Debug, Clone, clap::Args)]
pub struct MetricsArgs {
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics
    ///
    /// rblk_initiator_*: reads, writes, flushes, bytes, errors, latency histograms, reconnects,
    /// connection state. Bind it to a management or loopback address: it has no authentication.
    #[arg(long, value_name = "ADDR:PORT", value_parser = metrics_addr_arg)]
    pub metrics: Option<SocketAddr>,
}

/// `--metrics`: an address and port, said in words (not `invalid socket address syntax`).
fn metrics_addr_arg(text: &str) -> Result<SocketAddr, String> {
    text.trim()
        .parse()
        .map_err(|_| format!("--metrics takes an IP address and a port (127.0.0.1:9100, [::1]:9100), got {text:?}"))
}

impl MetricsArgs {
    /// Starts the endpoint for `metrics` if the flag asked for one.
    pub fn serve(&self, metrics: &Arc<Metrics>) -> anyhow::Result<Option<rblk_metrics::Endpoint>> {
        let Some(at) = self.metrics else { return Ok(None) };
        let m = Arc::clone(metrics);
        let endpoint = rblk_metrics::Endpoint::serve(at, move || m.render())
            .map_err(|e| anyhow::anyhow!("cannot serve metrics on {at}: {e}"))?;
        eprintln!("rblk: serving metrics at http://{}/metrics", endpoint.local_addr());
        Ok(Some(endpoint))
    }
}

/// The sessions of one volume a front end runs, live and closed: see the module documentation.
#[derive(Debug)]
pub struct Metrics {
    volume: String,
    target: String,
    live: Mutex<Vec<(u64, EngineCounters)>>,
    closed: Mutex<Totals>,
    next: AtomicU64,
}

/// Counts of sessions added up.
#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    stats: EngineStats,
    read: Latency,
    write: Latency,
    flush: Latency,
}

impl Totals {
    fn add(&mut self, c: &EngineCounters) {
        self.stats += c.stats();
        self.read += c.latency(IoOp::Read);
        self.write += c.latency(IoOp::Write);
        self.flush += c.latency(IoOp::Flush);
    }
}

/// A session counted in [`Metrics`]; dropping it (after the session closed, so that its last
/// FLUSH counts) keeps its final numbers in the totals.
#[derive(Debug)]
pub struct Counted {
    metrics: Arc<Metrics>,
    id: u64,
}

impl Drop for Counted {
    fn drop(&mut self) {
        let m = &self.metrics;
        let mut live = lock(&m.live);
        if let Some(i) = live.iter().position(|(id, _)| *id == self.id) {
            let (_, c) = live.swap_remove(i);
            lock(&m.closed).add(&c);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A latency snapshot as a Prometheus histogram.
#[derive(Debug)]
struct Histogram(Latency);

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let buckets: Vec<(f64, u64)> = self.0.buckets().collect();
        encoder.encode_histogram::<NoLabelSet>(self.0.sum().as_secs_f64(), self.0.count(), &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

impl Metrics {
    /// Metrics of the volume at `uri` (its name and target label every sample).
    pub fn new(uri: &Uri) -> Arc<Metrics> {
        Arc::new(Metrics {
            volume: uri.volume().to_owned(),
            target: uri.to_string(),
            live: Mutex::default(),
            closed: Mutex::default(),
            next: AtomicU64::new(0),
        })
    }

    /// Counts the session behind `counters` until the returned guard is dropped.
    pub fn add(self: &Arc<Self>, counters: EngineCounters) -> Counted {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.live).push((id, counters));
        Counted { metrics: Arc::clone(self), id }
    }

    /// The metrics text, as a scrape returns it.
    pub fn render(&self) -> String {
        let (mut t, states) = {
            let live = lock(&self.live);
            let mut t = *lock(&self.closed);
            let states: Vec<LinkState> = live.iter().map(|(_, c)| c.link_state()).collect();
            for (_, c) in live.iter() {
                t.add(c);
            }
            (t, states)
        };
        let labels = [("volume".into(), self.volume.clone().into()), ("target".into(), self.target.clone().into())];
        let mut reg = Registry::with_prefix_and_labels("rblk_initiator", labels.into_iter());
        let counter = |reg: &mut Registry, name: &str, help: &str, v: u64| {
            let k: Counter = Counter::default();
            k.inc_by(v);
            reg.register(name, help, k);
        };
        let s = std::mem::take(&mut t.stats);
        counter(&mut reg, "reads", "Read requests completed (failed ones included)", s.reads);
        counter(&mut reg, "writes", "Write requests completed, zeroes included (failed ones included)", s.writes);
        counter(&mut reg, "flushes", "FLUSHes sent to the target", s.flushes);
        counter(&mut reg, "flushes_skipped", "Flushes with nothing to flush (nothing sent)", s.flushes_skipped);
        counter(
            &mut reg,
            "read_modify_writes",
            "Writes of partial blocks (read, patched, written)",
            s.read_modify_writes,
        );
        counter(&mut reg, "read_bytes", "Bytes read by requests that succeeded", s.read_bytes);
        counter(&mut reg, "written_bytes", "Bytes written by requests that succeeded", s.written_bytes);
        counter(&mut reg, "discards", "DISCARD requests (trims) completed (failed ones included)", s.discards);
        counter(&mut reg, "discarded_bytes", "Bytes discarded by requests that succeeded", s.discarded_bytes);
        counter(&mut reg, "errors", "Requests that failed (reads, writes, flushes)", s.errors);
        counter(&mut reg, "reconnects", "Sessions re-established after losing the target", s.reconnects);
        counter(&mut reg, "queue_sleeps", "Waits of the queue threads that slept instead of spinning", s.sleeps);
        reg.register("read_seconds", "Read latency, submission to completion", Histogram(t.read));
        reg.register("write_seconds", "Write latency, submission to completion", Histogram(t.write));
        reg.register("flush_seconds", "FLUSH latency (sent ones)", Histogram(t.flush));
        let sessions: Gauge = Gauge::default();
        sessions.set(states.len() as i64);
        reg.register("sessions", "Open sessions to the target", sessions);
        let state: Family<Vec<(String, String)>, Gauge> = Family::default();
        for st in LinkState::ALL {
            let n = states.iter().filter(|&&s| s == st).count();
            state.get_or_create(&vec![("state".to_owned(), st.name().to_owned())]).set(n as i64);
        }
        reg.register("connection_state", "Sessions connected, reconnecting, or failed for good", state);
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
        out
    }
}
