//! Built-in policy for the TorchInductor cache (research/jit-caches.md §1.2, §2.2;
//! research/inductor-cpu.md).
//!
//! * Root: `$TMPDIR/torchinductor_${USER}`, moved by `TORCHINDUCTOR_CACHE_DIR`.
//! * Complete: entries written with `write_atomic` are complete when present; a `.so` (written in
//!   place by the linker) only when its ELF headers are in place; `triton/<dev>/<hash>/` kernels by
//!   the Triton group rule. Never `locks/`, `*_CxxBuild/`, `.<pid>.<tid>.tmp`, `tmp.<uuid>/`.
//! * Key: Inductor's system key is torch_key + triton_key + CUDA version + **GPU name** (not just
//!   the arch); Triton cubins inside need a driver new enough; generated `.so` files embed
//!   absolute include paths of the Python and torch install: `pkg.torch`, `pkg.triton`,
//!   `cuda.runtime`, `gpu.name`, `gpu.arch`, `driver.major`, `python.version` (patch),
//!   `python.site_packages`, `os.arch`.
//! * Retention: the newest 3.

use jitship_policy_common::{Decisions, inductor, triton};
use jitship_policy_sdk::{
    Decision, Facts, FileEntry, Host, KeyBuilder, Policy, PolicyError, PolicyInfo, ReasonCategory,
    export_policy,
};

#[derive(Default)]
pub struct Inductor;

pub const KEY_FACTS: &[&str] = &[
    "pkg.torch",
    "pkg.triton",
    "cuda.runtime",
    "gpu.name",
    "gpu.arch",
    "driver.major",
    "python.version",
    "python.site_packages",
    "os.arch",
];

impl Policy for Inductor {
    fn info(&self) -> PolicyInfo {
        PolicyInfo {
            name: "inductor".into(),
            version: "1.0.0".into(),
            cache_kind: "inductor".into(),
            default_root: "$TMPDIR/torchinductor_${USER}".into(),
            root_env: vec!["TORCHINDUCTOR_CACHE_DIR".into()],
            description: "TorchInductor: atomic entries as they appear, .so files once their ELF headers are in place, Triton kernels by group file".into(),
        }
    }

    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
        KeyBuilder::new("inductor", 1)
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
        inductor::decide(host, root, entries, 0..entries.len(), "", &mut out);
        Ok(
            out.finish(|| {
                Decision::skip(ReasonCategory::NotCache, "not part of an Inductor cache")
            }),
        )
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

    #[test]
    fn key_needs_gpu_name_and_python_patch() {
        let all: Vec<(&str, &str)> = KEY_FACTS.iter().map(|f| (*f, "v")).collect();
        assert!(
            Inductor
                .compat_key(&Facts::from_pairs(all.clone()).unwrap())
                .is_ok()
        );
        for missing in KEY_FACTS {
            let f: Vec<(&str, &str)> = all.iter().copied().filter(|(n, _)| n != missing).collect();
            assert_eq!(
                Inductor.compat_key(&Facts::from_pairs(f).unwrap()),
                Err(PolicyError::MissingFact(missing.to_string()))
            );
        }
    }
}
