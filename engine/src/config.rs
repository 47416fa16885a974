//! Configuration: a TOML file (`--config`, `JITSHIP_CONFIG`), overridden by `JITSHIP_*` environment
//! variables, overridden by flags (that order is decided in one place, `cli::args::resolve`; the
//! flags' own forms are parsed in `config::flags`). Everything jitship does is decided here, explicitly:
//! nothing is read from or written to the process environment behind the operator's back
//! (Mooncake included).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

mod fact_names;
mod file;
mod flags;

pub use crate::facts::{FactOverrides, GatherConfig, ScopedFacts};
pub use crate::policy::host::PolicyConfig;
pub use crate::store::settings::{
    Backend, InvalidSetting, LocalStoreConfig, MOONCAKE_LIBRARY_ENV, MooncakeConfig,
    MooncakeProtocol, StoreConfig, parse_host_port,
};
pub use crate::trust::{TrustConfig, TrustMode};
pub use fact_names::{KNOWN_FACTS, is_known_fact, unknown_fact_warnings};
pub use file::ConfigFile;
pub use flags::{
    apply_durable_store_arg, apply_store_arg, parse_cache_arg, parse_fact_arg, parse_fact_list,
    parse_scoped_fact_arg, parse_setting_arg,
};
use flags::{check_fact_name, parse_kind, unknown_kind};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid {what} {value:?}: {hint}")]
    Invalid {
        what: &'static str,
        value: String,
        hint: String,
    },
}

impl From<InvalidSetting> for ConfigError {
    fn from(e: InvalidSetting) -> Self {
        Self::Invalid {
            what: e.what,
            value: e.value,
            hint: e.hint,
        }
    }
}

/// The settings a command runs with: the file's (`ConfigFile`, the schema) with the command
/// line's on top (`cli::args::resolve`), and what resolving them added, which no file sets
/// (`engine_candidates`, `flag_facts`). It reads and writes as the file does.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "ConfigFile", into = "ConfigFile")]
pub struct Config {
    pub store: StoreConfig,
    pub caches: Vec<CacheConfig>,
    pub facts: BTreeMap<String, String>,
    pub gather: GatherConfig,
    pub publish: PublishConfig,
    pub install: InstallConfig,
    pub policy: PolicyConfig,
    pub watch: WatchConfig,
    pub retention: RetentionConfig,
    pub trust: TrustConfig,
    pub engine: Option<Engine>,
    /// The kinds [`Config::add_engine_candidates`] added (not configured by the operator): the
    /// session keeps those the engine reads once the facts are known.
    pub engine_candidates: Vec<String>,
    /// The command line's fact overrides (`--fact [KIND:]NAME=VALUE`, or `JITSHIP_FACTS`), set by
    /// the CLI; never read from the file. They win over `[facts]` and every `[[cache]]`'s `facts`
    /// (see [`Config::fact_overrides`]).
    pub flag_facts: ScopedFacts,
}

impl From<ConfigFile> for Config {
    fn from(f: ConfigFile) -> Self {
        Self {
            store: f.store,
            caches: f.caches,
            facts: f.facts,
            gather: f.gather,
            publish: f.publish,
            install: f.install,
            policy: f.policy,
            watch: f.watch,
            retention: f.retention,
            trust: f.trust,
            engine: f.engine,
            engine_candidates: Vec::new(),
            flag_facts: ScopedFacts::default(),
        }
    }
}

impl From<Config> for ConfigFile {
    fn from(c: Config) -> Self {
        Self {
            store: c.store,
            caches: c.caches,
            facts: c.facts,
            gather: c.gather,
            publish: c.publish,
            install: c.install,
            policy: c.policy,
            watch: c.watch,
            retention: c.retention,
            trust: c.trust,
            engine: c.engine,
        }
    }
}

/// Quotas handed to the retention policy, per compat key, and gc's safety margin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Generations to keep per compat key (the built-in policy keeps 3 when unset).
    pub max_generations: Option<u32>,
    /// Bytes (sum of file sizes) to keep per compat key, newest first; the newest always stays.
    pub max_bytes: Option<ByteSize>,
    /// Drop generations created longer ago than this (the newest always stays).
    #[serde(with = "humantime_serde")]
    pub max_age: Option<Duration>,
    /// A generation is removed only once it was superseded at least this long ago: an install that
    /// read the previous head may still be fetching it. Keep it above the install deadline plus
    /// clock skew between hosts.
    #[serde(with = "humantime_serde")]
    pub grace: Duration,
    /// How long gc waits before retrying a key a reader holds a lease on (Mooncake:
    /// `default_kv_lease_ttl` of the master, 10 s by default, plus a margin).
    #[serde(with = "humantime_serde")]
    pub lease_wait: Duration,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            max_generations: None,
            max_bytes: None,
            max_age: None,
            grace: Duration::from_secs(3600),
            lease_wait: Duration::from_secs(11),
        }
    }
}

impl RetentionConfig {
    pub fn limits(&self) -> crate::policy::RetentionLimits {
        crate::policy::RetentionLimits {
            max_generations: self.max_generations,
            max_bytes: self.max_bytes.map(|b| b.as_u64()),
            max_age_secs: self.max_age.map(|d| d.as_secs()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    /// Cache kind ("triton", "inductor", ...): selects the built-in policy of that name. A kind
    /// with no built-in policy is refused unless `policy` names a module or `"native"`.
    pub kind: String,
    /// The cache directory. Empty (omitted): resolved as the engine resolves it, from the
    /// policy's `root_env` and `default_root` in jitship's own environment (`crate::roots`).
    #[serde(default, skip_serializing_if = "path_is_empty")]
    pub root: PathBuf,
    /// A policy component (`.wasm`, built with `jitship policy build`) to use instead of the
    /// built-in one for this kind, or [`NATIVE_POLICY`] for jitship's generic native rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PathBuf>,
    /// Fact overrides for this cache only, e.g. `facts = { "model.id" = "Qwen/Qwen3-8B" }`: they
    /// win over `[facts]` for this cache's key, and lose to `--fact` (see
    /// [`crate::facts::FactOverrides::layers`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub facts: BTreeMap<String, String>,
    /// The policy's settings for this cache, e.g. `settings = { keep = 2, max_age = "1h" }`:
    /// only those the policy declares (`jitship policy check` lists them), read by their kinds
    /// (`--setting KIND:NAME=VALUE` wins). Checked through the policy when it loads; a kind whose
    /// settings it refuses is disabled with the reason.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub settings: BTreeMap<String, SettingValue>,
}

/// A setting's value as TOML gives it; the policy's declared kind decides how it is read
/// (`crate::policy::settings`), so `keep = 2` and `keep = "2"` are the same.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SettingValue {
    Boolean(bool),
    Integer(i64),
    Text(String),
}

impl std::fmt::Display for SettingValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Boolean(b) => write!(f, "{b}"),
            Self::Integer(i) => write!(f, "{i}"),
            Self::Text(t) => f.write_str(t),
        }
    }
}

impl CacheConfig {
    /// The operator's settings as text, for the policy's kinds to read.
    pub fn settings_text(&self) -> BTreeMap<String, String> {
        self.settings
            .iter()
            .map(|(n, v)| (n.clone(), v.to_string()))
            .collect()
    }
}

/// An inference engine whose caches `--engine` / `engine =` names at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// vLLM: its compile cache, or the Inductor cache and precompiled header it uses instead,
    /// by compile mode and machine (docs/vllm.md).
    Vllm,
    /// SGLang: the caches it moves under its own `SGLANG_CACHE_DIR`, and its own JIT and
    /// torch.compile caches, by machine (docs/sglang.md).
    Sglang,
}

impl Engine {
    /// Every kind the engine may read, whatever its mode and machine: configured (policies
    /// loaded, roots resolved) before the facts are known; `crate::engines` keeps those it reads.
    pub fn candidate_kinds(self) -> &'static [&'static str] {
        match self {
            Engine::Vllm => &[
                "vllm-compile",
                "inductor",
                "inductor-pch",
                "vllm-modelinfos",
            ],
            Engine::Sglang => &[
                "inductor",
                "inductor-pch",
                "triton",
                "sglang-jit",
                "sglang-compile",
                "flashinfer-jit",
                "deepgemm",
                "tilelang",
                "cuda-computecache",
            ],
        }
    }
}

impl Config {
    /// Adds the engine's candidate caches that are not configured already (an explicit one of
    /// the same kind wins), their roots left for `crate::roots`, and remembers which it added.
    pub fn add_engine_candidates(&mut self) {
        let Some(engine) = self.engine else { return };
        for kind in engine.candidate_kinds() {
            if !self.caches.iter().any(|c| c.kind == *kind) {
                self.caches.push(CacheConfig {
                    kind: (*kind).to_string(),
                    root: PathBuf::new(),
                    policy: None,
                    facts: BTreeMap::new(),
                    settings: BTreeMap::new(),
                });
                self.engine_candidates.push((*kind).to_string());
            }
        }
    }
}

/// `policy = "native"`: the operator's explicit choice of jitship's generic rules (skip temp,
/// lock and per-host files; key on every fact but the per-host ones) for a kind with no policy
/// module. A module file literally named `native` is given as `./native`.
pub const NATIVE_POLICY: &str = "native";

fn path_is_empty(p: &Path) -> bool {
    p.as_os_str().is_empty()
}

impl CacheConfig {
    /// Whether the operator chose the native generic rules for this cache.
    pub fn uses_native_policy(&self) -> bool {
        self.policy.as_deref() == Some(Path::new(NATIVE_POLICY))
    }

    /// The policy module file to load instead of the built-in one, if one is configured.
    pub fn policy_file(&self) -> Option<&Path> {
        self.policy
            .as_deref()
            .filter(|p| *p != Path::new(NATIVE_POLICY))
    }

    /// Whether the root is left to be resolved from the environment (`crate::roots`).
    pub fn root_is_default(&self) -> bool {
        path_is_empty(&self.root)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PublishConfig {
    /// Largest pack; keep it well under a Mooncake store node's segment.
    pub pack_size: ByteSize,
    /// Recorded as the producer of each generation (defaults to $POD_NAME, then nothing).
    pub pod: Option<String>,
    /// Copies of each new pack, the primary included (1 to 8): each extra copy goes under a key
    /// of its own so Mooncake places it on another store node and installs, which pick a copy at
    /// random, spread a rollout's reads. Each copy costs the pack's size in the store's memory
    /// (a generation of B bytes of packs takes B x pack_replicas). Set it alike for publishers
    /// and installers: an install picks among this many.
    pub pack_replicas: u32,
}

impl Default for PublishConfig {
    fn default() -> Self {
        Self {
            pack_size: ByteSize::mib(64),
            pod: None,
            pack_replicas: 1,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InstallConfig {
    /// Bound on the whole install; past it the root is left as it was.
    #[serde(with = "humantime_serde")]
    pub deadline: Duration,
}

impl Default for InstallConfig {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(60),
        }
    }
}

/// `jitship watch`: when to publish, and where to report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WatchConfig {
    /// Quiet time after the last change under a root before it is published.
    #[serde(with = "humantime_serde")]
    pub settle: Duration,
    /// Full rescan of every root this often: the fallback when file events are lost (inotify
    /// overflow, the watch limit) or never come (network file systems).
    #[serde(with = "humantime_serde")]
    pub rescan_interval: Duration,
    /// Least time between two new generations of one root (cycles that find nothing new do not
    /// count).
    #[serde(with = "humantime_serde")]
    pub min_interval: Duration,
    /// Publish only once this URL (the server's health endpoint, plain http) answered 200.
    pub ready_url: Option<String>,
    /// Bound on the final publish after SIGTERM/SIGINT.
    #[serde(with = "humantime_serde")]
    pub grace: Duration,
    /// Serve Prometheus metrics (/metrics) and /healthz on this address, e.g. "0.0.0.0:9464".
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Scrub this often (a sample of the kept generations' packs re-read, checked, and put back
    /// from the durable tier when the fast tier lost them); 0s, the default, never.
    #[serde(with = "humantime_serde")]
    pub scrub_interval: Duration,
    /// Packs one scrub reads.
    pub scrub_sample: usize,
}

impl Default for WatchConfig {
    fn default() -> Self {
        Self {
            settle: Duration::from_secs(5),
            rescan_interval: Duration::from_secs(60),
            min_interval: Duration::from_secs(30),
            ready_url: None,
            // Kubernetes gives 30 s between SIGTERM and SIGKILL by default.
            grace: Duration::from_secs(20),
            metrics_addr: None,
            scrub_interval: Duration::ZERO,
            scrub_sample: 16,
        }
    }
}

impl WatchConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |what, value: &Duration, hint: &str| ConfigError::Invalid {
            what,
            value: humantime::format_duration(*value).to_string(),
            hint: hint.into(),
        };
        if self.rescan_interval < Duration::from_secs(1) {
            return Err(invalid(
                "watch.rescan_interval",
                &self.rescan_interval,
                "must be at least 1s (a shorter interval is busy polling)",
            ));
        }
        if self.settle > Duration::from_secs(3600) {
            return Err(invalid("watch.settle", &self.settle, "must be at most 1h"));
        }
        if self.grace > Duration::from_secs(3600) {
            return Err(invalid(
                "watch.grace",
                &self.grace,
                "must be at most 1h (and below the pod's terminationGracePeriodSeconds)",
            ));
        }
        if !self.scrub_interval.is_zero() && self.scrub_interval < Duration::from_secs(60) {
            return Err(invalid(
                "watch.scrub_interval",
                &self.scrub_interval,
                "must be 0s (off) or at least 1m: a scrub reads packs from the store",
            ));
        }
        if self.scrub_sample == 0 || self.scrub_sample > 10_000 {
            return Err(ConfigError::Invalid {
                what: "watch.scrub_sample",
                value: self.scrub_sample.to_string(),
                hint: "must be 1 to 10000 packs".into(),
            });
        }
        if let Some(url) = &self.ready_url {
            crate::ready::ReadyUrl::parse(url).map_err(|e| ConfigError::Invalid {
                what: "watch.ready_url",
                value: url.clone(),
                hint: e.hint.into(),
            })?;
        }
        Ok(())
    }
}

impl Config {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        Self::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.into(),
            message: e.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        crate::store::check_key(&self.store.namespace).map_err(|_| ConfigError::Invalid {
            what: "store.namespace",
            value: self.store.namespace.clone(),
            hint: "use letters, digits and - _ . + = /".into(),
        })?;
        if self.trust.effective_mode() == TrustMode::Required
            && self.trust.trusted_keys.is_empty()
            && self.trust.trusted_key_files.is_empty()
        {
            return Err(ConfigError::Invalid {
                what: "trust.mode",
                value: "required".into(),
                hint: "required needs at least one key in trust.trusted_keys or \
                       trust.trusted_key_files (or --trusted-key); `jitship key generate` makes one"
                    .into(),
            });
        }
        if let (Some(dir), Some(registry)) =
            (&self.store.durable.path, &self.store.durable.registry)
        {
            return Err(ConfigError::Invalid {
                what: "store.durable",
                value: format!("path = {:?} and registry = {registry:?}", dir.display()),
                hint: "name one durable tier: a directory (path) or a registry (registry)".into(),
            });
        }
        if self.publish.pack_size.as_u64() < 4096 {
            return Err(ConfigError::Invalid {
                what: "publish.pack_size",
                value: self.publish.pack_size.to_string(),
                hint: "must be at least 4 KiB".into(),
            });
        }
        let most = crate::catalog::KeyLayout::MAX_PACK_REPLICAS;
        if !(1..=most).contains(&self.publish.pack_replicas) {
            return Err(ConfigError::Invalid {
                what: "publish.pack_replicas",
                value: self.publish.pack_replicas.to_string(),
                hint: format!(
                    "must be 1 to {most}: copies of each pack, the primary included, each \
                     costing the pack's size in the store's memory"
                ),
            });
        }
        self.watch.validate()?;
        if self.policy.fuel < 1_000_000 {
            return Err(ConfigError::Invalid {
                what: "policy.fuel",
                value: self.policy.fuel.to_string(),
                hint: "must be at least 1000000 (a 200-entry select needs about 1.5 million)"
                    .into(),
            });
        }
        if self.policy.deadline < Duration::from_millis(50) {
            return Err(ConfigError::Invalid {
                what: "policy.deadline",
                value: humantime::format_duration(self.policy.deadline).to_string(),
                hint: "must be at least 50ms (the epoch ticks every 10ms)".into(),
            });
        }
        if self.policy.memory < ByteSize::mib(2) {
            return Err(ConfigError::Invalid {
                what: "policy.memory",
                value: self.policy.memory.to_string(),
                hint: "must be at least 2 MiB (a policy's stack and data alone take about 1 MiB)"
                    .into(),
            });
        }
        if self.gather.timeout.is_zero() {
            return Err(ConfigError::Invalid {
                what: "gather.timeout",
                value: "0s".into(),
                hint: "must be above zero, e.g. \"5s\"".into(),
            });
        }
        for name in &self.gather.packages {
            if name.trim().is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            {
                return Err(ConfigError::Invalid {
                    what: "gather.packages entry",
                    value: name.clone(),
                    hint: "use a distribution name as pip spells it, e.g. flashinfer-python".into(),
                });
            }
        }
        if self.retention.max_generations == Some(0) {
            return Err(ConfigError::Invalid {
                what: "retention.max_generations",
                value: "0".into(),
                hint: "must be at least 1 (the newest generation is always kept)".into(),
            });
        }
        if self.store.backend == Backend::Mooncake {
            self.store.mooncake.validate()?;
            let limit = self.store.mooncake.staging_buffer_size;
            if self.publish.pack_size > limit {
                return Err(ConfigError::Invalid {
                    what: "publish.pack_size",
                    value: self.publish.pack_size.to_string(),
                    hint: format!(
                        "over store.mooncake.staging_buffer_size ({limit}), the largest value the mooncake backend moves; \
                         lower publish.pack_size or raise store.mooncake.staging_buffer_size"
                    ),
                });
            }
        }
        for name in self.facts.keys() {
            check_fact_name("[facts] entry", name)?;
        }
        for c in &self.caches {
            for name in c.facts.keys() {
                check_fact_name("[[cache]] facts entry", name)?;
            }
        }
        self.check_flag_facts()?;
        let mut kinds = std::collections::HashSet::new();
        for c in &self.caches {
            parse_kind(&c.kind)?;
            if c.policy.is_none() && !crate::policy::builtin::kinds().any(|k| k == c.kind) {
                return Err(unknown_kind(&c.kind));
            }
            if !kinds.insert(&c.kind) {
                return Err(ConfigError::Invalid {
                    what: "cache kind",
                    value: c.kind.clone(),
                    hint: "each kind may appear once".into(),
                });
            }
        }
        Ok(())
    }
}

impl Config {
    /// Every fact override, by level (see [`FactOverrides::layers`] for their precedence): the
    /// file's `[facts]` and `[[cache]] facts`, and the command line's [`Config::flag_facts`].
    pub fn fact_overrides(&self) -> FactOverrides {
        FactOverrides {
            config: ScopedFacts {
                global: self.facts.clone(),
                per_cache: self
                    .caches
                    .iter()
                    .filter(|c| !c.facts.is_empty())
                    .map(|c| (c.kind.clone(), c.facts.clone()))
                    .collect(),
            },
            flags: self.flag_facts.clone(),
        }
    }

    /// Every name of the command line's facts is valid, and each `KIND:` names a cache of this
    /// command.
    fn check_flag_facts(&self) -> Result<(), ConfigError> {
        for name in self.flag_facts.global.keys() {
            check_fact_name("--fact", name)?;
        }
        for (kind, facts) in &self.flag_facts.per_cache {
            for name in facts.keys() {
                check_fact_name("--fact", name)?;
            }
            if facts.is_empty() || self.caches.iter().any(|c| &c.kind == kind) {
                continue;
            }
            let kinds: Vec<&str> = self.caches.iter().map(|c| c.kind.as_str()).collect();
            let configured = if kinds.is_empty() {
                "no cache is configured (--cache or [[cache]])".to_owned()
            } else {
                format!("the configured cache kinds are: {}", kinds.join(", "))
            };
            return Err(ConfigError::Invalid {
                what: "--fact",
                value: format!(
                    "{kind}:{}",
                    facts.keys().next().map(String::as_str).unwrap_or("")
                ),
                hint: format!(
                    "{kind:?} is not a cache of this command; KIND:NAME=VALUE applies to the cache \
                     of that kind only, and {configured}"
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
