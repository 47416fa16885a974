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
use std::time::Duration;

mod governing;
mod journal;
mod plan;
mod registry;
mod report;
mod retention;
mod sweep;

pub use governing::{Governing, PolicyFinder, PolicyIndex, PolicyOrigin, UsedPolicy};
pub use registry::{RegistryGc, collect_registry};
pub use report::{Decision, GcReport, KeptWholeCause, KeyPolicy, NotDecided, Verdict};

use crate::catalog::CatalogError;
use crate::catalog::KeyLayout;
use crate::generation::{CompatId, ContentHash, GenerationId};
use crate::inspect::{self, InspectError};
use crate::policy::RetentionLimits;
use crate::store::{Store, StoreError};
use crate::trust::TrustPolicy;

use journal::resume_interrupted_run;
use plan::{
    add_merged_losers, add_orphans, add_spent_contributions, note_faulty_and_unreadable,
    settle_modules, settle_packs,
};
use retention::decide_compat;
use sweep::remove;

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

#[cfg(test)]
mod tests;
