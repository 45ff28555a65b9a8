//! Progress while a run goes on, on stderr: on a terminal one status line redrawn in place
//! (indicatif), otherwise (a pipe, a file, CI's log) a plain line a second. Both say the rates
//! since the last line, the share of the whole run done and its ETA.
//!
//! The runs of a job file's sections report to one [`Progress`] (each through its [`Slot`]),
//! twice a second from their main threads; the ETA adds the time left in the running group to
//! the expected length of the groups after it (ramp + runtime; unknown while a section that
//! ends by its size has no rate yet).

use std::fmt;
use std::io::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle, TermLike};

use crate::command::Sink;
use crate::report::human_count;
use crate::stats::DIRS;

/// Where a section's run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Before the measured window.
    Ramp,
    /// In the measured window.
    Measure,
    /// `--verify`'s read-back after the window.
    ReadBack,
}

/// What a section's run has done so far (all phases) and how long it expects to go on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Snapshot {
    /// I/Os by direction.
    pub(crate) ios: [u64; DIRS],
    /// Bytes by direction.
    pub(crate) bytes: [u64; DIRS],
    pub(crate) phase: Phase,
    /// `None`: unknown (no rate yet for a size, or the read-back).
    pub(crate) remaining: Option<Duration>,
}

#[derive(Debug, Clone, Copy)]
enum Section {
    Waiting,
    Running(Snapshot),
    Done(Snapshot),
}

enum Draw {
    Lines(Sink),
    Bar(ProgressBar),
}

struct State {
    sections: Vec<Section>,
    /// Lines: when the last one was printed.
    last_line: Instant,
    /// The rates' last point: when, I/Os by direction and all bytes.
    rate_at: (Instant, [u64; DIRS], u64),
    /// I/Os per second by direction and bytes per second, over the last second or more.
    rates: ([f64; DIRS], f64),
}

/// The progress of a whole invocation: one or more sections, in groups run one after another.
pub struct Progress {
    start: Instant,
    draw: Draw,
    /// Each section's group and expected length (`None`: decided by its size).
    plan: Vec<(u32, Option<Duration>)>,
    state: Mutex<State>,
}

impl fmt::Debug for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.draw {
            Draw::Lines(_) => "lines",
            Draw::Bar(_) => "bar",
        };
        f.debug_struct("Progress").field("draw", &kind).field("plan", &self.plan).finish()
    }
}

/// One section's handle on the [`Progress`].
#[derive(Debug, Clone)]
pub struct Slot {
    progress: Arc<Progress>,
    section: usize,
}

/// Plain lines no more often than this.
const LINE_EVERY: Duration = Duration::from_secs(1);

impl Progress {
    /// Plain lines on `sink`, one a second. `plan`: each section's group (from 0, in order) and
    /// expected length (ramp + runtime, `None` when its size decides).
    pub fn lines(sink: Sink, plan: Vec<(u32, Option<Duration>)>) -> Arc<Progress> {
        Progress::new(Draw::Lines(sink), plan)
    }

    /// One status line redrawn on stderr (a terminal).
    pub fn terminal(plan: Vec<(u32, Option<Duration>)>) -> Arc<Progress> {
        Progress::bar(ProgressDrawTarget::stderr(), plan)
    }

    /// One status line redrawn on `term` (tests stand in for a terminal).
    pub fn on_term(term: Box<dyn TermLike>, plan: Vec<(u32, Option<Duration>)>) -> Arc<Progress> {
        Progress::bar(ProgressDrawTarget::term_like(term), plan)
    }

    fn bar(target: ProgressDrawTarget, plan: Vec<(u32, Option<Duration>)>) -> Arc<Progress> {
        let bar = ProgressBar::with_draw_target(Some(1000), target);
        let style = ProgressStyle::with_template("rblk-bench: [{bar:20}] {percent:>3}% {msg}")
            .expect("a valid template")
            .progress_chars("=> ");
        bar.set_style(style);
        Progress::new(Draw::Bar(bar), plan)
    }

    fn new(draw: Draw, plan: Vec<(u32, Option<Duration>)>) -> Arc<Progress> {
        let start = Instant::now();
        let state = State {
            sections: vec![Section::Waiting; plan.len()],
            last_line: start,
            rate_at: (start, [0; DIRS], 0),
            rates: ([0.0; DIRS], 0.0),
        };
        Arc::new(Progress { start, draw, plan, state: Mutex::new(state) })
    }

    /// Section `section`'s handle.
    pub fn slot(self: &Arc<Self>, section: usize) -> Slot {
        Slot { progress: Arc::clone(self), section }
    }

    /// Removes the status line (before the report is printed).
    pub fn clear(&self) {
        if let Draw::Bar(bar) = &self.draw {
            bar.finish_and_clear();
        }
    }

    /// Prints a line (a warning) without breaking the status line.
    pub fn println(&self, line: &str) {
        match &self.draw {
            Draw::Lines(sink) => sink.line(line),
            Draw::Bar(bar) => bar.suspend(|| eprintln!("{line}")),
        }
    }

    fn set(&self, section: usize, s: Section) {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        st.sections[section] = s;
        let now = Instant::now();
        let (mut ios, mut bytes) = ([0u64; DIRS], 0u64);
        for s in &st.sections {
            if let Section::Running(x) | Section::Done(x) = s {
                for (sum, n) in ios.iter_mut().zip(x.ios) {
                    *sum += n;
                }
                bytes += x.bytes.iter().sum::<u64>();
            }
        }
        let (at, ios0, bytes0) = st.rate_at;
        let dt = (now - at).as_secs_f64();
        if dt >= LINE_EVERY.as_secs_f64() * 0.9 {
            let per = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt;
            st.rates = (std::array::from_fn(|d| per(ios[d], ios0[d])), per(bytes, bytes0));
            st.rate_at = (now, ios, bytes);
        }
        let remaining = self.remaining(&st.sections);
        let elapsed = now - self.start;
        let share = remaining.map(|r| {
            let whole = (elapsed + r).as_secs_f64();
            if whole > 0.0 {
                elapsed.as_secs_f64() / whole
            } else {
                1.0
            }
        });
        let phase = st.sections.iter().fold("", |p, s| match s {
            Section::Running(x) if x.phase == Phase::Ramp => " [ramp]",
            Section::Running(x) if x.phase == Phase::ReadBack && p.is_empty() => " [verify read-back]",
            _ => p,
        });
        let ([r, w, t], bps) = st.rates;
        // Trims only where there are any (a trim workload does nothing else).
        let split = if t > 0.0 {
            format!("read {}, write {}, trim {}", human_count(r), human_count(w), human_count(t))
        } else {
            format!("read {}, write {}", human_count(r), human_count(w))
        };
        let rates = format!(
            "{} IOPS ({split}), {:.1} MiB/s ({:.1} MB/s){phase}",
            human_count(r + w + t),
            bps / (1u64 << 20) as f64,
            bps / 1e6
        );
        let eta = remaining.map_or("?".to_owned(), eta_text);
        match &self.draw {
            Draw::Lines(sink) => {
                if now - st.last_line >= LINE_EVERY {
                    st.last_line = now;
                    let done = share.map_or("?%".to_owned(), |s| format!("{:.0}%", s * 100.0));
                    sink.line(&format!("rblk-bench: {:>5.1}s: {rates}, {done} done, ETA {eta}", elapsed.as_secs_f64()));
                }
            }
            Draw::Bar(bar) => {
                if let Some(s) = share {
                    bar.set_position((s * 1000.0).round() as u64);
                }
                bar.set_message(format!("{rates}, ETA {eta}"));
            }
        }
    }

    /// Time left in the whole invocation: the running group's longest remainder, plus each later
    /// group's longest expected length; `None` if any of those is unknown.
    fn remaining(&self, sections: &[Section]) -> Option<Duration> {
        let groups = self.plan.iter().map(|p| p.0 + 1).max().unwrap_or(0);
        let mut total = Duration::ZERO;
        for g in 0..groups {
            let mut longest = Duration::ZERO;
            for (i, (_, expected)) in self.plan.iter().enumerate().filter(|(_, p)| p.0 == g) {
                let left = match sections[i] {
                    Section::Waiting => *expected,
                    Section::Running(s) => s.remaining,
                    Section::Done(_) => Some(Duration::ZERO),
                };
                longest = longest.max(left?);
            }
            total += longest;
        }
        Some(total)
    }
}

impl Slot {
    /// The section's run so far.
    pub(crate) fn update(&self, s: Snapshot) {
        self.progress.set(self.section, Section::Running(s));
    }

    /// The section's run is over.
    pub(crate) fn finish(&self, s: Snapshot) {
        self.progress.set(self.section, Section::Done(s));
    }

    /// A warning, without breaking the status line.
    pub(crate) fn println(&self, line: &str) {
        self.progress.println(line);
    }
}

/// 65 s -> "1:05", 3725 s -> "1:02:05".
fn eta_text(d: Duration) -> String {
    let s = d.as_secs_f64().ceil() as u64;
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

/// Flushes what was written (a bar's terminal, a sink).
impl Drop for Progress {
    fn drop(&mut self) {
        if let Draw::Lines(sink) = &self.draw {
            let _ = sink.clone().flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    fn snap(ios: u64, phase: Phase, remaining: Option<Duration>) -> Snapshot {
        Snapshot { ios: [ios, 0, 0], bytes: [ios * 4096, 0, 0], phase, remaining }
    }

    #[test]
    fn eta_texts() {
        assert_eq!(eta_text(Duration::from_secs(65)), "1:05");
        assert_eq!(eta_text(Duration::from_millis(4200)), "0:05");
        assert_eq!(eta_text(Duration::from_secs(3725)), "1:02:05");
    }

    /// Catches an ETA that forgets the groups still to come (stonewalled sections) or that
    /// claims to know the length of a size-bound section before it has a rate.
    #[test]
    fn the_eta_adds_the_groups_still_to_come() {
        let secs = |s| Some(Duration::from_secs(s));
        let (sink, _) = Sink::buffer();
        let p = Progress::lines(sink, vec![(0, secs(10)), (0, secs(4)), (1, secs(20)), (2, None)]);
        let st = |s: Vec<Section>| p.remaining(&s);
        let run = |r| Section::Running(snap(1, Phase::Measure, r));
        let done = Section::Done(snap(1, Phase::Measure, None));
        // Group 2 ends by its size: nothing is known until it runs.
        assert_eq!(st(vec![run(secs(3)), run(secs(1)), Section::Waiting, Section::Waiting]), None);
        let p = Progress::lines(Sink::buffer().0, vec![(0, secs(10)), (0, secs(4)), (1, secs(20))]);
        let st = |s: Vec<Section>| p.remaining(&s);
        assert_eq!(st(vec![run(secs(3)), run(secs(1)), Section::Waiting]), secs(23));
        assert_eq!(st(vec![done, run(secs(1)), Section::Waiting]), secs(21));
        assert_eq!(st(vec![done, done, run(secs(5))]), secs(5));
        assert_eq!(st(vec![done, done, run(None)]), None);
        assert_eq!(st(vec![done, done, done]), secs(0));
    }

    /// A terminal as indicatif sees it: lines of text, a cursor row, and how often a line was
    /// cleared for a redraw.
    #[derive(Debug, Default)]
    struct Screen {
        lines: Vec<String>,
        row: usize,
        clears: usize,
    }

    #[derive(Debug, Clone, Default)]
    struct Term(Arc<Mutex<Screen>>);

    impl Term {
        fn with<R>(&self, f: impl FnOnce(&mut Screen) -> R) -> R {
            f(&mut self.0.lock().unwrap())
        }
    }

    impl TermLike for Term {
        fn width(&self) -> u16 {
            200
        }
        fn move_cursor_up(&self, n: usize) -> io::Result<()> {
            self.with(|s| s.row = s.row.saturating_sub(n));
            Ok(())
        }
        fn move_cursor_down(&self, n: usize) -> io::Result<()> {
            self.with(|s| s.row += n);
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> io::Result<()> {
            Ok(())
        }
        fn write_line(&self, text: &str) -> io::Result<()> {
            self.write_str(text)?;
            self.with(|s| s.row += 1);
            Ok(())
        }
        fn write_str(&self, text: &str) -> io::Result<()> {
            self.with(|s| {
                while s.lines.len() <= s.row {
                    s.lines.push(String::new());
                }
                let row = s.row;
                s.lines[row].push_str(text);
            });
            Ok(())
        }
        fn clear_line(&self) -> io::Result<()> {
            self.with(|s| {
                if let Some(l) = s.lines.get_mut(s.row) {
                    l.clear();
                }
                s.clears += 1;
            });
            Ok(())
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Catches a terminal's progress printed as a new line per update (a scrolling log) instead
    /// of one status line redrawn in place, and a status line without its percentage and ETA.
    #[test]
    fn on_a_terminal_one_status_line_is_redrawn_in_place() {
        let term = Term::default();
        let p = Progress::on_term(Box::new(term.clone()), vec![(0, Some(Duration::from_secs(2)))]);
        let slot = p.slot(0);
        for i in 1..=8u64 {
            slot.update(snap(i * 1000, Phase::Measure, Some(Duration::from_millis(2000 - i * 200))));
            std::thread::sleep(Duration::from_millis(70));
        }
        let (lines, clears) = term.with(|s| (s.lines.clone(), s.clears));
        let shown: Vec<&String> = lines.iter().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(shown.len(), 1, "one status line, redrawn: {lines:?}");
        assert!(clears >= 2, "redrawn in place ({clears} clears): {lines:?}");
        let line = shown[0];
        assert!(line.starts_with("rblk-bench: [") && line.contains("% ") && line.contains("ETA 0:0"), "{line}");
        p.clear();
        assert!(term.with(|s| s.lines.iter().all(|l| l.trim().is_empty())), "cleared before the report");
    }

    /// Catches plain-line progress that redraws (carriage returns, escape sequences: garbage in
    /// a log file) or prints more than about a line a second.
    #[test]
    fn elsewhere_plain_lines_come_once_a_second() {
        let (sink, buf) = Sink::buffer();
        let p = Progress::lines(sink, vec![(0, Some(Duration::from_secs(3)))]);
        let slot = p.slot(0);
        let start = Instant::now();
        let mut i = 0;
        while start.elapsed() < Duration::from_millis(2300) {
            i += 1;
            slot.update(snap(i * 100, Phase::Measure, Some(Duration::from_secs(3).saturating_sub(start.elapsed()))));
            std::thread::sleep(Duration::from_millis(50));
        }
        let text = String::from_utf8(buf.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(!text.contains('\r') && !text.contains('\x1b'), "{text:?}");
        for l in lines {
            assert!(l.starts_with("rblk-bench: ") && l.contains("% done, ETA 0:0") && l.contains(" IOPS"), "{l}");
        }
    }
}
