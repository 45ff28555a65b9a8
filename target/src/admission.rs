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
//! [`Config::max_unopened`]: crate::config::Config::max_unopened
//! [`Config::max_unopened_per_addr`]: crate::config::Config::max_unopened_per_addr

use std::collections::VecDeque;
use std::net::IpAddr;

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
