//! The NBD server over in-memory streams and socket pairs, on the block-I/O engine over the
//! in-memory fabric with an in-process target: the handshake's options, every command,
//! malformed and out-of-range requests, pipelining and replies in completion order, failed RDMA
//! operations, flushes that send nothing when nothing was written, and read-modify-write of
//! unaligned requests against a model.

use std::io::{Cursor, Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use rblk_fabric::WcStatus;
use rblk_initiator::{Chain, Engine, Fabric, OpenMode, Options, Reconnect, Session};
use rblk_target::config::VolumeSpec;
use rblk_target::server::{Config, Running, Server};
use zerocopy::IntoBytes as _;

use super::device::Device;
use super::handshake::{Export, HandshakeError, Refusal};
use super::transmit::{End, Summary};
use super::wire::{self, ExportGeometry, RequestHeader};
use super::{export_grew, private_dir, private_socket, serve, Listen, Listener};

const MIB: u64 = 1 << 20;
const GEO: ExportGeometry = ExportGeometry { size: 4 * MIB, block_size: 4096, read_only: false, discards: true };
/// Small pieces and a shallow lane, so requests split and wait for room.
const DEPTH: u32 = 4;
const PIECE: u32 = 16 << 10;

fn options() -> Options {
    Options { fabric: Fabric::Mem, ..Options::default() }
}

/// An in-process target serving one RAM volume `v` over the in-memory fabric.
struct Target {
    running: Option<Running>,
    uri: String,
}

impl Target {
    fn start(geo: ExportGeometry) -> Target {
        static NEXT: AtomicU16 = AtomicU16::new(0);
        let cfg = Config {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 43000 + NEXT.fetch_add(1, Ordering::Relaxed))),
            volumes: vec![VolumeSpec { name: "v".into(), size: geo.size, path: None }],
            fabric: Fabric::Mem,
            block_size: geo.block_size,
            ..Config::default()
        };
        let running = Server::start(cfg).expect("in-process target");
        let uri = format!("rblk://{}/v", running.local_addr());
        Target { running: Some(running), uri }
    }
}

impl Target {
    /// Grows `v` to `size` bytes, as a reload of the target's configuration does.
    fn grow(&self, geo: ExportGeometry, size: u64) {
        let running = self.running.as_ref().expect("running");
        let cfg = Config {
            listen: running.local_addr(),
            volumes: vec![VolumeSpec { name: "v".into(), size, path: None }],
            fabric: Fabric::Mem,
            block_size: geo.block_size,
            ..Config::default()
        };
        let report = running.reload(cfg).expect("reload");
        assert!(report.grown.iter().any(|(n, _, s)| n == "v" && *s == size), "{report:?}");
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown();
        }
    }
}

/// The volume of an in-process target (started at the first open: handshakes that never enter
/// transmission need none), a session per client as the real export.
struct TestExport {
    geo: ExportGeometry,
    target: OnceLock<Target>,
    /// Refuse clients as if another one had the export.
    busy: AtomicBool,
    /// Sessions opened.
    opened: AtomicU32,
    /// The QP number of the last client's lane, for fault injection.
    qp_num: Mutex<Option<u32>>,
    /// The clients' sessions' reconnect policy.
    reconnect: Reconnect,
    /// Every client's session, as `--metrics` counts them.
    metrics: Arc<crate::metrics::Metrics>,
}

impl TestExport {
    fn new(geo: ExportGeometry) -> TestExport {
        TestExport {
            geo,
            target: OnceLock::new(),
            busy: AtomicBool::new(false),
            opened: AtomicU32::new(0),
            qp_num: Mutex::new(None),
            reconnect: Reconnect::default(),
            metrics: crate::metrics::Metrics::new(&rblk_initiator::Uri::parse("rblk://127.0.0.1/v").unwrap()),
        }
    }

    /// Clients' sessions do not reconnect (ctrl_loss_tmo 0): a failed RDMA operation is final.
    fn without_reconnect(geo: ExportGeometry) -> TestExport {
        TestExport { reconnect: Reconnect::NEVER, ..TestExport::new(geo) }
    }

    fn target(&self) -> &Target {
        self.target.get_or_init(|| Target::start(ExportGeometry { read_only: false, ..self.geo }))
    }

    /// The volume's bytes, read through a session of their own.
    fn data(&self, offset: u64, len: usize) -> Vec<u8> {
        let vol = Session::connect(&self.target().uri, &options()).unwrap().open(OpenMode::ReadOnly).unwrap();
        let engine = Engine::new(vol, 1).unwrap();
        let mut buf = vec![0; len];
        engine.read_at(&mut buf, offset).unwrap();
        engine.close().unwrap();
        buf
    }

    /// Writes through a session of its own.
    fn write(&self, data: &[u8], offset: u64) {
        let vol = Session::connect(&self.target().uri, &options()).unwrap().open(OpenMode::ReadWrite).unwrap();
        let engine = Engine::new(vol, 1).unwrap();
        engine.write_at(data, offset).unwrap();
        engine.close().unwrap();
    }

    /// Grows the volume to `size` bytes on the target.
    fn grow(&self, size: u64) {
        self.target().grow(self.geo, size);
    }

    /// Makes the next `count` RDMA operations of the last client's lane fail.
    fn fail_next(&self, count: u32) {
        let qp = self.qp_num.lock().unwrap().expect("a client is in transmission");
        rblk_fabric::mem::fail_next(qp, count, WcStatus::RETRY_EXC_ERR);
    }
}

impl Export for TestExport {
    fn name(&self) -> &str {
        "vol"
    }
    fn description(&self) -> String {
        "test volume".into()
    }
    fn geometry(&self) -> ExportGeometry {
        self.geo
    }
    fn multi_conn(&self) -> bool {
        false
    }
    fn open(&self) -> Result<Device, Refusal> {
        if self.busy.load(Ordering::SeqCst) {
            return Err(Refusal::Busy("in use".into()));
        }
        let mode = if self.geo.read_only { OpenMode::ReadOnly } else { OpenMode::ReadWrite };
        let opts = Options { reconnect: self.reconnect, discard: self.geo.discards, ..options() };
        let vol = Session::connect(&self.target().uri, &opts).and_then(|s| s.open(mode));
        let mut dev = vol
            .and_then(|v| Device::open_with(v, DEPTH, PIECE))
            .map_err(|e| Refusal::Unavailable(Chain(&e).to_string()))?
            .counted_in(&self.metrics);
        self.opened.fetch_add(1, Ordering::SeqCst);
        *self.qp_num.lock().unwrap() = Some(dev.lane().qp_num());
        Ok(dev)
    }
}

// ---- building the client's bytes ----

fn option(opt: u32, data: &[u8]) -> Vec<u8> {
    let hdr = wire::OptionHeader { magic: wire::IHAVEOPT.into(), option: opt.into(), len: (data.len() as u32).into() };
    [hdr.as_bytes(), data].concat()
}

fn info_data(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    d
}

fn request(kind: u16, flags: u16, handle: u64, offset: u64, len: u32) -> Vec<u8> {
    let r = RequestHeader {
        magic: wire::REQUEST_MAGIC.into(),
        flags: flags.into(),
        kind: kind.into(),
        handle: handle.into(),
        offset: offset.into(),
        len: len.into(),
    };
    r.as_bytes().to_vec()
}

fn client_flags() -> Vec<u8> {
    (wire::FLAG_C_FIXED_NEWSTYLE | wire::FLAG_C_NO_ZEROES).to_be_bytes().to_vec()
}

// ---- reading the server's bytes ----

fn take<const N: usize>(r: &mut impl Read) -> [u8; N] {
    let mut b = [0u8; N];
    r.read_exact(&mut b).expect("server output ended early");
    b
}

fn u16_of(b: &[u8]) -> u16 {
    u16::from_be_bytes(b[..2].try_into().unwrap())
}
fn u32_of(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}
fn u64_of(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}

fn greeting(r: &mut impl Read) {
    let g = take::<18>(r);
    assert_eq!(&g[..16], b"NBDMAGICIHAVEOPT");
    assert_eq!(u16_of(&g[16..]), wire::FLAG_FIXED_NEWSTYLE | wire::FLAG_NO_ZEROES);
}

/// One option reply: (option, type, data).
fn opt_reply(r: &mut impl Read) -> (u32, u32, Vec<u8>) {
    let h = take::<20>(r);
    assert_eq!(u64_of(&h), wire::OPT_REPLY_MAGIC);
    let mut data = vec![0; u32_of(&h[16..]) as usize];
    r.read_exact(&mut data).unwrap();
    (u32_of(&h[8..]), u32_of(&h[12..]), data)
}

/// A simple reply: (error, handle).
fn simple_reply(r: &mut impl Read) -> (u32, u64) {
    let h = take::<16>(r);
    assert_eq!(u32_of(&h), wire::SIMPLE_REPLY_MAGIC);
    (u32_of(&h[4..]), u64_of(&h[8..]))
}

#[test]
fn handshake_options_over_an_in_memory_stream() {
    let export = TestExport::new(GEO);
    let mut script = client_flags();
    script.extend(option(wire::OPT_LIST, &[]));
    script.extend(option(wire::OPT_LIST, b"junk"));
    script.extend(option(wire::OPT_INFO, &info_data("nope", &[])));
    script.extend(option(wire::OPT_INFO, &info_data("", &[wire::INFO_BLOCK_SIZE])));
    script.extend(option(8, &[])); // NBD_OPT_STRUCTURED_REPLY
    script.extend(option(wire::OPT_STARTTLS, &[]));
    script.extend(option(wire::OPT_GO, &[0, 0, 0, 9, b'x']));
    script.extend(option(wire::OPT_INFO, &vec![0; wire::MAX_OPTION_LEN as usize + 1]));
    script.extend(option(wire::OPT_GO, &info_data("vol", &[wire::INFO_NAME, wire::INFO_DESCRIPTION])));
    script.extend(request(wire::CMD_WRITE, 0, 1, 8192, 4096));
    script.extend([0x5a; 4096]);
    // Pipelined (the script is sent at once): replies may come in any order, and a read of
    // what a write in flight writes may see either, so it reads elsewhere.
    script.extend(request(wire::CMD_READ, 0, 2, 0, 4096));
    script.extend(request(wire::CMD_FLUSH, 0, 3, 0, 0));
    script.extend(request(wire::CMD_DISC, 0, 4, 0, 0));
    let mut out = Vec::new();
    let summary = serve(Cursor::new(script), &mut out, &export, || {}).unwrap().expect("transmission");
    assert!(matches!(summary.end, End::Disconnect), "{summary:?}");

    let r = &mut Cursor::new(out);
    greeting(r);
    let (opt, kind, data) = opt_reply(r);
    assert_eq!((opt, kind), (wire::OPT_LIST, wire::REP_SERVER));
    assert_eq!(data, [&3u32.to_be_bytes()[..], b"vol"].concat());
    assert_eq!(opt_reply(r).1, wire::REP_ACK);
    assert_eq!(opt_reply(r).1, wire::REP_ERR_INVALID);
    let (_, kind, text) = opt_reply(r);
    assert_eq!(kind, wire::REP_ERR_UNKNOWN);
    assert!(String::from_utf8(text).unwrap().contains("nope"));
    // INFO: the export (size, flags), block sizes with the minimum asked for, ACK.
    let (opt, kind, data) = opt_reply(r);
    assert_eq!((opt, kind, u16_of(&data)), (wire::OPT_INFO, wire::REP_INFO, wire::INFO_EXPORT));
    assert_eq!((u64_of(&data[2..]), u16_of(&data[10..])), (GEO.size, GEO.transmission_flags(false)));
    let (_, _, data) = opt_reply(r);
    assert_eq!(u16_of(&data), wire::INFO_BLOCK_SIZE);
    assert_eq!((u32_of(&data[2..]), u32_of(&data[6..]), u32_of(&data[10..])), (4096, 4096, 32 << 20));
    assert_eq!(opt_reply(r).1, wire::REP_ACK);
    assert_eq!(opt_reply(r), (8, wire::REP_ERR_UNSUP, b"option 8 is not supported".to_vec()));
    assert_eq!(opt_reply(r).1, wire::REP_ERR_POLICY);
    assert_eq!(opt_reply(r).1, wire::REP_ERR_INVALID);
    assert_eq!(opt_reply(r).1, wire::REP_ERR_TOO_BIG);
    // GO: export, block sizes (minimum 1: not asked for), name, description, ACK.
    assert_eq!(u16_of(&opt_reply(r).2), wire::INFO_EXPORT);
    let (_, _, data) = opt_reply(r);
    assert_eq!((u16_of(&data), u32_of(&data[2..])), (wire::INFO_BLOCK_SIZE, 1));
    assert_eq!(opt_reply(r).2, [&wire::INFO_NAME.to_be_bytes()[..], b"vol"].concat());
    assert_eq!(opt_reply(r).2, [&wire::INFO_DESCRIPTION.to_be_bytes()[..], b"test volume"].concat());
    assert_eq!(opt_reply(r), (wire::OPT_GO, wire::REP_ACK, vec![]));
    // Transmission: three replies in some order, the read's with its data.
    let mut handles = Vec::new();
    for _ in 0..3 {
        let (err, handle) = simple_reply(r);
        assert_eq!(err, 0);
        if handle == 2 {
            assert_eq!(take::<4096>(r), [0; 4096]);
        }
        handles.push(handle);
    }
    handles.sort_unstable();
    assert_eq!(handles, [1, 2, 3]);
    assert_eq!(r.position() as usize, r.get_ref().len(), "nothing after the last reply (DISC has none)");
    assert_eq!(export.data(8192, 4096), [0x5a; 4096]);
    let s = summary.stats;
    assert_eq!((s.reads, s.writes, summary.errors), (1, 1, 0), "{s:?}");
    // The FLUSH covers the writes replied to when it came: this one was in flight, or not.
    assert_eq!(s.flushes + s.flushes_skipped, 1, "{s:?}");
}

#[test]
fn abort_export_name_and_bad_handshakes() {
    // NBD_OPT_ABORT: ACK, and no transmission.
    let export = TestExport::new(GEO);
    let mut out = Vec::new();
    let script = [client_flags(), option(wire::OPT_ABORT, &[])].concat();
    assert!(serve(Cursor::new(script), &mut out, &export, || {}).unwrap().is_none());
    let r = &mut Cursor::new(out);
    greeting(r);
    assert_eq!(opt_reply(r), (wire::OPT_ABORT, wire::REP_ACK, vec![]));
    assert_eq!(export.opened.load(Ordering::SeqCst), 0, "no device opened");
    assert!(export.target.get().is_none(), "no target needed");

    // NBD_OPT_EXPORT_NAME, old clients' way in: size, flags, and 124 zeros unless NO_ZEROES.
    for no_zeroes in [false, true] {
        let export = TestExport::new(GEO);
        let flags = wire::FLAG_C_FIXED_NEWSTYLE | if no_zeroes { wire::FLAG_C_NO_ZEROES } else { 0 };
        let mut script = flags.to_be_bytes().to_vec();
        script.extend(option(wire::OPT_EXPORT_NAME, b"vol"));
        script.extend(request(wire::CMD_DISC, 0, 1, 0, 0));
        let mut out = Vec::new();
        let summary = serve(Cursor::new(script), &mut out, &export, || {}).unwrap().expect("transmission");
        assert!(matches!(summary.end, End::Disconnect), "{summary:?}");
        assert_eq!(out.len(), 18 + 10 + if no_zeroes { 0 } else { 124 });
        assert_eq!((u64_of(&out[18..]), u16_of(&out[26..])), (GEO.size, GEO.transmission_flags(false)));
    }

    // An unknown export by NBD_OPT_EXPORT_NAME cannot be answered: the connection ends.
    let script = [client_flags(), option(wire::OPT_EXPORT_NAME, b"other")].concat();
    let e = serve(Cursor::new(script), Vec::new(), &TestExport::new(GEO), || {}).unwrap_err();
    assert!(matches!(e, HandshakeError::Refused(_)), "{e}");
    // Unknown client flags, a bad option magic, a client that leaves.
    let e = serve(Cursor::new(vec![0, 0, 0, 4]), Vec::new(), &TestExport::new(GEO), || {}).unwrap_err();
    assert!(matches!(e, HandshakeError::Violation(_)), "{e}");
    let mut bad = option(wire::OPT_LIST, &[]);
    bad[0] ^= 1;
    let e = serve(Cursor::new([client_flags(), bad].concat()), Vec::new(), &TestExport::new(GEO), || {}).unwrap_err();
    assert!(matches!(e, HandshakeError::Violation(_)), "{e}");
    let e = serve(Cursor::new(client_flags()), Vec::new(), &TestExport::new(GEO), || {}).unwrap_err();
    assert!(matches!(e, HandshakeError::Io(_)), "{e}");
}

#[test]
fn a_busy_export_refuses_go_and_the_client_may_go_on() {
    let export = TestExport::new(GEO);
    export.busy.store(true, Ordering::SeqCst);
    let script =
        [client_flags(), option(wire::OPT_GO, &info_data("", &[])), option(wire::OPT_INFO, &info_data("", &[]))]
            .concat();
    let e = serve(Cursor::new(script), Vec::new(), &export, || {});
    // The script ends after the INFO: the client left.
    assert!(matches!(e, Err(HandshakeError::Io(_))));
    let export = TestExport::new(GEO);
    export.busy.store(true, Ordering::SeqCst);
    let script = [client_flags(), option(wire::OPT_GO, &info_data("", &[])), option(wire::OPT_ABORT, &[])].concat();
    let mut out = Vec::new();
    assert!(serve(Cursor::new(script), &mut out, &export, || {}).unwrap().is_none());
    let r = &mut Cursor::new(out);
    greeting(r);
    let (_, kind, text) = opt_reply(r);
    assert_eq!((kind, text), (wire::REP_ERR_POLICY, b"in use".to_vec()));
    assert_eq!(opt_reply(r).1, wire::REP_ACK);
}

/// A client on one end of a socket pair, the server on a thread at the other.
struct Client {
    s: UnixStream,
    server: Option<std::thread::JoinHandle<Result<Option<Summary>, HandshakeError>>>,
}

impl Client {
    fn start(export: Arc<TestExport>) -> Client {
        let (mine, theirs) = UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || {
            let r = theirs.try_clone().unwrap();
            let w = theirs.try_clone().unwrap();
            serve(r, w, &*export, || drop(theirs.shutdown(std::net::Shutdown::Both)))
        });
        let mut c = Client { s: mine, server: Some(server) };
        greeting(&mut c.s);
        c.s.write_all(&client_flags()).unwrap();
        c.s.write_all(&option(wire::OPT_GO, &info_data("", &[wire::INFO_BLOCK_SIZE]))).unwrap();
        loop {
            let (_, kind, _) = opt_reply(&mut c.s);
            if kind == wire::REP_ACK {
                break;
            }
            assert_eq!(kind, wire::REP_INFO);
        }
        c
    }

    fn send(&mut self, kind: u16, flags: u16, handle: u64, offset: u64, len: u32, data: &[u8]) {
        self.s.write_all(&[request(kind, flags, handle, offset, len), data.to_vec()].concat()).unwrap();
    }

    fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, u32> {
        self.send(wire::CMD_READ, 0, 77, offset, len, &[]);
        let (err, handle) = simple_reply(&mut self.s);
        assert_eq!(handle, 77);
        if err != 0 {
            return Err(err);
        }
        let mut data = vec![0; len as usize];
        self.s.read_exact(&mut data).unwrap();
        Ok(data)
    }

    fn cmd(&mut self, kind: u16, flags: u16, offset: u64, len: u32, data: &[u8]) -> u32 {
        self.send(kind, flags, 78, offset, len, data);
        let (err, handle) = simple_reply(&mut self.s);
        assert_eq!(handle, 78);
        err
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> u32 {
        self.cmd(wire::CMD_WRITE, 0, offset, data.len() as u32, data)
    }

    fn disconnect(mut self) -> Summary {
        self.send(wire::CMD_DISC, 0, 0, 0, 0, &[]);
        let mut rest = Vec::new();
        self.s.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "no reply to DISC");
        self.ended()
    }

    /// The server's account, once it has ended.
    fn ended(&mut self) -> Summary {
        self.server.take().unwrap().join().unwrap().unwrap().expect("transmission")
    }
}

#[test]
fn malformed_and_out_of_range_requests_get_errors_and_the_server_keeps_serving() {
    let export = Arc::new(TestExport::new(GEO));
    let mut c = Client::start(Arc::clone(&export));
    assert_eq!(c.write(0, &[1; 4096]), 0);
    let size = GEO.size;
    assert_eq!(c.read(size, 4096), Err(22), "read at the end");
    assert_eq!(c.read(size - 4096, 8192), Err(22), "read across the end");
    assert_eq!(c.read(u64::MAX - 100, 4096), Err(22), "read whose end overflows");
    assert_eq!(c.read(0, 0), Err(22), "empty read");
    assert_eq!(c.read(0, (32 << 20) + 1), Err(22), "read over the maximum");
    assert_eq!(c.write(size - 512, &[2; 1024]), 28, "write across the end: ENOSPC, payload drained");
    assert_eq!(c.cmd(wire::CMD_WRITE, 1 << 5, 0, 4096, &[3; 4096]), 22, "unknown flag on a write");
    assert_eq!(c.cmd(wire::CMD_TRIM, 0, size, 4096, &[]), 28, "TRIM past the end");
    assert_eq!(c.cmd(7, 0, 0, 4096, &[]), 22, "BLOCK_STATUS is not offered");
    assert_eq!(c.cmd(0xbeef, 0, 0, 0, &[]), 22, "unknown command");
    assert_eq!(c.cmd(wire::CMD_READ, wire::CMD_FLAG_NO_HOLE, 0, 4096, &[]), 22, "NO_HOLE on a read");
    // Still serving, and nothing refused reached the volume.
    assert_eq!(c.read(0, 4096), Ok(vec![1; 4096]));
    let summary = c.disconnect();
    assert!(matches!(summary.end, End::Disconnect), "{summary:?}");
    assert_eq!((summary.stats.reads, summary.stats.writes, summary.errors), (1, 1, 0), "{summary:?}");
    assert_eq!(export.data(size - 4096, 4096), vec![0; 4096]);
}

#[test]
fn without_reconnect_failed_rdma_operations_are_eio_and_the_connection_goes_on() {
    let export = Arc::new(TestExport::without_reconnect(GEO));
    export.write(&[6; 8192], MIB - 4096);
    // A failed RDMA operation breaks its queue pair: each case gets a client of its own.
    type Case = fn(&mut Client) -> u32;
    let cases: [(&str, Case); 5] = [
        ("a read", |c| c.read(MIB, 64 << 10).unwrap_err()),
        ("a write", |c| c.write(MIB - 4096, &[4; 8192])),
        ("a read-modify-write", |c| c.write(MIB + 10, &[4; 10])),
        ("a write of zeroes", |c| c.cmd(wire::CMD_WRITE_ZEROES, 0, MIB, 4096, &[])),
        ("an unaligned read", |c| c.read(MIB - 10, 20).unwrap_err()),
    ];
    for (what, case) in cases {
        let mut c = Client::start(Arc::clone(&export));
        export.fail_next(1);
        assert_eq!(case(&mut c), 5, "{what} whose RDMA operation fails is EIO");
        // The queue pair is gone: the connection answers with errors, it does not end.
        assert_eq!(c.read(0, 4096), Err(5), "after {what}");
        assert_eq!(c.cmd(wire::CMD_FLUSH, 0, 0, 0, &[]), 0, "FLUSH goes to the session's first queue pair");
        let summary = c.disconnect();
        assert!(matches!(summary.end, End::Disconnect), "{what}: {summary:?}");
        assert_eq!(summary.errors, 2, "{what}: {summary:?}");
    }
    // Nothing failed half-way: the data is as it was, and a new client is served.
    let mut c = Client::start(Arc::clone(&export));
    assert_eq!(c.read(MIB - 4096, 8192), Ok(vec![6; 8192]));
    assert!(matches!(c.disconnect().end, End::Disconnect));
}

#[test]
fn a_failed_rdma_operation_is_replayed_on_a_new_session() {
    // The default policy: the queue pair that failed is replaced (the session reconnects) and
    // the operation runs again; the client sees nothing.
    let export = Arc::new(TestExport::new(GEO));
    let mut c = Client::start(Arc::clone(&export));
    export.fail_next(1);
    assert_eq!(c.write(MIB - 4096, &[4; 8192]), 0, "a write whose first RDMA operation failed");
    export.fail_next(1);
    assert_eq!(c.read(MIB - 4096, 8192), Ok(vec![4; 8192]), "a read whose first RDMA operation failed");
    assert_eq!(c.cmd(wire::CMD_FLUSH, 0, 0, 0, &[]), 0);
    let summary = c.disconnect();
    assert_eq!(summary.errors, 0, "{summary:?}");
    assert_eq!(export.data(MIB - 4096, 8192), vec![4; 8192]);
}

/// The value of `name` (labels as a Metrics of volume `v` puts them, plus `extra`) in a scrape.
fn sample(body: &str, name: &str, extra: &str) -> f64 {
    let labels = format!("{{volume=\"v\",target=\"rblk://127.0.0.1:7420/v\"{extra}}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(labels.as_str())?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {name}{labels} in:\n{body}"))
}

/// `--metrics` over HTTP while a client does I/O. Catches counters that do not move with the
/// client's requests (reads, writes, bytes, errors, latency), a reconnect that is not counted or
/// leaves the state reconnecting, and a closed session whose counts vanish from the totals.
#[test]
fn metrics_count_io_a_reconnect_and_closed_sessions() {
    let export = Arc::new(TestExport::new(GEO));
    let args = crate::metrics::MetricsArgs { metrics: Some((Ipv4Addr::LOCALHOST, 0).into()) };
    let endpoint = args.serve(&export.metrics).unwrap().expect("an endpoint");
    let at = endpoint.local_addr();
    let scrape = || {
        let mut s = std::net::TcpStream::connect(at).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        body.to_owned()
    };
    let m = scrape();
    assert_eq!(sample(&m, "rblk_initiator_sessions", ""), 0.0);
    let mut c = Client::start(Arc::clone(&export));
    assert_eq!(c.write(0, &[1; 8192]), 0);
    assert_eq!(c.read(0, 8192), Ok(vec![1; 8192]));
    assert_eq!(c.read(GEO.size, 4096), Err(22), "refused: an error, not a read");
    let m = scrape();
    assert_eq!(sample(&m, "rblk_initiator_sessions", ""), 1.0);
    assert_eq!(sample(&m, "rblk_initiator_connection_state", ",state=\"connected\""), 1.0);
    assert_eq!(sample(&m, "rblk_initiator_writes_total", ""), 1.0);
    assert_eq!(sample(&m, "rblk_initiator_reads_total", ""), 1.0);
    assert_eq!(sample(&m, "rblk_initiator_written_bytes_total", ""), 8192.0);
    assert_eq!(sample(&m, "rblk_initiator_read_bytes_total", ""), 8192.0);
    assert_eq!(sample(&m, "rblk_initiator_read_seconds_count", ""), 1.0);
    assert_eq!(sample(&m, "rblk_initiator_read_seconds_bucket", ",le=\"+Inf\""), 1.0);
    assert_eq!(sample(&m, "rblk_initiator_reconnects_total", ""), 0.0);
    assert!(sample(&m, "rblk_initiator_read_seconds_sum", "") > 0.0);

    export.fail_next(1);
    assert_eq!(c.read(0, 4096), Ok(vec![1; 4096]), "replayed on a new session");
    let m = scrape();
    assert_eq!(sample(&m, "rblk_initiator_reconnects_total", ""), 1.0);
    assert_eq!(sample(&m, "rblk_initiator_connection_state", ",state=\"connected\""), 1.0);
    assert_eq!(sample(&m, "rblk_initiator_connection_state", ",state=\"reconnecting\""), 0.0);
    assert_eq!(sample(&m, "rblk_initiator_reads_total", ""), 2.0);
    assert_eq!(sample(&m, "rblk_initiator_errors_total", ""), 0.0, "the replayed read did not fail");

    assert_eq!(c.cmd(wire::CMD_FLUSH, 0, 0, 0, &[]), 0);
    c.disconnect();
    let m = scrape();
    assert_eq!(sample(&m, "rblk_initiator_sessions", ""), 0.0);
    assert_eq!(sample(&m, "rblk_initiator_reads_total", ""), 2.0, "a closed session's counts stay");
    assert_eq!(sample(&m, "rblk_initiator_writes_total", ""), 1.0);
    assert_eq!(sample(&m, "rblk_initiator_flushes_total", ""), 1.0);
    assert_eq!(sample(&m, "rblk_initiator_flush_seconds_count", ""), 1.0);
    assert_eq!(sample(&m, "rblk_initiator_reconnects_total", ""), 1.0);
    endpoint.stop();
}

#[test]
fn a_bad_request_magic_ends_the_connection() {
    let export = Arc::new(TestExport::new(GEO));
    let mut c = Client::start(Arc::clone(&export));
    assert_eq!(c.write(0, &[8; 4096]), 0);
    let mut bad = request(wire::CMD_READ, 0, 1, 0, 4096);
    bad[3] ^= 0xff;
    c.s.write_all(&bad).unwrap();
    let mut rest = Vec::new();
    c.s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    let summary = c.ended();
    assert!(matches!(&summary.end, End::Violation(why) if why.contains("magic")), "{summary:?}");
    // The session closed (flushing the write) and the export serves the next client.
    let mut c = Client::start(Arc::clone(&export));
    assert_eq!(c.read(0, 4096), Ok(vec![8; 4096]));
    assert!(matches!(c.disconnect().end, End::Disconnect));
}

#[test]
fn a_read_only_export_refuses_writes() {
    let export = Arc::new(TestExport::new(ExportGeometry { read_only: true, ..GEO }));
    let mut c = Client::start(Arc::clone(&export));
    assert_eq!(c.write(0, &[1; 4096]), 1);
    assert_eq!(c.cmd(wire::CMD_WRITE_ZEROES, 0, 0, 4096, &[]), 1);
    assert_eq!(c.write(10, &[1; 10]), 1, "an unaligned write too");
    assert_eq!(c.cmd(wire::CMD_FLUSH, 0, 0, 0, &[]), 0);
    assert_eq!(c.read(0, 4096), Ok(vec![0; 4096]));
    let summary = c.disconnect();
    assert!(matches!(summary.end, End::Disconnect));
    assert_eq!((summary.stats.writes, summary.stats.flushes), (0, 0), "{summary:?}");
}

#[test]
fn pipelined_requests_split_across_pieces() {
    let export = Arc::new(TestExport::new(GEO));
    let mut c = Client::start(Arc::clone(&export));
    // 64 writes of 24 KiB (two pieces each), all sent before any reply is read.
    let pattern = |i: u64| -> Vec<u8> { (0..24 << 10).map(|j| (i * 7 + j / 4096) as u8).collect() };
    let mut burst = Vec::new();
    for i in 0..64u64 {
        let flags = if i % 16 == 0 { wire::CMD_FLAG_FUA } else { 0 };
        burst.extend(request(wire::CMD_WRITE, flags, 1000 + i, i * (32 << 10), 24 << 10));
        burst.extend(pattern(i));
    }
    c.s.write_all(&burst).unwrap();
    let mut handles: Vec<u64> = (0..64).map(|_| simple_reply(&mut c.s)).map(|(e, h)| (assert_eq!(e, 0), h).1).collect();
    handles.sort_unstable();
    assert_eq!(handles, (1000..1064).collect::<Vec<_>>());
    // The same, read back in one burst; replies carry their handle, data follows each.
    let mut burst = Vec::new();
    for i in 0..64u64 {
        burst.extend(request(wire::CMD_READ, 0, 2000 + i, i * (32 << 10), 24 << 10));
    }
    c.s.write_all(&burst).unwrap();
    let mut seen = Vec::new();
    for _ in 0..64u64 {
        let (err, handle) = simple_reply(&mut c.s);
        assert_eq!(err, 0);
        let mut data = vec![0; 24 << 10];
        c.s.read_exact(&mut data).unwrap();
        assert_eq!(data, pattern(handle - 2000), "read {handle}");
        seen.push(handle);
    }
    seen.sort_unstable();
    assert_eq!(seen, (2000..2064).collect::<Vec<_>>());
    // A 3 MiB write and read: many pieces, more than the lane's depth.
    let big: Vec<u8> = (0..3 * MIB).map(|i| (i % 251) as u8).collect();
    assert_eq!(c.write(MIB, &big), 0);
    assert_eq!(c.read(MIB, big.len() as u32), Ok(big.clone()));
    // WRITE_ZEROES through pieces, then FLUSH.
    assert_eq!(c.cmd(wire::CMD_WRITE_ZEROES, wire::CMD_FLAG_NO_HOLE, MIB + 4096, 1 << 20, &[]), 0);
    assert_eq!(c.cmd(wire::CMD_FLUSH, 0, 0, 0, &[]), 0);
    let back = c.read(MIB, big.len() as u32).unwrap();
    assert_eq!(back[..4096], big[..4096]);
    assert!(back[4096..4096 + (1 << 20)].iter().all(|&b| b == 0));
    assert_eq!(back[4096 + (1 << 20)..], big[4096 + (1 << 20)..]);
    let summary = c.disconnect();
    assert!(matches!(summary.end, End::Disconnect));
    let s = summary.stats;
    assert_eq!((s.reads, s.writes, s.read_modify_writes, summary.errors), (66, 66, 0, 0), "{s:?}");
    assert_eq!(s.flushes, 5, "4 FUA writes and a FLUSH: {s:?}");
}

#[test]
fn replies_go_out_in_completion_order() {
    let export = Arc::new(TestExport::new(GEO));
    let mut c = Client::start(Arc::clone(&export));
    // Reads of 512 KiB (32 pieces each at a depth of 4) keep the lane busy while the rest
    // arrives: an unaligned write, which waits until the lane is idle, an aligned read behind it,
    // which does not, and a FLUSH, which is done at once.
    let mut burst = Vec::new();
    for i in 0..8u64 {
        burst.extend(request(wire::CMD_READ, 0, 100 + i, i * (512 << 10), 512 << 10));
    }
    burst.extend(request(wire::CMD_WRITE, 0, 200, 10, 10));
    burst.extend([9; 10]);
    burst.extend(request(wire::CMD_READ, 0, 201, 3 * MIB, 4096));
    burst.extend(request(wire::CMD_FLUSH, 0, 202, 0, 0));
    c.s.write_all(&burst).unwrap();
    let mut order = Vec::new();
    for _ in 0..11 {
        let (err, handle) = simple_reply(&mut c.s);
        assert_eq!(err, 0, "{handle}");
        let len = match handle {
            100..=107 => 512 << 10,
            201 => 4096,
            _ => 0,
        };
        std::io::copy(&mut (&mut c.s).take(len), &mut std::io::sink()).unwrap();
        order.push(handle);
    }
    let at = |h: u64| order.iter().position(|&x| x == h).unwrap();
    assert!(at(201) < at(200), "the read overtook the unaligned write: {order:?}");
    assert!(at(202) < at(107), "the FLUSH did not wait for the reads: {order:?}");
    assert_eq!(c.read(0, 4096).unwrap()[10..20], [9; 10]);
    assert!(matches!(c.disconnect().end, End::Disconnect));
}

#[test]
fn flush_sends_nothing_when_nothing_was_written_and_fua_writes_flush() {
    let export = Arc::new(TestExport::new(GEO));
    let mut c = Client::start(Arc::clone(&export));
    assert_eq!(c.read(0, 4096), Ok(vec![0; 4096]));
    assert_eq!(c.cmd(wire::CMD_FLUSH, 0, 0, 0, &[]), 0);
    assert_eq!(c.cmd(wire::CMD_FLUSH, 0, 0, 0, &[]), 0);
    let s = c.disconnect().stats;
    assert_eq!((s.flushes, s.flushes_skipped), (0, 2), "nothing written, nothing flushed: {s:?}");

    let mut c = Client::start(Arc::clone(&export));
    assert_eq!(c.write(0, &[1; 4096]), 0);
    assert_eq!(c.cmd(wire::CMD_FLUSH, 0, 0, 0, &[]), 0);
    assert_eq!(c.cmd(wire::CMD_FLUSH, 0, 0, 0, &[]), 0, "clean again");
    assert_eq!(c.cmd(wire::CMD_WRITE, wire::CMD_FLAG_FUA, 8192, 4096, &[2; 4096]), 0);
    assert_eq!(c.cmd(wire::CMD_WRITE_ZEROES, wire::CMD_FLAG_FUA, 4096, 4096, &[]), 0);
    let s = c.disconnect().stats;
    // The FUA write-zeroes of whole blocks is one WRITE_ZEROES that the target makes durable
    // before it answers (FEATURE_DISCARD): no FLUSH of its own.
    assert_eq!((s.flushes, s.flushes_skipped), (2, 1), "a FLUSH, then one for the FUA write: {s:?}");
    assert_eq!(export.data(0, 12288), [vec![1; 4096], vec![0; 4096], vec![2; 4096]].concat());
}

/// Issue 41 on NBD: TRIM zeroes the whole blocks inside its range and leaves the partial ones
/// at its edges; WRITE_ZEROES with FAST_ZERO works against a target that zeroes by itself and
/// fails at once with ENOTSUP against one that cannot (nothing written: `qemu-img convert`
/// then writes the zeros itself); TRIM is refused where it is not advertised. Catches a TRIM
/// that is not sent or zeroes its unaligned edges, and a fast zero that silently writes.
#[test]
fn trim_zeroes_its_whole_blocks_and_fast_zero_fails_fast_without_discard() {
    let export = Arc::new(TestExport::new(GEO));
    let mut c = Client::start(Arc::clone(&export));
    assert_eq!(c.write(0, &[7; 4 * 4096]), 0);
    // 100 bytes into block 0 to 200 bytes into block 3: blocks 1 and 2 go.
    assert_eq!(c.cmd(wire::CMD_TRIM, 0, 100, 3 * 4096 + 100, &[]), 0);
    assert_eq!(c.cmd(wire::CMD_TRIM, 0, 4096 + 10, 100, &[]), 0, "no whole block: nothing to do");
    assert_eq!(c.cmd(wire::CMD_WRITE_ZEROES, wire::CMD_FLAG_FAST_ZERO, 3 * 4096, 4096, &[]), 0);
    let s = c.disconnect().stats;
    assert_eq!((s.discards, s.discarded_bytes), (1, 8192), "one DISCARD of the two whole blocks: {s:?}");
    assert_eq!(export.data(0, 4 * 4096), [vec![7; 4096], vec![0; 3 * 4096]].concat());

    let old = Arc::new(TestExport::new(ExportGeometry { discards: false, ..GEO }));
    let mut c = Client::start(Arc::clone(&old));
    assert_eq!(c.write(0, &[7; 4096]), 0);
    let fast = c.cmd(wire::CMD_WRITE_ZEROES, wire::CMD_FLAG_FAST_ZERO, 0, 4096, &[]);
    assert_eq!(fast, 95, "ENOTSUP");
    assert_eq!(c.cmd(wire::CMD_TRIM, 0, 0, 4096, &[]), 22, "TRIM is not advertised: EINVAL");
    assert_eq!(c.cmd(wire::CMD_WRITE_ZEROES, 0, 0, 4096, &[]), 0, "a plain WRITE_ZEROES still works");
    let _ = c.disconnect();
}

#[test]
fn unaligned_fua_writes_flush_their_blocks() {
    let export = Arc::new(TestExport::new(GEO));
    let mut c = Client::start(Arc::clone(&export));
    assert_eq!(c.cmd(wire::CMD_WRITE, wire::CMD_FLAG_FUA, 100, 10, &[3; 10]), 0, "unaligned FUA write");
    assert_eq!(c.cmd(wire::CMD_WRITE_ZEROES, wire::CMD_FLAG_FUA, 102, 4, &[]), 0, "unaligned FUA zeroes");
    let summary = c.disconnect();
    assert_eq!((summary.stats.read_modify_writes, summary.stats.flushes), (2, 2), "{summary:?}");
    assert_eq!(export.data(100, 10), [3, 3, 0, 0, 0, 0, 3, 3, 3, 3]);
}

/// xorshift64*, for reproducible random requests.
fn rng(x: &mut u64) -> u64 {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

#[test]
fn unaligned_requests_read_modify_write_like_a_byte_array() {
    let geo = ExportGeometry { size: 256 << 10, ..GEO };
    let export = Arc::new(TestExport::new(geo));
    let mut c = Client::start(Arc::clone(&export));
    let mut model = vec![0u8; geo.size as usize];
    let mut x = 0x1234_5678_9abc_def1u64;
    for step in 0..400 {
        // Offsets anywhere; lengths from 1 byte to 40 KiB (across pieces and blocks). Every
        // seventh request is aligned and FUA (unaligned FUA: see the test above).
        let mut len = 1 + rng(&mut x) % (40 << 10);
        let mut offset = rng(&mut x) % (geo.size - len + 1);
        let fua = step % 7 == 0;
        if fua {
            let bs = u64::from(geo.block_size);
            (offset, len) = (offset / bs * bs, len.div_ceil(bs) * bs);
        }
        let (o, n) = (offset as usize, len as usize);
        match rng(&mut x) % 4 {
            0 | 1 => {
                let fill = (step % 250 + 1) as u8;
                let data: Vec<u8> = (0..n).map(|i| fill.wrapping_add(i as u8)).collect();
                let flags = if fua { wire::CMD_FLAG_FUA } else { 0 };
                assert_eq!(c.cmd(wire::CMD_WRITE, flags, offset, len as u32, &data), 0, "write {offset}+{len}");
                model[o..o + n].copy_from_slice(&data);
            }
            2 => {
                let flags = if fua { wire::CMD_FLAG_FUA } else { 0 };
                assert_eq!(c.cmd(wire::CMD_WRITE_ZEROES, flags, offset, len as u32, &[]), 0, "zero {offset}+{len}");
                model[o..o + n].fill(0);
            }
            _ => assert!(c.read(offset, len as u32).unwrap() == model[o..o + n], "read {offset}+{len} at step {step}"),
        }
    }
    let summary = c.disconnect();
    assert!(matches!(summary.end, End::Disconnect));
    let s = summary.stats;
    assert!(s.read_modify_writes > 0 && s.flushes > 0 && summary.errors == 0, "{summary:?}");
    assert!(export.data(0, geo.size as usize) == model, "the volume is the model");
}

#[test]
fn a_client_that_closes_without_disc_ends_cleanly() {
    let export = Arc::new(TestExport::new(GEO));
    let mut c = Client::start(Arc::clone(&export));
    assert_eq!(c.write(0, &[5; 4096]), 0);
    // Requests in flight when the client goes: their replies fail to be written, quietly.
    for i in 0..8 {
        c.send(wire::CMD_READ, 0, i, i * MIB / 4, 256 << 10, &[]);
    }
    let Client { s, .. } = &mut c;
    drop(std::mem::replace(s, UnixStream::pair().unwrap().0));
    let summary = c.ended();
    assert!(summary.end.is_clean() || matches!(summary.end, End::WriteFailed(_)), "{summary:?}");
    // The session closed (flushing the write): the next client is served.
    let mut c = Client::start(Arc::clone(&export));
    assert_eq!(c.read(0, 4096), Ok(vec![5; 4096]));
    // Half-closed: the server answers what it has, then ends.
    c.send(wire::CMD_READ, 0, 1, 0, 4096, &[]);
    c.s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    c.s.read_to_end(&mut rest).unwrap();
    assert_eq!(rest.len(), 16 + 4096);
    let summary = c.ended();
    assert!(summary.end.is_clean() || matches!(summary.end, End::WriteFailed(_)), "{summary:?}");
    assert_eq!(export.opened.load(Ordering::SeqCst), 2);
}

#[test]
fn listen_addresses_and_the_command_line() {
    assert_eq!(Listen::parse("unix:/tmp/x.sock"), Ok(Listen::Unix("/tmp/x.sock".into())));
    assert_eq!(Listen::parse("tcp:127.0.0.1:10809"), Ok(Listen::Tcp("127.0.0.1:10809".parse().unwrap())));
    assert_eq!(Listen::parse("tcp:[::1]:10809"), Ok(Listen::Tcp("[::1]:10809".parse().unwrap())));
    assert!(Listen::parse("unix:").is_err());
    assert!(Listen::parse("tcp:127.0.0.1").is_err());
    assert!(Listen::parse("/tmp/x.sock").is_err());
    assert_eq!(Listen::parse("unix:/s").unwrap().nbd_uri(), "nbd+unix:///?socket=/s");
    assert_eq!(Listen::parse("tcp:127.0.0.1:10809").unwrap().nbd_uri(), "nbd://127.0.0.1:10809");

    use clap::Parser as _;
    let args = crate::cli::Args::try_parse_from([
        "rblk",
        "nbd",
        "rblk://h/v",
        "--listen",
        "unix:/run/v.sock",
        "--read-only",
        "--shared",
        "--key-file",
        "/k",
        "--device",
        "rxe0",
    ])
    .unwrap();
    match args.command {
        crate::cli::Command::Nbd(a) => {
            assert_eq!(
                (a.uri.as_str(), a.listen, a.read_only, a.shared),
                ("rblk://h/v", Some(Listen::Unix("/run/v.sock".into())), true, true)
            );
            assert_eq!(a.conn.route.device.as_deref(), Some("rxe0"));
        }
        other => panic!("{other:?}"),
    }
    let args = crate::cli::Args::try_parse_from(["rblk", "nbd", "rblk://h/v"]).unwrap();
    assert!(
        matches!(args.command, crate::cli::Command::Nbd(a) if a.listen.is_none() && !a.shared),
        "no TCP unless asked: the default is the private unix socket"
    );
    let e =
        crate::cli::Args::try_parse_from(["rblk", "nbd", "rblk://h/v", "--listen", "pipe:x"]).unwrap_err().to_string();
    assert!(e.contains("expected unix:PATH or tcp:ADDR:PORT"), "{e}");
}

/// Would catch a default socket in a directory others can reach: the directory is made 0700,
/// and an existing one with group or other access, or that is a symlink, is refused.
#[test]
fn the_default_socket_is_private() {
    use std::os::unix::fs::PermissionsExt as _;
    let base = std::env::temp_dir().join(format!("rblk-nbd-private-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let dir = base.join("rblk");
    private_dir(&dir).unwrap();
    assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777, 0o700, "made 0700");
    private_dir(&dir).expect("an existing private directory is taken");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let e = private_dir(&dir).unwrap_err().to_string();
    assert!(e.contains("mode 0755") && e.contains("chmod 700"), "{e}");
    let link = base.join("link");
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    let e = private_dir(&link).unwrap_err().to_string();
    assert!(e.contains("not a directory"), "{e}");

    // Under XDG_RUNTIME_DIR for a user, and the socket itself is 0600 whatever the umask.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::env::set_var("XDG_RUNTIME_DIR", &base);
    let path = private_socket("vol0", false).unwrap();
    assert_eq!(path, dir.join("vol0.sock"));
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o002));
    let l = Listener::bind(&Listen::Unix(path.clone())).unwrap();
    nix::sys::stat::umask(old);
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600, "the socket is 0600");
    l.cleanup();
    let _ = std::fs::remove_dir_all(&base);
}

/// `--nbd-device` beside the RDMA `--device`: both parse; it conflicts with --listen and
/// --shared (the kernel is its only client); a bad device is a usage error naming the forms.
/// Catches the flag clashing with, or swallowing, the RDMA device's.
#[test]
fn the_nbd_device_flag() {
    use clap::Parser as _;
    let parse = |extra: &[&str]| {
        let mut argv = vec!["rblk", "nbd", "rblk://h/v"];
        argv.extend_from_slice(extra);
        crate::cli::Args::try_parse_from(argv)
    };
    match parse(&["--nbd-device", "/dev/nbd3", "--device", "rxe0"]).unwrap().command {
        crate::cli::Command::Nbd(a) => {
            assert_eq!(a.nbd_device, Some(super::netlink::Index::Dev(3)));
            assert_eq!(a.conn.route.device.as_deref(), Some("rxe0"));
        }
        other => panic!("{other:?}"),
    }
    match parse(&["--nbd-device", "auto"]).unwrap().command {
        crate::cli::Command::Nbd(a) => assert_eq!(a.nbd_device, Some(super::netlink::Index::Any)),
        other => panic!("{other:?}"),
    }
    for clash in [&["--nbd-device", "auto", "--listen", "unix:/s"][..], &["--nbd-device", "auto", "--shared"]] {
        let e = parse(clash).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict, "{clash:?}: {e}");
    }
    let e = parse(&["--nbd-device", "/dev/sdb"]).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    assert!(e.to_string().contains("expected /dev/nbdN"), "{e}");
}

// ---- --nbd-device: the serving loop against a stand-in for the nbd driver ----

mod device_mode {
    use std::io::{Read as _, Write as _};
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use super::super::kernel::{serve, Event, Kernel};
    use super::super::netlink::{Connect, DriverError, Index, Request};
    use super::{request, TestExport, GEO};
    use crate::nbd::wire;

    /// Plays the nbd driver's part: takes its end of the socket at connect (the test sends the
    /// kernel's requests on it), and at disconnect sends NBD_CMD_DISC and shuts its end down, as
    /// the driver does.
    #[derive(Default)]
    struct FakeKernel {
        socket: Mutex<Option<UnixStream>>,
        connected: Mutex<Option<Connect>>,
        /// The errno connect answers with.
        refuse_connect: Option<i32>,
        /// The errno resize answers with.
        refuse_resize: Option<i32>,
        resized: Mutex<Vec<(u32, u64)>>,
        disconnects: AtomicU32,
    }

    impl Kernel for FakeKernel {
        fn connect(&self, c: &Connect, socket: &UnixStream) -> Result<u32, DriverError> {
            if let Some(errno) = self.refuse_connect {
                return Err(DriverError::from_errno(Request::Connect(c.index), errno, |_| None));
            }
            *self.connected.lock().unwrap() = Some(*c);
            *self.socket.lock().unwrap() = Some(socket.try_clone().unwrap());
            Ok(match c.index {
                Index::Dev(i) => i,
                Index::Any => 7,
            })
        }
        fn resize(&self, index: u32, size: u64) -> Result<(), DriverError> {
            if let Some(errno) = self.refuse_resize {
                return Err(DriverError::from_errno(Request::Resize(index, size), errno, |_| None));
            }
            self.resized.lock().unwrap().push((index, size));
            Ok(())
        }
        fn disconnect(&self, _index: u32) -> Result<(), DriverError> {
            self.disconnects.fetch_add(1, Ordering::SeqCst);
            *self.connected.lock().unwrap() = None;
            if let Some(s) = self.socket.lock().unwrap().take() {
                // The device may be gone already (a second disconnect): nothing to send then.
                let _ = (&s).write_all(&request(wire::CMD_DISC, 0, 0, 0, 0));
                let _ = s.shutdown(std::net::Shutdown::Write);
            }
            Ok(())
        }
        fn holder(&self, _index: u32) -> Option<(u32, bool)> {
            // Ours while connected (the driver shows the pid that connected it).
            self.connected.lock().unwrap().map(|_| (std::process::id(), true))
        }
    }

    impl FakeKernel {
        /// The kernel's end, once connected.
        fn stream(&self) -> UnixStream {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Some(s) = self.socket.lock().unwrap().as_ref() {
                    return s.try_clone().unwrap();
                }
                assert!(Instant::now() < deadline, "no connect in 10 s");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }

    /// One request from the kernel's side and its simple reply: (error, data).
    fn call(s: &mut UnixStream, kind: u16, handle: u64, offset: u64, len: u32, data: &[u8]) -> (u32, Vec<u8>) {
        s.write_all(&[request(kind, 0, handle, offset, len), data.to_vec()].concat()).unwrap();
        let mut reply = [0u8; 16];
        s.read_exact(&mut reply).unwrap();
        assert_eq!(u32::from_be_bytes(reply[..4].try_into().unwrap()), wire::SIMPLE_REPLY_MAGIC);
        assert_eq!(u64::from_be_bytes(reply[8..].try_into().unwrap()), handle);
        let error = u32::from_be_bytes(reply[4..8].try_into().unwrap());
        let mut back = vec![0; if kind == wire::CMD_READ && error == 0 { len as usize } else { 0 }];
        s.read_exact(&mut back).unwrap();
        (error, back)
    }

    /// `serve` in a thread for `index`: its result, the loop's sender (to play the signals and
    /// the size-change callback), and the export's shared size.
    fn start(
        kernel: &Arc<FakeKernel>,
        export: &TestExport,
        index: Index,
    ) -> (std::thread::JoinHandle<anyhow::Result<Vec<String>>>, mpsc::Sender<Event>, super::super::device::SharedSize)
    {
        use super::super::handshake::Export as _;
        let dev = export.open().unwrap_or_else(|_| panic!("opening the test volume"));
        let size = dev.size();
        let (tx, rx) = mpsc::channel();
        let sender = tx.clone();
        let kernel = Arc::clone(kernel);
        let t = std::thread::spawn(move || {
            let mut said = Vec::new();
            serve(&*kernel, dev, index, (tx, rx), |path| {
                said.push(path.to_owned());
                Ok(())
            })
            .map(|()| said)
        });
        (t, sender, size)
    }

    /// The driver is told the volume's size, block size and the flags a handshake would give,
    /// on one socket; the kernel's writes and reads are served; a signal disconnects the device
    /// (NBD_CMD_DISCONNECT once), the transmission ends on the driver's DISC, and `serve`
    /// returns Ok after the session flushed. Catches a connect with other attributes than the
    /// handshake's, a signal that does not disconnect, or an exit before the session closed.
    #[test]
    fn the_kernel_is_served_and_a_signal_disconnects_it() {
        let export = TestExport::new(GEO);
        let kernel = Arc::new(FakeKernel::default());
        let (t, tx, _) = start(&kernel, &export, Index::Dev(5));
        let mut s = kernel.stream();
        assert_eq!(
            *kernel.connected.lock().unwrap(),
            Some(Connect {
                index: Index::Dev(5),
                size: GEO.size,
                block_size: 4096,
                server_flags: GEO.transmission_flags(false).into()
            })
        );
        assert_eq!(call(&mut s, wire::CMD_WRITE, 1, 8192, 4096, &[7; 4096]), (0, vec![]));
        assert_eq!(call(&mut s, wire::CMD_READ, 2, 8192, 4096, &[]), (0, vec![7; 4096]));
        tx.send(Event::Signal(libc::SIGTERM)).unwrap();
        let said = t.join().unwrap().expect("a signal ends it with success");
        assert_eq!(said, ["/dev/nbd5"], "the device was announced once");
        assert_eq!(kernel.disconnects.load(Ordering::SeqCst), 1);
        assert_eq!(export.data(8192, 4096), vec![7; 4096]);
    }

    /// Another program disconnects the device (nbd-client -d: the driver's DISC, the socket shut
    /// down): `serve` ends with success, and disconnects nothing more (the device may be another
    /// client's by then). Catches a server that takes that for a failure, waits for a signal that
    /// never comes, or disconnects a device that is no longer its own.
    #[test]
    fn a_device_disconnected_by_another_program_ends_the_server() {
        let export = TestExport::new(GEO);
        let kernel = Arc::new(FakeKernel::default());
        let (t, _tx, _) = start(&kernel, &export, Index::Any);
        let mut s = kernel.stream();
        assert_eq!(call(&mut s, wire::CMD_READ, 1, 0, 4096, &[]).0, 0);
        kernel.disconnect(7).unwrap();
        assert_eq!(t.join().unwrap().expect("ended by the kernel: success"), ["/dev/nbd7"]);
        assert_eq!(kernel.disconnects.load(Ordering::SeqCst), 1, "the other program's only");
    }

    /// The kernel's end vanishes without DISC (its socket closed): the server ends, and lets go
    /// of the device, still its own. Catches a server that spins or hangs on a dead socket, or
    /// leaves the driver holding a dead device.
    #[test]
    fn the_kernels_end_vanishing_ends_the_server() {
        let export = TestExport::new(GEO);
        let kernel = Arc::new(FakeKernel::default());
        let (t, _tx, _) = start(&kernel, &export, Index::Dev(1));
        let s = kernel.stream();
        drop(kernel.socket.lock().unwrap().take());
        s.shutdown(std::net::Shutdown::Both).unwrap();
        drop(s);
        assert!(t.join().unwrap().is_ok(), "a closed connection is a clean end");
        assert_eq!(kernel.disconnects.load(Ordering::SeqCst), 1);
    }

    /// A connect the driver refuses: the error reads as words, nothing is announced, and `serve`
    /// returns only after the session closed. Catches a server that prints a device it did not
    /// get, or leaves its transmission thread behind.
    #[test]
    fn a_refused_connect_says_why_and_announces_nothing() {
        let export = TestExport::new(GEO);
        let kernel = Arc::new(FakeKernel { refuse_connect: Some(libc::EBUSY), ..FakeKernel::default() });
        let (t, _tx, _) = start(&kernel, &export, Index::Dev(3));
        let e = t.join().unwrap().unwrap_err().to_string();
        assert_eq!(e, "/dev/nbd3 is in use: pick another device, or --nbd-device auto");
        assert_eq!(kernel.disconnects.load(Ordering::SeqCst), 0);
        // No writer left on the volume: the session closed before serve returned.
        let vol = rblk_initiator::Session::connect(&export.target().uri, &super::options())
            .and_then(|s| s.open(rblk_initiator::OpenMode::Exclusive))
            .expect("an exclusive open once the refused server's session closed");
        vol.close().unwrap();
    }

    /// A volume that grows on the target (a reload) reaches the driver as a resize of the
    /// device at once (within 500 ms) while the server is idle, after the request checks took
    /// the new size: the
    /// kernel's write just past the old end is served and reads back. A resize the driver
    /// refuses is logged and serving goes on. Catches a grow that never reaches the kernel (the
    /// callback not hooked, or an idle server that never takes the target's RESIZED), a device
    /// resized before the checks allow its new range, or a refused resize that ends the device.
    #[test]
    fn a_grow_resizes_the_device_and_a_refused_resize_keeps_serving() {
        for refuse in [None, Some(libc::EINVAL)] {
            let export = TestExport::new(GEO);
            let kernel = Arc::new(FakeKernel { refuse_resize: refuse, ..FakeKernel::default() });
            let (t, tx, size) = start(&kernel, &export, Index::Dev(2));
            let mut s = kernel.stream();
            assert_eq!(call(&mut s, wire::CMD_READ, 1, GEO.size, 4096, &[]).0, 22, "past the end before the grow");
            let grown = 3 * GEO.size;
            let asked = Instant::now();
            export.grow(grown);
            let deadline = Instant::now() + Duration::from_secs(5);
            while size.get() != grown || (refuse.is_none() && kernel.resized.lock().unwrap().is_empty()) {
                assert!(Instant::now() < deadline, "the grow did not reach the device in 5 s ({refuse:?})");
                std::thread::sleep(Duration::from_millis(1));
            }
            let took = asked.elapsed();
            eprintln!("the grow reached the device {} ms after the reload", took.as_millis());
            // An idle server takes the target's RESIZED when it arrives, not at its next tick
            // (1 s after it started: without the armed completion channel, 995 ms here).
            assert!(took < Duration::from_millis(500), "the grow took {took:?} to reach the device");
            let want: &[(u32, u64)] = if refuse.is_none() { &[(2, grown)] } else { &[] };
            assert_eq!(*kernel.resized.lock().unwrap(), want);
            // Past the old end, still serving either way.
            assert_eq!(call(&mut s, wire::CMD_WRITE, 2, GEO.size, 8192, &[9; 8192]), (0, vec![]), "{refuse:?}");
            assert_eq!(call(&mut s, wire::CMD_READ, 3, GEO.size - 4096, 12288, &[]).0, 0);
            assert_eq!(call(&mut s, wire::CMD_READ, 4, GEO.size, 8192, &[]), (0, vec![9; 8192]));
            tx.send(Event::Signal(libc::SIGINT)).unwrap();
            assert!(t.join().unwrap().is_ok());
        }
    }
}

/// A listening server's line about a grow comes once per new size however many clients'
/// sessions report it, and says that connected clients keep their size until they reconnect.
/// Catches one line per client, or a line for a report of a size already known.
#[test]
fn a_grow_is_said_once_for_every_client() {
    let size = super::device::SharedSize::new(256 * MIB);
    let lines: Vec<String> = [1280 * MIB, 1280 * MIB, 256 * MIB, 1280 * MIB, 3 << 30]
        .into_iter()
        .filter_map(|new| export_grew(&size, new))
        .collect();
    assert_eq!(
        lines,
        [
            "rblk nbd: volume grew to 1280 MiB: NBD clients see the new size when they reconnect",
            "rblk nbd: volume grew to 3 GiB: NBD clients see the new size when they reconnect"
        ]
    );
    assert_eq!(size.get(), 3 << 30, "new clients' handshakes give the new size");
}

/// A listening server's connected client is served past the old end once the volume grew (its
/// session heard the grow, and the request checks follow it), though NBD gave it no new size.
/// Catches checks that keep the size the connection started with.
#[test]
fn a_connected_client_is_served_past_the_old_end_after_a_grow() {
    let export = Arc::new(TestExport::new(GEO));
    let mut c = Client::start(Arc::clone(&export));
    assert_eq!(c.read(GEO.size, 4096), Err(22), "past the end before the grow");
    export.grow(2 * GEO.size);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while c.read(GEO.size, 4096).is_err() {
        assert!(std::time::Instant::now() < deadline, "past the old end still refused 5 s after the grow");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(c.cmd(wire::CMD_WRITE, 0, 2 * GEO.size - 4096, 4096, &[3; 4096]), 0);
    assert_eq!(c.read(2 * GEO.size - 4096, 4096), Ok(vec![3; 4096]));
    assert!(matches!(c.disconnect().end, End::Disconnect));
}
