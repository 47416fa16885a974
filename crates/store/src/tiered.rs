//! A fast tier (Mooncake: RDMA-fast, but it evicts, and a restarted master forgets everything) over
//! a durable one (a local or shared directory) that outlives it. One `Store` to everything above.
//!
//! - Writes go to the durable tier first, so a generation is announced (its head record, written
//!   last by publish) in the durable tier only once its packs and manifest are there. A write the
//!   durable tier refuses fails; one the fast tier refuses is logged and counted (the durable tier
//!   holds it, and the next read repairs it). A pack publish finds in the fast tier alone (a
//!   durable tier added later, or one that lost data) is not rewritten by this store: publish asks
//!   each tier ([`Store::tiers`]) and copies what it checked into the durable one.
//! - Put-if-absent is decided by the durable tier: for a record, the value the fast tier gets is
//!   the one the durable tier kept, so two publishers racing for one head slot see the same
//!   winner in both tiers.
//! - Reads try the fast tier, then the durable one on a miss or a transient failure; a value found
//!   only in the durable tier is put back in the fast tier (read-repair), so the next reader hits
//!   the fast tier again. Records are read through `get_capped` (the contract's rule for records
//!   from a store others can write), so that is what is repaired as a record; the rest as bulk.
//! - `list` and `modified` answer for the durable tier; `exists` asks the durable tier only when
//!   the fast one says no; `remove` removes from both, durable first. The fast tier need not hold
//!   a subset of the durable one (a durable tier added to a store that already held heads):
//!   publish walks the fast tier's heads too, so it never writes a head into a seq the fast tier
//!   already holds.
//!
//! [`TierStats`] counts what each tier served, so reports can say where a generation came from.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Capabilities, Fetched, Store, StoreError, StoreResult, ValueClass};

/// What each tier served since the store was opened (reports take differences).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct TierStats {
    /// Values read from the fast tier.
    pub fast_hits: u64,
    /// Values the fast tier did not have, read from the durable tier.
    pub durable_hits: u64,
    /// Bytes read from the durable tier.
    pub durable_bytes: u64,
    /// Values put back in the fast tier after a durable hit.
    pub repaired: u64,
    /// Repairs or writes the fast tier refused (the durable tier holds the value).
    pub fast_put_failures: u64,
}

impl TierStats {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &TierStats) -> TierStats {
        TierStats {
            fast_hits: self.fast_hits - earlier.fast_hits,
            durable_hits: self.durable_hits - earlier.durable_hits,
            durable_bytes: self.durable_bytes - earlier.durable_bytes,
            repaired: self.repaired - earlier.repaired,
            fast_put_failures: self.fast_put_failures - earlier.fast_put_failures,
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    fast_hits: AtomicU64,
    durable_hits: AtomicU64,
    durable_bytes: AtomicU64,
    repaired: AtomicU64,
    fast_put_failures: AtomicU64,
}

#[derive(Debug)]
pub struct TieredStore {
    fast: Arc<dyn Store>,
    durable: Arc<dyn Store>,
    counters: Counters,
}

impl TieredStore {
    pub fn new(fast: Arc<dyn Store>, durable: Arc<dyn Store>) -> Self {
        Self {
            fast,
            durable,
            counters: Counters::default(),
        }
    }

    pub fn fast(&self) -> &Arc<dyn Store> {
        &self.fast
    }

    pub fn durable(&self) -> &Arc<dyn Store> {
        &self.durable
    }

    fn count(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Puts `value` into the fast tier, counting (not failing on) a refusal.
    fn fill_fast(&self, key: &str, value: &[u8], class: ValueClass) -> bool {
        match self.fast.put(key, value, class) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(key, error = %e, "fast tier refused a value the durable tier holds");
                Self::count(&self.counters.fast_put_failures, 1);
                false
            }
        }
    }

    /// A value read from the durable tier: counted and put back in the fast tier.
    fn repaired(&self, key: &str, value: &[u8], class: ValueClass) {
        Self::count(&self.counters.durable_hits, 1);
        Self::count(&self.counters.durable_bytes, value.len() as u64);
        if self.fill_fast(key, value, class) {
            Self::count(&self.counters.repaired, 1);
        }
    }

    /// One read of `key`: the fast tier's `answer` unless it falls through, else what `durable`
    /// reads, whose value is counted and put back in the fast tier as `class`, then handed out
    /// through `wrap`.
    fn read_through<T>(
        &self,
        key: &str,
        answer: StoreResult<Option<T>>,
        durable: impl FnOnce() -> StoreResult<Option<Vec<u8>>>,
        class: ValueClass,
        wrap: impl FnOnce(Vec<u8>) -> T,
    ) -> StoreResult<Option<T>> {
        if !Self::falls_through(&answer) {
            Self::count(&self.counters.fast_hits, 1);
            return answer;
        }
        Ok(durable()?.map(|v| {
            self.repaired(key, &v, class);
            wrap(v)
        }))
    }

    /// Whether a fast-tier answer sends the read on to the durable tier: a miss, or a failure
    /// that may pass (a restarting master, a dead node) or that the fast tier cannot answer.
    fn falls_through<T>(answer: &StoreResult<Option<T>>) -> bool {
        match answer {
            Ok(Some(_)) => false,
            Ok(None) => true,
            Err(e) => e.is_transient() || matches!(e, StoreError::Unsupported(_)),
        }
    }
}

impl Store for TieredStore {
    fn describe(&self) -> String {
        format!(
            "{} over {} (durable)",
            self.fast.describe(),
            self.durable.describe()
        )
    }

    fn max_value_size(&self) -> u64 {
        self.fast
            .max_value_size()
            .min(self.durable.max_value_size())
    }

    fn capabilities(&self) -> Capabilities {
        let durable = self.durable.capabilities();
        Capabilities {
            listing: durable.listing,
            write_times: durable.write_times,
            sizes: durable.sizes || self.fast.capabilities().sizes,
        }
    }

    fn put(&self, key: &str, value: &[u8], class: ValueClass) -> StoreResult<()> {
        self.durable.put(key, value, class)?;
        match class {
            // Content-addressed bulk data: any writer's bytes are the same bytes.
            ValueClass::Bulk => {
                self.fill_fast(key, value, class);
            }
            // A record slot may have been won by another writer: mirror the durable winner.
            ValueClass::Record => match self.durable.get(key)? {
                Some(winner) => {
                    self.fill_fast(key, &winner, class);
                }
                None => {
                    return Err(StoreError::Other(format!(
                        "the durable tier lost {key} right after storing it"
                    )));
                }
            },
        }
        Ok(())
    }

    fn get(&self, key: &str) -> StoreResult<Option<Vec<u8>>> {
        let fast = self.fast.get(key);
        self.read_through(key, fast, || self.durable.get(key), ValueClass::Bulk, |v| v)
    }

    fn get_capped(&self, key: &str, limit: u64) -> StoreResult<Option<Vec<u8>>> {
        let fast = self.fast.get_capped(key, limit);
        let durable = || self.durable.get_capped(key, limit);
        self.read_through(key, fast, durable, ValueClass::Record, |v| v)
    }

    fn exists(&self, key: &str) -> StoreResult<bool> {
        // What the fast tier holds the durable one holds too (it is written first), so a fast
        // hit needs no durable call: a slow durable tier never slows what the fast tier serves.
        if let Ok(true) = self.fast.exists(key) {
            return Ok(true);
        }
        self.durable.exists(key)
    }

    fn remove(&self, key: &str) -> StoreResult<bool> {
        // The durable tier first: once it is gone there, no read can repair it back.
        let durable = self.durable.remove(key)?;
        let fast = match self.fast.remove(key) {
            Ok(removed) => removed,
            Err(e) if e.is_transient() => {
                // A restarted master forgot it anyway; a dead node's copy goes with the node.
                tracing::warn!(key, error = %e, "fast tier could not remove a key; it holds a copy until evicted");
                false
            }
            Err(e) => return Err(e),
        };
        Ok(durable || fast)
    }

    fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
        self.durable.list(prefix)
    }

    fn modified(&self, key: &str) -> StoreResult<Option<std::time::SystemTime>> {
        self.durable.modified(key)
    }

    fn size(&self, key: &str) -> StoreResult<Option<u64>> {
        let fast = self.fast.size(key);
        if Self::falls_through(&fast) {
            return self.durable.size(key);
        }
        fast
    }

    fn put_batch(&self, items: &[(&str, &[u8])], class: ValueClass) -> Vec<StoreResult<()>> {
        match class {
            ValueClass::Bulk => {
                let durable = self.durable.put_batch(items, class);
                let stored: Vec<(&str, &[u8])> = items
                    .iter()
                    .zip(&durable)
                    .filter(|(_, r)| r.is_ok())
                    .map(|(item, _)| *item)
                    .collect();
                for r in self.fast.put_batch(&stored, class) {
                    if let Err(e) = r {
                        tracing::warn!(error = %e, "fast tier refused a value the durable tier holds");
                        Self::count(&self.counters.fast_put_failures, 1);
                    }
                }
                durable
            }
            ValueClass::Record => items.iter().map(|(k, v)| self.put(k, v, class)).collect(),
        }
    }

    fn get_batch(&self, keys: &[&str]) -> Vec<StoreResult<Option<Vec<u8>>>> {
        let fast = self.fast.get_batch(keys);
        keys.iter()
            .zip(fast)
            .map(|(key, answer)| {
                self.read_through(
                    key,
                    answer,
                    || self.durable.get(key),
                    ValueClass::Bulk,
                    |v| v,
                )
            })
            .collect()
    }

    fn exists_batch(&self, keys: &[&str]) -> Vec<StoreResult<bool>> {
        let fast = self.fast.exists_batch(keys);
        keys.iter()
            .zip(fast)
            .map(|(key, answer)| match answer {
                Ok(true) => Ok(true),
                _ => self.durable.exists(key),
            })
            .collect()
    }

    fn get_sized_batch(&self, items: &[(&str, u64)]) -> Vec<StoreResult<Option<Fetched>>> {
        let fast = self.fast.get_sized_batch(items);
        items
            .iter()
            .zip(fast)
            .map(|((key, _), answer)| {
                let durable = || self.durable.get(key);
                self.read_through(key, answer, durable, ValueClass::Bulk, Fetched::from)
            })
            .collect()
    }

    fn tier_stats(&self) -> Option<TierStats> {
        let c = &self.counters;
        Some(TierStats {
            fast_hits: c.fast_hits.load(Ordering::Relaxed),
            durable_hits: c.durable_hits.load(Ordering::Relaxed),
            durable_bytes: c.durable_bytes.load(Ordering::Relaxed),
            repaired: c.repaired.load(Ordering::Relaxed),
            fast_put_failures: c.fast_put_failures.load(Ordering::Relaxed),
        })
    }

    fn tiers(&self) -> Option<(&dyn Store, &dyn Store)> {
        Some((self.fast.as_ref(), self.durable.as_ref()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalStore;

    fn tiers() -> (
        tempfile::TempDir,
        Arc<dyn Store>,
        Arc<dyn Store>,
        TieredStore,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let fast: Arc<dyn Store> = Arc::new(LocalStore::open(dir.path().join("fast")).unwrap());
        let durable: Arc<dyn Store> =
            Arc::new(LocalStore::open(dir.path().join("durable")).unwrap());
        let tiered = TieredStore::new(fast.clone(), durable.clone());
        (dir, fast, durable, tiered)
    }

    #[test]
    fn a_tiered_store_keeps_the_store_contract() {
        let (_dir, _fast, _durable, tiered) = tiers();
        crate::conformance::run_all(&tiered, "conformance").unwrap();
    }

    #[test]
    fn what_the_fast_tier_lost_is_read_from_the_durable_one_and_put_back() {
        let (_dir, fast, durable, tiered) = tiers();
        tiered.put("ns/pack/a", b"bulk", ValueClass::Bulk).unwrap();
        tiered
            .put("ns/head/1", b"record", ValueClass::Record)
            .unwrap();
        assert_eq!(durable.get("ns/pack/a").unwrap().unwrap(), b"bulk");
        assert_eq!(fast.get("ns/head/1").unwrap().unwrap(), b"record");

        // Eviction (or a restarted master): the fast tier forgets both.
        fast.remove("ns/pack/a").unwrap();
        fast.remove("ns/head/1").unwrap();
        let before = tiered.tier_stats().unwrap();
        assert_eq!(
            tiered.get_capped("ns/head/1", 64).unwrap().unwrap(),
            b"record"
        );
        let sized = tiered.get_sized_batch(&[("ns/pack/a", 4)]);
        assert_eq!(&**sized[0].as_ref().unwrap().as_ref().unwrap(), b"bulk");
        let served = tiered.tier_stats().unwrap().since(&before);
        assert_eq!(
            (served.fast_hits, served.durable_hits, served.repaired),
            (0, 2, 2)
        );
        assert_eq!(served.durable_bytes, 10);

        // Repaired: the next readers hit the fast tier.
        assert_eq!(fast.get("ns/pack/a").unwrap().unwrap(), b"bulk");
        let before = tiered.tier_stats().unwrap();
        tiered.get_capped("ns/head/1", 64).unwrap().unwrap();
        tiered.get("ns/pack/a").unwrap().unwrap();
        let served = tiered.tier_stats().unwrap().since(&before);
        assert_eq!((served.fast_hits, served.durable_hits), (2, 0));
    }

    #[test]
    fn a_record_slot_takes_the_durable_winner_in_both_tiers() {
        let (_dir, fast, durable, tiered) = tiers();
        // Another publisher won the slot in the durable tier; the fast tier had nothing yet.
        durable
            .put("ns/head/7", b"theirs", ValueClass::Record)
            .unwrap();
        tiered
            .put("ns/head/7", b"ours", ValueClass::Record)
            .unwrap();
        assert_eq!(fast.get("ns/head/7").unwrap().unwrap(), b"theirs");
        assert_eq!(
            tiered.get_capped("ns/head/7", 64).unwrap().unwrap(),
            b"theirs"
        );
    }

    #[test]
    fn a_broken_durable_tier_does_not_touch_what_the_fast_tier_serves() {
        let (dir, _fast, _durable, tiered) = tiers();
        tiered.put("ns/pack/c", b"fast", ValueClass::Bulk).unwrap();
        tiered
            .put("ns/head/1", b"head", ValueClass::Record)
            .unwrap();
        // The durable directory goes away (an unmounted share): a file where it was.
        std::fs::remove_dir_all(dir.path().join("durable")).unwrap();
        std::fs::write(dir.path().join("durable"), b"not a directory").unwrap();
        assert_eq!(tiered.get("ns/pack/c").unwrap().unwrap(), b"fast");
        assert_eq!(
            tiered.get_capped("ns/head/1", 64).unwrap().unwrap(),
            b"head"
        );
        assert!(tiered.exists("ns/pack/c").unwrap());
        let sized = tiered.get_sized_batch(&[("ns/pack/c", 4)]);
        assert!(sized[0].as_ref().unwrap().is_some());
        // What only the durable tier could answer fails, and says so.
        assert!(tiered.get("ns/pack/missing").is_err());
        assert!(tiered.put("ns/pack/d", b"x", ValueClass::Bulk).is_err());
    }

    #[test]
    fn removal_and_existence_answer_for_the_durable_tier() {
        let (_dir, fast, _durable, tiered) = tiers();
        tiered.put("ns/pack/b", b"x", ValueClass::Bulk).unwrap();
        fast.remove("ns/pack/b").unwrap();
        assert!(
            tiered.exists("ns/pack/b").unwrap(),
            "the durable tier still has it"
        );
        assert!(tiered.remove("ns/pack/b").unwrap());
        assert_eq!(tiered.get("ns/pack/b").unwrap(), None);
        assert!(!tiered.exists("ns/pack/b").unwrap());
    }
}
