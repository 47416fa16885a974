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
    pub watch: WatchConfig,
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
            crate::watch::ready::ReadyUrl::parse(url).map_err(|e| ConfigError::Invalid {
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
        if self.publish.pack_size.as_u64() < 4096 {
            return Err(ConfigError::Invalid {
                what: "publish.pack_size",
                value: self.publish.pack_size.to_string(),
                hint: "must be at least 4 KiB".into(),
            });
        }
        self.watch.validate()?;
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
        assert!(parse_cache_arg("triton").is_err());
        assert!(parse_cache_arg("Tri ton=/x").is_err());
        assert!(parse_fact_arg("=x").is_err());
    }
}
