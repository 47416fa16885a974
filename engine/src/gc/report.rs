//! What a gc run reports: a verdict per generation, the policy that decided each compat id, and
//! what was removed.

use std::collections::HashSet;

use serde::Serialize;

use crate::generation::{CompatId, ContentHash, GenerationId, PolicyRef};

use super::UsedPolicy;
use super::registry::RegistryGc;

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
    pub(super) fn count_not_decided(&mut self, unreadable_keys: &HashSet<CompatId>) {
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
