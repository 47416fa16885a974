//! Retention and garbage collection: which generations to drop, and removing them safely from a
//! store that cannot list keys and may be read by installs at any moment.
//!
//! Deciding (per compat id, from the heads and manifests: `inspect::survey`):
//! - the newest generation (the head installs read) is never dropped;
//! - a pinned generation (`{ns}/pin/{id}` exists) is never dropped, whatever the policy says;
//! - the policy's `retain` names the others to drop, given the operator's quotas. The policy is
//!   the one that governs the compat id: the one its newest generation (with a readable
//!   manifest, signed by a trusted key where one is; see trust below) was published with
//!   (`Manifest.policy`), found by digest among the
//!   built-in modules, the modules of the configured caches (`[[cache]] policy`, `gc --cache
//!   KIND:x.wasm`) and the modules directory (`[policy] modules_dir`, `gc --policy-dir`); digest
//!   `native` is the native rules (`PolicyIndex`). Never the rule of whatever this gc happens to
//!   configure for the kind: a compat id whose policy gc does not have is kept whole and the
//!   report says which module to give it;
//! - a built-in upgraded since the publish (its recorded digest is an older built-in's) is decided
//!   by today's built-in of that name, reported as "built-in X (published with version V)", but
//!   only when all of these hold: the recorded digest is found nowhere (above), the recorded name
//!   equals the name of the built-in policy of the compat id's kind, and the operator configured
//!   no module of their own for that kind. A third-party module may call itself `inductor`: where
//!   the operator runs one for the kind, an unknown digest under that name is theirs, not an old
//!   built-in, and the key is kept whole;
//! - a generation the policy drops is kept while it was superseded less than `grace` ago: an install
//!   that read the previous head just before a publish may still be fetching its packs. `grace`
//!   must exceed the install deadline plus clock skew between hosts (default 1 h);
//! - a head whose manifest is gone (evicted) is dropped once superseded for `grace`;
//! - gc fails closed on what it cannot read: a manifest it cannot decode (corrupt, or written by a
//!   newer jitship with fields this one does not know) keeps every generation of its compat id,
//!   and no pack at all is removed in that run (such a generation may reference any pack, and
//!   packs are shared across compat ids); the report names it (`unreadable`). A head record that
//!   is no usable head (corrupt, oversized, another place's: anyone can write the store) is
//!   reported (`faulty_heads`) and left in place; readers pass it over.
//! - under `[trust] mode = "required"` only generations a trusted key signed count (`counts`):
//!   they fill the quota, the newest of them is the one never dropped, and an untrusted one
//!   (its manifest unreadable or not) never holds up or pushes out a trusted one. Untrusted
//!   generations below the newest trusted head are removed; those above it are reported and left
//!   (removing the top of a head sequence would leave a floor above every head).
//! - gc judges by trust, since anyone can write the store: the policy and settings that decide a
//!   compat id come from its newest readable generation a trusted key signed, and only where none
//!   is signed (no key configured) from the newest that counts; a generation's grace runs from
//!   the next newer head that supersedes it under the trust (under `required`, a trusted one),
//!   and an untrusted head's time is its claim or the store's date of it, whichever is later
//!   (`inspect::survey`). What records no trusted key signed decided is reported (`unsigned`) and
//!   logged at WARN.
//!
//! Removing (never in `--dry-run`), in an order a reader can never half-see:
//! 1. a head floor per compat id whose heads are removed (`catalog::FloorRecord`): heads below it
//!    may go, so probing for the newest head starts there;
//! 2. a journal (`catalog::GcJournal`) naming every key and pack this run will remove, so an
//!    interrupted run is finished by the next one (on Mooncake nothing else leads to them); a
//!    `gc-done` marker once every removal succeeded. A journal read back is anyone's: one that
//!    does not decode, or names anything but this namespace's head, contribution and manifest keys, is passed
//!    over and reported (`journals_refused`); a resumed one never removes a key of a generation
//!    this run keeps, and its packs go by the rule for every pack (below);
//! 3. head records, then manifests, then packs. A key a reader holds a lease on (Mooncake leases
//!    every key read or probed, for 10 s) is retried after `lease_wait`, so gc never pulls a pack
//!    from under an install that is reading it there. Before removing packs, the newest heads are read
//!    again and every pack their generations reference is spared. A pack is removed only if no
//!    retained generation of any compat id references it (packs are shared by content).
//!
//! Besides dropped generations, gc collects manifests that lost a head race and were merged into
//! a winner (named in `merged` of a generation, never headed), with their unreferenced packs;
//! spent contributions (`add_spent_contributions`: what a lost race left, once the head above it
//! is older than `grace`) with the manifests they name; and on stores that list keys and give write times (local), orphans: manifests and packs no
//! retained generation references and that were written more than `grace` ago (crashed publishes).
//!
//! Residual race (documented, not closed): a publish that deduplicates against a pack gc is about
//! to remove (it checked the pack exists before gc's last reading of the heads, and writes its head
//! after gc removed the pack) produces a generation with a missing pack. Installs treat it like an
//! evicted pack (they fall back to an older generation; nothing unverified is written), and the
//! next publish drops the lost files from its base and uploads them again (`publish::usable_parent`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, SystemTime};

use serde::Serialize;

mod governing;

pub use governing::{Governing, PolicyFinder, PolicyIndex, PolicyOrigin, UsedPolicy};

use crate::catalog::KeyLayout;
use crate::catalog::{self, CatalogError, ManifestRead};
use crate::generation::{CompatId, ContentHash, GenerationId, PolicyRef};
use crate::inspect::{self, CompatView, InspectError, ManifestState};
use crate::policy::{GenerationSummary, RetentionDrop, RetentionLimits};
use crate::store::{Store, StoreError};
use crate::trust::{Signer, TrustPolicy};

#[derive(Debug, Clone)]
pub struct GcOptions {
    /// Seconds since the Unix epoch (a parameter so tests and drills can move time).
    pub now: u64,
    pub grace: Duration,
    pub limits: RetentionLimits,
    pub dry_run: bool,
    /// How long to wait before retrying keys the store refuses to remove because a reader holds a
    /// lease on them (Mooncake leases every key read or probed for `default_kv_lease_ttl`, 10 s by
    /// default; gc's own reads lease what it is about to remove).
    pub lease_wait: Duration,
    /// Waits before gc gives up on a leased key (the journal lets the next run retry it).
    pub lease_rounds: u32,
    /// This host's trust. Under `required`, only generations signed by a trusted key count:
    /// they alone fill the retention quota, the newest of them is the one never dropped, and an
    /// untrusted one never makes gc keep or drop a trusted one (see `counts`).
    pub trust: std::sync::Arc<TrustPolicy>,
}

impl GcOptions {
    pub const DEFAULT_LEASE_WAIT: Duration = Duration::from_secs(11);
    pub const DEFAULT_LEASE_ROUNDS: u32 = 3;
}

#[derive(Debug, thiserror::Error)]
pub enum GcError {
    #[error(transparent)]
    Inspect(#[from] InspectError),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Keep,
    Drop,
}

/// What gc decided for one generation, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Decision {
    pub compat_id: CompatId,
    pub cache_kind: Option<String>,
    pub generation: GenerationId,
    pub seqs: Vec<u64>,
    pub verdict: Verdict,
    pub reason: String,
    pub size_bytes: u64,
}

/// Which policy decided one compat id, or why none did (the compat id was kept whole).
#[derive(Debug, Clone, Serialize)]
pub struct KeyPolicy {
    pub compat_id: CompatId,
    pub cache_kind: Option<String>,
    /// The policy its deciding generation was published with: the newest readable one a trusted
    /// key signed, else the newest readable one that counts (then reported in `unsigned`).
    pub published_with: Option<PolicyRef>,
    /// The policy whose `retain` decided, and where gc found it.
    pub decided_by: Option<UsedPolicy>,
    /// Why no policy decided: every generation of the compat id was kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_whole: Option<String>,
    /// The kind of reason `kept_whole` gives (what `NotDecided` counts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_whole_cause: Option<KeptWholeCause>,
}

/// Why retention did not decide a compat id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeptWholeCause {
    /// The policy it was published with is nowhere gc looked (or does not load, or refuses the
    /// recorded settings; the store's copy was refused).
    PolicyMissing,
    /// The policy failed in `retain`.
    PolicyFailed,
}

/// The keys retention did not decide this run (every generation kept), counted by why. Present
/// only when there are some: `jitship gc` then exits with `exit::GC_NOT_DECIDED`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NotDecided {
    /// Compat ids kept whole, for any reason below (one may have several).
    pub keys: u64,
    /// Their policy is not at hand (see each key's `kept_whole`).
    pub policy_missing: u64,
    /// Their policy failed in `retain`.
    pub policy_failed: u64,
    /// A generation that counts has a manifest this jitship cannot decode.
    pub unreadable: u64,
}

impl std::fmt::Display for NotDecided {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut why = Vec::new();
        for (n, what) in [
            (
                self.policy_missing,
                "the policy they were published with is not here",
            ),
            (self.policy_failed, "their policy failed"),
            (self.unreadable, "a manifest of theirs cannot be read"),
        ] {
            if n > 0 {
                why.push(format!("{n} because {what}"));
            }
        }
        write!(
            f,
            "{} keys kept whole, not decided by retention: {}",
            self.keys,
            why.join(", ")
        )
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct GcReport {
    pub dry_run: bool,
    pub decisions: Vec<Decision>,
    /// Per compat id with a readable manifest: the policy that decided, or why it was kept whole.
    pub policies: Vec<KeyPolicy>,
    /// Policies that failed: their compat ids keep everything this run.
    pub policy_errors: Vec<String>,
    /// Head records that are no usable head (corrupt, oversized, another place's): reported,
    /// left in place (readers pass them over).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub faulty_heads: Vec<String>,
    /// Head record keys removed (or, in a dry run, that would be).
    pub heads: Vec<String>,
    pub manifests: Vec<GenerationId>,
    /// Spent contribution records removed (or, in a dry run, that would be).
    #[serde(skip_serializing_if = "crate::inspect::is_zero")]
    pub contributions: u64,
    pub packs: Vec<ContentHash>,
    /// Policy modules stored by digest (`catalog::modules`) removed (or, in a dry run, that
    /// would be): those no retained generation names.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub modules: Vec<ContentHash>,
    /// Bytes of the packs removed, where known (orphans found by listing: unknown until removed).
    pub pack_bytes: u64,
    /// Floors written: (compat id, floor seq).
    pub floors: Vec<(CompatId, u64)>,
    /// Seq of the journal of this run, and of an earlier interrupted run it finished.
    pub journal: Option<u64>,
    pub resumed_journal: Option<u64>,
    /// Packs a dropped generation referenced that a retained one still does (kept).
    pub packs_shared: u64,
    /// Keys gc failed to remove (it goes on; the next run retries them through the journal).
    pub errors: Vec<String>,
    /// Generations whose manifest this jitship cannot decode (corrupt, or written by a newer
    /// jitship). gc fails closed on them: every generation of their compat id is kept, and no
    /// pack at all is removed this run, since such a generation may reference any pack. The packs
    /// this run would have removed stay in its journal for a later run.
    pub unreadable: Vec<String>,
    /// Packs removed whose size the store could not tell (not counted in `pack_bytes`).
    pub packs_unknown_size: u64,
    /// What records no trusted key signed decided this run (the policy and settings of a compat
    /// id, the grace of a generation, the newest generation kept for installs): with no trusted
    /// key configured, anyone who can write the store decides these. Also logged at WARN.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unsigned: Vec<String>,
    /// gc journals passed over: corrupt, oversized, another place's, or naming keys a journal may
    /// not name (anything but this namespace's head, contribution and manifest keys). Anyone can
    /// write them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub journals_refused: Vec<String>,
    /// With a durable registry tier: what `collect_registry` deleted there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registry: Option<RegistryGc>,
    /// Keys retention did not decide (kept whole), counted by why; `None`: every key was decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_decided: Option<NotDecided>,
}

impl GcReport {
    /// Counts the keys kept whole (`not_decided`), from the policies' lines and `unreadable_keys`.
    fn count_not_decided(&mut self, unreadable_keys: &HashSet<CompatId>) {
        let mut n = NotDecided::default();
        let mut keys: HashSet<CompatId> = unreadable_keys.clone();
        for k in &self.policies {
            match k.kept_whole_cause {
                Some(KeptWholeCause::PolicyMissing) => n.policy_missing += 1,
                Some(KeptWholeCause::PolicyFailed) => n.policy_failed += 1,
                None => continue,
            }
            keys.insert(k.compat_id);
        }
        n.unreadable = unreadable_keys.len() as u64;
        n.keys = keys.len() as u64;
        self.not_decided = (n.keys > 0).then_some(n);
    }
}

/// What gc did to the durable registry tier: the manifest of every generation retention
/// dropped, deleted by digest (its tags go with it; the registry's own garbage collection frees
/// the blobs).
#[derive(Debug, Clone, Default, Serialize)]
pub struct RegistryGc {
    pub registry: String,
    /// Tags of the generations deleted (in a dry run: that would be, if the registry has them).
    pub deleted: Vec<String>,
    /// Dropped generations the registry did not hold.
    pub absent: u64,
    /// Deletes that failed (the generation stays in the registry; the next gc does not see it
    /// again, since the store no longer holds it: delete it with the registry's tools).
    pub errors: Vec<String>,
}

/// Retention decides once, for the store (`collect`); this applies its drops to the durable
/// registry tier. Only generations retention dropped are deleted: a generation the store does not
/// hold at all (lost to a master restart, say) is never judged by gc, so it stays.
pub fn collect_registry(
    registry: &crate::oci::Registry,
    report: &GcReport,
    deadline: std::time::Instant,
) -> RegistryGc {
    let mut gc = RegistryGc {
        registry: registry.describe(),
        ..RegistryGc::default()
    };
    for d in report
        .decisions
        .iter()
        .filter(|d| d.verdict == Verdict::Drop)
    {
        for &seq in &d.seqs {
            let tag = crate::oci::Registry::generation_tag(&d.compat_id, seq, &d.generation);
            if report.dry_run {
                gc.deleted.push(tag);
                continue;
            }
            match registry.delete_generation(&d.compat_id, seq, &d.generation, deadline) {
                Ok(true) => gc.deleted.push(tag),
                Ok(false) => gc.absent += 1,
                Err(e) => gc.errors.push(format!("{tag}: {e}")),
            }
        }
    }
    gc
}

/// What this run removes, as decided so far.
#[derive(Default)]
struct Plan {
    heads: Vec<(CompatId, u64)>,
    manifests: BTreeSet<GenerationId>,
    /// Packs of what is removed (and of a resumed journal), with their size where known: removed
    /// unless a retained generation references them.
    dropped_packs: HashMap<ContentHash, u64>,
    /// (compat id, floor seq, seqs below the floor that stay).
    floors: Vec<(CompatId, u64, Vec<u64>)>,
    /// Packs retained generations reference.
    retained: HashSet<ContentHash>,
    /// Policy modules (by digest) a removed generation names, and those a retained one names: a
    /// module goes only when no retained generation names it.
    dropped_modules: BTreeSet<ContentHash>,
    retained_modules: HashSet<ContentHash>,
    /// The modules this run removes (`settle_modules`).
    modules: Vec<ContentHash>,
    /// Every generation some head names.
    known: HashSet<GenerationId>,
    /// Contribution records whose seq's next head was written more than `grace` ago.
    contributions: Vec<String>,
    /// Head keys of retained generations: a journal never removes them.
    kept_heads: HashSet<String>,
    /// Compat ids kept whole because a manifest that counts cannot be decoded.
    unreadable_keys: HashSet<CompatId>,
    /// Keys of an interrupted earlier run's journal, removed again, and its seq.
    resumed: Vec<String>,
    resumed_journal: Option<u64>,
}

/// Decides and (unless `dry_run`) removes. `policies` finds the policy that governs each compat
/// id (`PolicyIndex`: the one it was published with; a closure `Fn(&str) -> Arc<dyn CachePolicy>`:
/// the caller's own choice per kind).
pub fn collect(
    store: &dyn Store,
    layout: &KeyLayout,
    policies: &dyn PolicyFinder,
    opts: &GcOptions,
) -> Result<GcReport, GcError> {
    let mut report = GcReport {
        dry_run: opts.dry_run,
        ..GcReport::default()
    };
    let survey = inspect::survey(store, layout, &opts.trust)?;
    let mut plan = Plan::default();
    note_faulty_and_unreadable(&survey, opts, &mut report);
    for compat in &survey.compats {
        decide_compat(layout, compat, policies, opts, &mut plan, &mut report);
    }
    add_merged_losers(store, layout, &survey, &mut plan)?;
    add_spent_contributions(store, layout, &survey, opts, &mut plan)?;
    resume_interrupted_run(store, layout, &mut plan, &mut report)?;
    add_orphans(store, layout, opts, &mut plan, &report)?;
    report.count_not_decided(&plan.unreadable_keys);
    let mut packs = settle_packs(&mut plan, &mut report);
    plan.modules = settle_modules(&mut plan, &report);

    report.heads = plan
        .heads
        .iter()
        .map(|(c, s)| layout.head(c, *s))
        .chain(
            plan.resumed
                .iter()
                .filter(|k| k.contains("/head/"))
                .cloned(),
        )
        .collect();
    report.manifests = plan.manifests.iter().copied().collect();
    report.contributions = plan.contributions.len() as u64;
    report.floors = plan.floors.iter().map(|(c, f, _)| (*c, *f)).collect();
    report.resumed_journal = plan.resumed_journal.filter(|_| !plan.resumed.is_empty());
    // Failing closed: with a generation nobody here can read, no pack is removed this run; the
    // ones planned go into the journal (not marked done), so a later run reconsiders them.
    let deferred_packs: Vec<ContentHash> = if report.unreadable.is_empty() {
        vec![]
    } else {
        std::mem::take(&mut packs)
            .into_iter()
            .map(|p| p.0)
            .collect()
    };
    let nothing = report.heads.is_empty()
        && report.manifests.is_empty()
        && plan.contributions.is_empty()
        && !plan.resumed.iter().any(|k| k.contains("/contrib/"))
        && !plan.resumed.iter().any(|k| k.contains("/gen/"))
        && !plan.resumed.iter().any(|k| k.contains("/module/"))
        && packs.is_empty()
        && plan.modules.is_empty();
    if opts.dry_run || nothing {
        report.packs = packs.iter().map(|p| p.0).collect();
        report.pack_bytes = packs.iter().map(|p| p.1).sum();
        report.modules = plan.modules.clone();
        return Ok(report);
    }
    remove(
        store,
        layout,
        opts,
        &plan,
        packs,
        deferred_packs,
        &mut report,
    )?;
    Ok(report)
}

/// Faulty heads are reported and left in place; a manifest that counts but cannot be decoded
/// makes gc fail closed (`unreadable`). Only a generation that counts can hold up pack removal:
/// an untrusted store writer's garbage manifest must not stop gc.
fn note_faulty_and_unreadable(survey: &inspect::Survey, opts: &GcOptions, report: &mut GcReport) {
    for c in &survey.compats {
        for f in &c.faulty_heads {
            report.faulty_heads.push(format!(
                "compat id {} seq {}: {} (left in place; readers pass it over)",
                c.compat_id, f.seq, f.fault
            ));
        }
        let unnamed = c.faulty_count.saturating_sub(c.faulty_heads.len() as u64);
        if unnamed > 0 {
            report.faulty_heads.push(format!(
                "compat id {}: {unnamed} more heads that are no usable head, below those (left in place)",
                c.compat_id
            ));
        }
    }
    for (c, g) in survey.generations().filter(|(_, g)| counts(opts, g)) {
        if let ManifestState::Corrupt { error } = &g.state {
            report.unreadable.push(format!(
                "compat id {} generation {}: {error}",
                c.compat_id, g.id
            ));
        }
    }
}

/// Manifests that lost a head race and were merged into a winner: never headed, so garbage.
fn add_merged_losers(
    store: &dyn Store,
    layout: &KeyLayout,
    survey: &inspect::Survey,
    plan: &mut Plan,
) -> Result<(), GcError> {
    let losers: BTreeSet<GenerationId> = survey
        .generations()
        .filter_map(|(_, g)| g.summary())
        .flat_map(|s| s.merged.iter().copied())
        .filter(|id| !plan.known.contains(id))
        .collect();
    for id in losers {
        if let Some(m) = fetch_if_decodable(store, layout, &id)? {
            drop_manifest(plan, id, &m);
        }
    }
    Ok(())
}

/// Contributions (`catalog::contributions`) that are spent: those at a seq whose next head was
/// written more than `grace` ago. Their writers are long done: the next head merged them, or
/// their writer contributed again above. The record goes, and the manifest it names unless a head
/// names it, with that manifest's `merged` (its writer's earlier lost attempts) and their packs
/// (removed only if no retained generation references them). Within `grace` a contribution may
/// belong to a publish still running, whose packs no head names yet. Contributions at the newest
/// seq stay: the next publish's writer may still read them. Anyone can write these records: at
/// most `CONTRIBUTION_SLOTS` are read per seq, each under the head cap, and a manifest is removed
/// only if no head names it.
fn add_spent_contributions(
    store: &dyn Store,
    layout: &KeyLayout,
    survey: &inspect::Survey,
    opts: &GcOptions,
    plan: &mut Plan,
) -> Result<(), GcError> {
    let grace = opts.grace.as_secs();
    for compat in &survey.compats {
        let written_at: HashMap<u64, u64> = compat
            .generations
            .iter()
            .flat_map(|g| g.seqs.iter().map(move |&seq| (seq, g.head_written_at)))
            .collect();
        let spent = written_at.keys().copied().filter(|seq| {
            written_at
                .get(&(seq + 1))
                .is_some_and(|&t| opts.now.saturating_sub(t) >= grace)
        });
        let mut named = BTreeSet::new();
        for seq in spent.collect::<BTreeSet<_>>() {
            for (slot, read) in
                catalog::contributions::read_contributions(store, layout, &compat.compat_id, seq)?
            {
                plan.contributions
                    .push(layout.contribution(&compat.compat_id, seq, slot));
                if let Ok(record) = read {
                    named.insert(record.generation);
                }
            }
        }
        let mut earlier = BTreeSet::new();
        for id in &named {
            if plan.known.contains(id) {
                continue;
            }
            if let Some(m) = fetch_if_decodable(store, layout, id)? {
                earlier.extend(m.merged.iter().copied());
                drop_manifest(plan, *id, &m);
            }
        }
        for id in earlier.difference(&named) {
            if plan.known.contains(id) || plan.manifests.contains(id) {
                continue;
            }
            if let Some(m) = fetch_if_decodable(store, layout, id)? {
                drop_manifest(plan, *id, &m);
            }
        }
    }
    Ok(())
}

fn drop_manifest(plan: &mut Plan, id: GenerationId, m: &crate::generation::Manifest) {
    plan.manifests.insert(id);
    for p in &m.packs {
        plan.dropped_packs.insert(p.id, p.size);
    }
    plan.dropped_modules.extend(module_of(&m.policy));
}

/// The stored module a manifest names (`catalog::modules`): its policy's digest, unless that is
/// `native` or another word no module is stored under.
fn module_of(policy: &PolicyRef) -> Option<ContentHash> {
    policy.digest.parse().ok()
}

/// How many journals, newest first, gc reads looking for the newest one it may resume.
const JOURNALS_READ: usize = 4;

/// An interrupted earlier run: finish what it planned. Anyone can write a journal, so one is
/// resumed only if it is a journal of this place that names nothing but this namespace's head
/// and manifest keys (`parse_journal_key`); another is passed over and reported, and gc goes on to
/// the one below. Even then a key of a generation this run keeps is left, and its packs go
/// through the rule for every pack (removed only if no retained generation references them).
/// Its keys are not probed with `exists` (on Mooncake a probe leases the key and blocks its
/// removal); removing a key already gone is a no-op.
fn resume_interrupted_run(
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
fn read_journal(
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

enum JournalKey {
    Head,
    Contribution,
    Manifest(GenerationId),
    Module(ContentHash),
}

/// What a journal key is, if it is one a journal may name: a head or manifest key of this
/// namespace, exactly as this jitship spells it.
fn parse_journal_key(layout: &KeyLayout, key: &str) -> Option<JournalKey> {
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

/// Orphans, where the store can list and date keys: manifests and packs nothing references,
/// written more than `grace` ago (crashed publishes). Orphan packs are looked for only when every
/// generation could be read (see `unreadable`).
fn add_orphans(
    store: &dyn Store,
    layout: &KeyLayout,
    opts: &GcOptions,
    plan: &mut Plan,
    report: &GcReport,
) -> Result<(), GcError> {
    let grace_cutoff = SystemTime::UNIX_EPOCH + Duration::from_secs(opts.now)
        - opts.grace.min(Duration::from_secs(opts.now));
    let dates = store.capabilities().write_times;
    let old_enough = |key: &str| -> Result<bool, StoreError> {
        Ok(dates && store.modified(key)?.is_some_and(|t| t <= grace_cutoff))
    };
    let manifests = layout.generations_prefix();
    for key in list_or_none(store, &manifests)?.unwrap_or_default() {
        let Some(id) = key.strip_prefix(&manifests).and_then(|s| s.parse().ok()) else {
            continue;
        };
        if !plan.known.contains(&id) && !plan.manifests.contains(&id) && old_enough(&key)? {
            plan.manifests.insert(id);
        }
    }
    if !report.unreadable.is_empty() {
        return Ok(());
    }
    let modules = layout.modules_prefix();
    for key in list_or_none(store, &modules)?.unwrap_or_default() {
        let Some(digest) = key.strip_prefix(&modules).and_then(|s| s.parse().ok()) else {
            continue;
        };
        if !plan.retained_modules.contains(&digest) && old_enough(&key)? {
            plan.dropped_modules.insert(digest);
        }
    }
    let packs = layout.packs_prefix();
    for key in list_or_none(store, &packs)?.unwrap_or_default() {
        let Some(id) = key.strip_prefix(&packs).and_then(|s| s.parse().ok()) else {
            continue;
        };
        if !plan.retained.contains(&id)
            && !plan.dropped_packs.contains_key(&id)
            && old_enough(&key)?
        {
            plan.dropped_packs.insert(id, 0);
        }
    }
    Ok(())
}

/// The packs to remove, sorted: those dropped that no retained generation references (the
/// others are counted as shared).
fn settle_packs(plan: &mut Plan, report: &mut GcReport) -> Vec<(ContentHash, u64)> {
    let mut packs = Vec::new();
    for (id, size) in std::mem::take(&mut plan.dropped_packs) {
        if plan.retained.contains(&id) {
            report.packs_shared += 1;
        } else {
            packs.push((id, size));
        }
    }
    packs.sort();
    packs
}

/// The stored modules to remove: those a removed (or orphan) generation named that no retained
/// one names. None while a generation gc cannot read counts (it may name any module).
fn settle_modules(plan: &mut Plan, report: &GcReport) -> Vec<ContentHash> {
    let dropped = std::mem::take(&mut plan.dropped_modules);
    if !report.unreadable.is_empty() {
        return vec![];
    }
    dropped
        .into_iter()
        .filter(|d| !plan.retained_modules.contains(d))
        .collect()
}

/// Removes in an order a reader never half-sees: 1. floors, 2. journal, 3. heads, manifests,
/// packs (sparing those of generations published while gc ran).
fn remove(
    store: &dyn Store,
    layout: &KeyLayout,
    opts: &GcOptions,
    plan: &Plan,
    mut packs: Vec<(ContentHash, u64)>,
    deferred_packs: Vec<ContentHash>,
    report: &mut GcReport,
) -> Result<(), GcError> {
    for (compat, floor, keep) in &plan.floors {
        catalog::write_floor(store, layout, compat, *floor, keep.clone())?;
    }
    let manifest_keys: Vec<String> = report
        .manifests
        .iter()
        .map(|id| layout.generation(id))
        .chain(plan.resumed.iter().filter(|k| k.contains("/gen/")).cloned())
        .collect();
    let contribution_keys: Vec<String> = plan
        .contributions
        .iter()
        .chain(plan.resumed.iter().filter(|k| k.contains("/contrib/")))
        .cloned()
        .collect();
    let module_keys: Vec<String> = plan
        .modules
        .iter()
        .map(|d| layout.module(d))
        .chain(
            plan.resumed
                .iter()
                .filter(|k| k.contains("/module/"))
                .cloned(),
        )
        .collect();
    let mut journal_keys = report.heads.clone();
    journal_keys.extend(contribution_keys.iter().cloned());
    journal_keys.extend(manifest_keys.iter().cloned());
    journal_keys.extend(module_keys.iter().cloned());
    let journal_packs = packs.iter().map(|p| p.0).chain(deferred_packs).collect();
    let journal = catalog::write_gc_journal(store, layout, journal_keys, journal_packs)?;
    report.journal = Some(journal.seq);
    let heads = report.heads.clone();
    remove_all(store, &heads, opts, &mut report.errors);
    // A contribution goes before the manifest it names: a reader never finds one naming nothing.
    remove_all(store, &contribution_keys, opts, &mut report.errors);
    remove_all(store, &manifest_keys, opts, &mut report.errors);
    let (spared, spared_modules) = spared_packs(store, layout, opts, plan, report)?;
    if !report.unreadable.is_empty() {
        packs.clear();
    }
    remove_packs(store, layout, opts, packs, &spared, report);
    // Modules last: after every manifest that named them, sparing those of generations published
    // while gc ran (and all of them if one of those cannot be read).
    if report.unreadable.is_empty() {
        let keys: Vec<String> = module_keys
            .into_iter()
            .filter(|k| {
                k.strip_prefix(&layout.modules_prefix())
                    .and_then(|d| d.parse::<ContentHash>().ok())
                    .is_some_and(|d| !spared_modules.contains(&d))
            })
            .collect();
        for key in remove_all(store, &keys, opts, &mut report.errors) {
            if let Some(d) = key
                .strip_prefix(&layout.modules_prefix())
                .and_then(|d| d.parse().ok())
            {
                report.modules.push(d);
            }
        }
    }
    if report.errors.is_empty() && report.unreadable.is_empty() {
        catalog::mark_gc_done(store, layout, journal.seq)?;
    }
    Ok(())
}

/// Packs no run may remove now: those retained generations reference, and those of every
/// generation published (and counting) while gc ran. A generation published meanwhile that this
/// jitship cannot read (a newer jitship's) may reference any pack: it goes to `unreadable`, and
/// no pack is removed.
fn spared_packs(
    store: &dyn Store,
    layout: &KeyLayout,
    opts: &GcOptions,
    plan: &Plan,
    report: &mut GcReport,
) -> Result<(HashSet<ContentHash>, HashSet<ContentHash>), GcError> {
    let mut spared = plan.retained.clone();
    let mut spared_modules = plan.retained_modules.clone();
    for compat in catalog::compat_ids(store, layout)? {
        let Some(head) = catalog::newest_head(store, layout, &compat)? else {
            continue;
        };
        if plan.known.contains(&head.generation)
            || !counts_signer(opts, &opts.trust.judge(layout.namespace(), &head))
        {
            continue;
        }
        match catalog::read_manifest(store, layout, &head.generation)? {
            ManifestRead::Present(m) => {
                spared.extend(m.packs.iter().map(|p| p.id));
                spared_modules.extend(module_of(&m.policy));
            }
            ManifestRead::Missing => {}
            ManifestRead::Unreadable(source) => {
                report.unreadable.push(format!(
                    "compat id {compat} generation {} (published during this gc): {source}",
                    head.generation
                ));
            }
        }
    }
    Ok((spared, spared_modules))
}

fn remove_packs(
    store: &dyn Store,
    layout: &KeyLayout,
    opts: &GcOptions,
    packs: Vec<(ContentHash, u64)>,
    spared: &HashSet<ContentHash>,
    report: &mut GcReport,
) {
    let mut pack_keys = Vec::new();
    let mut size_of: HashMap<String, (ContentHash, u64)> = HashMap::new();
    for (id, mut size) in packs {
        if spared.contains(&id) {
            report.packs_shared += 1;
            continue;
        }
        let key = layout.pack(&id);
        // Orphans found by listing and packs of a resumed journal come without a size.
        if size == 0 {
            size = store.size(&key).ok().flatten().unwrap_or(0);
        }
        size_of.insert(key.clone(), (id, size));
        pack_keys.push(key);
    }
    // Replicas first (publish's `[publish] pack_replicas`, whatever this run's setting: every
    // possible one, found with one batch of exists), so a failed run leaves the primary, which
    // its journal names for the next run to retry, rather than replicas nothing can find.
    let replicas = replica_keys(store, layout, size_of.values().map(|(id, _)| *id));
    remove_all(store, &replicas, opts, &mut report.errors);
    for key in remove_all(store, &pack_keys, opts, &mut report.errors) {
        if let Some(&(id, size)) = size_of.get(&key) {
            report.packs.push(id);
            report.pack_bytes += size;
            if size == 0 {
                report.packs_unknown_size += 1;
            }
        }
    }
}

/// The replica keys of `packs` the store holds.
fn replica_keys(
    store: &dyn Store,
    layout: &KeyLayout,
    packs: impl Iterator<Item = ContentHash>,
) -> Vec<String> {
    let keys: Vec<String> = packs
        .flat_map(|id| (1..KeyLayout::MAX_PACK_REPLICAS).map(move |k| layout.pack_copy(&id, k)))
        .collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    // One whose existence cannot be told is tried: removing what is absent is harmless.
    let present = store.exists_batch(&refs);
    keys.iter()
        .zip(present)
        .filter(|(_, p)| !matches!(p, Ok(false)))
        .map(|(k, _)| k.clone())
        .collect()
}

/// Retention for one compat id: a verdict per generation, heads and manifests to remove, the
/// packs retained and dropped, and the floor above the dropped heads.
fn decide_compat(
    layout: &KeyLayout,
    compat: &CompatView,
    policies: &dyn PolicyFinder,
    opts: &GcOptions,
    plan: &mut Plan,
    report: &mut GcReport,
) {
    let rules = Rules::of(compat, policies, opts, report);
    if rules.unreadable {
        plan.unreadable_keys.insert(compat.compat_id);
    }
    let mut kept_seqs: Vec<u64> = Vec::new();
    let mut dropped_seqs: Vec<u64> = Vec::new();
    for g in &compat.generations {
        plan.known.insert(g.id);
        let (verdict, reason) = rules.verdict(g);
        if verdict == Verdict::Drop
            && counts(opts, g)
            && let Some(by) = g.superseded_by
            && let Some(signer) =
                signer_of(compat, by).filter(|s| !matches!(s, Signer::Trusted { .. }))
        {
            note_unsigned(
                report,
                format!(
                    "generation {} of compat id {}: dropped when its grace period, counted from \
                     head {by} ({signer}), ran out; that head's time is its writer's word (or \
                     the store's date of it, where later)",
                    g.id, compat.compat_id
                ),
            );
        }
        let packs = g.summary().map(|s| s.packs.as_slice()).unwrap_or_default();
        match verdict {
            Verdict::Keep => {
                plan.retained_modules
                    .extend(g.summary().and_then(|s| module_of(&s.policy)));
                kept_seqs.extend(&g.seqs);
                plan.kept_heads
                    .extend(g.seqs.iter().map(|s| layout.head(&compat.compat_id, *s)));
                plan.retained.extend(packs.iter().map(|p| p.id));
            }
            Verdict::Drop => {
                dropped_seqs.extend(&g.seqs);
                plan.heads
                    .extend(g.seqs.iter().map(|s| (compat.compat_id, *s)));
                plan.manifests.insert(g.id);
                plan.dropped_packs
                    .extend(packs.iter().map(|p| (p.id, p.size)));
                plan.dropped_modules
                    .extend(g.summary().and_then(|s| module_of(&s.policy)));
            }
        }
        report.decisions.push(Decision {
            compat_id: compat.compat_id,
            cache_kind: compat.cache_kind.clone(),
            generation: g.id,
            seqs: g.seqs.clone(),
            verdict,
            reason,
            size_bytes: g.summary().map_or(0, |s| s.size_bytes),
        });
    }
    if !dropped_seqs.is_empty()
        && let Some(newest) = rules.newest.filter(|g| !trusted(g))
    {
        note_unsigned(
            report,
            format!(
                "compat id {}: the newest generation, kept for installs and counted in the quota, \
                 is {}, {}",
                compat.compat_id,
                newest.id,
                signers(newest)
            ),
        );
    }
    // The floor is built from what this run removes alone: a floor record read from the store
    // may be anyone's (`catalog::write_floor` keeps a higher earlier floor only where a head
    // exists at it).
    if let Some(&highest_dropped) = dropped_seqs.iter().max() {
        let floor = highest_dropped + 1;
        let mut keep: Vec<u64> = kept_seqs.into_iter().filter(|&s| s < floor).collect();
        keep.sort_unstable_by(|a, b| b.cmp(a));
        plan.floors.push((compat.compat_id, floor, keep));
    }
}

/// What decides each generation of one compat id.
struct Rules<'a> {
    opts: &'a GcOptions,
    /// The newest generation that counts: the one installs take, never dropped.
    newest: Option<&'a inspect::GenerationView>,
    newest_seq: Option<u64>,
    /// A generation that counts has a manifest this jitship cannot decode: keep everything.
    unreadable: bool,
    /// What the governing policy drops, or why every generation is kept.
    policy_drops: Result<HashMap<GenerationId, RetentionDrop>, &'static str>,
}

impl<'a> Rules<'a> {
    fn of(
        compat: &'a CompatView,
        policies: &dyn PolicyFinder,
        opts: &'a GcOptions,
        report: &mut GcReport,
    ) -> Self {
        let counting = || compat.generations.iter().filter(|g| counts(opts, g));
        let newest = counting().next();
        Rules {
            opts,
            newest,
            newest_seq: newest.and_then(|g| g.seqs.iter().max().copied()),
            unreadable: counting().any(|g| matches!(g.state, ManifestState::Corrupt { .. })),
            policy_drops: retention_drops(compat, policies, opts, report),
        }
    }

    fn verdict(&self, g: &inspect::GenerationView) -> (Verdict, String) {
        let keep = |why: &str| (Verdict::Keep, why.to_owned());
        if self.newest.is_some_and(|n| n.id == g.id) {
            return keep("newest: the head installs read");
        }
        if !counts(self.opts, g) {
            return untrusted_verdict(g, self.newest_seq);
        }
        if self.unreadable {
            return keep(
                "its compat id has a manifest this jitship cannot decode: keeping everything",
            );
        }
        if g.pinned {
            return keep("pinned");
        }
        let grace = self.opts.grace.as_secs();
        let superseded_for = g.superseded_at.map(|s| self.opts.now.saturating_sub(s));
        let past_grace = superseded_for.is_some_and(|s| s >= grace);
        if !matches!(g.state, ManifestState::Present(_)) {
            return match past_grace {
                true => (Verdict::Drop, "manifest missing (head is dead)".to_owned()),
                false => keep("manifest missing, but superseded within the grace period"),
            };
        }
        let why = match &self.policy_drops {
            Err(why) => return keep(why),
            Ok(drops) => match drops.get(&g.id) {
                Some(why) => why,
                None => return keep("retained by the policy"),
            },
        };
        if past_grace {
            let reason = format!(
                "dropped by the retention policy ({}: {})",
                why.category, why.detail
            );
            return (Verdict::Drop, reason);
        }
        let reason = format!(
            "the policy drops it ({}: {}), but it was superseded {}s ago, within the {}s grace period (an install may still read it)",
            why.category,
            why.detail,
            superseded_for.unwrap_or(0),
            grace
        );
        (Verdict::Keep, reason)
    }
}

/// What the policy that governs the compat id drops (the one its newest readable generation
/// that counts was published with), given the operator's quotas; `Err`: why every generation is
/// kept. Which policy decided, or why none did, goes into the report.
fn retention_drops(
    compat: &CompatView,
    policies: &dyn PolicyFinder,
    opts: &GcOptions,
    report: &mut GcReport,
) -> Result<HashMap<GenerationId, RetentionDrop>, &'static str> {
    let counting: Vec<&inspect::GenerationView> = compat
        .generations
        .iter()
        .filter(|g| counts(opts, g))
        .collect();
    // The policy and its settings come from the newest readable generation a trusted key signed;
    // only where there is none (no key configured, or none of its generations signed) from the
    // newest readable one that counts, and the report says that an unsigned record decided.
    let decider = counting
        .iter()
        .find(|g| g.summary().is_some() && trusted(g))
        .or_else(|| counting.iter().find(|g| g.summary().is_some()));
    let published_with: Option<PolicyRef> =
        decider.and_then(|g| g.summary()).map(|s| s.policy.clone());
    if let (Some(g), Some(p)) = (decider, &published_with)
        && !trusted(g)
    {
        let settings = match p.settings.is_empty() {
            true => String::new(),
            false => format!(
                " with settings {}",
                crate::policy::host::describe(&p.settings)
            ),
        };
        note_unsigned(
            report,
            format!(
                "compat id {}: the policy that decides its retention ({}@{}{settings}) is the one \
                 recorded by generation {}, {}",
                compat.compat_id,
                p.name,
                p.version,
                g.id,
                signers(g)
            ),
        );
    }
    let mut key = KeyPolicy {
        compat_id: compat.compat_id,
        cache_kind: compat.cache_kind.clone(),
        published_with: published_with.clone(),
        decided_by: None,
        kept_whole: None,
        kept_whole_cause: None,
    };
    // No readable manifest at all: only dead heads, nothing for a policy to weigh.
    let (Some(kind), Some(recorded)) = (&compat.cache_kind, &published_with) else {
        if published_with.is_some() {
            report.policies.push(key);
        }
        return Ok(HashMap::new());
    };
    let drops = match policies.governing(kind, recorded) {
        Governing::Found { policy, used } => {
            key.decided_by = Some(used);
            let summaries: Vec<GenerationSummary> = counting
                .iter()
                .filter_map(|g| {
                    let s = g.summary()?;
                    Some(GenerationSummary {
                        id: g.id,
                        compat_key: compat.compat_key.clone().unwrap_or_default(),
                        created_at: s.created_at,
                        size_bytes: s.size_bytes,
                        file_count: s.file_count,
                        pinned: g.pinned,
                    })
                })
                .collect();
            match policy.retain(&summaries, opts.now, &opts.limits) {
                Ok(drops) => Ok(drops.into_iter().map(|d| (d.id, d)).collect()),
                Err(e) => {
                    let msg = format!(
                        "{kind} (compat id {}): policy {} failed in retain: {e}; keeping every generation of it",
                        compat.compat_id,
                        policy.info().name
                    );
                    key.kept_whole = Some(msg.clone());
                    key.kept_whole_cause = Some(KeptWholeCause::PolicyFailed);
                    report.policy_errors.push(msg);
                    Err("policy failed; keeping")
                }
            }
        }
        Governing::Missing { reason } => {
            tracing::warn!(kind = %kind, compat_id = %compat.compat_id, "gc: {reason}");
            key.kept_whole = Some(reason);
            key.kept_whole_cause = Some(KeptWholeCause::PolicyMissing);
            Err("kept whole: the policy it was published with is not here (see its policy line)")
        }
    };
    report.policies.push(key);
    drops
}

/// Whether a trusted key signed a head of `g`.
fn trusted(g: &inspect::GenerationView) -> bool {
    g.signatures
        .iter()
        .any(|s| matches!(s.signer, Signer::Trusted { .. }))
}

/// Who signed the heads of `g`, for the report.
fn signers(g: &inspect::GenerationView) -> String {
    let mut who: Vec<String> = g.signatures.iter().map(|s| s.signer.to_string()).collect();
    who.dedup();
    who.join(", ")
}

/// Who signed the head at `seq` of `compat`.
fn signer_of(compat: &CompatView, seq: u64) -> Option<Signer> {
    compat
        .generations
        .iter()
        .flat_map(|g| g.signatures.iter())
        .find(|s| s.seq == seq)
        .map(|s| s.signer.clone())
}

/// Records (and logs at WARN) what a record no trusted key signed decided.
fn note_unsigned(report: &mut GcReport, what: String) {
    tracing::warn!("gc: decided by an unsigned record: {what}");
    report.unsigned.push(what);
}

/// Whether `g` counts for retention: under `required`, only if a trusted key signed one of its
/// heads (what installs here take); otherwise every generation counts.
fn counts(opts: &GcOptions, g: &inspect::GenerationView) -> bool {
    g.signatures.iter().any(|s| counts_signer(opts, &s.signer))
}

/// Whether a head signed by `signer` counts (see `counts`).
fn counts_signer(opts: &GcOptions, signer: &Signer) -> bool {
    opts.trust.mode() != crate::config::TrustMode::Required
        || matches!(signer, Signer::Trusted { .. })
}

/// A generation no trusted key signed, under `required`: installs here never take it, so it
/// neither fills the quota nor is kept for readers. Removed unless pinned, or unless a head of it
/// lies above the newest trusted head: removing the top of a head sequence is not safe for stores
/// without listing (the floor must stay below a head that exists), so those are reported and
/// left; installs pass them over and the next trusted publish writes above them.
fn untrusted_verdict(
    g: &inspect::GenerationView,
    newest_trusted: Option<u64>,
) -> (Verdict, String) {
    let signers: Vec<String> = g.signatures.iter().map(|s| s.signer.to_string()).collect();
    let who = signers.join(", ");
    if g.pinned {
        return (Verdict::Keep, format!("pinned, though {who}"));
    }
    match newest_trusted {
        Some(top) if g.seqs.iter().all(|&s| s < top) => (
            Verdict::Drop,
            format!("{who}: trust is required, so installs never take it; removed"),
        ),
        _ => (
            Verdict::Keep,
            format!(
                "{who}: trust is required, so installs pass it over; left in place above the \
                 newest trusted head (remove it by hand, or let a trusted publish write above it)"
            ),
        ),
    }
}

fn fetch_if_decodable(
    store: &dyn Store,
    layout: &KeyLayout,
    id: &GenerationId,
) -> Result<Option<crate::generation::Manifest>, GcError> {
    match catalog::read_manifest(store, layout, id)? {
        ManifestRead::Present(m) => Ok(Some(*m)),
        ManifestRead::Missing | ManifestRead::Unreadable(_) => Ok(None),
    }
}

fn list_or_none(store: &dyn Store, prefix: &str) -> Result<Option<Vec<String>>, StoreError> {
    if store.capabilities().listing {
        store.list(prefix).map(Some)
    } else {
        Ok(None)
    }
}

/// Removes `keys`, waiting out readers' leases (`opts.lease_wait` apart, at most
/// `opts.lease_rounds` times); other failures are recorded and gc goes on. Returns the keys that
/// were there and are gone.
fn remove_all(
    store: &dyn Store,
    keys: &[String],
    opts: &GcOptions,
    errors: &mut Vec<String>,
) -> Vec<String> {
    let wait = catalog::LeaseWait {
        interval: opts.lease_wait,
        rounds: opts.lease_rounds,
    };
    let removal = catalog::remove_waiting_out_leases(store, keys, wait);
    errors.extend(removal.failed.iter().map(|(key, e)| format!("{key}: {e}")));
    removal.removed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 43: on a store that lists and dates keys, a stored module no generation names goes
    /// once older than grace; within grace (a publish may be about to name it) it stays. A key
    /// under `module/` that is not a digest is never touched.
    #[test]
    fn an_orphan_module_goes_after_grace_and_not_before() {
        use crate::store::ValueClass;
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::LocalStore::open(dir.path()).unwrap();
        let layout = KeyLayout::new("ns").unwrap();
        let orphan = ContentHash::of(b"module");
        store
            .put(&layout.module(&orphan), b"module", ValueClass::Record)
            .unwrap();
        let junk = format!("{}not-a-digest", layout.modules_prefix());
        store.put(&junk, b"x", ValueClass::Record).unwrap();
        let no_policy = |_: &str| -> std::sync::Arc<dyn crate::policy::CachePolicy> {
            unreachable!("no key to decide")
        };
        let opts = |now: u64| GcOptions {
            now,
            grace: Duration::from_secs(3600),
            limits: RetentionLimits::default(),
            dry_run: false,
            lease_wait: Duration::ZERO,
            lease_rounds: 0,
            trust: Default::default(),
        };
        let written = crate::catalog::now_secs();
        let r = collect(&store, &layout, &no_policy, &opts(written + 60)).unwrap();
        assert!(r.modules.is_empty(), "{:?}", r.modules);
        assert!(store.exists(&layout.module(&orphan)).unwrap());
        let r = collect(&store, &layout, &no_policy, &opts(written + 7200)).unwrap();
        assert_eq!(r.modules, vec![orphan]);
        assert!(!store.exists(&layout.module(&orphan)).unwrap());
        assert!(store.exists(&junk).unwrap());
    }

    #[test]
    fn removing_a_pack_removes_every_replica_whatever_this_runs_setting() {
        let dir = tempfile::tempdir().unwrap();
        use crate::store::ValueClass;
        let store = crate::store::LocalStore::open(dir.path()).unwrap();
        // Written with 3 copies; gc runs with the default of 1.
        let layout = KeyLayout::new("ns").unwrap();
        let (gone, kept) = (ContentHash::of(b"gone"), ContentHash::of(b"kept"));
        for id in [gone, kept] {
            for k in 0..3 {
                store
                    .put(&layout.pack_copy(&id, k), b"pack", ValueClass::Bulk)
                    .unwrap();
            }
        }
        let opts = GcOptions {
            now: 0,
            grace: Duration::ZERO,
            limits: RetentionLimits::default(),
            dry_run: false,
            lease_wait: Duration::ZERO,
            lease_rounds: 0,
            trust: Default::default(),
        };
        let mut report = GcReport::default();
        let spared = HashSet::from([kept]);
        remove_packs(
            &store,
            &layout,
            &opts,
            vec![(gone, 4), (kept, 4)],
            &spared,
            &mut report,
        );
        assert_eq!(report.packs, vec![gone]);
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        for k in 0..3 {
            assert!(
                !store.exists(&layout.pack_copy(&gone, k)).unwrap(),
                "copy {k}"
            );
            assert!(
                store.exists(&layout.pack_copy(&kept, k)).unwrap(),
                "spared copy {k}"
            );
        }
    }

    #[test]
    fn a_journal_may_name_only_this_namespaces_head_and_manifest_keys() {
        let layout = KeyLayout::new("ns").unwrap();
        let compat = CompatId::new("kernels", "k");
        let id = GenerationId(ContentHash::of(b"g"));
        let ok = |k: &str| parse_journal_key(&layout, k).is_some();
        assert!(ok(&layout.head(&compat, 7)));
        assert!(matches!(
            parse_journal_key(&layout, &layout.generation(&id)),
            Some(JournalKey::Manifest(g)) if g == id
        ));
        let other = KeyLayout::new("other").unwrap();
        for bad in [
            other.head(&compat, 7),
            other.generation(&id),
            layout.pack(&id.0),
            layout.pin(&id),
            layout.floor(&compat, 1),
            layout.gc_journal(1),
            format!("{}/../other/head/{compat}/7", layout.namespace()),
            format!("{}/x", layout.head(&compat, 7)),
            layout.head(&compat, 7).replace("/7", "/07"),
            format!("{}/head/{compat}/", layout.namespace()),
        ] {
            assert!(!ok(&bad), "{bad} accepted");
        }
    }
}
