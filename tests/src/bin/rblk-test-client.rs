//! A client process for rblk's tests over rxe (a second initiator, one to SIGKILL).
//!
//! ```text
//! rblk-test-client pair URI --mine OFF:LEN:SEED --other OFF:LEN:SEED --barrier DIR
//!     write `mine` with 4 queues at depth 16, then wait until the peer process wrote `other`
//!     (files in DIR), then verify both regions
//! rblk-test-client hammer URI --region OFF:LEN:SEED
//!     write the region over and over until killed; prints "hammering" once I/O runs
//! rblk-test-client open-time URI --count N
//!     connect, OPEN (read-only) and close N sessions one after the other; prints
//!     "open_ms p50 P min MIN max MAX rate R p99 Q" (R: sessions opened and closed per second)
//! rblk-test-client hold URI --sessions N [--qps Q] [--threads T|each] [--per-qp-keepalives] [--unsolicited]
//!     open N read-only sessions, each with Q-1 further queue pairs (JOINs; default Q 1; every
//!     QP keeping keepalives of its own with --per-qp-keepalives, as before session keepalives;
//!     requests not marked as solicited events with --unsolicited, as before them), print
//!     "held N qps M", and keep them alive (the protocol's keepalives, every QP ticked each
//!     second) until stdin closes; a line "grow N" on stdin opens more until N are held, then
//!     prints "held N qps M" again, after "stopped: ERROR" if an open failed (what is held
//!     stays held); a line "status" prints "status held N reconnects R failed F" (reconnects
//!     of the held sessions so far, sessions that gave up); T threads tick the sessions (default
//!     1), `each`: a thread per session, as independent hosts
//! rblk-test-client raw-lat URI --count N [--depth D] [--threads T]
//!     N 4 KiB RDMA READs in all, D at a time (default 1) on each of T queues (default 1, one
//!     thread each), posted and busy-polled straight on the queues' endpoints (the fabric layer
//!     only: no queue slots, engine, wait policy or bench around it); prints the latency as
//!     rblk-bench's JSON report does: {"read": {"ios", "iops", "lat_us": {"min", "p50", "p99"}}}
//! rblk-test-client keyless ADDR:PORT VOLUME
//!     the protocol's keyless sequence, by hand, as a peer without a key speaks it: HELLO (no
//!     features), then OPEN read-write, no AUTH; prints "opened SIZE" and exits 0, or prints
//!     "refused CODE: TEXT" and exits 1
//! rblk-test-client joins ADDR:PORT VOLUME --key-file F --host-id H --count N
//!     one session by hand (HELLO, AUTH as H with the key in F, OPEN read-only), then N further
//!     connections, one after the other, each JOINing it; prints "refusal: TEXT" (an ERROR,
//!     which names the cap) and "failure: TEXT" (a connect or JOIN that failed) once for each
//!     new text, then "joined J refused R failed F", and holds every connection until stdin
//!     closes
//! rblk-test-client reg-time DEVICE --size BYTES
//!     bare registrations: a memfd of BYTES (as a RAM volume is made: its pages allocated and
//!     mapped), registered for memory-window binds in a new PD on DEVICE (one ibv_reg_mr: the
//!     fabric's `Pd::register`) and deregistered; then the same pages mapped afresh and
//!     registered there, as a handover's successor maps (populating the mapping) and registers
//!     them, timed together; prints "reg_ms MS dereg_ms MS fresh_ms MS"
//! rblk-test-client watch ADDR:PORT VOLUME
//!     a bare rdma_cm peer: one connection, HELLO (no keepalives) and a read-only OPEN by hand,
//!     then nothing but a sleep on the connection's descriptors until rdma_cm reports the
//!     target's disconnect; prints "watching", then "disconnected UNIX_SECONDS"
//! rblk-test-client idle URI [--io]
//!     a library user: an engine whose owner sleeps in `Engine::idle_wait` (ticking once a
//!     second), or with --io writes 4 KiB through it without pause, until the session is lost;
//!     prints "idle", then "lost UNIX_SECONDS" (with RUST_LOG set, the library's own loss line
//!     too)
//! rblk-test-client grow-watch URI
//!     a library user while its volume grows: a queue (depth 1, opened before any grow) writes
//!     and reads back 64 KiB pieces at random offsets of the volume as it is (verifying each
//!     read against what was written there, or zeros); prints "ready SIZE", then at each grow
//!     "resized SIZE UNIX_SECONDS" from the library's on_resize hook, then writes and verifies a
//!     piece straddling the old end through that queue and prints "past SIZE UNIX_SECONDS" when
//!     its write completed; on stdin's end "done ios N errors E reconnects R" (an I/O or verify
//!     error is printed as "error TEXT" and counted, not fatal)
//! rblk-test-client ublk-features
//!     the ublk driver's feature bits (UBLK_U_CMD_GET_FEATURES, Linux 6.5 and later); prints
//!     "features 0xBITS NAME..." (the names of ublk_cmd.h without UBLK_F_, BIT_N for a bit libublk
//!     does not name) and "update_size yes|no" (UBLK_F_UPDATE_SIZE: UBLK_U_CMD_UPDATE_SIZE, which
//!     a live ublk resize needs); fails when the driver does not answer
//! ```
//! (`ublk-features` is scripts/kernel-rxe.sh's; `watch` and `idle` are scripts/lost-rxe.sh's; `reg-time` is scripts/handover-rxe.sh's baseline; `open-time` and `hold` are scripts/scale-rxe.sh's and scripts/hosts-rxe.sh's drivers, `raw-lat` compare-rxe.sh's,
//! `keyless` the trust tests', `joins` the JOIN-cap test's attacker in tests/tests/limits.rs.)

use std::path::PathBuf;
use std::process::ExitCode;

use rblk_initiator::{OpenMode, Options, Session};
use rblk_tests::workload::{self, Region};

fn arg(args: &[String], name: &str) -> Result<String, String> {
    args.windows(2).find(|w| w[0] == name).map(|w| w[1].clone()).ok_or(format!("missing {name}"))
}

fn main() -> ExitCode {
    // The initiator's own log (its reconnect attempts and why they failed), only when asked.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let args: Vec<String> = std::env::args().collect();
    let result = match args.get(1).map(String::as_str) {
        Some("pair") => pair(&args),
        Some("hammer") => hammer(&args),
        Some("open-time") => open_time(&args),
        Some("hold") => hold(&args),
        Some("raw-lat") => raw_lat(&args),
        Some("keyless") => keyless(&args),
        Some("joins") => joins(&args),
        Some("reg-time") => reg_time(&args),
        Some("watch") => watch(&args),
        Some("idle") => idle(&args),
        Some("ublk-features") => ublk_features(),
        Some("grow-watch") => grow_watch(&args),
        _ => {
            Err("usage: rblk-test-client pair|hammer|open-time|hold|raw-lat|keyless|joins|reg-time|watch|idle|ublk-features|grow-watch URI ..."
                .into())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rblk-test-client: {e}");
            ExitCode::FAILURE
        }
    }
}

fn open(uri: &str) -> Result<rblk_initiator::Volume, String> {
    let session = Session::connect(uri, &Options::default()).map_err(|e| format!("connect {uri}: {e}"))?;
    session.open(OpenMode::ReadWrite).map_err(|e| format!("open: {e}"))
}

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

fn watch(args: &[String]) -> Result<(), String> {
    let addr: std::net::SocketAddr = args.get(2).ok_or("missing ADDR:PORT")?.parse().map_err(|e| format!("{e}"))?;
    let volume = args.get(3).ok_or("missing VOLUME")?;
    let connect = rblk_proto::ConnectData::NewSession;
    let mut raw = rblk_tests::raw::Raw::connect(rblk_fabric::Fabric::Verbs, addr, connect)
        .map_err(|e| format!("connect {addr}: {}", rblk_fabric::Chain(&e)))?;
    raw.open(volume, OpenMode::ReadOnly);
    println!("watching");
    let mut out = [rblk_fabric::Completion::EMPTY; 4];
    while !raw.ep.peer_gone() {
        // Completions (a KEEPALIVE of the target's) are taken and dropped; the wait also ends
        // when rdma_cm has an event for the connection.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        raw.ep.wait(&mut out, std::time::Duration::ZERO, deadline).map_err(|e| format!("wait: {e}"))?;
    }
    println!("disconnected {:.6}", unix_now());
    Ok(())
}

/// The ublk feature bits by their names in ublk_cmd.h (without `UBLK_F_`), as libublk's copy of
/// the header defines them.
const UBLK_FEATURES: &[(u64, &str)] = {
    use libublk::sys;
    &[
        (sys::UBLK_F_SUPPORT_ZERO_COPY as u64, "SUPPORT_ZERO_COPY"),
        (sys::UBLK_F_URING_CMD_COMP_IN_TASK as u64, "URING_CMD_COMP_IN_TASK"),
        (sys::UBLK_F_NEED_GET_DATA as u64, "NEED_GET_DATA"),
        (sys::UBLK_F_USER_RECOVERY as u64, "USER_RECOVERY"),
        (sys::UBLK_F_USER_RECOVERY_REISSUE as u64, "USER_RECOVERY_REISSUE"),
        (sys::UBLK_F_UNPRIVILEGED_DEV as u64, "UNPRIVILEGED_DEV"),
        (sys::UBLK_F_CMD_IOCTL_ENCODE as u64, "CMD_IOCTL_ENCODE"),
        (sys::UBLK_F_USER_COPY as u64, "USER_COPY"),
        (sys::UBLK_F_ZONED as u64, "ZONED"),
        (sys::UBLK_F_USER_RECOVERY_FAIL_IO as u64, "USER_RECOVERY_FAIL_IO"),
        (sys::UBLK_F_UPDATE_SIZE as u64, "UPDATE_SIZE"),
        (sys::UBLK_F_AUTO_BUF_REG as u64, "AUTO_BUF_REG"),
        (sys::UBLK_F_QUIESCE as u64, "QUIESCE"),
        (sys::UBLK_F_PER_IO_DAEMON as u64, "PER_IO_DAEMON"),
        (sys::UBLK_F_BUF_REG_OFF_DAEMON as u64, "BUF_REG_OFF_DAEMON"),
        (sys::UBLK_F_BATCH_IO as u64, "BATCH_IO"),
        (sys::UBLK_F_INTEGRITY as u64, "INTEGRITY"),
        (sys::UBLK_F_SAFE_STOP_DEV as u64, "SAFE_STOP_DEV"),
        (sys::UBLK_F_NO_AUTO_PART_SCAN as u64, "NO_AUTO_PART_SCAN"),
        (sys::UBLK_F_SHMEM_ZC as u64, "SHMEM_ZC"),
    ]
};

/// The names of the set bits of `bits`, lowest first; `BIT_N` for a bit without a name.
fn ublk_feature_names(bits: u64) -> Vec<String> {
    (0..64)
        .map(|n| 1u64 << n)
        .filter(|b| bits & b != 0)
        .map(|b| match UBLK_FEATURES.iter().find(|(f, _)| *f == b) {
            Some((_, name)) => (*name).to_string(),
            None => format!("BIT_{}", b.trailing_zeros()),
        })
        .collect()
}

fn ublk_features() -> Result<(), String> {
    let bits = libublk::ctrl::UblkCtrl::get_features().ok_or(
        "the ublk driver did not answer UBLK_U_CMD_GET_FEATURES: load it (modprobe ublk_drv) \
         and run as root; kernels before 6.5 do not have the command",
    )?;
    println!("features {bits:#x} {}", ublk_feature_names(bits).join(" "));
    let update = bits & libublk::sys::UBLK_F_UPDATE_SIZE as u64 != 0;
    println!("update_size {}", if update { "yes" } else { "no" });
    Ok(())
}

fn idle(args: &[String]) -> Result<(), String> {
    use rblk_initiator::LinkState;
    let uri = args.get(2).ok_or("missing URI")?;
    let engine = rblk_initiator::Engine::new(open(uri)?, 0).map_err(|e| format!("engine: {e}"))?;
    let counters = engine.counters();
    let io = args.iter().any(|a| a == "--io");
    let (_bell, quiet) = std::os::unix::net::UnixStream::pair().map_err(|e| format!("socketpair: {e}"))?;
    println!("idle");
    let mut n = 0u64;
    while counters.link_state() == LinkState::Connected {
        if io {
            let _ = engine.write_at(&[n as u8; 4096], (n % 1024) * 4096);
            n += 1;
            continue;
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        let _ = engine.idle_wait(std::os::fd::AsFd::as_fd(&quiet), deadline);
        let _ = engine.tick();
    }
    println!("lost {:.6}", unix_now());
    Ok(())
}

fn grow_watch(args: &[String]) -> Result<(), String> {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    const PIECE: u64 = 64 << 10;
    let uri = args.get(2).ok_or("missing URI")?;
    let vol = open(uri)?;
    let grown = Arc::new(AtomicU64::new(0));
    let hook = Arc::clone(&grown);
    vol.on_resize(move |size| {
        // One line, then the I/O thread's straddle: nothing here blocks for long.
        println!("resized {size} {:.6}", unix_now());
        hook.store(size, Ordering::Release);
    });
    let mut q = vol.queue_with(1, PIECE as usize).map_err(|e| format!("queue: {e}"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = Arc::clone(&stop);
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        stopping.store(true, Ordering::Release);
    });
    let mut size = vol.size();
    println!("ready {size}");
    // What each piece holds: the seed it was written with (absent: zeros).
    let mut written: HashMap<u64, u64> = HashMap::new();
    let (mut ios, mut errors, mut x) = (0u64, 0u64, 0x2545_f491_4f6c_dd1du64);
    let one = |q: &mut rblk_initiator::Queue, offset: u64, write: Option<u64>| -> Result<Vec<u8>, String> {
        let mut data = vec![0u8; PIECE as usize];
        match write {
            Some(seed) => {
                workload::pattern(seed, offset, &mut data);
                q.submit_write(offset, &data, 1).map_err(|e| e.to_string())?;
            }
            None => q.submit_read(offset, PIECE as u32, 1).map_err(|e| e.to_string())?,
        }
        let mut done = [rblk_initiator::Done::default()];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while q.wait(&mut done, deadline).map_err(|e| e.to_string())? == 0 {
            if std::time::Instant::now() >= deadline {
                return Err(format!("I/O at {offset} took over 30 s"));
            }
        }
        done[0].result.as_ref().map_err(|e| e.to_string())?;
        if write.is_none() {
            done[0].read_data(&mut data).map_err(|e| e.to_string())?;
        }
        Ok(data)
    };
    let verify = |q: &mut rblk_initiator::Queue, offset: u64, written: &HashMap<u64, u64>| -> Result<(), String> {
        let got = one(q, offset, None)?;
        let mut want = vec![0u8; PIECE as usize];
        if let Some(&seed) = written.get(&offset) {
            workload::pattern(seed, offset, &mut want);
        }
        if got != want {
            return Err(format!("read at {offset} differs from what was written there"));
        }
        Ok(())
    };
    while !stop.load(Ordering::Acquire) {
        let now = grown.load(Ordering::Acquire);
        let result = if now > size {
            // The grow: a piece straddling the old end, written then read back.
            let offset = size - PIECE / 2;
            let seed = ios;
            let r = one(&mut q, offset, Some(seed)).map(|_| {
                println!("past {now} {:.6}", unix_now());
            });
            let old_end = size;
            size = now;
            r.and_then(|()| {
                let got = one(&mut q, offset, None)?;
                let mut want = vec![0u8; PIECE as usize];
                workload::pattern(seed, offset, &mut want);
                if got != want {
                    return Err(format!("the straddling piece at {offset} differs"));
                }
                // The two whole pieces it overlaps written anew, so the map holds again.
                for o in [old_end - PIECE, old_end] {
                    one(&mut q, o, Some(seed ^ o))?;
                    written.insert(o, seed ^ o);
                }
                Ok(())
            })
        } else {
            x = workload::xorshift(x);
            let offset = (x % (size / PIECE)) * PIECE;
            if x & 1 == 0 {
                written.insert(offset, ios);
                one(&mut q, offset, Some(ios)).map(|_| ())
            } else {
                verify(&mut q, offset, &written)
            }
        };
        ios += 1;
        if let Err(e) = result {
            errors += 1;
            println!("error {e}");
        }
    }
    println!("done ios {ios} errors {errors} reconnects {}", vol.reconnects());
    Ok(())
}

fn reg_time(args: &[String]) -> Result<(), String> {
    use rblk_fabric::{Access, Fabric, Memory, Pd};
    let device = args.get(2).ok_or("missing DEVICE")?;
    let size = count(args, "--size")?;
    let memory = Memory::memfd("rblk-reg-time", size).map_err(|e| format!("memfd of {size} bytes: {e}"))?;
    let pd = Pd::alloc(Fabric::Verbs, device).map_err(|e| format!("PD on {device}: {}", rblk_fabric::Chain(&e)))?;
    let t0 = std::time::Instant::now();
    let mr = pd.register(&memory, Access::BIND_ONLY).map_err(|e| format!("register: {}", rblk_fabric::Chain(&e)))?;
    let reg = t0.elapsed();
    let t1 = std::time::Instant::now();
    drop(mr);
    let dereg = t1.elapsed();
    let fd = memory.fd().ok_or("no memfd")?.try_clone_to_owned().map_err(|e| format!("dup: {e}"))?;
    let t2 = std::time::Instant::now();
    let fresh = Memory::from_memfd("rblk-reg-time", fd, size).map_err(|e| format!("mapping afresh: {e}"))?;
    let mr = pd.register(&fresh, Access::BIND_ONLY).map_err(|e| format!("register: {}", rblk_fabric::Chain(&e)))?;
    let fresh_reg = t2.elapsed();
    drop(mr);
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    println!("reg_ms {:.1} dereg_ms {:.1} fresh_ms {:.1}", ms(reg), ms(dereg), ms(fresh_reg));
    Ok(())
}

fn keyless(args: &[String]) -> Result<(), String> {
    let addr: std::net::SocketAddr = args.get(2).ok_or("missing ADDR:PORT")?.parse().map_err(|e| format!("{e}"))?;
    let volume = args.get(3).ok_or("missing VOLUME")?;
    let connect = rblk_proto::ConnectData::NewSession;
    let mut raw = rblk_tests::raw::Raw::connect(rblk_fabric::Fabric::Verbs, addr, connect)
        .map_err(|e| format!("connect {addr}: {e}"))?;
    raw.hello_with(0);
    match raw.open_with(volume, OpenMode::ReadWrite, None) {
        Ok(opened) => {
            println!("opened {}", opened.size);
            Ok(())
        }
        Err((code, text)) => {
            println!("refused {code:?}: {text}");
            Err(format!("OPEN refused: {code:?}: {text}"))
        }
    }
}

fn joins(args: &[String]) -> Result<(), String> {
    use rblk_proto::{ConnectData, Message};
    let addr: std::net::SocketAddr = args.get(2).ok_or("missing ADDR:PORT")?.parse().map_err(|e| format!("{e}"))?;
    let volume = args.get(3).ok_or("missing VOLUME")?;
    let key_file = arg(args, "--key-file")?;
    let key = rblk_fabric::keyfile::read(std::path::Path::new(&key_file)).map_err(|e| format!("{key_file}: {e}"))?;
    let host = arg(args, "--host-id")?;
    let n = count(args, "--count")?;
    let fabric = rblk_fabric::Fabric::Verbs;
    let mut first = rblk_tests::raw::Raw::connect(fabric, addr, ConnectData::NewSession)
        .map_err(|e| format!("connect {addr}: {}", rblk_fabric::Chain(&e)))?;
    first.login(Some(&key), Some(&host)).map_err(|(code, text)| format!("AUTH as {host}: {code:?}: {text}"))?;
    let opened = first.open_with(volume, OpenMode::ReadOnly, None).map_err(|(c, t)| format!("OPEN: {c:?}: {t}"))?;
    let (session_id, token) = (opened.session_id, opened.token);
    let data = ConnectData::Join { session_id, token }.to_bytes();
    let mut join = [0u8; rblk_proto::MSG_SIZE];
    let len = Message::Join { session_id, token }.encode(1, &mut join).map_err(|e| format!("encoding JOIN: {e}"))?;
    // Bounded waits: a connection the target drops unanswered counts as failed, not as a hang.
    let within = std::time::Duration::from_secs(10);
    let mut seen = std::collections::BTreeSet::new();
    let mut note = |text: String| {
        if seen.insert(text.clone()) {
            println!("{text}");
        }
    };
    let (mut held, mut joined, mut refused, mut failed) = (vec![first], 0, 0, 0);
    for _ in 0..n {
        let mut c = match rblk_tests::raw::Raw::connect_bytes(fabric, addr, &data, within) {
            Ok(c) => c,
            Err(e) => {
                failed += 1;
                note(format!("failure: connect: {}", rblk_fabric::Chain(&e)));
                continue;
            }
        };
        let reply = if c.try_send_bytes(&join[..len]) { c.try_reply(within) } else { None };
        match reply.as_deref().map(rblk_proto::parse) {
            Some(Ok((_, Message::Joined { .. } | Message::Ok { .. }))) => joined += 1,
            Some(Ok((_, Message::Error { code, text }))) => {
                refused += 1;
                note(format!("refusal: {code:?}: {text}"));
            }
            other => {
                failed += 1;
                note(format!("failure: JOIN answered with {other:?}"));
            }
        }
        held.push(c);
    }
    println!("joined {joined} refused {refused} failed {failed}");
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
    drop(held);
    Ok(())
}

fn pair(args: &[String]) -> Result<(), String> {
    let uri = args.get(2).ok_or("missing URI")?;
    let mine: Region = arg(args, "--mine")?.parse()?;
    let other: Region = arg(args, "--other")?.parse()?;
    let barrier = PathBuf::from(arg(args, "--barrier")?);
    let vol = open(uri)?;
    workload::pair(&vol, mine, other, &barrier)?;
    println!("verified {mine} and {other}");
    Ok(())
}

fn hammer(args: &[String]) -> Result<(), String> {
    let uri = args.get(2).ok_or("missing URI")?;
    let region: Region = arg(args, "--region")?.parse()?;
    let vol = open(uri)?;
    println!("hammering");
    loop {
        workload::run(workload::queues(&vol, 2, 16), region, false)?;
    }
}

fn count(args: &[String], name: &str) -> Result<usize, String> {
    let text = arg(args, name)?;
    text.parse().ok().filter(|&n| n > 0).ok_or(format!("{name} {text:?}: expected a positive number"))
}

fn open_ro(uri: &str) -> Result<rblk_initiator::Volume, String> {
    open_ro_with(uri, &Options::default())
}

fn open_ro_with(uri: &str, opts: &Options) -> Result<rblk_initiator::Volume, String> {
    let session = Session::connect(uri, opts).map_err(|e| format!("connect {uri}: {e}"))?;
    session.open(OpenMode::ReadOnly).map_err(|e| format!("open: {e}"))
}

fn open_time(args: &[String]) -> Result<(), String> {
    let uri = args.get(2).ok_or("missing URI")?;
    let n = count(args, "--count")?;
    let started = std::time::Instant::now();
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = std::time::Instant::now();
        let vol = open_ro(uri)?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        vol.close().map_err(|e| format!("close: {e}"))?;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    ms.sort_by(f64::total_cmp);
    println!(
        "open_ms p50 {:.1} min {:.1} max {:.1} rate {rate:.2} p99 {:.1}",
        ms[n / 2],
        ms[0],
        ms[n - 1],
        ms[(n * 99 / 100).min(n - 1)]
    );
    Ok(())
}

fn raw_lat(args: &[String]) -> Result<(), String> {
    let uri = args.get(2).ok_or("missing URI")?;
    let n = count(args, "--count")?;
    let depth = if args.iter().any(|a| a == "--depth") { count(args, "--depth")? } else { 1 };
    let threads = if args.iter().any(|a| a == "--threads") { count(args, "--threads")? } else { 1 };
    let vol = open_ro(uri)?;
    let queues = (0..threads)
        .map(|_| vol.queue(depth as u32).map_err(|e| format!("queue: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let span = vol.size().min(256 << 20) / 4096;
    let started = std::time::Instant::now();
    let results: Vec<Result<Vec<f64>, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = queues
            .into_iter()
            .enumerate()
            .map(|(t, mut q)| {
                let vol = &vol;
                s.spawn(move || raw_reads(vol, &mut q, span, depth, n.div_ceil(threads), t as u64))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into()))).collect()
    });
    let wall = started.elapsed().as_secs_f64();
    let mut us = Vec::new();
    for r in results {
        us.extend(r?);
    }
    us.sort_by(f64::total_cmp);
    let ios = us.len();
    println!(
        r#"{{"read": {{"ios": {ios}, "iops": {:.1}, "lat_us": {{"min": {:.3}, "p50": {:.3}, "p99": {:.3}}}}}}}"#,
        ios as f64 / wall,
        us[0],
        us[ios / 2],
        us[ios * 99 / 100]
    );
    Ok(())
}

/// `n` 4 KiB READs at random blocks of the first `span` blocks, `depth` in flight, posted and
/// busy-polled on `q`'s endpoint; returns each one's latency in microseconds.
fn raw_reads(
    vol: &rblk_initiator::Volume,
    q: &mut rblk_initiator::Queue,
    span: u64,
    depth: usize,
    n: usize,
    seed: u64,
) -> Result<Vec<f64>, String> {
    use rblk_fabric::{Access, Completion, Local, Memory, Op, WorkRequest};
    const TAG: u64 = 1 << 40;
    let (raddr, rkey) = q.remote();
    let buf = vol
        .pd()
        .register(&Memory::anonymous(4096 * depth).map_err(|e| e.to_string())?, Access::LOCAL)
        .map_err(|e| e.to_string())?;
    let mut out = [Completion::EMPTY; 32];
    let mut us = Vec::with_capacity(n);
    let mut posted_at = vec![std::time::Instant::now(); depth];
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ seed.wrapping_mul(0xD1B5_4A32_D192_ED03);
    let (mut issued, mut in_flight) = (0usize, 0usize);
    let mut free: Vec<usize> = (0..depth).collect();
    while us.len() < n {
        while in_flight < depth && issued < n {
            let slot = free.pop().ok_or("no free slot")?;
            x = workload::xorshift(x);
            let wr = WorkRequest {
                wr_id: TAG + slot as u64,
                op: Op::Read { remote_addr: raddr + (x % span) * 4096, rkey },
                local: Local::Region { mr: &buf, offset: slot * 4096, len: 4096 },
                signaled: true,
            };
            posted_at[slot] = std::time::Instant::now();
            q.endpoint_mut().post(&[wr]).map_err(|e| format!("post: {e}"))?;
            issued += 1;
            in_flight += 1;
        }
        let got = q.endpoint_mut().poll(&mut out).map_err(|e| format!("poll: {e}"))?;
        // The queue's own control traffic (the target's keepalives), and its keepalives: a run
        // longer than the keepalive timeout was cut without this.
        q.raw_polled(&out[..got]);
        for c in &out[..got] {
            let Some(slot) = c.wr_id.checked_sub(TAG).map(|s| s as usize).filter(|&s| s < depth) else {
                continue; // the queue's, handed to it above
            };
            c.ok().map_err(|e| format!("read: {e}"))?;
            us.push(posted_at[slot].elapsed().as_secs_f64() * 1e6);
            free.push(slot);
            in_flight -= 1;
        }
    }
    Ok(us)
}

/// One session held by `hold`: its volume (the first QP) and its JOINed queues.
struct Held {
    vol: rblk_initiator::Volume,
    queues: Vec<rblk_initiator::Queue>,
    /// Each queue's QP number when last ticked: a new one means it rejoined the session.
    qpns: Vec<u32>,
    /// Queues that rejoined so far.
    rejoins: u64,
    /// What this session has added to its shard's totals so far.
    added: Counts,
}

/// What `hold`'s status reports, summed over sessions: reconnects of the sessions, queues that
/// rejoined a reconnected session (a new QP), sessions that gave up.
#[derive(Default, Clone, Copy, PartialEq, Eq)]
struct Counts {
    reconnects: u64,
    rejoins: u64,
    failed: u64,
}

/// A tick thread's sessions and its running totals, which the status reads without waiting for
/// the thread (it may be reconnecting its sessions one after another).
#[derive(Default)]
struct Shard {
    held: std::sync::Mutex<Vec<Held>>,
    reconnects: std::sync::atomic::AtomicU64,
    rejoins: std::sync::atomic::AtomicU64,
    failed: std::sync::atomic::AtomicU64,
}

impl Held {
    /// A read-only session with `qps - 1` further queue pairs of depth 1 and one 4 KiB buffer
    /// (an idle peer's smallest footprint).
    fn open(uri: &str, qps: usize, opts: &Options) -> Result<Held, String> {
        let vol = open_ro_with(uri, opts)?;
        let queues = (1..qps)
            .map(|_| vol.queue_with(1, 4096).map_err(|e| format!("JOIN: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let qpns = queues.iter().map(rblk_initiator::Queue::qp_num).collect();
        Ok(Held { vol, queues, qpns, rejoins: 0, added: Counts::default() })
    }

    /// Takes what arrived and sends the KEEPALIVEs due, on every QP of the session (and
    /// reconnects it, and rejoins its queues, after a loss).
    fn tick(&mut self) -> Result<(), String> {
        for (q, qpn) in self.queues.iter_mut().zip(&mut self.qpns) {
            q.tick();
            if q.qp_num() != *qpn {
                *qpn = q.qp_num();
                self.rejoins += 1;
            }
        }
        match self.vol.keepalive() {
            // While the session reconnects there is nobody to send to (after a target restart
            // the new daemon may take seconds to listen): it goes on until it gives up.
            Err(_) if !self.vol.failed() => Ok(()),
            r => r.map_err(|e| format!("keepalive: {e}")),
        }
    }

    /// Its counts now.
    fn counts(&self) -> Counts {
        Counts { reconnects: self.vol.reconnects(), rejoins: self.rejoins, failed: u64::from(self.vol.failed()) }
    }
}

impl Shard {
    /// Ticks every session of the shard, adding what changed to its totals.
    fn tick(&self) -> Result<(), String> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for h in held.iter_mut() {
            h.tick()?;
            let (now, before) = (h.counts(), h.added);
            h.added = now;
            self.reconnects.fetch_add(now.reconnects.saturating_sub(before.reconnects), Relaxed);
            self.rejoins.fetch_add(now.rejoins.saturating_sub(before.rejoins), Relaxed);
            self.failed.fetch_add(now.failed.saturating_sub(before.failed), Relaxed);
        }
        Ok(())
    }

    fn add(&self, h: Held) {
        self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(h);
    }
}

fn hold(args: &[String]) -> Result<(), String> {
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    // Ticked every second: the target ends a connection it has not heard from for 15 s.
    const TICK: Duration = Duration::from_secs(1);
    let uri = args.get(2).ok_or("missing URI")?;
    let n = count(args, "--sessions")?;
    let qps = if args.iter().any(|a| a == "--qps") { count(args, "--qps")? } else { 1 };
    // Tick threads, each with its share of the sessions: after a target's loss each reconnects
    // its sessions one after another, so with one thread the client, not the target, would set
    // the pace of a reconnect storm (as hundreds of hosts reconnecting at once would not).
    // `--threads each`: a thread per session, as independent hosts. With fewer, a thread busy
    // reconnecting its sessions one after another ticks none of the others meanwhile: once that
    // takes longer than the target's keepalive timeout, the target ends the sessions it already
    // reconnected as silent, and they reconnect again (a storm the client itself prolongs).
    let each = args.windows(2).any(|w| w[0] == "--threads" && w[1] == "each");
    let threads = if each {
        0
    } else if args.iter().any(|a| a == "--threads") {
        count(args, "--threads")?
    } else {
        1
    };
    // Every QP keeps its own keepalives (as before session keepalives): what they save is
    // measured against this.
    let per_qp = args.iter().any(|a| a == "--per-qp-keepalives");
    // Requests not marked as solicited events (`FEATURE_SOLICITED` not offered): the target
    // wakes for every completion, as before; what the feature saves is measured against this.
    let unsolicited = args.iter().any(|a| a == "--unsolicited");
    let opts = Options { session_keepalives: !per_qp, solicited_events: !unsolicited, ..Options::default() };
    // The first error of a tick thread: the client reports it and exits.
    let (err_tx, err_rx) = mpsc::channel::<String>();
    let mut shards: Vec<Arc<Shard>> = Vec::new();
    let add_shard = |shards: &mut Vec<Arc<Shard>>| {
        let shard = Arc::new(Shard::default());
        shards.push(Arc::clone(&shard));
        let err_tx = err_tx.clone();
        std::thread::spawn(move || loop {
            let next = Instant::now() + TICK;
            if let Err(e) = shard.tick() {
                let _ = err_tx.send(e);
                return;
            }
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        });
    };
    for _ in 0..threads {
        add_shard(&mut shards);
    }
    // Where the next session goes: a shard of its own with `each`, else round robin.
    let place = |shards: &mut Vec<Arc<Shard>>, placed: usize, h: Held| {
        if each {
            add_shard(shards);
            shards[placed].add(h);
        } else {
            shards[placed % threads].add(h);
        }
    };
    let mut placed = 0usize;
    for _ in 0..n {
        place(&mut shards, placed, Held::open(uri, qps, &opts)?);
        placed += 1;
    }
    println!("held {placed} qps {}", placed * qps);
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    loop {
        if let Ok(e) = err_rx.try_recv() {
            return Err(e);
        }
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) if line == "status" => {
                let sum = |f: fn(&Shard) -> u64| shards.iter().map(|s| f(s)).sum::<u64>();
                let reconnects = sum(|s| s.reconnects.load(Relaxed));
                let failed = sum(|s| s.failed.load(Relaxed));
                let rejoins = sum(|s| s.rejoins.load(Relaxed));
                println!("status held {placed} reconnects {reconnects} failed {failed} rejoins {rejoins}");
            }
            Ok(line) => {
                let want: usize = line
                    .strip_prefix("grow ")
                    .and_then(|w| w.trim().parse().ok())
                    .ok_or(format!("stdin: {line:?}: expected \"grow N\" or \"status\""))?;
                while placed < want {
                    match Held::open(uri, qps, &opts) {
                        Ok(h) => {
                            place(&mut shards, placed, h);
                            placed += 1;
                        }
                        Err(e) => {
                            println!("stopped: {e}");
                            break;
                        }
                    }
                }
                println!("held {placed} qps {}", placed * qps);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 44 item 4: scripts/kernel-rxe.sh reports from these names whether a kernel's ublk
    /// driver can resize a live device (UPDATE_SIZE, bit 10 of ublk_cmd.h). A table off by a bit
    /// would call BATCH_IO (bit 15, which the brief first guessed) or AUTO_BUF_REG "UPDATE_SIZE"
    /// and send the grow feature's test to a kernel that refuses UBLK_U_CMD_UPDATE_SIZE; a bit
    /// libublk does not name must still show, not vanish.
    #[test]
    fn ublk_feature_bits_have_the_headers_names() {
        assert_eq!(ublk_feature_names(1 << 10), ["UPDATE_SIZE"]);
        assert_eq!(ublk_feature_names(1 << 15), ["BATCH_IO"]);
        assert_eq!(
            ublk_feature_names((1 << 3) | (1 << 4) | (1 << 40)),
            ["USER_RECOVERY", "USER_RECOVERY_REISSUE", "BIT_40"]
        );
        assert!(ublk_feature_names(0).is_empty());
        // Every named bit is one bit, and no two share one.
        for (i, (bit, name)) in UBLK_FEATURES.iter().enumerate() {
            assert_eq!(bit.count_ones(), 1, "{name}");
            assert_eq!(bit.trailing_zeros() as usize, i, "{name} is not bit {i}");
        }
    }
}
