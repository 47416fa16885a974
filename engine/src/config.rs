//! Configuration: a TOML file (`--config`, `JITSHIP_CONFIG`), overridden by `JITSHIP_*` environment
//! variables, overridden by flags. Everything jitship does is decided here, explicitly: nothing is
//! read from or written to the process environment behind the operator's back (Mooncake included).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

pub use crate::facts::GatherConfig;
pub use crate::policy::host::PolicyConfig;
pub use crate::store::settings::{
    Backend, InvalidSetting, LocalStoreConfig, MOONCAKE_LIBRARY_ENV, MooncakeConfig,
    MooncakeProtocol, StoreConfig, parse_host_port,
};
pub use crate::trust::{TrustConfig, TrustMode};

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

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub store: StoreConfig,
    /// One entry per cache root.
    #[serde(rename = "cache")]
    pub caches: Vec<CacheConfig>,
    /// Facts that override (or add to) what jitship gathers.
    pub facts: BTreeMap<String, String>,
    /// Where and how jitship gathers facts (the `[facts]` table stays a plain overrides map).
    pub gather: GatherConfig,
    pub publish: PublishConfig,
    pub install: InstallConfig,
    pub policy: PolicyConfig,
    pub watch: WatchConfig,
    pub retention: RetentionConfig,
    pub trust: TrustConfig,
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
}

impl Default for PublishConfig {
    fn default() -> Self {
        Self {
            pack_size: ByteSize::mib(64),
            pod: None,
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
        if self.publish.pack_size.as_u64() < 4096 {
            return Err(ConfigError::Invalid {
                what: "publish.pack_size",
                value: self.publish.pack_size.to_string(),
                hint: "must be at least 4 KiB".into(),
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

fn parse_kind(kind: &str) -> Result<(), ConfigError> {
    if kind.is_empty()
        || !kind
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    {
        return Err(ConfigError::Invalid {
            what: "cache kind",
            value: kind.into(),
            hint: "use lowercase letters, digits, - and _".into(),
        });
    }
    Ok(())
}

/// The refusal of a kind jitship ships no policy for: without one, the cache would silently key
/// and select by generic rules nobody chose. Names the built-in kinds and the nearest one.
fn unknown_kind(kind: &str) -> ConfigError {
    let builtins: Vec<&str> = crate::policy::builtin::kinds().collect();
    let nearest = nearest_kind(kind, &builtins)
        .map(|k| format!("did you mean {k:?}? "))
        .unwrap_or_default();
    ConfigError::Invalid {
        what: "cache kind",
        value: kind.into(),
        hint: format!(
            "jitship has no built-in policy for it. {nearest}The built-in kinds are: {}. \
             For a cache of your own, give a policy module (`policy = \"x.wasm\"` in its [[cache]], \
             or --cache {kind}:x.wasm=ROOT), or choose jitship's generic native rules explicitly \
             (`policy = \"native\"`, or --cache {kind}:native=ROOT)",
            builtins.join(", ")
        ),
    }
}

/// The built-in kind closest to `kind`: one that contains it or is contained in it (`vllm` ->
/// `vllm-compile`), else the smallest edit distance within a third of the name's length.
fn nearest_kind<'a>(kind: &str, builtins: &[&'a str]) -> Option<&'a str> {
    let distance = |b: &str| strsim::damerau_levenshtein(kind, b);
    let related = |b: &str| b.contains(kind) || kind.contains(b);
    builtins
        .iter()
        .copied()
        .filter(|b| related(b) || distance(b) <= (kind.len() / 3).max(2))
        .min_by_key(|&b| (!related(b), distance(b)))
}

/// `KIND[:POLICY][=ROOT]`, as given to `--cache`: POLICY is `native` or a policy module file (as
/// `policy` in a `[[cache]]`); without `=ROOT` the root is resolved from the environment the way
/// the engine resolves it (`crate::roots`).
pub fn parse_cache_arg(s: &str) -> Result<CacheConfig, ConfigError> {
    let invalid = |hint: &str| ConfigError::Invalid {
        what: "--cache",
        value: s.into(),
        hint: hint.into(),
    };
    let (spec, root) = match s.split_once('=') {
        Some((_, "")) => {
            return Err(invalid(
                "the root is empty; give KIND=ROOT, or just KIND to use the root the engine would use",
            ));
        }
        Some((spec, root)) => (spec, PathBuf::from(root)),
        None => (s, PathBuf::new()),
    };
    let (kind, policy) = match spec.split_once(':') {
        Some((_, "")) => {
            return Err(invalid(
                "the policy after ':' is empty; expected KIND:native or KIND:FILE.wasm",
            ));
        }
        Some((kind, policy)) => (kind, Some(PathBuf::from(policy))),
        None => (spec, None),
    };
    parse_kind(kind).map_err(|_| {
        invalid("expected KIND[:POLICY][=ROOT], e.g. triton=/root/.triton/cache, inductor, or mykind:native=/data/cache (KIND: lowercase letters, digits, - and _)")
    })?;
    Ok(CacheConfig {
        kind: kind.into(),
        root,
        policy,
    })
}

/// Applies `--cache` arguments on top of the config's `[[cache]]` entries: a kind already there
/// takes the flag's root and policy (each only if the flag gives one), a new kind is added.
pub fn apply_cache_args(config: &mut Config, args: &[String]) -> Result<(), ConfigError> {
    for arg in args {
        let cache = parse_cache_arg(arg)?;
        match config.caches.iter_mut().find(|c| c.kind == cache.kind) {
            Some(existing) => {
                if !cache.root_is_default() {
                    existing.root = cache.root;
                }
                if cache.policy.is_some() {
                    existing.policy = cache.policy;
                }
            }
            None => config.caches.push(cache),
        }
    }
    Ok(())
}

/// `K=V`, as given to `--fact`.
pub fn parse_fact_arg(s: &str) -> Result<(String, String), ConfigError> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.into(), v.into())),
        _ => Err(ConfigError::Invalid {
            what: "--fact",
            value: s.into(),
            hint: "expected NAME=VALUE, e.g. model.id=Qwen/Qwen3-8B".into(),
        }),
    }
}

/// Parses `k=v;k=v` (the form of `JITSHIP_FACTS`); empty items are ignored.
pub fn parse_fact_list(s: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    s.split(';')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(parse_fact_arg)
        .collect()
}

/// `local:DIR`, `mooncake` (the `[store.mooncake]` settings) or `mooncake:HOST:PORT` (those
/// settings with another master), as given to `--store`.
pub fn apply_store_arg(store: &mut StoreConfig, s: &str) -> Result<(), ConfigError> {
    let hint = "expected local:DIR, mooncake or mooncake:HOST:PORT (the master)";
    match s.split_once(':') {
        Some(("local", dir)) if !dir.is_empty() => {
            store.backend = Backend::Local;
            store.local.path = PathBuf::from(dir);
            Ok(())
        }
        None if s == "mooncake" => {
            store.backend = Backend::Mooncake;
            Ok(())
        }
        Some(("mooncake", master)) if parse_host_port(master).is_some() => {
            store.backend = Backend::Mooncake;
            store.mooncake.master = master.into();
            Ok(())
        }
        _ => Err(ConfigError::Invalid {
            what: "--store",
            value: s.into(),
            hint: hint.into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fact_lists_parse_like_the_env_variable() {
        let parsed = parse_fact_list("model.id=Qwen/Qwen3-8B; gpu.cc=9.0;;").unwrap();
        assert_eq!(
            parsed,
            BTreeMap::from([
                ("gpu.cc".into(), "9.0".into()),
                ("model.id".into(), "Qwen/Qwen3-8B".into())
            ])
        );
        assert!(parse_fact_list("model.id").is_err());
        assert!(parse_fact_list("").unwrap().is_empty());
    }

    #[test]
    fn example_config_parses() {
        let path = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/jitship.toml"
        ));
        let config = Config::load(path).unwrap();
        assert!(!config.caches.is_empty());
    }

    /// The tests crate writes configs with `toml::to_string`; [watch] must survive the round trip.
    #[test]
    fn default_config_round_trips_through_toml() {
        let mut config = Config::default();
        config.watch.metrics_addr = Some("127.0.0.1:9464".parse().unwrap());
        let text = toml::to_string(&config).unwrap();
        assert_eq!(Config::parse(&text, Path::new("x.toml")).unwrap(), config);
        let text = toml::to_string(&Config::default()).unwrap();
        assert_eq!(
            Config::parse(&text, Path::new("x.toml")).unwrap(),
            Config::default()
        );
    }

    /// The Kubernetes example embeds a jitship.toml in a ConfigMap; it must stay a valid config.
    #[test]
    fn kubernetes_example_config_parses() {
        let path = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/kubernetes/configmap.yaml"
        ));
        let yaml = std::fs::read_to_string(path).unwrap();
        let (_, body) = yaml.split_once("jitship.toml: |\n").unwrap();
        let toml: String = body
            .lines()
            .map(|l| l.strip_prefix("    ").unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n");
        let config = Config::parse(&toml, path).unwrap();
        assert_eq!(config.store.backend, Backend::Mooncake);
        assert_eq!(config.watch.metrics_addr.unwrap().port(), 9464);
        assert_eq!(config.trust.effective_mode(), TrustMode::Required);
        config.validate().unwrap();
    }

    #[test]
    fn trust_is_off_until_a_key_is_configured_and_required_needs_a_key() {
        let config = Config::parse("", Path::new("x.toml")).unwrap();
        assert_eq!(config.trust.effective_mode(), TrustMode::Off);
        let config = Config::parse(
            "[trust]\ntrusted_keys = ['ed25519:00']\n",
            Path::new("x.toml"),
        )
        .unwrap();
        assert_eq!(config.trust.effective_mode(), TrustMode::Required);
        // Parsing validates; a config built another way is checked by `validate`.
        let err = match Config::parse("[trust]\nmode = 'required'\n", Path::new("x.toml")) {
            Ok(config) => config.validate().unwrap_err().to_string(),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("jitship key generate"), "{err}");
        let err = Config::parse("[trust]\nmode = 'strict'\n", Path::new("x.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("strict"), "{err}");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_clear_errors() {
        let err = Config::parse("[store]\nbakend = 'local'\n", Path::new("x.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("bakend") && err.contains("x.toml"), "{err}");
        let err = Config::parse("[install]\ndeadline = 'soon'\n", Path::new("x.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("deadline"), "{err}");
        let err = Config::parse("[publish]\npack_size = '1KiB'\n", Path::new("x.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("at least"), "{err}");
        let err = Config::parse("[watch]\nrescan_interval = '0s'\n", Path::new("x.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("busy polling"), "{err}");
        let err = Config::parse("[watch]\nready_url = 'https://x/h'\n", Path::new("x.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("http://"), "{err}");
        let err = Config::parse("[watch]\nsettel = '1s'\n", Path::new("x.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("settel"), "{err}");
        assert!(parse_cache_arg("Tri ton=/x").is_err());
        assert!(parse_cache_arg("triton=").is_err());
        assert!(parse_cache_arg("triton:=/x").is_err());
        assert!(parse_fact_arg("=x").is_err());
        let err = Config::parse("[gather]\ntimeout = '0s'\n", Path::new("x.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("gather.timeout"), "{err}");
        let err = Config::parse("[gather]\npackages = ['torch>=2']\n", Path::new("x.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("torch>=2"), "{err}");
        let err = Config::parse("[policy]\nfuel = 5\n", Path::new("x.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("policy.fuel"), "{err}");
        let err = Config::parse("[policy]\nfule = 5\n", Path::new("x.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("fule"), "{err}");
    }

    #[test]
    fn cache_arg_takes_a_kind_an_optional_policy_and_an_optional_root() {
        let c = parse_cache_arg("triton=/c/triton").unwrap();
        assert_eq!(
            (c.kind.as_str(), c.root.as_path(), c.policy),
            ("triton", Path::new("/c/triton"), None)
        );
        let c = parse_cache_arg("inductor").unwrap();
        assert!(c.root_is_default() && c.policy.is_none());
        let c = parse_cache_arg("kernels:native=/data/k").unwrap();
        assert!(c.uses_native_policy() && c.policy_file().is_none());
        assert_eq!(c.root, Path::new("/data/k"));
        let c = parse_cache_arg("mine:/p/mine.wasm").unwrap();
        assert_eq!(c.policy_file(), Some(Path::new("/p/mine.wasm")));
        assert!(c.root_is_default() && !c.uses_native_policy());
    }

    /// An unknown kind is refused with the built-in kinds and the nearest one, unless the operator
    /// chose a policy module or the native rules; a missing root is left for `roots` to resolve.
    #[test]
    fn unknown_kinds_are_refused_with_the_builtins_and_the_nearest_name() {
        let parse = |t: &str| Config::parse(t, Path::new("x.toml"));
        for (kind, nearest) in [
            ("vllm", "vllm-compile"),
            ("flashinfer", "flashinfer-jit"),
            ("inducter", "inductor"),
            ("deep_gemm", "deepgemm"),
        ] {
            let err = parse(&format!("[[cache]]\nkind = '{kind}'\nroot = '/c'\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(&format!("did you mean {nearest:?}")), "{err}");
            for b in crate::policy::builtin::kinds() {
                assert!(err.contains(b), "{b} is not listed: {err}");
            }
            assert!(
                err.contains("policy = \"native\"") && err.contains(&format!("{kind}:native=ROOT")),
                "{err}"
            );
        }
        let err = parse("[[cache]]\nkind = 'zzzzzzzzzz'\nroot = '/c'\n")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("did you mean"), "{err}");
        let native = parse("[[cache]]\nkind = 'vllm'\nroot = '/c'\npolicy = 'native'\n").unwrap();
        assert!(native.caches[0].uses_native_policy());
        let module =
            parse("[[cache]]\nkind = 'vllm'\nroot = '/c'\npolicy = '/p/v.wasm'\n").unwrap();
        assert_eq!(module.caches[0].policy_file(), Some(Path::new("/p/v.wasm")));
        let default_root = parse("[[cache]]\nkind = 'inductor'\n").unwrap();
        assert!(default_root.caches[0].root_is_default());
        assert!(!toml::to_string(&default_root).unwrap().contains("root"));
    }

    #[test]
    fn policy_section_and_per_cache_policy_parse() {
        let text = "[policy]\nfuel = 2000000\ndeadline = '250ms'\nmemory = '16 MiB'\ncompile_cache = false\n\n\
                    [[cache]]\nkind = 'triton'\nroot = '/c'\npolicy = '/p/triton.wasm'\n";
        let config = Config::parse(text, Path::new("x.toml")).unwrap();
        assert_eq!(config.policy.fuel, 2_000_000);
        assert_eq!(config.policy.deadline, Duration::from_millis(250));
        assert_eq!(config.policy.memory, ByteSize::mib(16));
        assert!(!config.policy.compile_cache);
        assert_eq!(
            config.caches[0].policy.as_deref(),
            Some(Path::new("/p/triton.wasm"))
        );
    }

    #[test]
    fn gather_settings_parse_beside_the_facts_overrides() {
        let text = "[facts]\n\"model.id\" = \"m\"\n[gather]\npython = \"/venv/bin/python3\"\npackages = [\"xformers\"]\ntimeout = \"2s\"\n";
        let config = Config::parse(text, Path::new("x.toml")).unwrap();
        assert_eq!(config.facts.get("model.id").map(String::as_str), Some("m"));
        assert_eq!(
            config.gather.python.as_deref(),
            Some(Path::new("/venv/bin/python3"))
        );
        assert_eq!(config.gather.packages, vec!["xformers".to_string()]);
        assert_eq!(config.gather.timeout, Duration::from_secs(2));
        assert_eq!(
            config.gather.nvml_library,
            PathBuf::from("libnvidia-ml.so.1")
        );
    }

    #[test]
    fn example_mooncake_section_parses_when_uncommented() {
        let path = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/jitship.toml"
        ));
        let text = std::fs::read_to_string(path).unwrap();
        let mut inside = false;
        let mut out = String::new();
        for line in text.lines() {
            if line == "# [store.mooncake]" {
                inside = true;
            } else if line.trim().is_empty() {
                inside = false;
            }
            let body = line.strip_prefix("# ").unwrap_or(line);
            let setting = body.starts_with('[')
                || body
                    .split_once(" = ")
                    .is_some_and(|(k, _)| !k.contains(' '));
            out.push_str(if inside && setting { body } else { line });
            out.push('\n');
        }
        let out = out.replace("backend = \"local\"", "backend = \"mooncake\"");
        assert!(
            out.contains("\n[store.mooncake]\n") && out.contains("\nrdma_devices = "),
            "the example has no mooncake section"
        );
        let config = Config::parse(&out, path).unwrap();
        assert_eq!(config.store.backend, Backend::Mooncake);
        assert_eq!(
            config.store.mooncake.library_path().unwrap(),
            PathBuf::from("/opt/mooncake/lib/libmooncake_store.so")
        );
    }

    #[test]
    fn mooncake_section_parses_validates_and_store_arg_selects_it() {
        let text = "[store]\nbackend = 'mooncake'\n[store.mooncake]\nmaster = '10.0.0.5:50051'\nprotocol = 'rdma'\n\
                    rdma_devices = ['mlx5_0', 'mlx5_1']\nreplicas = 2\nsoft_pin = true\nstaging_buffer_size = '128 MiB'\n\
                    call_timeout = '5s'\n";
        let c = Config::parse(text, Path::new("x.toml")).unwrap();
        assert_eq!(c.store.backend, Backend::Mooncake);
        assert_eq!(c.store.mooncake.master, "10.0.0.5:50051");
        assert_eq!(c.store.mooncake.protocol, MooncakeProtocol::Rdma);
        assert_eq!(c.store.mooncake.replicas, 2);
        assert_eq!(c.store.mooncake.call_timeout, Duration::from_secs(5));
        assert_eq!(
            c.store.mooncake.staging_buffers, 4,
            "unset fields take their defaults"
        );

        let bad = |t: &str| {
            Config::parse(
                &format!("[store]\nbackend = 'mooncake'\n[store.mooncake]\n{t}\n"),
                Path::new("x.toml"),
            )
            .unwrap_err()
            .to_string()
        };
        assert!(bad("mastr = 'x:1'").contains("mastr"));
        assert!(bad("master = 'nohost'").contains("HOST:PORT"));
        assert!(bad("master = 'h:0'").contains("HOST:PORT"));
        assert!(bad("protocol = 'udp'").contains("protocol"));
        assert!(bad("replicas = 0").contains("replicas"));
        assert!(bad("staging_buffers = 0").contains("staging_buffers"));
        assert!(bad("call_timeout = '0s'").contains("call_timeout"));
        assert!(bad("metadata_server = 'localhost:8080'").contains("metadata_server"));
        let err = Config::parse(
            "[store]\nbackend = 'mooncake'\n[store.mooncake]\nstaging_buffer_size = '32 MiB'\n[publish]\npack_size = '64 MiB'\n",
            Path::new("x.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("pack_size") && err.contains("staging_buffer_size"),
            "{err}"
        );

        let mut store = StoreConfig::default();
        apply_store_arg(&mut store, "mooncake").unwrap();
        assert_eq!(store.backend, Backend::Mooncake);
        assert_eq!(store.mooncake.master, "127.0.0.1:50051");
        apply_store_arg(&mut store, "mooncake:master.svc:6000").unwrap();
        assert_eq!(store.mooncake.master, "master.svc:6000");
        assert!(apply_store_arg(&mut store, "mooncake:").is_err());
        assert!(apply_store_arg(&mut store, "mooncake:host").is_err());
        assert!(apply_store_arg(&mut store, "redis:host:1").is_err());
    }
}
