//! Built-in policy for TileLang's kernel cache (docs/jit-caches.md#tilelang).
//!
//! * Root: `~/.tilelang/cache`, moved by `TILELANG_CACHE_DIR`, or `SGLANG_CACHE_DIR`
//!   (+`/tilelang`, SGLang's redirect).
//! * Complete: a `<key>/` directory holding `params.pkl` (saved after the kernel sources and
//!   library) and a library: a complete ELF `kernel_lib.so` or `executable.so`, or a
//!   `kernel.cubin`. Top-level directories named `.*` or `tmp*` are in-flight saves. The layout
//!   follows TileLang's `KernelCache` source (file names `kernel.cu`, `wrapped_kernel.cu`,
//!   `kernel_lib.so`, `params.pkl`); it is **not verified against a pinned release** here.
//! * Key: as ModelExpress keys it (library version, CUDA, arch) plus what native code needs:
//!   `pkg.tilelang`, `gpu.arch`, `cuda.runtime`, `driver.major`, `python.version`, `os.arch`.
//! * Retention: the newest 3.

use std::collections::BTreeMap;

use jitship_policy_common::Decisions;
use jitship_policy_common::check::elf_complete;
use jitship_policy_sdk::{
    Decision, Facts, FileEntry, Host, KeyBuilder, Policy, PolicyError, PolicyInfo, ReasonCategory,
    export_policy, facts,
};

#[derive(Default)]
pub struct Tilelang;

pub const KEY_FACTS: &[&str] = &[
    facts::PKG_TILELANG,
    facts::GPU_ARCH,
    facts::CUDA_RUNTIME,
    facts::DRIVER_MAJOR,
    facts::PYTHON_VERSION,
    facts::OS_ARCH,
];

fn dir_state(host: &dyn Host, files: &[&FileEntry]) -> Result<(), String> {
    let has = |n: &str| files.iter().find(|e| e.path.rsplit('/').next() == Some(n));
    if has("params.pkl").is_none() {
        return Err("no params.pkl yet (saved last)".into());
    }
    if has("kernel.cubin").is_some() {
        return Ok(());
    }
    match has("kernel_lib.so").or_else(|| has("executable.so")) {
        None => Err("no kernel library".into()),
        Some(so) => elf_complete(host, so),
    }
}

impl Policy for Tilelang {
    fn info(&self) -> PolicyInfo {
        PolicyInfo {
            name: "tilelang".into(),
            version: "1.0.0".into(),
            cache_kind: "tilelang".into(),
            default_root: "~/.tilelang/cache".into(),
            root_env: vec![
                "TILELANG_CACHE_DIR".into(),
                "SGLANG_CACHE_DIR/tilelang".into(),
            ],
            description:
                "TileLang kernels: a kernel directory with params.pkl and a complete library".into(),
            settings: vec![],
        }
    }

    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
        KeyBuilder::new("tilelang", 1)
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
                Some((d, _)) if d.starts_with('.') || d.starts_with("tmp") => out.set(
                    i,
                    Decision::skip(ReasonCategory::Temporary, "in-flight save directory"),
                ),
                Some((d, _)) => dirs.entry(d).or_default().push((i, e)),
                None => out.set(
                    i,
                    Decision::skip(ReasonCategory::NotCache, "not inside a kernel directory"),
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
                        Ok(()) => {
                            Decision::publish("kernel directory complete (params.pkl and library)")
                        }
                        Err(why) => Decision::skip(ReasonCategory::Incomplete, why.clone()),
                    },
                );
            }
        }
        Ok(out.finish(|| Decision::skip(ReasonCategory::NotCache, "unreachable")))
    }
}

export_policy!(Tilelang);

#[cfg(test)]
mod tests {
    use super::*;
    use jitship_policy_common::testing::{Tree, assert_paths, elf};

    #[test]
    fn kernel_dirs() {
        let t = Tree::new();
        t.file("aaaa/kernel.cu", b"k")
            .file("aaaa/wrapped_kernel.cu", b"w")
            .file("aaaa/kernel_lib.so", elf(9))
            .file("aaaa/params.pkl", b"p");
        t.file("bbbb/kernel.cu", b"k")
            .file("bbbb/kernel_lib.so", elf(9));
        t.file("cccc/kernel_lib.so", &elf(9)[..40])
            .file("cccc/params.pkl", b"p");
        t.file(".tmp_5f1c/kernel_lib.so", elf(9))
            .file("tmp_77/params.pkl", b"p");
        assert_paths(
            &t.published(&Tilelang),
            &[
                "aaaa/kernel.cu",
                "aaaa/wrapped_kernel.cu",
                "aaaa/kernel_lib.so",
                "aaaa/params.pkl",
            ],
        );
    }

    #[test]
    fn key() {
        assert_eq!(
            Tilelang.compat_key(&Facts::default()),
            Err(PolicyError::MissingFact("pkg.tilelang".into()))
        );
    }
}
