//! Publish -> install through a real Mooncake cluster: the installed tree is the published one
//! (content, mode, mtime), a republish of an unchanged tree uploads nothing, a grown tree uploads
//! only what is new, and a second install finds everything current.

use std::sync::Arc;
use std::time::Duration;

use jitship::catalog::KeyLayout;
use jitship::install::InstallOutcome;
use jitship::publish::PublishOutcome;
use jitship::store::{MooncakeStore, Store};
use jitship_tests::fixtures::{digest, large_files_tree, triton_tree};
use jitship_tests::mooncake::{cluster, flow, unique_prefix};

#[test]
fn publish_then_install_through_mooncake_round_trips_the_tree() {
    let Some(c) = cluster("publish_then_install_through_mooncake_round_trips_the_tree") else {
        return;
    };
    let store: Arc<dyn Store> =
        Arc::new(MooncakeStore::connect(&c.config()).unwrap_or_else(|e| panic!("connect: {e}")));
    let layout = KeyLayout::new(&unique_prefix("roundtrip")).unwrap();
    let facts = flow::facts("roundtrip");
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    triton_tree(&src, 150, 1);
    // Files larger than a pack are split across packs.
    large_files_tree(&src, 2, 5 * 1024 * 1024 + 17, 2);
    let pack = 4 * 1024 * 1024;

    let first = flow::publish(store.as_ref(), &layout, &src, &facts, pack)
        .unwrap_or_else(|e| panic!("publish: {e}"));
    let PublishOutcome::Published { seq: 1, .. } = first.outcome else {
        panic!("first publish: {:?}", first.outcome)
    };
    assert!(
        first.bytes_uploaded > 10 * 1024 * 1024 && first.packs_uploaded >= 3,
        "{first:?}"
    );

    let dst = tmp.path().join("dst");
    let report = flow::install(
        store.clone(),
        &layout,
        &dst,
        &facts,
        Duration::from_secs(60),
    );
    assert_eq!(
        report.outcome,
        InstallOutcome::Installed,
        "{}",
        report.detail
    );
    assert_eq!(
        digest(&src),
        digest(&dst),
        "installed tree differs from the published one"
    );

    let again = flow::publish(store.as_ref(), &layout, &src, &facts, pack).unwrap();
    assert!(
        matches!(again.outcome, PublishOutcome::Unchanged { .. }),
        "{:?}",
        again.outcome
    );
    assert_eq!(again.bytes_uploaded, 0);

    triton_tree(&src.join("more"), 20, 3);
    let grown = flow::publish(store.as_ref(), &layout, &src, &facts, pack).unwrap();
    let PublishOutcome::Published { seq: 2, .. } = grown.outcome else {
        panic!("grown publish: {:?}", grown.outcome)
    };
    assert!(
        grown.bytes_uploaded < 2 * 1024 * 1024,
        "only the new files: {} bytes",
        grown.bytes_uploaded
    );

    let report = flow::install(
        store.clone(),
        &layout,
        &dst,
        &facts,
        Duration::from_secs(60),
    );
    assert_eq!(
        report.outcome,
        InstallOutcome::Installed,
        "{}",
        report.detail
    );
    assert_eq!(
        report.files_installed,
        20 * 8,
        "only the new files are fetched"
    );
    assert_eq!(digest(&src), digest(&dst));
    let report = flow::install(store, &layout, &dst, &facts, Duration::from_secs(60));
    assert_eq!(
        report.outcome,
        InstallOutcome::AlreadyCurrent,
        "{}",
        report.detail
    );
}
