//! When each root is due for a publish cycle. Pure: every function takes `now`, so the settle
//! window, the minimum interval, the retry backoff and the rescan timer are unit-tested without
//! sleeping. The event loop in `mod.rs` only asks "what is due, and when is the next thing due".

use std::time::{Duration, Instant};

/// The timing settings the schedule needs (a subset of `WatchOptions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Quiet time after the last change before a cycle.
    pub settle: Duration,
    /// Least time between two publishes (new generations) of one root. Cycles that find nothing
    /// new do not count: they cost no upload and make no generation.
    pub min_interval: Duration,
    /// Full rescan of every root this often, whatever the events say.
    pub rescan_interval: Duration,
}

/// Longest wait before retrying a root whose cycle failed.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// Longest wait while the store does not answer: retrying costs one connection probe, and the
/// first cycle after the store comes back should not wait minutes.
pub const STORE_MAX_BACKOFF: Duration = Duration::from_secs(30);
const FIRST_BACKOFF: Duration = Duration::from_secs(2);

/// Scheduling state of one root. Nothing here is persisted: after a restart every root starts
/// pending, and the first cycle finds out from the store and the disk what is left to publish.
#[derive(Debug, Clone)]
pub struct RootSchedule {
    /// Something under the root may not be published yet.
    pub pending: bool,
    /// Last change seen (event or rescan difference): the settle window counts from here.
    pub last_change: Instant,
    /// Start of the running or last cycle.
    pub last_attempt: Option<Instant>,
    /// Start of the last cycle that made a new generation (for the minimum interval).
    pub last_publish: Option<Instant>,
    /// Consecutive failed cycles.
    pub failures: u32,
    /// No retry before this, after a failure.
    pub retry_at: Option<Instant>,
}

impl RootSchedule {
    /// A root seen for the first time: pending, so the first cycle publishes whatever was written
    /// while no watcher ran (restart safety).
    pub fn new(now: Instant) -> Self {
        Self {
            pending: true,
            last_change: now,
            last_attempt: None,
            last_publish: None,
            failures: 0,
            retry_at: None,
        }
    }

    pub fn changed(&mut self, now: Instant) {
        self.pending = true;
        self.last_change = now;
    }

    /// When this root may start its next cycle, if it has anything pending.
    pub fn due_at(&self, t: &Timing) -> Option<Instant> {
        if !self.pending {
            return None;
        }
        let mut at = self.last_change + t.settle;
        if let Some(last) = self.last_publish {
            at = at.max(last + t.min_interval);
        }
        if let Some(retry) = self.retry_at {
            at = at.max(retry);
        }
        Some(at)
    }

    pub fn is_due(&self, t: &Timing, now: Instant) -> bool {
        self.due_at(t).is_some_and(|at| at <= now)
    }

    /// A cycle starts: what changes from here on needs another cycle.
    pub fn cycle_started(&mut self, now: Instant) {
        self.pending = false;
        self.last_attempt = Some(now);
    }

    /// `published`: the cycle made a new generation.
    pub fn cycle_succeeded(&mut self, published: bool) {
        if published {
            self.last_publish = self.last_attempt;
        }
        self.failures = 0;
        self.retry_at = None;
    }

    /// The cycle failed: pending again, retried after an exponential backoff (2 s, 4 s, ... up
    /// to `max`) so a store outage is not hammered. `jitter` (in [0, 1), from [`jitter`]) takes
    /// up to a quarter off, so sidecars that failed together do not all retry together.
    pub fn cycle_failed(&mut self, now: Instant, jitter: f64, max: Duration) {
        self.pending = true;
        self.failures = self.failures.saturating_add(1);
        let exp = self.failures.saturating_sub(1).min(16);
        let backoff = FIRST_BACKOFF.saturating_mul(1u32 << exp).min(max);
        let off = backoff.mul_f64(jitter.clamp(0.0, 1.0) / 4.0);
        self.retry_at = Some(now + (backoff - off));
    }
}

/// A number in [0, 1) that differs between calls and processes (std's random hash keys: no
/// dependency for a backoff's jitter).
pub fn jitter() -> f64 {
    use std::hash::{BuildHasher, RandomState};
    let bits = RandomState::new().hash_one(Instant::now());
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// The rescan timer: due every `rescan_interval` from the last rescan.
#[derive(Debug, Clone)]
pub struct Rescan {
    pub next: Instant,
}

impl Rescan {
    pub fn new(now: Instant, t: &Timing) -> Self {
        Self {
            next: now + t.rescan_interval,
        }
    }

    pub fn done(&mut self, now: Instant, t: &Timing) {
        self.next = now + t.rescan_interval;
    }

    /// Asked for early (inotify overflowed, a watch could not be added).
    pub fn soon(&mut self, now: Instant) {
        self.next = self.next.min(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> Timing {
        Timing {
            settle: Duration::from_secs(5),
            min_interval: Duration::from_secs(30),
            rescan_interval: Duration::from_secs(60),
        }
    }

    #[test]
    fn new_root_is_due_after_the_settle_window() {
        let t0 = Instant::now();
        let s = RootSchedule::new(t0);
        assert!(!s.is_due(&timing(), t0 + Duration::from_secs(4)));
        assert!(s.is_due(&timing(), t0 + Duration::from_secs(5)));
    }

    #[test]
    fn every_change_restarts_the_settle_window() {
        let t0 = Instant::now();
        let t = timing();
        let mut s = RootSchedule::new(t0);
        s.changed(t0 + Duration::from_secs(4));
        assert!(!s.is_due(&t, t0 + Duration::from_secs(8)));
        assert_eq!(s.due_at(&t), Some(t0 + Duration::from_secs(9)));
    }

    #[test]
    fn nothing_pending_is_never_due_and_the_minimum_interval_holds() {
        let t0 = Instant::now();
        let t = timing();
        let mut s = RootSchedule::new(t0);
        s.cycle_started(t0 + Duration::from_secs(5));
        s.cycle_succeeded(true);
        assert_eq!(s.due_at(&t), None);
        // A change 1 s after the publish: settle says 11 s, the minimum interval says 35 s.
        s.changed(t0 + Duration::from_secs(6));
        assert_eq!(s.due_at(&t), Some(t0 + Duration::from_secs(35)));
    }

    #[test]
    fn cycles_that_publish_nothing_do_not_hold_the_next_publish() {
        let t0 = Instant::now();
        let t = timing();
        let mut s = RootSchedule::new(t0);
        s.cycle_started(t0 + Duration::from_secs(5));
        s.cycle_succeeded(false);
        s.changed(t0 + Duration::from_secs(7));
        assert_eq!(s.due_at(&t), Some(t0 + Duration::from_secs(12)));
    }

    #[test]
    fn a_change_during_a_cycle_keeps_the_root_pending() {
        let t0 = Instant::now();
        let mut s = RootSchedule::new(t0);
        s.cycle_started(t0);
        s.changed(t0 + Duration::from_millis(10));
        s.cycle_succeeded(true);
        assert!(s.pending);
    }

    #[test]
    fn failures_back_off_exponentially_up_to_a_bound() {
        let t0 = Instant::now();
        let t = Timing {
            min_interval: Duration::ZERO,
            ..timing()
        };
        let mut s = RootSchedule::new(t0);
        let mut waits = Vec::new();
        for _ in 0..12 {
            s.cycle_started(t0);
            s.cycle_failed(t0, 0.0, MAX_BACKOFF);
            waits.push(s.due_at(&t).unwrap() - t0);
        }
        // The settle window (5 s) dominates the first backoffs.
        assert_eq!(waits[0], Duration::from_secs(5));
        assert_eq!(waits[2], Duration::from_secs(8));
        assert_eq!(waits[3], Duration::from_secs(16));
        assert_eq!(*waits.last().unwrap(), MAX_BACKOFF);
        s.cycle_started(t0);
        s.cycle_succeeded(false);
        assert_eq!(s.failures, 0);
        assert_eq!(s.retry_at, None);
    }

    #[test]
    fn jitter_shortens_a_backoff_by_at_most_a_quarter_and_the_store_cap_holds() {
        let t0 = Instant::now();
        let t = Timing {
            min_interval: Duration::ZERO,
            settle: Duration::ZERO,
            ..timing()
        };
        for _ in 0..100 {
            let j = jitter();
            assert!((0.0..1.0).contains(&j), "{j}");
        }
        let mut s = RootSchedule::new(t0);
        for _ in 0..12 {
            s.cycle_started(t0);
            s.cycle_failed(t0, 0.999, STORE_MAX_BACKOFF);
            let wait = s.due_at(&t).unwrap() - t0;
            assert!(wait <= STORE_MAX_BACKOFF, "{wait:?}");
            assert!(wait >= Duration::from_millis(1500), "{wait:?}");
        }
        assert!(s.due_at(&t).unwrap() - t0 > STORE_MAX_BACKOFF * 3 / 4 - Duration::from_millis(1));
    }

    #[test]
    fn rescan_can_be_pulled_forward() {
        let t0 = Instant::now();
        let t = timing();
        let mut r = Rescan::new(t0, &t);
        assert_eq!(r.next, t0 + Duration::from_secs(60));
        r.soon(t0 + Duration::from_secs(1));
        assert_eq!(r.next, t0 + Duration::from_secs(1));
        r.done(t0 + Duration::from_secs(1), &t);
        assert_eq!(r.next, t0 + Duration::from_secs(61));
    }
}
