//! Install from each tier, with the `jitship` binary (a child process, as operators run it), on a
//! small-file tree (Triton-like) and a large-file tree. Every figure is a ratio against baselines
//! measured in the same run on the same tree:
//! - `fast`: install from the local store holding the generation (the fast tier's hit);
//! - `directory`: the fast store empty, the generation in a durable directory tier
//!   (`--durable-store local:DIR`): read through, put back (read-repair);
//! - `registry`: the fast store empty, the generation in a real registry (Debian's
//!   docker-registry on 127.0.0.1, `--durable-store oci+http:...`): tags listed, head judged,
//!   blobs pulled and verified into a scratch store, read through, put back;
//! - `after repair`: the next install from the store the registry install repaired;
//! - `skopeo pull`: `skopeo copy` of the same artifact (its manifest and the same blobs) from
//!   the registry to an OCI layout directory: a standard client's raw pull, the floor for
//!   `registry`; and `tar -x` of the tree, the floor for writing it.
//!
//! Run: `cargo build --release --workspace --bin jitship && cargo bench --workspace --bench durable_tiers`
//! (JITSHIP_BENCH_SCALE=0.2 for a quick run; needs docker-registry and skopeo). Warm page cache;
//! best of 3 per figure, each with fresh roots and a fresh fast store.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use jitship_tests::child::{Run, jitship_bin, run_measured, settle};
use jitship_tests::fixtures;
use jitship_tests::registry::TestRegistry;

struct Figures {
    fast: Duration,
    directory: Duration,
    registry: Duration,
    after_repair: Duration,
    skopeo: Duration,
    tar_x: Duration,
}

fn best_of<F: FnMut(usize) -> Run>(n: usize, mut f: F) -> Run {
    (0..n).map(&mut f).min_by_key(|r| r.wall).expect("n > 0")
}

fn install(bin: &Path, store: &Path, durable: Option<&str>, dst: &Path, tag: &str) -> Run {
    let mut cmd = Command::new(bin);
    cmd.args(["install", "--json", "--fact", &format!("test.tag={tag}")])
        .arg("--cache")
        .arg(format!("bench:native={}", dst.display()))
        .arg("--store")
        .arg(format!("local:{}", store.display()))
        .env("DOCKER_CONFIG", "/nonexistent");
    if let Some(d) = durable {
        cmd.args(["--durable-store", d]);
    }
    let run = run_measured(&mut cmd, &[0]);
    let report: serde_json::Value = serde_json::from_str(&run.stdout).expect("install --json");
    assert_eq!(
        report["results"][0]["outcome"], "installed",
        "{}",
        run.stdout
    );
    run
}

fn measure(name: &str, make: &dyn Fn(&Path), bin: &Path, registry: &TestRegistry) -> Figures {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make(&src);
    let digest = fixtures::digest(&src);
    let bytes: u64 = digest
        .keys()
        .map(|rel| std::fs::metadata(src.join(rel)).unwrap().len())
        .sum();
    eprintln!(
        "{name}: {} files, {:.1} MiB",
        digest.len(),
        bytes as f64 / 1048576.0
    );
    let tag = name.replace(' ', "-");
    let publish = |store: &Path, durable: &str| {
        let mut cmd = Command::new(bin);
        cmd.args(["publish", "--json", "--pack-size", "16MiB"])
            .args(["--fact", &format!("test.tag={tag}")])
            .arg("--cache")
            .arg(format!("bench:native={}", src.display()))
            .arg("--store")
            .arg(format!("local:{}", store.display()))
            .args(["--durable-store", durable])
            .env("DOCKER_CONFIG", "/nonexistent");
        run_measured(&mut cmd, &[0])
    };
    let dir_tier = t.path().join("durable-dir");
    let _ = publish(
        &t.path().join("published-dir"),
        &format!("local:{}", dir_tier.display()),
    );
    let pushed = publish(&t.path().join("published"), &registry.durable_store_arg());
    let report: serde_json::Value = serde_json::from_str(&pushed.stdout).expect("publish --json");
    let outcome = report["results"][0]["registry"]["generation"]["outcome"]
        .as_str()
        .expect("pushed")
        .to_owned();
    let reference = outcome
        .strip_prefix("pushed to oci:")
        .expect("pushed to the registry");

    let fresh = |what: &str, i: usize| {
        let p = t.path().join(format!("{what}-{i}"));
        let _ = std::fs::remove_dir_all(&p);
        p
    };
    let tar = t.path().join("tree.tar");
    let out = Command::new("tar")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(&src)
        .arg(".")
        .status()
        .unwrap();
    assert!(out.success());
    let tar_x = best_of(3, |i| {
        let dst = fresh("tar-x", i);
        std::fs::create_dir_all(&dst).unwrap();
        settle();
        run_measured(
            Command::new("tar").arg("-xf").arg(&tar).arg("-C").arg(&dst),
            &[0],
        )
    })
    .wall;
    let fast = best_of(3, |i| {
        let dst = fresh("fast-dst", i);
        settle();
        install(bin, &t.path().join("published"), None, &dst, &tag)
    })
    .wall;
    let directory = best_of(3, |i| {
        let store = fresh("dir-store", i);
        let dst = fresh("dir-dst", i);
        settle();
        install(
            bin,
            &store,
            Some(&format!("local:{}", dir_tier.display())),
            &dst,
            &tag,
        )
    })
    .wall;
    let registry_run = best_of(3, |i| {
        let store = fresh("reg-store", i);
        let dst = fresh("reg-dst", i);
        settle();
        let run = install(bin, &store, Some(&registry.durable_store_arg()), &dst, &tag);
        assert!(run.stdout.contains("\"served\""), "{}", run.stdout);
        run
    });
    assert_eq!(fixtures::digest(&t.path().join("reg-dst-0")), digest);
    // The store the first registry install repaired: the next pod's install.
    let after_repair = best_of(3, |i| {
        let dst = fresh("after-dst", i);
        settle();
        install(bin, &t.path().join("reg-store-0"), None, &dst, &tag)
    })
    .wall;
    let skopeo = best_of(3, |i| {
        let out = fresh("skopeo", i);
        settle();
        run_measured(
            Command::new("skopeo").args([
                "copy",
                "--quiet",
                "--src-tls-verify=false",
                &format!("docker://{reference}"),
                &format!("oci:{}:bench", out.display()),
            ]),
            &[0],
        )
    })
    .wall;
    Figures {
        fast,
        directory,
        registry: registry_run.wall,
        after_repair,
        skopeo,
        tar_x,
    }
}

fn main() {
    let bin = jitship_bin();
    let scale: f64 = std::env::var("JITSHIP_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let kernels = ((3000.0 * scale) as usize).max(50);
    let large = ((128.0 * scale) as usize).max(8) << 20;
    let registry = TestRegistry::start();
    let small = measure(
        "triton-like",
        &|p| fixtures::triton_tree(p, kernels, 1),
        &bin,
        &registry,
    );
    let big = measure(
        "large files",
        &|p| fixtures::large_files_tree(p, 4, large, 2),
        &bin,
        &registry,
    );
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "\n| tree | fast | directory tier | registry tier | next pod after repair | skopeo pull | tar -x |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (name, f) in [("triton-like", &small), ("large files", &big)] {
        println!(
            "| {name} | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms |",
            ms(f.fast),
            ms(f.directory),
            ms(f.registry),
            ms(f.after_repair),
            ms(f.skopeo),
            ms(f.tar_x)
        );
    }
    println!(
        "\n| tree | directory / fast | registry / fast | registry / (skopeo pull + tar -x) | next pod after repair / fast |"
    );
    println!("|---|---|---|---|---|");
    for (name, f) in [("triton-like", &small), ("large files", &big)] {
        println!(
            "| {name} | {:.2}x | {:.2}x | {:.2}x | {:.2}x |",
            ratio(f.directory, f.fast),
            ratio(f.registry, f.fast),
            ratio(f.registry, f.skopeo + f.tar_x),
            ratio(f.after_repair, f.fast),
        );
    }
}
