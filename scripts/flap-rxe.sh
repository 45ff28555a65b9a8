#!/usr/bin/env bash
# A real link flap under fio, kept out of CI (about 2 minutes of guest time; issue 25 item 8):
#
#   scripts/flap-rxe.sh [--down SECS] [--ram] [--qd N] [--reconnect-delay SECS] [--lead SECS]
#                       [--after SECS]
#
# Defaults: --down 5, a durable volume, --qd 16, --reconnect-delay 1, --lead 4 (seconds of reads
# before the flap), --after 10 (seconds of reads after the link is back, plus the pass then running).
#
# Builds rblk-target and rblk (cargo build, debug; RBLK_BIN_DIR=DIR takes them from DIR instead,
# relative to where the script was started) and copies them to build/flap-rxe/bin, so a cargo build
# by someone else cannot swap them mid-run. Boots the rxe guest once (scripts/rxe-guest.sh, 6.12
# for ublk_drv; a scratch disk, build/flap-rxe/disk.img, for the durable volume) under
# `flock /tmp/rblk-guest.lock` (RBLK_GUEST_LOCK=PATH for another lock file, RBLK_GUEST_LOCK= for
# none; a caller that holds it already is noticed).
#
# Two rxe devices that are not one loopback, in one guest. Network namespaces do not work on the
# guest's 6.12 kernel: rxe opens its UDP socket (port 4791) in the initial namespace only and looks
# routes up there, so an rxe device on a veth end moved to another namespace neither receives nor
# routes (rping between two namespaces times out; the sender's GSI QP goes to the error state).
# Instead both veth ends stay in the initial namespace, each with its own rxe device, and policy
# routing makes the traffic between their addresses cross the veth instead of the local loopback:
#
#   initiator  rxe-ini on flap-i 10.97.0.1/24  <== veth, MTU 9000 ==>  flap-t 10.97.0.2/32 rxe-tgt  target
#
#   ip rule 90  iif flap-t lookup local      what arrives on a veth end is delivered locally
#   ip rule 91  iif flap-i lookup local
#   ip rule 97  iif lo to 10.97.0.2 lookup main    flap-i's connected route (gone while flap-i is
#                                                  down, back when it is up, as on a real NIC)
#   ip rule 98  to 10.97.0.1 lookup 98             table 98: 10.97.0.1 dev flap-t
#   ip rule 99  iif lo to 10.97.0.2 lookup 99      table 99: unreachable (no loopback shortcut
#                                                  while flap-i is down)
#   ip rule 1000 lookup local                      (moved from 0, after the rules above)
#   accept_local=1 and rp_filter=0: a packet from one of our own addresses arrives on a veth end.
#
# ARP replies leaving flap-t are delayed 1 ms (tc netem): over a bare veth the reply arrives
# within the request's own transmit, before the kernel's rdma_cm address resolution has queued the
# request, which then misses the neighbour update and waits for its whole timeout (measured: rping
# connects in 2.6-2.9 s with an empty neighbour table, 0.7 s with the delay). A wire never answers
# that fast.
#
# Then: rblk-target serves `v` (64 MiB; durable on the scratch disk, or RAM with --ram) on
# 10.97.0.2 over rxe-tgt; `rblk attach rblk://10.97.0.2/v --device rxe-ini --daemon
# --reconnect-delay D` (default --ctrl-loss-tmo, no --fast-io-fail-tmo); fio writes 16 MiB with
# crc32c verify headers (QD16, then fsync), then reads them back verifying, pass after pass
# (--rw=randread --verify=crc32c --iodepth=QD --continue_on_error=all; fio verifies each block once
# per run), while, after --lead s, `ip link set flap-i down`, --down s, `ip link set flap-i up`
# (the initiator's link); then one sequential verify pass over the 16 MiB. It prints:
#
#   fio errors        fio's total_err over the read passes (EIO and verify failures alike)
#   verify pass       total_err of the pass after the flap
#   longest read      fio's largest completion latency (the stall)
#   reconnect         from `ip link set flap-i up` to the initiator's "reconnected" log line, and
#                     the reconnect attempt's own duration (from that line)
#   GSI QPs           the state of both devices' QP1 at the end (rxe loses rdma_cm for good when
#                     it goes to ERR)
#
# and PASS when fio failed no I/O, the verify pass found nothing, and the reconnect attempt that
# succeeded started within --reconnect-delay (plus 0.5 s for the guest's scheduling) of the link
# coming back; FAIL otherwise (exit status 1). The guest's output is build/flap-rxe/guest.log.
#
# Measured 2026-12-03 (debug build, 6.12, TCG; about 2 minutes of guest run, 12,288 verified
# reads in 3 passes): durable QD16 and RAM QD8 both PASS, 0 fio errors, the link down 5.7-5.9 s
# (the 5 s sleep under TCG), the loss seen 0.3 s after, the longest read 6.3 s, "reconnected"
# 0.57 s and 0.74 s after the link came back (attempts of 92 and 73 ms). The same run with the
# initiator from before it sent no disconnect request while its port is down (initiator/src/
# conn.rs): FAIL, reads stuck, rxe-ini's GSI QP in ERR, every reconnect attempt timed out.
set -euo pipefail
shopt -s inherit_errexit

REPO_ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
CALLER_PWD=$PWD
cd "$REPO_ROOT"

OUT=build/flap-rxe
SCRIPT_NAME=flap-rxe
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh"

INI_ADDR=10.97.0.1
TGT_ADDR=10.97.0.2
INI_IF=flap-i
TGT_IF=flap-t
INI_DEV=rxe-ini
TGT_DEV=rxe-tgt
DATA=16M
SCRATCH=/mnt/rblk-flap
# How long the last read pass may take once told to stop, before I/O counts as stuck.
STUCK_SECS=60

# ---------------------------------------------------------------------------------------------------
# In the guest. Results on stdout as `@@result KEY VALUE`, progress on stderr.

# Seconds since the epoch of a tracing timestamp (2026-12-03T09:39:51.461971Z).
epoch_of() { date -u -d "$1" +%s.%N; }
# A - B, in seconds with two decimals.
minus() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a - b }'; }

setup_pair() {
    local d
    ip link add "$INI_IF" mtu 9000 type veth peer name "$TGT_IF" mtu 9000
    ip addr add "$INI_ADDR/24" dev "$INI_IF"
    ip addr add "$TGT_ADDR/32" dev "$TGT_IF"
    for d in all default "$INI_IF" "$TGT_IF"; do
        sysctl -qw "net.ipv4.conf.$d.accept_local=1" "net.ipv4.conf.$d.rp_filter=0"
    done
    ip link set "$INI_IF" up
    ip link set "$TGT_IF" up
    ip -batch - <<EOT
route add $INI_ADDR dev $TGT_IF src $TGT_ADDR table 98
route add unreachable $TGT_ADDR table 99
rule add pref 90 iif $TGT_IF lookup local
rule add pref 91 iif $INI_IF lookup local
rule add pref 97 iif lo to $TGT_ADDR lookup main
rule add pref 98 to $INI_ADDR lookup 98
rule add pref 99 iif lo to $TGT_ADDR lookup 99
rule add pref 1000 lookup local
rule del pref 0
EOT
    tc qdisc add dev "$TGT_IF" root handle 1: prio
    tc qdisc add dev "$TGT_IF" parent 1:3 handle 30: netem delay 1ms
    tc filter add dev "$TGT_IF" parent 1: protocol arp matchall flowid 1:3
    rdma link add "$INI_DEV" type rxe netdev "$INI_IF"
    rdma link add "$TGT_DEV" type rxe netdev "$TGT_IF"
    local route
    route=$(ip route get "$TGT_ADDR")
    [[ $route == *"dev $INI_IF"* ]] || die "10.97.0.2 is not routed over $INI_IF: $route"
    route=$(ip route get "$INI_ADDR")
    [[ $route == *"dev $TGT_IF"* ]] || die "10.97.0.1 is not routed over $TGT_IF: $route"
    local _
    for _ in $(seq 1 100); do
        [[ $(rdma link show "$INI_DEV/1") == *ACTIVE* && $(rdma link show "$TGT_DEV/1") == *ACTIVE* ]] && return 0
        sleep 0.1
    done
    die "$INI_DEV and $TGT_DEV did not become ACTIVE"
}

# The packets flap-i has sent.
tx_packets() { cat "/sys/class/net/$INI_IF/statistics/tx_packets"; }

# fio's JSON report FILE: "total_err first_error total_ios clat_max_ms".
fio_figures() { python3 "$REPO_ROOT/scripts/lib/flap.py" fio "$1"; }

guest_main() {
    local bin=$1 down=$2 mode=$3 qd=$4 delay=$5 lead=$6 after=$7
    local work
    work=$(mktemp -d /tmp/rblk-flap.XXXXXX)
    printf '@@meta guest_kernel %s\n@@meta fio %s\n' "$(uname -r)" "$(fio --version)"
    modprobe -a ublk_drv sch_prio sch_netem cls_matchall >&2 || die "cannot load ublk_drv, sch_prio, sch_netem, cls_matchall"
    setup_pair
    log "$INI_DEV on $INI_IF ($INI_ADDR) and $TGT_DEV on $TGT_IF ($TGT_ADDR): ACTIVE"

    local volume="v:64M" state=()
    if [[ $mode == durable ]]; then
        [[ -n ${RBLK_DISK:-} ]] || die "no scratch disk (RBLK_DISK) for the durable volume"
        mkfs.ext4 -q -F "$RBLK_DISK"
        mkdir -p "$SCRATCH"
        mount "$RBLK_DISK" "$SCRATCH"
        volume="v:64M:$SCRATCH/v.img"
        state=(--state-dir "$SCRATCH/state")
    fi
    # shellcheck source=lib/target.sh
    source "$REPO_ROOT/scripts/lib/target.sh"
    start_target "$work/target.log" "$bin" 30 --listen "$TGT_ADDR" --device "$TGT_DEV" --admin-socket none \
        --volume "$volume" "${state[@]}" || die "rblk-target did not start"
    local tpid=$TARGET_PID
    # shellcheck disable=SC2064 # expand now
    trap "kill -TERM $tpid 2>/dev/null || true" EXIT

    local ilog=$work/attach.log dev
    dev=$(RUST_LOG=${RUST_LOG:-info} "$bin/rblk" attach "rblk://$TGT_ADDR/v" --device "$INI_DEV" --daemon \
        --log-file "$ilog" --reconnect-delay "$delay" | sed -n 1p) || true
    [[ $dev == /dev/ublkb* ]] || {
        cat "$ilog" >&2 || true
        die "rblk attach failed"
    }
    log "attached $dev ($mode volume); writing $DATA with verify headers"
    local fio_common=(--filename="$dev" --ioengine=libaio --direct=1 --bs=4k --size="$DATA" --verify=crc32c)
    fio --name=fill "${fio_common[@]}" --rw=write --iodepth=16 --do_verify=0 --end_fsync=1 \
        --output-format=json >"$work/fill.json" || die "the write pass failed: $(cat "$work/fill.json")"

    # fio verifies a read job's blocks once per run (with libaio and a queue, time_based ends
    # after one pass), so passes over the data run back to back until told to stop.
    local tx0 t_down t_up
    tx0=$(tx_packets)
    log "reading with verify at QD$qd, pass after pass; the link goes down in $lead s for $down s"
    (
        i=0
        until [[ -e $work/stop ]]; do
            i=$((i + 1))
            fio --name=flap "${fio_common[@]}" --rw=randread --iodepth="$qd" --verify_fatal=0 \
                --continue_on_error=all --output-format=json >"$work/pass.$i.json" 2>"$work/pass.$i.err" || true
        done
    ) &
    local rpid=$!
    sleep "$lead"
    t_down=$(date -u +%s.%N)
    ip link set "$INI_IF" down
    log "ip link set $INI_IF down"
    sleep "$down"
    ip link set "$INI_IF" up
    t_up=$(date -u +%s.%N)
    log "ip link set $INI_IF up, after $(minus "$t_up" "$t_down") s"
    sleep "$after"
    touch "$work/stop"
    # A pass takes seconds (16 MiB at a few hundred reads/s under TCG, debug build).
    local hung=0 until=$((SECONDS + STUCK_SECS))
    while kill -0 "$rpid" 2>/dev/null && ((SECONDS < until)); do
        sleep 0.5
    done
    if kill -0 "$rpid" 2>/dev/null; then
        hung=1
        log "a read pass still runs $((after + STUCK_SECS)) s after the link came back: I/O is stuck"
        pkill -KILL -P "$rpid" || true
        kill -KILL "$rpid" 2>/dev/null || true
    fi
    wait "$rpid" || true

    local ferr=NA ffirst=NA fios=NA fmax=NA verr=NA passes=0
    if ((!hung)); then
        read -r passes ferr ffirst fios fmax < <(python3 "$REPO_ROOT/scripts/lib/flap.py" passes "$work"/pass.*.json)
        log "verifying all $DATA once more"
        fio --name=verify "${fio_common[@]}" --rw=read --iodepth=16 --verify_fatal=0 --continue_on_error=all \
            --output-format=json >"$work/verify.json" 2>"$work/verify.err" || true
        read -r verr _ _ _ < <(fio_figures "$work/verify.json") || true
    fi

    # The initiator's log: loss, attempts, the reconnect.
    local line t_lost="" t_rec="" attempt_ms="" attempts
    line=$(grep -m1 'the session to the target was lost' "$ilog" || true)
    [[ -n $line ]] && t_lost=$(epoch_of "${line%% *}")
    line=$(grep -m1 'reconnected after' "$ilog" || true)
    if [[ -n $line ]]; then
        t_rec=$(epoch_of "${line%% *}")
        attempt_ms=$(sed -n 's/.*the attempt took \([0-9]*\) ms.*/\1/p' <<<"$line")
    fi
    attempts=$(grep -c 'reconnecting failed' "$ilog" || true)

    printf '@@result mode %s\n@@result qd %s\n@@result reconnect_delay_s %s\n' "$mode" "$qd" "$delay"
    printf '@@result link_down_s %s\n' "$(minus "$t_up" "$t_down")"
    printf '@@result fio_hung %s\n@@result fio_errors %s\n@@result fio_first_error %s\n' "$hung" "$ferr" "$ffirst"
    printf '@@result fio_passes %s\n' "$passes"
    printf '@@result fio_reads %s\n@@result longest_read_ms %s\n@@result verify_pass_errors %s\n' "$fios" "$fmax" "$verr"
    printf '@@result loss_seen_after_down_s %s\n' "$([[ -n $t_lost ]] && minus "$t_lost" "$t_down" || echo NA)"
    printf '@@result failed_attempts %s\n' "$attempts"
    if [[ -n $t_rec ]]; then
        printf '@@result reconnected_after_up_s %s\n@@result reconnect_attempt_ms %s\n' \
            "$(minus "$t_rec" "$t_up")" "$attempt_ms"
    else
        printf '@@result reconnected_after_up_s NA\n@@result reconnect_attempt_ms NA\n'
    fi
    printf '@@result veth_tx_packets %s\n' "$(($(tx_packets) - tx0))"
    printf '@@result gsi_qps %s\n' "$(rdma res show qp | awk '/type GSI/ { printf "%s:%s ", $2, $8 }')"

    echo "@@begin fio stderr"
    cat "$work"/pass.*.err "$work/verify.err" 2>/dev/null | head -n 40 || true
    echo "@@end"
    echo "@@begin attach.log"
    grep -v 'keepalive' "$ilog" | cut -c1-400 || true
    echo "@@end"
    echo "@@begin target.log"
    grep -v 'caps allow\|allow-any-host\|no --key-file' "$work/target.log" | cut -c1-400 || true
    echo "@@end"
    # Stuck I/O would hold the detach's final flush too.
    ((hung)) || "$bin/rblk" detach "$dev" >&2 || log "rblk detach $dev failed"
}

# ---------------------------------------------------------------------------------------------------
# On the host.

# The summary of the guest's @@result lines in LOG, and the verdict (exit status): scripts/lib/flap.py.
summarize() { lib_python "$REPO_ROOT/scripts/lib/flap.py" summary "$1" "$INI_IF"; }

host_main() {
    local down=5 mode=durable qd=16 delay=1 lead=4 after=10
    while (($#)); do
        case $1 in
        --down | --qd | --reconnect-delay | --lead | --after)
            (($# >= 2)) || die "$1 needs a value"
            case $1 in
            --down) down=$2 ;;
            --qd) qd=$2 ;;
            --reconnect-delay) delay=$2 ;;
            --lead) lead=$2 ;;
            --after) after=$2 ;;
            esac
            shift
            ;;
        --ram) mode=ram ;;
        *) help_or_usage_error "$1" ;;
        esac
        shift
    done
    local v
    for v in "$down" "$qd" "$delay" "$lead" "$after"; do
        is_count "$v" || die "--down, --qd, --reconnect-delay, --lead and --after take whole numbers above 0 (got '$v')"
    done

    if [[ -n ${RBLK_BIN_DIR:-} ]]; then
        local d=$RBLK_BIN_DIR
        [[ $d == /* ]] || d=$CALLER_PWD/$d
        BIN_DIR=$(cd -- "$d" 2>/dev/null && pwd -P) || die "RBLK_BIN_DIR=$RBLK_BIN_DIR is not a directory"
    else
        log "building rblk-target and rblk (cargo build, debug)"
        cargo build -p rblk-target -p rblk --bins >&2 || die "cargo build failed"
        BIN_DIR=$REPO_ROOT/${CARGO_TARGET_DIR:-build}/debug
    fi
    mkdir -p "$OUT"
    # (A second run from the copies of the first one copies nothing.)
    if [[ $BIN_DIR != "$(cd -- "$OUT" && pwd -P)/bin" ]]; then
        snapshot_bins "$OUT/bin" rblk-target rblk
    fi

    local glog=$OUT/guest.log disk=()
    if [[ $mode == durable ]]; then
        rm -f "$OUT/disk.img"
        disk=(--disk "$OUT/disk.img:512M")
    fi
    local rc=0
    RXE_GUEST_TIMEOUT=${RXE_GUEST_TIMEOUT:-$((360 + lead + down + after))} guest_tee "$glog" "${disk[@]}" \
        "$REPO_ROOT/scripts/flap-rxe.sh" --in-guest "$BIN_DIR" "$down" "$mode" "$qd" "$delay" "$lead" "$after" \
        >/dev/null || rc=$?
    ((rc == 0)) || die "the guest run failed (exit status $rc); see $glog"
    summarize "$glog"
}

script_main 7 "BIN_DIR DOWN MODE QD DELAY LEAD AFTER" "$@"
