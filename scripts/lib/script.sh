# shellcheck shell=bash
# Shell helpers shared by the host-side scripts that boot the guest (compare-rxe.sh,
# ab-attach.sh). Source it after setting SCRIPT_NAME (the prefix of log lines); bash.

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
