//! # jitship policy SDK
//!
//! A jitship *policy* decides, for one cache kind, under which compatibility key a cache is
//! published, which of its files are complete and publishable, and which stored generations to
//! drop. Policies are WebAssembly components speaking the contract in `wit/policy.wit`
//! (package `jitship:policy@3.0.0`, "policy contract 3"). This crate lets you write one as a plain Rust trait
//! implementation:
//!
//! * the contract's types as plain Rust types ([`PolicyInfo`], [`FileEntry`], [`Decision`],
//!   [`Selection`], [`ReasonCategory`], [`FileTraits`], ...);
//! * the [`Policy`] trait and the [`export_policy!`] macro, which exports it from a wasm build and
//!   installs a panic hook that forwards the panic message through the host's `log` (without it
//!   a panic reaches the host as an opaque `unreachable` trap);
//! * the host's two imports behind the [`Host`] trait, with [`DirHost`], a native implementation
//!   reading from a real directory, so the same policy logic runs under `cargo test` with no wasm;
//! * helpers every cache kind needs: [`never_publish`] (temp, lock and per-host files, with their
//!   categories),
//!   [`Facts::require`] (refuse with `missing-fact` rather than key weakly), [`KeyBuilder`]
//!   (canonical keys from named factors) and [`default_retain`] (limits and pins honoured).
//!
//! ## Settings
//!
//! A policy may take settings instead of rebuilding the module to change "keep 2" or "1 h":
//! declare each in [`PolicyInfo::settings`] ([`SettingSpec::integer`], [`SettingSpec::duration`],
//! ...), read them in [`Policy::configure`]. The operator sets them per cache
//! (`[[cache]] settings = { keep = 2 }` or `--setting KIND:keep=2`); jitship checks each against
//! its kind, fills in the defaults, calls `configure` (`jitship policy check --setting keep=2`
//! shows the verdict) and records them with every generation, so gc retains a key with the
//! settings it was published with.
//!
//! ## Decisions: a category, a detail, traits
//!
//! Every decision carries a [`ReasonCategory`] from a small fixed set (jitship uses it as a metric
//! label and in publish summaries, so its cardinality stays bounded whatever a cache holds) and a
//! free `detail` (shown by `jitship policy test`, `-v` and reports). [`Decision::publish`] is
//! always `Complete`; [`Decision::skip`] takes the category that fits (the WIT file documents
//! each: `Temporary`, `Lock`, `PerHost`, `Incomplete`, `ForeignRoot`, `Unparseable`, `NotCache`,
//! `Excluded`). A published file may carry traits: [`Decision::marker`] for a file the tool finds
//! the others through (installs commit it last), [`Decision::embeds_root`] for a file whose bytes
//! name the absolute root (the policy then implements [`Policy::canonicalize`] and
//! [`Policy::materialize`]; the defaults refuse).
//!
//! [`Policy::completeness`] says whether the published files make a complete cache for the kind
//! (default: complete); a generation published from an incomplete root is recorded as such and
//! installs prefer the newest complete one.
//!
//! ## A complete policy
//!
//! ```
//! use jitship_policy_sdk::{
//!     default_retain, export_policy, never_publish, Decision, Facts, FileEntry, GenerationSummary,
//!     Host, KeyBuilder, Policy, PolicyError, PolicyInfo, ReasonCategory, RetentionDefaults,
//!     RetentionDrop, RetentionLimits, SettingSpec, Settings,
//! };
//!
//! #[derive(Default)]
//! pub struct MyCache {
//!     keep: u32,
//! }
//!
//! impl Policy for MyCache {
//!     fn info(&self) -> PolicyInfo {
//!         PolicyInfo {
//!             name: "my-cache".into(),
//!             version: "1.0.0".into(),
//!             cache_kind: "my-cache".into(),
//!             default_root: "~/.cache/my-cache".into(),
//!             root_env: vec!["MY_CACHE_DIR".into()],
//!             description: "kernels of my JIT: a .bin is complete once its .done marker exists".into(),
//!             settings: vec![SettingSpec::integer("keep", 3, "generations kept per key")],
//!         }
//!     }
//!
//!     fn configure(self, settings: &Settings) -> Result<Self, PolicyError> {
//!         let keep = settings.integer("keep")?;
//!         let keep = u32::try_from(keep).ok().filter(|k| *k >= 1).ok_or_else(|| {
//!             PolicyError::InvalidInput(format!("keep is {keep}; keep at least 1 generation"))
//!         })?;
//!         Ok(Self { keep })
//!     }
//!
//!     fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
//!         // Every factor the cache depends on; a missing one refuses the key.
//!         KeyBuilder::new("my-cache", 1)
//!             .require(facts, "gpu.arch")?
//!             .require(facts, "driver.major")?
//!             .require(facts, "pkg.my_jit")?
//!             .build()
//!     }
//!
//!     fn select(&self, _host: &dyn Host, _root: &str, entries: &[FileEntry]) -> Result<Vec<Decision>, PolicyError> {
//!         let names: std::collections::BTreeSet<&str> = entries.iter().map(|e| e.path.as_str()).collect();
//!         Ok(entries
//!             .iter()
//!             .map(|e| {
//!                 if let Some(skip) = never_publish(&e.path) {
//!                     return skip;
//!                 }
//!                 match e.path.strip_suffix(".bin") {
//!                     Some(stem) if names.contains(format!("{stem}.done").as_str()) => Decision::publish("complete kernel"),
//!                     Some(_) => Decision::skip(ReasonCategory::Incomplete, "kernel without .done marker (in flight)"),
//!                     // The JIT looks a kernel up through its .done file: install it last.
//!                     None if e.path.ends_with(".done") => Decision::publish("completion marker").marker(),
//!                     None => Decision::skip(ReasonCategory::NotCache, "not a file my JIT writes"),
//!                 }
//!             })
//!             .collect())
//!     }
//!
//!     fn retain(&self, gens: &[GenerationSummary], now: u64, limits: &RetentionLimits) -> Result<Vec<RetentionDrop>, PolicyError> {
//!         default_retain(gens, now, limits, &RetentionDefaults::keep(self.keep))
//!     }
//! }
//!
//! // In the policy crate (crate-type = ["cdylib", "rlib"]); a no-op outside wasm32 builds.
//! export_policy!(MyCache);
//!
//! // The same logic, natively, over a real directory:
//! let dir = tempfile::tempdir().unwrap();
//! std::fs::write(dir.path().join("a.bin"), b"x").unwrap();
//! std::fs::write(dir.path().join("a.done"), b"").unwrap();
//! std::fs::write(dir.path().join("b.bin"), b"x").unwrap();
//! std::fs::write(dir.path().join("b.bin.lock"), b"").unwrap();
//! let host = jitship_policy_sdk::DirHost::new(dir.path());
//! let policy = MyCache::default().configure(&Settings::defaults(&MyCache::default().info())).unwrap();
//! let (entries, selection) = host.select(&policy).unwrap();
//! let published: Vec<_> = entries.iter().zip(&selection.decisions).filter(|(_, d)| d.is_publish()).map(|(e, _)| e.path.as_str()).collect();
//! assert_eq!(published, ["a.bin", "a.done"]);
//! let categories: Vec<_> = selection.decisions.iter().map(|d| d.category).collect();
//! assert_eq!(categories, [ReasonCategory::Complete, ReasonCategory::Complete, ReasonCategory::Incomplete, ReasonCategory::Lock]);
//! assert!(selection.decisions[1].is_marker() && selection.complete);
//!
//! let facts = Facts::from_pairs([("gpu.arch", "sm_90"), ("driver.major", "550"), ("pkg.my_jit", "2.1")]).unwrap();
//! assert_eq!(policy.compat_key(&facts).unwrap(), "my-cache@1;driver.major=550;gpu.arch=sm_90;pkg.my_jit=2.1");
//! let weak = Facts::from_pairs([("gpu.arch", "sm_90")]).unwrap();
//! assert_eq!(policy.compat_key(&weak), Err(PolicyError::MissingFact("driver.major".into())));
//! let zero = Settings::defaults(&policy.info()).set("keep", "0");
//! assert!(MyCache::default().configure(&zero).is_err());
//! ```
//!
//! Build it to a component and try it on a cache directory:
//!
//! ```text
//! jitship policy build path/to/my-cache        # -> my-cache.wasm (wasm32-unknown-unknown + componentize)
//! jitship policy test my-cache.wasm --root ~/.cache/my-cache --fact gpu.arch=sm_90 ...
//! ```

pub mod facts;
mod host;
mod key;
mod retention;
mod rules;
mod settings;

pub use facts::Facts;
pub use host::{DirHost, Host, WasmHost, read_to_end};
pub use jitship_policy_contract as contract;
pub use jitship_policy_contract::{
    MAX_DETAIL_BYTES, MAX_FACTOR_BYTES, MAX_KEY_BYTES, PER_HOST_FACTS, encode_key_part, truncate,
};
pub use key::KeyBuilder;
pub use retention::{RetentionDefaults, default_retain};
pub use rules::{file_name, never_publish, parent_dir};
pub use settings::Settings;

use jitship_policy_contract::{RootRewrite, category, no_root_rewrite};

/// What `canonicalize` puts where a file named its absolute root (and `materialize` replaces by
/// the installing root). Chosen so that no real path contains it: `$` and braces are legal in
/// paths but no tool writes this literal.
pub const ROOT_TOKEN: &str = "${JITSHIP_ROOT}";

/// Bindings generated from `wit/policy.wit`. Policy authors use the re-exports at the crate root.
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "policy",
        pub_export_macro: true,
        export_macro_name: "__jitship_export_policy_world",
        default_bindings_module: "jitship_policy_sdk::bindings",
        additional_derives: [PartialEq, Eq],
    });
}

pub use bindings::jitship::policy::host::Level;
pub use bindings::jitship::policy::types::{
    Decision, Fact, FileEntry, FileTraits, GenerationSummary, PolicyError, PolicyInfo,
    ReasonCategory, RetentionCategory, RetentionDrop, RetentionLimits, Selection, Setting,
    SettingKind, SettingSpec, Verdict,
};

impl Decision {
    /// Publish: the file is complete (category `Complete`, no traits).
    pub fn publish(detail: impl Into<String>) -> Self {
        Decision {
            verdict: Verdict::Publish,
            category: ReasonCategory::Complete,
            detail: truncate(detail.into(), MAX_DETAIL_BYTES),
            traits: FileTraits::empty(),
        }
    }

    /// Skip, for the reason `category` (never `Complete`; the WIT documents each) and `detail`.
    pub fn skip(category: ReasonCategory, detail: impl Into<String>) -> Self {
        Decision {
            verdict: Verdict::Skip,
            category,
            detail: truncate(detail.into(), MAX_DETAIL_BYTES),
            traits: FileTraits::empty(),
        }
    }

    /// This published file is how the tool finds others (an install commits it last).
    pub fn marker(mut self) -> Self {
        self.traits |= FileTraits::MARKER;
        self
    }

    /// This published file names the absolute root: jitship canonicalizes it at publish and
    /// materializes it at install through the policy's `canonicalize`/`materialize`.
    pub fn embeds_root(mut self) -> Self {
        self.traits |= FileTraits::EMBEDS_ROOT;
        self
    }

    pub fn is_publish(&self) -> bool {
        self.verdict == Verdict::Publish
    }

    pub fn is_marker(&self) -> bool {
        self.traits.contains(FileTraits::MARKER)
    }

    pub fn is_embeds_root(&self) -> bool {
        self.traits.contains(FileTraits::EMBEDS_ROOT)
    }
}

impl ReasonCategory {
    /// The contract's name, e.g. `per-host`.
    pub fn as_str(self) -> &'static str {
        match self {
            ReasonCategory::Complete => category::COMPLETE,
            ReasonCategory::Temporary => category::TEMPORARY,
            ReasonCategory::Lock => category::LOCK,
            ReasonCategory::PerHost => category::PER_HOST,
            ReasonCategory::Incomplete => category::INCOMPLETE,
            ReasonCategory::ForeignRoot => category::FOREIGN_ROOT,
            ReasonCategory::Unparseable => category::UNPARSEABLE,
            ReasonCategory::NotCache => category::NOT_CACHE,
            ReasonCategory::Excluded => category::EXCLUDED,
        }
    }
}

/// Whether the files a policy publishes make a complete cache for its kind (see
/// [`Policy::completeness`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completeness {
    Complete,
    /// Not yet: why, in words ("2 graphs have kernels but no fxgraph entry yet").
    Incomplete(String),
}

impl PolicyError {
    pub fn missing(name: &str) -> Self {
        PolicyError::MissingFact(name.to_string())
    }
}

/// A cache policy. Implement this, then `export_policy!(YourType)` (the type must be `Default`).
///
/// The host calls each method on a fresh instance, `Default` then [`Policy::configure`]d with the
/// call's settings; a policy keeps no state between calls and sees no clock, randomness, network
/// or filesystem beyond [`Host::read_file`] inside the root.
pub trait Policy {
    /// Name, version, cache kind, default root, the environment variables that move it and the
    /// settings it takes.
    fn info(&self) -> PolicyInfo;

    /// This policy with the operator's settings applied (every setting `info` declares, checked
    /// against its kind, defaults filled in). Refuse settings that make no sense together with
    /// `invalid-input`: jitship then refuses the configuration before any other call. The
    /// default takes none.
    fn configure(self, settings: &Settings) -> Result<Self, PolicyError>
    where
        Self: Sized,
    {
        let _ = settings;
        Ok(self)
    }

    /// The compatibility key for the worker these facts describe. Return
    /// `PolicyError::MissingFact(name)` for any fact the key depends on that is absent.
    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError>;

    /// One decision per entry, same order and length. Entries are regular files under `root`
    /// (the absolute root being judged, on the publishing or the installing side; entry paths are
    /// relative, '/'-separated); `host` reads their bytes if the rule needs them.
    fn select(
        &self,
        host: &dyn Host,
        root: &str,
        entries: &[FileEntry],
    ) -> Result<Vec<Decision>, PolicyError>;

    /// Whether the published files (`decisions` is what `select` answered) make a cache the tool
    /// would start warm from. The default: complete (a kind with no such notion).
    fn completeness(
        &self,
        host: &dyn Host,
        root: &str,
        entries: &[FileEntry],
        decisions: &[Decision],
    ) -> Result<Completeness, PolicyError> {
        let _ = (host, root, entries, decisions);
        Ok(Completeness::Complete)
    }

    /// The root-independent form of a file this policy marked `embeds_root` (replace the
    /// mentions of `root` by [`ROOT_TOKEN`]). The default refuses: a policy that marks no file
    /// has nothing to canonicalize.
    fn canonicalize(&self, root: &str, path: &str, content: &[u8]) -> Result<Vec<u8>, PolicyError> {
        let _ = (root, content);
        Err(PolicyError::InvalidInput(no_root_rewrite(
            &self.info().name,
            RootRewrite::Canonicalize,
            path,
        )))
    }

    /// The inverse of [`Policy::canonicalize`] for the installing `root`. The default refuses.
    fn materialize(&self, root: &str, path: &str, content: &[u8]) -> Result<Vec<u8>, PolicyError> {
        let _ = (root, content);
        Err(PolicyError::InvalidInput(no_root_rewrite(
            &self.info().name,
            RootRewrite::Materialize,
            path,
        )))
    }

    /// The generations to drop, each with why (all share one key, newest first). Pinned
    /// generations are never dropped by the host whatever this answers. The default keeps 3 and
    /// honours `limits`.
    fn retain(
        &self,
        generations: &[GenerationSummary],
        now: u64,
        limits: &RetentionLimits,
    ) -> Result<Vec<RetentionDrop>, PolicyError> {
        default_retain(generations, now, limits, &RetentionDefaults::keep(3))
    }
}

/// What the exported functions do around a [`Policy`]: build the facts view, assemble and check
/// the selection (one decision per entry, `Complete` exactly for publish, traits only on
/// published files, bounded details). Public so native tests drive a policy exactly as the wasm
/// export does.
pub mod run {
    use super::*;

    /// The policy a call runs: `P::default()` configured with the call's settings.
    pub fn configured<P: Policy + Default>(settings: &[Setting]) -> Result<P, PolicyError> {
        P::default().configure(&Settings::new(settings))
    }

    pub fn check_settings<P: Policy + Default>(settings: &[Setting]) -> Result<(), PolicyError> {
        configured::<P>(settings).map(drop)
    }

    pub fn compat_key<P: Policy>(p: &P, facts: &[Fact]) -> Result<String, PolicyError> {
        let facts = Facts::new(facts)?;
        p.compat_key(&facts)
    }

    pub fn select<P: Policy>(
        p: &P,
        host: &dyn Host,
        root: &str,
        entries: &[FileEntry],
    ) -> Result<Selection, PolicyError> {
        let mut decisions = p.select(host, root, entries)?;
        if decisions.len() != entries.len() {
            return Err(PolicyError::Internal(format!(
                "select answered {} decisions for {} entries",
                decisions.len(),
                entries.len()
            )));
        }
        for (d, e) in decisions.iter_mut().zip(entries) {
            if d.detail.len() > MAX_DETAIL_BYTES {
                d.detail = truncate(std::mem::take(&mut d.detail), MAX_DETAIL_BYTES);
            }
            let consistent = match d.verdict {
                Verdict::Publish => d.category == ReasonCategory::Complete,
                Verdict::Skip => d.category != ReasonCategory::Complete && d.traits.is_empty(),
            };
            if !consistent {
                return Err(PolicyError::Internal(format!(
                    "decision for {} is {:?} with category {} and traits {:?}: a publish is complete, a skip \
                     says why with another category and carries no traits",
                    e.path,
                    d.verdict,
                    d.category.as_str(),
                    d.traits
                )));
            }
        }
        let (complete, incomplete_detail) = match p.completeness(host, root, entries, &decisions)? {
            Completeness::Complete => (true, String::new()),
            Completeness::Incomplete(why) if why.trim().is_empty() => {
                (false, "incomplete (the policy gave no detail)".to_string())
            }
            Completeness::Incomplete(why) => (false, truncate(why, MAX_DETAIL_BYTES)),
        };
        Ok(Selection {
            decisions,
            complete,
            incomplete_detail,
        })
    }

    pub fn canonicalize<P: Policy>(
        p: &P,
        root: &str,
        path: &str,
        content: &[u8],
    ) -> Result<Vec<u8>, PolicyError> {
        p.canonicalize(root, path, content)
    }

    pub fn materialize<P: Policy>(
        p: &P,
        root: &str,
        path: &str,
        content: &[u8],
    ) -> Result<Vec<u8>, PolicyError> {
        p.materialize(root, path, content)
    }

    pub fn retain<P: Policy>(
        p: &P,
        generations: &[GenerationSummary],
        now: u64,
        limits: &RetentionLimits,
    ) -> Result<Vec<RetentionDrop>, PolicyError> {
        let mut drops = p.retain(generations, now, limits)?;
        for d in &mut drops {
            if d.detail.len() > MAX_DETAIL_BYTES {
                d.detail = truncate(std::mem::take(&mut d.detail), MAX_DETAIL_BYTES);
            }
        }
        Ok(drops)
    }
}

/// Installs (once) a panic hook that sends the panic message to the host's log at error level.
#[doc(hidden)]
pub fn __install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            WasmHost.log(Level::Error, &format!("policy panicked: {info}"));
        }));
    });
}

/// Exports a [`Policy`] implementation (a `Default` type) as the component's `policy` world.
///
/// Outside `wasm32` targets this expands to nothing, so the crate still builds and tests natively.
#[macro_export]
macro_rules! export_policy {
    ($ty:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct __JitshipPolicyExport;

            impl $crate::bindings::Guest for __JitshipPolicyExport {
                fn info() -> $crate::PolicyInfo {
                    $crate::__install_panic_hook();
                    $crate::Policy::info(&<$ty as ::core::default::Default>::default())
                }
                fn check_settings(
                    settings: ::std::vec::Vec<$crate::Setting>,
                ) -> ::core::result::Result<(), $crate::PolicyError> {
                    $crate::__install_panic_hook();
                    $crate::run::check_settings::<$ty>(&settings)
                }
                fn compat_key(
                    facts: ::std::vec::Vec<$crate::Fact>,
                    settings: ::std::vec::Vec<$crate::Setting>,
                ) -> ::core::result::Result<::std::string::String, $crate::PolicyError> {
                    $crate::__install_panic_hook();
                    $crate::run::compat_key(&$crate::run::configured::<$ty>(&settings)?, &facts)
                }
                fn select(
                    root: ::std::string::String,
                    entries: ::std::vec::Vec<$crate::FileEntry>,
                    settings: ::std::vec::Vec<$crate::Setting>,
                ) -> ::core::result::Result<$crate::Selection, $crate::PolicyError> {
                    $crate::__install_panic_hook();
                    $crate::run::select(&$crate::run::configured::<$ty>(&settings)?, &$crate::WasmHost, &root, &entries)
                }
                fn canonicalize(
                    root: ::std::string::String,
                    path: ::std::string::String,
                    content: ::std::vec::Vec<u8>,
                    settings: ::std::vec::Vec<$crate::Setting>,
                ) -> ::core::result::Result<::std::vec::Vec<u8>, $crate::PolicyError> {
                    $crate::__install_panic_hook();
                    $crate::run::canonicalize(&$crate::run::configured::<$ty>(&settings)?, &root, &path, &content)
                }
                fn materialize(
                    root: ::std::string::String,
                    path: ::std::string::String,
                    content: ::std::vec::Vec<u8>,
                    settings: ::std::vec::Vec<$crate::Setting>,
                ) -> ::core::result::Result<::std::vec::Vec<u8>, $crate::PolicyError> {
                    $crate::__install_panic_hook();
                    $crate::run::materialize(&$crate::run::configured::<$ty>(&settings)?, &root, &path, &content)
                }
                fn retain(
                    generations: ::std::vec::Vec<$crate::GenerationSummary>,
                    now: u64,
                    limits: $crate::RetentionLimits,
                    settings: ::std::vec::Vec<$crate::Setting>,
                ) -> ::core::result::Result<::std::vec::Vec<$crate::RetentionDrop>, $crate::PolicyError> {
                    $crate::__install_panic_hook();
                    $crate::run::retain(&$crate::run::configured::<$ty>(&settings)?, &generations, now, &limits)
                }
            }

            $crate::bindings::__jitship_export_policy_world!(__JitshipPolicyExport with_types_in $crate::bindings);
        };
    };
}

#[cfg(test)]
mod contract_tests {
    use super::*;

    /// Publishes everything; marks `m` files; skips `bad-*` files as the name says.
    #[derive(Default)]
    struct Probe;

    impl Policy for Probe {
        fn info(&self) -> PolicyInfo {
            PolicyInfo {
                name: "probe".into(),
                version: "0".into(),
                cache_kind: "probe".into(),
                default_root: String::new(),
                root_env: vec![],
                description: String::new(),
                settings: vec![],
            }
        }
        fn compat_key(&self, _: &Facts) -> Result<String, PolicyError> {
            Ok("k".into())
        }
        fn select(
            &self,
            _: &dyn Host,
            root: &str,
            entries: &[FileEntry],
        ) -> Result<Vec<Decision>, PolicyError> {
            Ok(entries
                .iter()
                .map(|e| match e.path.as_str() {
                    "m" => Decision::publish(format!("under {root}")).marker(),
                    "bad-skip-complete" => Decision::skip(ReasonCategory::Complete, "x"),
                    "bad-skip-traits" => Decision::skip(ReasonCategory::Lock, "x").marker(),
                    _ => Decision::publish("ok"),
                })
                .collect())
        }
    }

    fn entries(paths: &[&str]) -> Vec<FileEntry> {
        paths
            .iter()
            .map(|p| FileEntry {
                path: p.to_string(),
                size: 1,
                mtime_ms: 0,
            })
            .collect()
    }

    #[test]
    fn run_select_assembles_a_complete_selection_and_refuses_inconsistent_decisions() {
        let s = run::select(&Probe, &WasmHost, "/abs/root", &entries(&["a", "m"])).unwrap();
        assert!(s.complete && s.incomplete_detail.is_empty());
        assert!(!s.decisions[0].is_marker() && s.decisions[1].is_marker());
        assert_eq!(s.decisions[1].detail, "under /abs/root");
        for bad in ["bad-skip-complete", "bad-skip-traits"] {
            let err = run::select(&Probe, &WasmHost, "/r", &entries(&[bad])).unwrap_err();
            assert!(
                matches!(err, PolicyError::Internal(m) if m.contains(bad)),
                "{bad}"
            );
        }
    }

    /// The SDK cuts details to the limit the host enforces (the contract's `MAX_DETAIL_BYTES`),
    /// not shorter.
    #[test]
    fn long_details_are_cut_to_the_hosts_limit() {
        let d = Decision::skip(ReasonCategory::NotCache, "é".repeat(MAX_DETAIL_BYTES));
        assert!(d.detail.len() <= MAX_DETAIL_BYTES && d.detail.len() > MAX_DETAIL_BYTES - 4);
        assert!(d.detail.ends_with("..."));
        let fits = "x".repeat(MAX_DETAIL_BYTES);
        assert_eq!(Decision::publish(fits.clone()).detail, fits);
        assert_eq!(MAX_DETAIL_BYTES, 1024);
    }

    #[test]
    fn relocation_is_refused_by_default() {
        for r in [
            run::canonicalize(&Probe, "/r", "a", b"x"),
            run::materialize(&Probe, "/r", "a", b"x"),
        ] {
            assert!(
                matches!(r, Err(PolicyError::InvalidInput(m)) if m.contains("marks no file as embedding the root"))
            );
        }
    }

    #[test]
    fn dir_host_runs_select_with_the_absolute_root() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("m"), b"x").unwrap();
        let host = DirHost::new(d.path());
        let (entries, s) = host.select(&Probe).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(
            s.decisions[0].detail,
            format!("under {}", d.path().display())
        );
        assert_eq!(ReasonCategory::PerHost.as_str(), "per-host");
    }
}
