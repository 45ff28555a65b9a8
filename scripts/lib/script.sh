# shellcheck shell=bash
# Shell helpers shared by the scripts that boot the rxe guest and run their own part in it
# (compare-rxe.sh, timeline-rxe.sh, ab-attach.sh). Source it after setting SCRIPT_NAME (the prefix
# of log lines), REPO_ROOT and, for RBLK_BIN_DIR relative to where the script was started,
# CALLER_PWD; bash. The script defines guest_main (its part in the guest), host_main and
# summarize (LOG SUMMARY_JSON TABLE_TXT: the guest's log to a table and a JSON summary), and ends
# with `script_main ARGC USAGE "$@"`.

log() { printf '%s: %s\n' "$SCRIPT_NAME" "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# The calling script's header comment, from its second line to `set -euo`.
usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[-1]}" | sed '$d; s/^# \{0,1\}//'
}

is_count() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }

# help_or_usage_error ARG: the end of every script's option loop: -h/--help prints the usage and
# exits 0; any other ARG prints it to stderr and exits 2.
help_or_usage_error() {
    case $1 in
    -h | --help)
        usage
        exit 0
        ;;
    *)
        usage >&2
        exit 2
        ;;
    esac
}

# script_main ARGC USAGE ARGS...: `SCRIPT --in-guest` with ARGC more arguments (USAGE names them)
# is the script's part in the guest, guest_main; anything else runs host_main.
script_main() {
    local argc=$1 use=$2
    shift 2
    if [[ ${1:-} == --in-guest ]]; then
        shift
        (($# == argc)) || die "usage: $0 --in-guest $use"
        guest_main "$@"
    else
        host_main "$@"
    fi
}

# python3 with scripts/lib on its path (scripts/lib/report.py: what the summaries share).
lib_python() {
    PYTHONPATH="$REPO_ROOT/scripts/lib${PYTHONPATH:+:$PYTHONPATH}" python3 "$@"
}

# ---------------------------------------------------------------------------------------------------
# Host side.

# release_bins BIN...: sets BIN_DIR to the directory with rblk's release binaries and checks that
# BIN... are there: RBLK_BIN_DIR when set (relative to CALLER_PWD; nothing is built), else what
# `cargo build --release --workspace --all-features` builds, ${CARGO_TARGET_DIR:-build}/release.
release_bins() {
    local d b
    if [[ -n ${RBLK_BIN_DIR:-} ]]; then
        d=$RBLK_BIN_DIR
        [[ $d == /* ]] || d=${CALLER_PWD:-$PWD}/$d
        BIN_DIR=$(cd -- "$d" 2>/dev/null && pwd -P) || die "RBLK_BIN_DIR=$RBLK_BIN_DIR is not a directory"
        log "using the binaries in $BIN_DIR (RBLK_BIN_DIR; not building)"
    else
        log "building release binaries (cargo build --release --workspace --all-features)"
        (cd -- "$REPO_ROOT" && cargo build --release --workspace --all-features) >&2 || die "cargo build failed"
        d=${CARGO_TARGET_DIR:-build}
        [[ $d == /* ]] || d=$REPO_ROOT/$d
        BIN_DIR=$(cd -- "$d/release" && pwd -P) || die "no $d/release after cargo build"
    fi
    for b in "$@"; do
        [[ -x $BIN_DIR/$b ]] || die "no $BIN_DIR/$b"
    done
}

# snapshot_bins DIR BIN...: copies BIN... from BIN_DIR into DIR (emptied first) and points BIN_DIR
# there: a `cargo build` by someone else during the guest run (which reads the binaries through
# 9p as it goes) must not swap them mid-run.
snapshot_bins() {
    local dir=$1 b
    shift
    rm -rf "$dir"
    mkdir -p "$dir"
    for b in "$@"; do
        cp -- "$BIN_DIR/$b" "$dir/$b" || die "cannot copy $BIN_DIR/$b to $dir"
    done
    BIN_DIR=$(cd -- "$dir" && pwd -P)
    log "the guest runs copies of ${*} in $BIN_DIR"
}

# guest_lock_held LOCK: is LOCK already flock(1)ed for us? True when this shell has a descriptor
# open on it (`flock LOCK CMD` hands its descriptor on to CMD) or /proc/locks shows a lock on its
# inode held by this shell or one of its ancestors (`flock -o LOCK CMD`). Taking the lock again
# then would wait for ourselves forever.
guest_lock_held() {
    local lock=$1 real fd ino p line
    local -A anc=()
    [[ -e $lock ]] || return 1
    real=$(readlink -f -- "$lock")
    for fd in "/proc/$$/fd/"*; do
        [[ $(readlink -- "$fd" 2>/dev/null) == "$real" ]] && return 0
    done
    ino=$(stat -L -c %i -- "$lock") || return 1
    p=$$
    while [[ $p =~ ^[1-9][0-9]*$ ]] && ((p > 1)); do
        anc[$p]=1
        read -r line <"/proc/$p/stat" 2>/dev/null || break
        line=${line##*) } # the fields after comm, which may hold spaces: state ppid ...
        p=${line#* }
        p=${p%% *}
    done
    local -a f
    while read -r -a f; do
        # 1: FLOCK  ADVISORY  WRITE 1234 00:2a:5678 0 EOF
        [[ ${f[1]:-} == FLOCK && ${f[5]##*:} == "$ino" && -n ${anc[${f[4]}]:-} ]] && return 0
    done </proc/locks
    return 1
}

# run_guest LOG TIMEOUT SCRIPT ARGS...: boots the rxe guest once (scripts/rxe-guest.sh, at most
# TIMEOUT seconds unless RXE_GUEST_TIMEOUT says otherwise) to run `SCRIPT --in-guest ARGS...`, its
# stdout appended to LOG. One guest at a time on this machine: under `flock /tmp/rblk-guest.lock`
# (RBLK_GUEST_LOCK=PATH for another lock file, RBLK_GUEST_LOCK= for none), unless this process
# already holds that lock (`flock /tmp/rblk-guest.lock SCRIPT`). Appends @@meta host_load_before,
# guest_run_secs (the boot and the run), guest_lock_wait_secs and host_load_after to LOG, and
# for a guest run that failed guest_exit_status and guest_failure (rxe-guest.sh's last message,
# e.g. a kernel panic); sets GUEST_RC to the guest's exit status.
run_guest() {
    local glog=$1 timeout=$2 script=$3
    shift 3
    local lock=${RBLK_GUEST_LOCK-/tmp/rblk-guest.lock} t0 t1 ds
    # The start time is taken once the lock is held, so the wait shows apart from the run.
    # shellcheck disable=SC2016 # expanded by that bash
    local -a cmd=(bash -c 'printf "@@meta guest_started %s\n" "$EPOCHREALTIME"; exec "$@"' run_guest
        env RXE_GUEST_TIMEOUT="${RXE_GUEST_TIMEOUT:-$timeout}" "$REPO_ROOT/scripts/rxe-guest.sh" "$script"
        --in-guest "$@")
    if [[ -n $lock ]] && guest_lock_held "$lock"; then
        log "this process already holds the guest lock $lock"
        lock=""
    fi
    [[ -n $lock ]] && cmd=(flock "$lock" "${cmd[@]}")
    if pgrep -f '^qemu-system' >/dev/null; then
        log "note: another qemu is running on this machine${lock:+ (waiting for $lock)}"
    fi
    printf '@@meta host_load_before %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$glog"
    local errlog
    errlog=$(mktemp)
    t0=$EPOCHREALTIME
    GUEST_RC=0
    # stderr stays live, and a copy says why a failed guest failed (rxe-guest.sh's last word).
    { "${cmd[@]}" 2>&1 >>"$glog" || echo "$?" >"$errlog.rc"; } | tee "$errlog" >&2
    t1=$EPOCHREALTIME
    [[ -s $errlog.rc ]] && read -r GUEST_RC <"$errlog.rc"
    if ((GUEST_RC != 0)); then
        printf '@@meta guest_exit_status %s\n@@meta guest_failure %s\n' "$GUEST_RC" \
            "$(grep -a '^rxe-guest: ' "$errlog" | grep -av 'ACTIVE after\|run directory kept' | tail -n 1 | cut -c1-300)" >>"$glog"
    fi
    rm -f "$errlog" "$errlog.rc"
    local started
    started=$(sed -n 's/^@@meta guest_started \([0-9.]*\)$/\1/p' "$glog" | tail -n 1)
    [[ -n $started ]] || started=$t0
    ds=$(((${t1/./} - ${started/./}) / 100000))
    local ws=$(((${started/./} - ${t0/./}) / 100000))
    log "the guest run took $((ds / 10)).$((ds % 10)) s (boot included; host clock), after $((ws / 10)).$((ws % 10)) s waiting for the guest lock"
    printf '@@meta guest_run_secs %d.%d\n@@meta guest_lock_wait_secs %d.%d\n@@meta host_load_after %s\n' \
        $((ds / 10)) $((ds % 10)) $((ws / 10)) $((ws % 10)) "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$glog"
}

# summarize_run LOG OUT_DIR: the script's summarize LOG OUT_DIR/summary.json OUT_DIR/table.txt;
# sets SUMMARY_RC to its exit status.
summarize_run() {
    SUMMARY_RC=0
    summarize "$1" "$2/summary.json" "$2/table.txt" || SUMMARY_RC=$?
    if [[ -s $2/summary.json ]]; then log "wrote $2/summary.json and $2/table.txt"; fi
}

# redraw_run [LOG OUT_DIR]: a script's --redraw: summarizes LOG (default $OUT/guest.log) into
# OUT_DIR (default $OUT) again, without a guest (LOG and OUT_DIR relative to where the script was
# started, CALLER_PWD), and ends as finish_run.
redraw_run() {
    local rlog=${1:-$OUT/guest.log} rout=${2:-$OUT}
    [[ -z ${1:-} || $rlog == /* ]] || rlog=${CALLER_PWD:-$PWD}/$rlog
    [[ -z ${2:-} || $rout == /* ]] || rout=${CALLER_PWD:-$PWD}/$rout
    [[ -s $rlog ]] || die "no $rlog to summarize"
    mkdir -p "$rout"
    summarize_run "$rlog" "$rout"
    finish_run "$rlog"
}

# finish_run LOG: the end of a run: fails when the guest run did (GUEST_RC) or its summary
# (SUMMARY_RC).
finish_run() {
    ((${GUEST_RC:-0} == 0)) || die "the guest run failed (exit status $GUEST_RC); see $1"
    ((${SUMMARY_RC:-0} == 0)) || exit 1
}

# ---------------------------------------------------------------------------------------------------
# Booting a guest with its output live (issue 45's scripts: grow, lost, handover, takeover and
# discard each had a copy of this).

# with_guest_lock CMD...: CMD under `flock /tmp/rblk-guest.lock` (RBLK_GUEST_LOCK=PATH for another
# lock file, RBLK_GUEST_LOCK= for none), or as it is when this process holds that lock already.
with_guest_lock() {
    local lock=${RBLK_GUEST_LOCK-/tmp/rblk-guest.lock}
    if [[ -n $lock ]] && ! guest_lock_held "$lock"; then
        flock "$lock" "$@"
    else
        "$@"
    fi
}

# guest_tee LOG RXE_GUEST_ARGS...: scripts/rxe-guest.sh RXE_GUEST_ARGS... (e.g. [--disk SPEC]
# SCRIPT --in-guest ARGS...) with RBLK_BIN_DIR=BIN_DIR, its stdout shown and written to LOG. One
# guest at a time, as run_guest: under `flock /tmp/rblk-guest.lock` (RBLK_GUEST_LOCK=PATH for
# another lock file, RBLK_GUEST_LOCK= for none) unless this process holds that lock already.
# Returns rxe-guest.sh's exit status (under pipefail); RXE_GUEST_MEM etc. pass through the
# environment.
guest_tee() {
    local glog=$1
    shift
    with_guest_lock env RBLK_BIN_DIR="$BIN_DIR" "$REPO_ROOT/scripts/rxe-guest.sh" "$@" | tee "$glog"
}
