//! Heads and floors: every reader of head and floor records, over any records at their keys.

use super::*;

#[derive(Debug, Clone)]
struct HeadCase {
    listing: bool,
    heads: Vec<(u64, bool, Content)>,
    /// Floor records at seqs 1.. of the floor sequence: (floor, keep, content).
    floors: Vec<(u64, Vec<u64>, Content)>,
}

fn head_cases() -> impl Strategy<Value = HeadCase> {
    (
        any::<bool>(),
        proptest::collection::vec((seq(), any::<bool>(), content()), 0..10),
        proptest::collection::vec(
            (
                prop_oneof![3 => 1u64..8, 1 => edgy_u64()],
                proptest::collection::vec(edgy_u64(), 0..6),
                content(),
            ),
            0..4,
        ),
    )
        .prop_map(|(listing, heads, floors)| HeadCase {
            listing,
            heads,
            floors,
        })
}

/// Heads and floors at any seq with any bytes: every head read is judged against its own key,
/// a walk yields existing seqs strictly newest first and ends within one step per record and a
/// bounded number of probes, and every reader agrees with the walk.
#[test]
fn head_and_floor_readers_survive_any_records() {
    run(head_cases(), |fixture, case| {
        let (store, layout) = fixture.case(case.listing);
        let store = store.as_ref();
        let c = compat();
        let mut planted = BTreeMap::new();
        for (seq, signed, content) in &case.heads {
            let valid = head(c, *seq, *signed).encode();
            let elsewhere = if seq % 2 == 0 {
                head(other_compat(), *seq, *signed).encode()
            } else {
                head(c, seq.wrapping_add(1), *signed).encode()
            };
            let bytes = content.bytes(valid, elsewhere, jitship_catalog::MAX_HEAD_BYTES);
            let stored = plant(store, &layout.head(&c, *seq), &bytes)?;
            planted.insert(*seq, stored);
        }
        let mut floors = BTreeMap::new();
        for (i, (floor, keep, content)) in case.floors.iter().enumerate() {
            let seq = i as u64 + 1;
            let record = |compat, seq| FloorRecord {
                compat_id: compat,
                seq,
                floor: *floor,
                keep: keep.clone(),
                written_at: 1,
                writer: "gc".into(),
            };
            let bytes = content.bytes(
                encode(&record(c, seq)),
                encode(&record(other_compat(), seq)),
                jitship_catalog::MAX_RECORD_BYTES,
            );
            floors.insert(seq, plant(store, &layout.floor(&c, seq), &bytes)?);
        }

        // Each planted head, read at its key.
        for (&seq, stored) in &planted {
            let read = read_head_at(store, &layout, &c, seq)
                .map_err(|e| TestCaseError::fail(format!("read_head_at {seq}: {e}")))?;
            match read {
                Some(Ok(h)) => {
                    prop_assert!(
                        h.seq == seq && h.compat_id == c,
                        "mislabelled head accepted"
                    );
                    prop_assert_eq!(HeadRecord::decode(stored).ok(), Some(h.clone()));
                    prop_assert_eq!(HeadRecord::decode(&h.encode()).ok(), Some(h));
                }
                Some(Err(HeadFault::Corrupt { .. })) => {
                    prop_assert!(HeadRecord::decode(stored).is_err());
                }
                Some(Err(HeadFault::Mislabelled)) => {
                    let h = HeadRecord::decode(stored);
                    prop_assert!(h.is_ok_and(|h| h.seq != seq || h.compat_id != c));
                }
                Some(Err(HeadFault::TooLarge { size })) => {
                    prop_assert!(size > jitship_catalog::MAX_HEAD_BYTES);
                    prop_assert_eq!(size, stored.len() as u64);
                }
                None => {
                    return Err(TestCaseError::fail(format!(
                        "planted head {seq} read as missing"
                    )));
                }
            }
        }
        let unplanted = (1..)
            .find(|s| !planted.contains_key(s))
            .expect("a free seq");
        prop_assert!(matches!(
            read_head_at(store, &layout, &c, unplanted),
            Ok(None)
        ));

        // The newest floor: one of those planted, labelled with its key, in range.
        let floor = newest_floor(store, &layout, &c)
            .map_err(|e| TestCaseError::fail(format!("newest_floor: {e}")))?;
        if let Some(f) = &floor {
            prop_assert!(f.compat_id == c && f.floor <= MAX_SEQ);
            consistent(f, &floors[&f.seq])?;
        }

        // The walk: seqs that hold records, strictly newest first, one step per record.
        let mut walk = HeadWalk::new(store, &layout, &c)
            .map_err(|e| TestCaseError::fail(format!("HeadWalk::new: {e}")))?;
        if let Some(f) = &walk.floor {
            prop_assert!(f.compat_id == c && f.floor <= MAX_SEQ);
        }
        let mut seen = Vec::new();
        let mut usable = Vec::new();
        for _ in 0..=planted.len() {
            let next = walk
                .next_head()
                .map_err(|e| TestCaseError::fail(format!("next_head: {e}")))?;
            let seq = match next {
                None => break,
                Some(Ok(h)) => {
                    usable.push(h.clone());
                    h.seq
                }
                Some(Err(f)) => f.seq,
            };
            prop_assert!(
                planted.contains_key(&seq),
                "walk yielded {seq}, never written"
            );
            prop_assert!(
                (1..=MAX_SEQ).contains(&seq),
                "walk yielded {seq}, out of range"
            );
            prop_assert!(
                seen.last().is_none_or(|&last| seq < last),
                "walk went up: {seen:?} then {seq}"
            );
            seen.push(seq);
        }
        prop_assert!(
            matches!(walk.next_head(), Ok(None)),
            "walk not done after one step per record ({} planted)",
            planted.len()
        );
        if case.listing {
            let in_range: Vec<u64> = planted
                .keys()
                .rev()
                .copied()
                .filter(|s| *s <= MAX_SEQ)
                .collect();
            prop_assert_eq!(
                &seen,
                &in_range,
                "a listing walk sees every record in range"
            );
        }
        // A search (at most 2 x 54 probes) from 1, each floor and each kept seq (at most 4 floors
        // of 6), and again below each gap; one probe per record walked.
        let bound = (29 + 2 * planted.len() as u64) * 110;
        prop_assert!(
            walk.probes() <= bound,
            "{} probes, over {bound}",
            walk.probes()
        );

        // The other readers agree with the walk.
        let newest = newest_head(store, &layout, &c)
            .map_err(|e| TestCaseError::fail(format!("newest_head: {e}")))?;
        prop_assert_eq!(newest.as_ref(), usable.first());
        let all = all_heads(store, &layout, &c)
            .map_err(|e| TestCaseError::fail(format!("all_heads: {e}")))?;
        prop_assert_eq!(&all.heads, &usable);
        let mut both: Vec<u64> = all
            .heads
            .iter()
            .map(|h| h.seq)
            .chain(all.faulty.iter().map(|f| f.seq))
            .collect();
        both.sort_unstable_by(|a, b| b.cmp(a));
        prop_assert_eq!(both, seen);
        Ok(())
    });
}
