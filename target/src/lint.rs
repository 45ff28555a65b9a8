//! What a start accepts but nobody can use: the findings of `--check-config` beyond the checks a
//! start makes ([`crate::config::Config::check`]).
//!
//! - An access list naming a host that can never authenticate (no shared key, and no `[[host]]`
//!   of that name with a `key_file`), and a `[[host]]` that never can: an error.
//! - A backing store the daemon's user cannot write (or cannot create in its directory): an
//!   error; the volume would be refused at its load.
//! - Volumes that need more memory than the host has (every volume is held in memory, durable
//!   ones too): an error; more than is available now: a warning.
//!
//! `--check-config` prints every finding and fails on errors; a start logs them all as
//! warnings and goes on, as it did before these checks existed.

use std::fmt;
use std::path::Path;

use crate::access::{Policy, ANY_HOST};
use crate::config::Config;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// `--check-config` fails.
    Error,
    /// Said, not failed.
    Warning,
}

/// One finding, in words that name the entry and the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// How bad.
    pub level: Level,
    /// What and how to fix it.
    pub text: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.level {
            Level::Error => "error",
            Level::Warning => "warning",
        };
        write!(f, "{level}: {}", self.text)
    }
}

/// Sizes in the config file written with a decimal unit (`64GB`): those meant binary units
/// (64 GiB) before sizes took both unit families, and now mean 64 x 10^9 bytes. A whole number
/// of blocks either way, so nothing refuses them: a warning says so, since a durable volume
/// whose size changes starts as a new instance (its initiators report unflushed writes lost).
pub fn decimal_sizes(file: &crate::config::File) -> Vec<Finding> {
    let mut found = Vec::new();
    for v in &file.volumes {
        let crate::config::Size::Text(text) = &v.size else { continue };
        let binary = text.trim().trim_end_matches(['B', 'b']);
        let (Ok(now), Ok(before)) = (rblk_proto::parse_size(text), rblk_proto::parse_size(binary)) else { continue };
        if now != before {
            found.push(Finding {
                level: Level::Warning,
                text: format!(
                    "volume {}: size {text:?} is decimal ({now} bytes, {}); before sizes took both unit families it \
                     was {}: write {binary:?} or \"{binary}iB\" to keep that size (a durable volume whose size \
                     changes starts as a new instance, and its initiators report unflushed writes as lost)",
                    v.name,
                    rblk_proto::Bytes(now),
                    rblk_proto::Bytes(before),
                ),
            });
        }
    }
    found
}

/// The host's memory, from `/proc/meminfo` (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// `MemTotal`.
    pub total: u64,
    /// `MemAvailable`.
    pub available: u64,
}

impl Memory {
    /// This host's, if `/proc/meminfo` can be read.
    pub fn of_this_host() -> Option<Memory> {
        Memory::parse(&std::fs::read_to_string("/proc/meminfo").ok()?)
    }

    fn parse(meminfo: &str) -> Option<Memory> {
        let field = |name: &str| {
            meminfo.lines().find_map(|l| {
                let rest = l.strip_prefix(name)?.strip_prefix(':')?.trim();
                rest.strip_suffix("kB").unwrap_or(rest).trim().parse::<u64>().ok().map(|kib| kib * 1024)
            })
        };
        Some(Memory { total: field("MemTotal")?, available: field("MemAvailable")? })
    }
}

/// Every finding for `cfg` (already checked, with its `policy`) on a host with `memory`.
pub fn lint(cfg: &Config, policy: &Policy, memory: Option<Memory>) -> Vec<Finding> {
    let mut found = Vec::new();
    hosts(cfg, policy, &mut found);
    backing_stores(cfg, &mut found, &|path, write_only| {
        use nix::unistd::{access, AccessFlags};
        let flags =
            if write_only { AccessFlags::W_OK | AccessFlags::X_OK } else { AccessFlags::R_OK | AccessFlags::W_OK };
        access(path, flags).map_err(std::io::Error::from)
    });
    if let Some(m) = memory {
        memory_needed(cfg, m, &mut found);
    }
    found
}

fn error(found: &mut Vec<Finding>, text: String) {
    found.push(Finding { level: Level::Error, text });
}

fn hosts(cfg: &Config, policy: &Policy, found: &mut Vec<Finding>) {
    let keyed: Vec<&str> = cfg.hosts.iter().filter(|h| h.key.is_some()).map(|h| h.name.as_str()).collect();
    let why = |host: &str| {
        let configured = cfg.hosts.iter().any(|h| h.name == host);
        let known = if keyed.is_empty() { "none".to_owned() } else { keyed.join(", ") };
        let similar =
            keyed.iter().find(|k| same_letters(k, host)).map_or_else(String::new, |k| format!(" (did you mean {k}?)"));
        if configured {
            format!("its [[host]] entry has no key_file and the target has no shared key (key_file): give it a key_file{similar}")
        } else {
            format!(
                "the target has no shared key (key_file) and no [[host]] named {host} with a key_file (hosts with keys: \
                 {known}): add one, or correct the name{similar}"
            )
        }
    };
    for h in &cfg.hosts {
        if policy.can_log_in(&h.name).is_err() {
            error(found, format!("[[host]] {} can never log in: {}", h.name, why(&h.name)));
        }
    }
    let mut volumes: Vec<_> = cfg.acls.iter().collect();
    volumes.sort_by(|a, b| a.0.cmp(b.0));
    for (volume, acl) in volumes {
        for host in acl.keys().filter(|h| *h != ANY_HOST) {
            let listed_as_host = cfg.hosts.iter().any(|h| h.name == *host);
            if policy.can_log_in(host).is_err() && !listed_as_host {
                error(
                    found,
                    format!("volume {volume}: allow names host {host}, which can never log in: {}", why(host)),
                );
            }
        }
    }
}

/// The same name but for case and punctuation (`db-1` and `DB1`).
fn same_letters(a: &str, b: &str) -> bool {
    let norm =
        |s: &str| s.chars().filter(char::is_ascii_alphanumeric).map(|c| c.to_ascii_lowercase()).collect::<String>();
    norm(a) == norm(b)
}

/// `probe(path, is_dir)`: whether this user may read and write the file at `path`, or create
/// files in the directory at `path` (access(2); a parameter so tests can refuse as root).
type Probe<'a> = &'a dyn Fn(&Path, bool) -> std::io::Result<()>;

fn backing_stores(cfg: &Config, found: &mut Vec<Finding>, probe: Probe<'_>) {
    for v in &cfg.volumes {
        let Some(path) = &v.path else { continue };
        let (what, checked, is_dir) = if path.exists() {
            ("write its backing store", path.as_path(), false)
        } else {
            let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            ("create its backing file in", parent, true)
        };
        if let Err(e) = probe(checked, is_dir) {
            let user = nix::unistd::Uid::effective();
            error(
                found,
                format!(
                    "volume {}: this user (uid {user}) cannot {what} {} ({}): the volume would be refused at its load; \
                     run the daemon as a user who can, or give the volume another path",
                    v.name,
                    checked.display(),
                    e
                ),
            );
        }
    }
}

/// The state directory, for `--check-config` run as the user the daemon starts as (the unit's
/// `ExecStartPre=` is): an error when this user cannot create or write it and a start must
/// make something there (the generated key, `target.id`); a warning when it only will later
/// (`admin.toml` at `admin add`, durable volumes' identities at shutdown).
/// (tests/tests/config_traps.rs runs it as nobody.)
pub fn state_dir(file: &crate::config::File) -> Vec<Finding> {
    use crate::config::{KeySource, DEFAULT_STATE_DIR, TARGET_ID};
    use nix::unistd::{access, AccessFlags};
    let dir = file.state_dir.as_deref().unwrap_or(Path::new(DEFAULT_STATE_DIR));
    // A missing directory is made (mode 0700) in its nearest existing ancestor.
    let Some(existing) = dir.ancestors().find(|p| p.exists()) else { return Vec::new() };
    let Err(e) = access(existing, AccessFlags::W_OK | AccessFlags::X_OK).map_err(std::io::Error::from) else {
        return Vec::new();
    };
    let mut made: Vec<String> = Vec::new();
    if let KeySource::Generated(key) = file.key_source() {
        if !key.exists() {
            made.push(key.display().to_string());
        }
    }
    let id = dir.join(TARGET_ID);
    if !id.exists() {
        made.push(id.display().to_string());
    }
    let user = nix::unistd::Uid::effective();
    let what = if existing == dir { "write" } else { "create" };
    let mut found = Vec::new();
    if made.is_empty() {
        found.push(Finding {
            level: Level::Warning,
            text: format!(
                "state_dir {}: this user (uid {user}) cannot {what} it ({}): `rblk-target admin add` could not save \
                 admin.toml, and durable volumes could not keep their identities across a restart",
                dir.display(),
                e
            ),
        });
    } else {
        error(
            &mut found,
            format!(
                "state_dir {}: this user (uid {user}) cannot {what} it ({}), so a start would fail making {}: run the \
                 daemon as the user that owns it (the unit's User=), or give it a state_dir that user may write \
                 (install -d -m 0700 -o USER {})",
                dir.display(),
                e,
                made.join(" and "),
                dir.display()
            ),
        );
    }
    found
}

fn memory_needed(cfg: &Config, m: Memory, found: &mut Vec<Finding>) {
    let need: u64 = cfg.volumes.iter().map(|v| v.size).sum();
    let show = |n: u64| rblk_proto::Bytes(n).to_string();
    let what =
        format!("the volumes need {} of memory in all (every volume is held in memory, durable ones too)", show(need));
    if need > m.total {
        error(
            found,
            format!(
                "{what}, more than this host has ({}): sessions would fail to register it; make volumes smaller or fewer",
                show(m.total)
            ),
        );
    } else if need > m.available {
        found.push(Finding {
            level: Level::Warning,
            text: format!("{what}, more than is available now ({} of {})", show(m.available), show(m.total)),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::{Grant, HostSpec};
    use crate::config::VolumeSpec;

    fn config(shared: Option<&[u8]>, hosts: &[(&str, bool)], allow: &[&str]) -> Config {
        let acl = allow.iter().map(|h| ((*h).to_owned(), Grant::ReadWrite)).collect();
        Config {
            volumes: vec![VolumeSpec::new("db", 1 << 20, None).unwrap()],
            key: shared.map(<[u8]>::to_vec),
            hosts: hosts
                .iter()
                .map(|(n, k)| HostSpec { name: (*n).into(), key: k.then(|| b"k".repeat(32)), ..HostSpec::default() })
                .collect(),
            acls: [("db".to_owned(), acl)].into(),
            ..Config::default()
        }
    }

    fn errors(cfg: &Config) -> Vec<String> {
        let policy = cfg.check().unwrap();
        lint(cfg, &policy, None).into_iter().filter(|f| f.level == Level::Error).map(|f| f.text).collect()
    }

    /// Would catch an access list naming a host that can never authenticate passing the check
    /// (`db-1` listed where only `db1` has a key and there is no shared key).
    #[test]
    fn a_host_that_can_never_log_in_is_an_error() {
        let e = errors(&config(None, &[("db1", true)], &["db-1"]));
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("volume db: allow names host db-1") && e[0].contains("did you mean db1?"), "{e:?}");
        // The same names with a shared key: every host can prove it.
        assert!(errors(&config(Some(&[7; 32]), &[("db1", true)], &["db-1"])).is_empty());
        // Listed with its own key: fine. A [[host]] without a key and no shared key: never.
        assert!(errors(&config(None, &[("db1", true)], &["db1", "*"])).is_empty());
        let e = errors(&config(None, &[("db1", true), ("web", false)], &["web"]));
        assert!(e.len() == 1 && e[0].starts_with("[[host]] web can never log in"), "{e:?}");
        // No key at all (allow_any_host): names are taken as claimed.
        assert!(errors(&config(None, &[], &["anyone"])).is_empty());
    }

    /// Would catch a backing store the user cannot create or write passing the check (the
    /// probe refuses here, as access(2) does for a user without the rights: root passes it
    /// nearly everywhere; target/tests/cli.rs runs the real one as another user).
    #[test]
    fn a_backing_store_that_cannot_be_written_is_an_error() {
        let dir = std::env::temp_dir();
        let (missing, existing) = (dir.join("rblk-lint-missing.img"), std::env::current_exe().unwrap());
        let cfg = Config {
            volumes: vec![
                VolumeSpec::new("new", 1 << 20, Some(missing.clone())).unwrap(),
                VolumeSpec::new("old", 1 << 20, Some(existing.clone())).unwrap(),
            ],
            ..Config::default()
        };
        let mut found = Vec::new();
        let refuse = |_: &Path, _: bool| Err(std::io::Error::from_raw_os_error(libc::EACCES));
        backing_stores(&cfg, &mut found, &refuse);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].text.contains(&format!(
                "volume new: this user (uid {}) cannot create its backing file in {}",
                nix::unistd::Uid::effective(),
                dir.display()
            )),
            "{found:?}"
        );
        assert!(found[1].text.contains(&format!("cannot write its backing store {}", existing.display())), "{found:?}");
        assert!(found.iter().all(|f| f.level == Level::Error && f.text.contains("Permission denied")));
        let mut none = Vec::new();
        backing_stores(&cfg, &mut none, &|_: &Path, _: bool| Ok(()));
        assert!(none.is_empty());
    }

    /// Would catch a config size with a decimal unit (`64GB`, which meant 64 GiB before sizes
    /// took both unit families) passing without a word.
    #[test]
    fn decimal_units_in_the_config_are_warned_about() {
        let file: crate::config::File = toml::from_str(
            "[[volume]]\nname = \"a\"\nsize = \"64GB\"\n[[volume]]\nname = \"b\"\nsize = \"64G\"\n[[volume]]\nname = \"c\"\nsize = \"64GiB\"\n[[volume]]\nname = \"d\"\nsize = 4096\n",
        )
        .unwrap();
        let found = decimal_sizes(&file);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].level == Level::Warning
                && found[0].text.starts_with("volume a: size \"64GB\" is decimal (64000000000 bytes"),
            "{found:?}"
        );
        assert!(found[0].text.contains("it was 64 GiB"), "{found:?}");
    }

    /// Would catch volumes larger than the host's memory passing the check, and a warning
    /// turned into an error (a start still accepts what is only short of available memory).
    #[test]
    fn volumes_larger_than_memory() {
        let cfg = Config { volumes: vec![VolumeSpec::new("big", 16 << 40, None).unwrap()], ..Config::default() };
        let m = Memory::parse("MemTotal:       24000000 kB\nMemFree: 1 kB\nMemAvailable:   20000000 kB\n").unwrap();
        assert_eq!(m.total, 24_000_000 * 1024);
        let found = lint(&cfg, &Policy::default(), Some(m));
        assert!(found.len() == 1 && found[0].level == Level::Error && found[0].text.contains("16 TiB"), "{found:?}");
        let cfg = Config { volumes: vec![VolumeSpec::new("mid", 21 << 30, None).unwrap()], ..Config::default() };
        let found = lint(&cfg, &Policy::default(), Some(m));
        assert!(found.len() == 1 && found[0].level == Level::Warning, "{found:?}");
        assert!(lint(&cfg, &Policy::default(), Some(Memory { total: 1 << 40, available: 1 << 40 })).is_empty());
    }
}
