//! A fleet at once: N concurrent `jitship install`s of one generation (a rollout's init
//! containers) and N concurrent `jitship publish`es into one compat key (a scale-down's final
//! publishes), each a child process of the real CLI, against the local store and, inside the
//! test cluster, Mooncake. Not a timed test: it prints, per N, the wall times (p50, p95, max),
//! failures by exit code, peak RSS per install, CPU each store node used, and the ratios
//! max / (N x one install alone) and against the PR 676-style baseline (`pr676_baseline.py`)
//! herded the same way in the same run.
//!
//! Fan-out: `JITSHIP_FLEET_REPLICAS` (e.g. `1,2`) publishes the tree once per value of
//! `[publish] pack_replicas` and runs the largest install herd against each; run it once in a
//! one-node cluster and once with `JITSHIP_CLUSTER_STORE_NODES=2` to compare the herd's max wall.
//!
//! ```text
//! cargo build --release --workspace --bin jitship && cargo bench -p jitship-tests --bench fleet --no-run
//! tests/cluster/cluster.sh run -- cargo bench -p jitship-tests --bench fleet
//! JITSHIP_CLUSTER_STORE_NODES=2 JITSHIP_FLEET_REPLICAS=1,2 JITSHIP_FLEET_PUBLISHERS= \
//!   tests/cluster/cluster.sh run -- cargo bench -p jitship-tests --bench fleet
//! ```
//! Knobs: `JITSHIP_FLEET_INSTALLS` (default `1,4,16,64`), `JITSHIP_FLEET_PUBLISHERS` (`8,24,100`;
//! empty: none), `JITSHIP_FLEET_BASELINE_MAX` (largest N the PR 676 baseline herds, default 16:
//! each holds the whole tar in memory), `JITSHIP_FLEET_KERNELS` (Triton-like kernels, default
//! 250: 2,000 files, 15 MB) plus `JITSHIP_FLEET_LARGE_MIB` (two files of it, default 16),
//! `JITSHIP_FLEET_LOCAL=0` skips the local store, `JITSHIP_FLEET_DEADLINE` is the herd's
//! `--deadline` (default 600s). Outside a cluster only the local store runs.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use jitship_tests::bench::{cli, env_list, env_num, herd, pr676_command, python};
use jitship_tests::child::{Run, run_measured, settle};
use jitship_tests::fixtures::{bytes, digest, large_files_tree, triton_tree};
use jitship_tests::mooncake::{Cluster, unique_prefix};

/// Where a fleet runs: a config file for the CLI, and for Mooncake the cluster and its nodes.
struct Target {
    name: String,
    config: PathBuf,
    cluster: Option<Cluster>,
    /// PIDs of the store nodes (`cluster.sh`'s `node.pid`, `node2.pid`, ...).
    nodes: Vec<i32>,
}

impl Target {
    /// A copy of this target's config with `[publish] pack_replicas = replicas`.
    fn with_replicas(&self, replicas: usize, dir: &Path) -> PathBuf {
        let path = dir.join(format!("{}-r{replicas}.toml", self.name));
        let mut text = std::fs::read_to_string(&self.config).unwrap();
        text.push_str(&format!("[publish]\npack_replicas = {replicas}\n"));
        std::fs::write(&path, text).unwrap();
        path
    }

    /// CPU seconds each store node has used so far: its share of serving a herd. (Bytes per
    /// node are not measurable here: `/proc/PID/io` does not count `send`, and every node shares
    /// the namespace's one loopback device.)
    fn node_cpu(&self) -> Vec<f64> {
        self.nodes.iter().map(|pid| cpu_seconds(*pid)).collect()
    }
}

/// utime + stime of `pid` in seconds (fields 14 and 15 of `/proc/PID/stat`; 100 ticks a second).
fn cpu_seconds(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (tick(11) + tick(12)) / 100.0
}

/// The master's Prometheus metrics (`JITSHIP_TEST_MOONCAKE_METRICS`), name{labels} -> value.
fn master_metrics() -> BTreeMap<String, f64> {
    let Ok(url) = std::env::var("JITSHIP_TEST_MOONCAKE_METRICS") else {
        return BTreeMap::new();
    };
    let host = url.trim_start_matches("http://").trim_end_matches('/');
    let Ok(mut s) = std::net::TcpStream::connect(host) else {
        return BTreeMap::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(s, "GET /metrics HTTP/1.0\r\nHost: {host}\r\n\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

/// Store calls the master saw between two snapshots: every `*_requests_total` plus the items of
/// batched ones (a batch of 64 exists is 64 look-ups).
fn store_calls(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> (u64, u64) {
    let delta = |k: &str| after.get(k).unwrap_or(&0.0) - before.get(k).unwrap_or(&0.0);
    let requests: f64 = after
        .keys()
        // Store nodes ping and poll for tasks on their own: not the client's calls.
        .filter(|k| {
            k.ends_with("_requests_total") && !k.contains("ping") && !k.contains("fetch_tasks")
        })
        .map(|k| delta(k))
        .sum();
    let items: f64 = after
        .keys()
        .filter(|k| k.starts_with("master_batch_") && k.ends_with("_items_total"))
        .map(|k| delta(k))
        .sum();
    (requests as u64, items as u64)
}

/// Placement: bytes allocated in each segment (store node), from the master's metrics.
fn segments(m: &BTreeMap<String, f64>) -> Vec<(String, u64)> {
    m.iter()
        .filter_map(|(k, v)| {
            let seg = k.strip_prefix("segment_allocated_bytes{segment=\"")?;
            Some((seg.trim_end_matches("\"}").to_owned(), *v as u64))
        })
        .collect()
}

struct Stats {
    p50: f64,
    p95: f64,
    max: f64,
    failures: BTreeMap<i32, usize>,
    rss_max_mib: f64,
}

fn stats(runs: &[Run], ok: &[i32]) -> Stats {
    let mut w: Vec<f64> = runs.iter().map(|r| r.wall.as_secs_f64()).collect();
    w.sort_by(f64::total_cmp);
    let at = |q: f64| w[((w.len() as f64 * q).ceil() as usize).clamp(1, w.len()) - 1];
    let mut failures = BTreeMap::new();
    for r in runs.iter().filter(|r| !ok.contains(&r.code)) {
        *failures.entry(r.code).or_default() += 1;
    }
    Stats {
        p50: at(0.5),
        p95: at(0.95),
        max: *w.last().unwrap(),
        failures,
        rss_max_mib: runs.iter().map(|r| r.max_rss_kib).max().unwrap_or(0) as f64 / 1024.0,
    }
}

fn failures(f: &BTreeMap<i32, usize>) -> String {
    if f.is_empty() {
        return "0".into();
    }
    f.iter()
        .map(|(code, n)| format!("{n}x exit {code}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A failed child's reason: the first lines of its report (stdout) and the last line jitship
/// wrote to `path` (its stderr), skipping the Mooncake library's own log lines (`E1206 ...`,
/// `W1206 ...`, `WARNING: Logging before InitGoogleLogging()`), which said nothing of why.
fn last_line(stdout: &str, path: &Path) -> String {
    let glog = |l: &str| {
        let b = l.as_bytes();
        l.starts_with("WARNING: Logging before")
            || (b.len() > 5
                && matches!(b[0], b'E' | b'W' | b'I' | b'F')
                && b[1..5].iter().all(u8::is_ascii_digit))
    };
    let report: Vec<&str> = stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(2)
        .collect();
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty() && !glog(l))
        .unwrap_or("");
    format!("{} | {line}", report.join(" / "))
        .chars()
        .take(600)
        .collect()
}

fn stderr_to(path: &Path) -> std::fs::File {
    std::fs::File::create(path).unwrap()
}

/// The herd's `--deadline` (`JITSHIP_FLEET_DEADLINE`, default 600s): on 2 cores, 64 installs of
/// the default tree take longer than jitship's default of 60 s, and exit 15 (deadline) all at once.
fn deadline() -> String {
    std::env::var("JITSHIP_FLEET_DEADLINE").unwrap_or_else(|_| "600s".into())
}

struct InstallRow {
    n: usize,
    s: Stats,
    wrong_trees: usize,
    node_cpu: Vec<f64>,
    baseline: Option<Stats>,
}

/// N concurrent installs of `ns`'s generation into fresh roots, each checked against `want`.
fn install_herd(
    t: &Target,
    config: &Path,
    ns: &str,
    n: usize,
    dir: &Path,
    want: &jitship_tests::fixtures::TreeDigest,
) -> (Stats, usize, Vec<f64>) {
    let roots: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("root-{n}-{i}"))).collect();
    settle();
    let before = t.node_cpu();
    let runs = herd(n, |i| {
        let mut cmd = cli(config, ns, "install", Some(&roots[i]));
        cmd.args(["--deadline", &deadline()]);
        cmd.stderr(stderr_to(&dir.join(format!("install-{n}-{i}.err"))));
        cmd
    });
    let after = t.node_cpu();
    let mut wrong = 0;
    for (i, r) in runs.iter().enumerate() {
        if r.code == 0 && digest(&roots[i]) != *want {
            wrong += 1;
        }
        if r.code != 0 {
            eprintln!(
                "  install {i} of {n} exited {}: {}",
                r.code,
                last_line(&r.stdout, &dir.join(format!("install-{n}-{i}.err")))
            );
        }
        let _ = std::fs::remove_dir_all(&roots[i]);
    }
    let node_cpu = before.iter().zip(&after).map(|(b, a)| a - b).collect();
    (stats(&runs, &[0]), wrong, node_cpu)
}

fn bench_installs(t: &Target, src: &Path, dir: &Path, ns_of: &str) -> Vec<InstallRow> {
    let ns = unique_prefix(&format!("fleet-{}-{ns_of}", t.name));
    let publish = run_measured(
        cli(&t.config, &ns, "publish", Some(src)).arg("--json"),
        &[0],
    );
    let published: serde_json::Value = serde_json::from_str(&publish.stdout).unwrap_or_default();
    eprintln!(
        "{}: published {} bytes in {} pack(s) in {:.2} s",
        t.name,
        published["results"][0]["bytes_uploaded"],
        published["results"][0]["packs_uploaded"],
        publish.wall.as_secs_f64()
    );
    let want = digest(src);
    let pr_prefix = format!("{ns}/pr676");
    if let Some(c) = &t.cluster {
        run_measured(&mut pr676_command(c, "publish", &pr_prefix, src), &[0]);
    }
    let baseline_max = env_num("JITSHIP_FLEET_BASELINE_MAX", 16);
    let mut rows = Vec::new();
    for n in env_list("JITSHIP_FLEET_INSTALLS", &[1, 4, 16, 64]) {
        let (s, wrong_trees, node_cpu) = install_herd(t, &t.config, &ns, n, dir, &want);
        let baseline = match &t.cluster {
            Some(c) if n <= baseline_max => {
                let dsts: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("pr-{n}-{i}"))).collect();
                settle();
                let runs = herd(n, |i| {
                    let mut cmd = pr676_command(c, "install", &pr_prefix, &dsts[i]);
                    cmd.stderr(stderr_to(&dir.join(format!("pr676-{n}-{i}.err"))));
                    cmd
                });
                for d in &dsts {
                    let _ = std::fs::remove_dir_all(d);
                }
                Some(stats(&runs, &[0]))
            }
            _ => None,
        };
        eprintln!("{}: {n} installs: max {:.2} s", t.name, s.max);
        rows.push(InstallRow {
            n,
            s,
            wrong_trees,
            node_cpu,
            baseline,
        });
    }
    rows
}

/// One install alone: its wall, the bytes it fetched and the store calls the master saw.
fn one_install(config: &Path, ns: &str, dir: &Path) -> (f64, String, (u64, u64)) {
    let root = dir.join("one");
    settle();
    let before = master_metrics();
    let r = run_measured(cli(config, ns, "install", Some(&root)).arg("--json"), &[0]);
    let calls = store_calls(&before, &master_metrics());
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap_or_default();
    let fetched = format!(
        "{} packs, {} bytes",
        v["results"][0]["packs_fetched"], v["results"][0]["bytes_fetched"]
    );
    let _ = std::fs::remove_dir_all(&root);
    (r.wall.as_secs_f64(), fetched, calls)
}

struct PublishRow {
    n: usize,
    s: Stats,
    /// Publishers whose every file is in the newest generation (installed and compared).
    in_union: usize,
    reasons: BTreeMap<String, usize>,
    calls: (u64, u64),
}

/// N concurrent publishers, each of a root of unique files, into one compat key.
fn bench_publishers(t: &Target, n: usize, dir: &Path) -> PublishRow {
    let ns = unique_prefix(&format!("fleet-pub-{}-{n}", t.name));
    let roots: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("pub-{n}-{i}"))).collect();
    for (i, root) in roots.iter().enumerate() {
        for f in 0..4 {
            let path = root.join(format!("pod{i}/k{f}.cubin"));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes((n * 1000 + i * 10 + f) as u64, 16 << 10)).unwrap();
        }
    }
    settle();
    let before = master_metrics();
    let runs = herd(n, |i| {
        let mut cmd = cli(&t.config, &ns, "publish", Some(&roots[i]));
        cmd.stderr(stderr_to(&dir.join(format!("publish-{n}-{i}.err"))));
        cmd
    });
    let calls = store_calls(&before, &master_metrics());
    let mut reasons = BTreeMap::new();
    for (i, r) in runs.iter().enumerate() {
        if r.code != 0 {
            let why = last_line(&r.stdout, &dir.join(format!("publish-{n}-{i}.err")));
            // The reason's last clause (after the key it names), so alike failures count together.
            let key = why.rsplit(": ").next().unwrap_or_default().to_owned();
            *reasons.entry(key).or_default() += 1;
        }
    }
    let union = dir.join(format!("union-{n}"));
    run_measured(&mut cli(&t.config, &ns, "install", Some(&union)), &[0, 10]);
    let in_union = roots
        .iter()
        .filter(|root| {
            digest(root)
                .iter()
                .all(|(p, d)| digest(&union).get(p).is_some_and(|u| u.0 == d.0))
        })
        .count();
    let _ = std::fs::remove_dir_all(&union);
    for root in &roots {
        let _ = std::fs::remove_dir_all(root);
    }
    PublishRow {
        n,
        s: stats(&runs, &[0]),
        in_union,
        reasons,
        calls,
    }
}

fn print_installs(t: &Target, rows: &[InstallRow], replicas: usize) {
    let single = rows.iter().find(|r| r.n == 1).map(|r| r.s.max);
    println!(
        "\n{} ({} store node(s), pack_replicas = {replicas}): concurrent installs",
        t.name,
        t.nodes.len().max(1)
    );
    println!(
        "{:>4} | {:>7} {:>7} {:>7} | {:>9} | {:>13} | {:>8} {:>10} | {:>8} | node CPU s",
        "N",
        "p50 s",
        "p95 s",
        "max s",
        "failures",
        "max/(N x one)",
        "PR676 max",
        "PR676/ours",
        "RSS MiB"
    );
    for r in rows {
        let per = single.map_or("-".into(), |one| {
            format!("{:.2}", r.s.max / (r.n as f64 * one))
        });
        let (bmax, ratio) = match &r.baseline {
            Some(b) => (
                format!(
                    "{:.2}{}",
                    b.max,
                    if b.failures.is_empty() { "" } else { "!" }
                ),
                format!("{:.2}", b.max / r.s.max),
            ),
            None => ("-".into(), "-".into()),
        };
        let nodes = if r.node_cpu.is_empty() {
            "-".into()
        } else {
            r.node_cpu
                .iter()
                .map(|m| format!("{m:.1}"))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        println!(
            "{:>4} | {:>7.2} {:>7.2} {:>7.2} | {:>9} | {:>13} | {:>9} {:>10} | {:>8.0} | {nodes}",
            r.n,
            r.s.p50,
            r.s.p95,
            r.s.max,
            failures(&r.s.failures) + if r.wrong_trees > 0 { " WRONG TREE" } else { "" },
            per,
            bmax,
            ratio,
            r.s.rss_max_mib,
        );
        if let Some(b) = r.baseline.as_ref().filter(|b| !b.failures.is_empty()) {
            println!("       PR676 failures: {}", failures(&b.failures));
        }
    }
}

fn main() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("tree");
    triton_tree(&src, env_num("JITSHIP_FLEET_KERNELS", 250), 7);
    let large = env_num("JITSHIP_FLEET_LARGE_MIB", 16);
    if large > 0 {
        large_files_tree(&src.join("large"), 2, large << 20, 9);
    }
    let tree_bytes: u64 = digest(&src)
        .keys()
        .map(|p| std::fs::metadata(src.join(p)).unwrap().len())
        .sum();
    let files = digest(&src).len();
    let gather = format!("[gather]\npython = {:?}\n", python().display().to_string());
    let mut targets = Vec::new();
    if env_num("JITSHIP_FLEET_LOCAL", 1) != 0 {
        let config = tmp.path().join("local.toml");
        let store = tmp.path().join("local-store");
        std::fs::write(
            &config,
            format!(
                "[store]\nbackend = \"local\"\n[store.local]\npath = {:?}\n{gather}",
                store.display().to_string()
            ),
        )
        .unwrap();
        targets.push(Target {
            name: "local".into(),
            config,
            cluster: None,
            nodes: Vec::new(),
        });
    }
    if std::env::var_os("JITSHIP_TEST_MOONCAKE_MASTER").is_some() {
        let c = jitship_tests::mooncake::cluster("bench fleet");
        let config = tmp.path().join("mooncake.toml");
        c.write_cli_config(&config);
        // Pack copies placed on distinct store nodes (the master's segment list).
        let placement = match std::env::var("JITSHIP_TEST_MOONCAKE_METRICS") {
            Ok(m) => format!("segments_url = \"{m}/get_all_segments\"\n"),
            Err(_) => String::new(),
        };
        std::fs::OpenOptions::new()
            .append(true)
            .open(&config)
            .unwrap()
            .write_all(format!("{placement}{gather}").as_bytes())
            .unwrap();
        let state = PathBuf::from(std::env::var("JITSHIP_TEST_MOONCAKE_STATE").unwrap_or_default());
        let mut nodes = Vec::new();
        for k in 1..=env_num("JITSHIP_TEST_MOONCAKE_STORE_NODES", 1) {
            let name = if k == 1 {
                "node.pid".into()
            } else {
                format!("node{k}.pid")
            };
            if let Some(pid) = std::fs::read_to_string(state.join(name))
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                nodes.push(pid);
            }
        }
        targets.push(Target {
            name: "mooncake".into(),
            config,
            cluster: Some(c),
            nodes,
        });
    } else {
        eprintln!(
            "no test cluster in the environment: the local store only (run inside `tests/cluster/cluster.sh run -- ...` for Mooncake)"
        );
    }
    println!(
        "fleet bench: a tree of {files} files, {:.1} MiB; {} CPUs; jitship CLI child processes",
        tree_bytes as f64 / 1048576.0,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    for t in &targets {
        let dir = tempfile::tempdir_in(tmp.path()).unwrap();
        // Per install and per publish, alone: what the 1,000-pod model multiplies.
        let ns = unique_prefix(&format!("fleet-one-{}", t.name));
        let before = master_metrics();
        let p = run_measured(
            cli(&t.config, &ns, "publish", Some(&src)).arg("--json"),
            &[0],
        );
        let pub_calls = store_calls(&before, &master_metrics());
        let pv: serde_json::Value = serde_json::from_str(&p.stdout).unwrap_or_default();
        let (one_wall, fetched, inst_calls) = one_install(&t.config, &ns, dir.path());
        // The master counts calls; the local store has none to ask.
        let calls = |c: (u64, u64)| match t.cluster {
            Some(_) => format!("{} store requests ({} batched items)", c.0, c.1),
            None => "store calls not counted".to_owned(),
        };
        println!(
            "\n{}: one publish of the tree: {:.2} s, uploaded {} bytes in {} packs, {}; one install: \
             {one_wall:.2} s, fetched {fetched}, {}",
            t.name,
            p.wall.as_secs_f64(),
            pv["results"][0]["bytes_uploaded"],
            pv["results"][0]["packs_uploaded"],
            calls(pub_calls),
            calls(inst_calls),
        );
        let replicas = env_list("JITSHIP_FLEET_REPLICAS", &[1]);
        let rows = bench_installs(t, &src, dir.path(), "herd");
        print_installs(t, &rows, 1);
        // Fan-out: the largest herd against the tree published with each replica count.
        let herd_n = rows.iter().map(|r| r.n).max().unwrap_or(0);
        if t.cluster.is_some() && herd_n > 0 && replicas.iter().any(|&r| r > 1) {
            println!(
                "\n{} fan-out: {herd_n} concurrent installs, {} store node(s)",
                t.name,
                t.nodes.len()
            );
            for &r in &replicas {
                let config = t.with_replicas(r, dir.path());
                let ns = unique_prefix(&format!("fleet-fanout-{r}"));
                run_measured(&mut cli(&config, &ns, "publish", Some(&src)), &[0]);
                let placed = segments(&master_metrics());
                let (s, wrong, node_cpu) =
                    install_herd(t, &config, &ns, herd_n, dir.path(), &digest(&src));
                println!(
                    "  pack_replicas = {r}: p50 {:.2} s, p95 {:.2} s, max {:.2} s, failures {}{}; node CPU s: {}; segments allocated (all runs so far): {}",
                    s.p50,
                    s.p95,
                    s.max,
                    failures(&s.failures),
                    if wrong > 0 { " WRONG TREE" } else { "" },
                    node_cpu
                        .iter()
                        .map(|m| format!("{m:.1}"))
                        .collect::<Vec<_>>()
                        .join(" / "),
                    placed
                        .iter()
                        .map(|(s, b)| format!("{s} {} MiB", b >> 20))
                        .collect::<Vec<_>>()
                        .join(", "),
                );
            }
        }
        let publishers = env_list("JITSHIP_FLEET_PUBLISHERS", &[8, 24, 100]);
        if !publishers.is_empty() {
            println!(
                "\n{}: concurrent publishers of unique files (4 x 16 KiB each) into one compat key",
                t.name
            );
            println!(
                "{:>4} | {:>7} {:>7} {:>7} | {:>12} | {:>15} | {:>10} | reasons",
                "N", "p50 s", "p95 s", "max s", "failures", "in newest gen", "store req"
            );
            for n in publishers {
                let r = bench_publishers(t, n, dir.path());
                println!(
                    "{:>4} | {:>7.2} {:>7.2} {:>7.2} | {:>12} | {:>9} of {:<3} | {:>10} | {}",
                    r.n,
                    r.s.p50,
                    r.s.p95,
                    r.s.max,
                    failures(&r.s.failures),
                    r.in_union,
                    r.n,
                    if t.cluster.is_some() {
                        r.calls.0.to_string()
                    } else {
                        "-".into()
                    },
                    r.reasons
                        .iter()
                        .map(|(w, k)| format!("{k}x \"{w}\""))
                        .collect::<Vec<_>>()
                        .join("; "),
                );
            }
        }
    }
    println!(
        "\nmax/(N x one): 1 = N installs take N times one (the work serialized on this machine's CPUs); \
         PR676/ours: the PR 676-style herd's max wall / jitship's (above 1 = jitship faster); \
         node CPU s: CPU seconds each store node used during the herd"
    );
}
