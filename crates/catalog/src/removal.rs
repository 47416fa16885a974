//! Removing what readers may hold: on Mooncake a key read in the last `default_kv_lease_ttl`
//! (10 s by default) cannot be removed, so every removal waits leases out the same way.

use jitship_store::{Store, StoreError};

/// How a removal waits out readers' leases (Mooncake refuses to remove a key read in the last
/// `default_kv_lease_ttl`, 10 s by default): up to `rounds` more attempts, `interval` apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseWait {
    pub interval: std::time::Duration,
    pub rounds: u32,
}

impl LeaseWait {
    /// One key a command itself just read (a pin, a pack `verify` fetched): retried every half
    /// second for up to 30 s.
    pub const ONE_KEY: Self = Self {
        interval: std::time::Duration::from_millis(500),
        rounds: 60,
    };
}

/// What a removal did: the keys that were there and are gone, and the keys it could not remove
/// (still leased after the last round, or the store failing), with why.
#[derive(Debug, Default)]
pub struct Removal {
    pub removed: Vec<String>,
    pub failed: Vec<(String, StoreError)>,
}

/// Removes `keys`, each round trying every key still leased, `wait.interval` apart. The one way
/// jitship removes what readers may hold (gc, unpin, repair): waiting is what keeps a removal from
/// pulling data from under an install on Mooncake. A key already gone is neither removed nor
/// failed.
pub fn remove_waiting_out_leases(store: &dyn Store, keys: &[String], wait: LeaseWait) -> Removal {
    let mut out = Removal::default();
    let mut pending: Vec<&String> = keys.iter().collect();
    for round in 0..=wait.rounds {
        if pending.is_empty() {
            break;
        }
        if round == 1 {
            tracing::info!(
                keys = pending.len(),
                every = ?wait.interval,
                rounds = wait.rounds,
                "keys are leased by readers; waiting before removing them"
            );
        }
        if round > 0 {
            std::thread::sleep(wait.interval);
        }
        let mut leased = Vec::new();
        for key in pending {
            match store.remove(key) {
                Ok(true) => out.removed.push(key.clone()),
                Ok(false) => {}
                Err(StoreError::Leased(_)) if round < wait.rounds => leased.push(key),
                Err(e) => out.failed.push((key.clone(), e)),
            }
        }
        pending = leased;
    }
    out
}

/// [`remove_waiting_out_leases`] for one key: whether it was there, or why it could not go.
pub fn remove_one(store: &dyn Store, key: &str, wait: LeaseWait) -> Result<bool, StoreError> {
    let mut r = remove_waiting_out_leases(store, &[key.to_owned()], wait);
    match r.failed.pop() {
        Some((_, e)) => Err(e),
        None => Ok(!r.removed.is_empty()),
    }
}
