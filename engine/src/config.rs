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
    pub publish: PublishConfig,
    pub install: InstallConfig,
    pub retention: RetentionConfig,
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
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            max_generations: None,
            max_bytes: None,
            max_age: None,
            grace: Duration::from_secs(3600),
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
        if self.retention.max_generations == Some(0) {
            return Err(ConfigError::Invalid {
                what: "retention.max_generations",
                value: "0".into(),
                hint: "must be at least 1 (the newest generation is always kept)".into(),
            });
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
    }
}
