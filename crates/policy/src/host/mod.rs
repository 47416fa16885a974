//! The WebAssembly policy host: runs policy components (plugins-sdk/wit/policy.wit) in a sandbox.
//!
//! One `PolicyEngine` per process: a wasmtime `Engine` with fuel and epoch interruption, a 10 ms
//! epoch ticker thread (ticking only while an evaluation is in flight), a linker that provides only the `jitship:policy` host interface (no WASI),
//! and the on-disk compile cache. Each `WasmPolicy` is a pre-instantiated component; every call gets
//! a fresh `Store` and instance (a trapped component instance is poisoned anyway, and isolation costs
//! ~30 µs), with the fuel budget, an epoch deadline (always set: with epoch interruption on, a store
//! without a deadline traps at once), the memory cap and the read budget of `[policy]`. Every answer
//! is validated before anyone above this module sees it.
//!
//! The engine, the per-call sandbox and one validator per export of the contract. The
//! validators are the contract as the host enforces it, so they stay beside the calls they check.

mod cache;
mod contract;
mod settings;
mod state;
mod ticker;
mod validate;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, Store, Trap};

pub use self::cache::{CacheError, CompileCache};
pub use self::contract::{CONTRACT_MAJOR, CONTRACT_MINOR, CONTRACT_PACKAGE, ContractInfo};
pub use self::settings::PolicyConfig;
use self::state::HostState;
pub use self::state::{
    LogLine, MAX_LOG_MESSAGE, MAX_LOG_MESSAGES, MAX_READ_CALLS, MAX_READ_PER_CALL,
    MemoryLimitExceeded,
};
use self::ticker::Ticker;
use self::validate::*;
use super::settings::{self as setting, PolicySettings, SettingKind, SettingSpec};
use super::{
    CachePolicy, Decision, FileEntry, GenerationSummary, PolicyError, PolicyInfo, ReasonCategory,
    RetentionCategory, RetentionDrop, RetentionLimits, Selection, Verdict,
};
use jitship_facts::Facts;
use jitship_generation::{ContentHash, PolicyRef, RelPath};

mod bindings {
    wasmtime::component::bindgen!({ path: "../../plugins-sdk/wit", world: "policy" });
}
use bindings::jitship::policy::types as wit;

/// How often the epoch advances; deadlines are whole ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Longest compatibility key a policy may answer, and longest detail of one decision, of a
/// retention drop and of a selection's incomplete-detail: the contract's values, which the SDK
/// cuts details to (`jitship-policy-contract`).
pub use jitship_policy_contract::{MAX_DETAIL_BYTES, MAX_KEY_BYTES};
/// Largest file `canonicalize`/`materialize` are handed or may answer (group and index files are
/// kilobytes; this bounds what a policy can make the host hold).
pub const MAX_REWRITE_BYTES: usize = 16 << 20;
/// How much larger than its input a rewritten file may be: a root is at most PATH_MAX (4 KiB) and a
/// file names it a bounded number of times.
pub const MAX_REWRITE_GROWTH: usize = 1 << 20;
/// Bounds on `info()` fields.
const MAX_NAME_BYTES: usize = 64;
const MAX_INFO_TEXT_BYTES: usize = 1024;
const MAX_ROOT_ENV: usize = 16;

/// Budgets for one call, from `[policy]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub fuel: u64,
    pub deadline: Duration,
    pub memory: u64,
    pub read_budget: u64,
}

impl Limits {
    pub fn from_config(c: &PolicyConfig) -> Self {
        Self {
            fuel: c.fuel,
            deadline: c.deadline,
            memory: c.memory.as_u64(),
            read_budget: c.read_budget.as_u64(),
        }
    }

    fn deadline_ticks(&self) -> u64 {
        // +1: the ticker may advance the epoch right after the deadline is set.
        (self.deadline.as_nanos().div_ceil(EPOCH_TICK.as_nanos()) as u64).max(1) + 1
    }
}

/// How a component was obtained, for reports and benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct LoadStats {
    /// Loaded from the on-disk compile cache (no compile).
    pub from_cache: bool,
    /// Compile or cache-load time.
    pub compile_us: u64,
    /// The whole load: compile or cache, contract check, link, `info()`.
    pub total_us: u64,
}

pub struct PolicyEngine {
    engine: Engine,
    linker: Linker<HostState>,
    limits: Limits,
    cache: Option<CompileCache>,
    /// Why there is no compile cache, when one was wanted.
    cache_problem: Option<String>,
    ticker: Ticker,
}

impl PolicyEngine {
    /// The engine for `[policy]`. A compile cache that cannot be used is reported (see
    /// `cache_problem`) and jitship compiles in memory instead: a slower start, not a failure.
    pub fn new(config: &PolicyConfig) -> Result<Arc<Self>, PolicyError> {
        let cache_dir = config.compile_cache.then_some(config.cache_dir.as_path());
        Self::with_cache_dir(Limits::from_config(config), cache_dir)
    }

    pub fn with_cache_dir(
        limits: Limits,
        cache_dir: Option<&Path>,
    ) -> Result<Arc<Self>, PolicyError> {
        let mut cfg = Config::new();
        // Component model async support is compiled in by default and, left on, doubles the fixed
        // cost of every call and of instantiation (docs/wasm-host.md#async-support); we never
        // use it.
        cfg.concurrency_support(false);
        cfg.consume_fuel(true);
        cfg.epoch_interruption(true);
        cfg.wasm_component_model(true);
        let engine = Engine::new(&cfg)
            .map_err(|e| PolicyError::Load(format!("cannot create the wasm engine: {e:#}")))?;
        let mut linker = Linker::new(&engine);
        bindings::Policy::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)
            .map_err(|e| PolicyError::Load(format!("cannot define the host interface: {e:#}")))?;
        let (cache, cache_problem) = match cache_dir {
            None => (None, None),
            Some(dir) => match CompileCache::open(dir, &engine) {
                Ok(c) => (Some(c), None),
                Err(e) => {
                    tracing::warn!(error = %e, "no compiled-policy cache; compiling policies in memory at every start");
                    (None, Some(e.to_string()))
                }
            },
        };
        let ticker = Ticker::start(&engine)?;
        Ok(Arc::new(Self {
            engine,
            linker,
            limits,
            cache,
            cache_problem,
            ticker,
        }))
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn cache_dir(&self) -> Option<&Path> {
        self.cache.as_ref().map(CompileCache::dir)
    }

    pub fn cache_problem(&self) -> Option<&str> {
        self.cache_problem.as_deref()
    }

    /// Loads a policy component from a file.
    pub fn load_file(self: &Arc<Self>, path: &Path) -> Result<WasmPolicy, PolicyError> {
        let bytes = std::fs::read(path)
            .map_err(|e| PolicyError::Load(format!("cannot read {}: {e}", path.display())))?;
        self.load(&bytes, &path.display().to_string())
    }

    /// Loads a policy component; `source` names it in messages (a path, or `builtin:KIND`).
    pub fn load(self: &Arc<Self>, bytes: &[u8], source: &str) -> Result<WasmPolicy, PolicyError> {
        let started = Instant::now();
        check_is_component(bytes, source)?;
        let digest = ContentHash::of(bytes).to_hex();
        let (component, from_cache) = self.compile(bytes, &digest, source)?;
        let compile_us = started.elapsed().as_micros() as u64;
        let contract = contract::check(&component, &self.engine, source)?;
        let pre = self.linker.instantiate_pre(&component).map_err(|e| {
            PolicyError::Contract(format!(
                "policy {source} (contract {}) cannot be linked against this jitship ({CONTRACT_PACKAGE}@{CONTRACT_MAJOR}.{CONTRACT_MINOR}): {e:#}",
                contract.version
            ))
        })?;
        let pre = bindings::PolicyPre::new(pre).map_err(|e| {
            PolicyError::Contract(format!(
                "policy {source} does not have the exports of the policy world: {e:#}"
            ))
        })?;
        let mut policy = WasmPolicy {
            engine: self.clone(),
            pre,
            label: source.into(),
            info: PolicyInfo {
                name: String::new(),
                version: String::new(),
                cache_kind: String::new(),
                default_root: String::new(),
                root_env: vec![],
                description: String::new(),
                settings: vec![],
            },
            settings: PolicySettings::new(),
            wit_settings: vec![],
            settings_checked: false,
            digest,
            bytes: bytes.into(),
            contract,
            load: LoadStats {
                from_cache,
                compile_us,
                total_us: 0,
            },
        };
        let info = policy.evaluate(None, |p, s| p.call_info(s))?.value;
        policy.info = validate_info(info)?;
        // Its defaults must be settings it accepts: a module that refuses them is broken.
        let mut policy = policy.configure(&BTreeMap::new())?;
        policy.load.total_us = started.elapsed().as_micros() as u64;
        Ok(policy)
    }

    /// The compiled component, from the cache if it holds it, else compiled (and cached).
    fn compile(
        &self,
        bytes: &[u8],
        digest: &str,
        source: &str,
    ) -> Result<(Component, bool), PolicyError> {
        let load_err = |e: wasmtime::Error| {
            PolicyError::Load(format!("policy {source} does not compile: {e:#}"))
        };
        let Some(cache) = &self.cache else {
            return Ok((
                Component::new(&self.engine, bytes).map_err(load_err)?,
                false,
            ));
        };
        if let Some(c) = cache.load(&self.engine, digest) {
            return Ok((c, true));
        }
        let cwasm = self.engine.precompile_component(bytes).map_err(load_err)?;
        if let Err(e) = cache.store(digest, &cwasm) {
            tracing::warn!(dir = %cache.dir().display(), "cannot keep the compiled policy {source}: {e}");
        }
        // SAFETY: `cwasm` was produced a moment ago, in this process, by this engine's
        // `precompile_component`; it never left memory we own.
        let component =
            unsafe { Component::deserialize(&self.engine, &cwasm) }.map_err(load_err)?;
        Ok((component, false))
    }
}

/// A call's answer plus what it cost and what the policy logged.
#[derive(Debug, Clone)]
pub struct Traced<T> {
    pub value: T,
    pub fuel_used: u64,
    pub wall: Duration,
    pub bytes_read: u64,
    pub logs: Vec<LogLine>,
    pub logs_dropped: u64,
}

impl<T> Traced<T> {
    /// A value the host answered without calling the policy: no cost, no logs.
    fn untraced(value: T) -> Self {
        Self {
            value,
            fuel_used: 0,
            wall: Duration::ZERO,
            bytes_read: 0,
            logs: vec![],
            logs_dropped: 0,
        }
    }

    /// The same call (its cost and logs) with `f` applied to its value.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Traced<U> {
        Traced {
            value: f(self.value),
            fuel_used: self.fuel_used,
            wall: self.wall,
            bytes_read: self.bytes_read,
            logs: self.logs,
            logs_dropped: self.logs_dropped,
        }
    }
}

/// A loaded policy component with its settings. Cheap to call from many threads: each call has
/// its own store.
#[derive(Clone)]
pub struct WasmPolicy {
    engine: Arc<PolicyEngine>,
    pre: bindings::PolicyPre<HostState>,
    label: String,
    info: PolicyInfo,
    /// Every declared setting, canonical text; handed to every call and recorded by publish.
    settings: PolicySettings,
    wit_settings: Vec<wit::Setting>,
    /// The policy's `check-settings` accepted `settings` (every `configure` after load that
    /// resolves to the same settings needs no call).
    settings_checked: bool,
    digest: String,
    /// The component's bytes (blake3 = `digest`), shared by every clone.
    bytes: Arc<[u8]>,
    contract: ContractInfo,
    load: LoadStats,
}

impl std::fmt::Debug for WasmPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmPolicy")
            .field("source", &self.label)
            .field("info", &self.info)
            .field("digest", &self.digest)
            .field("settings", &self.settings)
            .finish()
    }
}

impl WasmPolicy {
    pub fn source(&self) -> &str {
        &self.label
    }

    /// blake3 of the component.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    pub fn contract(&self) -> &ContractInfo {
        &self.contract
    }

    pub fn load_stats(&self) -> LoadStats {
        self.load
    }

    /// The settings every call receives.
    pub fn settings(&self) -> &PolicySettings {
        &self.settings
    }

    /// This policy with the operator's settings `given` (the declared ones only, read by their
    /// kinds, defaults for the rest), once the policy accepted them through `check-settings`.
    pub fn configure(&self, given: &BTreeMap<String, String>) -> Result<WasmPolicy, PolicyError> {
        let name = self.info_name().to_owned();
        let resolved = setting::resolve(&name, &self.info.settings, given)?;
        if self.settings_checked && resolved == self.settings {
            return Ok(self.clone());
        }
        let mut configured = self.clone();
        configured.wit_settings = resolved
            .iter()
            .map(|(n, v)| wit::Setting {
                name: n.clone(),
                value: v.clone(),
            })
            .collect();
        configured.settings = resolved;
        let answer = configured
            .evaluate(None, |p, s| {
                p.call_check_settings(s, &configured.wit_settings)
            })?
            .value;
        answer.map_err(|e| {
            PolicyError::Settings(format!(
                "policy {name} refused its settings {}: {}",
                describe(&configured.settings),
                from_wit(e)
            ))
        })?;
        configured.settings_checked = true;
        Ok(configured)
    }

    /// One evaluation: a fresh store and instance with every budget set, the call, the error mapped
    /// to a typed `PolicyError`. The store (and the instance, trapped or not) is dropped at the end.
    fn evaluate<R>(
        &self,
        root: Option<&Path>,
        call: impl FnOnce(&bindings::Policy, &mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Result<Traced<R>, PolicyError> {
        let limits = self.engine.limits;
        // The epoch advances only while this guard lives (before the deadline is set below).
        let _in_flight = self.engine.ticker.enter();
        let started = Instant::now();
        let memory_cap = usize::try_from(limits.memory).unwrap_or(usize::MAX);
        let state = HostState::new(
            self.info_name().into(),
            memory_cap,
            limits.read_budget,
            root.map(Path::to_path_buf),
        );
        let mut store = Store::new(&self.engine.engine, state);
        store.limiter(|s| &mut s.limiter);
        store
            .set_fuel(limits.fuel)
            .map_err(|e| PolicyError::Load(format!("cannot set fuel: {e:#}")))?;
        store.set_epoch_deadline(limits.deadline_ticks());
        store.epoch_deadline_trap();
        let result = self
            .pre
            .instantiate(&mut store)
            .and_then(|instance| call(&instance, &mut store));
        let fuel_used = limits.fuel.saturating_sub(store.get_fuel().unwrap_or(0));
        let wall = started.elapsed();
        match result {
            Ok(value) => {
                let state = store.into_data();
                Ok(Traced {
                    value,
                    fuel_used,
                    wall,
                    bytes_read: state.bytes_read,
                    logs: state.logs,
                    logs_dropped: state.logs_dropped,
                })
            }
            Err(e) => Err(self.classify(e, store.data(), &limits)),
        }
    }

    fn info_name(&self) -> &str {
        if self.info.name.is_empty() {
            &self.label
        } else {
            &self.info.name
        }
    }

    fn classify(&self, err: wasmtime::Error, state: &HostState, limits: &Limits) -> PolicyError {
        if let Some(m) = err.downcast_ref::<MemoryLimitExceeded>() {
            return PolicyError::MemoryExceeded {
                requested: m.requested,
                limit: m.limit,
            };
        }
        let said = state
            .last_error_log()
            .map(|m| format!("; the policy said: {m}"))
            .unwrap_or_default();
        match err.downcast_ref::<Trap>() {
            Some(Trap::OutOfFuel) => PolicyError::OutOfFuel { fuel: limits.fuel },
            Some(Trap::Interrupt) => PolicyError::WallTimeExceeded {
                deadline_ms: limits.deadline.as_millis() as u64,
            },
            Some(trap) => PolicyError::Trapped(format!("{trap}{said}")),
            // Not a trap: an instantiation or host-side failure; the chain says what.
            None => PolicyError::Trapped(format!("{err:#}{said}")),
        }
    }

    /// `compat-key`, with its cost and logs.
    pub fn compat_key_traced(
        &self,
        facts: &Facts,
    ) -> Result<Traced<Result<String, PolicyError>>, PolicyError> {
        let facts: Vec<wit::Fact> = facts
            .iter()
            .map(|(n, v)| wit::Fact {
                name: n.into(),
                value: v.into(),
            })
            .collect();
        let t = self.evaluate(None, |p, s| {
            p.call_compat_key(s, &facts, &self.wit_settings)
        })?;
        Ok(t.map(|v| v.map_err(from_wit).and_then(validate_key)))
    }

    /// `select`, with its cost and logs. `root` is the only directory `read-file` can see, and is
    /// handed to the policy as an absolute path.
    pub fn select_traced(
        &self,
        root: &Path,
        entries: &[FileEntry],
    ) -> Result<Traced<Result<Selection, PolicyError>>, PolicyError> {
        let root_text = absolute_root(root)?;
        let wit_entries: Vec<wit::FileEntry> = entries
            .iter()
            .map(|e| wit::FileEntry {
                path: e.path.clone(),
                size: e.size,
                mtime_ms: e.mtime_ms,
            })
            .collect();
        let t = self.evaluate(Some(root), |p, s| {
            p.call_select(s, &root_text, &wit_entries, &self.wit_settings)
        })?;
        Ok(t.map(|v| {
            v.map_err(from_wit)
                .and_then(|sel| validate_selection(sel, entries.len()))
        }))
    }

    /// `canonicalize` (`to_canonical`) or `materialize` of one file, with its cost and logs. The
    /// policy gets no root to read from: the file's bytes are the argument.
    pub fn rewrite_traced(
        &self,
        direction: Rewrite,
        root: &Path,
        path: &RelPath,
        content: &[u8],
    ) -> Result<Traced<Result<Vec<u8>, PolicyError>>, PolicyError> {
        let root_text = absolute_root(root)?;
        let op = direction.export_name();
        if content.len() > MAX_REWRITE_BYTES {
            return Ok(Traced::untraced(Err(PolicyError::HostRefusedInput(
                format!(
                    "{path} is {} bytes; jitship hands {op} files of at most {MAX_REWRITE_BYTES} bytes",
                    content.len()
                ),
            ))));
        }
        let t = self.evaluate(None, |p, s| match direction {
            Rewrite::Canonicalize => {
                p.call_canonicalize(s, &root_text, path.as_str(), content, &self.wit_settings)
            }
            Rewrite::Materialize => {
                p.call_materialize(s, &root_text, path.as_str(), content, &self.wit_settings)
            }
        })?;
        let limit = content
            .len()
            .saturating_add(MAX_REWRITE_GROWTH)
            .min(MAX_REWRITE_BYTES);
        Ok(t.map(|v| v.map_err(from_wit).and_then(|out| {
            if out.len() > limit {
                return Err(bad(format!(
                    "{op} of {path} answered {} bytes for {} bytes of input; at most {limit} are allowed",
                    out.len(),
                    content.len()
                )));
            }
            Ok(out)
        })))
    }

    /// `retain`, with its cost and logs. Pinned generations are removed from the answer whatever
    /// the policy said.
    pub fn retain_traced(
        &self,
        generations: &[GenerationSummary],
        now: u64,
        limits: &RetentionLimits,
    ) -> Result<Traced<Result<Vec<RetentionDrop>, PolicyError>>, PolicyError> {
        let gens: Vec<wit::GenerationSummary> = generations
            .iter()
            .map(|g| wit::GenerationSummary {
                id: g.id.to_string(),
                compat_key: g.compat_key.clone(),
                created_at: g.created_at,
                size_bytes: g.size_bytes,
                file_count: g.file_count,
                pinned: g.pinned,
            })
            .collect();
        let wl = wit::RetentionLimits {
            max_generations: limits.max_generations,
            max_bytes: limits.max_bytes,
            max_age_secs: limits.max_age_secs,
        };
        let t = self.evaluate(None, |p, s| {
            p.call_retain(s, &gens, now, wl, &self.wit_settings)
        })?;
        Ok(t.map(|v| {
            v.map_err(from_wit)
                .and_then(|drops| validate_drops(drops, generations, self.info_name()))
        }))
    }
}

/// Which way `rewrite_traced` goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rewrite {
    /// Publish side: the file as written under its root -> the root-independent form.
    Canonicalize,
    /// Install side: the root-independent form -> the file for the installing root.
    Materialize,
}

impl Rewrite {
    fn export_name(self) -> &'static str {
        match self {
            Self::Canonicalize => "canonicalize",
            Self::Materialize => "materialize",
        }
    }
}

/// `keep=2, max_age=3600`, for messages.
pub fn describe(settings: &PolicySettings) -> String {
    if settings.is_empty() {
        return "(none)".to_owned();
    }
    let parts: Vec<String> = settings.iter().map(|(n, v)| format!("{n}={v}")).collect();
    parts.join(", ")
}

impl CachePolicy for WasmPolicy {
    fn info(&self) -> &PolicyInfo {
        &self.info
    }

    fn policy_ref(&self) -> PolicyRef {
        PolicyRef {
            name: self.info.name.clone(),
            version: self.info.version.clone(),
            digest: self.digest.clone(),
            settings: self.settings.clone(),
        }
    }

    fn module(&self) -> Option<Arc<[u8]>> {
        Some(self.bytes.clone())
    }

    fn with_recorded_settings(
        &self,
        recorded: &PolicyRef,
    ) -> Option<Result<Box<dyn CachePolicy>, PolicyError>> {
        if recorded.name != self.info.name || recorded.settings == self.settings {
            return None;
        }
        Some(
            self.configure(&recorded.settings)
                .map(|p| Box::new(p) as Box<dyn CachePolicy>),
        )
    }

    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
        self.compat_key_traced(facts)?.value
    }

    fn select(&self, root: &Path, entries: &[FileEntry]) -> Result<Selection, PolicyError> {
        self.select_traced(root, entries)?.value
    }

    fn canonicalize(
        &self,
        root: &Path,
        path: &RelPath,
        content: &[u8],
    ) -> Result<Vec<u8>, PolicyError> {
        self.rewrite_traced(Rewrite::Canonicalize, root, path, content)?
            .value
    }

    fn materialize(
        &self,
        root: &Path,
        path: &RelPath,
        content: &[u8],
    ) -> Result<Vec<u8>, PolicyError> {
        self.rewrite_traced(Rewrite::Materialize, root, path, content)?
            .value
    }

    fn retain(
        &self,
        generations: &[GenerationSummary],
        now: u64,
        limits: &RetentionLimits,
    ) -> Result<Vec<RetentionDrop>, PolicyError> {
        self.retain_traced(generations, now, limits)?.value
    }
}
