#!/usr/bin/env bash
# Reconnect soak over rxe, kept out of CI (about 5 minutes of guest time):
#
#   scripts/soak-reconnect.sh [SECONDS]        # default 240
#
# Builds the binaries on the host, boots the rxe guest with a scratch disk, and there runs one
# rblk-target with four durable volumes (v1..v4, 128 MiB each, on the scratch disk) and four
# `rblk-bench --rw randrw --verify --numjobs 4` processes, one per volume, for SECONDS. Meanwhile:
# - every 30 s the bench on v1 is SIGKILLed and started again (the target must reap its
#   session: its queue pairs vanish without CLOSE);
# - once, half-way, the target is restarted gracefully (SIGTERM, then start): the other benches
#   reconnect and carry on.
# It passes when every bench run that was not killed exits 0 with zero verify mismatches, and
# the target's RDMA resources (`rdma res show qp|mr|pd` of its process) return to their
# baseline once the benches are gone. The last line says so:
#   soak: PASS: ... | soak: FAIL: ...
# The guest's output is also in build/guest/soak.log; one guest at a time (the guest lock, as
# scripts/lib/script.sh's guest_tee takes it).
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SCRIPT_NAME=soak
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh"

if [[ ${1:-} != --in-guest ]]; then
    secs=${1:-240}
    cd "$REPO_ROOT"
    cargo build --release --workspace --all-features --bins
    mkdir -p build/guest
    disk=build/guest/soak.img
    rm -f "$disk"
    BIN_DIR=$REPO_ROOT/build/release
    # SECONDS as an argument: rxe-guest.sh passes only RBLK_*, RUST_*, PATH and CI variables on.
    guest_tee build/guest/soak.log --disk "$disk:2G" "$REPO_ROOT/scripts/soak-reconnect.sh" --in-guest "$secs"
    exit
fi

# ---- in the guest ----
# shellcheck source=lib/target.sh
source "$REPO_ROOT/scripts/lib/target.sh"
B=$RBLK_BIN_DIR
SECS=${2:-240}
PORT=7500
DIR=/mnt/soak
mkdir -p "$DIR"
mkfs.ext4 -q -F "$RBLK_DISK"
mount "$RBLK_DISK" "$DIR"
vols=()
for i in 1 2 3 4; do vols+=(--volume "v$i:128M:$DIR/v$i.img"); done

tpid=
start_target() {
    "$B/rblk-target" --allow-any-host --listen "$RBLK_ADDR:$PORT" "${vols[@]}" --state-dir "$DIR/state" 2>>/tmp/soak-target.log &
    tpid=$!
    wait_lines /tmp/soak-target.log "listening on" "$1" 30 && return
    echo "soak: FAIL: rblk-target did not start"
    exit 1
}

# The target's RDMA resources: "qp N mr N pd N".
resources() {
    local kind out=""
    for kind in qp mr pd; do
        out+="$kind $(rdma res show "$kind" 2>/dev/null | grep -c "pid $tpid " || true) "
    done
    echo "$out"
}

start_target 1
sleep 1
baseline=$(resources)
echo "soak: target pid $tpid, baseline resources: $baseline"

declare -A pid_of
runs=0
bench() { # VOLUME SECONDS TAG
    "$B/rblk-bench" "rblk://$RBLK_ADDR:$PORT/$1" --rw randrw --bs 4k --verify --numjobs 4 --iodepth 8 \
        --runtime "$2" --reconnect-delay 1 --quiet -o json --group_reporting --output "/tmp/soak-$3.json" \
        >"/tmp/soak-$3.out" 2>&1 &
    pid_of[$3]=$!
    runs=$((runs + 1))
}

# The verify mismatches in rblk-bench's report $1 (fio's layout, read by scripts/lib/report.py's
# one converter), or why there are none.
mismatches() {
    PYTHONPATH="$REPO_ROOT/scripts/lib" python3 - "$1" <<'PY' 2>&1 | tail -n 1
import json, sys
from report import bench_report
v = bench_report(json.load(open(sys.argv[1])))["verify"]
print(v["mismatches"] if v and v["blocks_checked"] else f"no blocks checked: {v}")
PY
}

started=$(date +%s)
for i in 1 2 3 4; do bench "v$i" "$SECS" "v$i"; done
kills=0 restarted=0 cur=v1
while (($(date +%s) - started < SECS - 10)); do
    sleep 30
    elapsed=$(($(date +%s) - started))
    # Kill v1's bench and start it again for the time that is left.
    if [[ -n ${pid_of[$cur]:-} ]]; then
        kill -KILL "${pid_of[$cur]}" 2>/dev/null || true
        wait "${pid_of[$cur]}" 2>/dev/null || true
        unset "pid_of[$cur]"
        kills=$((kills + 1))
    fi
    left=$((SECS - elapsed))
    if ((left > 5)); then
        cur="v1-$kills"
        bench v1 "$left" "$cur"
    fi
    if ((restarted == 0 && elapsed >= SECS / 2)); then
        echo "soak: restarting the target at ${elapsed}s"
        kill -TERM "$tpid"
        wait "$tpid" || { echo "soak: FAIL: the target did not exit 0 after SIGTERM"; exit 1; }
        start_target 2
        restarted=1
    fi
done

fail=()
for tag in "${!pid_of[@]}"; do
    if ! wait "${pid_of[$tag]}"; then
        fail+=("bench $tag exited non-zero: $(tail -3 "/tmp/soak-$tag.out" | tr '\n' ' ')")
        continue
    fi
    m=$(mismatches "/tmp/soak-$tag.json") || true
    [[ $m == 0 ]] || fail+=("bench $tag: $m mismatches")
done

# Every session is gone: the resources come back to the baseline.
now=
for _ in $(seq 60); do
    now=$(resources)
    [[ $now == "$baseline" ]] && break
    sleep 1
done
[[ $now == "$baseline" ]] || fail+=("target resources $now, baseline $baseline")
kill -TERM "$tpid"
wait "$tpid" || fail+=("the target did not exit 0 at the end")

summary="$runs bench runs ($kills SIGKILLed), target restarted $restarted time(s), resources $now (baseline $baseline)"
if ((${#fail[@]})); then
    printf 'soak: %s\n' "${fail[@]}"
    echo "soak: FAIL: $summary"
    exit 1
fi
echo "soak: PASS: $summary, zero mismatches"
