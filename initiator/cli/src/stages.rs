//! `rblk attach --stage-log FILE`: each ublk queue thread's own timestamps of its requests'
//! stages and of its loop, for `scripts/stages-rxe.sh` and `scripts/lib/stages.py` (issue 23:
//! where a request's microseconds go inside the server, beside the guest kernel's trace).
//!
//! Recording is one branch per stage when off. When on, each event is a timestamp, a stage and
//! one number (a tag, or a count), kept in memory, at most [`MAX_EVENTS`] per queue (about
//! 100 MB), and written when the queue thread stops, to `FILE.qN` for queue N: a header line
//! and then one line per event, `NANOSECONDS STAGE ARG`, the nanoseconds counted from the first
//! event. A server that is killed writes nothing.

use std::cell::RefCell;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The most events a queue thread keeps; later ones are counted, not kept.
pub const MAX_EVENTS: usize = 4 << 20;

/// What happened. The numbers are the file's; `scripts/lib/stages.py` reads them by name from
/// the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Stage {
    /// A tag's task took a new request from the kernel (FETCH or COMMIT_AND_FETCH completed).
    Seen = 0,
    /// The request is staged on the lane (ARG: tag).
    Submitted = 1,
    /// The lane posted work to the queue pair (ARG: operations now in flight more than before).
    Posted = 2,
    /// The lane finished the request (ARG: tag).
    Done = 3,
    /// The tag's task queues its COMMIT_AND_FETCH with the result (ARG: tag).
    Resumed = 4,
    /// An io_uring_enter that posts the ring's new entries (ARG: how many).
    EnterPost = 5,
    /// An io_uring_enter that only collects task work (ARG: entries posted with it).
    EnterCollect = 6,
    /// The thread goes to sleep in io_uring_enter.
    Sleep = 7,
    /// ... and is back.
    Woke = 8,
    /// The loop runs the woken tasks and hands out finished requests ...
    RunOps = 9,
    /// ... until nothing moves.
    RunOpsEnd = 10,
    /// The loop waits (spins, then sleeps) ...
    Wait = 11,
    /// ... until there is work (ARG: how many passes its spin made).
    WaitEnd = 12,
}

const NAMES: [&str; 13] = [
    "seen",
    "submitted",
    "posted",
    "done",
    "resumed",
    "enter_post",
    "enter_collect",
    "sleep",
    "woke",
    "run_ops",
    "run_ops_end",
    "wait",
    "wait_end",
];

/// One queue thread's log.
pub struct StageLog {
    path: PathBuf,
    events: RefCell<Vec<(Instant, Stage, u16)>>,
    dropped: std::cell::Cell<u64>,
}

impl std::fmt::Debug for StageLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StageLog").field("path", &self.path).field("events", &self.events.borrow().len()).finish()
    }
}

impl StageLog {
    /// A log that [`write`](Self::write)s to `base.qN`.
    pub fn new(base: &Path, qid: u16) -> StageLog {
        let mut path = base.as_os_str().to_owned();
        path.push(format!(".q{qid}"));
        StageLog { path: path.into(), events: RefCell::new(Vec::with_capacity(1 << 16)), dropped: Default::default() }
    }

    /// Records `stage` now.
    pub fn note(&self, stage: Stage, arg: u16) {
        let mut ev = self.events.borrow_mut();
        if ev.len() < MAX_EVENTS {
            ev.push((Instant::now(), stage, arg));
        } else {
            self.dropped.set(self.dropped.get() + 1);
        }
    }

    /// Writes the log (see the module documentation).
    pub fn write(&self) -> std::io::Result<PathBuf> {
        let ev = self.events.borrow();
        let mut f = std::io::BufWriter::new(std::fs::File::create(&self.path)?);
        let stages: Vec<String> = NAMES.iter().enumerate().map(|(i, n)| format!("{i}={n}")).collect();
        writeln!(
            f,
            "# rblk stage log 1: ns stage arg; stages {}; events {}; dropped {}",
            stages.join(","),
            ev.len(),
            self.dropped.get()
        )?;
        if let Some(&(t0, _, _)) = ev.first() {
            for &(t, s, arg) in ev.iter() {
                writeln!(f, "{} {} {arg}", t.duration_since(t0).as_nanos(), s as u8)?;
            }
        }
        f.flush()?;
        Ok(self.path.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system's temporary directory, removed by the caller.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rblk-stages-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn the_file_names_every_stage_and_keeps_the_order_of_events() {
        let dir = scratch("order");
        let log = StageLog::new(&dir.join("s"), 3);
        log.note(Stage::Seen, 7);
        log.note(Stage::WaitEnd, 0);
        let path = log.write().unwrap();
        assert_eq!(path, dir.join("s.q3"));
        let text = std::fs::read_to_string(path).unwrap();
        let mut lines = text.lines();
        let head = lines.next().unwrap();
        assert!(head.contains("0=seen") && head.contains("12=wait_end") && head.contains("events 2"), "{head}");
        let rows: Vec<Vec<u64>> = lines.map(|l| l.split(' ').map(|x| x.parse().unwrap()).collect()).collect();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0][0], rows[0][1], rows[0][2]), (0, 0, 7));
        assert_eq!((rows[1][1], rows[1][2]), (12, 0));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_full_log_counts_what_it_drops() {
        let log = StageLog::new(Path::new("unused"), 0);
        log.events.borrow_mut().resize(MAX_EVENTS, (Instant::now(), Stage::Seen, 0));
        log.note(Stage::Done, 1);
        assert_eq!(log.dropped.get(), 1);
        assert_eq!(log.events.borrow().len(), MAX_EVENTS);
    }
}
