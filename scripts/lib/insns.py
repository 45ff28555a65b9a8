"""Instructions per request, counted by callgrind, and their gate (scripts/insns.sh).

Each scenario of scripts/insns-scenarios.json runs twice under
`valgrind --tool=callgrind --separate-threads=yes --collect-atstart=no`, for N and 11N requests;
callgrind collects only inside the scenario's region functions (`--toggle-collect`), minus the
functions toggled out inside them (the in-memory fabric's entry points). Toggling flips
collection at every match, so a leaf called inside a toggled-out function (memcpy inside the
fabric) cannot be toggled out too: such leaves ("subtract") are counted and their collected cost
is taken off afterwards. The region's Ir is the inclusive cost of the calls into it, in the thread
that made them; instructions per request are (Ir(11N) - Ir(N)) / 10N of that, so setup cancels
out. The gate compares them with scripts/insns-baseline.json when the rustc, valgrind and glibc
versions match.

Subcommands (scripts/insns.sh calls them; all read the scenario file):
  builds SCENARIOS                        `PACKAGE BINARY` to build, one a line
  names SCENARIOS                         the scenario names, one a line
  command SCENARIOS NAME N OUT BINDIR     the valgrind command line of one run, one word a line
  report SCENARIOS BASELINE DIR N [--update] [--repo DIR]
                                          the table; exit status 1 when the gate fails
"""

import fnmatch
import glob
import json
import os
import re
import subprocess
import sys

TOLERANCE = 0.05
BASELINE_PATH = "scripts/insns-baseline.json"


def load_scenarios(text):
    """The scenario file's scenarios, checked, each with the patterns common to all added to its
    own (`toggle_out`, `subtract`), and those common patterns."""
    doc = json.loads(text)
    common = {"toggle_out": doc.get("toggle_out", []), "subtract": doc.get("subtract", [])}
    scenarios = doc["scenarios"]
    seen = set()
    for s in scenarios:
        for key in ("name", "package", "binary", "args", "regions"):
            if key not in s:
                raise ValueError(f"scenario {s.get('name', '?')}: no {key!r}")
        if s["name"] in seen:
            raise ValueError(f"scenario {s['name']}: listed twice")
        if not s["regions"] or not all("insns_region" in r for r in s["regions"]):
            raise ValueError(f"scenario {s['name']}: each region must name an insns_region function")
        seen.add(s["name"])
        s["toggle_out"] = common["toggle_out"] + s.get("toggle_out", [])
        s["subtract"] = common["subtract"] + s.get("subtract", [])
    return scenarios, common


def valgrind_command(scenario, requests, out, bindir):
    """The argv of one callgrind run of `scenario` for `requests` requests, output to `out`."""
    cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--collect-atstart=no",
           "--dump-line=no", "--compress-strings=no", "--compress-pos=no",
           f"--callgrind-out-file={out}"]
    for pattern in scenario["regions"] + scenario["toggle_out"]:
        cmd.append(f"--toggle-collect={pattern}")
    cmd.append(os.path.join(bindir, scenario["binary"]))
    cmd.extend(scenario["args"])
    cmd.extend(["--requests", str(requests)])
    return cmd


def parse_part(text):
    """One callgrind output file (one thread's part): its thread number, its total Ir, the self
    cost of each function (the cost lines under `fn=`) and its calls as (caller, callee,
    inclusive Ir) arcs (the cost line after each `calls=`)."""
    thread = totals = events = fn = cfn = None
    costs, arcs, names = {}, [], {}
    after_calls = False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("thread:"):
            thread = int(line.split(":", 1)[1])
        elif line.startswith("events:"):
            events = line.split(":", 1)[1].split()
        elif line.startswith("totals:"):
            totals = int(line.split(":", 1)[1].split()[0])
        elif line.startswith("fn="):
            fn = _name(line[3:], names)
            costs.setdefault(fn, 0)
        elif line.startswith("cfn="):
            cfn = _name(line[4:], names)
        elif line.startswith("calls="):
            after_calls = True
        elif line[0].isdigit() or line[0] in "+-*":
            fields = line.split()
            cost = int(fields[1]) if len(fields) > 1 else 0
            if after_calls:
                arcs.append((fn, cfn, cost))
                after_calls = False
            elif fn is not None:
                costs[fn] += cost
    if events is None or events[0] != "Ir":
        raise ValueError("not a callgrind output with Ir as its first event")
    if totals is None:
        raise ValueError("no totals: line (callgrind did not finish writing it)")
    return {"thread": thread, "totals": totals, "costs": costs, "arcs": arcs}


def region_cost(part, regions):
    """Ir inside the region functions: the inclusive cost of every call into one from outside
    them (what collection saw while a region ran; memcpy or the fabric called elsewhere in the
    thread, which a toggle pattern also switches on, stays out)."""
    return sum(c for caller, callee, c in part["arcs"]
               if _matches(callee, regions) and not _matches(caller, regions))


def _name(spec, names):
    """A function name from `(id) name` or `(id)` (name compression) or a plain name."""
    m = re.match(r"\((\d+)\)(?: (.*))?$", spec)
    if not m:
        return spec
    if m.group(2) is not None:
        names[m.group(1)] = m.group(2)
    return names.get(m.group(1), spec)


def driver_part(parts, regions):
    """The one thread part that called a region function."""
    found = [p for p in parts if region_cost(p, regions) > 0]
    if len(found) != 1:
        raise ValueError(f"{len(found)} threads ran the region {', '.join(regions)} (expected 1): "
                         "is the function still out of line and named so?")
    return found[0]


def _matches(name, patterns):
    return name is not None and any(fnmatch.fnmatchcase(name, p) for p in patterns)


def nested_toggles(part, patterns):
    """Calls from a toggled-out function into another: each match flips collection, so the
    inner one was counted. Sorted (caller, callee) pairs."""
    return sorted({(a, b) for a, b, _ in part["arcs"] if _matches(a, patterns) and _matches(b, patterns)})


def subtracted(part, leaves):
    """Collected Ir of the calls into the `leaves` (memcpy): inside the region, outside the
    toggled-out functions, and whatever setup toggled in (the same in both runs)."""
    return sum(c for caller, callee, c in part["arcs"] if _matches(callee, leaves) and not _matches(caller, leaves))


def per_request(small, large, scenario, requests):
    """((region - leaves) Ir of the 11N run - the same of the N run) / 10N."""
    def ir(p):
        return region_cost(p, scenario["regions"]) - subtracted(p, scenario["subtract"])
    return (ir(large) - ir(small)) / (10 * requests)


def parse_versions(rustc_vv, valgrind_version, ldd_version):
    """The toolchain the figures depend on: `rustc -vV`'s release and commit, valgrind's
    version, glibc's (the first line of `ldd --version` ends with it)."""
    rustc = {}
    for line in rustc_vv.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            rustc[k.strip()] = v.strip()
    if "release" not in rustc:
        raise ValueError("rustc -vV printed no release: line")
    first = ldd_version.splitlines()[0] if ldd_version.strip() else ""
    m = re.search(r"(\d+\.\d+)\s*$", first)
    if not m:
        raise ValueError(f"ldd --version: no glibc version in {first!r}")
    return {"rustc": rustc["release"], "rustc_commit": rustc.get("commit-hash", "unknown"),
            "valgrind": valgrind_version.strip().removeprefix("valgrind-"), "glibc": m.group(1)}


def version_mismatch(baseline, current):
    """Why the figures cannot be compared with the baseline's, or None when they can."""
    why = [f"{k} {current.get(k)} != {baseline.get(k)} of the baseline"
           for k in ("rustc", "valgrind", "glibc") if current.get(k) != baseline.get(k)]
    return "; ".join(why) or None


def compare(figures, baseline, tolerance=TOLERANCE):
    """Rows (name, now, then, change) and failure messages: a scenario more than `tolerance`
    above or below its baseline, or with no baseline."""
    rows, failures = [], []
    for name, now in figures.items():
        then = baseline["scenarios"].get(name)
        if then is None:
            rows.append((name, now, None, None))
            failures.append(f"{name}: no baseline figure (a new scenario: record one)")
            continue
        change = now / then - 1
        rows.append((name, now, then, change))
        if abs(change) > tolerance:
            word = "rose" if change > 0 else "fell"
            failures.append(f"{name}: {word} by {change:+.1%} ({then:.1f} -> {now:.1f} "
                            f"instructions per request; the gate allows {tolerance:.0%})")
    return rows, failures


def table(rows):
    lines = [f"{'scenario':<28} {'insns/req':>10} {'baseline':>10} {'change':>8}"]
    for name, now, then, change in rows:
        then_s = "-" if then is None else f"{then:.1f}"
        change_s = "-" if change is None else f"{change:+.1%}"
        lines.append(f"{name:<28} {now:>10.1f} {then_s:>10} {change_s:>8}")
    return "\n".join(lines)


def commit_check(message, files, path=BASELINE_PATH):
    """Why HEAD's commit breaks the baseline's rule (changed alone, with a `Reason:` line), or
    None."""
    if path not in files:
        return None
    others = sorted(f for f in files if f != path)
    if others:
        return (f"HEAD changes {path} together with other files ({', '.join(others)}): "
                "commit a new baseline on its own")
    if not any(line.startswith("Reason:") for line in message.splitlines()):
        return f"HEAD changes {path} without a 'Reason:' line in its message"
    return None


def head_commit(repo):
    """HEAD's message and changed files, or None without git history (an exported tree)."""
    def git(*args):
        return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout
    try:
        git("rev-parse", "--verify", "-q", "HEAD")
    except (OSError, subprocess.CalledProcessError):
        return None
    message = git("log", "-1", "--format=%B", "HEAD")
    files = git("diff-tree", "--root", "--no-commit-id", "--name-only", "-r", "HEAD").split()
    return message, files


def read_parts(prefix):
    parts = [parse_part(open(f).read()) for f in sorted(glob.glob(prefix + "-*"))]
    if not parts:
        raise ValueError(f"no callgrind output at {prefix}-*")
    return parts


def figures_from(scenarios, outdir, requests):
    """Instructions per request of each scenario, from its two runs' outputs in `outdir`."""
    figures = {}
    for s in scenarios:
        small = driver_part(read_parts(os.path.join(outdir, f"{s['name']}-{requests}.out")), s["regions"])
        large = driver_part(read_parts(os.path.join(outdir, f"{s['name']}-{11 * requests}.out")),
                            s["regions"])
        nested = nested_toggles(large, s["toggle_out"])
        if nested:
            shown = ", ".join(f"{a} -> {b}" for a, b in nested)
            raise ValueError(f"{s['name']}: toggle patterns match nested functions ({shown}): "
                             "the inner one flips collection back on")
        figures[s["name"]] = per_request(small, large, s, requests)
    return figures


def report(argv):
    scenarios_path, baseline_path, outdir, requests = argv[:4]
    requests = int(requests)
    update = "--update" in argv
    repo = argv[argv.index("--repo") + 1] if "--repo" in argv else "."
    scenarios, _ = load_scenarios(open(scenarios_path).read())
    figures = figures_from(scenarios, outdir, requests)
    versions = parse_versions(*(open(os.path.join(outdir, f)).read()
                                for f in ("rustc.txt", "valgrind.txt", "ldd.txt")))
    if update:
        doc = {"versions": versions, "requests": requests,
               "scenarios": {k: round(v, 1) for k, v in figures.items()}}
        with open(baseline_path, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        print(table([(k, v, None, None) for k, v in figures.items()]))
        print(f"insns: wrote {baseline_path}; commit it on its own, with a line 'Reason: ...' in the "
              "message saying why the figures moved", file=sys.stderr)
        return 0
    if not os.path.exists(baseline_path):
        print(table([(k, v, None, None) for k, v in figures.items()]))
        print(f"insns: FAIL: no baseline at {baseline_path}: run scripts/insns.sh --update and commit "
              "that file alone, its message with a line 'Reason: ...'", file=sys.stderr)
        return 1
    with open(baseline_path) as f:
        baseline = json.load(f)
    failed = []
    mismatch = version_mismatch(baseline["versions"], versions)
    if mismatch:
        print(table([(k, v, None, None) for k, v in figures.items()]))
        print(f"insns: not compared: {mismatch}", file=sys.stderr)
    else:
        rows, failed = compare(figures, baseline)
        print(table(rows))
    head = head_commit(repo)
    if head is None:
        print("insns: no git history here: not checking that the baseline was committed on its own",
              file=sys.stderr)
    else:
        why = commit_check(*head)
        if why:
            failed.append(why)
    for f in failed:
        print(f"insns: FAIL: {f}", file=sys.stderr)
    if failed:
        print("insns: if the change is intended, run scripts/insns.sh --update and commit "
              f"{BASELINE_PATH} alone, its message with a line 'Reason: ...'", file=sys.stderr)
        return 1
    if not mismatch:
        print(f"insns: every scenario within {TOLERANCE:.0%} of the baseline", file=sys.stderr)
    return 0


def main(argv):
    cmd, rest = argv[0], argv[1:]
    if cmd == "report":
        return report(rest)
    scenarios, _ = load_scenarios(open(rest[0]).read())
    if cmd == "builds":
        for pb in dict.fromkeys((s["package"], s["binary"]) for s in scenarios):
            print(*pb)
    elif cmd == "names":
        for s in scenarios:
            print(s["name"])
    elif cmd == "command":
        name, requests, out, bindir = rest[1:5]
        s = next((s for s in scenarios if s["name"] == name), None)
        if s is None:
            raise SystemExit(f"insns: no scenario {name!r}")
        print("\n".join(valgrind_command(s, int(requests), out, bindir)))
    else:
        raise SystemExit(f"insns: unknown subcommand {cmd!r}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (ValueError, OSError) as e:
        print(f"insns: {e}", file=sys.stderr)
        sys.exit(2)
