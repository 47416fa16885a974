//! The operator's contract of the real CLI (`jitship-e2e` processes): every exit code, the JSON
//! envelope (snapshots with the volatile fields normalized), `install --best-effort` with a dead
//! store and a dead Mooncake master (exit 0, report written), no escape codes off a terminal or
//! with NO_COLOR, narrow store commands, errors printed once.
//!
//! Snapshots live in `tests/golden/cli/` (`jitship_tests::snapshot`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use jitship::config::{Backend as BackendKind, Config, StoreConfig};
use jitship_tests::fixtures::triton_tree;
use jitship_tests::output::{code, json, show, text};
use serde_json::Value;

struct Env {
    tmp: tempfile::TempDir,
}

impl Env {
    fn new() -> Self {
        Self {
            tmp: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.tmp.path().join(p)
    }

    fn store(&self) -> String {
        format!("local:{}", self.path("store").display())
    }

    /// `jitship ARGS` with the local store and one `kernels` cache (native rules) under `root`.
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = jitship_tests::cli::jitship();
        c.args(args).env("RUST_LOG", "warn").env_remove("NO_COLOR");
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run jitship-e2e")
    }
}

fn cache_flags(env: &Env, root: &str, tag: &str) -> Vec<String> {
    vec![
        "--store".into(),
        env.store(),
        "--cache".into(),
        format!("kernels:native={}", env.path(root).display()),
        "--fact".into(),
        format!("test.tag={tag}"),
    ]
}

fn run_with(env: &Env, cmd: &str, flags: &[String], extra: &[&str]) -> Output {
    let mut args = vec![cmd];
    args.extend(flags.iter().map(String::as_str));
    args.extend(extra);
    env.run(&args)
}

/// Replaces what changes from run to run (times, ids, temp paths, host) so the rest can be
/// compared with a snapshot.
fn normalize(v: &mut Value, tmp: &Path) {
    const VOLATILE: [&str; 9] = [
        "compat_key",
        "duration_ms",
        "hash_ms",
        "upload_ms",
        "generation",
        "compat_id",
        "host",
        "started_at",
        "finished_at",
    ];
    match v {
        Value::Object(map) => {
            for (k, val) in map.iter_mut() {
                let base = k.trim_end_matches("_rfc3339");
                if VOLATILE.contains(&base) && !val.is_null() {
                    *val = Value::String(format!("<{base}>"));
                } else {
                    normalize(val, tmp);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| normalize(i, tmp)),
        Value::String(s) => {
            *s = hide_ids(&s.replace(&tmp.display().to_string(), "<tmp>"));
        }
        _ => {}
    }
}

/// Replaces each run of 64 hex digits (generation and pack ids in messages) with `<id>`.
fn hide_ids(s: &str) -> String {
    let mut out = String::new();
    let mut run = String::new();
    for c in s.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_hexdigit() {
            run.push(c);
            continue;
        }
        out.push_str(if run.len() == 64 { "<id>" } else { &run });
        run.clear();
        out.push(c);
    }
    out.pop();
    out
}

fn snapshot(name: &str, mut doc: Value, tmp: &Path) {
    normalize(&mut doc, tmp);
    // A changed shape fails here; a removed or retyped field must also bump `schema`.
    let got = serde_json::to_string_pretty(&doc).unwrap();
    jitship_tests::snapshot::assert_matches("cli", name, &got);
}

#[test]
fn install_exit_codes_and_json_envelope() {
    let env = Env::new();
    triton_tree(&env.path("src"), 3, 7);
    let src = cache_flags(&env, "src", "contract");
    let out = run_with(&env, "publish", &src, &["--json"]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let published = json(&out);
    assert_eq!(published["schema"], 1);
    assert_eq!(published["ok"], true);
    assert_eq!(published["results"][0]["outcome"], "published");
    snapshot("publish-published", published, env.tmp.path());

    // 0 installed, then 10 already-current, into a fresh root.
    let dst = cache_flags(&env, "dst", "contract");
    let out = run_with(&env, "install", &dst, &["--json"]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let installed = json(&out);
    assert_eq!(installed["results"][0]["outcome"], "installed");
    assert_eq!(installed["exit_code"], 0);
    snapshot("install-installed", installed, env.tmp.path());

    let out = run_with(&env, "install", &dst, &[]);
    assert_eq!(code(&out), 10, "{}", show(&out));
    let line = text(&out.stdout);
    assert!(line.starts_with("kernels: already-current"), "{line}");

    // A person's summary says "installed" once.
    let fresh = cache_flags(&env, "dst2", "contract");
    let out = run_with(&env, "install", &fresh, &[]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let line = text(&out.stdout);
    assert!(line.starts_with("kernels: installed 24 files"), "{line}");
    assert_eq!(line.matches("installed").count(), 1, "{line}");

    // 11 miss: nothing published under another key.
    let other = cache_flags(&env, "dst3", "other-key");
    let out = run_with(&env, "install", &other, &["--json"]);
    assert_eq!(code(&out), 11, "{}", show(&out));
    assert_eq!(json(&out)["results"][0]["outcome"], "miss");
    assert_eq!(json(&out)["exit_code"], 11);

    // 12 failed: the store cannot be opened; with --best-effort 0, and the report is written.
    let dead = vec![
        "--store".to_owned(),
        "local:/etc/passwd/x".to_owned(),
        "--cache".to_owned(),
        format!("kernels:native={}", env.path("dst4").display()),
    ];
    let out = run_with(&env, "install", &dead, &[]);
    assert_eq!(code(&out), 12, "{}", show(&out));
    let report = env.path("report.json");
    let out = run_with(
        &env,
        "install",
        &dead,
        &["--best-effort", "--report", report.to_str().unwrap()],
    );
    assert_eq!(code(&out), 0, "{}", show(&out));
    let doc: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(doc["schema"], 1);
    assert_eq!(doc["command"], "install");
    assert_eq!(doc["ok"], false);
    assert_eq!(doc["exit_code"], 12, "the report tells the truth: {doc}");
    assert_eq!(doc["results"][0]["outcome"], "failed");
    assert_eq!(doc["errors"][0]["stage"], "store");
    assert_eq!(doc["errors"][0]["cache_kind"], "kernels");
    let message = doc["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("local store at /etc/passwd/x"),
        "{message}"
    );
    assert_eq!(message.matches("Not a directory").count(), 1, "{message}");
    snapshot("install-dead-store", doc, env.tmp.path());

    // 1: configuration error; with --best-effort still 0 and a report.
    let bad = ["install", "--config", "/nonexistent/jitship.toml"];
    assert_eq!(code(&env.run(&bad)), 1);
    let out = env.run(&[
        "install",
        "--config",
        "/nonexistent/jitship.toml",
        "--best-effort",
        "--report",
        report.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let doc: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(doc["errors"][0]["stage"], "config");
    assert_eq!(doc["exit_code"], 1);

    // 2: usage.
    assert_eq!(code(&env.run(&["install", "--no-such-flag"])), 2);
}

#[test]
fn publish_json_lists_failed_caches_and_errors() {
    let env = Env::new();
    triton_tree(&env.path("root"), 2, 3);
    // The built-in triton policy refuses without its facts; the kernels cache publishes.
    let out = env.run(&[
        "publish",
        "--store",
        &env.store(),
        "--cache",
        &format!("triton={}", env.path("root").display()),
        "--cache",
        &format!("kernels:native={}", env.path("root").display()),
        "--json",
    ]);
    assert_eq!(code(&out), 1, "{}", show(&out));
    let doc = json(&out);
    let results = doc["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{doc}");
    let triton = results
        .iter()
        .find(|r| r["cache_kind"] == "triton")
        .unwrap();
    assert_eq!(triton["outcome"], "failed");
    assert!(
        triton["error"].as_str().unwrap().contains("missing"),
        "{doc}"
    );
    let kernels = results
        .iter()
        .find(|r| r["cache_kind"] == "kernels")
        .unwrap();
    assert_eq!(kernels["outcome"], "published");
    assert_eq!(doc["errors"].as_array().unwrap().len(), 1);
    assert_eq!(doc["errors"][0]["stage"], "policy");
    assert_eq!(doc["ok"], false);
    snapshot("publish-one-failed", doc, env.tmp.path());

    // A dead store: every cache failed, still one document.
    let out = env.run(&[
        "publish",
        "--store",
        "local:/etc/passwd/x",
        "--cache",
        &format!("kernels:native={}", env.path("root").display()),
        "--json",
    ]);
    assert_eq!(code(&out), 1, "{}", show(&out));
    let doc = json(&out);
    assert_eq!(doc["results"][0]["outcome"], "failed");
    assert_eq!(doc["errors"][0]["stage"], "store");
}

#[test]
fn verify_finds_a_corrupt_pack_with_exit_3() {
    let env = Env::new();
    triton_tree(&env.path("root"), 2, 5);
    let flags = cache_flags(&env, "root", "verify");
    assert_eq!(code(&run_with(&env, "publish", &flags, &[])), 0);
    let store = ["--store".to_owned(), env.store()];
    let out = run_with(&env, "verify", &store, &["--json"]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert_eq!(json(&out)["results"][0]["ok"], true);
    // Flip bytes in every stored pack.
    let mut corrupted = 0;
    for entry in jitship_tests::fixtures::files_under(&env.path("store")) {
        if entry.to_string_lossy().contains("pack") {
            let mut bytes = std::fs::read(&entry).unwrap();
            if let Some(b) = bytes.get_mut(10) {
                *b ^= 0xff;
                std::fs::write(&entry, bytes).unwrap();
                corrupted += 1;
            }
        }
    }
    assert!(corrupted > 0, "no pack found under the store");
    let out = run_with(&env, "verify", &store, &["--json"]);
    assert_eq!(code(&out), 3, "{}", show(&out));
    assert_eq!(json(&out)["exit_code"], 3);
}

#[test]
fn store_commands_are_narrow_and_errors_print_once() {
    let env = Env::new();
    for cmd in ["ls", "verify"] {
        let out = env.run(&[cmd, "--cache", "kernels=/tmp/x"]);
        assert_eq!(code(&out), 2, "{cmd}: {}", show(&out));
    }
    // gc takes --cache for the policy modules it may need, checked like any cache.
    let out = env.run(&["gc", "--cache", "kernels=/tmp/x"]);
    assert_eq!(code(&out), 1, "gc: {}", show(&out));
    assert!(text(&out.stderr).contains("kernels"), "{}", show(&out));
    let out = env.run(&["unpin", "0123456789ab", "--reason", "x"]);
    assert_eq!(code(&out), 2, "{}", show(&out));

    let out = env.run(&["ls", "--store", "local:/etc/passwd/x"]);
    assert_eq!(code(&out), 1);
    let err = text(&out.stderr);
    assert_eq!(err.matches("Not a directory").count(), 1, "{err}");
    assert!(err.contains("local store at /etc/passwd/x"), "{err}");
    assert!(!err.contains("Local"), "Debug form: {err}");
    // --json: the failure is an envelope on stdout too.
    let out = env.run(&["ls", "--store", "local:/etc/passwd/x", "--json"]);
    assert_eq!(code(&out), 1);
    let doc = json(&out);
    assert_eq!(doc["command"], "ls");
    assert_eq!(doc["ok"], false);
    assert_eq!(doc["errors"].as_array().unwrap().len(), 1);

    // Help lists the exit codes; completions exist.
    let help = text(&env.run(&["install", "--help"]).stdout);
    assert!(help.contains("10  already-current"), "{help}");
    assert!(
        help.contains("Caches and facts:") && help.contains("Store:"),
        "{help}"
    );
    let out = env.run(&["completions", "bash"]);
    assert_eq!(code(&out), 0);
    assert!(text(&out.stdout).contains("jitship"));
}

#[test]
fn no_escape_codes_off_a_terminal_or_with_no_color() {
    let env = Env::new();
    triton_tree(&env.path("root"), 1, 1);
    let mut flags = cache_flags(&env, "root", "color");
    flags.push("-v".into());
    let run = |extra_env: Option<(&str, &str)>, color: &str| {
        let mut args = vec!["publish"];
        args.extend(flags.iter().map(String::as_str));
        args.extend(["--color", color]);
        let mut c = env.cmd(&args);
        c.env("RUST_LOG", "debug");
        if let Some((k, v)) = extra_env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    for (extra, color) in [(None, "auto"), (Some(("NO_COLOR", "1")), "auto")] {
        let out = run(extra, color);
        assert_eq!(code(&out), 0, "{}", show(&out));
        assert!(!out.stderr.is_empty(), "debug logs expected");
        assert!(
            !out.stderr.contains(&0x1b) && !out.stdout.contains(&0x1b),
            "escape codes with {extra:?}: {}",
            show(&out)
        );
    }
    // The check can fail: forced colour has them.
    let out = run(None, "always");
    assert!(out.stderr.contains(&0x1b), "{}", show(&out));

    // JSON logs: fields as fields.
    let mut args = vec!["publish", "--log-format", "json"];
    args.extend(flags.iter().map(String::as_str));
    let out = env.cmd(&args).env("RUST_LOG", "debug").output().unwrap();
    let first = text(&out.stderr);
    let line = first.lines().next().expect("a log line");
    let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert!(v["message"].is_string() && v["level"].is_string(), "{line}");
}

#[test]
#[ignore = "needs the Mooncake test cluster: tests/cluster/cluster.sh run -- cargo test -p jitship-tests --test e2e -- --ignored mooncake"]
fn best_effort_with_a_dead_mooncake_master() {
    // Needs libmooncake_store.so (from `tests/cluster/cluster.sh install`, named by `cluster.sh
    // run`); the master is a port nobody listens on.
    let cluster = jitship_tests::mooncake::cluster("best_effort_with_a_dead_mooncake_master");
    let env = Env::new();
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = dead.local_addr().unwrap().port();
    drop(dead);
    let mut mooncake = cluster.config();
    mooncake.master = format!("127.0.0.1:{port}");
    let config = Config {
        store: StoreConfig {
            backend: BackendKind::Mooncake,
            mooncake,
            ..StoreConfig::default()
        },
        ..Config::default()
    };
    let path = env.path("jitship.toml");
    std::fs::write(&path, toml::to_string(&config).unwrap()).unwrap();
    let report = env.path("report.json");
    let started = std::time::Instant::now();
    let out = env.run(&[
        "install",
        "--config",
        path.to_str().unwrap(),
        "--cache",
        &format!("kernels:native={}", env.path("root").display()),
        "--best-effort",
        "--report",
        report.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let doc: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(doc["results"][0]["outcome"], "failed", "{doc}");
    assert_eq!(doc["errors"][0]["stage"], "store", "{doc}");
    assert_eq!(doc["exit_code"], 12);
    eprintln!(
        "dead master: install --best-effort returned in {:?}: {}",
        started.elapsed(),
        doc["errors"][0]["message"]
    );
}

/// SIGTERM (or SIGINT) to an install waiting for another install's lock: it stops at once with
/// 128 + the signal, says which signal stopped it in its JSON report, and leaves the root as it
/// was: not created, no staging beside it. Once the lock is free the same install goes through.
#[test]
fn a_signal_stops_an_install_with_its_code_and_the_root_as_it_was() {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let env = Env::new();
    triton_tree(&env.path("src"), 20, 3);
    let flags = |root: &str| cache_flags(&env, root, "signals");
    let published = run_with(&env, "publish", &flags("src"), &[]);
    assert_eq!(code(&published), 0, "{}", show(&published));
    // Another install holds the root's lock (the file install takes beside the root).
    let lock = std::fs::File::create(env.path(".dst.jitship.lock")).unwrap();
    lock.lock().unwrap();
    for (signal, expected) in [(libc::SIGTERM, 143), (libc::SIGINT, 130)] {
        let log = env.path("install.log");
        let mut args = vec!["install", "--json"];
        let flags = flags("dst");
        args.extend(flags.iter().map(String::as_str));
        let child = env
            .cmd(&args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let waiting = Instant::now() + Duration::from_secs(60);
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("holds this root's lock")
        {
            assert!(
                Instant::now() < waiting,
                "the install never said it waits for the lock:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: kill(2) on our own child, which is still running (it waits for the lock).
        unsafe { libc::kill(child.id() as i32, signal) };
        let out = child.wait_with_output().unwrap();
        let stderr = std::fs::read_to_string(&log).unwrap();
        assert_eq!(
            out.status.code(),
            Some(expected),
            "signal {signal}: {:?}\n{stderr}",
            out.status
        );
        let doc = json(&out);
        let cache = &doc["results"][0];
        assert_eq!(cache["outcome"], "failed", "{doc}");
        let name = if signal == libc::SIGTERM {
            "SIGTERM"
        } else {
            "SIGINT"
        };
        let detail = cache["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains(name) && detail.contains("left as it was"),
            "{detail}"
        );
        assert_eq!(doc["exit_code"], expected, "{doc}");
        assert!(!env.path("dst").exists(), "the root was created");
        let staging: Vec<_> = std::fs::read_dir(env.tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("staging"))
            .collect();
        assert!(staging.is_empty(), "staging left behind: {staging:?}");
    }
    drop(lock);
    let installed = run_with(&env, "install", &flags("dst"), &[]);
    assert_eq!(code(&installed), 0, "{}", show(&installed));
}

/// The facts both the inductor and the vllm-compile policy key on, given so that both produce a
/// key on any machine, and a CPU key for inductor (no GPU, whatever this machine has).
fn inductor_facts() -> Vec<String> {
    [
        "pkg.torch=2.8.0+cpu",
        "pkg.triton=3.4.0",
        "pkg.vllm=0.10.2",
        "python.version=3.12.3",
        "python.site_packages=/venv/lib/python3.12/site-packages",
        "python.include=/usr/include/python3.12",
        "os.arch=x86_64",
        "cpu.isa=avx2",
        "cpu.flags_digest=f0",
        "cpu.threads=8",
        "cxx.identity=c0",
        "inductor.env_digest=e0",
        "gpu.name=",
        "gpu.count=0",
    ]
    .into_iter()
    .flat_map(|f| ["--fact".to_string(), f.to_string()])
    .collect()
}

/// Each cache's entry of a publish or install envelope, by kind.
fn by_kind(doc: &Value) -> std::collections::BTreeMap<String, Value> {
    doc["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results: {doc}"))
        .iter()
        .map(|r| (r["cache_kind"].as_str().unwrap().to_string(), r.clone()))
        .collect()
}

/// `--fact KIND:NAME=VALUE` in one publish of two caches changes only that cache's facts: the
/// other cache's compat id is the one it gets with no such override (the operator's case: a
/// `gpu.name` placeholder meant for vllm-compile turned the inductor key into a GPU key).
#[test]
fn a_per_cache_fact_applies_to_its_own_cache_only() {
    let env = Env::new();
    for root in ["vllm", "inductor"] {
        std::fs::create_dir_all(env.path(root)).unwrap();
    }
    let mut flags = vec![
        "--store".to_string(),
        env.store(),
        "--cache".into(),
        format!("vllm-compile={}", env.path("vllm").display()),
        "--cache".into(),
        format!("inductor={}", env.path("inductor").display()),
        "--json".into(),
    ];
    flags.extend(inductor_facts());
    let plain = run_with(&env, "publish", &flags, &[]);
    let plain_doc = json(&plain);
    let plain_results = by_kind(&plain_doc);
    let inductor_id = plain_results["inductor"]["compat_id"].clone();
    assert!(inductor_id.is_string(), "{}", show(&plain));
    assert!(
        plain_results
            .values()
            .all(|r| r.get("fact_overrides").is_none()),
        "{}",
        show(&plain)
    );

    // The placeholder GPU for vllm-compile (with the GPU facts a GPU key needs: gpu.arch and
    // driver.major are derived from its own gpu.cc and driver.version).
    let own = [
        "vllm-compile:gpu.name=NVIDIA H100 80GB HBM3",
        "vllm-compile:gpu.cc=9.0",
        "vllm-compile:driver.version=550.54.15",
        "vllm-compile:cuda.runtime=12.8",
    ];
    let mut with_own = flags.clone();
    with_own.extend(
        own.iter()
            .flat_map(|f| ["--fact".to_string(), f.to_string()]),
    );
    let out = run_with(&env, "publish", &with_own, &[]);
    let results = by_kind(&json(&out));
    assert_eq!(
        results["inductor"]["compat_id"],
        inductor_id,
        "the inductor key moved with vllm-compile's override: {}",
        show(&out)
    );
    assert!(
        results["inductor"].get("fact_overrides").is_none(),
        "{}",
        show(&out)
    );
    let vllm = &results["vllm-compile"]["fact_overrides"];
    assert_eq!(
        vllm["gpu.name"]["value"],
        "NVIDIA H100 80GB HBM3",
        "{}",
        show(&out)
    );
    assert_eq!(
        vllm["gpu.name"]["origin"],
        "--fact vllm-compile:NAME / JITSHIP_FACTS",
        "{}",
        show(&out)
    );
    assert_eq!(
        vllm.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["cuda.runtime", "driver.version", "gpu.cc", "gpu.name"],
        "{}",
        show(&out)
    );

    // The same form in JITSHIP_FACTS (read when no --fact is given).
    let list = inductor_facts()
        .iter()
        .filter(|f| *f != "--fact")
        .map(String::as_str)
        .chain(own)
        .collect::<Vec<_>>()
        .join(";");
    let no_facts: Vec<String> = flags.iter().take(7).cloned().collect();
    let out = env
        .cmd(&["publish"])
        .args(&no_facts)
        .env("JITSHIP_FACTS", &list)
        .output()
        .unwrap();
    let results = by_kind(&json(&out));
    assert_eq!(
        results["inductor"]["compat_id"],
        inductor_id,
        "{}",
        show(&out)
    );
    assert_eq!(
        results["vllm-compile"]["fact_overrides"]["gpu.cc"]["value"],
        "9.0",
        "{}",
        show(&out)
    );

    // `jitship facts` shows vllm-compile's own set apart from the command-wide one.
    let mut facts_flags = vec![
        "--cache".to_string(),
        format!("vllm-compile={}", env.path("vllm").display()),
        "--cache".into(),
        format!("inductor={}", env.path("inductor").display()),
        "--json".into(),
    ];
    facts_flags.extend(inductor_facts());
    facts_flags.extend(
        own.iter()
            .flat_map(|f| ["--fact".to_string(), f.to_string()]),
    );
    let out = run_with(&env, "facts", &facts_flags, &[]);
    let doc = json(&out);
    assert!(doc["facts"].get("gpu.name").is_none(), "{}", show(&out));
    let vllm = &doc["caches"]["vllm-compile"];
    assert_eq!(
        vllm["facts"]["gpu.name"],
        "NVIDIA H100 80GB HBM3",
        "{}",
        show(&out)
    );
    assert_eq!(vllm["facts"]["gpu.arch"], "sm_90", "{}", show(&out));
    assert_eq!(vllm["facts"]["driver.major"], "550", "{}", show(&out));
    assert!(doc["caches"].get("inductor").is_none(), "{}", show(&out));
    facts_flags.retain(|f| f != "--json");
    let out = run_with(&env, "facts", &facts_flags, &[]);
    let table = text(&out.stdout);
    assert!(
        table.contains("facts of the vllm-compile cache only"),
        "{}",
        show(&out)
    );

    // A KIND: naming no cache of the command is a configuration error naming the caches.
    let mut bad = flags.clone();
    bad.extend(["--fact".into(), "triton:gpu.name=x".into()]);
    let out = run_with(&env, "publish", &bad, &[]);
    assert_eq!(code(&out), 1, "{}", show(&out));
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        all.contains("\"triton\" is not a cache of this command")
            && all.contains("vllm-compile, inductor"),
        "{}",
        show(&out)
    );
}

/// `--durable-store`: publish writes both tiers; when the fast store has lost everything (an
/// evicted or restarted Mooncake, here a local store emptied), install is served by the durable
/// tier byte for byte, says so in its report, and puts what it read back, so the next install is
/// the fast tier's alone.
#[test]
fn a_durable_tier_serves_what_the_store_lost_and_repairs_it() {
    let env = Env::new();
    triton_tree(&env.path("src"), 3, 9);
    let durable = format!("local:{}", env.path("durable").display());
    let with_durable = |root: &str| {
        let mut flags = cache_flags(&env, root, "durable");
        flags.extend(["--durable-store".to_owned(), durable.clone()]);
        flags
    };
    let out = run_with(&env, "publish", &with_durable("src"), &["--json"]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert_eq!(json(&out)["results"][0]["outcome"], "published");

    // The fast store loses everything.
    std::fs::remove_dir_all(env.path("store")).unwrap();
    let plain = run_with(
        &env,
        "install",
        &cache_flags(&env, "plain", "durable"),
        &["--json"],
    );
    assert_eq!(
        code(&plain),
        11,
        "without the durable tier: a miss: {}",
        show(&plain)
    );

    let out = run_with(&env, "install", &with_durable("dst1"), &["--json"]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let r = &json(&out)["results"][0];
    assert_eq!(r["outcome"], "installed", "{r}");
    let tiers = &r["tiers"];
    let hits = tiers["durable_hits"].as_u64().unwrap();
    assert!(hits > 0 && tiers["fast_hits"] == 0, "{tiers}");
    assert_eq!(tiers["repaired"].as_u64(), Some(hits), "{tiers}");
    assert_eq!(
        jitship_tests::fixtures::digest(&env.path("dst1")),
        jitship_tests::fixtures::digest(&env.path("src"))
    );

    // Repaired: the next pod's install is the fast tier's alone, with or without the durable one.
    let out = run_with(&env, "install", &with_durable("dst2"), &["--json"]);
    let tiers = &json(&out)["results"][0]["tiers"];
    assert_eq!(tiers["durable_hits"], 0, "{tiers}");
    assert!(tiers["fast_hits"].as_u64().unwrap() > 0, "{tiers}");
    let out = run_with(&env, "install", &cache_flags(&env, "dst3", "durable"), &[]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    // The person's summary says where it came from.
    let out = run_with(&env, "install", &with_durable("dst4"), &[]);
    assert!(
        text(&out.stdout).contains("0 (0 B) from the durable tier"),
        "{}",
        show(&out)
    );
}

/// `export` then `import` into an empty store at another path, and `install` from it: the same
/// bytes, the publisher's signature kept (a host that requires it installs); the layout is an OCI
/// image layout (checked field by field against the image spec, as no OCI tool is installed
/// here); an altered blob or a store that already has the key writes nothing.
#[test]
fn export_then_import_into_an_empty_store_installs_the_same_signed_bytes() {
    let env = Env::new();
    let key = env.path("publisher.key");
    let out = env.run(&["key", "generate", "--out", key.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let public = text(&out.stdout).trim().to_owned();
    for (root, tag, seed) in [("src-a", "bake-a", 3), ("src-b", "bake-b", 4)] {
        triton_tree(&env.path(root), 2, seed);
        let mut flags = cache_flags(&env, root, tag);
        flags.extend(["--signing-key".to_owned(), key.display().to_string()]);
        let out = run_with(&env, "publish", &flags, &["--json"]);
        assert_eq!(code(&out), 0, "{}", show(&out));
    }
    // A second generation of a, so the exported head is not seq 1.
    triton_tree(&env.path("src-a/more"), 1, 5);
    let mut flags = cache_flags(&env, "src-a", "bake-a");
    flags.extend(["--signing-key".to_owned(), key.display().to_string()]);
    assert_eq!(code(&run_with(&env, "publish", &flags, &[])), 0);

    let layout = env.path("layout");
    let out = env.run(&[
        "export",
        "--store",
        &env.store(),
        "--out",
        layout.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let exported = &json(&out)["results"][0]["generations"];
    assert_eq!(exported.as_array().unwrap().len(), 2, "{exported}");

    // The OCI image layout, as the image spec defines it.
    let read = |p: &Path| -> Value { serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap() };
    assert_eq!(
        read(&layout.join("oci-layout"))["imageLayoutVersion"],
        "1.0.0"
    );
    let index = read(&layout.join("index.json"));
    assert_eq!(index["schemaVersion"], 2);
    assert_eq!(
        index["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    let blob = |digest: &str| -> Vec<u8> {
        let hex = digest.strip_prefix("sha256:").unwrap();
        let bytes = std::fs::read(layout.join("blobs/sha256").join(hex)).unwrap();
        use sha2::Digest;
        assert_eq!(format!("{:x}", sha2::Sha256::digest(&bytes)), hex);
        bytes
    };
    for d in index["manifests"].as_array().unwrap() {
        assert_eq!(d["mediaType"], "application/vnd.oci.image.manifest.v1+json");
        assert_eq!(d["artifactType"], "application/vnd.jitship.generation.v1");
        let tag = d["annotations"]["org.opencontainers.image.ref.name"]
            .as_str()
            .unwrap();
        assert_eq!(tag.len(), 64, "the compat id names it: {d}");
        let m: Value = serde_json::from_slice(&blob(d["digest"].as_str().unwrap())).unwrap();
        assert_eq!(m["schemaVersion"], 2);
        assert_eq!(
            m["config"]["mediaType"],
            "application/vnd.jitship.generation.manifest.v1+json"
        );
        blob(m["config"]["digest"].as_str().unwrap());
        let layers = m["layers"].as_array().unwrap();
        for l in layers {
            assert_eq!(
                blob(l["digest"].as_str().unwrap()).len() as u64,
                l["size"].as_u64().unwrap()
            );
        }
        assert_eq!(
            layers.last().unwrap()["mediaType"],
            "application/vnd.jitship.head.v1+json"
        );
        assert!(
            m["annotations"]["dev.jitship.signer"]
                .as_str()
                .unwrap()
                .starts_with("signed"),
            "{m}"
        );
        assert!(
            m["annotations"]["dev.jitship.compat-key"]
                .as_str()
                .unwrap()
                .contains("bake-")
        );
    }

    // An altered blob: refused, nothing written to the store.
    let altered = env.path("altered");
    copy_dir(&layout, &altered);
    let victim = std::fs::read_dir(altered.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&victim, bytes).unwrap();
    let other = format!("local:{}", env.path("other-store").display());
    let out = env.run(&[
        "import",
        "--store",
        &other,
        "--from",
        altered.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 1, "{}", show(&out));
    assert!(
        text(&out.stderr).contains("does not hash to its digest"),
        "{}",
        show(&out)
    );
    let ls = env.run(&["ls", "--store", &other, "--json"]);
    let listed = json(&ls);
    assert_eq!(
        listed["results"][0]["compats"],
        serde_json::json!([]),
        "nothing of a refused layout is written: {listed}"
    );

    // Into an empty store: imported, and installed from there, the signature required.
    let out = env.run(&[
        "import",
        "--store",
        &other,
        "--from",
        layout.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let imported = &json(&out)["results"][0]["generations"];
    for g in imported.as_array().unwrap() {
        assert_eq!(g["outcome"], "imported", "{g}");
    }
    assert!(
        imported.as_array().unwrap().iter().any(|g| g["seq"] == 2),
        "{imported}"
    );
    for (root, src, tag) in [("dst-a", "src-a", "bake-a"), ("dst-b", "src-b", "bake-b")] {
        let out = env.run(&[
            "install",
            "--store",
            &other,
            "--cache",
            &format!("kernels:native={}", env.path(root).display()),
            "--fact",
            &format!("test.tag={tag}"),
            "--trusted-key",
            &public,
            "--trust-mode",
            "required",
        ]);
        assert_eq!(code(&out), 0, "{}", show(&out));
        assert_eq!(
            jitship_tests::fixtures::digest(&env.path(root)),
            jitship_tests::fixtures::digest(&env.path(src)),
            "{root}"
        );
    }
    // Again: already there. Into the first store (it has those keys): left out, said so.
    let out = env.run(&[
        "import",
        "--store",
        &other,
        "--from",
        layout.to_str().unwrap(),
        "--json",
    ]);
    for g in json(&out)["results"][0]["generations"].as_array().unwrap() {
        assert_eq!(g["outcome"], "already-present", "{g}");
    }
    let out = env.run(&[
        "import",
        "--store",
        &env.store(),
        "--from",
        layout.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert!(
        text(&out.stdout).contains("already-present"),
        "{}",
        show(&out)
    );
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in jitship_tests::fixtures::files_under(from) {
        let rel = entry.strip_prefix(from).unwrap();
        let dest = to.join(rel);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(&entry, dest).unwrap();
    }
}
