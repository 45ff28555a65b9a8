//! How a thread that owns queues waits for them: spin or sleep, decided by one policy for the
//! library's own waits ([`Queue::wait`](crate::Queue::wait)) and every front end's event loop
//! (ublk's queue threads, NBD's connections).
//!
//! A sleep costs a wakeup: in a TCG guest 150-200 us, on hardware a few microseconds plus a
//! cold cache. Spinning costs a CPU while it lasts. The policy spins for twice the thread's
//! usual wait (a moving average), at most [`MAX_ADAPTIVE_SPIN`], then sleeps: a busy device
//! spins through its waits, and an idle one spins at most 1 ms per wakeup (its housekeeping
//! timer's, once a second). [`Wait`] chooses how far that goes.

use std::time::Duration;

/// The longest an adaptive wait spins before sleeping.
pub const MAX_ADAPTIVE_SPIN: Duration = Duration::from_millis(1);

/// A wait longer than this counts as this long in the moving average: no spin lasts longer,
/// and after an idle spell the average is back to the busy waits' within about a dozen.
const LONGEST_SAMPLE: Duration = MAX_ADAPTIVE_SPIN;

/// How a thread waits for its queues (`--wait`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Wait {
    /// Sleep as soon as nothing is ready: a wakeup per wait, no CPU spent spinning.
    Sleep,
    /// Spin while work is near: waits with at most two operations in flight spin for twice the
    /// thread's usual wait (at most 1 ms), deeper ones for the base spin (20 us by
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
        // Not "sleep at once when the usual wait is out of reach": a sleep makes the wait it ends
        // look longer by the wakeup, so that rule would keep a thread sleeping once it started
        // (in the guest: 1.9 sleeps per QD1 read in one boot, none in another).
        self.base.max(Duration::from_nanos(self.avg_ns.saturating_mul(2)).min(MAX_ADAPTIVE_SPIN))
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
    fn spins_are_bounded_and_an_idle_spell_is_forgotten_within_a_dozen_waits() {
        // Never past MAX_ADAPTIVE_SPIN: an idle thread (1 s waits for its housekeeping timer)
        // spins at most 1 ms per wakeup.
        let mut w = after(Wait::Adaptive, &[Duration::from_secs(1); 3]);
        assert_eq!(w.budget(0), MAX_ADAPTIVE_SPIN);
        assert_eq!(after(Wait::Poll, &[Duration::MAX]).budget(32), MAX_ADAPTIVE_SPIN);
        // Samples are capped, so a burst of short waits brings the budget down quickly.
        for _ in 0..12 {
            w.record(Duration::from_micros(200));
        }
        assert!(w.budget(0) < Duration::from_micros(800), "{:?}", w.budget(0));
    }
}
