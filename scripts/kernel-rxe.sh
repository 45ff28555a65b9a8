#!/usr/bin/env bash
# Run rxe tests on a newer guest kernel than CI's 6.12, outside CI (issue 44):
#
#   scripts/kernel-rxe.sh [TEST[:FILTER]...]
#
# Boots scripts/rxe-guest.sh once with RXE_GUEST_SUITES=trixie-backports (unless set: that
# suite's newest kernel, 7.3.4 on 2026-12-07; its packages are linux-binary-, linux-modules- and
# linux-base-VER, no firmware), and in it prints the kernel's version, rxe0's link and the ublk
# driver's feature bits (rblk-test-client ublk-features), among them UPDATE_SIZE: the
# UBLK_U_CMD_UPDATE_SIZE a live ublk resize needs, which CI's 6.12 does not have. Then it runs
# the rxe (= ignored) tests of each TEST, a file of tests/tests (ublk for tests/tests/ublk.rs):
# those whose names contain FILTER, or all. Default: ublk:two_volumes_attached_at_once.
#
# The ublk online-resize test (issue 44) is tests/tests/ublk_grow.rs, a test target CI never
# builds (test = false in tests/Cargo.toml: it fails on 6.12, whose driver has no UPDATE_SIZE):
# `scripts/kernel-rxe.sh ublk_grow` attaches a 256 MiB volume, writes ext4 files, grows the
# volume to 1280 MiB with `rblk-target admin resize`, waits for the device to follow, runs
# resize2fs online and checks every file.
#
# Builds the debug binaries and the TEST executables first (cargo build --workspace
# --all-features --bins --test TEST...; the tests find the binaries by RBLK_BIN_DIR) and gives the
# guest a fresh 2 GiB scratch disk, as scripts/test.sh does. Writes build/kernel/: guest.log (the
# guest's stdout), stderr.log (rxe-guest.sh's stderr, each line stamped with the host's Unix
# time), table.txt and summary.json (scripts/lib/kernel.py: the kernel, the ublk features, the
# boot's time from the guest lock to rxe0 ACTIVE with its download and qemu parts, each test
# run). Fails when the guest did not boot, the ublk driver did not answer, or a test failed or
# none ran.
#
# Measured on 2026-12-07 (2 cores shared with other builds, load 4; host clock, to rxe0 ACTIVE):
# the first boot of 7.3.4, with the download (122 MB), unpacking, depmod and the initramfs,
# 25.3 s (12.0 s of it before qemu); cached 12.2 to 16.4 s (6.12 in the same hour: 10.0 and
# 13.1 s). The default run, boot and ublk:two_volumes_attached_at_once, 28 to 42 s. One boot of
# seven panicked early (the int3 oops in sched_clock_cpu that 6.12 shows too) and rxe-guest.sh
# booted it again. See docs/tests.md.
#
# Takes /tmp/rblk-guest.lock (RBLK_GUEST_LOCK=PATH another, empty none), unless this process
# already holds it. Environment: RXE_GUEST_SUITES, RXE_GUEST_TIMEOUT (default 1500 here), the
# rest of scripts/rxe-guest.sh's.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
SCRIPT_NAME=kernel-rxe
CALLER_PWD=$PWD
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh"

DEFAULT_TESTS=(ublk:two_volumes_attached_at_once)

# Copies stdin to stdout and each line to FILE after the host's Unix time: rxe-guest.sh's stderr,
# so that the boot can be timed from the guest lock to rxe0 ACTIVE.
stamp_lines() { # FILE
    local line
    while IFS= read -r line; do
        printf '%s %s\n' "$EPOCHREALTIME" "$line" >>"$1"
        printf '%s\n' "$line"
    done
}

host_main() {
    local -a specs=() names=() filters=()
    local a
    for a in "$@"; do
        case $a in
        -*) help_or_usage_error "$a" ;;
        *) specs+=("$a") ;;
        esac
    done
    ((${#specs[@]})) || specs=("${DEFAULT_TESTS[@]}")
    for a in "${specs[@]}"; do
        [[ ${a%%:*} =~ ^[a-z0-9_]+$ ]] || die "TEST must name a file of tests/tests (e.g. ublk), got '${a%%:*}'"
        names+=("${a%%:*}")
        if [[ $a == *:* && -n ${a#*:} ]]; then filters+=("${a#*:}"); else filters+=(-); fi
    done

    local out=$REPO_ROOT/build/kernel tdir json
    mkdir -p "$out"
    cd -- "$REPO_ROOT"
    local -a tests=()
    for a in "${names[@]}"; do tests+=(--test "$a"); done
    log "building the debug binaries and ${names[*]} (cargo build --workspace --all-features --bins ${tests[*]})"
    cargo build --workspace --all-features --bins "${tests[@]}" >&2 || die "cargo build failed"
    tdir=$(cargo metadata --no-deps --format-version 1 |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
    json=$out/test-executables.json
    cargo test --workspace --all-features --no-run --message-format=json "${tests[@]}" >"$json" 2>/dev/null ||
        die "cargo test --no-run failed"
    local -a exes guest_args=()
    mapfile -t exes < <(lib_python "$REPO_ROOT/scripts/lib/kernel.py" exes "$json" "${names[@]}")
    ((${#exes[@]} == ${#names[@]})) || die "cannot find the test executables"
    local i
    for i in "${!exes[@]}"; do guest_args+=("${exes[i]}" "${filters[i]}"); done

    local glog=$out/guest.log elog=$out/stderr.log
    : >"$glog"
    : >"$elog"
    # A fresh scratch disk, as scripts/test.sh gives CI's guest: the durability tests need one.
    local disk=$out/scratch.img
    rm -f "$disk"
    # shellcheck disable=SC2016 # expanded by that bash
    local -a cmd=(bash -c 'printf "@@meta guest_started %s\n" "$EPOCHREALTIME"; exec "$@"' kernel-rxe
        env RXE_GUEST_SUITES="${RXE_GUEST_SUITES:-trixie-backports}"
        RXE_GUEST_TIMEOUT="${RXE_GUEST_TIMEOUT:-1500}" RBLK_BIN_DIR="$tdir/debug"
        "$REPO_ROOT/scripts/rxe-guest.sh" --disk "$disk:2G" "$REPO_ROOT/scripts/kernel-rxe.sh" --in-guest
        "${guest_args[@]}")
    local rc=0
    set +e
    with_guest_lock "${cmd[@]}" 2> >(stamp_lines "$elog" >&2) | tee -a "$glog"
    rc=${PIPESTATUS[0]}
    set -e
    wait "$!" 2>/dev/null || true # the stamping of stderr
    printf '@@meta guest_ended %s\n' "$EPOCHREALTIME" >>"$glog"
    ((rc == 0)) || log "the guest run exited with status $rc"

    echo
    lib_python "$REPO_ROOT/scripts/lib/kernel.py" summary "$glog" "$elog" "$out/summary.json" |
        tee "$out/table.txt"
    local src=${PIPESTATUS[0]}
    log "wrote $out/table.txt and $out/summary.json"
    ((rc == 0 && src == 0))
}

# In the guest: EXE FILTER|- pairs.
guest_main() {
    export RBLK_KNOWN_TARGETS=none
    local k=""
    read -r k </proc/sys/kernel/osrelease
    printf '@@kernel %s\n' "$k"
    printf '@@rxe %s\n' "$(rdma link show "$RBLK_DEVICE/1" 2>&1)"
    modprobe ublk_drv || true
    local f
    if f=$("$RBLK_BIN_DIR/rblk-test-client" ublk-features 2>&1); then
        printf '@@ublk %s\n' "${f//$'\n'/$'\n'@@ublk }"
    else
        printf '@@ublk-error %s\n' "${f//$'\n'/ }"
    fi
    local exe filter rc
    while (($# >= 2)); do
        exe=$1 filter=$2
        shift 2
        local name=${exe##*/} args=()
        name=${name%-*} # cargo's test executable: NAME-HASH
        [[ $filter == - ]] || args=("$filter")
        printf '\n@@test-start %s %s %s\n' "$name" "$filter" "$EPOCHREALTIME"
        # --report-time: each result line ends in <SECONDS> (unstable: RUSTC_BOOTSTRAP).
        RUSTC_BOOTSTRAP=1 timeout -k 10 900 "$exe" --ignored --test-threads=1 --color never \
            -Z unstable-options --report-time "${args[@]}" 2>&1
        rc=$?
        printf '@@test-end %s %s\n' "$rc" "$EPOCHREALTIME"
    done
}

if [[ ${1:-} == --in-guest ]]; then
    shift
    (($# % 2 == 0)) || die "usage: $0 --in-guest [EXE FILTER|-]..."
    set +e # a failing test is reported, not fatal
    guest_main "$@"
else
    host_main "$@"
fi
