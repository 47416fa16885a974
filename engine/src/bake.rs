//! Offline bake: `jitship export` writes generations to an OCI image layout directory (the
//! format of the OCI image spec, `oci-layout` + `index.json` + `blobs/sha256/`), and
//! `jitship import` puts them into a store from one. For air-gapped clusters, and for baking
//! caches into images at build time; standard OCI tools copy such a directory to a registry.
//!
//! One OCI image manifest per generation (`artifactType` [`ARTIFACT_TYPE`]): its config blob is
//! the generation's manifest (jitship's canonical bytes), its layers the packs and, last, the
//! head record (the publisher's signature included, so an import keeps who signed it). Its
//! annotations say the cache kind, compat key and id, generation, seq, parent and signer; the
//! index names each by its compat id (`org.opencontainers.image.ref.name`).
//!
//! An import reads the directory as hostile input: every size is bounded before a byte is
//! read, every blob's sha256 is checked against its digest, every pack's blake3 against its id,
//! the manifest against the generation id (`Manifest::decode`), the head against the manifest's
//! compat id. A generation lands in a store only whole: packs, then manifest, then the head at
//! its own seq (its signature binds the seq and the namespace), then a floor there so head
//! walks find it, then the compat index. A compat id the store already has heads for is left
//! alone (said so), unless it holds this very head.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::catalog::{self, CatalogError, KeyLayout};
use crate::generation::{CompatId, ContentHash, GenerationId, HeadRecord, Manifest};
use crate::store::{Store, StoreError, ValueClass};
use crate::trust::TrustPolicy;

/// The `artifactType` of a generation's OCI manifest.
pub const ARTIFACT_TYPE: &str = "application/vnd.jitship.generation.v1";
/// Media types of its blobs.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.jitship.generation.manifest.v1+json";
pub const PACK_MEDIA_TYPE: &str = "application/vnd.jitship.pack.v1";
pub const HEAD_MEDIA_TYPE: &str = "application/vnd.jitship.head.v1+json";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Bounds on what an import reads before it trusts anything.
const MAX_INDEX_BYTES: u64 = 16 << 20;
const MAX_OCI_MANIFEST_BYTES: u64 = 4 << 20;
const MAX_GENERATIONS: usize = 100_000;

#[derive(Debug, thiserror::Error)]
pub enum BakeError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The layout directory is not one `jitship export` wrote, or something in it was altered.
    #[error("{dir} is refused: {why}")]
    Layout { dir: PathBuf, why: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BakeError + '_ {
    move |source| BakeError::Io {
        path: path.to_path_buf(),
        source,
    }
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

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ImageManifest {
    schema_version: u32,
    media_type: String,
    artifact_type: String,
    config: Descriptor,
    layers: Vec<Descriptor>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ImageIndex {
    schema_version: u32,
    media_type: String,
    manifests: Vec<Descriptor>,
}

/// One generation exported or imported.
#[derive(Debug, Clone, Serialize)]
pub struct BakedGeneration {
    pub cache_kind: String,
    pub compat_id: CompatId,
    pub generation: GenerationId,
    pub seq: u64,
    pub packs: usize,
    pub bytes: u64,
    /// What happened to it (import): `imported`, `already-present`, or why it was left out.
    pub outcome: String,
}

/// What `export` or `import` did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BakeReport {
    pub dir: PathBuf,
    pub generations: Vec<BakedGeneration>,
    /// Compat ids exported with nothing (no usable, trusted, complete-in-the-store head).
    pub skipped: Vec<String>,
}

fn annotation(key: &str) -> String {
    format!("dev.jitship.{key}")
}

fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// The blob path of `digest`, refused unless it is exactly `sha256:` and 64 lowercase hex
/// digits (so no descriptor can name a path outside `blobs/sha256/`).
fn blob_path(dir: &Path, digest: &str) -> Option<PathBuf> {
    let hex = digest.strip_prefix("sha256:")?;
    let ok = hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    ok.then(|| dir.join("blobs/sha256").join(hex))
}

fn write_blob(dir: &Path, media_type: &str, bytes: &[u8]) -> Result<Descriptor, BakeError> {
    let digest = sha256_digest(bytes);
    let path = blob_path(dir, &digest).expect("a digest we computed");
    if !path.exists() {
        fs::write(&path, bytes).map_err(io(&path))?;
    }
    Ok(Descriptor {
        media_type: media_type.to_owned(),
        digest,
        size: bytes.len() as u64,
        artifact_type: None,
        annotations: BTreeMap::new(),
    })
}

/// Writes the newest generation of each of `compat_ids` (every compat id of the store when
/// empty) that `trust` admits and whose manifest and packs are all in the store, to the OCI
/// layout directory `dir` (created; must be empty or absent). `index.json` is written last.
pub fn export(
    store: &dyn Store,
    layout: &KeyLayout,
    trust: &TrustPolicy,
    compat_ids: &[CompatId],
    dir: &Path,
) -> Result<BakeReport, BakeError> {
    if dir.exists() && fs::read_dir(dir).map_err(io(dir))?.next().is_some() {
        return Err(BakeError::Layout {
            dir: dir.to_path_buf(),
            why: "it exists and is not empty; export writes a new layout".into(),
        });
    }
    let blobs = dir.join("blobs/sha256");
    fs::create_dir_all(&blobs).map_err(io(&blobs))?;
    let ids = if compat_ids.is_empty() {
        catalog::compat_ids(store, layout)?
    } else {
        compat_ids.to_vec()
    };
    let mut report = BakeReport {
        dir: dir.to_path_buf(),
        ..BakeReport::default()
    };
    let mut index = ImageIndex {
        schema_version: 2,
        media_type: OCI_INDEX.into(),
        manifests: vec![],
    };
    for compat in ids {
        match export_one(store, layout, trust, &compat, dir)? {
            Some((descriptor, baked)) => {
                index.manifests.push(descriptor);
                report.generations.push(baked);
            }
            None => report.skipped.push(compat.to_string()),
        }
    }
    let layout_file = dir.join("oci-layout");
    fs::write(&layout_file, br#"{"imageLayoutVersion":"1.0.0"}"#).map_err(io(&layout_file))?;
    let index_file = dir.join("index.json");
    let text = serde_json::to_vec_pretty(&index).expect("an index serializes");
    fs::write(&index_file, text).map_err(io(&index_file))?;
    Ok(report)
}

/// The newest admitted head of `compat` whose generation is whole in the store, written to `dir`.
fn export_one(
    store: &dyn Store,
    layout: &KeyLayout,
    trust: &TrustPolicy,
    compat: &CompatId,
    dir: &Path,
) -> Result<Option<(Descriptor, BakedGeneration)>, BakeError> {
    let mut walk = catalog::HeadWalk::new(store, layout, compat)?;
    while let Some(head) = walk.next_usable(catalog::MAX_FAULTY_PASSED)? {
        let signer = trust.judge(layout.namespace(), &head);
        if !trust.admits(&signer, &format_args!("head {} of {compat}", head.seq)) {
            continue;
        }
        let Some(manifest) = catalog::fetch_manifest(store, layout, &head.generation)? else {
            continue;
        };
        let mut packs = Vec::with_capacity(manifest.packs.len());
        for p in &manifest.packs {
            match store.get(&layout.pack(&p.id))? {
                Some(bytes) => packs.push(bytes),
                None => break,
            }
        }
        if packs.len() != manifest.packs.len() {
            continue;
        }
        if let Err(why) = check_files(&manifest, &packs) {
            tracing::warn!(generation = %head.generation, "not exported: {why}");
            continue;
        }
        let mut layers = Vec::with_capacity(packs.len() + 1);
        for (p, bytes) in manifest.packs.iter().zip(&packs) {
            let mut d = write_blob(dir, PACK_MEDIA_TYPE, bytes)?;
            d.annotations.insert(annotation("pack"), p.id.to_string());
            layers.push(d);
        }
        layers.push(write_blob(dir, HEAD_MEDIA_TYPE, &head.encode())?);
        let config = write_blob(dir, MANIFEST_MEDIA_TYPE, &manifest.encode())?;
        let mut annotations = BTreeMap::from([
            (annotation("namespace"), layout.namespace().to_owned()),
            (annotation("cache-kind"), manifest.cache_kind.clone()),
            (annotation("compat-key"), manifest.compat_key.clone()),
            (annotation("compat-id"), compat.to_string()),
            (annotation("generation"), head.generation.to_string()),
            (annotation("seq"), head.seq.to_string()),
            (annotation("signer"), signer.to_string()),
        ]);
        if let Some(parent) = &manifest.parent {
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
        let mut descriptor = write_blob(dir, OCI_MANIFEST, &bytes)?;
        descriptor.artifact_type = Some(ARTIFACT_TYPE.into());
        descriptor.annotations = annotations;
        descriptor
            .annotations
            .insert(REF_NAME.into(), compat.to_string());
        let baked = BakedGeneration {
            cache_kind: manifest.cache_kind.clone(),
            compat_id: *compat,
            generation: head.generation,
            seq: head.seq,
            packs: packs.len(),
            bytes: manifest.packed_bytes(),
            outcome: "exported".into(),
        };
        return Ok(Some((descriptor, baked)));
    }
    Ok(None)
}

/// A blob of the layout, read only if its file is exactly `expected` bytes (at most `limit`)
/// and its sha256 is its digest.
fn read_blob(dir: &Path, d: &Descriptor, limit: u64) -> Result<Vec<u8>, BakeError> {
    let refuse = |why: String| BakeError::Layout {
        dir: dir.to_path_buf(),
        why,
    };
    let path = blob_path(dir, &d.digest)
        .ok_or_else(|| refuse(format!("{:?} is not a sha256 digest", d.digest)))?;
    if d.size > limit {
        return Err(refuse(format!(
            "blob {} claims {} bytes, over the {limit}-byte bound for a {}",
            d.digest, d.size, d.media_type
        )));
    }
    let file = fs::File::open(&path).map_err(io(&path))?;
    let len = file.metadata().map_err(io(&path))?.len();
    if len != d.size {
        return Err(refuse(format!(
            "blob {} is {len} bytes, its descriptor says {}",
            d.digest, d.size
        )));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(len).read_to_end(&mut bytes).map_err(io(&path))?;
    if sha256_digest(&bytes) != d.digest {
        return Err(refuse(format!(
            "blob {} does not hash to its digest (altered)",
            d.digest
        )));
    }
    Ok(bytes)
}

fn read_json<T: serde::de::DeserializeOwned>(
    dir: &Path,
    path: &Path,
    limit: u64,
) -> Result<T, BakeError> {
    let refuse = |why: String| BakeError::Layout {
        dir: dir.to_path_buf(),
        why,
    };
    let len = fs::metadata(path).map_err(io(path))?.len();
    if len > limit {
        return Err(refuse(format!(
            "{} is {len} bytes, over the {limit}-byte bound",
            path.display()
        )));
    }
    let bytes = fs::read(path).map_err(io(path))?;
    serde_json::from_slice(&bytes).map_err(|e| refuse(format!("{}: {e}", path.display())))
}

/// Puts every generation of the layout directory `dir` into `store` (see the module docs for
/// the checks and the order). A layout jitship refuses is an error before anything is written;
/// a generation whose compat id the store already holds other heads for is reported, not put.
pub fn import(store: &dyn Store, layout: &KeyLayout, dir: &Path) -> Result<BakeReport, BakeError> {
    let refuse = |why: String| BakeError::Layout {
        dir: dir.to_path_buf(),
        why,
    };
    let marker: serde_json::Value = read_json(dir, &dir.join("oci-layout"), 4096)?;
    if marker["imageLayoutVersion"] != "1.0.0" {
        return Err(refuse(format!(
            "oci-layout is {marker}, not imageLayoutVersion 1.0.0"
        )));
    }
    let index: ImageIndex = read_json(dir, &dir.join("index.json"), MAX_INDEX_BYTES)?;
    if index.manifests.len() > MAX_GENERATIONS {
        return Err(refuse(format!(
            "index.json lists {} manifests; at most {MAX_GENERATIONS}",
            index.manifests.len()
        )));
    }
    // Everything verified first: a refused layout writes nothing.
    let mut verified = Vec::new();
    for d in index
        .manifests
        .iter()
        .filter(|d| d.artifact_type.as_deref() == Some(ARTIFACT_TYPE))
    {
        verified.push(verify_generation(store, layout, dir, d)?);
    }
    if verified.is_empty() {
        return Err(refuse(format!(
            "index.json names no {ARTIFACT_TYPE} manifest: not a layout jitship export wrote"
        )));
    }
    let mut report = BakeReport {
        dir: dir.to_path_buf(),
        ..BakeReport::default()
    };
    for g in verified {
        report
            .generations
            .push(put_generation(store, layout, dir, g)?);
    }
    Ok(report)
}

/// A generation of the layout, every byte verified. Its packs are not held: they are read again
/// (and their sha256 checked again) when put, so an import holds one generation's packs at a
/// time while verifying, and one pack while writing.
struct Verified {
    manifest: Manifest,
    manifest_bytes: Vec<u8>,
    head: HeadRecord,
    pack_layers: Vec<Descriptor>,
}

fn verify_generation(
    store: &dyn Store,
    layout: &KeyLayout,
    dir: &Path,
    d: &Descriptor,
) -> Result<Verified, BakeError> {
    let refuse = |why: String| BakeError::Layout {
        dir: dir.to_path_buf(),
        why,
    };
    let oci: ImageManifest = serde_json::from_slice(&read_blob(dir, d, MAX_OCI_MANIFEST_BYTES)?)
        .map_err(|e| refuse(format!("manifest {}: {e}", d.digest)))?;
    if oci.artifact_type != ARTIFACT_TYPE
        || oci.config.media_type != MANIFEST_MEDIA_TYPE
        || oci.layers.last().map(|l| l.media_type.as_str()) != Some(HEAD_MEDIA_TYPE)
    {
        return Err(refuse(format!(
            "manifest {} is not a jitship generation (artifact type, config or head layer)",
            d.digest
        )));
    }
    let manifest_bytes = read_blob(
        dir,
        &oci.config,
        crate::generation::MAX_MANIFEST_BYTES as u64,
    )?;
    let id = GenerationId(ContentHash::of(&manifest_bytes));
    let manifest = Manifest::decode(&manifest_bytes, id)
        .map_err(|e| refuse(format!("generation {id}: {e}")))?;
    let head_layer = oci.layers.last().expect("checked above");
    let head = HeadRecord::decode(&read_blob(dir, head_layer, catalog::MAX_HEAD_BYTES)?)
        .map_err(|e| refuse(format!("head of {id}: {e}")))?;
    if head.generation != id || head.compat_id != manifest.compat_id {
        return Err(refuse(format!(
            "the head of {id} names generation {} of compat id {}: not this generation's",
            head.generation, head.compat_id
        )));
    }
    if let Some(ns) = oci.annotations.get(&annotation("namespace"))
        && ns != layout.namespace()
        && head.signature.is_some()
    {
        return Err(refuse(format!(
            "generation {id} is signed for namespace {ns:?}, not {:?}: import it with --namespace {ns}",
            layout.namespace()
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
    let mut bytes = Vec::with_capacity(pack_layers.len());
    for (layer, p) in pack_layers.iter().zip(&manifest.packs) {
        if layer.media_type != PACK_MEDIA_TYPE || layer.size != p.size {
            return Err(refuse(format!(
                "generation {id}: layer {} is not pack {}",
                layer.digest, p.id
            )));
        }
        bytes.push(read_blob(dir, layer, store.max_value_size())?);
    }
    check_files(&manifest, &bytes).map_err(|why| refuse(format!("generation {id}: {why}")))?;
    Ok(Verified {
        manifest,
        manifest_bytes,
        head,
        pack_layers: pack_layers.to_vec(),
    })
}

/// Every file of `manifest` read from `packs` (its packs' bytes, in order) hashes to its blake3:
/// a pack's id names its layout, not its bytes, so the files are what prove them.
fn check_files(manifest: &Manifest, packs: &[Vec<u8>]) -> Result<(), String> {
    for (p, bytes) in manifest.packs.iter().zip(packs) {
        if bytes.len() as u64 != p.size {
            return Err(format!(
                "pack {} is {} bytes, the manifest says {}",
                p.id,
                bytes.len(),
                p.size
            ));
        }
    }
    for f in &manifest.files {
        let mut h = blake3::Hasher::new();
        for c in &f.chunks {
            // In bounds: `Manifest::validate` checked every chunk against its pack's size.
            let start = c.offset as usize;
            h.update(&packs[c.pack as usize][start..start + c.len as usize]);
        }
        if ContentHash::from(h.finalize()) != f.blake3 {
            return Err(format!("{} does not hash to its blake3 (altered)", f.path));
        }
    }
    Ok(())
}

fn put_generation(
    store: &dyn Store,
    layout: &KeyLayout,
    dir: &Path,
    g: Verified,
) -> Result<BakedGeneration, BakeError> {
    let compat = g.head.compat_id;
    let mut baked = BakedGeneration {
        cache_kind: g.manifest.cache_kind.clone(),
        compat_id: compat,
        generation: g.head.generation,
        seq: g.head.seq,
        packs: g.pack_layers.len(),
        bytes: g.manifest.packed_bytes(),
        outcome: String::new(),
    };
    // Its place must be free: the head keeps its seq (its signature binds it).
    let held = catalog::all_heads(store, layout, &compat)?;
    if held.heads.contains(&g.head) {
        baked.outcome = "already-present".into();
        return Ok(baked);
    }
    if !held.heads.is_empty() || !held.faulty.is_empty() {
        baked.outcome = format!(
            "left out: the store already has heads for compat id {compat} (newest seq {}); \
             import into a store without them, or install from this one",
            held.heads.first().map_or(0, |h| h.seq)
        );
        return Ok(baked);
    }
    for (p, layer) in g.manifest.packs.iter().zip(&g.pack_layers) {
        // The same sha256 as when its files were verified: the same bytes.
        let bytes = read_blob(dir, layer, store.max_value_size())?;
        store.put(&layout.pack(&p.id), &bytes, ValueClass::Bulk)?;
    }
    store.put(
        &layout.generation(&g.head.generation),
        &g.manifest_bytes,
        ValueClass::Record,
    )?;
    let head_key = layout.head(&compat, g.head.seq);
    let head_bytes = g.head.encode();
    store.put(&head_key, &head_bytes, ValueClass::Record)?;
    if store.get_capped(&head_key, catalog::MAX_HEAD_BYTES)? != Some(head_bytes) {
        baked.outcome = format!(
            "left out: another writer took seq {} of compat id {compat} meanwhile",
            g.head.seq
        );
        return Ok(baked);
    }
    // Head walks search from 1 and from floors: a floor at the imported seq finds it.
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
    baked.outcome = "imported".into();
    Ok(baked)
}
