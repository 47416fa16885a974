//! Head races: a lost race merges onto a trusted winner, a winner without a manifest is written
//! above, a parent with lost packs is repaired.

use super::*;

#[test]
fn a_head_put_still_in_flight_is_merged_not_skipped() {
    // 3 hidden reads: the read-back retries see it. 8: it stays hidden through all 8 read-backs,
    // the publisher writes above it, and the check below its won seq merges it.
    for hidden in [3, 8] {
        let (dir, race, layout) = setup();
        let winner = other_publisher(&race, &layout, dir.path(), &[("w.bin", b"w")], true);
        *race.state.winner.lock().unwrap() = Some(winner);
        let store = in_flight_head(race, hidden);
        let root = dir.path().join("ours");
        tree(&root, &[("o.bin", b"ours")]);
        let r = run(&store, &layout, &root);
        let head = catalog::newest_head(&store.inner.inner, &layout, &r.compat_id)
            .unwrap()
            .unwrap();
        let m = catalog::fetch_manifest(&store.inner.inner, &layout, &head.generation)
            .unwrap()
            .unwrap();
        assert_eq!(
            paths(&m),
            vec!["o.bin", "w.bin"],
            "hidden={hidden}: {:?}",
            r.outcome
        );
        assert_eq!(r.merged, vec![winner], "hidden={hidden}");
    }
}

/// When our head is read back, another publisher's head, naming `above`, appears one seq above
/// it, built without ours (its writer read our seq while our put was in flight).
fn head_appears_above(
    inner: LocalStore,
    above: GenerationId,
) -> Hooked<LocalStore, Mutex<Option<GenerationId>>> {
    Hooked::new(inner, Mutex::new(Some(above))).on_get(|inner, above, key| {
        let value = inner.get(key)?;
        if key.contains("/head/")
            && let Some(v) = &value
            && let Some(winner) = above.lock().unwrap().take()
        {
            let mut head = HeadRecord::decode(v).unwrap();
            head.seq += 1;
            head.generation = winner;
            head.writer = "the other publisher".into();
            let (prefix, _) = key.rsplit_once('/').unwrap();
            inner.put(
                &format!("{prefix}/{}", head.seq),
                &head.encode(),
                ValueClass::Record,
            )?;
        }
        Ok(value)
    })
}

#[test]
fn a_head_written_above_ours_without_it_is_merged() {
    let (dir, race, layout) = setup();
    let winner = other_publisher(&race, &layout, dir.path(), &[("w.bin", b"w")], true);
    let store = head_appears_above(race.inner, winner);
    let root = dir.path().join("ours");
    tree(&root, &[("o.bin", b"ours")]);
    let r = run(&store, &layout, &root);
    assert!(
        store.state.lock().unwrap().is_none(),
        "the other head was written"
    );
    assert!(
        matches!(r.outcome, PublishOutcome::Published { seq: 3, .. }),
        "{:?}",
        r.outcome
    );
    let head = catalog::newest_head(&store.inner, &layout, &r.compat_id)
        .unwrap()
        .unwrap();
    let m = catalog::fetch_manifest(&store.inner, &layout, &head.generation)
        .unwrap()
        .unwrap();
    assert_eq!(paths(&m), vec!["o.bin", "w.bin"]);
}

/// Issue 39: when our head is read back, a store writer has put an unsigned head right above it
/// and junk above that, at every seq a publisher tries next. The publish wrote a head installs
/// take (the one at seq 1: the rest is passed over) and still exited 1 ("gave up after 4
/// attempts"); now it reports that head.
#[test]
fn a_head_of_ours_that_only_untrusted_heads_cover_is_reported_not_a_failure() {
    use crate::trust::{PublisherKey, TrustPolicy};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let layout = KeyLayout::new("ns").unwrap();
    let inner = LocalStore::open(dir.path().join("store")).unwrap();
    let store = Hooked::new(inner, Mutex::new(true)).on_get(|inner, armed, key| {
        let value = inner.get(key)?;
        if key.contains("/head/")
            && let Some(v) = &value
            && std::mem::take(&mut *armed.lock().unwrap())
        {
            let mut head = HeadRecord::decode(v).unwrap();
            head.signature = None;
            head.writer = "attacker".into();
            let (prefix, _) = key.rsplit_once('/').unwrap();
            head.seq += 1;
            inner.put(
                &format!("{prefix}/{}", head.seq),
                &head.encode(),
                ValueClass::Record,
            )?;
            for junk in head.seq + 1..head.seq + 20 {
                inner.put(&format!("{prefix}/{junk}"), b"x", ValueClass::Record)?;
            }
        }
        Ok(value)
    });
    let key = PublisherKey::generate().unwrap();
    let policy = TrustPolicy::new(crate::config::TrustMode::Required, &[key.public_key()]);
    let mut o = opts();
    o.trust = PublishTrust::new(Some(Arc::new(key)), Arc::new(policy));
    let root = dir.path().join("ours");
    tree(&root, &[("o.bin", b"ours")]);
    let policy = NativeRules::new("triton");
    let r = publish(&store, &layout, &policy, &root, &o, None).unwrap();
    assert!(
        matches!(r.outcome, PublishOutcome::Published { seq: 1, .. }),
        "{:?}",
        r.outcome
    );
}

/// Under `required`: a lost race merges a trusted winner and the head written after the merge
/// is signed; a winner whose signature does not match is written over, never merged.
#[test]
fn under_required_a_lost_race_merges_only_a_trusted_winner_and_signs_the_merged_head() {
    use crate::trust::{PublisherKey, Signer, TrustPolicy};
    use std::sync::Arc;
    let key = PublisherKey::generate().unwrap();
    let policy = TrustPolicy::new(crate::config::TrustMode::Required, &[key.public_key()]);
    let mut o = opts();
    o.trust = PublishTrust::new(Some(Arc::new(key.clone())), Arc::new(policy.clone()));
    for trusted_winner in [true, false] {
        let (dir, store, layout) = setup();
        let winner = other_publisher(&store, &layout, dir.path(), &[("w.bin", b"winner's")], true);
        *store.state.winner.lock().unwrap() = Some(winner);
        if trusted_winner {
            *store.state.resign.lock().unwrap() = Some(key.clone());
        }
        let root = dir.path().join("ours");
        tree(&root, &[("o.bin", b"ours")]);
        let r = publish(
            &store,
            &layout,
            &NativeRules::new("triton"),
            &root,
            &o,
            None,
        )
        .unwrap();
        let PublishOutcome::Published { generation, seq } = r.outcome else {
            panic!("{:?}", r.outcome)
        };
        assert_eq!(seq, 2, "wrote above the winner");
        let m = catalog::fetch_manifest(&store, &layout, &generation)
            .unwrap()
            .unwrap();
        let compat = m.compat_id;
        let judge = |seq| {
            policy.judge(
                "ns",
                &catalog::read_head(&store, &layout, &compat, seq)
                    .unwrap()
                    .unwrap(),
            )
        };
        assert!(
            matches!(judge(2), Signer::Trusted { .. }),
            "our head is signed"
        );
        if trusted_winner {
            assert!(matches!(judge(1), Signer::Trusted { .. }));
            assert_eq!(r.merged, vec![winner]);
            assert_eq!(paths(&m), vec!["o.bin", "w.bin"]);
        } else {
            assert!(matches!(judge(1), Signer::Forged { .. }));
            assert!(r.merged.is_empty(), "{:?}", r.merged);
            assert_eq!(
                paths(&m),
                vec!["o.bin"],
                "nothing of the forged head merged"
            );
        }
    }
}

#[test]
fn losing_a_head_race_merges_onto_the_winner_and_reports_the_conflict() {
    let (dir, store, layout) = setup();
    let winner = other_publisher(
        &store,
        &layout,
        dir.path(),
        &[("w.bin", b"winner's"), ("same.bin", b"winner's version")],
        true,
    );
    *store.state.winner.lock().unwrap() = Some(winner);
    let root = dir.path().join("ours");
    tree(&root, &[("o.bin", b"ours"), ("same.bin", b"our version")]);
    let r = run(&store, &layout, &root);
    let PublishOutcome::Published { generation, seq } = r.outcome else {
        panic!("{:?}", r.outcome)
    };
    assert_eq!(seq, 2, "wrote above the winner");
    assert_eq!(r.merged, vec![winner]);
    assert_eq!(r.conflicts.len(), 1);
    assert_eq!(r.conflicts[0].path.as_str(), "same.bin");
    let m = catalog::fetch_manifest(&store, &layout, &generation)
        .unwrap()
        .unwrap();
    assert_eq!(paths(&m), vec!["o.bin", "same.bin", "w.bin"]);
    let same = m
        .files
        .iter()
        .find(|f| f.path.as_str() == "same.bin")
        .unwrap();
    assert_eq!(
        same.blake3,
        ContentHash::of(b"winner's version"),
        "the published version wins"
    );
    assert_eq!(m.parent, Some(winner));
    assert!(catalog::packs_present(&store, &layout, &m).unwrap());
}

#[test]
fn a_winner_whose_manifest_is_missing_or_corrupt_is_written_above() {
    for corrupt in [false, true] {
        let (dir, store, layout) = setup();
        let winner = other_publisher(&store, &layout, dir.path(), &[("w.bin", b"w")], false);
        if corrupt {
            store
                .inner
                .put(
                    &layout.generation(&winner),
                    b"{\"not\": \"a manifest\"}",
                    ValueClass::Record,
                )
                .unwrap();
        }
        *store.state.winner.lock().unwrap() = Some(winner);
        let root = dir.path().join("ours");
        tree(&root, &[("o.bin", b"ours")]);
        let r = run(&store, &layout, &root);
        let PublishOutcome::Published { generation, seq } = r.outcome else {
            panic!("corrupt={corrupt}: {:?}", r.outcome)
        };
        assert_eq!(seq, 2, "corrupt={corrupt}");
        assert!(r.merged.is_empty());
        let head = catalog::newest_head(&store, &layout, &r.compat_id)
            .unwrap()
            .unwrap();
        assert_eq!(head.generation, generation);
        // The next publish builds on our generation, not on the broken one.
        tree(&root, &[("o2.bin", b"more")]);
        let r = run(&store, &layout, &root);
        assert!(
            matches!(r.outcome, PublishOutcome::Published { seq: 3, .. }),
            "{:?}",
            r.outcome
        );
    }
}

#[test]
fn a_corrupt_head_manifest_does_not_block_later_publishes() {
    let (dir, store, layout) = setup();
    let root = dir.path().join("r");
    tree(&root, &[("a.bin", b"a")]);
    let r = run(&store, &layout, &root);
    let PublishOutcome::Published { generation, .. } = r.outcome else {
        panic!()
    };
    let key = layout.generation(&generation);
    store.inner.remove(&key).unwrap();
    store
        .inner
        .put(&key, b"garbage", ValueClass::Record)
        .unwrap();
    tree(&root, &[("b.bin", b"b")]);
    let r = run(&store, &layout, &root);
    let PublishOutcome::Published { generation, seq: 2 } = r.outcome else {
        panic!("{:?}", r.outcome)
    };
    let m = catalog::fetch_manifest(&store, &layout, &generation)
        .unwrap()
        .unwrap();
    assert_eq!(paths(&m), vec!["a.bin", "b.bin"]);
    assert_eq!(m.parent, None, "a fresh chain");
}

#[test]
fn a_parent_with_lost_packs_is_repaired_by_the_next_publish() {
    let (dir, store, layout) = setup();
    let root = dir.path().join("r");
    // Two files of 3 KiB: one pack each at a 4 KiB pack size.
    tree(&root, &[("a.bin", &[1u8; 3072]), ("b.bin", &[2u8; 3072])]);
    let r = run(&store, &layout, &root);
    let m = published_manifest(&store, &layout, &r);
    assert_eq!(m.packs.len(), 2);
    let b = m.files.iter().find(|f| f.path.as_str() == "b.bin").unwrap();
    let lost = m.packs[b.chunks[0].pack as usize].id;
    store.inner.remove(&layout.pack(&lost)).unwrap();

    // A publisher without b.bin: the new generation drops it and is complete.
    let other = dir.path().join("other");
    tree(&other, &[("a.bin", &[1u8; 3072]), ("c.bin", b"c")]);
    let r = run(&store, &layout, &other);
    let m = published_manifest(&store, &layout, &r);
    assert_eq!(paths(&m), vec!["a.bin", "c.bin"]);
    assert!(catalog::packs_present(&store, &layout, &m).unwrap());

    // A publisher with b.bin uploads it again, even with nothing else new.
    store.inner.remove(&layout.pack(&lost)).unwrap();
    let r = run(&store, &layout, &root);
    let m = published_manifest(&store, &layout, &r);
    assert_eq!(paths(&m), vec!["a.bin", "b.bin", "c.bin"]);
    assert!(catalog::packs_present(&store, &layout, &m).unwrap());
}
