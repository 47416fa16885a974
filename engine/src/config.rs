//! Configuration: a TOML file (`--config`, `JITSHIP_CONFIG`), overridden by `JITSHIP_*` environment
//! variables, overridden by flags. Everything jitship does is decided here, explicitly: nothing is
//! read from or written to the process environment behind the operator's back (Mooncake included).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

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
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    pub backend: Backend,
    /// Prefix of every key jitship writes; separate deployments may share a store.
    pub namespace: String,
    pub local: LocalStoreConfig,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            backend: Backend::Local,
            namespace: "jitship".into(),
            local: LocalStoreConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Local,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocalStoreConfig {
    pub path: PathBuf,
}

impl Default for LocalStoreConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("/var/lib/jitship/store"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    /// Cache kind ("triton", "inductor", ...): selects the built-in policy of that name.
    pub kind: String,
    pub root: PathBuf,
    /// A policy component (`.wasm`, built with `jitship policy build`) to use instead of the
    /// built-in one for this kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PathBuf>,
}

/// `[gather]`: the settings of fact gathering (see the `facts` module for the facts themselves).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatherConfig {
    /// The inference engine's interpreter (e.g. a venv's `bin/python3`); default `python3` on PATH.
    pub python: Option<PathBuf>,
    /// Site-packages directories to read package versions from, instead of asking the interpreter.
    pub site_packages: Vec<PathBuf>,
    /// Distributions whose versions become `pkg.*` facts, beyond the built-in list.
    pub packages: Vec<String>,
    /// The engine's configuration file; its blake3 becomes `engine.config_digest`.
    pub engine_config: Option<PathBuf>,
    /// NVML, loaded at run time.
    pub nvml_library: PathBuf,
    /// The NVIDIA kernel module's version file (driver version when NVML and nvidia-smi fail).
    pub driver_version_file: PathBuf,
    /// Bound on each external program (nvidia-smi, nvcc, python) and on NVML.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for GatherConfig {
    fn default() -> Self {
        Self {
            python: None,
            site_packages: Vec::new(),
            packages: Vec::new(),
            engine_config: None,
            nvml_library: PathBuf::from("libnvidia-ml.so.1"),
            driver_version_file: PathBuf::from("/proc/driver/nvidia/version"),
            timeout: Duration::from_secs(5),
        }
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

/// The sandbox every policy runs in (research/wasm-plugins.md §3.7). Each call gets a fresh instance
/// with these budgets; a policy that exceeds one is stopped with a typed error and its cache kind is
/// disabled, nothing else.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Deterministic CPU budget per call, in wasmtime fuel units (about one per wasm instruction).
    /// A 200-entry select uses about 1.5 million.
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
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            fuel: 1_000_000_000,
            deadline: Duration::from_secs(5),
            memory: ByteSize::mib(64),
            read_budget: ByteSize::mib(16),
            compile_cache: true,
            cache_dir: PathBuf::from("/var/cache/jitship/policy"),
        }
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
        if self.publish.pack_size.as_u64() < 4096 {
            return Err(ConfigError::Invalid {
                what: "publish.pack_size",
                value: self.publish.pack_size.to_string(),
                hint: "must be at least 4 KiB".into(),
            });
        }
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
        let mut kinds = std::collections::HashSet::new();
        for c in &self.caches {
            parse_kind(&c.kind)?;
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

/// `KIND=ROOT`, as given to `--cache`.
pub fn parse_cache_arg(s: &str) -> Result<CacheConfig, ConfigError> {
    let (kind, root) = s.split_once('=').ok_or_else(|| ConfigError::Invalid {
        what: "--cache",
        value: s.into(),
        hint: "expected KIND=ROOT, e.g. triton=/root/.triton/cache".into(),
    })?;
    parse_kind(kind)?;
    if root.is_empty() {
        return Err(ConfigError::Invalid {
            what: "--cache",
            value: s.into(),
            hint: "the root is empty".into(),
        });
    }
    Ok(CacheConfig {
        kind: kind.into(),
        root: PathBuf::from(root),
        policy: None,
    })
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

/// `local:DIR`, as given to `--store`.
pub fn apply_store_arg(store: &mut StoreConfig, s: &str) -> Result<(), ConfigError> {
    match s.split_once(':') {
        Some(("local", dir)) if !dir.is_empty() => {
            store.backend = Backend::Local;
            store.local.path = PathBuf::from(dir);
            Ok(())
        }
        _ => Err(ConfigError::Invalid {
            what: "--store",
            value: s.into(),
            hint: "expected local:DIR".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_config_parses() {
        let path = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/jitship.toml"
        ));
        let config = Config::load(path).unwrap();
        assert!(!config.caches.is_empty());
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
        assert!(parse_cache_arg("triton").is_err());
        assert!(parse_cache_arg("Tri ton=/x").is_err());
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
}
