//! `rblk nbd`: an NBD server in front of an rblk volume, so that any NBD client (the kernel's
//! `nbd-client`, qemu, libnbd, nbdfuse) can use it as a block device.
//!
//! - `wire`: the NBD wire format (big-endian zerocopy structs) and the request checks.
//! - `handshake`: fixed newstyle option haggling, generic over `Read + Write`.
//! - `transmit`: the transmission phase, pipelined: a reader thread parses requests, the
//!   connection's thread runs each as one request of the block-I/O engine
//!   ([`rblk_initiator::engine`]) and replies in completion order.
//! - `device`: what a client is served from: an rblk session's [`Engine`](rblk_initiator::Engine)
//!   and one [`Lane`](rblk_initiator::Lane) of up to 32 volume operations in flight.
//! - `netlink`: the kernel's nbd driver through generic netlink (connect, resize, disconnect).
//! - `kernel`: `--nbd-device`: this process is the kernel's server on a socket pair, no nbd-client.
//! - here: the command line, the listening socket, one thread per client, signals, the entry
//!   for `rblk list`.
//!
//! Each client gets its own rblk session when it enters transmission, so the rblk volume is
//! opened once per connected client; without `--shared` only one client at a time may.
//!
//! A volume that grows: with `--nbd-device` the device grows with it; a listening server's clients
//! keep the size their handshake gave them (NBD has no way to tell them), and see the new size
//! when they reconnect.

#![forbid(unsafe_code)]

mod device;
mod handshake;
mod kernel;
mod netlink;
mod transmit;
mod wire;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs as _};
use std::os::unix::fs::FileTypeExt as _;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

use anyhow::{bail, Context as _};
use rblk_initiator::{Chain, OpenMode, Options, Session, Uri};

use self::device::{Device, SharedSize};
use self::handshake::{Export, Outcome, Refusal};
use self::wire::ExportGeometry;
use crate::list::{self, Entry};

/// How long a client may take over its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a client entering transmission waits for the previous one to finish leaving.
const BUSY_GRACE: Duration = Duration::from_secs(5);
/// How long a client may leave a reply unread before it is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(120);

/// The long help's explanation and examples.
const HELP: &str = "\
Runs in the foreground until SIGINT or SIGTERM (a second one exits at once). Once it listens it
prints exactly one line on stdout, the export's NBD URI (nbd://ADDR:PORT or
nbd+unix:///?socket=PATH), or with -o json one JSON object {\"nbd_uri\", \"uri\", \"size\",
\"block_size\", \"read_only\", \"volatile\", \"shared\", \"pid\"}; the rest goes to stderr. Each NBD client gets its own rblk session, opened read-write unless
--read-only, when it enters transmission. Requests are pipelined: up to 32 volume operations in
flight per client, replies in completion order. Requests not aligned to the volume's block
size are served by read-modify-write, one at a time. FLUSH and FUA go to the target (a RAM
volume's flush is an ordering point only); WRITE_ZEROES writes zeros; TRIM is offered where the
target discards. A volume that grows keeps its old size for connected clients (NBD cannot tell
them): they see the new one when they reconnect, and one line on stderr says so.

With --nbd-device /dev/nbdN (or auto) there is no socket and no nbd-client: rblk connects the
kernel's NBD client itself, through the nbd driver's netlink interface as nbd-client does, and
serves it. It prints the device on stdout (with -o json: {\"device\", \"uri\", \"size\",
\"block_size\", \"read_only\", \"volatile\", \"pid\"}); SIGINT or SIGTERM disconnects it, the
session flushes and rblk exits 0. When the volume grows, the device grows with it (Linux 5.3 or
later). Killed with SIGKILL, rblk leaves the device connected (new I/O fails, I/O in flight
waits) until nbd-client -d frees it.

NBD has no authentication: anyone who can connect can read and write the volume. So by
default it listens on a private unix socket, /run/rblk/nbd/VOLUME.sock for root
($XDG_RUNTIME_DIR/rblk/VOLUME.sock for other users), mode 0600 in a directory of mode 0700 that
must belong to the user; TCP only with --listen tcp:ADDR:PORT, warned about on every address,
loopback included (every local user can reach it).

Examples:
  rblk nbd rblk://10.0.0.1/vol0          # prints nbd+unix:///?socket=/run/rblk/nbd/vol0.sock
  nbd-client -unix /run/rblk/nbd/vol0.sock /dev/nbd0 -block-size 4096
  qemu-img info 'nbd+unix:///?socket=/run/rblk/nbd/vol0.sock'
  nbd-client -d /dev/nbd0
  modprobe nbd; rblk nbd rblk://10.0.0.1/vol0 --nbd-device /dev/nbd0   # prints /dev/nbd0
  rblk nbd rblk://10.0.0.1/vol0 --nbd-device auto -o json              # the first free device";

/// Serve a volume over NBD, or connect it as /dev/nbdN
///
/// In the foreground until SIGINT/SIGTERM.
#[derive(Debug, clap::Args)]
#[command(after_long_help = HELP)]
pub struct Args {
    /// The volume: rblk://HOST[:PORT]/VOLUME
    #[arg(value_parser = crate::common::volume_uri_arg)]
    uri: String,
    /// Where clients connect [default: a private socket]
    ///
    /// unix:PATH (a socket file, mode 0600, created, and removed at exit; its directory must exist)
    /// or tcp:ADDR:PORT (10809 is NBD's port; NBD has no authentication, so every TCP address is
    /// warned about, loopback included). Default: a private socket, /run/rblk/nbd/VOLUME.sock for
    /// root, $XDG_RUNTIME_DIR/rblk/VOLUME.sock for other users, in a directory of mode 0700 (as
    /// nbdkit's -U -).
    #[arg(long, value_name = "unix:PATH|tcp:ADDR:PORT", value_parser = Listen::parse)]
    listen: Option<Listen>,
    /// Set up the kernel's /dev/nbdN itself instead of listening (root)
    ///
    /// /dev/nbdN, or auto for the first free one (printed on stdout). No nbd-client: rblk hands the
    /// nbd driver one end of a socket pair through netlink, as nbd-client does, and serves it; a
    /// grown volume grows the device. SIGINT/SIGTERM disconnect it. Needs the nbd module
    /// (modprobe nbd) and Linux 4.12 or later (5.3 to follow a grow).
    ///
    /// (Not --device: that names the RDMA device.)
    #[arg(long, value_name = "/dev/nbdN|auto", value_parser = netlink::Index::parse, conflicts_with_all = ["listen", "shared"])]
    nbd_device: Option<netlink::Index>,
    /// Export the volume read-only (and open it read-only)
    #[arg(long, conflicts_with = "exclusive")]
    read_only: bool,
    /// Open the volume exclusively: no other session may write it
    #[arg(long, conflicts_with = "shared", hide_short_help = true)]
    exclusive: bool,
    /// Let several NBD clients connect at once (NBD multi-conn)
    ///
    /// Each gets its own rblk session. Without it, a second client is refused while one is
    /// connected, so on a socket others can reach, one client that stays connected locks the rest
    /// out: keep the default private socket (or a unix socket only the right users can open).
    #[arg(long)]
    shared: bool,
    #[command(flatten)]
    format: crate::common::Format,
    #[command(flatten)]
    metrics: crate::metrics::MetricsArgs,
    #[command(flatten)]
    conn: crate::common::Connection,
    #[command(flatten, next_help_heading = "Reconnect")]
    reconnect: rblk_initiator::ReconnectArgs,
}

/// Where to listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// A unix socket at this path.
    Unix(PathBuf),
    /// TCP on this address.
    Tcp(SocketAddr),
}

impl Listen {
    /// Parses `unix:PATH` or `tcp:ADDR:PORT` (a host name resolves to its first address).
    pub fn parse(text: &str) -> Result<Listen, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a socket path, e.g. unix:/run/rblk-vol0.sock".into());
            }
            return Ok(Listen::Unix(PathBuf::from(path)));
        }
        if let Some(addr) = text.strip_prefix("tcp:") {
            let mut addrs = addr.to_socket_addrs().map_err(|e| format!("{addr:?}: {e} (expected ADDR:PORT)"))?;
            return addrs.next().map(Listen::Tcp).ok_or_else(|| format!("{addr:?} has no address"));
        }
        Err(format!("{text:?}: expected unix:PATH or tcp:ADDR:PORT"))
    }

    /// Refuses a unix socket whose directory does not exist, before anything connects.
    fn check_dir(&self) -> anyhow::Result<()> {
        let Listen::Unix(path) = self else { return Ok(()) };
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => bail!("--listen unix:{}: {} is not a directory", path.display(), dir.display()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                bail!("--listen unix:{}: the directory {} does not exist", path.display(), dir.display())
            }
            Err(e) => bail!("--listen unix:{}: {}: {}", path.display(), dir.display(), crate::common::io_text(&e)),
        }
    }

    /// The NBD URI clients use (qemu's syntax) for the default export.
    pub fn nbd_uri(&self) -> String {
        match self {
            Listen::Unix(path) => format!("nbd+unix:///?socket={}", path.display()),
            Listen::Tcp(addr) => format!("nbd://{addr}"),
        }
    }
}

/// The default socket: `DIR/VOLUME.sock` in a directory of this user's with mode 0700
/// (`/run/rblk/nbd` for root, `$XDG_RUNTIME_DIR/rblk` otherwise), made if missing and refused
/// if it exists with another owner, group or other access, or as a symlink.
fn private_socket(volume: &str, root: bool) -> anyhow::Result<PathBuf> {
    let dir = if root {
        list::run_dir().join("nbd")
    } else {
        match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
            Some(d) => PathBuf::from(d).join("rblk"),
            None => bail!(
                "XDG_RUNTIME_DIR is not set, so there is no private place for the socket: give --listen unix:PATH"
            ),
        }
    };
    private_dir(&dir)?;
    Ok(dir.join(format!("{volume}.sock")))
}

/// Makes `dir` (mode 0700) or checks that it is this user's, a directory, and mode 0700.
fn private_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
    }
    rblk_fabric::private::check_dir(dir, rblk_fabric::private::DirUse::OwnerOnly)
        .map_err(|why| anyhow::anyhow!("{why}: refusing to put the NBD socket there (or give --listen)"))
}

/// A listening socket.
#[derive(Debug)]
enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
}

impl Listener {
    fn bind(listen: &Listen) -> anyhow::Result<Listener> {
        match listen {
            Listen::Unix(path) => {
                if let Ok(meta) = std::fs::symlink_metadata(path) {
                    if !meta.file_type().is_socket() {
                        bail!("{} exists and is not a socket; not replacing it", path.display());
                    }
                    if UnixStream::connect(path).is_ok() {
                        bail!("another server is listening on {}", path.display());
                    }
                    // A socket nobody listens on: left behind by a server that was killed.
                    std::fs::remove_file(path).with_context(|| format!("removing stale socket {}", path.display()))?;
                }
                // Mode 0600 from the start, whatever the umask: who may open the socket may
                // read and write the volume.
                let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
                let bound = UnixListener::bind(path);
                nix::sys::stat::umask(old);
                let l = bound.with_context(|| format!("listening on {}", path.display()))?;
                Ok(Listener::Unix(l, path.clone()))
            }
            Listen::Tcp(addr) => {
                let l = TcpListener::bind(addr).with_context(|| format!("listening on {addr}"))?;
                let who = if addr.ip().is_loopback() { "every user of this host" } else { "anyone who reaches it" };
                tracing::warn!(
                    %addr,
                    "NBD has no authentication: {who} can read and write the volume through this address; the default \
                     private unix socket (no --listen) is safer"
                );
                Ok(Listener::Tcp(l))
            }
        }
    }

    fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Unix(l, _) => l.accept().map(|(s, _)| Stream::Unix(s)),
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                // Replies are small and latency matters.
                s.set_nodelay(true)?;
                Ok(Stream::Tcp(s))
            }
        }
    }

    /// Connects to ourselves, to wake a blocked accept.
    fn wake(&self) {
        match self {
            Listener::Unix(_, path) => drop(UnixStream::connect(path)),
            Listener::Tcp(l) => {
                if let Ok(mut addr) = l.local_addr() {
                    if addr.ip().is_unspecified() {
                        let ip: std::net::IpAddr = match addr {
                            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
                        };
                        addr.set_ip(ip);
                    }
                    drop(TcpStream::connect_timeout(&addr, Duration::from_secs(1)));
                }
            }
        }
    }

    fn cleanup(&self) {
        if let Listener::Unix(_, path) = self {
            if let Err(e) = std::fs::remove_file(path) {
                tracing::warn!(path = %path.display(), error = %e, "removing the socket failed");
            }
        }
    }
}

/// A client's connection.
#[derive(Debug)]
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn try_clone(&self) -> io::Result<Stream> {
        match self {
            Stream::Unix(s) => s.try_clone().map(Stream::Unix),
            Stream::Tcp(s) => s.try_clone().map(Stream::Tcp),
        }
    }

    fn shutdown(&self, how: Shutdown) {
        // Already shut down, or the peer is gone: nothing left to do either way.
        let _ = match self {
            Stream::Unix(s) => s.shutdown(how),
            Stream::Tcp(s) => s.shutdown(how),
        };
    }

    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(t),
            Stream::Tcp(s) => s.set_read_timeout(t),
        }
    }

    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_write_timeout(t),
            Stream::Tcp(s) => s.set_write_timeout(t),
        }
    }

    fn peer(&self) -> String {
        match self {
            Stream::Unix(_) => "unix".into(),
            Stream::Tcp(s) => s.peer_addr().map_or_else(|_| "tcp".into(), |a| a.to_string()),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.flush(),
            Stream::Tcp(s) => s.flush(),
        }
    }
}

/// The one-client-at-a-time claim, released on drop.
#[derive(Debug)]
pub struct Slot(Arc<AtomicBool>);

impl Slot {
    fn claim(busy: &Arc<AtomicBool>) -> Option<Slot> {
        busy.compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst).ok().map(|_| Slot(Arc::clone(busy)))
    }

    /// Claims the slot, waiting up to `grace` for the previous client to finish leaving: a
    /// client that disconnects and reconnects at once (qemu-img convert, then compare) would
    /// otherwise race its own old connection's teardown.
    fn claim_within(busy: &Arc<AtomicBool>, grace: Duration) -> Option<Slot> {
        let deadline = std::time::Instant::now() + grace;
        loop {
            if let Some(slot) = Slot::claim(busy) {
                return Some(slot);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// The volume as an export: a session per client.
#[derive(Debug)]
struct RblkExport {
    uri: Uri,
    opts: Options,
    mode: OpenMode,
    /// Size and flags at start; the size is `size`'s.
    geo: ExportGeometry,
    /// The volume's size as last learnt from any client's session: new clients' handshakes
    /// give it.
    size: SharedSize,
    shared: bool,
    busy: Arc<AtomicBool>,
    /// Every client's session, counted for `--metrics`.
    metrics: Arc<crate::metrics::Metrics>,
}

impl Export for RblkExport {
    fn name(&self) -> &str {
        self.uri.volume()
    }

    fn description(&self) -> String {
        format!("rblk volume {}", self.uri)
    }

    fn geometry(&self) -> ExportGeometry {
        ExportGeometry { size: self.size.get(), ..self.geo }
    }

    fn multi_conn(&self) -> bool {
        // Every client's FLUSH flushes the whole volume on the target, and no client caches.
        self.shared
    }

    fn open(&self) -> Result<Device, Refusal> {
        let slot = if self.shared {
            None
        } else {
            let Some(slot) = Slot::claim_within(&self.busy, BUSY_GRACE) else {
                tracing::error!(
                    "refusing a second NBD client: {} is already exported to another client \
                     (start rblk nbd with --shared to allow several)",
                    self.uri
                );
                let text =
                    format!("{} is in use by another NBD client (the server was started without --shared)", self.uri);
                return Err(Refusal::Busy(text));
            };
            Some(slot)
        };
        let unavailable = |e: rblk_initiator::Error| {
            tracing::error!(error = %Chain(&e), "opening {} for an NBD client failed", self.uri);
            Refusal::Unavailable(format!("opening {}: {}", self.uri, Chain(&e)))
        };
        let vol = Session::connect(&self.uri, &self.opts).and_then(|s| s.open(self.mode)).map_err(unavailable)?;
        let dev = Device::open(vol).map_err(unavailable)?;
        let size = self.size.clone();
        dev.on_resize(move |new| {
            if let Some(line) = export_grew(&size, new) {
                eprintln!("{line}");
            }
        });
        Ok(dev.with_slot(slot).counted_in(&self.metrics))
    }
}

/// What a listening server says when a client's session learns that the volume grew to `new`
/// bytes: every client's session reports the grow, so the line comes once, from whichever
/// learns it first (and the export's handshakes give the new size from then on).
fn export_grew(size: &SharedSize, new: u64) -> Option<String> {
    size.grow_to(new).then(|| {
        format!(
            "rblk nbd: volume grew to {}: NBD clients see the new size when they reconnect",
            crate::common::human(new)
        )
    })
}

/// `rblk nbd`.
pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(index) = args.nbd_device {
        return kernel::run(&args, index);
    }
    // Local arguments first: a bad socket directory fails before any connection.
    let listen = match &args.listen {
        Some(l) => {
            l.check_dir()?;
            l.clone()
        }
        None => {
            let volume = Uri::parse(&args.uri)?.volume().to_owned();
            Listen::Unix(private_socket(&volume, nix::unistd::geteuid().is_root())?)
        }
    };
    let opts = args.conn.options(&args.uri, args.reconnect.reconnect())?;
    let mode = crate::common::open_mode(args.read_only, args.exclusive);
    // Open once up front: a bad URI, key or device fails here, not at the first client.
    let vol = Session::connect(&args.uri, &opts)?.open(mode)?;
    let geo = ExportGeometry {
        size: vol.size(),
        block_size: vol.block_size(),
        read_only: vol.is_read_only(),
        discards: vol.discards(),
    };
    let uri = vol.uri().clone();
    let volatile = vol.is_volatile();
    vol.close()?;

    // Before the NBD socket: a metrics port in use fails with nothing to clean up.
    let metrics = crate::metrics::Metrics::new(&uri);
    let _endpoint = args.metrics.serve(&metrics)?;
    let listener = Arc::new(Listener::bind(&listen)?);
    let stop = Arc::new(AtomicBool::new(false));
    watch_signals(&listener, &stop)?;
    let size = SharedSize::new(geo.size);
    let export =
        Arc::new(RblkExport { uri, opts, mode, geo, size, shared: args.shared, busy: Arc::default(), metrics });

    // Exactly one line on stdout: the NBD URI (or JSON); the rest to stderr.
    let nbd_uri = listen.nbd_uri();
    let line = if args.format.json() {
        serde_json::json!({
            "nbd_uri": nbd_uri,
            "uri": export.uri.to_string(),
            "size": geo.size,
            "block_size": geo.block_size,
            "read_only": geo.read_only,
            "volatile": volatile,
            "shared": args.shared,
            "pid": std::process::id(),
        })
        .to_string()
    } else {
        nbd_uri.clone()
    };
    let mut out = io::stdout().lock();
    writeln!(out, "{line}").and_then(|()| out.flush()).context("writing to stdout")?;
    drop(out);
    eprintln!(
        "rblk nbd: serving {} as {nbd_uri} ({} bytes, block size {}{}{}{})",
        export.uri,
        geo.size,
        geo.block_size,
        if geo.read_only { ", read-only" } else { "" },
        if volatile { ", volatile" } else { "" },
        if args.shared { ", shared" } else { "" },
    );
    eprintln!("rblk nbd: pid {} serves {nbd_uri}", std::process::id());
    // In `rblk list` while serving; removed when this returns.
    let _registered = list::register(Entry::new("nbd", &export.uri.to_string()).listen(&nbd_uri));

    let clients: Arc<Mutex<HashMap<u64, Stream>>> = Arc::default();
    let mut threads: Vec<thread::JoinHandle<()>> = Vec::new();
    for id in 1u64.. {
        let stream = match listener.accept() {
            Ok(s) => s,
            Err(_) if stop.load(Ordering::SeqCst) => break,
            Err(e) => {
                // Out of file descriptors and the like: try again shortly.
                tracing::warn!(error = %e, "accepting a client failed");
                thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        if stop.load(Ordering::SeqCst) {
            break;
        }
        threads.retain(|t| !t.is_finished());
        let registered = stream.try_clone().map(|s| lock(&clients).insert(id, s));
        if let Err(e) = registered {
            tracing::warn!(error = %e, "dropping a client: cloning its socket failed");
            continue;
        }
        let (export, registry) = (Arc::clone(&export), Arc::clone(&clients));
        let spawned = thread::Builder::new().name(format!("rblk-nbd-{id}")).spawn(move || {
            serve_client(id, stream, &export);
            lock(&registry).remove(&id);
        });
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => {
                tracing::warn!(error = %e, "dropping a client: no thread for it");
                lock(&clients).remove(&id);
            }
        }
    }

    // Stop reading from every client: each finishes what is in flight, replies, and closes its
    // session.
    tracing::info!("shutting down");
    for s in lock(&clients).values() {
        s.shutdown(Shutdown::Read);
    }
    for t in threads {
        let _ = t.join();
    }
    listener.cleanup();
    eprintln!("rblk nbd: stopped");
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The first SIGINT/SIGTERM stops accepting and winds the clients down; a second one exits at
/// once.
fn watch_signals(listener: &Arc<Listener>, stop: &Arc<AtomicBool>) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]).context("installing signal handlers")?;
    let (listener, stop) = (Arc::clone(listener), Arc::clone(stop));
    thread::Builder::new()
        .name("rblk-nbd-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if stop.swap(true, Ordering::SeqCst) {
                    eprintln!("rblk nbd: signal {sig} again: exiting now");
                    listener.cleanup();
                    std::process::exit(1);
                }
                tracing::info!(signal = sig, "signal received: shutting down");
                listener.wake();
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}

/// One client: handshake, then transmission until it disconnects.
fn serve_client(id: u64, stream: Stream, export: &RblkExport) {
    let span = tracing::info_span!("nbd", client = id, peer = %stream.peer());
    let _enter = span.enter();
    tracing::info!("client connected");
    let split = stream
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(WRITE_TIMEOUT)))
        .and_then(|()| Ok((stream.try_clone()?, stream.try_clone()?)));
    let (mut r, mut w) = match split {
        Ok(rw) => rw,
        Err(e) => {
            tracing::warn!(error = %e, "setting up the connection failed");
            return;
        }
    };
    match handshake::handshake(&mut r, &mut w, export) {
        Ok(Outcome::Transmit { device, name }) => {
            if let Err(e) = stream.set_read_timeout(None) {
                tracing::warn!(error = %e, "clearing the handshake timeout failed");
                return;
            }
            tracing::info!(export = name, "transmission started");
            let transmit::Summary { end, stats: s, errors } =
                transmit::transmit(r, w, *device, || stream.shutdown(Shutdown::Both));
            let (reads, writes, rmw, flushes, skipped, discards) =
                (s.reads, s.writes, s.read_modify_writes, s.flushes, s.flushes_skipped, s.discards);
            if end.is_clean() {
                tracing::info!(%end, reads, writes, rmw, flushes, skipped, discards, errors, "client gone");
            } else {
                tracing::warn!(%end, reads, writes, rmw, flushes, skipped, discards, errors, "client connection ended");
            }
        }
        Ok(Outcome::Aborted) => tracing::info!("client aborted the handshake"),
        Err(handshake::HandshakeError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
            tracing::info!("client left during the handshake");
        }
        Err(e) => tracing::warn!(error = %e, "handshake failed"),
    }
}

/// Handshake, then transmission, on one stream pair: the whole server for one client. The
/// listener's threads do the same with a handshake timeout in between.
#[cfg(test)]
pub fn serve<E: Export>(
    mut r: impl Read + Send,
    mut w: impl Write,
    export: &E,
    close: impl FnOnce(),
) -> Result<Option<transmit::Summary>, handshake::HandshakeError> {
    match handshake::handshake(&mut r, &mut w, export)? {
        Outcome::Transmit { device, .. } => Ok(Some(transmit::transmit(r, w, *device, close))),
        Outcome::Aborted => Ok(None),
    }
}
