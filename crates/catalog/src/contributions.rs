//! Contribution records: how a publisher that lost a head race gets its files into the next head
//! without winning one (issue 40; `docs/concurrent-publishes.md`).
//!
//! A publisher that loses head seq `s` puts its candidate's manifest and a contribution record
//! naming it in one of [`CONTRIBUTION_SLOTS`] slots at `s` (`{ns}/contrib/{compat-id}/{s}/{slot}`,
//! a slot chosen at random and probed onward, so hundreds of losers rarely collide). Whoever
//! writes head `s + 1` merges every contribution at `s` it can read, and names each in its
//! manifest's `merged`; a loser whose contribution a head names is done. A contribution is a
//! [`HeadRecord`] (same bounds and signature), signed under [`signing_domain`], so a contribution
//! can never be replayed as a head or the other way round.

use jitship_generation::{CompatId, GenerationId, HeadRecord};
use jitship_store::{Store, StoreError, ValueClass};

use crate::{HeadFault, KeyLayout};

/// Contribution slots per head seq. Every writer of the next head reads them all (one batched
/// probe), so the number bounds both the merge work a store writer can cause and how many losers
/// of one seq are carried; a loser that finds every slot taken races the next seq itself.
pub const CONTRIBUTION_SLOTS: u64 = 64;

/// What a contribution's signature covers besides the record: the namespace with a word no
/// namespace can hold (keys have no spaces), so a signed contribution is never a valid head.
pub fn signing_domain(namespace: &str) -> String {
    format!("{namespace} contribution")
}

/// One contribution slot's record: the record, or why it is no usable contribution.
pub type ContributionRead = Result<HeadRecord, HeadFault>;

/// The contributions at head seq `seq`, by slot (slots that hold nothing are left out). Each is
/// read under the head record cap and must name `compat` and `seq`; only the store failing is an
/// error.
pub fn read_contributions(
    store: &dyn Store,
    layout: &KeyLayout,
    compat: &CompatId,
    seq: u64,
) -> Result<Vec<(u64, ContributionRead)>, StoreError> {
    let keys: Vec<String> = (0..CONTRIBUTION_SLOTS)
        .map(|slot| layout.contribution(compat, seq, slot))
        .collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut found = Vec::new();
    for (slot, present) in store.exists_batch(&refs).into_iter().enumerate() {
        if present? {
            let slot = slot as u64;
            if let Some(read) = read_slot(store, layout, compat, seq, slot)? {
                found.push((slot, read));
            }
        }
    }
    Ok(found)
}

fn read_slot(
    store: &dyn Store,
    layout: &KeyLayout,
    compat: &CompatId,
    seq: u64,
    slot: u64,
) -> Result<Option<ContributionRead>, StoreError> {
    let key = layout.contribution(compat, seq, slot);
    crate::read_head_record(store, &key, compat, seq)
}

/// Puts `record` (a contribution at `record.seq`, already signed) in a free slot: one chosen at
/// random, then the next ones. Returns the slot it holds, or `None` if every slot is taken (the
/// caller then races the next head seq with its own files instead). A slot is ours when reading
/// it back gives our record (a put never overwrites).
pub fn contribute(
    store: &dyn Store,
    layout: &KeyLayout,
    record: &HeadRecord,
) -> Result<Option<u64>, StoreError> {
    let bytes = record.encode();
    let start = random_below(CONTRIBUTION_SLOTS);
    for probe in 0..CONTRIBUTION_SLOTS {
        let slot = (start + probe) % CONTRIBUTION_SLOTS;
        let key = layout.contribution(&record.compat_id, record.seq, slot);
        if store.exists(&key)? {
            continue;
        }
        store.put(&key, &bytes, ValueClass::Record)?;
        match read_slot(store, layout, &record.compat_id, record.seq, slot)? {
            Some(Ok(stored)) if stored == *record => return Ok(Some(slot)),
            _ => continue,
        }
    }
    Ok(None)
}

/// The contributions at `seq` of generations other than `exclude`, for the caller to judge and
/// merge; faulty slots are logged and passed over (anyone can write them).
pub fn readable_contributions(
    store: &dyn Store,
    layout: &KeyLayout,
    compat: &CompatId,
    seq: u64,
    exclude: &dyn Fn(&GenerationId) -> bool,
) -> Result<Vec<HeadRecord>, StoreError> {
    let mut records = Vec::new();
    for (slot, read) in read_contributions(store, layout, compat, seq)? {
        match read {
            Ok(record) if exclude(&record.generation) => {}
            Ok(record) => records.push(record),
            Err(fault) => tracing::warn!(
                seq,
                slot,
                "contribution slot holds no usable record ({fault}); passing it over"
            ),
        }
    }
    Ok(records)
}

/// A number below `n`, at random (uniform enough for spreading writers over slots).
fn random_below(n: u64) -> u64 {
    let mut buf = [0u8; 8];
    // Without randomness every writer starts at slot 0 and probes onward: slower, still correct.
    let _ = getrandom::fill(&mut buf);
    u64::from_le_bytes(buf) % n
}
