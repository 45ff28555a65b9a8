# shellcheck shell=bash
# Shell helpers shared by the guest-side scripts (source it; bash).

# start_target LOG BIN SECS ARGS...: starts BIN/rblk-target --allow-any-host ARGS... in the
# background with its stderr in LOG, waits up to SECS seconds until it says it is listening and
# sets TARGET_PID. --allow-any-host: the scripts' clients (rblk-bench, rblk-test-client, older
# builds of rblk) connect without a key; a build that predates the flag serves keyless anyway.
# Returns 1 (after printing the log) if it exits first; kills it and returns 1 if it does not
# listen in time.
start_target() {
    local log=$1 bin=$2 secs=$3
    shift 3
    local open=()
    # Not `| grep -q`: under pipefail the SIGPIPE grep leaves would read as "not supported".
    [[ $("$bin/rblk-target" --help 2>/dev/null) == *--allow-any-host* ]] && open=(--allow-any-host)
    "$bin/rblk-target" "${open[@]}" "$@" 2>"$log" &
    TARGET_PID=$!
    local _
    for _ in $(seq 1 $((secs * 10))); do
        grep -q 'listening on' "$log" && return 0
        if ! kill -0 "$TARGET_PID" 2>/dev/null; then
            cat "$log" >&2
            echo "rblk-target exited before it listened" >&2
            return 1
        fi
        sleep 0.1
    done
    kill -TERM "$TARGET_PID" 2>/dev/null || true
    echo "rblk-target did not start listening within $secs s" >&2
    return 1
}

# wait_gone PID: waits (up to 60 s) until process PID (not necessarily our child) has exited.
wait_gone() {
    local _
    for _ in $(seq 1 600); do
        [[ -e /proc/$1 ]] || return 0
        sleep 0.1
    done
    return 1
}

# wait_bdev DEV: waits (up to 30 s) until DEV is a block device with a non-zero size.
wait_bdev() {
    local size=0 _
    for _ in $(seq 1 300); do
        if [[ -b $1 ]]; then
            read -r size <"/sys/class/block/${1#/dev/}/size" 2>/dev/null || size=0
            ((size > 0)) && return 0
        fi
        sleep 0.1
    done
    return 1
}

# Linux NVMe-oF/RDMA, for scale (compare-rxe.sh, timeline-rxe.sh): nvmet + nvmet-rdma export a
# memory-backed null_blk, and nvme-rdma connects to it over the same rxe device.
NVMET_CFG=/sys/kernel/config/nvmet

_nvmet_fail() {
    echo "NVMe-oF/RDMA: $*" >&2
    return 1
}
_nvmet_mkdir() { mkdir "$1" || _nvmet_fail "cannot create $1"; }
_nvmet_set() { printf '%s\n' "$2" >"$1" || _nvmet_fail "cannot write $2 to $1"; }

# nvmeof_setup NQN ADDR: loads null_blk (one 1 GiB RAM device, /dev/nullb0), nvmet, nvmet-rdma and
# nvme-rdma, and exports /dev/nullb0 as namespace 1 of subsystem NQN (any host) on nvmet port 1,
# rdma ADDR:4420. Returns 1, with the reason on stderr, when a step fails.
nvmeof_setup() {
    local nqn=$1 addr=$2
    local s=$NVMET_CFG/subsystems/$nqn p=$NVMET_CFG/ports/1
    modprobe null_blk nr_devices=1 memory_backed=1 gb=1 >&2 || _nvmet_fail "cannot load null_blk" || return 1
    modprobe -a nvmet nvmet-rdma nvme-rdma >&2 || _nvmet_fail "cannot load nvmet, nvmet-rdma, nvme-rdma" || return 1
    wait_bdev /dev/nullb0 || _nvmet_fail "null_blk made no /dev/nullb0" || return 1
    [[ -d $NVMET_CFG ]] || _nvmet_fail "no $NVMET_CFG (configfs not mounted?)" || return 1
    _nvmet_mkdir "$s" &&
        _nvmet_set "$s/attr_allow_any_host" 1 &&
        _nvmet_mkdir "$s/namespaces/1" &&
        _nvmet_set "$s/namespaces/1/device_path" /dev/nullb0 &&
        _nvmet_set "$s/namespaces/1/enable" 1 &&
        _nvmet_mkdir "$p" &&
        _nvmet_set "$p/addr_trtype" rdma &&
        _nvmet_set "$p/addr_adrfam" ipv4 &&
        _nvmet_set "$p/addr_traddr" "$addr" &&
        _nvmet_set "$p/addr_trsvcid" 4420 || return 1
    ln -s "$s" "$p/subsystems/$nqn" || _nvmet_fail "cannot link $nqn to nvmet port 1"
}

# nvmeof_teardown NQN: undoes nvmeof_setup (no host may be connected). Returns 1 when the configfs
# entries cannot be removed; only warns when the modules cannot be unloaded.
nvmeof_teardown() {
    local nqn=$1
    local s=$NVMET_CFG/subsystems/$nqn p=$NVMET_CFG/ports/1
    rm -f "$p/subsystems/$nqn" || _nvmet_fail "cannot unlink $nqn from nvmet port 1" || return 1
    rmdir "$p" || _nvmet_fail "cannot remove nvmet port 1" || return 1
    _nvmet_set "$s/namespaces/1/enable" 0 || return 1
    rmdir "$s/namespaces/1" "$s" || _nvmet_fail "cannot remove the nvmet subsystem $nqn" || return 1
    modprobe -r nvme-rdma nvmet-rdma nvmet null_blk >&2 || echo "warning: cannot unload the NVMe-oF modules" >&2
}

# nvmeof_connect NQN ADDR: `nvme connect -t rdma` to NQN at ADDR:4420 with one I/O queue; waits (up
# to 30 s) for its namespace and sets NVMEOF_DEV=/dev/nvmeXnY. Returns 1 when either fails.
nvmeof_connect() {
    local nqn=$1 addr=$2 b n _
    NVMEOF_DEV=""
    nvme connect -t rdma -a "$addr" -s 4420 -n "$nqn" -i 1 >&2 || {
        echo "nvme connect -t rdma -a $addr -s 4420 -n $nqn -i 1 failed" >&2
        return 1
    }
    for _ in $(seq 1 300); do
        for b in /sys/block/nvme*n*; do
            [[ ${b##*/} =~ ^nvme[0-9]+n[0-9]+$ ]] || continue # not the per-path nvmeXcYnZ
            read -r n <"$b/device/subsysnqn" 2>/dev/null || continue
            # shellcheck disable=SC2034 # the caller's
            [[ $n == "$nqn" ]] && NVMEOF_DEV=/dev/${b##*/} && return 0
        done
        sleep 0.1
    done
    echo "nvme connect made no /dev/nvmeXnY for $nqn" >&2
    return 1
}

# ---------------------------------------------------------------------------------------------------
# timeline-rxe.sh and stages-rxe.sh (issue 45): a `rblk attach --daemon` device and its detach.

# attach_daemon WORK BIN ARGS...: `BIN/rblk attach ARGS... --daemon` (at most 120 s), its stdout in
# WORK/attach.out and stderr in WORK/attach.log (a file, not $(...): the server it leaves running
# could keep a pipe open). Sets ATTACH_DEV to stdout's first line (/dev/ublkbN) and ATTACH_PID to
# the serving process's id from stderr's `rblk: pid N serves ...` (empty when either is missing).
# Returns 1 when attach failed.
# shellcheck disable=SC2034 # ATTACH_*: the caller's
attach_daemon() {
    local work=$1 bin=$2
    shift 2
    ATTACH_DEV="" ATTACH_PID=""
    timeout 120 "$bin/rblk" attach "$@" --daemon >"$work/attach.out" 2>"$work/attach.log" || return 1
    ATTACH_DEV=$(sed -n 1p "$work/attach.out")
    ATTACH_PID=$(sed -n 's/^rblk: pid \([0-9][0-9]*\) serves .*/\1/p' "$work/attach.log")
}

# detach_daemon BIN DEV PID: `BIN/rblk detach DEV` (at most 60 s, its output on stderr), then waits
# for PID (when not empty) to exit, killing it after 60 s. Returns 1 when the detach failed.
detach_daemon() {
    local rc=0
    timeout 60 "$1/rblk" detach "$2" >&2 || rc=1
    if [[ -n $3 ]]; then wait_gone "$3" || kill -KILL "$3" 2>/dev/null || true; fi
    return "$rc"
}

# Waiting and reading processes (issue 45's scripts: grow, lost, handover, takeover, discard, scale,
# hosts, soak-reconnect and ab-attach shared copies of these).

# wait_lines FILE PATTERN N SECS [PID]: waits until FILE has at least N lines matching PATTERN (grep
# -c); 1 when SECS seconds pass first, or as soon as PID (when given) has exited. By the clock, not
# by a count of polls: under TCG a poll costs far more than its sleep.
wait_lines() {
    local file=$1 pat=$2 n=$3 end=$((SECONDS + $4)) pid=${5:-}
    while ((SECONDS <= end)); do
        (($(_count_lines "$file" "$pat") >= n)) && return 0
        if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then
            (($(_count_lines "$file" "$pat") >= n))
            return
        fi
        sleep 0.01
    done
    return 1
}
# The lines of FILE matching PATTERN; 0 for a file not there yet.
_count_lines() {
    local c
    c=$(grep -c -- "$2" "$1" 2>/dev/null) || true
    echo "${c:-0}"
}

# wait_for FILE PATTERN SECS [PID]: waits until FILE has a line matching PATTERN (wait_lines ... 1).
wait_for() { wait_lines "$1" "$2" 1 "$3" "${4:-}"; }

# proc_ticks PID: utime + stime of process PID, all its threads (/proc/PID/stat fields 14 and 15),
# in clock ticks (getconf CLK_TCK). The comm field (2) may hold spaces and parentheses: the fields
# after its last ')' start at 3. Returns 1 when PID is gone.
proc_ticks() {
    local line
    local -a f
    read -r line 2>/dev/null <"/proc/$1/stat" || return 1
    read -r -a f <<<"${line##*) }"
    echo $((f[11] + f[12]))
}

# wait_socket PATH SECS: waits until PATH is a socket (a server's listening Unix socket); 1 when
# SECS seconds pass first.
wait_socket() {
    local end=$((SECONDS + $2))
    until [[ -S $1 ]]; do
        ((SECONDS <= end)) || return 1
        sleep 0.1
    done
}

# oneline MAX [FILE...]: FILE... (stdin without) as one line of at most MAX characters, for a
# failure row: line ends and tabs squeezed to one space each.
oneline() {
    local max=$1
    shift
    cat -- "$@" 2>/dev/null | tr -s '\r\n\t' '   ' | cut -c1-"$max"
}

# The block-device front ends of the comparisons (compare-rxe.sh, counts-rxe.sh), one place. They
# read BLK_BIN (rblk's binaries), BLK_URI (the rblk volume), BLK_RXE (the rxe device), BLK_WORK (a
# scratch directory; FUSE mounts on BLK_WORK/mnt), BLK_NQN and BLK_ADDR (nvmeof, after
# nvmeof_setup) and BLK_LIBUBLK (libublk's examples/null binary).

# blk_attach_daemon ARGS...: `rblk attach BLK_URI --daemon ARGS...`; sets BLK_DEV and BLK_PID.
blk_attach_daemon() {
    if ! attach_daemon "$BLK_WORK" "$BLK_BIN" "$BLK_URI" --device "$BLK_RXE" "$@"; then
        BLK_ERR="rblk attach $* --daemon failed: $(oneline 400 "$BLK_WORK/attach.out" "$BLK_WORK/attach.log")"
        return 1
    fi
    BLK_DEV=$ATTACH_DEV BLK_PID=$ATTACH_PID
    [[ $BLK_DEV == /dev/ublkb* && -n $BLK_PID ]] && return 0
    BLK_ERR="rblk attach $* printed no /dev/ublkbN line (stdout) and 'rblk: pid N serves' line (stderr): $(oneline 400 "$BLK_WORK/attach.out" "$BLK_WORK/attach.log")"
    return 1
}

# blk_attach PATH: makes front end PATH's block device (nvmeof, nbd, fuse, ublk, ublk-sleep,
# ublk-q2, ublk-null, libublk-null; docs/performance.md, "The comparison's block devices", says
# what each is): sets BLK_DEV and BLK_PID (the process
# serving it; empty for nvmeof), or BLK_ERR and returns 1.
blk_attach() {
    local w=$BLK_WORK _
    BLK_DEV="" BLK_PID="" BLK_ERR=""
    case $1 in
    nvmeof)
        nvmeof_connect "$BLK_NQN" "$BLK_ADDR" 2>"$w/nvme.err" || {
            BLK_ERR="cannot connect to Linux NVMe-oF/RDMA: $(oneline 400 "$w/nvme.err")"
            return 1
        }
        BLK_DEV=$NVMEOF_DEV
        ;;
    nbd)
        modprobe nbd >&2 || {
            BLK_ERR="cannot load nbd"
            return 1
        }
        rm -f "$w/nbd.sock"
        # Its one stdout line, once it serves, is the export's URI (nbd+unix:///?socket=PATH).
        "$BLK_BIN/rblk" nbd "$BLK_URI" --device "$BLK_RXE" --listen "unix:$w/nbd.sock" >"$w/nbd.out" 2>"$w/nbd.log" &
        BLK_PID=$!
        for _ in $(seq 1 300); do
            grep -q '^nbd+unix:' "$w/nbd.out" && break
            kill -0 "$BLK_PID" 2>/dev/null || break
            sleep 0.1
        done
        grep -q '^nbd+unix:' "$w/nbd.out" || {
            BLK_ERR="rblk nbd printed no nbd+unix: URI (it did not start serving): $(oneline 400 "$w/nbd.out" "$w/nbd.log")"
            return 1
        }
        timeout 60 nbd-client -unix "$w/nbd.sock" /dev/nbd0 -block-size 4096 >"$w/nbdc.log" 2>&1 || {
            BLK_ERR="nbd-client failed: $(oneline 400 "$w/nbdc.log")"
            return 1
        }
        BLK_DEV=/dev/nbd0
        ;;
    fuse)
        mkdir -p "$w/mnt"
        timeout 120 "$BLK_BIN/rblk" mount "$BLK_URI" "$w/mnt" --device "$BLK_RXE" --queues 1 --loop --daemon \
            >"$w/mount.out" 2>"$w/mount.log" || {
            BLK_ERR="rblk mount --loop --daemon failed: $(oneline 400 "$w/mount.out" "$w/mount.log")"
            return 1
        }
        BLK_DEV=$(sed -n 1p "$w/mount.out")
        BLK_PID=$(sed -n -e 's/^rblk: pid \([0-9][0-9]*\) serves .*/\1/p' \
            -e 's/^rblk: serving in the background (pid \([0-9][0-9]*\)).*/\1/p' "$w/mount.log" | head -n 1)
        [[ $BLK_DEV == /dev/loop* && -n $BLK_PID ]] || {
            BLK_ERR="rblk mount printed no /dev/loopN line (stdout) or no 'rblk: pid N serves' line (stderr): $(oneline 400 "$w/mount.out" "$w/mount.log")"
            return 1
        }
        ;;
    ublk) blk_attach_daemon --queues 1 --depth 32 || return 1 ;;
    ublk-sleep) blk_attach_daemon --queues 1 --depth 32 --wait sleep || return 1 ;;
    ublk-q2) blk_attach_daemon --queues 2 --depth 32 || return 1 ;;
    ublk-null) RBLK_ALLOW_NULL=1 blk_attach_daemon --queues 1 --depth 32 --null-io || return 1 ;;
    libublk-null)
        BLK_LIBUBLK_ID=9
        while [[ -e /dev/ublkc$BLK_LIBUBLK_ID || -e /dev/ublkb$BLK_LIBUBLK_ID ]]; do
            BLK_LIBUBLK_ID=$((BLK_LIBUBLK_ID + 1))
        done
        "$BLK_LIBUBLK" add -n "$BLK_LIBUBLK_ID" -q 1 -d 32 --foreground >"$w/libublk.out" 2>&1 &
        BLK_PID=$!
        BLK_DEV=/dev/ublkb$BLK_LIBUBLK_ID
        ;;
    *)
        BLK_ERR="no front end $1"
        return 1
        ;;
    esac
    wait_bdev "$BLK_DEV" && return 0
    BLK_ERR="$BLK_DEV did not appear as a block device${BLK_PID:+$(kill -0 "$BLK_PID" 2>/dev/null || echo " (its server exited)")}"
    [[ $1 == libublk-null ]] && BLK_ERR+=": $(oneline 400 "$w/libublk.out")"
    return 1
}

# blk_detach PATH: removes front end PATH's device (also after a failed blk_attach); returns 1, with
# BLK_ERR, when that did not go cleanly (the serving process is killed then).
blk_detach() {
    local w=$BLK_WORK rc=0 _
    BLK_ERR=""
    case $1 in
    nvmeof)
        nvme disconnect -n "$BLK_NQN" >"$w/nvme.err" 2>&1 || BLK_ERR="nvme disconnect failed: $(oneline 400 "$w/nvme.err")"
        ;;
    nbd)
        if [[ -e /sys/block/nbd0/pid ]]; then
            timeout 60 nbd-client -d /dev/nbd0 >"$w/nbdc.log" 2>&1 || BLK_ERR="nbd-client -d failed: $(oneline 400 "$w/nbdc.log")"
            for _ in $(seq 1 300); do
                [[ -e /sys/block/nbd0/pid ]] || break
                sleep 0.1
            done
        fi
        if [[ -n $BLK_PID ]]; then
            kill -TERM "$BLK_PID" 2>/dev/null || true
            wait "$BLK_PID" || rc=$?
            ((rc == 0)) || BLK_ERR+="${BLK_ERR:+; }rblk nbd exited with status $rc after SIGTERM: $(oneline 400 "$w/nbd.log")"
        fi
        ;;
    fuse)
        if mountpoint -q "$w/mnt"; then
            timeout 60 "$BLK_BIN/rblk" umount "$w/mnt" >"$w/umount.log" 2>&1 || BLK_ERR="rblk umount failed: $(oneline 400 "$w/umount.log")"
        fi
        ;;
    ublk*)
        if [[ -n $BLK_DEV && -e $BLK_DEV ]]; then
            timeout 60 "$BLK_BIN/rblk" detach "$BLK_DEV" >"$w/detach.log" 2>&1 ||
                BLK_ERR="rblk detach $BLK_DEV failed: $(oneline 400 "$w/detach.log")"
        fi
        ;;
    libublk-null)
        if [[ -n ${BLK_LIBUBLK_ID:-} && -e /dev/ublkc$BLK_LIBUBLK_ID ]]; then
            timeout 60 "$BLK_LIBUBLK" del -n "$BLK_LIBUBLK_ID" >"$w/libublk-del.log" 2>&1 ||
                BLK_ERR="$BLK_LIBUBLK del -n $BLK_LIBUBLK_ID failed: $(oneline 400 "$w/libublk-del.log")"
        fi
        ;;
    esac
    if [[ -n $BLK_PID && $1 != nbd ]] && ! wait_gone "$BLK_PID"; then
        BLK_ERR+="${BLK_ERR:+; }its server (pid $BLK_PID) did not exit: SIGKILL"
        kill -KILL "$BLK_PID" 2>/dev/null || true
        wait_gone "$BLK_PID" || true
    fi
    [[ $1 == libublk-null && -n $BLK_PID ]] && { wait "$BLK_PID" 2>/dev/null || true; }
    [[ -z $BLK_ERR ]]
}
