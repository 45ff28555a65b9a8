//! `rblk nbd --nbd-device`: the kernel's NBD client without nbd-client. One socket pair: this
//! process serves the transmission phase on its end (no handshake: the driver learns size, block
//! size and flags from NBD_CMD_CONNECT's attributes), the driver gets the other end. A grown
//! volume grows the device (NBD_CMD_RECONFIGURE); SIGINT/SIGTERM disconnect it
//! (NBD_CMD_DISCONNECT: the driver sends NBD_CMD_DISC, the transmission ends, the session flushes
//! and closes).
//!
//! [`serve`] runs it against a [`Kernel`]: the nbd driver ([`Driver`]), or the tests' stand-in
//! that plays the driver's part on its end of the socket.

use std::io::Write as _;
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rblk_initiator::Session;

use super::device::Device;
use super::netlink::{self, Connect, Driver, DriverError, Index};
use super::transmit::{self, End};
use crate::list::{self, Entry};

/// How long the driver may take to send NBD_CMD_DISC after NBD_CMD_DISCONNECT before this end of
/// the socket is shut down.
const DISCONNECT_GRACE: Duration = Duration::from_secs(10);

/// What the device mode asks of the nbd driver.
pub trait Kernel {
    /// NBD_CMD_CONNECT: the driver sends requests on `socket`; the device's index.
    fn connect(&self, c: &Connect, socket: &UnixStream) -> Result<u32, DriverError>;
    /// NBD_CMD_RECONFIGURE: the device is `size` bytes now.
    fn resize(&self, index: u32, size: u64) -> Result<(), DriverError>;
    /// NBD_CMD_DISCONNECT.
    fn disconnect(&self, index: u32) -> Result<(), DriverError>;
    /// Who connected the device (the pid, and whether it runs), while it is connected.
    fn holder(&self, index: u32) -> Option<(u32, bool)>;
}

impl Kernel for Driver {
    fn connect(&self, c: &Connect, socket: &UnixStream) -> Result<u32, DriverError> {
        Driver::connect(self, c, socket)
    }
    fn resize(&self, index: u32, size: u64) -> Result<(), DriverError> {
        Driver::resize(self, index, size)
    }
    fn disconnect(&self, index: u32) -> Result<(), DriverError> {
        Driver::disconnect(self, index)
    }
    fn holder(&self, index: u32) -> Option<(u32, bool)> {
        netlink::holder(index)
    }
}

/// What the serving loop waits for.
#[derive(Debug)]
pub enum Event {
    /// SIGINT or SIGTERM.
    Signal(i32),
    /// The volume grew to this many bytes.
    Grew(u64),
    /// The transmission phase ended.
    Ended(Box<transmit::Summary>),
}

/// `rblk nbd URI --nbd-device DEV`.
pub fn run(args: &super::Args, index: Index) -> anyhow::Result<()> {
    // The driver first: a missing module, or a device that is taken, fails before any connection
    // (the driver's EBUSY at connect stays the judge of a race).
    let driver = Driver::open()?;
    if let Index::Dev(i) = index {
        if netlink::holder(i).is_some() {
            return Err(DriverError::from_errno(netlink::Request::Connect(index), libc::EBUSY, netlink::holder).into());
        }
    }
    let opts = args.conn.options(&args.uri, args.reconnect.reconnect())?;
    let mode = crate::common::open_mode(args.read_only, args.exclusive);
    let vol = Session::connect(&args.uri, &opts)?.open(mode)?;
    let (uri, volatile) = (vol.uri().clone(), vol.is_volatile());
    let metrics = crate::metrics::Metrics::new(&uri);
    let _endpoint = args.metrics.serve(&metrics)?;
    let dev = Device::open(vol)?.counted_in(&metrics);
    let geo = dev.geometry();

    let (tx, events) = mpsc::channel();
    watch_signals(&tx)?;
    let json = args.format.json();
    serve(&driver, dev, index, (tx, events), |path| {
        // Exactly one line on stdout: the device (or JSON); the rest to stderr.
        let line = if json {
            serde_json::json!({
                "device": path,
                "uri": uri.to_string(),
                "size": geo.size,
                "block_size": geo.block_size,
                "read_only": geo.read_only,
                "volatile": volatile,
                "pid": std::process::id(),
            })
            .to_string()
        } else {
            path.to_owned()
        };
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}").and_then(|()| out.flush()).context("writing to stdout")?;
        eprintln!(
            "rblk nbd: {path} is {uri} ({} bytes, block size {}{}{})",
            geo.size,
            geo.block_size,
            if geo.read_only { ", read-only" } else { "" },
            if volatile { ", volatile" } else { "" },
        );
        Ok(list::register(Entry::new("nbd", &uri.to_string()).device(Some(std::path::Path::new(path)))))
    })
}

/// Serves `dev` to the kernel as `index` until a signal (then disconnects it) or until the
/// connection ends. `connected(device path)` runs once the device exists (to say so); what it
/// returns is kept until the device is gone. `events` is the loop's channel: the signals' thread
/// holds a sender, the volume's size-change callback and the transmission thread get one here.
pub fn serve<K: Kernel, G>(
    kernel: &K,
    dev: Device,
    index: Index,
    (tx, events): (Sender<Event>, Receiver<Event>),
    connected: impl FnOnce(&str) -> anyhow::Result<G>,
) -> anyhow::Result<()> {
    let geo = dev.geometry();
    let grew = tx.clone();
    dev.on_resize(move |size| drop(grew.send(Event::Grew(size))));

    // Served before the driver has it: the kernel may read (a partition scan) at once.
    let (ours, kernels) = UnixStream::pair().context("making the socket pair for the nbd driver")?;
    let (r, w, closer) = (ours.try_clone()?, ours.try_clone()?, ours.try_clone()?);
    let server = thread::Builder::new()
        .name("rblk-nbd-kernel".into())
        .spawn(move || {
            let summary = transmit::transmit(r, w, dev, || closer.shutdown(Shutdown::Both).unwrap_or(()));
            drop(tx.send(Event::Ended(Box::new(summary))));
        })
        .context("starting the transmission thread")?;
    // Ends the transmission: the session closes before this returns.
    let end_now = |server: thread::JoinHandle<()>| {
        let _ = ours.shutdown(Shutdown::Both);
        let _ = server.join();
    };

    let connect = Connect {
        index,
        size: geo.size,
        block_size: geo.block_size.into(),
        server_flags: geo.transmission_flags(false).into(),
    };
    let index = match kernel.connect(&connect, &kernels) {
        Ok(i) => i,
        Err(e) => {
            end_now(server);
            return Err(e.into());
        }
    };
    // The driver holds its own reference to its end.
    drop(kernels);
    let path = netlink::device_path(index);
    let _guard = match connected(&path) {
        Ok(g) => g,
        Err(e) => {
            let _ = kernel.disconnect(index);
            end_now(server);
            return Err(e);
        }
    };

    let mut stopping: Option<Instant> = None;
    let summary = loop {
        let wait = stopping.map_or(Duration::from_secs(3600), |t| t.saturating_duration_since(Instant::now()));
        match events.recv_timeout(wait) {
            Ok(Event::Ended(summary)) => break summary,
            Ok(Event::Grew(size)) => match kernel.resize(index, size) {
                Ok(()) => eprintln!("rblk nbd: {path} grew to {} ({size} bytes)", crate::common::human(size)),
                Err(e) => tracing::error!("{e}: {path} keeps its old size until it is connected again"),
            },
            Ok(Event::Signal(sig)) if stopping.is_some() => {
                eprintln!("rblk nbd: signal {sig} again: exiting now");
                let _ = ours.shutdown(Shutdown::Both);
                std::process::exit(1);
            }
            Ok(Event::Signal(sig)) => {
                tracing::info!(signal = sig, "signal received: disconnecting {path}");
                if let Err(e) = kernel.disconnect(index) {
                    tracing::error!("{e}: closing the connection instead");
                    let _ = ours.shutdown(Shutdown::Both);
                }
                stopping = Some(Instant::now() + DISCONNECT_GRACE);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if stopping.is_some() {
                    tracing::warn!("the nbd driver did not end the connection: closing it");
                    let _ = ours.shutdown(Shutdown::Both);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // Never: the transmission thread sends Ended before it lets go of its sender.
                break Box::new(transmit::Summary { end: End::Closed, stats: Default::default(), errors: 0 });
            }
        }
    };
    let _ = server.join();
    let transmit::Summary { end, stats: s, errors } = *summary;
    let (reads, writes, flushes, discards) = (s.reads, s.writes, s.flushes, s.discards);
    tracing::info!(%end, reads, writes, flushes, discards, errors, "{path}: the connection ended");
    if stopping.is_some() {
        eprintln!("rblk nbd: {path} disconnected");
        return Ok(());
    }
    // Not asked for: the device was disconnected by someone else (nbd-client -d), or the volume
    // stopped answering. The driver lets go of the device if it is still ours (not if another
    // client has connected it since).
    if kernel.holder(index).is_some_and(|(pid, _)| pid == std::process::id()) {
        let _ = kernel.disconnect(index);
    }
    if end.is_clean() {
        eprintln!("rblk nbd: {path} was disconnected by another program ({end})");
        return Ok(());
    }
    anyhow::bail!("{path}: {end}; disconnected it");
}

/// SIGINT and SIGTERM become events.
fn watch_signals(tx: &Sender<Event>) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]).context("installing signal handlers")?;
    let tx = tx.clone();
    thread::Builder::new()
        .name("rblk-nbd-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if tx.send(Event::Signal(sig)).is_err() {
                    return;
                }
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}
