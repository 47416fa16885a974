//! The store, key layout, facts and per-cache policies one command works with.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, Result, bail};

use super::args::{PolicySandboxArgs, SettingsArgs, StoreArgs};
use super::output::{self, ErrorRecord, Stage};
use crate::catalog::KeyLayout;
use crate::config::{Backend, CacheConfig, Config, StoreConfig};
use crate::facts::{AppliedOverride, Facts, FactsConfig};
use crate::generation::Producer;
use crate::oci::Registry;
use crate::policies::PolicySet;
use crate::policy::CachePolicy;
use crate::publish::PublishOptions;
use crate::roots::{ProcessEnv, RootOrigin};
use crate::store::Store;
use crate::trust::{PublishTrust, PublisherKey, TrustPolicy};

/// The facts one cache's key is built from (the command-wide overrides and its own on top of
/// what was gathered, `FactOverrides::layers`), and the facts its own overrides decide, with the
/// layer that set each, for its report (`FactOverrides::own`).
#[derive(Debug, Clone, Default)]
pub(crate) struct CacheFacts {
    pub(crate) facts: Facts,
    pub(crate) own_overrides: BTreeMap<String, AppliedOverride>,
    /// Facts missing for want of a Python interpreter, and why (`Gathered::ungathered`).
    pub(crate) ungathered: BTreeMap<String, String>,
}

/// What working on one cache needs: the store and the kind's policy.
pub(crate) type StoreAndPolicy = (Arc<dyn Store>, Arc<dyn CachePolicy>);
/// The store, key layout, facts and per-cache policies one command works with: the store and
/// the policy set present (`Session`, the store commands and `watch`), or each possibly missing
/// with the reason ([`CacheSession`]: publish and install report it per cache).
pub(crate) struct Session<S = Arc<dyn Store>, P = Arc<PolicySet>> {
    pub(crate) config: Config,
    pub(crate) store: S,
    pub(crate) layout: KeyLayout,
    /// The command-wide facts (no cache's own overrides).
    pub(crate) facts: Facts,
    /// Each configured cache's own facts, by kind (empty for the store commands).
    pub(crate) cache_facts: BTreeMap<String, CacheFacts>,
    pub(crate) policies: P,
    pub(crate) trust: Arc<TrustPolicy>,
    /// Where each of `config.caches`' roots came from (same order); empty for the store commands,
    /// and when the policies could not start (every cache then fails with that reason).
    pub(crate) root_origins: Vec<RootOrigin>,
    /// The durable registry tier (`[store.durable] registry`), if one is configured.
    pub(crate) registry: Option<Arc<Registry>>,
}

/// What publish, install and watch work with: a session whose store and policies may be missing,
/// each with the reason; only a configuration error (flags, config file, trust settings, a root
/// that cannot be resolved) stops the command.
pub(crate) type CacheSession =
    Session<Result<Arc<dyn Store>, SharedFailure>, Result<Arc<PolicySet>, SharedFailure>>;

/// Why every cache of a command fails before its own work starts (an unreachable store, an
/// unusable policy engine): kept, cloned into each cache's report, instead of failing the command.
#[derive(Clone)]
pub(crate) struct SharedFailure {
    pub(crate) stage: Stage,
    pub(crate) error: Arc<anyhow::Error>,
}

impl SharedFailure {
    pub(crate) fn record(&self, cache_kind: &str) -> ErrorRecord {
        ErrorRecord::new(Some(cache_kind), self.stage, &self.error)
    }

    pub(crate) fn one_line(&self) -> String {
        output::one_line(&self.error)
    }
}

/// "local store at /var/lib/jitship/store", "Mooncake store (master 10.0.0.1:50051)".
pub(crate) fn describe_store(config: &StoreConfig) -> String {
    let fast = match config.backend {
        Backend::Local => format!("local store at {}", config.local.path.display()),
        Backend::Mooncake => format!("Mooncake store (master {})", config.mooncake.master),
    };
    match (&config.durable.path, &config.durable.registry) {
        (Some(dir), _) => format!("{fast} over the durable tier at {}", dir.display()),
        (None, Some(registry)) => format!("{fast} over the durable registry tier {registry}"),
        (None, None) => fast,
    }
}

/// The durable registry tier `config` names, if any (nothing is connected to yet).
fn open_registry(config: &StoreConfig) -> Result<Option<Arc<Registry>>> {
    if config.durable.registry.is_none() {
        return Ok(None);
    }
    Registry::open(&config.durable)
        .map(|r| Some(Arc::new(r)))
        .context("opening the durable registry tier ([store.durable] registry)")
}

/// The store settings `store::open` takes: the durable registry tier is not a `Store` and
/// `store::open` refuses it; the session opens it beside the store (`open_registry`).
fn without_registry(config: &StoreConfig) -> StoreConfig {
    let mut config = config.clone();
    config.durable.registry = None;
    config
}

fn open_store(config: &StoreConfig) -> Result<Arc<dyn Store>> {
    crate::store::open(&without_registry(config))
        .with_context(|| format!("opening the {}", describe_store(config)))
}

/// [`open_store`] for a command that only reads: a local store directory is opened only if it
/// exists (never created, nothing removed); Mooncake as always.
fn open_existing_store(config: &StoreConfig) -> Result<Arc<dyn Store>> {
    use crate::store::LocalStore;
    let fast: Arc<dyn Store> = match config.backend {
        Backend::Local => LocalStore::open_existing(&config.local.path)
            .map(|s| Arc::new(s) as Arc<dyn Store>)
            .with_context(|| format!("opening the {}", describe_store(config)))?,
        Backend::Mooncake => crate::store::MooncakeStore::connect(&config.mooncake)
            .map(|s| Arc::new(s) as Arc<dyn Store>)
            .with_context(|| format!("opening the {}", describe_store(config)))?,
    };
    crate::store::with_durable_tier(fast, &without_registry(config), |dir| {
        LocalStore::open_existing(dir)
    })
    .with_context(|| format!("opening the {}", describe_store(config)))
}

/// Opening the store failed in a way that may pass by itself: a master, node or metadata server
/// down, a timeout, a directory that cannot be reached yet.
fn may_pass(e: &anyhow::Error) -> bool {
    use crate::store::StoreError;
    e.chain()
        .filter_map(|c| c.downcast_ref::<StoreError>())
        .any(|e| e.is_transient() || matches!(e, StoreError::Io { .. }))
}

/// The store of a `watch` session started before its store answered: every call fails with why
/// (the watcher never calls it; it connects through `StoreSource::Connect`).
#[derive(Debug)]
struct NotConnected {
    what: String,
    why: String,
}

impl NotConnected {
    fn err(&self) -> crate::store::StoreError {
        crate::store::StoreError::Unavailable(format!("{} not connected: {}", self.what, self.why))
    }
}

impl Store for NotConnected {
    fn describe(&self) -> String {
        format!("{} (not connected)", self.what)
    }
    fn max_value_size(&self) -> u64 {
        0
    }
    fn put(&self, _: &str, _: &[u8], _: crate::store::ValueClass) -> crate::store::StoreResult<()> {
        Err(self.err())
    }
    fn get(&self, _: &str) -> crate::store::StoreResult<Option<Vec<u8>>> {
        Err(self.err())
    }
    fn exists(&self, _: &str) -> crate::store::StoreResult<bool> {
        Err(self.err())
    }
    fn remove(&self, _: &str) -> crate::store::StoreResult<bool> {
        Err(self.err())
    }
}

impl CacheSession {
    pub(crate) fn open(settings: &SettingsArgs) -> Result<Self> {
        Self::open_resolved(settings.resolve()?)
    }

    /// [`open`](Self::open) with the settings already resolved (install reads its deadline
    /// first, to bound the opening by it).
    pub(crate) fn open_resolved(mut config: Config) -> Result<Self> {
        if config.caches.is_empty() {
            bail!(
                "no cache roots configured: pass --cache KIND[=ROOT] (e.g. --cache triton, or --cache triton=$HOME/.triton/cache) or add [[cache]] to the config file"
            );
        }
        let layout = KeyLayout::new(&config.store.namespace)?
            .with_pack_replicas(config.publish.pack_replicas);
        let trust = Arc::new(TrustPolicy::from_config(&config.trust)?);
        let registry = open_registry(&config.store)?;
        // Keys are built from gathered facts (GPU, driver, Python, packages) with the overrides
        // on top, each cache's own set (FactOverrides::layers). Gathering runs probes (python,
        // nvidia-smi) that take about as long as connecting to Mooncake: side by side.
        let overrides = config.fact_overrides();
        let facts_config = FactsConfig::from_process(&config.gather, &overrides);
        let (gathered, store, policies) = std::thread::scope(|s| {
            let gathering = s.spawn(|| {
                let t = std::time::Instant::now();
                let gathered = crate::facts::probe(&facts_config);
                tracing::debug!(ms = t.elapsed().as_millis() as u64, "facts gathered");
                gathered
            });
            let t = std::time::Instant::now();
            let store = open_store(&config.store).map_err(|e| SharedFailure {
                stage: Stage::Store,
                error: Arc::new(e),
            });
            tracing::debug!(ms = t.elapsed().as_millis() as u64, "store opened");
            let t = std::time::Instant::now();
            // A policy that fails to load disables only its own kind (its calls fail with the
            // reason); an unusable wasm engine fails every kind.
            let policies =
                PolicySet::from_config(&config)
                    .map(Arc::new)
                    .map_err(|e| SharedFailure {
                        stage: Stage::Policy,
                        error: Arc::new(
                            anyhow::Error::new(e).context("starting the policy engine"),
                        ),
                    });
            tracing::debug!(ms = t.elapsed().as_millis() as u64, "policies loaded");
            (gathering.join(), store, policies)
        });
        // The environment the engine's own process resolves its caches in (SGLang moves them).
        let env = crate::engines::engine_env(config.engine, ProcessEnv::from_process());
        let mut root_origins = match &policies {
            Ok(policies) => crate::roots::resolve_cache_roots(&mut config.caches, policies, &env)?,
            Err(_) => Vec::new(),
        };
        let probed = gathered.map_err(|_| anyhow::anyhow!("gathering facts panicked"))?;
        let gathered = probed.with_overrides(&facts_config.overrides);
        // --engine: of its candidate caches, those it reads on this machine in this environment.
        if let Some(chosen) =
            crate::engines::keep_read_caches(&mut config, &mut root_origins, &env, &gathered.facts)
        {
            tracing::info!("--engine {}", chosen.why);
        }
        for (name, why) in &gathered.missing {
            tracing::debug!(fact = %name, why = %why, "fact missing");
        }
        let cache_facts = cache_facts(&config, &probed);
        Ok(Self {
            config,
            layout,
            facts: gathered.facts,
            cache_facts,
            store,
            policies,
            trust,
            root_origins,
            registry,
        })
    }

    /// The store and policy for `cache`, or why the cache cannot be worked on.
    pub(crate) fn ready(&self, cache: &CacheConfig) -> Result<StoreAndPolicy, SharedFailure> {
        let store = self.store.clone()?;
        let policies = self.policies.as_ref().map_err(Clone::clone)?;
        let policy = policies.policy(&cache.kind);
        Ok((
            store,
            crate::engines::keyed_explained(
                self.config.engine,
                &cache.kind,
                policy,
                &self.facts_of(cache).ungathered,
            ),
        ))
    }

    /// [`ready`](Self::ready) for every cache, in order, and the session's own reference to the
    /// store let go: each install then holds the only ones, drops its own as soon as it has read
    /// what it needs, and the last to do so starts the Mooncake client's teardown while files
    /// are still being compared or moved, so the command does not wait for it at exit.
    pub(crate) fn ready_each(&mut self) -> Vec<Result<StoreAndPolicy, SharedFailure>> {
        let ready = self.config.caches.iter().map(|c| self.ready(c)).collect();
        if self.store.is_ok() {
            self.store = Err(SharedFailure {
                stage: Stage::Store,
                error: Arc::new(anyhow::anyhow!("the store was handed to the caches")),
            });
        }
        ready
    }

    /// Everything present, or the first reason it is not (watch needs all of it to start).
    pub(crate) fn into_session(self) -> Result<Session> {
        let unwrap = |f: SharedFailure| anyhow::anyhow!(f.one_line());
        Ok(Session {
            store: self.store.map_err(unwrap)?,
            policies: self.policies.map_err(unwrap)?,
            config: self.config,
            layout: self.layout,
            facts: self.facts,
            cache_facts: self.cache_facts,
            trust: self.trust,
            root_origins: self.root_origins,
            registry: self.registry,
        })
    }

    /// [`into_session`](Self::into_session) for `watch`, which waits for a store that does not
    /// answer yet (a Mooncake master starting after its sidecars, a durable directory not mounted
    /// yet) instead of exiting: the session's store then refuses every call, and the watcher
    /// connects through the returned source once the store answers. Any other failure to open
    /// the store (a missing library, a bad setting) still stops the command.
    pub(crate) fn into_watch_session(mut self) -> Result<(Session, crate::watch::StoreSource)> {
        let waits = match &self.store {
            Ok(_) => None,
            Err(f) if f.stage == Stage::Store && may_pass(&f.error) => Some(f.one_line()),
            Err(_) => None,
        };
        let Some(why) = waits else {
            let session = self.into_session()?;
            let source = crate::watch::StoreSource::Open(session.store.clone());
            return Ok((session, source));
        };
        let config = self.config.store.clone();
        tracing::warn!(error = %why, "the store does not answer: watching the caches, publishing once it does");
        self.store = Ok(Arc::new(NotConnected {
            what: describe_store(&config),
            why: why.clone(),
        }));
        let connect: crate::watch::Connect =
            Arc::new(move || open_store(&config).map_err(|e| output::one_line(&e)));
        Ok((
            self.into_session()?,
            crate::watch::StoreSource::Connect { connect, why },
        ))
    }
}

impl Session {
    /// For commands that need the store only and write to it (pin, unpin, gc, verify --repair):
    /// a local store directory is created if missing.
    pub(crate) fn open_store(args: &StoreArgs) -> Result<Self> {
        Self::open_store_with(args, open_store)
    }

    /// For commands that only read the store (ls, inspect, verify): a local store directory that
    /// does not exist is an error naming it, and nothing is created.
    pub(crate) fn open_store_read_only(args: &StoreArgs) -> Result<Self> {
        Self::open_store_with(args, open_existing_store)
    }

    /// [`open_store`](Self::open_store) with the configuration already resolved (gc adds its
    /// caches).
    pub(crate) fn open_store_config(config: Config) -> Result<Self> {
        Self::open_config_with(config, open_store)
    }

    fn open_store_with(
        args: &StoreArgs,
        open: fn(&StoreConfig) -> Result<Arc<dyn Store>>,
    ) -> Result<Self> {
        Self::open_config_with(args.resolve()?, open)
    }

    fn open_config_with(
        config: Config,
        open: fn(&StoreConfig) -> Result<Arc<dyn Store>>,
    ) -> Result<Self> {
        let store = open(&config.store)?;
        let layout = KeyLayout::new(&config.store.namespace)?
            .with_pack_replicas(config.publish.pack_replicas);
        let mut facts = Facts::new();
        facts.merge(&config.facts);
        // gc asks the policies of the kinds it finds (retain); a kind whose policy cannot load
        // keeps everything.
        let policies = Arc::new(PolicySet::from_config(&config)?);
        let trust = Arc::new(TrustPolicy::from_config(&config.trust)?);
        let registry = open_registry(&config.store)?;
        Ok(Self {
            config,
            store,
            layout,
            facts,
            cache_facts: BTreeMap::new(),
            policies,
            trust,
            root_origins: Vec::new(),
            registry,
        })
    }

    /// `cache`'s policy, keyed as its engine keys it.
    pub(crate) fn policy(&self, cache: &CacheConfig) -> Arc<dyn CachePolicy> {
        let policy = self.policies.policy(&cache.kind);
        crate::engines::keyed(self.config.engine, &cache.kind, policy)
    }
}

impl<S, P> Session<S, P> {
    /// Where `cache`'s root came from, as `CacheSession::open` resolved it ("" when it was not).
    pub(crate) fn root_origin(&self, cache: &CacheConfig) -> String {
        self.origin_of(cache)
            .map_or_else(String::new, ToString::to_string)
    }

    fn origin_of(&self, cache: &CacheConfig) -> Option<&RootOrigin> {
        let i = self
            .config
            .caches
            .iter()
            .position(|c| c.kind == cache.kind)?;
        self.root_origins.get(i)
    }

    /// Where `cache`'s root came from when `open` resolved it from the environment (`None` for a
    /// root given as such).
    pub(crate) fn resolved_origin(&self, cache: &CacheConfig) -> Option<String> {
        match self.origin_of(cache)? {
            RootOrigin::Given => None,
            origin => Some(origin.to_string()),
        }
    }

    /// The facts `cache`'s key is built from, and the overrides among them: every cache of the
    /// session's config has them (built with the session, whose caches never change kind).
    pub(crate) fn facts_of(&self, cache: &CacheConfig) -> &CacheFacts {
        self.cache_facts
            .get(&cache.kind)
            .expect("every configured cache has its facts")
    }

    /// Fails (a configuration error) when the signing key cannot be loaded.
    pub(crate) fn publish_options(
        &self,
        pack_size: Option<bytesize::ByteSize>,
        pod: Option<&String>,
    ) -> Result<PublishOptions> {
        let mut opts = publish_options(&self.config, &self.facts, &self.trust, pack_size, pod)?;
        opts.registry = self.registry.clone();
        Ok(opts)
    }
}

/// Each configured cache's facts: `probed` (what the machine says) with the overrides that apply
/// to that cache layered on it, so that one cache's overrides never reach another's key.
fn cache_facts(config: &Config, probed: &crate::facts::Gathered) -> BTreeMap<String, CacheFacts> {
    let overrides = config.fact_overrides();
    config
        .caches
        .iter()
        .map(|cache| {
            let kind = Some(cache.kind.as_str());
            let gathered = probed.with_overrides(&overrides.layers(kind));
            let facts = CacheFacts {
                ungathered: gathered.ungathered(),
                facts: gathered.facts,
                own_overrides: overrides.own(&cache.kind),
            };
            (cache.kind.clone(), facts)
        })
        .collect()
}

/// The signing key (if configured) and the trust a publisher builds with.
fn publish_trust(config: &Config, trust: &Arc<TrustPolicy>) -> Result<PublishTrust> {
    let Some(path) = &config.trust.signing_key_file else {
        return Ok(PublishTrust::new(None, trust.clone()));
    };
    let key = PublisherKey::load(path)?;
    if trust.mode() != crate::config::TrustMode::Required {
        tracing::info!(
            key_id = key.key_id(),
            mode = trust.mode().as_str(),
            "a signing publisher builds only on heads signed by its own or a trusted key (trust required for publishing)"
        );
    }
    Ok(PublishTrust::new(Some(Arc::new(key)), trust.clone()))
}

fn publish_options(
    config: &Config,
    facts: &Facts,
    trust: &Arc<TrustPolicy>,
    pack_size: Option<bytesize::ByteSize>,
    pod: Option<&String>,
) -> Result<PublishOptions> {
    Ok(PublishOptions {
        pack_size: pack_size.unwrap_or(config.publish.pack_size).as_u64(),
        producer: Producer {
            host: gethostname::gethostname().to_string_lossy().into_owned(),
            pod: pod.cloned().or_else(|| config.publish.pod.clone()),
            jitship_version: env!("CARGO_PKG_VERSION").into(),
        },
        facts: facts.clone(),
        max_head_attempts: 64,
        trust: publish_trust(config, trust)?,
        interrupt: Default::default(),
        registry: None,
    })
}

impl PolicySandboxArgs {
    pub(crate) fn engine(&self) -> Result<Arc<crate::policy::host::PolicyEngine>> {
        let mut config = match &self.config.config {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `store::open` refuses a durable registry tier rather than dropping it; the session opens
    /// the registry beside the store and the store without it.
    #[test]
    fn a_durable_registry_is_refused_by_store_open_and_opened_beside_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = StoreConfig::default();
        config.local.path = dir.path().join("store");
        config.durable.registry = Some("registry.example.com/jitship/cache".into());
        let Err(e) = crate::store::open(&config) else {
            panic!("store::open took a durable registry");
        };
        assert!(e.to_string().contains("[store.durable] registry"), "{e}");
        assert!(open_store(&config).is_ok());
        assert!(open_registry(&config).unwrap().is_some());
    }
}
