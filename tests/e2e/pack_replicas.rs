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

/// Where the master says `key` lives: its copy's transport endpoint (the store node's segment).
fn segment_of(metrics: &str, key: &str) -> String {
    // Keys are [A-Za-z0-9/_.-]: legal in a query as they are (the master does not decode %2F).
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "5"])
        .arg(format!("{metrics}/query_key?key={key}"))
        .output()
        .expect("curl (installed by cluster.sh install)");
    assert!(out.status.success(), "query_key {key}: {out:?}");
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let copies = answer["data"].as_array().expect("data: the key's copies");
    assert_eq!(copies.len(), 1, "one Mooncake replica per key: {answer}");
    copies[0]["transport_endpoint_"]
        .as_str()
        .expect("transport_endpoint_")
        .to_owned()
}

/// With `segments_url` naming the master's segment list, the copies of every pack sit on
/// different store nodes (as the master's own `query_key` reports them), so a herd that picks a
/// copy at random reads from both. Without it Mooncake places them itself, often on one node.
#[test]
#[ignore = "needs a Mooncake test cluster of two store nodes: JITSHIP_CLUSTER_STORE_NODES=2 \
            tests/cluster/cluster.sh run -- ... (run-all's mooncake-fleet step)"]
fn pack_copies_sit_on_different_store_nodes_on_mooncake_fan_out() {
    use jitship::config::MooncakeConfig;
    use jitship::store::MooncakeStore;
    use jitship_tests::mooncake::{cluster, unique_prefix};

    let c = cluster("pack_copies_sit_on_different_store_nodes_on_mooncake_fan_out");
    let nodes: usize = std::env::var("JITSHIP_TEST_MOONCAKE_STORE_NODES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    assert!(
        nodes >= 2,
        "this test needs two store nodes: run it with JITSHIP_CLUSTER_STORE_NODES=2"
    );
    let metrics = std::env::var("JITSHIP_TEST_MOONCAKE_METRICS").expect("cluster.sh sets it");
    let store = MooncakeStore::connect(&MooncakeConfig {
        segments_url: Some(format!("{metrics}/get_all_segments")),
        ..c.config()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    for i in 0..40 {
        let path = src.join(format!("k{i}.cubin"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, vec![i as u8; 3000 + i]).unwrap();
    }
    let layout = KeyLayout::new(&unique_prefix("fan-out"))
        .unwrap()
        .with_pack_replicas(2);
    let m = publish_tree(&store, &layout, &src);
    assert!(m.packs.len() > 4, "several packs: {}", m.packs.len());
    let mut primaries = std::collections::BTreeSet::new();
    for p in &m.packs {
        let first = segment_of(&metrics, &layout.pack(&p.id));
        let second = segment_of(&metrics, &layout.pack_copy(&p.id, 1));
        assert_ne!(first, second, "both copies of pack {} on one node", p.id);
        primaries.insert(first);
    }
    assert_eq!(
        primaries.len(),
        1,
        "every copy 0 on the first segment listed: {primaries:?}"
    );
}
