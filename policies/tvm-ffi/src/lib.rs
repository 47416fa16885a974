//! Built-in policy for TVM-FFI's JIT extension cache (docs/jit-caches.md#tvm-ffi).
//!
//! * Root: `~/.cache/tvm-ffi`, moved by `TVM_FFI_CACHE_DIR`.
//! * Complete: a build directory `<name>_<hash>/` whose `.so` is a complete ELF file and, when
//!   ninja built it, none of whose files is newer than its `.ninja_log`. The layout (ninja build
//!   directories like torch's `load_inline`) is **not verified against a pinned release** here.
//! * Key: the build embeds `cuda_home`, nvcc and absolute include paths like FlashInfer's:
//!   `pkg.apache_tvm_ffi`, `gpu.arch`, `cuda.nvcc`, `cuda.home`, `python.version`,
//!   `python.site_packages`, `driver.major`, `os.arch`.
//! * Retention: the newest 3.

use std::collections::BTreeMap;

use jitship_policy_common::Decisions;
use jitship_policy_common::check::elf_complete;
use jitship_policy_sdk::{
    Decision, Facts, FileEntry, Host, KeyBuilder, Policy, PolicyError, PolicyInfo, ReasonCategory,
    export_policy, facts,
};

#[derive(Default)]
pub struct TvmFfi;

pub const KEY_FACTS: &[&str] = &[
    facts::PKG_APACHE_TVM_FFI,
    facts::GPU_ARCH,
    facts::CUDA_NVCC,
    facts::CUDA_HOME,
    facts::PYTHON_VERSION,
    facts::PYTHON_SITE_PACKAGES,
    facts::DRIVER_MAJOR,
    facts::OS_ARCH,
];

fn dir_state(host: &dyn Host, files: &[&FileEntry]) -> Result<(), String> {
    let sos: Vec<&&FileEntry> = files.iter().filter(|e| e.path.ends_with(".so")).collect();
    if sos.is_empty() {
        return Err("no shared object built yet".into());
    }
    for so in &sos {
        elf_complete(host, so).map_err(|w| format!("{}: {w}", so.path))?;
    }
    if let Some(log) = files.iter().find(|e| e.path.ends_with("/.ninja_log"))
        && let Some(newer) = files
            .iter()
            .find(|e| !e.path.ends_with("/.ninja_deps") && e.mtime_ms > log.mtime_ms)
    {
        return Err(format!(
            "{} is newer than .ninja_log (ninja still running)",
            newer.path
        ));
    }
    Ok(())
}

impl Policy for TvmFfi {
    fn info(&self) -> PolicyInfo {
        PolicyInfo {
            name: "tvm-ffi".into(),
            version: "1.0.0".into(),
            cache_kind: "tvm-ffi".into(),
            default_root: "~/.cache/tvm-ffi".into(),
            root_env: vec!["TVM_FFI_CACHE_DIR".into()],
            description: "TVM-FFI JIT extensions: a build directory once its .so is complete and ninja is done".into(),
            settings: vec![],
        }
    }

    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
        KeyBuilder::new("tvm-ffi", 1)
            .require_all(facts, KEY_FACTS)?
            .build()
    }

    fn select(
        &self,
        host: &dyn Host,
        _root: &str,
        entries: &[FileEntry],
    ) -> Result<Vec<Decision>, PolicyError> {
        let mut out = Decisions::with_never_publish(entries);
        let mut dirs: BTreeMap<&str, Vec<(usize, &FileEntry)>> = BTreeMap::new();
        for (i, e) in entries.iter().enumerate() {
            if out.is_decided(i) {
                continue;
            }
            match e.path.split_once('/') {
                Some((d, _)) => dirs.entry(d).or_default().push((i, e)),
                None => out.set(
                    i,
                    Decision::skip(ReasonCategory::NotCache, "not inside a build directory"),
                ),
            }
        }
        for members in dirs.values() {
            let files: Vec<&FileEntry> = members.iter().map(|(_, e)| *e).collect();
            let state = dir_state(host, &files);
            for (i, _) in members {
                out.set(
                    *i,
                    match &state {
                        Ok(()) => Decision::publish("build directory complete"),
                        Err(why) => Decision::skip(ReasonCategory::Incomplete, why.clone()),
                    },
                );
            }
        }
        Ok(out.finish(|| Decision::skip(ReasonCategory::NotCache, "unreachable")))
    }
}

export_policy!(TvmFfi);

#[cfg(test)]
mod tests {
    use super::*;
    use jitship_policy_common::testing::{Tree, assert_paths, elf};

    #[test]
    fn build_dirs() {
        let t = Tree::new();
        t.file("my_ext_ab12/build.ninja", b"n")
            .file("my_ext_ab12/my_ext.so", elf(9))
            .file("my_ext_ab12/.ninja_log", b"# ninja log v5\n");
        t.mtime("my_ext_ab12/build.ninja", 1000)
            .mtime("my_ext_ab12/my_ext.so", 1000)
            .mtime("my_ext_ab12/.ninja_log", 2000);
        t.file("busy_cd34/build.ninja", b"n")
            .file("busy_cd34/busy.so", &elf(9)[..20]);
        t.file("x.lock", b"")
            .file("late_ef56/late.so", elf(9))
            .file("late_ef56/.ninja_log", b"");
        t.mtime("late_ef56/.ninja_log", 1000)
            .mtime("late_ef56/late.so", 2000);
        assert_paths(
            &t.published(&TvmFfi),
            &[
                "my_ext_ab12/build.ninja",
                "my_ext_ab12/my_ext.so",
                "my_ext_ab12/.ninja_log",
            ],
        );
        assert!(
            t.select(&TvmFfi)["late_ef56/late.so"]
                .1
                .contains("newer than .ninja_log")
        );
    }

    #[test]
    fn key() {
        assert_eq!(
            TvmFfi.compat_key(&Facts::default()),
            Err(PolicyError::MissingFact("pkg.apache_tvm_ffi".into()))
        );
    }
}
