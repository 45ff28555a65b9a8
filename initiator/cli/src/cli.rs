//! `rblk`'s command line: its arguments and the subcommands that need no front end.

use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use rblk_initiator::{Direction, OpenMode, Options, Reconnect, Session, Volume};

use crate::common::{deprecated, human, open, print_json, target_uri_arg, volume_uri_arg, Connection, Format};
use crate::stdio::{Patient, Source};
use crate::{mount, nbd, ublk};

/// Client for rblk volumes served over RDMA by rblk-target.
///
/// A volume is named by a URI, rblk://HOST:PORT/VOLUME (IPv6 addresses in brackets; port 7420
/// by default). Sizes and offsets take 4096, 4k, 1.5M, 1G (k, M, G, T and KiB, MiB, GiB, TiB
/// are powers of 1024; KB, MB, GB, TB powers of 1000, refused unless whole 4096-byte blocks).
/// Durations take 500ms, 15s, 2m, 1h30m; a bare number is seconds.
#[derive(Debug, Parser)]
#[command(version)]
pub struct Args {
    #[command(subcommand)]
    /// The subcommand.
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List RDMA devices, their ports and the IP addresses that reach them
    ///
    /// With no device the listing is empty (JSON: `[]`; text: nothing on stdout, the reason on
    /// stderr) and the exit status 0 in both forms, as `nvme list`'s.
    Devices {
        #[command(flatten)]
        format: Format,
    },
    /// Show a volume's size, block size, largest I/O, durability and open mode
    ///
    /// Opens it read-only.
    Info {
        /// The volume: rblk://HOST/VOLUME or rblk://HOST:PORT/VOLUME.
        #[arg(value_parser = volume_uri_arg)]
        uri: String,
        #[command(flatten)]
        format: Format,
        #[command(flatten)]
        conn: Connection,
    },
    /// List the volumes a target lets this host open (as `nvme discover`)
    ///
    /// Name, size, volatile or durable, and the most this host may open it for. Opens and registers
    /// nothing. (`rblk list` lists this host's attachments.)
    #[command(alias = "ls")]
    Discover {
        /// The target: rblk://HOST or rblk://HOST:PORT (several addresses: the first that
        /// answers).
        #[arg(value_parser = target_uri_arg)]
        uri: String,
        #[command(flatten)]
        format: Format,
        #[command(flatten)]
        conn: Connection,
    },
    /// Show the target's counters: registrations, sessions, CPU time
    ///
    /// Registrations, pinned bytes, sessions, connections and its CPU time (which shows the data
    /// path does not use it). Opens the volume read-only, since the target answers STATS only on an
    /// open session.
    Stats {
        /// A volume of the target: rblk://HOST/VOLUME or rblk://HOST:PORT/VOLUME.
        #[arg(value_parser = volume_uri_arg)]
        uri: String,
        #[command(flatten)]
        format: Format,
        #[command(flatten)]
        conn: Connection,
    },
    /// Read LENGTH bytes at OFFSET of a volume to a file or stdout. Opens it read-only.
    Read {
        /// The volume: rblk://HOST/VOLUME or rblk://HOST:PORT/VOLUME.
        #[arg(value_parser = volume_uri_arg)]
        uri: String,
        /// Byte offset to read from, a multiple of the block size
        #[arg(long, value_parser = size_arg, default_value = "0", value_name = "N")]
        offset: u64,
        /// Bytes to read, a multiple of the block size (4096, 4k, 1M, ...)
        #[arg(long, value_parser = size_arg, value_name = "N")]
        length: u64,
        /// Write the data to this file (created or truncated); `-`: stdout
        ///
        /// Standard output must then not be a terminal unless asked for this way (binary data would
        /// garble it).
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Not a file: formats are `-o`, files `--output FILE` (this refuses with that message).
        #[arg(short = 'o', value_name = "FORMAT", hide = true, value_parser = read_has_no_format)]
        output_format: Option<String>,
        /// Show a progress bar on stderr when it is a terminal
        ///
        /// Bytes, rate, time left.
        #[arg(long)]
        progress: bool,
        #[command(flatten)]
        conn: Connection,
    },
    /// Write a file or stdin to a volume at OFFSET, then flush
    ///
    /// So a completed write is durable on a durable volume. Opens it read-write.
    ///
    /// The input's length must be a multiple of the volume's block size, unless --pad is given.
    Write {
        /// The volume: rblk://HOST/VOLUME or rblk://HOST:PORT/VOLUME.
        #[arg(value_parser = volume_uri_arg)]
        uri: String,
        /// Byte offset to write at, a multiple of the block size
        ///
        /// Required, so that nothing is overwritten by accident.
        #[arg(long, value_parser = size_arg, value_name = "N")]
        offset: u64,
        /// Read the data from this file or block device (`-`: stdin)
        ///
        /// Instead of stdin; stdin is refused when it is a terminal, unless `-` is given. Any input
        /// streams in bounded memory; the length of a file or block device is checked before
        /// anything is written, a pipe's (past the end, or a partial last block without --pad) when
        /// the data gets there.
        #[arg(long, short, value_name = "FILE")]
        input: Option<PathBuf>,
        /// Zero-fill a partial last block
        ///
        /// When the input's length is not a multiple of the block size.
        #[arg(long)]
        pad: bool,
        /// Do not FLUSH before exiting
        ///
        /// The data is then in target memory only, and a durable volume may lose it if the target
        /// crashes before someone flushes.
        #[arg(long)]
        no_flush: bool,
        /// Show a progress bar on stderr when it is a terminal
        ///
        /// Bytes, rate, and time left when the input's length is known; bytes and rate for a pipe.
        #[arg(long)]
        progress: bool,
        #[command(flatten)]
        conn: Connection,
    },
    /// Discard LENGTH bytes at OFFSET of a volume, as blkdiscard does
    ///
    /// The target zeroes them, and a durable volume's backing store gives their blocks back.
    /// Durable when this returns. Opens the volume read-write; needs a target with discard.
    Discard {
        /// The volume: rblk://HOST/VOLUME or rblk://HOST:PORT/VOLUME.
        #[arg(value_parser = volume_uri_arg)]
        uri: String,
        /// Byte offset, a multiple of the block size
        ///
        /// Required, so that nothing is discarded by accident.
        #[arg(long, value_parser = size_arg, value_name = "N")]
        offset: u64,
        /// Bytes, a multiple of the block size
        ///
        /// Required, as --offset.
        #[arg(long, value_parser = size_arg, value_name = "N")]
        length: u64,
        /// Zero the range and keep its blocks allocated (WRITE_ZEROES)
        ///
        /// As `blkdiscard --zeroout`, instead of discarding it. Against a target without discard
        /// the zeros are written.
        #[arg(long, short = 'z')]
        zeroout: bool,
        #[command(flatten)]
        conn: Connection,
    },
    // Its help text is on the argument struct.
    Nbd(nbd::Args),
    // Their help texts are on the argument structs.
    Mount(mount::MountArgs),
    Umount(mount::UmountArgs),
    Attach(ublk::AttachArgs),
    Detach(ublk::DetachArgs),
    List(crate::list::ListArgs),
    /// Print a completion script for SHELL on stdout
    ///
    /// Generated from this binary's own arguments (e.g. `rblk completions bash >
    /// /etc/bash_completion.d/rblk`).
    Completions {
        /// The shell
        shell: clap_complete::Shell,
    },
    /// Write a new key to FILE (64 hex digits, mode 0600)
    ///
    /// 256 random bits and a newline, as `rblk-target gen-key` does. Refuses to overwrite an
    /// existing file.
    GenKey {
        /// Where to write it.
        file: PathBuf,
    },
}

fn read_has_no_format(text: &str) -> Result<String, String> {
    Err(format!("rblk read writes data, not a report: to write to a file use --output {text}"))
}

fn size_arg(text: &str) -> Result<u64, String> {
    rblk_initiator::parse_size(text).map_err(|e| e.to_string())
}

/// Bytes moved per synchronous call: the library splits them into max_io chunks in flight together.
const STEP: u64 = 4 << 20;

/// Runs `rblk` with the process's arguments; the binary's `main`.
pub fn main() -> ExitCode {
    let args = Args::parse();
    // Yesterday's spellings still work, and say what replaces them.
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.iter().find(|a| !a.starts_with('-')).is_some_and(|a| a == "ls") {
        deprecated("`rblk ls`", "`rblk discover`");
    }
    if argv.iter().any(|a| a == "--json") {
        deprecated("--json", "-o json");
    }
    // On a terminal, warnings are plain lines (level and message); in a log file or the
    // journal, tracing's full format (time and module).
    let terminal = io::IsTerminal::is_terminal(&io::stderr()) && std::env::var_os("JOURNAL_STREAM").is_none();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(io::stderr)
        .with_ansi(terminal);
    if terminal {
        logs.without_time().with_target(false).init();
    } else {
        logs.init();
    }
    match run(args.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rblk: {}", error_text(&e));
            if no_device(&e) {
                eprintln!("rblk: no RDMA device reaches that address here (`rblk devices` lists them)");
            }
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each once: rblk's errors do not repeat their sources' text, so the
/// chain reads `what failed: why: root cause`. An OS error is its errno's description, without
/// the standard library's `(os error N)`.
pub fn error_text(e: &anyhow::Error) -> String {
    let text =
        |c: &(dyn std::error::Error + 'static)| match c.downcast_ref::<io::Error>().and_then(io::Error::raw_os_error) {
            Some(n) => nix::errno::Errno::from_raw(n).desc().to_owned(),
            None => c.to_string(),
        };
    e.chain().map(text).collect::<Vec<_>>().join(": ")
}

/// True when rdma_cm found no RDMA device for the address (ENODEV somewhere in the chain).
fn no_device(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<io::Error>().and_then(io::Error::raw_os_error) == Some(libc::ENODEV))
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Devices { format } => devices(&format),
        Command::Info { uri, conn, format } => info(&uri, &conn, &format),
        Command::Stats { uri, conn, format } => stats(&uri, &conn, &format),
        Command::Discover { uri, conn, format } => discover(&uri, &conn, &format),
        Command::Read { uri, offset, length, output, progress, conn, .. } => {
            read(&uri, &conn, offset, length, output, progress)
        }
        Command::Write { uri, offset, input, pad, no_flush, progress, conn } => {
            write(&uri, &conn, offset, input, pad, !no_flush, progress)
        }
        Command::Discard { uri, offset, length, zeroout, conn } => discard(&uri, &conn, offset, length, zeroout),
        Command::Nbd(args) => nbd::run(args),
        Command::Mount(args) => mount::mount(args),
        Command::Umount(args) => mount::umount(args),
        Command::Attach(args) => ublk::attach(args),
        Command::Detach(args) => ublk::detach(args),
        Command::List(args) => crate::list::list(args),
        Command::Completions { shell } => {
            let mut cmd = <Args as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, "rblk", &mut script);
            match io::Write::write_all(&mut io::stdout(), &script) {
                // `rblk completions bash | head`: the reader has what it wanted.
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
                r => r.context("writing the completion script"),
            }
        }
        Command::GenKey { file } => {
            Options::generate_key_file(&file).with_context(|| {
                format!("writing a new key to {} (an existing file is never overwritten)", file.display())
            })?;
            eprintln!("rblk: wrote a new key to {} (mode 0600)", file.display());
            Ok(())
        }
    }
}

fn devices(format: &Format) -> anyhow::Result<()> {
    let devs = rblk_initiator::list_devices()?;
    if format.json() {
        let all: Vec<serde_json::Value> = devs
            .iter()
            .map(|d| {
                let ports: Vec<serde_json::Value> = d
                    .ports
                    .iter()
                    .map(|p| {
                        serde_json::json!({
                            "port": p.port, "active": p.active, "state": p.state, "addrs": p.addrs,
                            "link_layer": p.link_layer, "active_mtu": p.active_mtu,
                            "netdevs": p.netdevs, "gid_types": p.gid_types,
                        })
                    })
                    .collect();
                serde_json::json!({ "name": d.name, "ports": ports })
            })
            .collect();
        // An empty listing is valid JSON and no error: scripts test for `[]`.
        return print_json(&serde_json::Value::Array(all));
    }
    // No device is no error, as in JSON (`[]`) and as `nvme list` without NVMe devices: the
    // listing is empty, and stderr says why.
    if devs.is_empty() {
        eprintln!("rblk: no RDMA device found: {}", rblk_initiator::why_no_device());
        return Ok(());
    }
    println!(
        "{:<10} {:>4}  {:<7} {:<10} {:>5}  {:<14} {:<10} ADDRESSES",
        "DEVICE", "PORT", "STATE", "LINK", "MTU", "GID TYPES", "NETDEV"
    );
    for d in devs {
        for p in d.ports {
            let addrs: Vec<String> = p.addrs.iter().map(ToString::to_string).collect();
            let or_dash = |v: &[String]| if v.is_empty() { "-".to_owned() } else { v.join(",") };
            println!(
                "{:<10} {:>4}  {:<7} {:<10} {:>5}  {:<14} {:<10} {}",
                d.name,
                p.port,
                p.state,
                p.link_layer,
                p.active_mtu,
                or_dash(&p.gid_types),
                or_dash(&p.netdevs),
                or_dash(&addrs)
            );
        }
    }
    Ok(())
}

fn info(uri: &str, conn: &Connection, format: &Format) -> anyhow::Result<()> {
    let vol = open(uri, conn, OpenMode::ReadOnly, Reconnect::default())?;
    if format.json() {
        print_json(&info_json(&vol))?;
        vol.close()?;
        return Ok(());
    }
    println!("volume      {}", vol.uri());
    println!("size        {} ({})", vol.size(), human(vol.size()));
    println!("block size  {}", vol.block_size());
    println!("max I/O     {} ({})", vol.max_io(), human(vol.max_io().into()));
    println!("storage     {}", if vol.is_volatile() { "volatile (RAM only)" } else { "durable" });
    println!("mode        {}", mode_name(vol.mode(), vol.is_read_only()));
    println!("access      {}", access_name(vol.memory_windows()));
    vol.close()?;
    Ok(())
}

fn discover(uri: &str, conn: &Connection, format: &Format) -> anyhow::Result<()> {
    let target = rblk_initiator::Uri::parse_target(uri)?;
    let mut session = Session::connect(&target, &conn.options(uri, Reconnect::default())?)?;
    let volumes = session.list()?;
    drop(session);
    if format.json() {
        return print_json(&discover_json(&volumes));
    }
    if volumes.is_empty() {
        eprintln!("rblk: the target has no volume this host may open");
        return Ok(());
    }
    for line in discover_table(&volumes) {
        println!("{line}");
    }
    Ok(())
}

/// `rblk discover`'s table: a header, then a line per volume. Names come from the target and
/// may hold anything, terminal escapes included: they are shown escaped
/// ([`rblk_initiator::printable`]). The JSON output keeps them as they are (serde_json escapes
/// C0 controls; a name is what a script passes back in a URI).
pub fn discover_table(volumes: &[rblk_initiator::ListEntry]) -> Vec<String> {
    let mut lines = vec![format!("{:<24} {:>14}  {:<9} ACCESS", "VOLUME", "SIZE", "STORAGE")];
    for v in volumes {
        let storage = if v.is_failed() {
            "failed"
        } else if v.is_volatile() {
            "volatile"
        } else {
            "durable"
        };
        let name = rblk_initiator::printable(v.name());
        lines.push(format!("{name:<24} {:>14}  {storage:<9} {}", human(v.size()), mode_name(v.grant(), false)));
    }
    lines
}

/// `rblk discover -o json`: an array of name, size, volatile, failed, access.
fn discover_json(volumes: &[rblk_initiator::ListEntry]) -> serde_json::Value {
    volumes
        .iter()
        .map(|v| {
            serde_json::json!({
                "name": v.name(), "size": v.size(), "volatile": v.is_volatile(), "failed": v.is_failed(),
                "access": mode_name(v.grant(), false),
            })
        })
        .collect()
}

/// `rblk info --json`: uri, size, block_size, max_io, volatile, mode, memory_windows.
fn info_json(vol: &Volume) -> serde_json::Value {
    serde_json::json!({
        "uri": vol.uri().to_string(),
        "size": vol.size(),
        "block_size": vol.block_size(),
        "max_io": vol.max_io(),
        "volatile": vol.is_volatile(),
        "mode": mode_name(vol.mode(), vol.is_read_only()),
        "memory_windows": vol.memory_windows(),
    })
}

/// How the session reaches the volume, for `rblk info` and `rblk stats`.
fn access_name(windows: bool) -> &'static str {
    if windows {
        "memory windows (an rkey per queue pair, bound to it)"
    } else {
        "registration per session (one rkey for all its queue pairs)"
    }
}

/// `rblk stats --json`: target, then STATS_REPLY's fields by their names.
fn stats_json(target: &str, s: &rblk_initiator::StatsReply) -> serde_json::Value {
    serde_json::json!({
        "target": target,
        "registrations": s.registrations,
        "pinned_bytes": s.pinned_bytes,
        "sessions": s.sessions,
        "connections": s.connections,
        "cpu_user_us": s.cpu_user_us,
        "cpu_system_us": s.cpu_system_us,
        "windows": s.windows,
    })
}

fn stats(uri: &str, conn: &Connection, format: &Format) -> anyhow::Result<()> {
    let mut vol = open(uri, conn, OpenMode::ReadOnly, Reconnect::default())?;
    let s = vol.stats()?;
    let target = vol.uri().to_string();
    vol.close()?;
    if format.json() {
        return print_json(&stats_json(&target, &s));
    }
    println!("target         {target}");
    println!("registrations  {} (this query's own included)", s.registrations);
    println!("pinned         {} ({})", s.pinned_bytes, human(s.pinned_bytes));
    println!("sessions       {}", s.sessions);
    println!("connections    {}", s.connections);
    match s.windows {
        Some(n) => println!("windows        {n} bound; {}", access_name(true)),
        None => println!("windows        none for this session: {}", access_name(false)),
    }
    let secs = |us: u64| us as f64 / 1e6;
    println!("cpu            {:.3} s user, {:.3} s system", secs(s.cpu_user_us), secs(s.cpu_system_us));
    Ok(())
}

/// The mode as users name it; a volume the target serves read-only is read-only whatever was asked.
fn mode_name(mode: OpenMode, read_only: bool) -> &'static str {
    if read_only {
        OpenMode::ReadOnly.as_str()
    } else {
        mode.as_str()
    }
}

/// A progress bar on stderr for `--progress` (indicatif draws nothing when stderr is not a
/// terminal), or a hidden one: of `len` bytes when known, else a spinner with bytes and rate.
fn progress_bar(shown: bool, len: Option<u64>) -> indicatif::ProgressBar {
    use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
    if !shown {
        return ProgressBar::hidden();
    }
    let (bar, template) = match len {
        Some(len) => (
            ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr()),
            "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
        ),
        None => (
            ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
            "{spinner} {bytes} {binary_bytes_per_sec}",
        ),
    };
    bar.set_style(ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()));
    bar
}

fn read(
    uri: &str,
    conn: &Connection,
    offset: u64,
    length: u64,
    output: Option<PathBuf>,
    progress: bool,
) -> anyhow::Result<()> {
    // Local checks before any connection: where the data goes.
    let to_stdout = output.as_deref().is_none_or(|p| p == std::path::Path::new("-"));
    crate::stdio::refuse_terminal(crate::stdio::Std::Out, output.is_some())?;
    let mut out = match &output {
        Some(path) if !to_stdout => {
            File::create(path).and_then(Patient::new).with_context(|| format!("creating {}", path.display()))?
        }
        _ => Patient::stdout().context("standard output")?,
    };
    let mut vol = open(uri, conn, OpenMode::ReadOnly, Reconnect::default())?;
    vol.check_range(Direction::Read, offset, length)?;
    let step = step(&vol);
    let mut buf = vec![0u8; step.min(length) as usize];
    let bar = progress_bar(progress, Some(length));
    let mut done = 0;
    while done < length {
        let n = step.min(length - done) as usize;
        vol.read_at(&mut buf[..n], offset + done)?;
        out.write_all(&buf[..n], &mut vol)?;
        done += n as u64;
        bar.set_position(done);
    }
    bar.finish_and_clear();
    vol.close()?;
    Ok(())
}

fn write(
    uri: &str,
    conn: &Connection,
    offset: u64,
    input: Option<PathBuf>,
    pad: bool,
    flush: bool,
    progress: bool,
) -> anyhow::Result<()> {
    let (mut reader, len) = open_input(input.as_deref())?;
    if len == Some(0) {
        bail!("the input is empty: nothing to write");
    }
    let mut vol = open(uri, conn, OpenMode::ReadWrite, Reconnect::default())?;
    let bs = u64::from(vol.block_size());
    // With a known length (files, block devices) a bad one is refused before anything is
    // written; a stream's is found when it gets there.
    if let Some(len) = len {
        vol.check_range(Direction::Write, offset, padded_len(len, bs, pad)?)?;
    }
    let bar = progress_bar(progress, len);
    let (read, written) = write_stream(&mut vol, &mut reader, offset, pad, &bar)?;
    bar.finish_and_clear();
    if read == 0 {
        bail!("the input is empty: nothing to write");
    }
    if let Some(len) = len.filter(|&len| len != read) {
        bail!("the input ended after {read} bytes, {len} were expected");
    }
    let note = match flush.then(|| vol.flush()).transpose()? {
        None => "not flushed (--no-flush)",
        Some(true) => "flushed; the volume is volatile (RAM only)",
        Some(false) => "flushed to durable storage",
    };
    vol.close()?;
    let padded = if written > read { format!(" ({} bytes of zero padding)", written - read) } else { String::new() };
    eprintln!("rblk: wrote {written} bytes at offset {offset}{padded}; {note}");
    Ok(())
}

/// `rblk discard`: the range checked, then one DISCARD (or WRITE_ZEROES with `zeroout`), which the
/// engine splits into pieces the target takes.
fn discard(uri: &str, conn: &Connection, offset: u64, length: u64, zeroout: bool) -> anyhow::Result<()> {
    let mut vol = open(uri, conn, OpenMode::ReadWrite, Reconnect::default())?;
    vol.check_range(Direction::Write, offset, length)?;
    if zeroout {
        vol.write_zeroes(offset, length)?;
        if !vol.discards() {
            vol.flush()?;
        }
    } else {
        if !vol.discards() {
            bail!(
                "the target at {} does not support DISCARD (an older rblk-target); --zeroout writes zeros instead",
                vol.addr()
            );
        }
        vol.discard(offset, length)?;
    }
    vol.close()?;
    let what = if zeroout { "zeroed" } else { "discarded" };
    eprintln!("rblk: {what} {length} bytes at offset {offset}");
    Ok(())
}

/// The input and its length where it can be known without reading it: a file's size, a block
/// device's (by seeking to its end); None for stdin, pipes and character devices.
fn open_input(path: Option<&std::path::Path>) -> anyhow::Result<(Patient, Option<u64>)> {
    use std::io::{Seek, SeekFrom};
    // Before any connection: a terminal on stdin would have rblk wait silently for typing.
    crate::stdio::refuse_terminal(crate::stdio::Std::In, path.is_some())?;
    let path = path.filter(|p| *p != std::path::Path::new("-"));
    let Some(path) = path else { return Ok((Patient::stdin().context("standard input")?, None)) };
    let mut input = File::open(path).and_then(Patient::new).with_context(|| format!("opening {}", path.display()))?;
    if input.is_stream() {
        return Ok((input, None));
    }
    let file = input.file();
    let len = file.seek(SeekFrom::End(0)).with_context(|| format!("sizing {}", path.display()))?;
    file.seek(SeekFrom::Start(0)).with_context(|| format!("rewinding {}", path.display()))?;
    Ok((input, Some(len)))
}

/// Copies `reader` to the volume from `offset` on, one [`STEP`] at a time, so any input streams
/// in bounded memory. The last block is zero-filled if `pad`, refused otherwise (after what came
/// before it was written). `bar` follows the bytes read. Returns the bytes read and written.
fn write_stream(
    vol: &mut Volume,
    reader: &mut dyn Source,
    offset: u64,
    pad: bool,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<(u64, u64)> {
    let bs = u64::from(vol.block_size());
    let step = step(vol);
    let mut buf = vec![0u8; step as usize];
    let (mut read, mut written) = (0u64, 0u64);
    loop {
        let got = reader.read_full(&mut buf, vol)?;
        if got == 0 {
            break;
        }
        read += got as u64;
        let n = if (got as u64).is_multiple_of(bs) {
            got
        } else {
            let n = padded_len(read, bs, pad).with_context(|| format!("after {written} bytes were written"))?
                - (read - got as u64);
            buf[got..n as usize].fill(0);
            n as usize
        };
        vol.check_range(Direction::Write, offset + written, n as u64)
            .with_context(|| format!("the input goes past the end of the volume after {written} bytes"))?;
        vol.write_at(&buf[..n], offset + written)?;
        written += n as u64;
        bar.set_position(read);
        if got < buf.len() {
            break;
        }
    }
    Ok((read, written))
}

/// Bytes to write for an input of `len` bytes: refuses a partial last block unless `pad`.
fn padded_len(len: u64, block_size: u64, pad: bool) -> anyhow::Result<u64> {
    let tail = len % block_size;
    match (tail, pad) {
        (0, _) => Ok(len),
        (_, true) => len.checked_add(block_size - tail).context("the input is too large"),
        (_, false) => bail!(
            "the input is {len} bytes, not a multiple of the volume's block size ({block_size} bytes); \
             pass --pad to zero-fill the last block"
        ),
    }
}

fn step(vol: &Volume) -> u64 {
    let bs = u64::from(vol.block_size());
    (STEP / bs).max(1) * bs
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn cli_is_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn sizes_and_flags_parse() {
        let args = Args::try_parse_from(["rblk", "read", "rblk://h/v", "--offset", "4k", "--length", "1M"]).unwrap();
        match args.command {
            Command::Read { offset, length, output: None, .. } => assert_eq!((offset, length), (4096, 1 << 20)),
            other => panic!("{other:?}"),
        }
        let args = Args::try_parse_from(["rblk", "write", "rblk://h/v", "--offset", "1G", "--pad", "-i", "f"]).unwrap();
        match args.command {
            Command::Write { offset, pad: true, input: Some(_), .. } => assert_eq!(offset, 1 << 30),
            other => panic!("{other:?}"),
        }
        let e = Args::try_parse_from(["rblk", "read", "rblk://h/v", "--length", "4x"]).unwrap_err().to_string();
        assert!(e.contains("unknown suffix"), "{e}");
        assert!(Args::try_parse_from(["rblk", "read", "rblk://h/v"]).is_err(), "--length is required");
        assert!(Args::try_parse_from(["rblk", "write", "rblk://h/v"]).is_err(), "--offset is required");
        match Args::try_parse_from(["rblk", "discard", "rblk://h/v", "--offset", "1M", "--length", "2M", "-z"]) {
            Ok(Args { command: Command::Discard { offset, length, zeroout: true, .. }, .. }) => {
                assert_eq!((offset, length), (1 << 20, 2 << 20));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            Args::try_parse_from(["rblk", "discard", "rblk://h/v", "--offset", "0"]).is_err(),
            "--length is required"
        );
    }

    /// Issue 43, trap 8: `rblk read -h` had the ten connection options mixed into every
    /// subcommand's own. Would catch connection options outside their one heading, or the
    /// prose gone from `--help`. (The size of every `-h`, at most 100 columns and 40 lines, is
    /// rblk-dist's `every_short_help_fits_100_columns_and_40_lines`, for all three binaries.)
    #[test]
    fn connection_options_under_one_heading_and_prose_in_long_help() {
        let mut root = Args::command().term_width(100);
        root.build();
        let mut helps = vec![("rblk".to_owned(), root.render_help().to_string())];
        for sub in root.get_subcommands_mut() {
            helps.push((sub.get_name().to_owned(), sub.render_help().to_string()));
        }
        assert!(helps.len() > 15, "every subcommand: {}", helps.len());
        for (name, text) in &helps {
            if let Some(at) = text.find("\nConnection options:\n") {
                let (own, connection) = text.split_at(at);
                let connection = connection.split("\n\n").next().unwrap_or_default();
                for flag in ["--key-file", "--no-key", "--host-id", "--device", "--target-id", "--timeout"] {
                    assert!(!own.contains(flag), "rblk {name} -h: {flag} outside Connection options:\n{text}");
                    assert!(connection.contains(flag), "rblk {name} -h: {flag} not under Connection options:\n{text}");
                }
            }
        }
        let read = &helps.iter().find(|(n, _)| n == "read").expect("rblk read").1;
        assert!(read.contains("Connection options:") && read.contains("see more with '--help'"), "{read}");
        // The prose is still there, in --help.
        let mut read = root.find_subcommand_mut("read").unwrap().clone();
        let long = read.render_long_help().to_string();
        assert!(long.contains("/etc/rblk/keys/HOST.key") && long.contains("RDMA_OPTION_ID_TOS"), "{long}");
    }

    #[test]
    fn padding() {
        assert_eq!(padded_len(8192, 4096, false).unwrap(), 8192);
        assert_eq!(padded_len(5000, 4096, true).unwrap(), 8192);
        let e = padded_len(5000, 4096, false).unwrap_err().to_string();
        assert!(e.contains("not a multiple of the volume's block size (4096 bytes)") && e.contains("--pad"), "{e}");
    }

    #[test]
    fn error_text_says_each_cause_once() {
        let io = std::io::Error::other("disk on fire");
        let e = anyhow::Error::new(rblk_initiator::Error::KeyFile { path: "/k".into(), source: io });
        assert_eq!(error_text(&e), "key file /k: disk on fire");
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_text(&e), "outer: inner");
        // Issue 43, trap 7: no `(os error 13)` after the errno's words.
        let io = std::io::Error::from_raw_os_error(libc::EACCES);
        let e = anyhow::Error::new(rblk_initiator::Error::KeyFile { path: "/etc/rblk/target.key".into(), source: io });
        assert_eq!(error_text(&e), "key file /etc/rblk/target.key: Permission denied");
    }

    /// The no-device hint follows the errno, not the message's wording.
    #[test]
    fn no_device_hint_follows_enodev() {
        let cm = |errno| rblk_fabric::Error::Cm {
            op: "rdma_resolve_addr",
            addr: rblk_fabric::AddrDisplay(None),
            source: io::Error::from_raw_os_error(errno),
        };
        let addr = "10.0.0.1:4791".parse().unwrap();
        let e = anyhow::Error::new(rblk_initiator::Error::Connect { addr, source: cm(libc::ENODEV) });
        assert!(no_device(&e));
        let e = anyhow::Error::new(rblk_initiator::Error::Connect { addr, source: cm(libc::ETIMEDOUT) });
        assert!(!no_device(&e));
    }

    /// --source-addr and --tos reach the connection options; a TOS past 255 or a source that is
    /// not an IP address is refused by the parser.
    #[test]
    fn route_flags() {
        use clap::Parser as _;
        let a =
            Args::try_parse_from(["rblk", "info", "rblk://h/v", "--source-addr", "10.0.0.2", "--tos", "106"]).unwrap();
        let Command::Info { conn, .. } = a.command else { panic!("parsed as {:?}", a.command) };
        let o = conn.options("rblk://h/v", Reconnect::default()).unwrap();
        assert_eq!((o.source_addr, o.tos), (Some("10.0.0.2".parse().unwrap()), Some(106)));
        assert_eq!(o.route().source, o.source_addr);
        assert!(o.memory_windows, "memory windows are asked for by default");
        assert_eq!(o.wait, rblk_initiator::Wait::Adaptive, "no polling unless asked");
        let a = Args::try_parse_from(["rblk", "info", "rblk://h/v", "--memory-windows", "off", "--poll"]).unwrap();
        let Command::Info { conn, .. } = a.command else { panic!("parsed as {:?}", a.command) };
        let o = conn.options("rblk://h/v", Reconnect::default()).unwrap();
        assert!(!o.memory_windows && o.wait == rblk_initiator::Wait::Poll);
        let a = Args::try_parse_from(["rblk", "info", "rblk://h/v", "--wait", "sleep"]).unwrap();
        let Command::Info { conn, .. } = a.command else { panic!("parsed as {:?}", a.command) };
        assert_eq!(conn.options("rblk://h/v", Reconnect::default()).unwrap().wait, rblk_initiator::Wait::Sleep);
        assert!(Args::try_parse_from(["rblk", "info", "rblk://h/v", "--wait", "sleep", "--poll"]).is_err());
        for bad in [["--tos", "256"], ["--source-addr", "eth0"], ["--memory-windows", "maybe"], ["--wait", "fast"]] {
            let mut argv = vec!["rblk", "info", "rblk://h/v"];
            argv.extend(bad);
            assert!(Args::try_parse_from(argv).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(1 << 30), "1 GiB");
        assert_eq!(human(4096), "4 KiB");
        assert_eq!(human(1000), "1000 bytes");
        assert_eq!(human(1536 * 1024), "1536 KiB");
    }
}

#[cfg(test)]
mod stream_tests {
    use std::net::{Ipv4Addr, SocketAddr};

    use rblk_initiator::Fabric;
    use rblk_target::config::VolumeSpec;
    use rblk_target::server::{Config, Server};

    use super::*;

    /// A stream of unknown length (a pipe): `len` bytes of a pattern, handed out as asked. It
    /// records the largest read asked of it.
    struct Pipe {
        len: u64,
        pos: u64,
        largest: usize,
    }

    fn byte(i: u64) -> u8 {
        (i.wrapping_mul(31) >> 3) as u8
    }

    impl Source for Pipe {
        fn read_full(&mut self, buf: &mut [u8], _: &mut Volume) -> anyhow::Result<usize> {
            self.largest = self.largest.max(buf.len());
            let n = (buf.len() as u64).min(self.len - self.pos) as usize;
            for (k, b) in buf[..n].iter_mut().enumerate() {
                *b = byte(self.pos + k as u64);
            }
            self.pos += n as u64;
            Ok(n)
        }
    }

    fn volume(size: u64) -> (rblk_target::server::Running, Volume) {
        let r = Server::start(Config {
            listen: SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0),
            fabric: Fabric::Mem,
            volumes: vec![VolumeSpec { name: "v".into(), size, path: None }],
            ..Config::default()
        })
        .unwrap();
        let opts = Options { fabric: Fabric::Mem, ..Options::default() };
        let vol = Session::connect(&format!("rblk://{}/v", r.local_addr()), &opts).unwrap().open(OpenMode::ReadWrite);
        (r, vol.unwrap())
    }

    /// Catches an input buffered whole before it is written (512 MiB of stdin once took 529 MB of
    /// RSS): reading to the end asks for ever larger reads, the stream asks for at most a step.
    #[test]
    fn a_stream_is_written_a_step_at_a_time_and_padded() {
        let (_r, mut vol) = volume(64 << 20);
        let len = 40 * (1 << 20) + 100;
        let mut pipe = Pipe { len, pos: 0, largest: 0 };
        // --progress with stderr not a terminal: the bar draws nothing, but follows the input.
        let bar = progress_bar(true, None);
        let (read, written) = write_stream(&mut vol, &mut pipe, 8192, true, &bar).unwrap();
        assert_eq!((read, written), (len, len - 100 + 4096));
        assert_eq!(bar.position(), len, "the progress bar counts the bytes read");
        assert!(pipe.largest as u64 <= STEP, "reads of at most a step: {}", pipe.largest);
        let mut back = vec![0u8; 8192];
        vol.read_at(&mut back, 8192 + len - 100 - 4096).unwrap();
        let want: Vec<u8> = (len - 100 - 4096..len).map(byte).chain(std::iter::repeat_n(0, 4096 - 100)).collect();
        assert_eq!(back, want, "the tail, then zero padding");
    }

    /// Catches JSON fields that are missing or do not say what the text says.
    #[test]
    fn info_and_stats_as_json() {
        let (_r, mut vol) = volume(8 << 20);
        let info = info_json(&vol);
        assert_eq!(info["size"], 8 << 20);
        assert_eq!(info["block_size"], 4096);
        assert_eq!(info["volatile"], true);
        assert_eq!(info["mode"], "read-write");
        assert!(info["uri"].as_str().unwrap().ends_with("/v"));
        let s = vol.stats().unwrap();
        let stats = stats_json("rblk://t/v", &s);
        assert_eq!((stats["sessions"].as_u64(), stats["registrations"].as_u64()), (Some(1), Some(1)));
        assert_eq!(stats["pinned_bytes"], 8 << 20);
        // The in-memory fabric has type 2B windows: the session has one, on its first QP.
        assert_eq!(info["memory_windows"], true);
        assert_eq!(stats["windows"], 1);
        let parsed = Args::try_parse_from(["rblk", "stats", "rblk://h/v", "-o", "json"]).unwrap();
        assert!(matches!(parsed.command, Command::Stats { format, .. } if format.json()));
        assert!(Args::try_parse_from(["rblk", "info", "rblk://h/v", "-o", "yaml"]).is_err());
    }

    /// Catches LIST not listing what the host may open, listing what it may not (an access
    /// list), or the wrong grant: over the in-memory fabric against an in-process target.
    #[test]
    fn ls_lists_what_this_host_may_open() {
        use rblk_target::access::Grant;
        let volume = |name: &str, size| VolumeSpec { name: name.into(), size, path: None };
        let r = Server::start(Config {
            listen: SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0),
            fabric: Fabric::Mem,
            volumes: vec![volume("b", 8 << 20), volume("a", 4 << 20), volume("secret", 4096)],
            acls: [
                ("secret".to_owned(), [("db1".to_owned(), Grant::Exclusive)].into()),
                ("b".to_owned(), [("*".to_owned(), Grant::ReadOnly)].into()),
            ]
            .into(),
            ..Config::default()
        })
        .unwrap();
        let target = rblk_initiator::Uri::parse_target(&format!("rblk://{}", r.local_addr())).unwrap();
        let list = |host: &str| {
            let opts = Options { fabric: Fabric::Mem, host_id: Some(host.into()), ..Options::default() };
            discover_json(&Session::connect(&target, &opts).unwrap().list().unwrap())
        };
        let web = list("web");
        assert_eq!(web.as_array().unwrap().len(), 2, "secret is not listed: {web}");
        assert_eq!((web[0]["name"].as_str(), web[0]["access"].as_str()), (Some("a"), Some("exclusive")));
        assert_eq!((web[1]["name"].as_str(), web[1]["access"].as_str()), (Some("b"), Some("read-only")));
        assert_eq!(web[1]["size"], 8 << 20);
        let db1 = list("db1");
        assert_eq!(db1.as_array().unwrap().len(), 3);
        assert_eq!((db1[2]["name"].as_str(), db1[2]["access"].as_str()), (Some("secret"), Some("exclusive")));
        // Nothing was registered or left open by listing.
        let opts = Options { fabric: Fabric::Mem, ..Options::default() };
        let mut vol = Session::connect(&format!("rblk://{}/a", r.local_addr()), &opts)
            .unwrap()
            .open(OpenMode::Exclusive)
            .unwrap();
        assert_eq!(vol.stats().unwrap().registrations, 1);
    }

    /// Issue 44: `rblk info` and `rblk discover` open fresh sessions, so they show a grown
    /// volume's new size. Would catch either reporting a size from anything but the target's
    /// answer now (an OPENED or LIST of the old size).
    #[test]
    fn info_and_discover_show_a_grown_volumes_size() {
        let config = |size| Config {
            listen: SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0),
            fabric: Fabric::Mem,
            volumes: vec![VolumeSpec { name: "v".into(), size, path: None }],
            ..Config::default()
        };
        let r = Server::start(config(8 << 20)).unwrap();
        let opts = Options { fabric: Fabric::Mem, ..Options::default() };
        let before = Session::connect(&format!("rblk://{}/v", r.local_addr()), &opts).unwrap().open(OpenMode::ReadOnly);
        assert_eq!(info_json(&before.unwrap())["size"], 8 << 20);
        let grown = r.reload(Config { listen: r.local_addr(), ..config(24 << 20) }).unwrap();
        assert!(grown.grown.iter().any(|(n, _, s)| n == "v" && *s == 24 << 20), "{grown:?}");
        let vol = Session::connect(&format!("rblk://{}/v", r.local_addr()), &opts).unwrap().open(OpenMode::ReadOnly);
        assert_eq!(info_json(&vol.unwrap())["size"], 24 << 20);
        let target = rblk_initiator::Uri::parse_target(&format!("rblk://{}", r.local_addr())).unwrap();
        let listed = Session::connect(&target, &opts).unwrap().list().unwrap();
        assert_eq!(discover_json(&listed)[0]["size"], 24 << 20);
        let table = discover_table(&listed);
        assert!(table[1].contains("24 MiB"), "{table:?}");
    }

    /// Catches a stream's length errors going unnoticed or unexplained.
    #[test]
    fn a_streams_bad_length_is_refused_when_it_gets_there() {
        let hidden = indicatif::ProgressBar::hidden();
        let (_r, mut vol) = volume(8 << 20);
        let e = write_stream(&mut vol, &mut Pipe { len: 5000, pos: 0, largest: 0 }, 0, false, &hidden).unwrap_err();
        assert!(format!("{e:#}").contains("not a multiple of the volume's block size"), "{e:#}");
        let e = write_stream(&mut vol, &mut Pipe { len: 12 << 20, pos: 0, largest: 0 }, 0, false, &hidden).unwrap_err();
        assert!(format!("{e:#}").contains("past the end of the volume after 8388608 bytes"), "{e:#}");
        assert_eq!(
            write_stream(&mut vol, &mut Pipe { len: 0, pos: 0, largest: 0 }, 0, false, &hidden).unwrap(),
            (0, 0)
        );
    }
}
