//! Large trees shaped like real caches of every built-in kind (units repeated with distinct hashes,
//! in the proportions of docs/jit-caches.md#sizes-and-counts), for the scale test of the built-in
//! policies (`policy_scale`) and the policy benchmark.
//!
//! Only files a policy reads are written to disk (group files, shared objects, indexes, ninja
//! logs, autotune tables); the rest exist only as entries, so a 100,000-entry tree of each kind
//! costs seconds, not minutes. A policy never stats a file, so it cannot tell the difference.

use std::path::Path;

use jitship::policy::FileEntry;

use crate::policy_fixtures::elf;

const T0: u64 = 1_700_000_000_000;

struct Builder<'a> {
    root: &'a Path,
    abs: String,
    entries: Vec<FileEntry>,
}

impl Builder<'_> {
    /// An entry whose content no policy reads.
    fn entry(&mut self, rel: String, size: u64) {
        self.entry_at(rel, size, T0);
    }

    fn entry_at(&mut self, rel: String, size: u64, mtime_ms: u64) {
        self.entries.push(FileEntry {
            path: rel,
            size,
            mtime_ms,
        });
    }

    /// An entry written to disk, for a file policies read.
    fn file(&mut self, rel: String, bytes: impl AsRef<[u8]>) {
        self.file_at(rel, bytes, T0);
    }

    fn file_at(&mut self, rel: String, bytes: impl AsRef<[u8]>, mtime_ms: u64) {
        let path = self.root.join(&rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, bytes.as_ref()).expect("write");
        self.entry_at(rel, bytes.as_ref().len() as u64, mtime_ms);
    }

    /// A Triton kernel directory (`<dir>/`): seven children and the group naming them.
    fn triton_kernel(&mut self, dir: &str, kernel: &str) {
        let mut children = Vec::new();
        for ext in ["source", "ttir", "ttgir", "llir", "ptx", "cubin", "json"] {
            let name = format!("{kernel}.{ext}");
            children.push(format!(
                "\"{name}\": \"{}/{dir}/{name}\"",
                self.abs.trim_end_matches('/')
            ));
            self.entry(format!("{dir}/{name}"), 20_000);
        }
        let group = format!("{{\"child_paths\": {{{}}}}}", children.join(", "));
        self.file(format!("{dir}/__grp__{kernel}.json"), group);
    }

    /// One Inductor compile's worth of entries under `base` ("" or ending with '/').
    fn inductor_unit(&mut self, base: &str, i: usize) {
        let h = hash(i);
        self.entry(format!("{base}fxgraph/{}/f{h}/e{h}", &h[..2]), 40_000);
        self.entry(format!("{base}aotautograd/a{h}/e{h}"), 30_000);
        self.entry(format!("{base}{}/c{h}.py", &h[..2]), 8_000);
        self.entry(format!("{base}{}/c{h}w.py", &h[..2]), 8_000);
        self.entry(format!("{base}{}/c{h}.main.cpp", &h[2..4]), 12_000);
        self.file(format!("{base}{}/c{h}.main.so", &h[2..4]), elf(64));
        self.triton_kernel(&format!("{base}triton/0/{h}"), &format!("triton_poi_{i}"));
    }
}

/// A 52-character Triton-like hash for unit `i`. (Also compiled into the engine's policy bench,
/// under the workspace's ban on raw blake3: a fixture name, not a content hash.)
#[allow(clippy::disallowed_methods)]
fn hash(i: usize) -> String {
    let b = blake3::hash(&(i as u64).to_le_bytes()).to_hex();
    b[..52].to_uppercase()
}

/// Writes a tree of `kind` with at least `min_entries` entries under `root` (absolute, empty) and
/// returns its entries, sorted by path as a scan would give them.
pub fn tree(kind: &str, root: &Path, min_entries: usize) -> Vec<FileEntry> {
    let mut b = Builder {
        root,
        abs: root.display().to_string(),
        entries: Vec::with_capacity(min_entries + 200),
    };
    let mut i = 0;
    while b.entries.len() < min_entries {
        match kind {
            "triton" => {
                let h = hash(i);
                b.triton_kernel(&h, &format!("kernel_{i}"));
                if i % 50 == 0 {
                    b.file(format!("{h}L/cuda_utils.so"), elf(64));
                }
            }
            "inductor" => b.inductor_unit("", i),
            "vllm-compile" | "sglang-compile" => {
                // One model hash with 8 ranks per 8 units: per rank, a prefix directory with its
                // index and artifacts, an inductor cache and a triton cache.
                let index_name = if kind == "vllm-compile" {
                    "vllm_compile_cache.py"
                } else {
                    "sglang_compile_cache.py"
                };
                let rank = format!("{}/rank_{}_0", &hash(i / 8)[..10], i % 8);
                let mut index = String::from("{");
                for a in 0..16 {
                    let name = format!("artifact_compile_range_1_2048_subgraph_{a}");
                    b.entry(format!("{rank}/backbone/{name}"), 50_000);
                    index.push_str(&format!(
                        "(Range(start=1, end=2048), {a}, 'inductor'): {{'graph_handle': ('{name}', '/x')}}, "
                    ));
                }
                index.push('}');
                b.entry(format!("{rank}/backbone/cache_key_factors.json"), 2_000);
                b.entry(format!("{rank}/backbone/computation_graph.py"), 90_000);
                b.file(format!("{rank}/backbone/{index_name}"), index);
                for u in 0..4 {
                    b.inductor_unit(&format!("{rank}/inductor_cache/"), i * 4 + u);
                }
                for k in 0..2 {
                    b.triton_kernel(
                        &format!("{rank}/triton_cache/{}", hash(1_000_000 + i * 2 + k)),
                        &format!("kernel_{k}"),
                    );
                }
            }
            "flashinfer-jit" => {
                let d = format!("0.7.4/90a/cached_ops/op_{i}");
                b.entry(format!("{d}/build.ninja"), 3_000);
                b.entry(format!("{d}/.ninja_deps"), 1_000);
                for o in 0..4 {
                    b.entry(format!("{d}/part_{o}.cuda.o"), 200_000);
                    b.entry(format!("0.7.4/90a/generated/op_{i}/part_{o}.cu"), 20_000);
                }
                b.file(format!("{d}/op_{i}.so"), elf(64));
                let log = format!(
                    "# ninja log v5\n0\t10\t1\tpart_0.cuda.o\tabc\n10\t20\t2\top_{i}.so\tdef\n"
                );
                b.file_at(format!("{d}/.ninja_log"), log, T0 + 1_000);
            }
            "inductor-pch" => {
                // A header stub and the precompiled header g++ finished (GCC's identification).
                let h = &hash(i)[..20];
                b.entry(format!("c{h}.h"), 120);
                b.file(format!("c{h}.h.gch"), b"gpch+014\x18\xa4 the header");
            }
            "flashinfer-autotune" => {
                let d = format!("0.7.4/90a/{}", &hash(i)[..16]);
                for r in 0..8 {
                    b.file(
                        format!("{d}/autotune_configs_dp0_rank{r}.json"),
                        br#"{"fp8_gemm": {"m=128": [1, 2]}}"#,
                    );
                }
            }
            "deepgemm" => {
                let d = format!("cache/kernel.sm90_fp8_gemm.{}", &hash(i)[..32]);
                for f in ["kernel.cu", "kernel.cubin", "kernel.ptx"] {
                    b.entry(format!("{d}/{f}"), 40_000);
                }
            }
            "cuda-computecache" => {
                let h = hash(i);
                b.entry(format!("{}/{}/{}", &h[..2], &h[2..4], &h[4..20]), 60_000);
            }
            "sglang-jit" => {
                let d = format!(
                    "cuda_sm90/op_{i}/build-{}/deps-{}",
                    &hash(i)[..16],
                    &hash(i + 7)[..16]
                );
                b.entry(format!("{d}/sgl_deps.json"), 200);
                b.entry(format!("{d}/op_{i}.so"), 300_000);
            }
            "tilelang" => {
                let d = hash(i)[..16].to_string();
                for f in ["kernel.cu", "wrapped_kernel.cu", "params.pkl"] {
                    b.entry(format!("{d}/{f}"), 10_000);
                }
                b.file(format!("{d}/kernel_lib.so"), elf(64));
            }
            "cute-dsl" => b.entry(format!("{}/kernel.o", &hash(i)[..16]), 30_000),
            // vLLM's model-inspection cache: one JSON per model class and source hash, flat.
            "vllm-modelinfos" => b.entry(format!("Model{i}-{}.json", &hash(i)[..32]), 1_500),
            "tvm-ffi" => {
                let d = format!("ext_{i}");
                b.entry(format!("{d}/build.ninja"), 2_000);
                b.entry(format!("{d}/main.o"), 50_000);
                b.file(format!("{d}/ext_{i}.so"), elf(64));
                b.file_at(format!("{d}/.ninja_log"), "# ninja log v5\n", T0 + 1_000);
            }
            other => panic!("no scale tree for cache kind {other}"),
        }
        i += 1;
    }
    b.entries.sort_by(|a, c| a.path.cmp(&c.path));
    b.entries
}
