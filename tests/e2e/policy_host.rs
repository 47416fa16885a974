//! The policy host against real components: a well-behaved guest for the golden round trip and
//! hostile guests (tests/guests) for containment. The guests are built here through
//! `policy::build` (wasm32-unknown-unknown + in-process componentize), into target/tmp, so the test
//! exercises the same path `jitship policy build` takes; cargo caches the builds between runs.
//! `hostile`: containment of hostile guests; `build`: reproducible guest builds.
// blake3 named directly: an oracle independent of the host's own digest.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use jitship::config::CacheConfig;
use jitship::facts::Facts;
use jitship::generation::RelPath;
use jitship::generation::{ContentHash, GenerationId};
use jitship::policies::{PolicySet, PolicySource};
use jitship::policy::build::{BuildOptions, build_policy_crate_to};
use jitship::policy::host::Rewrite;
use jitship::policy::host::{Limits, PolicyEngine, WasmPolicy};
use jitship::policy::{
    CachePolicy, FileEntry, GenerationSummary, PolicyError, ReasonCategory, RetentionLimits,
    Verdict,
};
use jitship_tests::fixtures::copy_tree;

mod build;
mod hostile;

fn guests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("guests")
}

fn out_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("policy-guests")
}

/// Builds every guest once per test binary; returns the directory holding `<name>.wasm`.
fn guests() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let out = out_dir();
        let opts = BuildOptions {
            target_dir: Some(out.join("target")),
            quiet: true,
            locked: true,
        };
        for name in ["good", "hostile", "v1", "v4"] {
            build_policy_crate_to(
                &guests_dir().join(name),
                &out.join(format!("{name}.wasm")),
                &opts,
            )
            .unwrap_or_else(|e| panic!("building guest {name}: {e}"));
        }
        out
    })
}

fn wasm(name: &str) -> PathBuf {
    guests().join(format!("{name}.wasm"))
}

fn limits() -> Limits {
    Limits {
        fuel: 200_000_000,
        deadline: Duration::from_secs(10),
        memory: 16 << 20,
        read_budget: 16 << 20,
    }
}

fn engine_with(limits: Limits) -> Arc<PolicyEngine> {
    PolicyEngine::with_cache_dir(limits, None).expect("engine")
}

fn load(engine: &Arc<PolicyEngine>, name: &str) -> WasmPolicy {
    engine
        .load_file(&wasm(name))
        .unwrap_or_else(|e| panic!("loading {name}: {e}"))
}

fn facts(pairs: &[(&str, &str)]) -> Facts {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn entry(path: &str) -> FileEntry {
    FileEntry {
        path: path.into(),
        size: 1,
        mtime_ms: 0,
    }
}

fn gen_id(n: u8) -> GenerationId {
    GenerationId(ContentHash([n; 32]))
}

fn generation(n: u8, created_at: u64, pinned: bool) -> GenerationSummary {
    GenerationSummary {
        id: gen_id(n),
        compat_key: "k".into(),
        created_at,
        size_bytes: 10,
        file_count: 1,
        pinned,
    }
}

/// After any containment test: the host still runs a good policy.
fn host_still_works(engine: &Arc<PolicyEngine>) {
    let good = load(engine, "good");
    let key = good
        .compat_key(&facts(&[
            ("gpu.name", "H100"),
            ("python.version", "3.12.3"),
        ]))
        .expect("good policy answers");
    assert_eq!(key, "test-v1;gpu=H100;py=3.12.3");
}

#[test]
fn golden_round_trip_on_a_real_component() {
    let engine = engine_with(limits());
    let good = load(&engine, "good");
    let info = good.info();
    assert_eq!(
        (
            info.name.as_str(),
            info.version.as_str(),
            info.cache_kind.as_str()
        ),
        ("good", "1.2.3", "test")
    );
    assert_eq!(info.root_env, vec!["TEST_CACHE_DIR".to_string()]);
    assert_eq!(good.contract().version, "3.0.0");
    assert!(
        good.contract().uses_read_file(),
        "{:?}",
        good.contract().imports
    );
    assert_eq!(
        good.policy_ref().digest,
        blake3::hash(&std::fs::read(wasm("good")).unwrap())
            .to_hex()
            .to_string()
    );

    assert_eq!(
        good.compat_key(&facts(&[
            ("gpu.name", "H100"),
            ("python.version", "3.12.3")
        ]))
        .unwrap(),
        "test-v1;gpu=H100;py=3.12.3"
    );
    assert_eq!(
        good.compat_key(&facts(&[("gpu.name", "H100")])),
        Err(PolicyError::MissingFact("python.version".into()))
    );

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("a.json"), b"{\"ok\": 1}").unwrap();
    std::fs::write(root.join("b.json"), b"{\"trunc").unwrap();
    std::fs::write(root.join("sub/k.cubin"), b"\x7fELF").unwrap();
    let entries = [
        entry("a.json"),
        entry("b.json"),
        entry("c.tmp"),
        entry("d.lock"),
        entry("sub/k.cubin"),
        entry("gone.json"),
    ];
    let selection = good.select(root, &entries).unwrap();
    assert!(selection.complete && selection.incomplete_detail.is_empty());
    let got: Vec<(Verdict, ReasonCategory, &str)> = selection
        .decisions
        .iter()
        .map(|d| (d.verdict, d.category, d.detail.as_str()))
        .collect();
    assert_eq!(
        got[..5],
        [
            (Verdict::Publish, ReasonCategory::Complete, "complete json"),
            (Verdict::Skip, ReasonCategory::Incomplete, "truncated json"),
            (
                Verdict::Skip,
                ReasonCategory::Temporary,
                "in-flight temp file"
            ),
            (Verdict::Skip, ReasonCategory::Lock, "lock file"),
            (Verdict::Publish, ReasonCategory::Complete, "complete file"),
        ]
    );
    assert_eq!(got[5].0, Verdict::Skip);
    assert!(
        got[5].2.starts_with("unreadable: refused: gone.json"),
        "{}",
        got[5].2
    );
    assert!(
        selection
            .decisions
            .iter()
            .all(|d| !d.marker && !d.embeds_root)
    );

    // The root arrives absolute (even when given relative); traits and completeness travel.
    std::fs::write(root.join("k.grp.json"), b"{\"child\": 1}").unwrap();
    let s = good
        .select(
            root,
            &[entry("root-probe"), entry("k.grp.json"), entry("x.partial")],
        )
        .unwrap();
    assert_eq!(s.decisions[0].detail, format!("root is {}", root.display()));
    assert!(s.decisions[1].marker && s.decisions[1].embeds_root);
    assert!(!s.complete);
    assert_eq!(s.incomplete_detail, "1 partial file(s) still being written");
    let cwd = std::env::current_dir().unwrap();
    let relative = pathdiff_for_test(root, &cwd);
    let s = good.select(&relative, &[entry("root-probe")]).unwrap();
    assert_eq!(
        s.decisions[0].detail,
        format!("root is {}", cwd.join(&relative).display())
    );

    // canonicalize/materialize round trip through the component.
    let path = RelPath::parse("k.grp.json").unwrap();
    let content = format!("{{\"child\": \"{}/k.bin\"}}", root.display());
    let canon = good.canonicalize(root, &path, content.as_bytes()).unwrap();
    assert_eq!(canon, b"{\"child\": \"${ROOT}/k.bin\"}");
    assert_eq!(
        good.materialize(Path::new("/elsewhere"), &path, &canon)
            .unwrap(),
        b"{\"child\": \"/elsewhere/k.bin\"}"
    );
    assert!(matches!(
        good.canonicalize(Path::new("/not/this"), &path, content.as_bytes()),
        Err(PolicyError::InvalidInput(m)) if m.contains("does not name /not/this")
    ));

    let gens = [
        generation(1, 100, false),
        generation(2, 90, true),
        generation(3, 80, false),
        generation(4, 70, false),
    ];
    let ids = |drops: Vec<jitship::policy::RetentionDrop>| -> Vec<GenerationId> {
        drops.into_iter().map(|d| d.id).collect()
    };
    let dropped = good
        .retain(&gens, 1000, &RetentionLimits::default())
        .unwrap();
    assert_eq!(
        dropped[0].category,
        jitship::policy::RetentionCategory::Count
    );
    assert_eq!(dropped[0].detail, "beyond the newest 2");
    assert_eq!(ids(dropped), vec![gen_id(3), gen_id(4)]);
    let dropped = good
        .retain(
            &gens,
            1000,
            &RetentionLimits {
                max_generations: Some(1),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(
        ids(dropped),
        vec![gen_id(3), gen_id(4)],
        "the pinned generation is kept whatever the policy says"
    );

    // Settings: the default is what every call gets and what a generation records; another
    // value is read by its kind, checked by the policy, and changes its answers.
    assert_eq!(good.policy_ref().settings["keep"], "2");
    let keep3 = good
        .configure(&BTreeMap::from([("keep".to_owned(), "3".to_owned())]))
        .unwrap();
    assert_eq!(keep3.policy_ref().settings["keep"], "3");
    let dropped = keep3
        .retain(&gens, 1000, &RetentionLimits::default())
        .unwrap();
    assert_eq!(ids(dropped), vec![gen_id(4)]);
    let refused = |given: &[(&str, &str)]| {
        let given = given
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        match good.configure(&given) {
            Err(PolicyError::Settings(m)) => m,
            other => panic!("expected a settings refusal, got {other:?}"),
        }
    };
    let m = refused(&[("keep", "0")]);
    assert!(
        m.contains("policy good refused its settings keep=0") && m.contains("keep at least 1"),
        "{m}"
    );
    let m = refused(&[("keep", "many")]);
    assert!(
        m.contains("setting keep is \"many\", not an integer"),
        "{m}"
    );
    let m = refused(&[("kep", "2")]);
    assert!(
        m.contains("no setting \"kep\"") && m.contains("keep (integer, default \"2\")"),
        "{m}"
    );

    // Fresh instances: the same input gives the same answer, and costs the same fuel.
    let a = good.select_traced(root, &entries).unwrap();
    let b = good.select_traced(root, &entries).unwrap();
    assert_eq!(a.value, b.value);
    assert_eq!(a.fuel_used, b.fuel_used);
    assert!(a.fuel_used > 0 && a.bytes_read > 0);
}

#[test]
fn a_failing_policy_disables_its_kind_and_nothing_else() {
    let engine = engine_with(limits());
    let root = PathBuf::from("/nonexistent");
    let cache = |kind: &str, policy: Option<PathBuf>| CacheConfig {
        kind: kind.into(),
        root: root.clone(),
        policy,
        facts: Default::default(),
        settings: Default::default(),
    };
    let set = PolicySet::load(
        &engine,
        &[
            cache("hostile", Some(wasm("hostile"))),
            cache("test", Some(wasm("good"))),
            cache("future", Some(wasm("v4"))),
            cache("past", Some(wasm("v1"))),
            cache("triton", Some(wasm("good"))),
            cache("plain", Some(jitship::config::NATIVE_POLICY.into())),
        ],
    );

    let hostile = set.get("hostile").unwrap();
    assert_eq!(hostile.compat_key(&Facts::new()).unwrap(), "hostile-key");
    assert_eq!(
        hostile.compat_key(&facts(&[("evil", "missing")])).unwrap(),
        "hostile-key"
    );
    let err = hostile.compat_key(&facts(&[("evil", "loop")])).unwrap_err();
    assert!(matches!(err, PolicyError::OutOfFuel { .. }), "{err}");
    // Disabled from now on, through the handle already held and through the set.
    let err = hostile.compat_key(&Facts::new()).unwrap_err();
    assert!(
        matches!(&err, PolicyError::Disabled { kind, reason } if kind == "hostile" && reason.contains("CPU budget")),
        "{err}"
    );
    assert!(matches!(
        set.get("hostile"),
        Err(PolicyError::Disabled { .. })
    ));

    // The others carry on; a refusal the contract allows disables nothing.
    let test = set.get("test").unwrap();
    assert!(matches!(
        test.compat_key(&Facts::new()),
        Err(PolicyError::MissingFact(_))
    ));
    assert_eq!(
        test.compat_key(&facts(&[("gpu.name", "A"), ("python.version", "3")]))
            .unwrap(),
        "test-v1;gpu=A;py=3"
    );
    assert!(set.get("plain").is_ok());

    let status = set.status();
    let row = |k: &str| status.iter().find(|s| s.kind == k).unwrap().clone();
    assert!(row("hostile").disabled.unwrap().contains("compat-key"));
    assert!(
        row("future")
            .disabled
            .unwrap()
            .contains("jitship:policy@3.0.0")
    );
    assert!(
        row("triton")
            .disabled
            .unwrap()
            .contains("governs cache kind \"test\"")
    );
    assert_eq!(row("test").disabled, None);
    assert_eq!(row("plain").source, PolicySource::Native);
    assert_eq!(row("test").source, PolicySource::File(wasm("good")));
}

#[test]
fn compiled_modules_are_cached_on_disk_and_only_trusted_files_are_loaded() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let cache_dir = dir.path().join("cache");
    let engine = PolicyEngine::with_cache_dir(limits(), Some(&cache_dir)).unwrap();
    assert_eq!(
        std::fs::metadata(&cache_dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let first = load(&engine, "good");
    assert!(!first.load_stats().from_cache);
    let files: Vec<PathBuf> = std::fs::read_dir(&cache_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let cwasm = &files[0];
    assert!(
        cwasm
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with(first.digest())
    );
    assert_eq!(
        std::fs::metadata(cwasm).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // A new engine (a new process) loads it instead of compiling.
    let engine = PolicyEngine::with_cache_dir(limits(), Some(&cache_dir)).unwrap();
    let second = load(&engine, "good");
    assert!(second.load_stats().from_cache);
    host_still_works(&engine);

    // Garbage in place of the artifact: a miss, recompiled and rewritten.
    std::fs::write(cwasm, b"garbage").unwrap();
    std::fs::set_permissions(cwasm, std::fs::Permissions::from_mode(0o600)).unwrap();
    let engine = PolicyEngine::with_cache_dir(limits(), Some(&cache_dir)).unwrap();
    assert!(!load(&engine, "good").load_stats().from_cache);
    assert!(
        load(&engine, "good").load_stats().from_cache,
        "rewritten after the miss"
    );

    // A file others could have written is never loaded.
    std::fs::set_permissions(cwasm, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert!(!load(&engine, "good").load_stats().from_cache);

    // A directory others can write to is refused as a whole: jitship compiles in memory.
    let open_dir = dir.path().join("open");
    std::fs::create_dir(&open_dir).unwrap();
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let engine = PolicyEngine::with_cache_dir(limits(), Some(&open_dir)).unwrap();
    assert!(
        engine
            .cache_problem()
            .unwrap()
            .contains("writable by group or others")
    );
    assert!(!load(&engine, "good").load_stats().from_cache);
    assert_eq!(std::fs::read_dir(&open_dir).unwrap().count(), 0);
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

#[test]
fn publish_takes_key_and_selection_from_a_wasm_policy_and_a_refused_one_disables_only_its_kind() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("a.json"), b"{\"a\":1}").unwrap();
    std::fs::write(root.join("b.json"), b"{\"tr").unwrap();
    std::fs::write(root.join("c.tmp"), b"x").unwrap();
    std::fs::write(root.join("sub/k.cubin"), b"k").unwrap();
    let config = format!(
        "[store]\nbackend = \"local\"\n[store.local]\npath = {store:?}\n\n\
         [[cache]]\nkind = \"test\"\nroot = {root:?}\npolicy = {good:?}\n\n\
         [[cache]]\nkind = \"past\"\nroot = {root:?}\npolicy = {v1:?}\n\n\
         [facts]\n\"gpu.name\" = \"H100\"\n\"python.version\" = \"3.12.3\"\n\n\
         [policy]\ncache_dir = {cache:?}\n",
        store = dir.path().join("store"),
        good = wasm("good"),
        v1 = wasm("v1"),
        cache = dir.path().join("policy-cache"),
    );
    let config_path = dir.path().join("jitship.toml");
    std::fs::write(&config_path, config).unwrap();
    let out = jitship_tests::cli::jitship()
        .args(["publish", "--json", "--config"])
        .arg(&config_path)
        .env_remove("JITSHIP_CACHES")
        .env_remove("JITSHIP_FACTS")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "one kind failed: {stderr}");
    // The JSON envelope lists the failed kind among the results and its error under errors.
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let past = &doc["results"][1];
    assert_eq!(past["cache_kind"], "past", "{doc}");
    assert_eq!(past["outcome"], "failed", "{doc}");
    assert!(
        past["error"]
            .as_str()
            .unwrap()
            .contains("rebuild it against jitship-policy-sdk 3"),
        "{doc}"
    );
    assert_eq!(doc["errors"][0]["cache_kind"], "past", "{doc}");
    assert_eq!(doc["errors"][0]["stage"], "policy", "{doc}");
    let test = &doc["results"][0];
    assert_eq!(test["cache_kind"], "test");
    assert_eq!(
        test["compat_key"], "test-v1;gpu=H100;py=3.12.3",
        "the key comes from the wasm policy"
    );
    assert_eq!(test["files_selected"], 2, "a.json and sub/k.cubin: {test}");
    assert_eq!(
        test["skipped"]["incomplete"], 1,
        "the policy read b.json through read-file: {test}"
    );
    assert_eq!(test["skipped"]["temporary"], 1);
    assert_eq!(test["skip_details"][0]["path"], "b.json", "{test}");
    assert_eq!(test["skip_details"][0]["detail"], "truncated json");
}

/// `path` relative to `base` (both absolute), through `..` components.
fn pathdiff_for_test(path: &Path, base: &Path) -> PathBuf {
    let p: Vec<_> = path.components().collect();
    let b: Vec<_> = base.components().collect();
    let common = p.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..b.len() {
        out.push("..");
    }
    for c in &p[common..] {
        out.push(c);
    }
    out
}
