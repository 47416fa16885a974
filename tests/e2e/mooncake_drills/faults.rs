//! The master killed, the store node killed, the master restarted (every key lost) and the store filled past its watermark, with the directory and registry durable tiers behind it.

use super::*;

#[test]
#[ignore = "needs the Mooncake test cluster: tests/cluster/cluster.sh run -- cargo test -p jitship-tests --test e2e -- --ignored mooncake"]
fn mooncake_fault_drills() {
    let _serial = serial();
    let c = cluster("mooncake_fault_drills");
    let _restore = Restore(&c);
    let tmp = tempfile::tempdir().unwrap();
    let layout = KeyLayout::new(&unique_prefix("drills")).unwrap();
    let facts = flow::facts("drills");
    let src = tmp.path().join("src");
    triton_tree(&src, 40, 11);
    let store = connect(&c);
    flow::publish(store.as_ref(), &layout, &src, &facts, PACK)
        .unwrap_or_else(|e| panic!("publish: {e}"));
    // A worker root holding an installed generation and a file of its own.
    let root = tmp.path().join("root");
    let r = flow::install(store.clone(), &layout, &root, &facts, INSTALL_DEADLINE);
    assert_eq!(r.outcome, InstallOutcome::Installed, "{}", r.detail);
    std::fs::write(root.join("local-only"), b"not from the store").unwrap();
    // The next publish has something new to upload.
    triton_tree(&src.join("grown"), 5, 12);
    // The same tree through a durable tier too, under its own prefix.
    let durable_layout = KeyLayout::new(&unique_prefix("durable")).unwrap();
    let durable_dir = tmp.path().join("durable");
    let durable_src = tmp.path().join("durable-src");
    triton_tree(&durable_src, 20, 21);
    let durable_digest = digest(&durable_src);
    let with_durable = tiered(&store, &durable_dir);
    flow::publish(
        with_durable.as_ref(),
        &durable_layout,
        &durable_src,
        &facts,
        PACK,
    )
    .unwrap_or_else(|e| panic!("publish through the durable tier: {e}"));
    // A durable tier added to a Mooncake store that already holds the generation: nothing is
    // uploaded (Mooncake has every pack), and still every pack lands in the durable tier before
    // a head there names it.
    let late = late_durable_tier(&store, tmp.path(), &facts);
    // And through the durable registry tier, under a prefix of its own.
    let test_registry = TestRegistry::start();
    let registry = test_registry.client();
    let registry_layout = KeyLayout::new(&unique_prefix("registry")).unwrap();
    let registry_src = tmp.path().join("registry-src");
    triton_tree(&registry_src, 20, 31);
    let registry_digest = digest(&registry_src);
    let pushed = flow::publish_to_registry(
        store.as_ref(),
        &registry_layout,
        &registry_src,
        &facts,
        PACK,
        &registry,
    )
    .unwrap_or_else(|e| panic!("publish with the registry tier: {e}"));
    let push = pushed.registry.expect("pushed");
    assert!(push.error.is_none(), "{:?}", push.error);

    // 1. Master killed.
    c.ctl(&["kill-master"]);
    expect_fast_typed_publish_failure("master-killed", store.as_ref(), &layout, &src, &facts);
    expect_install_leaves_root_alone("master-killed", store.clone(), &layout, &root, &facts);
    let t = Instant::now();
    let err = MooncakeStore::connect(&c.config()).unwrap_err();
    eprintln!(
        "DRILL master-killed: a new client fails in {:.1?}: {err}",
        t.elapsed()
    );
    assert!(
        matches!(err, StoreError::MasterDown(_)) && t.elapsed() < Duration::from_secs(5),
        "{err}"
    );

    // 2. Master restarted: every key is lost. The long-lived client reconnects by itself.
    c.ctl(&["start-master"]);
    c.ctl(&["wait-node"]);
    let t = Instant::now();
    while store
        .exists(&format!("{}/probe", layout.namespace()))
        .is_err()
    {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the client did not reconnect to the restarted master"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "DRILL master-restarted: the client answered again after {:.1?}",
        t.elapsed()
    );
    let fresh = tmp.path().join("fresh");
    let report = flow::install(store.clone(), &layout, &fresh, &facts, INSTALL_DEADLINE);
    eprintln!(
        "DRILL master-restarted: install -> {:?}: {}",
        report.outcome, report.detail
    );
    assert_eq!(report.outcome, InstallOutcome::Miss, "{}", report.detail);
    assert!(!fresh.exists(), "a miss must not create the root");
    // With the durable tier, the restart loses nothing: installed from it, put back, and the next
    // install is Mooncake's again.
    let served = install_tiered(
        "master-restarted durable",
        &with_durable,
        &durable_layout,
        &tmp.path().join("durable-root-1"),
        &facts,
        &durable_digest,
    );
    assert!(
        served.durable_hits > 0 && served.repaired == served.durable_hits,
        "everything the restart lost comes from the durable tier and is put back: {served:?}"
    );
    let served = install_tiered(
        "master-restarted durable, next pod",
        &with_durable,
        &durable_layout,
        &tmp.path().join("durable-root-2"),
        &facts,
        &durable_digest,
    );
    assert_eq!(
        (served.durable_hits, served.fast_hits > 0),
        (0, true),
        "read-repair: the next install is served by Mooncake alone: {served:?}"
    );
    // Each tier on its own (`verify`'s check): Mooncake lost the generation, the durable tier
    // added late holds it whole.
    let (fast_tier, durable_tier) = late.store.tiers().expect("two tiers");
    let check = |tier, store, heads: &[u64]| {
        jitship::inspect::tiers::check_tier(tier, store, &late.layout, &late.generation, heads)
            .unwrap_or_else(|e| panic!("verify {tier}: {e}"))
    };
    use jitship::inspect::tiers::Tier;
    let fast_check = check(Tier::Fast, fast_tier, &[]);
    let durable_check = check(Tier::Durable, durable_tier, &[2]);
    eprintln!(
        "DRILL master-restarted, durable tier added late: fast tier ok {} ({:?}), durable tier ok {} \
         ({} files, {} packs)",
        fast_check.ok,
        fast_check.problems,
        durable_check.ok,
        durable_check.files_checked,
        durable_check.packs_fetched
    );
    assert!(
        !fast_check.ok && durable_check.ok,
        "{fast_check:?} {durable_check:?}"
    );
    // The durable tier added late serves the generation the restart lost.
    let served = install_tiered(
        "master-restarted, durable tier added to a store that held the generation",
        &late.store,
        &late.layout,
        &tmp.path().join("late-durable-root"),
        &facts,
        &late.digest,
    );
    assert!(
        served.durable_hits > 0,
        "served by the durable tier added late: {served:?}"
    );
    // The registry tier: the generation the restart lost is pulled, verified and put back.
    assert!(
        install_from_registry(
            "master-restarted registry",
            &store,
            &registry_layout,
            &tmp.path().join("registry-restart"),
            &facts,
            &registry_digest,
            &registry,
        ),
        "read-repair: the next install after the restart is Mooncake's alone"
    );
    // And the repaired values are in Mooncake itself, for clients without the durable tier.
    let plain = flow::install(
        store.clone(),
        &durable_layout,
        &tmp.path().join("durable-root-3"),
        &facts,
        INSTALL_DEADLINE,
    );
    assert_eq!(
        plain.outcome,
        InstallOutcome::Installed,
        "repaired values serve a client without the durable tier: {}",
        plain.detail
    );
    let again = flow::publish(store.as_ref(), &layout, &src, &facts, PACK)
        .unwrap_or_else(|e| panic!("republish: {e}"));
    eprintln!(
        "DRILL master-restarted: publish -> {:?}, {} bytes uploaded",
        again.outcome, again.bytes_uploaded
    );
    assert!(
        matches!(again.outcome, PublishOutcome::Published { seq: 1, .. }),
        "{:?}",
        again.outcome
    );
    assert_eq!(
        again.packs_reused, 0,
        "nothing survived the restart, everything is uploaded again"
    );
    let report = flow::install(store.clone(), &layout, &fresh, &facts, INSTALL_DEADLINE);
    assert_eq!(
        report.outcome,
        InstallOutcome::Installed,
        "{}",
        report.detail
    );
    assert_eq!(digest(&fresh), digest(&src));

    // 3. Store node killed.
    triton_tree(&src.join("grown-again"), 5, 13);
    c.ctl(&["kill-node"]);
    expect_fast_typed_publish_failure("node-killed", store.as_ref(), &layout, &src, &facts);
    expect_install_leaves_root_alone("node-killed", store.clone(), &layout, &root, &facts);
    drop(store);

    // 4. Eviction: a small node, filled past its high watermark (0.9).
    c.ctl(&["start-node", "160"]);
    c.ctl(&["wait-node"]);
    eviction_drill(&c, tmp.path(), &registry);
}

/// A cache published to Mooncake alone, then through a durable tier added afterwards.
struct LateDurable {
    store: Arc<dyn Store>,
    layout: KeyLayout,
    digest: TreeDigest,
    generation: jitship::generation::GenerationId,
}

/// Publishes a tree to `store` (Mooncake alone), then again through a durable tier added in
/// `dir`: no pack is uploaded (Mooncake holds them all), and the durable tier gets every pack of
/// the generation its head names (the hole of issue 44: before, it got the head and manifest
/// only, and the install after a master restart missed).
fn late_durable_tier(
    store: &Arc<dyn Store>,
    dir: &Path,
    facts: &jitship::facts::Facts,
) -> LateDurable {
    let layout = KeyLayout::new(&unique_prefix("late-durable")).unwrap();
    let src = dir.join("late-src");
    triton_tree(&src, 20, 41);
    let first = flow::publish(store.as_ref(), &layout, &src, facts, PACK)
        .unwrap_or_else(|e| panic!("publish to Mooncake alone: {e}"));
    let tiered = tiered(store, &dir.join("late-durable"));
    let again = flow::publish(tiered.as_ref(), &layout, &src, facts, PACK)
        .unwrap_or_else(|e| panic!("publish with the durable tier added: {e}"));
    eprintln!(
        "DRILL durable tier added late: {} packs on Mooncake; with the durable tier -> {:?}, {} \
         uploaded, {} reused",
        first.packs_uploaded, again.outcome, again.packs_uploaded, again.packs_reused
    );
    let PublishOutcome::Published { generation, seq: 2 } = again.outcome else {
        panic!("a generation above Mooncake's head: {:?}", again.outcome);
    };
    assert_eq!(again.packs_uploaded, 0, "Mooncake held every pack");
    let packs = jitship_tests::fixtures::files_under(&dir.join("late-durable"))
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("/pack/"))
        .count();
    assert_eq!(
        packs as u64, first.packs_uploaded,
        "every pack is in the durable tier"
    );
    LateDurable {
        store: tiered,
        layout,
        digest: digest(&src),
        generation,
    }
}

/// Publishes several caches of ~30 MB each into a 160 MB segment, each pushed to the durable
/// registry tier too. Each install must then be either a complete generation, byte for byte one
/// that was published, or a miss with the root not created, which the registry tier then serves
/// and puts back; and at least one generation must have lost objects (or the drill drilled
/// nothing).
fn eviction_drill(c: &Cluster, dir: &Path, registry: &Arc<jitship::oci::Registry>) {
    let store = connect(c);
    let layout = KeyLayout::new(&unique_prefix("evict")).unwrap();
    // First in, so first evicted: a cache published through a durable tier.
    let durable_layout = KeyLayout::new(&unique_prefix("evict-durable")).unwrap();
    let with_durable = tiered(&store, &dir.join("evict-durable"));
    let durable_facts = flow::facts("evict-durable");
    let durable_src = dir.join("evict-durable-src");
    large_files_tree(&durable_src, 5, 6 * 1024 * 1024, 900);
    let durable_digest = digest(&durable_src);
    flow::publish(
        with_durable.as_ref(),
        &durable_layout,
        &durable_src,
        &durable_facts,
        PACK,
    )
    .unwrap_or_else(|e| panic!("publish through the durable tier: {e}"));
    // Cache 0 gets two generations: a small one, then a big one on top (fallback candidate).
    let mut published: Vec<(jitship::facts::Facts, bool, Vec<TreeDigest>)> = Vec::new();
    for i in 0..6u64 {
        let facts = flow::facts(&format!("evict-{i}"));
        let src = dir.join(format!("evict-src-{i}"));
        let mut states = Vec::new();
        if i == 0 {
            triton_tree(&src, 10, 100);
            flow::publish_to_registry(store.as_ref(), &layout, &src, &facts, PACK, registry)
                .unwrap_or_else(|e| panic!("publish {i}: {e}"));
            states.push(digest(&src));
        }
        large_files_tree(&src, 5, 6 * 1024 * 1024, 1000 + i * 10);
        let r = flow::publish_to_registry(store.as_ref(), &layout, &src, &facts, PACK, registry)
            .unwrap_or_else(|e| panic!("publish {i}: {e}"));
        let push = r.registry.as_ref().expect("pushed");
        assert!(
            push.error.is_none(),
            "cache {i}: push failed: {:?}",
            push.error
        );
        // The push reads the generation back from Mooncake: under this much pressure its packs
        // can be evicted first, and then there is nothing whole to push (said so, not an error).
        let pushed = push.generation.as_ref().is_some_and(|g| {
            g.generation
                == match r.outcome {
                    PublishOutcome::Published { generation, .. } => generation,
                    _ => panic!("cache {i}: {:?}", r.outcome),
                }
        });
        eprintln!(
            "DRILL eviction: cache {i}: pushed to the registry: {:?}",
            push.generation.as_ref().map(|g| &g.outcome)
        );
        states.push(digest(&src));
        eprintln!(
            "DRILL eviction: cache {i}: {:?}, {} bytes uploaded",
            r.outcome, r.bytes_uploaded
        );
        published.push((facts, pushed, states));
    }
    if let Ok(m) = std::process::Command::new("bash")
        .arg(&c.ctl)
        .arg("metrics")
        .output()
    {
        let text = String::from_utf8_lossy(&m.stdout);
        for line in text.lines().filter(|l| {
            l.starts_with("master_key_count")
                || l.starts_with("master_allocated_bytes")
                || l.starts_with("master_soft_pin_key_count")
        }) {
            eprintln!("DRILL eviction: {line}");
        }
    }
    let mut misses = 0;
    let mut installs = 0;
    let mut served_by_registry = 0;
    let mut repaired_for_next = 0;
    for (i, (facts, pushed, states)) in published.iter().enumerate() {
        let root = dir.join(format!("evict-root-{i}"));
        let report = flow::install(store.clone(), &layout, &root, facts, INSTALL_DEADLINE);
        match report.outcome {
            InstallOutcome::Installed => {
                let got = digest(&root);
                let which = states.iter().position(|s| *s == got);
                eprintln!(
                    "DRILL eviction: cache {i}: installed generation state {which:?} of {} ({})",
                    states.len(),
                    report.detail
                );
                assert!(
                    which.is_some(),
                    "cache {i}: installed a tree that was never published (partial?)"
                );
                installs += 1;
            }
            InstallOutcome::Miss | InstallOutcome::Failed => {
                eprintln!(
                    "DRILL eviction: cache {i}: {:?}: {}",
                    report.outcome, report.detail
                );
                assert!(!root.exists(), "cache {i}: a miss must not create the root");
                // Head records and manifests are soft-pinned (soft_pin_catalog): eviction takes
                // packs, so the head is still found and the generation is known to be incomplete.
                assert!(
                    report.detail.contains("incomplete"),
                    "cache {i}: the head itself was evicted: {}",
                    report.detail
                );
                misses += 1;
                if !pushed {
                    eprintln!(
                        "DRILL eviction: cache {i}: not in the registry (evicted before its push \
                         read it back)"
                    );
                    continue;
                }
                // The registry tier serves what eviction took, and puts it back.
                served_by_registry += 1;
                if install_from_registry(
                    &format!("eviction cache {i} registry"),
                    &store,
                    &layout,
                    &dir.join(format!("evict-registry-{i}")),
                    facts,
                    states.last().expect("published"),
                    registry,
                ) {
                    repaired_for_next += 1;
                }
            }
            InstallOutcome::AlreadyCurrent => panic!("cache {i}: already current in a fresh root"),
            InstallOutcome::Conflict => {
                panic!("cache {i}: conflicts in a fresh root: {}", report.detail)
            }
            InstallOutcome::Untrusted => {
                panic!("cache {i}: untrusted with trust off: {}", report.detail)
            }
            InstallOutcome::Deadline => panic!("cache {i}: {}", report.detail),
        }
    }
    eprintln!("DRILL eviction: {installs} installed, {misses} missed");
    // The durable cache: Mooncake alone lost it (it went in first), the tiered store installs it.
    let plain = flow::install(
        store.clone(),
        &durable_layout,
        &dir.join("evict-durable-plain"),
        &durable_facts,
        INSTALL_DEADLINE,
    );
    eprintln!(
        "DRILL eviction durable: Mooncake alone -> {:?}: {}",
        plain.outcome, plain.detail
    );
    assert_ne!(
        plain.outcome,
        InstallOutcome::Installed,
        "the first cache in was not evicted: the drill drilled nothing for the durable tier"
    );
    let served = install_tiered(
        "eviction durable",
        &with_durable,
        &durable_layout,
        &dir.join("evict-durable-root"),
        &durable_facts,
        &durable_digest,
    );
    assert!(served.durable_hits > 0, "{served:?}");
    assert!(
        misses >= 1,
        "nothing was evicted: the drill did not fill the store past its watermark"
    );
    assert!(
        served_by_registry >= 1,
        "no evicted cache had been pushed: the drill drilled nothing for the registry tier"
    );
    eprintln!(
        "DRILL eviction registry: {served_by_registry} evicted caches served by the registry; \
         {repaired_for_next} of them installed by the next pod from Mooncake alone"
    );
    assert!(
        repaired_for_next >= 1,
        "read-repair never held: every cache the registry put back was evicted again"
    );
    assert!(installs >= 1, "even the newest cache was lost");
}
