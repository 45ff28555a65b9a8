//! Descriptors handed between processes: over a unix stream socket (SCM_RIGHTS, with
//! [`send`] and [`recv`]) and from the service manager at start (`LISTEN_FDS`, with
//! [`listen_fds`]). A target hands its volumes' memfds and backing stores to its successor this
//! way (the target's `handover` module).
//!
//! Received descriptors come back as [`OwnedFd`]s, so they are closed when dropped; turning the
//! kernel's raw numbers into owned ones is the part that needs `unsafe`, and it lives here.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

/// The most descriptors one [`send`] carries (the kernel's SCM_MAX_FD is 253).
pub const MAX_FDS: usize = 250;

/// Sends `bytes` with `fds` attached (at most [`MAX_FDS`]) in one message: the descriptors
/// arrive with the first of those bytes the peer reads with [`recv`].
pub fn send(stream: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::other(format!("{} descriptors in one message: at most {MAX_FDS}", fds.len())));
    }
    if bytes.is_empty() {
        return Err(io::Error::other("a message with descriptors needs at least one byte"));
    }
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let cmsgs = if raw.is_empty() { vec![] } else { vec![ControlMessage::ScmRights(&raw)] };
    let mut sent = sendmsg::<()>(stream.as_raw_fd(), &[IoSlice::new(bytes)], &cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
    // The descriptors went with the first part; the rest is plain data.
    while sent < bytes.len() {
        sent += sendmsg::<()>(stream.as_raw_fd(), &[IoSlice::new(&bytes[sent..])], &[], MsgFlags::MSG_NOSIGNAL, None)?;
    }
    Ok(())
}

/// Reads exactly `buf.len()` bytes, keeping every descriptor that arrives with them (in order).
/// Never read such a stream with plain `read`: the kernel closes descriptors that arrive with
/// bytes read that way. EOF before `buf` is full is `UnexpectedEof`.
pub fn recv(stream: &UnixStream, buf: &mut [u8]) -> io::Result<Vec<OwnedFd>> {
    let mut fds = Vec::new();
    let mut got = 0;
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS + 3]);
    while got < buf.len() {
        let mut iov = [IoSliceMut::new(&mut buf[got..])];
        let msg = recvmsg::<()>(stream.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
        let mut truncated = false;
        match msg.cmsgs() {
            Ok(cmsgs) => {
                for cmsg in cmsgs {
                    if let ControlMessageOwned::ScmRights(raw) = cmsg {
                        // SAFETY: SCM_RIGHTS just installed these descriptors in our table for us
                        // alone (MSG_CMSG_CLOEXEC: no child inherits them); nothing else knows
                        // their numbers, so each becomes owned exactly once, here, on every path.
                        fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
                    }
                }
            }
            // MSG_CTRUNC: the kernel closed the descriptors that did not fit.
            Err(_) => truncated = true,
        }
        if truncated {
            return Err(io::Error::other("descriptors were lost: more arrived than one message may carry"));
        }
        if msg.bytes == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed the connection"));
        }
        got += msg.bytes;
    }
    Ok(fds)
}

/// The descriptors the service manager passed at start (`LISTEN_FDS`, for this process's
/// `LISTEN_PID`), with their `LISTEN_FDNAMES` names; empty when none were passed. The variables
/// are removed from the environment, so the descriptors are taken once.
pub fn listen_fds() -> io::Result<Vec<(String, OwnedFd)>> {
    Ok(sd_notify::listen_fds_with_names(true)?
        .map(|(fd, name)| {
            // SAFETY: the service manager passed descriptors 3..3+LISTEN_FDS to this process
            // (sd_notify checked that LISTEN_PID is ours and set FD_CLOEXEC on them), and
            // unsetting the variables means no later call hands them out: each is owned once,
            // here.
            (name, unsafe { OwnedFd::from_raw_fd(fd) })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Seek as _, Write as _};
    use std::os::fd::AsFd as _;

    /// Catches descriptors lost between two processes' ends of a socket (a successor daemon
    /// that gets the state but not the memory), split reads, and a plain read of a stream
    /// that carried descriptors.
    #[test]
    fn descriptors_travel_with_their_bytes() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut f = tempfile();
        f.write_all(b"volume bytes").unwrap();
        send(&a, b"head", &[f.as_fd(), f.as_fd()]).unwrap();
        send(&a, b"tail-without-fds", &[]).unwrap();
        let mut buf = [0u8; 4];
        let fds = recv(&b, &mut buf).unwrap();
        assert_eq!(&buf, b"head");
        assert_eq!(fds.len(), 2);
        let mut got = String::new();
        let mut g = std::fs::File::from(fds.into_iter().next().unwrap());
        g.rewind().unwrap();
        g.read_to_string(&mut got).unwrap();
        assert_eq!(got, "volume bytes");
        let mut rest = [0u8; 16];
        assert!(recv(&b, &mut rest).unwrap().is_empty());
        assert_eq!(&rest, b"tail-without-fds");
        drop(a);
        let err = recv(&b, &mut [0u8; 1]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(send(&b, b"x", &vec![f.as_fd(); MAX_FDS + 1]).is_err());
    }

    fn tempfile() -> std::fs::File {
        let fd = nix::sys::memfd::memfd_create("rblk-fdpass-test", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).unwrap();
        std::fs::File::from(fd)
    }
}
