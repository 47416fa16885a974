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

mod heads;
mod records;

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
