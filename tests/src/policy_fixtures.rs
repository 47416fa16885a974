//! Fixture trees for the golden tests of the built-in policies: one per cache kind, each with
//! complete entries and the hard cases of docs/jit-caches.md#hard-cases (truncated group files,
//! group files pointing outside the root or their own directory, in-flight temp directories and
//! files, lock files, per-host files, outputs newer than ninja's log, cut-short shared objects).
//! Everything is deterministic: contents are fixed and every mtime is set explicitly.

use std::path::Path;

/// A facts set describing one H100 worker, with every fact any built-in policy keys on.
pub fn worker_facts() -> Vec<(&'static str, &'static str)> {
    vec![
        ("gpu.name", "NVIDIA H100 80GB HBM3"),
        ("gpu.count", "8"),
        ("gpu.cc", "9.0"),
        ("gpu.arch", "sm_90"),
        ("driver.version", "550.54.15"),
        ("driver.major", "550"),
        ("cuda.runtime", "12.4"),
        ("cuda.nvcc", "12.4"),
        ("cuda.home", "/usr/local/cuda-12.4"),
        ("python.version", "3.12.3"),
        ("python.executable", "/opt/venv/bin/python"),
        (
            "python.site_packages",
            "/opt/venv/lib/python3.12/site-packages",
        ),
        ("pkg.torch", "2.15.0"),
        ("pkg.triton", "3.9.0"),
        ("pkg.vllm", "0.34.0"),
        ("pkg.sglang", "0.5.23"),
        ("pkg.flashinfer_python", "0.7.4"),
        ("pkg.deep_gemm", "2.6.1"),
        ("pkg.tilelang", "0.1.7"),
        ("pkg.nvidia_cutlass_dsl", "4.3.2"),
        ("pkg.apache_tvm_ffi", "0.1.2"),
        ("model.id", "Qwen/Qwen3-8B"),
        ("model.revision", "9c925d6"),
        ("engine.config_digest", "b3:5f1c2d3e"),
        ("os.arch", "x86_64"),
        ("python.include", "/usr/include/python3.12"),
        ("cpu.isa", "avx512_vnni"),
        ("cpu.flags_digest", "b3:0c1d2e3f"),
        ("cpu.threads", "96"),
        ("cxx.identity", "b3:9a8b7c6d"),
        ("inductor.env_digest", "b3:af1349b9"),
        ("host.name", "vllm-0"),
    ]
}

const T0: u64 = 1_700_000_000_000;

fn file(root: &Path, rel: &str, bytes: impl AsRef<[u8]>) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(&p, bytes).expect("write");
    mtime(root, rel, T0);
}

fn mtime(root: &Path, rel: &str, ms: u64) {
    let f = std::fs::File::options()
        .write(true)
        .open(root.join(rel))
        .expect("open");
    f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
        .expect("mtime");
}

/// A complete ELF64 image (header, `len` bytes, one section header at the end): the one the
/// policies' own unit tests use.
pub use jitship_policy_common::testing::elf;

/// A Triton kernel directory whose group names its files under `abs_root`.
fn triton_kernel(root: &Path, dir: &str, kernel: &str, abs_root: &str) {
    let mut children = serde_json::Map::new();
    for ext in ["source", "ttir", "ttgir", "llir", "ptx", "cubin", "json"] {
        let name = format!("{kernel}.{ext}");
        file(root, &format!("{dir}/{name}"), format!("{kernel} {ext}"));
        children.insert(name.clone(), format!("{abs_root}/{dir}/{name}").into());
    }
    file(
        root,
        &format!("{dir}/__grp__{kernel}.json"),
        serde_json::json!({ "child_paths": children }).to_string(),
    );
}

/// Triton's hard cases under `area` ("" or ending with '/').
fn triton_cases(root: &Path, area: &str) {
    let abs = root.display().to_string();
    triton_kernel(
        root,
        &format!("{area}KHRPJVATUMNFU7C00XJCY5ZXPWAGYN97OP4FQJ6ND7QAAAAAAAAA"),
        "add_kernel",
        &abs,
    );
    triton_kernel(
        root,
        &format!("{area}MULPJVATUMNFU7C00XJCY5ZXPWAGYN97OP4FQJ6ND7QBBBBBBBBB"),
        "mul_kernel",
        &abs,
    );
    file(
        root,
        &format!(
            "{area}LAUNCHERUTILSAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA/cuda_utils.cpython-312-x86_64-linux-gnu.so"
        ),
        elf(64),
    );
    // compile in flight: IR files, no group yet, and Triton's own temp directory
    file(root, &format!("{area}INFLIGHTAAAA/k.ttir"), b"ir");
    file(
        root,
        &format!("{area}INFLIGHTAAAA/tmp.pid_4242_5f1c2d3e/k.cubin"),
        b"partial",
    );
    // truncated group file (a reboot cut the write)
    file(root, &format!("{area}TRUNCATEDAAA/t.cubin"), b"cubin");
    file(
        root,
        &format!("{area}TRUNCATEDAAA/__grp__t.json"),
        br#"{"child_paths": {"t.cubin": "/root/.tri"#,
    );
    // group pointing outside the root (copied from another machine's cache)
    file(root, &format!("{area}FOREIGNAAAAA/f.cubin"), b"cubin");
    file(
        root,
        &format!("{area}FOREIGNAAAAA/__grp__f.json"),
        format!(
            r#"{{"child_paths": {{"f.cubin": "/home/other/.triton/cache/{area}FOREIGNAAAAA/f.cubin"}}}}"#
        ),
    );
    // group pointing outside its own directory (at another kernel's file)
    file(root, &format!("{area}OUTSIDEDIRAA/o.cubin"), b"cubin");
    file(
        root,
        &format!("{area}OUTSIDEDIRAA/__grp__o.json"),
        format!(
            r#"{{"child_paths": {{"o.cubin": "{abs}/{area}KHRPJVATUMNFU7C00XJCY5ZXPWAGYN97OP4FQJ6ND7QAAAAAAAAA/o.cubin"}}}}"#
        ),
    );
    // group escaping with '..', group of garbage bytes, group naming a missing child
    file(root, &format!("{area}DOTDOTAAAAAA/d.cubin"), b"cubin");
    file(
        root,
        &format!("{area}DOTDOTAAAAAA/__grp__d.json"),
        format!(
            r#"{{"child_paths": {{"d.cubin": "{abs}/{area}DOTDOTAAAAAA/../../../etc/d.cubin"}}}}"#
        ),
    );
    file(
        root,
        &format!("{area}GARBAGEAAAAA/__grp__g.json"),
        [0xffu8, 0xfe, 0x00, b'{', b'"', 0x80],
    );
    file(
        root,
        &format!("{area}MISSINGAAAAA/__grp__m.json"),
        format!(r#"{{"child_paths": {{"m.cubin": "{abs}/{area}MISSINGAAAAA/m.cubin"}}}}"#),
    );
}

/// Inductor's precompiled headers: a finished `.gch`, one g++ is still writing, one cut short.
fn pch_cases(root: &Path, dir: &str) {
    let stub = b"#include <torch/csrc/inductor/cpp_prefix.h>\n";
    file(root, &format!("{dir}cdone.h"), stub);
    file(
        root,
        &format!("{dir}cdone.h.gch"),
        b"gpch+014\x18\xa4 the header",
    );
    file(root, &format!("{dir}cbusy.h"), stub);
    file(
        root,
        &format!("{dir}cbusy.h.gch"),
        b"gpcWrite\x00\x00 half of it",
    );
    file(root, &format!("{dir}ccut.h.gch"), b"gp");
    file(root, &format!("{dir}locks/cdone.lock"), b"");
}

/// Writes the fixture tree of `kind` under `root` (which must exist and be empty).
pub fn build(kind: &str, root: &Path) {
    let per_host = "gpu_p2p_access_cache_for_0,1,2,3.json";
    match kind {
        "triton" => {
            triton_cases(root, "");
            file(root, per_host, b"{}");
            file(root, "x.lock", b"");
        }
        "inductor" => {
            file(
                root,
                "fxgraph/pe/fpegyiq3v3wzjzphd45wkflpabggdbjpylgr7tta4hj6uplstsiw/fcktj476mi6x65x5z522ljwzo66p",
                b"pickle",
            );
            file(
                root,
                "aotautograd/aum56c7mhu3x/i4arff5cfkq2mtbmaqdyxmnncn7z",
                b"pickle",
            );
            file(root, "s5/cs5crfr7fofx.py", b"# wrapper");
            file(root, "ex/cexa62frrkzf.main.cpp", b"// kernel");
            file(root, "ex/cexa62frrkzf.main.so", elf(256));
            file(root, "ni/cnil5uz245tw.main.cpp", b"// kernel");
            file(root, "ni/cnil5uz245tw.main.so", &elf(256)[..200]);
            file(root, "dv/cdvx2tvfeqbc.so.load_ok", b"");
            file(root, "iw/ciwzrk3ittdq.best_config", b"{}");
            file(root, "cache/5f1c2d3e4f", b"{}");
            file(root, "locks/cexa62frrkzf.lock", b"");
            file(root, "fxgraph/ab/abcdef/.4242.140234.tmp", b"partial");
            file(root, "ex/cexa62frrkzf_CxxBuild/main.o", b"obj");
            file(root, "triton/0/tmp.5f1c2d3e/k.cubin", b"bundle in flight");
            triton_cases(root, "triton/0/");
            pch_cases(root, "precompiled_headers/");
        }
        "inductor-pch" => pch_cases(root, ""),
        "vllm-compile" => {
            let aot = "torch_aot_compile/295491ebf0294c0a690f1019a81888cde55cc78dba53b700d73b6720eb6bbe4b";
            file(root, &format!("{aot}/rank_0_0/model"), b"aot artifact");
            file(root, &format!("{aot}/rank_1_0/model.4242.tmp"), b"partial");
            file(
                root,
                &format!("{aot}/inductor_cache/fxgraph/pe/fpeg/abc"),
                b"pickle",
            );
            file(root, &format!("{aot}/inductor_cache/iw/ciwz.py"), b"code");
            file(root, &format!("{aot}/inductor_cache/locks/ciwz.lock"), b"");
            triton_cases(root, &format!("{aot}/inductor_cache/triton/0/"));
            let index = "{(Range(start=1, end=2048), 0, 'inductor_standalone'): {'graph_handle': ('artifact_compile_range_1_2048_subgraph_0', '/x'), 'cache_key': 'k'}}\n";
            let done = "1c5863dba3/rank_0_0/backbone";
            file(root, &format!("{done}/cache_key_factors.json"), b"{}");
            file(root, &format!("{done}/computation_graph.py"), b"graph");
            file(
                root,
                &format!("{done}/artifact_compile_range_1_2048_subgraph_0"),
                b"artifact",
            );
            file(root, &format!("{done}/vllm_compile_cache.py"), index);
            let busy = "1c5863dba3/rank_1_0/backbone";
            file(root, &format!("{busy}/cache_key_factors.json"), b"{}");
            file(
                root,
                &format!("{busy}/artifact_compile_range_1_2048_subgraph_0/6i/c6i5i5pk.py"),
                b"unpacked",
            );
            let cut = "1c5863dba3/rank_0_0/eagle_head";
            file(
                root,
                &format!("{cut}/artifact_compile_range_1_2048_subgraph_0"),
                b"artifact",
            );
            file(root, &format!("{cut}/vllm_compile_cache.py"), &index[..70]);
            let lost = "1c5863dba3/rank_1_0/eagle_head";
            file(root, &format!("{lost}/vllm_compile_cache.py"), index);
            file(
                root,
                "1c5863dba3/rank_0_0/inductor_cache/iw/ciwz.py",
                b"code",
            );
            file(root, per_host, b"{}");
        }
        "flashinfer-jit" => {
            let ws = "0.7.4/90a";
            for (uri, linked, so_ms, cut) in [
                (
                    "batch_prefill_with_kv_cache_dtype_q_bf16_head_dim_qk_128_sm90",
                    true,
                    T0,
                    false,
                ),
                ("single_decode_unlinked", false, T0, false),
                ("cutlass_fused_moe_relinking", true, T0 + 5_000, false),
                ("norm_cut_short", true, T0, true),
            ] {
                let d = format!("{ws}/cached_ops/{uri}");
                file(
                    root,
                    &format!("{d}/build.ninja"),
                    "cuda_home = /usr/local/cuda-12.4\n",
                );
                file(root, &format!("{d}/.ninja_deps"), b"deps");
                file(root, &format!("{d}/prefill.cuda.o"), b"obj");
                let so = elf(512);
                file(
                    root,
                    &format!("{d}/{uri}.so"),
                    if cut { &so[..300] } else { &so[..] },
                );
                mtime(root, &format!("{d}/{uri}.so"), so_ms);
                file(root, &format!("{ws}/generated/{uri}/prefill.cu"), b"src");
                let mut log = String::from("# ninja log v5\n0\t10\t1\tprefill.cuda.o\tabc\n");
                if linked {
                    log.push_str(&format!("10\t20\t2\t{d}/{uri}.so\tdef\n"));
                }
                file(root, &format!("{d}/.ninja_log"), log);
                mtime(root, &format!("{d}/.ninja_log"), T0 + 1_000);
            }
            file(
                root,
                &format!(
                    "{ws}/cached_ops/tmp/batch_prefill_with_kv_cache_dtype_q_bf16_head_dim_qk_128_sm90.lock"
                ),
                b"",
            );
            file(root, "cubins/0a1b2c/fmha_sm100.cubin", b"cubin");
        }
        "flashinfer-autotune" => {
            let d = "0.7.4/90a/5f1c2d3e4f5a6b7c";
            file(
                root,
                &format!("{d}/autotune_configs.json"),
                br#"{"fp8_gemm": {"m=128": [1, 2]}}"#,
            );
            file(
                root,
                &format!("{d}/autotune_configs_dp0_rank1.json"),
                br#"{"fp8_gemm": {"m=128": [1,"#,
            );
            file(
                root,
                &format!("{d}/autotune_configs_dp0_rank2.json.tmp"),
                b"{}",
            );
            file(root, &format!("{d}/notes.txt"), b"x");
        }
        "deepgemm" => {
            let k = "cache/kernel.sm90_fp8_gemm_1d2d.0123456789abcdef0123456789abcdef";
            file(root, &format!("{k}/kernel.cu"), b"src");
            file(root, &format!("{k}/kernel.cubin"), b"cubin");
            file(root, &format!("{k}/kernel.ptx"), b"ptx");
            file(
                root,
                "cache/kernel.sm90_bf16_gemm.fedcba9876543210fedcba9876543210/kernel.cu",
                b"src",
            );
            file(
                root,
                "tmp/5f1c2d3e-4f5a-6b7c-8d9e-0f1a2b3c4d5e/kernel.cu",
                b"src",
            );
            file(
                root,
                "tmp/5f1c2d3e-4f5a-6b7c-8d9e-0f1a2b3c4d5e/kernel.cubin",
                b"cubin",
            );
            file(root, "cache/stray.txt", b"x");
        }
        "cuda-computecache" => {
            file(root, "index", b"index");
            file(root, "0a/1b/2c3d4e5f", b"sass");
            file(root, "0a/1b/2c3d4e5f.tmp", b"partial");
            file(root, "cache.lock", b"");
        }
        "sglang-jit" => {
            let b = "cuda_sm90/rmsnorm/build-0123456789abcdef";
            file(
                root,
                &format!("{b}/deps-fedcba9876543210/sgl_deps.json"),
                b"[]",
            );
            file(
                root,
                &format!("{b}/deps-fedcba9876543210/rmsnorm.so"),
                elf(128),
            );
            file(
                root,
                &format!("{b}/.staging-5f1c2d3e/rmsnorm.so"),
                b"partial",
            );
            file(root, &format!("{b}/stray.txt"), b"x");
            file(root, per_host, b"{}");
        }
        "sglang-compile" => {
            let index = "{(Range(start=1, end=4096), 0, 'inductor'): {'graph_handle': ('artifact_compile_range_1_4096_subgraph_0', '/x')}}";
            file(
                root,
                "a1b2c3d4e5/rank_0_0/qwen3/artifact_compile_range_1_4096_subgraph_0",
                b"artifact",
            );
            file(
                root,
                "a1b2c3d4e5/rank_0_0/qwen3/sglang_compile_cache.py",
                index,
            );
            file(
                root,
                "a1b2c3d4e5/rank_0_0/llama/artifact_compile_range_1_4096_subgraph_0",
                b"artifact",
            );
            file(
                root,
                "a1b2c3d4e5/rank_0_0/llama/sglang_compile_cache.py",
                &index[..30],
            );
            file(
                root,
                "a1b2c3d4e5/rank_0_0/mixtral/artifact_compile_range_1_4096_subgraph_0",
                b"artifact",
            );
            file(root, "a1b2c3d4e5/rank_0_0/qwen3/.4242.1.tmp", b"partial");
        }
        "tilelang" => {
            for f in ["kernel.cu", "wrapped_kernel.cu", "params.pkl"] {
                file(root, &format!("aaaa0000/{f}"), b"x");
            }
            file(root, "aaaa0000/kernel_lib.so", elf(64));
            file(root, "bbbb1111/kernel.cu", b"x");
            file(root, "bbbb1111/kernel_lib.so", elf(64));
            file(root, "cccc2222/params.pkl", b"x");
            file(root, "cccc2222/kernel_lib.so", &elf(64)[..40]);
            file(root, ".tmp_5f1c2d3e/kernel_lib.so", elf(64));
        }
        "vllm-modelinfos" => {
            file(
                root,
                "vllm-model_executor-models-llama-LlamaForCausalLM.json",
                b"{\"hash\": \"d032877f\", \"modelinfo\": {\"architecture\": \"LlamaForCausalLM\"}}",
            );
            file(root, "tmpk2j4x9ab", b"{\"hash\"");
            file(root, "nested/x.json", b"{}");
        }
        "cute-dsl" => {
            file(root, "0a1b2c3d/kernel.o", b"obj");
            file(root, "0a1b2c3d/kernel.o.tmp", b"partial");
            file(root, "cache.lock", b"");
        }
        "tvm-ffi" => {
            file(root, "my_ext_ab12/build.ninja", b"ninja");
            file(root, "my_ext_ab12/my_ext.so", elf(64));
            file(root, "my_ext_ab12/.ninja_log", b"# ninja log v5\n");
            mtime(root, "my_ext_ab12/.ninja_log", T0 + 1_000);
            file(root, "busy_cd34/build.ninja", b"ninja");
            file(root, "busy_cd34/busy.so", &elf(64)[..20]);
            file(root, "late_ef56/late.so", elf(64));
            file(root, "late_ef56/.ninja_log", b"");
            mtime(root, "late_ef56/late.so", T0 + 2_000);
            file(root, "x.lock", b"");
        }
        other => panic!("no fixture for cache kind {other}"),
    }
}
