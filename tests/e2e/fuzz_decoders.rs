//! Bounded, seeded fuzzing of the OCI decoders through `import` and `import_archive`, in the
//! suite: the `oci-layout` marker, `index.json`, the OCI image manifest, the head, manifest and
//! pack blobs of a layout directory, and the tar reader of a layout archive.
//!
//! Each case starts from a valid layout of one generation (built here, and checked to import) and
//! breaks one part of it: random bytes, the valid bytes mutated (flips, inserts, deletes,
//! truncation, JSON splices, extreme numbers), or descriptors edited (digests naming paths or
//! other blobs, sizes at the ends of u64, media types swapped, layers dropped or repeated, the
//! generation listed many times). A blob that was changed is stored under its new digest and
//! every descriptor above it updated, so the change reaches its decoder instead of stopping at a
//! digest check. The archive test mutates the bytes of a valid archive and the fields of its tar
//! headers (type, name, size, mode, link name) with their checksums recomputed.
//!
//! The properties: every import returns (Ok or Err) within `DEADLINE`, without a panic; and
//! whatever it reports as put into the store is there as an install sees it (its head at its
//! seq, admitted by the trust it ran under, its manifest, packs whose files hash to their
//! blake3).
//!
//! Seed `SEED` (ChaCha), `CASES` cases per test, failure persistence off (nothing is written
//! into the repository); a few seconds per test in a debug build. A longer or different run:
//! `PROPTEST_CASES=5000 PROPTEST_RNG_SEED=7 cargo test -p jitship-tests --test e2e --
//! fuzz_decoders::` (a failure prints the seed and the shrunk input).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jitship::catalog::{self, KeyLayout};
use jitship::generation::{
    Chunk, CompatId, ContentHash, FORMAT_VERSION, FileRecord, HeadRecord, Manifest, PackRef,
    PolicyRef, Producer, RelPath,
};
use jitship::oci::{self, Descriptor, ImageManifest};
use jitship::store::{LocalStore, Store};
use jitship::trust::{PublisherKey, TrustMode, TrustPolicy};
use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, RngSeed, TestRunner};
use serde_json::{Value, json};

mod archive;

/// The fixed seed of every test here ("jitship\x39" in ASCII).
const SEED: u64 = 0x6a69_7473_6869_7039;
const CASES: u32 = 300;
/// What one import of a layout of a few hundred bytes may take, debug build, busy machine.
const DEADLINE: Duration = Duration::from_secs(30);
const NAMESPACE: &str = "fuzz";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";

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
// Byte mutations

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
        Just("\"signature\":null,".to_owned()),
        Just("\"artifactType\":\"application/vnd.jitship.generation.v1\",".to_owned()),
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

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_owned()),
        Just("-1".to_owned()),
        Just("9007199254740992".to_owned()),
        Just("4294967296".to_owned()),
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

// ---------------------------------------------------------------------------------------------
// A valid layout, and the parts a case breaks

/// The blobs of one generation, as a layout holds them.
#[derive(Clone)]
struct Blobs {
    pack: Vec<u8>,
    manifest: Vec<u8>,
    head: Vec<u8>,
}

fn valid_blobs(key: &PublisherKey, signed: bool) -> Blobs {
    let files: [(&str, &[u8]); 3] = [("a/x.so", b"hello kernel"), ("a/y", b""), ("b", b"world")];
    let mut pack = Vec::new();
    let mut records = Vec::new();
    for (path, content) in files {
        let chunks = if content.is_empty() {
            vec![]
        } else {
            vec![Chunk {
                pack: 0,
                offset: pack.len() as u64,
                len: content.len() as u64,
            }]
        };
        pack.extend_from_slice(content);
        records.push(FileRecord {
            path: RelPath::parse(path).expect("a path"),
            size: content.len() as u64,
            mode: 0o644,
            mtime_s: 1,
            mtime_ns: 2,
            blake3: ContentHash(*blake3::hash(content).as_bytes()),
            chunks,
            marker: false,
            canonical: false,
        });
    }
    let manifest = Manifest {
        format: FORMAT_VERSION,
        cache_kind: "triton".into(),
        compat_key: "fuzz".into(),
        compat_id: CompatId::new("triton", "fuzz"),
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
        created_at: 1,
        packs: vec![PackRef {
            id: ContentHash(*blake3::hash(b"fuzz pack").as_bytes()),
            size: pack.len() as u64,
        }],
        files: records,
        incomplete: None,
    };
    let mut head = HeadRecord {
        compat_id: manifest.compat_id,
        seq: 1,
        generation: manifest.id(),
        written_at: 1,
        writer: "fuzz:1".into(),
        signature: None,
    };
    if signed {
        key.sign(NAMESPACE, &mut head);
    }
    Blobs {
        pack,
        manifest: manifest.encode(),
        head: head.encode(),
    }
}

/// The OCI image manifest naming `b`'s blobs, as JSON.
fn oci_manifest(b: &Blobs) -> Value {
    let mut pack = Descriptor::of(oci::PACK_MEDIA_TYPE, &b.pack);
    pack.annotations
        .insert(oci::annotation("pack"), "fuzz".into());
    let oci = ImageManifest {
        schema_version: 2,
        media_type: oci::OCI_MANIFEST.into(),
        artifact_type: oci::ARTIFACT_TYPE.into(),
        config: Descriptor::of(oci::MANIFEST_MEDIA_TYPE, &b.manifest),
        layers: vec![pack, Descriptor::of(oci::HEAD_MEDIA_TYPE, &b.head)],
        annotations: BTreeMap::from([(oci::annotation("namespace"), NAMESPACE.to_owned())]),
    };
    serde_json::to_value(&oci).expect("a manifest serializes")
}

/// `index.json` naming the OCI manifest `oci` once.
fn index(oci: &[u8]) -> Value {
    let mut d = Descriptor::of(oci::OCI_MANIFEST, oci);
    d.artifact_type = Some(oci::ARTIFACT_TYPE.into());
    d.annotations.insert(
        "org.opencontainers.image.ref.name".into(),
        CompatId::new("triton", "fuzz").to_string(),
    );
    json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [d]})
}

/// Which part of the layout a case breaks, and how.
#[derive(Debug, Clone)]
enum Break {
    /// Random bytes as this file.
    Random(Part, Vec<u8>),
    /// This file's valid bytes mutated.
    Mutated(Part, Vec<Mutation>),
    /// A descriptor of the OCI manifest or the index edited.
    Edit(Edit),
}

#[derive(Debug, Clone, Copy)]
enum Part {
    Marker,
    Index,
    Oci,
    Head,
    Manifest,
    Pack,
}

#[derive(Debug, Clone)]
enum Edit {
    /// A JSON pointer into the OCI manifest (or the index, `index` true) set to a value.
    Set {
        index: bool,
        pointer: &'static str,
        value: Value,
    },
    /// The OCI manifest's layer `i` (mod len) removed, or repeated `n` times.
    Layer { i: usize, repeat: usize },
    /// The index lists the generation `n` times.
    Listed(usize),
}

fn part() -> impl Strategy<Value = Part> {
    prop_oneof![
        1 => Just(Part::Marker),
        3 => Just(Part::Index),
        3 => Just(Part::Oci),
        3 => Just(Part::Head),
        3 => Just(Part::Manifest),
        1 => Just(Part::Pack),
    ]
}

fn digest_text() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!("")),
        Just(json!("sha256:")),
        Just(json!("sha256:../../../../etc/passwd")),
        Just(json!(format!("sha256:{}", "A".repeat(64)))),
        Just(json!(format!("sha256:{}", "0".repeat(65)))),
        Just(json!(format!("sha512:{}", "0".repeat(128)))),
        Just(json!(format!("sha256:{}/..", "a".repeat(61)))),
        "sha256:[0-9a-f]{64}".prop_map(Value::from),
        Just(json!(1)),
        Just(Value::Null),
    ]
}

fn size_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(0)),
        Just(json!(1)),
        Just(json!(u64::MAX)),
        Just(json!(i64::MAX)),
        Just(json!(1u64 << 32)),
        Just(json!(-1)),
        Just(json!(1.5)),
        Just(json!("12")),
        (0u64..64).prop_map(Value::from),
    ]
}

fn media_type() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(oci::PACK_MEDIA_TYPE)),
        Just(json!(oci::HEAD_MEDIA_TYPE)),
        Just(json!(oci::MANIFEST_MEDIA_TYPE)),
        Just(json!(oci::OCI_MANIFEST)),
        Just(json!(oci::ARTIFACT_TYPE)),
        Just(json!("")),
        Just(Value::Null),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    let oci_digest = prop_oneof![
        Just("/config/digest"),
        Just("/layers/0/digest"),
        Just("/layers/1/digest")
    ];
    let oci_size = prop_oneof![
        Just("/config/size"),
        Just("/layers/0/size"),
        Just("/layers/1/size")
    ];
    let oci_type = prop_oneof![
        Just("/config/mediaType"),
        Just("/layers/0/mediaType"),
        Just("/layers/1/mediaType"),
        Just("/artifactType"),
        Just("/annotations/dev.jitship.namespace"),
    ];
    prop_oneof![
        (oci_digest, digest_text()).prop_map(|(pointer, value)| Edit::Set {
            index: false,
            pointer,
            value
        }),
        (oci_size, size_value()).prop_map(|(pointer, value)| Edit::Set {
            index: false,
            pointer,
            value
        }),
        (oci_type, media_type()).prop_map(|(pointer, value)| Edit::Set {
            index: false,
            pointer,
            value
        }),
        digest_text().prop_map(|value| Edit::Set {
            index: true,
            pointer: "/manifests/0/digest",
            value
        }),
        size_value().prop_map(|value| Edit::Set {
            index: true,
            pointer: "/manifests/0/size",
            value
        }),
        media_type().prop_map(|value| Edit::Set {
            index: true,
            pointer: "/manifests/0/artifactType",
            value
        }),
        (any::<usize>(), 0usize..40).prop_map(|(i, repeat)| Edit::Layer { i, repeat }),
        (0usize..300).prop_map(Edit::Listed),
    ]
}

fn breaks() -> impl Strategy<Value = Break> {
    prop_oneof![
        2 => (part(), proptest::collection::vec(any::<u8>(), 0..400))
            .prop_map(|(p, b)| Break::Random(p, b)),
        5 => (part(), mutations()).prop_map(|(p, m)| Break::Mutated(p, m)),
        4 => edit().prop_map(Break::Edit),
    ]
}

/// The files of the layout `b` with `brk` applied: (path, bytes), `index.json` last. A changed
/// blob is written under its own digest and named by the descriptors above it.
fn layout_files(valid: &Blobs, brk: Option<&Break>) -> Vec<(String, Vec<u8>)> {
    let change = |part: Part, bytes: Vec<u8>| -> Vec<u8> {
        match brk {
            Some(Break::Random(p, random)) if p.same(part) => random.clone(),
            Some(Break::Mutated(p, ms)) if p.same(part) => apply(bytes, ms),
            _ => bytes,
        }
    };
    let b = Blobs {
        pack: change(Part::Pack, valid.pack.clone()),
        manifest: change(Part::Manifest, valid.manifest.clone()),
        head: change(Part::Head, valid.head.clone()),
    };
    let mut oci = oci_manifest(&b);
    match brk {
        Some(Break::Edit(Edit::Set {
            index: false,
            pointer,
            value,
        })) => set(&mut oci, pointer, value.clone()),
        Some(Break::Edit(Edit::Layer { i, repeat })) => {
            let layers = oci["layers"].as_array_mut().expect("layers");
            let layer = layers[i % layers.len()].clone();
            layers.remove(i % layers.len());
            for _ in 0..*repeat {
                layers.insert(i % (layers.len() + 1), layer.clone());
            }
        }
        _ => {}
    }
    let oci = change(Part::Oci, serde_json::to_vec(&oci).expect("json"));
    let mut idx = index(&oci);
    match brk {
        Some(Break::Edit(Edit::Set {
            index: true,
            pointer,
            value,
        })) => set(&mut idx, pointer, value.clone()),
        Some(Break::Edit(Edit::Listed(n))) => {
            let entry = idx["manifests"][0].clone();
            idx["manifests"] = Value::Array(vec![entry; *n]);
        }
        _ => {}
    }
    let idx = change(Part::Index, serde_json::to_vec(&idx).expect("json"));
    let marker = change(Part::Marker, br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec());
    let mut files: Vec<(String, Vec<u8>)> = [b.pack, b.manifest, b.head, oci]
        .into_iter()
        .map(|blob| {
            let digest = oci::sha256_digest(&blob);
            let hex = oci::sha256_hex(&digest).expect("a digest").to_owned();
            (format!("blobs/sha256/{hex}"), blob)
        })
        .collect();
    files.push(("oci-layout".into(), marker));
    files.push(("index.json".into(), idx));
    files
}

impl Part {
    fn same(self, other: Part) -> bool {
        std::mem::discriminant(&self) == std::mem::discriminant(&other)
    }
}

fn set(doc: &mut Value, pointer: &str, value: Value) {
    if let Some(slot) = doc.pointer_mut(pointer) {
        *slot = value;
    } else if let Some((parent, name)) = pointer.rsplit_once('/')
        && let Some(Value::Object(map)) = doc.pointer_mut(parent)
    {
        map.insert(name.to_owned(), value);
    }
}

fn write_layout(dir: &Path, files: &[(String, Vec<u8>)]) {
    std::fs::create_dir_all(dir.join("blobs/sha256")).expect("blobs dir");
    for (rel, bytes) in files {
        std::fs::write(dir.join(rel), bytes).expect("write a layout file");
    }
}

// ---------------------------------------------------------------------------------------------
// Running an import and judging what it did

/// How the store is read after an import, and under which trust it ran.
#[derive(Debug, Clone, Copy)]
struct Trust {
    signed: bool,
    mode: TrustMode,
}

fn trust() -> impl Strategy<Value = Trust> {
    (
        any::<bool>(),
        prop_oneof![
            Just(TrustMode::Off),
            Just(TrustMode::Warn),
            Just(TrustMode::Required)
        ],
    )
        .prop_map(|(signed, mode)| Trust { signed, mode })
}

/// Runs `import` on a thread and waits at most `DEADLINE` for it: a hang fails the case instead
/// of the suite.
fn within_deadline<T: Send + 'static>(
    what: &str,
    import: impl FnOnce() -> T + Send + 'static,
) -> Result<T, TestCaseError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let started = Instant::now();
    std::thread::spawn(move || {
        // A panic drops `tx`: reported below as one.
        let _ = tx.send(import());
    });
    match rx.recv_timeout(DEADLINE) {
        Ok(out) => Ok(out),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(TestCaseError::fail(format!(
            "{what} still running after {:?}",
            started.elapsed()
        ))),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            Err(TestCaseError::fail(format!("{what} panicked")))
        }
    }
}

/// Everything the report says was put into `store` is there as an install reads it: its head at
/// its seq (admitted by `policy`), its manifest, and packs whose files hash to their blake3.
fn check_imported(
    store: &dyn Store,
    policy: &TrustPolicy,
    report: &oci::layout::BakeReport,
) -> Result<(), TestCaseError> {
    let layout = KeyLayout::new(NAMESPACE).expect("a namespace");
    let fail = |why: String| TestCaseError::fail(why);
    for g in report
        .generations
        .iter()
        .filter(|g| g.outcome.put_into_store())
    {
        let head = catalog::read_head(store, &layout, &g.compat_id, g.seq)
            .map_err(|e| fail(format!("imported head unreadable: {e}")))?
            .ok_or_else(|| {
                fail(format!(
                    "imported head {} of {} missing",
                    g.seq, g.compat_id
                ))
            })?;
        let signer = policy.judge(NAMESPACE, &head);
        prop_assert!(
            policy.admits(&signer, &"an imported head"),
            "imported a head the trust does not admit: {signer}"
        );
        let manifest = catalog::fetch_manifest(store, &layout, &head.generation)
            .map_err(|e| fail(format!("imported manifest unreadable: {e}")))?
            .ok_or_else(|| fail("imported manifest missing".into()))?;
        let mut packs = Vec::new();
        for p in &manifest.packs {
            let bytes = store
                .get(&layout.pack(&p.id))
                .map_err(|e| fail(format!("pack unreadable: {e}")))?
                .ok_or_else(|| fail(format!("imported pack {} missing", p.id)))?;
            prop_assert_eq!(bytes.len() as u64, p.size);
            packs.push(bytes);
        }
        for f in &manifest.files {
            let mut h = blake3::Hasher::new();
            for c in &f.chunks {
                h.update(&packs[c.pack as usize][c.offset as usize..(c.offset + c.len) as usize]);
            }
            prop_assert_eq!(
                ContentHash(*h.finalize().as_bytes()),
                f.blake3,
                "imported file {} does not hash to its blake3",
                f.path
            );
        }
    }
    Ok(())
}

/// One key and a valid layout, signed and not, checked to import as they are: the cases break
/// something that works.
struct Setup {
    key: Arc<PublisherKey>,
    signed: Blobs,
    unsigned: Blobs,
}

impl Setup {
    fn new() -> Self {
        let key = Arc::new(PublisherKey::generate().expect("a key"));
        let setup = Self {
            signed: valid_blobs(&key, true),
            unsigned: valid_blobs(&key, false),
            key,
        };
        for (signed, mode) in [(true, TrustMode::Required), (false, TrustMode::Off)] {
            let dir = tempfile::tempdir().expect("a temp dir");
            write_layout(
                &dir.path().join("layout"),
                &layout_files(setup.blobs(signed), None),
            );
            let store = LocalStore::scratch(dir.path().join("store")).expect("a store");
            let policy = setup.policy(mode);
            let layout = KeyLayout::new(NAMESPACE).expect("a namespace");
            let report = oci::import(&store, &layout, &policy, &dir.path().join("layout"))
                .expect("the valid layout imports");
            assert_eq!(report.generations.len(), 1, "{report:?}");
            assert!(report.generations[0].outcome.put_into_store(), "{report:?}");
        }
        setup
    }

    fn blobs(&self, signed: bool) -> &Blobs {
        if signed { &self.signed } else { &self.unsigned }
    }

    fn policy(&self, mode: TrustMode) -> TrustPolicy {
        TrustPolicy::new(mode, &[self.key.public_key()])
    }
}

fn run<S: Strategy>(strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    let mut runner = TestRunner::new(config(CASES));
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{e}");
    }
}

/// A layout directory with one part broken: `import` returns within the deadline, never
/// panics, and what it reports as imported is whole and admitted in the store.
#[test]
fn import_survives_broken_layouts() {
    let setup = Setup::new();
    run((trust(), breaks()), |(t, brk)| {
        let dir = tempfile::tempdir().expect("a temp dir");
        let layout_dir = dir.path().join("layout");
        write_layout(
            &layout_dir,
            &layout_files(setup.blobs(t.signed), Some(&brk)),
        );
        let store = Arc::new(LocalStore::scratch(dir.path().join("store")).expect("a store"));
        let policy = setup.policy(t.mode);
        let (s, p) = (store.clone(), policy.clone());
        let result = within_deadline("import", move || {
            let layout = KeyLayout::new(NAMESPACE).expect("a namespace");
            oci::import(&s, &layout, &p, &layout_dir)
        })?;
        if let Ok(report) = result {
            check_imported(&store, &policy, &report)?;
        }
        Ok(())
    });
}
