//! What every command of `rblk` shares: how to reach a target ([`Connection`]) and open a
//! volume ([`open`]), the open mode of `--read-only`/`--exclusive`, output formats
//! ([`Format`], `-o json`), the value parsers of URIs and host ids, and sizes as people read
//! them ([`human`]). `cli.rs` parses and dispatches; the front ends (`ublk`, `nbd`, `mount`)
//! take these from here.

use std::path::PathBuf;
use std::time::Duration;

use rblk_initiator::{OpenMode, Options, Reconnect, Session, Volume};

/// How to reach the target; shared by every subcommand that connects.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Connection options")]
pub struct Connection {
    /// Key file for a target that requires one [default: searched]
    ///
    /// The target's shared key (its --key-file, or the STATE_DIR/target.key it made), or this
    /// host's own key from the target's `[[host]]` entry. One line of at least 32 bytes, mode 0600,
    /// owned by root or you, in directories only you or root may write.
    ///
    /// Without it the key is searched for in this order, the first file that exists winning:
    /// RBLK_KEY_FILE; /etc/rblk/keys/HOST.key for each host of the URI in turn (HOST as the URI
    /// names it without brackets or port, a name in lower case, an IPv6 address in its short form:
    /// rblk://[fe80::1]:7000/v takes /etc/rblk/keys/fe80::1.key); /var/lib/rblk/target.key (a
    /// target on this host made it) for this host's own addresses only, when you may read it;
    /// /etc/rblk/target.key (a target's key copied here) for any address. A file that exists but is
    /// not a good key file is an error naming it. With a key, a target that requires none is
    /// refused (it cannot prove it holds the key): --no-key connects without.
    // RBLK_KEY_FILE is read by the search itself (not as this flag's `env`), so that --no-key
    // overrides it where it conflicts with the flag.
    #[arg(long, value_name = "PATH")]
    pub key_file: Option<PathBuf>,
    /// Connect without any key, even when one is found
    ///
    /// For a target that serves anyone, which an initiator with a key refuses. Overrides
    /// RBLK_KEY_FILE; not with --key-file.
    #[arg(long, conflicts_with = "key_file")]
    pub no_key: bool,
    /// This host's identity for access lists [default: hostname]
    ///
    /// For the target's access lists and per-host keys (like an NVMe host NQN): printable ASCII, no
    /// spaces. The environment variable RBLK_HOST_ID sets it too.
    #[arg(long, env = "RBLK_HOST_ID", hide_env = true, value_name = "NAME", value_parser = host_id_arg)]
    pub host_id: Option<String>,
    #[command(flatten)]
    pub route: rblk_initiator::RouteArgs,
    #[command(flatten)]
    pub trust: rblk_initiator::TrustArgs,
    /// Give up on each control exchange after this long
    ///
    /// Connect, open, flush; `10`, `1500ms`: a bare number is seconds; at most 1 day.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = timeout_arg)]
    pub timeout: Duration,
}

/// `--timeout`: a duration from 1 ms to a day.
pub fn timeout_arg(text: &str) -> Result<Duration, String> {
    rblk_initiator::parse_duration_bounded(text, Duration::from_millis(1), Some(rblk_initiator::MAX_TIMEOUT))
}

/// A volume URI, checked when the command line is parsed (a bad one is a usage error, exit 2),
/// before anything connects.
pub fn volume_uri_arg(text: &str) -> Result<String, String> {
    rblk_initiator::Uri::parse(text).map(|_| text.to_owned()).map_err(|e| e.to_string())
}

/// A target URI (no volume), checked as [`volume_uri_arg`] checks a volume's.
pub fn target_uri_arg(text: &str) -> Result<String, String> {
    rblk_initiator::Uri::parse_target(text).map(|_| text.to_owned()).map_err(|e| e.to_string())
}

/// `--json`, or `-o json` / `--output-format json` as nvme-cli spells it.
#[derive(Debug, Clone, clap::Args)]
pub struct Format {
    /// Deprecated spelling of `-o json`.
    #[arg(long, hide = true)]
    pub json: bool,
    /// Output format: normal (text) or json, as nvme-cli spells it
    #[arg(short = 'o', long, value_name = "FORMAT", value_parser = output_format_arg)]
    pub output_format: Option<String>,
}

/// `-o`/`--output-format`: a format, never a file (files are `--output FILE`).
pub fn output_format_arg(text: &str) -> Result<String, String> {
    match text {
        "normal" | "json" => Ok(text.to_owned()),
        _ => Err(format!("{text:?} is not an output format (normal or json); to write to a file use --output FILE")),
    }
}

/// Says once on stderr that `old` is a deprecated spelling of `new` (it keeps working).
pub fn deprecated(old: &str, new: &str) {
    eprintln!("rblk: note: {old} is deprecated; use {new}");
}

impl Format {
    /// Whether JSON was asked for.
    pub fn json(&self) -> bool {
        self.json || self.output_format.as_deref() == Some("json")
    }
}

pub fn print_json(value: &serde_json::Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

pub fn host_id_arg(text: &str) -> Result<String, String> {
    rblk_initiator::check_host_id(text).map(|()| text.to_owned())
}

/// The open mode for a front end's `--read-only` and `--exclusive` (clap makes them exclusive).
pub fn open_mode(read_only: bool, exclusive: bool) -> OpenMode {
    match (read_only, exclusive) {
        (true, _) => OpenMode::ReadOnly,
        (false, true) => OpenMode::Exclusive,
        (false, false) => OpenMode::ReadWrite,
    }
}

impl Connection {
    /// The library's options for these flags to reach `uri` (a volume's or a target's: its
    /// hosts name the key files searched), with `reconnect` as the reconnect policy.
    pub fn options(&self, uri: &str, reconnect: Reconnect) -> anyhow::Result<Options> {
        let mut options =
            Options { host_id: self.host_id.clone(), timeout: self.timeout, reconnect, ..Options::default() };
        if let Some(root) = std::env::var_os(rblk_initiator::KEY_ROOT_ENV).filter(|r| !r.is_empty()) {
            options.key_root = root.into();
        }
        if self.no_key {
            options.no_key();
        } else {
            let target = rblk_initiator::Uri::parse_target(uri)?;
            options.find_key_for(self.key_file.as_deref(), Some(&target))?;
        }
        self.route.apply(&mut options);
        self.trust.apply(&mut options);
        Ok(options)
    }
}

/// Connects and opens a volume as the command line asks.
pub fn open(uri: &str, conn: &Connection, mode: OpenMode, reconnect: Reconnect) -> anyhow::Result<Volume> {
    let session = Session::connect(uri, &conn.options(uri, reconnect)?)?;
    Ok(session.open(mode)?)
}

/// An I/O error in words: the errno's description without the standard library's
/// `(os error N)`.
pub fn io_text(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => nix::errno::Errno::from_raw(n).desc().to_lowercase(),
        None => e.to_string(),
    }
}

/// `bytes` in the largest binary unit that divides it (`1 GiB`, `1536 KiB`): the project's one
/// byte formatter, [`rblk_initiator::Bytes`].
pub fn human(bytes: u64) -> String {
    rblk_initiator::Bytes(bytes).to_string()
}
