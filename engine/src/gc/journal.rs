//! Resuming an interrupted run from its journal, which anyone can write.

use crate::catalog::KeyLayout;
use crate::catalog::{self};
use crate::generation::{CompatId, ContentHash, GenerationId};
use crate::store::{Store, StoreError};

use super::report::GcReport;
use super::{GcError, Plan};

/// How many journals, newest first, gc reads looking for the newest one it may resume.
pub(super) const JOURNALS_READ: usize = 4;

/// An interrupted earlier run: finish what it planned. Anyone can write a journal, so one is
/// resumed only if it is a journal of this place that names nothing but this namespace's head
/// and manifest keys (`parse_journal_key`); another is passed over and reported, and gc goes on to
/// the one below. Even then a key of a generation this run keeps is left, and its packs go
/// through the rule for every pack (removed only if no retained generation references them).
/// Its keys are not probed with `exists` (on Mooncake a probe leases the key and blocks its
/// removal); removing a key already gone is a no-op.
pub(super) fn resume_interrupted_run(
    store: &dyn Store,
    layout: &KeyLayout,
    plan: &mut Plan,
    report: &mut GcReport,
) -> Result<(), GcError> {
    let key = |seq| layout.gc_journal(seq);
    let mut seqs = catalog::SeqWalk::new(store, &layout.gc_journal_prefix(), key, &[1])?;
    for _ in 0..JOURNALS_READ {
        let Some(seq) = seqs.next_seq()? else {
            return Ok(());
        };
        let k = layout.gc_journal(seq);
        let refused = match read_journal(store, layout, &k, seq)? {
            Err(why) => why,
            Ok(None) => continue,
            Ok(Some(j)) => {
                if catalog::gc_done(store, layout, j.seq)? {
                    return Ok(());
                }
                plan.resumed.extend(
                    j.keys
                        .iter()
                        .filter(|k| match parse_journal_key(layout, k) {
                            Some(JournalKey::Head) => !plan.kept_heads.contains(*k),
                            Some(JournalKey::Contribution) => true,
                            Some(JournalKey::Manifest(id)) => {
                                !plan.known.contains(&id) || plan.manifests.contains(&id)
                            }
                            Some(JournalKey::Module(digest)) => {
                                !plan.retained_modules.contains(&digest)
                            }
                            None => false,
                        })
                        .cloned(),
                );
                for p in &j.packs {
                    plan.dropped_packs.entry(*p).or_insert(0);
                }
                plan.resumed_journal = Some(j.seq);
                return Ok(());
            }
        };
        tracing::warn!(key = %k, "gc journal passed over: {refused}");
        report.journals_refused.push(format!(
            "{k}: {refused} (passed over; anyone can write the store)"
        ));
    }
    Ok(())
}

/// The journal at `key` (seq `seq`): `Ok(None)` if gone, `Err(why)` if no journal gc may resume.
pub(super) fn read_journal(
    store: &dyn Store,
    layout: &KeyLayout,
    key: &str,
    seq: u64,
) -> Result<Result<Option<catalog::GcJournal>, String>, GcError> {
    let bytes = match store.get_capped(key, catalog::MAX_JOURNAL_BYTES) {
        Ok(Some(b)) => b,
        Ok(None) => return Ok(Ok(None)),
        Err(StoreError::TooLarge { .. }) => {
            return Ok(Err(format!("over {} bytes", catalog::MAX_JOURNAL_BYTES)));
        }
        Err(e) => return Err(e.into()),
    };
    let j: catalog::GcJournal = match serde_json::from_slice(&bytes) {
        Ok(j) => j,
        Err(e) => return Ok(Err(format!("not a gc journal: {e}"))),
    };
    if j.seq != seq {
        return Ok(Err(format!("names seq {} under seq {seq}", j.seq)));
    }
    if let Some(bad) = j
        .keys
        .iter()
        .find(|k| parse_journal_key(layout, k).is_none())
    {
        let bad: String = bad.chars().take(200).collect();
        return Ok(Err(format!(
            "names {bad:?}, which is not a head or manifest key of namespace {:?}",
            layout.namespace()
        )));
    }
    Ok(Ok(Some(j)))
}

pub(super) enum JournalKey {
    Head,
    Contribution,
    Manifest(GenerationId),
    Module(ContentHash),
}

/// What a journal key is, if it is one a journal may name: a head or manifest key of this
/// namespace, exactly as this jitship spells it.
pub(super) fn parse_journal_key(layout: &KeyLayout, key: &str) -> Option<JournalKey> {
    if let Some(id) = key
        .strip_prefix(&layout.generations_prefix())
        .and_then(|s| s.parse::<GenerationId>().ok())
        .filter(|id| layout.generation(id) == key)
    {
        return Some(JournalKey::Manifest(id));
    }
    if let Some(digest) = key
        .strip_prefix(&layout.modules_prefix())
        .and_then(|s| s.parse::<ContentHash>().ok())
        .filter(|d| layout.module(d) == key)
    {
        return Some(JournalKey::Module(digest));
    }
    if let Some((compat, seq)) = key
        .strip_prefix(&layout.all_heads_prefix())
        .and_then(|rest| rest.split_once('/'))
    {
        let compat: CompatId = compat.parse().ok()?;
        let seq = catalog::walk::parse_seq(seq)?;
        return (layout.head(&compat, seq) == key).then_some(JournalKey::Head);
    }
    // A contribution key: `{ns}/contrib/{compat}/{seq}/{slot}`, slot below the slot count.
    let mut parts = key
        .strip_prefix(&layout.all_contributions_prefix())?
        .split('/');
    let (compat, seq, slot) = (parts.next()?, parts.next()?, parts.next()?);
    let compat: CompatId = compat.parse().ok()?;
    let seq = catalog::walk::parse_seq(seq)?;
    let slot: u64 = slot.parse().ok()?;
    (slot < catalog::contributions::CONTRIBUTION_SLOTS
        && layout.contribution(&compat, seq, slot) == key)
        .then_some(JournalKey::Contribution)
}
