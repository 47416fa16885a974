//! Built-in policy for the TorchInductor cache (docs/jit-caches.md#inductor,
//! docs/inductor-cpu.md).
//!
//! * Root: `$TMPDIR/torchinductor_${USER}`, moved by `TORCHINDUCTOR_CACHE_DIR`.
//! * Complete: entries written with `write_atomic` are complete when present; a `.so` (written in
//!   place by the linker) only when its ELF headers are in place; `triton/<dev>/<hash>/` kernels by
//!   the Triton group rule; `precompiled_headers/*.h.gch` once g++ stamped its identification.
//!   Never `locks/`, `*_CxxBuild/`, `.<pid>.<tid>.tmp`, `tmp.<uuid>/`.
//! * Complete cache (the selection's `complete`): no compiled kernel (`.so`, Triton group) newer
//!   than the newest `fxgraph/`/`aotautograd/` entry, i.e. no graph still compiling; otherwise
//!   the generation is recorded as incomplete and installs prefer the newest complete one.
//! * Key (schema 2): what torch's own keys depend on beyond the cache directory
//!   (docs/inductor-cpu.md#what-the-keys-hold), so that a consumer torch would miss on, recompile
//!   for, or fail on gets a jitship miss instead: the torch and Triton versions (`pkg.triton` =
//!   `none` when not installed), `python.version` (patch), the absolute install paths the kernel
//!   command lines hold (`python.site_packages`: the venv and torch's include/lib dirs;
//!   `python.include`), `os.arch`, and the CPU side every machine compiles for: `cpu.isa` (the
//!   kernels' ISA defines and flags), `cpu.flags_digest` (`-march=native`), `cpu.threads` (in the
//!   FX-graph key), `cxx.identity` (compiler name and `-v`), `inductor.env_digest` (the config).
//!   On a GPU machine (`gpu.count` > 0, or a `gpu.name` known) also `cuda.runtime`, `gpu.name`
//!   (Inductor's system key holds the device name), `gpu.arch`, `driver.major`; a CPU-only
//!   machine (`gpu.count` = 0 or unknown, no `gpu.name`) needs no GPU fact.
//! * Retention: the newest 3.

use jitship_policy_common::inductor::{self, inductor_key};
use jitship_policy_common::{Decisions, triton};
use jitship_policy_sdk::{
    Completeness, Decision, Facts, FileEntry, Host, Policy, PolicyError, PolicyInfo,
    ReasonCategory, export_policy,
};

#[derive(Default)]
pub struct Inductor;

impl Policy for Inductor {
    fn info(&self) -> PolicyInfo {
        PolicyInfo {
            name: "inductor".into(),
            version: "2.0.0".into(),
            cache_kind: "inductor".into(),
            default_root: "$TMPDIR/torchinductor_${USER}".into(),
            root_env: vec!["TORCHINDUCTOR_CACHE_DIR".into()],
            description: "TorchInductor: atomic entries as they appear, .so files once their ELF headers are in place, precompiled headers once g++ finished them, Triton kernels by group file; keyed on the CPU (ISA, flags, threads, compiler) and the GPU when there is one".into(),
            settings: vec![],
        }
    }

    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
        inductor_key("inductor", facts)
    }

    fn select(
        &self,
        host: &dyn Host,
        root: &str,
        entries: &[FileEntry],
    ) -> Result<Vec<Decision>, PolicyError> {
        let mut out = Decisions::with_never_publish(entries);
        inductor::decide(host, root, entries, 0..entries.len(), "", &mut out);
        Ok(
            out.finish(|| {
                Decision::skip(ReasonCategory::NotCache, "not part of an Inductor cache")
            }),
        )
    }

    /// Incomplete while a graph is still compiling: compiled kernels newer than the newest
    /// FX-graph/AOTAutograd entry, or with no FX-graph entry at all
    /// ([`inductor::completeness`]).
    fn completeness(
        &self,
        _host: &dyn Host,
        _root: &str,
        entries: &[FileEntry],
        _decisions: &[Decision],
    ) -> Result<Completeness, PolicyError> {
        Ok(match inductor::completeness(entries, "") {
            Ok(()) => Completeness::Complete,
            Err(why) => Completeness::Incomplete(why),
        })
    }

    /// Only `triton/<dev>/<hash>/__grp__*.json` files are marked `embeds-root`.
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

export_policy!(Inductor);

#[cfg(test)]
mod tests {
    use super::*;
    use jitship_policy_common::inductor::{GPU_KEY_FACTS, KEY_FACTS};
    use jitship_policy_common::testing::{Tree, assert_paths, elf};

    #[test]
    fn inductor_tree() {
        let t = Tree::new();
        let abs = t.abs();
        t.file("fxgraph/pe/fpegyiq3v3wz/fcktj476mi6x", b"pickle")
            .file("aotautograd/aum56c7mhu3x/i4arff5cfkq2", b"pickle")
            .file("s5/cs5crfr7fofx.py", b"# wrapper")
            .file("ex/cexa62frrkzf.main.cpp", b"// kernel")
            .file("ex/cexa62frrkzf.main.so", elf(500))
            .file("ni/cnil5uz245tw.main.cpp", b"// kernel")
            .file("ni/cnil5uz245tw.main.so", &elf(500)[..300]) // linker still writing
            .file("dv/cdvx2tvfeqbc.so.load_ok", b"")
            .file("iw/ciwzrk3ittdq.best_config", b"{}")
            .file("locks/cexa62frrkzf.lock", b"")
            .file("fxgraph/ab/abcdef/.4242.17.tmp", b"partial")
            .file("ex/cexa62frrkzf_CxxBuild/o.o", b"obj")
            .file("triton/0/tmp.1f2e3d4c/k.cubin", b"bundle in flight");
        t.triton_kernel("triton/0/HASHAAAAAAAA", "triton_poi_fused_0", &abs);
        t.file("triton/0/TRUNCAAAAAAAA/k.cubin", b"x")
            .file("triton/0/TRUNCAAAAAAAA/__grp__k.json", b"{\"child_p");
        // Inductor writes a graph's FX/AOT entries after its kernels.
        t.mtime("fxgraph/pe/fpegyiq3v3wz/fcktj476mi6x", 4_000_000_000_000)
            .mtime("aotautograd/aum56c7mhu3x/i4arff5cfkq2", 4_000_000_000_000);
        let mut want = vec![
            "fxgraph/pe/fpegyiq3v3wz/fcktj476mi6x".to_string(),
            "aotautograd/aum56c7mhu3x/i4arff5cfkq2".into(),
            "s5/cs5crfr7fofx.py".into(),
            "ex/cexa62frrkzf.main.cpp".into(),
            "ex/cexa62frrkzf.main.so".into(),
            "ni/cnil5uz245tw.main.cpp".into(),
            "dv/cdvx2tvfeqbc.so.load_ok".into(),
            "iw/ciwzrk3ittdq.best_config".into(),
            "triton/0/HASHAAAAAAAA/__grp__triton_poi_fused_0.json".into(),
        ];
        for ext in ["source", "ttir", "ttgir", "llir", "ptx", "cubin", "json"] {
            want.push(format!("triton/0/HASHAAAAAAAA/triton_poi_fused_0.{ext}"));
        }
        let want: Vec<&str> = want.iter().map(String::as_str).collect();
        assert_paths(&t.published(&Inductor), &want);
        let sel = t.select(&Inductor);
        assert!(sel["ni/cnil5uz245tw.main.so"].1.starts_with("incomplete: "));
        assert!(sel["ni/cnil5uz245tw.main.so"].1.contains("cut short"));
        assert!(sel["locks/cexa62frrkzf.lock"].1.starts_with("lock: "));
        assert!(
            sel["fxgraph/ab/abcdef/.4242.17.tmp"]
                .1
                .starts_with("temporary: ")
        );
        assert!(
            sel["triton/0/TRUNCAAAAAAAA/__grp__k.json"]
                .1
                .starts_with("unparseable: ")
        );
        // Inductor finds kernels through its FX/AOT entries, load_ok probes and Triton groups.
        assert_paths(
            &t.markers(&Inductor),
            &[
                "fxgraph/pe/fpegyiq3v3wz/fcktj476mi6x",
                "aotautograd/aum56c7mhu3x/i4arff5cfkq2",
                "dv/cdvx2tvfeqbc.so.load_ok",
                "triton/0/HASHAAAAAAAA/__grp__triton_poi_fused_0.json",
            ],
        );
        assert_paths(
            &t.embedding_root(&Inductor),
            &["triton/0/HASHAAAAAAAA/__grp__triton_poi_fused_0.json"],
        );
        assert!(t.selection(&Inductor).complete);
    }

    #[test]
    fn a_graph_still_compiling_makes_the_selection_incomplete() {
        let t = Tree::new();
        t.file("ex/cex.main.so", elf(500))
            .mtime("ex/cex.main.so", 1_000)
            .file("fxgraph/ab/k/e1", b"p")
            .mtime("fxgraph/ab/k/e1", 2_000)
            .file("aotautograd/a/e1", b"p")
            .mtime("aotautograd/a/e1", 2_100);
        let sel = t.selection(&Inductor);
        assert!(sel.complete && sel.incomplete_detail.is_empty(), "{sel:?}");
        // A second graph's kernel, its entries not written yet: every file still publishes, but
        // the cache is recorded as incomplete.
        t.file("ni/cni.main.so", elf(500))
            .mtime("ni/cni.main.so", 5_000);
        let sel = t.selection(&Inductor);
        assert!(!sel.complete, "{sel:?}");
        assert!(
            sel.incomplete_detail.contains("newer than the newest"),
            "{}",
            sel.incomplete_detail
        );
        assert_eq!(t.published(&Inductor).len(), 4);
        t.file("fxgraph/cd/k2/e2", b"p")
            .mtime("fxgraph/cd/k2/e2", 6_000);
        assert!(t.selection(&Inductor).complete);
    }

    #[test]
    fn triton_groups_relocate() {
        let t = Tree::new();
        t.triton_kernel("triton/0/HASHAAAAAAAA", "k", &t.abs());
        let path = "triton/0/HASHAAAAAAAA/__grp__k.json";
        let bytes = std::fs::read(t.root().join(path)).unwrap();
        let canon = Inductor.canonicalize(&t.abs(), path, &bytes).unwrap();
        let there: serde_json::Value =
            serde_json::from_slice(&Inductor.materialize("/new/root", path, &canon).unwrap())
                .unwrap();
        assert_eq!(
            there["child_paths"]["k.cubin"],
            "/new/root/triton/0/HASHAAAAAAAA/k.cubin"
        );
    }

    fn cpu_facts() -> Vec<(&'static str, &'static str)> {
        KEY_FACTS.iter().map(|f| (*f, "v")).collect()
    }

    #[test]
    fn a_cpu_machine_keys_on_cpu_facts_with_no_gpu_placeholder() {
        let cpu = cpu_facts();
        let key = Inductor
            .compat_key(&Facts::from_pairs(cpu.clone()).unwrap())
            .unwrap();
        assert!(key.contains("device=cpu"), "{key}");
        assert!(key.contains("pkg.triton=none"), "{key}");
        assert!(!key.contains("gpu."), "{key}");
        for missing in KEY_FACTS {
            let f: Vec<(&str, &str)> = cpu.iter().copied().filter(|(n, _)| n != missing).collect();
            assert_eq!(
                Inductor.compat_key(&Facts::from_pairs(f).unwrap()),
                Err(PolicyError::MissingFact(missing.to_string()))
            );
        }
        // Each CPU fact changes the key (a consumer that differs misses).
        for changed in [
            "cpu.isa",
            "cpu.threads",
            "cxx.identity",
            "python.site_packages",
        ] {
            let f: Vec<(&str, &str)> = cpu
                .iter()
                .map(|(n, v)| (*n, if *n == changed { "other" } else { *v }))
                .collect();
            assert_ne!(
                Inductor.compat_key(&Facts::from_pairs(f).unwrap()).unwrap(),
                key
            );
        }
        // "No GPU" as the driver reports it is a CPU machine too.
        let mut zero = cpu.clone();
        zero.push(("gpu.count", "0"));
        assert_eq!(
            Inductor
                .compat_key(&Facts::from_pairs(zero).unwrap())
                .unwrap(),
            key
        );
    }

    #[test]
    fn a_gpu_machine_still_keys_on_the_gpu_facts() {
        let mut gpu = cpu_facts();
        gpu.push(("gpu.count", "8"));
        let cpu_key = Inductor
            .compat_key(&Facts::from_pairs(cpu_facts()).unwrap())
            .unwrap();
        for missing in GPU_KEY_FACTS {
            let mut f = gpu.clone();
            f.extend(
                GPU_KEY_FACTS
                    .iter()
                    .filter(|n| *n != missing)
                    .map(|n| (*n, "v")),
            );
            assert_eq!(
                Inductor.compat_key(&Facts::from_pairs(f).unwrap()),
                Err(PolicyError::MissingFact(missing.to_string()))
            );
        }
        gpu.extend(GPU_KEY_FACTS.iter().map(|n| (*n, "v")));
        let key = Inductor
            .compat_key(&Facts::from_pairs(gpu).unwrap())
            .unwrap();
        assert!(
            key.contains("device=gpu") && key.contains("gpu.name=v"),
            "{key}"
        );
        assert_ne!(key, cpu_key);
    }

    #[test]
    fn precompiled_headers_inside_the_root_publish_once_complete() {
        let t = Tree::new();
        t.file("precompiled_headers/cabc.h", b"#include <x>\n")
            .file("precompiled_headers/cabc.h.gch", b"gpch+014 done")
            .file("precompiled_headers/cdef.h.gch", b"gpcWrite half");
        assert_paths(
            &t.published(&Inductor),
            &[
                "precompiled_headers/cabc.h",
                "precompiled_headers/cabc.h.gch",
            ],
        );
    }
}
