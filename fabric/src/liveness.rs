//! Loss detection on a control channel, for both ends: when to send a keepalive, and when the
//! peer counts as gone because it went silent or a SEND of ours stopped completing. Neither end
//! relies on the transport's retry budget for this (rxe retries for ever with a retry count of
//! 7; a peer without RECVs posted stalls a SEND for ever).
//!
//! [`Liveness`] holds no clock of its own: every call takes `now`, so the rules are tested with
//! made-up instants. It sends nothing either; [`Liveness::poll`] says what to do and the caller
//! does it. The two ends apply the same rules at a different cadence ([`Rules`]): the target
//! sleeps until the next instant anything could happen, the initiator looks once per keepalive
//! interval.

use std::time::{Duration, Instant};

/// How one end applies the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// A keepalive is due this long after the last one was due.
    pub interval: Duration,
    /// Silence from the peer, or a watched SEND without progress, for this long means the peer
    /// is gone.
    pub timeout: Duration,
    /// When loss is looked for.
    pub cadence: Cadence,
    /// At most one keepalive outstanding: while a watched SEND is, a due keepalive is skipped
    /// (the target watches only its keepalives). Otherwise a due keepalive is always sent.
    pub one_keepalive: bool,
}

/// When [`Liveness::poll`] looks for loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cadence {
    /// At every poll; [`Liveness::next_check`] includes the instants loss would be found at
    /// (the target, which sleeps until then).
    EveryPoll,
    /// Only when a keepalive is due, and the due time moves on then whether or not one is sent
    /// (the initiator, which polls at every reap: between keepalives a poll is one comparison).
    KeepaliveDue,
}

/// What [`Liveness::poll`] says to do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing.
    Nothing,
    /// Send a keepalive (and tell [`Liveness::send_posted`] if it is a watched SEND).
    SendKeepalive,
    /// The peer sent nothing for this long, at least [`Rules::timeout`]: it is gone.
    Silent(Duration),
    /// A watched SEND made no progress for this long, at least [`Rules::timeout`]: the peer is
    /// gone.
    SendStuck(Duration),
}

/// One connection's loss detection and keepalive schedule (see the module docs).
#[derive(Debug, Clone)]
pub struct Liveness {
    rules: Rules,
    /// When the peer was last heard from.
    heard: Instant,
    /// Whether the peer's silence counts (it promised keepalives).
    silence_counts: bool,
    /// Since when a watched SEND has been outstanding without progress.
    send_since: Option<Instant>,
    keepalive_due: Instant,
    /// A probe under way ([`Liveness::probe`]): how long a watched SEND may go without
    /// progress until the peer counts as gone.
    probe: Option<Duration>,
    /// Whether keepalives are sent at all ([`Liveness::send_keepalives`]).
    sending: bool,
}

impl Liveness {
    /// A connection established at `now`: heard from then, a keepalive due one interval later,
    /// the peer's silence counting, no SEND watched.
    pub fn new(rules: Rules, now: Instant) -> Liveness {
        Liveness {
            rules,
            heard: now,
            silence_counts: true,
            send_since: None,
            keepalive_due: now + rules.interval,
            probe: None,
            sending: true,
        }
    }

    /// Whether this end sends keepalives (on by default). Off, no keepalive is offered and none
    /// is due (a connection whose liveness is its session's: see
    /// `rblk_proto::FEATURE_SESSION_KEEPALIVE`), except for a probe's; turned on again, the one
    /// due is offered at once.
    pub fn send_keepalives(&mut self, on: bool) {
        self.sending = on;
    }

    /// Whether a keepalive may be due: this end sends them, or a probe asks for one.
    fn keepalives_due(&self) -> bool {
        self.sending || self.probe.is_some()
    }

    /// Whether the peer's silence counts: only a peer that promised keepalives can be silent
    /// for too long.
    pub fn expect_keepalives(&mut self, on: bool) {
        self.silence_counts = on;
    }

    /// A message from the peer arrived (or was handled) at `now`. It answers a probe.
    pub fn heard(&mut self, now: Instant) {
        self.heard = now;
        self.probe = None;
    }

    /// Asks at `now` whether the peer is still there, sooner than the timeout would tell: a
    /// keepalive is due at once (or the one outstanding is watched), and a watched SEND without
    /// progress for `wait` (counted from its post, which may be before `now`) means the peer
    /// is gone ([`Action::SendStuck`]). A SEND that completes, or a message from the peer,
    /// answers it. For a target whose host is at its session cap: a host that vanished without
    /// a disconnect leaves a keepalive of ours unacknowledged, and its sessions make room for
    /// its next ones before the timeout would.
    pub fn probe(&mut self, now: Instant, wait: Duration) {
        self.probe = Some(wait);
        self.keepalive_due = self.keepalive_due.min(now);
    }

    /// Whether a probe is under way (not answered yet).
    pub fn probing(&self) -> bool {
        self.probe.is_some()
    }

    /// How long a watched SEND may go without progress: the timeout, or a probe's shorter wait.
    fn stuck_after(&self) -> Duration {
        self.probe.map_or(self.rules.timeout, |wait| wait.min(self.rules.timeout))
    }

    /// When the peer was last heard from.
    pub fn last_heard(&self) -> Instant {
        self.heard
    }

    /// A watched SEND was posted at `now`: the stuck clock starts, unless one is outstanding
    /// already (then it keeps running from that one's start or last progress).
    pub fn send_posted(&mut self, now: Instant) {
        self.send_since.get_or_insert(now);
    }

    /// Progress at `now` while watched SENDs stay outstanding (one of them completed, or time
    /// the caller spent serving a request should not count): a running stuck clock restarts.
    pub fn send_progress(&mut self, now: Instant) {
        if let Some(since) = &mut self.send_since {
            *since = now;
        }
    }

    /// Every watched SEND completed: the stuck clock stops, and a probe is answered.
    pub fn sends_done(&mut self) {
        self.send_since = None;
        self.probe = None;
    }

    /// Whether a watched SEND is outstanding.
    pub fn send_outstanding(&self) -> bool {
        self.send_since.is_some()
    }

    /// What to do at `now`. `heard_elsewhere` counts as hearing from the peer too (the
    /// initiator's session, heard on another connection while this one waits for a reply).
    /// `may_send` false: no keepalive now (and, at [`Cadence::EveryPoll`], the one due stays
    /// due). Loss is checked before a keepalive is offered: silence first, then a stuck SEND.
    pub fn poll(&mut self, now: Instant, heard_elsewhere: Option<Instant>, may_send: bool) -> Action {
        let due = now >= self.keepalive_due;
        if self.rules.cadence == Cadence::KeepaliveDue {
            if !due {
                return Action::Nothing;
            }
            self.keepalive_due = now + self.rules.interval;
        }
        let heard = heard_elsewhere.map_or(self.heard, |h| h.max(self.heard));
        if self.silence_counts && now >= heard + self.rules.timeout {
            return Action::Silent(now.saturating_duration_since(heard));
        }
        if let Some(since) = self.send_since.filter(|since| now >= *since + self.stuck_after()) {
            return Action::SendStuck(now.saturating_duration_since(since));
        }
        if due && may_send && self.keepalives_due() {
            self.keepalive_due = now + self.rules.interval;
            if !(self.rules.one_keepalive && self.send_outstanding()) {
                return Action::SendKeepalive;
            }
        }
        Action::Nothing
    }

    /// The next instant [`poll`](Self::poll) has something to do: the keepalive due, and at
    /// [`Cadence::EveryPoll`] also the instants silence or a stuck SEND would be found.
    pub fn next_check(&self) -> Instant {
        let due = self.keepalive_due;
        if self.rules.cadence == Cadence::KeepaliveDue {
            return due;
        }
        let timeout = self.rules.timeout;
        let stuck = self.stuck_after();
        let silence = self.heard + timeout;
        [
            self.keepalives_due().then_some(due),
            self.silence_counts.then_some(silence),
            self.send_since.map(|since| since + stuck),
        ]
        .into_iter()
        .flatten()
        .min()
        // Nothing can happen: look again once a timeout's silence would have passed.
        .unwrap_or(silence.max(due))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn rules(cadence: Cadence, one_keepalive: bool) -> Rules {
        Rules { interval: 5 * S, timeout: 15 * S, cadence, one_keepalive }
    }

    fn target(t0: Instant) -> Liveness {
        Liveness::new(rules(Cadence::EveryPoll, true), t0)
    }

    fn initiator(t0: Instant) -> Liveness {
        Liveness::new(rules(Cadence::KeepaliveDue, false), t0)
    }

    #[test]
    fn a_keepalive_is_due_every_interval() {
        let t0 = Instant::now();
        for mut l in [target(t0), initiator(t0)] {
            assert_eq!(l.next_check(), t0 + 5 * S);
            assert_eq!(l.poll(t0 + 4 * S, None, true), Action::Nothing);
            assert_eq!(l.poll(t0 + 5 * S, None, true), Action::SendKeepalive);
            assert_eq!(l.poll(t0 + 6 * S, None, true), Action::Nothing, "not again before the next interval");
            assert_eq!(l.next_check(), t0 + 10 * S);
        }
    }

    #[test]
    fn silence_for_the_timeout_is_loss() {
        let t0 = Instant::now();
        for mut l in [target(t0), initiator(t0)] {
            l.heard(t0 + 10 * S);
            assert_eq!(l.poll(t0 + 24 * S, None, false), Action::Nothing);
            assert_eq!(l.poll(t0 + 30 * S, None, false), Action::Silent(20 * S));
        }
    }

    #[test]
    fn silence_counts_only_from_a_peer_that_promised_keepalives() {
        let t0 = Instant::now();
        let mut l = target(t0);
        l.expect_keepalives(false);
        assert_eq!(l.next_check(), t0 + 5 * S);
        assert_eq!(l.poll(t0 + 60 * S, None, false), Action::Nothing);
        l.expect_keepalives(true);
        assert_eq!(l.poll(t0 + 60 * S, None, false), Action::Silent(60 * S));
    }

    /// Catches a connection whose keepalives are off still sending them, or waking at a due
    /// time that stays in the past (a busy loop), and a probe that cannot send.
    #[test]
    fn keepalives_off_send_none_and_wake_only_for_silence_or_a_probe() {
        let t0 = Instant::now();
        let mut l = target(t0);
        l.send_keepalives(false);
        assert_eq!(l.next_check(), t0 + 15 * S, "the silence timeout, not the keepalive due");
        assert_eq!(l.poll(t0 + 6 * S, None, true), Action::Nothing);
        assert_eq!(l.next_check(), t0 + 15 * S, "no due time left in the past");
        l.heard(t0 + 10 * S);
        assert_eq!(l.poll(t0 + 12 * S, None, true), Action::Nothing);
        assert_eq!(l.poll(t0 + 25 * S, None, true), Action::Silent(15 * S), "silence still counts");
        let mut l = target(t0);
        l.send_keepalives(false);
        l.expect_keepalives(false);
        assert!(l.next_check() >= t0 + 15 * S, "nothing to do: no wake before a timeout");
        l.probe(t0 + 7 * S, 2 * S);
        assert_eq!(l.poll(t0 + 7 * S, None, true), Action::SendKeepalive, "a probe sends");
        l.send_posted(t0 + 7 * S);
        assert_eq!(l.next_check(), t0 + 9 * S);
        l.sends_done();
        l.send_keepalives(true);
        assert_eq!(l.poll(t0 + 8 * S, None, true), Action::Nothing, "the probe's keepalive was the one due");
        assert_eq!(l.poll(t0 + 12 * S, None, true), Action::SendKeepalive, "on again: every interval");
    }

    #[test]
    fn hearing_elsewhere_counts() {
        let t0 = Instant::now();
        let mut l = initiator(t0);
        assert_eq!(l.poll(t0 + 20 * S, Some(t0 + 19 * S), false), Action::Nothing);
        assert_eq!(l.last_heard(), t0, "what was heard elsewhere is not this connection's");
        assert_eq!(l.poll(t0 + 25 * S, None, false), Action::Silent(25 * S));
    }

    #[test]
    fn a_send_without_progress_for_the_timeout_is_loss() {
        let t0 = Instant::now();
        for mut l in [target(t0), initiator(t0)] {
            l.send_posted(t0);
            l.send_posted(t0 + 3 * S);
            l.heard(t0 + 14 * S);
            assert_eq!(l.poll(t0 + 15 * S, None, false), Action::SendStuck(15 * S), "from the first post");
        }
    }

    #[test]
    fn progress_restarts_the_stuck_clock_and_done_stops_it() {
        let t0 = Instant::now();
        let mut l = target(t0);
        l.send_progress(t0);
        assert!(!l.send_outstanding(), "progress starts no clock");
        l.send_posted(t0);
        l.send_progress(t0 + 10 * S);
        l.heard(t0 + 20 * S);
        assert_eq!(l.poll(t0 + 20 * S, None, false), Action::Nothing);
        assert_eq!(l.poll(t0 + 25 * S, None, false), Action::SendStuck(15 * S));
        l.sends_done();
        assert_eq!(l.poll(t0 + 26 * S, None, false), Action::Nothing);
    }

    #[test]
    fn silence_is_reported_before_a_stuck_send() {
        let t0 = Instant::now();
        let mut l = target(t0);
        l.send_posted(t0);
        assert_eq!(l.poll(t0 + 15 * S, None, true), Action::Silent(15 * S));
    }

    #[test]
    fn one_keepalive_at_a_time_on_the_target() {
        let t0 = Instant::now();
        let mut l = target(t0);
        assert_eq!(l.poll(t0 + 5 * S, None, true), Action::SendKeepalive);
        l.send_posted(t0 + 5 * S);
        assert_eq!(l.poll(t0 + 10 * S, None, true), Action::Nothing, "the last one is outstanding");
        assert_eq!(l.next_check(), t0 + 15 * S, "skipped, the next one is due an interval later");
        l.sends_done();
        l.heard(t0 + 15 * S);
        assert_eq!(l.poll(t0 + 15 * S, None, true), Action::SendKeepalive);
    }

    #[test]
    fn the_initiator_keeps_sending_while_sends_are_outstanding() {
        let t0 = Instant::now();
        let mut l = initiator(t0);
        l.send_posted(t0);
        assert_eq!(l.poll(t0 + 5 * S, None, true), Action::SendKeepalive);
    }

    #[test]
    fn a_due_keepalive_stays_due_on_the_target_while_it_may_not_send() {
        let t0 = Instant::now();
        let mut l = target(t0);
        assert_eq!(l.poll(t0 + 6 * S, None, false), Action::Nothing);
        assert_eq!(l.next_check(), t0 + 5 * S);
        assert_eq!(l.poll(t0 + 7 * S, None, true), Action::SendKeepalive);
        assert_eq!(l.next_check(), t0 + 12 * S);
    }

    #[test]
    fn the_initiator_moves_on_at_each_interval_even_without_sending() {
        let t0 = Instant::now();
        let mut l = initiator(t0);
        assert_eq!(l.poll(t0 + 6 * S, None, false), Action::Nothing);
        assert_eq!(l.next_check(), t0 + 11 * S);
    }

    #[test]
    fn the_initiator_looks_for_loss_only_when_a_keepalive_is_due() {
        let t0 = Instant::now();
        let mut l = initiator(t0);
        l.send_posted(t0);
        assert_eq!(l.poll(t0 + 14 * S, None, false), Action::Nothing);
        assert_eq!(l.next_check(), t0 + 19 * S, "no earlier look for loss");
        assert_eq!(l.poll(t0 + 16 * S, None, false), Action::Nothing, "between keepalives");
        assert_eq!(l.poll(t0 + 19 * S, None, false), Action::Silent(19 * S));
    }

    /// Catches a probe that sends nothing, waits for the full timeout, or ends a peer that
    /// answered.
    #[test]
    fn a_probe_sends_at_once_and_an_unacknowledged_one_is_loss_after_its_wait() {
        let t0 = Instant::now();
        let mut l = target(t0);
        l.probe(t0 + S, 2 * S);
        assert!(l.probing());
        assert_eq!(l.next_check(), t0 + S, "due at once");
        assert_eq!(l.poll(t0 + S, None, true), Action::SendKeepalive);
        l.send_posted(t0 + S);
        assert_eq!(l.next_check(), t0 + 3 * S, "the probe's wait, not the timeout");
        assert_eq!(l.poll(t0 + 2 * S, None, true), Action::Nothing);
        assert_eq!(l.poll(t0 + 3 * S, None, true), Action::SendStuck(2 * S));
        // Answered by the SEND's completion: the timeout applies again.
        let mut l = target(t0);
        l.probe(t0, 2 * S);
        assert_eq!(l.poll(t0, None, true), Action::SendKeepalive);
        l.send_posted(t0);
        l.sends_done();
        assert!(!l.probing());
        l.send_posted(t0 + 5 * S);
        assert_eq!(l.poll(t0 + 8 * S, None, true), Action::Nothing, "an answered probe shortens nothing");
        // Answered by a message from the peer.
        let mut l = target(t0);
        l.probe(t0, 2 * S);
        l.send_posted(t0);
        l.heard(t0 + S);
        assert_eq!(l.poll(t0 + 4 * S, None, true), Action::Nothing);
    }

    /// Catches a probe that restarts the clock of a keepalive already outstanding: a peer that
    /// left it unacknowledged for longer than the wait is gone at once.
    #[test]
    fn a_probe_counts_the_outstanding_keepalive_from_its_post() {
        let t0 = Instant::now();
        let mut l = target(t0);
        l.send_posted(t0);
        l.heard(t0 + 4 * S);
        l.probe(t0 + 4 * S, 2 * S);
        assert_eq!(l.poll(t0 + 4 * S, None, true), Action::SendStuck(4 * S));
    }

    #[test]
    fn the_target_wakes_when_loss_would_be_found() {
        let t0 = Instant::now();
        let mut l = target(t0);
        assert_eq!(l.poll(t0 + 5 * S, None, true), Action::SendKeepalive);
        assert_eq!(l.next_check(), t0 + 10 * S);
        l.heard(t0 + 9 * S);
        l.send_posted(t0 + 4 * S);
        assert_eq!(l.poll(t0 + 9 * S, None, true), Action::Nothing);
        assert_eq!(l.next_check(), t0 + 10 * S);
        assert_eq!(l.poll(t0 + 10 * S, None, true), Action::Nothing, "outstanding: no second keepalive");
        assert_eq!(l.next_check(), t0 + 15 * S);
        l.expect_keepalives(true);
        l.heard(t0 + 12 * S);
        assert_eq!(l.next_check(), t0 + 15 * S, "the next keepalive");
        assert_eq!(l.poll(t0 + 19 * S, None, false), Action::SendStuck(15 * S));
    }
}
