//! The store, key layout, facts and per-cache policies one command works with.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};

use super::args::{PolicySandboxArgs, SettingsArgs};
use crate::config::{CacheConfig, Config};
use crate::facts::{Facts, FactsConfig};
use crate::generation::Producer;
use crate::policy::CachePolicy;
use crate::policy::set::PolicySet;
use crate::publish::PublishOptions;
use crate::roots::{ProcessEnv, RootOrigin};
use crate::store::{KeyLayout, Store};
use crate::trust::{PublishTrust, PublisherKey, TrustPolicy};

/// The store, key layout, facts and per-cache policies one command works with.
pub(crate) struct Session {
    pub(crate) config: Config,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) layout: KeyLayout,
    pub(crate) facts: Facts,
    pub(crate) policies: PolicySet,
    pub(crate) trust: Arc<TrustPolicy>,
    /// Where each of `config.caches`' roots came from (same order); empty until `open` resolves.
    pub(crate) root_origins: Vec<RootOrigin>,
}

impl Session {
    pub(crate) fn open(settings: &SettingsArgs) -> Result<Self> {
        let config = settings.resolve()?;
        if config.caches.is_empty() {
            bail!(
                "no cache roots configured: pass --cache KIND[=ROOT] (e.g. --cache triton, or --cache triton=$HOME/.triton/cache) or add [[cache]] to the config file"
            );
        }
        // Keys are built from gathered facts (GPU, driver, Python, packages) with the config's
        // [facts] and the --fact flags (already merged into it) on top. Gathering runs probes
        // (python, nvidia-smi) that take about as long as connecting to Mooncake: side by side.
        let facts_config = FactsConfig::from_process(&config, &Default::default());
        let (gathered, session) = std::thread::scope(|s| {
            let gathering = s.spawn(|| crate::facts::gather(&facts_config));
            let session = Self::open_with(config);
            (gathering.join(), session)
        });
        let mut session = session?;
        session.root_origins = crate::roots::resolve_cache_roots(
            &mut session.config.caches,
            &session.policies,
            &ProcessEnv::from_process(),
        )?;
        let gathered = gathered.map_err(|_| anyhow::anyhow!("gathering facts panicked"))?;
        for (name, why) in &gathered.missing {
            tracing::debug!(fact = %name, "fact missing: {why}");
        }
        session.facts = gathered.facts;
        Ok(session)
    }

    /// For commands that need the store only (ls, inspect, verify, pin, gc).
    pub(crate) fn open_store(settings: &SettingsArgs) -> Result<Self> {
        Self::open_with(settings.resolve()?)
    }

    fn open_with(config: Config) -> Result<Self> {
        let store = crate::store::open(&config.store)
            .with_context(|| format!("opening the {:?} store", config.store.backend))?;
        let layout = KeyLayout::new(&config.store.namespace)?;
        let mut facts = Facts::new();
        facts.merge(&config.facts);
        // A policy that fails to load disables its own kind (reported by publish/install through
        // the policy's errors); only an unusable wasm engine stops the command.
        let policies = PolicySet::from_config(&config)?;
        let trust = Arc::new(TrustPolicy::from_config(&config.trust)?);
        Ok(Self {
            config,
            store,
            layout,
            facts,
            policies,
            trust,
            root_origins: Vec::new(),
        })
    }

    /// Where `cache`'s root came from, as `open` resolved it.
    pub(crate) fn root_origin(&self, cache: &CacheConfig) -> String {
        self.config
            .caches
            .iter()
            .position(|c| c.kind == cache.kind)
            .and_then(|i| self.root_origins.get(i))
            .map_or_else(String::new, ToString::to_string)
    }

    pub(crate) fn policy(&self, cache: &CacheConfig) -> Arc<dyn CachePolicy> {
        self.policies.policy(&cache.kind)
    }

    /// The policy for a cache kind found in the store (gc): the configured one, or the kind's
    /// built-in policy when this host does not configure that kind.
    pub(crate) fn policy_for_kind(&self, kind: &str) -> Arc<dyn CachePolicy> {
        if self.config.caches.iter().any(|c| c.kind == kind) {
            return self.policies.policy(kind);
        }
        let mut config = self.config.clone();
        // A kind jitship has no built-in policy for was published under the native rules (or a
        // module this host does not have): their retention is the generic default.
        let builtin = crate::policy::builtin::kinds().any(|k| k == kind);
        config.caches = vec![CacheConfig {
            kind: kind.to_owned(),
            root: PathBuf::new(),
            policy: (!builtin).then(|| crate::config::NATIVE_POLICY.into()),
        }];
        match PolicySet::from_config(&config) {
            Ok(set) => set.policy(kind),
            // The set of the configured kinds answers with a disabled policy, whose retain fails:
            // gc then keeps everything of that kind.
            Err(_) => self.policies.policy(kind),
        }
    }
}

impl Session {
    /// The signing key (if configured) and the trust a publisher builds with.
    fn publish_trust(&self) -> Result<PublishTrust> {
        let signing_key = match &self.config.trust.signing_key_file {
            Some(path) => {
                let key = PublisherKey::load(path)?;
                if self.trust.mode() != crate::config::TrustMode::Off
                    && !self.trust.trusted_key_ids().contains(&key.key_id())
                {
                    tracing::warn!(
                        key_id = key.key_id(),
                        "the signing key is not among this host's trusted keys: its own generations will not be parents of its next publishes"
                    );
                }
                Some(Arc::new(key))
            }
            None => None,
        };
        Ok(PublishTrust {
            signing_key,
            policy: self.trust.clone(),
        })
    }

    pub(crate) fn publish_options(
        &self,
        pack_size: Option<bytesize::ByteSize>,
        pod: Option<&String>,
    ) -> Result<PublishOptions> {
        Ok(PublishOptions {
            pack_size: pack_size.unwrap_or(self.config.publish.pack_size).as_u64(),
            producer: Producer {
                host: gethostname::gethostname().to_string_lossy().into_owned(),
                pod: pod.cloned().or_else(|| self.config.publish.pod.clone()),
                jitship_version: env!("CARGO_PKG_VERSION").into(),
            },
            facts: self.facts.clone(),
            max_head_attempts: 16,
            trust: self.publish_trust()?,
        })
    }
}

impl PolicySandboxArgs {
    pub(crate) fn engine(&self) -> Result<Arc<crate::policy::host::PolicyEngine>> {
        let mut config = match &self.config {
            Some(path) => Config::load(path)?,
            // An author's one-shot run: compiling (~0.1 s) beats touching a system cache directory.
            None => Config {
                policy: crate::config::PolicyConfig {
                    compile_cache: false,
                    ..Default::default()
                },
                ..Config::default()
            },
        };
        if self.no_compile_cache {
            config.policy.compile_cache = false;
        }
        Ok(crate::policy::host::PolicyEngine::new(&config.policy)?)
    }
}
