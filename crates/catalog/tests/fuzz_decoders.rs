//! Bounded, seeded fuzzing of the catalog's record readers through its public API, in the
//! suite: whatever bytes anyone puts at a head, floor, index, gc journal, pin or manifest key,
//! the readers (`read_head_at`, `HeadWalk`, `newest_head`, `all_heads`, `newest_floor`,
//! `compat_ids`, `newest_gc_journal`, `pin_record`, `read_manifest`) return, never panic, stay
//! within a bounded number of steps and probes, and what they accept is what was stored there
//! (decodes from those bytes, labelled with its own key, and re-encodes to a record that decodes
//! equal).
//!
//! Records are random bytes, valid records, valid records of another key, or valid records
//! mutated (bytes flipped, inserted, deleted, truncated, JSON-shaped splices, numbers swapped
//! for extremes), at seqs that include the ends of the range (`MAX_SEQ`, above it, `u64::MAX`).
//! Each case writes into a fresh namespace of one local store (no fsync), read with listing and
//! without (the Mooncake path: probing and floors).
//!
//! Seed `SEED` (ChaCha), `CASES` cases per test, failure persistence off (nothing is written into
//! the repository); a few seconds per test in a debug build. A longer or different run:
//! `PROPTEST_CASES=20000 PROPTEST_RNG_SEED=7 cargo test -p jitship-catalog --test
//! fuzz_decoders` (a failure prints the seed and the shrunk input).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use jitship_catalog::{
    FloorRecord, GcJournal, HeadFault, HeadWalk, IndexEntry, KeyLayout, MAX_SEQ, ManifestRead,
    PinRecord, all_heads, compat_ids, newest_floor, newest_gc_journal, newest_head, pin_record,
    read_head_at, read_manifest,
};
use jitship_generation::{
    Chunk, CompatId, ContentHash, FORMAT_VERSION, FileRecord, GenerationId, HeadRecord,
    HeadSignature, Manifest, PackRef, PolicyRef, Producer, RelPath,
};
use jitship_store::testing::WithoutListing;
use jitship_store::{LocalStore, Store, ValueClass};
use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, RngSeed, TestRunner};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The fixed seed of every test here ("jitship\x39" in ASCII).
const SEED: u64 = 0x6a69_7473_6869_7039;
const CASES: u32 = 256;
/// How far `Content::Oversized` pads records whose cap is too large to write in every case.
const OVERSIZED_CHEAP: u64 = 70_000;

/// `cases` at `SEED`, unless `PROPTEST_CASES` / `PROPTEST_RNG_SEED` ask for another run.
fn config(cases: u32) -> ProptestConfig {
    let env = ProptestConfig::default();
    ProptestConfig {
        cases: if std::env::var_os("PROPTEST_CASES").is_some() {
            env.cases
        } else {
            cases
        },
        rng_algorithm: RngAlgorithm::ChaCha,
        rng_seed: if std::env::var_os("PROPTEST_RNG_SEED").is_some() {
            env.rng_seed
        } else {
            RngSeed::Fixed(SEED)
        },
        failure_persistence: None,
        ..env
    }
}

/// One local store for every case of a test, each case in a namespace of its own.
struct Fixture {
    dir: tempfile::TempDir,
    store: Arc<LocalStore>,
    next: AtomicU64,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        // No fsync: nothing here needs to survive a crash.
        let store = Arc::new(LocalStore::scratch(dir.path()).expect("a local store"));
        Self {
            dir,
            store,
            next: AtomicU64::new(0),
        }
    }

    /// Removes what the last case wrote (an oversized record is a MiB).
    fn clear(&self) {
        for entry in std::fs::read_dir(self.dir.path()).expect("the store's directory") {
            let path = entry.expect("an entry").path();
            if path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("case"))
            {
                std::fs::remove_dir_all(&path).expect("remove a case's namespace");
            }
        }
    }

    /// A fresh namespace, and the store as a case sees it: listing, or probing like Mooncake.
    fn case(&self, listing: bool) -> (Box<dyn Store>, KeyLayout) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let layout = KeyLayout::new(&format!("case{n}")).expect("a namespace");
        let store: Box<dyn Store> = if listing {
            Box::new(self.store.clone())
        } else {
            Box::new(WithoutListing(self.store.clone()))
        };
        (store, layout)
    }
}

/// Runs `test` on `cases` values of `strategy` at the fixed seed, one fixture for all.
fn run<S: Strategy>(strategy: S, test: impl Fn(&Fixture, S::Value) -> Result<(), TestCaseError>)
where
    S::Value: Debug,
{
    let fixture = Fixture::new();
    let mut runner = TestRunner::new(config(CASES));
    let result = runner.run(&strategy, |v| {
        let outcome = test(&fixture, v);
        fixture.clear();
        outcome
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// What is written at a key

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Truncate(usize),
    Splice(usize, String),
    /// Replaces the `n`th run of ASCII digits (a number) with another.
    Number(usize, String),
}

fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(",\"extra\":1".to_owned()),
        Just("\"seq\":1,".to_owned()),
        Just("\"keep\":[1,2,3],".to_owned()),
        Just("\"reason\":null,".to_owned()),
        Just("null".to_owned()),
        Just(" ".to_owned()),
        Just("{}".to_owned()),
        Just("[]".to_owned()),
        Just("\"".to_owned()),
        Just("\\u0000".to_owned()),
        Just("\\ud800".to_owned()),
        Just("\u{1b}[2J".to_owned()),
        Just("[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[".to_owned()),
        "[0-9a-f]{1,64}",
        "[ -~]{0,12}",
    ]
}

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_owned()),
        Just("-1".to_owned()),
        Just("9007199254740991".to_owned()),
        Just("9007199254740992".to_owned()),
        Just("9007199254740993".to_owned()),
        Just("18446744073709551615".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("1.5".to_owned()),
        Just("1e400".to_owned()),
        any::<u64>().prop_map(|n| n.to_string()),
    ]
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    let one = prop_oneof![
        3 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        2 => any::<usize>().prop_map(Mutation::Delete),
        1 => any::<usize>().prop_map(Mutation::Truncate),
        3 => (any::<usize>(), fragment()).prop_map(|(i, s)| Mutation::Splice(i, s)),
        3 => (any::<usize>(), number()).prop_map(|(i, s)| Mutation::Number(i, s)),
    ];
    proptest::collection::vec(one, 1..4)
}

fn apply(mut bytes: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
    for m in ms {
        let n = bytes.len().max(1);
        match m {
            Mutation::Flip(i, b) if !bytes.is_empty() => bytes[i % n] ^= b | 1,
            Mutation::Insert(i, b) => bytes.insert(i % (bytes.len() + 1), *b),
            Mutation::Delete(i) if !bytes.is_empty() => {
                bytes.remove(i % n);
            }
            Mutation::Truncate(i) => bytes.truncate(i % n),
            Mutation::Splice(i, s) => {
                let at = i % (bytes.len() + 1);
                bytes.splice(at..at, s.bytes());
            }
            Mutation::Number(i, s) => {
                let runs = digit_runs(&bytes);
                if !runs.is_empty() {
                    let (start, end) = runs[i % runs.len()];
                    bytes.splice(start..end, s.bytes());
                }
            }
            _ => {}
        }
    }
    bytes
}

fn digit_runs(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut start = None;
    for (i, b) in bytes.iter().enumerate() {
        match (b.is_ascii_digit(), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                runs.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        runs.push((s, bytes.len()));
    }
    runs
}

/// What a case writes at one key, given the valid record for that key and one for another key.
#[derive(Debug, Clone)]
enum Content {
    Random(Vec<u8>),
    Valid,
    /// The valid record of another key (another seq, compat id or generation).
    Elsewhere,
    Mutated(Vec<Mutation>),
    /// Over every record's size cap.
    Oversized,
}

fn content() -> impl Strategy<Value = Content> {
    prop_oneof![
        2 => proptest::collection::vec(any::<u8>(), 0..300).prop_map(Content::Random),
        2 => Just(Content::Valid),
        1 => Just(Content::Elsewhere),
        5 => mutations().prop_map(Content::Mutated),
        1 => Just(Content::Oversized),
    ]
}

impl Content {
    fn bytes(&self, valid: Vec<u8>, elsewhere: Vec<u8>, cap: u64) -> Vec<u8> {
        match self {
            Self::Random(b) => b.clone(),
            Self::Valid => valid,
            Self::Elsewhere => elsewhere,
            Self::Mutated(ms) => apply(valid, ms),
            Self::Oversized => {
                let mut b = valid;
                b.resize(cap as usize + 1, b' ');
                b
            }
        }
    }
}

/// Seqs where the bounds live: a contiguous run from 1, further up, the ends of the range.
fn seq() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => 1u64..6,
        2 => 6u64..64,
        1 => Just(MAX_SEQ - 1),
        1 => Just(MAX_SEQ),
        1 => Just(MAX_SEQ + 1),
        1 => Just(u64::MAX),
        1 => any::<u64>(),
    ]
}

fn edgy_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0u64..64,
        1 => Just(MAX_SEQ),
        1 => Just(MAX_SEQ + 1),
        1 => (u64::MAX - 4)..=u64::MAX,
        1 => any::<u64>(),
    ]
}

/// Puts `bytes` at `key` (the first put of a key wins) and returns what the key holds.
fn plant(store: &dyn Store, key: &str, bytes: &[u8]) -> Result<Vec<u8>, TestCaseError> {
    store
        .put(key, bytes, ValueClass::Record)
        .map_err(|e| TestCaseError::fail(format!("put {key}: {e}")))?;
    store
        .get(key)
        .map_err(|e| TestCaseError::fail(format!("get {key}: {e}")))?
        .ok_or_else(|| TestCaseError::fail(format!("{key} vanished")))
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("a record serializes")
}

/// `value` was decoded from `stored` and re-encodes to bytes that decode equal.
fn consistent<T: Serialize + DeserializeOwned + PartialEq + Debug>(
    value: &T,
    stored: &[u8],
) -> Result<(), TestCaseError> {
    let from_stored: Option<T> = serde_json::from_slice(stored).ok();
    prop_assert_eq!(from_stored.as_ref(), Some(value), "not what the key holds");
    let again: Option<T> = serde_json::from_slice(&encode(value)).ok();
    prop_assert_eq!(
        again.as_ref(),
        Some(value),
        "does not re-encode consistently"
    );
    Ok(())
}

fn head(compat: CompatId, seq: u64, signed: bool) -> HeadRecord {
    HeadRecord {
        compat_id: compat,
        seq,
        generation: GenerationId(ContentHash([seq as u8; 32])),
        written_at: seq,
        writer: format!("w:{seq}"),
        signature: signed.then(|| HeadSignature {
            key_id: "0123456789abcdef".into(),
            ed25519: "ab".repeat(64),
        }),
    }
}

fn compat() -> CompatId {
    CompatId::new("triton", "k")
}

fn other_compat() -> CompatId {
    CompatId::new("triton", "other")
}

// ---------------------------------------------------------------------------------------------
// Heads and floors

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

// ---------------------------------------------------------------------------------------------
// The compat index, gc journals, pins and manifests

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
