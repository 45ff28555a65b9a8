//! How to reach a target: fabric, device, key and timeouts.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rblk_fabric::{Fabric, Route};

use crate::wait::Wait;
use crate::{Error, Result};

/// Default deadline for each control exchange (connect, HELLO, AUTH, OPEN, FLUSH, ...).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Default deadline for each synchronous data operation ([`Volume::read_at`](crate::Volume::read_at)
/// and [`Volume::write_at`](crate::Volume::write_at) chunks).
pub const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(30);

/// Default pause between reconnect attempts ([`Reconnect::delay`]), as nvme-cli's
/// `--reconnect-delay`.
pub const DEFAULT_RECONNECT_DELAY: Duration = Duration::from_secs(2);

/// Default time a session keeps trying to reconnect ([`Reconnect::ctrl_loss_tmo`]), as nvme-cli's
/// `--ctrl-loss-tmo`.
pub const DEFAULT_CTRL_LOSS_TMO: Duration = Duration::from_secs(600);

/// Reconnect delays up to this one are kept exact ([`Reconnect::pause`]); longer ones (the
/// default among them) are jittered, so no pause is ever below half of it.
pub const EXACT_RECONNECT_DELAY: Duration = Duration::from_secs(1);

/// What a session does when it loses its target (a queue pair's error completion, keepalives
/// stopping): reconnect about every `delay` (jittered, [`Reconnect::pause`]), holding I/O
/// meanwhile, and replay what was in flight. nvme-cli's names and meanings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconnect {
    /// Pause between attempts (the first one is immediate), on average: each pause is drawn
    /// afresh between 0.5x and 1.5x of it ([`Reconnect::pause`]).
    pub delay: Duration,
    /// Give up this long after the loss: every waiting and later I/O fails. `Some(ZERO)`: do
    /// not reconnect at all (fail at once); `None`: retry forever.
    pub ctrl_loss_tmo: Option<Duration>,
    /// Fail waiting and new I/O with EIO this long after the loss while reconnecting goes on
    /// (for md, which must see a failed mirror leg quickly). `None` (the default): I/O waits
    /// until the session is back or gives up.
    pub fast_io_fail_tmo: Option<Duration>,
    /// How long the first connect keeps trying while the target cannot be reached or does not
    /// listen yet (a storage host still booting), with a jittered backoff up to
    /// [`FIRST_CONNECT_MAX_PAUSE`] ([`first_connect_pause`]) and a log line per attempt; a refusal
    /// (authentication, access, a bad request) ends it at once. Zero (the default): one
    /// attempt, as before.
    pub connect_timeout: Duration,
}

impl Default for Reconnect {
    fn default() -> Self {
        Reconnect {
            delay: DEFAULT_RECONNECT_DELAY,
            ctrl_loss_tmo: Some(DEFAULT_CTRL_LOSS_TMO),
            fast_io_fail_tmo: None,
            connect_timeout: Duration::ZERO,
        }
    }
}

/// The longest pause between two attempts of a first connect ([`Reconnect::connect_timeout`]).
pub const FIRST_CONNECT_MAX_PAUSE: Duration = Duration::from_secs(5);

/// The pause before first-connect attempt `attempt + 1` (after `attempt` failed ones, from 1)
/// for a random `draw`: 250 ms doubling per attempt up to [`FIRST_CONNECT_MAX_PAUSE`], each drawn
/// uniformly between half of that and all of it, so initiators that boot together do not knock
/// in step.
pub fn first_connect_pause(attempt: u32, draw: u64) -> Duration {
    let full = (Duration::from_millis(250) * 2u32.saturating_pow(attempt.saturating_sub(1).min(16)))
        .min(FIRST_CONNECT_MAX_PAUSE);
    let ns = full.as_nanos();
    let spread = (ns / 2 * u128::from(draw)) >> 64;
    Duration::from_nanos(u64::try_from(ns / 2 + spread).unwrap_or(u64::MAX))
}

impl Reconnect {
    /// The pause before the next attempt for a random `draw`: uniform in [0.5, 1.5) x `delay`
    /// for delays above [`EXACT_RECONNECT_DELAY`] (so never below half a second), `delay`
    /// itself up to it. Sessions that lost one target together (a target restart ends a
    /// thousand at once) then retry spread over a whole `delay` instead of in the same
    /// millisecond, as nvme-cli's fixed delay would have them. A delay of a second or less is
    /// one set for a quick return after a short flap, and kept exactly as asked.
    pub fn pause(&self, draw: u64) -> Duration {
        if self.delay <= EXACT_RECONNECT_DELAY {
            return self.delay;
        }
        let delay = self.delay.as_nanos();
        let spread = (delay * u128::from(draw)) >> 64;
        Duration::from_nanos(u64::try_from(delay / 2 + spread).unwrap_or(u64::MAX))
    }

    /// [`Reconnect::pause`] with a fresh draw from the OS random source.
    pub fn next_pause(&self) -> Duration {
        self.pause(u64::from_le_bytes(rblk_fabric::random()))
    }

    /// Never reconnect: a lost session fails at once (ctrl_loss_tmo 0).
    pub const NEVER: Reconnect = Reconnect {
        delay: DEFAULT_RECONNECT_DELAY,
        ctrl_loss_tmo: Some(Duration::ZERO),
        fast_io_fail_tmo: None,
        connect_timeout: Duration::ZERO,
    };

    /// Parses a timeout as nvme-cli takes it, with units: `-1` means forever (`None`); else a
    /// duration of at most [`MAX_RECONNECT_TIME`] ([`rblk_proto::parse_duration`]: `600`,
    /// `10m`, `1.5s`; a bare number is seconds).
    pub fn parse_timeout(text: &str) -> std::result::Result<Option<Duration>, String> {
        match text.trim() {
            "-1" => Ok(None),
            t => rblk_proto::parse_duration_bounded(t, Duration::ZERO, Some(MAX_RECONNECT_TIME))
                .map(Some)
                .map_err(|e| format!("{e}, or -1 for forever")),
        }
    }
}

/// The longest reconnect delay and timeout the flags take (longer: `-1`, forever): an
/// `Instant` plus any of them must not overflow.
pub const MAX_RECONNECT_TIME: Duration = Duration::from_secs(86_400);

/// The longest control timeout (`--timeout`) the flags take.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);

/// The longest `--spin` the flags take: a wait that spins longer burns a core for nothing.
pub const MAX_SPIN: Duration = Duration::from_secs(1);

/// The path flags of rblk's programs (`--device`, `--source-addr`, `--tos`, `--memory-windows`,
/// `--wait`, `--poll`, `--spin`), for `#[command(flatten)]`: how to reach the target besides its address, and how
/// to wait for it. Feature `clap`.
#[cfg(feature = "clap")]
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RouteArgs {
    /// Only use this RDMA device (mlx5_0, rxe0)
    ///
    /// The target's address picks the device; this checks that it is the one expected.
    #[arg(long, value_name = "NAME")]
    pub device: Option<String>,
    /// Connect from this local IP address [default: routing chooses]
    ///
    /// It picks the RDMA device, port and GID (RoCE: the netdev and GID that carry the address), as
    /// perftest's -x picks a GID.
    #[arg(long, value_name = "ADDR", value_parser = source_addr_arg)]
    pub source_addr: Option<IpAddr>,
    /// Type of service of the connections, 0-255 [default: the kernel's]
    ///
    /// RDMA_OPTION_ID_TOS, as perftest's -T; on RoCEv2 the IP header's DSCP and ECN bits, e.g. 106
    /// for DSCP 26 with ECN capable. The kernel's default is 0 unless rdma_cm's default_roce_tos is
    /// set.
    #[arg(long, value_name = "TOS", value_parser = tos_arg)]
    pub tos: Option<u8>,
    /// Ask for per-QP memory windows: on or off
    ///
    /// On (the default): where the target and its device have them, each queue pair gets an rkey of
    /// its own that works on no other QP and dies when the session closes, and the target registers
    /// a volume once for all sessions. Off, or with a target or device without them: one
    /// registration and one rkey per session.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = on_off_arg, action = clap::ArgAction::Set, hide_short_help = true)]
    pub memory_windows: bool,
    /// Wait policy: sleep, adaptive or poll [default: adaptive]
    ///
    /// How a thread waits for its queue pair (and, under `rblk attach`, for its ublk queue): sleep
    /// (arm and sleep at once: a wakeup per wait, no CPU spent spinning); adaptive (spin while work
    /// is near: a wait with at most two operations in flight spins for twice the thread's usual
    /// wait, at most 1 ms, a deeper one briefly, then sleeps; an idle device spins at most 1 ms a
    /// second); poll (adaptive at every depth, as perftest and SPDK poll).
    #[arg(long, value_name = "POLICY", value_enum, default_value_t = Wait::Adaptive, hide_default_value = true, hide_possible_values = true)]
    pub wait: Wait,
    /// The same as --wait poll (like fio's --hipri)
    ///
    /// Cuts the latency tail when several queues are busy, at the cost of a core per busy queue.
    #[arg(long, conflicts_with = "wait", hide_short_help = true)]
    pub poll: bool,
    /// The shortest spin before a wait sleeps [default: 20us]
    ///
    /// `10us`, `1ms`; at most 1 s. Deep queues under --wait adaptive spin this long, and no
    /// adaptive wait spins less. Longer spins cut latency and burn a core.
    #[arg(long, value_parser = |t: &str| rblk_proto::parse_duration_bounded(t, Duration::ZERO, Some(MAX_SPIN)), value_name = "DURATION", hide_short_help = true)]
    pub spin: Option<std::time::Duration>,
}

/// `--tos`: a byte, said in words when it is not one (not clap's `300 is not in 0..=255`).
#[cfg(feature = "clap")]
pub fn tos_arg(text: &str) -> std::result::Result<u8, String> {
    text.trim().parse().map_err(|_| {
        format!("--tos must be a whole number from 0 to 255 (the IP header's DSCP and ECN bits), got {text:?}")
    })
}

/// `--source-addr`: an IP address (not the standard library's `invalid IP address syntax`).
#[cfg(feature = "clap")]
pub fn source_addr_arg(text: &str) -> std::result::Result<IpAddr, String> {
    text.trim().parse().map_err(|_| {
        format!("--source-addr takes an IP address of this host (10.0.0.2, fe80::1), not a device name: got {text:?}")
    })
}

/// An on/off flag's value: `on`, `off` (and true/false, yes/no, 1/0), not clap's `value was not
/// a boolean` and `[possible values: true, false]`.
#[cfg(feature = "clap")]
pub fn on_off_arg(text: &str) -> std::result::Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => Err(format!("expected on or off, got {text:?}")),
    }
}

#[cfg(feature = "clap")]
impl RouteArgs {
    /// Sets `options`' device, source address, type of service, memory windows and polling from
    /// the flags.
    pub fn apply(&self, options: &mut Options) {
        options.wait = if self.poll { Wait::Poll } else { self.wait };
        if let Some(spin) = self.spin {
            options.spin = spin;
        }
        options.device = self.device.clone();
        options.source_addr = self.source_addr;
        options.tos = self.tos;
        options.memory_windows = self.memory_windows;
    }
}

/// The trust flags of rblk's programs (`--target-id`, `--known-targets`, `--allow-v1-target`),
/// for `#[command(flatten)]`: which target a key may be proved to. Feature `clap`.
#[cfg(feature = "clap")]
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TrustArgs {
    /// The identity the target must prove (32 hex digits)
    ///
    /// The target's STATE_DIR/target.id (its start log says it too). Without it, the identity
    /// pinned for the target's address in --known-targets, pinned there at the first connection.
    #[arg(long, value_name = "ID", value_parser = crate::trust::parse_target_id)]
    pub target_id: Option<[u8; rblk_proto::TARGET_ID_LEN]>,
    /// Where target identities are pinned, as ssh's known_hosts
    ///
    /// One `ADDRESS:PORT ID` a line; `none` pins nothing [default: /var/lib/rblk/known_targets; the
    /// environment variable RBLK_KNOWN_TARGETS sets it too].
    #[arg(long, env = "RBLK_KNOWN_TARGETS", hide_env = true, value_name = "PATH")]
    pub known_targets: Option<PathBuf>,
    /// With a key, also accept a target that cannot prove it holds it
    ///
    /// An rblk-target from before mutual authentication, with a warning: whoever answers at its
    /// address could relay this host's proof to another target.
    #[arg(long, hide_short_help = true)]
    pub allow_v1_target: bool,
}

#[cfg(feature = "clap")]
impl TrustArgs {
    /// Sets `options`' expected target identity, pin file and v1 leniency from the flags.
    pub fn apply(&self, options: &mut Options) {
        options.target_id = self.target_id;
        options.known_targets = crate::trust::known_targets_path(self.known_targets.as_deref());
        options.allow_v1_target = self.allow_v1_target;
    }
}

/// The reconnect flags of rblk's programs (`--reconnect-delay`, `--ctrl-loss-tmo`,
/// `--fast-io-fail-tmo`, nvme-cli's names; a bare number is seconds, as nvme-cli takes them, and
/// units work too: `500ms`, `10m`; the underscore spellings work too), for
/// `#[command(flatten)]`. Feature `clap`.
#[cfg(feature = "clap")]
#[derive(Debug, Clone, clap::Args)]
pub struct ReconnectArgs {
    /// Pause between reconnect attempts
    ///
    /// After losing the target: the first try is at once; `2`, `500ms`: a bare number is seconds;
    /// at most 1 day. On average: each pause is drawn between 0.5x and 1.5x of it when above 1 s,
    /// so sessions that lost one target do not all retry at once. I/O waits meanwhile and what was
    /// in flight is sent again.
    #[arg(long, alias = "reconnect_delay", value_name = "DURATION", default_value = "2s", value_parser = reconnect_time_arg)]
    pub reconnect_delay: Duration,
    /// Give up reconnecting after this long (-1: never)
    ///
    /// `600`, `10m`: a bare number is seconds; at most 1 day. Then every waiting and new I/O fails.
    /// 0 fails at once (no reconnect); -1 retries forever.
    #[arg(
        long,
        alias = "ctrl_loss_tmo",
        value_name = "DURATION",
        default_value = "10m",
        allow_negative_numbers = true,
        value_parser = parse_timeout
    )]
    pub ctrl_loss_tmo: Timeout,
    /// Fail I/O with EIO after this long offline [default: off]
    ///
    /// A bare number is seconds. Reconnecting goes on until --ctrl-loss-tmo (for md RAID, which
    /// then fails the leg and can re-add it later). Off: I/O waits.
    #[arg(long, alias = "fast_io_fail_tmo", value_name = "DURATION", allow_negative_numbers = true, value_parser = parse_timeout)]
    pub fast_io_fail_tmo: Option<Timeout>,
    /// Keep trying the first connect this long
    ///
    /// While the target cannot be reached or does not listen yet (a storage host still booting; a
    /// bare number is seconds; at most 1 day), backing off up to 5 s between attempts, one log line
    /// each. A refusal (the key, the access list) ends it at once. 0: one attempt.
    #[arg(long, alias = "connect_timeout", value_name = "DURATION", default_value = "0", value_parser = reconnect_time_arg)]
    pub connect_timeout: Duration,
}

/// `--reconnect-delay` and `--connect-timeout`: a duration of at most [`MAX_RECONNECT_TIME`].
#[cfg(feature = "clap")]
fn reconnect_time_arg(text: &str) -> std::result::Result<Duration, String> {
    rblk_proto::parse_duration_bounded(text, Duration::ZERO, Some(MAX_RECONNECT_TIME))
}

/// A timeout flag's value: `None` is -1, forever.
#[cfg(feature = "clap")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeout(pub Option<Duration>);

#[cfg(feature = "clap")]
fn parse_timeout(text: &str) -> std::result::Result<Timeout, String> {
    Reconnect::parse_timeout(text).map(Timeout)
}

#[cfg(feature = "clap")]
impl ReconnectArgs {
    /// The policy the flags ask for.
    pub fn reconnect(&self) -> Reconnect {
        Reconnect {
            delay: self.reconnect_delay,
            ctrl_loss_tmo: self.ctrl_loss_tmo.0,
            fast_io_fail_tmo: self.fast_io_fail_tmo.and_then(|t| t.0),
            connect_timeout: self.connect_timeout,
        }
    }
}

/// Connection options. `Options::default()` reaches a target without a key over real verbs.
#[derive(Clone)]
pub struct Options {
    /// Which fabric: real verbs, or (feature `mem`) the in-memory fabric.
    pub fabric: Fabric,
    /// Only use this RDMA device (the address decides the device; this only checks it).
    pub device: Option<String>,
    /// Connect from this local address: it picks the RDMA device, port and GID (perftest's `-x`
    /// picks a GID by index; rdma_cm picks it by address). None lets routing choose.
    pub source_addr: Option<IpAddr>,
    /// Type of service of every connection (RDMA_OPTION_ID_TOS: on RoCEv2 the DSCP and ECN bits
    /// of the packets, as perftest's `-T`). None keeps the kernel's default.
    pub tos: Option<u8>,
    /// The pre-shared key, when the target requires one (see [`Options::key_from_file`]): the
    /// target's shared key, or this host's own. Proved to every address of the target, except
    /// this host's own ones when [`local_target_key`](Self::local_target_key) is set.
    pub key: Option<Vec<u8>>,
    /// The file [`key`](Self::key) was read from by [`Options::find_key_for`] (None when it was
    /// set directly): named when a keyed initiator refuses a target that asks for no key.
    pub key_file: Option<PathBuf>,
    /// Where the key was looked for without being found (see [`Options::find_key_for`]), each
    /// with why it was passed over: named when a target refuses for want of a key.
    pub key_files_tried: Vec<String>,
    /// The key a target on this host made ([`LOCAL_TARGET_KEY`], found by
    /// [`Options::find_key_for`] when no key was named for the target): proved only to this
    /// host's own addresses, ahead of [`key`](Self::key) (then at most `/etc/rblk/target.key`),
    /// so a target elsewhere never gets a proof made with it.
    pub local_target_key: Option<Vec<u8>>,
    /// The directory the key search's fixed paths are under ([`KeySearch`]): `/` by default.
    /// Tests point it at a tree of their own.
    pub key_root: PathBuf,
    /// With a key, also accept a target that cannot prove it holds the key (one that predates
    /// [`FEATURE_MUTUAL_AUTH`](rblk_proto::FEATURE_MUTUAL_AUTH)): v1 AUTH, with a warning.
    /// Its proof could be relayed to another target by whoever answers at the address.
    pub allow_v1_target: bool,
    /// The identity the target must prove (`--target-id`), instead of the one pinned for its
    /// address.
    pub target_id: Option<[u8; rblk_proto::TARGET_ID_LEN]>,
    /// Where target identities are pinned by address on first use ([`crate::KNOWN_TARGETS`]);
    /// None pins nothing (a library user without a state directory).
    pub known_targets: Option<PathBuf>,
    /// The host identity sent to targets with host identities (their access lists and
    /// per-host caps go by it): a hostname or an NVMe-style NQN, 1 to
    /// [`MAX_HOST_ID`](rblk_proto::MAX_HOST_ID) printable ASCII characters. None: the machine's
    /// hostname (and no identity if it has none).
    pub host_id: Option<String>,
    /// Deadline for each control exchange.
    pub timeout: Duration,
    /// Deadline for each synchronous data operation.
    pub io_timeout: Duration,
    /// How long waits spin on the completion queue before sleeping, when [`wait`](Self::wait)
    /// does not spin adaptively (deep queues under [`Wait::Adaptive`]), and at least that long
    /// when it does.
    pub spin: Duration,
    /// Spin or sleep while waiting ([`Wait`]; [`Wait::Adaptive`] by default): the one policy of
    /// the library's queues and of the front ends' event loops.
    pub wait: Wait,
    /// What to do when the session loses its target.
    pub reconnect: Reconnect,
    /// Ask for per-QP memory windows ([`rblk_proto::FEATURE_WINDOWS`]): each queue pair gets an
    /// rkey of its own from a target whose device has type 2B windows. A target that predates
    /// them refuses the connect request, and the session connects again without (one extra
    /// round trip). False: one registration and one rkey per session, as before.
    pub memory_windows: bool,
    /// Share the session's keepalives ([`rblk_proto::FEATURE_SESSION_KEEPALIVE`], true by
    /// default): a queue pair joined through the session's first address sends no KEEPALIVE and
    /// takes the target's silence there as the session's, so an idle session of N queue pairs
    /// keeps alive one instead of N. False: every queue pair keeps its own, as before (the
    /// target follows each that sends them); what the scale script measures the saving against.
    pub session_keepalives: bool,
    /// Mark requests as solicited events ([`rblk_proto::FEATURE_SOLICITED`], true by default):
    /// every SEND but KEEPALIVE carries the solicited-event flag, so the target wakes for
    /// requests and takes keepalives at its next wake-up instead of waking for each. False:
    /// the feature is not offered, as before; what the scale script measures the saving
    /// against.
    pub solicited_events: bool,
    /// Let the target zero and discard ranges ([`rblk_proto::FEATURE_DISCARD`], true by
    /// default): DISCARD works and whole-block WRITE_ZEROES moves nothing over the link. False:
    /// the feature is not offered, as against an older target: zeroes are RDMA writes and the
    /// front ends advertise no discard.
    pub discard: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            fabric: Fabric::default(),
            device: None,
            source_addr: None,
            tos: None,
            key: None,
            key_file: None,
            key_files_tried: Vec::new(),
            local_target_key: None,
            key_root: PathBuf::from("/"),
            allow_v1_target: false,
            target_id: None,
            known_targets: None,
            host_id: None,
            timeout: DEFAULT_TIMEOUT,
            io_timeout: DEFAULT_IO_TIMEOUT,
            spin: rblk_fabric::policy::SPIN,
            wait: Wait::Adaptive,
            reconnect: Reconnect::default(),
            memory_windows: true,
            session_keepalives: true,
            solicited_events: true,
            discard: true,
        }
    }
}

impl Options {
    /// How the fabric is to reach targets: device, source address and type of service.
    pub fn route(&self) -> Route {
        Route { device: self.device.clone(), source: self.source_addr, tos: self.tos }
    }
}

// Never print the key.
impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field("fabric", &self.fabric)
            .field("device", &self.device)
            .field("source_addr", &self.source_addr)
            .field("tos", &self.tos)
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .field("key_file", &self.key_file)
            .field("key_files_tried", &self.key_files_tried)
            .field("local_target_key", &self.local_target_key.as_ref().map(|_| "<redacted>"))
            .field("key_root", &self.key_root)
            .field("allow_v1_target", &self.allow_v1_target)
            .field("target_id", &self.target_id.as_ref().map(|id| rblk_proto::to_hex(id)))
            .field("known_targets", &self.known_targets)
            .field("host_id", &self.host_id)
            .field("timeout", &self.timeout)
            .field("io_timeout", &self.io_timeout)
            .field("spin", &self.spin)
            .field("wait", &self.wait)
            .field("reconnect", &self.reconnect)
            .field("memory_windows", &self.memory_windows)
            .field("session_keepalives", &self.session_keepalives)
            .field("solicited_events", &self.solicited_events)
            .field("discard", &self.discard)
            .finish()
    }
}

/// Checks a host identity (see [`Options::host_id`]); `--host-id`'s parser.
pub fn check_host_id(id: &str) -> std::result::Result<(), String> {
    if rblk_proto::is_valid_host_id(id) {
        Ok(())
    } else {
        Err(format!("host id {id:?}: 1-{} printable ASCII characters without spaces", rblk_proto::MAX_HOST_ID))
    }
}

impl Options {
    /// The host identity to send: [`Options::host_id`], or the machine's hostname.
    pub fn host_id(&self) -> std::result::Result<Option<String>, String> {
        match &self.host_id {
            Some(id) => check_host_id(id).map(|()| Some(id.clone())),
            None => Ok(std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
                .filter(|h| rblk_proto::is_valid_host_id(h))),
        }
    }

    /// Reads a key file with the project's one reader ([`rblk_fabric::keyfile::read`], the
    /// target's too): the bytes without trailing whitespace (the newline an editor adds), at
    /// least [`MIN_KEY_LEN`](rblk_fabric::keyfile::MIN_KEY_LEN) of them, in a file that group
    /// and others cannot read.
    pub fn key_from_file(path: impl AsRef<Path>) -> Result<Vec<u8>> {
        let path = path.as_ref();
        rblk_fabric::keyfile::read(path).map_err(|source| Error::KeyFile { path: path.to_owned(), source })
    }

    /// [`Options::find_key_for`] without a target: no `/etc/rblk/keys/HOST.key` is looked for.
    pub fn find_key(&mut self, flag: Option<&Path>) -> Result<()> {
        self.find_key_for(flag, None)
    }

    /// Finds the key for `target` (see [`KeySearch`] for the order) and sets
    /// [`key`](Self::key), [`key_file`](Self::key_file),
    /// [`key_files_tried`](Self::key_files_tried) and
    /// [`local_target_key`](Self::local_target_key). A file that does not exist is skipped and
    /// named in `key_files_tried`; one that exists must be a good key file (its error names
    /// it), except the local target's, which is also skipped when this user may not open it.
    pub fn find_key_for(&mut self, flag: Option<&Path>, target: Option<&crate::Uri>) -> Result<()> {
        let env = std::env::var_os(KEY_FILE_ENV).filter(|v| !v.is_empty());
        (self.key, self.key_file, self.key_files_tried, self.local_target_key) = (None, None, Vec::new(), None);
        if let Some(path) = flag {
            return self.use_key_file(path);
        }
        self.key_files_tried.push("no --key-file".into());
        if let Some(path) = env.as_deref().map(Path::new) {
            return self.use_key_file(path);
        }
        self.key_files_tried.push(format!("no {KEY_FILE_ENV}"));
        let search = KeySearch::under(&self.key_root);
        for host in target.into_iter().flat_map(|t| t.hosts().map(|(h, _)| h)) {
            let path = search.host_key(host);
            if self.found(&path) {
                return self.use_key_file(&path);
            }
        }
        let local = &search.local_target;
        match std::fs::File::open(local) {
            Ok(_) => self.local_target_key = Some(Options::key_from_file(local)?),
            Err(e) => self.key_files_tried.push(format!("{} ({e})", local.display())),
        }
        if self.local_target_key.is_some() && same_file(&search.etc_target, local) {
            self.key_files_tried.push(format!("{} (the local target's key again)", search.etc_target.display()));
        } else if self.found(&search.etc_target) {
            return self.use_key_file(&search.etc_target);
        }
        Ok(())
    }

    /// Connects without any key (`--no-key`): a target that asks for none is then trusted as
    /// any keyless initiator trusts it, and one that requires a key refuses, saying so.
    pub fn no_key(&mut self) {
        (self.key, self.key_file, self.local_target_key) = (None, None, None);
        self.key_files_tried = vec!["--no-key given".into()];
    }

    /// Whether `path` exists (a dangling link does not); if not, it is noted as tried.
    fn found(&mut self, path: &Path) -> bool {
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.key_files_tried.push(format!("{} (not found)", path.display()));
                false
            }
            _ => true,
        }
    }

    fn use_key_file(&mut self, path: &Path) -> Result<()> {
        self.key = Some(Options::key_from_file(path)?);
        self.key_file = Some(path.to_owned());
        Ok(())
    }

    /// The key to prove to a target at `ip`, and whether it is the local target's:
    /// [`local_target_key`](Self::local_target_key) for this host's own addresses, else
    /// [`key`](Self::key).
    pub fn key_for(&self, ip: IpAddr) -> Option<(&[u8], bool)> {
        match &self.local_target_key {
            Some(local) if crate::trust::is_local_addr(ip) => Some((local, true)),
            _ => self.key.as_deref().map(|k| (k, false)),
        }
    }

    /// Writes a new key to `path` as `rblk-target gen-key` does ([`rblk_fabric::keyfile::generate`]):
    /// 64 hex digits, mode 0600, never over an existing file.
    pub fn generate_key_file(path: &Path) -> std::io::Result<()> {
        rblk_fabric::keyfile::generate(path)
    }

    /// Why a session cannot answer a target that requires a key: none was found, and where
    /// it was looked for.
    pub fn missing_key_reason(&self) -> String {
        let mut tried = self.key_files_tried.clone();
        if self.local_target_key.is_some() {
            tried.push(format!("{LOCAL_TARGET_KEY} (this host's target's key: not used for other hosts)"));
        }
        let tried = if tried.is_empty() { "nothing".to_owned() } else { tried.join(", ") };
        format!(
            "target requires a key (--key-file FILE, {KEY_FILE_ENV}, {HOST_KEYS_DIR}/HOST.key or {ETC_TARGET_KEY} \
             with the target's key; tried: {tried})"
        )
    }
}

/// Whether `a` and `b` are one file (the same device and inode: a link counts).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// Where [`Options::find_key_for`] looks for the key when none is named, in this order after
/// `--key-file` and [`KEY_FILE_ENV`]:
///
/// 1. `/etc/rblk/keys/HOST.key` for each host of the URI in turn, HOST as the URI names it,
///    without brackets or port (`rblk://[FE80::1]:7000/v`: `fe80::1.key`; a host name in lower
///    case, an IPv6 address in its short form): one key per host, whatever the port.
/// 2. [`LOCAL_TARGET_KEY`], the key a target on this host made, for this host's own addresses
///    only (skipped when this user may not open it).
/// 3. `/etc/rblk/target.key`, where the README copies a target's key to, for every address,
///    unless it is the same file as 2.
///
/// Each under [`Options::key_root`] (`/`). A file that does not exist is skipped; one that
/// exists and is not a good key file is an error that names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySearch {
    /// `/etc/rblk/keys`.
    pub host_keys: PathBuf,
    /// [`LOCAL_TARGET_KEY`].
    pub local_target: PathBuf,
    /// `/etc/rblk/target.key`.
    pub etc_target: PathBuf,
}

impl KeySearch {
    /// The paths under `root`.
    pub fn under(root: &Path) -> KeySearch {
        let at = |p: &str| root.join(p.trim_start_matches('/'));
        KeySearch { host_keys: at(HOST_KEYS_DIR), local_target: at(LOCAL_TARGET_KEY), etc_target: at(ETC_TARGET_KEY) }
    }

    /// `HOST_KEYS_DIR/HOST.key` for a host as a URI names it.
    pub fn host_key(&self, host: &str) -> PathBuf {
        let name = match host.parse::<IpAddr>() {
            Ok(ip) => ip.to_string(),
            Err(_) => host.to_ascii_lowercase(),
        };
        self.host_keys.join(format!("{name}.key"))
    }
}

/// The directory of per-target keys: `HOST.key` in it is the key for the target at HOST.
pub const HOST_KEYS_DIR: &str = "/etc/rblk/keys";

/// The key file for every target without one of its own: where the README copies a target's key.
pub const ETC_TARGET_KEY: &str = "/etc/rblk/target.key";

/// The environment variable that names a key file when `--key-file` is not given.
pub const KEY_FILE_ENV: &str = "RBLK_KEY_FILE";

/// For tests only: the directory the binaries (rblk, rblk-bench) put the key search's fixed
/// paths under instead of `/` ([`Options::key_root`]), so a test can lay out its own /etc/rblk
/// and /var/lib/rblk. The library itself never reads it.
pub const KEY_ROOT_ENV: &str = "RBLK_TEST_KEY_ROOT";

/// The key a target on this host makes at its first start when none is configured
/// (`rblk-target`'s default state dir): initiators on the same host use it when they can read it.
pub const LOCAL_TARGET_KEY: &str = "/var/lib/rblk/target.key";

#[cfg(test)]
mod tests {
    use super::*;

    /// The first connect's backoff: 250 ms doubling to the 5 s cap, each pause between half of
    /// its step and all of it. Catches a backoff without a cap (a target ready after 60 s found
    /// a minute later), one without jitter, and one that overflows on a long wait.
    #[test]
    fn first_connect_pauses_double_to_five_seconds_with_jitter() {
        let ms = |a, d| first_connect_pause(a, d).as_millis();
        assert_eq!((ms(1, 0), ms(1, u64::MAX)), (125, 249));
        assert_eq!((ms(2, 0), ms(3, 0), ms(5, 0)), (250, 500, 2000));
        assert_eq!((ms(6, 0), ms(6, u64::MAX)), (2500, 4999), "capped at 5 s");
        assert_eq!(ms(u32::MAX, 1 << 63), 3750);
        assert_ne!(ms(4, 1 << 60), ms(4, 1 << 62), "jittered");
    }

    /// Would catch a reconnect delay without jitter (every session that lost one target
    /// retrying in the same millisecond), jitter outside [0.5x, 1.5x), short delays (a second
    /// or less, asked for a quick return) not kept exact, and one draw reused for every attempt.
    #[test]
    fn reconnect_pauses_are_jittered() {
        let r = Reconnect::default();
        assert_eq!(r.pause(0), Duration::from_secs(1), "the least draw: half the delay");
        assert_eq!(r.pause(u64::MAX / 2 + 1), Duration::from_secs(2), "the middle draw: the delay");
        assert!(r.pause(u64::MAX) < Duration::from_secs(3) && r.pause(u64::MAX) > Duration::from_millis(2999));
        let draws: Vec<Duration> = (0..1000).map(|_| r.next_pause()).collect();
        assert!(draws.iter().all(|d| (Duration::from_secs(1)..Duration::from_secs(3)).contains(d)), "{draws:?}");
        let distinct: std::collections::BTreeSet<_> = draws.iter().collect();
        assert!(distinct.len() > 990, "fresh draws differ: {} distinct of 1000", distinct.len());
        let (lo, hi) = (draws.iter().min().unwrap(), draws.iter().max().unwrap());
        assert!(*hi - *lo > Duration::from_millis(1500), "spread over the range: {lo:?}..{hi:?}");
        let just_above = Reconnect { delay: EXACT_RECONNECT_DELAY + Duration::from_millis(2), ..r };
        assert_eq!(just_above.pause(0), Duration::from_millis(501), "never below half a second");
        for delay in [EXACT_RECONNECT_DELAY, Duration::from_millis(100), Duration::ZERO] {
            let exact = Reconnect { delay, ..r };
            assert_eq!((exact.pause(0), exact.pause(u64::MAX)), (delay, delay), "{delay:?} kept exact");
        }
        let day = Reconnect { delay: MAX_RECONNECT_TIME, ..r };
        assert!(day.pause(u64::MAX) < MAX_RECONNECT_TIME * 3 / 2, "no overflow at the longest delay");
    }

    /// Would catch: the initiator accepting a key file that group or others can read (only
    /// warning, as it did), a short key, or a reader other than the target's (the newline kept).
    #[test]
    fn key_files() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("rblk-initiator-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("key");
        let write = |bytes: &[u8], mode: u32| {
            std::fs::write(&path, bytes).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        let key = [b'k'; 32];
        write(&[&key[..], b"\n"].concat(), 0o600);
        assert_eq!(Options::key_from_file(&path).unwrap(), key);
        write(&[&key[..], b"\n"].concat(), 0o644);
        let text = rblk_fabric::Chain(&Options::key_from_file(&path).unwrap_err()).to_string();
        assert!(text.contains("group or others") && text.contains("chmod 600"), "{text}");
        write(b"s3cret\n", 0o600);
        let text = rblk_fabric::Chain(&Options::key_from_file(&path).unwrap_err()).to_string();
        assert!(text.contains("fewer than 32") && text.contains("gen-key"), "{text}");
        write(b"\n", 0o600);
        let text = rblk_fabric::Chain(&Options::key_from_file(&path).unwrap_err()).to_string();
        assert!(text.contains("empty") && text.matches("key file").count() == 1, "{text}");
        let e = Options::key_from_file(dir.join("missing")).unwrap_err();
        assert!(matches!(e, Error::KeyFile { .. }) && e.to_string().contains("missing"), "{e}");
        // A named file is used (and must be good); without one the refusal names what was tried.
        write(&key, 0o600);
        let mut found = Options::default();
        found.find_key(Some(&path)).unwrap();
        assert_eq!(found.key.as_deref(), Some(&key[..]));
        assert!(found.local_target_key.is_none(), "a named key is used for every address");
        assert_eq!(found.key_for("203.0.113.7".parse().unwrap()), Some((&key[..], false)));
        // The local target's key: only for this host's addresses (would catch it being proved to
        // any target the URI names, the relay's start).
        let local = Options { local_target_key: Some(key.to_vec()), ..Options::default() };
        assert_eq!(local.key_for("127.0.0.1".parse().unwrap()), Some((&key[..], true)));
        assert_eq!(local.key_for("203.0.113.7".parse().unwrap()), None);
        assert!(local.missing_key_reason().contains("not used for other hosts"));
        let opts = Options { key_files_tried: vec!["/x/target.key (denied)".into()], ..Options::default() };
        let reason = opts.missing_key_reason();
        assert!(reason.contains("--key-file") && reason.contains("/x/target.key (denied)"), "{reason}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Issue 43, trap 10: the key search's order and names. Would catch a HOST.key named other
    /// than the URI writes the host (brackets, a port, an IPv6 address's long form or a name's
    /// capitals making two files for one host), a later file winning over an earlier one, a file
    /// that exists but is bad skipped instead of named, the local target's key offered to other
    /// hosts or reached again through /etc/rblk/target.key, and `--no-key` keeping a key.
    #[test]
    fn key_search_order() {
        use std::os::unix::fs::PermissionsExt as _;
        let root = std::env::temp_dir().join(format!("rblk-initiator-search-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for d in ["etc/rblk/keys", "var/lib/rblk"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        for d in ["", "etc", "etc/rblk", "etc/rblk/keys", "var", "var/lib", "var/lib/rblk"] {
            std::fs::set_permissions(root.join(d), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let write = |path: &str, key: &[u8], mode: u32| {
            let path = root.join(path);
            let _ = std::fs::remove_file(&path);
            std::fs::write(&path, key).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        let (host, etc, local) = ([b'h'; 32], [b'e'; 32], [b'l'; 32]);
        write("etc/rblk/keys/fe80::1.key", &host, 0o600);
        write("etc/rblk/keys/storage1.key", &host, 0o600);
        write("etc/rblk/target.key", &etc, 0o600);
        write("var/lib/rblk/target.key", &local, 0o600);
        let search = |uri: &str| {
            let mut o = Options { key_root: root.clone(), ..Options::default() };
            o.find_key_for(None, Some(&crate::Uri::parse(uri).unwrap())).map(|()| o)
        };
        assert!(std::env::var_os(KEY_FILE_ENV).is_none(), "run without {KEY_FILE_ENV}");
        for uri in ["rblk://[FE80:0::1]:7000/v", "rblk://Storage1/v", "rblk://10.9.9.9,storage1:1/v"] {
            let o = search(uri).unwrap();
            assert_eq!(o.key.as_deref(), Some(&host[..]), "{uri}");
            assert!(o.local_target_key.is_none(), "{uri}: the host's key is for every address");
            assert_eq!(o.key_for("127.0.0.1".parse().unwrap()), Some((&host[..], false)));
        }
        // No host key: the local target's key for this host, /etc/rblk/target.key for others.
        let o = search("rblk://203.0.113.7/v").unwrap();
        assert_eq!(o.key_for("127.0.0.1".parse().unwrap()), Some((&local[..], true)));
        assert_eq!(o.key_for("203.0.113.7".parse().unwrap()), Some((&etc[..], false)));
        assert!(o.key_files_tried.iter().any(|t| t.ends_with("etc/rblk/keys/203.0.113.7.key (not found)")));
        // The flag first, whatever else exists.
        let mut o = Options { key_root: root.clone(), ..Options::default() };
        o.find_key_for(Some(&root.join("etc/rblk/target.key")), Some(&crate::Uri::parse("rblk://storage1/v").unwrap()))
            .unwrap();
        assert_eq!(o.key.as_deref(), Some(&etc[..]));
        // /etc/rblk/target.key linked to the local target's key: not used for other hosts.
        std::fs::remove_file(root.join("etc/rblk/target.key")).unwrap();
        std::fs::hard_link(root.join("var/lib/rblk/target.key"), root.join("etc/rblk/target.key")).unwrap();
        let o = search("rblk://203.0.113.7/v").unwrap();
        assert_eq!(o.key_for("203.0.113.7".parse().unwrap()), None);
        assert!(o.missing_key_reason().contains("the local target's key again"), "{}", o.missing_key_reason());
        // A file found but bad is an error naming it, not a reason to look further.
        write("etc/rblk/keys/storage1.key", &host, 0o644);
        let e = rblk_fabric::Chain(&search("rblk://storage1/v").unwrap_err()).to_string();
        assert!(e.contains("storage1.key") && e.contains("0644"), "{e}");
        let mut o = search("rblk://[fe80::1]/v").unwrap();
        o.no_key();
        assert!(o.key.is_none() && o.local_target_key.is_none() && o.key_for("127.0.0.1".parse().unwrap()).is_none());
        assert!(o.missing_key_reason().contains("--no-key"), "{}", o.missing_key_reason());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn reconnect_timeouts() {
        assert_eq!(Reconnect::parse_timeout("-1"), Ok(None));
        assert_eq!(Reconnect::parse_timeout("0"), Ok(Some(Duration::ZERO)));
        assert_eq!(Reconnect::parse_timeout("600"), Ok(Some(Duration::from_secs(600))));
        assert_eq!(Reconnect::parse_timeout("10m"), Ok(Some(Duration::from_secs(600))));
        assert_eq!(Reconnect::parse_timeout("1.5"), Ok(Some(Duration::from_millis(1500))));
        for bad in ["", "-2", "x", "2d"] {
            let e = Reconnect::parse_timeout(bad).unwrap_err();
            assert!(e.ends_with("or -1 for forever"), "{bad}: {e}");
        }
        assert_eq!(
            Reconnect::parse_timeout("25h").unwrap_err(),
            "25 h is too long: it must be at most 1 day, or -1 for forever"
        );
    }

    #[test]
    fn debug_hides_the_key() {
        let opts = Options { key: Some(b"s3cret".to_vec()), ..Options::default() };
        let text = format!("{opts:?}");
        assert!(!text.contains("s3cret") && text.contains("redacted"), "{text}");
    }
}
