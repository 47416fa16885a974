//! # jitship policy SDK
//!
//! A jitship *policy* decides, for one cache kind, under which compatibility key a cache is
//! published, which of its files are complete and publishable, and which stored generations to
//! drop. Policies are WebAssembly components speaking the contract in `wit/policy.wit`
//! (package `jitship:policy@1.0.0`). This crate lets you write one as a plain Rust trait
//! implementation:
//!
//! * the contract's types as plain Rust types ([`PolicyInfo`], [`FileEntry`], [`Decision`], ...);
//! * the [`Policy`] trait and the [`export_policy!`] macro, which exports it from a wasm build and
//!   installs a panic hook that forwards the panic message through the host's `log` (without it
//!   a panic reaches the host as an opaque `unreachable` trap);
//! * the host's two imports behind the [`Host`] trait, with [`DirHost`], a native implementation
//!   reading from a real directory, so the same policy logic runs under `cargo test` with no wasm;
//! * helpers every cache kind needs: [`never_publish`] (temp, lock and per-host files),
//!   [`Facts::require`] (refuse with `missing-fact` rather than key weakly), [`KeyBuilder`]
//!   (canonical keys from named factors) and [`default_retain`] (limits and pins honoured).
//!
//! ## A complete policy
//!
//! ```
//! use jitship_policy_sdk::{
//!     default_retain, export_policy, never_publish, Decision, Facts, FileEntry, GenerationSummary,
//!     Host, KeyBuilder, Policy, PolicyError, PolicyInfo, RetentionDefaults, RetentionLimits,
//! };
//!
//! #[derive(Default)]
//! pub struct MyCache;
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
//!         }
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
//!     fn select(&self, _host: &dyn Host, entries: &[FileEntry]) -> Result<Vec<Decision>, PolicyError> {
//!         let names: std::collections::BTreeSet<&str> = entries.iter().map(|e| e.path.as_str()).collect();
//!         Ok(entries
//!             .iter()
//!             .map(|e| {
//!                 if let Some(why) = never_publish(&e.path) {
//!                     return Decision::skip(why);
//!                 }
//!                 match e.path.strip_suffix(".bin") {
//!                     Some(stem) if names.contains(format!("{stem}.done").as_str()) => Decision::publish("complete kernel"),
//!                     Some(_) => Decision::skip("kernel without .done marker (in flight)"),
//!                     None => Decision::publish("marker"),
//!                 }
//!             })
//!             .collect())
//!     }
//!
//!     fn retain(&self, gens: &[GenerationSummary], now: u64, limits: &RetentionLimits) -> Result<Vec<String>, PolicyError> {
//!         default_retain(gens, now, limits, &RetentionDefaults::keep(3))
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
//! let host = jitship_policy_sdk::DirHost::new(dir.path());
//! let entries = host.entries().unwrap();
//! let decisions = MyCache.select(&host, &entries).unwrap();
//! let published: Vec<_> = entries.iter().zip(&decisions).filter(|(_, d)| d.is_publish()).map(|(e, _)| e.path.as_str()).collect();
//! assert_eq!(published, ["a.bin", "a.done"]);
//!
//! let facts = Facts::from_pairs([("gpu.arch", "sm_90"), ("driver.major", "550"), ("pkg.my_jit", "2.1")]).unwrap();
//! assert_eq!(MyCache.compat_key(&facts).unwrap(), "my-cache@1;driver.major=550;gpu.arch=sm_90;pkg.my_jit=2.1");
//! let weak = Facts::from_pairs([("gpu.arch", "sm_90")]).unwrap();
//! assert_eq!(MyCache.compat_key(&weak), Err(PolicyError::MissingFact("driver.major".into())));
//! ```
//!
//! Build it to a component and try it on a cache directory:
//!
//! ```text
//! jitship policy build path/to/my-cache        # -> my-cache.wasm (wasm32-unknown-unknown + componentize)
//! jitship policy test my-cache.wasm --root ~/.cache/my-cache --fact gpu.arch=sm_90 ...
//! ```

mod facts;
mod host;
mod key;
mod retention;
mod rules;

pub use facts::Facts;
pub use host::{DirHost, Host, WasmHost, read_to_end};
pub use key::{KeyBuilder, MAX_FACTOR_BYTES, PER_HOST_FACTS};
pub use retention::{RetentionDefaults, default_retain};
pub use rules::{file_name, never_publish, parent_dir};

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
    Decision, Fact, FileEntry, GenerationSummary, PolicyError, PolicyInfo, RetentionLimits, Verdict,
};

/// Longest reason the SDK lets through (the host refuses reasons over 1 KiB as a policy failure;
/// reasons often quote paths read from cache files, which can be any length).
pub const MAX_REASON_BYTES: usize = 512;

/// `s` cut to at most `max` bytes at a character boundary, marked with "..." when cut.
pub fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max.saturating_sub(3);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

impl Decision {
    pub fn publish(reason: impl Into<String>) -> Self {
        Decision {
            verdict: Verdict::Publish,
            reason: truncate(reason.into(), MAX_REASON_BYTES),
        }
    }
    pub fn skip(reason: impl Into<String>) -> Self {
        Decision {
            verdict: Verdict::Skip,
            reason: truncate(reason.into(), MAX_REASON_BYTES),
        }
    }
    pub fn is_publish(&self) -> bool {
        self.verdict == Verdict::Publish
    }
}

impl PolicyError {
    pub fn missing(name: &str) -> Self {
        PolicyError::MissingFact(name.to_string())
    }
}

/// A cache policy. Implement this, then `export_policy!(YourType)` (the type must be `Default`).
///
/// The host calls each method on a fresh instance; a policy keeps no state between calls and
/// sees no clock, randomness, network or filesystem beyond [`Host::read_file`] inside the root.
pub trait Policy {
    /// Name, version, cache kind, default root and the environment variables that move it.
    fn info(&self) -> PolicyInfo;

    /// The compatibility key for the worker these facts describe. Return
    /// `PolicyError::MissingFact(name)` for any fact the key depends on that is absent.
    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError>;

    /// One decision per entry, same order and length. Entries are regular files under the root
    /// (paths relative, '/'-separated); `host` reads their bytes if the rule needs them.
    fn select(&self, host: &dyn Host, entries: &[FileEntry]) -> Result<Vec<Decision>, PolicyError>;

    /// Ids of generations to drop (all share one key, newest first). Pinned generations are never
    /// dropped by the host whatever this answers. The default keeps 3 and honours `limits`.
    fn retain(
        &self,
        generations: &[GenerationSummary],
        now: u64,
        limits: &RetentionLimits,
    ) -> Result<Vec<String>, PolicyError> {
        default_retain(generations, now, limits, &RetentionDefaults::keep(3))
    }
}

/// What the exported functions do around a [`Policy`]: build the facts view, check that `select`
/// answers one decision per entry. Public so native tests can drive a policy exactly as the
/// wasm export does.
pub mod run {
    use super::*;

    pub fn compat_key<P: Policy>(p: &P, facts: &[Fact]) -> Result<String, PolicyError> {
        let facts = Facts::new(facts)?;
        p.compat_key(&facts)
    }

    pub fn select<P: Policy>(
        p: &P,
        host: &dyn Host,
        entries: &[FileEntry],
    ) -> Result<Vec<Decision>, PolicyError> {
        let mut out = p.select(host, entries)?;
        for d in &mut out {
            if d.reason.len() > MAX_REASON_BYTES {
                d.reason = truncate(std::mem::take(&mut d.reason), MAX_REASON_BYTES);
            }
        }
        if out.len() != entries.len() {
            return Err(PolicyError::Internal(format!(
                "select answered {} decisions for {} entries",
                out.len(),
                entries.len()
            )));
        }
        Ok(out)
    }

    pub fn retain<P: Policy>(
        p: &P,
        generations: &[GenerationSummary],
        now: u64,
        limits: &RetentionLimits,
    ) -> Result<Vec<String>, PolicyError> {
        p.retain(generations, now, limits)
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
                fn compat_key(facts: ::std::vec::Vec<$crate::Fact>) -> ::core::result::Result<::std::string::String, $crate::PolicyError> {
                    $crate::__install_panic_hook();
                    $crate::run::compat_key(&<$ty as ::core::default::Default>::default(), &facts)
                }
                fn select(
                    entries: ::std::vec::Vec<$crate::FileEntry>,
                ) -> ::core::result::Result<::std::vec::Vec<$crate::Decision>, $crate::PolicyError> {
                    $crate::__install_panic_hook();
                    $crate::run::select(&<$ty as ::core::default::Default>::default(), &$crate::WasmHost, &entries)
                }
                fn retain(
                    generations: ::std::vec::Vec<$crate::GenerationSummary>,
                    now: u64,
                    limits: $crate::RetentionLimits,
                ) -> ::core::result::Result<::std::vec::Vec<::std::string::String>, $crate::PolicyError> {
                    $crate::__install_panic_hook();
                    $crate::run::retain(&<$ty as ::core::default::Default>::default(), &generations, now, &limits)
                }
            }

            $crate::bindings::__jitship_export_policy_world!(__JitshipPolicyExport with_types_in $crate::bindings);
        };
    };
}
