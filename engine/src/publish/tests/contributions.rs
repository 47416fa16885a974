//! Contributions (issue 40; `docs/concurrent-publishes.md`): a loser leaves its generation where
//! the next head's writer merges it, and is done once a head names it.

use super::*;

/// What another publisher does when our contribution lands (the hook on its put): nothing, a
/// head at the next seq carrying it, or a contribution of its own in another slot.
#[derive(Debug)]
enum OnContribution {
    /// Writes the head above the lost seq: the winner's files and ours, naming ours in `merged`.
    CarryItInTheNextHead { winner: GenerationId },
    /// Leaves its own generation as a contribution at the same seq.
    ContributeToo(GenerationId),
}

type Contributions = Hooked<LosesFirstHead, Mutex<Option<OnContribution>>>;

fn on_contribution(race: LosesFirstHead, then: OnContribution) -> Contributions {
    Hooked::new(race, Mutex::new(Some(then))).on_put(|race, then, key, value, class| {
        race.put(key, value, class)?;
        if !key.contains("/contrib/") {
            return Ok(());
        }
        let record = HeadRecord::decode(value).unwrap();
        let layout = KeyLayout::new("ns").unwrap();
        match then.lock().unwrap().take() {
            None => {}
            Some(OnContribution::CarryItInTheNextHead { winner }) => {
                let fetch = |id| catalog::fetch_manifest(race, &layout, id).unwrap().unwrap();
                let (w, ours) = (fetch(&winner), fetch(&record.generation));
                let mut next = w.clone();
                let (files, packs, _) = merge_files(&w.files, &w.packs, &ours.files, &ours.packs);
                (next.files, next.packs) = (files, packs);
                next.parent = Some(winner);
                next.merged = vec![record.generation];
                next.normalize();
                race.put(
                    &layout.generation(&next.id()),
                    &next.encode(),
                    ValueClass::Record,
                )?;
                let head = HeadRecord {
                    seq: record.seq + 1,
                    generation: next.id(),
                    writer: "the carrier".into(),
                    ..record.clone()
                };
                let key = layout.head(&record.compat_id, head.seq);
                race.put(&key, &head.encode(), ValueClass::Record)?;
            }
            Some(OnContribution::ContributeToo(other)) => {
                let theirs = HeadRecord {
                    generation: other,
                    writer: "another loser".into(),
                    ..record.clone()
                };
                let free = (0..catalog::contributions::CONTRIBUTION_SLOTS)
                    .map(|slot| layout.contribution(&record.compat_id, record.seq, slot))
                    .find(|k| !race.exists(k).unwrap())
                    .unwrap();
                race.put(&free, &theirs.encode(), ValueClass::Record)?;
            }
        }
        Ok(())
    })
}

/// The manifests in the store, by id.
fn manifest_ids(store: &LocalStore, layout: &KeyLayout) -> Vec<GenerationId> {
    let prefix = layout.generations_prefix();
    store
        .list(&prefix)
        .unwrap()
        .iter()
        .map(|k| k.strip_prefix(&prefix).unwrap().parse().unwrap())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

#[test]
fn a_loser_whose_contribution_the_next_head_carries_is_done_and_leaves_no_stray_manifest() {
    let (dir, race, layout) = setup();
    let winner = other_publisher(&race, &layout, dir.path(), &[("w.bin", b"w")], true);
    *race.state.winner.lock().unwrap() = Some(winner);
    let store = on_contribution(race, OnContribution::CarryItInTheNextHead { winner });
    let root = dir.path().join("ours");
    tree(&root, &[("o.bin", b"ours")]);
    let r = run(&store, &layout, &root);
    let PublishOutcome::Published { generation, seq } = r.outcome else {
        panic!("{:?}", r.outcome)
    };
    assert_eq!(seq, 2, "the head that carried our contribution");
    assert!(
        r.carried,
        "another's head: its packs are not noted as checked by this publish"
    );
    let inner = &store.inner.inner;
    let head = catalog::newest_head(inner, &layout, &r.compat_id)
        .unwrap()
        .unwrap();
    assert_eq!((head.seq, head.writer.as_str()), (2, "the carrier"));
    assert_eq!(head.generation, generation);
    let m = catalog::fetch_manifest(inner, &layout, &generation)
        .unwrap()
        .unwrap();
    assert_eq!(paths(&m), vec!["o.bin", "w.bin"]);
    // Our first attempt is named by the contribution and the head's `merged`; the attempt we
    // put for seq 2 (and lost) is named by nothing, so it is gone.
    let mut expected = vec![winner, generation, m.merged[0]];
    expected.sort();
    assert_eq!(manifest_ids(inner, &layout), expected);
}

#[test]
fn the_next_head_merges_every_contribution_at_the_lost_seq() {
    let (dir, race, layout) = setup();
    let winner = other_publisher(&race, &layout, dir.path(), &[("w.bin", b"w")], true);
    let other = {
        let scratch = tempfile::tempdir().unwrap();
        other_publisher(
            &race,
            &layout,
            scratch.path(),
            &[("x.bin", b"another loser's")],
            true,
        )
    };
    *race.state.winner.lock().unwrap() = Some(winner);
    let store = on_contribution(race, OnContribution::ContributeToo(other));
    let root = dir.path().join("ours");
    tree(&root, &[("o.bin", b"ours")]);
    let r = run(&store, &layout, &root);
    let m = published_manifest(&store, &layout, &r);
    let PublishOutcome::Published { seq, .. } = r.outcome else {
        unreachable!()
    };
    assert_eq!(seq, 2);
    assert_eq!(paths(&m), vec!["o.bin", "w.bin", "x.bin"]);
    assert_eq!(m.parent, Some(winner));
    assert!(m.merged.contains(&other), "{:?}", m.merged);
    assert!(r.merged.contains(&other));
}

#[test]
fn junk_in_every_contribution_slot_only_sends_the_loser_to_the_next_seq() {
    let (dir, race, layout) = setup();
    let winner = other_publisher(&race, &layout, dir.path(), &[("w.bin", b"w")], true);
    *race.state.winner.lock().unwrap() = Some(winner);
    let root = dir.path().join("ours");
    tree(&root, &[("o.bin", b"ours")]);
    let compat = CompatId::new(
        "triton",
        &NativeRules::new("triton")
            .compat_key(&opts().facts)
            .unwrap(),
    );
    for slot in 0..catalog::contributions::CONTRIBUTION_SLOTS {
        let key = layout.contribution(&compat, 1, slot);
        race.inner.put(&key, b"junk", ValueClass::Record).unwrap();
    }
    let r = run(&race, &layout, &root);
    let m = published_manifest(&race, &layout, &r);
    assert_eq!(paths(&m), vec!["o.bin", "w.bin"]);
    assert_eq!(m.parent, Some(winner));
}

/// A contribution is signed under its own domain: under `required` an unsigned one is not
/// merged, and a trusted publisher's signed contribution is never a valid head.
#[test]
fn under_required_only_trusted_contributions_are_merged_and_none_passes_as_a_head() {
    use crate::trust::{PublisherKey, Signer, TrustPolicy};
    use std::sync::Arc;
    let key = PublisherKey::generate().unwrap();
    let policy = TrustPolicy::new(crate::config::TrustMode::Required, &[key.public_key()]);
    let (dir, race, layout) = setup();
    let winner = other_publisher(&race, &layout, dir.path(), &[("w.bin", b"w")], true);
    let other = {
        let scratch = tempfile::tempdir().unwrap();
        other_publisher(
            &race,
            &layout,
            scratch.path(),
            &[("x.bin", b"unsigned")],
            true,
        )
    };
    *race.state.winner.lock().unwrap() = Some(winner);
    *race.state.resign.lock().unwrap() = Some(key.clone());
    let store = on_contribution(race, OnContribution::ContributeToo(other));
    let mut o = opts();
    o.trust =
        crate::trust::PublishTrust::new(Some(Arc::new(key.clone())), Arc::new(policy.clone()));
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
    let m = published_manifest(&store, &layout, &r);
    assert_eq!(
        paths(&m),
        vec!["o.bin", "w.bin"],
        "the unsigned contribution is not merged"
    );
    assert!(!m.merged.contains(&other));

    let ours =
        catalog::contributions::read_contributions(&store.inner.inner, &layout, &r.compat_id, 1)
            .unwrap()
            .into_iter()
            .filter_map(|(_, read)| read.ok())
            .find(|c| c.generation != other)
            .expect("our signed contribution");
    let domain = catalog::contributions::signing_domain("ns");
    assert!(matches!(
        policy.judge(&domain, &ours),
        Signer::Trusted { .. }
    ));
    assert!(
        matches!(policy.judge("ns", &ours), Signer::Forged { .. }),
        "a contribution copied to a head key does not verify"
    );
}
