//! Built-in policy for FlashInfer's JIT modules (docs/jit-caches.md#flashinfer-jit).
//!
//! * Root: `~/.cache/flashinfer`, moved by `FLASHINFER_WORKSPACE_BASE` (+`/.cache/flashinfer`);
//!   modules live under `<fi-version>/<archs>/`.
//! * Complete: a module `cached_ops/<uri>/` whose `<uri>.so` is a complete ELF file, whose
//!   `.ninja_log` exists and records the `.so`, and none of whose files is newer than that log
//!   (ninja appends to the log after each step, so an output newer than the log is being
//!   written). Its sources `generated/<uri>/` publish with it (ninja decides freshness by mtime;
//!   the installer must keep mtimes). Downloaded `cubins/` are verified by sha256 on load.
//!   Never `cached_ops/tmp/<uri>.lock`. Whether the lock is *held* cannot be seen through the
//!   contract (no flock); the mtime rule plus the host's settle window stand in for it.
//! * Key: identity is the path `<version>/<archs>/<uri>` plus ninja's freshness, and
//!   `build.ninja` embeds `cuda_home`, the nvcc path and absolute source paths (a different
//!   `cuda_home` string rebuilt for 30 minutes in FI #4884); the `.so` is a torch extension:
//!   `pkg.flashinfer_python`, `pkg.torch`, `gpu.arch`, `cuda.nvcc`, `cuda.home`,
//!   `python.site_packages`, `python.version`, `driver.major`, `os.arch`.
//! * Retention: the newest 2 (modules are large: hundreds of MB).

use std::collections::{BTreeMap, BTreeSet};

use jitship_policy_common::Decisions;
use jitship_policy_common::check::elf_complete;
use jitship_policy_sdk::{
    Decision, Facts, FileEntry, GenerationSummary, Host, KeyBuilder, Policy, PolicyError,
    PolicyInfo, ReasonCategory, RetentionDefaults, RetentionDrop, RetentionLimits, default_retain,
    export_policy, facts, read_to_end,
};

#[derive(Default)]
pub struct FlashinferJit;

pub const KEY_FACTS: &[&str] = &[
    facts::PKG_FLASHINFER_PYTHON,
    facts::PKG_TORCH,
    facts::GPU_ARCH,
    facts::CUDA_NVCC,
    facts::CUDA_HOME,
    facts::PYTHON_SITE_PACKAGES,
    facts::PYTHON_VERSION,
    facts::DRIVER_MAJOR,
    facts::OS_ARCH,
];

const NINJA_LOG_LIMIT: usize = 8 << 20;

fn module_state(host: &dyn Host, dir: &str, uri: &str, files: &[&FileEntry]) -> Result<(), String> {
    let so_name = format!("{dir}/{uri}.so");
    let so = files
        .iter()
        .find(|e| e.path == so_name)
        .ok_or_else(|| format!("{uri}.so not built yet"))?;
    elf_complete(host, so).map_err(|w| format!("{uri}.so: {w}"))?;
    let log_name = format!("{dir}/.ninja_log");
    let log = files
        .iter()
        .find(|e| e.path == log_name)
        .ok_or("no .ninja_log (build never finished)")?;
    let text = read_to_end(host, &log.path, NINJA_LOG_LIMIT)
        .map_err(|m| format!(".ninja_log unreadable: {m}"))?;
    let text = String::from_utf8_lossy(&text);
    let linked = text.lines().filter(|l| !l.starts_with('#')).any(|l| {
        l.split('\t')
            .nth(3)
            .is_some_and(|out| out == format!("{uri}.so") || out.ends_with(&format!("/{uri}.so")))
    });
    if !linked {
        return Err(format!(
            ".ninja_log does not record {uri}.so (link never finished)"
        ));
    }
    if let Some(newer) = files
        .iter()
        .filter(|e| !e.path.ends_with("/.ninja_log") && !e.path.ends_with("/.ninja_deps"))
        .find(|e| e.mtime_ms > log.mtime_ms)
    {
        return Err(format!(
            "{} is newer than .ninja_log (ninja still running)",
            newer.path
        ));
    }
    Ok(())
}

impl Policy for FlashinferJit {
    fn info(&self) -> PolicyInfo {
        PolicyInfo {
            name: "flashinfer-jit".into(),
            version: "1.0.0".into(),
            cache_kind: "flashinfer-jit".into(),
            default_root: "~/.cache/flashinfer".into(),
            root_env: vec!["FLASHINFER_WORKSPACE_BASE/.cache/flashinfer".into()],
            description: "FlashInfer JIT: a module once its .so is linked, recorded in .ninja_log and nothing is newer than the log".into(),
            settings: vec![],
        }
    }

    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
        KeyBuilder::new("flashinfer-jit", 1)
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
        // (workspace, uri) -> files of cached_ops/<uri>/ ; and generated/<uri>/ members
        let mut modules: BTreeMap<(String, String), Vec<&FileEntry>> = BTreeMap::new();
        let mut generated: Vec<(usize, String, String)> = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            if out.is_decided(i) {
                continue;
            }
            let p: Vec<&str> = e.path.split('/').collect();
            if p.contains(&"cubins") {
                out.set(
                    i,
                    Decision::publish("downloaded cubin (sha256-verified on load)"),
                );
                continue;
            }
            match p.as_slice() {
                [ver, arch, "cached_ops", uri, _] => {
                    modules
                        .entry((format!("{ver}/{arch}"), uri.to_string()))
                        .or_default()
                        .push(e);
                }
                [ver, arch, "generated", uri, _, ..] => {
                    generated.push((i, format!("{ver}/{arch}"), uri.to_string()))
                }
                _ => out.set(
                    i,
                    Decision::skip(ReasonCategory::NotCache, "not a FlashInfer module file"),
                ),
            }
        }
        let mut complete = BTreeSet::new();
        let mut reasons = BTreeMap::new();
        for ((ws, uri), files) in &modules {
            let dir = format!("{ws}/cached_ops/{uri}");
            match module_state(host, &dir, uri, files) {
                Ok(()) => {
                    complete.insert((ws.clone(), uri.clone()));
                }
                Err(why) => {
                    reasons.insert((ws.clone(), uri.clone()), why);
                }
            }
        }
        for (i, e) in entries.iter().enumerate() {
            let p: Vec<&str> = e.path.split('/').collect();
            if let [ver, arch, "cached_ops", uri, _] = p.as_slice() {
                let k = (format!("{ver}/{arch}"), uri.to_string());
                out.set(
                    i,
                    match reasons.get(&k) {
                        None => {
                            Decision::publish("module built: .so linked and recorded in .ninja_log")
                        }
                        Some(why) => Decision::skip(ReasonCategory::Incomplete, why.clone()),
                    },
                );
            }
        }
        for (i, ws, uri) in generated {
            let built = complete.contains(&(ws, uri));
            out.set(
                i,
                if built {
                    Decision::publish("source of a built module")
                } else {
                    Decision::skip(
                        ReasonCategory::Incomplete,
                        "source of a module that is not built",
                    )
                },
            );
        }
        Ok(out.finish(|| Decision::skip(ReasonCategory::NotCache, "not a FlashInfer module file")))
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

export_policy!(FlashinferJit);

#[cfg(test)]
mod tests {
    use super::*;
    use jitship_policy_common::testing::{Tree, assert_paths, elf};

    const WS: &str = "0.7.4/90a";

    fn module(t: &Tree, uri: &str, linked: bool) {
        let d = format!("{WS}/cached_ops/{uri}");
        t.file(&format!("{d}/build.ninja"), "cuda_home = /usr/local/cuda\n")
            .file(&format!("{d}/prefill.cuda.o"), b"obj")
            .file(&format!("{d}/{uri}.so"), elf(100))
            .file(&format!("{WS}/generated/{uri}/prefill.cu"), b"src");
        let log = if linked {
            format!("# ninja log v5\n0\t10\t1\tprefill.cuda.o\tabc\n10\t20\t2\t{uri}.so\tdef\n")
        } else {
            "# ninja log v5\n0\t10\t1\tprefill.cuda.o\tabc\n".to_string()
        };
        t.file(&format!("{d}/.ninja_log"), log);
        for f in ["build.ninja", "prefill.cuda.o", &format!("{uri}.so")] {
            t.mtime(&format!("{d}/{f}"), 1_000_000);
        }
        t.mtime(&format!("{d}/.ninja_log"), 2_000_000);
    }

    #[test]
    fn modules() {
        let t = Tree::new();
        module(&t, "batch_prefill_bf16_sm90", true);
        module(&t, "unlinked_mod", false);
        module(&t, "relinking_mod", true);
        t.mtime(
            &format!("{WS}/cached_ops/relinking_mod/relinking_mod.so"),
            3_000_000,
        );
        module(&t, "cut_mod", true);
        t.file(
            &format!("{WS}/cached_ops/cut_mod/cut_mod.so"),
            &elf(100)[..80],
        );
        t.mtime(&format!("{WS}/cached_ops/cut_mod/cut_mod.so"), 1_000_000);
        t.file(
            &format!("{WS}/cached_ops/tmp/batch_prefill_bf16_sm90.lock"),
            b"",
        )
        .file("cubins/abc/kernel.cubin", b"cubin");
        let good = format!("{WS}/cached_ops/batch_prefill_bf16_sm90");
        assert_paths(
            &t.published(&FlashinferJit),
            &[
                &format!("{good}/build.ninja"),
                &format!("{good}/prefill.cuda.o"),
                &format!("{good}/batch_prefill_bf16_sm90.so"),
                &format!("{good}/.ninja_log"),
                &format!("{WS}/generated/batch_prefill_bf16_sm90/prefill.cu"),
                "cubins/abc/kernel.cubin",
            ],
        );
        let sel = t.select(&FlashinferJit);
        assert!(
            sel[&format!("{WS}/cached_ops/unlinked_mod/unlinked_mod.so")]
                .1
                .contains("does not record")
        );
        assert!(
            sel[&format!("{WS}/cached_ops/relinking_mod/build.ninja")]
                .1
                .contains("newer than .ninja_log")
        );
        assert!(
            sel[&format!("{WS}/cached_ops/cut_mod/cut_mod.so")]
                .1
                .contains("cut short")
        );
        assert!(
            sel[&format!("{WS}/cached_ops/tmp/batch_prefill_bf16_sm90.lock")]
                .1
                .contains("temp")
        );
    }

    #[test]
    fn key_needs_cuda_home() {
        let all: Vec<(&str, &str)> = KEY_FACTS.iter().map(|f| (*f, "v")).collect();
        assert!(
            FlashinferJit
                .compat_key(&Facts::from_pairs(all.clone()).unwrap())
                .is_ok()
        );
        let f: Vec<(&str, &str)> = all.into_iter().filter(|(n, _)| *n != "cuda.home").collect();
        assert_eq!(
            FlashinferJit.compat_key(&Facts::from_pairs(f).unwrap()),
            Err(PolicyError::MissingFact("cuda.home".into()))
        );
    }
}
