//! A bare control-channel client on the fabric, for tests that must send what the initiator
//! library never would (malformed messages, wrong versions, raw one-sided access).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rblk_fabric::channel::{self, Channel, Event};
use rblk_fabric::{Access, Completion, Endpoint, Fabric, Local, Memory, Op, QpConfig, Route, WcStatus, WorkRequest};
use rblk_proto::{ConnectData, ErrorCode, Message, OpenMode, Opened, Resume, MSG_SIZE};

/// One QP speaking the control protocol by hand.
#[derive(Debug)]
pub struct Raw {
    /// The endpoint (post raw READ/WRITE on it).
    pub ep: Endpoint,
    channel: Channel,
    buf: [u8; MSG_SIZE],
    tag: u32,
}

const STEP: Duration = Duration::from_secs(30);

/// Runs `connect` again while the target rejects it busy (`rblk_proto::RejectData::Busy`),
/// after the time it asks, for at most [`STEP`] in all.
fn until_admitted(mut connect: impl FnMut() -> rblk_fabric::Result<Raw>) -> rblk_fabric::Result<Raw> {
    let deadline = Instant::now() + STEP;
    loop {
        let err = match connect() {
            Err(e) => e,
            ok => return ok,
        };
        let Some(after) = rblk_initiator::busy_after(&err) else { return Err(err) };
        let pause = after.max(Duration::from_millis(1));
        if Instant::now() + pause >= deadline {
            return Err(err);
        }
        std::thread::sleep(pause);
    }
}

/// A control channel on `ep` whose every request is solicited (`FEATURE_SOLICITED`): harmless to
/// a target that wakes for every completion, and needed by one that, past OPENED with the bit
/// negotiated, wakes only for solicited ones (an unflagged request would wait for its next timer).
fn solicited_channel(ep: &Endpoint) -> rblk_fabric::Result<Channel> {
    let mut channel = Channel::new(&ep.pd())?;
    channel.solicit(true);
    Ok(channel)
}

impl Raw {
    /// Connects with `connect` data on `fabric`; a target busy admitting others is asked again
    /// when it says (as initiators do), within the step's 30 s.
    pub fn connect(fabric: Fabric, addr: SocketAddr, connect: ConnectData) -> rblk_fabric::Result<Raw> {
        until_admitted(|| Raw::connect_bytes(fabric, addr, &connect.to_bytes(), STEP))
    }

    /// Connects with any private data (connect data no initiator would send), giving up after
    /// `within`.
    pub fn connect_bytes(fabric: Fabric, addr: SocketAddr, data: &[u8], within: Duration) -> rblk_fabric::Result<Raw> {
        Raw::connect_sized(fabric, addr, data, within, &QpConfig::default())
    }

    /// [`Raw::connect_bytes`] with a QP sized by `cfg` (a deep send queue, to flood the target).
    pub fn connect_sized(
        fabric: Fabric,
        addr: SocketAddr,
        data: &[u8],
        within: Duration,
        cfg: &QpConfig,
    ) -> rblk_fabric::Result<Raw> {
        Raw::connect_routed(fabric, addr, data, within, cfg, &Route::default())
    }

    /// [`Raw::connect`] from the local address `source`: the peer address the target sees.
    pub fn connect_from(
        fabric: Fabric,
        addr: SocketAddr,
        source: std::net::IpAddr,
        connect: ConnectData,
    ) -> rblk_fabric::Result<Raw> {
        let route = Route { source: Some(source), ..Route::default() };
        until_admitted(|| Raw::connect_routed(fabric, addr, &connect.to_bytes(), STEP, &QpConfig::default(), &route))
    }

    fn connect_routed(
        fabric: Fabric,
        addr: SocketAddr,
        data: &[u8],
        within: Duration,
        cfg: &QpConfig,
        route: &Route,
    ) -> rblk_fabric::Result<Raw> {
        let deadline = Instant::now() + within;
        let mut ep = Endpoint::resolve(fabric, addr, None, route, cfg, deadline)?;
        let mut channel = solicited_channel(&ep)?;
        channel.post_recvs(&mut ep)?;
        ep.connect(data, deadline)?;
        Ok(Raw { ep, channel, buf: [0; MSG_SIZE], tag: 0 })
    }

    /// Connects like [`Raw::connect`] but posts no RECVs: every SEND of the target to it stalls,
    /// as to a peer that stopped reposting its receives.
    pub fn connect_without_recvs(fabric: Fabric, addr: SocketAddr, connect: ConnectData) -> rblk_fabric::Result<Raw> {
        let deadline = Instant::now() + STEP;
        let mut ep = Endpoint::resolve(fabric, addr, None, &Route::default(), &QpConfig::default(), deadline)?;
        let channel = solicited_channel(&ep)?;
        ep.connect(&connect.to_bytes(), deadline)?;
        Ok(Raw { ep, channel, buf: [0; MSG_SIZE], tag: 0 })
    }

    /// Sends raw bytes as one SEND (solicited, as every request of this client).
    pub fn send_bytes(&mut self, bytes: &[u8]) {
        self.ep
            .post(&[WorkRequest { wr_id: 1, op: Op::SendSolicited, local: Local::Inline(bytes), signaled: false }])
            .expect("post raw send");
    }

    /// From now on its control channel's SENDs carry no solicited-event flag (as a peer that
    /// negotiated `FEATURE_SOLICITED` and breaks its word): a target armed for solicited
    /// completions only is not woken by them.
    pub fn unsolicited(&mut self) {
        self.channel.solicit(false);
    }

    /// Sends `msg` and returns the next non-keepalive reply as owned bytes. With every send
    /// buffer in flight (after a burst), it first waits for SENDs to complete, within 30 s.
    pub fn request(&mut self, msg: &Message<'_>) -> Vec<u8> {
        self.tag += 1;
        let deadline = Instant::now() + STEP;
        loop {
            match self.channel.send(&mut self.ep, self.tag, msg) {
                Ok(()) => break,
                Err(rblk_fabric::Error::QueueFull { .. }) if Instant::now() < deadline => {
                    let mut out = [Completion::EMPTY; 8];
                    let n = self.ep.wait(&mut out, Duration::from_micros(20), deadline).expect("wait");
                    for c in out[..n].iter().filter(|c| channel::is_control(c.wr_id)) {
                        let got = self.on_control(c).expect("control completion");
                        assert!(got.is_none(), "a message arrived before the request was sent: {got:?}");
                    }
                }
                Err(e) => panic!("send request: {e}"),
            }
        }
        self.reply()
    }

    /// The next received message other than KEEPALIVE, as bytes (parse with rblk_proto::parse).
    pub fn reply(&mut self) -> Vec<u8> {
        let deadline = Instant::now() + STEP;
        let mut out = [Completion::EMPTY; 8];
        loop {
            let n = self.ep.wait(&mut out, Duration::from_micros(20), deadline).expect("wait");
            assert!(n > 0 || Instant::now() < deadline, "no reply within {STEP:?}");
            for c in &out[..n] {
                if !channel::is_control(c.wr_id) {
                    c.ok().expect("raw send completed");
                    continue;
                }
                if let Some(bytes) = self.on_control(c).expect("control completion") {
                    return bytes;
                }
            }
        }
    }

    /// Hands the control channel's completion `c` to it (a SEND's frees its slot, a RECV's is
    /// reposted): the message received, unless it is none or a KEEPALIVE.
    fn on_control(&mut self, c: &Completion) -> rblk_fabric::Result<Option<Vec<u8>>> {
        match self.channel.on_completion(&mut self.ep, c, &mut self.buf)? {
            Event::Sent => Ok(None),
            Event::Received(len) => {
                let bytes = &self.buf[..len];
                Ok((!matches!(rblk_proto::parse(bytes), Ok((_, Message::Keepalive)))).then(|| bytes.to_vec()))
            }
        }
    }

    /// Waits for the completion of this QP's own work request `wr_id` (a raw READ or WRITE),
    /// reaping the control channel's completions that come before it. A SEND's completion can
    /// arrive after the reply that answered it ([`Raw::reply`] returns at the reply), so the next
    /// completion on the CQ is not necessarily the raw request's: taking it for that would report
    /// a stale SUCCESS for an access the target refused. Err if waiting on the CQ fails; panics
    /// on a message that arrives meanwhile (nothing here asked for one) and after 30 s.
    /// A one-sided READ of 4 KiB at `remote_addr` under `rkey` on this QP: the completion's
    /// status, or the post's error (a QP the target already tore down).
    pub fn read_block(&mut self, remote_addr: u64, rkey: u32) -> rblk_fabric::Result<WcStatus> {
        let buf = self.ep.pd().register(&Memory::anonymous(4096)?, Access::LOCAL)?;
        let local = Local::Region { mr: &buf, offset: 0, len: 4096 };
        self.ep.post(&[WorkRequest { wr_id: 9, op: Op::Read { remote_addr, rkey }, local, signaled: true }])?;
        Ok(self.wait_for(9)?.status)
    }

    pub fn wait_for(&mut self, wr_id: u64) -> rblk_fabric::Result<Completion> {
        assert!(!channel::is_control(wr_id), "wr_id {wr_id:#x} is one of the control channel's");
        let deadline = Instant::now() + STEP;
        let mut out = [Completion::EMPTY; 1];
        loop {
            let n = self.ep.wait(&mut out, Duration::from_micros(50), deadline)?;
            assert!(n > 0 || Instant::now() < deadline, "no completion of wr_id {wr_id} within {STEP:?}");
            let Some(c) = out[..n].first() else { continue };
            if c.wr_id == wr_id {
                return Ok(*c);
            }
            assert!(channel::is_control(c.wr_id), "a completion of wr_id {:#x} while waiting for {wr_id}", c.wr_id);
            // A SEND's completion frees its slot; a RECV flushed by a failed QP is an error the
            // raw request's own completion (which came first) already reported.
            if let Ok(Some(bytes)) = self.on_control(c) {
                panic!("a message arrived while waiting for wr_id {wr_id}: {:?}", rblk_proto::parse(&bytes));
            }
        }
    }

    /// SENDs `bytes` (any content, at most MSG_SIZE) through the control channel; false if the
    /// connection is gone or its send queue stays full.
    pub fn try_send_bytes(&mut self, bytes: &[u8]) -> bool {
        for _ in 0..2 {
            match self.channel.send_bytes(&mut self.ep, bytes) {
                Ok(()) => return true,
                Err(rblk_fabric::Error::QueueFull { .. }) => {
                    // Reap the completed SENDs (and drop whatever arrived meanwhile).
                    let _ = self.try_reply(Duration::from_millis(10));
                }
                Err(_) => return false,
            }
        }
        false
    }

    /// The next received message other than KEEPALIVE within `within`, as bytes; None on a
    /// timeout or once the connection failed.
    pub fn try_reply(&mut self, within: Duration) -> Option<Vec<u8>> {
        let deadline = Instant::now() + within;
        let mut out = [Completion::EMPTY; 8];
        loop {
            let n = self.ep.wait(&mut out, Duration::from_micros(20), deadline).ok()?;
            if n == 0 && Instant::now() >= deadline {
                return None;
            }
            for c in &out[..n] {
                if !channel::is_control(c.wr_id) {
                    continue;
                }
                if let Some(bytes) = self.on_control(c).ok()? {
                    return Some(bytes);
                }
            }
        }
    }

    /// Waits (at most `within`) for a KEEPALIVE from the target, dropping whatever else
    /// arrives; false if none came (or the connection failed).
    pub fn keepalive(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut out = [Completion::EMPTY; 8];
        while Instant::now() < deadline {
            let Ok(n) = self.ep.wait(&mut out, Duration::from_micros(20), deadline) else { return false };
            for c in out[..n].iter().filter(|c| channel::is_control(c.wr_id)) {
                match self.channel.on_completion(&mut self.ep, c, &mut self.buf) {
                    Ok(Event::Received(len))
                        if matches!(rblk_proto::parse(&self.buf[..len]), Ok((_, Message::Keepalive))) =>
                    {
                        return true
                    }
                    Ok(_) => {}
                    Err(_) => return false,
                }
            }
        }
        false
    }

    /// STATS (on an open session): the reply, or a panic naming what came instead.
    pub fn stats(&mut self) -> rblk_proto::StatsReply {
        match rblk_proto::parse(&self.request(&Message::Stats)) {
            Ok((_, Message::StatsReply(s))) => s,
            other => panic!("STATS answered with {other:?}"),
        }
    }

    /// HELLO announcing `features`; returns the features the target's CHALLENGE announces.
    pub fn hello_with(&mut self, features: u64) -> u64 {
        let challenge = self.request(&Message::Hello { features });
        match rblk_proto::parse(&challenge) {
            Ok((_, Message::Challenge { features, .. })) => features,
            other => panic!("HELLO answered with {other:?}"),
        }
    }

    /// HELLO announcing `features`; returns CHALLENGE's nonce.
    pub fn challenge(&mut self, features: u64) -> [u8; rblk_proto::NONCE_LEN] {
        let challenge = self.request(&Message::Hello { features });
        match rblk_proto::parse(&challenge) {
            Ok((_, Message::Challenge { nonce, .. })) => nonce,
            other => panic!("HELLO answered with {other:?}"),
        }
    }

    /// AUTH with `mac` and `host` (after HELLO): Ok, or the ERROR's code and text.
    pub fn auth_with(&mut self, mac: [u8; rblk_proto::MAC_LEN], host: Option<&str>) -> Result<(), (ErrorCode, String)> {
        let reply = self.request(&Message::Auth { mac, host });
        match rblk_proto::parse(&reply) {
            Ok((_, Message::Ok { .. })) => Ok(()),
            Ok((_, Message::Error { code, text })) => Err((code, text.to_owned())),
            other => panic!("AUTH answered with {other:?}"),
        }
    }

    /// HELLO (every feature but keepalive) and AUTH as `host` with `key` (zeros without one).
    pub fn login(&mut self, key: Option<&[u8]>, host: Option<&str>) -> Result<(), (ErrorCode, String)> {
        let nonce = self.challenge(rblk_proto::FEATURES & !rblk_proto::FEATURE_KEEPALIVE);
        let mac = key.map_or([0; rblk_proto::MAC_LEN], |k| rblk_proto::auth_mac(k, &nonce, host).expect("mac"));
        self.auth_with(mac, host)
    }

    /// OPEN `name` with `mode`, replacing the session `resume` names (after HELLO): OPENED, or
    /// the ERROR's code and text.
    pub fn open_with(
        &mut self,
        name: &str,
        mode: OpenMode,
        resume: Option<Resume>,
    ) -> Result<Opened, (ErrorCode, String)> {
        let reply = self.request(&Message::Open { mode, name, resume });
        match rblk_proto::parse(&reply) {
            Ok((_, Message::Opened(o))) => Ok(o),
            Ok((_, Message::Error { code, text })) => Err((code, text.to_owned())),
            other => panic!("OPEN {name} answered with {other:?}"),
        }
    }

    /// HELLO, then OPEN `name` with `mode`; returns the OPENED reply. Announces every feature
    /// but keepalive: this client sends nothing unasked, and the target would end a connection
    /// that promised keepalives and stayed silent.
    pub fn open(&mut self, name: &str, mode: OpenMode) -> Opened {
        self.hello_with(rblk_proto::FEATURES & !rblk_proto::FEATURE_KEEPALIVE);
        self.open_with(name, mode, None).unwrap_or_else(|e| panic!("OPEN {name} refused: {e:?}"))
    }
}

/// The target side of [`Raw`]: accepts the connection `req` (a control channel on a QP of
/// `pd`) and answers each control message it receives with what `reply` returns for it (None:
/// no answer), until the peer goes or nothing arrives for `idle`. For tests that play a target
/// no rblk-target would be (an older one, a rogue one).
pub fn serve_scripted<'r>(
    req: rblk_fabric::Request,
    pd: &rblk_fabric::Pd,
    conn: u64,
    idle: Duration,
    mut reply: impl FnMut(&Message<'_>) -> Option<Message<'r>>,
) {
    let cfg = QpConfig { send_depth: 18, recv_depth: 16, max_inline: 128 };
    let Ok(mut ep) = req.into_endpoint(pd, &cfg, conn) else { return };
    let Ok(mut chan) = Channel::new(pd) else { return };
    if chan.post_recvs(&mut ep).is_err() || ep.accept().is_err() {
        return;
    }
    let mut out = [Completion::EMPTY; 8];
    let mut buf = [0u8; MSG_SIZE];
    loop {
        let Ok(n) = ep.wait(&mut out, Duration::ZERO, Instant::now() + idle) else { return };
        if n == 0 {
            return;
        }
        for c in out[..n].iter().filter(|c| channel::is_control(c.wr_id)) {
            let Ok(Event::Received(len)) = chan.on_completion(&mut ep, c, &mut buf) else {
                continue;
            };
            let Ok((tag, msg)) = rblk_proto::parse(&buf[..len]) else { return };
            let Some(answer) = reply(&msg) else { continue };
            if chan.send(&mut ep, tag, &answer).is_err() {
                return;
            }
        }
    }
}

/// A scripted target for one connection on the in-memory fabric (a fresh loopback address):
/// [`serve_scripted`] answers it with `reply`. Returns the address to connect to.
pub fn scripted_target(reply: impl FnMut(&Message<'_>) -> Option<Message<'static>> + Send + 'static) -> SocketAddr {
    let listener = rblk_fabric::Listener::bind(Fabric::Mem, "127.0.0.1:0".parse().expect("loopback"), None)
        .expect("a scripted target listens");
    let addr = listener.local_addr().expect("its address");
    std::thread::spawn(move || {
        let Ok(Some(rblk_fabric::ListenerEvent::Request(req))) = listener.next_event(Some(Instant::now() + STEP))
        else {
            return;
        };
        let Ok(pd) = req.alloc_pd() else { return };
        serve_scripted(req, &pd, 0, STEP, reply);
    });
    addr
}
