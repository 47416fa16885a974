//! The fixed costs of a Mooncake command, measured on the real CLI in the test cluster.
//!
//! For the jitship binary next to this bench (`target/<profile>/jitship`) and, when
//! `JITSHIP_BENCH_BASELINE` names another jitship binary (e.g. one built from main), for that one
//! too, alternating run by run so both see the same load:
//! - `ls` of an empty namespace and of a namespace holding one generation;
//! - `publish` of a small tree (a Triton-like cache of `JITSHIP_BENCH_KERNELS`, default 100
//!   kernels, about 6 MB) and `install` of it into an empty root: wall time and peak RSS;
//! - `install` again, already current (exit 10).
//!
//! Each figure is a range over `JITSHIP_BENCH_REPS` (default 5) runs; the ratio compares medians.
//! Run inside the test cluster:
//! ```text
//! cargo build --workspace --bin jitship && cargo test --workspace --bench mooncake_fixed --no-run
//! JITSHIP_BENCH_BASELINE=/path/to/main/jitship tests/cluster/cluster.sh run -- \
//!   target/debug/deps/mooncake_fixed-<hash>
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;

use jitship_tests::child::{Run, jitship_bin, run_measured};
use jitship_tests::fixtures::{digest, triton_tree};
use jitship_tests::mooncake::{cluster, unique_prefix};

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One binary's figures: every run of each measure.
#[derive(Default)]
struct Figures {
    ls_empty: Vec<Run>,
    ls_full: Vec<Run>,
    publish: Vec<Run>,
    install: Vec<Run>,
    install_current: Vec<Run>,
}

/// One run of each measure. `killed_ok`: a process killed by a signal is counted, not fatal (the
/// baseline: main's binary could abort at exit, see the report).
fn one_round(
    bin: &Path,
    config: &Path,
    src: &Path,
    scratch: &Path,
    tag: &str,
    killed_ok: bool,
    f: &mut Figures,
) {
    let ns = unique_prefix(&format!("fixed-{tag}"));
    let cli = |command: &str, cache_root: Option<&Path>| {
        let mut cmd = Command::new(bin);
        cmd.arg(command)
            .arg("--config")
            .arg(config)
            .args(["--namespace", &ns]);
        if let Some(root) = cache_root {
            cmd.args(["--fact", "gpu.name=bench", "--cache"])
                .arg(format!("bench:native={}", root.display()));
        }
        cmd
    };
    let dst = scratch.join(format!("dst-{tag}"));
    let _ = std::fs::remove_dir_all(&dst);
    let ok = |codes: &[i32]| -> Vec<i32> {
        let mut v = codes.to_vec();
        if killed_ok {
            v.push(-1);
        }
        v
    };
    let run_measured = |cmd: &mut Command, codes: &[i32]| run_measured(cmd, &ok(codes));
    f.ls_empty.push(run_measured(&mut cli("ls", None), &[0]));
    f.publish
        .push(run_measured(&mut cli("publish", Some(src)), &[0]));
    f.ls_full.push(run_measured(&mut cli("ls", None), &[0]));
    f.install
        .push(run_measured(&mut cli("install", Some(&dst)), &[0]));
    assert_eq!(digest(src), digest(&dst), "installed tree differs");
    f.install_current
        .push(run_measured(&mut cli("install", Some(&dst)), &[10]));
}

/// A line of the report: its name, the runs it shows, the figure of a run, the unit.
type Row = (
    &'static str,
    fn(&Figures) -> &[Run],
    fn(&Run) -> f64,
    &'static str,
);

fn ms(r: &Run) -> f64 {
    r.wall.as_secs_f64() * 1000.0
}

fn mib(r: &Run) -> f64 {
    r.max_rss_kib as f64 / 1024.0
}

fn range(runs: &[Run], f: fn(&Run) -> f64) -> (f64, f64, f64) {
    let mut v: Vec<f64> = runs.iter().map(f).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

fn main() {
    // `cargo test --benches` passes harness flags; this bench takes none.
    let c = cluster("bench mooncake_fixed");
    let reps = env_num("JITSHIP_BENCH_REPS", 5).max(1);
    let kernels = env_num("JITSHIP_BENCH_KERNELS", 100);
    let ours = jitship_bin();
    let baseline = std::env::var_os("JITSHIP_BENCH_BASELINE").map(PathBuf::from);
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    triton_tree(&src, kernels, 1);
    let bytes: u64 = digest(&src)
        .keys()
        .map(|rel| std::fs::metadata(src.join(rel)).unwrap().len())
        .sum();
    let config = tmp.path().join("jitship.toml");
    c.write_cli_config(&config);

    let mut mine = Figures::default();
    let mut base = Figures::default();
    for rep in 0..reps {
        one_round(
            &ours,
            &config,
            &src,
            tmp.path(),
            &format!("ours-{rep}"),
            false,
            &mut mine,
        );
        if let Some(b) = &baseline {
            one_round(
                b,
                &config,
                &src,
                tmp.path(),
                &format!("base-{rep}"),
                true,
                &mut base,
            );
        }
        eprintln!("round {} of {reps} done", rep + 1);
    }

    println!(
        "\nMooncake fixed costs (TCP loopback, one store node); small tree {} files, {:.1} MB; {reps} runs each, min-max (median)",
        digest(&src).len(),
        bytes as f64 / 1e6
    );
    println!("ours: {}", ours.display());
    if let Some(b) = &baseline {
        println!("baseline: {}", b.display());
    }
    let rows: [Row; 7] = [
        ("ls, empty namespace", |f| &f.ls_empty, ms, "ms"),
        ("ls, one generation", |f| &f.ls_full, ms, "ms"),
        ("install, already current", |f| &f.install_current, ms, "ms"),
        ("publish, small tree", |f| &f.publish, ms, "ms"),
        ("install, small tree", |f| &f.install, ms, "ms"),
        ("peak RSS publish", |f| &f.publish, mib, "MiB"),
        ("peak RSS install", |f| &f.install, mib, "MiB"),
    ];
    println!(
        "{:<26} | {:>24} | {:>24} | {:>7}",
        "measure", "ours", "baseline", "ratio"
    );
    for (name, pick, unit_of, unit) in rows {
        let (lo, med, hi) = range(pick(&mine), unit_of);
        let ours_s = format!("{lo:.0}-{hi:.0} ({med:.0}) {unit}");
        let (base_s, ratio) = if baseline.is_some() {
            let (blo, bmed, bhi) = range(pick(&base), unit_of);
            (
                format!("{blo:.0}-{bhi:.0} ({bmed:.0}) {unit}"),
                format!("{:.2}", med / bmed),
            )
        } else {
            ("-".into(), "-".into())
        };
        println!("{name:<26} | {ours_s:>24} | {base_s:>24} | {ratio:>7}");
    }
    println!("ratio = ours / baseline, medians (lower is better)");
    if baseline.is_some() {
        let all = [
            &base.ls_empty,
            &base.ls_full,
            &base.publish,
            &base.install,
            &base.install_current,
        ];
        let killed: usize = all
            .iter()
            .map(|v| v.iter().filter(|r| r.code == -1).count())
            .sum();
        let total: usize = all.iter().map(|v| v.len()).sum();
        println!(
            "baseline processes killed by a signal (e.g. an abort at exit): {killed} of {total}"
        );
    }
}
