//! Configuration changes at run time (`SIGHUP`, [`Running::reload`]): volumes added and
//! removed, and new hosts, keys, access lists and limits, without dropping anyone. This module
//! states the rules and holds the [`ReloadReport`]; [`Shared::apply`] applies them to the
//! registry.
//!
//! [`Running::reload`]: crate::server::Running::reload
//! [`Shared::apply`]: crate::registry::Shared
//!
//! Rules:
//! - A configuration that does not pass [`Config::check`](crate::config::Config::check) changes
//!   nothing.
//! - A reload that would remove a RAM volume sessions could have written (opened read-write
//!   since it was created or handed over) is refused, nothing changed, unless the file lists it
//!   in `confirm_remove`: its contents would go with it. `rblk-target admin remove` names its
//!   volume, which confirms it.
//! - A removed volume with open sessions stays (served as before, with its old access list)
//!   and is reported busy; the next reload tries again. An idle one goes: a durable one after
//!   the final flush that shutdown does, its identity kept for a later re-add.
//! - A volume whose backing path changed is served as it was (reported): remove it, reload,
//!   add it again.
//! - A volume whose size grew grows while it is served ([`Volume::grow`]: nothing in it moves
//!   or is copied), and its sessions hear of it
//!   ([`Shared::grow_volume`](crate::registry::Shared::grow_volume)); a grow that cannot be
//!   done (a ninth segment, its reserved address space full) is reported and leaves it as it was.
//! - A volume whose size shrank is made again at the new size, as a removal and an addition
//!   would (a RAM volume holding data needs `confirm_remove`); while sessions have it open it
//!   is served as it was (reported).
//!
//! [`Volume::grow`]: crate::volume::Volume::grow
//! - An added volume is created (or loaded from its backing store) before OPEN can find it; a
//!   volume that failed to load earlier is tried again.
//! - Hosts, keys and access lists apply to the next AUTH and OPEN, and take access away at
//!   once: sessions whose host must now prove another key (or cannot log in at all), or that
//!   the access lists no longer allow, are released (their rkeys die) and their connections
//!   end; a JOIN to one is refused. A change that widens access is refused unless the file
//!   says `confirm_widen = true` (see [`crate::access_changes`]). Limits apply to connections
//!   and sessions from now on. `listen`, `device`, `state_dir`, block size and max I/O need a
//!   restart (reported).

use std::fmt;

/// What a reload did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReloadReport {
    /// Volumes served now that were not before.
    pub added: Vec<String>,
    /// Volumes no longer served (durable ones flushed to their backing store first).
    pub removed: Vec<String>,
    /// Volumes the configuration no longer has that are kept because sessions have them open,
    /// with the number of sessions.
    pub busy: Vec<(String, usize)>,
    /// Volumes that could not be created or loaded, with the reason (OPEN reports it).
    pub refused: Vec<(String, String)>,
    /// Volumes whose size or backing path changed, served as before, with what changed and why.
    pub unchanged: Vec<(String, String)>,
    /// Volumes grown while served: name, old and new size in bytes.
    pub grown: Vec<(String, u64, u64)>,
    /// Settings that differ but only a restart applies.
    pub needs_restart: Vec<String>,
    /// Who may get in and open what, as it changed.
    pub access: Vec<crate::access_changes::AccessChange>,
    /// Sessions released because the new policy no longer admits them: id, and whose session
    /// of which volume and why.
    pub released: Vec<(u64, String)>,
}

impl ReloadReport {
    /// True when nothing changed and nothing was left undone.
    pub fn is_quiet(&self) -> bool {
        *self == ReloadReport::default()
    }
}

impl fmt::Display for ReloadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if !self.added.is_empty() {
            parts.push(format!("added {}", self.added.join(", ")));
        }
        if !self.removed.is_empty() {
            parts.push(format!("removed {}", self.removed.join(", ")));
        }
        for (name, n) in &self.busy {
            parts.push(format!("kept {name} ({n} open sessions)"));
        }
        for (name, why) in &self.refused {
            parts.push(format!("refused {name} ({why})"));
        }
        for (name, was, size) in &self.grown {
            parts.push(format!("grew {name} from {} to {}", rblk_proto::Bytes(*was), rblk_proto::Bytes(*size)));
        }
        for (name, what) in &self.unchanged {
            parts.push(format!("left {name} as it was ({what})"));
        }
        if !self.needs_restart.is_empty() {
            parts.push(format!("needs a restart: {}", self.needs_restart.join(", ")));
        }
        if !self.access.is_empty() {
            parts.push(format!("access: {}", crate::access_changes::describe(&self.access)));
        }
        if !self.released.is_empty() {
            let each: Vec<&str> = self.released.iter().map(|(_, what)| what.as_str()).collect();
            parts.push(format!("released {}: {}", crate::counted(self.released.len(), "session"), each.join("; ")));
        }
        if parts.is_empty() {
            f.write_str("nothing changed")
        } else {
            f.write_str(&parts.join("; "))
        }
    }
}
