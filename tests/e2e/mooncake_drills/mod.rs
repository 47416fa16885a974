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
//!
//! By what they break: `faults` (master and node killed, master restarted, eviction, with both
//! durable tiers), `restart` (a call tried again across a master restart), `eviction` (the
//! catalog outlives eviction), `watch` (a sidecar started before its master, the periodic scrub).
//! This module holds what they share.

mod eviction;
mod faults;
mod restart;
mod watch;

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
