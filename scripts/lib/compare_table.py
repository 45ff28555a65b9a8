"""scripts/compare-rxe.sh's tables (part of scripts/lib/compare.py's analysis): the rows as text."""
import statistics

from compare_log import BLOCK_PATHS, PATHS

GUEST_CPU_NOTE = (
    "guest us/IO: busy time of all vCPUs (/proc/stat: user+nice+system+irq+softirq+steal) over a window "
    "inside the run's measured part (from 1.5 s after its start, SECS-1 s long, at least 1 s) / the I/Os "
    "completed in that window (the device's /sys/block/DEV/stat; for rblk-bench its IOPS x the window): "
    "everything the guest spent per I/O, fio's own share included. vCPU busy: that busy time / all vCPUs' "
    "time. q sleeps/IO: voluntary context switches of the rblk-q* queue threads per I/O in the window.")


def fmt(x, unit):
    return f"{x:,.0f}" if unit == "ops/s" else f"{x:,.1f}"


def cell(xs, unit):
    """A table cell: the median of the rounds' figures and, for more than one, their min-max."""
    if len(xs) == 1:
        return fmt(xs[0], unit)
    return f"{fmt(statistics.median(xs), unit)} ({fmt(min(xs), unit)}-{fmt(max(xs), unit)})"


def verdict(met):
    return "n/a" if met is None else ("met" if met else "MISSED")


def workload_table(rows):
    """The first table's lines: rblk-bench against perftest."""
    head = (f"{'workload':<44} {'unit':<6} {'perftest median (min-max)':>27} {'rblk median (min-max)':>27} "
            f"{'rblk/pt':>8}  {'goal':<14} {'target cpu':>10} {'rblk cpu':>9}")
    out = [head, "-" * len(head)]
    for label, unit, pts, rb, ratio, op, goal, met, share, own, errs in rows:
        g = "" if goal is None else f"{op} {goal} {verdict(met)}"
        s = "" if share is None else f"{share * 100:.2f}%"
        o = "" if own is None else f"{own * 100:.0f}%"
        pc = cell(pts, unit) if pts else "FAILED"
        rc = cell(rb, unit) if rb else "FAILED"
        rt = "-" if ratio is None else f"{ratio:.3f}"
        out.append(f"{label:<44} {unit:<6} {pc:>27} {rc:>27} {rt:>8}  {g:<14} {s:>10} {o:>9}".rstrip())
        for e in errs:
            out.append(f"      error: {e[:150]}")
    return out


def block_table(rows):
    """The second table's lines: every block device path, with the note on guest CPU."""
    head = (f"{'block device: fio 4k, 1 job, libaio, direct':<46} {'unit':<6} {'median (min-max)':>25} "
            f"{'/nvmeof':>7} {'/bench':>7} {'guest us/IO':>11} {'vCPU busy':>9} {'q sleeps/IO':>11} "
            f"{'target cpu':>10}  goal")
    out = [head, "-" * len(head)]
    names = dict(BLOCK_PATHS + [("rblk_bench", "rblk-bench (its rows above)")])
    for label, unit, paths, figs, spreads, status, errs, _, goal_list, shares, gc in rows:
        out.append(label)
        for path in paths + ["rblk_bench"]:
            name = f"  {'bench' if path == 'rblk_bench' else path:<12} {names[path]}"
            vn = vb = gu = gb = qs = "-"
            if figs.get(path) is None:
                c = status[path] if status[path] != "failed" else "FAILED"
            else:
                c = cell(spreads[path], unit)
                rn = 1.0 if path == "nvmeof" else (figs[path] / figs["nvmeof"] if figs.get("nvmeof") else None)
                rb = figs[path] / figs["rblk_bench"] if figs.get("rblk_bench") else None
                vn = "-" if rn is None else f"{rn:.3f}"
                vb = "-" if rb is None else f"{rb:.3f}"
                g = gc.get(path) or {}
                if g.get("us_per_io") is not None:
                    gu, gb = f"{g['us_per_io']:,.0f}", f"{g['busy_share'] * 100:.0f}%"
                if g.get("queue_sleeps_per_io") is not None:
                    qs = f"{g['queue_sleeps_per_io']:.2f}"
            goal = "; ".join(f"{x['text']} {verdict(x['met'])}" for x in goal_list if x["path"] == path)
            s = f"{shares[path] * 100:.2f}%" if path in shares else ""
            out.append(f"{name:<46} {unit:<6} {c:>25} {vn:>7} {vb:>7} {gu:>11} {gb:>9} {qs:>11} {s:>10}  {goal}".rstrip())
            for e in errs.get(path, []):
                out.append(f"      error: {e[:150]}")
    out.append(GUEST_CPU_NOTE)
    return out


def goals_table(goals_all):
    """The goals of issue 23, all in one place: (lines, how many are met)."""
    met_n = sum(1 for g in goals_all if g["met"])
    out = ["", f"goals (medians of this boot): {met_n} of {len(goals_all)} met"]
    for g in goals_all:
        r = "-" if g["ratio"] is None else f"{g['ratio']:.3f}"
        out.append(f"  {g['label']:<58} ratio {r:>7}  {verdict(g['met'])}")
    return out, met_n


def idle_share(meta):
    """The target's CPU share while idle with no session (@@meta target_idle_cpu_ns NS WALL_NS)."""
    if "target_idle_cpu_ns" not in meta:
        return None
    ns, wall = (int(x) for x in meta["target_idle_cpu_ns"].split())
    return ns / wall if wall else None


def target_cpu_lines(all_cpu, idle):
    """The line on the target's CPU during the rblk-bench runs (none without a figure)."""
    if not all_cpu:
        return []
    return [f"target CPU during rblk runs (share of one core): median {statistics.median(all_cpu) * 100:.2f}%, "
            f"max {max(all_cpu) * 100:.2f}% over {len(all_cpu)} runs"
            + (f"; idle with no session: {idle * 100:.2f}%" if idle is not None else "")]


def clocksource_text(meta):
    """The guest's clock source, and whether it changed during the rounds."""
    start, end = meta.get("clocksource_start"), meta.get("clocksource_end")
    if not start:
        return "?"
    if end and end != start:
        return f"{start}, then {end} (clock reads became system calls: rounds before and after differ)"
    return start


def blk_cpu_summary(blk_cpu):
    """path -> the target's CPU share during its fio runs: median, max and the number of runs."""
    return {p: {"median": statistics.median(blk_cpu[p]), "max": max(blk_cpu[p]), "runs": len(blk_cpu[p])}
            for p in PATHS if p in blk_cpu}


def run_lines(log, secs, rounds, bw_args, blk_cpu, complete, log_path):
    """The lines about the run under the tables: its settings and versions, the target's CPU
    during the block-device runs, the guest run's time, what was unavailable or failed, whether
    the guest finished, the notes."""
    meta = log.meta
    out = [
        f"{rounds} round(s) of {secs} s per run, interleaved; perftest bandwidth runs with '{bw_args}'; "
        f"guest kernel {meta.get('guest_kernel', '?')}, {meta.get('guest_cpus', '?')} vCPUs (qemu TCG, "
        f"idle vCPUs {meta.get('guest_idle') or 'halt'}, clock source {clocksource_text(meta)}), active MTU "
        f"{meta.get('active_mtu', '?')}; {meta.get('perftest', '')}; {meta.get('rblk_bench', '')}"]
    if blk_cpu:
        out.append("target CPU during block-device runs (share of one core, each whole fio run): "
                   + ", ".join(f"{p} median {c['median'] * 100:.2f}% max {c['max'] * 100:.2f}%"
                               for p, c in blk_cpu.items()))
    out.append(f"block devices: {meta.get('fio', 'fio ?')}; {meta.get('nvme_cli', '')}; {meta.get('nvmet', '')}")
    if meta.get("libublk_null"):
        out.append(f"libublk-null: {meta['libublk_null']}")
    out.append(f"guest run {meta.get('guest_run_secs', '?')} s (boot included), after "
               f"{meta.get('guest_lock_wait_secs', '?')} s waiting for the guest lock; host load average before "
               f"{meta.get('host_load_before', '?')}, after {meta.get('host_load_after', '?')}")
    for p, why in log.unavailable.items():
        out.append(f"unavailable: {p}: {why}")
    for x in log.fails:
        out.append(f"failed: {x['tool']} {x['workload']} (round {x['round']}): {x['error']}")
    if not complete:
        why = ""
        if meta.get("guest_exit_status"):
            why = (f": the guest run failed (exit status {meta['guest_exit_status']}; "
                   f"{meta.get('guest_failure') or '?'})")
        out.append(f"INCOMPLETE{why}; the rows after the last one it reported did not run (see {log_path})")
    for n in log.notes:
        out.append(f"note: {n}")
    return out
