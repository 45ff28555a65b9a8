//! Admission of connections that have not authenticated yet: the pool that
//! [`Config::max_unopened`] and [`Config::max_unopened_per_addr`] bound, decided at the
//! connect request, before a protection domain, a QP or a buffer is allocated for it.
//!
//! A connection is in the pool from its connect request until it passes AUTH (where no AUTH
//! is asked, until it opens a session), or ends. A JOIN carries its session's token and is
//! never in it. So a connection that passed AUTH is never evicted to make room for one that
//! has not, however slow its OPEN.
//!
//! At a new connect request from address A:
//! 1. once the pool is half full, a request from an address that already holds a place in it
//!    is dropped with a probability that grows linearly to 1 at the cap (random early drop,
//!    as OpenSSH's `MaxStartups start:rate:full`); an address's first place is never dropped
//!    early, so one flooding address cannot make an honest one's first try fail by chance;
//! 2. if A holds `max_unopened_per_addr` places, A's oldest is evicted (the newest try of an
//!    address wins: a client that retries is not locked out by its own dead tries);
//! 3. if the pool is full, the oldest place of the address holding the most is evicted: an
//!    address with fewer places than another never loses one to make room.
//!
//! Not done: OpenSSH's per-source penalties (refusing an address for a while after failures).
//! An AUTH failure's ERROR is held back instead (`Shared::auth_failed`), and nothing is
//! refused for it, so an honest host that mistyped its key, or shares a NAT address with a
//! flood, still gets in.
//!
//! Before any of that, a connect request waits in the listener's [`Backlog`]: every event on
//! the CM channel is read as soon as it is there, and a request that has waited longer than
//! [`ADMIT_PATIENCE`] is rejected at once instead of admitted late (see there).
//!
//! [`Config::max_unopened`]: crate::config::Config::max_unopened
//! [`Config::max_unopened_per_addr`]: crate::config::Config::max_unopened_per_addr

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// How long a connect request may wait in the listener's [`Backlog`] to be admitted. A
/// reconnecting initiator gives a connect up after 3 s (its `ATTEMPT_STEP`, resolution
/// included) and tries again; admitting its request later builds a QP for nobody, and in a
/// reconnect storm every such admission makes the ones behind it late too (a metastable storm:
/// at 1,000 sessions x 2 QPs from independent hosts under TCG, 45-120 s where the busy rejects
/// take 38-40 s; docs/performance.md).
pub(crate) const ADMIT_PATIENCE: Duration = Duration::from_secs(2);

/// What an admission is taken to cost before one was measured.
const FIRST_COST: Duration = Duration::from_millis(1);

/// How many recent admissions [`Backlog::typical`] looks at.
const RECENT: usize = 64;

/// Admissions measured before a request is turned away for the wait ahead of it.
const MIN_MEASURED: usize = 16;

/// The furthest ahead a busy request is sent as the next slot in line (see
/// [`Backlog::come_back`]).
const HORIZON: Duration = Duration::from_secs(10);

/// Connect requests read off the CM channel and not yet admitted, each with when it was read.
/// The listener reads every waiting event before it admits the next request, so a request's
/// read time is its arrival to within one admission.
///
/// JOINs go first (they complete sessions already admitted), then new sessions, oldest first.
/// A new session whose request would wait longer than [`ADMIT_PATIENCE`] behind those queued
/// (at the measured cost of an admission) is rejected at once, busy, and told when to come back
/// ([`rblk_proto::RejectData::Busy`]): each such request gets the next free slot after the work
/// already promised, one session's admissions apart (at a recent admission's typical cost,
/// [`Backlog::typical`]), so a herd of hosts returns at the pace the target admits them instead
/// of all after the same delay. A request that still waited longer than the patience (the cost
/// was misjudged) is rejected the same way when its turn comes.
/// A reject costs no QP. An initiator that predates the busy reject retries after its own
/// delay, as after any reject.
#[derive(Debug)]
pub(crate) struct Backlog<T> {
    joins: VecDeque<(T, Instant)>,
    news: VecDeque<(T, Instant)>,
    patience: Duration,
    /// What one admission takes, a moving average of the measured ones: what a request
    /// queued now waits for each one ahead of it.
    cost: Duration,
    /// The last [`RECENT`] admissions' times, for [`Backlog::typical`].
    recent: VecDeque<Duration>,
    /// Admissions, and of those new sessions, decaying counts (see [`Backlog::per_session`]).
    admissions: f64,
    sessions: f64,
    /// The last come-back time promised to a busy request.
    promised: Option<Instant>,
}

/// The listener's verdict on a request it took off the CM channel.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict<T> {
    /// Queued to be admitted.
    Queued,
    /// Rejected, busy: connect again after this long.
    Busy(T, Duration),
}

impl<T> Backlog<T> {
    pub(crate) fn new(patience: Duration) -> Backlog<T> {
        Backlog {
            joins: VecDeque::new(),
            news: VecDeque::new(),
            patience,
            cost: FIRST_COST,
            recent: VecDeque::with_capacity(RECENT),
            admissions: 0.0,
            sessions: 0.0,
            promised: None,
        }
    }

    /// Request `item` (a JOIN when `join`), read at `at`: queued, or busy when a new session's
    /// request would wait longer than the patience (once [`MIN_MEASURED`] admissions were
    /// measured).
    pub(crate) fn push(&mut self, item: T, at: Instant, join: bool) -> Verdict<T> {
        if join {
            self.joins.push_back((item, at));
            return Verdict::Queued;
        }
        // Judged ahead only on enough measured admissions: a fresh target's first (its shared
        // CQ made, its first registrations) can take many times the rest, and would turn a
        // burst away that it admits in time. Until then a request is turned away only once it
        // has waited longer than the patience (in `next`).
        if self.recent.len() >= MIN_MEASURED && self.wait_ahead() > self.patience {
            let after = self.come_back(at, roll());
            return Verdict::Busy(item, after);
        }
        self.news.push_back((item, at));
        Verdict::Queued
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.joins.is_empty() && self.news.is_empty()
    }

    /// Every request waiting, JOINs first, taken out.
    pub(crate) fn take_all(&mut self) -> Vec<T> {
        self.joins.drain(..).chain(self.news.drain(..)).map(|(item, _)| item).collect()
    }

    /// The request to admit now: the first JOIN, else the oldest new session, that waited at
    /// most the patience at `now` (and whether it is a JOIN). Those that waited longer are
    /// appended to `late`, each with when to come back.
    pub(crate) fn next(&mut self, now: Instant, late: &mut Vec<(T, Duration)>) -> Option<(T, bool)> {
        for join in [true, false] {
            loop {
                let queue = if join { &mut self.joins } else { &mut self.news };
                let Some((item, at)) = queue.pop_front() else { break };
                if now.saturating_duration_since(at) <= self.patience {
                    return Some((item, join));
                }
                let after = self.come_back(now, roll());
                late.push((item, after));
            }
        }
        None
    }

    /// One admission took `took`; `join`: it was a JOIN.
    pub(crate) fn admitted(&mut self, took: Duration, join: bool) {
        // Moving averages over about the last 8 admissions (the cost: a storm's, not the idle
        // target's) and the last 100 (the QPs a session brings).
        // The first measured one replaces the guess.
        self.cost = if self.recent.is_empty() { took } else { (self.cost * 7 + took) / 8 };
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(took);
        self.admissions = self.admissions * 0.99 + 1.0;
        self.sessions = self.sessions * 0.99 + if join { 0.0 } else { 1.0 };
    }

    /// Admissions per new session (its first QP and its JOINs), at least 1.
    fn per_session(&self) -> f64 {
        if self.sessions > 0.0 {
            (self.admissions / self.sessions).clamp(1.0, 1024.0)
        } else {
            1.0
        }
    }

    /// How long a new session's request would wait behind what is queued.
    fn wait_ahead(&self) -> Duration {
        let queued = self.joins.len() + self.news.len();
        self.cost.saturating_mul(u32::try_from(queued).unwrap_or(u32::MAX))
    }

    /// The median of the recent admissions' times: what slots are spaced by. Not the moving
    /// average, which the slowest admissions pull up: while a herd of hosts is being turned
    /// away admissions are slow (measured under TCG, where the hosts' attempts share the
    /// target's CPUs: about 5 times slower), and slots spaced by that left the target half idle
    /// later, when the hosts came back 0.7 s apart. Not the fastest either: slots too tight
    /// send hosts back before there is room, each turned away again to a later slot (measured:
    /// 3,812 busy rejects for 1,000 sessions).
    fn typical(&self) -> Duration {
        let mut recent: Vec<Duration> = self.recent.iter().copied().collect();
        recent.sort_unstable();
        recent.get(recent.len() / 2).copied().unwrap_or(FIRST_COST)
    }

    /// When a busy request should come back, from `now`: the next slot after the work queued
    /// and the slots already promised, one session's admissions apart; beyond [`HORIZON`] from
    /// now, a time drawn (`roll`, uniform in [0, 1)) between the queued work's end and the
    /// horizon, so that a misjudged cost never parks hosts far ahead of an idle target.
    fn come_back(&mut self, now: Instant, roll: f64) -> Duration {
        let spacing = self.typical().mul_f64(self.per_session());
        let earliest = now + self.wait_ahead();
        let slot = self.promised.map_or(earliest, |p| p.max(earliest)) + spacing;
        let slot = if slot <= now + HORIZON {
            self.promised = Some(slot);
            slot
        } else {
            let room = (now + HORIZON).saturating_duration_since(earliest);
            earliest + room.mul_f64(roll.clamp(0.0, 1.0))
        };
        slot.saturating_duration_since(now).min(Duration::from_millis(u64::from(rblk_proto::MAX_RETRY_AFTER_MS)))
    }
}

/// Why a connect request was refused before anything was allocated for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Crowded {
    /// Random early drop (rule 1).
    #[error(
        "dropped early: {held} connections have not authenticated yet (of max_unopened {max}), and this \
         address already holds {mine} of them"
    )]
    Early {
        /// Places held, all addresses.
        held: usize,
        /// The cap.
        max: usize,
        /// Places this address holds.
        mine: usize,
    },
}

/// The connections that have not authenticated yet, oldest first, with their peer address.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    queue: VecDeque<(u64, Option<IpAddr>)>,
}

impl Pool {
    /// Decides on connection `conn` from `ip` (see the module's rules) with `roll`, a number
    /// drawn uniformly from [0, 1): on admission it holds a place, and the connections to
    /// evict for it (out of the pool already) are returned.
    pub(crate) fn admit(
        &mut self,
        conn: u64,
        ip: Option<IpAddr>,
        max: usize,
        per_addr: usize,
        roll: f64,
    ) -> Result<Vec<(u64, Option<IpAddr>)>, Crowded> {
        let (max, per_addr) = (max.max(1), per_addr.max(1));
        let held = self.queue.len();
        let mine = self.held_by(ip);
        let start = max.div_ceil(2);
        if mine > 0 && held >= start {
            // At `start` places a request is dropped with probability 1 / (max - start + 1),
            // at `max` with probability 1.
            let p = (held - start + 1) as f64 / (max - start + 1) as f64;
            if roll < p {
                return Err(Crowded::Early { held, max, mine });
            }
        }
        let mut evict = Vec::new();
        while self.held_by(ip) >= per_addr {
            evict.extend(self.take_oldest_of(ip));
        }
        while self.queue.len() >= max {
            let Some(top) = self.most() else { break };
            evict.extend(self.take_oldest_of(top));
        }
        self.queue.push_back((conn, ip));
        Ok(evict)
    }

    /// Connection `conn` authenticated, opened, or ended: it holds no place any more.
    pub(crate) fn leave(&mut self, conn: u64) {
        self.queue.retain(|&(c, _)| c != conn);
    }

    fn held_by(&self, ip: Option<IpAddr>) -> usize {
        self.queue.iter().filter(|&&(_, a)| a == ip).count()
    }

    /// The address holding the most places (of those tied, the one whose oldest is oldest).
    fn most(&self) -> Option<Option<IpAddr>> {
        let mut best: Option<(usize, Option<IpAddr>)> = None;
        for &(_, a) in &self.queue {
            let n = self.held_by(a);
            if best.is_none_or(|(b, _)| n > b) {
                best = Some((n, a));
            }
        }
        best.map(|(_, a)| a)
    }

    fn take_oldest_of(&mut self, ip: Option<IpAddr>) -> Option<(u64, Option<IpAddr>)> {
        let i = self.queue.iter().position(|&(_, a)| a == ip)?;
        self.queue.remove(i)
    }
}

/// A number drawn uniformly from [0, 1), for [`Pool::admit`]'s early drop.
pub(crate) fn roll() -> f64 {
    (u64::from_le_bytes(rblk_fabric::random::<8>()) >> 11) as f64 / (1u64 << 53) as f64
}

/// An optional address as logs show it: the address, or `unknown` (never `Some(..)`).
pub(crate) struct Shown<T>(pub(crate) Option<T>);

impl<T: std::fmt::Display> std::fmt::Display for Shown<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(v) => v.fmt(f),
            None => f.write_str("unknown"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A backlog whose admissions are measured to cost `cost` (exactly: the moving average
    /// set, as after a long run of them).
    fn costing(cost: Duration) -> Backlog<u32> {
        let mut b = Backlog::new(Duration::from_secs(2));
        for _ in 0..64 {
            b.admitted(cost, false);
        }
        b.cost = cost;
        b
    }

    fn near(a: Duration, b: Duration) -> bool {
        a.abs_diff(b) <= b / 50
    }

    /// What the backlog is for: a request that waited longer than the patience is never
    /// admitted (it would be admitted late, for an initiator that gave it up), the ones that
    /// did not are admitted in order, and nothing is lost either way.
    #[test]
    fn a_backlog_admits_in_order_and_turns_away_what_waited_too_long() {
        let t0 = Instant::now();
        let mut b = Backlog::new(Duration::from_secs(2));
        for i in 0..5u32 {
            assert_eq!(b.push(i, t0 + Duration::from_millis(500) * i, false), Verdict::Queued);
        }
        let mut late = Vec::new();
        // At 1 s nothing has waited 2 s: the oldest first.
        assert_eq!(b.next(t0 + Duration::from_secs(1), &mut late), Some((0, false)));
        assert!(late.is_empty());
        // At 3.2 s, 1 (read at 0.5 s) and 2 (1 s) waited longer than 2 s; 3 (1.5 s) waited 1.7 s.
        assert_eq!(b.next(t0 + Duration::from_millis(3200), &mut late), Some((3, false)));
        assert_eq!(late.iter().map(|l| l.0).collect::<Vec<_>>(), vec![1, 2]);
        // Each told to come back, at different times.
        assert!(late[0].1 > Duration::ZERO && late[1].1 > late[0].1, "{late:?}");
        // Exactly the patience is still in time.
        assert_eq!(b.next(t0 + Duration::from_secs(4), &mut late), Some((4, false)));
        assert!(b.is_empty());
        assert_eq!(b.next(t0 + Duration::from_secs(9), &mut late), None);
        assert_eq!(late.len(), 2);
    }

    /// A storm: 10 ms admissions, 1,000 new sessions at once. The first 200 fit the 2 s
    /// patience; the rest are told at once to come back, each at its own slot after the queued
    /// work, one admission apart, so that they return at the pace the target admits. Catches a
    /// backlog that queues everything (they would wait 10 s, given up by their initiators), and
    /// one that sends every busy host back after the same delay (a herd again).
    #[test]
    fn in_a_storm_the_excess_is_turned_away_at_once_and_spread_over_the_time_needed() {
        let t0 = Instant::now();
        let mut b = costing(10 * MS);
        let mut busy = Vec::new();
        for i in 0..1000u32 {
            if let Verdict::Busy(item, after) = b.push(i, t0, false) {
                busy.push((item, after));
            }
        }
        assert_eq!(busy.len(), 1000 - 201, "201 fit: 200 x 10 ms is the patience, not over it");
        assert_eq!(busy[0].0, 201, "the first turned away is the first that does not fit");
        // After the 2.01 s of queued work, one slot of 10 ms each.
        assert_eq!(busy[0].1, 2020 * MS);
        for w in busy.windows(2) {
            assert_eq!(w[1].1 - w[0].1, 10 * MS, "slots one admission apart");
        }
        assert_eq!(busy.last().unwrap().1, (2020 + 798 * 10) * MS);
    }

    /// Sessions that bring a JOIN each take two admissions: the slots are two apart. And JOINs
    /// are admitted before new sessions (they complete sessions already admitted), never
    /// turned away on arrival.
    #[test]
    fn joins_go_first_and_slots_count_a_session_s_joins() {
        let t0 = Instant::now();
        let mut b = Backlog::new(Duration::from_secs(2));
        for _ in 0..400 {
            b.admitted(10 * MS, false);
            b.admitted(10 * MS, true);
        }
        for i in 0..300u32 {
            let _ = b.push(i, t0, false);
        }
        let Verdict::Busy(_, first) = b.push(1000, t0, false) else { panic!("a full backlog turns away") };
        let Verdict::Busy(_, second) = b.push(1001, t0, false) else { panic!("a full backlog turns away") };
        let spacing = second - first;
        assert!(near(spacing, 20 * MS), "two admissions per session: {spacing:?}");
        assert_eq!(b.push(2000, t0, true), Verdict::Queued, "a JOIN is never turned away on arrival");
        let mut late = Vec::new();
        assert_eq!(b.next(t0, &mut late), Some((2000, true)), "the JOIN first");
        assert_eq!(b.next(t0, &mut late), Some((0, false)));
    }

    /// Slots are spaced by the median of the recent admissions, not their moving average:
    /// admissions measured while a herd was being turned away were slow (the hosts' own
    /// attempts took the CPU), and slots spaced by them left the target idle once the hosts
    /// came back at them (measured under TCG: a storm of 133 s with the CPU half idle, hosts
    /// returning 0.7 s apart). Catches a spacing by the average.
    #[test]
    fn slots_are_spaced_by_the_typical_admission_not_the_slow_ones() {
        let t0 = Instant::now();
        let mut b = Backlog::new(Duration::from_secs(2));
        for _ in 0..50 {
            b.admitted(10 * MS, false);
        }
        for _ in 0..14 {
            b.admitted(500 * MS, false);
        }
        assert!(b.cost > 300 * MS, "the average is slow: {:?}", b.cost);
        let mut busy = Vec::new();
        for i in 0..20u32 {
            if let Verdict::Busy(_, after) = b.push(i, t0, false) {
                busy.push(after);
            }
        }
        assert!(busy.len() >= 2, "a full backlog turns away");
        assert_eq!(busy[1] - busy[0], 10 * MS);
    }

    /// A fresh target whose first admission was slow (cold) does not turn a burst away on
    /// that one measurement: until 16 are measured, only a request that has waited longer than
    /// the patience is. Catches a judgement ahead on one cold admission (guest tests open 64
    /// sessions at once from a fresh daemon).
    #[test]
    fn a_burst_is_not_turned_away_on_one_cold_admission() {
        let t0 = Instant::now();
        let mut b = Backlog::new(Duration::from_secs(2));
        b.admitted(Duration::from_millis(900), false);
        for i in 0..64u32 {
            assert_eq!(b.push(i, t0, false), Verdict::Queued);
        }
        let mut late = Vec::new();
        assert_eq!(b.next(t0 + Duration::from_secs(1), &mut late), Some((0, false)));
        assert!(late.is_empty());
    }

    /// However many are turned away, none is sent beyond the horizon (10 s): past it, the
    /// slots in line would park hosts ahead of an idle target if the cost was misjudged, so
    /// they are spread between the queued work's end and the horizon instead.
    #[test]
    fn come_back_times_stay_within_the_horizon() {
        let t0 = Instant::now();
        let mut b = costing(Duration::from_secs(1));
        let mut after = Vec::new();
        for i in 0..1000u32 {
            if let Verdict::Busy(_, a) = b.push(i, t0, false) {
                after.push(a);
            }
        }
        // Queued: 0, 1 and 2 s of work ahead (2 s is the patience); then slots 1 s apart from
        // 3 s + 1 s up to the horizon, then spread between 3 s and 10 s.
        assert_eq!(&after[..7], &[4, 5, 6, 7, 8, 9, 10].map(Duration::from_secs)[..]);
        assert!(after.iter().all(|&a| a >= Duration::from_secs(3) && a <= HORIZON), "{after:?}");
        let spread: std::collections::BTreeSet<_> = after[7..].iter().map(|a| a.as_millis() / 500).collect();
        assert!(spread.len() >= 10, "spread over the window, not one time: {spread:?}");
    }

    fn ip(n: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, n]))
    }

    /// Catches a pool that evicts the honest address's one place when a flood fills it (it
    /// must take a flooder's oldest), or lets a flooder keep its places while a newcomer waits.
    #[test]
    fn a_full_pool_evicts_the_biggest_address_never_one_with_fewer() {
        let mut p = Pool::default();
        p.admit(1, ip(99), 16, 8, 0.5).unwrap(); // the honest one, first in
        let mut next = 2;
        let mut evicted = Vec::new();
        // Eight flooders, many tries each, with rolls all over [0, 1).
        for round in 0..40u64 {
            for f in 1..=8 {
                let roll = ((round * 8 + u64::from(f)) % 97) as f64 / 97.0;
                if let Ok(e) = p.admit(next, ip(f), 16, 8, roll) {
                    evicted.extend(e);
                }
                next += 1;
            }
        }
        assert_eq!(p.queue.len(), 16, "the flood keeps the pool full");
        // A newcomer (no place yet) at a full pool: admitted, a flooder's oldest evicted.
        let e = p.admit(next, ip(100), 16, 8, 0.0).expect("a first place is never dropped early");
        evicted.extend(e.iter().copied());
        assert_eq!(e.len(), 1);
        assert!(e[0].1 != ip(99) && e[0].1 != ip(100), "{e:?}");
        assert!(evicted.iter().all(|&(c, a)| c != 1 && a != ip(99)), "the honest place stays: {evicted:?}");
        assert!(p.queue.contains(&(1, ip(99))));
    }

    /// Catches the per-address cap refusing an address's newest try (a retrying client locked
    /// out by its own dead tries) instead of evicting its oldest.
    #[test]
    fn an_address_at_its_cap_loses_its_oldest_place() {
        let mut p = Pool::default();
        for c in 1..=3 {
            assert!(p.admit(c, ip(1), 64, 3, 0.99).unwrap().is_empty());
        }
        assert_eq!(p.admit(4, ip(1), 64, 3, 0.99).unwrap(), vec![(1, ip(1))]);
        assert_eq!(p.held_by(ip(1)), 3);
        p.leave(2);
        assert!(p.admit(5, ip(1), 64, 3, 0.99).unwrap().is_empty(), "a place left: no eviction");
    }

    /// Catches early drop that hits an address's first place, or starts before half the cap,
    /// or does not grow to certain at the cap.
    #[test]
    fn early_drop_spares_first_places_and_grows_to_certain() {
        let mut p = Pool::default();
        for c in 0..4 {
            p.admit(c, ip(c as u8), 10, 10, 0.0).expect("below half: never dropped");
        }
        // 4 held: below start (5): a second place is not dropped even at roll 0.
        p.admit(10, ip(0), 10, 10, 0.0).expect("below half");
        // 5 held, start: probability 1/6.
        assert!(matches!(p.admit(11, ip(0), 10, 10, 0.1), Err(Crowded::Early { held: 5, mine: 2, .. })));
        p.admit(12, ip(0), 10, 10, 0.2).expect("roll above 1/6");
        p.admit(13, ip(7), 10, 10, 0.0).expect("a new address's first place: never dropped early");
        for c in 14..16 {
            p.admit(c, ip(9), 10, 10, 0.0).ok();
        }
        while p.queue.len() < 10 {
            p.admit(100 + p.queue.len() as u64, ip(50 + p.queue.len() as u8), 10, 10, 0.0).unwrap();
        }
        assert!(p.admit(200, ip(0), 10, 10, 0.999_999).is_err(), "at the cap: certain for a held address");
        let evict = p.admit(201, ip(77), 10, 10, 0.0).expect("a first place, at the cap: admitted");
        assert_eq!(evict.len(), 1, "one place made for it");
        assert_eq!(p.queue.len(), 10);
    }

    #[test]
    fn rolls_are_in_the_unit_interval() {
        for _ in 0..1000 {
            let r = roll();
            assert!((0.0..1.0).contains(&r), "{r}");
        }
    }
}
