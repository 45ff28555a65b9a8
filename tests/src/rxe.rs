//! The RDMA device a test runs on, and a one-connection passive peer for fabric tests.

use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rblk_fabric::{Access, Completion, Endpoint, Fabric, ListenerEvent, Memory, QpAttributes, QpConfig, Route};

/// The device and address to test on.
#[derive(Debug, Clone)]
pub struct Rdma {
    /// Device name (`RBLK_DEVICE`).
    pub device: String,
    /// An address of that device (`RBLK_ADDR`).
    pub addr: IpAddr,
}

/// The RDMA device from the environment. Panics (the test fails) when there is none: tests
/// that need RDMA never pass without it.
pub fn rdma() -> Rdma {
    let required = std::env::var("RBLK_REQUIRE_RDMA").is_ok_and(|v| v == "1");
    let device = std::env::var("RBLK_DEVICE").unwrap_or_default();
    let addr = std::env::var("RBLK_ADDR").unwrap_or_default();
    let devices = rblk_fabric::list_devices().expect("listing RDMA devices");
    let found = devices.iter().any(|d| d.name == device);
    assert!(
        !device.is_empty() && found,
        "this test needs an RDMA device: RBLK_DEVICE={device:?} (found: {:?}, RBLK_REQUIRE_RDMA={required}); \
         run it through scripts/test.sh, which boots the rxe guest",
        devices.iter().map(|d| &d.name).collect::<Vec<_>>()
    );
    let addr = addr.parse().unwrap_or_else(|_| panic!("RBLK_ADDR={addr:?} is not an IP address"));
    Rdma { device, addr }
}

/// How long any single step of a fabric test may take before it fails (TCG is slow).
pub const STEP: Duration = Duration::from_secs(30);

/// Requests to the passive peer's thread.
enum Cmd {
    Attributes(mpsc::Sender<QpAttributes>),
    From(mpsc::Sender<Option<SocketAddr>>),
    Recv(mpsc::Sender<(Completion, Vec<u8>)>),
}

/// A passive peer: accepts one connection, registers `region` bytes for remote read and write
/// (plus a receive buffer), and serves [`Peer`] requests from its own thread.
pub struct Peer {
    /// Where the connector should connect.
    pub addr: SocketAddr,
    /// The registered region (readable from the test for verification).
    pub memory: Arc<Memory>,
    /// Remote address and rkey of the region, once the connection is accepted.
    remote: mpsc::Receiver<(u64, u32)>,
    cmds: Option<mpsc::Sender<Cmd>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer").field("addr", &self.addr).finish()
    }
}

const RECV_LEN: usize = 4096;

impl Peer {
    /// Listens on `rdma.addr` (ephemeral port) with a region of `region` bytes.
    pub fn start(rdma: &Rdma, region: usize) -> Peer {
        let listener = rblk_fabric::Listener::bind(Fabric::Verbs, SocketAddr::new(rdma.addr, 0), Some(&rdma.device))
            .expect("bind listener");
        let addr = listener.local_addr().expect("listener address");
        let memory = Memory::anonymous(region).expect("map region");
        let (remote_tx, remote) = mpsc::channel();
        let (cmds, cmd_rx) = mpsc::channel::<Cmd>();
        let mem = Arc::clone(&memory);
        let thread = thread::spawn(move || {
            let req = loop {
                match listener.next_event(Some(Instant::now() + STEP)).expect("listener event") {
                    Some(ListenerEvent::Request(r)) => break r,
                    Some(_) => continue,
                    None => panic!("no connection request within {STEP:?}"),
                }
            };
            let pd = req.alloc_pd().expect("alloc pd");
            let mr = pd.register(&mem, Access::REMOTE_READ_WRITE).expect("register region");
            let recv_mem = Memory::anonymous(RECV_LEN).expect("map recv buffer");
            let recv_mr = pd.register(&recv_mem, Access::LOCAL).expect("register recv buffer");
            let mut ep = req.into_endpoint(&pd, &QpConfig::default(), 1).expect("endpoint");
            ep.post_recv(7, &recv_mr, 0, RECV_LEN as u32).expect("post recv");
            ep.accept().expect("accept");
            remote_tx.send((mr.addr(), mr.rkey())).expect("hand out rkey");
            // Serve until the test drops its Peer (the channel closes).
            while let Ok(cmd) = cmd_rx.recv() {
                match cmd {
                    Cmd::Attributes(tx) => {
                        let _ = tx.send(ep.attributes().expect("query target QP"));
                    }
                    Cmd::From(tx) => {
                        let _ = tx.send(ep.peer());
                    }
                    Cmd::Recv(tx) => {
                        let c = wait_one(&mut ep);
                        let mut data = vec![0u8; (c.byte_len as usize).min(RECV_LEN)];
                        recv_mem.read_at(0, &mut data).expect("read recv buffer");
                        let _ = tx.send((c, data));
                    }
                }
            }
            // Drain listener events so a late DISCONNECTED does not linger unacknowledged.
            while let Ok(Some(_)) = listener.next_event(None) {}
        });
        Peer { addr, memory, remote, cmds: Some(cmds), thread: Some(thread) }
    }

    /// The region's remote address and rkey (waits for the accept).
    pub fn remote(&self) -> (u64, u32) {
        self.remote.recv_timeout(STEP).expect("peer accepted and registered")
    }

    /// The passive QP's attributes, as its device reports them.
    pub fn attributes(&self) -> QpAttributes {
        let (tx, rx) = mpsc::channel();
        self.cmds.as_ref().expect("peer running").send(Cmd::Attributes(tx)).expect("peer alive");
        rx.recv_timeout(STEP).expect("peer answered")
    }

    /// The address the accepted connection came from, as the passive side sees it.
    pub fn connected_from(&self) -> Option<SocketAddr> {
        let (tx, rx) = mpsc::channel();
        self.cmds.as_ref().expect("peer running").send(Cmd::From(tx)).expect("peer alive");
        rx.recv_timeout(STEP).expect("peer answered")
    }

    /// Waits for one RECV completion on the passive side and returns it with the bytes received.
    pub fn recv(&self) -> (Completion, Vec<u8>) {
        let (tx, rx) = mpsc::channel();
        self.cmds.as_ref().expect("peer running").send(Cmd::Recv(tx)).expect("peer alive");
        rx.recv_timeout(STEP).expect("peer received")
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        // Closing the command channel ends the peer's loop.
        self.cmds.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits for exactly one completion (with a deadline).
pub fn wait_one(ep: &mut Endpoint) -> Completion {
    let mut out = [Completion::EMPTY; 1];
    let deadline = Instant::now() + STEP;
    loop {
        let n = ep.wait(&mut out, Duration::from_micros(50), deadline).expect("wait for completion");
        if n == 1 {
            return out[0];
        }
        assert!(Instant::now() < deadline, "no completion within {STEP:?}");
    }
}

/// Connects an active endpoint to `peer`.
pub fn connect(rdma: &Rdma, peer: &Peer) -> Endpoint {
    connect_along(peer, &Route { device: Some(rdma.device.clone()), ..Route::default() })
}

/// Connects an active endpoint to `peer` along `route` (device, source address, TOS).
pub fn connect_along(peer: &Peer, route: &Route) -> Endpoint {
    let deadline = Instant::now() + STEP;
    let mut ep = Endpoint::resolve(Fabric::Verbs, peer.addr, None, route, &QpConfig::default(), deadline)
        .expect("resolve and create QP");
    ep.connect(&[], deadline).expect("connect");
    ep
}
