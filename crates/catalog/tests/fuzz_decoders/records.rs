//! The compat index, gc journals, pins and manifests, over any records at their keys.

use super::*;

/// Index entries at any seq with any bytes: `compat_ids` returns (sorted, unique), and every id
/// it names is one an entry at an index key decodes to.
#[test]
fn compat_index_reader_survives_any_records() {
    let strategy = (
        any::<bool>(),
        proptest::collection::vec((seq(), "[ -~]{0,6}", content()), 0..8),
    );
    run(strategy, |fixture, (listing, entries)| {
        let (store, layout) = fixture.case(listing);
        let store = store.as_ref();
        let mut decoded = Vec::new();
        for (seq, key, content) in &entries {
            let entry = |key: &str| IndexEntry {
                compat_id: CompatId::new("triton", key),
                cache_kind: "triton".into(),
                compat_key: key.to_owned(),
                written_at: *seq,
                writer: "w".into(),
            };
            let bytes = content.bytes(
                encode(&entry(key)),
                encode(&entry("elsewhere")),
                jitship_catalog::MAX_RECORD_BYTES,
            );
            let stored = plant(store, &layout.index(*seq), &bytes)?;
            if let Ok(e) = serde_json::from_slice::<IndexEntry>(&stored) {
                consistent(&e, &stored)?;
                decoded.push(e.compat_id);
            }
        }
        let ids = compat_ids(store, &layout)
            .map_err(|e| TestCaseError::fail(format!("compat_ids: {e}")))?;
        prop_assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "not sorted and unique: {ids:?}"
        );
        for id in &ids {
            prop_assert!(decoded.contains(id), "{id} is in no entry written");
        }
        Ok(())
    });
}

/// Journals at any seq with any bytes: `newest_gc_journal` returns, and a journal it returns is
/// one written at a journal key, re-encoding consistently.
#[test]
fn gc_journal_reader_survives_any_records() {
    let strategy = (
        any::<bool>(),
        proptest::collection::vec(
            (
                seq(),
                proptest::collection::vec("[ -~]{0,24}", 0..4),
                content(),
            ),
            0..6,
        ),
    );
    run(strategy, |fixture, (listing, journals)| {
        let (store, layout) = fixture.case(listing);
        let store = store.as_ref();
        let mut planted = BTreeMap::new();
        for (seq, keys, content) in &journals {
            let journal = |seq| GcJournal {
                seq,
                written_at: 1,
                writer: "gc".into(),
                keys: keys.clone(),
                packs: vec![ContentHash([7; 32])],
            };
            let bytes = content.bytes(
                encode(&journal(*seq)),
                encode(&journal(seq.wrapping_add(1))),
                // Not the 64 MiB cap: padded with whitespace, still a journal.
                OVERSIZED_CHEAP,
            );
            planted.insert(*seq, plant(store, &layout.gc_journal(*seq), &bytes)?);
        }
        // A corrupt newest journal is an error today (issue 39 asks for better); a panic is not.
        if let Ok(Some(j)) = newest_gc_journal(store, &layout) {
            prop_assert!(
                planted
                    .values()
                    .any(|stored| consistent(&j, stored).is_ok()),
                "{j:?} was not written"
            );
        }
        Ok(())
    });
}

/// Pins with any bytes: `pin_record` returns, and a record it returns is what the key holds.
#[test]
fn pin_reader_survives_any_records() {
    let strategy = (
        any::<bool>(),
        any::<[u8; 32]>(),
        proptest::option::of("[ -~]{0,16}"),
        content(),
    );
    run(strategy, |fixture, (listing, id, reason, content)| {
        let (store, layout) = fixture.case(listing);
        let store = store.as_ref();
        let id = GenerationId(ContentHash(id));
        let pin = |generation| PinRecord {
            generation,
            pinned_at: 1,
            by: "w".into(),
            reason: reason.clone(),
        };
        let bytes = content.bytes(
            encode(&pin(id)),
            encode(&pin(GenerationId(ContentHash([0; 32])))),
            jitship_catalog::MAX_RECORD_BYTES,
        );
        let stored = plant(store, &layout.pin(&id), &bytes)?;
        match pin_record(store, &layout, &id) {
            Ok(Some(p)) => consistent(&p, &stored)?,
            Ok(None) => return Err(TestCaseError::fail("a pin written reads as missing")),
            Err(_) => prop_assert!(
                serde_json::from_slice::<PinRecord>(&stored).is_err()
                    || stored.len() as u64 > jitship_catalog::MAX_RECORD_BYTES
            ),
        }
        Ok(())
    });
}

fn manifest(key: &str, files: &[(&str, u64)]) -> Manifest {
    let mut offset = 0;
    let files = files
        .iter()
        .map(|(path, size)| {
            let chunks = if *size == 0 {
                vec![]
            } else {
                vec![Chunk {
                    pack: 0,
                    offset,
                    len: *size,
                }]
            };
            offset += size;
            FileRecord {
                path: RelPath::parse(path).expect("a path"),
                size: *size,
                mode: 0o644,
                mtime_s: 1,
                mtime_ns: 2,
                blake3: ContentHash([5; 32]),
                chunks,
                marker: false,
                canonical: false,
            }
        })
        .collect();
    Manifest {
        format: FORMAT_VERSION,
        cache_kind: "triton".into(),
        compat_key: key.into(),
        compat_id: CompatId::new("triton", key),
        facts: BTreeMap::from([("gpu.name".into(), "H100".into())]),
        policy: PolicyRef {
            name: "native".into(),
            version: "1".into(),
            digest: "native".into(),
            settings: BTreeMap::from([("keep".into(), "3".into())]),
        },
        parent: None,
        merged: vec![],
        producer: Producer {
            host: "h".into(),
            pod: None,
            jitship_version: "0".into(),
        },
        created_at: 1,
        packs: vec![PackRef {
            id: ContentHash([6; 32]),
            size: offset,
        }],
        files,
        incomplete: None,
    }
}

/// Manifests with any bytes, stored under their own id or another: `read_manifest` returns, and
/// a manifest it accepts is exactly the canonical bytes stored, valid, under its own id.
#[test]
fn manifest_reader_survives_any_records() {
    let strategy = (any::<bool>(), any::<bool>(), content());
    let valid = manifest("k", &[("a/x", 4), ("a/y", 0), ("b", 9)]);
    run(strategy, |fixture, (listing, own_id, content)| {
        let (store, layout) = fixture.case(listing);
        let store = store.as_ref();
        let bytes = content.bytes(
            valid.encode(),
            manifest("other", &[("c", 1)]).encode(),
            // Not the 256 MiB cap: padded, so not canonical, is refused all the same.
            OVERSIZED_CHEAP,
        );
        let id = if own_id {
            GenerationId(ContentHash::of(&bytes))
        } else {
            valid.id()
        };
        let stored = plant(store, &layout.generation(&id), &bytes)?;
        match read_manifest(store, &layout, &id) {
            Ok(ManifestRead::Present(m)) => {
                prop_assert_eq!(m.encode(), stored);
                prop_assert_eq!(m.id(), id);
                prop_assert!(m.validate().is_ok());
            }
            Ok(ManifestRead::Missing) => {
                return Err(TestCaseError::fail("a manifest written reads as missing"));
            }
            Ok(ManifestRead::Unreadable(_)) => {}
            Err(e) => return Err(TestCaseError::fail(format!("read_manifest: {e}"))),
        }
        Ok(())
    });
}
