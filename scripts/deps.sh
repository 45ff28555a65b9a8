#!/usr/bin/env bash
# Install the Debian 12 host packages that rblk's build, tests and rxe guest harness need.
#
# Idempotent and quiet: when every package is already installed it prints nothing and exits 0.
# Otherwise it runs `apt-get update` once and installs only the missing packages,
# non-interactively (works as root with stdin closed, e.g. in CI).
set -euo pipefail

# What each group is for:
#   qemu-system-x86 busybox-static cpio kmod xz-utils   the rxe guest (scripts/rxe-guest.sh)
#   iproute2 rdma-core ibverbs-providers ibverbs-utils  rxe setup and the verbs runtime (host root
#   perftest rdmacm-utils                               is shared into the guest), perftest, rping
#   cmake libclang-dev linux-libc-dev                   building the `sideway` crate, and libublk's sys
#                                                       crate (bindgen over the kernel's ublk header)
#   e2fsprogs util-linux coreutils python3              mkfs for scratch disks, flock/timeout/stdbuf,
#                                                       parsing cargo's JSON in scripts/test.sh
#   qemu-utils nbd-client fio                           NBD export tests: qemu-io/qemu-img as clients,
#                                                       the kernel client, fio with verify
#   fuse3                                               `rblk mount`: fusermount3 for non-root users
#                                                       (root mounts directly); the FUSE tests use fio,
#                                                       losetup, mkfs.ext4 and e2fsck from above
#   nvme-cli                                            scripts/compare-rxe.sh: `nvme connect` to the
#                                                       guest's Linux NVMe-oF/RDMA target (nvmet-rdma)
#   systemd                                             systemd-analyze verify of the unit files in
#                                                       dist/systemd (tests/tests/systemd.rs)
#   curl                                                scraping rblk-target --metrics in the guest
#                                                       (tests/tests/metrics.rs)
#   python3-matplotlib                                  scripts/plot.py (charts of rblk-bench --log
#                                                       and compare-rxe.sh; bench/tests/engine.rs)
#   mdadm                                               md mirrors and stripes over rblk attach
#                                                       devices in the guest (tests/tests/md.rs)
#   man-db groff-base                                   `man --warnings -l` over every page rblk-dist
#                                                       writes (dist/gen's tests, which fail without it)
#   python3-six                                         fio's fio_jsonplus_clat2csv imports six, which
#                                                       Debian's fio does not depend on; bench/tests/
#                                                       fio.rs runs that tool on rblk-bench's json+
#   python3-pyflakes shellcheck                         scripts/test.sh's scripts step: shellcheck -x
#                                                       on every shell script, pyflakes3 on the Python
#   valgrind                                            scripts/insns.sh: instructions per request
#                                                       under callgrind, gated against a baseline
PACKAGES=(
    qemu-system-x86 busybox-static cpio kmod xz-utils
    iproute2 rdma-core ibverbs-providers ibverbs-utils perftest rdmacm-utils
    cmake libclang-dev linux-libc-dev
    e2fsprogs util-linux coreutils python3
    qemu-utils nbd-client fio
    fuse3
    nvme-cli
    systemd
    curl
    python3-matplotlib
    mdadm
    man-db groff-base
    python3-six
    python3-pyflakes shellcheck
    valgrind
)

# Print the packages of PACKAGES that are not fully installed.
missing_packages() {
    local installed
    # One dpkg-query call for all packages; unknown packages only produce an error on stderr.
    installed=$(dpkg-query -W -f='${Package} ${Status}\n' "${PACKAGES[@]}" 2>/dev/null |
        awk '$2 == "install" && $3 == "ok" && $4 == "installed" { print $1 }') || true
    local p
    for p in "${PACKAGES[@]}"; do
        grep -qxF -- "$p" <<<"$installed" || printf '%s\n' "$p"
    done
}

main() {
    local -a missing
    mapfile -t missing < <(missing_packages)
    ((${#missing[@]} == 0)) && return 0

    local -a sudo=()
    if ((EUID != 0)); then
        if command -v sudo >/dev/null; then
            sudo=(sudo -n)
        else
            echo "deps.sh: missing packages (${missing[*]}) and not root; install them as root" >&2
            return 1
        fi
    fi

    echo "deps.sh: installing ${missing[*]}" >&2
    # Wait for a concurrent apt/dpkg (e.g. unattended-upgrades) instead of failing on its lock.
    local -a apt=(apt-get -q -o DPkg::Lock::Timeout=600)
    "${sudo[@]}" "${apt[@]}" update </dev/null >&2
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        "${apt[@]}" install -y --no-install-recommends "${missing[@]}" </dev/null >&2
}

main "$@"
