#!/usr/bin/env bash
# What handing the volumes to a successor costs (`rblk-target --takeover`), measured over rxe in
# one guest boot with 8 GiB of memory (outside CI, ~5 minutes):
#
#   scripts/handover-rxe.sh [SIZE...]        # default: 64M 4G
#
# For each RAM volume size: `rblk attach`, fio 4 KiB random reads at QD1 for 20 s logging every
# completion, and at 5 s a successor from a copy of the binary takes over. Prints the longest
# gap between two fio completions across the handover, the time from the takeover request (the
# old daemon's log) to the successor's first successful OPEN (its log), the handover
# conversation alone (request to the old daemon's `bye`), and the registration time of the
# volume at its first OPEN in the old daemon and in the successor (measured apart: the same
# registration, once per daemon). fio's errors must be 0.
# Takes /tmp/rblk-guest.lock (one guest boot at a time).
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if [[ ${1:-} != --in-guest ]]; then
    cd "$REPO_ROOT"
    cargo build --workspace --bins
    exec flock /tmp/rblk-guest.lock env RBLK_BIN_DIR="$REPO_ROOT/build/debug" RXE_GUEST_MEM="${RXE_GUEST_MEM:-8G}" \
        scripts/rxe-guest.sh "$REPO_ROOT/scripts/handover-rxe.sh" --in-guest "${@:-64M 4G}"
fi
shift
sizes=${*:-64M 4G}

bin=${RBLK_BIN_DIR:?}
addr=${RBLK_ADDR:?}
modprobe ublk_drv
dir=/tmp/handover-rxe
rm -rf "$dir"
mkdir -p "$dir"
cp "$bin/rblk-target" "$dir/rblk-target-next"
export RBLK_RUN_DIR=/run/rblk-handover

wait_for() { # FILE TEXT
    for _ in $(seq 600); do
        grep -q "$2" "$1" && return 0
        sleep 0.1
    done
    echo "handover-rxe: no '$2' in $1" >&2
    cat "$1" >&2
    return 1
}

run() {
    local size=$1 port=7431
    local args=(--allow-any-host --listen "$addr:$port" --admin-socket "$dir/admin.sock" --volume "v:$size")
    RUST_LOG=info "$bin/rblk-target" "${args[@]}" >"$dir/old-$size.log" 2>&1 &
    local old=$!
    wait_for "$dir/old-$size.log" "listening on"
    local out dev
    out=$("$bin/rblk" attach "rblk://$addr:$port/v" --daemon --reconnect-delay 200ms 2>&1)
    dev=$(grep -m1 '^/dev/ublkb' <<<"$out")
    rm -f "$dir"/lat_*
    fio --name=t --filename="$dev" --ioengine=libaio --direct=1 --rw=randread --bs=4k --iodepth=1 \
        --size=64M --time_based --runtime=20 --write_lat_log="$dir/lat" --log_avg_msec=0 \
        --output-format=terse --terse-version=3 >"$dir/fio-$size.out" &
    local fio=$!
    sleep 5
    RUST_LOG=info "$dir/rblk-target-next" "${args[@]}" --takeover >"$dir/new-$size.log" 2>&1 &
    local new=$!
    wait "$old" || true
    wait_for "$dir/new-$size.log" "control: opened"
    wait "$fio" || true
    python3 - "$size" "$dir" <<'EOF'
import datetime, glob, re, sys
size, d = sys.argv[1], sys.argv[2]
def stamp(path, text):
    for line in open(path, errors="replace"):
        if text in line:
            m = re.match(r"(\S+Z)", line.split("] ")[-1] if line.startswith("[") else line)
            if m:
                return datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00"))
    return None
def ms(line_text, path):
    for line in open(path, errors="replace"):
        if line_text in line:
            m = re.search(r"in (\d+) ms", line)
            if m:
                return int(m.group(1))
    return None
old, new = f"{d}/old-{size}.log", f"{d}/new-{size}.log"
asked = stamp(old, "asks to take the volumes over")
bye = stamp(old, "the successor is ready")
opened = stamp(new, "control: opened")
times = sorted(int(l.split(",")[0]) for f in glob.glob(f"{d}/lat_clat.*.log") for l in open(f) if l.strip())
gap = max(b - a for a, b in zip(times, times[1:])) if len(times) > 1 else None
terse = open(f"{d}/fio-{size}.out").read().strip().splitlines()[-1].split(";")
print(f"handover {size:>5}: longest gap between fio completions {gap} ms ({len(times)} reads, fio errors {terse[4]}); "
      f"request to first OPEN {(opened - asked).total_seconds() * 1e3:.0f} ms; request to bye "
      f"{(bye - asked).total_seconds() * 1e3:.0f} ms; registration at the first OPEN: old daemon "
      f"{ms('registered', old)} ms, successor {ms('registered', new)} ms")
EOF
    "$bin/rblk" detach "$dev" >/dev/null
    kill -TERM "$new"
    wait "$new" || true
}

for size in $sizes; do
    run "$size"
done
