"""The stated hardware projection (issue 45, item 4): what rblk should reach on a ConnectX-class
RNIC, from what it does per I/O today and published per-operation costs.

    projection.py INPUTS.json                 the cost table, the projection and the goal checks
    projection.py --inputs-from SUMMARY.json  an inputs file from scripts/timeline-rxe.sh's
                                              summary.json (instructions left to be filled in)

INPUTS.json (scripts/lib/projection-inputs.json is the committed one):
  "source": where the counts come from (free text and the run's date)
  "paths": {"library": COUNTS, "ublk": COUNTS}; library is rblk-bench's path (doorbell + poll,
      no block layer), ublk is `rblk attach` (the ublk server's queue thread). COUNTS, per I/O at
      QD1 on rxe, of the serving thread:
        "syscalls_per_io": {name: count}   every system call, io_uring_enter included
        "switches_per_io", "involuntary_switches_per_io"   sched_switch away from the thread
        "post_syscall": "write"    the call that is a post (a doorbell) on rxe
        "rearm_syscall": "ioctl"   the call that arms the CQ (ibv_req_notify_cq) on rxe
  "instructions_per_request": {"library": N, "ublk_server": N, "source": TEXT}: instructions in
      rblk's own code per request, from scripts/insns.sh's baseline. ublk_server is the ublk
      server's request path beyond the library's read (deliver/tag_task). null until filled in:
      the projection refuses without them and shows the instruction budget of each goal instead.
      Optional "library_qd32" and "ublk_server_qd32": the same at depth (the gate's QD32
      scenarios), for IOPS per core, a throughput figure; QD1's are used without them. The other
      counts stay QD1's (one doorbell and one completion per I/O: an upper bound at depth).

On the NIC the counts become: a post is an MMIO doorbell, not a system call; a re-arm is a
doorbell too (mlx5 arms its CQ from user space); every other system call stays; a voluntary
switch is a sleep that costs a wake-up; involuntary switches are rxe's kernel threads (the
software NIC) taking the CPU and have no counterpart.
"""

import json
import sys

# Each cost: value, unit, kind (measured / model / estimate / derived / assumption), source.
COSTS = {
    "ib_read_lat_small_us": (1.91, "us", "measured", "ib_read_lat, default size (2 B), mlx5 NIC, numactl-bound: https://github.com/linux-rdma/perftest/issues/131"),
    "ib_send_lat_2b_us": (1.83, "us", "measured", "ib_send_lat 2 B, ConnectX-5 EDR (GPU buffers): https://github.com/linux-rdma/perftest/pull/98"),
    "ib_send_lat_4k_us": (2.66, "us", "measured", "ib_send_lat 4096 B, same run: https://github.com/linux-rdma/perftest/pull/98"),
    "nvmeof_qd1_us": (10.4, "us", "measured", "NVMe-oF/RDMA randread QD1 avg, SPDK target + Linux kernel initiator (performance.spdk.io, 2023): https://github.com/spdk/spdk/issues/3012"),
    "spdk_initiator_qd1_us": (4.64, "us", "measured", "same, SPDK initiator + SPDK target: https://github.com/spdk/spdk/issues/3012"),
    "post_us": (0.075, "us", "model", "ibv_post_send software overhead incl. the doorbell, UCX rc_verbs model: openucx/ucx src/uct/ib/rc/verbs/rc_verbs_iface.c"),
    "doorbell_us": (0.040, "us", "model", "mlx5 direct post (doorbell record + MMIO/BlueFlame), UCX rc_mlx5 model: openucx/ucx src/uct/ib/rc/accel/rc_mlx5_common.c"),
    "cq_poll_us": (0.05, "us", "estimate", "one CQE polled from user space (mlx5); no published per-poll figure found"),
    "syscall_us": (0.23, "us", "measured", "null syscall, Skylake, KPTI + retpolines (Lutomirski's patch, 237 -> 228 ns): https://www.phoronix.com/news/Drop-SYSCALL64-Tramp-KPTI"),
    "wakeup_us": (2.0, "us", "estimate", "a sleeping thread woken by a completion (interrupt, wake-up, switch in); thread ping-pong 1.07 us per switch (Linux 6.6, i7-11th gen): https://ddumbying.vercel.app/experiments/ctx-switch-overhead"),
    "switch_cpu_us": (1.07, "us", "measured", "CPU per thread switch, pipe ping-pong, Linux 6.6, i7-11th gen: https://ddumbying.vercel.app/experiments/ctx-switch-overhead"),
    "ublk_transport_us": (1.1, "us", "measured", "ublk null servers over null_blk, extra CPU per 4 KiB read at 2x QD32 (ublksrv, libublk-rs), KVM guest on Ryzen 9 6900HX, Linux 6.12: ehrlich-b/go-ublk site/content/reference/benchmarks.md"),
    "ublk_vm_qd1_extra_us": (13.16, "us", "measured", "ublksrv null QD1 p50 completion latency, null_blk's inline, same KVM guest (fio and server on separate vCPUs): ehrlich-b/go-ublk site/content/reference/benchmarks.md"),
    "ipc": (1.0, "instructions/cycle", "assumption", "rblk's own code on a current x86 server core (conservative)"),
    "clock_ghz": (3.0, "GHz", "assumption", "a current x86 server core"),
}

GOALS = {"ublk_vs_nvmeof": 1.3, "library_vs_ib_read_lat": 1.5, "iops_per_core": 1e6}
WANT_INSNS = "instructions_per_request is not filled in: fill in library and ublk_server from scripts/insns.sh's baseline"


class InputError(ValueError):
    """The inputs file is not what the projection wants (the message says what is wanted)."""


class MissingInstructions(InputError):
    """The instruction counts are still the placeholder."""


def cost(costs, key):
    return costs[key][0]


def derived(costs):
    """The figures derived from the table: ib_read_lat at 4 KiB (the small read plus what 4 KiB
    adds to ib_send_lat on a ConnectX-5) and what the kernel initiator adds to SPDK's."""
    return {
        "ib_read_lat_4k_us": cost(costs, "ib_read_lat_small_us") + cost(costs, "ib_send_lat_4k_us") - cost(costs, "ib_send_lat_2b_us"),
        "kernel_initiator_us": cost(costs, "nvmeof_qd1_us") - cost(costs, "spdk_initiator_qd1_us"),
    }


def validate(inputs):
    """Checks the inputs' shape; raises InputError saying what is wanted."""
    if not isinstance(inputs, dict) or not isinstance(inputs.get("paths"), dict):
        raise InputError('wanted a JSON object with "paths": {"library": ..., "ublk": ...}')
    for name in ("library", "ublk"):
        p = inputs["paths"].get(name)
        if not isinstance(p, dict):
            raise InputError(f'paths.{name} is missing: wanted its counts per I/O')
        sc = p.get("syscalls_per_io")
        if not isinstance(sc, dict):
            raise InputError(f"paths.{name}.syscalls_per_io: wanted an object of system call counts per I/O")
        nums = [(f"syscalls_per_io.{k}", v) for k, v in sc.items()]
        nums += [(k, p.get(k)) for k in ("switches_per_io", "involuntary_switches_per_io")]
        for key, v in nums:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise InputError(f"paths.{name}.{key}: wanted a count per I/O (a number >= 0), got {v!r}")
        for key in ("post_syscall", "rearm_syscall"):
            if not isinstance(p.get(key), str):
                raise InputError(f"paths.{name}.{key}: wanted the name of a system call")
    ins = inputs.get("instructions_per_request")
    if not isinstance(ins, dict):
        raise InputError('instructions_per_request is missing: wanted {"library": N, "ublk_server": N}')
    for key in ("library", "ublk_server", "library_qd32", "ublk_server_qd32"):
        v = ins.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
            raise InputError(f"instructions_per_request.{key}: wanted a number of instructions, got {v!r}")


def on_hardware(p):
    """A path's counts per I/O as they become on an RNIC (see the module's doc)."""
    sc = dict(p["syscalls_per_io"])
    posts = sc.pop(p["post_syscall"], 0.0)
    rearms = sc.pop(p["rearm_syscall"], 0.0)
    enters = sc.pop("io_uring_enter", 0.0)
    return {
        "doorbells": posts,
        "rearms": rearms,
        "io_uring_enter": enters,
        "other_syscalls": sum(sc.values()),
        "wakeups": max(p["switches_per_io"] - p["involuntary_switches_per_io"], 0.0),
    }


def instructions_us(n, costs):
    return n / (cost(costs, "ipc") * cost(costs, "clock_ghz") * 1000.0)


def library_latency_us(hw, insns, costs):
    """QD1 latency of the library: ib_read_lat at 4 KiB (one post, a busy-polled CQ) plus what
    rblk does beyond perftest."""
    return (derived(costs)["ib_read_lat_4k_us"]
            + max(hw["doorbells"] - 1.0, 0.0) * cost(costs, "post_us")
            + hw["rearms"] * cost(costs, "doorbell_us")
            + (hw["io_uring_enter"] + hw["other_syscalls"]) * cost(costs, "syscall_us")
            + hw["wakeups"] * cost(costs, "wakeup_us")
            + instructions_us(insns, costs))


def ublk_latency_us(hw, insns_library, insns_server, costs, vm_transport=False):
    """QD1 latency through ublk: the library's read in the queue thread, the client's kernel
    side (fio, block layer, completion, taken as what the kernel NVMe-oF initiator adds to
    SPDK's) and ublk's hand-off; or, with vm_transport, ublk null's QD1 cost as measured in a VM."""
    extra = (cost(costs, "ublk_vm_qd1_extra_us") if vm_transport
             else derived(costs)["kernel_initiator_us"] + cost(costs, "ublk_transport_us"))
    return library_latency_us(hw, insns_library, costs) + extra + instructions_us(insns_server, costs)


def cpu_us_per_io(hw, insns, costs, ublk=False):
    """Initiator CPU per I/O (not the wait on the wire): posts, one CQ poll, re-arms, system
    calls, switches, rblk's instructions; ublk adds its transport (the application's own block
    layer submission is not counted)."""
    us = (hw["doorbells"] * cost(costs, "post_us") + cost(costs, "cq_poll_us")
          + hw["rearms"] * cost(costs, "doorbell_us")
          + (hw["io_uring_enter"] + hw["other_syscalls"]) * cost(costs, "syscall_us")
          + hw["wakeups"] * cost(costs, "switch_cpu_us") + instructions_us(insns, costs))
    return us + (cost(costs, "ublk_transport_us") if ublk else 0.0)


def _rows(inputs, costs, ins_lib, ins_srv, at_depth=None):
    """at_depth: (library, ublk server) instructions per request at depth, for IOPS per core."""
    hw = {name: on_hardware(inputs["paths"][name]) for name in ("library", "ublk")}
    lib = library_latency_us(hw["library"], ins_lib, costs)
    ub = ublk_latency_us(hw["ublk"], ins_lib, ins_srv, costs)
    ub_vm = ublk_latency_us(hw["ublk"], ins_lib, ins_srv, costs, vm_transport=True)
    tp_lib, tp_srv = at_depth or (ins_lib, ins_srv)
    cpu_lib = cpu_us_per_io(hw["library"], tp_lib, costs)
    cpu_ub = cpu_us_per_io(hw["ublk"], tp_lib + tp_srv, costs, ublk=True)
    return {"hardware_counts": hw, "library_qd1_us": lib, "ublk_qd1_us": ub, "ublk_qd1_vm_transport_us": ub_vm,
            "library_iops_per_core": 1e6 / cpu_lib, "ublk_iops_per_core": 1e6 / cpu_ub,
            "library_cpu_us": cpu_lib, "ublk_cpu_us": cpu_ub}


def project(inputs, costs=COSTS):
    """The projection; raises MissingInstructions while the instruction counts are placeholders."""
    validate(inputs)
    ins = inputs["instructions_per_request"]
    if ins.get("library") is None or ins.get("ublk_server") is None:
        raise MissingInstructions(WANT_INSNS)
    depth = None
    if ins.get("library_qd32") is not None and ins.get("ublk_server_qd32") is not None:
        depth = (float(ins["library_qd32"]), float(ins["ublk_server_qd32"]))
    return _rows(inputs, costs, float(ins["library"]), float(ins["ublk_server"]), depth)


def floor(inputs, costs=COSTS):
    """Everything but rblk's own instructions (taken as 0), and how many instructions per
    request each goal leaves: the projection's instruction-free part."""
    validate(inputs)
    r = _rows(inputs, costs, 0.0, 0.0)
    per_us = cost(costs, "ipc") * cost(costs, "clock_ghz") * 1000.0
    d = derived(costs)
    r["budgets"] = {
        "library latency": (GOALS["library_vs_ib_read_lat"] * d["ib_read_lat_4k_us"] - r["library_qd1_us"]) * per_us,
        "ublk latency": (GOALS["ublk_vs_nvmeof"] * cost(costs, "nvmeof_qd1_us") - r["ublk_qd1_us"]) * per_us,
        "library IOPS per core": (1e6 / GOALS["iops_per_core"] - r["library_cpu_us"]) * per_us,
        "ublk IOPS per core": (1e6 / GOALS["iops_per_core"] - r["ublk_cpu_us"]) * per_us,
    }
    return r


def goal_checks(r, costs=COSTS):
    """[(label, value, limit, met)] for issue 45's goals."""
    d = derived(costs)
    ub, lib = GOALS["ublk_vs_nvmeof"] * cost(costs, "nvmeof_qd1_us"), GOALS["library_vs_ib_read_lat"] * d["ib_read_lat_4k_us"]
    return [
        (f"ublk QD1 <= {GOALS['ublk_vs_nvmeof']} x NVMe-oF's {cost(costs, 'nvmeof_qd1_us')} us", r["ublk_qd1_us"], ub, r["ublk_qd1_us"] <= ub),
        (f"library QD1 <= {GOALS['library_vs_ib_read_lat']} x ib_read_lat 4 KiB", r["library_qd1_us"], lib, r["library_qd1_us"] <= lib),
        ("library >= 1 M IOPS per initiator core", r["library_iops_per_core"], GOALS["iops_per_core"], r["library_iops_per_core"] >= GOALS["iops_per_core"]),
        ("ublk >= 1 M IOPS per initiator core", r["ublk_iops_per_core"], GOALS["iops_per_core"], r["ublk_iops_per_core"] >= GOALS["iops_per_core"]),
    ]


def render_costs(costs=COSTS):
    lines = ["cost                     value  unit                kind        source"]
    for key, (v, unit, kind, src) in costs.items():
        lines.append(f"{key:<24} {v:>6g}  {unit:<19} {kind:<11} {src}")
    for key, v in derived(costs).items():
        lines.append(f"{key:<24} {v:>6.2f}  {'us':<19} {'derived':<11} see derived() in scripts/lib/projection.py")
    return "\n".join(lines)


def render(r, costs=COSTS, refused=None):
    d = derived(costs)
    out = [render_costs(costs), "", "counts per I/O on the RNIC (from rxe's, QD1)"]
    for name, hw in r["hardware_counts"].items():
        out.append(f"  {name:<8} " + ", ".join(f"{k} {v:.2f}" for k, v in hw.items()))
    title = "projection without rblk's instructions (a floor)" if refused else "projection"
    out += ["", title,
            f"  library QD1                  {r['library_qd1_us']:6.2f} us   (ib_read_lat 4 KiB {d['ib_read_lat_4k_us']:.2f} us)",
            f"  ublk QD1                     {r['ublk_qd1_us']:6.2f} us   (NVMe-oF/RDMA QD1 {cost(costs, 'nvmeof_qd1_us')} us)",
            f"  ublk QD1, ublk as in a VM    {r['ublk_qd1_vm_transport_us']:6.2f} us",
            f"  library IOPS per core        {r['library_iops_per_core'] / 1e6:6.2f} M    ({r['library_cpu_us']:.3f} us CPU per I/O)",
            f"  ublk IOPS per core           {r['ublk_iops_per_core'] / 1e6:6.2f} M    ({r['ublk_cpu_us']:.3f} us CPU per I/O)", ""]
    if refused:
        out.append("instructions per request each goal leaves (filled in from scripts/insns.sh's baseline)")
        out += [f"  {k:<24} {v:>8.0f}" if v >= 0 else f"  {k:<24}     none (missed by {-v:.0f} without them)"
                for k, v in r["budgets"].items()]
        out.append(f"goals: not projected ({refused})")
    else:
        out.append("goals")
        out += [f"  {label:<52} {value:>10.2f} / {limit:<10.2f} {'met' if met else 'MISSED'}" for label, value, limit, met in goal_checks(r, costs)]
    return "\n".join(out)


def inputs_from_timeline(summary):
    """An inputs object from timeline-rxe.sh's summary.json (paths bench and ublk)."""
    paths = {}
    for name, key in (("library", "bench"), ("ublk", "ublk")):
        p = (summary.get("paths") or {}).get(key)
        if not isinstance(p, dict) or not isinstance(p.get("syscalls_per_io"), dict):
            raise InputError(f"the timeline summary has no paths.{key}.syscalls_per_io: wanted a run of scripts/timeline-rxe.sh with the {key} path")
        paths[name] = {"what": p.get("title"), "syscalls_per_io": {k: round(v, 4) for k, v in p["syscalls_per_io"].items()},
                       "switches_per_io": round(p["switches_per_io"], 4),
                       "involuntary_switches_per_io": round(p["involuntary_switches_per_io"], 4),
                       "post_syscall": "write", "rearm_syscall": "ioctl"}
    return {"source": {"what": "scripts/timeline-rxe.sh's summary.json, QD1 4 KiB randread under tracing, rxe in a TCG guest",
                       "date": summary.get("date"), "guest": summary.get("guest")},
            "paths": paths,
            "instructions_per_request": {"library": None, "ublk_server": None,
                                         "source": "PLACEHOLDER: filled in from scripts/insns.sh's baseline"}}


def main(argv):
    usage = "usage: projection.py INPUTS.json | projection.py --inputs-from TIMELINE_SUMMARY.json"
    args = argv[1:]
    if len(args) == 2 and args[0] == "--inputs-from":
        path = args[1]
    elif len(args) == 1 and not args[0].startswith("-"):
        path = args[0]
    else:
        print(usage, file=sys.stderr)
        return 2
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"projection: cannot read {path} as JSON: {e.__class__.__name__}: {e}", file=sys.stderr)
        return 2
    try:
        if args[0] == "--inputs-from":
            print(json.dumps(inputs_from_timeline(doc), indent=2))
            return 0
        try:
            print(render(project(doc)))
            return 0
        except MissingInstructions as e:
            print(render(floor(doc), refused="instructions per request not filled in"))
            print(f"projection: {path}: {e}", file=sys.stderr)
            return 1
    except InputError as e:
        print(f"projection: {path}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
