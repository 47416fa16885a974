//! The manifest: what a generation holds. Canonical JSON (fixed field order, sorted files and
//! facts, no insignificant whitespace); its id is the blake3 of those bytes. `decode` refuses
//! anything that is not exactly what `encode` would have produced, so a manifest cannot carry
//! unknown fields, links, devices, escapes or overlapping paths.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{CompatId, ContentHash, RelPath};

/// Version of the manifest format; a reader refuses other versions.
pub const FORMAT_VERSION: u32 = 1;

/// Largest manifest jitship accepts (a hostile store cannot make an installer allocate more).
pub const MAX_MANIFEST_BYTES: usize = 256 * 1024 * 1024;

/// The id of a generation: blake3 of its canonical manifest bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GenerationId(pub ContentHash);

impl fmt::Display for GenerationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for GenerationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GenerationId({})", self.0)
    }
}

impl FromStr for GenerationId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        s.parse().map(Self)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: u32,
    pub cache_kind: String,
    pub compat_key: String,
    pub compat_id: CompatId,
    /// The facts the key was computed from, recorded so a miss can be explained later.
    pub facts: BTreeMap<String, String>,
    /// The policy that keyed and selected this generation.
    pub policy: PolicyRef,
    /// The head this generation was built on, if any.
    pub parent: Option<GenerationId>,
    /// Other generations whose files were merged in (concurrent publishers), sorted.
    pub merged: Vec<GenerationId>,
    pub producer: Producer,
    /// Seconds since the Unix epoch.
    pub created_at: u64,
    pub packs: Vec<PackRef>,
    /// Sorted by path, no duplicates, no file inside another file's path.
    pub files: Vec<FileRecord>,
    /// Why the root this generation was published from was not a complete cache for its kind
    /// (the policy's `incomplete-detail`); `None` = complete. Installs prefer complete
    /// generations. Absent from manifests written before policy contract 2 (complete).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyRef {
    pub name: String,
    pub version: String,
    /// blake3 of the policy module (or "native" for code built into jitship).
    pub digest: String,
    /// The policy's settings this generation was published with, every declared one in its
    /// canonical text (defaults included): gc retains the key with them. Absent when the policy
    /// declares none, and from manifests written before policy contract 3.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub settings: BTreeMap<String, String>,
}

/// Most settings a manifest may record, and the longest name and value (the policy contract's
/// own bounds: a record read from the store is bounded before anyone uses it).
pub const MAX_POLICY_SETTINGS: usize = 32;
pub const MAX_SETTING_NAME_BYTES: usize = 64;
pub const MAX_SETTING_VALUE_BYTES: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Producer {
    pub host: String,
    pub pod: Option<String>,
    pub jitship_version: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackRef {
    pub id: ContentHash,
    pub size: u64,
}

/// A regular file. Nothing else (links, devices, directories) can be expressed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRecord {
    pub path: RelPath,
    pub size: u64,
    /// Permission bits only (at most 0o777).
    pub mode: u32,
    pub mtime_s: i64,
    pub mtime_ns: u32,
    pub blake3: ContentHash,
    /// Where the bytes live, in order; their lengths add up to `size`.
    pub chunks: Vec<Chunk>,
    /// The engine finds other files through this one (policy trait `marker`): an install
    /// commits it after every other file.
    #[serde(default, skip_serializing_if = "is_false")]
    pub marker: bool,
    /// The bytes stored are the root-independent form (policy trait `embeds-root`): verified as
    /// stored, materialized for the installing root.
    #[serde(default, skip_serializing_if = "is_false")]
    pub canonical: bool,
}

/// For `skip_serializing_if`: optional flags are left out when false, so manifests written
/// before they existed decode and re-encode to the same bytes.
fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Chunk {
    /// Index into `Manifest::packs`.
    pub pack: u32,
    pub offset: u64,
    pub len: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("manifest is {0} bytes, over the {MAX_MANIFEST_BYTES}-byte limit")]
    TooLarge(usize),
    #[error(
        "manifest bytes hash to {actual}, not to the generation id {expected} they were stored under"
    )]
    HashMismatch {
        expected: GenerationId,
        actual: GenerationId,
    },
    #[error("manifest does not parse: {0}")]
    Parse(#[from] serde_json::Error),
    #[error(
        "manifest format {0} is not supported (this jitship reads format {FORMAT_VERSION}); upgrade jitship"
    )]
    Format(u32),
    #[error("manifest is not in canonical form (it was not written by jitship)")]
    NotCanonical,
    #[error("manifest compat id does not match its cache kind and key")]
    CompatMismatch,
    #[error("manifest lists {0:?} twice, or out of order")]
    DuplicateOrUnsorted(String),
    #[error("manifest has {file:?} both as a file and as a directory of {other:?}")]
    FileDirConflict { file: String, other: String },
    #[error("manifest file {0:?} has mode {1:o}; only permission bits (<= 0o777) are allowed")]
    BadMode(String, u32),
    #[error(
        "manifest file {0:?} has chunks that do not add up to its size or point outside a pack"
    )]
    BadChunks(String),
    #[error(
        "manifest records {0} policy settings, or one over {MAX_SETTING_NAME_BYTES} bytes of name or \
         {MAX_SETTING_VALUE_BYTES} of value; at most {MAX_POLICY_SETTINGS} are allowed"
    )]
    BadSettings(usize),
}

impl Manifest {
    /// Canonical bytes: serde_json of this struct is deterministic because field order is fixed,
    /// maps are BTreeMaps and vectors are kept sorted by `normalize`.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("manifest serialization cannot fail")
    }

    /// The blake3 of `encode()`, computed without making the bytes.
    pub fn id(&self) -> GenerationId {
        GenerationId(ContentHash::of_json(self))
    }

    /// The length of `encode()`, counted as it serializes (no bytes are kept): publish checks a
    /// manifest fits the store before it uploads anything.
    pub fn encoded_len(&self) -> u64 {
        let mut count = CountBytes(0);
        serde_json::to_writer(&mut count, self).expect("manifest serialization cannot fail");
        count.0
    }

    /// Whether `encode()` would give exactly `bytes`, checked as it serializes: no second copy.
    fn encodes_to(&self, bytes: &[u8]) -> bool {
        let mut same = SameBytes { rest: bytes };
        serde_json::to_writer(&mut same, self).is_ok() && same.rest.is_empty()
    }

    /// Sorts the lists whose order carries no meaning, so equal content gives equal bytes.
    pub fn normalize(&mut self) {
        self.files.sort_by(|a, b| a.path.cmp(&b.path));
        self.merged.sort();
        self.merged.dedup();
    }

    /// Parses and fully validates bytes fetched from a store under `expected` id.
    pub fn decode(bytes: &[u8], expected: GenerationId) -> Result<Self, ManifestError> {
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(ManifestError::TooLarge(bytes.len()));
        }
        let actual = GenerationId(ContentHash::of(bytes));
        if actual != expected {
            return Err(ManifestError::HashMismatch { expected, actual });
        }
        let manifest: Manifest = match serde_json::from_slice(bytes) {
            Ok(m) => m,
            Err(e) => {
                // A newer jitship's manifest fails on its new fields before `format` is looked
                // at; say so rather than "does not parse".
                #[derive(Deserialize)]
                struct FormatOnly {
                    format: u32,
                }
                return Err(match serde_json::from_slice::<FormatOnly>(bytes) {
                    Ok(f) if f.format != FORMAT_VERSION => ManifestError::Format(f.format),
                    _ => ManifestError::Parse(e),
                });
            }
        };
        if manifest.format != FORMAT_VERSION {
            return Err(ManifestError::Format(manifest.format));
        }
        if !manifest.encodes_to(bytes) {
            return Err(ManifestError::NotCanonical);
        }
        manifest.validate()?;
        Ok(manifest)
    }

    /// Structural checks that hold for every manifest jitship writes.
    pub fn validate(&self) -> Result<(), ManifestError> {
        if self.compat_id != CompatId::new(&self.cache_kind, &self.compat_key) {
            return Err(ManifestError::CompatMismatch);
        }
        let settings = &self.policy.settings;
        if settings.len() > MAX_POLICY_SETTINGS
            || settings
                .iter()
                .any(|(n, v)| n.len() > MAX_SETTING_NAME_BYTES || v.len() > MAX_SETTING_VALUE_BYTES)
        {
            return Err(ManifestError::BadSettings(settings.len()));
        }
        for pair in self.files.windows(2) {
            let (a, b) = (pair[0].path.as_str(), pair[1].path.as_str());
            if a >= b {
                return Err(ManifestError::DuplicateOrUnsorted(b.to_owned()));
            }
        }
        // A path that is also the directory of another ("a" and "a/b") cannot both be files.
        let files: HashMap<&str, ()> = self.files.iter().map(|f| (f.path.as_str(), ())).collect();
        for f in &self.files {
            if let Some(dir) = f.path.ancestors().find(|d| files.contains_key(d)) {
                return Err(ManifestError::FileDirConflict {
                    file: dir.to_owned(),
                    other: f.path.to_string(),
                });
            }
            if f.mode > 0o777 {
                return Err(ManifestError::BadMode(f.path.to_string(), f.mode));
            }
            let mut total = 0u64;
            for c in &f.chunks {
                let pack = self
                    .packs
                    .get(c.pack as usize)
                    .ok_or_else(|| ManifestError::BadChunks(f.path.to_string()))?;
                let end = c.offset.checked_add(c.len);
                if c.len == 0 || end.is_none_or(|e| e > pack.size) {
                    return Err(ManifestError::BadChunks(f.path.to_string()));
                }
                total = total
                    .checked_add(c.len)
                    .ok_or_else(|| ManifestError::BadChunks(f.path.to_string()))?;
            }
            if total != f.size {
                return Err(ManifestError::BadChunks(f.path.to_string()));
            }
        }
        Ok(())
    }

    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    pub fn packed_bytes(&self) -> u64 {
        self.packs.iter().map(|p| p.size).sum()
    }
}

/// A writer that only compares what is written with the bytes still expected, and fails at the
/// first difference.
struct SameBytes<'a> {
    rest: &'a [u8],
}

impl std::io::Write for SameBytes<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.rest.strip_prefix(buf) {
            Some(rest) => {
                self.rest = rest;
                Ok(buf.len())
            }
            None => Err(std::io::Error::other("differs from the expected bytes")),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A writer that only counts (`Manifest::encoded_len`).
struct CountBytes(u64);

impl std::io::Write for CountBytes {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(any(test, feature = "testing"))]
pub mod tests {
    use super::*;

    pub fn sample() -> Manifest {
        let mut m = Manifest {
            format: FORMAT_VERSION,
            cache_kind: "triton".into(),
            compat_key: "k".into(),
            compat_id: CompatId::new("triton", "k"),
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
                id: ContentHash([1; 32]),
                size: 10,
            }],
            files: vec![
                FileRecord {
                    path: RelPath::parse("a/x").unwrap(),
                    size: 4,
                    mode: 0o644,
                    mtime_s: 5,
                    mtime_ns: 6,
                    blake3: ContentHash([2; 32]),
                    chunks: vec![Chunk {
                        pack: 0,
                        offset: 0,
                        len: 4,
                    }],
                    marker: false,
                    canonical: false,
                },
                FileRecord {
                    path: RelPath::parse("b").unwrap(),
                    size: 0,
                    mode: 0o600,
                    mtime_s: 5,
                    mtime_ns: 6,
                    blake3: ContentHash::of(b""),
                    chunks: vec![],
                    marker: false,
                    canonical: false,
                },
            ],
            incomplete: None,
        };
        m.normalize();
        m
    }

    #[test]
    fn encoded_len_is_the_length_of_the_bytes() {
        let m = sample();
        assert_eq!(m.encoded_len(), m.encode().len() as u64);
    }

    #[test]
    fn marker_and_incomplete_are_optional_and_round_trip() {
        let plain = sample();
        let text = String::from_utf8(plain.encode()).unwrap();
        assert!(
            !text.contains("marker") && !text.contains("canonical") && !text.contains("incomplete"),
            "false/None flags must not change the bytes of manifests written before them: {text}"
        );
        let mut m = sample();
        m.files[0].marker = true;
        m.files[0].canonical = true;
        m.incomplete = Some("2 graphs without an fxgraph entry".into());
        let bytes = m.encode();
        assert_eq!(Manifest::decode(&bytes, m.id()).unwrap(), m);
        // Spelling a default out is not the canonical form.
        let spelled = text.replacen("\"chunks\":[]", "\"chunks\":[],\"marker\":false", 1);
        let id = GenerationId(ContentHash::of(spelled.as_bytes()));
        assert!(matches!(
            Manifest::decode(spelled.as_bytes(), id),
            Err(ManifestError::NotCanonical)
        ));
    }

    #[test]
    fn policy_settings_are_optional_round_trip_and_bounded() {
        assert!(
            !String::from_utf8(sample().encode())
                .unwrap()
                .contains("settings")
        );
        let mut m = sample();
        m.policy.settings = BTreeMap::from([("keep".into(), "5".into())]);
        assert_eq!(Manifest::decode(&m.encode(), m.id()).unwrap(), m);
        m.policy.settings = (0..=MAX_POLICY_SETTINGS)
            .map(|i| (format!("s{i}"), "1".into()))
            .collect();
        assert!(matches!(
            Manifest::decode(&m.encode(), m.id()),
            Err(ManifestError::BadSettings(33))
        ));
        m.policy.settings = BTreeMap::from([("v".into(), "x".repeat(MAX_SETTING_VALUE_BYTES + 1))]);
        assert!(matches!(
            Manifest::decode(&m.encode(), m.id()),
            Err(ManifestError::BadSettings(1))
        ));
    }

    #[test]
    fn round_trip_is_canonical() {
        let m = sample();
        let bytes = m.encode();
        assert_eq!(m.id(), GenerationId(ContentHash::of(&bytes)));
        assert_eq!(Manifest::decode(&bytes, m.id()).unwrap(), m);
    }

    #[test]
    fn wrong_id_or_whitespace_is_refused() {
        let m = sample();
        let bytes = m.encode();
        assert!(matches!(
            Manifest::decode(&bytes, GenerationId(ContentHash([0; 32]))),
            Err(ManifestError::HashMismatch { .. })
        ));
        // The canonical bytes and one more: JSON allows trailing whitespace, the canonical form not.
        let mut trailing = bytes.clone();
        trailing.push(b'\n');
        let id = GenerationId(ContentHash::of(&trailing));
        assert!(matches!(
            Manifest::decode(&trailing, id),
            Err(ManifestError::NotCanonical)
        ));
        let mut pretty = serde_json::to_vec_pretty(&m).unwrap();
        pretty.push(b'\n');
        let id = GenerationId(ContentHash::of(&pretty));
        assert!(matches!(
            Manifest::decode(&pretty, id),
            Err(ManifestError::NotCanonical)
        ));
    }
}

/// Property tests: `decode` is the gate for bytes from a store, so it must never panic, and
/// whatever it accepts must be exactly what `encode` produces (no second spelling of a manifest).
/// Cases default to proptest's 256; a long run: `PROPTEST_CASES=200000 cargo test -p jitship
/// --lib generation::manifest::props` (see the report of issue 11 for the figures).
#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::tests::sample;
    use super::*;

    /// Valid manifests of varied shape: files under a few directories, packs, chunks, markers.
    fn manifests() -> impl Strategy<Value = Manifest> {
        let file = (
            "[a-c]{1,2}(/[a-c_.]{1,3}){0,2}",
            0u64..64,
            0u32..=0o777,
            any::<bool>(),
        );
        (
            proptest::collection::vec(file, 0..12),
            1u64..200,
            any::<u64>(),
            "[ -~]{0,8}",
        )
            .prop_map(|(files, pack_size, created_at, key)| {
                let mut m = sample();
                m.compat_key = key;
                m.compat_id = CompatId::new(&m.cache_kind, &m.compat_key);
                m.created_at = created_at;
                m.packs = vec![PackRef {
                    id: ContentHash([9; 32]),
                    size: pack_size + 64,
                }];
                m.files = files
                    .into_iter()
                    .filter_map(|(path, size, mode, marker)| {
                        Some(FileRecord {
                            path: RelPath::parse(&path).ok()?,
                            size,
                            mode,
                            mtime_s: created_at as i64 >> 1,
                            mtime_ns: 7,
                            blake3: ContentHash::of(path.as_bytes()),
                            chunks: if size == 0 {
                                vec![]
                            } else {
                                vec![Chunk {
                                    pack: 0,
                                    offset: 0,
                                    len: size,
                                }]
                            },
                            marker,
                            canonical: false,
                        })
                    })
                    .collect();
                m.normalize();
                m.files.dedup_by(|a, b| a.path == b.path);
                // A path cannot be both a file and the directory of another.
                let dirs: std::collections::HashSet<String> = m
                    .files
                    .iter()
                    .flat_map(|f| f.path.ancestors().map(str::to_owned).collect::<Vec<_>>())
                    .collect();
                m.files.retain(|f| !dirs.contains(f.path.as_str()));
                m
            })
    }

    /// Decodes `bytes` under their own id; anything accepted must re-encode to the same bytes.
    fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
        let id = GenerationId(ContentHash::of(bytes));
        if let Ok(m) = Manifest::decode(bytes, id) {
            prop_assert_eq!(m.encode(), bytes.to_vec());
            prop_assert_eq!(m.id(), id);
        }
        Ok(())
    }

    #[derive(Debug, Clone)]
    enum Mutation {
        Flip(usize, u8),
        Insert(usize, u8),
        Delete(usize),
        Splice(usize, String),
    }

    fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
        let one = prop_oneof![
            (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
            (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
            any::<usize>().prop_map(Mutation::Delete),
            // JSON-shaped edits: the interesting refusals (unknown fields, types, nesting).
            (
                any::<usize>(),
                prop_oneof![
                    Just(",\"extra\":1".to_owned()),
                    Just("\"marker\":true,".to_owned()),
                    Just("\"marker\":false,".to_owned()),
                    Just("../".to_owned()),
                    Just("null".to_owned()),
                    Just(" ".to_owned()),
                    Just("{}".to_owned()),
                    Just("[]".to_owned()),
                    Just("\\u0000".to_owned()),
                    "[0-9]{1,20}",
                ]
            )
                .prop_map(|(i, s)| Mutation::Splice(i, s)),
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
                Mutation::Splice(i, s) => {
                    let at = i % (bytes.len() + 1);
                    bytes.splice(at..at, s.bytes());
                }
                _ => {}
            }
        }
        bytes
    }

    proptest! {
        #[test]
        fn valid_manifests_round_trip(m in manifests()) {
            let bytes = m.encode();
            prop_assert!(m.validate().is_ok());
            prop_assert_eq!(Manifest::decode(&bytes, m.id()).unwrap(), m);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            check(&bytes)?;
        }

        #[test]
        fn mutated_manifests_never_panic_and_never_decode_to_another_spelling(
            m in manifests(),
            ms in mutations(),
        ) {
            check(&apply(m.encode(), &ms))?;
        }

        #[test]
        fn head_records_never_panic_and_what_decodes_re_decodes_equal(
            bytes in proptest::collection::vec(any::<u8>(), 0..256),
            ms in mutations(),
        ) {
            let valid = crate::HeadRecord {
                compat_id: CompatId::new("triton", "k"),
                seq: 3,
                generation: sample().id(),
                written_at: 5,
                writer: "h:1:abc".into(),
                signature: None,
            };
            for candidate in [bytes, apply(valid.encode(), &ms)] {
                if let Ok(h) = crate::HeadRecord::decode(&candidate) {
                    let again = crate::HeadRecord::decode(&h.encode()).unwrap();
                    prop_assert_eq!(again, h);
                }
            }
        }
    }
}
