//! What the caps and volumes need from the host against what the process's limits allow: file
//! descriptors (RLIMIT_NOFILE), tasks (RLIMIT_NPROC and the cgroup's `pids.max`, which is the
//! unit's `TasksMax=`) and pinned memory (RLIMIT_MEMLOCK), and the listen backlog against the
//! kernel's cap (`net.rdma_ucm.max_backlog`).
//!
//! Judged against the HARD limits: the daemon raises its soft limits to them at start
//! ([`raise_soft_limits`], as daemons do), so a soft limit below what the caps need is no
//! trouble, and `--check-config` (which the unit's `ExecStartPre=` runs in a process of its own)
//! says the same as the start. With every cap reached, connections past a limit would fail at
//! random (a thread, a QP, a registration that cannot be made) instead of being refused by a
//! cap: [`judge`] says so beforehand. [`judge`] is a pure function of the configuration and the
//! limits; [`Limits::of_this_process`] reads them.

use crate::config::Config;

/// Tasks (threads) the daemon needs besides its connections, about: the main and listener
/// threads, the signal handler, the admin socket and its clients, metrics, volume loads.
pub const TASKS_BASE: u64 = 16;

/// Tasks the daemon may need with every cap reached: [`TASKS_BASE`] (main, listener, slow-work
/// thread, admin and metrics), the worker threads that serve every connection
/// ([`Config::workers`]), and a write-back thread per volume. Connections add none. The one
/// place that knows how connections map to threads.
pub fn tasks_needed(cfg: &Config) -> u64 {
    let volumes = u64::try_from(cfg.volumes.len()).unwrap_or(u64::MAX);
    let workers = u64::try_from(cfg.workers).unwrap_or(u64::MAX);
    TASKS_BASE.saturating_add(volumes).saturating_add(workers)
}

/// Bytes the daemon may pin with every cap reached, on `devices` RDMA devices: every
/// connection's control buffers ([`rblk_fabric::channel::PINNED_BYTES`]), and the volumes: with
/// memory windows each volume once per device; without, each session its volume (at worst
/// every session the largest).
pub fn pinned_needed(cfg: &Config, devices: u64) -> u64 {
    let control = u64::try_from(rblk_fabric::channel::PINNED_BYTES).unwrap_or(u64::MAX);
    let control = cfg.max_connections().saturating_mul(control);
    let volumes = if cfg.memory_windows {
        cfg.volumes.iter().fold(0u64, |sum, v| sum.saturating_add(v.size)).saturating_mul(devices.max(1))
    } else {
        let largest = cfg.volumes.iter().map(|v| v.size).max().unwrap_or(0);
        u64::try_from(cfg.max_sessions).unwrap_or(u64::MAX).saturating_mul(largest)
    };
    control.saturating_add(volumes)
}

/// The limits a daemon's needs are judged against; None where there is none (unlimited, not
/// enforced for this process, or unknown).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    /// The hard RLIMIT_NOFILE.
    pub descriptors: Option<u64>,
    /// The lowest task limit that applies, and where it comes from.
    pub tasks: Option<TaskLimit>,
    /// The hard RLIMIT_MEMLOCK, unless the process may pin beyond it (CAP_IPC_LOCK).
    pub pinned: Option<u64>,
    /// `net.rdma_ucm.max_backlog`: the kernel caps `rdma_listen`'s backlog at it.
    pub max_backlog: Option<u64>,
    /// RDMA devices a volume may be registered on (with memory windows, once on each).
    pub devices: u64,
}

/// A limit on the daemon's tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskLimit {
    /// Tasks at most.
    pub max: u64,
    /// Which limit: "the hard RLIMIT_NPROC", or the cgroup's `pids.max`.
    pub source: String,
}

/// What `cfg`'s caps and volumes need beyond `limits`, in words that name the limit and the
/// fix; empty when everything fits.
pub fn judge(cfg: &Config, limits: &Limits) -> Vec<String> {
    let mut found = Vec::new();
    let connections = cfg.max_connections();
    let caps = "max_unopened + max_sessions + max_joins";
    let needed = cfg.descriptors_needed();
    if let Some(limit) = limits.descriptors.filter(|&l| needed > l) {
        found.push(format!(
            "the caps allow {connections} connections ({caps}), which need about {needed} file descriptors, more \
             than the hard RLIMIT_NOFILE allows ({limit}): raise it (LimitNOFILE= in the unit, ulimit -Hn) or lower \
             the caps"
        ));
    }
    let needed = tasks_needed(cfg);
    if let Some(limit) = limits.tasks.as_ref().filter(|l| needed > l.max) {
        found.push(format!(
            "the caps allow {connections} connections ({caps}), which need about {needed} tasks (a thread per \
             connection), more than {} allows ({}): raise it (TasksMax= in the unit) or lower the caps",
            limit.source, limit.max
        ));
    }
    let needed = pinned_needed(cfg, limits.devices);
    if let Some(limit) = limits.pinned.filter(|&l| needed > l) {
        let volumes = if cfg.memory_windows {
            "every volume registered once per RDMA device"
        } else {
            "without memory windows, every session registers its volume: max_sessions x the largest"
        };
        found.push(format!(
            "the volumes and caps need up to {} of pinned memory ({volumes}, and {} of control buffers per \
             connection), more than the hard RLIMIT_MEMLOCK allows ({}): raise it (LimitMEMLOCK=infinity in the \
             unit, ulimit -l unlimited) or run as root",
            rblk_proto::Bytes(needed),
            rblk_proto::Bytes(rblk_fabric::channel::PINNED_BYTES as u64),
            rblk_proto::Bytes(limit),
        ));
    }
    let backlog = u64::from(cfg.listen_backlog);
    if let Some(max) = limits.max_backlog.filter(|&m| backlog > m) {
        found.push(format!(
            "listen_backlog = {backlog}, but the kernel caps it at net.rdma_ucm.max_backlog ({max}): raise that \
             (sysctl net.rdma_ucm.max_backlog={backlog}) or lower listen_backlog"
        ));
    }
    found
}

/// [`judge`] against this process's limits.
pub fn warnings(cfg: &Config) -> Vec<String> {
    judge(cfg, &Limits::of_this_process(cfg))
}

impl Limits {
    /// This process's: the hard limits, its cgroup's `pids.max` (cgroup v2, or v1's pids
    /// controller), the capabilities that exempt it (root's real uid, CAP_SYS_RESOURCE or
    /// CAP_SYS_ADMIN from RLIMIT_NPROC; CAP_IPC_LOCK from RLIMIT_MEMLOCK), and the RDMA devices
    /// `cfg` listens on.
    pub fn of_this_process(cfg: &Config) -> Limits {
        use nix::sys::resource::Resource;
        let caps = effective_caps();
        let has = |bit: u32| caps.is_some_and(|c| c & (1 << bit) != 0);
        let (sys_admin, ipc_lock, sys_resource) = (21, 14, 24);
        let mut tasks = if nix::unistd::getuid().is_root() || has(sys_admin) || has(sys_resource) {
            None
        } else {
            hard(Resource::RLIMIT_NPROC).map(|max| TaskLimit { max, source: "the hard RLIMIT_NPROC".into() })
        };
        if let Some(cgroup) = cgroup_tasks() {
            if tasks.as_ref().is_none_or(|t| cgroup.max < t.max) {
                tasks = Some(cgroup);
            }
        }
        let exempt = caps.map_or_else(|| nix::unistd::geteuid().is_root(), |_| has(ipc_lock));
        let devices = match (&cfg.device, std::fs::read_dir("/sys/class/infiniband")) {
            (Some(_), _) | (None, Err(_)) => 1,
            (None, Ok(dir)) => u64::try_from(dir.count()).unwrap_or(1).max(1),
        };
        Limits {
            descriptors: hard(Resource::RLIMIT_NOFILE),
            tasks,
            pinned: if exempt { None } else { hard(Resource::RLIMIT_MEMLOCK) },
            max_backlog: matches!(cfg.fabric, rblk_fabric::Fabric::Verbs)
                .then(|| read_number("/proc/sys/net/rdma_ucm/max_backlog"))
                .flatten(),
            devices,
        }
    }
}

/// A hard limit; None when unlimited or unreadable.
fn hard(resource: nix::sys::resource::Resource) -> Option<u64> {
    let (_, hard) = nix::sys::resource::getrlimit(resource).ok()?;
    (hard != nix::sys::resource::RLIM_INFINITY).then_some(hard)
}

fn read_number(path: impl AsRef<std::path::Path>) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `CapEff` from `/proc/self/status`.
fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
    u64::from_str_radix(hex, 16).ok()
}

/// The lowest `pids.max` on the way from this process's cgroup up to the root: under systemd
/// the unit's `TasksMax=` (or its slice's).
fn cgroup_tasks() -> Option<TaskLimit> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_tasks_in(&cgroups, std::path::Path::new("/sys/fs/cgroup"), &|p| read_number(p))
}

/// [`cgroup_tasks`] over `/proc/self/cgroup`'s text, the cgroup mount and a reader of
/// `pids.max` files (None: absent or "max").
fn cgroup_tasks_in(
    cgroups: &str,
    mount: &std::path::Path,
    read: &dyn Fn(&std::path::Path) -> Option<u64>,
) -> Option<TaskLimit> {
    // cgroup v1's pids controller ("N:pids:/path"), else the unified hierarchy ("0::/path").
    let v1 = cgroups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers.split(',').any(|c| c == "pids").then(|| (mount.join("pids"), path))
    });
    let v2 = || cgroups.lines().find_map(|l| l.strip_prefix("0::")).map(|path| (mount.to_owned(), path));
    let (root, path) = v1.or_else(v2)?;
    let mut best: Option<TaskLimit> = None;
    let mut at = std::path::PathBuf::from(path.trim());
    loop {
        let dir = root.join(at.strip_prefix("/").unwrap_or(&at));
        if let Some(max) = read(&dir.join("pids.max")) {
            if best.as_ref().is_none_or(|b| max < b.max) {
                best = Some(TaskLimit { max, source: format!("the cgroup {}'s pids.max", at.display()) });
            }
        }
        if !at.pop() {
            return best;
        }
    }
}

/// Raises the soft RLIMIT_NOFILE and RLIMIT_MEMLOCK to their hard limits, as daemons do at
/// start: the hard limits are what [`judge`] counts on. Logged at debug; a failure too.
pub fn raise_soft_limits() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    for (name, resource) in [("RLIMIT_NOFILE", Resource::RLIMIT_NOFILE), ("RLIMIT_MEMLOCK", Resource::RLIMIT_MEMLOCK)] {
        let Ok((soft, hard)) = getrlimit(resource) else { continue };
        if soft >= hard {
            continue;
        }
        match setrlimit(resource, hard, hard) {
            Ok(()) => tracing::debug!(soft, hard, "raised the soft {name} to the hard limit"),
            Err(e) => tracing::debug!(soft, hard, error = %e, "cannot raise the soft {name} to the hard limit"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::VolumeSpec;

    const GIB: u64 = 1 << 30;

    fn judged(cfg: &Config, limits: &Limits) -> String {
        judge(cfg, limits).join("\n")
    }

    /// Would catch a limit that is not judged (descriptors, tasks, pinned memory, backlog), one
    /// judged against anything but the caps' and volumes' needs, or a warning that fits caps
    /// within the limits.
    #[test]
    fn each_limit_is_judged_against_the_caps() {
        let cfg = Config {
            volumes: vec![VolumeSpec { name: "a".into(), size: GIB, path: None }],
            workers: 4,
            ..Config::default()
        };
        let connections = 64 + 1024 + 4096;
        assert_eq!(cfg.max_connections(), connections);
        // Connections add no task: the workers serve them all.
        assert_eq!(tasks_needed(&cfg), 16 + 1 + 4);
        assert_eq!(pinned_needed(&cfg, 2), connections * 128 * 1024 + 2 * GIB);
        let fits = Limits {
            descriptors: Some(cfg.descriptors_needed()),
            tasks: Some(TaskLimit { max: tasks_needed(&cfg), source: "the hard RLIMIT_NPROC".into() }),
            pinned: Some(pinned_needed(&cfg, 2)),
            max_backlog: Some(1024),
            devices: 2,
        };
        assert_eq!(judge(&cfg, &fits), Vec::<String>::new());
        assert_eq!(judge(&cfg, &Limits::default()), Vec::<String>::new(), "no limits, nothing to say");

        let fds = Limits { descriptors: Some(1024), ..fits.clone() };
        let text = judged(&cfg, &fds);
        assert!(text.contains("5184 connections") && text.contains("hard RLIMIT_NOFILE allows (1024)"), "{text}");
        assert_eq!(judge(&cfg, &fds).len(), 1);

        let tasks =
            Limits { tasks: Some(TaskLimit { max: 20, source: "the cgroup /x's pids.max".into() }), ..fits.clone() };
        let text = judged(&cfg, &tasks);
        assert!(text.contains("tasks") && text.contains("the cgroup /x's pids.max allows (20)"), "{text}");
        assert!(text.contains("TasksMax="), "{text}");

        let one_device = Limits { devices: 1, ..fits.clone() };
        assert!(judge(&cfg, &one_device).is_empty(), "a volume on one device pins it once");
        let pinned = Limits { pinned: Some(GIB), ..fits.clone() };
        let text = judged(&cfg, &pinned);
        assert!(text.contains("RLIMIT_MEMLOCK allows (1 GiB)") && text.contains("LimitMEMLOCK=infinity"), "{text}");
        let per_session = Config { memory_windows: false, ..cfg.clone() };
        assert_eq!(pinned_needed(&per_session, 2), connections * 128 * 1024 + 1024 * GIB);
        assert!(judged(&per_session, &fits).contains("every session registers its volume"));

        let backlog = Config { listen_backlog: 4096, ..cfg.clone() };
        let text = judged(&backlog, &fits);
        assert!(text.contains("net.rdma_ucm.max_backlog (1024)"), "{text}");

        let small = Config { max_unopened: 16, max_sessions: 64, max_joins: 128, ..cfg.clone() };
        let tight = Limits {
            descriptors: Some(1024),
            pinned: Some(3 * GIB),
            tasks: Some(TaskLimit { max: 4096, source: "the cgroup /x's pids.max".into() }),
            ..tasks
        };
        assert!(judge(&small, &tight).is_empty(), "{:?}", judge(&small, &tight));
    }

    /// Would catch the cgroup's task limit not found (v1's pids controller or v2's unified
    /// hierarchy), a parent's lower limit missed, or "max" taken as a limit.
    #[test]
    fn the_lowest_pids_max_up_the_cgroup_tree() {
        let mount = std::path::Path::new("/cg");
        let files = |p: &std::path::Path| match p.to_str()? {
            "/cg/system.slice/rblk-target.service/pids.max" => Some(8192),
            "/cg/system.slice/pids.max" => Some(30000),
            "/cg/pids/user.slice/pids.max" => Some(4000),
            "/cg/pids/user.slice/s.scope/pids.max" => None,
            _ => None,
        };
        let v2 = cgroup_tasks_in("0::/system.slice/rblk-target.service\n", mount, &files).unwrap();
        assert_eq!(
            v2,
            TaskLimit { max: 8192, source: "the cgroup /system.slice/rblk-target.service's pids.max".into() }
        );
        let v1 = cgroup_tasks_in("9:name=systemd:/x\n8:pids:/user.slice/s.scope\n0::/\n", mount, &files).unwrap();
        assert_eq!((v1.max, v1.source.as_str()), (4000, "the cgroup /user.slice's pids.max"));
        assert_eq!(cgroup_tasks_in("0::/other\n", mount, &files), None);
    }

    /// Would catch a start that leaves the soft RLIMIT_NOFILE below the hard one (the judgement
    /// counts on the hard one), read back from /proc/self/limits as `prlimit` shows it.
    #[test]
    fn the_soft_limits_are_raised_to_the_hard_ones() {
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        // One below the hard limit, so that other tests of this process keep their descriptors.
        setrlimit(Resource::RLIMIT_NOFILE, hard - 1, hard).unwrap();
        raise_soft_limits();
        assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap(), (hard, hard));
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
        let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
        let numbers: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
        assert_eq!(numbers, [hard.to_string(), hard.to_string()], "{line}");
    }
}
