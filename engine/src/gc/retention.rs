//! Retention per compat id: the governing policy's drops, grace, pins and trust.

use std::collections::HashMap;

use crate::catalog::KeyLayout;
use crate::generation::{GenerationId, PolicyRef};
use crate::inspect::{self, CompatView, ManifestState};
use crate::policy::{GenerationSummary, RetentionDrop};
use crate::trust::Signer;

use super::plan::module_of;
use super::report::{Decision, GcReport, KeptWholeCause, KeyPolicy, Verdict};
use super::{GcOptions, Governing, Plan, PolicyFinder};

/// Retention for one compat id: a verdict per generation, heads and manifests to remove, the
/// packs retained and dropped, and the floor above the dropped heads.
pub(super) fn decide_compat(
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
pub(super) struct Rules<'a> {
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
pub(super) fn retention_drops(
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
pub(super) fn trusted(g: &inspect::GenerationView) -> bool {
    g.signatures
        .iter()
        .any(|s| matches!(s.signer, Signer::Trusted { .. }))
}

/// Who signed the heads of `g`, for the report.
pub(super) fn signers(g: &inspect::GenerationView) -> String {
    let mut who: Vec<String> = g.signatures.iter().map(|s| s.signer.to_string()).collect();
    who.dedup();
    who.join(", ")
}

/// Who signed the head at `seq` of `compat`.
pub(super) fn signer_of(compat: &CompatView, seq: u64) -> Option<Signer> {
    compat
        .generations
        .iter()
        .flat_map(|g| g.signatures.iter())
        .find(|s| s.seq == seq)
        .map(|s| s.signer.clone())
}

/// Records (and logs at WARN) what a record no trusted key signed decided.
pub(super) fn note_unsigned(report: &mut GcReport, what: String) {
    tracing::warn!("gc: decided by an unsigned record: {what}");
    report.unsigned.push(what);
}

/// Whether `g` counts for retention: under `required`, only if a trusted key signed one of its
/// heads (what installs here take); otherwise every generation counts.
pub(super) fn counts(opts: &GcOptions, g: &inspect::GenerationView) -> bool {
    g.signatures.iter().any(|s| counts_signer(opts, &s.signer))
}

/// Whether a head signed by `signer` counts (see `counts`).
pub(super) fn counts_signer(opts: &GcOptions, signer: &Signer) -> bool {
    opts.trust.mode() != crate::config::TrustMode::Required
        || matches!(signer, Signer::Trusted { .. })
}

/// A generation no trusted key signed, under `required`: installs here never take it, so it
/// neither fills the quota nor is kept for readers. Removed unless pinned, or unless a head of it
/// lies above the newest trusted head: removing the top of a head sequence is not safe for stores
/// without listing (the floor must stay below a head that exists), so those are reported and
/// left; installs pass them over and the next trusted publish writes above them.
pub(super) fn untrusted_verdict(
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
