//! Committing a generation: putting the manifest and the head record, and when another publisher
//! wins a head seq, getting our files into a head anyway (`commit_head`).
//!
//! Many publishers of one key at once (a scale-down: hundreds of sidecars' final publishes in the
//! same seconds) must all end with their files in a head, each doing bounded work. A loser of
//! seq `s` does not race every later seq with a merge of everyone before it (that is N rounds
//! for the last of N publishers): it leaves its generation as a **contribution** at `s`
//! (`catalog::contributions`) and whoever writes head `s + 1` merges every contribution at `s`.
//! A loser whose contribution a head names is done; one that a head missed (its contribution
//! landed after that head's writer read the slots) contributes again at the next seq. Every
//! manifest a publisher puts is therefore named by a head, by a head's `merged`, or by a
//! contribution record, where gc finds it (`gc`, contributions).

use std::collections::HashSet;

use crate::catalog::KeyLayout;
use crate::catalog::contributions::{self, signing_domain};
use crate::catalog::{self, ManifestRead, now_secs, writer_id};
use crate::generation::{GenerationId, HeadRecord, Manifest, merge_files, prune_packs};
use crate::store::{Store, ValueClass};
use crate::trust::PublishTrust;

use super::{PublishError, PublishOptions, PublishReport};

/// Puts the manifest and the head at `seq`; if another publisher won `seq`, contributes ours
/// there, merges its generation and the other contributions, and tries the next seq, until a head
/// holds our files.
///
/// Union (invariant 4) holds because every head we write includes the generations of all heads
/// between our parent's seq and ours: a seq we lose is merged before we move on, and after we win a
/// seq the head just below it is checked once more: if it holds a generation we never merged (its
/// put was still in flight when we read that seq back), we merge it and write the next seq.
pub(super) fn commit_head(
    store: &dyn Store,
    layout: &KeyLayout,
    mut candidate: Manifest,
    mut seq: u64,
    opts: &PublishOptions,
    report: &mut PublishReport,
) -> Result<(GenerationId, u64), PublishError> {
    let mut commit = HeadCommit {
        store,
        layout,
        trust: &opts.trust,
        writer: writer_id(),
        base_seq: seq.saturating_sub(1),
        compat: candidate.compat_id,
        losses: 0,
        contributions_read: None,
        max_rounds: opts.max_head_attempts,
        own_paths: candidate.files.iter().map(|f| f.path.to_string()).collect(),
        included: candidate.parent.into_iter().collect(),
        contributed: Vec::new(),
        put: HashSet::new(),
        written: None,
    };
    for _ in 0..opts.max_head_attempts {
        if seq > catalog::MAX_SEQ {
            let heads = layout.heads_prefix(&candidate.compat_id);
            return Err(catalog::CatalogError::SequenceFull(heads).into());
        }
        // Every head carries contributions left at the seq below it, not only heads written by
        // that seq's losers: they wait to be carried rather than race (`wait_to_be_carried`).
        commit.merge_contributions(&mut candidate, seq.saturating_sub(1), report)?;
        let (generation, record) = commit.write(&mut candidate, seq)?;
        report.head_attempts += 1;
        let step = match put_and_read_back(store, layout, &record)? {
            // Another publisher of the same generation counts as ours only if its head is
            // admitted.
            Some(Ok(stored))
                if stored == record
                    || (stored.generation == generation && commit.admits(&stored)) =>
            {
                commit.after_win(&mut candidate, generation, seq, report)?
            }
            Some(Ok(stored)) => {
                commit.after_loss(&mut candidate, generation, &stored, seq, report)?
            }
            Some(Err(fault)) => {
                // Someone wrote junk at this seq first (anyone can write the store): above it.
                tracing::warn!(
                    seq,
                    "this seq holds no usable head ({fault}); trying the next seq"
                );
                Step::TrySeq(seq + 1)
            }
            None => {
                // Nobody's head is readable at this seq even after retries (evicted at once):
                // write above it; the check after a win merges it if it shows up after all.
                tracing::warn!(
                    seq,
                    "head record unreadable right after writing it; trying the next seq"
                );
                Step::TrySeq(seq + 1)
            }
        };
        match step {
            Step::Done(generation, seq) => {
                report.carried = !commit.put.contains(&generation);
                return Ok((generation, seq));
            }
            Step::TrySeq(next) => seq = next,
        }
    }
    // A head of ours that installs take is already written: going on was only to get above a
    // head nobody may build on (issue 39: that publish exited 1 though installs took its head).
    if let Some((generation, seq)) = commit.written {
        tracing::warn!(
            seq,
            "could not write above the head over ours that this publisher does not trust; the head at {seq} stands"
        );
        return Ok((generation, seq));
    }
    Err(PublishError::Contention(opts.max_head_attempts))
}

/// Most contributions one head carries: each costs its writer a manifest read; the others wait
/// for the next head.
const MAX_CARRIED_PER_HEAD: usize = 16;

/// What a head write leads to: done (the generation and the seq whose head names it), or another
/// try at a seq.
enum Step {
    Done(GenerationId, u64),
    TrySeq(u64),
}

/// The state of one `commit_head`: who writes, and the generations its head already includes.
struct HeadCommit<'a> {
    store: &'a dyn Store,
    layout: &'a KeyLayout,
    trust: &'a PublishTrust,
    writer: String,
    /// The seq of the head the publish built on: heads above it were written meanwhile.
    base_seq: u64,
    compat: crate::generation::CompatId,
    /// Seqs lost so far (the backoff grows with them).
    losses: u32,
    /// Heads one wait reads at most before this publisher writes one itself.
    max_rounds: u32,
    /// The seq whose contributions were merged last (each seq's are read once).
    contributions_read: Option<u64>,
    /// The paths of the candidate this publish started with: a winner holding them all holds
    /// everything this publish is responsible for.
    own_paths: Vec<String>,
    /// Generations the candidate builds on or merged (never merged twice).
    included: HashSet<GenerationId>,
    /// Our generations left as contributions at lost seqs: a head naming one holds our files.
    contributed: Vec<GenerationId>,
    /// Every generation whose manifest this publish put.
    put: HashSet<GenerationId>,
    /// A head of ours already written that holds everything the candidate holds, with only
    /// heads this publisher does not trust above it: what this publish stands on if it cannot
    /// write above those.
    written: Option<(GenerationId, u64)>,
}

impl HeadCommit<'_> {
    fn admits(&self, head: &HeadRecord) -> bool {
        self.trust.admits(self.layout.namespace(), head)
    }

    /// Puts the candidate's manifest and makes its head for `seq`, signed with this publisher's
    /// key.
    fn write(
        &mut self,
        candidate: &mut Manifest,
        seq: u64,
    ) -> Result<(GenerationId, HeadRecord), PublishError> {
        candidate.normalize();
        // A merge can grow a manifest past the store's value limit: refused as at the first put.
        super::check_manifest_fits(self.store, candidate)?;
        let bytes = candidate.encode();
        let generation = candidate.id();
        self.put.insert(generation);
        let key = self.layout.generation(&generation);
        self.store.put(&key, &bytes, ValueClass::Record)?;
        let record = self.signed_record(self.layout.namespace(), seq, generation);
        Ok((generation, record))
    }

    /// A record naming `generation` at `seq`, signed under `domain` with this publisher's key
    /// (heads under the namespace, contributions under `signing_domain`).
    fn signed_record(&self, domain: &str, seq: u64, generation: GenerationId) -> HeadRecord {
        let mut record = HeadRecord {
            compat_id: self.compat,
            seq,
            generation,
            written_at: now_secs(),
            writer: self.writer.clone(),
            signature: None,
        };
        if let Some(key) = self.trust.signing_key() {
            key.sign(domain, &mut record);
        }
        record
    }

    /// Won `seq`. A head below ours that we never merged (its put was in flight when we read its
    /// seq back) would be superseded without its files: merge it and write the next seq.
    fn after_win(
        &mut self,
        candidate: &mut Manifest,
        generation: GenerationId,
        seq: u64,
        report: &mut PublishReport,
    ) -> Result<Step, PublishError> {
        self.included.insert(generation);
        let below = seq - 1;
        let missed = if below > self.base_seq {
            // A refused head below needs no merging: ours supersedes it.
            catalog::read_head_at(self.store, self.layout, &candidate.compat_id, below)?
                .and_then(Result::ok)
                .filter(|h| !self.included.contains(&h.generation) && self.admits(h))
        } else {
            None
        };
        let Some(missed) = missed else {
            return self.merge_head_above(candidate, generation, seq, report);
        };
        tracing::info!(seq = below, generation = %missed.generation, "a head below ours was never merged; merging it");
        self.included.insert(missed.generation);
        self.written = None;
        if let Some(other) = winner_manifest(self.store, self.layout, &missed.generation)? {
            merge(candidate, generation, &other, Parent::Ours, report);
            return Ok(Step::TrySeq(seq + 1));
        }
        Ok(Step::Done(generation, seq))
    }

    /// A head above ours written by someone who did not see ours (our put was the one in
    /// flight): merge onto it and write above it.
    fn merge_head_above(
        &mut self,
        candidate: &mut Manifest,
        generation: GenerationId,
        seq: u64,
        report: &mut PublishReport,
    ) -> Result<Step, PublishError> {
        let above = head_above_without(
            self.store,
            self.layout,
            candidate,
            seq,
            generation,
            self.trust,
        )?;
        let Some((above, manifest)) = above else {
            return Ok(Step::Done(generation, seq));
        };
        tracing::info!(seq = seq + 1, generation = %above, "a head above ours does not include ours; merging onto it");
        self.included.insert(above);
        let Some(other) = manifest else {
            // Refused or unreadable: nothing to merge, only to write above.
            self.written = Some((generation, seq));
            return Ok(Step::TrySeq(seq + 2));
        };
        self.written = None;
        if merge(candidate, generation, &other, Parent::Theirs, report) {
            return Ok(Step::Done(other.id(), seq + 1));
        }
        Ok(Step::TrySeq(seq + 2))
    }

    /// Another publisher won this seq. If its generation holds a contribution of ours, we are
    /// done. Otherwise ours becomes a contribution at this seq, the candidate takes in the
    /// winner's files, and the next seq is tried (after merging the other contributions here,
    /// unless that head is written already: then it is the next loss).
    fn after_loss(
        &mut self,
        candidate: &mut Manifest,
        generation: GenerationId,
        stored: &HeadRecord,
        seq: u64,
        report: &mut PublishReport,
    ) -> Result<Step, PublishError> {
        tracing::info!(seq, winner = %stored.generation, "another publisher won the head; merging");
        self.included.insert(stored.generation);
        let winner = if self.admits(stored) {
            winner_manifest(self.store, self.layout, &stored.generation)?
        } else {
            tracing::warn!(seq, winner = %stored.generation, "the head that won this seq is not trusted; not merging it, writing above it");
            None
        };
        let Some(winner) = winner else {
            // Our candidate is unchanged and is written again (same id) at the next seq.
            tracing::warn!(seq, winner = %stored.generation, "the winning head's manifest is missing or corrupt; writing above it");
            return Ok(Step::TrySeq(seq + 1));
        };
        if self.holds_contribution(&winner) || self.holds_own_files(&winner) {
            tracing::info!(seq, winner = %stored.generation, "the winning head holds our files");
            self.discard(generation);
            return Ok(Step::Done(stored.generation, seq));
        }
        self.written = None;
        if merge(candidate, generation, &winner, Parent::Theirs, report) {
            // The winner holds all our files: the manifest we put for this seq is nobody's.
            self.discard(generation);
            return Ok(Step::Done(stored.generation, seq));
        }
        // The manifest we put for this seq is named by the contribution (and by the head that
        // carries it), where gc finds it.
        self.contribute(generation, seq, report)?;
        self.wait_to_be_carried(candidate, generation, seq + 1, report)
    }

    /// After leaving `contribution` at the seq below `next`: waits for a head to carry it instead
    /// of racing every head written meanwhile. Each head that appears is read; one that holds our
    /// files ends the publish; one written without them (its writer read the slots before ours
    /// landed) gets the same contribution again at its seq (no new manifest). Only when no head
    /// appears after a short random wait does this publisher write the next head itself, carrying
    /// the contributions it finds. A publisher's work is then one manifest, a contribution and a
    /// head read per head written while it waits, however many publish at once.
    fn wait_to_be_carried(
        &mut self,
        candidate: &mut Manifest,
        contribution: GenerationId,
        mut next: u64,
        report: &mut PublishReport,
    ) -> Result<Step, PublishError> {
        let mut contributed_below = true;
        for _ in 0..self.max_rounds {
            if contributed_below {
                self.backoff();
            }
            let Some(Ok(head)) =
                catalog::read_head_at(self.store, self.layout, &candidate.compat_id, next)?
            else {
                // Nobody wrote it (or junk holds it: the write above handles that): ours to write.
                self.merge_contributions(candidate, next - 1, report)?;
                return Ok(Step::TrySeq(next));
            };
            self.included.insert(head.generation);
            let manifest = if self.admits(&head) {
                winner_manifest(self.store, self.layout, &head.generation)?
            } else {
                None
            };
            let Some(manifest) = manifest else {
                // Not one installs here take, or unreadable: written over, never merged.
                return Ok(Step::TrySeq(next + 1));
            };
            if self.holds_contribution(&manifest) || self.holds_own_files(&manifest) {
                tracing::info!(seq = next, generation = %head.generation, "a head carried our contribution");
                return Ok(Step::Done(head.generation, next));
            }
            if rebase(candidate, &manifest, report) {
                return Ok(Step::Done(head.generation, next));
            }
            // Contribute at the newest head only: one below it is read by no writer any more.
            let key = self.layout.head(&candidate.compat_id, next + 1);
            contributed_below = !self.store.exists(&key)?;
            if contributed_below {
                tracing::debug!(seq = next, generation = %head.generation, "a head written without our contribution; contributing again above it");
                self.contribute(contribution, next, report)?;
            }
            next += 1;
        }
        Ok(Step::TrySeq(next))
    }

    /// Removes the manifest we put for a lost seq when nothing names it: no head (we never won
    /// with it), no contribution, no head we merged. Without this every lost race left a whole
    /// manifest that nothing leads to (on Mooncake gc cannot find it). Best effort: a store that
    /// refuses leaves it, logged.
    fn discard(&self, generation: GenerationId) {
        if self.contributed.contains(&generation) || self.included.contains(&generation) {
            return;
        }
        let key = self.layout.generation(&generation);
        if let Err(e) = self.store.remove(&key) {
            tracing::debug!(%generation, "could not remove a manifest no head names: {e}");
        }
    }

    /// Whether `head` (a winner's manifest) has every path this publish brought (its own files,
    /// not those it merged from others: their writers see to their own). A path it holds with
    /// other content counts: the version published first wins a conflict.
    fn holds_own_files(&self, head: &Manifest) -> bool {
        self.own_paths.iter().all(|path| {
            head.files
                .binary_search_by(|f| f.path.as_str().cmp(path))
                .is_ok()
        })
    }

    /// Whether `head` (a winner's manifest) names a generation we left as a contribution.
    fn holds_contribution(&self, head: &Manifest) -> bool {
        self.contributed
            .iter()
            .any(|c| head.parent == Some(*c) || head.merged.contains(c))
    }

    /// Leaves `generation` (its manifest is in the store) as a contribution at `seq`, signed as
    /// our heads are. Every slot taken is no failure: our candidate still races the next seq.
    fn contribute(
        &mut self,
        generation: GenerationId,
        seq: u64,
        report: &mut PublishReport,
    ) -> Result<(), PublishError> {
        let domain = signing_domain(self.layout.namespace());
        let record = self.signed_record(&domain, seq, generation);
        match contributions::contribute(self.store, self.layout, &record)? {
            Some(slot) => {
                tracing::debug!(seq, slot, %generation, "left our generation as a contribution");
                self.contributed.push(generation);
                report.contributions += 1;
            }
            None => tracing::info!(
                seq,
                "every contribution slot at this seq is taken; racing the next seq with our files"
            ),
        }
        Ok(())
    }

    /// Merges every contribution at `seq` this publisher admits (signed under the contribution
    /// domain by a key it trusts) and has not merged: the candidate's files win a conflicting path
    /// (the winner's, published first), each contribution is named in `merged`.
    fn merge_contributions(
        &mut self,
        candidate: &mut Manifest,
        seq: u64,
        report: &mut PublishReport,
    ) -> Result<(), PublishError> {
        if seq == 0 || self.contributions_read == Some(seq) {
            return Ok(());
        }
        self.contributions_read = Some(seq);
        let (included, ours) = (&self.included, &self.contributed);
        let found = contributions::readable_contributions(
            self.store,
            self.layout,
            &candidate.compat_id,
            seq,
            &|g| included.contains(g) || ours.contains(g),
        )?;
        let domain = signing_domain(self.layout.namespace());
        for record in found.into_iter().take(MAX_CARRIED_PER_HEAD) {
            if self.included.contains(&record.generation)
                || self.contributed.contains(&record.generation)
                || !self.trust.admits(&domain, &record)
            {
                continue;
            }
            self.included.insert(record.generation);
            let Some(other) = winner_manifest(self.store, self.layout, &record.generation)? else {
                continue;
            };
            if other.compat_id != candidate.compat_id {
                continue;
            }
            merge_contribution(candidate, &other, report);
        }
        Ok(())
    }

    /// A short random wait after a lost seq, growing with the losses, so the losers of one seq
    /// do not all read the contributions before most of them are written.
    fn backoff(&mut self) {
        self.losses += 1;
        let ceiling_ms = 4u64 << self.losses.min(4);
        let mut buf = [0u8; 8];
        let _ = getrandom::fill(&mut buf);
        let wait = u64::from_le_bytes(buf) % ceiling_ms;
        std::thread::sleep(std::time::Duration::from_millis(wait));
    }
}

/// Builds `candidate` (never put since its last merge) on `head` instead: `head`'s version of a
/// path wins, and `head` becomes the parent. True if `head` holds every path of it.
fn rebase(candidate: &mut Manifest, head: &Manifest, report: &mut PublishReport) -> bool {
    let (files, packs, conflicts) =
        merge_files(&head.files, &head.packs, &candidate.files, &candidate.packs);
    report.conflicts.extend(conflicts);
    candidate.parent = Some(head.id());
    candidate.files = files;
    candidate.packs = packs;
    prune_packs(candidate);
    candidate.files == head.files
}

/// Takes a contribution's files into `candidate` (the candidate's version of a path wins) and
/// names it in `merged`; the parent stays the head the candidate builds on.
fn merge_contribution(candidate: &mut Manifest, other: &Manifest, report: &mut PublishReport) {
    let (files, packs, conflicts) = merge_files(
        &candidate.files,
        &candidate.packs,
        &other.files,
        &other.packs,
    );
    report.conflicts.extend(conflicts);
    let id = other.id();
    report.merged.push(id);
    candidate.merged.push(id);
    candidate.files = files;
    candidate.packs = packs;
    prune_packs(candidate);
}

/// The head at `seq + 1` if it exists and its generation neither builds on nor merged `ours`
/// (with its manifest, when readable and the head is admitted by `trust`: a refused head above
/// ours is written over, never merged).
fn head_above_without(
    store: &dyn Store,
    layout: &KeyLayout,
    candidate: &Manifest,
    seq: u64,
    ours: GenerationId,
    trust: &PublishTrust,
) -> Result<Option<(GenerationId, Option<Manifest>)>, PublishError> {
    // A faulty record above ours is no head: readers pass it over and find ours.
    let Some(Ok(above)) = catalog::read_head_at(store, layout, &candidate.compat_id, seq + 1)?
    else {
        return Ok(None);
    };
    if !trust.admits(layout.namespace(), &above) {
        return Ok(Some((above.generation, None)));
    }
    let manifest = winner_manifest(store, layout, &above.generation)?;
    let includes_ours = manifest
        .as_ref()
        .is_some_and(|m| m.parent == Some(ours) || m.merged.contains(&ours));
    Ok((!includes_ours).then_some((above.generation, manifest)))
}

/// Puts `record` and reads its seq back. A miss is retried with backoff, putting ours again each
/// time: on Mooncake another client's put of the same key can be in flight (our put returns as if
/// the key existed, a get still misses), and deciding "nobody holds this seq" too early would skip
/// that publisher's files. `None` only if the seq stays unreadable; the fault if the seq holds
/// something that is no usable head.
fn put_and_read_back(
    store: &dyn Store,
    layout: &KeyLayout,
    record: &HeadRecord,
) -> Result<Option<Result<HeadRecord, catalog::HeadFault>>, PublishError> {
    let key = layout.head(&record.compat_id, record.seq);
    let bytes = record.encode();
    for attempt in 0..8u32 {
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_millis(25 << attempt.min(4)));
        }
        store.put(&key, &bytes, ValueClass::Record)?;
        // Someone else's bytes may hold this seq and be no head: that is an answer too.
        if let Some(stored) = catalog::read_head_at(store, layout, &record.compat_id, record.seq)? {
            return Ok(Some(stored));
        }
    }
    Ok(None)
}

/// A winning (or missed) head's manifest; `None` if it is missing or corrupt (it cannot be merged,
/// and the next seq supersedes it).
fn winner_manifest(
    store: &dyn Store,
    layout: &KeyLayout,
    id: &GenerationId,
) -> Result<Option<Manifest>, PublishError> {
    match catalog::read_manifest(store, layout, id)? {
        ManifestRead::Present(m) => Ok(Some(*m)),
        ManifestRead::Missing => Ok(None),
        ManifestRead::Unreadable(source) => {
            tracing::warn!(generation = %id, error = %source, "a head's manifest is corrupt; it cannot be merged");
            Ok(None)
        }
    }
}

/// Which generation of a merge is the parent, the one holding the newer head: its files win a
/// conflicting path, the other is recorded as merged.
enum Parent {
    /// Ours won a seq above a head we never merged.
    Ours,
    /// Theirs won the seq we tried, or sits above ours without including it.
    Theirs,
}

/// The one head-race merge: rebuilds `candidate` (whose previous id was `ours`) as the union of
/// itself and `theirs`, another publisher's generation of its compat id. True if the result holds
/// nothing `theirs` lacks, so `theirs` itself is the answer.
fn merge(
    candidate: &mut Manifest,
    ours: GenerationId,
    theirs: &Manifest,
    parent: Parent,
    report: &mut PublishReport,
) -> bool {
    let theirs_id = theirs.id();
    let (files, packs, conflicts) = match parent {
        Parent::Theirs => merge_files(
            &theirs.files,
            &theirs.packs,
            &candidate.files,
            &candidate.packs,
        ),
        Parent::Ours => merge_files(
            &candidate.files,
            &candidate.packs,
            &theirs.files,
            &theirs.packs,
        ),
    };
    report.conflicts.extend(conflicts);
    report.merged.push(theirs_id);
    let (parent, merged) = match parent {
        Parent::Theirs => (theirs_id, ours),
        Parent::Ours => (ours, theirs_id),
    };
    candidate.parent = Some(parent);
    candidate.merged.push(merged);
    candidate.files = files;
    candidate.packs = packs;
    prune_packs(candidate);
    candidate.files == theirs.files
}
