//! Pack replicas (`[publish] pack_replicas`, issue 40; `docs/fleet.md`): a publish writes every
//! copy, and an install whose primary and some replicas are gone reads a copy that is left.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use jitship::catalog::{self, KeyLayout};
use jitship::generation::Manifest;
use jitship::install::InstallOutcome;
use jitship::publish::PublishOutcome;
use jitship::store::{LocalStore, Store};
use jitship_tests::mooncake::flow;

const TAG: &str = "pack-replicas";

fn publish_tree(store: &dyn Store, layout: &KeyLayout, root: &Path) -> Manifest {
    let r = flow::publish(store, layout, root, &flow::facts(TAG), 4096).unwrap();
    let PublishOutcome::Published { generation, .. } = &r.outcome else {
        panic!("{:?}", r.outcome)
    };
    catalog::fetch_manifest(store, layout, generation)
        .unwrap()
        .unwrap()
}

#[test]
fn replicas_are_written_and_an_install_reads_them_when_the_primary_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let files: Vec<(String, Vec<u8>)> = (0..40)
        .map(|i| {
            (
                format!("d{}/k{i}.cubin", i % 3),
                vec![i as u8; 700 + i * 13],
            )
        })
        .collect();
    for (p, c) in &files {
        let path = src.join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, c).unwrap();
    }
    let store: Arc<dyn Store> = Arc::new(LocalStore::open(dir.path().join("store")).unwrap());
    let layout = KeyLayout::new("ns").unwrap().with_pack_replicas(3);
    let m = publish_tree(store.as_ref(), &layout, &src);
    assert!(
        m.packs.len() > 2,
        "a tree of several packs: {}",
        m.packs.len()
    );
    for p in &m.packs {
        let primary = store.get(&layout.pack(&p.id)).unwrap().expect("primary");
        for k in 1..3 {
            let copy = store.get(&layout.pack_copy(&p.id, k)).unwrap();
            assert_eq!(
                copy.as_deref(),
                Some(&primary[..]),
                "replica {k} of {}",
                p.id
            );
        }
        assert!(!store.exists(&layout.pack_copy(&p.id, 3)).unwrap());
        // Every primary and one replica gone: each pack has one copy left.
        store.remove(&layout.pack(&p.id)).unwrap();
        store.remove(&layout.pack_copy(&p.id, 1)).unwrap();
    }
    let dst = dir.path().join("dst");
    let facts = flow::facts(TAG);
    let r = flow::install(
        store.clone(),
        &layout,
        &dst,
        &facts,
        Duration::from_secs(60),
    );
    assert_eq!(r.outcome, InstallOutcome::Installed, "{r:?}");
    for (p, c) in &files {
        assert_eq!(&std::fs::read(dst.join(p)).unwrap(), c, "{p}");
    }
}
