//! Pack replicas (`[publish] pack_replicas`, issue 40; `docs/fleet.md`): a publish writes every
//! copy, and an install whose primary and some replicas are gone reads a copy that is left.

use std::path::Path;
use std::sync::Arc;

use jitship::catalog::{self, KeyLayout};
use jitship::facts::Facts;
use jitship::generation::{Manifest, Producer};
use jitship::install::{InstallOptions, InstallOutcome};
use jitship::policy::native::NativeRules;
use jitship::publish::{PublishOptions, PublishOutcome, publish};
use jitship::store::{LocalStore, Store};

fn publish_tree(store: &dyn Store, layout: &KeyLayout, root: &Path) -> Manifest {
    let mut facts = Facts::new();
    facts.set("model.id", "m");
    let opts = PublishOptions {
        pack_size: 4096,
        producer: Producer {
            host: "h".into(),
            pod: None,
            jitship_version: "t".into(),
        },
        facts,
        max_head_attempts: 4,
        trust: Default::default(),
        interrupt: Default::default(),
        registry: None,
    };
    let r = publish(
        store,
        layout,
        &NativeRules::new("triton"),
        root,
        &opts,
        None,
    )
    .unwrap();
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
    let mut facts = Facts::new();
    facts.set("model.id", "m");
    let r = jitship::install::install(
        store.clone(),
        &layout,
        Arc::new(NativeRules::new("triton")),
        &dst,
        &facts,
        &InstallOptions::default(),
    );
    assert_eq!(r.outcome, InstallOutcome::Installed, "{r:?}");
    for (p, c) in &files {
        assert_eq!(&std::fs::read(dst.join(p)).unwrap(), c, "{p}");
    }
}
