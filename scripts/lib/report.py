"""What the guest scripts' python shares: the host-side summaries (compare-rxe.sh, ab-attach.sh,
timeline-rxe.sh) and the one reader of rblk-bench's JSON report (also in the guest, for
timeline-rxe.sh and soak-reconnect.sh). Their embedded python finds it through
scripts/lib/script.sh's lib_python (PYTHONPATH=scripts/lib)."""
import os
import platform


def host_info():
    """The host's CPU model, CPU count and kernel release, for the JSON summaries."""
    cpu_model = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu_model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    return {"cpu": cpu_model, "cpus": os.cpu_count(), "kernel": platform.release()}


# rblk-bench's latency figures in the tables: its earlier layout's names, fio's percentiles.
BENCH_PCT = {"p50": "50.000000", "p90": "90.000000", "p99": "99.000000", "p99_9": "99.900000",
             "p99_99": "99.990000"}


def bench_report(doc):
    """rblk-bench's JSON report in the shape the scripts read: {"total": {"iops"}, "read"/"write":
    {"lat_us": {"p50", ...} | None}, "cpu", "target_cpu", "verify"}. Its fio layout (-o json, one
    entry with --group_reporting) is converted, and a job's error (84: --verify found bad blocks)
    raises; its earlier layout (--json: guest.logs of earlier runs, read again by --redraw), the
    merge of two processes and raw-lat's report already have that shape."""
    if "jobs" not in doc:
        return doc
    jobs = doc["jobs"]
    if len(jobs) != 1:
        raise ValueError(f"{len(jobs)} job entries in rblk-bench's report (--group_reporting makes one)")
    job = jobs[0]
    if job.get("error"):
        raise ValueError(f"rblk-bench reports error {job['error']}")
    out = {"total": {"iops": float(job["read"]["iops"]) + float(job["write"]["iops"])}}
    for d in ("read", "write"):
        c = job[d]["clat_ns"]
        lat = None
        if c.get("N"):
            lat = {k: c["percentile"][v] / 1000.0 for k, v in BENCH_PCT.items()}
            lat.update(min=c["min"] / 1000.0, mean=c["mean"] / 1000.0, max=c["max"] / 1000.0)
        out[d] = {"lat_us": lat}
    section = doc["rblk"]["sections"][0]
    out["cpu"], out["target_cpu"], out["verify"] = section.get("cpu"), section.get("target_cpu"), section.get("verify")
    return out
