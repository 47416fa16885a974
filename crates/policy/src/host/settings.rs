//! `[policy]`: the sandbox every policy call runs in.

use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

/// The sandbox every policy runs in (docs/wasm-host.md#limits). Each call gets a fresh instance
/// with these budgets; a policy that exceeds one is stopped with a typed error and its cache kind is
/// disabled, nothing else.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Deterministic CPU budget per call, in wasmtime fuel units (about one per wasm instruction).
    /// The built-in selects are linear, 2,500 to 41,000 units per entry (vllm-compile the
    /// heaviest; `tests/e2e/policy_scale.rs` prints them): the default covers a 100,000-entry
    /// cache of any built-in kind with 2x to spare, and the deadline still stops a runaway loop.
    pub fuel: u64,
    /// Wall-clock backstop per call, for when the machine is so starved that fuel alone would take
    /// too long; keep it generous, busy nodes run slow.
    #[serde(with = "humantime_serde")]
    pub deadline: Duration,
    /// Cap on a policy's linear memory.
    pub memory: ByteSize,
    /// Cap on what one evaluation may read through `read-file` (host work is not metered by fuel).
    pub read_budget: ByteSize,
    /// Keep compiled policies on disk so a start costs milliseconds instead of a compile.
    pub compile_cache: bool,
    /// Where compiled policies are kept (created 0700; only files jitship wrote there are loaded).
    /// If it cannot be created or trusted, jitship warns and compiles in memory.
    pub cache_dir: PathBuf,
    /// A directory of policy modules (`*.wasm`) gc may need: a compat id's retention is decided by
    /// the policy its newest generation was published with, found by digest here when it is
    /// neither built in nor a configured cache's module (`jitship gc --policy-dir` overrides).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modules_dir: Option<PathBuf>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            fuel: 10_000_000_000,
            deadline: Duration::from_secs(5),
            memory: ByteSize::mib(64),
            read_budget: ByteSize::mib(16),
            compile_cache: true,
            cache_dir: PathBuf::from("/var/cache/jitship/policy"),
            modules_dir: None,
        }
    }
}
