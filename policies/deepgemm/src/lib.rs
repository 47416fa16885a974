//! Built-in policy for DeepGEMM's JIT cache (docs/jit-caches.md#deepgemm).
//!
//! * Root: `~/.deep_gemm`, moved by `DG_JIT_CACHE_DIR` (vLLM points it at
//!   `$VLLM_CACHE_ROOT/deep_gemm`), or `SGLANG_DG_CACHE_DIR`.
//! * Complete: a `cache/kernel.<name>.<digest>/` directory (compiled in `tmp/<uuid>`, then renamed
//!   whole) holding both `kernel.cu` and `kernel.cubin`, DeepGEMM's own validity check. Never
//!   `tmp/`.
//! * Key: DeepGEMM hashes `NVCC<maj.min>`, `--gpu-architecture=sm_XXa`, the **absolute**
//!   `-I<site-packages>/deep_gemm/include` and the generated code: `pkg.deep_gemm`, `gpu.arch`,
//!   `cuda.nvcc`, `python.site_packages`, `driver.major` (cubins need a driver as new as the
//!   toolchain), `os.arch`.
//! * Retention: the newest 3.

use std::collections::{BTreeMap, BTreeSet};

use jitship_policy_common::Decisions;
use jitship_policy_sdk::{
    Decision, Facts, FileEntry, Host, KeyBuilder, Policy, PolicyError, PolicyInfo, ReasonCategory,
    export_policy, facts,
};

#[derive(Default)]
pub struct DeepGemm;

pub const KEY_FACTS: &[&str] = &[
    facts::PKG_DEEP_GEMM,
    facts::GPU_ARCH,
    facts::CUDA_NVCC,
    facts::PYTHON_SITE_PACKAGES,
    facts::DRIVER_MAJOR,
    facts::OS_ARCH,
];

impl Policy for DeepGemm {
    fn info(&self) -> PolicyInfo {
        PolicyInfo {
            name: "deepgemm".into(),
            version: "1.0.0".into(),
            cache_kind: "deepgemm".into(),
            default_root: "~/.deep_gemm".into(),
            root_env: vec!["DG_JIT_CACHE_DIR".into(), "SGLANG_DG_CACHE_DIR".into()],
            description:
                "DeepGEMM JIT: a cache/kernel.* directory with both kernel.cu and kernel.cubin"
                    .into(),
            settings: vec![],
        }
    }

    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
        KeyBuilder::new("deepgemm", 1)
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
        let mut dirs: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (i, e) in entries.iter().enumerate() {
            if out.is_decided(i) {
                continue;
            }
            match e.path.split('/').collect::<Vec<_>>().as_slice() {
                ["cache", d, f] if d.starts_with("kernel.") => {
                    dirs.entry(d).or_default().insert(f);
                }
                _ => out.set(
                    i,
                    Decision::skip(ReasonCategory::NotCache, "not inside cache/kernel.*/"),
                ),
            }
        }
        for (i, e) in entries.iter().enumerate() {
            if let ["cache", d, _] = e.path.split('/').collect::<Vec<_>>().as_slice()
                && let Some(files) = dirs.get(d)
            {
                out.set(
                    i,
                    if files.contains("kernel.cu") && files.contains("kernel.cubin") {
                        Decision::publish("kernel directory has kernel.cu and kernel.cubin")
                    } else {
                        Decision::skip(
                            ReasonCategory::Incomplete,
                            "kernel directory lacks kernel.cu or kernel.cubin",
                        )
                    },
                );
            }
        }
        Ok(out.finish(|| Decision::skip(ReasonCategory::NotCache, "not inside cache/kernel.*/")))
    }
}

export_policy!(DeepGemm);

#[cfg(test)]
mod tests {
    use super::*;
    use jitship_policy_common::testing::{Tree, assert_paths};

    #[test]
    fn both_files_or_nothing() {
        let t = Tree::new();
        let k = "cache/kernel.sm90_fp8_gemm_1d2d.0123456789abcdef0123456789abcdef";
        let half = "cache/kernel.sm90_bf16_gemm.fedcba9876543210fedcba9876543210";
        t.file(&format!("{k}/kernel.cu"), b"src")
            .file(&format!("{k}/kernel.cubin"), b"bin")
            .file(&format!("{k}/kernel.ptx"), b"ptx")
            .file(&format!("{half}/kernel.cu"), b"src")
            .file("tmp/5f1c2d3e/kernel.cu", b"src")
            .file("tmp/5f1c2d3e/kernel.cubin", b"bin")
            .file("cache/stray.txt", b"x");
        assert_paths(
            &t.published(&DeepGemm),
            &[
                &format!("{k}/kernel.cu"),
                &format!("{k}/kernel.cubin"),
                &format!("{k}/kernel.ptx"),
            ],
        );
        assert!(
            t.select(&DeepGemm)["tmp/5f1c2d3e/kernel.cubin"]
                .1
                .contains("temp")
        );
    }

    #[test]
    fn key_includes_include_path_owner() {
        let all: Vec<(&str, &str)> = KEY_FACTS.iter().map(|f| (*f, "v")).collect();
        assert!(
            DeepGemm
                .compat_key(&Facts::from_pairs(all.clone()).unwrap())
                .is_ok()
        );
        let f: Vec<(&str, &str)> = all
            .into_iter()
            .filter(|(n, _)| *n != "python.site_packages")
            .collect();
        assert_eq!(
            DeepGemm.compat_key(&Facts::from_pairs(f).unwrap()),
            Err(PolicyError::MissingFact("python.site_packages".into()))
        );
    }
}
