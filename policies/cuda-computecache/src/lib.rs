//! Built-in policy for the CUDA driver's JIT cache (docs/jit-caches.md#cuda-computecache).
//!
//! * Root: `~/.nv/ComputeCache`, moved by `CUDA_CACHE_PATH`.
//! * Complete: the cache is opaque and driver-managed, with no completion signal a policy can
//!   check; every file but temp and lock files publishes, and the host's settle window (the tree
//!   unchanged for a while) is what guards against a write in progress.
//! * Key: valid "until a CUDA driver upgrade" and for one GPU: `driver.version` (full),
//!   `gpu.name`, `gpu.arch`, `os.arch`.
//! * Retention: the newest 2 (a driver upgrade makes older ones useless anyway).

use jitship_policy_common::Decisions;
use jitship_policy_sdk::{
    Decision, Facts, FileEntry, GenerationSummary, Host, KeyBuilder, Policy, PolicyError,
    PolicyInfo, RetentionDefaults, RetentionDrop, RetentionLimits, default_retain, export_policy,
    facts,
};

#[derive(Default)]
pub struct ComputeCache;

pub const KEY_FACTS: &[&str] = &[
    facts::DRIVER_VERSION,
    facts::GPU_NAME,
    facts::GPU_ARCH,
    facts::OS_ARCH,
];

impl Policy for ComputeCache {
    fn info(&self) -> PolicyInfo {
        PolicyInfo {
            name: "cuda-computecache".into(),
            version: "1.0.0".into(),
            cache_kind: "cuda-computecache".into(),
            default_root: "~/.nv/ComputeCache".into(),
            root_env: vec!["CUDA_CACHE_PATH".into()],
            description: "CUDA driver ComputeCache: opaque; every settled non-temp file, keyed on the exact driver and GPU".into(),
            settings: vec![],
        }
    }

    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
        KeyBuilder::new("cuda-computecache", 1)
            .require_all(facts, KEY_FACTS)?
            .build()
    }

    fn select(
        &self,
        _host: &dyn Host,
        _root: &str,
        entries: &[FileEntry],
    ) -> Result<Vec<Decision>, PolicyError> {
        let out = Decisions::with_never_publish(entries);
        Ok(out.finish(|| {
            Decision::publish("driver-managed cache file (opaque; guarded by the settle window)")
        }))
    }

    fn retain(
        &self,
        g: &[GenerationSummary],
        now: u64,
        l: &RetentionLimits,
    ) -> Result<Vec<RetentionDrop>, PolicyError> {
        default_retain(g, now, l, &RetentionDefaults::keep(2))
    }
}

export_policy!(ComputeCache);

#[cfg(test)]
mod tests {
    use super::*;
    use jitship_policy_common::testing::{Tree, assert_paths};

    #[test]
    fn everything_but_temp() {
        let t = Tree::new();
        t.file("index", b"idx")
            .file("a/b/0123", b"sass")
            .file("a/b/0123.tmp", b"x")
            .file("x.lock", b"");
        assert_paths(&t.published(&ComputeCache), &["a/b/0123", "index"]);
    }

    #[test]
    fn key_needs_the_full_driver_version() {
        let f = Facts::from_pairs([
            ("driver.major", "550"),
            ("gpu.name", "H100"),
            ("gpu.arch", "sm_90"),
            ("os.arch", "x86_64"),
        ])
        .unwrap();
        assert_eq!(
            ComputeCache.compat_key(&f),
            Err(PolicyError::MissingFact("driver.version".into()))
        );
    }
}
