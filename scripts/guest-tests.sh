#!/usr/bin/env bash
# Run the rxe tests inside the guest: scripts/test.sh boots it with
#
#   scripts/rxe-guest.sh scripts/guest-tests.sh TEST_EXECUTABLE...
#
# Each test executable (built on the host; cargo never runs in the guest) runs with
# `--ignored --test-threads=1`: the ignored tests are exactly the ones marked
# `#[ignore = "needs rxe ..."]`. Their output streams as it comes. The `test result: ... N passed;
# M failed` lines are summed across executables; an executable that exits non-zero without a failed
# test (a crash, a timeout) or prints no result line counts as broken.
#
# The last line of stdout is the machine-readable summary scripts/test.sh reads:
#   guest-tests: summary passed=N failed=M broken=B executables=E
# Exit status: 0 when every executable ran cleanly and no test failed, else 1.
#
# Environment: RBLK_GUEST_TEST_TIMEOUT, seconds one executable may take (default 900).
set -uo pipefail # no -e: a failing executable is counted, not fatal

PER_EXE_TIMEOUT=${RBLK_GUEST_TEST_TIMEOUT:-900}

# Every test starts its own targets, many on the same address and port with other identities:
# rblk pins nothing here unless a test names its own pin file (tests/tests/mutual.rs does).
export RBLK_KNOWN_TARGETS=none

passed=0 failed=0 broken=0
failed_tests=() broken_exes=()

# One log file for all executables, rewritten by each. Bash builtins instead of basename, mktemp,
# tail, tr and rm: under TCG every exec of a host tool over 9p costs ~0.1-0.3 s.
LOG=/tmp/guest-test.$$.log

# Run one test executable; update the counters.
run_one() { # EXE
    local exe=$1 name=${1##*/} log=$LOG rc=0 up=""
    read -r up _ </proc/uptime # the guest's clock, to place a kernel report printed on the console
    printf '\n== guest: %s (guest uptime %s s) ==\n' "$name" "$up"
    if [[ ! -x $exe ]]; then
        echo "guest-tests: $exe is missing or not executable"
        broken=$((broken + 1))
        broken_exes+=("$name (missing)")
        return
    fi

    # stderr joins stdout so the log keeps their order; libtest prints its results on stdout.
    # --report-time (each result line ends in <SECONDS>, for keeping CI's guest time in budget)
    # is an unstable libtest option: RUSTC_BOOTSTRAP=1 allows it on the stable toolchain.
    RUSTC_BOOTSTRAP=1 timeout -k 10 "$PER_EXE_TIMEOUT" "$exe" --ignored --test-threads=1 --color never \
        -Z unstable-options --report-time 2>&1 |
        tee "$log"
    rc=${PIPESTATUS[0]}

    local line p=0 f=0 results=0
    while IFS= read -r line || { [[ -n $line ]] && echo; }; do # (a last line a crash cut short: end it)
        line=${line%$'\r'}
        if [[ $line =~ ^test\ result:.*\ ([0-9]+)\ passed\;\ ([0-9]+)\ failed\; ]]; then
            p=$((p + BASH_REMATCH[1]))
            f=$((f + BASH_REMATCH[2]))
            results=$((results + 1))
        elif [[ $line =~ ^test\ (.+)\ \.\.\.\ FAILED( <[0-9.]+s>)?$ ]]; then
            failed_tests+=("$name: ${BASH_REMATCH[1]}")
        fi
    done <"$log"
    passed=$((passed + p))
    failed=$((failed + f))

    local why=""
    if ((rc == 124 || rc == 137)); then
        why="timed out after $PER_EXE_TIMEOUT s (RBLK_GUEST_TEST_TIMEOUT)"
    elif ((results == 0)); then
        why="printed no 'test result:' line (exit status $rc)"
    elif ((rc != 0 && f == 0)); then
        why="exited with status $rc without a failed test (crash?)"
    fi
    if [[ -n $why ]]; then
        echo "guest-tests: $name $why"
        broken=$((broken + 1))
        broken_exes+=("$name: $why")
    fi
}

main() {
    (($#)) || {
        echo "usage: $0 TEST_EXECUTABLE..." >&2
        exit 2
    }
    local exe
    for exe in "$@"; do
        run_one "$exe"
    done

    echo
    local t
    for t in "${failed_tests[@]}"; do
        echo "guest-tests: FAILED $t"
    done
    for t in "${broken_exes[@]}"; do
        echo "guest-tests: BROKEN $t"
    done
    rm -f "$LOG"
    echo "guest-tests: summary passed=$passed failed=$failed broken=$broken executables=$#"
    ((failed == 0 && broken == 0))
}

main "$@"
