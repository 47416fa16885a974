//! Built-in policy for the Triton kernel cache (docs/jit-caches.md#triton).
//!
//! * Root: `~/.triton/cache`, moved by `TRITON_CACHE_DIR`, or `$TRITON_HOME/.triton/cache`.
//! * Complete: a kernel directory whose `__grp__<k>.json` (written last) parses and names only
//!   files of its own directory, all present, under the root being judged (a group naming
//!   another root is foreign; see `jitship_policy_common::triton`). Launcher `.so` and
//!   `*.autotune.json` files stand alone.
//! * Key: Triton's own key is triton_key (the installed Triton) + ptxas (bundled with Triton) +
//!   target arch + options; cubins also need a driver new enough for that toolchain, and the
//!   launcher `.so` is native code. So: `pkg.triton`, `gpu.arch`, `gpu.cc`, `driver.major`,
//!   `os.arch`. Not the GPU model within an arch, not Python (Triton's own key holds neither).
//! * Retention: the newest 3.

use jitship_policy_common::{Decisions, triton};
use jitship_policy_sdk::{
    Decision, Facts, FileEntry, Host, KeyBuilder, Policy, PolicyError, PolicyInfo, ReasonCategory,
    export_policy,
};

#[derive(Default)]
pub struct Triton;

impl Policy for Triton {
    fn info(&self) -> PolicyInfo {
        PolicyInfo {
            name: "triton".into(),
            version: "1.0.0".into(),
            cache_kind: "triton".into(),
            default_root: "~/.triton/cache".into(),
            root_env: vec!["TRITON_CACHE_DIR".into(), "TRITON_HOME/.triton/cache".into()],
            description: "Triton kernels: a kernel directory is complete when its __grp__ file parses and every child exists in it"
                .into(),
            settings: vec![],
        }
    }

    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
        KeyBuilder::new("triton", 1)
            .require_all(
                facts,
                &[
                    "pkg.triton",
                    "gpu.arch",
                    "gpu.cc",
                    "driver.major",
                    "os.arch",
                ],
            )?
            .build()
    }

    fn select(
        &self,
        host: &dyn Host,
        root: &str,
        entries: &[FileEntry],
    ) -> Result<Vec<Decision>, PolicyError> {
        let mut out = Decisions::with_never_publish(entries);
        let files = triton::kernel_files(entries, 0..entries.len(), "");
        triton::decide(host, root, entries, &files, &mut out);
        Ok(out.finish(|| {
            Decision::skip(
                ReasonCategory::NotCache,
                "not inside a Triton kernel directory",
            )
        }))
    }

    /// Only `__grp__*.json` group files are marked `embeds-root`.
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

export_policy!(Triton);

#[cfg(test)]
mod tests {
    use super::*;
    use jitship_policy_common::testing::{Tree, assert_paths};

    const H1: &str = "KHRPJVATUMNFU7C00XJCY5ZXPWAGYN97OP4FQJ6ND7QAAAAAAAAA";
    const H2: &str = "ZZRPJVATUMNFU7C00XJCY5ZXPWAGYN97OP4FQJ6ND7QBBBBBBBBB";

    #[test]
    fn complete_groups_publish_and_hard_cases_skip() {
        let t = Tree::new();
        let abs = t.abs();
        t.triton_kernel(H1, "add_kernel", &abs);
        t.triton_kernel(H2, "mul_kernel", &abs);
        // launcher directory: one .so, no group
        t.file(
            "CUDAUTILSAAAA/cuda_utils.cpython-312-x86_64-linux-gnu.so",
            b"elf",
        );
        // in-flight kernel: files but no group yet, and a tmp.pid_ directory
        t.file("INFLIGHTAAAA/k.ttir", b"x")
            .file("INFLIGHTAAAA/tmp.pid_42_abc/k.cubin", b"x");
        // truncated group file
        t.file("TRUNCATEDAAA/t.cubin", b"x").file(
            "TRUNCATEDAAA/__grp__t.json",
            br#"{"child_paths": {"t.cubin": "/ro"#,
        );
        // group naming a child in another kernel's directory
        let other = format!(r#"{{"child_paths": {{"o.cubin": "{abs}/{H1}/o.cubin"}}}}"#);
        t.file("OUTSIDEDIRAA/o.cubin", b"x")
            .file("OUTSIDEDIRAA/__grp__o.json", other);
        // group whose paths point at another cache root
        let foreign = r#"{"child_paths": {"f.cubin": "/other/root/FOREIGNAAAAA/f.cubin"}}"#;
        t.file("FOREIGNAAAAA/f.cubin", b"x")
            .file("FOREIGNAAAAA/__grp__f.json", foreign);
        // group naming a missing child; a group of garbage bytes; a relative child path
        let missing = format!(r#"{{"child_paths": {{"m.cubin": "{abs}/MISSINGAAAAA/m.cubin"}}}}"#);
        t.file("MISSINGAAAAA/__grp__m.json", missing);
        t.file("GARBAGEAAAAA/g.cubin", b"x")
            .file("GARBAGEAAAAA/__grp__g.json", [0xff, 0x00, 0x7b, 0x22]);
        t.file("RELATIVEAAAA/r.cubin", b"x").file(
            "RELATIVEAAAA/__grp__r.json",
            r#"{"child_paths": {"r.cubin": "../RELATIVEAAAA/r.cubin"}}"#,
        );
        // per-host and lock files, a stray file at the root
        t.file("gpu_p2p_access_cache_for_0,1.json", b"{}")
            .file("x.lock", b"")
            .file("README", b"x");

        let mut want: Vec<String> = Vec::new();
        for (h, k) in [(H1, "add_kernel"), (H2, "mul_kernel")] {
            for ext in ["source", "ttir", "ttgir", "llir", "ptx", "cubin", "json"] {
                want.push(format!("{h}/{k}.{ext}"));
            }
            want.push(format!("{h}/__grp__{k}.json"));
        }
        want.push("CUDAUTILSAAAA/cuda_utils.cpython-312-x86_64-linux-gnu.so".into());
        let want: Vec<&str> = want.iter().map(String::as_str).collect();
        assert_paths(&t.published(&Triton), &want);

        let sel = t.select(&Triton);
        assert!(
            sel["OUTSIDEDIRAA/__grp__o.json"]
                .1
                .contains("outside the group's own directory")
        );
        assert!(
            sel["FOREIGNAAAAA/__grp__f.json"]
                .1
                .contains("another cache root"),
            "{:?}",
            sel["FOREIGNAAAAA/__grp__f.json"]
        );
        assert!(
            sel["TRUNCATEDAAA/__grp__t.json"]
                .1
                .contains("not valid JSON")
        );
        assert!(
            sel["MISSINGAAAAA/__grp__m.json"]
                .1
                .contains("does not exist")
        );
        assert!(sel["RELATIVEAAAA/__grp__r.json"].1.contains("not absolute"));
        assert!(sel["INFLIGHTAAAA/k.ttir"].1.contains("in flight"));
        assert!(
            sel["gpu_p2p_access_cache_for_0,1.json"]
                .1
                .contains("per-host")
        );
        // Each skip in its category.
        for (path, category) in [
            ("OUTSIDEDIRAA/__grp__o.json", "foreign-root"),
            ("OUTSIDEDIRAA/o.cubin", "foreign-root"),
            ("FOREIGNAAAAA/__grp__f.json", "foreign-root"),
            ("TRUNCATEDAAA/__grp__t.json", "unparseable"),
            ("GARBAGEAAAAA/g.cubin", "unparseable"),
            ("RELATIVEAAAA/__grp__r.json", "unparseable"),
            ("MISSINGAAAAA/__grp__m.json", "incomplete"),
            ("INFLIGHTAAAA/k.ttir", "incomplete"),
            ("INFLIGHTAAAA/tmp.pid_42_abc/k.cubin", "temporary"),
            ("gpu_p2p_access_cache_for_0,1.json", "per-host"),
            ("x.lock", "lock"),
            ("README", "not-cache"),
        ] {
            assert!(
                sel[path].1.starts_with(&format!("{category}: ")),
                "{path}: {:?}",
                sel[path]
            );
        }
        // Triton finds a kernel's files through its group, whose child paths are absolute.
        let groups = [
            format!("{H1}/__grp__add_kernel.json"),
            format!("{H2}/__grp__mul_kernel.json"),
        ];
        let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
        assert_paths(&t.markers(&Triton), &groups);
        assert_paths(&t.embedding_root(&Triton), &groups);
        assert!(t.selection(&Triton).complete);
    }

    #[test]
    fn groups_canonicalize_to_the_same_bytes_from_any_root() {
        let (a, b) = (Tree::new(), Tree::new());
        a.triton_kernel(H1, "k", &a.abs());
        b.triton_kernel(H1, "k", &b.abs());
        let path = format!("{H1}/__grp__k.json");
        let read = |t: &Tree| std::fs::read(t.root().join(&path)).unwrap();
        let ca = Triton.canonicalize(&a.abs(), &path, &read(&a)).unwrap();
        let cb = Triton.canonicalize(&b.abs(), &path, &read(&b)).unwrap();
        assert_eq!(ca, cb, "canonical group bytes must not depend on the root");
        let at_b: serde_json::Value =
            serde_json::from_slice(&Triton.materialize(&b.abs(), &path, &ca).unwrap()).unwrap();
        assert_eq!(
            at_b,
            serde_json::from_slice::<serde_json::Value>(&read(&b)).unwrap()
        );
    }

    #[test]
    fn mixed_roots_publish_what_triton_would_load_from_this_root() {
        // A pod that installed kernels produced at another root (without relocation, as older
        // jitship did) and then compiled its own: its own kernels publish, the others are foreign.
        let t = Tree::new();
        let abs = t.abs();
        t.triton_kernel(H1, "installed_kernel", "/srv/producer/.triton/cache");
        t.triton_kernel(H2, "own_kernel", &abs);
        t.triton_kernel("THIRDAAAAAAA", "own_too", &abs);
        let sel = t.select(&Triton);
        let published = t.published(&Triton);
        assert_eq!(published.len(), 16, "{published:?}");
        assert!(
            published.iter().all(|p| !p.starts_with(H1)),
            "{published:?}"
        );
        let g = &sel[&format!("{H1}/__grp__installed_kernel.json")];
        assert!(
            !g.0 && g
                .1
                .contains("another cache root (/srv/producer/.triton/cache/...)"),
            "{g:?}"
        );
        let child = &sel[&format!("{H1}/installed_kernel.cubin")];
        assert!(
            !child.0 && child.1.contains("another cache root"),
            "{child:?}"
        );
    }

    #[test]
    fn key_factors_and_refusal() {
        let f = Facts::from_pairs([
            ("pkg.triton", "3.9.0"),
            ("gpu.arch", "sm_90"),
            ("gpu.cc", "9.0"),
            ("driver.major", "550"),
            ("os.arch", "x86_64"),
            ("host.name", "pod-7"),
            ("gpu.name", "NVIDIA H100 80GB HBM3"),
        ])
        .unwrap();
        assert_eq!(
            Triton.compat_key(&f).unwrap(),
            "triton@1;driver.major=550;gpu.arch=sm_90;gpu.cc=9.0;os.arch=x86_64;pkg.triton=3.9.0"
        );
        let weak = Facts::from_pairs([("gpu.arch", "sm_90")]).unwrap();
        assert_eq!(
            Triton.compat_key(&weak),
            Err(PolicyError::MissingFact("pkg.triton".into()))
        );
    }
}
