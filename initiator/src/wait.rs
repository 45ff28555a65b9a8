//! How a thread that owns queues waits for them: spin or sleep, decided by one policy for the
//! library's own waits ([`Queue::wait`](crate::Queue::wait)) and every front end's event loop
//! (ublk's queue threads, NBD's connections).
//!
//! A sleep costs a wakeup: in a TCG guest 150-200 us, on hardware a few microseconds plus a
//! cold cache. Spinning costs a CPU while it lasts. The policy spins when the thread's recent
//! waits were short enough for a spin to cover them (twice their moving average, at most
//! [`MAX_ADAPTIVE_SPIN`]), and sleeps at once when they were not, so a busy device spins and an
//! idle one costs nothing. [`Wait`] chooses how far that goes.

use std::time::Duration;

/// The longest an adaptive wait spins before sleeping.
pub const MAX_ADAPTIVE_SPIN: Duration = Duration::from_millis(1);

/// A wait longer than this counts as this long in the moving average: it is out of spinning
/// reach either way, and after an idle spell the average is back within reach after about eight
/// short waits.
const LONGEST_SAMPLE: Duration = MAX_ADAPTIVE_SPIN;

/// How a thread waits for its queues (`--wait`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Wait {
    /// Sleep as soon as nothing is ready: a wakeup per wait, no CPU spent spinning.
    Sleep,
    /// Spin while work is near: waits with at most two operations in flight spin for twice the
    /// thread's usual wait (when that is under 1 ms), deeper ones for the base spin (20 us by
    /// default), then sleep.
    #[default]
    Adaptive,
    /// As adaptive, at every depth (perftest and SPDK poll; fio's --hipri): the latency tail
    /// stays down when several queues are busy, at the cost of a core per busy queue.
    Poll,
}

impl Wait {
    /// The name `--wait` takes.
    pub fn name(self) -> &'static str {
        match self {
            Wait::Sleep => "sleep",
            Wait::Adaptive => "adaptive",
            Wait::Poll => "poll",
        }
    }
}

impl std::fmt::Display for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One waiting thread's policy and the history it decides from.
#[derive(Debug, Clone)]
pub struct Waiter {
    mode: Wait,
    base: Duration,
    /// Moving average (1/8) of how long this thread's adaptive waits took, spin and sleep
    /// included, each counted as at most [`LONGEST_SAMPLE`].
    avg_ns: u64,
}

impl Waiter {
    /// A waiter with no history: its first adaptive waits spin for `base`.
    pub fn new(mode: Wait, base: Duration) -> Waiter {
        Waiter { mode, base, avg_ns: 0 }
    }

    /// The policy.
    pub fn mode(&self) -> Wait {
        self.mode
    }

    /// A waiter with the same policy and no history, for another thread.
    pub fn fresh(&self) -> Waiter {
        Waiter::new(self.mode, self.base)
    }

    /// Whether a wait with `near` operations outstanding spins adaptively (and so should be
    /// [`record`](Self::record)ed).
    pub fn adapts(&self, near: u32) -> bool {
        match self.mode {
            Wait::Sleep => false,
            Wait::Adaptive => near <= 2,
            Wait::Poll => true,
        }
    }

    /// How long a wait with `near` operations outstanding (in flight, or expected soon) spins
    /// before it sleeps.
    pub fn budget(&self, near: u32) -> Duration {
        if self.mode == Wait::Sleep {
            return Duration::ZERO;
        }
        if !self.adapts(near) {
            return self.base;
        }
        let twice = Duration::from_nanos(self.avg_ns.saturating_mul(2));
        if twice > MAX_ADAPTIVE_SPIN {
            // The usual wait is longer than a spin may last: spinning would only delay the sleep.
            return self.base;
        }
        self.base.max(twice)
    }

    /// An adaptive wait ended after `waited`, spin and sleep included.
    pub fn record(&mut self, waited: Duration) {
        let t = u64::try_from(waited.min(LONGEST_SAMPLE).as_nanos()).unwrap_or(u64::MAX);
        self.avg_ns = if self.avg_ns == 0 { t } else { self.avg_ns - self.avg_ns / 8 + t / 8 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_micros(20);

    fn after(mode: Wait, waits: &[Duration]) -> Waiter {
        let mut w = Waiter::new(mode, BASE);
        for &t in waits {
            w.record(t);
        }
        w
    }

    #[test]
    fn sleep_never_spins_and_deep_queues_spin_adaptively_only_when_polling() {
        let usual = [Duration::from_micros(300)];
        assert_eq!(after(Wait::Sleep, &usual).budget(1), Duration::ZERO);
        assert!(!after(Wait::Sleep, &usual).adapts(0));
        for near in [0, 1, 2] {
            assert_eq!(after(Wait::Adaptive, &usual).budget(near), Duration::from_micros(600));
        }
        assert_eq!(after(Wait::Adaptive, &usual).budget(16), BASE);
        assert_eq!(after(Wait::Poll, &usual).budget(16), Duration::from_micros(600));
    }

    #[test]
    fn no_history_spins_the_base_and_a_short_usual_wait_never_less() {
        assert_eq!(Waiter::new(Wait::Poll, BASE).budget(32), BASE);
        assert_eq!(after(Wait::Poll, &[Duration::from_micros(3)]).budget(32), BASE);
    }

    #[test]
    fn a_usual_wait_beyond_spinning_reach_sleeps_after_the_base_and_recovers() {
        // An idle spell: waits of seconds (the 1 s housekeeping timer) make it sleep soon...
        let mut w = after(Wait::Adaptive, &[Duration::from_secs(1); 3]);
        assert_eq!(w.budget(0), BASE);
        assert_eq!(w.budget(0), after(Wait::Adaptive, &[Duration::MAX]).budget(0), "samples are capped");
        // ...and a burst of short waits brings spinning back within a dozen waits (8 at 200 us).
        for _ in 0..12 {
            w.record(Duration::from_micros(200));
        }
        assert!(w.budget(0) > BASE, "{:?}", w.budget(0));
        assert!(w.budget(0) <= MAX_ADAPTIVE_SPIN);
    }
}
