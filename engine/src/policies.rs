//! The policies of the configured caches, by kind, and which kinds are disabled and why.
//!
//! A policy that traps, runs out of a budget, answers garbage or fails to load disables its own
//! cache kind for the rest of the process (invariant 6); the other kinds carry on. A call that ran
//! past its wall-clock deadline is environmental (a loaded node, not a broken policy): it is retried,
//! then the kind pauses with a doubling backoff and is re-enabled by the first call that succeeds. A refusal the
//! contract allows (`missing-fact`, `invalid-input`) is an answer, not a failure: it is returned but
//! disables nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::config::{CacheConfig, Config};
use crate::facts::Facts;
use crate::generation::{PolicyRef, RelPath};
use crate::policy::host::PolicyEngine;
use crate::policy::native::NativeRules;
use crate::policy::{
    CachePolicy, FileEntry, GenerationSummary, PolicyError, PolicyInfo, RetentionDrop,
    RetentionLimits, Selection, builtin,
};

/// Where a kind's policy came from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "type", content = "value")]
pub enum PolicySource {
    /// `policy = "..."` in the cache's config.
    File(PathBuf),
    /// Embedded in jitship (`policy::builtin`).
    Builtin,
    /// `policy = "native"`: jitship's generic native rules, chosen by the operator.
    Native,
}

/// Why a kind does not run its policy now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DisabledCause {
    /// The module could not be loaded, or governs another kind: disabled for the process.
    Load,
    /// The policy broke its contract (trap, budget, invalid answer): disabled for the process.
    Violation,
    /// The node was too slow (wall-clock deadline): paused, retried after a backoff, re-enabled by
    /// the first call that succeeds.
    Backoff,
}

impl DisabledCause {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Load => "load",
            Self::Violation => "violation",
            Self::Backoff => "backoff",
        }
    }
}

/// Attempts of one call when it fails for an environmental reason, and the waits between them.
const ENVIRONMENTAL_RETRY_WAITS: [Duration; 2] =
    [Duration::from_millis(100), Duration::from_millis(400)];
/// Pause of a kind after a call failed environmentally on every attempt: doubling from the first
/// to the last value with each further failure.
const BACKOFF_FIRST: Duration = Duration::from_secs(2);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

#[derive(Debug, Clone)]
enum Health {
    Enabled,
    /// Environmental failures in a row; calls are refused until `until`, then tried again.
    Backoff {
        failures: u32,
        until: Instant,
        reason: String,
    },
    /// A contract violation: refused for the rest of the process (invariant 6).
    Disabled(String),
}

/// A policy that disables itself on its first contract violation, and pauses itself (with backoff,
/// then tries again) when it failed only because the node was slow.
pub struct GuardedPolicy {
    kind: String,
    inner: Box<dyn CachePolicy>,
    health: Mutex<Health>,
    /// The operator gave this cache settings (`[[cache]] settings`, `--setting`): publish uses
    /// them, never the ones the key's newest generation recorded (`with_recorded_settings`).
    settings_given: bool,
}

impl GuardedPolicy {
    pub fn new(kind: impl Into<String>, inner: Box<dyn CachePolicy>) -> Self {
        Self {
            kind: kind.into(),
            inner,
            health: Mutex::new(Health::Enabled),
            settings_given: false,
        }
    }

    /// Says whether the operator gave this cache settings (see `settings_given`).
    pub fn settings_given(mut self, given: bool) -> Self {
        self.settings_given = given;
        self
    }

    fn health(&self) -> MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Why this kind is disabled for the rest of the process, if it is (a backoff pause is not).
    pub fn disabled_reason(&self) -> Option<String> {
        match &*self.health() {
            Health::Disabled(reason) => Some(reason.clone()),
            Health::Enabled | Health::Backoff { .. } => None,
        }
    }

    /// Why calls are refused right now, and whether that lasts (`Violation`) or passes (`Backoff`).
    pub fn paused(&self) -> Option<(DisabledCause, String)> {
        match &*self.health() {
            Health::Enabled => None,
            Health::Backoff { until, reason, .. } => {
                let left = until.saturating_duration_since(Instant::now());
                (!left.is_zero()).then(|| {
                    (
                        DisabledCause::Backoff,
                        format!("{reason}; retried in {}s", left.as_secs().max(1)),
                    )
                })
            }
            Health::Disabled(reason) => Some((DisabledCause::Violation, reason.clone())),
        }
    }

    fn guard<T>(&self, op: &str, f: impl Fn() -> Result<T, PolicyError>) -> Result<T, PolicyError> {
        if let Some((_, reason)) = self.paused() {
            return Err(PolicyError::Disabled {
                kind: self.kind.clone(),
                reason,
            });
        }
        let mut result = f();
        for wait in ENVIRONMENTAL_RETRY_WAITS {
            match &result {
                Err(e) if e.is_environmental() => {
                    tracing::warn!(kind = %self.kind, op, error = %e, retry_in_ms = wait.as_millis() as u64, "policy call failed for an environmental reason; retrying");
                    std::thread::sleep(wait);
                    result = f();
                }
                _ => break,
            }
        }
        let policy = &self.inner.info().name;
        let mut health = self.health();
        match &result {
            Ok(_) => {
                if let Health::Backoff { .. } = &*health {
                    tracing::info!(kind = %self.kind, policy = %policy, "policy answers again; cache kind re-enabled");
                    *health = Health::Enabled;
                }
            }
            Err(e) if e.is_policy_answer() => {}
            Err(e) if e.is_environmental() => {
                let failures = match &*health {
                    Health::Backoff { failures, .. } => failures + 1,
                    _ => 1,
                };
                let pause = BACKOFF_FIRST
                    .saturating_mul(1 << (failures - 1).min(16))
                    .min(BACKOFF_MAX);
                let reason = format!("policy {policy} failed in {op}: {e}");
                tracing::warn!(kind = %self.kind, policy = %policy, op, error = %e, failures, pause_s = pause.as_secs(), "cache kind paused; it is retried after the pause");
                if !matches!(&*health, Health::Disabled(_)) {
                    *health = Health::Backoff {
                        failures,
                        until: Instant::now() + pause,
                        reason,
                    };
                }
            }
            Err(e) => {
                let reason = format!("policy {policy} failed in {op}: {e}");
                tracing::error!(kind = %self.kind, policy = %policy, op, error = %e, "policy broke its contract; cache kind disabled until jitship restarts");
                if !matches!(&*health, Health::Disabled(_)) {
                    *health = Health::Disabled(reason);
                }
            }
        }
        result
    }
}

impl CachePolicy for GuardedPolicy {
    fn info(&self) -> &PolicyInfo {
        self.inner.info()
    }
    fn policy_ref(&self) -> PolicyRef {
        self.inner.policy_ref()
    }
    fn module(&self) -> Option<std::sync::Arc<[u8]>> {
        self.inner.module()
    }
    fn with_recorded_settings(
        &self,
        recorded: &PolicyRef,
    ) -> Option<Result<Box<dyn CachePolicy>, PolicyError>> {
        if self.settings_given {
            return None;
        }
        let kind = self.kind.clone();
        self.inner
            .with_recorded_settings(recorded)
            .map(|r| r.map(|p| Box::new(GuardedPolicy::new(kind, p)) as Box<dyn CachePolicy>))
    }
    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
        self.guard("compat-key", || self.inner.compat_key(facts))
    }
    fn select(&self, root: &Path, entries: &[FileEntry]) -> Result<Selection, PolicyError> {
        self.guard("select", || self.inner.select(root, entries))
    }
    fn canonicalize(
        &self,
        root: &Path,
        path: &RelPath,
        content: &[u8],
    ) -> Result<Vec<u8>, PolicyError> {
        self.guard("canonicalize", || {
            self.inner.canonicalize(root, path, content)
        })
    }
    fn materialize(
        &self,
        root: &Path,
        path: &RelPath,
        content: &[u8],
    ) -> Result<Vec<u8>, PolicyError> {
        self.guard("materialize", || {
            self.inner.materialize(root, path, content)
        })
    }
    fn retain(
        &self,
        generations: &[GenerationSummary],
        now: u64,
        limits: &RetentionLimits,
    ) -> Result<Vec<RetentionDrop>, PolicyError> {
        self.guard("retain", || self.inner.retain(generations, now, limits))
    }
}

enum Slot {
    Ready {
        policy: Arc<GuardedPolicy>,
        source: PolicySource,
    },
    /// Could not be loaded: the kind is disabled from the start.
    Failed {
        source: PolicySource,
        reason: String,
    },
}

/// One row of `PolicySet::status`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KindStatus {
    pub kind: String,
    pub source: PolicySource,
    /// `name@version` of the policy, when it loaded.
    pub policy: Option<String>,
    pub digest: Option<String>,
    /// Why the kind is disabled or paused; `None` = enabled.
    pub disabled: Option<String>,
    /// Whether that lasts for the process (`load`, `violation`) or passes (`backoff`).
    pub disabled_cause: Option<DisabledCause>,
}

/// The policy of every configured cache kind.
pub struct PolicySet {
    slots: BTreeMap<String, Slot>,
}

impl PolicySet {
    /// Loads the policy of each configured cache: its `policy` file if set, the native generic
    /// rules if it says `policy = "native"`, else the built-in one for its kind. A policy that fails
    /// to load, whose `info()` names another cache kind, or a kind with none of these (refused by
    /// `Config::validate` already) disables that kind (reported by `status`), never the others.
    pub fn load(engine: &Arc<PolicyEngine>, caches: &[CacheConfig]) -> Self {
        let mut slots = BTreeMap::new();
        for cache in caches {
            let builtin = builtin::lookup(&cache.kind);
            let (source, loaded) = match (cache.policy_file(), builtin) {
                (Some(path), _) => (
                    PolicySource::File(path.to_path_buf()),
                    Some(engine.load_file(path)),
                ),
                _ if cache.uses_native_policy() => (PolicySource::Native, None),
                (None, Some(bytes)) => (
                    PolicySource::Builtin,
                    Some(engine.load(bytes, &format!("builtin:{}", cache.kind))),
                ),
                (None, None) => {
                    let reason = format!(
                        "jitship has no built-in policy for cache kind {:?}; give it `policy = \"x.wasm\"` or `policy = \"native\"`",
                        cache.kind
                    );
                    tracing::error!(kind = %cache.kind, "{reason}");
                    let slot = Slot::Failed {
                        source: PolicySource::Builtin,
                        reason,
                    };
                    slots.insert(cache.kind.clone(), slot);
                    continue;
                }
            };
            // The operator's settings, checked through the policy now: a kind whose settings
            // its policy refuses does not run, and says why.
            let settings = cache.settings_text();
            let loaded = loaded.map(|r| r.and_then(|p| p.configure(&settings)));
            if loaded.is_none() && !settings.is_empty() {
                let reason = format!(
                    "cache kind {:?} runs jitship's native rules, which take no settings (given: {})",
                    cache.kind,
                    settings.keys().cloned().collect::<Vec<_>>().join(", ")
                );
                tracing::error!(kind = %cache.kind, "{reason}");
                slots.insert(cache.kind.clone(), Slot::Failed { source, reason });
                continue;
            }
            let slot = match loaded {
                None => Slot::Ready {
                    policy: Arc::new(GuardedPolicy::new(
                        &cache.kind,
                        Box::new(NativeRules::new(&cache.kind)),
                    )),
                    source,
                },
                Some(Ok(p)) if p.info().cache_kind != cache.kind => Slot::Failed {
                    reason: format!(
                        "policy {} governs cache kind {:?}, but it is configured for {:?}",
                        p.source(),
                        p.info().cache_kind,
                        cache.kind
                    ),
                    source,
                },
                Some(Ok(p)) => Slot::Ready {
                    policy: Arc::new(
                        GuardedPolicy::new(&cache.kind, Box::new(p))
                            .settings_given(!settings.is_empty()),
                    ),
                    source,
                },
                Some(Err(e)) => Slot::Failed {
                    source,
                    reason: e.to_string(),
                },
            };
            if let Slot::Failed { reason, .. } = &slot {
                tracing::error!(kind = %cache.kind, reason = %reason, "policy not loaded; cache kind disabled");
            }
            slots.insert(cache.kind.clone(), slot);
        }
        Self { slots }
    }

    /// The policies of `config`'s caches. The wasm engine (and its compile cache directory) is only
    /// created if some cache actually uses a policy module.
    pub fn from_config(config: &Config) -> Result<Self, PolicyError> {
        let needs_wasm = config.caches.iter().any(|c| {
            c.policy_file().is_some()
                || (!c.uses_native_policy() && builtin::lookup(&c.kind).is_some())
        });
        let native_only = config
            .caches
            .iter()
            .all(|c| c.uses_native_policy() && c.settings.is_empty());
        if !needs_wasm && native_only {
            let native = config.caches.iter().map(|c| {
                let p: Box<dyn CachePolicy> = Box::new(NativeRules::new(&c.kind));
                (c.kind.clone(), p)
            });
            return Ok(Self::from_policies(native));
        }
        let engine = PolicyEngine::new(&config.policy)?;
        Ok(Self::load(&engine, &config.caches))
    }

    /// A set from policies already at hand (tests, embedding).
    pub fn from_policies(
        policies: impl IntoIterator<Item = (String, Box<dyn CachePolicy>)>,
    ) -> Self {
        let slots = policies
            .into_iter()
            .map(|(kind, p)| {
                let source = if p.policy_ref().digest == "native" {
                    PolicySource::Native
                } else {
                    PolicySource::Builtin
                };
                (
                    kind.clone(),
                    Slot::Ready {
                        policy: Arc::new(GuardedPolicy::new(kind, p)),
                        source,
                    },
                )
            })
            .collect();
        Self { slots }
    }

    /// The policy for `kind`, or why there is none (not configured, failed to load, disabled).
    pub fn get(&self, kind: &str) -> Result<Arc<GuardedPolicy>, PolicyError> {
        match self.slots.get(kind) {
            None => Err(PolicyError::Disabled {
                kind: kind.into(),
                reason: "no cache of this kind is configured".into(),
            }),
            Some(Slot::Failed { reason, .. }) => Err(PolicyError::Disabled {
                kind: kind.into(),
                reason: reason.clone(),
            }),
            Some(Slot::Ready { policy, .. }) => match policy.disabled_reason() {
                Some(reason) => Err(PolicyError::Disabled {
                    kind: kind.into(),
                    reason,
                }),
                None => Ok(policy.clone()),
            },
        }
    }

    /// The policy for `kind`, always: a kind that failed to load or was disabled gets a stand-in
    /// whose every call fails with `PolicyError::Disabled`, so publish and install report it through
    /// their ordinary error paths.
    pub fn policy(&self, kind: &str) -> Arc<dyn CachePolicy> {
        match self.get(kind) {
            Ok(p) => p,
            Err(PolicyError::Disabled { reason, .. }) => {
                Arc::new(DisabledPolicy::new(kind, reason))
            }
            Err(other) => Arc::new(DisabledPolicy::new(kind, other.to_string())),
        }
    }

    pub fn kinds(&self) -> impl Iterator<Item = &str> {
        self.slots.keys().map(String::as_str)
    }

    /// Every configured kind: where its policy came from and whether it is disabled.
    pub fn status(&self) -> Vec<KindStatus> {
        self.slots
            .iter()
            .map(|(kind, slot)| match slot {
                Slot::Ready { policy, source } => {
                    let paused = policy.paused();
                    KindStatus {
                        kind: kind.clone(),
                        source: source.clone(),
                        policy: Some(format!("{}@{}", policy.info().name, policy.info().version)),
                        digest: Some(policy.policy_ref().digest),
                        disabled_cause: paused.as_ref().map(|(cause, _)| *cause),
                        disabled: paused.map(|(_, reason)| reason),
                    }
                }
                Slot::Failed { source, reason } => KindStatus {
                    kind: kind.clone(),
                    source: source.clone(),
                    policy: None,
                    digest: None,
                    disabled: Some(reason.clone()),
                    disabled_cause: Some(DisabledCause::Load),
                },
            })
            .collect()
    }
}

/// Stands in for a policy that could not be loaded.
struct DisabledPolicy {
    info: PolicyInfo,
    reason: String,
}

impl DisabledPolicy {
    fn new(kind: &str, reason: String) -> Self {
        let info = PolicyInfo {
            name: "disabled".into(),
            version: String::new(),
            cache_kind: kind.into(),
            default_root: String::new(),
            root_env: vec![],
            description: reason.clone(),
            settings: vec![],
        };
        Self { info, reason }
    }

    fn err<T>(&self) -> Result<T, PolicyError> {
        Err(PolicyError::Disabled {
            kind: self.info.cache_kind.clone(),
            reason: self.reason.clone(),
        })
    }
}

impl CachePolicy for DisabledPolicy {
    fn info(&self) -> &PolicyInfo {
        &self.info
    }
    fn policy_ref(&self) -> PolicyRef {
        PolicyRef {
            name: "disabled".into(),
            version: String::new(),
            digest: "disabled".into(),
            settings: Default::default(),
        }
    }
    fn compat_key(&self, _: &Facts) -> Result<String, PolicyError> {
        self.err()
    }
    fn select(&self, _: &Path, _: &[FileEntry]) -> Result<Selection, PolicyError> {
        self.err()
    }
    fn canonicalize(&self, _: &Path, _: &RelPath, _: &[u8]) -> Result<Vec<u8>, PolicyError> {
        self.err()
    }
    fn materialize(&self, _: &Path, _: &RelPath, _: &[u8]) -> Result<Vec<u8>, PolicyError> {
        self.err()
    }
    fn retain(
        &self,
        _: &[GenerationSummary],
        _: u64,
        _: &RetentionLimits,
    ) -> Result<Vec<RetentionDrop>, PolicyError> {
        self.err()
    }
}

#[cfg(test)]
mod tests;
