//! Built-in policy for SGLang's piecewise torch.compile cache (docs/jit-caches.md#sglang-compile).
//!
//! * Root: `~/.cache/sglang/torch_compile_cache`, moved by `SGLANG_CACHE_DIR`
//!   (+`/torch_compile_cache`).
//! * Complete: `<hash>/rank_0_0/<model_tag>/` once `sglang_compile_cache.py` (written last,
//!   non-atomically) is a complete literal naming only existing artifacts; `inductor_cache/` and
//!   `triton_cache/` under a rank directory by the Inductor and Triton rules.
//! * Key: SGLang's directory hash covers only Inductor factors and hard-codes rank 0, so the key
//!   carries everything else that shapes the graphs: `pkg.sglang`, `pkg.torch`, `pkg.triton`,
//!   `python.version`, `python.site_packages`, `cuda.runtime`, `gpu.name`, `gpu.arch`,
//!   `driver.major`, `model.id`, `model.revision`, `engine.config_digest`, `os.arch`.
//! * Retention: the newest 3.

use jitship_policy_common::{Decisions, compile_cache, triton};
use jitship_policy_sdk::{
    Decision, Facts, FileEntry, Host, KeyBuilder, Policy, PolicyError, PolicyInfo, ReasonCategory,
    export_policy, facts,
};

#[derive(Default)]
pub struct SglangCompile;

pub const KEY_FACTS: &[&str] = &[
    facts::PKG_SGLANG,
    facts::PKG_TORCH,
    facts::PKG_TRITON,
    facts::PYTHON_VERSION,
    facts::PYTHON_SITE_PACKAGES,
    facts::CUDA_RUNTIME,
    facts::GPU_NAME,
    facts::GPU_ARCH,
    facts::DRIVER_MAJOR,
    facts::MODEL_ID,
    facts::MODEL_REVISION,
    facts::ENGINE_CONFIG_DIGEST,
    facts::OS_ARCH,
];

impl Policy for SglangCompile {
    fn info(&self) -> PolicyInfo {
        PolicyInfo {
            name: "sglang-compile".into(),
            version: "1.0.0".into(),
            cache_kind: "sglang-compile".into(),
            default_root: "~/.cache/sglang/torch_compile_cache".into(),
            root_env: vec!["SGLANG_CACHE_DIR/torch_compile_cache".into()],
            description: "SGLang piecewise torch.compile: a model_tag directory once sglang_compile_cache.py is complete".into(),
            settings: vec![],
        }
    }

    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
        KeyBuilder::new("sglang-compile", 1)
            .require_all(facts, KEY_FACTS)?
            .build()
    }

    fn select(
        &self,
        host: &dyn Host,
        root: &str,
        entries: &[FileEntry],
    ) -> Result<Vec<Decision>, PolicyError> {
        let mut out = Decisions::with_never_publish(entries);
        compile_cache::decide(host, root, entries, "", "sglang_compile_cache.py", &mut out);
        Ok(out.finish(|| {
            Decision::skip(
                ReasonCategory::NotCache,
                "not part of an SGLang compile cache",
            )
        }))
    }

    /// Only Triton group files (under `inductor_cache/triton/` and `triton_cache/`) are marked
    /// `embeds-root`.
    fn canonicalize(
        &self,
        root: &str,
        _path: &str,
        content: &[u8],
    ) -> Result<Vec<u8>, PolicyError> {
        triton::canonicalize_group(root, content)
    }

    fn materialize(&self, root: &str, _path: &str, content: &[u8]) -> Result<Vec<u8>, PolicyError> {
        triton::materialize_group(root, content)
    }
}

export_policy!(SglangCompile);

#[cfg(test)]
mod tests {
    use super::*;
    use jitship_policy_common::testing::{Tree, assert_paths};

    #[test]
    fn waits_for_the_index() {
        let t = Tree::new();
        let index = "{(Range(start=1, end=4096), 0, 'inductor'): {'graph_handle': ('artifact_compile_range_1_4096_subgraph_0', '/x')}}";
        t.file(
            "a1b2c3d4e5/rank_0_0/qwen3/artifact_compile_range_1_4096_subgraph_0",
            b"bin",
        )
        .file("a1b2c3d4e5/rank_0_0/qwen3/sglang_compile_cache.py", index)
        .file(
            "a1b2c3d4e5/rank_0_0/llama/artifact_compile_range_1_4096_subgraph_0",
            b"bin",
        )
        .file(
            "a1b2c3d4e5/rank_0_0/llama/sglang_compile_cache.py",
            &index[..30],
        )
        .file(
            "a1b2c3d4e5/rank_0_0/mixtral/artifact_compile_range_1_4096_subgraph_0",
            b"bin",
        )
        .file("a1b2c3d4e5/rank_0_0/qwen3/.1.2.tmp", b"x");
        assert_paths(
            &t.published(&SglangCompile),
            &[
                "a1b2c3d4e5/rank_0_0/qwen3/artifact_compile_range_1_4096_subgraph_0",
                "a1b2c3d4e5/rank_0_0/qwen3/sglang_compile_cache.py",
            ],
        );
    }

    #[test]
    fn key() {
        let all: Vec<(&str, &str)> = KEY_FACTS.iter().map(|f| (*f, "v")).collect();
        assert!(
            SglangCompile
                .compat_key(&Facts::from_pairs(all).unwrap())
                .unwrap()
                .starts_with("sglang-compile@1;")
        );
        assert_eq!(
            SglangCompile.compat_key(&Facts::from_pairs([("pkg.sglang", "0.5.23")]).unwrap()),
            Err(PolicyError::MissingFact("pkg.torch".into()))
        );
    }
}
