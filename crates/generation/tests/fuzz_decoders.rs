//! Bounded, seeded fuzzing of every decoder this crate owns, in the suite: `HeadRecord::decode`,
//! `Manifest::decode` and `Manifest::validate`, and the parsers of the ids and paths that come
//! from store keys and records (`ContentHash`, `GenerationId`, `CompatId`, `RelPath`).
//!
//! Each decoder gets fully random bytes and, far more likely to reach deep code, valid encodings
//! mutated (bytes flipped, inserted, deleted, JSON-shaped splices, numbers swapped for extremes).
//! The properties: no input panics, and whatever a decoder accepts re-encodes to a value that
//! decodes equal (the manifest: to exactly the bytes accepted, its only spelling).
//!
//! Seed `SEED` (ChaCha), cases per test in `CASES_*`, failure persistence off (nothing is written
//! into the repository). About a second per test in a debug build. A longer or different run:
//! `PROPTEST_CASES=200000 PROPTEST_RNG_SEED=7 cargo test -p jitship-generation --test
//! fuzz_decoders` (a failure prints the seed and the shrunk input).

use std::collections::BTreeMap;

use jitship_generation::{
    Chunk, CompatId, ContentHash, FORMAT_VERSION, FileRecord, GenerationId, HeadRecord,
    HeadSignature, Manifest, PackRef, PolicyRef, Producer, RelPath, slices_by_pack,
};
use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, RngSeed};

/// The fixed seed of every test here ("jitship\x39" in ASCII).
const SEED: u64 = 0x6a69_7473_6869_7039;
const CASES_RANDOM: u32 = 2000;
const CASES_MUTATED: u32 = 1000;

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

// ---------------------------------------------------------------------------------------------
// Mutations of valid encodings

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

/// JSON fragments that reach the decoders' refusals: unknown fields, wrong types, nesting,
/// escapes, duplicate keys, numbers out of every integer type's range.
fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(",\"extra\":1".to_owned()),
        Just("\"marker\":true,".to_owned()),
        Just("\"signature\":null,".to_owned()),
        Just("\"seq\":1,".to_owned()),
        Just("../".to_owned()),
        Just("/".to_owned()),
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

/// Numbers at the edges: zero, the JSON-safe limit, every unsigned and signed bound, one past,
/// negative, fractional, exponent.
fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_owned()),
        Just("-1".to_owned()),
        Just("9007199254740992".to_owned()),
        Just("4294967295".to_owned()),
        Just("4294967296".to_owned()),
        Just("9223372036854775807".to_owned()),
        Just("9223372036854775808".to_owned()),
        Just("18446744073709551615".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("-9223372036854775809".to_owned()),
        Just("1.5".to_owned()),
        Just("1e400".to_owned()),
        Just("511".to_owned()),
        Just("512".to_owned()),
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

/// Where the runs of ASCII digits are, as `start..end`.
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

// ---------------------------------------------------------------------------------------------
// Valid values to mutate

fn hash() -> impl Strategy<Value = ContentHash> {
    any::<[u8; 32]>().prop_map(ContentHash)
}

fn heads() -> impl Strategy<Value = HeadRecord> {
    (
        "[ -~]{0,8}",
        1u64..=(1 << 53),
        hash(),
        any::<u64>(),
        "[ -~]{0,16}",
        proptest::option::of(("[0-9a-f]{16}", "[0-9a-f]{128}")),
    )
        .prop_map(
            |(key, seq, generation, written_at, writer, sig)| HeadRecord {
                compat_id: CompatId::new("triton", &key),
                seq,
                generation: GenerationId(generation),
                written_at,
                writer,
                signature: sig.map(|(key_id, ed25519)| HeadSignature { key_id, ed25519 }),
            },
        )
}

fn empty_manifest(key: &str, created_at: u64) -> Manifest {
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
            settings: BTreeMap::new(),
        },
        parent: None,
        merged: vec![],
        producer: Producer {
            host: "h".into(),
            pod: None,
            jitship_version: "0".into(),
        },
        created_at,
        packs: vec![],
        files: vec![],
        incomplete: None,
    }
}

/// Valid manifests of varied shape: files under a few directories laid end to end in one or two
/// packs, markers, settings, parents, an incomplete note.
fn manifests() -> impl Strategy<Value = Manifest> {
    let file = (
        "[a-c]{1,2}(/[a-c_.]{1,3}){0,2}",
        0u64..64,
        0u32..=0o777,
        any::<bool>(),
        any::<bool>(),
    );
    (
        proptest::collection::vec(file, 0..10),
        any::<u64>(),
        "[ -~]{0,8}",
        proptest::option::of(hash()),
        proptest::collection::btree_map("[a-z]{1,6}", "[ -~]{0,8}", 0..3),
        proptest::option::of("[ -~]{0,12}"),
    )
        .prop_map(|(files, created_at, key, parent, settings, incomplete)| {
            let mut m = empty_manifest(&key, created_at);
            m.parent = parent.map(GenerationId);
            m.policy.settings = settings;
            m.incomplete = incomplete;
            let mut files: Vec<_> = files
                .into_iter()
                .filter_map(|(path, size, mode, marker, canonical)| {
                    Some((RelPath::parse(&path).ok()?, size, mode, marker, canonical))
                })
                .collect();
            files.sort_by(|a, b| a.0.cmp(&b.0));
            files.dedup_by(|a, b| a.0 == b.0);
            let dirs: std::collections::HashSet<String> = files
                .iter()
                .flat_map(|f| f.0.ancestors().map(str::to_owned).collect::<Vec<_>>())
                .collect();
            files.retain(|f| !dirs.contains(f.0.as_str()));
            // Files end to end; the second half of them in a second pack.
            let half = files.len() / 2;
            let mut offsets = [0u64; 2];
            for (i, (path, size, mode, marker, canonical)) in files.into_iter().enumerate() {
                let pack = u32::from(i >= half && half > 0);
                let chunks = if size == 0 {
                    vec![]
                } else {
                    let offset = offsets[pack as usize];
                    offsets[pack as usize] += size;
                    vec![Chunk {
                        pack,
                        offset,
                        len: size,
                    }]
                };
                m.files.push(FileRecord {
                    blake3: ContentHash::of(path.as_str().as_bytes()),
                    path,
                    size,
                    mode,
                    mtime_s: (created_at >> 1) as i64,
                    mtime_ns: 7,
                    chunks,
                    marker,
                    canonical,
                });
            }
            for (i, size) in offsets.iter().enumerate() {
                m.packs.push(PackRef {
                    id: ContentHash([i as u8 + 9; 32]),
                    size: size + 3,
                });
            }
            m
        })
}

/// Numbers where overflow and bounds checks live: small, at the edges of u64, anything.
fn edgy_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..80,
        (u64::MAX - 80)..=u64::MAX,
        Just(1 << 63),
        any::<u64>()
    ]
}

/// Manifests with every number arbitrary (chunk offsets, lengths, pack indices, sizes, modes):
/// what a decoder that parsed the JSON hands to `validate`.
fn wild_manifests() -> impl Strategy<Value = Manifest> {
    // Mostly small, so a fair share of chunks fit their packs and the checks after them run.
    let small = || prop_oneof![4 => 0u64..32, 1 => edgy_u64()];
    let chunk = (
        prop_oneof![4 => 0u32..4, 1 => any::<u32>()],
        small(),
        small(),
    )
        .prop_map(|(pack, offset, len)| Chunk { pack, offset, len });
    let file = (
        "[a-c]{1,2}(/[a-c]{1,2}){0,2}",
        edgy_u64(),
        prop_oneof![0u32..0o1000, any::<u32>()],
        proptest::collection::vec(chunk, 0..4),
        any::<bool>(),
    );
    (
        proptest::collection::vec(prop_oneof![4 => 32u64..128, 1 => edgy_u64()], 0..4),
        proptest::collection::vec(file, 0..6),
        any::<bool>(),
    )
        .prop_map(|(packs, files, sort)| {
            let mut m = empty_manifest("k", 1);
            m.packs = packs
                .into_iter()
                .map(|size| PackRef {
                    id: ContentHash([3; 32]),
                    size,
                })
                .collect();
            m.files = files
                .into_iter()
                .filter_map(|(path, size, mode, chunks, summed)| {
                    // Half the files sized as their chunks add up (wrapping), so some pass.
                    let size = if summed {
                        chunks.iter().fold(0u64, |a, c| a.wrapping_add(c.len))
                    } else {
                        size
                    };
                    Some(FileRecord {
                        path: RelPath::parse(&path).ok()?,
                        size,
                        mode,
                        mtime_s: -1,
                        mtime_ns: u32::MAX,
                        blake3: ContentHash([4; 32]),
                        chunks,
                        marker: false,
                        canonical: false,
                    })
                })
                .collect();
            if sort {
                m.normalize();
            }
            m
        })
}

// ---------------------------------------------------------------------------------------------
// The properties

/// A head that decodes re-encodes to bytes that decode equal.
fn check_head(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(h) = HeadRecord::decode(bytes) {
        let again = HeadRecord::decode(&h.encode());
        prop_assert_eq!(again.ok(), Some(h));
    }
    Ok(())
}

/// A manifest that decodes under its own id is exactly its canonical encoding, and valid.
fn check_manifest(bytes: &[u8]) -> Result<(), TestCaseError> {
    let id = GenerationId(ContentHash::of(bytes));
    if let Ok(m) = Manifest::decode(bytes, id) {
        prop_assert_eq!(m.encode(), bytes.to_vec());
        prop_assert_eq!(m.id(), id);
        prop_assert!(m.validate().is_ok());
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(CASES_RANDOM))]

    #[test]
    fn head_decode_survives_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        check_head(&bytes)?;
    }

    #[test]
    fn manifest_decode_survives_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
        check_manifest(&bytes)?;
        // Under an id that is not theirs: refused before anything is parsed.
        prop_assert!(Manifest::decode(&bytes, GenerationId(ContentHash([0; 32]))).is_err()
            || ContentHash::of(&bytes) == ContentHash([0; 32]));
    }

    #[test]
    fn id_and_path_parsers_survive_random_text(text in prop_oneof![
        "[0-9a-fA-F]{62,66}",
        "[ -~]{0,80}",
        any::<String>(),
        "([a-c.]{0,3}/){0,4}[a-c.]{0,3}",
    ]) {
        if let Ok(h) = text.parse::<ContentHash>() {
            prop_assert_eq!(h.to_string(), text.clone());
        }
        if let Ok(g) = text.parse::<GenerationId>() {
            prop_assert_eq!(g.to_string(), text.clone());
        }
        if let Ok(c) = text.parse::<CompatId>() {
            prop_assert_eq!(c.to_string(), text.clone());
        }
        if let Ok(p) = RelPath::parse(&text) {
            prop_assert_eq!(p.as_str(), text.as_str());
            prop_assert!(!p.as_str().starts_with('/'));
            prop_assert!(p.as_str().split('/').all(|c| !c.is_empty() && c != "." && c != ".."));
        }
        // As JSON strings, the way records carry them.
        let quoted = serde_json::to_vec(&text).expect("a string serializes");
        if let Ok(p) = serde_json::from_slice::<RelPath>(&quoted) {
            prop_assert_eq!(p.as_str(), text.as_str());
        }
        if let Ok(h) = serde_json::from_slice::<ContentHash>(&quoted) {
            prop_assert_eq!(h.to_string(), text);
        }
    }
}

proptest! {
    #![proptest_config(config(CASES_MUTATED))]

    #[test]
    fn head_decode_survives_mutated_heads(h in heads(), ms in mutations()) {
        let bytes = h.encode();
        prop_assert_eq!(HeadRecord::decode(&bytes).ok(), Some(h));
        check_head(&apply(bytes, &ms))?;
    }

    #[test]
    fn manifest_decode_survives_mutated_manifests(m in manifests(), ms in mutations()) {
        let bytes = m.encode();
        prop_assert!(m.validate().is_ok(), "{:?}", m.validate());
        prop_assert_eq!(Manifest::decode(&bytes, m.id()).ok(), Some(m));
        check_manifest(&apply(bytes, &ms))?;
    }

    /// `validate` on whatever numbers a parsed manifest holds: never panics (no overflow, no index
    /// out of range), and what it passes is safe for the code that trusts it (every chunk inside
    /// its pack, lengths adding up to the size, `slices_by_pack` and its slices in bounds) and
    /// decodes from its canonical bytes.
    #[test]
    fn validate_survives_wild_numbers_and_what_passes_is_in_bounds(m in wild_manifests()) {
        if m.validate().is_err() {
            return Ok(());
        }
        for f in &m.files {
            let mut total = 0u64;
            for c in &f.chunks {
                let pack = &m.packs[c.pack as usize];
                prop_assert!(c.len > 0 && c.offset.checked_add(c.len).is_some_and(|e| e <= pack.size));
                total = total.checked_add(c.len).expect("validate bounds the sum");
            }
            prop_assert_eq!(total, f.size);
            prop_assert!(f.mode <= 0o777);
        }
        for (pack, slices) in slices_by_pack(&m.files) {
            let size = m.packs[pack as usize].size;
            for s in slices {
                prop_assert!(s.pack_offset.checked_add(s.len).is_some_and(|e| e <= size));
            }
        }
        prop_assert_eq!(Manifest::decode(&m.encode(), m.id()).ok(), Some(m));
    }
}
