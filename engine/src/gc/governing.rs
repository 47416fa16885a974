//! Which policy governs a compat id's retention: the one its newest generation was published with
//! (`Manifest.policy`), found by digest, never another rule in its place. See the module docs of
//! `gc` for the rule, including the built-in upgrade.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use serde::Serialize;

use crate::catalog::KeyLayout;
use crate::catalog::modules::{self, ModuleRead};
use crate::config::Config;
use crate::generation::{ContentHash, PolicyRef};
use crate::policy::host::{PolicyConfig, PolicyEngine, WasmPolicy, describe};
use crate::policy::native::NativeRules;
use crate::policy::{CachePolicy, PolicySettings, builtin};
use crate::store::Store;

/// Where gc found the policy that decided a compat id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "type")]
pub enum PolicyOrigin {
    /// A module embedded in this jitship, the very one the key was published with.
    Builtin,
    /// Today's built-in of the recorded name: the key was published with an earlier built-in
    /// (`published_version`, whose digest nothing here has).
    BuiltinUpgraded { published_version: String },
    /// The module of a configured cache (`[[cache]] policy`, `--cache KIND:x.wasm`).
    ConfiguredCache { kind: String, path: PathBuf },
    /// A module of the modules directory (`[policy] modules_dir`, `--policy-dir`).
    ModulesDir { path: PathBuf },
    /// The module publish stored by its digest (`catalog::modules`), fetched from the store and
    /// checked against the digest.
    Store { key: String },
    /// jitship's native rules (recorded digest `native`).
    Native,
    /// Handed to `gc::collect` by its caller (tests, embedding).
    Given,
}

impl std::fmt::Display for PolicyOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Builtin => f.write_str("built-in"),
            Self::BuiltinUpgraded { published_version } => {
                write!(f, "built-in (published with version {published_version})")
            }
            Self::ConfiguredCache { kind, path } => {
                write!(f, "configured cache {kind} ({})", path.display())
            }
            Self::ModulesDir { path } => write!(f, "modules dir ({})", path.display()),
            Self::Store { key } => write!(f, "fetched from the store ({key})"),
            Self::Native => f.write_str("native rules"),
            Self::Given => f.write_str("given by the caller"),
        }
    }
}

/// The policy that decided a compat id, as the report shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UsedPolicy {
    pub name: String,
    pub version: String,
    pub digest: String,
    pub found: PolicyOrigin,
    /// The settings it decided with: those recorded by the generation that decided (the newest
    /// readable one a trusted key signed, else the newest that counts; see `gc`).
    #[serde(skip_serializing_if = "PolicySettings::is_empty")]
    pub settings: PolicySettings,
}

impl std::fmt::Display for UsedPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let digest: String = self.digest.chars().take(12).collect();
        match &self.found {
            PolicyOrigin::BuiltinUpgraded { published_version } => write!(
                f,
                "built-in {}@{} {digest} (published with version {published_version})",
                self.name, self.version
            )?,
            found => write!(f, "{}@{} {digest} ({found})", self.name, self.version)?,
        }
        if !self.settings.is_empty() {
            write!(f, " with settings {}", describe(&self.settings))?;
        }
        Ok(())
    }
}

/// The answer for one compat id: the policy to ask, or why gc has none (the key is kept whole).
pub enum Governing {
    Found {
        policy: Arc<dyn CachePolicy>,
        used: UsedPolicy,
    },
    Missing {
        reason: String,
    },
}

impl Governing {
    /// `policy`, found at `origin`, with what its reference says of it.
    fn found(policy: Arc<dyn CachePolicy>, origin: PolicyOrigin) -> Governing {
        let r = policy.policy_ref();
        Governing::Found {
            used: UsedPolicy {
                name: r.name,
                version: r.version,
                digest: r.digest,
                found: origin,
                settings: r.settings,
            },
            policy,
        }
    }
}

/// Finds the policy that governs a compat id of `kind` whose newest generation was published
/// with `recorded`.
pub trait PolicyFinder {
    fn governing(&self, kind: &str, recorded: &PolicyRef) -> Governing;
}

/// A caller's own choice of policy per kind (tests, embedding): used whatever was recorded.
impl<F> PolicyFinder for F
where
    F: Fn(&str) -> Arc<dyn CachePolicy>,
{
    fn governing(&self, kind: &str, _recorded: &PolicyRef) -> Governing {
        Governing::found(self(kind), PolicyOrigin::Given)
    }
}

/// What to tell the operator when a module is not at hand.
const GIVE_IT: &str = "give the module with --policy-dir DIR or [policy] modules_dir, or \
                       `[[cache]] policy` (--cache KIND:FILE.wasm)";

/// A module loaded (or why it does not load).
type Loaded = Result<Arc<WasmPolicy>, String>;

/// Candidate modules: where each is, and its bytes' digest once read.
struct Candidate {
    origin: PolicyOrigin,
    path: Option<PathBuf>,
    bytes: Option<&'static [u8]>,
}

/// The policies gc can find by digest: the built-ins, the modules of the configured caches and
/// those of a modules directory. Modules are hashed when first needed and loaded only when a
/// compat id's recorded digest names them; each is loaded once.
pub struct PolicyIndex {
    policy: PolicyConfig,
    /// Kinds whose configured cache names a module file.
    configured_modules: HashMap<String, PathBuf>,
    modules_dir: Option<PathBuf>,
    engine: OnceLock<Result<Arc<PolicyEngine>, String>>,
    /// Digest -> where it is (filled on first use).
    digests: OnceLock<HashMap<String, Candidate>>,
    /// Problems met while indexing (an unreadable modules dir or file), for the reasons.
    index_problems: OnceLock<Vec<String>>,
    loaded: Mutex<HashMap<String, Loaded>>,
    /// The store whose modules (`catalog::modules`) gc may fetch by digest.
    store: Option<(Arc<dyn Store>, KeyLayout)>,
    /// Digest -> the store's answer (fetched once).
    fetched: Mutex<HashMap<String, Fetched>>,
}

/// What the store held for a digest: a module loaded under its key, or why none.
#[derive(Clone)]
enum Fetched {
    Loaded { key: String, policy: Loaded },
    Missing,
    Refused(String),
}

impl PolicyIndex {
    /// From `config`: its caches' modules, its `[policy]` sandbox and `modules_dir`
    /// (`modules_dir` overrides the config's).
    pub fn new(config: &Config, modules_dir: Option<PathBuf>) -> Self {
        let configured_modules = config
            .caches
            .iter()
            .filter_map(|c| Some((c.kind.clone(), c.policy_file()?.to_path_buf())))
            .collect();
        Self {
            policy: config.policy.clone(),
            configured_modules,
            modules_dir: modules_dir.or_else(|| config.policy.modules_dir.clone()),
            engine: OnceLock::new(),
            digests: OnceLock::new(),
            index_problems: OnceLock::new(),
            loaded: Mutex::new(HashMap::new()),
            store: None,
            fetched: Mutex::new(HashMap::new()),
        }
    }

    /// Also fetches modules from `store` by digest, when nothing here has the recorded one (a
    /// module rebuilt or deleted since the publish). They run under the same sandbox limits as
    /// any other (`[policy]`), and only the digests gc asks for: those recorded by the generation
    /// that decides a key (under `required`, one a trusted key signed).
    pub fn with_store(mut self, store: Arc<dyn Store>, layout: KeyLayout) -> Self {
        self.store = Some((store, layout));
        self
    }

    /// The module of `digest` from the store, loaded (once per digest).
    fn fetch(&self, digest: &str) -> Fetched {
        let Some((store, layout)) = &self.store else {
            return Fetched::Missing;
        };
        let Ok(hash) = digest.parse::<ContentHash>() else {
            return Fetched::Missing;
        };
        let mut fetched = self.fetched.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(done) = fetched.get(digest) {
            return done.clone();
        }
        let key = layout.module(&hash);
        let answer = match modules::read_module(store.as_ref(), layout, &hash) {
            Ok(ModuleRead::Present(bytes)) => Fetched::Loaded {
                policy: self.engine().and_then(|engine| {
                    engine
                        .load(&bytes, &format!("store:{key}"))
                        .map(Arc::new)
                        .map_err(|e| e.to_string())
                }),
                key,
            },
            Ok(ModuleRead::Missing) => Fetched::Missing,
            Ok(ModuleRead::Refused(why)) => {
                tracing::warn!("gc: stored module refused: {why}");
                Fetched::Refused(why)
            }
            Err(e) => Fetched::Refused(format!("cannot read {key}: {e}")),
        };
        fetched.insert(digest.to_owned(), answer.clone());
        answer
    }

    fn engine(&self) -> Result<Arc<PolicyEngine>, String> {
        self.engine
            .get_or_init(|| {
                PolicyEngine::new(&self.policy)
                    .map_err(|e| format!("cannot start the policy engine: {e}"))
            })
            .clone()
    }

    /// Every candidate by digest: configured modules first, then built-ins, then the modules dir
    /// (the first place a digest is found is the one reported).
    fn digests(&self) -> &HashMap<String, Candidate> {
        self.digests.get_or_init(|| {
            let mut problems = Vec::new();
            let mut out: HashMap<String, Candidate> = HashMap::new();
            let mut add_file =
                |out: &mut HashMap<String, Candidate>, path: &Path, origin| match std::fs::read(
                    path,
                ) {
                    Ok(bytes) => {
                        let digest = ContentHash::of(&bytes).to_hex();
                        out.entry(digest).or_insert(Candidate {
                            origin,
                            path: Some(path.to_path_buf()),
                            bytes: None,
                        });
                    }
                    Err(e) => problems.push(format!("cannot read {}: {e}", path.display())),
                };
            let mut configured: Vec<_> = self.configured_modules.iter().collect();
            configured.sort();
            for (kind, path) in configured {
                let origin = PolicyOrigin::ConfiguredCache {
                    kind: kind.clone(),
                    path: path.clone(),
                };
                add_file(&mut out, path, origin);
            }
            for b in builtin::BUILTINS.iter().filter(|b| !b.wasm.is_empty()) {
                out.entry(ContentHash::of(b.wasm).to_hex())
                    .or_insert(Candidate {
                        origin: PolicyOrigin::Builtin,
                        path: None,
                        bytes: Some(b.wasm),
                    });
            }
            if let Some(dir) = &self.modules_dir {
                match std::fs::read_dir(dir) {
                    Ok(entries) => {
                        let mut paths: Vec<PathBuf> = entries
                            .filter_map(|e| e.ok().map(|e| e.path()))
                            .filter(|p| p.extension().is_some_and(|x| x == "wasm") && p.is_file())
                            .collect();
                        paths.sort();
                        for path in paths {
                            let origin = PolicyOrigin::ModulesDir { path: path.clone() };
                            add_file(&mut out, &path, origin);
                        }
                    }
                    Err(e) => problems.push(format!(
                        "cannot read the modules dir {}: {e}",
                        dir.display()
                    )),
                }
            }
            for p in &problems {
                tracing::warn!("gc policy index: {p}");
            }
            let _ = self.index_problems.set(problems);
            out
        })
    }

    /// The loaded policy of `digest`, loading it on first use.
    fn load(&self, digest: &str, c: &Candidate) -> Loaded {
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(done) = loaded.get(digest) {
            return done.clone();
        }
        let result = self.engine().and_then(|engine| {
            let policy = match (&c.bytes, &c.path) {
                (Some(bytes), _) => engine.load(bytes, &format!("builtin:{digest}")),
                (None, Some(path)) => engine.load_file(path),
                (None, None) => unreachable!("a candidate has bytes or a path"),
            };
            match policy {
                // The file may have changed since it was hashed: only the recorded bytes count.
                Ok(p) if p.digest() != digest => Err(format!(
                    "{} changed while gc ran (its digest is now {})",
                    p.source(),
                    p.digest()
                )),
                Ok(p) => Ok(Arc::new(p)),
                Err(e) => Err(e.to_string()),
            }
        });
        loaded.insert(digest.to_owned(), result.clone());
        result
    }
}

/// `policy` configured with the settings the key was published with (`Manifest.policy`), or, when
/// it refuses them, the key kept whole with `refused`'s reason.
fn with_recorded_settings(
    policy: &WasmPolicy,
    recorded: &PolicyRef,
    origin: PolicyOrigin,
    refused: impl FnOnce(crate::policy::PolicyError) -> String,
) -> Governing {
    match policy.configure(&recorded.settings) {
        Ok(configured) => Governing::found(Arc::new(configured), origin),
        Err(e) => Governing::Missing { reason: refused(e) },
    }
}

impl PolicyFinder for PolicyIndex {
    fn governing(&self, kind: &str, recorded: &PolicyRef) -> Governing {
        let short: String = recorded.digest.chars().take(12).collect();
        let named = format!("{}@{} ({short})", recorded.name, recorded.version);
        if recorded.digest == "native" {
            return Governing::found(Arc::new(NativeRules::new(kind)), PolicyOrigin::Native);
        }
        if let Some(c) = self.digests().get(&recorded.digest) {
            return match self.load(&recorded.digest, c) {
                Ok(policy) => with_recorded_settings(&policy, recorded, c.origin.clone(), |e| {
                    format!(
                        "its policy {named} is {}, but it does not take the settings the key was \
                         published with ({}): {e}; keeping it whole",
                        c.origin,
                        describe(&recorded.settings)
                    )
                }),
                Err(e) => Governing::Missing {
                    reason: format!(
                        "its policy {named} is {}, but it does not load: {e}; keeping it whole",
                        c.origin
                    ),
                },
            };
        }
        // The module publish stored by its digest: fetched, checked against the digest, loaded
        // under the same limits.
        let mut store_problem = None;
        match self.fetch(&recorded.digest) {
            Fetched::Loaded { key, policy } => {
                let origin = PolicyOrigin::Store { key };
                return match policy {
                    Ok(policy) => with_recorded_settings(&policy, recorded, origin.clone(), |e| {
                        format!(
                            "its policy {named} is {origin}, but it does not take the settings \
                             the key was published with ({}): {e}; keeping it whole",
                            describe(&recorded.settings)
                        )
                    }),
                    Err(e) => Governing::Missing {
                        reason: format!(
                            "its policy {named} is {origin}, but it does not load: {e}; keeping \
                             it whole"
                        ),
                    },
                };
            }
            Fetched::Refused(why) => store_problem = Some(why),
            Fetched::Missing => {}
        }
        // A built-in upgraded since the publish: today's built-in of that name decides, but only
        // when nothing here has the recorded digest, the recorded name is the built-in's and the
        // operator did not configure a module of their own for the kind (a third-party module
        // may call itself by a built-in's name).
        let upgrade = builtin::lookup(kind)
            .filter(|_| !self.configured_modules.contains_key(kind))
            .map(|bytes| {
                let digest = ContentHash::of(bytes).to_hex();
                let c = &self.digests()[&digest];
                self.load(&digest, c)
            });
        if let Some(Ok(policy)) = &upgrade
            && policy.info().name == recorded.name
        {
            // Built-ins take no settings today; one that does later reads the recorded ones, and
            // a key whose settings it no longer takes is kept whole like any other.
            let origin = PolicyOrigin::BuiltinUpgraded {
                published_version: recorded.version.clone(),
            };
            return with_recorded_settings(policy, recorded, origin, |e| {
                format!(
                    "its policy {named} is upgraded in this jitship, but the upgrade does not take \
                     the settings the key was published with: {e}; keeping it whole"
                )
            });
        }
        let mut reason = format!(
            "its policy {named} is not here (not built in, no configured cache's module, {}, {}); \
             keeping it whole: {GIVE_IT}",
            match &self.modules_dir {
                Some(d) => format!("not in the modules dir {}", d.display()),
                None => "no modules dir".to_owned(),
            },
            match (&self.store, &store_problem) {
                (None, _) => "the store not asked".to_owned(),
                (Some(_), None) => "not in the store".to_owned(),
                (Some(_), Some(why)) => format!("the store's copy refused: {why}"),
            }
        );
        if let Some(problems) = self.index_problems.get().filter(|p| !p.is_empty()) {
            reason.push_str(&format!(" ({})", problems.join("; ")));
        }
        Governing::Missing { reason }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(config: &Config) -> PolicyIndex {
        let mut config = config.clone();
        config.policy.compile_cache = false;
        PolicyIndex::new(&config, None)
    }

    fn builtin_ref(kind: &str) -> PolicyRef {
        let bytes = builtin::lookup(kind).unwrap();
        PolicyRef {
            name: kind.into(),
            version: "0.0.1".into(),
            digest: ContentHash::of(bytes).to_hex(),
            settings: Default::default(),
        }
    }

    #[test]
    fn a_builtin_is_found_by_its_digest_and_native_by_native() {
        let ix = index(&Config::default());
        match ix.governing("triton", &builtin_ref("triton")) {
            Governing::Found { used, .. } => {
                assert_eq!(used.found, PolicyOrigin::Builtin);
                assert_eq!(used.name, "triton");
            }
            Governing::Missing { reason } => panic!("{reason}"),
        }
        let native = PolicyRef {
            name: "native".into(),
            version: "1".into(),
            digest: "native".into(),
            settings: Default::default(),
        };
        assert!(matches!(
            ix.governing("my-kind", &native),
            Governing::Found { used, .. } if used.found == PolicyOrigin::Native
        ));
    }

    #[test]
    fn an_upgraded_builtin_decides_only_under_its_own_name_and_unconfigured() {
        let ix = index(&Config::default());
        let old = PolicyRef {
            name: "inductor".into(),
            version: "0.0.1".into(),
            digest: "0".repeat(64),
            settings: Default::default(),
        };
        match ix.governing("inductor", &old) {
            Governing::Found { used, .. } => {
                assert_eq!(
                    used.found,
                    PolicyOrigin::BuiltinUpgraded {
                        published_version: "0.0.1".into()
                    }
                );
                assert!(used.to_string().contains("published with version 0.0.1"));
            }
            Governing::Missing { reason } => panic!("{reason}"),
        }
        // Another name under a built-in kind: a third-party module, not here.
        let other = PolicyRef {
            name: "my-inductor".into(),
            ..old.clone()
        };
        let Governing::Missing { reason } = ix.governing("inductor", &other) else {
            panic!("a third-party module must not fall back to the built-in")
        };
        assert!(reason.contains("my-inductor@0.0.1") && reason.contains("--policy-dir"));
        // The operator configured a module of their own for the kind: no fallback either, even
        // under the built-in's name.
        let mut config = Config::default();
        config.caches.push(crate::config::CacheConfig {
            kind: "inductor".into(),
            root: PathBuf::new(),
            policy: Some(PathBuf::from("/nonexistent/inductor.wasm")),
            facts: Default::default(),
            settings: Default::default(),
        });
        let ix = index(&config);
        assert!(matches!(
            ix.governing("inductor", &old),
            Governing::Missing { .. }
        ));
        // A kind with no built-in: never a fallback.
        assert!(matches!(
            index(&Config::default()).governing("no-such-kind", &old),
            Governing::Missing { .. }
        ));
    }
}
