//! The data streams of `rblk read` and `rblk write` when the other end sets the pace: a pipe,
//! a socket or a terminal may keep us waiting for as long as it likes (`rblk read | slow-tool`,
//! `slow-producer | rblk write`), and the target ends a session it has not heard from for its
//! keepalive timeout (15 s). So a wait for such a stream goes through poll(2) with a 1 s timeout,
//! and the volume's housekeeping (its keepalives, on every queue pair) runs at least once a
//! second while it does: between timeouts, and between the 4 KiB pieces a slowly draining pipe
//! takes.
//! Regular files and block devices never wait on a peer and are read and written directly.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::stat::{fstat, SFlag};
use rblk_initiator::Volume;

/// How long one poll waits before the volume's housekeeping runs.
const TICK: Duration = Duration::from_secs(1);

/// The most written at once to a stream: a pipe that polls writable takes this much without
/// blocking (PIPE_BUF).
const STREAM_WRITE: usize = 4096;

/// Standard input or output, for [`refuse_terminal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Std {
    /// `rblk write`'s data when no --input is given.
    In,
    /// `rblk read`'s data when no --output is given.
    Out,
}

/// Refuses binary data to or from a terminal unless it was asked for by name (`-`): on stdout
/// it garbles the terminal, on stdin rblk would wait silently for bytes typed in. `named`: the
/// flag named the stream (`--output -`, `--input -`).
pub fn refuse_terminal(which: Std, named: bool) -> anyhow::Result<()> {
    use std::io::IsTerminal as _;
    let (terminal, what) = match which {
        Std::Out => (
            io::stdout().is_terminal(),
            "standard output is a terminal: give --output FILE, or --output - to write the data there anyway",
        ),
        Std::In => (
            io::stdin().is_terminal(),
            "standard input is a terminal: give --input FILE or pipe the data in, or --input - to read the data \
             typed there anyway (end it with Ctrl-D)",
        ),
    };
    if terminal && !named {
        anyhow::bail!("{what}");
    }
    Ok(())
}

/// Where `rblk write` takes its bytes from: a [`Patient`] (tests have streams of their own).
pub trait Source {
    /// Fills `buf` unless the input ends first, keeping `vol`'s session alive while it waits;
    /// returns the bytes read.
    fn read_full(&mut self, buf: &mut [u8], vol: &mut Volume) -> anyhow::Result<usize>;
}

/// A file, or standard input or output, read or written without letting the session go
/// silent while its other end makes us wait.
#[derive(Debug)]
pub struct Patient {
    file: File,
    /// Not a regular file or a block device: its other end may make us wait.
    stream: bool,
    /// When the volume's housekeeping last ran here.
    ticked: Instant,
}

impl Patient {
    /// Wraps `file` (for standard input or output: a duplicate of its descriptor, so no
    /// buffer of the standard library holds bytes that poll(2) cannot see).
    pub fn new(file: File) -> io::Result<Patient> {
        let kind = SFlag::from_bits_truncate(fstat(file.as_fd())?.st_mode) & SFlag::S_IFMT;
        Ok(Patient { file, stream: kind != SFlag::S_IFREG && kind != SFlag::S_IFBLK, ticked: Instant::now() })
    }

    /// Standard input.
    pub fn stdin() -> io::Result<Patient> {
        Patient::new(File::from(io::stdin().as_fd().try_clone_to_owned()?))
    }

    /// Standard output.
    pub fn stdout() -> io::Result<Patient> {
        Patient::new(File::from(io::stdout().as_fd().try_clone_to_owned()?))
    }

    /// Whether its other end may make us wait (a pipe, a socket, a terminal).
    pub fn is_stream(&self) -> bool {
        self.stream
    }

    /// The file itself (to seek or size it).
    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// Waits until the stream is ready for `flags`, keeping `vol`'s session alive meanwhile.
    fn ready(&mut self, flags: PollFlags, vol: &mut Volume) -> anyhow::Result<()> {
        loop {
            if self.ticked.elapsed() >= TICK {
                vol.keepalive().context("keeping the session alive while the stream waits")?;
                self.ticked = Instant::now();
            }
            let mut fds = [PollFd::new(self.file.as_fd(), flags)];
            match poll(&mut fds, PollTimeout::try_from(TICK).unwrap_or(PollTimeout::MAX)) {
                // Ready, or hung up or in error: the read or write says which.
                Ok(n) if n > 0 => return Ok(()),
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(io::Error::from(e)).context("waiting for the stream"),
            }
        }
    }

    /// Writes all of `buf`.
    pub fn write_all(&mut self, mut buf: &[u8], vol: &mut Volume) -> anyhow::Result<()> {
        if !self.stream {
            return self.file.write_all(buf).context("writing the output");
        }
        while !buf.is_empty() {
            self.ready(PollFlags::POLLOUT, vol)?;
            match self.file.write(&buf[..buf.len().min(STREAM_WRITE)]) {
                Ok(0) => anyhow::bail!("writing the output: it takes no more bytes"),
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e).context("writing the output"),
            }
        }
        Ok(())
    }
}

impl Source for Patient {
    fn read_full(&mut self, buf: &mut [u8], vol: &mut Volume) -> anyhow::Result<usize> {
        let mut got = 0;
        while got < buf.len() {
            if self.stream {
                self.ready(PollFlags::POLLIN, vol)?;
            }
            match self.file.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e).context("reading the input"),
            }
        }
        Ok(got)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches a pipe taken for a file (its reads and writes would block with the session
    /// silent) or a file taken for a stream (a poll per 4 KiB for nothing).
    #[test]
    fn pipes_are_streams_and_files_are_not() {
        let (r, w) = io::pipe().unwrap();
        assert!(Patient::new(File::from(std::os::fd::OwnedFd::from(r))).unwrap().is_stream());
        drop(w);
        let file = tempfile_in_tmp();
        assert!(!Patient::new(file).unwrap().is_stream());
    }

    fn tempfile_in_tmp() -> File {
        let path = std::env::temp_dir().join(format!("rblk-stdio-{}", std::process::id()));
        let f = File::create(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }
}
