//! Configuration changes at run time (`SIGHUP`, [`Running::reload`]): volumes added and
//! removed, and new hosts, keys, access lists and limits, without dropping anyone.
//!
//! Rules:
//! - A configuration that does not pass [`Config::check`] changes nothing.
//! - A removed volume with open sessions stays (served as before, with its old access list)
//!   and is reported busy; the next reload tries again. An idle one goes: a durable one after
//!   the final flush that shutdown does, its identity kept for a later re-add.
//! - A volume whose size or backing path changed is served as it was (reported): remove it,
//!   reload, add it again.
//! - An added volume is created (or loaded from its backing store) before OPEN can find it; a
//!   volume that failed to load earlier is tried again.
//! - Hosts, keys and access lists apply to the next AUTH and OPEN; limits to connections and
//!   sessions from now on. `listen`, `device`, `state_dir`, block size and max I/O need a
//!   restart (reported).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use rblk_fabric::Chain;
use tracing::{info, warn};

use crate::config::{Config, Limits};
use crate::server::{self, Running, Shared};
use crate::start::{Progress, StartError};
use crate::volume::LoadError;
use crate::volume::Volume;

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
    /// Volumes whose size or backing path changed, served as before, with what changed.
    pub unchanged: Vec<(String, String)>,
    /// Settings that differ but only a restart applies.
    pub needs_restart: Vec<String>,
}

impl ReloadReport {
    /// True when no volume changed and nothing was left undone.
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
        for (name, what) in &self.unchanged {
            parts.push(format!("left {name} as it was ({what})"));
        }
        if !self.needs_restart.is_empty() {
            parts.push(format!("needs a restart: {}", self.needs_restart.join(", ")));
        }
        if parts.is_empty() {
            f.write_str("no volume changed")
        } else {
            f.write_str(&parts.join("; "))
        }
    }
}

impl Running {
    /// Applies `new` (see the module docs). Errors (nothing changed) when `new` does not pass
    /// [`Config::check`].
    pub fn reload(&self, new: Config) -> Result<ReloadReport, StartError> {
        self.reload_with(new, &mut |_| {})
    }

    /// [`Running::reload`], telling `progress` about each volume before it is loaded.
    pub fn reload_with(&self, new: Config, progress: &mut dyn FnMut(Progress<'_>)) -> Result<ReloadReport, StartError> {
        let mut current = self.shared.current.lock().unwrap_or_else(|p| p.into_inner());
        self.shared.apply(&mut current, new, progress)
    }
}

impl Shared {
    /// Applies `new` in place of `current` (the configuration applied last, locked by the
    /// caller: [`Running::reload_with`], or an admin request that changed one volume of it),
    /// which becomes `new` unless `new` does not pass [`Config::check`]. The one place volumes
    /// are added and removed at run time.
    pub(crate) fn apply(
        &self,
        current: &mut Config,
        new: Config,
        progress: &mut dyn FnMut(Progress<'_>),
    ) -> Result<ReloadReport, StartError> {
        let mut policy = new.check()?;
        let shared = self;
        let mut report = ReloadReport::default();
        let fixed = &self.fixed;
        let differs = [
            ("listen", new.listen != fixed.listen),
            ("metrics", new.metrics != fixed.metrics),
            ("admin_socket", new.admin_socket != fixed.admin_socket),
            ("device", new.device != fixed.device),
            ("state_dir", new.state_dir != fixed.state_dir),
            ("block_size", new.block_size != fixed.block_size),
            ("max_io", new.max_io != fixed.max_io),
            ("memory_windows", new.memory_windows != fixed.memory_windows),
        ];
        for (setting, _) in differs.iter().filter(|(_, d)| *d) {
            warn!("reload: {setting} changed, which only a restart applies");
            report.needs_restart.push((*setting).to_owned());
        }
        let wanted: HashMap<&str, &crate::config::VolumeSpec> =
            new.volumes.iter().map(|v| (v.name.as_str(), v)).collect();

        // Removals, the new policy and limits, in one step for OPEN.
        let (gone, to_load) = {
            let mut catalog = shared.catalog.write().unwrap_or_else(|p| p.into_inner());
            let mut gone: Vec<Arc<Volume>> = Vec::new();
            let mut names: Vec<String> = catalog.volumes.keys().cloned().collect();
            names.sort_unstable();
            for name in names {
                if wanted.contains_key(name.as_str()) {
                    continue;
                }
                let sessions = catalog.sessions_of(&name);
                if sessions > 0 {
                    warn!(
                        volume = %name,
                        sessions,
                        "the configuration removes volume {name}, but it has {sessions} open session(s): still served; \
                         the next reload tries again"
                    );
                    policy.keep_acl(&name, catalog.policy.acl(&name).cloned());
                    report.busy.push((name, sessions));
                } else if let Some(v) = catalog.volumes.remove(&name) {
                    catalog.specs.remove(&name);
                    gone.push(v);
                }
            }
            for (name, spec) in &wanted {
                if let Some(was) = catalog.specs.get(*name) {
                    let mut what = Vec::new();
                    if was.size != spec.size {
                        what.push(format!("size {} -> {}", was.size, spec.size));
                    }
                    if was.path != spec.path {
                        let show = |p: &Option<std::path::PathBuf>| {
                            p.as_ref().map_or_else(|| "RAM".to_owned(), |p| p.display().to_string())
                        };
                        what.push(format!("path {} -> {}", show(&was.path), show(&spec.path)));
                    }
                    if !what.is_empty() {
                        let what = what.join(", ");
                        warn!(volume = %name, "reload: {what}: not applied to a served volume (remove it, reload, add it again)");
                        report.unchanged.push(((*name).to_owned(), what));
                    }
                }
            }
            catalog.refused.retain(|name, _| wanted.contains_key(name.as_str()));
            catalog.policy = policy;
            *shared.limits.write().unwrap_or_else(|p| p.into_inner()) = Limits::of(&new);
            let to_load: Vec<crate::config::VolumeSpec> =
                new.volumes.iter().filter(|v| !catalog.volumes.contains_key(&v.name)).cloned().collect();
            (gone, to_load)
        };

        // Nobody can open these any more, and nobody has them open.
        for v in gone {
            server::final_flush(&shared.identity, &v);
            info!(volume = %v.name, "volume removed");
            report.removed.push(v.name.clone());
        }

        // Backing stores of the volumes still served (a removal just now freed its own).
        let in_use: Vec<std::path::PathBuf> =
            shared.catalog().volumes.values().filter_map(|v| v.backing.as_ref().map(|b| canonical(b.path()))).collect();
        let count = to_load.len();
        let mut loaded = Vec::new();
        for (i, v) in to_load.iter().enumerate() {
            let durable = v.path.is_some();
            if let Some(path) = v.path.as_deref().filter(|p| in_use.contains(&canonical(p))) {
                let why = format!("backing store {} is still used by a served volume", path.display());
                warn!(volume = %v.name, "reload: not adding the volume: {why}");
                report.refused.push((v.name.clone(), why));
                continue;
            }
            progress(Progress::Loading { name: &v.name, index: i + 1, count, size: v.size, durable });
            match server::load_volume(v, fixed.block_size, &shared.identity) {
                Ok(vol) => loaded.push((v.clone(), Arc::new(vol))),
                Err(e) => {
                    let why = match e {
                        LoadError::Memory(e) => format!("cannot map its memory: {}", Chain(&e)),
                        LoadError::Backing(e) => Chain(&e).to_string(),
                    };
                    tracing::error!(volume = %v.name, "reload: refusing the volume: {why}");
                    report.refused.push((v.name.clone(), why));
                }
            }
        }
        {
            let mut catalog = shared.catalog.write().unwrap_or_else(|p| p.into_inner());
            for (name, why) in &report.refused {
                catalog.refused.insert(name.clone(), why.clone());
            }
            for (spec, vol) in loaded {
                server::log_serving(&vol);
                report.added.push(spec.name.clone());
                catalog.refused.remove(&spec.name);
                catalog.volumes.insert(spec.name.clone(), vol);
                catalog.specs.insert(spec.name.clone(), spec);
            }
        }
        server::warn_memlock(shared);
        info!(%report, "configuration reloaded");
        *current = new;
        Ok(report)
    }
}

fn canonical(p: &std::path::Path) -> std::path::PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned())
}
