//! The scrub (`jitship::scrub`) on local tiers: a pack removed or damaged in the fast tier is
//! found and put back from the durable tier; without one it is reported, and a sample is bounded.
//! (An integration test: building a generation needs `publish`, a layer above `scrub`.)

use std::sync::Arc;

use jitship::catalog::KeyLayout;
use jitship::facts::Facts;
use jitship::generation::Manifest;
use jitship::policy::native::NativeRules;
use jitship::publish::PublishOptions;
use jitship::scrub::scrub;
use jitship::store::{LocalStore, TieredStore};
use jitship::store::{Store, ValueClass};
use jitship::trust::TrustPolicy;

fn options() -> PublishOptions {
    // Small packs: the big file below spans several.
    jitship_tests::harness::publish_options(&Facts::new(), 4096, "pod-a")
}

/// The fast and durable tiers, the tiered store over them, the layout and the manifest.
type Published = (
    Arc<dyn Store>,
    Arc<dyn Store>,
    Arc<dyn Store>,
    KeyLayout,
    Manifest,
);

/// A generation published through a tiered store of two local directories; its manifest.
fn published(dir: &std::path::Path) -> Published {
    let root = dir.join("root");
    std::fs::create_dir_all(&root).unwrap();
    for i in 0..12u8 {
        std::fs::write(
            root.join(format!("k{i}.cubin")),
            vec![i; 1500 + usize::from(i) * 37],
        )
        .unwrap();
    }
    let big: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(root.join("big.so"), big).unwrap();
    let fast: Arc<dyn Store> = Arc::new(LocalStore::open(dir.join("fast")).unwrap());
    let durable: Arc<dyn Store> = Arc::new(LocalStore::open(dir.join("durable")).unwrap());
    let tiered: Arc<dyn Store> = Arc::new(TieredStore::new(fast.clone(), durable.clone()));
    let layout = KeyLayout::new("t").unwrap();
    let report = jitship::publish::publish(
        tiered.as_ref(),
        &layout,
        &NativeRules::new("k"),
        &root,
        &options(),
        None,
    )
    .unwrap();
    let jitship::publish::PublishOutcome::Published { generation, .. } = report.outcome else {
        panic!("not published: {:?}", report.outcome);
    };
    let jitship::catalog::ManifestRead::Present(m) =
        jitship::catalog::read_manifest(tiered.as_ref(), &layout, &generation).unwrap()
    else {
        panic!("the manifest of {generation} is not readable");
    };
    let m = *m;
    assert!(m.packs.len() >= 6, "{} packs", m.packs.len());
    (fast, durable, tiered, layout, m)
}

#[test]
fn a_full_scrub_finds_and_repairs_a_removed_and_a_damaged_pack_from_the_durable_tier() {
    let dir = tempfile::tempdir().unwrap();
    let (fast, durable, tiered, layout, m) = published(dir.path());
    let trust = TrustPolicy::default();
    let clean = scrub(tiered.as_ref(), &layout, &trust, 1000, true).unwrap();
    assert_eq!(clean.checked, m.packs.len() as u64, "{clean:?}");
    assert!(clean.findings.is_empty() && clean.clean(), "{clean:?}");

    // Behind jitship's back: one pack gone, one holding other bytes of the same size.
    let gone = layout.pack(&m.packs[0].id);
    let damaged = layout.pack(&m.packs.last().unwrap().id);
    assert!(fast.remove(&gone).unwrap());
    let mut bytes = fast.get(&damaged).unwrap().unwrap();
    bytes[0] ^= 0xff;
    assert!(fast.remove(&damaged).unwrap());
    fast.put(&damaged, &bytes, ValueClass::Bulk).unwrap();

    let r = scrub(tiered.as_ref(), &layout, &trust, 1000, true).unwrap();
    assert_eq!(
        (r.checked, r.missing, r.corrupt, r.repaired),
        (m.packs.len() as u64, 1, 1, 2),
        "{r:?}"
    );
    assert!(r.clean(), "{r:?}");
    // Put back, byte for byte as the durable tier holds them.
    for key in [&gone, &damaged] {
        assert_eq!(fast.get(key).unwrap(), durable.get(key).unwrap(), "{key}");
    }
    let again = scrub(tiered.as_ref(), &layout, &trust, 1000, true).unwrap();
    assert!(again.findings.is_empty(), "{again:?}");
}

#[test]
fn without_a_durable_tier_a_lost_pack_is_reported_not_repaired_and_a_sample_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let (fast, _durable, _tiered, layout, m) = published(dir.path());
    let trust = TrustPolicy::default();
    let r = scrub(fast.as_ref(), &layout, &trust, 3, true).unwrap();
    assert_eq!((r.checked, r.packs), (3, m.packs.len() as u64), "{r:?}");
    for p in &m.packs {
        fast.remove(&layout.pack(&p.id)).unwrap();
    }
    let r = scrub(fast.as_ref(), &layout, &trust, 1000, true).unwrap();
    assert_eq!(r.missing, m.packs.len() as u64, "{r:?}");
    assert_eq!(r.repaired, 0);
    assert!(!r.clean());
    assert!(
        r.findings
            .iter()
            .all(|f| f.not_repaired.as_deref() == Some("no durable tier to repair from")),
        "{r:?}"
    );
}
