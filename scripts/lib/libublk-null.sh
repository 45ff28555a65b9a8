# shellcheck shell=bash disable=SC2034 # LIBUBLK_NULL* are for the caller
# libublk's null target for scripts/compare-rxe.sh's libublk-null rows, built on the host (sourced
# by compare-rxe.sh after scripts/lib/script.sh; bash). The stand-ins' sources are
# scripts/lib/libublk-null/NAME/lib.rs, the manifest's rewrite scripts/lib/libublk_null.py.

# libublk 0.4.8's own examples/null, built from the crate's source in ~/.cargo/registry (a copy in
# build/libublk-null/, its own workspace and target directory), offline. The crate's
# dev-dependencies are all resolved to build an example; those examples/null.rs does not use are
# dropped, and env_logger and daemonize, which it does use but the offline registry lacks, get
# stand-ins (logging off; no daemon mode: it runs with --foreground). examples/null.rs itself is
# built unchanged. Sets LIBUBLK_NULL to the binary and LIBUBLK_NULL_INFO to how it was built, or
# LIBUBLK_NULL_WHY.
build_libublk_null() {
    local src dst=$REPO_ROOT/build/libublk-null crate how
    LIBUBLK_NULL="" LIBUBLK_NULL_WHY=""
    src=$(find "${CARGO_HOME:-$HOME/.cargo}"/registry/src -maxdepth 2 -type d -name libublk-0.4.8 2>/dev/null | head -n 1)
    if [[ -z $src ]]; then
        LIBUBLK_NULL_WHY="no libublk-0.4.8 crate source under ${CARGO_HOME:-$HOME/.cargo}/registry/src"
        return 1
    fi
    crate=$dst/libublk-0.4.8
    # The crate's source never changes: an earlier build from the same source is used again.
    if [[ -x $dst/target/release/examples/null && -s $dst/built-from ]] &&
        [[ $(sed -n 1p "$dst/built-from") == "$src" ]]; then
        LIBUBLK_NULL=$dst/target/release/examples/null
        LIBUBLK_NULL_INFO=$(sed -n 2p "$dst/built-from")
        log "using $LIBUBLK_NULL (built earlier from $src)"
        return 0
    fi
    rm -rf "$crate" "$dst/built-from"
    mkdir -p "$dst"
    cp -r "$src" "$crate"
    chmod -R u+w "$crate"
    printf '\n[workspace]\n' >>"$crate/Cargo.toml" # not a member of rblk's workspace
    log "building libublk 0.4.8's examples/null in $crate (offline)"
    if (cd "$crate" && CARGO_TARGET_DIR=$dst/target cargo build --offline --release --example null) \
        >"$dst/build.log" 2>&1; then
        how="as published"
    else
        local name
        for name in env_logger daemonize; do
            mkdir -p "$dst/stand-ins/$name/src"
            cp "$REPO_ROOT/scripts/lib/libublk-null/$name/lib.rs" "$dst/stand-ins/$name/src/lib.rs"
        done
        printf '[package]\nname = "env_logger"\nversion = "0.9.99"\nedition = "2021"\n' >"$dst/stand-ins/env_logger/Cargo.toml"
        printf '[package]\nname = "daemonize"\nversion = "0.5.99"\nedition = "2021"\n' >"$dst/stand-ins/daemonize/Cargo.toml"
        python3 "$REPO_ROOT/scripts/lib/libublk_null.py" "$crate/Cargo.toml" || {
            LIBUBLK_NULL_WHY="cannot rewrite $crate/Cargo.toml"
            return 1
        }
        rm -f "$crate/Cargo.lock" # its versions are not all in the offline registry
        if ! (cd "$crate" && CARGO_TARGET_DIR=$dst/target cargo build --offline --release --example null) \
            >>"$dst/build.log" 2>&1; then
            LIBUBLK_NULL_WHY="cannot build libublk 0.4.8's examples/null offline: $(grep -m1 '^error' "$dst/build.log" || tail -n 1 "$dst/build.log")"
            return 1
        fi
        how="with stand-ins for env_logger and daemonize (not in the offline registry; logging off, run with --foreground)"
    fi
    LIBUBLK_NULL=$dst/target/release/examples/null
    LIBUBLK_NULL_INFO="libublk 0.4.8 examples/null built offline from $src $how: $LIBUBLK_NULL add -n ID -q 1 -d 32 --foreground"
    printf '%s\n%s\n' "$src" "$LIBUBLK_NULL_INFO" >"$dst/built-from"
    log "built $LIBUBLK_NULL"
}
