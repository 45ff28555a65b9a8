#!/usr/bin/env bash
# Instructions per request on the host, counted by callgrind, and their gate against a committed
# baseline (issue 45, item 3; docs/performance.md, "Instructions per request"):
#
#   scripts/insns.sh [--update] [--requests N]
#
# Builds the scenarios' binaries (scripts/insns-scenarios.json: today the lane bench,
# `cargo build --profile insns -p rblk-lane-bench`: release without debug info), runs each
# scenario under `valgrind --tool=callgrind` for N and 11N requests (the two at once), and hands
# the outputs to scripts/lib/insns.py, which prints instructions per request
# ((Ir(11N) - Ir(N)) / 10N, in the thread that ran the scenario's region) against
# scripts/insns-baseline.json.
#
# Fails (exit 1) when a scenario rose or fell by more than 5% against the baseline, or when HEAD's
# commit changed the baseline together with other files or without a `Reason:` line. Compares
# only when the baseline's rustc, valgrind and glibc versions are this host's; otherwise it says
# "not compared" and why, and passes.
#
#   --update       write the figures to scripts/insns-baseline.json instead of comparing (then
#                  commit that file on its own, with a line `Reason: ...` in the message)
#   --requests N   requests of the short run (default 256; a multiple of 128)
#
# Environment: INSNS_OUT (the directory for callgrind's outputs; default BUILD/callgrind, where BUILD is
# Cargo's build directory).
set -euo pipefail
shopt -s inherit_errexit

SCRIPT_NAME=insns
REPO_ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=scripts/lib/script.sh
. "$REPO_ROOT/scripts/lib/script.sh"

SCENARIOS=$REPO_ROOT/scripts/insns-scenarios.json
BASELINE=$REPO_ROOT/scripts/insns-baseline.json

main() {
    local update=() requests=256
    while (($#)); do
        case $1 in
        --update) update=(--update) ;;
        --requests)
            is_count "${2:-}" || die "--requests needs a positive number"
            requests=$2
            shift
            ;;
        *) help_or_usage_error "$1" ;;
        esac
        shift
    done
    command -v valgrind >/dev/null || die "valgrind is not installed (scripts/deps.sh installs it)"
    cd "$REPO_ROOT"

    local -a builds build_args=()
    mapfile -t builds < <(lib_python -m insns builds "$SCENARIOS")
    local pb
    for pb in "${builds[@]}"; do
        build_args+=(-p "${pb% *}" --bin "${pb#* }")
    done
    log "building ${builds[*]} (profile insns: release without debug info)"
    cargo build --profile insns "${build_args[@]}"
    local build_dir
    build_dir=$(cargo metadata --no-deps --format-version 1 |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
    local out=${INSNS_OUT:-$build_dir/callgrind}
    rm -rf "$out"
    mkdir -p "$out"
    rustc -vV >"$out/rustc.txt"
    valgrind --version >"$out/valgrind.txt"
    ldd --version >"$out/ldd.txt"

    local -a names cmd
    mapfile -t names < <(lib_python -m insns names "$SCENARIOS")
    local name n
    local -a pids
    for name in "${names[@]}"; do
        log "$name: $requests and $((11 * requests)) requests"
        pids=()
        for n in "$requests" $((11 * requests)); do
            mapfile -t cmd < <(lib_python -m insns command "$SCENARIOS" "$name" "$n" \
                "$out/$name-$n.out" "$build_dir/insns")
            "${cmd[@]}" >"$out/$name-$n.log" 2>&1 &
            pids+=($!)
        done
        local -a failed=()
        for n in 0 1; do
            wait "${pids[n]}" || failed+=($((n == 0 ? requests : 11 * requests)))
        done
        for n in "${failed[@]}"; do
            tail -n 20 "$out/$name-$n.log" >&2
            die "$name: the run of $n requests failed (log: $out/$name-$n.log)"
        done
    done
    lib_python -m insns report "$SCENARIOS" "$BASELINE" "$out" "$requests" --repo "$REPO_ROOT" "${update[@]}"
}

main "$@"
