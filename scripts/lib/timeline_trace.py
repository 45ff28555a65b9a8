"""scripts/timeline-rxe.sh's guest log and its traces, for timeline.py (whose docstring says what
the analysis does): reading the log (read_log), parsing tracefs's text lines (parse), the matchers
of one boundary's event, and the boundaries each path's I/O crosses (SPEC)."""
import base64
import collections
import gzip
import re

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
