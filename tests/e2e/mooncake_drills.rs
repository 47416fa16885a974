//! Fault drills against a real Mooncake cluster: the master killed, the store node killed, the
//! master restarted (every key lost), and the store filled past its watermark so older objects are
//! evicted. They break the cluster on purpose, so they run one after the other in one test, and
//! a guard restores the cluster (`cluster.sh restore`) when they end, also when one fails.
//!
//! The master-restart and eviction drills also run a durable tier (`TieredStore` over a local
//! directory): what the fast tier lost is installed from the durable tier, put back, and the next
//! install is served by Mooncake again. They run the durable registry tier too (a real
//! docker-registry on the namespace's loopback): the generation the fast tier lost is pulled from
//! the registry, verified, put back, and the next install is Mooncake's alone.
//!
//! What each drill shows is printed (`DRILL ...` lines) as well as asserted.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jitship::catalog::CatalogError;
use jitship::catalog::KeyLayout;
use jitship::install::InstallOutcome;
use jitship::publish::{PublishError, PublishOutcome};
use jitship::store::{LocalStore, MooncakeStore, Store, StoreError, TieredStore, ValueClass};
use jitship_tests::fixtures::{TreeDigest, digest, large_files_tree, triton_tree};
use jitship_tests::mooncake::{Cluster, cluster, flow, unique_prefix};
use jitship_tests::registry::TestRegistry;

/// How long a failing publish or install may take with the master or node gone. Mooncake blocks
/// each call about 4 s on a dead master before answering RPC_FAIL; call_timeout bounds the rest.
const FAIL_FAST: Duration = Duration::from_secs(25);
const PACK: u64 = 4 * 1024 * 1024;
const INSTALL_DEADLINE: Duration = Duration::from_secs(60);

/// The drills break the one cluster of a run: the tests here take this first, so they run one
/// after the other even when the harness runs tests side by side.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct Restore<'a>(&'a Cluster);

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        // Put the cluster back for the tests that follow, whatever happened.
        let _ = std::process::Command::new("bash")
            .arg(&self.0.ctl)
            .arg("restore")
            .status();
    }
}

/// `fast` over a durable tier in `dir`.
fn tiered(fast: &Arc<dyn Store>, dir: &Path) -> Arc<dyn Store> {
    let durable: Arc<dyn Store> = Arc::new(LocalStore::open(dir).unwrap());
    Arc::new(TieredStore::new(fast.clone(), durable))
}

/// Installs `facts`' generation through `store` (a tiered one) into `root`: it must be installed
/// byte for byte as `src`, and the tiers must have served it as `expect` says.
fn install_tiered(
    what: &str,
    store: &Arc<dyn Store>,
    layout: &KeyLayout,
    root: &Path,
    facts: &jitship::facts::Facts,
    src_digest: &TreeDigest,
) -> jitship::store::TierStats {
    let report = flow::install(store.clone(), layout, root, facts, INSTALL_DEADLINE);
    assert_eq!(
        report.outcome,
        InstallOutcome::Installed,
        "{what}: {}",
        report.detail
    );
    assert_eq!(&digest(root), src_digest, "{what}: not the published tree");
    let tiers = report.tiers.expect("a tiered store reports its tiers");
    eprintln!("DRILL {what}: installed; tiers {tiers:?}");
    tiers
}

/// Installs `facts`' generation from `store` with the durable registry tier `registry`: it
/// must be served by the registry, installed byte for byte, and what it read put back into
/// Mooncake (the report's tiers). Then the next install, without the registry: true when it was
/// Mooncake's alone (under eviction pressure what was put back may be evicted again).
fn install_from_registry(
    what: &str,
    store: &Arc<dyn Store>,
    layout: &KeyLayout,
    roots: &Path,
    facts: &jitship::facts::Facts,
    src_digest: &TreeDigest,
    registry: &Arc<jitship::oci::Registry>,
) -> bool {
    let report = flow::install_with_registry(
        store.clone(),
        layout,
        &roots.join("registry-1"),
        facts,
        INSTALL_DEADLINE,
        Some(registry.clone()),
    );
    let pull = report.registry.as_ref().expect("the registry was asked");
    eprintln!(
        "DRILL {what}: {:?} ({}); registry {} served {:?} in {} ms{}; tiers {:?}",
        report.outcome,
        report.detail,
        pull.registry,
        pull.tag,
        pull.duration_ms,
        pull.error
            .as_ref()
            .map_or(String::new(), |e| format!(": {e}")),
        report.tiers
    );
    assert_eq!(
        report.outcome,
        InstallOutcome::Installed,
        "{what}: {}",
        report.detail
    );
    assert!(pull.served.is_some(), "{what}: served by the registry");
    let tiers = report
        .tiers
        .expect("read through the registry's scratch store");
    assert!(
        tiers.durable_hits > 0 && tiers.repaired > 0,
        "{what}: what the registry served is put back into Mooncake: {tiers:?}"
    );
    assert_eq!(&digest(&roots.join("registry-1")), src_digest, "{what}");
    let next = flow::install(
        store.clone(),
        layout,
        &roots.join("registry-2"),
        facts,
        INSTALL_DEADLINE,
    );
    eprintln!(
        "DRILL {what}, next pod without the registry: {:?}: {}",
        next.outcome, next.detail
    );
    if next.outcome != InstallOutcome::Installed {
        assert!(
            !roots.join("registry-2").exists(),
            "{what}: a miss created the root"
        );
        return false;
    }
    assert_eq!(&digest(&roots.join("registry-2")), src_digest, "{what}");
    true
}

fn connect(c: &Cluster) -> Arc<dyn Store> {
    let mut config = c.config();
    config.call_timeout = Duration::from_secs(10);
    // These drills check how a failure is reported; trying again is
    // `mooncake_a_put_while_the_master_restarts_is_tried_again_until_it_succeeds`'s.
    config.retry_for = Duration::from_secs(2);
    config.staging_buffer_size = bytesize::ByteSize::mib(8);
    Arc::new(MooncakeStore::connect(&config).unwrap_or_else(|e| panic!("connect: {e}")))
}

/// The store error under a publish error, if it is one.
fn store_error(e: &PublishError) -> Option<&StoreError> {
    match e {
        PublishError::Store(s) | PublishError::Catalog(CatalogError::Store(s)) => Some(s),
        _ => None,
    }
}

fn expect_fast_typed_publish_failure(
    drill: &str,
    store: &dyn Store,
    layout: &KeyLayout,
    src: &Path,
    facts: &jitship::facts::Facts,
) {
    let t = Instant::now();
    let r = flow::publish(store, layout, src, facts, PACK);
    let took = t.elapsed();
    let err = match r {
        Ok(report) => panic!(
            "{drill}: publish succeeded with the cluster broken: {:?}",
            report.outcome
        ),
        Err(e) => e,
    };
    eprintln!("DRILL {drill}: publish failed in {took:.1?}: {err}");
    let typed = store_error(&err).unwrap_or_else(|| panic!("{drill}: not a store error: {err}"));
    assert!(
        typed.is_transient() || matches!(typed, StoreError::NoSpace(_)),
        "{drill}: untyped failure {typed:?}"
    );
    assert!(took < FAIL_FAST, "{drill}: publish took {took:?}");
}

/// Install into `root` (which holds files) must fail or miss quickly and leave it as it was.
fn expect_install_leaves_root_alone(
    drill: &str,
    store: Arc<dyn Store>,
    layout: &KeyLayout,
    root: &Path,
    facts: &jitship::facts::Facts,
) {
    let before = digest(root);
    let t = Instant::now();
    let report = flow::install(store, layout, root, facts, INSTALL_DEADLINE);
    let took = t.elapsed();
    eprintln!(
        "DRILL {drill}: install -> {:?} in {took:.1?}: {}",
        report.outcome, report.detail
    );
    assert!(
        matches!(
            report.outcome,
            InstallOutcome::Failed | InstallOutcome::Miss
        ),
        "{drill}: {:?} {}",
        report.outcome,
        report.detail
    );
    assert!(took < FAIL_FAST, "{drill}: install took {took:?}");
    assert_eq!(digest(root), before, "{drill}: the root changed");
    assert!(report.files_installed == 0);
}

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

/// `jitship watch` started while the master is down does not exit (it used to exit 1, "store
/// master unavailable", and crash-loop): it watches, says on its log that the store does not
/// answer, and publishes once the master is up.
#[test]
#[ignore = "needs the Mooncake test cluster: tests/cluster/cluster.sh run -- cargo test -p jitship-tests --test e2e -- --ignored mooncake"]
fn mooncake_watch_started_before_the_master_publishes_once_it_is_up() {
    use std::process::Stdio;
    let _serial = serial();
    let c = cluster("mooncake_watch_started_before_the_master_publishes_once_it_is_up");
    let _restore = Restore(&c);
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("jitship.toml");
    c.write_cli_config(&config);
    let src = tmp.path().join("src");
    triton_tree(&src, 10, 41);
    c.ctl(&["kill-master"]);
    let log = tmp.path().join("watch.log");
    let mut child = jitship_tests::cli::jitship()
        .env_remove("RUST_LOG")
        .arg("watch")
        .arg("--config")
        .arg(&config)
        .args(["--namespace", &unique_prefix("watch-waits")])
        .args(["--fact", "model.id=watch-waits", "--cache"])
        .arg(format!("kernels:native={}", src.display()))
        .args([
            "--settle",
            "200ms",
            "--min-interval",
            "0s",
            "--rescan-interval",
            "60s",
            "-v",
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let dir = log
        .parent()
        .expect("the log is in the test's directory")
        .to_owned();
    let mut wait_log = |needle: &str, within: Duration| -> Duration {
        let t = Instant::now();
        let logged = || std::fs::read_to_string(&log).unwrap_or_default();
        let mut exited = None;
        let seen = jitship_tests::child::wait_for_change(&dir, within, || {
            exited = child.try_wait().unwrap();
            logged().contains(needle) || exited.is_some()
        });
        if let Some(status) = exited.filter(|_| !logged().contains(needle)) {
            panic!("watch exited ({status}) before {needle:?}:\n{}", logged());
        }
        assert!(
            seen,
            "{needle:?} not logged within {within:?}:\n{}",
            logged()
        );
        t.elapsed()
    };
    wait_log("the store does not answer: watching the caches", FAIL_FAST);
    wait_log("store_unreachable=true", FAIL_FAST);
    c.ctl(&["start-master"]);
    c.ctl(&["wait-node"]);
    // The retry backoff is capped at 30 s while the store does not answer.
    let took = wait_log("published a new generation", Duration::from_secs(90));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains("the store answers: publishing"), "{text}");
    eprintln!("DRILL watch-before-master: published {took:.1?} after the master and node were up");
    // SAFETY: kill(2) on our own child, still running (wait_log checked).
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(0), "watch:\n{text}");
}

/// A master restarted under a client: the client's calls fail (RPC_FAIL) until it reconnects.
/// Without a durable tier a call is tried again within `retry_for`, so a put made while the
/// master was down succeeds once it is back, and reads back.
#[test]
#[ignore = "needs a Mooncake cluster (tests/cluster/cluster.sh run)"]
fn mooncake_a_put_while_the_master_restarts_is_tried_again_until_it_succeeds() {
    let _serial = serial();
    let c = cluster("mooncake_a_put_while_the_master_restarts");
    let mut config = c.config();
    config.call_timeout = Duration::from_secs(10);
    config.staging_buffer_size = bytesize::ByteSize::mib(8);
    config.retry_for = Duration::from_secs(90);
    let store =
        Arc::new(MooncakeStore::connect(&config).unwrap_or_else(|e| panic!("connect: {e}")));
    let key = format!("{}/retried", unique_prefix("retry"));
    // A client that has worked already: its staging buffer is registered (registering one needs
    // the master's metadata server, and fails with INVALID_PARAMS while it is down).
    store
        .put(&format!("{key}-before"), b"before", ValueClass::Bulk)
        .unwrap();
    c.ctl(&["kill-master"]);
    let t = Instant::now();
    let writer = {
        let (store, key) = (store.clone(), key.clone());
        std::thread::spawn(move || store.put(&key, b"written across a restart", ValueClass::Bulk))
    };
    // The master comes back only once the put has failed and waits to try again.
    while store.retries() == 0 {
        if writer.is_finished() {
            c.ctl(&["start-master"]);
            c.ctl(&["wait-node"]);
            panic!("the put ended before any retry: {:?}", writer.join().unwrap());
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the put never retried"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    c.ctl(&["start-master"]);
    c.ctl(&["wait-node"]);
    let put = writer.join().unwrap();
    eprintln!(
        "DRILL retry: a put begun with the master down succeeded {:.1?} later, after {} retries",
        t.elapsed(),
        store.retries()
    );
    put.unwrap_or_else(|e| panic!("the put across the restart: {e}"));
    assert_eq!(
        store.get(&key).unwrap().as_deref(),
        Some(&b"written across a restart"[..])
    );
}

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

/// `watch`'s periodic scrub on Mooncake with a durable tier: a pack removed from Mooncake behind
/// jitship's back is found by the first scrub, put back from the durable tier, and counted in the
/// `jitship_store_scrub_*` metrics.
#[test]
#[ignore = "needs the Mooncake test cluster: tests/cluster/cluster.sh run -- cargo test -p jitship-tests --test e2e -- --ignored mooncake"]
fn mooncake_watch_scrub_repairs_a_pack_removed_behind_its_back() {
    use std::io::{Read, Write};
    use std::process::Stdio;
    let _serial = serial();
    let c = cluster("mooncake_watch_scrub_repairs_a_pack_removed_behind_its_back");
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("jitship.toml");
    c.write_cli_config(&config);
    let namespace = unique_prefix("watch-scrub");
    let durable = tmp.path().join("durable");
    let durable_flag = format!("local:{}", durable.display());
    let src = tmp.path().join("src");
    triton_tree(&src, 10, 51);
    let cli = |command: &str, root: &Path| {
        let mut cmd = jitship_tests::cli::jitship();
        cmd.env_remove("RUST_LOG")
            .arg(command)
            .arg("--config")
            .arg(&config)
            .args(["--namespace", &namespace, "--durable-store", &durable_flag])
            .args(["--fact", "model.id=watch-scrub", "--cache"])
            .arg(format!("kernels:native={}", root.display()));
        cmd
    };
    let out = cli("publish", &src).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let name = std::fs::read_dir(durable.join(&namespace).join("pack"))
        .unwrap()
        .next()
        .expect("the durable tier holds a pack")
        .unwrap()
        .file_name();
    let key = format!("{namespace}/pack/{}", name.to_string_lossy());
    // Behind jitship's back. The publish's own read of it may still hold a lease (10 s).
    let store = connect(&c);
    let t = Instant::now();
    loop {
        match store.remove(&key) {
            Ok(true) => break,
            Err(StoreError::Leased(_)) if t.elapsed() < FAIL_FAST => {
                std::thread::sleep(Duration::from_millis(200))
            }
            other => panic!("removing {key}: {other:?}"),
        }
    }
    assert!(!store.exists(&key).unwrap());
    drop(store);
    let idle = tmp.path().join("idle");
    std::fs::create_dir_all(&idle).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = tmp.path().join("watch.log");
    let mut child = cli("watch", &idle)
        .args(["--settle", "200ms", "--rescan-interval", "60s", "-v"])
        .args(["--scrub-interval", "1h", "--scrub-sample", "1000"])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let metrics = || -> String {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return String::new();
        };
        let _ = write!(
            s,
            "GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        );
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        text
    };
    let want = [
        "\njitship_store_scrub_runs_total 1\n",
        "\njitship_store_scrub_missing_total 1\n",
        "\njitship_store_scrub_repaired_total 1\n",
        "\njitship_store_scrub_last_unrepaired 0\n",
    ];
    let t = Instant::now();
    let body = loop {
        let body = metrics();
        if want.iter().all(|w| body.contains(w)) {
            break body;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "watch exited ({status}):\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{want:?} not in the metrics:\n{body}\nlog:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let line = |name: &str| {
        body.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or("")
            .to_owned()
    };
    eprintln!(
        "DRILL watch scrub: {}; {}; {}; {}",
        line("jitship_store_scrub_checked_total"),
        line("jitship_store_scrub_missing_total"),
        line("jitship_store_scrub_repaired_total"),
        line("jitship_store_scrub_last_unrepaired")
    );

    // Stopped as a pod is. This test process loaded Mooncake's library, so the watcher started
    // with the stop signals blocked: it stops cleanly only because it clears that mask
    // (`interrupt::clear_inherited_signal_mask`); before, the library's signal thread took SIGTERM
    // and the watcher died of it without its final publish.
    // SAFETY: kill(2) on our own child, still running (the loop above checked).
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(0), "watch:\n{text}");
    assert!(text.contains("jitship watch stopped"), "watch:\n{text}");
    assert!(
        connect(&c).exists(&key).unwrap(),
        "the pack is back in Mooncake"
    );
}
