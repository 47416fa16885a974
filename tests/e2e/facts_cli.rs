//! `jitship facts` end to end: the binary, a config with [facts] and [gather], a fake
//! nvidia-smi and python on the child's PATH, overrides from JITSHIP_FACTS and --fact.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use jitship_tests::cli::bare as jitship;
use jitship_tests::fixtures::fake_venv;

fn script(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn facts_command_prints_gathered_and_overridden_facts() {
    let dir = tempfile::tempdir().unwrap();
    let (bin, site) = (dir.path().join("bin"), dir.path().join("site"));
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(site.join("triton-3.4.0.dist-info")).unwrap();
    std::fs::write(
        site.join("triton-3.4.0.dist-info/METADATA"),
        "Name: triton\nVersion: 3.4.0\n",
    )
    .unwrap();
    script(
        &bin.join("nvidia-smi"),
        "echo 'NVIDIA H200, 9.0, 570.86.15'",
    );
    let config = dir.path().join("jitship.toml");
    std::fs::write(
        &config,
        format!(
            "[facts]\n\"model.id\" = \"from-config\"\n\"model.revision\" = \"main\"\n\n[gather]\nsite_packages = [{:?}]\nnvml_library = {:?}\ndriver_version_file = {:?}\n",
            site.display().to_string(),
            dir.path().join("no-nvml.so").display().to_string(),
            dir.path().join("no-driver-file").display().to_string(),
        ),
    )
    .unwrap();
    let run = |args: &[&str], facts_env: Option<&str>| {
        let mut cmd = jitship_tests::cli::jitship();
        cmd.arg("facts").args(args).env_clear().env("PATH", &bin);
        if let Some(v) = facts_env {
            cmd.env("JITSHIP_FACTS", v);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };

    let json = run(
        &["--config", config.to_str().unwrap(), "--json"],
        Some("model.id=from-env;gpu.cc=10.0"),
    );
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["facts"]["gpu.name"], "NVIDIA H200");
    assert_eq!(v["sources"]["gpu.name"]["source"], "nvidia-smi");
    assert_eq!(v["facts"]["driver.major"], "570");
    assert_eq!(v["facts"]["pkg.triton"], "3.4.0");
    assert_eq!(v["facts"]["model.revision"], "main");
    assert_eq!(v["sources"]["model.revision"]["detail"], "config [facts]");
    // The environment beats the config file, and derived facts follow the override.
    assert_eq!(v["facts"]["model.id"], "from-env");
    assert_eq!(v["facts"]["gpu.cc"], "10.0");
    assert_eq!(v["facts"]["gpu.arch"], "sm_100");
    assert!(
        v["missing"]["python.version"]
            .as_str()
            .unwrap()
            .contains("no python3 is on PATH")
    );

    // A flag beats both; the human table lists missing facts with their reasons.
    let table = run(
        &[
            "--config",
            config.to_str().unwrap(),
            "--fact",
            "model.id=from-flag",
        ],
        Some("model.id=from-env"),
    );
    let model = table.lines().find(|l| l.starts_with("model.id ")).unwrap();
    assert!(
        model.contains("from-flag") && model.contains("override"),
        "{table}"
    );
    assert!(table.contains("\nmissing ("), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("pkg.torch ") && l.contains("not installed")),
        "{table}"
    );
}

/// `JITSHIP_PYTHON` is one interpreter for every command: `facts` and `publish` gather the same
/// python.* and pkg.* facts from a venv it names, and without it publish gathers none (no python3
/// on PATH).
#[test]
fn jitship_python_gives_publish_and_facts_the_same_python_facts() {
    let dir = tempfile::tempdir().unwrap();
    let python = fake_venv(&dir.path().join("venv"), &[("torch", "2.15.0")]);
    let python = python.to_str().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("k.bin"), b"kernel").unwrap();
    let cache = format!("kernels:native={}", root.display());

    let (code, out, err) = jitship(&["facts", "--json"], &[("JITSHIP_PYTHON", python)]);
    assert_eq!(code, 0, "{err}");
    let facts: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(facts["facts"]["python.executable"], python, "{out}");
    assert_eq!(facts["facts"]["pkg.torch"], "2.15.0", "{out}");

    let published = |store: &Path, env: &[(&str, &str)]| {
        let store = format!("local:{}", store.display());
        let args = ["publish", "--store", &store, "--cache", &cache, "--json"];
        let (code, out, err) = jitship(&args, env);
        assert_eq!(code, 0, "{err}");
        let report: serde_json::Value = serde_json::from_str(&out).unwrap();
        let generation = report["results"][0]["generation"]
            .as_str()
            .unwrap()
            .to_string();
        let (code, out, err) = jitship(&["inspect", "--store", &store, "--json", &generation], &[]);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["results"][0]["facts"].clone()
    };
    let with = published(&dir.path().join("s1"), &[("JITSHIP_PYTHON", python)]);
    for name in [
        "python.executable",
        "python.version",
        "python.site_packages",
        "pkg.torch",
    ] {
        assert!(
            with[name].is_string(),
            "publish did not gather {name}: {with}"
        );
        assert_eq!(
            with[name], facts["facts"][name],
            "{name} differs between facts and publish"
        );
    }
    let without = published(&dir.path().join("s2"), &[]);
    assert!(without["python.executable"].is_null(), "{without}");
    assert!(without["pkg.torch"].is_null(), "{without}");
}

/// A worker image that sets `VIRTUAL_ENV` without putting the venv on PATH (and has no python3
/// on PATH): `install --engine vllm` asks the venv's interpreter (a miss on an empty store, not a
/// failure); without `VIRTUAL_ENV` the failure names where the interpreter is looked for, not a
/// `--fact`.
#[test]
fn the_worker_python_is_found_through_virtual_env_alone() {
    let dir = tempfile::tempdir().unwrap();
    let venv = dir.path().join("venv");
    fake_venv(&venv, &[("torch", "2.13.0"), ("vllm", "0.32.0")]);
    // PATH holds the compiler the CPU facts ask, and no python3.
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let gxx = ["/usr/bin/g++", "/usr/local/bin/g++"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("g++ on this machine");
    std::os::unix::fs::symlink(gxx, bin.join("g++")).unwrap();
    let path = bin.display().to_string();
    let store = format!("local:{}", dir.path().join("store").display());
    let cache_root = dir.path().join("vllm").display().to_string();
    let tmp = dir.path().join("tmp").display().to_string();
    let install = ["install", "--store", &store, "--engine", "vllm", "--json"];
    let base = [
        ("VLLM_CACHE_ROOT", cache_root.as_str()),
        ("TMPDIR", tmp.as_str()),
        ("USER", "worker"),
        ("HOME", "/nonexistent"),
        ("PATH", path.as_str()),
    ];

    let venv_env = venv.display().to_string();
    let with: Vec<(&str, &str)> = base
        .iter()
        .copied()
        .chain([("VIRTUAL_ENV", venv_env.as_str())])
        .collect();
    let (code, out, err) = jitship(&["facts", "--json"], &with);
    assert_eq!(code, 0, "{err}");
    let facts: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(facts["facts"]["pkg.torch"], "2.13.0", "{out}");
    assert_eq!(
        facts["facts"]["python.executable"],
        venv.join("bin/python3").display().to_string(),
        "{out}"
    );
    let (code, out, err) = jitship(&install, &with);
    assert_eq!(code, 11, "a miss on an empty store: {out}{err}");

    let (code, out, err) = jitship(&install, &base);
    assert_eq!(code, 12, "{out}{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    for r in report["results"].as_array().unwrap() {
        let detail = r["detail"].as_str().unwrap();
        for option in ["--python", "JITSHIP_PYTHON", "VIRTUAL_ENV", "PATH"] {
            assert!(detail.contains(option), "{option} not named: {detail}");
        }
        assert!(!detail.contains("--fact"), "{detail}");
    }
}

/// `jitship facts` shows each cache's root as publish resolves it, and where it came from; an
/// unknown kind is refused with the built-in kinds and the nearest name.
#[test]
fn facts_shows_resolved_roots_and_unknown_kinds_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("jitship.toml");
    std::fs::write(&config, "[policy]\ncompile_cache = false\n").unwrap();
    let config = config.to_str().unwrap();
    let env = [
        ("TMPDIR", "/scratch"),
        ("USER", "alice"),
        ("HOME", "/home/alice"),
        ("TRITON_HOME", "/opt/th"),
    ];
    let args = [
        "facts", "--json", "--config", config, "--cache", "inductor", "--cache", "triton",
    ];
    let (code, out, err) = jitship(&args, &env);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let roots = v["roots"].as_array().unwrap();
    let row = |kind: &str| roots.iter().find(|r| r["kind"] == kind).unwrap().clone();
    assert_eq!(
        row("inductor")["root"],
        "/scratch/torchinductor_alice",
        "{out}"
    );
    assert_eq!(row("inductor")["origin"]["from"], "default", "{out}");
    assert_eq!(row("triton")["root"], "/opt/th/.triton/cache", "{out}");
    assert_eq!(
        row("triton")["origin"]["entry"],
        "TRITON_HOME/.triton/cache",
        "{out}"
    );
    let args = ["facts", "--config", config, "--cache", "inductor"];
    let (code, out, err) = jitship(&args, &[("TORCHINDUCTOR_CACHE_DIR", "/c/ind")]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("inductor  /c/ind  $TORCHINDUCTOR_CACHE_DIR")),
        "{out}"
    );

    let (code, _, err) = jitship(
        &[
            "publish",
            "--store",
            "local:/nonexistent",
            "--cache",
            "vllm=/x",
        ],
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("did you mean \"vllm-compile\"") && err.contains("flashinfer-jit"),
        "{err}"
    );
    assert!(err.contains("vllm:native=ROOT"), "{err}");
}

/// One `--fact` is one fact: its value is everything after the first `=`, so a `;` in it cannot
/// smuggle in a second fact (issue 24). `JITSHIP_FACTS`, a `;`-separated list, stays a list, and
/// is ignored as a whole once a flag is given.
#[test]
fn a_fact_flag_is_one_fact_whatever_its_value_holds() {
    let facts = |args: &[&str], env: &[(&str, &str)]| {
        let mut argv = vec!["facts", "--json"];
        argv.extend(args);
        let (code, stdout, stderr) = jitship(&argv, env);
        assert_eq!(code, 0, "{stderr}");
        serde_json::from_str::<serde_json::Value>(&stdout).unwrap()
    };
    let v = facts(
        &[
            "--fact",
            "model.id=Q;gpu.arch=sm_80",
            "--fact",
            "model.revision=a=b;c",
        ],
        &[("JITSHIP_FACTS", "gpu.cc=7.0")],
    );
    assert_eq!(v["facts"]["model.id"], "Q;gpu.arch=sm_80", "{v:#}");
    assert_eq!(v["facts"]["model.revision"], "a=b;c", "{v:#}");
    assert!(v["facts"].get("gpu.arch").is_none(), "{v:#}");
    assert!(v["sources"].get("gpu.arch").is_none(), "{v:#}");
    assert!(v["facts"].get("gpu.cc").is_none(), "{v:#}");

    // The variable alone: a list.
    let v = facts(&[], &[("JITSHIP_FACTS", "model.id=Q;gpu.cc=8.0; ;")]);
    assert_eq!(v["facts"]["model.id"], "Q", "{v:#}");
    assert_eq!(v["facts"]["gpu.arch"], "sm_80", "{v:#}");
}

/// The same through the settings every worker command takes: `publish` keys the native policy on
/// the one fact `model.id`, its value encoded, and no `gpu.arch` appears.
#[test]
fn publish_keys_on_a_fact_flag_as_one_fact() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("k.bin"), b"kernel").unwrap();
    let store = format!("local:{}", dir.path().join("store").display());
    let cache = format!("kernels:native={}", root.display());
    let (code, stdout, stderr) = jitship(
        &[
            "publish",
            "--store",
            &store,
            "--cache",
            &cache,
            "--fact",
            "model.id=Q;gpu.arch=sm_80",
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let key = v["results"][0]["compat_key"]
        .as_str()
        .unwrap_or_else(|| panic!("{v:#}"));
    assert!(key.contains("model.id=Q%3Bgpu.arch%3Dsm_80"), "{key}");
    assert!(!key.contains("gpu.arch=sm_80"), "{key}");
}

/// A built-in policy, run as its embedded module through the host, encodes a value holding the
/// key's separators (the SDK's `KeyBuilder`): one `pkg.triton`, no second `gpu.arch`.
#[test]
fn a_builtin_policy_module_encodes_separators_in_values() {
    let module = concat!(env!("CARGO_MANIFEST_DIR"), "/../policies/dist/triton.wasm");
    let (code, stdout, stderr) = jitship(
        &[
            "policy",
            "test",
            module,
            "--fact",
            "pkg.triton=3.9.0;gpu.arch=sm_80",
            "--fact",
            "gpu.arch=sm_90",
            "--fact",
            "gpu.cc=9.0",
            "--fact",
            "driver.major=570",
            "--fact",
            "os.arch=x86_64",
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        v["compat_key"]["value"],
        "triton@1;driver.major=570;gpu.arch=sm_90;gpu.cc=9.0;os.arch=x86_64;pkg.triton=3.9.0%3Bgpu.arch%3Dsm_80",
        "{v:#}"
    );
}
