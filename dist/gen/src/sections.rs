//! What a page says that clap does not know: EXIT STATUS, ENVIRONMENT, FILES and SEE ALSO of
//! each section-1 page, and the name of the section a command's `after_long_help` goes under.
//!
//! One table, [`PAGES`], keyed by page name (`rblk`, `rblk-attach`, `rblk-target-admin`): a
//! subcommand's page takes each field from the most specific page on its path that sets it (so
//! every `rblk-*` page has rblk's exit codes unless its own entry says otherwise). An entry of
//! ENVIRONMENT or FILES can be tied to flags or subcommands: it shows on the pages whose command
//! (or one of its subcommands) has that flag or is that subcommand, so `RBLK_KEY_FILE` is not on
//! `rblk-devices(1)`. The
//! environment variables clap reads (`#[arg(env = ...)]`) are added by the page renderer from
//! the definitions themselves; an entry here only says more about one. Variables that only
//! tests set stay out.

/// A described item: an exit code, a variable, a file.
#[derive(Clone, Copy)]
pub(crate) struct Item {
    /// The tag: `0`, `RBLK_KEY_FILE`, `/etc/rblk/target.key`.
    pub(crate) name: &'static str,
    /// Where it is shown: on every page when empty, else on the pages whose command (or a
    /// subcommand of it) has one of these long flags (`--key-file`) or is one of these
    /// subcommands (`attach`).
    pub(crate) on: &'static [&'static str],
    /// What it means; `code` in backticks is set in bold.
    pub(crate) text: &'static str,
}

const fn item(name: &'static str, text: &'static str) -> Item {
    Item { name, on: &[], text }
}

const fn on(name: &'static str, on: &'static [&'static str], text: &'static str) -> Item {
    Item { name, on, text }
}

/// One page's entry; `None` takes the field from the page above it.
pub(crate) struct Entry {
    pub(crate) page: &'static str,
    pub(crate) exit_status: Option<&'static [Item]>,
    pub(crate) environment: Option<&'static [Item]>,
    pub(crate) files: Option<&'static [Item]>,
    /// Man pages, `name(section)`.
    pub(crate) see_also: Option<&'static [&'static str]>,
    /// The section `after_long_help` is rendered under; without one it continues DESCRIPTION.
    pub(crate) after_help_section: Option<&'static str>,
}

const NONE: Entry =
    Entry { page: "", exit_status: None, environment: None, files: None, see_also: None, after_help_section: None };

/// How a usage error ends, in all three binaries (clap's status).
const USAGE: Item = item(
    "2",
    "Usage error: an unknown option or subcommand, a missing argument, or a value its option does not take \
     (the message says which and what is wanted).",
);

const LOG: Item = item(
    "RUST_LOG",
    "What is logged on stderr, as a `tracing` filter: `info`, `debug`, `rblk_initiator=debug`. Default: `warn`.",
);

const INITIATOR_ENV: &[Item] = &[
    on(
        "RBLK_KEY_FILE",
        &["--key-file"],
        "The key file to prove to the target when `--key-file` is not given; it comes before the files under FILES.",
    ),
    on("RBLK_HOST_ID", &["--host-id"], "This host's identity when `--host-id` is not given (default: its hostname)."),
    on(
        "RBLK_KNOWN_TARGETS",
        &["--known-targets"],
        "The file of pinned target identities when `--known-targets` is not given; `none` pins nothing.",
    ),
    LOG,
];

const INITIATOR_FILES: &[Item] = &[
    on(
        "/etc/rblk/keys/HOST.key",
        &["--key-file"],
        "The key for the target HOST when neither `--key-file` nor `RBLK_KEY_FILE` names one: HOST as the URI \
         writes it, without brackets or port, a name in lower case. Key files hold at least 32 bytes and must \
         not be readable by group or others.",
    ),
    on(
        "/var/lib/rblk/target.key",
        &["--key-file"],
        "The key a target on this host made at its first start: used next, for this host's own addresses only.",
    ),
    on(
        "/etc/rblk/target.key",
        &["--key-file"],
        "The target's key copied to this host (`scp -p target:/var/lib/rblk/target.key /etc/rblk/target.key`): \
         used last, unless it is the local target's key file. `--no-key` connects without any key.",
    ),
    on(
        "/var/lib/rblk/known_targets",
        &["--known-targets"],
        "The identities of the targets met before, one per address, pinned at the first connection (as \
         OpenSSH's known_hosts); a target that answers with another identity is refused.",
    ),
];

/// The front ends' records, which `rblk list`, `detach` and `umount` read.
const RUN_DIR: Item = on(
    "/run/rblk/",
    &["attach", "detach", "list", "mount", "umount", "nbd"],
    "One record per ublk attachment, FUSE mount and NBD export of this host, written by the process serving \
     it and removed when it ends (`rblk list` reads them).",
);

/// rblk's: the connection's, and what its front ends and its logs read.
const RBLK_ENV: &[Item] = &[
    INITIATOR_ENV[0],
    INITIATOR_ENV[1],
    INITIATOR_ENV[2],
    INITIATOR_ENV[3],
    item(
        "JOURNAL_STREAM",
        "Set by systemd when stderr goes to the journal: log lines then carry the time and module, as they do \
         when stderr is not a terminal.",
    ),
    on(
        "NOTIFY_SOCKET",
        &["attach"],
        "Set by systemd for a `Type=notify` unit (`rblk-attach@.service`): `rblk attach` sends `READY=1` there \
         once the device exists.",
    ),
    on(
        "XDG_RUNTIME_DIR",
        &["nbd"],
        "For a user other than root, the directory of `rblk nbd`'s default socket: \
         `$XDG_RUNTIME_DIR/rblk/VOLUME.sock`.",
    ),
];

const RBLK: Entry = Entry {
    page: "rblk",
    exit_status: Some(&[
        item("0", "Success."),
        item(
            "1",
            "Failure: the target could not be reached or refused the request, or a device or file could not be \
             used; the reason is on stderr. The same in text and with `-o json`.",
        ),
        USAGE,
    ]),
    environment: Some(RBLK_ENV),
    files: Some(&[
        INITIATOR_FILES[0],
        INITIATOR_FILES[1],
        INITIATOR_FILES[2],
        INITIATOR_FILES[3],
        RUN_DIR,
        on(
            "/dev/rblk/NAME",
            &["attach", "detach"],
            "A symbolic link to an attached volume's /dev/ublkbN, removed at detach.",
        ),
        on(
            "/dev/ublk-control",
            &["attach", "detach"],
            "The ublk driver's control device (`modprobe ublk_drv`), for `rblk attach`.",
        ),
        on(
            "/etc/rblk/attach/NAME.conf",
            &["attach"],
            "The volume `rblk-attach@NAME.service` attaches (`RBLK_URI=...`).",
        ),
    ]),
    see_also: Some(&["rblk-target(1)", "rblk-bench(1)", "rblk-target.toml(5)", "nbd-client(8)", "nvme(1)"]),
    after_help_section: None,
};

const RBLK_BENCH: Entry = Entry {
    page: "rblk-bench",
    exit_status: Some(&[
        item("0", "The run completed (and with `--verify`, every block checked was good)."),
        item(
            "1",
            "The run failed: the target could not be reached or refused the volume, an I/O failed, an output \
             file could not be written (the previous result is kept), or `--verify` found bad blocks.",
        ),
        item(
            "2",
            "Usage error: an unknown option, a value an option does not take, a bad URI or a job file that does not \
             parse (the message names the file and line).",
        ),
    ]),
    environment: Some(INITIATOR_ENV),
    files: Some(INITIATOR_FILES),
    see_also: Some(&["fio(1)", "rblk(1)", "rblk-target(1)"]),
    after_help_section: Some("JSON OUTPUT"),
};

const TARGET_FILES: &[Item] = &[
    on(
        "/etc/rblk/target.toml",
        &["--config"],
        "The configuration `rblk-target.service` starts with (`--config /etc/rblk/target.toml`); see \
         rblk-target.toml(5). Relative paths in it are taken from its directory.",
    ),
    on(
        "/var/lib/rblk/",
        &["--state-dir"],
        "The state directory (`--state-dir`, `state_dir`): `target.key`, the key made at the first start when \
         none is configured; `target.id`, the target's identity that initiators pin; `admin.toml`, the volumes \
         `rblk-target admin` added and removed; and each durable volume's instance identity across a clean \
         shutdown.",
    ),
    on(
        "/run/rblk-target/admin.sock",
        &["--admin-socket"],
        "The admin socket (`--admin-socket`, `admin_socket`), mode 0600, for `rblk-target admin`.",
    ),
];

const TARGET_ENV: &[Item] = &[
    on("RBLK_KEY_FILE", &["--key-file"], "The shared key file when `--key-file` is not given."),
    on("RBLK_ADMIN_SOCKET", &["--admin-socket"], "The admin socket when `--admin-socket` is not given."),
    item(
        "RUST_LOG",
        "What is logged on stderr, as a `tracing` filter: `warn`, `debug`, `rblk_target=debug`. Default: `info`.",
    ),
    item(
        "NOTIFY_SOCKET",
        "Set by systemd for a `Type=notify` unit: the daemon reports its progress and `READY=1` there once it \
         accepts connections, and keeps volumes in the unit's file descriptor store for a handover (`LISTEN_FDS` \
         gives them back to the successor).",
    ),
];

const RBLK_TARGET: Entry = Entry {
    page: "rblk-target",
    exit_status: Some(&[
        item(
            "0",
            "Stopped by SIGINT or SIGTERM after disconnecting its peers and flushing durable volumes; or \
             `--check-config` found the configuration good; or `--print-config` printed it.",
        ),
        item(
            "1",
            "The configuration does not check, or the start failed (no RDMA device, a volume that cannot be \
             loaded, the port in use); the reason is on stderr.",
        ),
        USAGE,
        item(
            "75",
            "The volumes were handed to a successor (`rblk-target admin handover`); `RestartForceExitStatus=75` in \
             the unit makes systemd start the new binary at once.",
        ),
    ]),
    environment: Some(TARGET_ENV),
    files: Some(TARGET_FILES),
    see_also: Some(&["rblk-target.toml(5)", "rblk(1)", "rblk-bench(1)", "systemd.service(5)", "sd_notify(3)"]),
    after_help_section: None,
};

/// The subcommands of rblk-target are not the daemon: no 75, and no shutdown.
const TARGET_TOOL_EXIT: &[Item] = &[
    item("0", "Success."),
    item("1", "Failure: the daemon could not be reached or refused the request; the reason is on stderr."),
    USAGE,
];

/// Every page's entry; the order does not matter.
pub(crate) const PAGES: &[Entry] = &[
    RBLK,
    Entry { page: "rblk-nbd", see_also: Some(&["rblk(1)", "nbd-client(8)", "qemu-img(1)"]), ..NONE },
    Entry {
        page: "rblk-attach",
        see_also: Some(&["rblk(1)", "rblk-detach(1)", "rblk-list(1)", "systemd.service(5)"]),
        ..NONE
    },
    Entry {
        page: "rblk-mount",
        see_also: Some(&["rblk(1)", "rblk-umount(1)", "fusermount3(1)", "losetup(8)"]),
        ..NONE
    },
    RBLK_BENCH,
    RBLK_TARGET,
    Entry {
        page: "rblk-devices",
        files: Some(&[
            item("/sys/class/infiniband/", "The RDMA devices and their ports, as the kernel lists them."),
            item("/dev/infiniband/", "The devices' verbs and rdma_cm files, which a user must be able to open."),
        ]),
        see_also: Some(&["rblk(1)", "ibv_devices(1)", "rdma(8)"]),
        ..NONE
    },
    Entry {
        page: "rblk-completions",
        files: Some(&[
            item("/usr/local/share/bash-completion/completions/rblk", "Where `scripts/install.sh` installs bash's."),
            item("/usr/local/share/zsh/site-functions/_rblk", "zsh's."),
            item("/usr/local/share/fish/vendor_completions.d/rblk.fish", "fish's."),
        ]),
        ..NONE
    },
    Entry {
        page: "rblk-gen-key",
        files: Some(&[item(
            "/etc/rblk/keys/HOST.key",
            "Where `rblk` looks for its key for the target HOST; the target names the same key in that host's \
             `[[host]]` table (`key_file`), see rblk-target.toml(5).",
        )]),
        see_also: Some(&["rblk(1)", "rblk-target-gen-key(1)", "rblk-target.toml(5)"]),
        ..NONE
    },
    Entry {
        page: "rblk-target-admin",
        exit_status: Some(TARGET_TOOL_EXIT),
        environment: Some(&[TARGET_ENV[2]]),
        files: Some(&[
            item(
                "/run/rblk-target/admin.sock",
                "The daemon's admin socket (`--socket`), mode 0600: root's and the daemon's user's.",
            ),
            item(
                "/var/lib/rblk/admin.toml",
                "In the state directory: the volumes added and removed through the admin socket, which every start, \
                 reload and successor reads with the config file. Edit it only while the daemon is stopped.",
            ),
        ]),
        see_also: Some(&["rblk-target(1)", "rblk-target.toml(5)"]),
        ..NONE
    },
    Entry {
        page: "rblk-target-gen-key",
        exit_status: Some(TARGET_TOOL_EXIT),
        environment: Some(&[TARGET_ENV[2]]),
        files: Some(&[
            item(
                "/var/lib/rblk/target.key",
                "The key the daemon makes itself at its first start when none is configured.",
            ),
            item("/etc/rblk/hosts/HOST.key", "A host's own key, named by its `[[host]]` table's `key_file`."),
        ]),
        see_also: Some(&["rblk-target(1)", "rblk-target.toml(5)", "rblk-gen-key(1)"]),
        ..NONE
    },
];

/// The sections of the page at the end of `path` (its page names from the binary's down).
pub(crate) struct Resolved {
    pub(crate) exit_status: &'static [Item],
    pub(crate) environment: &'static [Item],
    pub(crate) files: &'static [Item],
    pub(crate) see_also: &'static [&'static str],
    pub(crate) after_help_section: Option<&'static str>,
}

/// Resolves `path`'s fields, the most specific entry first; an error names a binary without an
/// entry (every section-1 page must have all four sections).
pub(crate) fn resolve(path: &[String]) -> Result<Resolved, String> {
    let entries: Vec<&Entry> = path.iter().rev().filter_map(|p| PAGES.iter().find(|e| e.page == p)).collect();
    let page = path.last().map_or("", String::as_str);
    let missing = |what: &str| format!("dist/gen/src/sections.rs has no {what} for {page} or a page above it");
    Ok(Resolved {
        exit_status: entries.iter().find_map(|e| e.exit_status).ok_or_else(|| missing("EXIT STATUS"))?,
        environment: entries.iter().find_map(|e| e.environment).ok_or_else(|| missing("ENVIRONMENT"))?,
        files: entries.iter().find_map(|e| e.files).ok_or_else(|| missing("FILES"))?,
        see_also: entries.iter().find_map(|e| e.see_also).ok_or_else(|| missing("SEE ALSO"))?,
        // Only the page's own: a subcommand's after-help is its own text.
        after_help_section: entries.first().filter(|e| e.page == page).and_then(|e| e.after_help_section),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(pages: &[&str]) -> Vec<String> {
        pages.iter().map(|p| (*p).to_owned()).collect()
    }

    /// Trap 9 (man pages), EXIT STATUS and the rest on every page: catches a subcommand page
    /// that does not inherit its binary's sections, one that inherits what is not its own (the
    /// daemon's 75 on an admin tool's page), and a page nothing covers passing silently.
    #[test]
    fn subcommand_pages_inherit_unless_overridden() {
        let mount = resolve(&path(&["rblk", "rblk-mount"])).unwrap();
        let names = |items: &[Item]| items.iter().map(|i| i.name).collect::<Vec<_>>();
        assert_eq!(names(mount.exit_status), names(RBLK.exit_status.unwrap()));
        assert_eq!(names(mount.files), names(RBLK.files.unwrap()));
        assert_eq!(mount.see_also[0], "rblk(1)");
        let list = resolve(&path(&["rblk-target", "rblk-target-admin", "rblk-target-admin-list"])).unwrap();
        assert!(list.exit_status.iter().all(|i| i.name != "75"), "the daemon's status on an admin tool's page");
        assert!(resolve(&path(&["rblk-target"])).unwrap().exit_status.iter().any(|i| i.name == "75"));
        assert_eq!(resolve(&path(&["rblk-bench"])).unwrap().after_help_section, Some("JSON OUTPUT"));
        let Err(e) = resolve(&path(&["rblk-other"])) else { panic!("a page without an entry resolved") };
        assert!(e.contains("rblk-other"), "{e}");
    }
}
