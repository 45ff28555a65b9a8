"""scripts/compare-rxe.sh's analysis: the guest's log to the tables, the goals and summary.json.

    python3 scripts/lib/compare.py LOG SUMMARY_JSON TABLE_TXT TIMELINE_SCRIPT [COUNTS_SCRIPT]
    python3 scripts/lib/compare.py bench-lines REPORT_JSON      (in the guest: a run's figures)
    python3 scripts/lib/compare.py merge REPORT_JSON REPORT_JSON (in the guest: two processes' run)

The log's lines are described in scripts/lib/compare-guest.sh (@@meta, @@begin ... @@end, @@fail,
@@unavailable, @@cpu, @@gcpu, @@file ... @@endfile). The tables and summary.json's fields are
described in docs/performance.md ("How scripts/compare-rxe.sh measures"). Exit status 1 when a
goal row is missing or the guest did not finish (after the tables and summary.json are written).

The parts: compare_log.py reads the log and each run's figure, compare_rows.py makes each row's
medians, ratios and goals, compare_table.py the text; this file the parts the guest ran with other
scripts' guest parts (the QD1 timeline, the counts per I/O), summary.json and the command line. Tests: test_compare.py and test_compare_report.py, on a recorded log
(testdata/compare-guest.log).
"""
import datetime
import json
import os
import subprocess
import sys

from compare_log import BLOCK_WORKLOADS, LogError, bench_lines, merge_two, parse_log, parse_runs, settings
from compare_rows import WORKLOADS, block_row, med, workload_row
from compare_table import (block_table, blk_cpu_summary, goals_table, idle_share, run_lines, target_cpu_lines,
                           workload_table)
from report import host_info


def redraw_part(lines, tdir, script):
    """Writes another script's raw output from this boot (lines) to TDIR/guest.log and summarizes
    it with `SCRIPT --redraw TDIR/guest.log TDIR` (scripts/timeline-rxe.sh, scripts/counts-rxe.sh);
    returns its exit status."""
    os.makedirs(tdir, exist_ok=True)
    tlog = os.path.join(tdir, "guest.log")
    with open(tlog, "w") as f:
        f.write("\n".join(lines) + "\n")
    for name in ("summary.json", "table.txt"):
        try:
            os.remove(os.path.join(tdir, name))
        except FileNotFoundError:
            pass
    return subprocess.run([script, "--redraw", tlog, tdir], stdout=subprocess.DEVNULL).returncode


def timeline_section(tdir, exit_status):
    """The QD1 timeline's summary in TDIR (table.txt and summary.json of timeline-rxe.sh --redraw)
    -> (the lines under the tables, summary.json's "timeline": each path's totals)."""
    timeline = {"summary": os.path.join(tdir, "summary.json"), "exit_status": exit_status, "paths": {}}
    try:
        with open(os.path.join(tdir, "table.txt")) as f:
            ttable = f.read().rstrip("\n")
        with open(os.path.join(tdir, "summary.json")) as f:
            tdoc = json.load(f)
        for p, r in tdoc.get("paths", {}).items():
            if "error" in r:
                timeline["paths"][p] = {"error": r["error"]}
                continue
            timeline["paths"][p] = {
                "total_block_us_median": (r.get("total_block_us") or {}).get("median_us"),
                "total_app_us_median": (r.get("total_app_us") or {}).get("median_us"),
                "io_uring_enter_per_io": r.get("io_uring_enter_per_io"),
                "switches_per_io": r.get("switches_per_io"), "ios": r.get("ios"),
            }
        lines = ["", f"QD1 per-stage timeline (scripts/timeline-rxe.sh's guest part, in this boot; {tdir}):", ttable]
    except (OSError, ValueError) as e:
        timeline["error"] = f"no timeline summary: {e}"
        lines = ["", f"QD1 per-stage timeline: FAILED ({timeline['error']}; see {os.path.join(tdir, 'guest.log')})"]
    return lines, timeline


def counts_section(cdir, exit_status):
    """The counts per I/O in CDIR (table.txt and summary.json of counts-rxe.sh --redraw) -> (the
    lines under the tables, summary.json's "counts": its goals, rows, unavailable front ends and
    failed runs)."""
    counts = {"summary": os.path.join(cdir, "summary.json"), "exit_status": exit_status}
    try:
        with open(os.path.join(cdir, "table.txt")) as f:
            ctable = f.read().rstrip("\n")
        with open(os.path.join(cdir, "summary.json")) as f:
            cdoc = json.load(f)
        for k in ("goals", "rows", "unavailable", "failed"):
            counts[k] = cdoc[k]
        lines = ["", f"Counts per I/O (scripts/counts-rxe.sh's guest part, in this boot; {cdir}):", ctable]
    except (OSError, ValueError, KeyError, TypeError) as e:
        counts["error"] = f"no counts summary: {e}"
        lines = ["", f"Counts per I/O: FAILED ({counts['error']}; see {os.path.join(cdir, 'guest.log')})"]
    return lines, counts


def other_part(log, out_dir, name, script, section):
    """The part of another script's guest run in this boot, whose raw output the log holds as
    NAME-guest.log: redrawn by SCRIPT into OUT_DIR/NAME and read by SECTION -> (lines, summary
    field); (None, None) when the log has no such part and its run did not ask for one (the
    counts: a log from before they were in the comparison)."""
    if f"{name}-guest.log" in log.files and script:
        pdir = os.path.join(out_dir, name)
        return section(pdir, redraw_part(log.files.pop(f"{name}-guest.log"), pdir, script))
    if name == "counts" and "counts_secs" not in log.meta:
        return None, None
    why = f"the guest sent no {name} output" if script else f"no {name} script to summarize it with"
    return ["", f"{PART_TITLES[name]}: FAILED ({why})"], {"error": why}


PART_TITLES = {"timeline": "QD1 per-stage timeline", "counts": "Counts per I/O"}


def summarize(log, log_path, out_dir, timeline_script, counts_script=None):
    """The whole report of a parsed log: (table text, summary.json's document, missing goal rows,
    complete). Runs the timeline's and the counts' summaries into OUT_DIR/timeline and
    OUT_DIR/counts when the log has their output."""
    meta = log.meta
    secs, rounds, bw_args, hz, complete = settings(meta)
    f = parse_runs(log, secs, hz)
    rows, summary = [], {}
    for spec in WORKLOADS:
        summary[spec[0]], row = workload_row(f, spec)
        rows.append(row)
    brows, block_summary, goals_all, missing = [], {}, [], []
    for spec in BLOCK_WORKLOADS:
        block_summary[spec[0]], row = block_row(f, spec, goals_all, missing)
        brows.append(row)
    out = workload_table(rows) + [""] + block_table(brows)
    goal_lines, met_n = goals_table(goals_all)
    out += goal_lines
    all_cpu = [x for xs in f.cpu.values() for x in xs]
    idle = idle_share(meta)
    out.append("")
    out += target_cpu_lines(all_cpu, idle)
    bcpu = blk_cpu_summary(log.blk_cpu)
    out += run_lines(log, secs, rounds, bw_args, bcpu, complete, log_path)
    # The counts per I/O and the QD1 per-stage timeline: scripts/counts-rxe.sh's and
    # scripts/timeline-rxe.sh's guest parts ran in this boot; their own summaries read their raw
    # output.
    lines, counts = other_part(log, out_dir, "counts", counts_script, counts_section)
    out += lines or []
    lines, timeline = other_part(log, out_dir, "timeline", timeline_script, timeline_section)
    out += lines
    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": host_info(),
        "guest": {"kernel": meta.get("guest_kernel"), "cpus": int(meta.get("guest_cpus", "0") or 0), "accel": "tcg",
                  "idle": meta.get("guest_idle") or "halt",
                  "clocksource": [meta.get("clocksource_start"), meta.get("clocksource_end")],
                  "active_mtu": meta.get("active_mtu"), "clk_tck": hz},
        "guest_run_secs": float(meta["guest_run_secs"]) if meta.get("guest_run_secs") else None,
        "guest_lock_wait_secs": float(meta["guest_lock_wait_secs"]) if meta.get("guest_lock_wait_secs") else None,
        "complete": complete,
        "guest_exit_status": int(meta["guest_exit_status"]) if meta.get("guest_exit_status") else 0,
        "guest_failure": meta.get("guest_failure"),
        "perftest": meta.get("perftest"),
        "rblk_bench": meta.get("rblk_bench"),
        "secs": secs,
        "rounds": rounds,
        "perftest_bw_args": bw_args,
        "workloads": summary,
        "notes": log.notes,
        "target_cpu_share": {
            "median": med(all_cpu), "max": max(all_cpu) if all_cpu else None, "runs": len(all_cpu), "idle": idle,
        },
        "fio": meta.get("fio"),
        "nvme_cli": meta.get("nvme_cli"),
        "nvmet": meta.get("nvmet"),
        "libublk_null": meta.get("libublk_null"),
        "block_devices": block_summary,
        "goals": goals_all,
        "goals_met": met_n,
        "goals_total": len(goals_all),
        "missing_goal_rows": missing,
        "unavailable": log.unavailable,
        "ublk_unavailable": log.unavailable.get("ublk"),
        "failures": log.fails,
        "target_cpu_share_block": bcpu,
        "target_cpu_share_ublk": bcpu.get("ublk"),
        "timeline": timeline,
    }
    if counts is not None:
        doc["counts"] = counts
    return "\n".join(out), doc, missing, complete, rounds


def write_outputs(log, table, doc, rounds, out_dir, summary_path, table_path):
    """summary.json, table.txt, the files the guest sent and each rblk-bench report of the last
    round (for the latency CDF) into OUT_DIR."""
    with open(summary_path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    with open(table_path, "w") as f:
        f.write(table + "\n")
    for name, lines in log.files.items():
        with open(os.path.join(out_dir, name), "w") as f:
            f.write("\n".join(lines) + "\n")
    for run in log.runs:
        if run["tool"] == "rblk" and run["round"] == rounds:
            with open(os.path.join(out_dir, f"rblk-{run['workload']}.json"), "w") as f:
                f.write(run["text"].strip() + "\n")


def load(path):
    with open(path) as f:
        return json.load(f)


def main(argv):
    if len(argv) == 3 and argv[1] == "bench-lines":
        print("\n".join(bench_lines(load(argv[2]))))
        return 0
    if len(argv) == 4 and argv[1] == "merge":
        print(json.dumps(merge_two(load(argv[2]), load(argv[3]))))
        return 0
    if len(argv) not in (5, 6):
        print(f"usage: {argv[0]} LOG SUMMARY_JSON TABLE_TXT TIMELINE_SCRIPT [COUNTS_SCRIPT] | bench-lines REPORT"
              " | merge REPORT REPORT", file=sys.stderr)
        return 2
    log_path, summary_path, table_path, timeline_script = argv[1:5]
    counts_script = argv[5] if len(argv) == 6 else None
    out_dir = os.path.dirname(summary_path)
    try:
        with open(log_path, errors="replace") as f:
            log = parse_log(f)
    except LogError as e:
        print(f"compare: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"compare: error: cannot read the guest's log {log_path}: {e.strerror}", file=sys.stderr)
        return 1
    table, doc, missing, complete, rounds = summarize(log, log_path, out_dir, timeline_script, counts_script)
    print(table)
    try:
        write_outputs(log, table, doc, rounds, out_dir, summary_path, table_path)
    except OSError as e:
        print(f"compare: error: cannot write the summary into {out_dir or '.'}: {e.filename or ''}: {e.strerror}",
              file=sys.stderr)
        return 1
    if missing:
        print("compare: error: goal rows missing (a goal row is ublk, nvmeof or rblk-bench): " + "; ".join(missing),
              file=sys.stderr)
        return 1
    if not complete:
        print(f"compare: error: the guest did not finish the comparison (see {log_path})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
