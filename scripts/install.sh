#!/usr/bin/env bash
# Install rblk's binaries, systemd units and example configuration.
#
#   scripts/install.sh [--prefix DIR] [--destdir DIR] [--unitdir DIR] [--confdir DIR] [--bin-dir DIR]
#
#   --prefix DIR   where the binaries go, DIR/bin (default /usr/local); the units' ExecStart=
#                  lines are rewritten to name DIR/bin
#   --destdir DIR  stage everything under DIR (packaging, tests): files go to DIR/PREFIX/bin,
#                  DIR/UNITDIR and DIR/CONFDIR, while the units still name PREFIX/bin and CONFDIR
#   --unitdir DIR  where the units go (default /etc/systemd/system, the administrator's own
#                  units; a distribution package would use /lib/systemd/system)
#   --confdir DIR  the configuration directory (default /etc/rblk); the units are rewritten to
#                  name it
#   --bin-dir DIR  take rblk, rblk-target and rblk-bench from DIR instead of the release build
#                  (build/release, built with `cargo build --release` when one is missing)
#
# Installs rblk, rblk-target, rblk-bench into PREFIX/bin; rblk-target.service and
# rblk-attach@.service into UNITDIR; the example configuration into CONFDIR/target.toml unless
# one exists there (it is never overwritten), and creates CONFDIR/attach/. With rblk-dist built,
# also shell completions and man pages into PREFIX/share (man1, and man5 for rblk-target.toml). It does not enable
# or start anything: then run `systemctl daemon-reload`, edit /etc/rblk/target.toml, check it with
# `rblk-target --config /etc/rblk/target.toml --check-config` and `systemctl enable --now
# rblk-target`.
set -euo pipefail

REPO_ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
PREFIX=/usr/local
DESTDIR=""
UNITDIR=/etc/systemd/system
CONFDIR=/etc/rblk
BIN_DIR=""
BINARIES=(rblk rblk-target rblk-bench)

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}

while (($#)); do
    case $1 in
    --prefix) PREFIX=${2:?--prefix needs a directory}; shift 2 ;;
    --destdir) DESTDIR=${2:?--destdir needs a directory}; shift 2 ;;
    --unitdir) UNITDIR=${2:?--unitdir needs a directory}; shift 2 ;;
    --confdir) CONFDIR=${2:?--confdir needs a directory}; shift 2 ;;
    --bin-dir) BIN_DIR=${2:?--bin-dir needs a directory}; shift 2 ;;
    -h | --help) usage ;;
    *) echo "install.sh: unknown argument $1" >&2; usage ;;
    esac
done
PREFIX=${PREFIX%/}
CONFDIR=${CONFDIR%/}
for d in "$PREFIX" "$UNITDIR" "$CONFDIR"; do
    [[ $d == /* ]] || { echo "install.sh: directories must be absolute: $d" >&2; exit 2; }
done

if [[ -z $BIN_DIR ]]; then
    # Cargo's build directory (build/, from .cargo/config.toml, unless CARGO_TARGET_DIR says otherwise).
    BIN_DIR=${CARGO_TARGET_DIR:-$REPO_ROOT/build}/release
    missing=()
    for b in "${BINARIES[@]}"; do
        [[ -x $BIN_DIR/$b ]] || missing+=("$b")
    done
    if ((${#missing[@]})); then
        echo "install.sh: building release binaries (${missing[*]} missing in $BIN_DIR)" >&2
        (cd "$REPO_ROOT" && cargo build --release --workspace --bins) >&2
    fi
fi
for b in "${BINARIES[@]}"; do
    [[ -x $BIN_DIR/$b ]] || { echo "install.sh: $BIN_DIR/$b is missing" >&2; exit 1; }
done

bindir=$DESTDIR$PREFIX/bin
unitdir=$DESTDIR$UNITDIR
confdir=$DESTDIR$CONFDIR

install -d -m 0755 "$bindir" "$unitdir" "$confdir" "$confdir/attach"
for b in "${BINARIES[@]}"; do
    install -m 0755 "$BIN_DIR/$b" "$bindir/$b"
done

# The units name /usr/local/bin and /etc/rblk; other directories get their own paths.
for unit in rblk-target.service rblk-attach@.service; do
    sed -e "s|/usr/local/bin/|$PREFIX/bin/|g" -e "s|/etc/rblk/|$CONFDIR/|g" \
        "$REPO_ROOT/dist/systemd/$unit" >"$unitdir/$unit.tmp"
    chmod 0644 "$unitdir/$unit.tmp"
    mv -f "$unitdir/$unit.tmp" "$unitdir/$unit"
done

# Drop-ins (settings only newer systemd versions know, kept out of the units).
for dropin in "$REPO_ROOT"/dist/systemd/*.service.d/*.conf; do
    dir=$unitdir/$(basename "$(dirname "$dropin")")
    install -d -m 0755 "$dir"
    install -m 0644 "$dropin" "$dir/$(basename "$dropin")"
done

if [[ -e $confdir/target.toml ]]; then
    echo "install.sh: keeping the existing $confdir/target.toml (the example is $REPO_ROOT/dist/rblk-target.toml)" >&2
else
    install -m 0644 "$REPO_ROOT/dist/rblk-target.toml" "$confdir/target.toml"
fi

# Shell completions and man pages, generated from the CLI definitions by rblk-dist (built with
# the other binaries by `cargo build --release --workspace --bins`).
if [[ -x $BIN_DIR/rblk-dist ]]; then
    gen=$(mktemp -d)
    "$BIN_DIR/rblk-dist" "$gen"
    share=$DESTDIR$PREFIX/share
    install -d "$share/bash-completion/completions" "$share/zsh/site-functions" \
        "$share/fish/vendor_completions.d" "$share/man/man1" "$share/man/man5"
    for f in "$gen"/completions/bash/*.bash; do
        install -m 0644 "$f" "$share/bash-completion/completions/$(basename "$f" .bash)"
    done
    install -m 0644 "$gen"/completions/zsh/_* "$share/zsh/site-functions/"
    install -m 0644 "$gen"/completions/fish/*.fish "$share/fish/vendor_completions.d/"
    install -m 0644 "$gen"/man/*.1 "$share/man/man1/"
    install -m 0644 "$gen"/man/*.5 "$share/man/man5/"    # rblk-target.toml(5)
    rm -rf "$gen"
else
    echo "install.sh: no $BIN_DIR/rblk-dist: completions and man pages not installed (cargo build --release -p rblk-dist)" >&2
fi

echo "install.sh: installed ${BINARIES[*]} into $bindir, units into $unitdir, configuration in $confdir" >&2
if [[ -z $DESTDIR ]]; then
    echo "install.sh: next: systemctl daemon-reload; edit $CONFDIR/target.toml; systemctl enable --now rblk-target" >&2
fi
