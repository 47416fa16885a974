//! Policy host figures: compile time, cold load with and without the compiled-module cache,
//! per-call latency of `select` over 200 entries on a fresh instance (the way jitship calls it),
//! and for every built-in policy the fuel and time per 1,000 entries of `select` on trees of its
//! kind at 10,000 and 100,000 entries (`tests/src/policy_scale.rs`; a linear policy shows the same
//! figure at both sizes, the ratio is printed).
//!
//! Run: `cargo bench -p jitship-tests --bench policy_host` (builds the test guest first, like the tests);
//! `cargo bench -p jitship-tests --bench policy_host -- builtins` for the built-in figures alone. Fuel is
//! deterministic, so `cargo test -p jitship-tests --bench policy_host -- builtins` (dev profile, no
//! release build of wasmtime) gives the same fuel figures with slower times.
//! Reports min / median / p90 over N runs; on a shared machine compare minima (see
//! docs/wasm-host.md#measuring-on-a-shared-machine).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jitship::facts::Facts;
use jitship::policy::FileEntry;
use jitship::policy::build::{BuildOptions, build_policy_crate_to};
use jitship::policy::builtin;
use jitship::policy::host::{Limits, PolicyEngine};

// The trees of the scale test, shared with it.
use jitship_tests::policy_scale;

fn stats(name: &str, mut us: Vec<f64>) {
    us.sort_by(f64::total_cmp);
    let pick = |q: f64| us[((us.len() - 1) as f64 * q).round() as usize];
    println!(
        "{name:<58} n={:<5} min {:>9.1} µs  median {:>9.1} µs  p90 {:>9.1} µs",
        us.len(),
        pick(0.0),
        pick(0.5),
        pick(0.9)
    );
}

fn main() {
    // `-- builtins` prints only the per-built-in figures (no guest build, no load figures).
    if std::env::args().any(|a| a == "builtins") {
        builtin_scale(Limits {
            fuel: 1_000_000_000,
            deadline: Duration::from_secs(5),
            memory: 64 << 20,
            read_budget: 16 << 20,
        });
        return;
    }
    let guests = Path::new(env!("CARGO_MANIFEST_DIR")).join("guests");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("policy-guests");
    let wasm = out.join("good.wasm");
    let opts = BuildOptions {
        target_dir: Some(out.join("target")),
        quiet: true,
        locked: true,
    };
    let started = Instant::now();
    let built =
        build_policy_crate_to(&guests.join("good"), &wasm, &opts).expect("building the test guest");
    println!(
        "guest: {} ({} bytes core, {} bytes component), built in {:.1} s (cargo's cache included)",
        wasm.display(),
        built.core_size,
        built.component.len(),
        started.elapsed().as_secs_f64()
    );
    let bytes = std::fs::read(&wasm).expect("reading the guest");
    let limits = Limits {
        fuel: 1_000_000_000,
        deadline: Duration::from_secs(5),
        memory: 64 << 20,
        read_budget: 16 << 20,
    };

    // Compile (Cranelift, parallel compilation, fuel + epoch instrumentation), no disk cache.
    let engine = PolicyEngine::with_cache_dir(limits, None).expect("engine");
    let mut compile = Vec::new();
    let mut load_nocache = Vec::new();
    for _ in 0..15 {
        let p = engine.load(&bytes, "good").expect("load");
        compile.push(p.load_stats().compile_us as f64);
        load_nocache.push(p.load_stats().total_us as f64);
    }
    stats("compile (Component from .wasm)", compile);
    stats(
        "cold load without cache (compile+check+link+info)",
        load_nocache,
    );

    // With the on-disk cache: the first load writes the .cwasm, the rest deserialize it.
    let dir = tempfile::tempdir().expect("tempdir");
    let engine =
        PolicyEngine::with_cache_dir(limits, Some(&dir.path().join("cache"))).expect("engine");
    let first = engine.load(&bytes, "good").expect("load");
    assert!(!first.load_stats().from_cache);
    println!(
        "first load with cache (compile + write .cwasm): {} µs",
        first.load_stats().total_us
    );
    let mut deser = Vec::new();
    let mut load_cached = Vec::new();
    for _ in 0..200 {
        let p = engine.load(&bytes, "good").expect("load");
        assert!(p.load_stats().from_cache);
        deser.push(p.load_stats().compile_us as f64);
        load_cached.push(p.load_stats().total_us as f64);
    }
    stats("cache hit (read .cwasm + deserialize)", deser);
    stats("cold load with cache (hit+check+link+info)", load_cached);
    drop(first);

    let policy: Arc<_> = Arc::new(engine.load(&bytes, "good").expect("load"));
    let entries: Vec<FileEntry> = (0..200)
        .map(|i| {
            let path = match i % 10 {
                0 => format!("{:02x}/tmp.pid_{i}_0/kernel.cubin", i),
                1 => format!("{:02x}/kernel_{i}.lock", i),
                _ => format!("{:02x}/{:064x}/triton_kernel_{i}.cubin", i, i * 7919),
            };
            FileEntry {
                path,
                size: 4096 + i as u64,
                mtime_ms: 1_700_000_000_000 + i as u64,
            }
        })
        .collect();
    let root = tempfile::tempdir().expect("tempdir");
    let mut select = Vec::new();
    let mut fuel = 0;
    for _ in 0..2000 {
        let t0 = Instant::now();
        let t = policy.select_traced(root.path(), &entries).expect("select");
        select.push(t0.elapsed().as_secs_f64() * 1e6);
        assert_eq!(t.value.expect("decisions").decisions.len(), 200);
        fuel = t.fuel_used;
    }
    stats("select(200 entries), fresh store+instance per call", select);
    println!("fuel per select(200): {fuel}");

    let facts: Facts = [
        ("gpu.name", "NVIDIA H100 80GB HBM3"),
        ("python.version", "3.12.3"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut key = Vec::new();
    for _ in 0..2000 {
        let t0 = Instant::now();
        let t = policy.compat_key_traced(&facts).expect("compat-key");
        key.push(t0.elapsed().as_secs_f64() * 1e6);
        assert!(t.value.is_ok());
    }
    stats("compat-key(2 facts), fresh store+instance per call", key);

    builtin_scale(limits);

    // Optional: compile and cache figures for other modules (e.g. a built-in policy), given as
    // arguments after `--`.
    for path in std::env::args().skip(1).filter(|a| a.ends_with(".wasm")) {
        let bytes = std::fs::read(&path).expect("reading the module");
        let engine = PolicyEngine::with_cache_dir(limits, None).expect("engine");
        let compile: Vec<f64> = (0..5)
            .map(|_| {
                engine
                    .load(&bytes, &path)
                    .expect("load")
                    .load_stats()
                    .compile_us as f64
            })
            .collect();
        stats(
            &format!("compile {} ({} bytes)", path, bytes.len()),
            compile,
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let engine =
            PolicyEngine::with_cache_dir(limits, Some(&dir.path().join("cache"))).expect("engine");
        engine.load(&bytes, &path).expect("load");
        let cached: Vec<f64> = (0..50)
            .map(|_| {
                engine
                    .load(&bytes, &path)
                    .expect("load")
                    .load_stats()
                    .total_us as f64
            })
            .collect();
        stats(&format!("cold load with cache {path}"), cached);
    }
}

/// Fuel and wall time per 1,000 entries of each built-in's `select`, at two tree sizes.
fn builtin_scale(limits: Limits) {
    let limits = Limits {
        fuel: u64::MAX / 4,
        deadline: Duration::from_secs(600),
        ..limits
    };
    let engine = PolicyEngine::with_cache_dir(limits, None).expect("engine");
    println!(
        "{:<20} {:>8} {:>14} {:>12} {:>8}   (per 1,000 entries; ratio = fuel/1k at 100k vs 10k)",
        "built-in", "entries", "fuel", "time", "ratio"
    );
    for kind in builtin::kinds() {
        let policy = engine
            .load(builtin::lookup(kind).expect("built-in"), kind)
            .expect("load");
        let mut base = None;
        for n in [10_000, 100_000] {
            let dir = tempfile::tempdir().expect("tempdir");
            let entries = policy_scale::tree(kind, dir.path(), n);
            let per_k = 1000.0 / entries.len() as f64;
            let mut best: Option<(u64, Duration)> = None;
            // Best of three at 10k; one run at 100k (a quadratic policy takes minutes there).
            for _ in 0..if n == 10_000 { 3 } else { 1 } {
                let t = policy.select_traced(dir.path(), &entries).expect("select");
                if let Err(e) = &t.value {
                    println!("{kind:<20} {n:>8} failed: {e}");
                }
                if best.is_none_or(|(_, w)| t.wall < w) {
                    best = Some((t.fuel_used, t.wall));
                }
            }
            let (fuel, wall) = best.expect("one run at least");
            let fuel_k = fuel as f64 * per_k;
            let ratio = base.map_or(String::from("-"), |b: f64| format!("{:.2}", fuel_k / b));
            base.get_or_insert(fuel_k);
            println!(
                "{kind:<20} {:>8} {:>14.0} {:>9.3} ms {:>8}",
                entries.len(),
                fuel_k,
                wall.as_secs_f64() * 1e3 * per_k,
                ratio
            );
        }
    }
}
