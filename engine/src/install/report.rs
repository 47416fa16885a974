//! What an install is asked and what it answers: options, outcome, report, errors, and the
//! `Progress` the job fills in, which becomes the report once the install ends.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::catalog::CatalogError;
use crate::generation::{CompatId, ContentHash, GenerationId};
use crate::interrupt::Interrupt;
use crate::policy::PolicyError;
use crate::store::StoreError;
use crate::trust::{Signer, TrustPolicy};

#[derive(Debug, Clone)]
pub struct InstallOptions {
    /// Bound on the whole install, lock wait included, counted from `started`.
    pub deadline: Duration,
    /// When the deadline's clock started: the CLI passes the process's start
    /// (`process_start`), so what it did before the install spent the deadline too. `None`: when
    /// `install` is called.
    pub started: Option<Instant>,
    /// How many older heads to try when the newest generation is unusable: packs evicted from the
    /// store, or recorded as an incomplete cache by its policy (a complete one is preferred).
    pub fallback_depth: usize,
    /// Test hook (hidden flag `--test-commit-pause`): a pause before each file moved into the
    /// root, so a test can SIGKILL the real binary mid-commit. Zero otherwise.
    pub commit_pause: Duration,
    /// Which heads may be installed.
    pub trust: Arc<TrustPolicy>,
    /// Raised (by SIGTERM or SIGINT in the CLI), it stops the install as the deadline does: the
    /// root is left as it was, unless moving files into it had begun, which then finishes.
    pub interrupt: Interrupt,
    /// The durable registry tier (`[store.durable] registry`): read when the store has nothing
    /// to install, and what it gives put back into the store.
    pub registry: Option<Arc<crate::oci::Registry>>,
    /// Test hook: told once the install's job thread has ended, also when the install stopped
    /// waiting for it (deadline, interrupt), so a test waits for an abandoned job instead of
    /// sleeping. `None` otherwise.
    pub job_ended: Option<std::sync::mpsc::Sender<()>>,
    /// Already-current checks of roots started early (`RecordedChecks::start`); a root with none
    /// is checked when its install begins.
    pub recorded: super::RecordedChecks,
}

impl Default for InstallOptions {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(60),
            started: None,
            fallback_depth: 3,
            commit_pause: Duration::ZERO,
            trust: Arc::default(),
            interrupt: Interrupt::default(),
            registry: None,
            job_ended: None,
            recorded: super::RecordedChecks::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstallOutcome {
    Installed,
    AlreadyCurrent,
    Miss,
    Failed,
    /// Files of the generation are present with other content (left alone): the generation is
    /// only partly installed.
    Conflict,
    /// Every candidate generation was refused by the trust (unsigned, untrusted or forged).
    Untrusted,
    /// The deadline passed first (connecting, waiting for the lock, fetching); the root was left
    /// as it was.
    Deadline,
}

impl InstallOutcome {
    /// Process exit codes, one per outcome (1 and 2 stay with usage and config errors).
    pub fn exit_code(self) -> i32 {
        match self {
            Self::Installed => 0,
            Self::AlreadyCurrent => 10,
            Self::Miss => 11,
            Self::Failed => 12,
            Self::Conflict => 13,
            Self::Untrusted => 14,
            Self::Deadline => 15,
        }
    }

    /// Severity order used to summarize several caches in one exit code.
    pub fn severity(self) -> u8 {
        match self {
            Self::AlreadyCurrent => 0,
            Self::Installed => 1,
            Self::Miss => 2,
            Self::Conflict => 3,
            Self::Untrusted => 4,
            Self::Deadline => 5,
            Self::Failed => 6,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct InstallReport {
    pub cache_kind: String,
    pub root: PathBuf,
    pub outcome: InstallOutcome,
    /// Human explanation of the outcome.
    pub detail: String,
    pub compat_key: Option<String>,
    pub compat_id: Option<CompatId>,
    pub generation: Option<GenerationId>,
    /// Who signed the head of the installed generation.
    pub signer: Option<Signer>,
    /// Newer heads the trust refused (newest first).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<RefusedHead>,
    /// Newer generations given up on because a pack was corrupt or vanished while fetched.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub damaged: Vec<String>,
    /// Every newer head passed over on the way to the one taken (or to none), newest first, and
    /// why: refused by the trust, faulty, incomplete in the store, damaged. Always written (empty
    /// when none was), so a reader needs no special case for its absence.
    pub passed_over: Vec<PassedOver>,
    /// Whether the generation taken is a complete cache for its kind (its policy said so when it
    /// was published); `None` when none was taken.
    pub complete: Option<bool>,
    /// Why it is not complete (the policy's words at publish).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
    /// Newer generations passed over because they were incomplete caches.
    pub newer_incomplete: Vec<GenerationId>,
    pub files_in_generation: u64,
    pub files_installed: u64,
    pub bytes_installed: u64,
    pub files_already_present: u64,
    /// Files written in the form the policy materialized for this root (they embed the root).
    pub files_materialized: Vec<String>,
    /// Paths present on disk with other content (left alone).
    pub conflicts: Vec<String>,
    pub packs_fetched: u64,
    pub bytes_fetched: u64,
    pub duration_ms: u64,
    /// With a durable tier (`[store.durable]`): what the fast tier served, what it had lost and
    /// the durable tier served instead, and what was put back in the fast tier (read-repair).
    /// Always written: zeroes without a durable tier.
    #[serde(serialize_with = "tiers_or_zeroes")]
    pub tiers: Option<crate::store::TierStats>,
    /// With a durable registry tier, when the store had nothing to install: what the registry
    /// served and put back into the store (read-repair), or why it served nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registry: Option<crate::oci::registry::RegistryPull>,
}

/// `tiers` as an object of zeroes when there is no tiered store, so the field is always there.
fn tiers_or_zeroes<S: serde::Serializer>(
    tiers: &Option<crate::store::TierStats>,
    s: S,
) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&tiers.unwrap_or_default(), s)
}

/// A newer head an install did not take, and why.
#[derive(Debug, Clone, Serialize)]
pub struct PassedOver {
    pub seq: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<GenerationId>,
    pub reason: PassReason,
    /// In words, for the detail line and operators.
    pub why: String,
}

/// Why a head was passed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PassReason {
    /// Unsigned, untrusted or forged where the trust requires a trusted signature.
    Untrusted,
    /// Not a usable head record: corrupt, oversized, another place's.
    Faulty,
    /// Its manifest or a pack is not in the store (evicted or removed).
    Missing,
    /// There but wrong: a corrupt manifest or pack, a manifest of another compat id or kind.
    Damaged,
}

/// A head the trust did not admit.
#[derive(Debug, Clone, Serialize)]
pub struct RefusedHead {
    pub seq: u64,
    pub generation: GenerationId,
    pub signer: Signer,
}

impl InstallReport {
    /// A `failed` report with nothing done: the report of a cache that could not be started
    /// (store unreachable, no policy engine, no compatibility key).
    pub fn failed(cache_kind: &str, root: &Path, detail: String) -> Self {
        Progress::new(cache_kind, root).into_report(InstallOutcome::Failed, detail, 0)
    }
}

/// What an install has found and done so far: the job's working state, filled in on its own
/// thread, and made into the plain `InstallReport` once, when the install ends (`into_report`:
/// the outcome, its words and the duration are known only then).
#[derive(Debug, Clone)]
pub(crate) struct Progress {
    pub(crate) cache_kind: String,
    pub(crate) root: PathBuf,
    pub(crate) compat_key: Option<String>,
    pub(crate) compat_id: Option<CompatId>,
    pub(crate) generation: Option<GenerationId>,
    pub(crate) signer: Option<Signer>,
    pub(crate) refused: Vec<RefusedHead>,
    pub(crate) damaged: Vec<String>,
    pub(crate) passed_over: Vec<PassedOver>,
    /// The seq of the head of the generation taken (passed over if its packs turn out damaged).
    pub(crate) taken_seq: Option<u64>,
    pub(crate) complete: Option<bool>,
    pub(crate) incomplete: Option<String>,
    pub(crate) newer_incomplete: Vec<GenerationId>,
    pub(crate) files_in_generation: u64,
    pub(crate) files_installed: u64,
    pub(crate) bytes_installed: u64,
    pub(crate) files_already_present: u64,
    pub(crate) files_materialized: Vec<String>,
    pub(crate) conflicts: Vec<String>,
    pub(crate) packs_fetched: u64,
    pub(crate) bytes_fetched: u64,
    pub(crate) tiers: Option<crate::store::TierStats>,
    pub(crate) registry: Option<crate::oci::registry::RegistryPull>,
}

impl Progress {
    /// Nothing found or done yet.
    pub(crate) fn new(cache_kind: &str, root: &Path) -> Self {
        Self {
            cache_kind: cache_kind.to_owned(),
            root: root.to_owned(),
            compat_key: None,
            compat_id: None,
            generation: None,
            signer: None,
            refused: vec![],
            damaged: vec![],
            passed_over: vec![],
            taken_seq: None,
            complete: None,
            incomplete: None,
            newer_incomplete: vec![],
            files_in_generation: 0,
            files_installed: 0,
            bytes_installed: 0,
            files_already_present: 0,
            files_materialized: vec![],
            conflicts: vec![],
            packs_fetched: 0,
            bytes_fetched: 0,
            tiers: None,
            registry: None,
        }
    }

    /// The report of an install that ended with `outcome`, said in `detail`, after `duration_ms`.
    pub(crate) fn into_report(
        self,
        outcome: InstallOutcome,
        detail: String,
        duration_ms: u64,
    ) -> InstallReport {
        InstallReport {
            cache_kind: self.cache_kind,
            root: self.root,
            outcome,
            detail,
            compat_key: self.compat_key,
            compat_id: self.compat_id,
            generation: self.generation,
            signer: self.signer,
            refused: self.refused,
            damaged: self.damaged,
            passed_over: self.passed_over,
            complete: self.complete,
            incomplete: self.incomplete,
            newer_incomplete: self.newer_incomplete,
            files_in_generation: self.files_in_generation,
            files_installed: self.files_installed,
            bytes_installed: self.bytes_installed,
            files_already_present: self.files_already_present,
            files_materialized: self.files_materialized,
            conflicts: self.conflicts,
            packs_fetched: self.packs_fetched,
            bytes_fetched: self.bytes_fetched,
            duration_ms,
            tiers: self.tiers,
            registry: self.registry,
        }
    }

    /// Records a newer head passed over, and why (in the report and the log).
    pub(crate) fn pass_over(
        &mut self,
        seq: u64,
        generation: Option<GenerationId>,
        reason: PassReason,
        why: String,
    ) {
        tracing::warn!(
            seq,
            generation = %generation.map_or("none".to_owned(), |g| g.to_string()),
            "passed over: {why}"
        );
        self.passed_over.push(PassedOver {
            seq,
            generation,
            reason,
            why,
        });
    }

    /// The heads passed over, in words, for the detail line.
    pub(crate) fn passed_over_in_words(&self) -> String {
        self.passed_over
            .iter()
            .map(|p| match &p.generation {
                Some(g) => format!("seq {} (generation {g}): {}", p.seq, p.why),
                None => format!("seq {}: {}", p.seq, p.why),
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("pack {0} vanished from the store during the install (evicted); retry")]
    PackVanished(ContentHash),
    #[error("pack {id} is {actual} bytes, the manifest says {expected}: refusing a corrupt pack")]
    PackSize {
        id: ContentHash,
        expected: u64,
        actual: usize,
    },
    #[error(
        "{path}: content hash {actual} does not match the manifest's {expected}: refusing corrupt data"
    )]
    Corrupt {
        path: String,
        expected: ContentHash,
        actual: ContentHash,
    },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path}: the policy could not write this file for this root ({source}); the root was left as it was"
    )]
    Materialize { path: String, source: PolicyError },
    #[error("deadline of {0:?} passed; the root was left as it was")]
    Deadline(Duration),
    #[error("stopped by {0} before anything was moved into the root; the root was left as it was")]
    Interrupted(&'static str),
    #[error("cancelled at the deadline")]
    Cancelled,
    #[error(
        "head for compat id {head} ({kind}) points at generation {generation} of compat id \
         {manifest_compat} ({manifest_kind}): refusing a generation of another cache"
    )]
    CrossCompat {
        head: CompatId,
        kind: String,
        generation: GenerationId,
        manifest_compat: CompatId,
        manifest_kind: String,
    },
    #[error("{0}: the cache root must be a directory (or not exist yet)")]
    RootNotDir(PathBuf),
    /// The root (or a symlink's target) belongs to another user (`owner::check_owner`).
    #[error(transparent)]
    ForeignRoot(#[from] crate::owner::ForeignRoot),
    /// A name jitship keeps beside the root (its lock file) holds something else.
    #[error(
        "{path} is {what}, not the regular file jitship keeps there: it is never followed, read \
         or waited on; remove it (jitship creates the file itself)"
    )]
    NotRegularBeside { path: PathBuf, what: &'static str },
    /// A group file whose child paths name files outside the root being installed.
    #[error(
        "{path}: a group file naming {child:?} outside the cache root {root}: refusing the \
         generation (a store can hold any manifest); the root was left as it was"
    )]
    GroupOutsideRoot {
        path: String,
        child: String,
        root: PathBuf,
    },
    /// After the moves, a file of the generation is not in the root as moved there.
    #[error(
        "{path}: not in the root after the commit ({why}); something else changed the root \
         during the install, so the generation is not reported installed"
    )]
    NotInPlace { path: PathBuf, why: String },
}
