//! End-to-end tests of `jitship watch`: the real binary runs as a child process beside writers
//! that fill cache roots the way the real tools do (docs/jit-caches.md), against a local
//! store. Every generation the watcher published is then read back from the store and checked.
//!
//! Timing: the writers never rely on the watcher being quick. Where a test needs the watcher to
//! have published *while* a temp file or directory exists, the writer waits for that generation
//! to appear (up to `WAIT`) before it goes on. The one timing bound asserted is the spec's: a
//! generation within the settle window plus 2 s after the writes stop.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use jitship::catalog;
use jitship::catalog::KeyLayout;
use jitship::generation::{ContentHash, HeadRecord, Manifest};
use jitship::policy::CachePolicy;
use jitship::store::{LocalStore, Store};
use jitship_tests::fixtures::bytes;

/// Longest a test waits for something that should take well under a second.
const WAIT: Duration = Duration::from_secs(30);
const SETTLE: Duration = Duration::from_millis(500);
/// The full rescan (the fallback for lost file events) of a watcher a test starts, unless it asks
/// for another: longer than any wait, so a generation a test sees came from the file events. That,
/// not a wall-clock bound, is what the latency tests check (the latency is printed; a loaded
/// machine stretches it, so it is not asserted).
const NO_RESCAN: &str = "3600s";

/// Every fact the built-in policies key on, as on an H100 worker: the watcher is tested with the
/// real embedded policies, which refuse to publish under a key missing one.
const WORKER_FACTS: &[&str] = &[
    "model.id=test/model",
    "model.revision=main",
    "engine.config_digest=0123abcd",
    "gpu.name=NVIDIA H100 80GB HBM3",
    "gpu.arch=sm_90",
    "gpu.cc=9.0",
    "driver.version=550.54.15",
    "driver.major=550",
    "cuda.runtime=12.4",
    "cuda.nvcc=12.4",
    "cuda.home=/usr/local/cuda",
    "python.version=3.12.3",
    "python.site_packages=/opt/venv/lib/python3.12/site-packages",
    "python.include=/usr/include/python3.12",
    "os.arch=x86_64",
    "cpu.isa=avx512",
    "cpu.flags_digest=0123abcd",
    "cpu.threads=16",
    "cxx.identity=g++ 12.2.0",
    "inductor.env_digest=0123abcd",
    "pkg.torch=2.9.0",
    "pkg.triton=3.5.0",
    "pkg.vllm=0.11.0",
    "pkg.sglang=0.5.3",
    "pkg.flashinfer_python=0.4.1",
    "pkg.deep_gemm=2.1.0",
    "pkg.tilelang=0.1.6",
    "pkg.nvidia_cutlass_dsl=4.2.0",
    "pkg.apache_tvm_ffi=0.1.0",
];

/// A running `jitship watch`; killed (by its pid) if a test fails before stopping it.
struct Watcher {
    child: Option<Child>,
    log: PathBuf,
}

impl Watcher {
    fn start(store: &Path, caches: &[(&str, &Path)], settle: Duration, extra: &[&str]) -> Self {
        let log = store.with_extension("log");
        let mut cmd = jitship_tests::cli::jitship();
        cmd.arg("watch")
            .arg("--store")
            .arg(format!("local:{}", store.display()))
            .args(WORKER_FACTS.iter().flat_map(|f| ["--fact", f]))
            .arg("--settle")
            .arg(format!("{}ms", settle.as_millis()))
            .args(["--min-interval", "0s", "--grace", "20s", "-v"])
            .args(extra)
            .args(if extra.contains(&"--rescan-interval") {
                &[][..]
            } else {
                &["--rescan-interval", NO_RESCAN][..]
            })
            .env_remove("JITSHIP_CONFIG")
            .env_remove("JITSHIP_CACHES")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for (kind, root) in caches {
            cmd.arg("--cache").arg(format!("{kind}={}", root.display()));
        }
        let child = cmd.spawn().expect("starting jitship watch");
        Self {
            child: Some(child),
            log,
        }
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.pid(), sig) }, 0);
    }

    /// Sends SIGTERM and waits for the exit.
    fn terminate(mut self) -> (ExitStatus, String) {
        self.signal(libc::SIGTERM);
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return (
                    status,
                    std::fs::read_to_string(&self.log).unwrap_or_default(),
                );
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "jitship watch did not exit after SIGTERM; log:\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log holds `needle`: the watcher says it did something, so a test need
    /// not sleep and hope it did.
    fn wait_log(&self, needle: &str) {
        let deadline = Instant::now() + WAIT;
        while !self.log().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "{needle:?} not logged after {WAIT:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until `/metrics` on `port` holds every one of `lines`.
    fn wait_metrics(&self, port: u16, lines: &[&str]) {
        let deadline = Instant::now() + WAIT;
        loop {
            // Refused until the endpoint is up.
            let body = std::net::TcpStream::connect(("127.0.0.1", port))
                .map(|_| http_get(port, "/metrics").1)
                .unwrap_or_default();
            if lines.iter().all(|l| body.contains(l)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{lines:?} missing after {WAIT:?}:\n{body}\nlog:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            eprintln!(
                "watcher log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

/// Every generation any head in the store points to, oldest head first, for one cache kind.
fn generations(store_dir: &Path, kind: &str) -> Vec<Manifest> {
    let store = LocalStore::open(store_dir).unwrap();
    let layout = KeyLayout::new("jitship").unwrap();
    let mut heads: Vec<HeadRecord> = store
        .list("jitship/head/")
        .unwrap_or_default()
        .iter()
        .filter_map(|k| HeadRecord::decode(&store.get(k).ok()??).ok())
        .collect();
    heads.sort_by_key(|h| h.seq);
    let mut out = Vec::new();
    for h in heads {
        let m = catalog::fetch_manifest(&store, &layout, &h.generation)
            .unwrap()
            .expect("a head points to a manifest that is not stored");
        if m.cache_kind == kind {
            // The newest head agrees with the listing (the path installers take).
            let newest = catalog::newest_head(&store, &layout, &m.compat_id)
                .unwrap()
                .unwrap();
            assert!(newest.seq >= h.seq);
            out.push(m);
        }
    }
    out
}

/// The embedded policy of `kind`, run by the real wasm host.
fn builtin_policy(kind: &str) -> jitship::policy::host::WasmPolicy {
    use jitship::policy::host::{Limits, PolicyEngine};
    let engine = PolicyEngine::with_cache_dir(
        Limits::from_config(&jitship::config::PolicyConfig::default()),
        None,
    )
    .expect("policy engine");
    let bytes = jitship::policy::builtin::lookup(kind).expect("a built-in policy");
    engine
        .load(bytes, &format!("builtin:{kind}"))
        .expect("loading the built-in policy")
}

fn paths(m: &Manifest) -> BTreeSet<String> {
    m.files.iter().map(|f| f.path.to_string()).collect()
}

/// Waits until some generation of `kind` satisfies `pred`; returns it and when it was seen.
fn wait_for(
    store: &Path,
    kind: &str,
    w: &Watcher,
    what: &str,
    pred: impl Fn(&Manifest) -> bool,
) -> (Manifest, Instant) {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(m) = generations(store, kind).into_iter().rev().find(|m| pred(m)) {
            return (m, Instant::now());
        }
        assert!(
            Instant::now() < deadline,
            "no generation with {what} after {WAIT:?}; log:\n{}",
            w.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Asserts every file in every generation has exactly the content the writer finished it with.
/// A file stored in its root-independent form (`canonical`, e.g. a Triton group file) is compared
/// as the kind's real built-in policy canonicalizes the final content under `root`.
fn assert_only_final_contents(
    gens: &[Manifest],
    root: &Path,
    finals: &std::collections::BTreeMap<String, Vec<u8>>,
) {
    for m in gens {
        for f in &m.files {
            let want = finals
                .get(f.path.as_str())
                .unwrap_or_else(|| panic!("generation {} holds unexpected {}", m.id(), f.path));
            let want = if f.canonical {
                builtin_policy(&m.cache_kind)
                    .canonicalize(root, &f.path, want)
                    .unwrap_or_else(|e| panic!("canonicalizing the final {}: {e}", f.path))
            } else {
                want.clone()
            };
            assert_eq!(
                f.blake3,
                ContentHash::of(&want),
                "generation {} holds a partial {}",
                m.id(),
                f.path
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Triton: each file goes to `<key>/tmp.pid_<pid>_<uuid>/<file>` and is then `os.replace`d into
// `<key>/`, one by one; the `__grp__<name>.json` group file is written last.

const TRITON_FILES: [&str; 7] = ["source", "ttir", "ttgir", "llir", "ptx", "cubin", "json"];

fn triton_kernel(root: &Path, k: usize, before_renames: impl FnOnce()) -> Vec<(String, Vec<u8>)> {
    let key = format!("{:0>52}", format!("K{k}"));
    let dir = root.join(&key);
    std::fs::create_dir_all(&dir).unwrap();
    let tmp = dir.join(format!("tmp.pid_{}_{k:08x}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let name = format!("kernel_{k}");
    let mut written = Vec::new();
    for (i, ext) in TRITON_FILES.iter().enumerate() {
        let file = format!("{name}.{ext}");
        let bytes = bytes((k * 100 + i) as u64, 2_000 + i * 500);
        std::fs::write(tmp.join(&file), &bytes).unwrap();
        written.push((file, bytes));
    }
    before_renames();
    let mut out = Vec::new();
    let mut children = serde_json::Map::new();
    for (file, bytes) in written {
        std::fs::rename(tmp.join(&file), dir.join(&file)).unwrap();
        children.insert(file.clone(), dir.join(&file).display().to_string().into());
        out.push((format!("{key}/{file}"), bytes));
    }
    std::fs::remove_dir(&tmp).unwrap();
    let grp = serde_json::json!({ "child_paths": children })
        .to_string()
        .into_bytes();
    // The group file goes through its own temp directory too.
    let gtmp = dir.join(format!("tmp.pid_{}_{k:08x}g", std::process::id()));
    std::fs::create_dir_all(&gtmp).unwrap();
    let gname = format!("__grp__{name}.json");
    std::fs::write(gtmp.join(&gname), &grp).unwrap();
    std::fs::rename(gtmp.join(&gname), dir.join(&gname)).unwrap();
    std::fs::remove_dir(&gtmp).unwrap();
    out.push((format!("{key}/{gname}"), grp));
    out
}

/// What the current policy guarantees for Triton. The native rules (today's `session.policy`)
/// only keep temp directories out. The built-in wasm policy adds the group rule: a kernel directory
/// is published only with its `__grp__` file and every child it names. When a generation says it
/// was selected by another policy than "native", the group rule is asserted too.
fn assert_triton_complete(m: &Manifest) {
    let ps = paths(m);
    for p in &ps {
        assert!(
            !p.split('/').any(|seg| seg.starts_with("tmp.")),
            "generation {} published the in-flight temp file {p}",
            m.id()
        );
    }
    if m.policy.name == "native" {
        return;
    }
    // Tightened check, active with a Triton-aware policy.
    let dirs: BTreeSet<&str> = ps
        .iter()
        .filter_map(|p| p.split_once('/').map(|(d, _)| d))
        .collect();
    for d in dirs {
        let groups: Vec<&String> = ps
            .iter()
            .filter(|p| p.starts_with(&format!("{d}/__grp__")))
            .collect();
        assert!(
            !groups.is_empty(),
            "generation {} holds {d} without its group file",
            m.id()
        );
        for g in groups {
            let name = g
                .trim_start_matches(&format!("{d}/__grp__"))
                .trim_end_matches(".json");
            for ext in TRITON_FILES {
                assert!(
                    ps.contains(&format!("{d}/{name}.{ext}")),
                    "generation {} holds group {g} without {name}.{ext}",
                    m.id()
                );
            }
        }
    }
}

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

// ---------------------------------------------------------------------------------------------

#[test]
fn a_root_created_late_is_picked_up_within_the_settle_window() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let root = dir.path().join("home/.cache/sglang/jit");
    let w = Watcher::start(&store, &[("sglang-jit", &root)], SETTLE, &[]);
    // The watcher watches the nearest ancestor that exists (the temp dir itself).
    w.wait_log(&format!("path={} ", dir.path().display()));
    assert!(generations(&store, "sglang-jit").is_empty());
    // The engine creates the directories level by level, then publishes a staging dir by rename.
    std::fs::create_dir_all(dir.path().join("home/.cache")).unwrap();
    // The watcher has moved down to the new nearest ancestor before the next level appears.
    w.wait_log(&format!(
        "path={} ",
        dir.path().join("home/.cache").display()
    ));
    let staging = root.join("cuda/norm/.staging-1234");
    std::fs::create_dir_all(&staging).unwrap();
    let so = bytes(9, 50_000);
    std::fs::write(staging.join("norm.so"), &so).unwrap();
    let leaf = root.join("cuda/norm/build-0123456789abcdef/deps-fedcba9876543210");
    std::fs::create_dir_all(leaf.parent().unwrap()).unwrap();
    std::fs::rename(&staging, &leaf).unwrap();
    let writes_stopped = Instant::now();
    let want = "cuda/norm/build-0123456789abcdef/deps-fedcba9876543210/norm.so".to_string();
    let (m, seen) = wait_for(&store, "sglang-jit", &w, "the module", |m| {
        paths(m).contains(&want)
    });
    let latency = seen - writes_stopped;
    eprintln!("late root: change-to-generation latency {latency:?} (settle {SETTLE:?})");
    assert_eq!(paths(&m), BTreeSet::from([want]));
    let (status, log) = w.terminate();
    assert!(status.success(), "exit {status}; log:\n{log}");
}

#[test]
fn sigterm_publishes_pending_work_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let triton = dir.path().join("triton");
    let dg = dir.path().join("deep_gemm");
    std::fs::create_dir_all(&triton).unwrap();
    // A settle window far longer than the test: only the final publish can publish.
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let w = Watcher::start(
        &store,
        &[("triton", &triton), ("deepgemm", &dg)],
        Duration::from_secs(600),
        &["--metrics-addr", &addr],
    );
    let files = triton_kernel(&triton, 7, || {});
    let entry = dg.join("cache/kernel.x.0123456789abcdef0123456789abcdef");
    std::fs::create_dir_all(&entry).unwrap();
    std::fs::write(entry.join("kernel.cu"), b"__global__ void k() {}").unwrap();
    std::fs::write(entry.join("kernel.cubin"), bytes(3, 9_000)).unwrap();
    // Work still in flight at SIGTERM stays out.
    let tmp = triton
        .join(format!("{:0>52}", "K7"))
        .join("tmp.pid_99_beef");
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::write(tmp.join("kernel_8.cubin"), b"half").unwrap();
    std::fs::create_dir_all(dg.join("tmp/feed")).unwrap();
    std::fs::write(dg.join("tmp/feed/kernel.cu"), b"half").unwrap();
    // Both roots have seen their changes and wait for the settle window.
    w.wait_metrics(
        port,
        &[
            "jitship_watch_pending{cache=\"triton\"} 1",
            "jitship_watch_pending{cache=\"deepgemm\"} 1",
        ],
    );
    assert!(generations(&store, "triton").is_empty());
    let (status, log) = w.terminate();
    assert!(status.success(), "exit {status}; log:\n{log}");
    let t = generations(&store, "triton");
    assert_eq!(t.len(), 1, "{log}");
    assert_eq!(
        paths(&t[0]),
        files
            .iter()
            .map(|(p, _)| p.clone())
            .collect::<BTreeSet<_>>()
    );
    assert_triton_complete(&t[0]);
    let d = generations(&store, "deepgemm");
    assert_eq!(d.len(), 1, "{log}");
    assert_eq!(
        paths(&d[0]),
        BTreeSet::from([
            "cache/kernel.x.0123456789abcdef0123456789abcdef/kernel.cu".to_string(),
            "cache/kernel.x.0123456789abcdef0123456789abcdef/kernel.cubin".to_string(),
        ])
    );
    assert!(log.contains("SIGTERM"), "{log}");
}

/// A loopback HTTP server answering `status` to every request until dropped.
struct Health {
    port: u16,
    ready: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Probes answered "not ready".
    refused: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Health {
    fn start() -> Self {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let ready = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let refused = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (r, s, n) = (ready.clone(), stop.clone(), refused.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(mut conn) = conn else { continue };
                let mut buf = [0u8; 2048];
                let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                let _ = conn.read(&mut buf);
                let status = if r.load(Ordering::SeqCst) {
                    "200 OK"
                } else {
                    n.fetch_add(1, Ordering::SeqCst);
                    "503 Service Unavailable"
                };
                let _ = conn.write_all(
                    format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                        .as_bytes(),
                );
            }
        });
        Self {
            port,
            ready,
            refused,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Health {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // Wake the blocking accept so the thread sees the flag.
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn nothing_is_published_before_the_server_is_ready() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let root = dir.path().join("triton");
    std::fs::create_dir_all(&root).unwrap();
    let health = Health::start();
    let url = format!("http://127.0.0.1:{}/health", health.port);
    let w = Watcher::start(&store, &[("triton", &root)], SETTLE, &["--ready-url", &url]);
    let files = triton_kernel(&root, 1, || {});
    // The root is pending (the gate is probed only then) and the gate refused it twice since the
    // files were written, READY_POLL apart: past the settle window, held by the gate alone.
    let seen = health.refused.load(std::sync::atomic::Ordering::SeqCst);
    let deadline = Instant::now() + WAIT;
    while health.refused.load(std::sync::atomic::Ordering::SeqCst) < seen + 2 {
        assert!(
            Instant::now() < deadline,
            "the gate was not probed; log:\n{}",
            w.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        generations(&store, "triton").is_empty(),
        "published before ready"
    );
    health
        .ready
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let all: BTreeSet<String> = files.iter().map(|(p, _)| p.clone()).collect();
    wait_for(&store, "triton", &w, "the kernel", |m| paths(m) == all);
    let (status, log) = w.terminate();
    assert!(status.success(), "exit {status}; log:\n{log}");
    assert!(log.contains("server is ready"), "{log}");
}

fn http_get(port: u16, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn metrics_and_healthz_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let root = dir.path().join("triton");
    std::fs::create_dir_all(&root).unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let w = Watcher::start(
        &store,
        &[("triton", &root)],
        SETTLE,
        &["--metrics-addr", &addr],
    );
    let files = triton_kernel(&root, 2, || {});
    let all: BTreeSet<String> = files.iter().map(|(p, _)| p.clone()).collect();
    wait_for(&store, "triton", &w, "the kernel", |m| paths(m) == all);
    let (status, body) = http_get(port, "/healthz");
    assert_eq!(status, 200, "{body}");
    // The store is the truth (a loaded machine may split the writes over two generations); the
    // loop records a cycle's metrics just after its head is written, so poll briefly.
    let n = generations(&store, "triton").len();
    let lines = [
        format!("jitship_watch_generations_published_total{{cache=\"triton\"}} {n}"),
        format!("jitship_watch_publish_cycles_total{{cache=\"triton\",outcome=\"published\"}} {n}"),
        "jitship_watch_ready 1".to_string(),
    ];
    let deadline = Instant::now() + WAIT;
    let body = loop {
        let (status, body) = http_get(port, "/metrics");
        assert_eq!(status, 200, "{body}");
        if lines.iter().all(|l| body.contains(l.as_str())) {
            break body;
        }
        assert!(Instant::now() < deadline, "{lines:?} missing:\n{body}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(body.contains("jitship_watch_last_publish_timestamp_seconds{cache=\"triton\"}"));
    let uploaded: u64 = body
        .lines()
        .find(|l| l.starts_with("jitship_watch_bytes_uploaded_total{cache=\"triton\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0);
    assert!(uploaded > 0, "{body}");
    assert_eq!(http_get(port, "/nope").0, 404);
    let (status, log) = w.terminate();
    assert!(status.success(), "exit {status}; log:\n{log}");
}

/// Idle CPU of the watcher: 2000 files published, then nothing changes for 30 s while its
/// utime+stime are sampled from /proc. Run with
/// `cargo test -p jitship-tests --test e2e -- --ignored --nocapture watch::idle_cpu`.
#[test]
#[ignore = "takes 40 s; a measurement, run by hand"]
fn idle_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let root = dir.path().join("triton");
    std::fs::create_dir_all(&root).unwrap();
    let mut finals = BTreeSet::new();
    for k in 0..250 {
        for (p, _) in triton_kernel(&root, k, || {}) {
            finals.insert(p);
        }
    }
    // A rescan (a full walk of the 2000 files) every 10 s falls inside the window.
    let w = Watcher::start(
        &store,
        &[("triton", &root)],
        SETTLE,
        &["--rescan-interval", "10s"],
    );
    wait_for(&store, "triton", &w, "every file", |m| paths(m) == finals);
    std::thread::sleep(Duration::from_secs(2));
    let ticks = |pid: i32| -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let rest = stat.rsplit_once(')').unwrap().1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        // Fields 14 and 15 (utime, stime), counted from after the command name.
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    };
    // SAFETY: sysconf only reads a system constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let window = Duration::from_secs(30);
    let before = ticks(w.pid());
    std::thread::sleep(window);
    let used = (ticks(w.pid()) - before) as f64 / hz;
    let pct = 100.0 * used / window.as_secs_f64();
    eprintln!("idle CPU over {window:?}: {used:.3} s ({pct:.3} %)");
    assert!(pct < 1.0, "{pct} % CPU while idle");
    let (status, _) = w.terminate();
    assert!(status.success());
}

/// Killed without a final publish (SIGKILL, OOM, node loss), then restarted: the new watcher
/// rebuilds its state from the store and the root and publishes what was written meanwhile. No
/// marker file or lock is left to block it.
#[test]
fn a_restarted_watcher_publishes_what_was_written_while_it_was_down() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let root = dir.path().join("triton");
    std::fs::create_dir_all(&root).unwrap();
    let mut all: BTreeSet<String> = BTreeSet::new();
    let w = Watcher::start(&store, &[("triton", &root)], SETTLE, &[]);
    all.extend(triton_kernel(&root, 1, || {}).into_iter().map(|(p, _)| p));
    wait_for(&store, "triton", &w, "the first kernel", |m| {
        paths(m) == all
    });
    // Usually 1; 2 if a loaded machine stalled the writer past the settle window mid-kernel.
    let before = generations(&store, "triton").len();
    w.signal(libc::SIGKILL);
    drop(w);
    // Written while no watcher runs.
    all.extend(triton_kernel(&root, 2, || {}).into_iter().map(|(p, _)| p));
    let entries_in_root: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries_in_root.len(), 2, "the watcher wrote into the root");
    let w = Watcher::start(&store, &[("triton", &root)], SETTLE, &[]);
    let (m, _) = wait_for(&store, "triton", &w, "both kernels", |m| paths(m) == all);
    assert!(
        m.parent.is_some(),
        "the new generation builds on the old head"
    );
    assert_eq!(generations(&store, "triton").len(), before + 1);
    let (status, log) = w.terminate();
    assert!(status.success(), "exit {status}; log:\n{log}");
    // Nothing new: the final publish found the head current and made no generation.
    assert_eq!(generations(&store, "triton").len(), before + 1, "{log}");
}

/// A watcher started while its store cannot be reached (here a local store whose directory
/// cannot be made yet, as an unmounted volume; on Mooncake a master not up yet,
/// `mooncake_drills`) keeps watching, says so on `/healthz` and in its metrics, and publishes
/// once the store answers, instead of exiting and crash-looping.
#[test]
fn a_watcher_started_before_its_store_answers_publishes_once_it_does() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    // A file where the store's directory must go: opening the store fails until it is gone.
    std::fs::write(&store, b"not mounted yet").unwrap();
    let root = dir.path().join("triton");
    std::fs::create_dir_all(&root).unwrap();
    let files = triton_kernel(&root, 1, || {});
    let all: BTreeSet<String> = files.iter().map(|(p, _)| p.clone()).collect();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let w = Watcher::start(
        &store,
        &[("triton", &root)],
        SETTLE,
        &["--metrics-addr", &addr],
    );
    w.wait_log("the store does not answer: watching the caches");
    // The metric and /healthz say why from the start.
    w.wait_metrics(port, &["\njitship_watch_store_reachable 0\n"]);
    let (status, body) = http_get(port, "/healthz");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("store unreachable"), "{body}");
    // The first cycle tried to connect, failed, and is retried after a backoff.
    w.wait_log("publish cycle failed");
    assert!(w.log().contains("store_unreachable=true"), "{}", w.log());
    std::fs::remove_file(&store).unwrap();
    w.wait_log("the store answers: publishing");
    wait_for(&store, "triton", &w, "the kernel", |m| paths(m) == all);
    w.wait_metrics(port, &["\njitship_watch_store_reachable 1\n"]);
    let (status, body) = http_get(port, "/healthz");
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("store unreachable"), "{body}");
    let (status, log) = w.terminate();
    assert!(status.success(), "exit {status}; log:\n{log}");
}

/// The watcher's periodic scrub (`--scrub-interval`) over a store with a durable tier: a pack
/// removed from the fast tier behind jitship's back is found, put back from the durable tier
/// byte for byte, and counted in the `jitship_store_scrub_*` metrics.
#[test]
fn the_periodic_scrub_finds_and_repairs_a_pack_removed_behind_its_back() {
    let dir = tempfile::tempdir().unwrap();
    let fast = dir.path().join("store");
    let durable = dir.path().join("durable");
    let durable_flag = format!("local:{}", durable.display());
    let root = dir.path().join("triton");
    std::fs::create_dir_all(&root).unwrap();
    triton_kernel(&root, 1, || {});
    triton_kernel(&root, 2, || {});
    let out = jitship_tests::cli::jitship()
        .arg("publish")
        .arg("--store")
        .arg(format!("local:{}", fast.display()))
        .args(["--durable-store", &durable_flag])
        .args(WORKER_FACTS.iter().flat_map(|f| ["--fact", f]))
        .arg("--cache")
        .arg(format!("triton={}", root.display()))
        .env_remove("JITSHIP_CONFIG")
        .env_remove("JITSHIP_CACHES")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let packs: Vec<PathBuf> = std::fs::read_dir(fast.join("jitship/pack"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!packs.is_empty());
    let lost = &packs[0];
    let name = lost.file_name().unwrap();
    std::fs::remove_file(lost).unwrap();
    // `verify --sample` finds it; without --repair it writes nothing.
    let out = jitship_tests::cli::jitship()
        .arg("verify")
        .arg("--store")
        .arg(format!("local:{}", fast.display()))
        .args(["--durable-store", &durable_flag, "--sample", "1000"])
        .env_remove("JITSHIP_CONFIG")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("1 missing, 0 corrupt, 0 repaired"), "{text}");
    assert!(!lost.exists());
    // The watcher's own root has nothing to publish: what it scrubs is the store's.
    let idle = dir.path().join("idle");
    std::fs::create_dir_all(&idle).unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let w = Watcher::start(
        &fast,
        &[("triton", &idle)],
        SETTLE,
        &[
            "--durable-store",
            &durable_flag,
            "--scrub-interval",
            "1h",
            "--scrub-sample",
            "1000",
            "--metrics-addr",
            &addr,
        ],
    );
    w.wait_metrics(
        port,
        &[
            "\njitship_store_scrub_runs_total 1\n",
            "\njitship_store_scrub_missing_total 1\n",
            "\njitship_store_scrub_repaired_total 1\n",
            "\njitship_store_scrub_corrupt_total 0\n",
            "\njitship_store_scrub_last_unrepaired 0\n",
        ],
    );
    let (_, body) = http_get(port, "/metrics");
    assert!(
        body.contains(&format!(
            "\njitship_store_scrub_checked_total {}\n",
            packs.len()
        )),
        "{body}"
    );
    assert_eq!(
        std::fs::read(lost).unwrap(),
        std::fs::read(durable.join("jitship/pack").join(name)).unwrap(),
        "put back as the durable tier holds it"
    );
    let (status, log) = w.terminate();
    assert!(status.success(), "exit {status}; log:\n{log}");
    assert!(
        log.contains("scrub: a pack a kept generation needs is missing"),
        "{log}"
    );
}
