//! Publish and install through Mooncake against the raw library in the same run.
//!
//! For each tree (a Triton-like cache of tens of thousands of small files; a few large files):
//! - `publish`: jitship's whole publish (scan, hash, pack, upload, manifest, head) into a fresh
//!   namespace, timed end to end;
//! - `install`: jitship's whole install (head, manifest, fetch, verify, stage, rename) into a
//!   fresh root, timed end to end;
//! - `raw put` / `raw get`: the very pack bytes that publish uploaded, already in one registered
//!   buffer, moved with one `batch_put_from` and one `batch_get_into` through the same library:
//!   the limit of this machine.
//!
//! Ratios are raw time / jitship time (1.0 = as fast as raw; the goal is at least 0.8). Medians
//! of `JITSHIP_BENCH_REPS` (default 3) runs. Run inside the test cluster, e.g.
//!   JITSHIP_CLUSTER_SEGMENT_MB=4096 tests/cluster/cluster.sh run -- \
//!     cargo test -p jitship-tests --bench mooncake
//! Trees: those of the foundation bench (`benches/throughput.rs`): `fixtures::triton_tree` with
//! 3000 kernels (24,000 files) and `fixtures::large_files_tree` (4 files of 128 MiB).
//! `JITSHIP_BENCH_KERNELS` and `JITSHIP_BENCH_LARGE_MIB` change the sizes.

use std::ffi::{CString, c_char, c_int, c_void};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jitship::catalog;
use jitship::generation::CompatId;
use jitship::install::InstallOutcome;
use jitship::publish::PublishOutcome;
use jitship::store::{KeyLayout, MooncakeStore, Store};
use jitship_tests::fixtures::{digest, large_files_tree, triton_tree};
use jitship_tests::mooncake::{Cluster, cluster, flow, unique_prefix};
use mooncake_sys as sys;

const PACK: u64 = 64 * 1024 * 1024;

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
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

    /// One batch_put_from and one batch_get_into of `objects`, then one get_into per object;
    /// returns (put time, batched get time, one-by-one get time).
    fn round(&self, prefix: &str, objects: &[Vec<u8>]) -> (Duration, Duration, Duration) {
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
        // SAFETY: base is a live allocation of `total` bytes, unregistered before it is freed.
        assert_eq!(
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
        // One object per call, as install fetches packs (one in flight, bounded memory).
        let t = Instant::now();
        for i in 0..n {
            // SAFETY: as for the batch.
            let r = unsafe { (self.lib.get_into)(self.handle, key_ptrs[i], bufs[i], sizes[i]) };
            assert_eq!(r, sizes[i] as i64, "raw get_into");
        }
        let get_one_by_one = t.elapsed();
        for k in &keys {
            // SAFETY: NUL-terminated key; force removal frees the space for the next round.
            unsafe { (self.lib.remove)(self.handle, k.as_ptr(), 1) };
        }
        // SAFETY: registered above; no call uses it any more; same layout as allocated.
        unsafe {
            (self.lib.unregister_buffer)(self.handle, base.cast());
            std::alloc::dealloc(base, layout);
        }
        (put, get, get_one_by_one)
    }
}

impl Raw {
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

struct Figures {
    name: String,
    files: usize,
    bytes: u64,
    publish: Duration,
    install: Duration,
    raw_put: Duration,
    raw_get: Duration,
    raw_get_one: Duration,
    store_put: Duration,
    store_get: Duration,
}

fn bench_tree(
    c: &Cluster,
    raw: &Raw,
    store: &Arc<dyn Store>,
    name: &str,
    src: &Path,
    reps: usize,
) -> Figures {
    let files = digest(src).len();
    let facts = flow::facts(name);
    let (mut publish, mut install, mut raw_put, mut raw_get) = (vec![], vec![], vec![], vec![]);
    let (mut store_put, mut store_get, mut raw_get_one) = (vec![], vec![], vec![]);
    let mut bytes = 0;
    for rep in 0..reps {
        let layout = KeyLayout::new(&unique_prefix(&format!("bench-{name}-{rep}"))).unwrap();
        let t = Instant::now();
        let report = flow::publish(store.as_ref(), &layout, src, &facts, PACK)
            .unwrap_or_else(|e| panic!("publish: {e}"));
        publish.push(t.elapsed());
        assert!(
            matches!(report.outcome, PublishOutcome::Published { .. }),
            "{:?}",
            report.outcome
        );
        bytes = report.bytes_uploaded;

        let dst = tempfile::tempdir().unwrap();
        let root = dst.path().join("root");
        let t = Instant::now();
        let r = flow::install(
            store.clone(),
            &layout,
            &root,
            &facts,
            Duration::from_secs(600),
        );
        install.push(t.elapsed());
        assert_eq!(r.outcome, InstallOutcome::Installed, "{}", r.detail);
        assert_eq!(r.files_installed as usize, files);

        // The very pack bytes publish uploaded (fetched untimed), through the raw library.
        let compat = CompatId::new("triton", &report.compat_key);
        let head = catalog::newest_head(store.as_ref(), &layout, &compat)
            .unwrap()
            .expect("head");
        let manifest = catalog::fetch_manifest(store.as_ref(), &layout, &head.generation)
            .unwrap()
            .expect("manifest");
        let packs: Vec<Vec<u8>> = manifest
            .packs
            .iter()
            .map(|p| store.get(&layout.pack(&p.id)).unwrap().expect("pack"))
            .collect();
        assert_eq!(packs.iter().map(|p| p.len() as u64).sum::<u64>(), bytes);
        let (p, g, g1) = raw.round(&layout.namespace().to_string(), &packs);
        raw_put.push(p);
        raw_get.push(g);
        raw_get_one.push(g1);

        // The same bytes through jitship's Store trait alone (staging copy, worker thread, typed
        // results), to tell the backend's cost from publish's and install's file work.
        let keys: Vec<String> = (0..packs.len())
            .map(|i| format!("{}/store/{i}", layout.namespace()))
            .collect();
        let items: Vec<(&str, &[u8])> = keys
            .iter()
            .zip(&packs)
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        let t = Instant::now();
        for r in store.put_batch(&items) {
            r.unwrap_or_else(|e| panic!("store put: {e}"));
        }
        store_put.push(t.elapsed());
        let t = Instant::now();
        for (k, v) in keys.iter().zip(&packs) {
            let got = store
                .get(k)
                .unwrap_or_else(|e| panic!("store get: {e}"))
                .expect("stored");
            assert!(got.len() == v.len());
        }
        store_get.push(t.elapsed());
        raw.clear(layout.namespace());
        let _ = c;
    }
    Figures {
        name: name.into(),
        files,
        bytes,
        publish: median(publish),
        install: median(install),
        raw_put: median(raw_put),
        raw_get: median(raw_get),
        raw_get_one: median(raw_get_one),
        store_put: median(store_put),
        store_get: median(store_get),
    }
}

fn main() {
    // `cargo test --benches` passes harness flags; this bench takes none.
    let Some(c) = cluster("bench mooncake") else {
        return;
    };
    let reps = env_num("JITSHIP_BENCH_REPS", 3).max(1);
    let kernels = env_num("JITSHIP_BENCH_KERNELS", 3000);
    let large_mib = env_num("JITSHIP_BENCH_LARGE_MIB", 128);
    let tmp = tempfile::tempdir().unwrap();
    let triton = tmp.path().join("triton");
    let large = tmp.path().join("large");
    eprintln!("generating trees...");
    triton_tree(&triton, kernels, 1);
    large_files_tree(&large, 4, large_mib * 1024 * 1024, 2);

    let store: Arc<dyn Store> =
        Arc::new(MooncakeStore::connect(&c.config()).unwrap_or_else(|e| panic!("connect: {e}")));
    let raw = Raw::connect(&c);
    let figures = [
        bench_tree(&c, &raw, &store, "triton", &triton, reps),
        bench_tree(&c, &raw, &store, "large", &large, reps),
    ];
    let mbs = |b: u64, d: Duration| b as f64 / d.as_secs_f64() / 1e6;
    println!("\nMooncake (TCP loopback, one store node), pack size 64 MiB, medians of {reps} runs");
    println!(
        "{:<8} {:>7} {:>9} | {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9}",
        "tree", "files", "MiB", "publish", "raw put", "ratio", "install", "raw get", "ratio"
    );
    for f in &figures {
        println!(
            "{:<8} {:>7} {:>9.1} | {:>6.0}MB/s {:>6.0}MB/s {:>9.2} | {:>6.0}MB/s {:>6.0}MB/s {:>9.2}",
            f.name,
            f.files,
            f.bytes as f64 / 1048576.0,
            mbs(f.bytes, f.publish),
            mbs(f.bytes, f.raw_put),
            f.raw_put.as_secs_f64() / f.publish.as_secs_f64(),
            mbs(f.bytes, f.install),
            mbs(f.bytes, f.raw_get),
            f.raw_get.as_secs_f64() / f.install.as_secs_f64(),
        );
    }
    println!("\nthe Mooncake backend alone (Store::put_batch / Store::get of the same packs)");
    println!(
        "{:<8} | {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9}",
        "tree", "store put", "raw put", "ratio", "store get", "raw get", "ratio"
    );
    for f in &figures {
        println!(
            "{:<8} | {:>6.0}MB/s {:>6.0}MB/s {:>9.2} | {:>6.0}MB/s {:>6.0}MB/s {:>9.2}",
            f.name,
            mbs(f.bytes, f.store_put),
            mbs(f.bytes, f.raw_put),
            f.raw_put.as_secs_f64() / f.store_put.as_secs_f64(),
            mbs(f.bytes, f.store_get),
            mbs(f.bytes, f.raw_get),
            f.raw_get.as_secs_f64() / f.store_get.as_secs_f64(),
        );
    }
    println!("\nraw get_into one object per call (how install fetches: one pack in flight)");
    for f in &figures {
        println!(
            "{:<8} | raw get one by one {:>6.0}MB/s; store get / that: {:.2}; install / that: {:.2}",
            f.name,
            mbs(f.bytes, f.raw_get_one),
            f.raw_get_one.as_secs_f64() / f.store_get.as_secs_f64(),
            f.raw_get_one.as_secs_f64() / f.install.as_secs_f64(),
        );
    }
    println!("ratio = raw time / jitship time (goal >= 0.8)");
}
