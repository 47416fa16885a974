//! `jitship policy new` as a third party uses it: a crate written into a directory outside this
//! repository (so nothing resolves through jitship's workspace), its native tests run with
//! `cargo test`, built with `jitship policy build`, loaded by `policy check` and dry-run by
//! `policy test`, then used to publish to a local store and to gc it, with its `keep` setting
//! changed between two gc runs. Needs `rustup target add wasm32-unknown-unknown` and the crates the SDK depends
//! on (wit-bindgen, tempfile) from the registry or cargo's cache.
//!
//! The cargo target directory is shared between runs (under `CARGO_TARGET_TMPDIR`), so only the
//! new crate and the SDK compile after the first run.

use std::path::Path;
use std::process::Command;

use jitship_tests::cli::run as jitship;
use jitship_tests::output::{json, ok};

pub(crate) fn write(root: &Path, path: &str, bytes: &[u8]) {
    let path = root.join(path);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_new_policy_crate_outside_the_repository_tests_builds_checks_and_dry_runs() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    assert!(
        !tmp.path().starts_with(repo),
        "{} must lie outside the repository",
        tmp.path().display()
    );
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("policy-new-target");
    let dir = tmp.path().join("demo-policy");
    let dir_s = dir.to_str().unwrap();

    // Scaffold.
    let out = ok(
        "policy new",
        jitship(&[
            "policy",
            "new",
            "demo-policy",
            "--kind",
            "demo",
            "--dir",
            dir_s,
            "--json",
        ]),
    );
    let made = json(&out);
    assert_eq!(made["kind"], "demo");
    assert_eq!(made["crate_name"], "demo_policy");
    assert_eq!(made["sdk_version"], env!("CARGO_PKG_VERSION"));
    for f in [
        "Cargo.toml",
        "src/lib.rs",
        "README.md",
        "sdk/Cargo.toml",
        "sdk/src/lib.rs",
        "sdk/wit/policy.wit",
    ] {
        assert!(dir.join(f).is_file(), "{f} not written");
    }
    let manifest = std::fs::read_to_string(dir.join("sdk/Cargo.toml")).unwrap();
    assert!(
        !manifest.contains(".workspace"),
        "the SDK manifest inherits from a workspace:\n{manifest}"
    );
    // A second run into the same directory writes nothing.
    let again = jitship(&["policy", "new", "demo-policy", "--dir", dir_s]);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("not empty"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );

    // Its lock file from the crates this workspace already downloaded where cargo can (so the test
    // runs without network where the workspace built), else from the registry.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let lock = |offline: bool| {
        let mut c = Command::new(&cargo);
        c.args(["generate-lockfile", "--manifest-path"])
            .arg(dir.join("Cargo.toml"));
        if offline {
            c.arg("--offline");
        }
        c.output().expect("run cargo")
    };
    if !lock(true).status.success() {
        ok("cargo generate-lockfile", lock(false));
    }

    // Its native tests, with plain cargo.
    ok(
        "cargo test of the new crate",
        Command::new(&cargo)
            .args(["test", "--quiet", "--manifest-path"])
            .arg(dir.join("Cargo.toml"))
            .env("CARGO_TARGET_DIR", &target)
            .env_remove("RUSTFLAGS")
            .output()
            .expect("run cargo"),
    );

    // Build, with no warning (the SDK lies inside the crate's own workspace).
    let wasm = dir.join("target/demo_policy.wasm");
    let out = ok(
        "policy build",
        jitship(&[
            "policy",
            "build",
            dir_s,
            "-o",
            wasm.to_str().unwrap(),
            "--target-dir",
            target.to_str().unwrap(),
            "--json",
        ]),
    );
    let built = json(&out);
    assert_eq!(built["name"], "demo_policy");
    assert_eq!(built["warnings"], serde_json::json!([]), "{built}");
    assert!(wasm.is_file());
    let wasm_s = wasm.to_str().unwrap();

    // Check: jitship loads it, for the kind asked for.
    let out = ok(
        "policy check",
        jitship(&["policy", "check", wasm_s, "--no-compile-cache", "--json"]),
    );
    let check = json(&out);
    assert_eq!(check["info"]["name"], "demo-policy");
    assert_eq!(check["info"]["cache_kind"], "demo");
    assert!(
        check["contract"].as_str().unwrap().starts_with("3."),
        "{check}"
    );
    // Its setting: declared with its kind and default, set by name, refused when the policy
    // says so or when it declares no such setting.
    assert_eq!(check["info"]["settings"][0]["name"], "keep", "{check}");
    assert_eq!(check["info"]["settings"][0]["kind"], "integer", "{check}");
    assert_eq!(check["settings"]["keep"], "3", "{check}");
    let out = ok(
        "policy check --setting keep=1",
        jitship(&[
            "policy",
            "check",
            wasm_s,
            "--no-compile-cache",
            "--setting",
            "keep=1",
            "--json",
        ]),
    );
    assert_eq!(json(&out)["settings"]["keep"], "1");
    for (given, says) in [
        ("keep=0", "keep at least 1"),
        ("keeep=2", "no setting \"keeep\""),
    ] {
        let out = jitship(&[
            "policy",
            "check",
            wasm_s,
            "--no-compile-cache",
            "--setting",
            given,
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{given}: {stderr}");
        assert!(stderr.contains(says), "{given}: {stderr}");
    }

    // Dry run: key, selection over a sample tree, retention of five generations (keeps 3).
    let root = tmp.path().join("root");
    write(&root, "kernels/a.bin", b"kernel");
    write(&root, "kernels/a.bin.lock", b"");
    write(&root, "kernels/b.bin", b"");
    write(&root, "kernels/tmp.pid_1_2/c.bin", b"partial");
    let gens: Vec<serde_json::Value> = (1..=5u64)
        .rev()
        .map(|i| {
            serde_json::json!({
                "id": i.to_string().repeat(64), "compat_key": "k", "created_at": i * 100,
                "size_bytes": 1024, "file_count": 1, "pinned": false
            })
        })
        .collect();
    let gens_file = tmp.path().join("generations.json");
    std::fs::write(&gens_file, serde_json::to_vec(&gens).unwrap()).unwrap();
    let out = ok(
        "policy test",
        jitship(&[
            "policy",
            "test",
            wasm_s,
            "--no-compile-cache",
            "--root",
            root.to_str().unwrap(),
            "--generations",
            gens_file.to_str().unwrap(),
            "--now",
            "600",
            "--fact",
            "os.arch=x86_64",
            "--fact",
            "gpu.arch=sm_90",
            "--fact",
            "driver.major=550",
            "--json",
        ]),
    );
    let r = json(&out);
    assert_eq!(
        r["compat_key"]["value"], "demo@1;driver.major=550;gpu.arch=sm_90;os.arch=x86_64",
        "{r}"
    );
    let decisions: Vec<(String, String)> = r["select"]["call"]["value"]
        .as_array()
        .unwrap_or_else(|| panic!("{r}"))
        .iter()
        .map(|d| {
            (
                d["path"].as_str().unwrap().to_string(),
                d["category"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected = [
        ("kernels/a.bin", "complete"),
        ("kernels/a.bin.lock", "lock"),
        ("kernels/b.bin", "incomplete"),
        ("kernels/tmp.pid_1_2/c.bin", "temporary"),
    ];
    assert_eq!(
        decisions,
        expected.map(|(p, c)| (p.to_string(), c.to_string())),
        "{r}"
    );
    let dropped = |r: &serde_json::Value| -> Vec<String> {
        r["retain"]["call"]["value"]
            .as_array()
            .unwrap_or_else(|| panic!("{r}"))
            .iter()
            .map(|d| d["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(dropped(&r), ["2".repeat(64), "1".repeat(64)], "{r}");
    assert_eq!(r["retain"]["call"]["value"][0]["category"], "count", "{r}");
    assert_eq!(r["settings"]["keep"], "3", "{r}");
    let out = ok(
        "policy test --setting keep=1",
        jitship(&[
            "policy",
            "test",
            wasm_s,
            "--no-compile-cache",
            "--setting",
            "keep=1",
            "--generations",
            gens_file.to_str().unwrap(),
            "--now",
            "600",
            "--fact",
            "os.arch=x86_64",
            "--fact",
            "gpu.arch=sm_90",
            "--fact",
            "driver.major=550",
            "--json",
        ]),
    );
    assert_eq!(dropped(&json(&out)).len(), 4);

    // Publish with it to a local store, then gc, as an operator would: four generations under
    // the default keep=3, then a fifth published with keep=1.
    let store = format!("local:{}", tmp.path().join("store").display());
    let config = tmp.path().join("jitship.toml");
    std::fs::write(&config, "[policy]\ncompile_cache = false\n").unwrap();
    let config_s = config.to_str().unwrap();
    let cache = format!("demo:{wasm_s}={}", root.display());
    let publish = |n: u32, extra: &[&str]| -> String {
        write(
            &root,
            &format!("kernels/g{n}.bin"),
            format!("kernel {n}").as_bytes(),
        );
        let out = ok(
            "publish",
            jitship(
                &[
                    &[
                        "publish",
                        "--config",
                        config_s,
                        "--store",
                        &store,
                        "--cache",
                        &cache,
                        "--fact",
                        "os.arch=x86_64",
                        "--fact",
                        "gpu.arch=sm_90",
                        "--fact",
                        "driver.major=550",
                        "--json",
                    ][..],
                    extra,
                ]
                .concat(),
            ),
        );
        let doc = json(&out);
        doc["results"][0]["generation"]
            .as_str()
            .unwrap_or_else(|| panic!("{doc}"))
            .to_owned()
    };
    let modules = wasm.parent().unwrap().to_str().unwrap().to_owned();
    let gc = || -> serde_json::Value {
        let out = ok(
            "gc",
            jitship(&[
                "gc",
                "--config",
                config_s,
                "--store",
                &store,
                "--policy-dir",
                &modules,
                "--grace",
                "0s",
                "--json",
            ]),
        );
        json(&out)["results"][0].clone()
    };
    let dropped_by_gc = |r: &serde_json::Value| -> Vec<(String, String)> {
        r["decisions"]
            .as_array()
            .unwrap_or_else(|| panic!("{r}"))
            .iter()
            .filter(|d| d["verdict"] == "drop")
            .map(|d| {
                let reason = d["reason"].as_str().unwrap().to_owned();
                (d["generation"].as_str().unwrap().to_owned(), reason)
            })
            .collect()
    };
    let first: Vec<String> = (1..=4).map(|n| publish(n, &[])).collect();
    let r = gc();
    assert_eq!(r["policies"][0]["decided_by"]["name"], "demo-policy", "{r}");
    assert_eq!(
        r["policies"][0]["decided_by"]["settings"]["keep"], "3",
        "{r}"
    );
    let gone = dropped_by_gc(&r);
    assert_eq!(gone.len(), 1, "keep=3 keeps three of four: {r}");
    assert_eq!(gone[0].0, first[0], "{r}");
    assert!(
        gone[0].1.contains("count: beyond the newest 3"),
        "{}",
        gone[0].1
    );

    // The operator sets keep=1 for the cache; the next generation records it and gc follows.
    let newest = publish(5, &["--setting", "demo:keep=1"]);
    let r = gc();
    assert_eq!(
        r["policies"][0]["decided_by"]["settings"]["keep"], "1",
        "{r}"
    );
    let mut gone: Vec<String> = dropped_by_gc(&r).into_iter().map(|(g, _)| g).collect();
    gone.sort();
    let mut expected = first[1..].to_vec();
    expected.sort();
    assert_eq!(gone, expected, "keep=1 keeps the newest alone: {r}");
    let kept: Vec<&str> = r["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["verdict"] == "keep")
        .map(|d| d["generation"].as_str().unwrap())
        .collect();
    assert_eq!(kept, [newest.as_str()], "{r}");

    // Sticky settings (issue 43): a publish without --setting keeps what the key's newest
    // generation recorded (keep=1), and its summary names the policy, version and settings.
    write(&root, "kernels/g6.bin", b"kernel 6");
    let out = ok(
        "publish without --setting",
        jitship(&[
            "publish",
            "--config",
            config_s,
            "--store",
            &store,
            "--cache",
            &cache,
            "--fact",
            "os.arch=x86_64",
            "--fact",
            "gpu.arch=sm_90",
            "--fact",
            "driver.major=550",
        ]),
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("policy demo-policy@0.1.0, settings keep=1, kept from generation"),
        "{said}"
    );
    let r = gc();
    assert_eq!(
        r["policies"][0]["decided_by"]["settings"]["keep"], "1",
        "{r}"
    );
    // Changing them needs the flag: keep=2 is recorded and followed.
    publish(7, &["--setting", "demo:keep=2"]);
    let r = gc();
    assert_eq!(
        r["policies"][0]["decided_by"]["settings"]["keep"], "2",
        "{r}"
    );
}

/// Issue 43: `policy new --kind triton` starts from the built-in Triton policy (its root, its
/// environment variables, its select, canonicalize and materialize), so the first build already
/// relocates group files: published from one root, installed at another, every `__grp__` file
/// names the installing root. A kind jitship has no policy for starts from the generic template
/// and says so.
#[test]
fn a_policy_new_of_kind_triton_publishes_and_installs_at_another_root_with_group_files_relocated() {
    use crate::policy_modules::{build, scaffold};

    let tmp = tempfile::tempdir().unwrap();
    let unknown = tmp.path().join("other");
    let out = ok(
        "policy new --kind no-such-kind",
        jitship(&[
            "policy",
            "new",
            "other",
            "--kind",
            "no-such-kind",
            "--dir",
            unknown.to_str().unwrap(),
        ]),
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("no built-in policy for kind \"no-such-kind\"")
            && said.contains("generic template"),
        "{said}"
    );

    let dir = tmp.path().join("my-triton");
    scaffold("my-triton", "triton", &dir);
    let lib = std::fs::read_to_string(dir.join("src/lib.rs")).unwrap();
    assert!(
        lib.contains("\"~/.triton/cache\"") && lib.contains("TRITON_CACHE_DIR"),
        "{lib}"
    );
    let wasm = dir.join("target/my_triton.wasm");
    build(&dir, &wasm);
    let check = json(&ok(
        "policy check",
        jitship(&[
            "policy",
            "check",
            wasm.to_str().unwrap(),
            "--no-compile-cache",
            "--json",
        ]),
    ));
    assert_eq!(check["info"]["name"], "my-triton", "{check}");
    assert_eq!(check["info"]["default_root"], "~/.triton/cache", "{check}");

    let a = tmp.path().join("pod-a/.triton/cache");
    let b = tmp.path().join("pod-b/somewhere/much/longer/cache");
    jitship_tests::fixtures::triton_tree(&a, 3, 43);
    let store = format!("local:{}", tmp.path().join("store").display());
    let config = tmp.path().join("jitship.toml");
    std::fs::write(&config, "[policy]\ncompile_cache = false\n").unwrap();
    let run = |cmd: &str, root: &Path| -> serde_json::Value {
        let cache = format!("triton:{}={}", wasm.display(), root.display());
        let mut args = vec![
            cmd,
            "--config",
            config.to_str().unwrap(),
            "--store",
            &store,
            "--cache",
            &cache,
            "--json",
        ];
        for f in [
            "pkg.triton=3.4.0",
            "gpu.arch=sm_90",
            "gpu.cc=9.0",
            "driver.major=550",
            "os.arch=x86_64",
        ] {
            args.extend(["--fact", f]);
        }
        json(&ok(cmd, jitship(&args)))["results"][0].clone()
    };
    let published = run("publish", &a);
    assert_eq!(published["outcome"], "published", "{published}");
    assert_eq!(published["files_selected"], 24, "{published}");
    let installed = run("install", &b);
    assert_eq!(installed["outcome"], "installed", "{installed}");
    let mut groups = 0;
    for entry in walkdir::WalkDir::new(&b) {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("__grp__") {
            continue;
        }
        groups += 1;
        let text = std::fs::read_to_string(entry.path()).unwrap();
        assert!(
            text.contains(b.to_str().unwrap()) && !text.contains(a.to_str().unwrap()),
            "{}: {text}",
            entry.path().display()
        );
    }
    assert_eq!(groups, 3);
}
