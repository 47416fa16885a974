//! What each engine writes mid-compile (temp dirs and files, in-place writes, a lock) is never
//! published; what it finishes is, once quiet.

use super::*;

// ---------------------------------------------------------------------------------------------
// Triton (`triton_kernel` writes a kernel as Triton does).

#[test]
fn triton_temp_dirs_are_never_published() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let root = dir.path().join("triton");
    std::fs::create_dir_all(&root).unwrap();
    let w = Watcher::start(&store, &[("triton", &root)], SETTLE, &[]);
    let mut finals = std::collections::BTreeMap::new();
    for k in 0..3 {
        let done_before: Vec<String> = finals.keys().cloned().collect();
        let files = triton_kernel(&root, k, || {
            // The files of kernel k sit in their temp directory. Hold here until the watcher has
            // published the kernels finished before (so a cycle ran while the temp dir existed).
            if !done_before.is_empty() {
                wait_for(&store, "triton", &w, "the previous kernels", |m| {
                    let ps = paths(m);
                    done_before.iter().all(|p| ps.contains(p))
                });
            }
        });
        finals.extend(files);
    }
    let writes_stopped = Instant::now();
    // "At least every kernel": anything extra (a temp file) is reported by the checks below.
    let all: BTreeSet<String> = finals.keys().cloned().collect();
    let (_, seen) = wait_for(&store, "triton", &w, "every kernel", |m| {
        all.is_subset(&paths(m))
    });
    let latency = seen - writes_stopped;
    eprintln!("triton: change-to-generation latency {latency:?} (settle {SETTLE:?})");
    let gens = generations(&store, "triton");
    assert!(
        gens.len() >= 3,
        "expected a generation per kernel, got {}",
        gens.len()
    );
    gens.iter().for_each(assert_triton_complete);
    assert_only_final_contents(&gens, &root, &finals);
    let (status, log) = w.terminate();
    assert!(status.success(), "exit {status}; log:\n{log}");
}

// ---------------------------------------------------------------------------------------------
// DeepGEMM: compile into `tmp/<uuid>/`, then rename the whole directory to
// `cache/kernel.<name>.<32 hex>`; an entry is valid only with both kernel.cu and kernel.cubin.

#[test]
fn deepgemm_tmp_dirs_are_never_published_and_entries_are_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let root = dir.path().join("deep_gemm");
    let w = Watcher::start(&store, &[("deepgemm", &root)], SETTLE, &[]);
    let mut finals = std::collections::BTreeMap::new();
    for k in 0..3u64 {
        let uuid = format!("{:032x}", k * 7 + 1);
        let tmp = root.join("tmp").join(&uuid);
        std::fs::create_dir_all(&tmp).unwrap();
        let cu = bytes(k * 2, 4_000);
        let cubin = bytes(k * 2 + 1, 30_000);
        std::fs::write(tmp.join("kernel.cu"), &cu).unwrap();
        std::fs::write(tmp.join("kernel.cubin"), &cubin).unwrap();
        if !finals.is_empty() {
            let before: Vec<String> = finals.keys().cloned().collect();
            wait_for(&store, "deepgemm", &w, "the previous kernels", |m| {
                let ps = paths(m);
                before.iter().all(|p| ps.contains(p))
            });
        }
        let entry = format!("cache/kernel.gemm_fp8_{k}.{:032x}", k + 100);
        std::fs::create_dir_all(root.join("cache")).unwrap();
        std::fs::rename(&tmp, root.join(&entry)).unwrap();
        finals.insert(format!("{entry}/kernel.cu"), cu);
        finals.insert(format!("{entry}/kernel.cubin"), cubin);
    }
    let all: BTreeSet<String> = finals.keys().cloned().collect();
    wait_for(&store, "deepgemm", &w, "every kernel", |m| {
        all.is_subset(&paths(m))
    });
    let gens = generations(&store, "deepgemm");
    assert!(
        gens.len() >= 3,
        "expected a generation per kernel, got {}",
        gens.len()
    );
    for m in &gens {
        let ps = paths(m);
        assert!(ps.iter().all(|p| !p.starts_with("tmp/")), "{ps:?}");
        for p in &ps {
            let entry = p.rsplit_once('/').unwrap().0;
            assert!(
                ps.contains(&format!("{entry}/kernel.cu"))
                    && ps.contains(&format!("{entry}/kernel.cubin")),
                "generation {} holds a partial entry {entry}",
                m.id()
            );
        }
    }
    assert_only_final_contents(&gens, &root, &finals);
    let (status, log) = w.terminate();
    assert!(status.success(), "exit {status}; log:\n{log}");
}

// ---------------------------------------------------------------------------------------------
// vLLM AOT: `rank_<r>_0/model.<pid>.tmp` is written (slowly: it is large), then `os.replace`d to
// `model`.

#[test]
fn vllm_model_tmp_files_are_never_published() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let root = dir.path().join("vllm");
    let hash_dir = root
        .join("torch_compile_cache/torch_aot_compile")
        .join("ab".repeat(32));
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let w = Watcher::start(
        &store,
        &[("vllm:native", &root)],
        SETTLE,
        &["--metrics-addr", &addr],
    );
    let mut finals = std::collections::BTreeMap::new();
    for rank in 0..2u64 {
        let rdir = hash_dir.join(format!("rank_{rank}_0"));
        std::fs::create_dir_all(&rdir).unwrap();
        let tmp = rdir.join(format!("model.{}.tmp", 4242 + rank));
        let bytes = bytes(rank + 50, 400_000);
        let mut f = std::fs::File::create(&tmp).unwrap();
        // Half written, and a generation is cut while it sits there.
        f.write_all(&bytes[..200_000]).unwrap();
        f.flush().unwrap();
        if !finals.is_empty() {
            let before: Vec<String> = finals.keys().cloned().collect();
            wait_for(&store, "vllm", &w, "the previous rank", |m| {
                let ps = paths(m);
                before.iter().all(|p| ps.contains(p))
            });
        } else {
            // Nothing else is new: the watcher must publish nothing at all for a lone temp file.
            // A cycle ran with it in place and skipped it as temporary:
            w.wait_metrics(
                port,
                &["jitship_watch_files_skipped{cache=\"vllm\",category=\"temporary\"} 1"],
            );
            assert!(
                generations(&store, "vllm").is_empty(),
                "published a temp file alone"
            );
        }
        f.write_all(&bytes[200_000..]).unwrap();
        f.sync_all().unwrap();
        drop(f);
        std::fs::rename(&tmp, rdir.join("model")).unwrap();
        let rel = rdir
            .join("model")
            .strip_prefix(&root)
            .unwrap()
            .display()
            .to_string();
        finals.insert(rel, bytes);
    }
    let all: BTreeSet<String> = finals.keys().cloned().collect();
    wait_for(&store, "vllm", &w, "every rank's model", |m| {
        all.is_subset(&paths(m))
    });
    let gens = generations(&store, "vllm");
    for m in &gens {
        assert!(
            paths(m).iter().all(|p| !p.ends_with(".tmp")),
            "{:?}",
            paths(m)
        );
    }
    assert_only_final_contents(&gens, &root, &finals);
    let (status, log) = w.terminate();
    assert!(status.success(), "exit {status}; log:\n{log}");
}

// ---------------------------------------------------------------------------------------------
// FlashInfer: under `cached_ops/tmp/<uri>.lock`, ninja writes objects and the `.so` in place, in
// many small writes. No temp name protects them: the settle window does (writes keep coming far
// more often than the window), and publish refuses a file that changes while it is read.

#[test]
fn flashinfer_in_place_writes_are_published_only_when_quiet() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let root = dir.path().join("flashinfer/0.7.4/90a");
    // A longer window than the other tests: a 1-in-10 scheduling hiccup of the writer must not
    // look like quiet.
    let settle = Duration::from_millis(1000);
    let w = Watcher::start(&store, &[("flashinfer:native", &root)], settle, &[]);
    let uri = "batch_prefill_with_kv_cache_dtype_q_bf16_head_dim_qk_128_sm90";
    let ops = root.join("cached_ops");
    let module = ops.join(uri);
    std::fs::create_dir_all(ops.join("tmp")).unwrap();
    std::fs::create_dir_all(&module).unwrap();
    let lock = ops.join(format!("tmp/{uri}.lock"));
    let lock_file = std::fs::File::create(&lock).unwrap();
    assert_eq!(
        // SAFETY: flock(2) on a file we own.
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock_file), libc::LOCK_EX) },
        0
    );
    let mut finals = std::collections::BTreeMap::new();
    let ninja = b"cuda_home = /usr/local/cuda\nbuild x.cuda.o: cuda_compile x.cu\n".to_vec();
    std::fs::write(module.join("build.ninja"), &ninja).unwrap();
    finals.insert(format!("cached_ops/{uri}/build.ninja"), ninja);
    for name in ["prefill.cuda.o".to_string(), format!("{uri}.so")] {
        let bytes = bytes(name.len() as u64, 256 * 1024);
        let mut f = std::fs::File::create(module.join(&name)).unwrap();
        for chunk in bytes.chunks(16 * 1024) {
            f.write_all(chunk).unwrap();
            f.flush().unwrap();
            std::thread::sleep(Duration::from_millis(50));
        }
        finals.insert(format!("cached_ops/{uri}/{name}"), bytes);
    }
    // SAFETY: as above.
    unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock_file), libc::LOCK_UN) };
    let writes_stopped = Instant::now();
    let all: BTreeSet<String> = finals.keys().cloned().collect();
    let (_, seen) = wait_for(&store, "flashinfer", &w, "the whole module", |m| {
        all.is_subset(&paths(m))
    });
    let latency = seen - writes_stopped;
    let gens = generations(&store, "flashinfer");
    assert_only_final_contents(&gens, &root, &finals);
    for m in &gens {
        assert!(
            paths(m).iter().all(|p| !p.ends_with(".lock")),
            "{:?}",
            paths(m)
        );
    }
    eprintln!("flashinfer: change-to-generation latency {latency:?} (settle {settle:?})");
    let (status, log) = w.terminate();
    assert!(status.success(), "exit {status}; log:\n{log}");
}
