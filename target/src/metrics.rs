//! The Prometheus text endpoint (`--metrics ADDR:PORT`): `GET /metrics` answers the target's
//! counters, named `rblk_target_*` (counters end in `_total`), encoded by `prometheus-client`.
//! Values are read from the same counters STATS reports at each scrape, so the two never
//! disagree. The HTTP side is [`rblk_metrics::Endpoint`], the same as the initiator's.

use std::sync::atomic::Ordering;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::registry::Shared;

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
    gauge(&mut reg, "windows", "Memory windows bound (one per QP of sessions that use them)", load(&c.windows));
    counter(&mut reg, "connections_accepted", "Connections accepted", load(&c.connections_accepted));
    counter(&mut reg, "sessions_opened", "Sessions opened", load(&c.sessions_opened));
    counter(&mut reg, "auth_failures", "AUTHs refused (wrong key, unknown host)", load(&c.auth_failures));
    counter(
        &mut reg,
        "refused_opens",
        "OPENs refused (access lists, caps, busy, no such volume, ...)",
        load(&c.refused_opens),
    );
    counter(&mut reg, "refused_joins", "JOINs refused by a JOIN cap", load(&c.refused_joins));
    counter(
        &mut reg,
        "crowded_connects",
        "connect requests refused at once (random early drop among connections not yet authenticated)",
        load(&c.crowded),
    );
    counter(
        &mut reg,
        "busy_connects",
        "connect requests rejected busy (admitting others would have kept them waiting over 2 s), told when to come back",
        load(&c.busy_connects),
    );
    counter(&mut reg, "malformed_messages", "Malformed or refused control messages", load(&c.malformed));
    counter(&mut reg, "flushes", "FLUSH requests answered", load(&c.flushes));
    counter(
        &mut reg,
        "device_events",
        "Asynchronous events of the RDMA devices (port up or down, QP and CQ errors: each is logged)",
        load(&c.device_events),
    );
    counter(&mut reg, "keepalives_sent", "KEEPALIVEs sent, on every connection", load(&c.keepalives_sent));
    counter(
        &mut reg,
        "keepalives_received",
        "KEEPALIVEs received, on every connection (with session keepalives, JOINed connections carry none)",
        load(&c.keepalives_received),
    );
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
    counter(
        &mut reg,
        "window_dealloc_failures",
        "Memory windows whose deallocation failed (their connections were disconnected)",
        load(&c.window_dealloc_failures),
    );
    // Per volume: its size and memory segments (a grow changes both), and what DISCARD and
    // WRITE_ZEROES zeroed.
    type PerVolume = prometheus_client::metrics::family::Family<Vec<(String, String)>, Counter>;
    type PerVolumeGauge = prometheus_client::metrics::family::Family<Vec<(String, String)>, Gauge>;
    let (discarded, zeroed) = (PerVolume::default(), PerVolume::default());
    let (size, segments) = (PerVolumeGauge::default(), PerVolumeGauge::default());
    for v in shared.catalog().volumes.values() {
        let label = vec![("volume".to_owned(), v.name.clone())];
        discarded.get_or_create(&label).inc_by(load(&v.zeroed.discarded));
        zeroed.get_or_create(&label).inc_by(load(&v.zeroed.zeroed));
        size.get_or_create(&label).set(i64::try_from(v.size()).unwrap_or(i64::MAX));
        segments.get_or_create(&label).set(v.segment_count() as i64);
    }
    reg.register(
        "volume_size_bytes",
        "Size of each served volume in bytes (it grows with rblk-target admin resize or a reload)",
        size,
    );
    reg.register("volume_segments", "Memory segments of each served volume (one more per grow, at most 8)", segments);
    reg.register("discarded_bytes", "Bytes DISCARD zeroed (and gave back where durable), per volume", discarded);
    reg.register("zeroed_bytes", "Bytes WRITE_ZEROES zeroed, per volume", zeroed);
    reg.register("flush_seconds", "FLUSH latency, write-back and fdatasync included", c.flush_seconds.clone());
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
    out
}
