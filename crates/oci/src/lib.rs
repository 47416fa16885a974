//! Generations as OCI artifacts, the form they take outside the store: in an OCI image layout
//! directory (`layout`: `jitship export`/`import`, for air-gapped clusters and for baking caches
//! into images) and in an OCI registry (`registry`: the durable tier behind Mooncake, which
//! outlives eviction and master restarts). Both hold the same artifacts, so `skopeo`, `oras` or
//! `crane` copy one into the other.
//!
//! One OCI image manifest per generation (`artifactType` [`ARTIFACT_TYPE`]): its config blob is
//! the generation's manifest (jitship's canonical bytes), its layers the packs and, last, the
//! head record (the publisher's signature included, so whoever reads it checks who signed it).
//! Its annotations say the namespace, cache kind, compat key and id, generation, seq, parent and
//! signer.
//!
//! What is read back is hostile input (a registry and a directory are as writable by others as
//! the store): every size is bounded before a byte is read, every blob's sha256 is checked
//! against its digest, every pack's files against their blake3, the manifest against the
//! generation id (`Manifest::decode`), the head against the manifest's compat id, and the head's
//! signature by the install's trust. A generation lands in a store only whole: packs, then
//! manifest, then the head at its own seq (its signature binds the seq and the namespace), then
//! a floor there so head walks find it, then the compat index.

mod check;
pub mod layout;
pub mod registry;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;

use jitship_catalog::{self as catalog, CatalogError, KeyLayout};
use jitship_generation::{CompatId, ContentHash, GenerationId, HeadRecord, Manifest};
use jitship_store::{Store, StoreError, ValueClass};
use jitship_trust::{Signer, TrustPolicy};

pub use check::{check_files, check_spooled_files};
pub use layout::{export, import};
pub use registry::{Registry, RegistryError};

/// The `artifactType` of a generation's OCI manifest.
pub const ARTIFACT_TYPE: &str = "application/vnd.jitship.generation.v1";
/// Media types of its blobs.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.jitship.generation.manifest.v1+json";
pub const PACK_MEDIA_TYPE: &str = "application/vnd.jitship.pack.v1";
pub const HEAD_MEDIA_TYPE: &str = "application/vnd.jitship.head.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Bounds on what is read before anything is trusted.
pub const MAX_OCI_MANIFEST_BYTES: u64 = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// What was read is not what jitship wrote, or something in it was altered.
    #[error("{from} is refused: {why}")]
    Refused { from: String, why: String },
}

/// An OCI content descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Descriptor {
    /// The descriptor of `bytes` stored as a `media_type` blob.
    pub fn of(media_type: &str, bytes: &[u8]) -> Self {
        Self {
            media_type: media_type.to_owned(),
            digest: sha256_digest(bytes),
            size: bytes.len() as u64,
            artifact_type: None,
            annotations: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    pub schema_version: u32,
    pub media_type: String,
    pub artifact_type: String,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// One generation exported, imported, pushed or pulled.
#[derive(Debug, Clone, Serialize)]
pub struct BakedGeneration {
    pub cache_kind: String,
    pub compat_id: CompatId,
    pub generation: GenerationId,
    pub seq: u64,
    pub packs: usize,
    pub bytes: u64,
    /// What happened to it.
    pub outcome: BakeOutcome,
}

/// What an export, import, push or pull did with one generation. Written in reports as
/// `exported`, `pushed to REGISTRY:TAG`, `imported`, `repaired`, `already-present` or
/// `left out: WHY`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BakeOutcome {
    Exported,
    Pushed {
        to: String,
    },
    /// Put into a store that held none of it.
    Imported,
    /// The store held this head: what it had lost was put back.
    Repaired,
    AlreadyPresent,
    LeftOut(String),
}

impl BakeOutcome {
    /// The generation is in the store now, through this run (imported or put back).
    pub fn put_into_store(&self) -> bool {
        matches!(self, Self::Imported | Self::Repaired)
    }
}

impl std::fmt::Display for BakeOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exported => f.write_str("exported"),
            Self::Pushed { to } => write!(f, "pushed to {to}"),
            Self::Imported => f.write_str("imported"),
            Self::Repaired => f.write_str("repaired"),
            Self::AlreadyPresent => f.write_str("already-present"),
            Self::LeftOut(why) => write!(f, "left out: {why}"),
        }
    }
}

impl Serialize for BakeOutcome {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

pub fn annotation(key: &str) -> String {
    format!("dev.jitship.{key}")
}

pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// The 64 lowercase hex digits of a `sha256:` digest, `None` for anything else (so no
/// descriptor can name a path outside `blobs/sha256/` or a URL outside the repository).
pub fn sha256_hex(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    let ok = hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    ok.then_some(hex)
}

/// Where artifacts are written: a layout directory or a registry.
pub trait BlobSink {
    /// Stores `bytes` as a blob (once: a blob already there is not written again).
    fn put_blob(&mut self, media_type: &str, bytes: &[u8]) -> Result<Descriptor, OciError>;
}

/// Where artifacts are read from. `read_blob` returns the blob `d` names only if it is exactly
/// `d.size` bytes, at most `limit`, and its sha256 is `d.digest`.
pub trait BlobSource {
    fn describe(&self) -> String;
    fn read_blob(&self, d: &Descriptor, limit: u64) -> Result<Vec<u8>, OciError>;

    /// `read_blob` of each of `ds`, in order (a registry reads several at once).
    fn read_blobs(&self, ds: &[Descriptor], limit: u64) -> Result<Vec<Vec<u8>>, OciError> {
        ds.iter().map(|d| self.read_blob(d, limit)).collect()
    }

    /// `read_blob` into an anonymous temporary file: a layout streams it there (its sha256
    /// checked on the way), so memory holds a buffer, not the blob.
    fn spool_blob(&self, d: &Descriptor, limit: u64) -> Result<File, OciError> {
        spool(&self.read_blob(d, limit)?)
    }
}

/// An anonymous temporary file (in `$TMPDIR`, gone when dropped) holding `bytes`.
pub fn spool(bytes: &[u8]) -> Result<File, OciError> {
    let io = |source| OciError::Io {
        path: std::env::temp_dir(),
        source,
    };
    let mut file = tempfile::tempfile().map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    Ok(file)
}

/// A pack id `m` lists more than once, if any. jitship never writes one, and each listing would
/// be read, held and written again (one pack listed 100 times cost export and import 100 times
/// its size).
pub fn repeated_pack(m: &Manifest) -> Option<ContentHash> {
    let mut seen = std::collections::HashSet::with_capacity(m.packs.len());
    m.packs.iter().find(|p| !seen.insert(p.id)).map(|p| p.id)
}

/// A generation ready to be written as an artifact: the newest head of a compat id that the
/// trust admits and whose generation is whole (and proven by its files' blake3) in the store,
/// or whose packs the sink already holds.
pub struct StoredGeneration {
    pub head: HeadRecord,
    pub signer: Signer,
    pub manifest: Manifest,
    pub packs: Vec<PackBlob>,
}

/// A pack of a generation being written as an artifact.
pub enum PackBlob {
    /// Read from the store into an anonymous temporary file, so a generation's packs are never
    /// all held in memory (one is, while it is written to the sink).
    Spooled(File),
    /// Already a blob of the sink (pushed by the publish that uploaded it).
    InSink(Descriptor),
}

/// The newest admitted head of `compat` whose generation is whole in `store` (a pack named in
/// `in_sink`, by store key, counts as there); `None` if none is. The files of every pack read
/// are checked against their blake3 (a pack's id names its layout, not its bytes).
/// The next head of the walk the trust admits, with its signer (faulty heads passed over, at most
/// `MAX_FAULTY_PASSED` of them).
pub(crate) fn next_admitted_head(
    walk: &mut catalog::HeadWalk<'_>,
    layout: &KeyLayout,
    trust: &TrustPolicy,
) -> Result<Option<(HeadRecord, Signer)>, OciError> {
    while let Some(head) = walk.next_usable(catalog::MAX_FAULTY_PASSED)? {
        let signer = trust.judge(layout.namespace(), &head);
        let what = format_args!("head {} of {}", head.seq, head.compat_id);
        if trust.admits(&signer, &what) {
            return Ok(Some((head, signer)));
        }
    }
    Ok(None)
}

pub fn newest_whole(
    store: &dyn Store,
    layout: &KeyLayout,
    trust: &TrustPolicy,
    compat: &CompatId,
    in_sink: &std::collections::HashMap<String, Descriptor>,
) -> Result<Option<StoredGeneration>, OciError> {
    let mut walk = catalog::HeadWalk::new(store, layout, compat)?;
    while let Some((head, signer)) = next_admitted_head(&mut walk, layout, trust)? {
        let Some(manifest) = catalog::fetch_manifest(store, layout, &head.generation)? else {
            continue;
        };
        if let Some(id) = repeated_pack(&manifest) {
            tracing::warn!(
                generation = %head.generation,
                "not written as an artifact: pack {id} is listed more than once in its manifest"
            );
            continue;
        }
        let mut packs = Vec::with_capacity(manifest.packs.len());
        for p in &manifest.packs {
            let key = layout.pack(&p.id);
            if let Some(d) = in_sink.get(&key) {
                packs.push(PackBlob::InSink(d.clone()));
                continue;
            }
            // At most the size the manifest records: a larger value is damage, not read.
            match store.get_capped(&key, p.size) {
                Ok(Some(bytes)) => packs.push(PackBlob::Spooled(spool(&bytes)?)),
                Ok(None) | Err(StoreError::TooLarge { .. }) => break,
                Err(e) => return Err(e.into()),
            }
        }
        if packs.len() != manifest.packs.len() {
            continue;
        }
        let read: Vec<Option<&File>> = packs
            .iter()
            .map(|p| match p {
                PackBlob::Spooled(f) => Some(f),
                PackBlob::InSink(_) => None,
            })
            .collect();
        if let Err(why) = check_spooled_files(&manifest, &read) {
            tracing::warn!(generation = %head.generation, "not written as an artifact: {why}");
            continue;
        }
        return Ok(Some(StoredGeneration {
            head,
            signer,
            manifest,
            packs,
        }));
    }
    Ok(None)
}

/// Writes `g`'s blobs to `sink` and returns its OCI manifest (bytes) and the descriptor an index
/// names it by (annotations included), with what was written.
pub fn write_artifact(
    sink: &mut dyn BlobSink,
    layout: &KeyLayout,
    g: &StoredGeneration,
) -> Result<(Vec<u8>, Descriptor, BakedGeneration), OciError> {
    let mut layers = Vec::with_capacity(g.packs.len() + 1);
    for (p, blob) in g.manifest.packs.iter().zip(&g.packs) {
        let mut d = match blob {
            PackBlob::Spooled(file) => {
                let mut bytes = vec![0; p.size as usize];
                file.read_exact_at(&mut bytes, 0)
                    .map_err(|source| OciError::Io {
                        path: std::env::temp_dir(),
                        source,
                    })?;
                sink.put_blob(PACK_MEDIA_TYPE, &bytes)?
            }
            PackBlob::InSink(d) => d.clone(),
        };
        d.annotations.insert(annotation("pack"), p.id.to_string());
        layers.push(d);
    }
    layers.push(sink.put_blob(HEAD_MEDIA_TYPE, &g.head.encode())?);
    let config = sink.put_blob(MANIFEST_MEDIA_TYPE, &g.manifest.encode())?;
    let compat = g.head.compat_id;
    let mut annotations = BTreeMap::from([
        (annotation("namespace"), layout.namespace().to_owned()),
        (annotation("cache-kind"), g.manifest.cache_kind.clone()),
        (annotation("compat-key"), g.manifest.compat_key.clone()),
        (annotation("compat-id"), compat.to_string()),
        (annotation("generation"), g.head.generation.to_string()),
        (annotation("seq"), g.head.seq.to_string()),
        (annotation("signer"), g.signer.to_string()),
    ]);
    if let Some(parent) = &g.manifest.parent {
        annotations.insert(annotation("parent"), parent.to_string());
    }
    let oci = ImageManifest {
        schema_version: 2,
        media_type: OCI_MANIFEST.into(),
        artifact_type: ARTIFACT_TYPE.into(),
        config,
        layers,
        annotations: annotations.clone(),
    };
    let bytes = serde_json::to_vec(&oci).expect("a manifest serializes");
    let mut descriptor = Descriptor::of(OCI_MANIFEST, &bytes);
    descriptor.artifact_type = Some(ARTIFACT_TYPE.into());
    descriptor.annotations = annotations;
    let baked = BakedGeneration {
        cache_kind: g.manifest.cache_kind.clone(),
        compat_id: compat,
        generation: g.head.generation,
        seq: g.head.seq,
        packs: g.packs.len(),
        bytes: g.manifest.packed_bytes(),
        outcome: BakeOutcome::Exported,
    };
    Ok((bytes, descriptor, baked))
}

/// An artifact's OCI manifest parsed and checked to be a jitship generation's; its head layer
/// read and decoded (nothing else read yet: a caller judges the head's signer first, so a
/// forged or untrusted artifact costs two small reads).
pub struct ArtifactHead {
    oci: ImageManifest,
    pub head: HeadRecord,
}

pub fn read_artifact_head(
    source: &dyn BlobSource,
    manifest_bytes: &[u8],
    what: &str,
) -> Result<ArtifactHead, OciError> {
    let refuse = |why: String| OciError::Refused {
        from: source.describe(),
        why,
    };
    let oci: ImageManifest = serde_json::from_slice(manifest_bytes)
        .map_err(|e| refuse(format!("manifest {what}: {e}")))?;
    if oci.artifact_type != ARTIFACT_TYPE
        || oci.config.media_type != MANIFEST_MEDIA_TYPE
        || oci.layers.last().map(|l| l.media_type.as_str()) != Some(HEAD_MEDIA_TYPE)
    {
        return Err(refuse(format!(
            "manifest {what} is not a jitship generation (artifact type, config or head layer)"
        )));
    }
    let head_layer = oci.layers.last().expect("checked above");
    let head = HeadRecord::decode(&source.read_blob(head_layer, catalog::MAX_HEAD_BYTES)?)
        .map_err(|e| refuse(format!("head layer of {what}: {e}")))?;
    Ok(ArtifactHead { oci, head })
}

/// A generation of an artifact, every byte verified. Its packs are held when the reader asked
/// (a registry: reading them twice would pull them twice), else read again (and their sha256
/// checked again) when put: a layout import spools each pack to a temporary file while verifying
/// (its sha256 on the way in, its files' blake3 from there) and holds one pack while writing.
pub struct Verified {
    pub manifest: Manifest,
    manifest_bytes: Vec<u8>,
    pub head: HeadRecord,
    pack_layers: Vec<Descriptor>,
    packs: Option<Vec<Vec<u8>>>,
}

/// Reads and verifies the rest of the artifact `a` (see the module docs): `namespace` is the
/// one the reader works in; a signed head of another namespace is refused. `keep_packs` keeps
/// the packs' bytes for `put_generation`.
pub fn verify_artifact(
    source: &dyn BlobSource,
    a: ArtifactHead,
    namespace: &str,
    max_pack_bytes: u64,
    keep_packs: bool,
) -> Result<Verified, OciError> {
    let refuse = |why: String| OciError::Refused {
        from: source.describe(),
        why,
    };
    let ArtifactHead { oci, head } = a;
    let manifest_bytes =
        source.read_blob(&oci.config, jitship_generation::MAX_MANIFEST_BYTES as u64)?;
    let id = GenerationId(ContentHash::of(&manifest_bytes));
    let manifest = Manifest::decode(&manifest_bytes, id)
        .map_err(|e| refuse(format!("generation {id}: {e}")))?;
    if let Some(pack) = repeated_pack(&manifest) {
        return Err(refuse(format!(
            "generation {id}: pack {pack} is listed more than once in its manifest (jitship \
             never writes that; each listing would be read again)"
        )));
    }
    if head.generation != id || head.compat_id != manifest.compat_id {
        return Err(refuse(format!(
            "the head of {id} names generation {} of compat id {}: not this generation's",
            head.generation, head.compat_id
        )));
    }
    if let Some(ns) = oci.annotations.get(&annotation("namespace"))
        && ns != namespace
        && head.signature.is_some()
    {
        return Err(refuse(format!(
            "generation {id} is signed for namespace {ns:?}, not {namespace:?}: read it with --namespace {ns}"
        )));
    }
    let pack_layers = &oci.layers[..oci.layers.len() - 1];
    if pack_layers.len() != manifest.packs.len() {
        return Err(refuse(format!(
            "generation {id} has {} pack layers for {} packs",
            pack_layers.len(),
            manifest.packs.len()
        )));
    }
    for (layer, p) in pack_layers.iter().zip(&manifest.packs) {
        if layer.media_type != PACK_MEDIA_TYPE || layer.size != p.size {
            return Err(refuse(format!(
                "generation {id}: layer {} is not pack {}",
                layer.digest, p.id
            )));
        }
    }
    let packs = if keep_packs {
        let bytes = source.read_blobs(pack_layers, max_pack_bytes)?;
        let read: Vec<Option<&[u8]>> = bytes.iter().map(|b| Some(b.as_slice())).collect();
        check_files(&manifest, &read).map_err(|why| refuse(format!("generation {id}: {why}")))?;
        Some(bytes)
    } else {
        let spooled = pack_layers
            .iter()
            .map(|l| source.spool_blob(l, max_pack_bytes))
            .collect::<Result<Vec<_>, _>>()?;
        let read: Vec<Option<&File>> = spooled.iter().map(Some).collect();
        check_spooled_files(&manifest, &read)
            .map_err(|why| refuse(format!("generation {id}: {why}")))?;
        None
    };
    Ok(Verified {
        manifest,
        manifest_bytes,
        head,
        pack_layers: pack_layers.to_vec(),
        packs,
    })
}

/// Puts the verified generation `g` into `store` (see the module docs for the order).
///
/// A store that already holds this very head gets what it lost put back (packs evicted, a
/// manifest gone): `repaired`, or `already-present` if nothing was missing. A store holding
/// other heads of the compat id is left alone (`left out`, with why): the head keeps its seq
/// (its signature binds it), and that place is taken. Except that an untrusted head never
/// shadows a trusted one: a head `trust` finds validly signed by a trusted key is left out only
/// for another trusted head; an unsigned, untrusted or forged record at its seq is removed (no
/// `required` install takes it), and so is a pack under one of its pack ids that is not the
/// bytes it verified (planted), so what it names is what lands.
pub fn put_generation(
    store: &dyn Store,
    layout: &KeyLayout,
    trust: &TrustPolicy,
    source: &dyn BlobSource,
    g: Verified,
) -> Result<BakedGeneration, OciError> {
    let compat = g.head.compat_id;
    let mut baked = BakedGeneration {
        cache_kind: g.manifest.cache_kind.clone(),
        compat_id: compat,
        generation: g.head.generation,
        seq: g.head.seq,
        packs: g.pack_layers.len(),
        bytes: g.manifest.packed_bytes(),
        outcome: BakeOutcome::Imported,
    };
    let ns = layout.namespace();
    let is_trusted = |h: &HeadRecord| matches!(trust.judge(ns, h), Signer::Trusted { .. });
    let trusted = is_trusted(&g.head);
    let held = catalog::all_heads(store, layout, &compat)?;
    let holds_this_head = held.heads.contains(&g.head);
    let taken = if trusted {
        held.heads.iter().find(|h| is_trusted(h))
    } else {
        held.heads.first()
    };
    if !holds_this_head && (taken.is_some() || (!trusted && !held.faulty.is_empty())) {
        baked.outcome = BakeOutcome::LeftOut(format!(
            "the store already has {}heads for compat id {compat} (newest seq {})",
            if trusted { "trusted " } else { "" },
            taken.map_or(0, |h| h.seq)
        ));
        return Ok(baked);
    }
    let mut put = 0;
    for (i, (p, layer)) in g.manifest.packs.iter().zip(&g.pack_layers).enumerate() {
        let key = layout.pack(&p.id);
        if store.exists(&key)? {
            if !(holds_this_head || trusted) {
                continue;
            }
            // What is there is these bytes (read back, one pack at a time), or it goes.
            match store.get_capped(&key, p.size) {
                Ok(Some(there)) if sha256_digest(&there) == layer.digest => continue,
                Ok(None) => {}
                Ok(Some(_)) | Err(StoreError::TooLarge { .. }) => {
                    tracing::warn!(pack = %p.id, "replacing a pack that is not the bytes its id names");
                    catalog::remove_one(store, &key, catalog::LeaseWait::ONE_KEY)?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        match &g.packs {
            Some(held) => store.put(&key, &held[i], ValueClass::Bulk)?,
            None => {
                // The same sha256 as when its files were verified: the same bytes.
                let bytes = source.read_blob(layer, store.max_value_size())?;
                store.put(&key, &bytes, ValueClass::Bulk)?;
            }
        }
        put += 1;
    }
    // The manifest's key is its blake3: any other bytes there are damage or planted.
    let manifest_key = layout.generation(&g.head.generation);
    let manifest_there =
        match store.get_capped(&manifest_key, jitship_generation::MAX_MANIFEST_BYTES as u64) {
            Ok(Some(there)) if there == g.manifest_bytes => true,
            Ok(None) => false,
            Ok(Some(_)) | Err(StoreError::TooLarge { .. }) => {
                catalog::remove_one(store, &manifest_key, catalog::LeaseWait::ONE_KEY)?;
                false
            }
            Err(e) => return Err(e.into()),
        };
    if !manifest_there {
        store.put(&manifest_key, &g.manifest_bytes, ValueClass::Record)?;
        put += 1;
    }
    if holds_this_head {
        baked.outcome = if put == 0 {
            BakeOutcome::AlreadyPresent
        } else {
            BakeOutcome::Repaired
        };
        return Ok(baked);
    }
    let head_key = layout.head(&compat, g.head.seq);
    let head_bytes = g.head.encode();
    if trusted {
        // A record at this seq that is not a trusted head (unsigned, untrusted, forged, junk)
        // is what no `required` install takes: it goes, so the signed head lands at its seq.
        let there = match store.get_capped(&head_key, catalog::MAX_HEAD_BYTES) {
            Ok(there) => there,
            Err(StoreError::TooLarge { .. }) => Some(vec![]),
            Err(e) => return Err(e.into()),
        };
        if let Some(there) = there
            && there != head_bytes
        {
            if HeadRecord::decode(&there).is_ok_and(|h| h.compat_id == compat && is_trusted(&h)) {
                baked.outcome = BakeOutcome::LeftOut(format!(
                    "seq {} of compat id {compat} holds another trusted head",
                    g.head.seq
                ));
                return Ok(baked);
            }
            tracing::warn!(
                seq = g.head.seq,
                %compat,
                "removing an untrusted record at the seq of a trusted head being imported"
            );
            catalog::remove_one(store, &head_key, catalog::LeaseWait::ONE_KEY)?;
        }
    }
    store.put(&head_key, &head_bytes, ValueClass::Record)?;
    if store.get_capped(&head_key, catalog::MAX_HEAD_BYTES)? != Some(head_bytes) {
        baked.outcome = BakeOutcome::LeftOut(format!(
            "another writer took seq {} of compat id {compat} meanwhile",
            g.head.seq
        ));
        return Ok(baked);
    }
    // Head walks search from 1 and from floors: a floor at the put seq finds it.
    if g.head.seq > 1 {
        catalog::write_floor(store, layout, &compat, g.head.seq, vec![])?;
    }
    catalog::ensure_indexed(
        store,
        layout,
        &compat,
        &g.manifest.cache_kind,
        &g.manifest.compat_key,
    )?;
    baked.outcome = BakeOutcome::Imported;
    Ok(baked)
}
