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
    let all = all_heads(&store, &layout, &compat).unwrap().heads;
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
    heads(&store, &layout, compat, 10);
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
    let seq = append_seq(
        &store,
        "ns/seq/",
        &key,
        &|s| format!("ours {s}").into_bytes(),
        &|_, _| true,
    )
    .unwrap();
    assert_eq!(seq, 3);
    assert_eq!(store.get(&key(3)).unwrap().unwrap(), b"ours 3");
}

// ---------------------------------------------------------------------------------------------
// Records anyone can write: head discovery stays bounded and finds the newest usable head.

/// Local with listing, and local without listing (probing, as on Mooncake).
fn both_stores(dir: &std::path::Path) -> Vec<Box<dyn Store>> {
    vec![
        Box::new(LocalStore::open(dir.join("listing")).unwrap()),
        Box::new(WithoutListing(
            LocalStore::open(dir.join("probing")).unwrap(),
        )),
    ]
}

fn put_raw(store: &dyn Store, key: &str, bytes: &[u8]) {
    store.put(key, bytes, ValueClass::Record).unwrap();
}

#[test]
fn hostile_heads_far_above_are_out_of_range_or_one_search_away() {
    let dir = tempfile::tempdir().unwrap();
    let layout = KeyLayout::new("ns").unwrap();
    let compat = CompatId::new("triton", "k");
    for store in both_stores(dir.path()) {
        let store = store.as_ref();
        heads(store, &layout, compat, 5);
        // Out of range: never looked at.
        put_raw(
            store,
            &layout.head(&compat, u64::MAX),
            &head(compat, u64::MAX).encode(),
        );
        put_raw(
            store,
            &layout.head(&compat, MAX_SEQ + 1),
            &head(compat, MAX_SEQ + 1).encode(),
        );
        let walk = HeadWalk::new(store, &layout, &compat).unwrap();
        assert_eq!(walk.newest_seq(), Some(5), "{store:?}");
        // In range, far above, and at the seqs a doubling probe looks at (2^k from 1): found
        // (listing, or the probe lands on them), passed over by the caller, and the walk steps
        // down to the real heads in a bounded number of probes.
        let far = 5 + 10_000_000;
        put_raw(
            store,
            &layout.head(&compat, far),
            &head(compat, far).encode(),
        );
        for k in 3..24 {
            let s = 1u64 << k;
            put_raw(store, &layout.head(&compat, s), b"junk");
        }
        let mut walk = HeadWalk::new(store, &layout, &compat).unwrap();
        let mut seen = vec![];
        while let Some(e) = walk.next_head().unwrap() {
            seen.push(match e {
                Ok(h) => h.seq,
                Err(f) => f.seq,
            });
        }
        assert!(seen.ends_with(&[5, 4, 3, 2, 1]), "{store:?}: {seen:?}");
        assert!(
            seen.windows(2).all(|w| w[0] > w[1]),
            "newest first: {seen:?}"
        );
        println!(
            "{store:?}: {} heads walked past 21 planted probe points and one at 10^7 above: {} probes",
            seen.len(),
            walk.probes()
        );
        assert!(
            walk.probes() < 2_000,
            "{store:?}: {} probes for {} heads",
            walk.probes(),
            seen.len()
        );
        // A well-formed head is usable as far as the catalog goes (trust is the caller's): found
        // by listing; without listing, only if a probe lands on it.
        let newest = newest_head(store, &layout, &compat).unwrap().unwrap().seq;
        if store.capabilities().listing {
            assert_eq!(newest, far);
        } else {
            assert!(newest == far || newest == 5, "{newest}");
        }
    }
}

#[test]
fn corrupt_empty_mislabelled_and_oversized_heads_are_passed_over_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let layout = KeyLayout::new("ns").unwrap();
    let compat = CompatId::new("triton", "k");
    let other = CompatId::new("triton", "other");
    for store in both_stores(dir.path()) {
        let store = store.as_ref();
        heads(store, &layout, compat, 3);
        put_raw(store, &layout.head(&compat, 4), b"{garbage");
        put_raw(store, &layout.head(&compat, 5), b"");
        put_raw(store, &layout.head(&compat, 6), &head(other, 6).encode());
        put_raw(store, &layout.head(&compat, 7), &head(compat, 2).encode());
        let big = vec![b' '; (MAX_HEAD_BYTES + 1) as usize];
        put_raw(store, &layout.head(&compat, 8), &big);
        let all = all_heads(store, &layout, &compat).unwrap();
        assert_eq!(
            all.heads.iter().map(|h| h.seq).collect::<Vec<_>>(),
            vec![3, 2, 1]
        );
        let faults: Vec<(u64, &HeadFault)> = all.faulty.iter().map(|f| (f.seq, &f.fault)).collect();
        assert_eq!(faults.len(), 5, "{faults:?}");
        assert!(
            matches!(faults[0], (8, HeadFault::TooLarge { .. })),
            "{faults:?}"
        );
        assert!(matches!(faults[1], (7, HeadFault::Mislabelled)));
        assert!(matches!(faults[2], (6, HeadFault::Mislabelled)));
        assert!(matches!(faults[3], (5, HeadFault::Corrupt { .. })));
        assert!(matches!(faults[4], (4, HeadFault::Corrupt { .. })));
        assert_eq!(
            newest_head(store, &layout, &compat).unwrap().unwrap().seq,
            3
        );
        assert_eq!(
            HeadWalk::new(store, &layout, &compat).unwrap().newest_seq(),
            Some(8)
        );
    }
}

#[test]
fn an_oversized_record_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::open(dir.path()).unwrap();
    // A sparse 2 GiB file: reading it whole would cost 2 GiB of memory.
    let path = dir.path().join("ns").join("head").join("x");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(2 << 30).unwrap();
    match store.get_capped("ns/head/x", MAX_HEAD_BYTES) {
        Err(StoreError::TooLarge { size, limit }) => {
            assert_eq!((size, limit), (2 << 30, MAX_HEAD_BYTES))
        }
        other => panic!("{:?}", other.map(|v| v.map(|v| v.len()))),
    }
}

#[test]
fn hostile_floors_never_hide_the_heads() {
    let dir = tempfile::tempdir().unwrap();
    let store = WithoutListing(LocalStore::open(dir.path()).unwrap());
    let layout = KeyLayout::new("ns").unwrap();
    let compat = CompatId::new("triton", "k");
    heads(&store, &layout, compat, 6);
    // A floor far above every head, one at 1 written last, and garbage.
    for (seq, floor) in [(1u64, 1u64 << 40), (2, 1)] {
        let f = FloorRecord {
            compat_id: compat,
            seq,
            floor,
            keep: vec![],
            written_at: 0,
            writer: "attacker".into(),
        };
        put_raw(&store, &layout.floor(&compat, seq), &encode_record(&f));
    }
    put_raw(&store, &layout.floor(&compat, 3), b"not a floor");
    assert_eq!(
        newest_head(&store, &layout, &compat).unwrap().unwrap().seq,
        6
    );
}

/// Issue 39 (found by the decoder fuzzing): heads at 100..=105 under gc's floor at 100, then four
/// forged floors, each starting nowhere and naming 60,000 kept seqs. The walk cost 240,002
/// probes and 7.7 s and found no head: the forged floors were the four it read. Now kept seqs
/// are capped and floors that start nowhere do not count.
#[test]
fn forged_floors_neither_hide_gcs_floor_nor_cost_a_probe_per_kept_seq() {
    let dir = tempfile::tempdir().unwrap();
    let store = WithoutListing(LocalStore::open(dir.path()).unwrap());
    let layout = KeyLayout::new("ns").unwrap();
    let compat = CompatId::new("triton", "k");
    for s in 100..=105 {
        put_raw(&store, &layout.head(&compat, s), &head(compat, s).encode());
    }
    write_floor(&store, &layout, &compat, 100, vec![]).unwrap();
    for seq in 2..=5 {
        let f = FloorRecord {
            compat_id: compat,
            seq,
            floor: MAX_SEQ,
            keep: (1..=60_000).map(|k| MAX_SEQ - 1 - k).collect(),
            written_at: 0,
            writer: "attacker".into(),
        };
        put_raw(&store, &layout.floor(&compat, seq), &encode_record(&f));
    }
    let mut walk = HeadWalk::new(&store, &layout, &compat).unwrap();
    assert_eq!(
        walk.next_usable(MAX_FAULTY_PASSED).unwrap().unwrap().seq,
        105
    );
    assert!(
        walk.probes() < 4 * MAX_FLOOR_KEEPS as u64,
        "{} probes",
        walk.probes()
    );
}

/// Issue 39: 10^6 junk heads cost gc 931 MB and a 200 MB report, one entry each. `all_heads`
/// (what `ls` and gc read) names the newest 64 and counts the rest.
#[test]
fn all_heads_names_a_bounded_number_of_faulty_heads_and_counts_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    for store in both_stores(dir.path()) {
        let store = store.as_ref();
        let layout = KeyLayout::new("ns").unwrap();
        let compat = CompatId::new("triton", "k");
        heads(store, &layout, compat, 2);
        for seq in 3..=1002 {
            put_raw(store, &layout.head(&compat, seq), b"x");
        }
        let all = all_heads(store, &layout, &compat).unwrap();
        assert_eq!(all.heads.len(), 2);
        assert_eq!(all.faulty.len(), MAX_FAULTY_LISTED);
        assert_eq!(all.faulty[0].seq, 1002, "the newest are named");
        assert_eq!(all.faulty_count, 1000);
    }
}

#[test]
fn append_seq_never_wraps_and_a_record_at_the_ceiling_does_not_freeze_the_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::open(dir.path()).unwrap();
    let key = |s: u64| format!("ns/seq/{s}");
    let ours = |s: u64| format!("ours {s}").into_bytes();
    let is_ours = |s: u64, b: &[u8]| b == ours(s).as_slice();
    store.put(&key(4), &ours(4), ValueClass::Record).unwrap();
    // Junk at the very top, just below it, and beyond the range.
    store.put(&key(MAX_SEQ), b"x", ValueClass::Record).unwrap();
    store
        .put(&key(MAX_SEQ - 1), b"x", ValueClass::Record)
        .unwrap();
    store.put(&key(u64::MAX), b"x", ValueClass::Record).unwrap();
    // Issue 39: this was SequenceFull forever. Now it appends above the newest real record.
    assert_eq!(
        append_seq(&store, "ns/seq/", &key, &ours, &is_ours).unwrap(),
        5
    );
    assert_eq!(
        append_seq(&store, "ns/seq/", &key, &ours, &is_ours).unwrap(),
        6
    );
    assert!(store.get(&key(0)).unwrap().is_none());
    // No record of its own below the ceiling: it starts from 1.
    let other = |s: u64| format!("other/{s}");
    store
        .put(&other(MAX_SEQ), b"x", ValueClass::Record)
        .unwrap();
    assert_eq!(
        append_seq(&store, "other/", &other, &ours, &is_ours).unwrap(),
        1
    );
}

#[test]
fn an_index_record_at_the_ceiling_does_not_stop_first_publishes() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::open(dir.path()).unwrap();
    let layout = KeyLayout::new("ns").unwrap();
    put_raw(&store, &layout.index(MAX_SEQ), b"junk");
    let compat = CompatId::new("triton", "k");
    ensure_indexed(&store, &layout, &compat, "triton", "k").unwrap();
    assert_eq!(compat_ids(&store, &layout).unwrap(), vec![compat]);
}

#[test]
fn a_garbage_gc_journal_is_passed_over_for_the_newest_real_one() {
    let dir = tempfile::tempdir().unwrap();
    for store in both_stores(dir.path()) {
        let store = store.as_ref();
        let layout = KeyLayout::new("ns").unwrap();
        let journal = write_gc_journal(store, &layout, vec!["ns/head/x/1".into()], vec![]).unwrap();
        put_raw(store, &layout.gc_journal(journal.seq + 1), b"garbage");
        assert_eq!(
            newest_gc_journal(store, &layout).unwrap(),
            Some(journal.clone())
        );
        // And a journal written after it lands above the garbage.
        let next = write_gc_journal(store, &layout, vec![], vec![]).unwrap();
        assert_eq!(next.seq, journal.seq + 2);
        assert_eq!(newest_gc_journal(store, &layout).unwrap(), Some(next));
    }
}
