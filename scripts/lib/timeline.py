"""Where the microseconds of one QD1 4 KiB read go: the analysis of scripts/timeline-rxe.sh's guest
log (issue 23; its header says what the guest records and what each boundary is). On the host:

    python3 scripts/lib/timeline.py summarize LOG SUMMARY_JSON TABLE_TXT

reads the log (@@meta KEY VALUE, @@path PATH KEY VALUE, @@fail PATH MESSAGE, and each path's
tracefs text, gzip and base64 between @@trace PATH and @@endtrace PATH), builds the per-I/O
timelines of the paths ublk, nvmeof and bench, prints the table and writes it to TABLE_TXT and the
figures to SUMMARY_JSON; exit status 1 when no path has analysed I/Os. In the guest:

    python3 scripts/lib/timeline.py fio-p50 FIO_JSON      # fio's read p50 in us
    python3 scripts/lib/timeline.py bench-p50 BENCH_JSON  # rblk-bench's (scripts/lib/report.py)

Per I/O (between its anchors: block_rq_issue and the block_rq_complete of the same sector, for
bench one post and the next), each boundary of SPEC is the first event of its kind after the
previous boundary seen (one with a required label only after that label was seen in this I/O);
the "pre" boundaries are the last ones before the anchor since the previous I/O ended, the "post"
ones the first after the end before the next I/O starts. A stage is the time from the previous
boundary seen to its own.
"""
import base64
import collections
import datetime
import gzip
import json
import re
import statistics
import sys

from report import bench_report, host_info

PATHS = ("ublk", "nvmeof", "bench")

# ---------------------------------------------------------------------------------------------------
# The guest's log and its traces.

Log = collections.namedtuple("Log", "meta paths fails traces")


def read_log(lines):
    """The guest's log as a Log: meta {KEY: VALUE}, paths {PATH: {KEY: VALUE}}, fails [{"path",
    "error"}] (@@fail lines, traces that cannot be decoded or do not end), traces {PATH: text}."""
    meta, paths, fails, traces = {}, collections.defaultdict(dict), [], {}
    cur, buf = None, []
    for raw in lines:
        line = raw.rstrip("\r\n").replace("\r", "")
        if cur is not None:
            if line == f"@@endtrace {cur}":
                try:
                    traces[cur] = gzip.decompress(base64.b64decode("".join(buf))).decode(errors="replace")
                except (ValueError, OSError, EOFError) as e:
                    fails.append({"path": cur, "error": f"cannot decode its trace: {e}"})
                cur, buf = None, []
            else:
                buf.append(line.strip())
        elif line.startswith("@@meta "):
            p = line.split(" ", 2)
            meta[p[1]] = p[2] if len(p) > 2 else ""
        elif line.startswith("@@path "):
            p = line.split(" ", 3)
            paths[p[1]][p[2]] = p[3] if len(p) > 3 else ""
        elif line.startswith("@@fail "):
            p = line.split(" ", 2)
            fails.append({"path": p[1], "error": p[2] if len(p) > 2 else ""})
        elif line.startswith("@@trace "):
            cur, buf = line.split(" ", 1)[1], []
    if cur is not None:
        fails.append({"path": cur, "error": "the guest's output ends inside its trace"})
    return Log(meta, paths, fails, traces)


SYS = {0: "read", 1: "write", 7: "poll", 16: "ioctl", 19: "readv", 20: "writev", 24: "sched_yield",
       202: "futex", 208: "io_getevents", 209: "io_submit", 228: "clock_gettime", 230: "clock_nanosleep",
       232: "epoll_wait", 233: "epoll_ctl", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait",
       333: "io_pgetevents", 426: "io_uring_enter", 441: "epoll_pwait2", 35: "nanosleep", 23: "select"}
NR_IO_URING_ENTER, NR_IO_SUBMIT, NR_IO_GETEVENTS = 426, 209, 208

LINE = re.compile(r"^\s*(.*?)-(\d+)\s+(?:\(\s*[\d-]+\)\s+)?\[(\d+)\]\s+\S+\s+(\d+\.\d+):\s+(\w+):\s?(.*)$")
BLK = re.compile(r"^(\d+),(\d+) (\S+)(?: \d+)? \((.*?)\) (\d+) \+ (\d+)")


class Ev:
    """One trace event: t (us), pid, cpu, comm, name, f (its fields' text); nr (system calls); dev
    (MAJ,MIN), rw, sector (block); a, b, state (sched_switch: prev_pid, next_pid, prev_state;
    sched_wakeup: a = the woken pid)."""
    __slots__ = ("t", "pid", "cpu", "comm", "name", "f", "nr", "dev", "rw", "sector", "a", "b", "state")


def parse(text):
    """The events of tracefs text, sorted by time; lines that are no event (comments, a block
    event whose fields do not parse) are left out."""
    evs = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = LINE.match(line)
        if not m:
            continue
        e = Ev()
        e.comm, e.pid, e.t = m.group(1).strip(), int(m.group(2)), float(m.group(4)) * 1e6
        e.name, e.f = m.group(5), m.group(6)
        e.cpu = int(m.group(3))
        e.nr = e.dev = e.rw = e.sector = e.a = e.b = e.state = None
        if e.name in ("block_rq_issue", "block_rq_complete"):
            b = BLK.match(e.f)
            if not b:
                continue
            e.dev, e.rw, e.sector = f"{b.group(1)},{b.group(2)}", b.group(3), int(b.group(5))
        elif e.name in ("sys_enter", "sys_exit"):
            b = re.match(r"NR (-?\d+)", e.f)
            e.nr = int(b.group(1)) if b else None
        elif e.name == "sched_switch":
            a = re.search(r"prev_pid=(\d+)", e.f)
            b = re.search(r"next_pid=(\d+)", e.f)
            s = re.search(r"prev_state=(\S+)", e.f)
            e.a, e.b, e.state = int(a.group(1)) if a else None, int(b.group(1)) if b else None, s.group(1) if s else ""
        elif e.name in ("sched_wakeup", "sched_waking"):
            a = re.search(r" pid=(\d+)", " " + e.f)
            e.a = int(a.group(1)) if a else None
        evs.append(e)
    evs.sort(key=lambda e: e.t)
    return evs


# ---------------------------------------------------------------------------------------------------
# The boundaries: matchers (event, context) -> bool. A kprobe's matcher names the functions it
# needs (`needs`), so a boundary whose function was not probed reads "n/a" with the reason.

def kp(name, pid=None):
    def m(e, c):
        return e.name == name and (pid is None or e.pid == c[pid])
    m.needs = [name]
    return m


def kp_any(names, pid=None):
    def m(e, c):
        return e.name in names and (pid is None or e.pid == c[pid])
    m.needs = list(names)
    return m


def ev(name, pred=None):
    return lambda e, c: e.name == name and (pred is None or pred(e, c))


def woken(who):
    return lambda e, c: e.name == "sched_wakeup" and (e.a == c[who] if who != "fio" else e.a in c["fio"])


def on_cpu(who):
    return lambda e, c: e.name == "sched_switch" and e.b == c[who]


def sysx(kind, nr, who):
    return lambda e, c: e.name == kind and e.nr == nr and (e.pid == c[who] if who != "fio" else e.pid in c["fio"])


def blk(kind, devkey):
    return lambda e, c: e.name == kind and e.dev == c[devkey]


def rxe_work(e, c):
    return e.name == "workqueue_execute_start" and "rdma_rxe" in e.f


# The first post of an I/O (ublk, bench: the READ; nvmeof: the command SEND) and rxe's first work
# item after it: rxe_wakeup() asks whether that item's vCPU was idle (halted) at the post.
READ_POSTED = "RDMA READ posted (rxe_post_send)"
SEND_POSTED = "command SEND posted (rxe_post_send)"
FIRST_POSTS = (READ_POSTED, SEND_POSTED)
RXE_WORK = "rxe's first work item starts (workqueue_execute_start)"

# (label, matcher, requires-label or None)
RXE_READ = [
    (RXE_WORK, rxe_work, None),
    ("rxe requester runs (rxe_requester)", kp("rxe_requester"), None),
    ("request on the wire (rxe_xmit_packet)", kp("rxe_xmit_packet"), None),
    ("target's responder runs (rxe_receiver)", kp_any(["rxe_receiver", "rxe_responder"]), None),
    ("response on the wire (rxe_xmit_packet)", kp("rxe_xmit_packet"), None),
    ("rxe completer runs (rxe_completer)", kp("rxe_completer"), None),
    ("CQE posted (rxe_cq_post)", kp("rxe_cq_post"), None),
]
SPEC = {
    "ublk": {
        "title": "fio randread 4k QD1 through the ublk device of `rblk attach --queues 1 --depth 32`",
        "pre": [("fio io_submit (sys_enter)", sysx("sys_enter", NR_IO_SUBMIT, "fio"), None),
                ("ublk_queue_rq (kprobe)", kp("ublk_queue_rq"), None)],
        "start": "block_rq_issue",
        "mid": [
            ("queue thread woken (sched_wakeup)", woken("srv"), None),
            ("queue thread on CPU (sched_switch in)", on_cpu("srv"), "queue thread woken (sched_wakeup)"),
            ("ublk task work runs (kprobe)", kp_any(["ublk_rq_task_work_cb", "ublk_cmd_tw_cb"], "srv"), None),
            ("io_uring_enter returns (sys_exit)", sysx("sys_exit", NR_IO_URING_ENTER, "srv"), None),
            (READ_POSTED, kp("rxe_post_send", "srv"), None),
        ] + RXE_READ + [
            ("completion event (ib_uverbs_comp_handler)", kp("ib_uverbs_comp_handler"), None),
            ("poll task work queued (io_uring_task_add)", ev("io_uring_task_add"),
             "completion event (ib_uverbs_comp_handler)"),
            ("queue thread woken again (sched_wakeup)", woken("srv"), None),
            ("queue thread on CPU again (sched_switch in)", on_cpu("srv"), "queue thread woken again (sched_wakeup)"),
            ("io_uring_enter returns again (sys_exit)", sysx("sys_exit", NR_IO_URING_ENTER, "srv"), None),
            ("COMMIT (ublk_ch_uring_cmd)", kp("ublk_ch_uring_cmd", "srv"), None),
        ],
        "end": "block_rq_complete",
        "post": [
            ("fio woken (sched_wakeup)", woken("fio"), None),
            ("fio io_getevents returns (sys_exit)", sysx("sys_exit", NR_IO_GETEVENTS, "fio"), None),
        ],
    },
    "nvmeof": {
        "title": "fio randread 4k QD1 through Linux NVMe-oF/RDMA (nvme-rdma -> nvmet-rdma -> null_blk)",
        "pre": [("fio io_submit (sys_enter)", sysx("sys_enter", NR_IO_SUBMIT, "fio"), None),
                ("nvme_rdma_queue_rq (kprobe)", kp("nvme_rdma_queue_rq"), None)],
        "start": "block_rq_issue",
        "mid": [
            (SEND_POSTED, kp("rxe_post_send"), None),
            (RXE_WORK, rxe_work, None),
            ("rxe requester runs (rxe_requester)", kp("rxe_requester"), None),
            ("request on the wire (rxe_xmit_packet)", kp("rxe_xmit_packet"), None),
            ("target got the command (nvmet_rdma_recv_done)", kp("nvmet_rdma_recv_done"), None),
            ("target block_rq_issue (null_blk)", blk("block_rq_issue", "tdev"), None),
            ("target block_rq_complete (null_blk)", blk("block_rq_complete", "tdev"), None),
            ("data + response queued (nvmet_rdma_queue_response)", kp("nvmet_rdma_queue_response"), None),
            ("data WRITE posted (rxe_post_send)", kp("rxe_post_send"), None),
            ("rxe requester runs again (rxe_requester)", kp("rxe_requester"), None),
            ("data on the wire (rxe_xmit_packet)", kp("rxe_xmit_packet"), None),
            ("host's responder runs (rxe_receiver)", kp_any(["rxe_receiver", "rxe_responder"]), None),
            ("CQE posted (rxe_cq_post)", kp("rxe_cq_post"), None),
            ("host completion (nvme_rdma_recv_done)", kp("nvme_rdma_recv_done"), None),
        ],
        "end": "block_rq_complete",
        "post": [
            ("fio woken (sched_wakeup)", woken("fio"), None),
            ("fio io_getevents returns (sys_exit)", sysx("sys_exit", NR_IO_GETEVENTS, "fio"), None),
        ],
    },
    "bench": {
        "title": "rblk-bench --rw randread --bs 4k --iodepth 1 (the library, no block device)",
        "pre": [],
        "start": "post",
        "mid": RXE_READ + [
            ("completion event (ib_uverbs_comp_handler)", kp("ib_uverbs_comp_handler"), None),
            ("bench thread woken (sched_wakeup)", woken("srv"), None),
            ("bench thread on CPU (sched_switch in)", on_cpu("srv"), "bench thread woken (sched_wakeup)"),
        ],
        "end": "post",
        "post": [],
    },
}
START_LABEL = {"block_rq_issue": "block_rq_issue", "post": READ_POSTED}
END_LABEL = {"block_rq_complete": "block_rq_complete", "post": "next READ posted (rxe_post_send)"}


def labels(spec):
    """A path's boundaries in their order (unique: a stage is keyed by its label)."""
    return [lb for lb, _, _ in spec["pre"]] + [START_LABEL[spec["start"]]] + [lb for lb, _, _ in spec["mid"]] \
        + [END_LABEL[spec["end"]]] + [lb for lb, _, _ in spec["post"]]


def needs_missing(m, kprobes):
    """The function a boundary's matcher needs that has no kprobe (the first it names when it
    takes any of several and none is set), or None."""
    names = getattr(m, "needs", None)
    if names is None:
        return None
    return None if any(x in kprobes for x in names) else names[0]


# ---------------------------------------------------------------------------------------------------
# One path's trace.

def stat(xs):
    """{"median_us", "mean_us", "n"} of microsecond values, None for none."""
    if not xs:
        return None
    return {"median_us": statistics.median(xs), "mean_us": statistics.fmean(xs), "n": len(xs)}


def find_windows(path, evs, info, kprobes):
    """(context, info, windows) of a path's events, or an {"error"} dict (kprobes: the functions
    probed, for the error's reason). Windows are the (start, end) event indexes of each I/O; the
    context has the path's device ("dev", the NVMe-oF target's "tdev"), fio's pids ("fio"), its
    job ("fio_job") and the serving thread ("srv"). info comes back with dev_name amended when the
    reads were found on another device (NVMe multipath)."""
    tids = [int(x) for x in info.get("tids", "").split()]
    ctx = {"dev": info.get("dev"), "tdev": info.get("target_dev")}
    cnt = collections.Counter
    if path in ("ublk", "nvmeof"):
        def is_read(e):
            return e.name == "block_rq_issue" and "R" in e.rw
        issues = [i for i, e in enumerate(evs) if is_read(e) and e.dev == ctx["dev"]]
        if not issues:
            # NVMe multipath: requests are issued on the hidden path device (nvmeXcYnZ), not on
            # nvmeXnY: take the device with the most reads that is not the target's.
            other = cnt(e.dev for e in evs if is_read(e) and e.dev != ctx["tdev"]).most_common(1)
            if other:
                ctx["dev"] = other[0][0]
                info = dict(info, dev_name=f"{info.get('dev_name')} (requests on {other[0][0]})")
                issues = [i for i, e in enumerate(evs) if is_read(e) and e.dev == ctx["dev"]]
        if not issues:
            return {"error": f"no block_rq_issue of a read on {info.get('dev_name')} ({ctx['dev']}) in the trace"}
        fio_job = cnt(evs[i].pid for i in issues).most_common(1)[0][0]
        ctx["fio"] = {e.pid for e in evs if e.comm == "fio"} | {fio_job}
        ctx["fio_job"] = fio_job
        if path == "ublk":
            cand = cnt(e.pid for e in evs if e.name == "ublk_ch_uring_cmd" and (not tids or e.pid in tids))
            if not cand:
                cand = cnt(e.pid for e in evs
                           if e.name == "sys_enter" and e.nr == NR_IO_URING_ENTER and e.pid not in ctx["fio"])
            ctx["srv"] = cand.most_common(1)[0][0] if cand else -1
        else:
            ctx["srv"] = fio_job
        # An I/O ends at the completion of its sector.
        wins = []
        for i in issues:
            s = evs[i].sector
            end = next((k for k in range(i + 1, len(evs)) if evs[k].name == "block_rq_complete"
                        and evs[k].dev == ctx["dev"] and evs[k].sector == s), None)
            if end is not None:
                wins.append((i, end))
    else:
        ctx["fio"] = set()
        posts_by = cnt(e.pid for e in evs if e.name == "rxe_post_send" and (not tids or e.pid in tids))
        if not posts_by:
            return {"error": "no rxe_post_send by rblk-bench's threads in the trace"
                    + ("" if "rxe_post_send" in kprobes else " (no kprobe rxe_post_send on this kernel)")}
        ctx["srv"] = posts_by.most_common(1)[0][0]
        posts = [i for i, e in enumerate(evs) if e.name == "rxe_post_send" and e.pid == ctx["srv"]]
        wins = list(zip(posts, posts[1:]))
    return ctx, info, wins


def io_marks(path, spec, evs, ctx, wins, w):
    """The boundaries seen in I/O w (1 <= w < len(wins) - 1: the I/Os before and after bound the
    search of the "pre" and "post" boundaries), [(label, t, event index)] in order."""
    s, e_ = wins[w]
    lo, hi = wins[w - 1][1], wins[w + 1][0]
    if path == "bench":
        lo = s
    marks = []
    for label, m, _ in spec["pre"]:
        k = next((k for k in range(s - 1, lo, -1) if m(evs[k], ctx)), None)
        if k is not None:
            marks.append((label, evs[k].t, k))
    marks.append((START_LABEL[spec["start"]], evs[s].t, s))
    pos, found = s, set()
    for label, m, req in spec["mid"]:
        if req and req not in found:
            continue
        k = next((k for k in range(pos + 1, e_) if m(evs[k], ctx)), None)
        if k is not None:
            marks.append((label, evs[k].t, k))
            found.add(label)
            pos = k
    marks.append((END_LABEL[spec["end"]], evs[e_].t, e_))
    pos = e_
    for label, m, _ in spec["post"]:
        k = next((k for k in range(pos + 1, hi) if m(evs[k], ctx)), None)
        if k is not None:
            marks.append((label, evs[k].t, k))
            pos = k
    return marks


def rxe_wakeup(evs, marks, wins, w):
    """For I/O w: (whether rxe's first work item after the first post ran on a vCPU that was idle
    at the post: a switch from the idle task there in between, post -> item us, how long that
    vCPU had been idle before the post in us or None), or None when the I/O saw no post and
    item in that order."""
    post_k = next((k for label, _, k in marks if label in FIRST_POSTS), None)
    work_k = next((k for label, _, k in marks if label == RXE_WORK), None)
    if post_k is None or work_k is None or work_k <= post_k:
        return None
    cpu = evs[work_k].cpu
    idle = any(evs[k].name == "sched_switch" and evs[k].a == 0 and evs[k].cpu == cpu
               for k in range(post_k + 1, work_k))
    went = next((k for k in range(post_k - 1, wins[w - 1][0], -1)
                 if evs[k].name == "sched_switch" and evs[k].cpu == cpu), None)
    idle_for = evs[post_k].t - evs[went].t if idle and went is not None and evs[went].b == 0 else None
    return idle, evs[work_k].t - evs[post_k].t, idle_for


def span_counts(span, srv, fio_job, ios):
    """Per I/O over the analysed events: the serving thread's system calls (io_uring_enter and
    all, by name, most first), its context switches (sched_switch away from it) and the
    involuntary ones (it was runnable), fio's job's (None without one) and the io_uring events."""
    cnt = collections.Counter
    sc = cnt(SYS.get(e.nr, f"nr{e.nr}") for e in span if e.name == "sys_enter" and e.pid == srv)
    sw_srv = [e for e in span if e.name == "sched_switch" and e.a == srv]
    sw_fio = [e for e in span if e.name == "sched_switch" and fio_job is not None and e.a == fio_job]
    invol = sum(1 for e in sw_srv if e.state.startswith("R"))
    iou = cnt(e.name for e in span if e.name.startswith("io_uring_"))
    return {
        "io_uring_enter_per_io": sc.get("io_uring_enter", 0) / ios,
        "syscalls_per_io": {k: v / ios for k, v in sc.most_common()},
        "switches_per_io": len(sw_srv) / ios, "involuntary_switches_per_io": invol / ios,
        "fio_switches_per_io": (len(sw_fio) / ios) if fio_job is not None else None,
        "io_uring_events_per_io": {k: v / ios for k, v in iou.most_common()},
    }


def stage_rows(spec, seen, per, ios, kprobes, skipped):
    """The stages of a path's table and summary: per boundary its label, the share of I/Os that
    saw it, whether it is the first, why it is missing (its function not probed: skipped or not
    on this kernel) and the median, mean and count of its stage's microseconds."""
    stages = []
    matchers = {lb: m for lb, m, _ in spec["pre"] + spec["mid"] + spec["post"]}
    for n, label in enumerate(labels(spec)):
        miss = needs_missing(matchers[label], kprobes) if label in matchers else None
        d = {"stage": label, "seen_share": seen[label] / ios, "first": n == 0}
        if miss and not seen[label]:
            d["missing"] = (f"{miss} not probed (RBLK_TIMELINE_SKIP_KPROBES)" if miss in skipped
                            else f"no kprobe {miss} on this kernel")
        s = stat(per[label])
        if s:
            d.update(s)
        stages.append(d)
    return stages


def analyse(path, text, info, kprobes, skipped):
    """One path's figures from its trace text and its @@path values (summary.json's paths.PATH),
    or {"error"}."""
    spec = SPEC[path]
    evs = parse(text)
    found = find_windows(path, evs, info, kprobes)
    if isinstance(found, dict):
        return found
    ctx, info, wins = found
    srv_comm = next((e.comm for e in evs if e.pid == ctx["srv"]), "?")
    names = labels(spec)
    per = {lb: [] for lb in names}
    seen = {lb: 0 for lb in names}
    totals = {"block": [], "app": []}
    wake = {True: [], False: []}  # post -> rxe's first work item, by whether its vCPU was idle
    idle_for = []  # how long that vCPU had been idle at the post
    ios = 0
    span_lo = span_hi = None
    # I/Os 1..n-2: each has a previous I/O's end and a next I/O's start to bound pre/post searches.
    for w in range(1, len(wins) - 1):
        s, e_ = wins[w]
        marks = io_marks(path, spec, evs, ctx, wins, w)
        ios += 1
        wk = rxe_wakeup(evs, marks, wins, w)
        if wk is not None:
            wake[wk[0]].append(wk[1])
            if wk[2] is not None:
                idle_for.append(wk[2])
        for n, (label, t, _) in enumerate(marks):
            seen[label] += 1
            if n > 0:
                per[label].append(t - marks[n - 1][1])
        totals["block"].append(evs[e_].t - evs[s].t)
        if spec["pre"] and spec["post"] and marks[0][0] == spec["pre"][0][0] and marks[-1][0] == spec["post"][-1][0]:
            totals["app"].append(marks[-1][1] - marks[0][1])
        span_lo = s if span_lo is None else span_lo
        span_hi = e_ if path == "bench" else wins[w + 1][0]
    if not ios:
        return {"error": f"too few complete I/Os in the trace ({len(wins)})"}

    # Per-I/O counts over the analysed span (from the first analysed I/O's start to the last one's end).
    counts = span_counts(evs[span_lo:span_hi], ctx["srv"], ctx.get("fio_job"), ios)
    return {
        "title": spec["title"], "device": info.get("dev_name"), "ios": ios,
        "serving_thread": {"tid": ctx["srv"], "comm": srv_comm}, "fio_job": ctx.get("fio_job"),
        "stages": stage_rows(spec, seen, per, ios, kprobes, skipped),
        "total_block_us": stat(totals["block"]), "total_app_us": stat(totals["app"]),
        **counts,
        "rxe_worker": {"idle_share": len(wake[True]) / (len(wake[True]) + len(wake[False])),
                       "from_idle_us": stat(wake[True]), "from_busy_us": stat(wake[False]),
                       "idle_before_post_us": stat(idle_for)} if wake[True] or wake[False] else None,
        "fio_p50_us": float(info["fio_p50_us"]) if info.get("fio_p50_us") else None,
        "bench_p50_us": info.get("bench_p50_us") or None,
        "trace_events": len(evs),
    }


def analyse_all(log):
    """analyse() of every path of the log, in PATHS' order: a path without a trace, or whose
    analysis failed (a parser bug must not lose the other paths), gets an {"error"}."""
    kprobes = set(log.meta.get("kprobes", "").split())
    skipped = set(log.meta.get("kprobes_skipped", "").split())
    results = {}
    for p in PATHS:
        if p in log.traces:
            try:
                results[p] = analyse(p, log.traces[p], log.paths.get(p, {}), kprobes, skipped)
            except Exception as e:
                results[p] = {"error": f"cannot analyse the trace: {type(e).__name__}: {e}"}
        else:
            results[p] = {"error": "no trace (see the failures)"}
    return results


# ---------------------------------------------------------------------------------------------------
# The table and summary.json.

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


class SummaryError(Exception):
    """A file summarize() cannot read or write, in words for the user."""


def write_file(path, text):
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        raise SummaryError(f"cannot write {path}: {e.strerror}") from e


def summarize(log_path, summary_path, table_path):
    """The guest's log to table.txt (also printed) and summary.json; 0 when a path has analysed
    I/Os, else 1 (with the reason on stderr)."""
    try:
        with open(log_path, errors="replace") as f:
            log = read_log(f)
    except OSError as e:
        raise SummaryError(f"cannot read {log_path}: {e.strerror}") from e
    results = analyse_all(log)
    text = table(results, log.meta, log.fails, log_path)
    print(text)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    doc = summary(results, log.meta, log.fails, date, host_info())
    write_file(summary_path, json.dumps(doc, indent=2) + "\n")
    write_file(table_path, text + "\n")
    if not any("error" not in r for r in results.values()):
        print("timeline: error: no path has analysed I/Os", file=sys.stderr)
        return 1
    return 0


def fio_p50(doc):
    """fio's read completion latency p50 in us from its JSON output (its first job)."""
    return doc["jobs"][0]["read"]["clat_ns"]["percentile"]["50.000000"] / 1000


def main(argv):
    if len(argv) == 4 and argv[0] == "summarize":
        try:
            return summarize(*argv[1:])
        except SummaryError as e:
            print(f"timeline: error: {e}", file=sys.stderr)
            return 1
    if len(argv) == 2 and argv[0] in ("fio-p50", "bench-p50"):
        with open(argv[1]) as f:
            doc = json.load(f)
        print(fio_p50(doc) if argv[0] == "fio-p50" else bench_report(doc)["read"]["lat_us"]["p50"])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
