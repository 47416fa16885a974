//! Built-in policy for the CuTe DSL (CUTLASS Python) compile cache
//! (docs/jit-caches.md#cute-dsl).
//!
//! * Root: `$TMPDIR/${USER}/cutlass_python_cache`, moved by `CUTE_DSL_CACHE_DIR` (CUTLASS >= 4.3.2).
//! * Complete: the on-disk layout is **not verified** against a release; this policy publishes
//!   every file but temp, lock and per-host files and relies on the host's settle window. That
//!   is weaker than the other kinds' rules, and said so in `info().description`.
//! * Key: as ModelExpress keys it (library version, CUDA, arch) plus what native code needs:
//!   `pkg.nvidia_cutlass_dsl`, `gpu.arch`, `cuda.runtime`, `driver.major`, `python.version`,
//!   `os.arch`.
//! * Retention: the newest 3.

use jitship_policy_common::Decisions;
use jitship_policy_sdk::{
    Decision, Facts, FileEntry, Host, KeyBuilder, Policy, PolicyError, PolicyInfo, export_policy,
    facts,
};

#[derive(Default)]
pub struct CuteDsl;

pub const KEY_FACTS: &[&str] = &[
    facts::PKG_NVIDIA_CUTLASS_DSL,
    facts::GPU_ARCH,
    facts::CUDA_RUNTIME,
    facts::DRIVER_MAJOR,
    facts::PYTHON_VERSION,
    facts::OS_ARCH,
];

impl Policy for CuteDsl {
    fn info(&self) -> PolicyInfo {
        PolicyInfo {
            name: "cute-dsl".into(),
            version: "1.0.0".into(),
            cache_kind: "cute-dsl".into(),
            default_root: "$TMPDIR/${USER}/cutlass_python_cache".into(),
            root_env: vec!["CUTE_DSL_CACHE_DIR".into()],
            description: "CuTe DSL cache: layout unverified; every settled non-temp file".into(),
            settings: vec![],
        }
    }

    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
        KeyBuilder::new("cute-dsl", 1)
            .require_all(facts, KEY_FACTS)?
            .build()
    }

    fn select(
        &self,
        _host: &dyn Host,
        _root: &str,
        entries: &[FileEntry],
    ) -> Result<Vec<Decision>, PolicyError> {
        Ok(Decisions::with_never_publish(entries)
            .finish(|| Decision::publish("settled cache file (layout unverified)")))
    }
}

export_policy!(CuteDsl);

#[cfg(test)]
mod tests {
    use super::*;
    use jitship_policy_common::testing::{Tree, assert_paths};

    #[test]
    fn all_but_temp() {
        let t = Tree::new();
        t.file("ab/kernel.o", b"o")
            .file("ab/kernel.o.tmp", b"x")
            .file("c.lock", b"");
        assert_paths(&t.published(&CuteDsl), &["ab/kernel.o"]);
        assert!(CuteDsl.compat_key(&Facts::default()).is_err());
    }
}
