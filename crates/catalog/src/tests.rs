use std::sync::atomic::{AtomicBool, Ordering};

use super::*;
use jitship_store::LocalStore;
use jitship_store::testing::{Hooked, WithoutListing};

fn head(compat: CompatId, seq: u64) -> HeadRecord {
    HeadRecord {
        compat_id: compat,
        seq,
        generation: GenerationId(ContentHash([seq as u8; 32])),
        written_at: seq,
        writer: "t".into(),
        signature: None,
    }
}

fn heads(store: &dyn Store, layout: &KeyLayout, compat: CompatId, n: u64) {
    for s in 1..=n {
        store
            .put(
                &layout.head(&compat, s),
                &head(compat, s).encode(),
                ValueClass::Record,
            )
            .unwrap();
    }
}

#[test]
fn newest_head_without_listing_starts_at_the_floor() {
    let dir = tempfile::tempdir().unwrap();
    let store = WithoutListing(LocalStore::open(dir.path()).unwrap());
    let layout = KeyLayout::new("ns").unwrap();
    let compat = CompatId::new("triton", "k");
    heads(&store, &layout, compat, 10);
    assert_eq!(
        newest_head(&store, &layout, &compat).unwrap().unwrap().seq,
        10
    );

    // gc: floor 7 keeping head 3 (pinned), then heads below the floor removed.
    write_floor(&store, &layout, &compat, 7, vec![3]).unwrap();
    for s in [1, 2, 4, 5, 6] {
        store.remove(&layout.head(&compat, s)).unwrap();
    }
    let newest = newest_head(&store, &layout, &compat).unwrap().unwrap();
    assert_eq!(newest.seq, 10);
    let older: Vec<u64> = older_heads(&store, &layout, &newest, 10)
        .unwrap()
        .iter()
        .map(|h| h.seq)
        .collect();
    assert_eq!(older, vec![9, 8, 7, 3]);
    let (_, all) = all_heads(&store, &layout, &compat).unwrap();
    assert_eq!(
        all.iter().map(|h| h.seq).collect::<Vec<_>>(),
        vec![10, 9, 8, 7, 3]
    );

    // The hazard the floor exists for: the same removal without a floor hides every head.
    let bare = CompatId::new("triton", "no floor");
    heads(&store, &layout, bare, 10);
    for s in 1..=6 {
        store.remove(&layout.head(&bare, s)).unwrap();
    }
    assert!(newest_head(&store, &layout, &bare).unwrap().is_none());
}

/// What `gc_during_probe` removes, and whether it has.
#[derive(Debug)]
struct GcOnce {
    layout: KeyLayout,
    compat: CompatId,
    fired: AtomicBool,
}

/// Runs a "gc" (new floor, heads below it removed) at the first probe of a head.
fn gc_during_probe(
    inner: WithoutListing<LocalStore>,
    layout: &KeyLayout,
    compat: CompatId,
) -> Hooked<WithoutListing<LocalStore>, GcOnce> {
    let gc = GcOnce {
        layout: layout.clone(),
        compat,
        fired: AtomicBool::new(false),
    };
    Hooked::new(inner, gc).on_exists(|inner, gc, key| {
        if key.contains("/head/") && !gc.fired.swap(true, Ordering::SeqCst) {
            write_floor(inner, &gc.layout, &gc.compat, 6, vec![]).unwrap();
            for s in 1..6 {
                inner.remove(&gc.layout.head(&gc.compat, s))?;
            }
        }
        inner.exists(key)
    })
}

#[test]
fn a_probe_that_overlaps_a_gc_starts_again_from_the_new_floor() {
    let dir = tempfile::tempdir().unwrap();
    let layout = KeyLayout::new("ns").unwrap();
    let compat = CompatId::new("triton", "k");
    let store = gc_during_probe(
        WithoutListing(LocalStore::open(dir.path()).unwrap()),
        &layout,
        compat,
    );
    heads(&store.inner, &layout, compat, 10);
    let newest = newest_head(&store, &layout, &compat).unwrap().unwrap();
    assert!(store.state.fired.load(Ordering::SeqCst));
    assert_eq!(newest.seq, 10);
}

#[test]
fn a_floor_never_goes_down() {
    let dir = tempfile::tempdir().unwrap();
    let store = WithoutListing(LocalStore::open(dir.path()).unwrap());
    let layout = KeyLayout::new("ns").unwrap();
    let compat = CompatId::new("triton", "k");
    write_floor(&store, &layout, &compat, 7, vec![2]).unwrap();
    // A gc that planned on an older view writes a lower floor: the higher one stands.
    let f = write_floor(&store, &layout, &compat, 5, vec![3]).unwrap();
    assert_eq!((f.seq, f.floor, f.keep.clone()), (2, 7, vec![3, 2]));
    assert_eq!(newest_floor(&store, &layout, &compat).unwrap().unwrap(), f);
}

#[test]
fn the_compat_index_is_written_once_and_found_without_listing() {
    let dir = tempfile::tempdir().unwrap();
    let store = WithoutListing(LocalStore::open(dir.path()).unwrap());
    let layout = KeyLayout::new("ns").unwrap();
    let a = CompatId::new("triton", "a");
    let b = CompatId::new("inductor", "b");
    for _ in 0..3 {
        ensure_indexed(&store, &layout, &a, "triton", "a").unwrap();
    }
    ensure_indexed(&store, &layout, &b, "inductor", "b").unwrap();
    assert!(store.exists(&layout.index(2)).unwrap());
    assert!(
        !store.exists(&layout.index(3)).unwrap(),
        "one entry per compat id"
    );
    let mut want = vec![a, b];
    want.sort();
    assert_eq!(compat_ids(&store, &layout).unwrap(), want);
}

#[test]
fn append_seq_moves_past_seqs_other_writers_won() {
    let dir = tempfile::tempdir().unwrap();
    let store = WithoutListing(LocalStore::open(dir.path()).unwrap());
    let key = |s: u64| format!("ns/seq/{s}");
    // Another writer took seq 1 and 2 already; a third one took 3 in between (simulated by
    // a put that exists before ours).
    store.put(&key(1), b"x1", ValueClass::Record).unwrap();
    store.put(&key(2), b"x2", ValueClass::Record).unwrap();
    let seq = append_seq(&store, "ns/seq/", &key, &|s| {
        format!("ours {s}").into_bytes()
    })
    .unwrap();
    assert_eq!(seq, 3);
    assert_eq!(store.get(&key(3)).unwrap().unwrap(), b"ours 3");
}
