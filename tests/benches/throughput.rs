//! Publish and install throughput of the `jitship` binary on the local store, each figure printed
//! as a ratio against a baseline measured in the same run on the same tree:
//! - publish vs `tar -c` of the tree, install vs `tar -x` of that archive;
//! - publish's hashing phase vs raw single-threaded blake3 over the same bytes held in memory,
//!   and vs a bare loop that opens, reads and hashes the same files on every core (the floor of
//!   per-file system calls on this machine, with none of jitship's checks);
//! - peak memory (max RSS of the jitship process) for a tree and a tree twice its size, with
//!   16 MiB packs so both trees span many packs (memory is bounded by a few pack buffers).
//!
//! Run: `cargo build --release --workspace --bin jitship && cargo bench --workspace --bench throughput`
//! (set JITSHIP_BENCH_SCALE=0.2 for a quick run). Warm page cache; one run per figure, best of 3.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use jitship_tests::child::{Run, jitship_bin, run_measured, settle};
use jitship_tests::fixtures;

/// The bench accepts installed (0) and already-current (10).
fn run(cmd: &mut Command) -> Run {
    run_measured(cmd, &[0, 10])
}

/// The fastest of `n` runs of `f`, each after `settle` (`f` removes what the last run left first).
fn best_of<F: FnMut() -> Run>(n: usize, mut f: F) -> Run {
    (0..n).map(|_| f()).min_by_key(|r| r.wall).expect("n > 0")
}

fn tree_bytes(root: &Path) -> Vec<Vec<u8>> {
    fixtures::digest(root)
        .keys()
        .map(|rel| std::fs::read(root.join(rel)).unwrap())
        .collect()
}

struct Figures {
    publish: Duration,
    tar_c: Duration,
    install: Duration,
    tar_x: Duration,
    hash: Duration,
    raw_blake3: Duration,
    bare_read_hash: Duration,
    rss_publish: i64,
    rss_install: i64,
}

fn measure(name: &str, make: &dyn Fn(&Path), bin: &Path) -> Figures {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make(&src);
    let files = fixtures::digest(&src).len();
    let bytes: u64 = tree_bytes(&src).iter().map(|b| b.len() as u64).sum();
    eprintln!("{name}: {files} files, {:.1} MiB", bytes as f64 / 1048576.0);

    let tar = t.path().join("tree.tar");
    let tar_c = best_of(3, || {
        settle();
        run(Command::new("tar")
            .arg("-cf")
            .arg(&tar)
            .arg("-C")
            .arg(&src)
            .arg("."))
    })
    .wall;
    let tar_x = best_of(3, || {
        let dst = t.path().join("tar-x");
        let _ = std::fs::remove_dir_all(&dst);
        std::fs::create_dir_all(&dst).unwrap();
        settle();
        run(Command::new("tar").arg("-xf").arg(&tar).arg("-C").arg(&dst))
    })
    .wall;

    let publish = best_of(3, || {
        let store = t.path().join("store");
        let _ = std::fs::remove_dir_all(&store);
        settle();
        run(Command::new(bin)
            .args([
                "publish",
                "--json",
                "--pack-size",
                "16MiB",
                "--fact",
                "gpu.name=bench",
                "--cache",
            ])
            .arg(format!("bench:native={}", src.display()))
            .arg("--store")
            .arg(format!("local:{}", store.display())))
    });
    // The hashing phase of the run that was fastest overall (not of the last run).
    let report: serde_json::Value = serde_json::from_str(&publish.stdout).expect("publish --json");
    let hash = Duration::from_millis(report["results"][0]["hash_ms"].as_u64().expect("hash_ms"));

    let install = best_of(3, || {
        let dst = t.path().join("dst");
        let _ = std::fs::remove_dir_all(&dst);
        settle();
        run(Command::new(bin)
            .args(["install", "--fact", "gpu.name=bench", "--cache"])
            .arg(format!("bench:native={}", dst.display()))
            .arg("--store")
            .arg(format!("local:{}", t.path().join("store").display())))
    });
    assert_eq!(
        fixtures::digest(&src),
        fixtures::digest(&t.path().join("dst")),
        "installed tree differs"
    );

    let contents = tree_bytes(&src);
    let raw_blake3 = (0..3)
        .map(|_| {
            let start = Instant::now();
            for c in &contents {
                std::hint::black_box(blake3::hash(c));
            }
            start.elapsed()
        })
        .min()
        .unwrap();
    let paths: Vec<_> = fixtures::digest(&src)
        .into_keys()
        .map(|rel| src.join(rel))
        .collect();
    let bare_read_hash = (0..3).map(|_| bare_read_and_hash(&paths)).min().unwrap();
    Figures {
        publish: publish.wall,
        tar_c,
        install: install.wall,
        tar_x,
        hash,
        raw_blake3,
        bare_read_hash,
        rss_publish: publish.max_rss_kib,
        rss_install: install.max_rss_kib,
    }
}

/// Opens, reads and blake3-hashes each file, the files split evenly over one thread per core,
/// each with one reused buffer: what hashing costs here with nothing but the system calls.
fn bare_read_and_hash(paths: &[std::path::PathBuf]) -> Duration {
    use std::io::Read;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let start = Instant::now();
    std::thread::scope(|scope| {
        for part in paths.chunks(paths.len().div_ceil(threads).max(1)) {
            scope.spawn(move || {
                let mut buffer = vec![0u8; 256 * 1024];
                for path in part {
                    let mut file = std::fs::File::open(path).unwrap();
                    let mut hasher = blake3::Hasher::new();
                    loop {
                        match file.read(&mut buffer).unwrap() {
                            0 => break,
                            n => hasher.update(&buffer[..n]),
                        };
                    }
                    std::hint::black_box(hasher.finalize());
                }
            });
        }
    });
    start.elapsed()
}

fn main() {
    let bin = jitship_bin();
    let scale: f64 = std::env::var("JITSHIP_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let kernels = ((3000.0 * scale) as usize).max(50);
    let large = ((128.0 * scale) as usize).max(8) << 20;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;

    let small = measure(
        "triton-like",
        &|p| fixtures::triton_tree(p, kernels, 1),
        &bin,
    );
    let small2 = measure(
        "triton-like x2",
        &|p| fixtures::triton_tree(p, kernels * 2, 1),
        &bin,
    );
    let big = measure(
        "large files",
        &|p| fixtures::large_files_tree(p, 4, large, 2),
        &bin,
    );

    println!(
        "\n| tree | publish / tar -c | install / tar -x | hashing speed vs raw blake3 | vs bare read and hash | peak RSS publish, install |"
    );
    println!("|---|---|---|---|---|---|");
    for (name, f) in [
        ("triton-like", &small),
        ("triton-like x2", &small2),
        ("large files", &big),
    ] {
        println!(
            "| {name} | {:.0} ms / {:.0} ms = {:.2}x | {:.0} ms / {:.0} ms = {:.2}x | {:.2} (hash {:.0} ms, raw {:.0} ms) | {:.2} (bare {:.0} ms; bare vs raw {:.2}) | {} MiB, {} MiB |",
            ms(f.publish),
            ms(f.tar_c),
            ms(f.publish) / ms(f.tar_c),
            ms(f.install),
            ms(f.tar_x),
            ms(f.install) / ms(f.tar_x),
            ms(f.raw_blake3) / ms(f.hash).max(1.0),
            ms(f.hash),
            ms(f.raw_blake3),
            ms(f.bare_read_hash) / ms(f.hash).max(1.0),
            ms(f.bare_read_hash),
            ms(f.raw_blake3) / ms(f.bare_read_hash).max(1.0),
            f.rss_publish / 1024,
            f.rss_install / 1024,
        );
    }
    println!(
        "\npeak RSS growth when the small-file tree doubles: publish {:.2}x, install {:.2}x",
        small2.rss_publish as f64 / small.rss_publish as f64,
        small2.rss_install as f64 / small.rss_install as f64
    );
}
