//! Built-in policy for FlashInfer autotune results written by vLLM
//! (docs/jit-caches.md#flashinfer-autotune), a kind of its own: JSON tuning tables, not code.
//!
//! * Root: `~/.cache/vllm/flashinfer_autotune_cache`, moved by
//!   `VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR`, or `VLLM_CACHE_ROOT` (+`/flashinfer_autotune_cache`).
//! * Complete: `<fi-version>/<arch>/<hash>/autotune_configs[_dp<d>_rank<r>].json` once the whole
//!   file parses as JSON (it is written at the end of autotuning, not atomically).
//! * Key: vLLM names the directory from its compile factors (without its version), the
//!   FlashInfer version and the arch; tuned tactics are measured on one GPU model:
//!   `pkg.flashinfer_python`, `pkg.vllm`, `gpu.name`, `gpu.arch`, `model.id`, `model.revision`,
//!   `engine.config_digest`.
//! * Retention: the newest 3.

use jitship_policy_common::Decisions;
use jitship_policy_common::check::json_value;
use jitship_policy_sdk::{
    Decision, Facts, FileEntry, Host, KeyBuilder, Policy, PolicyError, PolicyInfo, ReasonCategory,
    export_policy, facts, file_name,
};

#[derive(Default)]
pub struct FlashinferAutotune;

pub const KEY_FACTS: &[&str] = &[
    facts::PKG_FLASHINFER_PYTHON,
    facts::PKG_VLLM,
    facts::GPU_NAME,
    facts::GPU_ARCH,
    facts::MODEL_ID,
    facts::MODEL_REVISION,
    facts::ENGINE_CONFIG_DIGEST,
];

impl Policy for FlashinferAutotune {
    fn info(&self) -> PolicyInfo {
        PolicyInfo {
            name: "flashinfer-autotune".into(),
            version: "1.0.0".into(),
            cache_kind: "flashinfer-autotune".into(),
            default_root: "~/.cache/vllm/flashinfer_autotune_cache".into(),
            root_env: vec![
                "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR".into(),
                "VLLM_CACHE_ROOT/flashinfer_autotune_cache".into(),
            ],
            description:
                "FlashInfer autotune tables (vLLM): each autotune_configs*.json once it parses"
                    .into(),
            settings: vec![],
        }
    }

    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
        KeyBuilder::new("flashinfer-autotune", 1)
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
        for (i, e) in entries.iter().enumerate() {
            let name = file_name(&e.path);
            let shaped = e.path.split('/').count() == 4
                && name.starts_with("autotune_configs")
                && name.ends_with(".json");
            out.set(
                i,
                if !shaped {
                    Decision::skip(
                        ReasonCategory::NotCache,
                        "not <fi-version>/<arch>/<hash>/autotune_configs*.json",
                    )
                } else {
                    match json_value(host, &e.path, 16 << 20) {
                        Ok(_) => Decision::publish("autotune table parses"),
                        Err(why) => Decision::skip(
                            ReasonCategory::Incomplete,
                            format!("autotune table incomplete: {why}"),
                        ),
                    }
                },
            );
        }
        Ok(out.finish(|| Decision::skip(ReasonCategory::NotCache, "unreachable")))
    }
}

export_policy!(FlashinferAutotune);

#[cfg(test)]
mod tests {
    use super::*;
    use jitship_policy_common::testing::{Tree, assert_paths};

    #[test]
    fn whole_json_only() {
        let t = Tree::new();
        let d = "0.7.4/90a/5f1c2d3e4f";
        t.file(
            &format!("{d}/autotune_configs.json"),
            br#"{"fp8_gemm": {"m=128": [1, 2]}}"#,
        )
        .file(
            &format!("{d}/autotune_configs_dp0_rank1.json"),
            br#"{"fp8_gemm": {"m=128": [1,"#,
        )
        .file(&format!("{d}/notes.txt"), b"x");
        assert_paths(
            &t.published(&FlashinferAutotune),
            &[&format!("{d}/autotune_configs.json")],
        );
    }

    #[test]
    fn key() {
        let all: Vec<(&str, &str)> = KEY_FACTS.iter().map(|f| (*f, "v")).collect();
        assert!(
            FlashinferAutotune
                .compat_key(&Facts::from_pairs(all).unwrap())
                .is_ok()
        );
        assert!(FlashinferAutotune.compat_key(&Facts::default()).is_err());
    }
}
