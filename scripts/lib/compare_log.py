"""scripts/compare-rxe.sh's guest log, read (part of scripts/lib/compare.py's analysis): the
@@ lines compare-guest.sh writes, each run's figure (fio's, perftest's, rblk-bench's), and the
helpers the guest runs through compare.py (bench-lines, merge)."""
import json
import os
import re

from report import BENCH_PCT, bench_report

# Block devices through fio: the paths, what each is, and the workloads with the rblk-bench row
# (and figure) each compares with, the paths that run it and its goals: (path, reference, op, factor).
BLOCK_PATHS = [
    ("nvmeof", "Linux NVMe-oF/RDMA, null_blk"),
    ("nbd", "rblk nbd + nbd-client"),
    ("fuse", "rblk mount --loop (FUSE)"),
    ("ublk", "rblk attach --queues 1"),
    ("ublk-sleep", "rblk attach --wait sleep"),
    ("ublk-q2", "rblk attach --queues 2"),
    ("ublk-null", "rblk attach --null-io (no RDMA)"),
    ("libublk-null", "libublk examples/null (no I/O)"),
]
PATHS = [p for p, _ in BLOCK_PATHS]
QD32_GOALS = [("ublk", "nvmeof", ">=", 2.0), ("ublk", "rblk_bench", ">=", 0.75), ("ublk", "ublk-null", ">=", 0.85)]
BLOCK_WORKLOADS = [
    ("block_randread_4k_qd32", "randread 4k QD32", "ops/s", "fio_randread_4k_qd32", ("read", "iops"),
     "randread_4k_qd32", PATHS, QD32_GOALS),
    ("block_randwrite_4k_qd32", "randwrite 4k QD32", "ops/s", "fio_randwrite_4k_qd32", ("write", "iops"),
     "randwrite_4k_qd32", PATHS, QD32_GOALS),
    ("block_randread_4k_qd1_p50", "randread 4k QD1 p50", "us", "fio_randread_4k_qd1", ("read", "p50"),
     "randread_4k_qd1", [p for p in PATHS if p != "ublk-q2"],
     [("ublk", "nvmeof", "<=", 0.5), ("ublk", "rblk_bench", "<=", 1.6)]),
]
BLOCK_OF = {b[3]: b for b in BLOCK_WORKLOADS}


class LogError(ValueError):
    """A line of the guest's log that cannot be taken as compare-guest.sh writes it."""


class Log:
    """What the guest's log says, line by line: meta (@@meta KEY VALUE), runs ({"workload", "tool",
    "round", "cmd", "text"} per @@begin ... @@end), blk_cpu (path and "WORKLOAD/path" -> [the
    target's CPU share per fio run]), gcpu ((workload, tool, round) -> (busy ticks, all ticks,
    window ns, I/Os or -1, queue sleeps or -1, overran)), fails ({"workload", "tool", "round",
    "error"}), unavailable (path -> why), files (NAME -> lines) and notes."""

    def __init__(self):
        self.meta, self.runs, self.blk_cpu, self.gcpu = {}, [], {}, {}
        self.fails, self.unavailable, self.files, self.notes = [], {}, {}, []


def parse_log(lines):
    """The guest's log (lines without their ends or with) -> a Log. A run whose @@end never came
    is a failure, a file whose @@endfile never came is kept with a note; a file name that could
    leave the output directory raises LogError."""
    log = Log()
    block, in_file = None, None
    for raw in lines:
        line = raw.rstrip("\r\n").replace("\r", "")
        if in_file is not None:
            if line == f"@@endfile {in_file}":
                in_file = None
            else:
                log.files[in_file].append(line)
        elif line.startswith("@@file "):
            in_file = line[len("@@file "):]
            if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", in_file):
                raise LogError(f"bad file name in the guest's output: {in_file!r}")
            log.files[in_file] = []
        elif line.startswith("@@meta "):
            parts = line.split(" ", 2)
            log.meta[parts[1]] = parts[2] if len(parts) > 2 else ""
        elif line.startswith("@@unavailable "):
            parts = line.split(" ", 2)
            log.unavailable[parts[1]] = parts[2] if len(parts) > 2 else ""
        elif line.startswith("@@fail "):
            parts = line.split(" ", 4)
            log.fails.append({"workload": parts[1], "tool": parts[2], "round": int(parts[3]),
                              "error": parts[4] if len(parts) > 4 else ""})
        elif line.startswith("@@cpu "):
            w, path, _, ns, wall = line.split()[1:6]
            share = int(ns) / int(wall) if int(wall) else 0.0
            log.blk_cpu.setdefault(path, []).append(share)
            log.blk_cpu.setdefault(f"{w}/{path}", []).append(share)
        elif line.startswith("@@gcpu "):
            w, tool, rnd, *xs = line.split()[1:]
            xs = [int(x) for x in xs] + [0] * (6 - len(xs))
            log.gcpu[(w, tool, int(rnd))] = tuple(xs[:6])
        elif line.startswith("@@begin "):
            w, tool, rnd, *cmd = line.split(" ")[1:]
            block = {"workload": w, "tool": tool, "round": int(rnd), "cmd": " ".join(cmd), "text": []}
        elif line.startswith("@@end ") and block is not None:
            block["text"] = "\n".join(block["text"])
            log.runs.append(block)
            block = None
        elif block is not None:
            block["text"].append(line)
    if in_file is not None:
        # The guest died while sending it: what came is kept (the timeline analyses the paths it has).
        log.notes.append(f"the guest's file {in_file} has no @@endfile: the guest died while sending it")
    if block is not None:
        log.fails.append({"workload": block["workload"], "tool": block["tool"], "round": block["round"],
                          "error": "the guest's output ends inside this run's report"})
    # An older log: ublk's absence as one meta line.
    if log.meta.get("ublk", "").startswith("unavailable: "):
        log.unavailable.setdefault("ublk", log.meta["ublk"][len("unavailable: "):])
    return log


def settings(meta, env=os.environ):
    """(secs, rounds, perftest bandwidth arguments, clock ticks per second, complete) of the run,
    from its @@meta lines (an older log's missing ones from the environment or the defaults)."""
    secs = int(meta.get("secs") or env.get("COMPARE_SECS") or 5)
    rounds = int(meta.get("rounds") or env.get("COMPARE_ROUNDS") or 4)
    bw_args = meta.get("perftest_bw_args") or env.get("COMPARE_PERFTEST_BW_ARGS") or "-Q 1"
    return secs, rounds, bw_args, int(meta.get("clk_tck") or 100), meta.get("complete") == "yes"


def fio_job(text):
    """The one job of fio's JSON report (text after fio's own lines); its error raises."""
    job = json.loads(text[text.index("{"):])["jobs"][0]
    if job.get("error"):
        raise ValueError(f"fio reports error {job['error']}")
    return job


def fio_figure(job, section, field):
    """IOPS, or the p50 completion latency in us, of fio's JSON report (one job)."""
    if field == "iops":
        return float(job[section]["iops"])
    return float(job[section]["clat_ns"]["percentile"]["50.000000"]) / 1000.0


def columns(header):
    """perftest's header names, some of which contain one space ("BW peak[MB/sec]")."""
    names, cur = [], []
    for tok in header.split():
        cur.append(tok)
        if tok.startswith("#") or tok.endswith("]"):
            names.append(" ".join(cur))
            cur = []
    if cur:
        names.append(" ".join(cur))
    return names


def perftest_figures(text):
    """perftest's result line under its '#bytes' header -> {column name: number}."""
    lines = [l.strip() for l in text.splitlines()]
    for i, line in enumerate(lines):
        if not line.startswith("#bytes"):
            continue
        names = columns(line)
        for values in lines[i + 1:]:
            fields = values.split()
            if fields and re.fullmatch(r"\d+", fields[0]) and len(fields) >= len(names):
                return {n: float(v) for n, v in zip(names, fields)}
    raise ValueError("no '#bytes' result table in perftest's output")


def pick(figs, prefix):
    """The first of perftest's figures whose column name starts with prefix."""
    for name, value in figs.items():
        if name.startswith(prefix):
            return value
    raise ValueError(f"no {prefix} column in {sorted(figs)}")


class Figures:
    """Every run's figure: values ((workload, tool) -> [figure per run]; an rblk run's figure is its
    bench_report), by_round ((workload, tool) -> {round: (figure, I/Os per second or None)}), cmds
    ((workload, tool) -> command line), cpu and own_cpu (workload -> [the target's and
    rblk-bench's own CPU share per rblk run]), and the log and hz they came from."""

    def __init__(self, log, hz):
        self.log, self.hz = log, hz
        self.values, self.by_round, self.cmds, self.cpu, self.own_cpu = {}, {}, {}, {}, {}


def run_figure(run, secs, notes, cpu, own_cpu):
    """(figure, I/Os per second or None) of one run: fio's IOPS or p50 for a block path, perftest's
    message rate (its #iterations / SECS when its clock calibration failed) or t_typical, or
    rblk's bench_report (its CPU shares into cpu and own_cpu). None for a perftest latency that
    cannot be used (noted). Raises ValueError and the like on output that does not parse."""
    if run["tool"] in PATHS:
        wl = BLOCK_OF[run["workload"]]
        job = fio_job(run["text"])
        return fio_figure(job, *wl[4]), float(job[wl[4][0]]["iops"])
    if run["tool"] == "perftest":
        figs = perftest_figures(run["text"])
        if any(n.startswith("MsgRate") for n in figs):
            v = pick(figs, "MsgRate") * 1e6
            if v <= 0:
                # Its clock calibration failed; the count of the measured SECS is still right.
                v = pick(figs, "#iterations") / float(secs)
                notes.append(f"round {run['round']} {run['workload']}: perftest rate from #iterations / {secs} s")
            return v, None
        v = pick(figs, "t_typical")
        if not v > 0:
            notes.append(f"round {run['round']} {run['workload']}: perftest latency unusable (t_typical {v}), skipped")
            return None, None
        return v, None
    report = bench_report(json.loads(run["text"]))
    share = (report.get("target_cpu") or {}).get("share_of_core")
    if share is not None:
        cpu.setdefault(run["workload"], []).append(share)
    own = (report.get("cpu") or {}).get("share_of_core")
    if own is not None:
        own_cpu.setdefault(run["workload"], []).append(own)
    return report, (report.get("total") or {}).get("iops")


def parse_runs(log, secs, hz):
    """Every run of the log -> Figures; a run whose output does not parse becomes a failure."""
    f = Figures(log, hz)
    for run in log.runs:
        key = (run["workload"], run["tool"])
        f.cmds[key] = run["cmd"]
        try:
            v, rate = run_figure(run, secs, log.notes, f.cpu, f.own_cpu)
        except (ValueError, KeyError, TypeError, IndexError, StopIteration) as e:
            log.fails.append({"workload": run["workload"], "tool": run["tool"], "round": run["round"],
                              "error": f"cannot parse its output: {type(e).__name__}: {e}"})
            continue
        if v is None:
            continue
        f.values.setdefault(key, []).append(v)
        f.by_round.setdefault(key, {})[run["round"]] = (v, rate)
    return f


def bench_lines(doc):
    """rblk-bench's JSON report (fio's layout) -> the lines the guest logs: a line per direction
    and the target's CPU."""
    out = []
    for job in doc["jobs"]:
        for d in ("read", "write"):
            x = job[d]
            if x["total_ios"]:
                p = x["clat_ns"]["percentile"]
                out.append(f"    {d}: IOPS={x['iops']:.0f}, BW={x['bw'] / 1024:.1f}MiB/s, "
                           f"lat p50={p['50.000000'] / 1000:.1f} us, p99={p['99.000000'] / 1000:.1f} us")
    t = doc["rblk"]["sections"][0]["target_cpu"]
    out.append("    target cpu: " + (f"{t['share_of_core'] * 100:.3f}% of one core" if t else "unknown"))
    return out


def merge_two(a, b):
    """Two rblk-bench reports in fio's layout (one job entry each) -> one in the shape the host
    reads (the earlier rblk-bench layout's names): IOPS and CPU added, each latency figure the
    worse one, the first's target CPU."""
    def lat_us(c):
        return None if not c["N"] else {k: c["percentile"][v] / 1000 for k, v in BENCH_PCT.items()}

    def section(x):
        return x["rblk"]["sections"][0]

    ja, jb = a["jobs"][0], b["jobs"][0]
    out = {"total": {"iops": sum(j[d]["iops"] for j in (ja, jb) for d in ("read", "write"))},
           "cpu": {"share_of_core": section(a)["cpu"]["share_of_core"] + section(b)["cpu"]["share_of_core"]},
           "target_cpu": section(a)["target_cpu"]}
    for d in ("read", "write"):
        la, lb = lat_us(ja[d]["clat_ns"]), lat_us(jb[d]["clat_ns"])
        out[d] = {"lat_us": None if la is None or lb is None else {k: max(la[k], lb[k]) for k in la}}
    return out
