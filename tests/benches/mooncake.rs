//! Publish and install through Mooncake at real sizes, every figure a ratio against baselines
//! measured in the same run on the same tree, against a real master and store node (TCP
//! loopback). For each tree (a Triton-like cache of tens of thousands of small files; a few large
//! files; optionally a huge tree for the memory bound):
//! - jitship: the real CLI as a child process (`publish`, `install` into an empty root, `install`
//!   again when already current, `ls`), wall time and peak RSS, as an operator runs it;
//! - raw: the very pack bytes jitship stored, in one registered buffer, moved with one
//!   `batch_put_from` and one `batch_get_into` through the same library (this machine's limit);
//! - PR 676: `pr676_baseline.py`, what ModelExpress PR 676 does with the official Python client
//!   (tar in RAM, 64 MiB chunks, a buffer registered per chunk), as a child process;
//! - `tar -x` of the same tree from a warm archive (the local-disk part of an install);
//! - the tree's files written from memory, then `sync -f`: what this disk takes to hold the
//!   tree durably, as an install must.
//!
//! Publish's own phases (hashing, upload) come from `publish --json`, so the share of process
//! start, store setup and teardown shows beside raw put. Before any run, the store node's
//! segment is written once (`Raw::warm_segment`), so no run pays the VM's first-touch faults.
//!
//! Medians of `JITSHIP_BENCH_REPS` (default 3). Build, then run inside the test cluster:
//! ```text
//! cargo build --release --workspace --bin jitship && cargo bench --workspace --bench mooncake --no-run
//! JITSHIP_CLUSTER_SEGMENT_MB=4096 tests/cluster/cluster.sh run -- \
//!   cargo bench --workspace --bench mooncake
//! ```
//! Trees: `fixtures::triton_tree` with `JITSHIP_BENCH_KERNELS` (default 2500: 20,000 files) and
//! `fixtures::large_files_tree` (4 files of `JITSHIP_BENCH_LARGE_MIB`, default 128 MiB);
//! `JITSHIP_BENCH_HUGE_GIB=4` adds a tree of that many GiB (files of 256 MiB; the segment must
//! hold it: `JITSHIP_CLUSTER_SEGMENT_MB=6144`), measured once, for peak RSS against the size.

use std::ffi::{CString, c_char, c_int, c_void};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jitship::catalog;
use jitship::catalog::KeyLayout;
use jitship::store::{MooncakeStore, Store};
use jitship_tests::child::{Run, jitship_bin, run_measured, settle};
use jitship_tests::fixtures::{digest, large_files_tree, triton_tree};
use jitship_tests::mooncake::{Cluster, cluster, unique_prefix};
use mooncake_sys as sys;

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A second, raw client: the C ABI with one registered buffer, nothing of jitship in the way.
struct Raw {
    lib: Arc<sys::MooncakeLib>,
    handle: sys::mooncake_store_t,
}

impl Raw {
    fn connect(c: &Cluster) -> Raw {
        // SAFETY: the cluster script names the Mooncake Store library.
        let lib = unsafe { sys::MooncakeLib::load(&c.library) }.unwrap_or_else(|e| panic!("{e}"));
        let cs = |s: &str| CString::new(s).unwrap();
        let (host, meta, proto, dev, master) = (
            cs("127.0.0.1"),
            cs(&c.metadata),
            cs("tcp"),
            cs(""),
            cs(&c.master),
        );
        // SAFETY: fresh handle, NUL-terminated arguments alive for the call.
        let handle = unsafe { (lib.create)() };
        assert!(!handle.is_null());
        // SAFETY: a live handle; NUL-terminated arguments alive for the call.
        let rc = unsafe {
            (lib.setup)(
                handle,
                host.as_ptr(),
                meta.as_ptr(),
                0,
                16 << 20,
                proto.as_ptr(),
                dev.as_ptr(),
                master.as_ptr(),
            )
        };
        assert_eq!(rc, 0, "raw setup");
        Raw { lib, handle }
    }

    /// One batch_put_from and one batch_get_into of `objects`; returns (put time, get time).
    fn round(&self, prefix: &str, objects: &[Vec<u8>]) -> (Duration, Duration) {
        let total: usize = objects.iter().map(|o| o.len().next_multiple_of(4096)).sum();
        let layout = std::alloc::Layout::from_size_align(total, 4096).unwrap();
        // SAFETY: non-zero size; freed below with the same layout.
        let base = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!base.is_null());
        let mut offsets = Vec::new();
        let mut at = 0;
        for o in objects {
            // SAFETY: at + len <= total by construction.
            unsafe { std::ptr::copy_nonoverlapping(o.as_ptr(), base.add(at), o.len()) };
            offsets.push(at);
            at += o.len().next_multiple_of(4096);
        }
        assert_eq!(
            // SAFETY: base is a live allocation of `total` bytes, unregistered before it is freed.
            unsafe { (self.lib.register_buffer)(self.handle, base.cast(), total) },
            0
        );
        let keys: Vec<CString> = (0..objects.len())
            .map(|i| CString::new(format!("{prefix}/raw/{i}")).unwrap())
            .collect();
        let key_ptrs: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr()).collect();
        // SAFETY: offsets lie inside the buffer.
        let mut bufs: Vec<*mut c_void> = offsets
            .iter()
            .map(|&o| unsafe { base.add(o) }.cast())
            .collect();
        let sizes: Vec<usize> = objects.iter().map(Vec::len).collect();
        let n = objects.len();

        let mut put_out: Vec<c_int> = vec![0; n];
        let t = Instant::now();
        // SAFETY: arrays of n entries; registered buffer; NUL-terminated keys.
        let rc = unsafe {
            (self.lib.batch_put_from)(
                self.handle,
                key_ptrs.as_ptr(),
                bufs.as_mut_ptr(),
                sizes.as_ptr(),
                n,
                std::ptr::null(),
                put_out.as_mut_ptr(),
            )
        };
        let put = t.elapsed();
        assert!(
            rc == 0 && put_out.iter().all(|&r| r == 0),
            "raw put: {rc} {put_out:?}"
        );
        // Zero the buffer so the get really fills it.
        // SAFETY: within the allocation.
        unsafe { std::ptr::write_bytes(base, 0, total) };
        let mut get_out: Vec<i64> = vec![0; n];
        let t = Instant::now();
        // SAFETY: as for the put.
        let rc = unsafe {
            (self.lib.batch_get_into)(
                self.handle,
                key_ptrs.as_ptr(),
                bufs.as_mut_ptr(),
                sizes.as_ptr(),
                n,
                get_out.as_mut_ptr(),
            )
        };
        let get = t.elapsed();
        assert!(
            rc == 0 && get_out.iter().zip(&sizes).all(|(&r, &s)| r == s as i64),
            "raw get: {rc} {get_out:?}"
        );
        for (o, &off) in objects.iter().zip(&offsets) {
            // SAFETY: within the allocation.
            let got = unsafe { std::slice::from_raw_parts(base.add(off), o.len()) };
            assert!(got == &o[..], "raw get returned other bytes");
        }
        for k in &keys {
            // SAFETY: NUL-terminated key; force removal frees the space for the next round.
            unsafe { (self.lib.remove)(self.handle, k.as_ptr(), 1) };
        }
        // SAFETY: registered above; no call uses it any more; same layout as allocated.
        unsafe {
            (self.lib.unregister_buffer)(self.handle, base.cast());
            std::alloc::dealloc(base, layout);
        }
        (put, get)
    }
}

impl Raw {
    /// Writes the store node's whole segment once (64 MiB objects, then force-removed), so that
    /// every run below writes into memory the machine has already backed. On this VM a page of
    /// guest memory first written costs the host a fault: the first 512 MiB published into a
    /// fresh segment took 0.7-7 s, the same publish into a written segment 0.5-0.6 s. Without
    /// this, whoever writes first pays it, and raw rounds (which free their keys and reuse the
    /// space) did not. A store node whose segment is registered for RDMA has it pinned up front.
    fn warm_segment(&self, segment_bytes: usize) {
        const OBJECT: usize = 64 << 20;
        let buffer = vec![0u8; OBJECT];
        // SAFETY: a live allocation of OBJECT bytes, unregistered before it is dropped.
        let rc = unsafe {
            (self.lib.register_buffer)(self.handle, buffer.as_ptr().cast_mut().cast(), OBJECT)
        };
        assert_eq!(rc, 0, "register the warm-up buffer");
        let start = Instant::now();
        let mut written = 0;
        for i in 0..segment_bytes / OBJECT {
            let key = CString::new(format!("warm-up/{i}")).unwrap();
            let mut buf: *mut c_void = buffer.as_ptr().cast_mut().cast();
            let mut out: c_int = 0;
            // SAFETY: one key, one registered buffer of OBJECT bytes.
            let rc = unsafe {
                (self.lib.batch_put_from)(
                    self.handle,
                    &key.as_ptr(),
                    &mut buf,
                    &OBJECT,
                    1,
                    std::ptr::null(),
                    &mut out,
                )
            };
            if rc != 0 || out != 0 {
                break; // full: every page the node can hand out has been written
            }
            written += OBJECT;
        }
        // SAFETY: registered above; no call uses it any more.
        unsafe { (self.lib.unregister_buffer)(self.handle, buffer.as_ptr().cast_mut().cast()) };
        self.clear("warm-up");
        eprintln!(
            "warm-up: wrote {} MiB of the store node's segment in {:.1} s",
            written >> 20,
            start.elapsed().as_secs_f64()
        );
    }

    /// Force-removes every key under `namespace` (readers' leases would block a plain remove),
    /// so each run starts with the same free space.
    fn clear(&self, namespace: &str) {
        let pattern = CString::new(format!("^{namespace}/")).unwrap();
        // SAFETY: NUL-terminated pattern; force=1 overrides leases.
        let removed = unsafe { (self.lib.remove_by_regex)(self.handle, pattern.as_ptr(), 1) };
        assert!(removed >= 0, "remove_by_regex: {removed}");
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: the handle came from create; nothing uses it any more.
        unsafe { (self.lib.destroy)(self.handle) };
    }
}

/// Runs the CLI against the cluster in `namespace`, on the native policy.
fn cli(config: &Path, namespace: &str, command: &str, root: Option<&Path>) -> Command {
    let mut cmd = Command::new(jitship_bin());
    cmd.arg(command)
        .arg("--config")
        .arg(config)
        .args(["--namespace", namespace]);
    if let Some(root) = root {
        cmd.args(["--fact", "model.id=bench", "--cache"])
            .arg(format!("kernels:native={}", root.display()));
    }
    cmd
}

/// The interpreter `python3` on PATH runs, resolved once (`sys.executable`). Both sides use it:
/// jitship's facts probe through `[gather] python`, as a pod image that knows its Python sets it,
/// and the PR 676 baseline. On a build machine whose `python3` is a pyenv shim (bash scripts
/// that pick a version), each start through PATH costs about 85 ms more, which neither side
/// would pay in a pod.
fn python() -> &'static Path {
    static PYTHON: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    PYTHON.get_or_init(|| {
        let out = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("run python3");
        assert!(out.status.success(), "python3 did not say where it lives");
        std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

/// Runs the PR 676-style baseline (`pr676_baseline.py OP ...`) with the official client.
fn pr676(c: &Cluster, op: &str, prefix: &str, dir: &Path) -> Run {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/pr676_baseline.py");
    let pythonpath = c
        .pythonpath
        .as_ref()
        .expect("JITSHIP_TEST_MOONCAKE_PYTHONPATH names the official wheel");
    run_measured(
        Command::new(python())
            .arg(script)
            .args([op, &c.master, &c.metadata, prefix])
            .arg(dir)
            .env("PYTHONPATH", pythonpath),
        &[0],
    )
}

#[derive(Default)]
struct Figures {
    name: String,
    files: usize,
    bytes: u64,
    publish: Vec<Run>,
    install: Vec<Run>,
    install_current: Vec<Run>,
    ls: Vec<Run>,
    pr676_publish: Vec<Run>,
    pr676_install: Vec<Run>,
    raw_put: Vec<Duration>,
    raw_get: Vec<Duration>,
    tar_x: Vec<Run>,
    /// The tree's files written from memory, then `sync -f`: what this disk takes to hold the
    /// tree durably, as an install must (it `syncfs`es before its first rename).
    durable_write: Vec<Duration>,
    /// publish --json's hashing and upload phases, and its own duration, in ms.
    publish_phases: Vec<[u64; 3]>,
}

fn bench_tree(
    c: &Cluster,
    raw: &Raw,
    store: &Arc<dyn Store>,
    config: &Path,
    name: &str,
    src: &Path,
    reps: usize,
) -> Figures {
    let scratch = tempfile::tempdir().unwrap();
    let tar = scratch.path().join("tree.tar");
    run_measured(
        Command::new("tar")
            .arg("-cf")
            .arg(&tar)
            .arg("-C")
            .arg(src)
            .arg("."),
        &[0],
    );
    let want = digest(src);
    let tree_files: Vec<(String, Vec<u8>)> = want
        .keys()
        .map(|rel| (rel.clone(), std::fs::read(src.join(rel)).unwrap()))
        .collect();
    let mut f = Figures {
        name: name.into(),
        files: want.len(),
        ..Figures::default()
    };
    for rep in 0..reps {
        let ns = unique_prefix(&format!("bench-{name}-{rep}"));
        let layout = KeyLayout::new(&ns).unwrap();
        let root = scratch.path().join(format!("jitship-{rep}"));
        settle();
        let publish = run_measured(cli(config, &ns, "publish", Some(src)).arg("--json"), &[0]);
        let report: serde_json::Value =
            serde_json::from_str(&publish.stdout).expect("publish --json");
        let phase = |name: &str| report["results"][0][name].as_u64().expect("publish phase");
        f.publish_phases
            .push([phase("hash_ms"), phase("upload_ms"), phase("duration_ms")]);
        f.publish.push(publish);
        settle();
        f.install.push(run_measured(
            &mut cli(config, &ns, "install", Some(&root)),
            &[0],
        ));
        assert!(digest(&root) == want, "jitship installed another tree");
        f.install_current.push(run_measured(
            &mut cli(config, &ns, "install", Some(&root)),
            &[10],
        ));
        f.ls.push(run_measured(&mut cli(config, &ns, "ls", None), &[0]));

        let prefix = format!("{ns}/pr676");
        let pr_root = scratch.path().join(format!("pr676-{rep}"));
        settle();
        f.pr676_publish.push(pr676(c, "publish", &prefix, src));
        settle();
        f.pr676_install.push(pr676(c, "install", &prefix, &pr_root));
        // Contents only: tar keeps whole-second mtimes and its data filter drops mode bits.
        assert!(
            contents(&pr_root) == contents(src),
            "the PR 676 baseline installed another tree"
        );

        let tar_root = scratch.path().join(format!("tar-{rep}"));
        std::fs::create_dir_all(&tar_root).unwrap();
        settle();
        f.tar_x.push(run_measured(
            Command::new("tar")
                .arg("-xf")
                .arg(&tar)
                .arg("-C")
                .arg(&tar_root),
            &[0],
        ));
        let written_root = scratch.path().join(format!("written-{rep}"));
        settle();
        f.durable_write
            .push(durable_write(&written_root, &tree_files));

        // The very pack bytes jitship stored (read untimed), through the raw library.
        let packs = stored_packs(store.as_ref(), &layout);
        f.bytes = packs.iter().map(|p| p.len() as u64).sum();
        let (put, get) = raw.round(&ns, &packs);
        f.raw_put.push(put);
        f.raw_get.push(get);
        drop(packs);
        raw.clear(&ns);
        for dir in [root, pr_root, tar_root, written_root] {
            std::fs::remove_dir_all(dir).unwrap();
        }
        eprintln!("{name}: round {} of {reps} done", rep + 1);
    }
    f
}

/// Writes `files` (path under `root`, content) and flushes the file system with `sync -f`:
/// the floor of any install that keeps its crash guarantee on this disk.
fn durable_write(root: &Path, files: &[(String, Vec<u8>)]) -> Duration {
    let start = Instant::now();
    for (rel, bytes) in files {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, bytes).unwrap();
    }
    let status = Command::new("sync").arg("-f").arg(root).status().unwrap();
    assert!(status.success(), "sync -f {}: {status}", root.display());
    start.elapsed()
}

/// Each file's path and content hash (no times or modes).
fn contents(root: &Path) -> Vec<(String, String)> {
    digest(root)
        .into_iter()
        .map(|(path, (hash, ..))| (path, hash))
        .collect()
}

/// The packs of the newest generation in the namespace `layout` names.
fn stored_packs(store: &dyn Store, layout: &KeyLayout) -> Vec<Vec<u8>> {
    let index = catalog::compat_ids(store, layout).expect("compat index");
    let compat = index.first().expect("one compat id");
    let head = catalog::newest_head(store, layout, compat)
        .unwrap()
        .expect("head");
    let manifest = catalog::fetch_manifest(store, layout, &head.generation)
        .unwrap()
        .expect("manifest");
    manifest
        .packs
        .iter()
        .map(|p| store.get(&layout.pack(&p.id)).unwrap().expect("pack"))
        .collect()
}

/// A huge tree published and installed once, for peak RSS against its size.
fn bench_huge(config: &Path, gib: usize) -> (u64, Run, Run) {
    let scratch = tempfile::tempdir().unwrap();
    let src = scratch.path().join("src");
    let file = 256usize << 20;
    let files = (gib << 30) / file;
    eprintln!("huge: generating {files} files of 256 MiB...");
    large_files_tree(&src, files, file, 3);
    let ns = unique_prefix("bench-huge");
    let root = scratch.path().join("dst");
    settle();
    let publish = run_measured(&mut cli(config, &ns, "publish", Some(&src)), &[0]);
    settle();
    let install = run_measured(&mut cli(config, &ns, "install", Some(&root)), &[0]);
    assert!(
        digest(&root) == digest(&src),
        "huge tree installed differently"
    );
    ((files * file) as u64, publish, install)
}

fn median_d(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn wall(runs: &[Run]) -> Duration {
    median_d(runs.iter().map(|r| r.wall).collect())
}

fn rss_mib(runs: &[Run]) -> f64 {
    runs.iter().map(|r| r.max_rss_kib).max().unwrap_or(0) as f64 / 1024.0
}

fn main() {
    // `cargo test --benches` passes harness flags; this bench takes none.
    let c = cluster("bench mooncake");
    let reps = env_num("JITSHIP_BENCH_REPS", 3).max(1);
    let kernels = env_num("JITSHIP_BENCH_KERNELS", 2500);
    let large_mib = env_num("JITSHIP_BENCH_LARGE_MIB", 128);
    let huge_gib = env_num("JITSHIP_BENCH_HUGE_GIB", 0);
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("jitship.toml");
    c.write_cli_config(&config);
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&config)
            .unwrap();
        writeln!(f, "[gather]\npython = {:?}", python().display().to_string()).unwrap();
    }
    eprintln!(
        "python: {} (jitship's [gather] python and the PR 676 baseline)",
        python().display()
    );
    let triton = tmp.path().join("triton");
    let large = tmp.path().join("large");
    eprintln!("generating trees...");
    triton_tree(&triton, kernels, 1);
    large_files_tree(&large, 4, large_mib * 1024 * 1024, 2);

    let store: Arc<dyn Store> =
        Arc::new(MooncakeStore::connect(&c.config()).unwrap_or_else(|e| panic!("connect: {e}")));
    let raw = Raw::connect(&c);
    // The segment cluster.sh gave the store node (its variable and default).
    raw.warm_segment(env_num("JITSHIP_CLUSTER_SEGMENT_MB", 1024) << 20);
    let figures = [
        bench_tree(&c, &raw, &store, &config, "small", &triton, reps),
        bench_tree(&c, &raw, &store, &config, "large", &large, reps),
    ];
    let mbs = |b: u64, d: Duration| b as f64 / d.as_secs_f64() / 1e6;
    let ratio = |base: Duration, ours: Duration| base.as_secs_f64() / ours.as_secs_f64();
    println!(
        "\nMooncake (TCP loopback, one store node), jitship CLI with 64 MiB packs; medians of {reps} runs"
    );
    println!("ratios are baseline time / jitship time: above 1 = jitship faster");
    println!(
        "{:<6} {:>6} {:>7} | {:>8} {:>7} {:>7} | {:>8} {:>7} {:>7} {:>9} {:>6}",
        "tree",
        "files",
        "MiB",
        "publish",
        "/raw",
        "/PR676",
        "install",
        "/raw",
        "/PR676",
        "/tar+raw",
        "/disk"
    );
    for f in &figures {
        let (p, i) = (wall(&f.publish), wall(&f.install));
        let tar_plus_raw = wall(&f.tar_x) + median_d(f.raw_get.clone());
        println!(
            "{:<6} {:>6} {:>7.1} | {:>5.0}MB/s {:>7.2} {:>7.2} | {:>5.0}MB/s {:>7.2} {:>7.2} {:>9.2} {:>6.2}",
            f.name,
            f.files,
            f.bytes as f64 / 1048576.0,
            mbs(f.bytes, p),
            ratio(median_d(f.raw_put.clone()), p),
            ratio(wall(&f.pr676_publish), p),
            mbs(f.bytes, i),
            ratio(median_d(f.raw_get.clone()), i),
            ratio(wall(&f.pr676_install), i),
            ratio(tar_plus_raw, i),
            ratio(median_d(f.durable_write.clone()), i),
        );
    }
    println!(
        "/disk: the tree written from memory + `sync -f` (this disk's durable write) / install"
    );
    println!(
        "\npublish phases (ms, medians): the CLI's wall time; the publish itself: hashing, then reading\n\
         and uploading packs; the rest: process start, store setup and teardown. raw put: the same packs"
    );
    println!(
        "{:<6} | {:>6} {:>8} {:>8} {:>7} {:>6} | {:>7} {:>11}",
        "tree", "wall", "publish", "hashing", "upload", "rest", "raw put", "raw/upload"
    );
    for f in &figures {
        let med = |i: usize| {
            let mut v: Vec<u64> = f.publish_phases.iter().map(|p| p[i]).collect();
            v.sort();
            v[v.len() / 2]
        };
        let (wall_ms, raw_ms) = (
            wall(&f.publish).as_millis() as u64,
            median_d(f.raw_put.clone()).as_millis() as u64,
        );
        println!(
            "{:<6} | {:>6} {:>8} {:>8} {:>7} {:>6} | {:>7} {:>11.2}",
            f.name,
            wall_ms,
            med(2),
            med(0),
            med(1),
            wall_ms.saturating_sub(med(2)),
            raw_ms,
            raw_ms as f64 / med(1).max(1) as f64,
        );
    }
    println!("\npeak RSS (MiB, largest of the runs) and fixed costs (ms, medians)");
    println!(
        "{:<6} | {:>9} {:>9} | {:>9} {:>9} | {:>16} {:>6}",
        "tree", "publish", "PR676", "install", "PR676", "already-current", "ls"
    );
    for f in &figures {
        println!(
            "{:<6} | {:>9.0} {:>9.0} | {:>9.0} {:>9.0} | {:>16.0} {:>6.0}",
            f.name,
            rss_mib(&f.publish),
            rss_mib(&f.pr676_publish),
            rss_mib(&f.install),
            rss_mib(&f.pr676_install),
            wall(&f.install_current).as_secs_f64() * 1e3,
            wall(&f.ls).as_secs_f64() * 1e3,
        );
    }
    if huge_gib > 0 {
        let (bytes, publish, install) = bench_huge(&config, huge_gib);
        println!(
            "\nhuge tree {:.1} GiB: publish {:.1} s, peak RSS {:.0} MiB; install {:.1} s, peak RSS {:.0} MiB",
            bytes as f64 / (1u64 << 30) as f64,
            publish.wall.as_secs_f64(),
            publish.max_rss_kib as f64 / 1024.0,
            install.wall.as_secs_f64(),
            install.max_rss_kib as f64 / 1024.0,
        );
    }
}
