//! `rblk nbd --nbd-device`: the kernel's NBD client without nbd-client. One socket pair: this process
//! serves the transmission phase on its end (no handshake: the driver learns size, block size
//! and flags from NBD_CMD_CONNECT's attributes), the driver gets the other end. A grown volume
//! grows the device (NBD_CMD_RECONFIGURE); SIGINT/SIGTERM disconnect it (NBD_CMD_DISCONNECT: the
//! driver sends NBD_CMD_DISC, the transmission ends, the session flushes and closes).

use std::io::Write as _;
use std::net::Shutdown;
use std::os::fd::AsRawFd as _;
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rblk_initiator::Session;

use super::device::Device;
use super::netlink::{self, Connect, Driver, DriverError, Index};
use super::transmit;
use crate::list::{self, Entry};

/// How long the driver may take to send NBD_CMD_DISC after NBD_CMD_DISCONNECT before this end of
/// the socket is shut down.
const DISCONNECT_GRACE: Duration = Duration::from_secs(10);

/// What the main thread waits for.
enum Event {
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
    let grew = tx.clone();
    dev.on_resize(move |size| drop(grew.send(Event::Grew(size))));
    watch_signals(&tx)?;

    // Served before the driver has it: the kernel may read (a partition scan) at once.
    let (ours, kernels) = UnixStream::pair().context("making the socket pair for the nbd driver")?;
    let (r, w, closer) = (ours.try_clone()?, ours.try_clone()?, ours.try_clone()?);
    let served = tx.clone();
    let server = thread::Builder::new()
        .name("rblk-nbd-kernel".into())
        .spawn(move || {
            let summary = transmit::transmit(r, w, dev, || closer.shutdown(Shutdown::Both).unwrap_or(()));
            drop(served.send(Event::Ended(Box::new(summary))));
        })
        .context("starting the transmission thread")?;

    let connect = Connect {
        index,
        size: geo.size,
        block_size: geo.block_size.into(),
        server_flags: geo.transmission_flags(false).into(),
        sockets: vec![kernels.as_raw_fd()],
    };
    let index = match driver.connect(&connect) {
        Ok(i) => i,
        Err(e) => {
            // Ends the transmission: the session closes before the error is reported.
            let _ = ours.shutdown(Shutdown::Both);
            let _ = server.join();
            return Err(e.into());
        }
    };
    // The driver holds its own reference to its end.
    drop(kernels);
    let path = netlink::device_path(index);

    // Exactly one line on stdout: the device (or JSON); the rest to stderr.
    let line = if args.format.json() {
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
        path.clone()
    };
    let mut out = std::io::stdout().lock();
    let printed = writeln!(out, "{line}").and_then(|()| out.flush());
    drop(out);
    if let Err(e) = printed {
        let _ = driver.disconnect(index);
        return Err(e).context("writing to stdout");
    }
    eprintln!(
        "rblk nbd: {path} is {uri} ({} bytes, block size {}{}{})",
        geo.size,
        geo.block_size,
        if geo.read_only { ", read-only" } else { "" },
        if volatile { ", volatile" } else { "" },
    );
    let _registered = list::register(Entry::new("nbd", &uri.to_string()).device(Some(std::path::Path::new(&path))));

    let mut stopping: Option<Instant> = None;
    let summary = loop {
        let wait = stopping.map_or(Duration::from_secs(3600), |t| t.saturating_duration_since(Instant::now()));
        match events.recv_timeout(wait) {
            Ok(Event::Ended(summary)) => break summary,
            Ok(Event::Grew(size)) => match driver.resize(index, size) {
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
                if let Err(e) = driver.disconnect(index) {
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
            Err(mpsc::RecvTimeoutError::Disconnected) => unreachable!("the main thread holds a sender"),
        }
    };
    let _ = server.join();
    let transmit::Summary { end, stats: s, errors } = *summary;
    let (reads, writes, flushes, discards) = (s.reads, s.writes, s.flushes, s.discards);
    if stopping.is_none() {
        // The connection ended by itself (the volume stopped answering): the driver fails the
        // device's I/O, and its size goes to 0.
        if let Err(e) = driver.disconnect(index) {
            tracing::warn!("{e}");
        }
        anyhow::bail!("{path}: {end}; disconnected it");
    }
    tracing::info!(%end, reads, writes, flushes, discards, errors, "{path} disconnected");
    eprintln!("rblk nbd: {path} disconnected");
    Ok(())
}

/// SIGINT and SIGTERM become events.
fn watch_signals(tx: &mpsc::Sender<Event>) -> anyhow::Result<()> {
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
