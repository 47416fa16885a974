//! What the retention policy decides and what the host keeps whatever it says: the newest and
//! the pinned, and a key decided by the module it was published with (or kept whole).

use super::*;

/// Native rules whose retention drops everything it is shown, or fails (`fail`).
fn greedy(kind: &str, fail: bool) -> std::sync::Arc<dyn jitship::policy::CachePolicy> {
    std::sync::Arc::new(HookedPolicy::new(NativeRules::new(kind), fail).on_retain(
        |_, fail, generations, _, _| {
            if *fail {
                return Err(jitship::policy::PolicyError::Internal("boom".into()));
            }
            Ok(generations
                .iter()
                .map(|g| jitship::policy::RetentionDrop {
                    id: g.id,
                    category: jitship::policy::RetentionCategory::Rule,
                    detail: "drops everything".into(),
                })
                .collect())
        },
    ))
}

#[test]
fn the_host_keeps_the_newest_and_pinned_whatever_the_policy_says() {
    let b = jitship_tests::backends::local("policy", true);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let mut gens = Vec::new();
    for k in 1..=3 {
        triton_tree(&root, k, 8);
        gens.push(publish(&b, &root, "greedy").0);
    }
    catalog::pin(b.store.as_ref(), &b.layout, &gens[0], None).unwrap();
    let opts = GcOptions {
        now: now_secs(),
        grace: Duration::ZERO,
        limits: RetentionLimits::default(),
        dry_run: false,
        lease_wait: GcOptions::DEFAULT_LEASE_WAIT,
        lease_rounds: GcOptions::DEFAULT_LEASE_ROUNDS,
        trust: Default::default(),
    };

    // A failing policy disables retention for its kind: everything stays, the error is reported.
    let failing = |kind: &str| greedy(kind, true);
    let r = gc::collect(b.store.as_ref(), &b.layout, &failing, &opts).unwrap();
    assert_eq!(r.policy_errors.len(), 1, "{r:#?}");
    assert!(r.policy_errors[0].contains("boom"));
    assert!(r.decisions.iter().all(|d| d.verdict == Verdict::Keep));
    assert!(r.heads.is_empty() && r.manifests.is_empty());

    // A policy that drops everything: the newest and the pinned one stay.
    let dropping = |kind: &str| greedy(kind, false);
    let r = gc::collect(b.store.as_ref(), &b.layout, &dropping, &opts).unwrap();
    assert_eq!(verdict(&r, &gens[2]).0, Verdict::Keep);
    assert_eq!(verdict(&r, &gens[0]), (Verdict::Keep, "pinned".into()));
    assert_eq!(verdict(&r, &gens[1]).0, Verdict::Drop);
    assert!(has(&b, &b.layout.generation(&gens[0])) && has(&b, &b.layout.generation(&gens[2])));
    assert!(!has(&b, &b.layout.generation(&gens[1])));
}

/// The example third-party policy (examples/retention-policy: `golden-retention`, kind triton,
/// keeps 5 by default), built as `jitship policy build` builds it.
fn golden_retention_module() -> Vec<u8> {
    use jitship::policy::build::{BuildOptions, build_policy_crate};
    let ws = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf();
    let opts = BuildOptions {
        target_dir: Some(ws.join("target/policy-example")),
        quiet: true,
        locked: true,
    };
    build_policy_crate(&ws.join("examples/retention-policy"), &opts)
        .unwrap_or_else(|e| {
            panic!("building examples/retention-policy: {e} (is wasm32-unknown-unknown installed?)")
        })
        .component
}

/// A key published with a third-party policy is decided by that policy or kept whole: gc never
/// runs another rule on it (the native keep-3 would drop 4 of 7).
#[test]
fn a_key_is_decided_by_the_policy_it_was_published_with_or_kept_whole() {
    use jitship::policy::host::{PolicyConfig, PolicyEngine};

    let b = jitship_tests::backends::local("gc-third-party", false);
    let tmp = tempfile::tempdir().unwrap();
    let module = golden_retention_module();
    let engine = PolicyEngine::new(&PolicyConfig {
        compile_cache: false,
        ..PolicyConfig::default()
    })
    .unwrap();
    let policy = engine.load(&module, "golden-retention.wasm").unwrap();
    let digest = policy.digest().to_owned();
    let mut facts = flow::facts("third-party");
    for (k, v) in [
        ("pkg.triton", "3.9.0"),
        ("gpu.arch", "sm_90"),
        ("driver.major", "550"),
        ("os.arch", "x86_64"),
    ] {
        facts.set(k, v);
    }
    let root = tmp.path().join("root");
    let mut gens = Vec::new();
    for k in 1..=7 {
        triton_tree(&root, k, 9);
        let r = jitship::publish::publish(
            b.store.as_ref(),
            &b.layout,
            &policy,
            &root,
            &flow::options(&facts, PACK),
            None,
        )
        .unwrap();
        let PublishOutcome::Published { generation, .. } = r.outcome else {
            panic!("publish: {:?}", r.outcome)
        };
        gens.push(generation);
    }
    // Publish stored the module by its digest (issue 43); without it, the store alone has no
    // such policy either.
    let stored = b.layout.module(&digest.parse().unwrap());
    assert!(has(&b, &stored));
    b.store.remove(&stored).unwrap();
    let live = |b: &Backend| {
        gens.iter()
            .filter(|g| has(b, &b.layout.generation(g)))
            .count()
    };

    let config = tmp.path().join("jitship.toml");
    std::fs::write(
        &config,
        "[[cache]]\nkind = \"inductor\"\n\n[[cache]]\nkind = \"my-kind\"\npolicy = \"native\"\n\n\
         [policy]\ncompile_cache = false\n",
    )
    .unwrap();
    // Exit 4 where a key was kept whole (not decided by retention), 0 where every key was.
    let gc = |extra: &[&str], code: i32| -> serde_json::Value {
        let out = jitship_tests::cli::jitship()
            .arg("gc")
            .args(b.cli.as_ref().unwrap())
            .args(["--grace", "0s", "--json"])
            .args(extra)
            .env("RUST_LOG", "error")
            .env_remove("JITSHIP_CONFIG")
            .env_remove("JITSHIP_CACHES")
            .env_remove("JITSHIP_POLICY_DIR")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(code),
            "gc {extra:?}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        doc["results"][0].clone()
    };
    let kept_whole = |r: &serde_json::Value| {
        let keys = r["policies"].as_array().unwrap();
        assert_eq!(keys.len(), 1, "{r:#}");
        assert_eq!(keys[0]["published_with"]["name"], "golden-retention");
        assert!(keys[0]["decided_by"].is_null(), "{r:#}");
        let why = keys[0]["kept_whole"].as_str().unwrap().to_owned();
        assert!(
            why.contains("golden-retention@0.1.0") && why.contains("--policy-dir"),
            "{why}"
        );
        assert!(r["manifests"].as_array().unwrap().is_empty(), "{r:#}");
        assert!(r["heads"].as_array().unwrap().is_empty(), "{r:#}");
        assert_eq!(
            r["not_decided"],
            serde_json::json!({"keys": 1, "policy_missing": 1, "policy_failed": 0, "unreadable": 0}),
            "{r:#}"
        );
    };

    // The store alone: gc has no such policy; nothing is dropped and the report says why.
    kept_whole(&gc(&[], 4));
    // The text summary counts the key and says why (issue 43: a cron gc that decided nothing
    // does not report success).
    let out = jitship_tests::cli::jitship()
        .arg("gc")
        .args(b.cli.as_ref().unwrap())
        .args(["--dry-run"])
        .env("RUST_LOG", "error")
        .env_remove("JITSHIP_CONFIG")
        .env_remove("JITSHIP_CACHES")
        .env_remove("JITSHIP_POLICY_DIR")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("NOT DECIDED: 1 keys kept whole, not decided by retention: 1 because the policy they were published with is not here"),
        "{text}"
    );
    assert_eq!(live(&b), 7);
    // A config naming only other caches: the same.
    kept_whole(&gc(&["--config", config.to_str().unwrap()], 4));
    assert_eq!(live(&b), 7);

    // With the module in a modules dir: its rule applies (keeps 5) and the report names it.
    let dir = tmp.path().join("modules");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("golden.wasm"), &module).unwrap();
    std::fs::write(dir.join("junk.wasm"), b"not a module").unwrap();
    let with_dir = [
        "--config",
        config.to_str().unwrap(),
        "--policy-dir",
        dir.to_str().unwrap(),
    ];
    let dry = gc(&[&with_dir[..], &["--dry-run"]].concat(), 0);
    let key = &dry["policies"][0];
    assert_eq!(key["decided_by"]["name"], "golden-retention", "{dry:#}");
    assert_eq!(key["decided_by"]["digest"], digest.as_str());
    assert_eq!(key["decided_by"]["found"]["type"], "modules-dir");
    assert!(key.get("kept_whole").is_none(), "{dry:#}");
    assert_eq!(dry["manifests"].as_array().unwrap().len(), 2, "{dry:#}");
    assert_eq!(live(&b), 7);
    let r = gc(&with_dir, 0);
    assert_eq!(r["manifests"].as_array().unwrap().len(), 2, "{r:#}");
    assert_eq!(live(&b), 5);
    for g in &gens[2..] {
        assert!(has(&b, &b.layout.generation(g)), "{g} dropped");
    }

    // The text report names the policy that decided.
    let out = jitship_tests::cli::jitship()
        .arg("gc")
        .args(b.cli.as_ref().unwrap())
        .args(["--dry-run"])
        .args(with_dir)
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("DECIDED BY")
            && text.contains("golden-retention@0.1.0")
            && text.contains("modules dir"),
        "{text}"
    );
}
