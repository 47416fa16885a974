use super::journal::{JournalKey, parse_journal_key};
use super::sweep::remove_packs;
use super::*;

/// Issue 43: on a store that lists and dates keys, a stored module no generation names goes
/// once older than grace; within grace (a publish may be about to name it) it stays. A key
/// under `module/` that is not a digest is never touched.
#[test]
fn an_orphan_module_goes_after_grace_and_not_before() {
    use crate::store::ValueClass;
    let dir = tempfile::tempdir().unwrap();
    let store = crate::store::LocalStore::open(dir.path()).unwrap();
    let layout = KeyLayout::new("ns").unwrap();
    let orphan = ContentHash::of(b"module");
    store
        .put(&layout.module(&orphan), b"module", ValueClass::Record)
        .unwrap();
    let junk = format!("{}not-a-digest", layout.modules_prefix());
    store.put(&junk, b"x", ValueClass::Record).unwrap();
    let no_policy = |_: &str| -> std::sync::Arc<dyn crate::policy::CachePolicy> {
        unreachable!("no key to decide")
    };
    let opts = |now: u64| GcOptions {
        now,
        grace: Duration::from_secs(3600),
        limits: RetentionLimits::default(),
        dry_run: false,
        lease_wait: Duration::ZERO,
        lease_rounds: 0,
        trust: Default::default(),
    };
    let written = crate::catalog::now_secs();
    let r = collect(&store, &layout, &no_policy, &opts(written + 60)).unwrap();
    assert!(r.modules.is_empty(), "{:?}", r.modules);
    assert!(store.exists(&layout.module(&orphan)).unwrap());
    let r = collect(&store, &layout, &no_policy, &opts(written + 7200)).unwrap();
    assert_eq!(r.modules, vec![orphan]);
    assert!(!store.exists(&layout.module(&orphan)).unwrap());
    assert!(store.exists(&junk).unwrap());
}

#[test]
fn removing_a_pack_removes_every_replica_whatever_this_runs_setting() {
    let dir = tempfile::tempdir().unwrap();
    use crate::store::ValueClass;
    let store = crate::store::LocalStore::open(dir.path()).unwrap();
    // Written with 3 copies; gc runs with the default of 1.
    let layout = KeyLayout::new("ns").unwrap();
    let (gone, kept) = (ContentHash::of(b"gone"), ContentHash::of(b"kept"));
    for id in [gone, kept] {
        for k in 0..3 {
            store
                .put(&layout.pack_copy(&id, k), b"pack", ValueClass::Bulk)
                .unwrap();
        }
    }
    let opts = GcOptions {
        now: 0,
        grace: Duration::ZERO,
        limits: RetentionLimits::default(),
        dry_run: false,
        lease_wait: Duration::ZERO,
        lease_rounds: 0,
        trust: Default::default(),
    };
    let mut report = GcReport::default();
    let spared = HashSet::from([kept]);
    remove_packs(
        &store,
        &layout,
        &opts,
        vec![(gone, 4), (kept, 4)],
        &spared,
        &mut report,
    );
    assert_eq!(report.packs, vec![gone]);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    for k in 0..3 {
        assert!(
            !store.exists(&layout.pack_copy(&gone, k)).unwrap(),
            "copy {k}"
        );
        assert!(
            store.exists(&layout.pack_copy(&kept, k)).unwrap(),
            "spared copy {k}"
        );
    }
}

#[test]
fn a_journal_may_name_only_this_namespaces_head_and_manifest_keys() {
    let layout = KeyLayout::new("ns").unwrap();
    let compat = CompatId::new("kernels", "k");
    let id = GenerationId(ContentHash::of(b"g"));
    let ok = |k: &str| parse_journal_key(&layout, k).is_some();
    assert!(ok(&layout.head(&compat, 7)));
    assert!(matches!(
        parse_journal_key(&layout, &layout.generation(&id)),
        Some(JournalKey::Manifest(g)) if g == id
    ));
    let other = KeyLayout::new("other").unwrap();
    for bad in [
        other.head(&compat, 7),
        other.generation(&id),
        layout.pack(&id.0),
        layout.pin(&id),
        layout.floor(&compat, 1),
        layout.gc_journal(1),
        format!("{}/../other/head/{compat}/7", layout.namespace()),
        format!("{}/x", layout.head(&compat, 7)),
        layout.head(&compat, 7).replace("/7", "/07"),
        format!("{}/head/{compat}/", layout.namespace()),
    ] {
        assert!(!ok(&bad), "{bad} accepted");
    }
}
