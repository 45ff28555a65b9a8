"""The text and summary.json of scripts/timeline-rxe.sh's analysis (timeline.py): one overview row
per path, each path's stages, the footer, and the summary's document."""


def f1(x):
    """A microsecond figure: n/a, one decimal, or thousands without."""
    return "n/a" if x is None else (f"{x:,.0f}" if x >= 1000 else f"{x:.1f}")


HEAD = (f"{'path':<8} {'I/Os':>5}  {'total med us':>12}  {'app med us':>10}  {'io_uring_enter/IO':>17}  "
        f"{'switches/IO (invol.)':>20}  {'fio switches/IO':>15}  {'untraced-ish p50':>16}")


def overview_row(p, r):
    """A path's line of the first table: I/Os, total and app medians, io_uring_enter, switches
    (involuntary), fio's switches per I/O and the run's own p50; or its error."""
    if "error" in r:
        return f"{p:<8} failed: {r['error']}"
    tb, ta = r["total_block_us"], r["total_app_us"]
    p50 = r["fio_p50_us"] if r["fio_p50_us"] is not None else r["bench_p50_us"]
    return (f"{p:<8} {r['ios']:>5}  {f1(tb['median_us'] if tb else None):>12}  "
            f"{f1(ta['median_us'] if ta else None):>10}  {r['io_uring_enter_per_io']:>17.2f}  "
            f"{r['switches_per_io']:>12.2f} ({r['involuntary_switches_per_io']:.2f})  "
            f"{'n/a' if r['fio_switches_per_io'] is None else format(r['fio_switches_per_io'], '.2f'):>15}  "
            f"{(f1(float(p50)) if p50 not in (None, '') else 'n/a'):>16}")


def stage_line(s):
    """A boundary's line of a path's table: median, mean (or why it is missing) and seen share."""
    if s["first"]:
        val, mean = "start", ""
    elif "missing" in s:
        val, mean = "n/a", s["missing"]
    else:
        val, mean = f1(s.get("median_us")), f1(s.get("mean_us"))
    return f"  {s['stage']:<62} {val:>9} {mean:>8} {s['seen_share'] * 100:>5.0f}%"


def path_section(p, r):
    """A path's own table: its title, I/Os and serving thread, a line per boundary, its system
    calls and io_uring events per I/O and rxe's worker's wakeup."""
    out = ["", f"{p}: {r['title']}"]
    out.append(f"  {r['ios']} I/Os analysed; device {r['device'] or '-'}; serving thread {r['serving_thread']['tid']} "
               f"({r['serving_thread']['comm']}); {r['trace_events']} trace events")
    out.append(f"  {'boundary (stage = time since the previous boundary seen)':<62} "
               f"{'median us':>9} {'mean us':>8} {'seen':>6}")
    out.extend(stage_line(s) for s in r["stages"])
    sc = ", ".join(f"{k} {v:.2f}" for k, v in list(r["syscalls_per_io"].items())[:8]) or "none traced"
    out.append(f"  serving thread's system calls per I/O: {sc}")
    iu = ", ".join(f"{k[9:]} {v:.2f}" for k, v in r["io_uring_events_per_io"].items()) or "none"
    out.append(f"  io_uring events per I/O: {iu}")
    w = r.get("rxe_worker")
    if w:
        def med(x):
            return "n/a" if not x else f1(x["median_us"])
        out.append(f"  rxe's first work item ran on a vCPU idle at the post for {w['idle_share'] * 100:.0f}% of I/Os; "
                   f"post -> that item starts: median {med(w['from_idle_us'])} us from idle, "
                   f"{med(w['from_busy_us'])} us otherwise; idle for a median {med(w['idle_before_post_us'])} us "
                   "before the post")
    return out


def footer(meta, fails, log_path):
    """The closing lines: the guest, trace clock and kprobes; INCOMPLETE when the guest did not
    finish; the failures."""
    out = ["", f"guest kernel {meta.get('guest_kernel', '?')}, {meta.get('guest_cpus', '?')} vCPUs (qemu TCG); "
           f"trace clock {meta.get('trace_clock', '?')}; "
           f"kprobes set: {meta.get('kprobes', '').strip() or 'none'}; "
           f"missing: {meta.get('kprobes_missing', '').strip() or 'none'}; "
           f"guest run {meta.get('guest_run_secs', '?')} s"]
    if meta.get("complete") != "yes":
        out.append("INCOMPLETE: the guest did not finish (see " + log_path + ")")
    out.extend(f"failed: {x['path']}: {x['error']}" for x in fails)
    return out


def table(results, meta, fails, log_path):
    """table.txt's text (no final newline)."""
    out = ["QD1 4 KiB randread, one I/O at a time, from the guest kernel's trace (medians over the traced I/Os)",
           HEAD, "-" * len(HEAD)]
    out.extend(overview_row(p, r) for p, r in results.items())
    out.append("total: block_rq_issue -> block_rq_complete (bench: READ posted -> next READ posted); app: fio "
               "io_submit -> io_getevents returns; switches: sched_switch away from the serving thread (ublk: the "
               "queue thread; nvmeof: fio's job; bench: its I/O thread); p50: fio's / rblk-bench's own over the "
               "whole run, tracing included")
    for p, r in results.items():
        if "error" not in r:
            out.extend(path_section(p, r))
    out.extend(footer(meta, fails, log_path))
    return "\n".join(out)


def summary(results, meta, fails, date, host):
    """summary.json's document."""
    return {
        "date": date,
        "host": host,
        "guest": {"kernel": meta.get("guest_kernel"), "cpus": meta.get("guest_cpus"), "accel": "tcg"},
        "secs": meta.get("secs"), "trace_secs": meta.get("trace_secs"), "trace_clock": meta.get("trace_clock"),
        "kprobes": sorted(set(meta.get("kprobes", "").split())),
        "kprobes_missing": meta.get("kprobes_missing", "").split(),
        "io_uring_events_available": meta.get("io_uring_events", "").split(),
        "fio": meta.get("fio"), "rblk": meta.get("rblk"),
        "complete": meta.get("complete") == "yes",
        "guest_run_secs": float(meta["guest_run_secs"]) if meta.get("guest_run_secs") else None,
        "paths": results, "failures": fails,
    }
