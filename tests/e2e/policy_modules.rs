//! Issue 43: policy modules by digest, in the store. A publish stores the module it used under
//! its blake3 (`catalog::modules`), the digest its manifest records; gc fetches it from there when
//! no local file has that digest (the author rebuilt or deleted it), checks it against the digest
//! and runs it under the same sandbox; a module no retained generation names goes. A module key
//! is anyone's: bytes that are not its digest's are refused, never loaded.
//!
//! Built as `policy_new` builds its crate (a `jitship policy new` scaffold outside the
//! repository, `jitship policy build`, the target directory shared with that test), so it needs
//! `rustup target add wasm32-unknown-unknown` and the SDK's crates in cargo's cache.

use std::path::{Path, PathBuf};
use std::process::Command;

use jitship::catalog::KeyLayout;
use jitship::generation::ContentHash;
use jitship::store::{LocalStore, Store, ValueClass};

use jitship_tests::cli::run as jitship;
use jitship_tests::output::{json, ok};

use super::policy_new::write;

pub(crate) fn scaffold(name: &str, kind: &str, dir: &Path) {
    ok(
        "policy new",
        jitship(&[
            "policy",
            "new",
            name,
            "--kind",
            kind,
            "--dir",
            dir.to_str().unwrap(),
        ]),
    );
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
}

/// `jitship policy build DIR -o OUT`, with the target directory `policy_new` uses.
pub(crate) fn build(dir: &Path, out: &Path) {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("policy-new-target");
    ok(
        "policy build",
        jitship(&[
            "policy",
            "build",
            dir.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--target-dir",
            target.to_str().unwrap(),
        ]),
    );
}

const FACTS: [&str; 6] = [
    "--fact",
    "os.arch=x86_64",
    "--fact",
    "gpu.arch=sm_90",
    "--fact",
    "driver.major=550",
];

struct Place {
    store: String,
    dir: PathBuf,
    config: PathBuf,
}

impl Place {
    fn new(tmp: &Path) -> Self {
        let dir = tmp.join("store");
        let config = tmp.join("jitship.toml");
        std::fs::write(&config, "[policy]\ncompile_cache = false\n").unwrap();
        Self {
            store: format!("local:{}", dir.display()),
            dir,
            config,
        }
    }

    fn publish(&self, cache: &str, extra: &[&str]) -> serde_json::Value {
        let args = [
            &[
                "publish",
                "--config",
                self.config.to_str().unwrap(),
                "--store",
                &self.store,
                "--cache",
                cache,
                "--json",
            ][..],
            &FACTS[..],
            extra,
        ]
        .concat();
        json(&ok("publish", jitship(&args)))["results"][0].clone()
    }

    /// gc with the store alone (no module given), `extra` added; its exit code and report.
    fn gc(&self, extra: &[&str]) -> (Option<i32>, serde_json::Value, String) {
        let args = [
            &[
                "gc",
                "--config",
                self.config.to_str().unwrap(),
                "--store",
                &self.store,
                "--grace",
                "0s",
            ][..],
            extra,
        ]
        .concat();
        let out = jitship(&[&args[..], &["--json"]].concat());
        let doc = json(&out);
        let dry: &[&str] = match extra.contains(&"--dry-run") {
            true => &[],
            false => &["--dry-run"],
        };
        let text = jitship(&[&args[..], dry].concat());
        (
            out.status.code(),
            doc["results"][0].clone(),
            String::from_utf8_lossy(&text.stdout).into_owned(),
        )
    }

    fn store(&self) -> (LocalStore, KeyLayout) {
        (
            LocalStore::open(&self.dir).unwrap(),
            KeyLayout::new("jitship").unwrap(),
        )
    }
}

/// Must-show 1 of issue 43: publish with a module, rebuild it with a change (a new version) over
/// the same file and delete the old one from everywhere, and gc with the store alone decides
/// with the recorded module, fetched from the store, and names it. Then the same key published
/// with the new module: gc removes the old module once no kept generation names it.
#[test]
fn gc_decides_with_the_recorded_module_fetched_from_the_store_after_a_rebuild() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("mod-policy");
    scaffold("mod-policy", "demo", &dir);
    let wasm = dir.join("target/mod_policy.wasm");
    build(&dir, &wasm);
    let v1 = std::fs::read(&wasm).unwrap();
    let d1 = ContentHash::of(&v1);

    let place = Place::new(tmp.path());
    let root = tmp.path().join("root");
    let cache = format!("demo:{}={}", wasm.display(), root.display());
    let mut first = Vec::new();
    for n in 1..=4 {
        write(
            &root,
            &format!("kernels/g{n}.bin"),
            format!("k{n}").as_bytes(),
        );
        let r = place.publish(&cache, &[]);
        first.push(r["generation"].as_str().unwrap().to_owned());
    }
    let (store, layout) = place.store();
    assert_eq!(
        store.get(&layout.module(&d1)).unwrap().as_deref(),
        Some(&v1[..]),
        "publish stores its module by digest"
    );
    // ls and inspect show the governing policy, its settings and where its module is.
    let text = |args: &[&str]| {
        let out = ok("ls/inspect", jitship(args));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let ls = text(&["ls", "--store", &place.store]);
    assert!(
        ls.contains("policy mod-policy@0.1.0") && ls.contains("settings keep=3"),
        "{ls}"
    );
    let inspect = text(&["inspect", "--store", &place.store, &first[3]]);
    assert!(
        inspect.contains("settings    keep=3") && inspect.contains("module      in the store"),
        "{inspect}"
    );

    // The author bumps the version and the default, and rebuilds over the same file.
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    std::fs::write(
        dir.join("Cargo.toml"),
        manifest.replacen("version = \"0.1.0\"", "version = \"0.2.0\"", 1),
    )
    .unwrap();
    let lib = std::fs::read_to_string(dir.join("src/lib.rs")).unwrap();
    std::fs::write(
        dir.join("src/lib.rs"),
        lib.replacen("pub const KEEP: u32 = 3;", "pub const KEEP: u32 = 1;", 1),
    )
    .unwrap();
    build(&dir, &wasm);
    let v2 = std::fs::read(&wasm).unwrap();
    assert_ne!(ContentHash::of(&v2), d1, "the rebuild changed the module");

    // With the new module in a modules dir, and with the store alone: 0.1.0 decides (keep 3 of
    // 4), fetched from the store, and the report names it.
    let modules_dir = wasm.parent().unwrap().to_str().unwrap().to_owned();
    for extra in [&["--policy-dir", modules_dir.as_str()][..], &[]] {
        let (code, r, text) = place.gc(&[extra, &["--dry-run"]].concat());
        assert_eq!(code, Some(0), "{r:#}");
        let used = &r["policies"][0]["decided_by"];
        assert_eq!(used["name"], "mod-policy", "{r:#}");
        assert_eq!(used["version"], "0.1.0", "{r:#}");
        assert_eq!(used["digest"], d1.to_hex(), "{r:#}");
        assert_eq!(used["found"]["type"], "store", "{r:#}");
        assert_eq!(used["found"]["key"], layout.module(&d1), "{r:#}");
        assert!(
            text.contains("mod-policy@0.1.0") && text.contains("fetched from the store"),
            "{text}"
        );
    }
    std::fs::remove_file(&wasm).unwrap();
    // inspect fetches the recorded module from the store, for `policy test` to run.
    let saved = tmp.path().join("saved.wasm");
    ok(
        "inspect --save-module",
        jitship(&[
            "inspect",
            "--store",
            &place.store,
            &first[3],
            "--save-module",
            saved.to_str().unwrap(),
        ]),
    );
    assert_eq!(std::fs::read(&saved).unwrap(), v1);
    let tested = json(&ok(
        "policy test of the saved module",
        jitship(&[
            "policy",
            "test",
            saved.to_str().unwrap(),
            "--no-compile-cache",
            "--json",
            FACTS[0],
            FACTS[1],
            FACTS[2],
            FACTS[3],
            FACTS[4],
            FACTS[5],
        ]),
    ));
    assert_eq!(tested["policy"]["version"], "0.1.0", "{tested}");
    let (code, r, _) = place.gc(&[]);
    assert_eq!(code, Some(0), "{r:#}");
    let dropped: Vec<&str> = r["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["verdict"] == "drop")
        .map(|d| d["generation"].as_str().unwrap())
        .collect();
    assert_eq!(
        dropped,
        [first[0].as_str()],
        "keep=3 of 0.1.0 drops one: {r:#}"
    );
    assert!(store.exists(&layout.module(&d1)).unwrap(), "still named");

    // The key moves on to 0.2.0: its settings are sticky (the publish keeps the keep=3 the key's
    // newest generation recorded), so the operator sets keep=1. gc decides with 0.2.0 and drops
    // the 0.1.0 generations, and with them the 0.1.0 module, which no kept generation names.
    std::fs::write(&wasm, &v2).unwrap();
    write(&root, "kernels/g5.bin", b"k5");
    let r = place.publish(&cache, &["--setting", "demo:keep=1"]);
    assert_eq!(r["policy"]["version"], "0.2.0", "{r:#}");
    assert_eq!(r["policy"]["settings"]["keep"], "1", "{r:#}");
    std::fs::remove_file(&wasm).unwrap();
    let (code, r, _) = place.gc(&[]);
    assert_eq!(code, Some(0), "{r:#}");
    assert_eq!(r["policies"][0]["decided_by"]["version"], "0.2.0", "{r:#}");
    assert_eq!(r["modules"], serde_json::json!([d1.to_hex()]), "{r:#}");
    assert!(!store.exists(&layout.module(&d1)).unwrap(), "{r:#}");
    assert!(store.exists(&layout.module(&ContentHash::of(&v2))).unwrap());

    // A module key is hostile until its digest matches: other bytes under the 0.2.0 digest are
    // refused, the key is kept whole and the report says why.
    let d2 = ContentHash::of(&v2);
    store.remove(&layout.module(&d2)).unwrap();
    let mut forged = v1.clone();
    forged.extend_from_slice(b"\0");
    store
        .put(&layout.module(&d2), &forged, ValueClass::Record)
        .unwrap();
    let (_, r, _) = place.gc(&["--dry-run"]);
    let why = r["policies"][0]["kept_whole"]
        .as_str()
        .unwrap_or_else(|| panic!("{r:#}"));
    assert!(
        why.contains("mod-policy@0.2.0") && why.contains("not the digest its key names"),
        "{why}"
    );
    // The next publish puts the right bytes back.
    write(&root, "kernels/g6.bin", b"k6");
    std::fs::write(&wasm, &v2).unwrap();
    place.publish(&cache, &[]);
    assert_eq!(
        store.get(&layout.module(&d2)).unwrap().as_deref(),
        Some(&v2[..])
    );
}

/// Issue 43: `gc --setting` is refused with the reason and the way to change a key's settings,
/// not as a bare usage error.
#[test]
fn gc_refuses_a_setting_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let place = Place::new(tmp.path());
    let out = jitship(&[
        "gc",
        "--config",
        place.config.to_str().unwrap(),
        "--store",
        &place.store,
        "--setting",
        "demo:keep=1",
    ]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("gc takes no --setting (demo:keep=1)")
            && said.contains("publish it with --setting"),
        "{said}"
    );
}

/// Issue 43, `policy test`: a retention-only run (`--generations`, no `--fact`, no `--root`)
/// does not fail on the key's missing facts; a run with a root takes every `embeds-root` file
/// through canonicalize and materialize (same bytes back at the root, relocated at another).
#[test]
fn policy_test_runs_retention_alone_and_exercises_canonicalize_and_materialize() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let triton = repo.join("policies/dist/triton.wasm");
    let triton = triton.to_str().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let gens = tmp.path().join("gens.json");
    let id = "1".repeat(64);
    std::fs::write(
        &gens,
        format!(
            r#"[{{"id": "{id}", "compat_key": "k", "created_at": 1, "size_bytes": 1, "file_count": 1}}]"#
        ),
    )
    .unwrap();
    let out = ok(
        "policy test --generations",
        jitship(&[
            "policy",
            "test",
            triton,
            "--no-compile-cache",
            "--generations",
            gens.to_str().unwrap(),
            "--json",
        ]),
    );
    let r = json(&out);
    assert_eq!(r["key_asked"], false, "{r}");
    assert_eq!(r["retain"]["keep"][0], id.as_str(), "{r}");

    let root = tmp.path().join("root");
    jitship_tests::fixtures::triton_tree(&root, 2, 7);
    let mut args = vec![
        "policy",
        "test",
        triton,
        "--no-compile-cache",
        "--root",
        root.to_str().unwrap(),
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
    let r = json(&ok("policy test --root", jitship(&args)));
    let rewrites = r["select"]["root_rewrites"]
        .as_array()
        .unwrap_or_else(|| panic!("{r}"));
    assert_eq!(rewrites.len(), 2, "{r}");
    for w in rewrites {
        assert!(w["path"].as_str().unwrap().contains("__grp__"), "{w}");
        // round_trip is information only: Triton writes the group JSON in its own layout.
        for check in ["root_gone", "relocates"] {
            assert_eq!(w[check], true, "{check}: {w}");
        }
    }
}

/// Issue 43, under `[trust] mode = "required"`: gc runs only modules named by generations a
/// trusted key signed. An unsigned publish on top, with another module (stored in the store like
/// any), never decides the key: the trusted generation's built-in does. Without required trust the
/// newest generation decides, with its module fetched from the store (and the report says an
/// unsigned record decided).
#[test]
fn under_required_trust_only_modules_of_trusted_generations_run() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let golden = tmp.path().join("golden.wasm");
    build(&repo.join("examples/retention-policy"), &golden);
    let key = tmp.path().join("publisher.key");
    let out = ok(
        "key generate",
        jitship(&["key", "generate", "--out", key.to_str().unwrap()]),
    );
    let public = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find(|w| w.starts_with("ed25519:"))
        .expect("the public key on stdout")
        .to_owned();
    let place = Place::new(tmp.path());
    let required = tmp.path().join("required.toml");
    std::fs::write(
        &required,
        format!(
            "[policy]\ncompile_cache = false\n\n[trust]\nmode = \"required\"\ntrusted_keys = \
             [\"{public}\"]\n"
        ),
    )
    .unwrap();
    let facts = [
        "--fact",
        "pkg.triton=3.9.0",
        "--fact",
        "gpu.arch=sm_90",
        "--fact",
        "gpu.cc=9.0",
        "--fact",
        "driver.major=550",
        "--fact",
        "os.arch=x86_64",
    ];
    let publish = |config: &Path, cache: String, extra: &[&str]| {
        let args = [
            &[
                "publish",
                "--config",
                config.to_str().unwrap(),
                "--store",
                &place.store,
                "--cache",
                &cache,
                "--json",
            ][..],
            &facts[..],
            extra,
        ]
        .concat();
        json(&ok("publish", jitship(&args)))["results"][0].clone()
    };
    let root = tmp.path().join("root");
    for n in 1..=2 {
        jitship_tests::fixtures::triton_tree(&root, n, 5);
        publish(
            &required,
            format!("triton={}", root.display()),
            &["--signing-key", key.to_str().unwrap()],
        );
    }
    let evil = tmp.path().join("evil");
    jitship_tests::fixtures::triton_tree(&evil, 3, 9);
    let r = publish(
        &place.config,
        format!("triton:{}={}", golden.display(), evil.display()),
        &[],
    );
    assert_eq!(r["policy"]["name"], "golden-retention", "{r}");
    let (store, layout) = place.store();
    let stored = layout.module(&ContentHash::of(&std::fs::read(&golden).unwrap()));
    assert!(store.exists(&stored).unwrap());

    let gc = |config: &Path| {
        let out = jitship(&[
            "gc",
            "--config",
            config.to_str().unwrap(),
            "--store",
            &place.store,
            "--dry-run",
            "--json",
        ]);
        json(&out)["results"][0]["policies"][0].clone()
    };
    let decided = gc(&required);
    assert_eq!(decided["decided_by"]["name"], "triton", "{decided}");
    assert_eq!(
        decided["decided_by"]["found"]["type"], "builtin",
        "{decided}"
    );
    let decided = gc(&place.config);
    assert_eq!(
        decided["decided_by"]["name"], "golden-retention",
        "{decided}"
    );
    assert_eq!(decided["decided_by"]["found"]["type"], "store", "{decided}");
}
