//! Policies: per cache kind, which files are complete and publishable, under which compatibility
//! key, and which generations to drop. Everything above this module talks to `CachePolicy` only;
//! the implementations behind it are the wasm host and, until it lands, `native`.

pub mod build;
pub mod builtin;
pub mod host;
pub mod native;
pub mod scaffold;
pub mod settings;
pub mod testing;

use std::path::Path;

use jitship_facts::Facts;
use jitship_generation::{GenerationId, PolicyRef, RelPath};
use jitship_policy_contract::{RootRewrite, category, no_root_rewrite};

pub use self::settings::{PolicySettings, SettingKind, SettingSpec};

/// What a policy says about itself (mirrors `policy-info` in plugins-sdk/wit/policy.wit).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PolicyInfo {
    pub name: String,
    pub version: String,
    pub cache_kind: String,
    /// May start with `~/` or `$TMPDIR/`.
    pub default_root: String,
    /// Environment variables that move the root, highest precedence first.
    pub root_env: Vec<String>,
    pub description: String,
    /// The settings the policy takes (`settings::resolve` reads an operator's values by them).
    pub settings: Vec<SettingSpec>,
}

/// A regular file under a root, as offered to `select`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FileEntry {
    pub path: String,
    pub size: u64,
    pub mtime_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Publish,
    Skip,
}

/// Why a file is published or skipped, from the fixed set of the contract (`reason-category` in
/// plugins-sdk/wit/policy.wit, which documents each). Used as metric labels and in publish
/// summaries, so their cardinality is bounded whatever a cache holds; the free text is `detail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReasonCategory {
    Complete,
    Temporary,
    Lock,
    PerHost,
    Incomplete,
    ForeignRoot,
    Unparseable,
    NotCache,
    Excluded,
}

impl ReasonCategory {
    pub const ALL: [ReasonCategory; 9] = [
        Self::Complete,
        Self::Temporary,
        Self::Lock,
        Self::PerHost,
        Self::Incomplete,
        Self::ForeignRoot,
        Self::Unparseable,
        Self::NotCache,
        Self::Excluded,
    ];

    /// The contract's name, e.g. `per-host`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Complete => category::COMPLETE,
            Self::Temporary => category::TEMPORARY,
            Self::Lock => category::LOCK,
            Self::PerHost => category::PER_HOST,
            Self::Incomplete => category::INCOMPLETE,
            Self::ForeignRoot => category::FOREIGN_ROOT,
            Self::Unparseable => category::UNPARSEABLE,
            Self::NotCache => category::NOT_CACHE,
            Self::Excluded => category::EXCLUDED,
        }
    }
}

impl std::fmt::Display for ReasonCategory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A policy's answer for one file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Decision {
    pub verdict: Verdict,
    /// `Complete` for every publish; one of the others for a skip.
    pub category: ReasonCategory,
    /// Free text for `-v`, reports and `jitship policy test` (never a metric label).
    pub detail: String,
    /// The engine finds other files through this one: an install commits it last.
    pub marker: bool,
    /// The file names the absolute root: canonicalized at publish, materialized at install.
    pub embeds_root: bool,
}

impl Decision {
    pub fn publish(detail: impl Into<String>) -> Self {
        Self {
            verdict: Verdict::Publish,
            category: ReasonCategory::Complete,
            detail: detail.into(),
            marker: false,
            embeds_root: false,
        }
    }
    pub fn skip(category: ReasonCategory, detail: impl Into<String>) -> Self {
        Self {
            verdict: Verdict::Skip,
            category,
            detail: detail.into(),
            marker: false,
            embeds_root: false,
        }
    }
    pub fn is_publish(&self) -> bool {
        self.verdict == Verdict::Publish
    }
}

/// The answer of `select`: one decision per entry, and whether the root holds a cache that is
/// complete for its kind (a generation published from an incomplete root is recorded as such, and
/// installs prefer the newest complete one).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Selection {
    pub decisions: Vec<Decision>,
    pub complete: bool,
    /// Why not complete; empty when `complete`.
    pub incomplete_detail: String,
}

impl Selection {
    /// A complete selection of these decisions.
    pub fn complete(decisions: Vec<Decision>) -> Self {
        Self {
            decisions,
            complete: true,
            incomplete_detail: String::new(),
        }
    }

    /// `None` when complete, else why not: what `Manifest::incomplete` records.
    pub fn incomplete(&self) -> Option<String> {
        (!self.complete).then(|| self.incomplete_detail.clone())
    }
}

/// A stored generation, for retention (also read from JSON by `jitship policy test --generations`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerationSummary {
    pub id: GenerationId,
    pub compat_key: String,
    pub created_at: u64,
    pub size_bytes: u64,
    pub file_count: u64,
    #[serde(default)]
    pub pinned: bool,
}

/// Why `retain` drops a generation, from the contract's fixed set (`retention-category` in
/// plugins-sdk/wit/policy.wit, which documents each); the free text is the drop's `detail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RetentionCategory {
    Count,
    Size,
    Age,
    Superseded,
    Rule,
}

impl RetentionCategory {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Count => "count",
            Self::Size => "size",
            Self::Age => "age",
            Self::Superseded => "superseded",
            Self::Rule => "rule",
        }
    }
}

impl std::fmt::Display for RetentionCategory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A generation `retain` drops, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RetentionDrop {
    pub id: GenerationId,
    pub category: RetentionCategory,
    pub detail: String,
}

/// Operator quotas handed to `retain` (none = the policy's default).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionLimits {
    pub max_generations: Option<u32>,
    pub max_bytes: Option<u64>,
    pub max_age_secs: Option<u64>,
}

/// Why a policy gave no answer. The first three come from the policy itself (the WIT
/// `policy-error`); the rest are the host's verdict on a policy that misbehaved or could not run.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error(
        "fact {0:?} is missing; set it with --fact {0}=VALUE (refusing to publish under a weak key)"
    )]
    MissingFact(String),
    /// Jitship's reading of a [`MissingFact`](Self::MissingFact) that no `--fact` should fill:
    /// the fact could not be gathered, and `why` says what to do (no Python interpreter found).
    #[error("fact {fact:?} is missing: {why}")]
    Ungathered { fact: String, why: String },
    #[error("policy rejected its input: {0}")]
    InvalidInput(String),
    /// Jitship, not the policy, refused what it was about to hand the policy (a root that is not
    /// UTF-8, a file over the size a rewrite takes): the policy never ran.
    #[error("jitship refused the input before the policy saw it: {0}")]
    HostRefusedInput(String),
    #[error("policy failed: {0}")]
    Internal(String),
    #[error(
        "policy used up its CPU budget of {fuel} fuel units in one call (a loop that never ends?); \
         raise [policy] fuel only if it legitimately needs more"
    )]
    OutOfFuel { fuel: u64 },
    #[error(
        "policy ran past its wall-clock deadline of {deadline_ms} ms in one call; raise [policy] deadline \
         if this node is simply overloaded"
    )]
    WallTimeExceeded { deadline_ms: u64 },
    #[error(
        "policy tried to grow its memory to {requested} bytes, over the cap of {limit} bytes; raise [policy] \
         memory only if it legitimately needs more"
    )]
    MemoryExceeded { requested: u64, limit: u64 },
    #[error("policy crashed: {0}")]
    Trapped(String),
    /// The module does not speak this jitship's contract (version, imports, exports).
    #[error("{0}")]
    Contract(String),
    /// The policy answered something the host refuses (wrong length, oversized or unknown values).
    #[error("policy returned an invalid answer: {0}")]
    BadOutput(String),
    /// The module could not be read or compiled.
    #[error("cannot load policy: {0}")]
    Load(String),
    /// An earlier failure disabled this cache kind for the rest of the process.
    #[error("cache kind {kind:?} is disabled: {reason}")]
    Disabled { kind: String, reason: String },
    /// The operator's settings for a policy do not fit what it declares, or the policy refused
    /// them (`check-settings`): a configuration to fix, never a policy failure.
    #[error("{0}")]
    Settings(String),
}

impl PolicyError {
    /// A refusal the policy chose to make (its contract allows it), or jitship's refusal of the
    /// input before the policy ran, as opposed to a policy that misbehaved or could not run. Only
    /// misbehaviour disables a cache kind.
    pub fn is_policy_answer(&self) -> bool {
        matches!(
            self,
            Self::MissingFact(_)
                | Self::Ungathered { .. }
                | Self::InvalidInput(_)
                | Self::HostRefusedInput(_)
        )
    }

    /// A failure caused by the node, not the policy (a wall-clock deadline on a loaded machine):
    /// retried with backoff, never a reason to disable the kind for good.
    pub fn is_environmental(&self) -> bool {
        matches!(self, Self::WallTimeExceeded { .. })
    }
}

/// The one interface publish, install and gc use to ask a policy.
pub trait CachePolicy: Send + Sync {
    fn info(&self) -> &PolicyInfo;

    /// Identity recorded in manifests (name, version, module digest).
    fn policy_ref(&self) -> PolicyRef;

    /// The module's bytes (whose blake3 is `policy_ref().digest`), for a policy loaded from a
    /// WebAssembly component: publish stores them in the store by that digest, so gc, `inspect`
    /// and `policy test` find the module a key was published with whatever became of the file.
    /// `None` for the native rules and test doubles.
    fn module(&self) -> Option<std::sync::Arc<[u8]>> {
        None
    }

    /// This policy configured with the settings `recorded` (a key's newest generation's
    /// `Manifest.policy`), when publish should keep them: the operator gave none for this cache,
    /// `recorded` names this policy, and its settings differ from these. `None`: keep these
    /// (`Some(Err)`: this module refuses the recorded settings). Sticky settings: a publish
    /// without `--setting` or `settings` never silently resets a key to the defaults.
    fn with_recorded_settings(
        &self,
        recorded: &PolicyRef,
    ) -> Option<Result<Box<dyn CachePolicy>, PolicyError>> {
        let _ = recorded;
        None
    }

    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError>;

    /// One decision per entry, same order, and whether the root is a complete cache. `root` is
    /// where the entries live (a policy may read files under it, e.g. Triton group files, and
    /// compares absolute paths they name with it).
    fn select(&self, root: &Path, entries: &[FileEntry]) -> Result<Selection, PolicyError>;

    /// The root-independent form of `content`, the file at `path` under `root`, whose decision
    /// had `embeds_root`. A policy that marks no file so refuses.
    fn canonicalize(
        &self,
        root: &Path,
        path: &RelPath,
        content: &[u8],
    ) -> Result<Vec<u8>, PolicyError> {
        let _ = (root, content);
        Err(PolicyError::InvalidInput(no_root_rewrite(
            &self.info().name,
            RootRewrite::Canonicalize,
            path.as_str(),
        )))
    }

    /// The inverse of `canonicalize`, for the installing `root`.
    fn materialize(
        &self,
        root: &Path,
        path: &RelPath,
        content: &[u8],
    ) -> Result<Vec<u8>, PolicyError> {
        let _ = (root, content);
        Err(PolicyError::InvalidInput(no_root_rewrite(
            &self.info().name,
            RootRewrite::Materialize,
            path.as_str(),
        )))
    }

    /// The generations to drop among `generations` (one compat key, newest first), each with why.
    fn retain(
        &self,
        generations: &[GenerationSummary],
        now: u64,
        limits: &RetentionLimits,
    ) -> Result<Vec<RetentionDrop>, PolicyError>;
}

#[cfg(test)]
mod contract_tests {
    use super::*;

    /// The skip categories are the contract's, in its order; the one publish category is
    /// `complete`.
    #[test]
    fn reason_categories_are_the_contracts() {
        let skip: Vec<&str> = ReasonCategory::ALL
            .iter()
            .filter(|c| **c != ReasonCategory::Complete)
            .map(|c| c.as_str())
            .collect();
        assert_eq!(skip, category::SKIP);
        assert_eq!(ReasonCategory::Complete.as_str(), category::COMPLETE);
    }
}
