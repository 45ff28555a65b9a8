//! `rblk`'s command line: its arguments and the subcommands that need no front end.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use rblk_initiator::{Direction, OpenMode, Options, Reconnect, Session, Volume};

use crate::{fuse, nbd, ublk};

/// Client for rblk volumes served over RDMA by rblk-target.
///
/// A volume is named by a URI, rblk://HOST:PORT/VOLUME (IPv6 addresses in brackets; port 7420
/// by default). Sizes and offsets accept binary suffixes: 4096, 4k, 1M, 1G.
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
pub struct Args {
    #[command(subcommand)]
    /// The subcommand.
    pub command: Command,
}

/// How to reach the target; shared by every subcommand that connects.
#[derive(Debug, clap::Args)]
pub struct Connection {
    /// Key file, for targets that require one: the target's shared key (its --key-file), or
    /// this host's own key from the target's [[host]] entry. One line.
    #[arg(long, env = "RBLK_KEY_FILE", value_name = "PATH")]
    pub key_file: Option<PathBuf>,
    /// This host's identity for the target's access lists and per-host keys (like an NVMe host
    /// NQN): printable ASCII, no spaces. Default: the machine's hostname.
    #[arg(long, env = "RBLK_HOST_ID", value_name = "NAME", value_parser = host_id_arg)]
    pub host_id: Option<String>,
    /// Only use this RDMA device (e.g. mlx5_0, rxe0). The target's address picks the device;
    /// this checks that it is the one expected.
    #[arg(long, value_name = "NAME")]
    pub device: Option<String>,
    /// Give up on each control exchange (connect, open, flush) after this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    pub timeout: u64,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List RDMA devices, their ports and the IP addresses that reach them.
    Devices,
    /// Show a volume's size, block size, largest I/O, durability and open mode. Opens it
    /// read-only.
    Info {
        /// The volume: rblk://HOST/VOLUME or rblk://HOST:PORT/VOLUME.
        uri: String,
        #[command(flatten)]
        conn: Connection,
    },
    /// Read LENGTH bytes at OFFSET of a volume to a file or stdout. Opens it read-only.
    Read {
        /// The volume: rblk://HOST/VOLUME or rblk://HOST:PORT/VOLUME.
        uri: String,
        /// Byte offset to read from, a multiple of the block size (4096, 4k, 1M, ...).
        #[arg(long, value_parser = size_arg, default_value = "0", value_name = "N")]
        offset: u64,
        /// Bytes to read, a multiple of the block size (4096, 4k, 1M, ...).
        #[arg(long, value_parser = size_arg, value_name = "N")]
        length: u64,
        /// Write the data to this file (created or truncated) instead of stdout.
        #[arg(long, short, value_name = "FILE")]
        output: Option<PathBuf>,
        #[command(flatten)]
        conn: Connection,
    },
    /// Write a file or stdin to a volume at OFFSET, then flush (so a completed write is durable
    /// on a durable volume). Opens it read-write.
    ///
    /// The input's length must be a multiple of the volume's block size, unless --pad is given.
    Write {
        /// The volume: rblk://HOST/VOLUME or rblk://HOST:PORT/VOLUME.
        uri: String,
        /// Byte offset to write at, a multiple of the block size (4096, 4k, 1M, ...). Required, so
        /// that nothing is overwritten by accident.
        #[arg(long, value_parser = size_arg, value_name = "N")]
        offset: u64,
        /// Read the data from this file instead of stdin (stdin is read completely first).
        #[arg(long, short, value_name = "FILE")]
        input: Option<PathBuf>,
        /// Zero-fill the last block when the input's length is not a multiple of the block size.
        #[arg(long)]
        pad: bool,
        /// Do not FLUSH before exiting: the data is then in target memory only, and a durable
        /// volume may lose it if the target crashes before someone flushes.
        #[arg(long)]
        no_flush: bool,
        #[command(flatten)]
        conn: Connection,
    },
    // Its help text is on the argument struct.
    Nbd(nbd::Args),
    // Their help texts are on the argument structs.
    Mount(fuse::MountArgs),
    Umount(fuse::UmountArgs),
    Attach(ublk::AttachArgs),
    Detach(ublk::DetachArgs),
    List(crate::list::ListArgs),
}

fn size_arg(text: &str) -> Result<u64, String> {
    rblk_initiator::parse_size(text).map_err(|e| e.to_string())
}

/// Bytes moved per synchronous call: the library splits them into max_io chunks in flight together.
const STEP: u64 = 4 << 20;

/// Runs `rblk` with the process's arguments; the binary's `main`.
pub fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(io::stderr)
        .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
        .init();
    match run(args.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let text = error_text(&e);
            eprintln!("rblk: {text}");
            if text.contains("No such device") {
                eprintln!("rblk: no RDMA device reaches that address here (`rblk devices` lists them)");
            }
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each once.
pub fn error_text(e: &anyhow::Error) -> String {
    rblk_initiator::describe(e.as_ref())
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Devices => devices(),
        Command::Info { uri, conn } => info(&uri, &conn),
        Command::Read { uri, offset, length, output, conn } => read(&uri, &conn, offset, length, output),
        Command::Write { uri, offset, input, pad, no_flush, conn } => write(&uri, &conn, offset, input, pad, !no_flush),
        Command::Nbd(args) => nbd::run(args),
        Command::Mount(args) => fuse::mount(args),
        Command::Umount(args) => fuse::umount(args),
        Command::Attach(args) => ublk::attach(args),
        Command::Detach(args) => ublk::detach(args),
        Command::List(args) => crate::list::list(args),
    }
}

fn devices() -> anyhow::Result<()> {
    let devs = rblk_initiator::list_devices()?;
    if devs.is_empty() {
        bail!("no RDMA device found");
    }
    for d in devs {
        for p in d.ports {
            let addrs: Vec<String> = p.addrs.iter().map(ToString::to_string).collect();
            println!("{} port {} {} {}", d.name, p.port, p.state, addrs.join(","));
        }
    }
    Ok(())
}

fn host_id_arg(text: &str) -> Result<String, String> {
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
    /// The library's options for these flags, with `reconnect` as the reconnect policy.
    pub fn options(&self, reconnect: Reconnect) -> anyhow::Result<Options> {
        let key = self.key_file.as_ref().map(Options::key_from_file).transpose()?;
        Ok(Options {
            device: self.device.clone(),
            key,
            host_id: self.host_id.clone(),
            timeout: Duration::from_secs(self.timeout),
            reconnect,
            ..Options::default()
        })
    }
}

/// Connects and opens a volume as the command line asks.
pub fn open(uri: &str, conn: &Connection, mode: OpenMode, reconnect: Reconnect) -> anyhow::Result<Volume> {
    let session = Session::connect(uri, &conn.options(reconnect)?)?;
    Ok(session.open(mode)?)
}

fn info(uri: &str, conn: &Connection) -> anyhow::Result<()> {
    let vol = open(uri, conn, OpenMode::ReadOnly, Reconnect::default())?;
    println!("volume      {}", vol.uri());
    println!("size        {} ({})", vol.size(), human(vol.size()));
    println!("block size  {}", vol.block_size());
    println!("max I/O     {} ({})", vol.max_io(), human(vol.max_io().into()));
    println!("storage     {}", if vol.is_volatile() { "volatile (RAM only)" } else { "durable" });
    println!("mode        {}", mode_name(vol.mode(), vol.is_read_only()));
    vol.close()?;
    Ok(())
}

fn mode_name(mode: OpenMode, read_only: bool) -> &'static str {
    match mode {
        _ if read_only => "read-only",
        OpenMode::ReadOnly => "read-only",
        OpenMode::ReadWrite => "read-write",
        OpenMode::Exclusive => "exclusive",
    }
}

fn read(uri: &str, conn: &Connection, offset: u64, length: u64, output: Option<PathBuf>) -> anyhow::Result<()> {
    let mut vol = open(uri, conn, OpenMode::ReadOnly, Reconnect::default())?;
    vol.check_range(Direction::Read, offset, length)?;
    let mut out: Box<dyn Write> = match &output {
        Some(path) => Box::new(File::create(path).with_context(|| format!("creating {}", path.display()))?),
        None => Box::new(io::stdout().lock()),
    };
    let step = step(&vol);
    let mut buf = vec![0u8; step.min(length) as usize];
    let mut done = 0;
    while done < length {
        let n = step.min(length - done) as usize;
        vol.read_at(&mut buf[..n], offset + done)?;
        out.write_all(&buf[..n]).context("writing the output")?;
        done += n as u64;
    }
    out.flush().context("writing the output")?;
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
) -> anyhow::Result<()> {
    // Know the input's length up front, so a bad one is refused before anything is written.
    let (mut reader, len): (Box<dyn Read>, u64) = match &input {
        Some(path) => {
            let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
            let meta = file.metadata().with_context(|| format!("reading {}", path.display()))?;
            if meta.is_file() {
                (Box::new(file), meta.len())
            } else {
                slurp(file).with_context(|| format!("reading {}", path.display()))?
            }
        }
        None => slurp(io::stdin().lock()).context("reading stdin")?,
    };
    if len == 0 {
        bail!("the input is empty: nothing to write");
    }
    let mut vol = open(uri, conn, OpenMode::ReadWrite, Reconnect::default())?;
    let bs = u64::from(vol.block_size());
    let total = padded_len(len, bs, pad)?;
    vol.check_range(Direction::Write, offset, total)?;
    let step = step(&vol);
    let mut buf = vec![0u8; step.min(total) as usize];
    let mut done = 0;
    while done < total {
        let n = step.min(total - done) as usize;
        let got = read_full(&mut reader, &mut buf[..n]).context("reading the input")?;
        if (got as u64) < n as u64 && done + (got as u64) < len {
            bail!("the input ended after {} bytes, {len} were expected", done + got as u64);
        }
        buf[got..n].fill(0);
        vol.write_at(&buf[..n], offset + done)?;
        done += n as u64;
    }
    let note = match flush.then(|| vol.flush()).transpose()? {
        None => "not flushed (--no-flush)",
        Some(true) => "flushed; the volume is volatile (RAM only)",
        Some(false) => "flushed to durable storage",
    };
    vol.close()?;
    let padded = if total > len { format!(" ({} bytes of zero padding)", total - len) } else { String::new() };
    eprintln!("rblk: wrote {total} bytes at offset {offset}{padded}; {note}");
    Ok(())
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

/// Reads all of a stream of unknown length.
fn slurp(mut r: impl Read) -> io::Result<(Box<dyn Read>, u64)> {
    let mut data = Vec::new();
    r.read_to_end(&mut data)?;
    let len = data.len() as u64;
    Ok((Box::new(io::Cursor::new(data)), len))
}

/// Fills `buf` unless the input ends first; returns the bytes read.
fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// `bytes` in the largest binary unit that divides it.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    let mut value = bytes;
    while unit + 1 < UNITS.len() && value >= 1024 && value % 1024 == 0 {
        value /= 1024;
        unit += 1;
    }
    format!("{value} {}", UNITS[unit])
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
    }

    #[test]
    fn padding() {
        assert_eq!(padded_len(8192, 4096, false).unwrap(), 8192);
        assert_eq!(padded_len(5000, 4096, true).unwrap(), 8192);
        let e = padded_len(5000, 4096, false).unwrap_err().to_string();
        assert!(e.contains("not a multiple of the volume's block size (4096 bytes)") && e.contains("--pad"), "{e}");
    }

    #[test]
    fn error_text_skips_repeated_causes() {
        let io = std::io::Error::other("disk on fire");
        let e = anyhow::Error::new(rblk_initiator::Error::KeyFile { path: "/k".into(), source: io });
        assert_eq!(error_text(&e), "key file /k: disk on fire");
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_text(&e), "outer: inner");
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(1 << 30), "1 GiB");
        assert_eq!(human(4096), "4 KiB");
        assert_eq!(human(1000), "1000 bytes");
        assert_eq!(human(1536 * 1024), "1536 KiB");
    }

    #[test]
    fn read_full_stops_at_the_end() {
        let mut r: &[u8] = &[1, 2, 3];
        let mut buf = [9u8; 5];
        assert_eq!(read_full(&mut r, &mut buf).unwrap(), 3);
        assert_eq!(buf, [1, 2, 3, 9, 9]);
    }
}
