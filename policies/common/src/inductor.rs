//! TorchInductor trees (docs/jit-caches.md#inductor, docs/inductor-cpu.md#layout).
//!
//! Inductor writes its entries (`fxgraph/`, `aotautograd/`, generated `.py`/`.cpp`,
//! `.best_config`, `cache/<system hash>`) with `write_atomic` (`.<pid>.<tid>.tmp` + rename), so a
//! present file is complete. The exceptions are shared objects, which g++/ld write in place under
//! `locks/<key>.lock`: a `.so` counts only when its ELF headers are in place, and precompiled
//! headers (`precompiled_headers/*.h.gch`, present when the root is `$TMPDIR/torchinductor_$USER`
//! itself), which g++ writes in place: a `.gch` counts only once GCC has written its
//! identification ([`gch_complete`]). Triton kernels under `triton/<device>/<hash>/` follow the
//! Triton group rule (their group files embed the root). `locks/`, `*_CxxBuild/` and temp files
//! are never published.
//!
//! Markers (docs/inductor-cpu.md#layout): Inductor finds everything else through the
//! `fxgraph/` and `aotautograd/` entries (a hit there loads the wrapper and its kernels), and
//! trusts a kernel `.so` without re-probing it once its `.so.load_ok` exists. An install commits
//! these last, so a worker never hits an entry whose kernels are not in place yet.
//!
//! A root is *complete* ([`completeness`]) when no compiled kernel is newer than the newest
//! FX-graph/AOTAutograd entry: Inductor compiles a graph's kernels first and writes its
//! `fxgraph/` entry (then `aotautograd/`) last, so kernels without a later entry are a graph
//! still compiling (measured: a 37 s compile under `jitship watch` gave 5 such generations). A
//! policy answers it as its selection's `complete` (contract 2), so the generation is recorded as
//! incomplete and installs prefer the newest complete one.

use jitship_policy_sdk::{
    Decision, Facts, FileEntry, Host, KeyBuilder, PolicyError, ReasonCategory, facts, file_name,
    never_publish,
};

use crate::check::{elf_complete, gch_complete};
use crate::{Decisions, triton};

/// The precompiled-header directory Inductor keeps in `$TMPDIR/torchinductor_$USER`.
pub const PCH_DIR: &str = "precompiled_headers/";

/// Facts every Inductor key holds.
pub const KEY_FACTS: &[&str] = &[
    facts::PKG_TORCH,
    facts::PYTHON_VERSION,
    facts::PYTHON_SITE_PACKAGES,
    facts::PYTHON_INCLUDE,
    facts::OS_ARCH,
    facts::CPU_ISA,
    facts::CPU_FLAGS_DIGEST,
    facts::CPU_THREADS,
    facts::CXX_IDENTITY,
    facts::INDUCTOR_ENV_DIGEST,
];

/// Facts a GPU machine's key holds besides [`KEY_FACTS`].
pub const GPU_KEY_FACTS: &[&str] = &[
    facts::CUDA_RUNTIME,
    facts::GPU_NAME,
    facts::GPU_ARCH,
    facts::DRIVER_MAJOR,
];

/// Whether the facts describe a machine with a GPU torch will compile for.
pub fn has_gpu(facts: &Facts) -> bool {
    facts.get(facts::GPU_NAME).is_some()
        || facts
            .get(facts::GPU_COUNT)
            .is_some_and(|c| c.trim().parse::<u32>().map_or(true, |n| n > 0))
}

/// The Inductor key (shared with the `inductor-pch` kind, whose headers key on the same toolchain).
pub fn inductor_key(kind: &str, facts: &Facts) -> Result<String, PolicyError> {
    inductor_key_builder(kind, 2, facts)?.build()
}

/// What every key of compiled Inductor code holds (the [`inductor_key`] facts), for a kind that
/// keys on more (vLLM's compile cache adds `pkg.vllm`).
pub fn inductor_key_builder(
    kind: &str,
    schema: u32,
    facts: &Facts,
) -> Result<KeyBuilder, PolicyError> {
    let key = KeyBuilder::new(kind, schema)
        .require_all(facts, KEY_FACTS)?
        // Not installed is a value (a venv with Triton keys differently: docs/inductor-cpu.md); the
        // required pkg.torch above proves site-packages were read.
        .factor(
            facts::PKG_TRITON,
            facts.get(facts::PKG_TRITON).unwrap_or("none"),
        );
    Ok(if has_gpu(facts) {
        key.require_all(facts, GPU_KEY_FACTS)?
            .factor("device", "gpu")
    } else {
        key.factor("device", "cpu")
    })
}

/// Decides the undecided entries among `candidates` (indices into `entries`) under `base` ("" or
/// a directory ending with '/') as an Inductor cache directory; `root` is the absolute root the
/// entries live under.
pub fn decide(
    host: &dyn Host,
    root: &str,
    entries: &[FileEntry],
    candidates: impl IntoIterator<Item = usize>,
    base: &str,
    out: &mut Decisions,
) {
    let mut kernels = Vec::new();
    for i in candidates {
        let Some(e) = entries.get(i) else { continue };
        if out.is_decided(i) {
            continue;
        }
        let Some(rel) = e.path.strip_prefix(base) else {
            continue;
        };
        let parts: Vec<&str> = rel.split('/').collect();
        if parts[0] == "triton" {
            if parts.len() == 4 {
                kernels.push(triton::KernelFile {
                    index: i,
                    kernel_dir: format!("{base}triton/{}/{}", parts[1], parts[2]),
                    name: parts[3].to_string(),
                });
            } else {
                out.set(
                    i,
                    Decision::skip(
                        ReasonCategory::NotCache,
                        "unexpected path in Inductor's triton/<device>/<hash>/ tree",
                    ),
                );
            }
        } else if rel.starts_with(PCH_DIR) {
            out.set(i, precompiled_header(host, e));
        } else if file_name(rel).ends_with(".so") {
            out.set(
                i,
                match elf_complete(host, e) {
                    Ok(()) => Decision::publish("shared object complete (ELF headers in place)"),
                    Err(why) => Decision::skip(ReasonCategory::Incomplete, why),
                },
            );
        } else if is_marker(parts[0], rel) {
            out.set(
                i,
                Decision::publish(
                    "written atomically by Inductor; Inductor finds others through it",
                )
                .marker(),
            );
        } else {
            out.set(i, Decision::publish("written atomically by Inductor"));
        }
    }
    triton::decide(host, root, entries, &kernels, out);
}

/// Whether the file at `rel` (first component `top`) is how Inductor finds other files: an FX
/// graph or AOTAutograd entry, or a `.so.load_ok` dlopen-probe marker.
fn is_marker(top: &str, rel: &str) -> bool {
    top == "fxgraph" || top == "aotautograd" || rel.ends_with(".so.load_ok")
}

/// A file of Inductor's precompiled-header directory (`c<key>.h`, written atomically, and
/// `c<key>.h.gch`, written in place by g++).
pub fn precompiled_header(host: &dyn Host, e: &FileEntry) -> Decision {
    let name = file_name(&e.path);
    if name.ends_with(".h.gch") {
        match gch_complete(host, e) {
            Ok(()) => Decision::publish("precompiled header complete (GCC identification written)"),
            Err(why) => Decision::skip(ReasonCategory::Incomplete, why),
        }
    } else if name.ends_with(".h") {
        Decision::publish("header stub written atomically by Inductor")
    } else {
        Decision::skip(
            ReasonCategory::NotCache,
            "not an Inductor precompiled header",
        )
    }
}

/// Whether the Inductor tree under `base` is a complete cache (`Ok`), or why not: compiled
/// kernels (`.so` files, Triton `__grp__` group files) with no FX-graph entry at all, or newer than
/// the newest `fxgraph/`/`aotautograd/` entry. An empty tree, or one with entries only, is
/// complete. `entries` are everything the scan offered (temp and lock files are ignored here).
pub fn completeness(entries: &[FileEntry], base: &str) -> Result<(), String> {
    let mut newest_entry: Option<u64> = None;
    let mut fx_entries = 0usize;
    let mut kernels: Vec<&FileEntry> = Vec::new();
    for e in entries {
        let Some(rel) = e.path.strip_prefix(base) else {
            continue;
        };
        if never_publish(rel).is_some() || rel.starts_with(PCH_DIR) {
            continue;
        }
        let top = rel.split('/').next().unwrap_or(rel);
        let name = file_name(rel);
        if top == "fxgraph" || top == "aotautograd" {
            fx_entries += usize::from(top == "fxgraph");
            newest_entry = Some(newest_entry.map_or(e.mtime_ms, |n| n.max(e.mtime_ms)));
        } else if name.ends_with(".so") || (top == "triton" && name.starts_with("__grp__")) {
            kernels.push(e);
        }
    }
    let Some(newest) = newest_entry.filter(|_| fx_entries > 0) else {
        return match kernels.first() {
            None => Ok(()),
            Some(k) => Err(format!(
                "{} compiled kernel(s) (e.g. {}) but no fxgraph/ entry yet: Inductor writes a graph's entry after its kernels, so a graph is still compiling",
                kernels.len(),
                k.path
            )),
        };
    };
    let newer: Vec<&&FileEntry> = kernels.iter().filter(|k| k.mtime_ms > newest).collect();
    match newer.first() {
        None => Ok(()),
        Some(k) => Err(format!(
            "{} compiled kernel(s) (e.g. {}) newer than the newest fxgraph/aotautograd entry: a graph is still compiling",
            newer.len(),
            k.path
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Tree;

    fn entries(t: &Tree) -> Vec<FileEntry> {
        jitship_policy_sdk::DirHost::new(t.root())
            .entries()
            .unwrap()
    }

    #[test]
    fn kernels_without_an_fx_entry_are_an_incomplete_cache() {
        let t = Tree::new();
        assert_eq!(completeness(&entries(&t), ""), Ok(()));
        t.file("dv/cdvx.so", b"probe").mtime("dv/cdvx.so", 1_000);
        t.file("ex/cex.main.so", b"k")
            .mtime("ex/cex.main.so", 2_000);
        t.file("locks/cex.lock", b"");
        let why = completeness(&entries(&t), "").unwrap_err();
        assert!(why.starts_with("2 compiled kernel(s)"), "{why}");
        assert!(why.contains("no fxgraph/ entry"), "{why}");
        // An aotautograd entry alone does not make it complete: the FX entry names the kernels.
        t.file("aotautograd/a/e", b"p")
            .mtime("aotautograd/a/e", 3_000);
        assert!(completeness(&entries(&t), "").is_err());
        t.file("fxgraph/ab/k/e", b"p")
            .mtime("fxgraph/ab/k/e", 2_500);
        assert_eq!(completeness(&entries(&t), ""), Ok(()));
    }

    #[test]
    fn a_second_graph_compiling_after_a_complete_one_is_incomplete_until_its_entry() {
        let t = Tree::new();
        t.file("ex/cex.main.so", b"k")
            .mtime("ex/cex.main.so", 1_000);
        t.file("fxgraph/ab/k/e1", b"p")
            .mtime("fxgraph/ab/k/e1", 2_000);
        t.file("aotautograd/a/e1", b"p")
            .mtime("aotautograd/a/e1", 2_100);
        assert_eq!(completeness(&entries(&t), ""), Ok(()));
        t.file("ni/cni.main.so", b"k")
            .mtime("ni/cni.main.so", 5_000);
        t.file("triton/0/H/__grp__k.json", b"{}")
            .mtime("triton/0/H/__grp__k.json", 5_100);
        let why = completeness(&entries(&t), "").unwrap_err();
        assert!(why.starts_with("2 compiled kernel(s)"), "{why}");
        assert!(why.contains("newer than the newest"), "{why}");
        // Temp files and precompiled headers are not kernels of a graph.
        t.file("fxgraph/cd/k2/e2", b"p")
            .mtime("fxgraph/cd/k2/e2", 6_000);
        t.file("precompiled_headers/c1.h.gch", b"gpch")
            .mtime("precompiled_headers/c1.h.gch", 9_000);
        t.file("xx/c_CxxBuild/o.so", b"o")
            .mtime("xx/c_CxxBuild/o.so", 9_000);
        assert_eq!(completeness(&entries(&t), ""), Ok(()));
        // Under a base directory, only that tree counts.
        assert_eq!(completeness(&entries(&t), "elsewhere/"), Ok(()));
    }

    #[test]
    fn a_precompiled_header_counts_once_gcc_wrote_its_identification() {
        let t = Tree::new();
        t.file(
            "precompiled_headers/cabc.h",
            b"#include <torch/csrc/inductor/cpp_prefix.h>\n",
        )
        .file("precompiled_headers/cabc.h.gch", b"gpch+014\x18\xa4rest")
        .file("precompiled_headers/cdef.h.gch", b"gpcWrite\x00\x00partial")
        .file("precompiled_headers/cshort.h.gch", b"gp")
        .file("precompiled_headers/locks/cabc.lock", b"");
        let mut out = Decisions::with_never_publish(&entries(&t));
        let es = entries(&t);
        let host = jitship_policy_sdk::DirHost::new(t.root());
        decide(&host, &t.abs(), &es, 0..es.len(), "", &mut out);
        let d = out.finish(|| Decision::skip(ReasonCategory::NotCache, "undecided"));
        let by: std::collections::BTreeMap<&str, &Decision> =
            es.iter().map(|e| e.path.as_str()).zip(&d).collect();
        assert!(by["precompiled_headers/cabc.h"].is_publish());
        assert!(by["precompiled_headers/cabc.h.gch"].is_publish());
        assert!(!by["precompiled_headers/cdef.h.gch"].is_publish());
        assert!(
            by["precompiled_headers/cdef.h.gch"]
                .detail
                .contains("gpcWrite")
        );
        assert!(!by["precompiled_headers/cshort.h.gch"].is_publish());
        assert!(!by["precompiled_headers/locks/cabc.lock"].is_publish());
    }
}
