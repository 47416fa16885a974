//! Policies: per cache kind, which files are complete and publishable, under which compatibility
//! key, and which generations to drop. Everything above this module talks to `CachePolicy` only;
//! the implementations behind it are the wasm host and, until it lands, `native`.

pub mod native;

use std::path::Path;

use crate::facts::Facts;
use crate::generation::{GenerationId, PolicyRef};

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

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Decision {
    pub verdict: Verdict,
    pub reason: String,
}

impl Decision {
    pub fn publish(reason: impl Into<String>) -> Self {
        Self {
            verdict: Verdict::Publish,
            reason: reason.into(),
        }
    }
    pub fn skip(reason: impl Into<String>) -> Self {
        Self {
            verdict: Verdict::Skip,
            reason: reason.into(),
        }
    }
}

/// A stored generation, for retention.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GenerationSummary {
    pub id: GenerationId,
    pub compat_key: String,
    pub created_at: u64,
    pub size_bytes: u64,
    pub file_count: u64,
    pub pinned: bool,
}

/// Operator quotas handed to `retain` (none = the policy's default).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionLimits {
    pub max_generations: Option<u32>,
    pub max_bytes: Option<u64>,
    pub max_age_secs: Option<u64>,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error(
        "fact {0:?} is missing; set it with --fact {0}=VALUE (refusing to publish under a weak key)"
    )]
    MissingFact(String),
    #[error("policy rejected its input: {0}")]
    InvalidInput(String),
    #[error("policy failed: {0}")]
    Internal(String),
}

/// The one interface publish, install and gc use to ask a policy.
pub trait CachePolicy: Send + Sync {
    fn info(&self) -> &PolicyInfo;

    /// Identity recorded in manifests (name, version, module digest).
    fn policy_ref(&self) -> PolicyRef;

    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError>;

    /// One decision per entry, same order. `root` is where the entries live (a policy may read
    /// files under it, e.g. Triton group files).
    fn select(&self, root: &Path, entries: &[FileEntry]) -> Result<Vec<Decision>, PolicyError>;

    /// Ids to drop among `generations` (one compat key, newest first).
    fn retain(
        &self,
        generations: &[GenerationSummary],
        now: u64,
        limits: &RetentionLimits,
    ) -> Result<Vec<GenerationId>, PolicyError>;
}
