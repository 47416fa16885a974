//! Built-in policy for SGLang's kernel JIT cache (docs/jit-caches.md#sglang-jit).
//!
//! * Root: `~/.cache/sglang/jit`, moved by `SGLANG_JIT_CACHE_DIR`, or `SGLANG_CACHE_DIR` (+`/jit`).
//! * Complete: a leaf `<target>/<module>/build-<key>/deps-<key>/` is published by renaming a
//!   `.staging-<uuid>/` directory, so it is complete once it exists; never `.staging-*`.
//! * Key: the leaves are content-addressed and install-location independent (SGLang keys the
//!   build on arguments, flags, target, compiler version and package versions); the key keeps
//!   what makes the native code loadable: `pkg.sglang`, `gpu.arch`, `cuda.runtime`,
//!   `driver.major`, `python.version`, `os.arch`.
//! * Retention: the newest 3.

use jitship_policy_common::Decisions;
use jitship_policy_sdk::{
    Decision, Facts, FileEntry, Host, KeyBuilder, Policy, PolicyError, PolicyInfo, ReasonCategory,
    export_policy, facts,
};

#[derive(Default)]
pub struct SglangJit;

pub const KEY_FACTS: &[&str] = &[
    facts::PKG_SGLANG,
    facts::GPU_ARCH,
    facts::CUDA_RUNTIME,
    facts::DRIVER_MAJOR,
    facts::PYTHON_VERSION,
    facts::OS_ARCH,
];

impl Policy for SglangJit {
    fn info(&self) -> PolicyInfo {
        PolicyInfo {
            name: "sglang-jit".into(),
            version: "1.0.0".into(),
            cache_kind: "sglang-jit".into(),
            default_root: "~/.cache/sglang/jit".into(),
            root_env: vec!["SGLANG_JIT_CACHE_DIR".into(), "SGLANG_CACHE_DIR/jit".into()],
            description: "SGLang kernel JIT: a deps-* leaf is complete once it exists (published by renaming .staging-*)".into(),
            settings: vec![],
        }
    }

    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
        KeyBuilder::new("sglang-jit", 1)
            .require_all(facts, KEY_FACTS)?
            .build()
    }

    fn select(
        &self,
        _host: &dyn Host,
        _root: &str,
        entries: &[FileEntry],
    ) -> Result<Vec<Decision>, PolicyError> {
        let mut out = Decisions::with_never_publish(entries);
        for (i, e) in entries.iter().enumerate() {
            let p: Vec<&str> = e.path.split('/').collect();
            let leaf = p.len() >= 5 && p[2].starts_with("build-") && p[3].starts_with("deps-");
            out.set(
                i,
                if leaf {
                    Decision::publish("inside a deps-* leaf (published by atomic rename)")
                } else {
                    Decision::skip(
                        ReasonCategory::NotCache,
                        "not inside <target>/<module>/build-*/deps-*/",
                    )
                },
            );
        }
        Ok(out.finish(|| Decision::skip(ReasonCategory::NotCache, "unreachable")))
    }
}

export_policy!(SglangJit);

#[cfg(test)]
mod tests {
    use super::*;
    use jitship_policy_common::testing::{Tree, assert_paths, elf};

    #[test]
    fn leaves_publish_staging_never() {
        let t = Tree::new();
        t.file(
            "cuda_sm90/rmsnorm/build-0123456789abcdef/deps-fedcba9876543210/sgl_deps.json",
            b"[]",
        )
        .file(
            "cuda_sm90/rmsnorm/build-0123456789abcdef/deps-fedcba9876543210/rmsnorm.so",
            elf(10),
        )
        .file(
            "cuda_sm90/rmsnorm/build-0123456789abcdef/.staging-5f1c/rmsnorm.so",
            elf(3),
        )
        .file("cuda_sm90/.staging-77/x", b"x")
        .file("cuda_sm90/rmsnorm/build-0123456789abcdef/stray.txt", b"x")
        .file(
            "cuda_sm90/rmsnorm/build-0123456789abcdef/deps-1/x.lock",
            b"",
        );
        assert_paths(
            &t.published(&SglangJit),
            &[
                "cuda_sm90/rmsnorm/build-0123456789abcdef/deps-fedcba9876543210/rmsnorm.so",
                "cuda_sm90/rmsnorm/build-0123456789abcdef/deps-fedcba9876543210/sgl_deps.json",
            ],
        );
    }

    #[test]
    fn key() {
        let all: Vec<(&str, &str)> = KEY_FACTS.iter().map(|f| (*f, "v")).collect();
        assert!(
            SglangJit
                .compat_key(&Facts::from_pairs(all).unwrap())
                .is_ok()
        );
        assert_eq!(
            SglangJit.compat_key(&Facts::default()),
            Err(PolicyError::MissingFact("pkg.sglang".into()))
        );
    }
}
