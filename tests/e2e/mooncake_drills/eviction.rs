//! The catalog outlives eviction; scrub puts back the packs eviction took.

use super::*;

/// What one generation's catalog and packs look like in Mooncake alone (the fast tier).
#[derive(Debug)]
struct Held {
    /// Generations the heads in Mooncake name whose manifest Mooncake holds.
    catalog: usize,
    /// Packs of the generation (as the durable tier's manifest names them) Mooncake holds.
    packs: usize,
    of: usize,
}

fn held(fast: &dyn Store, durable_dir: &Path, layout: &KeyLayout) -> Held {
    use jitship::inspect::{ManifestState, survey};
    let trust = jitship::trust::TrustPolicy::default();
    let in_fast = survey(fast, layout, &trust).map_or(0, |s| {
        s.generations()
            .filter(|(_, g)| matches!(g.state, ManifestState::Present(_)))
            .count()
    });
    let durable = LocalStore::open(durable_dir).unwrap();
    let s = survey(&durable, layout, &trust).unwrap();
    let (_, g) = s
        .generations()
        .next()
        .expect("the durable tier holds the generation");
    let m = match jitship::catalog::read_manifest(&durable, layout, &g.id).unwrap() {
        jitship::catalog::ManifestRead::Present(m) => m,
        other => panic!("durable manifest: {other:?}"),
    };
    let packs = m
        .packs
        .iter()
        .filter(|p| fast.exists(&layout.pack(&p.id)).unwrap_or(false))
        .count();
    Held {
        catalog: in_fast,
        packs,
        of: m.packs.len(),
    }
}

/// The catalog outlives eviction. Two caches are published through a durable tier into a small
/// store node (160 MB), one with its catalog unpinned (what a soft pin becomes once its fixed
/// TTL lapses, Mooncake #2909), one with it hard-pinned (`hard_pin_catalog`, the default), then
/// the node is filled past its watermark. Unpinned, the catalog goes with the packs; pinned, the
/// generation is still known in Mooncake, a scrub puts its evicted packs back from the durable
/// tier pack by pack, and an install from Mooncake alone then succeeds. gc can still remove a
/// hard-pinned record.
#[test]
#[ignore = "needs the Mooncake test cluster: tests/cluster/cluster.sh run -- cargo test -p jitship-tests --test e2e -- --ignored mooncake"]
fn mooncake_catalog_outlives_eviction() {
    let _serial = serial();
    let c = cluster("mooncake_catalog_outlives_eviction");
    let _restore = Restore(&c);
    c.ctl(&["kill-node"]);
    c.ctl(&["start-node", "160"]);
    c.ctl(&["wait-node"]);
    let tmp = tempfile::tempdir().unwrap();
    let with = |soft: bool, hard: bool| -> Arc<dyn Store> {
        let mut config = c.config();
        config.call_timeout = Duration::from_secs(10);
        config.staging_buffer_size = bytesize::ByteSize::mib(8);
        config.soft_pin_catalog = soft;
        config.hard_pin_catalog = hard;
        Arc::new(MooncakeStore::connect(&config).unwrap_or_else(|e| panic!("connect: {e}")))
    };
    let unpinned = with(false, false);
    let pinned = with(true, true);
    let mut caches = Vec::new();
    for (name, fast) in [("unpinned", &unpinned), ("pinned", &pinned)] {
        let layout = KeyLayout::new(&unique_prefix(&format!("catalog-{name}"))).unwrap();
        let dir = tmp.path().join(format!("durable-{name}"));
        let src = tmp.path().join(format!("src-{name}"));
        large_files_tree(
            &src,
            3,
            4 * 1024 * 1024,
            if name == "pinned" { 2100 } else { 2000 },
        );
        let facts = flow::facts(&format!("catalog-{name}"));
        flow::publish(tiered(fast, &dir).as_ref(), &layout, &src, &facts, PACK)
            .unwrap_or_else(|e| panic!("publish {name}: {e}"));
        caches.push((name, fast.clone(), layout, dir, src, facts));
    }
    // Fill the node past its high watermark (0.9 of 160 MB) with other caches.
    for i in 0..6u64 {
        let layout = KeyLayout::new(&unique_prefix(&format!("catalog-fill-{i}"))).unwrap();
        let src = tmp.path().join(format!("fill-{i}"));
        large_files_tree(&src, 5, 6 * 1024 * 1024, 2200 + i * 10);
        flow::publish(
            pinned.as_ref(),
            &layout,
            &src,
            &flow::facts(&format!("fill-{i}")),
            PACK,
        )
        .unwrap_or_else(|e| panic!("fill {i}: {e}"));
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
                || l.starts_with("master_total_capacity_bytes")
                || l.starts_with("master_evicted_key_count ")
                || l.starts_with("master_evicted_size_bytes ")
        }) {
            eprintln!("DRILL catalog: {line}");
        }
    }
    let trust = jitship::trust::TrustPolicy::default();
    let mut pinned_evicted = 0;
    for (name, fast, layout, dir, src, facts) in &caches {
        let after = held(fast.as_ref(), dir, layout);
        eprintln!("DRILL catalog {name}: after the fill, Mooncake holds {after:?}");
        let root = tmp.path().join(format!("root-{name}"));
        let alone = flow::install(fast.clone(), layout, &root, facts, INSTALL_DEADLINE);
        eprintln!(
            "DRILL catalog {name}: install from Mooncake alone: {:?}: {}",
            alone.outcome, alone.detail
        );
        let both = tiered(fast, dir);
        let t = Instant::now();
        let scrub = jitship::scrub::scrub(both.as_ref(), layout, &trust, 1000, true)
            .unwrap_or_else(|e| panic!("scrub {name}: {e}"));
        eprintln!(
            "DRILL catalog {name}: scrub in {:.1?}: checked {} of {} packs, {} missing, {} corrupt, {} repaired",
            t.elapsed(),
            scrub.checked,
            scrub.packs,
            scrub.missing,
            scrub.corrupt,
            scrub.repaired
        );
        let repaired = held(fast.as_ref(), dir, layout);
        eprintln!("DRILL catalog {name}: after the scrub, Mooncake holds {repaired:?}");
        let root = tmp.path().join(format!("root-{name}-after"));
        let report = flow::install(fast.clone(), layout, &root, facts, INSTALL_DEADLINE);
        eprintln!(
            "DRILL catalog {name}: install from Mooncake alone after the scrub: {:?}: {}",
            report.outcome, report.detail
        );
        if *name == "pinned" {
            assert_eq!(after.catalog, 1, "the hard-pinned catalog was evicted");
            pinned_evicted = after.of - after.packs;
            assert_eq!(scrub.missing as usize, pinned_evicted, "{scrub:?}");
            assert_eq!(scrub.repaired, scrub.missing, "{scrub:?}");
            assert_eq!(repaired.packs, repaired.of);
            assert_eq!(
                report.outcome,
                InstallOutcome::Installed,
                "{}",
                report.detail
            );
            assert_eq!(digest(&root), digest(src));
            // Only gc removes it: a hard-pinned record can be removed.
            let key = format!("{}/hard-pinned-probe", layout.namespace());
            fast.put(&key, b"record", jitship::store::ValueClass::Record)
                .unwrap();
            assert!(
                fast.remove(&key).unwrap(),
                "a hard-pinned record is removed"
            );
        }
    }
    assert!(
        pinned_evicted > 0,
        "no pack of the pinned cache was evicted: the drill drilled nothing"
    );
}
