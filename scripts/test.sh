#!/usr/bin/env bash
# The project's one test command (the README and CI call it):
#
#   scripts/test.sh
#
# Steps, each announced with a `== step ==` line; the first failing step fails the run:
#   deps      host packages (scripts/deps.sh)
#   fmt       cargo fmt --all --check
#   scripts   shellcheck -x over scripts/*.sh, scripts/lib/*.sh, scripts/lib/guest/*.sh and .ci/run;
#             pyflakes3 over scripts/*.py and scripts/lib/*.py; scripts/lib/scriptlint.py (no heredoc
#             over 20 lines, no script over 400 lines but rxe-guest.sh)
#   clippy    cargo clippy --workspace --all-targets --all-features -- -D warnings
#   test      cargo test --workspace --all-features on the host (the rxe tests show as ignored)
#   insns     scripts/insns.sh: instructions per request under callgrind (host, in-memory fabric),
#             failing past 5% of scripts/insns-baseline.json (compared only with its rustc, valgrind
#             and glibc versions)
#   fuzz      the control-channel fuzzers (tests/tests/fuzz.rs) for RBLK_FUZZ_SECS (default 15)
#             seconds each, after their committed corpus (tests/fuzz/)
#   build     every binary and test executable, on the host
#   guest     one rxe guest boot (scripts/rxe-guest.sh, with a fresh scratch disk) running
#             scripts/guest-tests.sh, which runs the ignored (= rxe) tests of each test executable
#             that has any; cargo never runs in the guest
#   powercut  scripts/powercut.sh: two boots, the host kills qemu after an acknowledged FLUSH;
#             counted as one guest test
# Then a final line `guest: N passed, M failed` on stdout. The run fails if any step fails, if a
# guest test failed, if a test executable crashed or printed no result, if the guest did not boot,
# or if the guest ran zero tests.
#
# The guest and powercut steps wait for /tmp/rblk-guest.lock (RBLK_GUEST_LOCK=PATH for another lock
# file, RBLK_GUEST_LOCK= for none), as the measurement scripts do: one guest at a time here.
#
# Environment: RXE_GUEST_TIMEOUT etc. (see scripts/rxe-guest.sh), RBLK_GUEST_TEST_TIMEOUT (see
# scripts/guest-tests.sh).
set -euo pipefail
shopt -s inherit_errexit

REPO_ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$REPO_ROOT"
SCRIPT_NAME=test.sh
# shellcheck source=lib/script.sh
source "$REPO_ROOT/scripts/lib/script.sh" # with_guest_lock: one guest at a time on this machine

T0=$EPOCHREALTIME

# Seconds since T0, one decimal.
elapsed() {
    local ds=$(((${EPOCHREALTIME/./} - ${T0/./}) / 100000))
    printf '%d.%d' $((ds / 10)) $((ds % 10))
}
STEP=""
# shellcheck disable=SC2317 # EXIT trap
on_exit() {
    local rc=$?
    if ((rc != 0)) && [[ -n $STEP ]]; then
        printf 'test.sh: FAIL: step "%s" failed (exit status %d)\n' "$STEP" "$rc" >&2
    fi
    printf 'test.sh: total %s s\n' "$(elapsed)" >&2
}
trap on_exit EXIT

step() {
    STEP=${1%%:*}
    printf '\n== %s ==\n' "$*"
}
fail() {
    printf 'test.sh: FAIL: %s\n' "$*" >&2
    FAILED=1
}

# Cargo's build directory (build/, from .cargo/config.toml, unless CARGO_TARGET_DIR overrides it).
target_dir() {
    cargo metadata --no-deps --format-version 1 |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])'
}

# Print the test executables from `cargo test --no-run --message-format=json` on stdin, one a line.
test_executables() { python3 scripts/lib/cargo_tests.py; }

# The scripts' gate: every check runs (so one run lists everything), and the step fails if any did.
lint_scripts() {
    local rc=0
    local -a sh=(scripts/*.sh scripts/lib/*.sh scripts/lib/guest/*.sh .ci/run) py=(scripts/*.py scripts/lib/*.py)
    shellcheck -x "${sh[@]}" || rc=1
    pyflakes3 "${py[@]}" || rc=1
    python3 scripts/lib/scriptlint.py || rc=1
    ((rc == 0)) && printf 'test.sh: %d shell scripts and %d Python files pass shellcheck, pyflakes3 and scriptlint\n' \
        "${#sh[@]}" "${#py[@]}"
    return "$rc"
}

main() {
    FAILED=0

    step "deps: scripts/deps.sh"
    scripts/deps.sh

    step "fmt: cargo fmt --all --check"
    cargo fmt --all --check

    step "scripts: shellcheck, pyflakes3, scripts/lib/scriptlint.py"
    lint_scripts

    step "clippy: cargo clippy --workspace --all-targets --all-features -- -D warnings"
    cargo clippy --workspace --all-targets --all-features -- -D warnings

    step "test (host): cargo test --workspace --all-features"
    cargo test --workspace --all-features

    step "insns: scripts/insns.sh (instructions per request against the baseline)"
    scripts/insns.sh

    # --workspace, as above: `-p rblk-tests` resolves features for that package alone, which on a
    # fresh clone compiles 23 crates a second time (rblk-initiator, rblk-target, rblk, clap,
    # proptest, smol, ...) for this one executable; the workspace's is already built.
    step "fuzz: RBLK_FUZZ_SECS=${RBLK_FUZZ_SECS:-15} cargo test --workspace --test fuzz"
    RBLK_FUZZ_SECS=${RBLK_FUZZ_SECS:-15} cargo test --workspace --all-features --test fuzz -- --nocapture

    step "build: binaries and test executables"
    # With --tests, as `cargo test` resolves them: the dev-dependencies' features are unified in,
    # so every crate the test build compiled is reused and only the binaries no test needed
    # (rblk, rblk-dist) are linked. A plain `--bins` resolves features without the
    # dev-dependencies and compiled ~30 crates a second time on a fresh clone (bindgen twice,
    # sideway, libublk, smol, regex, rblk-fabric, rblk-initiator, rblk-target, rblk, ...).
    cargo build --workspace --all-features --bins --tests
    local tdir json
    tdir=$(target_dir)
    json=$tdir/test-executables.json
    cargo test --workspace --all-features --no-run --message-format=json >"$json"
    local -a all_exes exes=()
    mapfile -t all_exes < <(test_executables <"$json")
    # Only executables with ignored (= rxe) tests go to the guest: the others run nothing there,
    # and each start of a debug test executable over 9p under TCG costs about a second. One
    # whose listing fails goes too, so the guest counts it as broken.
    local exe listing
    for exe in "${all_exes[@]}"; do
        if ! listing=$("$exe" --list --ignored --format terse) || [[ $listing == *": test"* ]]; then
            exes+=("$exe")
        fi
    done
    printf '%s\n' "${exes[@]}"
    printf 'test.sh: %d of %d test executables have rxe tests\n' "${#exes[@]}" "${#all_exes[@]}"

    step "guest: rxe tests in the qemu guest (scripts/rxe-guest.sh scripts/guest-tests.sh)"
    local log=$tdir/guest-tests.log guest_rc=0
    : >"$log"
    # A fresh scratch disk for the durability tests (the guest's root is tmpfs).
    local disk=$tdir/guest/scratch.img
    mkdir -p "$tdir/guest"
    rm -f "$disk"
    if ((${#exes[@]})); then
        RBLK_REQUIRE_RDMA=1 RBLK_BIN_DIR=$tdir/debug \
            with_guest_lock scripts/rxe-guest.sh --disk "$disk:2G" "$REPO_ROOT/scripts/guest-tests.sh" "${exes[@]}" | tee "$log" ||
            guest_rc=$?
    else
        fail "cargo built no test executables"
    fi

    # The runner's last stdout line: "guest-tests: summary passed=N failed=M broken=B executables=E".
    local summary n=0 m=0 broken=0
    summary=$(grep -a '^guest-tests: summary ' "$log" | tail -n 1 | tr -d '\r') || true
    if [[ $summary =~ passed=([0-9]+)\ failed=([0-9]+)\ broken=([0-9]+) ]]; then
        n=${BASH_REMATCH[1]} m=${BASH_REMATCH[2]} broken=${BASH_REMATCH[3]}
    else
        fail "the rxe guest did not run the tests to the end (boot failure or timeout; exit status $guest_rc)"
    fi

    local libtest_n=$n
    # The power cut needs the host to kill the guest, so it is a run of its own: two boots.
    step "powercut: scripts/powercut.sh (flushed data survives qemu being killed)"
    if RBLK_BIN_DIR=$tdir/debug with_guest_lock scripts/powercut.sh; then
        n=$((n + 1))
    else
        m=$((m + 1))
        fail "the power-cut test failed"
    fi

    printf 'guest: %d passed, %d failed\n' "$n" "$m"
    ((m == 0)) || fail "$m guest test(s) failed"
    ((broken == 0)) || fail "$broken test executable(s) crashed, timed out or printed no result in the guest"
    if [[ -n $summary ]] && ((libtest_n == 0)); then
        fail "the guest ran zero tests: expected the #[ignore = \"needs rxe ...\"] tests to run there"
    fi
    if ((guest_rc != 0 && FAILED == 0)); then
        fail "the guest run exited with status $guest_rc"
    fi
    STEP="" # the reasons are printed above
    ((FAILED == 0)) || exit 1
}

main "$@"
