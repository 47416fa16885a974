//! Trying a call again when Mooncake answered with a failure that passes by itself: the master
//! not answering (RPC_FAIL, RPC_TIMEOUT, an HA master not serving yet: a restart, a failover), a
//! store node not answering (TRANSFER_FAIL, CHECKSUM_MISMATCH), replicas busy, a read that
//! outlived its lease, and a store with no room (right after a master restart, the store nodes
//! have not registered again yet). Every call of the backend is safe to repeat: puts are immutable (an
//! existing key keeps its value), gets, existence checks and removes change nothing more the
//! second time.
//!
//! Bounded by `[store.mooncake] retry_for` from the first failure, with a jittered exponential
//! backoff (a fleet that lost its master together must not come back in step). A call that timed
//! out (`call_timeout`) is not tried again: its thread may still be inside the library, and more
//! would pile up. Over a durable tier the fast tier does not retry (`store::open` sets
//! `retry_for` to 0): the durable tier answers at once, which is what it is for. An install's
//! deadline still holds: the install gives up waiting for its job at the deadline, whatever the
//! job is doing.

use std::time::{Duration, Instant};

use crate::{StoreError, StoreResult};

/// The first wait; each next one doubles, up to [`MAX_WAIT`].
const FIRST_WAIT: Duration = Duration::from_millis(100);
const MAX_WAIT: Duration = Duration::from_secs(2);

/// Whether a failure is worth trying again within the budget. NO_AVAILABLE_HANDLE (`NoSpace`)
/// is: right after a master restart every put gets it until the store nodes have registered
/// again (seen in the restart drill, after `wait-node` returned), and on a full store eviction
/// frees room behind it. A store that stays full still fails, `retry_for` later.
pub(super) fn retryable(e: &StoreError) -> bool {
    (e.is_transient() || matches!(e, StoreError::NoSpace(_)))
        && !matches!(e, StoreError::Timeout(_))
}

/// The waits between tries: doubling from [`FIRST_WAIT`] to [`MAX_WAIT`], each drawn between
/// half and all of that, and none past the budget.
pub(super) struct Backoff {
    next: Duration,
    left: Duration,
}

impl Backoff {
    pub(super) fn new(budget: Duration) -> Self {
        Self {
            next: FIRST_WAIT,
            left: budget,
        }
    }

    /// The wait before the next try, after a try that took `spent`; `None` once the budget is
    /// spent.
    pub(super) fn wait(&mut self, spent: Duration) -> Option<Duration> {
        self.left = self.left.saturating_sub(spent);
        let full = self.next.min(MAX_WAIT);
        let wait = full / 2 + full.mul_f64(fastrand::f64() / 2.0);
        if wait >= self.left {
            return None;
        }
        self.left -= wait;
        self.next = full * 2;
        Some(wait)
    }
}

/// Runs `op` until it succeeds, fails for good, or `budget` is spent; `on_retry` is told each
/// failure that will be tried again.
pub(super) fn retrying<T>(
    budget: Duration,
    mut op: impl FnMut() -> StoreResult<T>,
    mut on_retry: impl FnMut(&StoreError, Duration),
) -> StoreResult<T> {
    let mut backoff = Backoff::new(budget);
    loop {
        let started = Instant::now();
        let result = op();
        match &result {
            Err(e) if retryable(e) => match backoff.wait(started.elapsed()) {
                Some(wait) => {
                    on_retry(e, wait);
                    std::thread::sleep(wait);
                }
                None => return result,
            },
            _ => return result,
        }
    }
}

/// Answers `n` keys with `batch(indexes)` (one answer per index given, in order), then asks
/// again for the keys whose answer was a retryable failure, all together, until none is left or
/// `budget` is spent.
pub(super) fn retrying_batch<T>(
    n: usize,
    budget: Duration,
    mut batch: impl FnMut(&[usize]) -> Vec<StoreResult<T>>,
    mut on_retry: impl FnMut(&StoreError, usize, Duration),
) -> Vec<StoreResult<T>> {
    let all: Vec<usize> = (0..n).collect();
    let mut backoff = Backoff::new(budget);
    let started = Instant::now();
    let mut out = batch(&all);
    let mut spent = started.elapsed();
    loop {
        let again: Vec<usize> = (0..n)
            .filter(|&i| matches!(&out[i], Err(e) if retryable(e)))
            .collect();
        let Some(first) = again.first() else {
            return out;
        };
        let Some(wait) = backoff.wait(spent) else {
            return out;
        };
        if let Err(e) = &out[*first] {
            on_retry(e, again.len(), wait);
        }
        std::thread::sleep(wait);
        let started = Instant::now();
        for (i, r) in again.iter().zip(batch(&again)) {
            out[*i] = r;
        }
        spent = started.elapsed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_waits_double_with_jitter_up_to_the_cap_and_stop_at_the_budget() {
        for _ in 0..50 {
            let mut b = Backoff::new(Duration::from_secs(10));
            let mut total = Duration::ZERO;
            let mut full = FIRST_WAIT;
            while let Some(w) = b.wait(Duration::ZERO) {
                assert!(
                    w >= full / 2 && w <= full,
                    "{w:?} outside [{:?}, {full:?}]",
                    full / 2
                );
                total += w;
                full = (full * 2).min(MAX_WAIT);
            }
            assert!(total < Duration::from_secs(10), "{total:?}");
            // Everything but the last wait's worth of the budget was used.
            assert!(total > Duration::from_secs(10) - MAX_WAIT, "{total:?}");
        }
    }

    #[test]
    fn time_spent_in_the_calls_counts_against_the_budget() {
        let mut b = Backoff::new(Duration::from_secs(5));
        assert!(b.wait(Duration::from_secs(4)).is_some());
        assert!(b.wait(Duration::from_secs(1)).is_none());
        assert!(Backoff::new(Duration::ZERO).wait(Duration::ZERO).is_none());
    }

    #[test]
    fn only_failures_that_pass_by_themselves_are_retried_and_never_a_timeout() {
        assert!(retryable(&StoreError::MasterDown("m".into())));
        assert!(retryable(&StoreError::NodeDown("n".into())));
        assert!(retryable(&StoreError::Unavailable("busy".into())));
        assert!(retryable(&StoreError::LeaseExpired("slow".into())));
        assert!(!retryable(&StoreError::Timeout(Duration::from_secs(30))));
        assert!(retryable(&StoreError::NoSpace(
            "nodes not registered yet".into()
        )));
        assert!(!retryable(&StoreError::Leased("k".into())));
        assert!(!retryable(&StoreError::InvalidKey("k".into())));
    }

    #[test]
    fn a_call_is_tried_until_it_succeeds_and_a_lasting_failure_is_returned() {
        let mut calls = 0;
        let mut told = vec![];
        let r = retrying(
            Duration::from_secs(10),
            || {
                calls += 1;
                if calls < 3 {
                    Err(StoreError::MasterDown("restarting".into()))
                } else {
                    Ok(calls)
                }
            },
            |e, _| told.push(e.to_string()),
        );
        assert_eq!(r.unwrap(), 3);
        assert_eq!(told.len(), 2);
        let mut calls = 0;
        let r: StoreResult<()> = retrying(
            Duration::from_secs(10),
            || {
                calls += 1;
                Err(StoreError::InvalidKey("k".into()))
            },
            |_, _| panic!("an invalid key is not retried"),
        );
        assert!(matches!(r, Err(StoreError::InvalidKey(_))));
        assert_eq!(calls, 1);
        // No budget: one try.
        let mut calls = 0;
        let r: StoreResult<()> = retrying(
            Duration::ZERO,
            || {
                calls += 1;
                Err(StoreError::MasterDown("down".into()))
            },
            |_, _| panic!("no budget, no retry"),
        );
        assert!(r.is_err());
        assert_eq!(calls, 1);
    }

    #[test]
    fn a_batch_asks_again_only_for_the_keys_that_failed_transiently() {
        let mut asked: Vec<Vec<usize>> = vec![];
        let out = retrying_batch(
            4,
            Duration::from_secs(10),
            |idx| {
                asked.push(idx.to_vec());
                let round = asked.len();
                idx.iter()
                    .map(|&i| match (i, round) {
                        (0, _) => Ok(Some(0)),
                        (1, _) => Ok(None),
                        (2, 1) => Err(StoreError::NodeDown("node".into())),
                        (2, _) => Ok(Some(2)),
                        (3, _) => Err(StoreError::InvalidKey("k".into())),
                        _ => unreachable!(),
                    })
                    .collect()
            },
            |_, n, _| assert_eq!(n, 1),
        );
        assert_eq!(asked, vec![vec![0, 1, 2, 3], vec![2]]);
        assert_eq!(out[0].as_ref().unwrap(), &Some(0));
        assert_eq!(out[1].as_ref().unwrap(), &None);
        assert_eq!(out[2].as_ref().unwrap(), &Some(2));
        assert!(matches!(out[3], Err(StoreError::InvalidKey(_))));
    }
}
