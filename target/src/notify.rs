//! systemd's readiness protocol (sd_notify(3), through the `sd-notify` crate) for a daemon run
//! with `Type=notify`: `STATUS=` while volumes load, `EXTEND_TIMEOUT_USEC=` before each
//! durable volume's load, `READY=1` once the listener accepts connections, `RELOADING=1`
//! around a reload, `STOPPING=1` at shutdown. Without `NOTIFY_SOCKET` (not started by systemd
//! with `Type=notify`) every call does nothing; a failure to notify is logged, never fatal.
//!
//! The server library does not call this itself: `rblk-target` passes [`progress`] to
//! [`crate::server::Server::start_with`] and [`crate::server::Running::reload_with`].

use std::time::Duration;

use sd_notify::NotifyState;

use crate::start::Progress;

/// The fd store name of a handover's state record (a sealed memfd holding its JSON): the last
/// descriptor a handover stores, after which [`store_fd`] waits for the service manager (see
/// [`crate::handover`]).
pub const STATE_FDNAME: &str = "rblk-state";

/// How long the service manager should wait for a durable volume of `size` bytes to load:
/// 60 s (opening the backing store, mapping and populating the memory, a slow first read),
/// plus 15 s per started GiB, which covers a backing store read at 70 MiB/s, well below what
/// a disk does alone but about what a busy one or a network block device gives. It replaces
/// `TimeoutStartSec=` (90 s by default) from the moment it is sent, once per volume.
pub fn load_allowance(size: u64) -> Duration {
    Duration::from_secs(60 + 15 * size.div_ceil(1 << 30))
}

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::warn!(error = %e, "cannot notify the service manager (NOTIFY_SOCKET)");
    }
}

/// Reports a volume about to be created or loaded, and for a durable one extends the start
/// (or reload) timeout by [`load_allowance`].
pub fn progress(p: Progress<'_>) {
    match p {
        Progress::Loading { name, index, count, size, durable } => {
            let status = format!("loading volume {name} ({index}/{count})");
            if durable {
                // As text: the crate's ExtendTimeoutUsec holds 32 bits (71 minutes).
                let extend = format!("EXTEND_TIMEOUT_USEC={}", load_allowance(size).as_micros());
                send(&[NotifyState::Status(&status), NotifyState::Custom(&extend)]);
            } else {
                send(&[NotifyState::Status(&status)]);
            }
        }
    }
}

/// The daemon serves: its listener accepts connections.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// A reload begins; [`ready`] ends it. systemd 253 and newer want the monotonic clock with it.
pub fn reloading() {
    let mut states = vec![NotifyState::Reloading, NotifyState::Status("reloading the configuration")];
    if let Ok(now) = NotifyState::monotonic_usec_now() {
        states.push(now);
    }
    send(&states);
}

/// Shutdown begins (disconnecting everyone, then the final flush of `durable_bytes` of durable
/// volumes): the stop timeout is extended by [`load_allowance`] of them, as writing them back
/// takes about as long as loading them.
pub fn stopping(durable_bytes: u64) {
    let status = NotifyState::Status("stopping: disconnecting peers and flushing volumes");
    if durable_bytes == 0 {
        send(&[NotifyState::Stopping, status]);
    } else {
        let extend = format!("EXTEND_TIMEOUT_USEC={}", load_allowance(durable_bytes).as_micros());
        send(&[NotifyState::Stopping, status, NotifyState::Custom(&extend)]);
    }
}

/// Whether a service manager listens (`NOTIFY_SOCKET` is set): only then can `admin handover`
/// use its file descriptor store.
pub fn has_service_manager() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some()
}

/// Puts `fd` in the service manager's file descriptor store as `name` (`FDSTORE=1`). After the
/// handover's state record (the last one sent) it waits, with a barrier (`BARRIER=1`, at most
/// 5 s), until the service manager has read every message, so that none is lost when the
/// daemon exits right after.
pub fn store_fd(name: &str, fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
    use std::os::fd::AsFd as _;
    sd_notify::notify_with_fds(false, &[NotifyState::FdStore, NotifyState::FdName(name)], &[fd])?;
    if name != STATE_FDNAME {
        return Ok(());
    }
    let (r, w) = nix::unistd::pipe()?;
    sd_notify::notify_with_fds(false, &[NotifyState::Custom("BARRIER=1")], &[w.as_fd()])?;
    drop(w);
    // The read end hangs up once the service manager closed its copy of the write end.
    let mut poll = [nix::poll::PollFd::new(r.as_fd(), nix::poll::PollFlags::POLLIN)];
    match nix::poll::poll(&mut poll, nix::poll::PollTimeout::from(5000u16))? {
        0 => Err(std::io::Error::other("the service manager did not answer the barrier within 5 s")),
        _ => Ok(()),
    }
}

/// The `STATUS=` of a serving daemon.
pub fn serving(volumes: usize, addr: std::net::SocketAddr) -> String {
    format!("serving {volumes} volume{} on {addr}", if volumes == 1 { "" } else { "s" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowance_grows_with_the_size() {
        assert_eq!(load_allowance(4096), Duration::from_secs(75));
        assert_eq!(load_allowance(1 << 30), Duration::from_secs(75));
        assert_eq!(load_allowance((1 << 30) + 4096), Duration::from_secs(90));
        assert_eq!(load_allowance(64 << 30), Duration::from_secs(60 + 15 * 64));
    }
}
