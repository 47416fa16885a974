//! The OCI image layout directory (`oci-layout` + `index.json` + `blobs/sha256/`, the format of
//! the OCI image spec): `jitship export` writes generations to one, `jitship import` puts them
//! into a store from one. The index names each generation's manifest by its compat id
//! (`org.opencontainers.image.ref.name`). A compat id the store already has heads for is left
//! alone on import (said so), unless it holds this very head, or only untrusted heads where the
//! import brings a trusted one (see `put_generation`).
//!
//! Import judges every head by the trust, as install does, before anything else of its
//! generation is read: under `required` a generation no trusted key signed is refused (listed in
//! the report's `refused`, with its signer), and if that leaves nothing to import the command
//! fails (exit 1) with the reasons. A layout is someone else's directory: every file of it is
//! opened beneath it without following a link, without blocking (a FIFO), and must be a regular
//! file of a bounded size; a generation or a pack listed twice is refused before it is read
//! twice; packs are streamed to temporary files while verified and written one at a time.
//!
//! The layout also travels as one tar archive (`--out FILE.tar`, `--from FILE.tar`; what
//! `skopeo copy oci-archive:` reads): written by archiving a layout directory, read by unpacking
//! only the layout's own names, each regular file bounded in size, into a scratch directory.

use std::collections::HashSet;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use jitship_confined::Confined;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{
    ARTIFACT_TYPE, BakedGeneration, BlobSink, BlobSource, Descriptor, OCI_INDEX, OciError,
    REF_NAME, sha256_digest, sha256_hex,
};
use jitship_catalog::{self as catalog, KeyLayout};
use jitship_generation::{CompatId, GenerationId};
use jitship_store::Store;
use jitship_trust::{Signer, TrustPolicy};

/// Bounds on what an import reads before it trusts anything.
const MAX_INDEX_BYTES: u64 = 16 << 20;
const MAX_GENERATIONS: usize = 100_000;
/// Most entries an archive may hold (the layout's files and its two directories).
const MAX_ARCHIVE_ENTRIES: usize = 4_000_000;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> OciError + '_ {
    move |source| OciError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ImageIndex {
    schema_version: u32,
    media_type: String,
    manifests: Vec<Descriptor>,
}

/// What `export` or `import` did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BakeReport {
    pub dir: PathBuf,
    pub generations: Vec<BakedGeneration>,
    /// Compat ids exported with nothing (no usable, trusted, complete-in-the-store head).
    pub skipped: Vec<String>,
    /// Import: generations the trust did not admit (nothing of them was written).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<RefusedGeneration>,
}

/// A generation of a layout that `import` did not put into the store because the trust does not
/// admit its head.
#[derive(Debug, Clone, Serialize)]
pub struct RefusedGeneration {
    pub compat_id: CompatId,
    pub generation: GenerationId,
    pub seq: u64,
    pub signer: Signer,
}

/// A layout directory, as blobs are written to and read from it: every file reached beneath the
/// directory's descriptor (`confined`), never through a link.
struct LayoutDir<'a> {
    dir: &'a Path,
    root: Confined,
}

impl<'a> LayoutDir<'a> {
    fn open(dir: &'a Path) -> Result<Self, OciError> {
        // The operator named this path (a link there is their choice); nothing below it is
        // followed.
        let real = fs::canonicalize(dir).map_err(io(dir))?;
        let root = Confined::open(&real).map_err(io(dir))?;
        Ok(Self { dir, root })
    }

    fn refuse(&self, why: String) -> OciError {
        OciError::Refused {
            from: self.dir.display().to_string(),
            why,
        }
    }

    fn blob_rel(&self, digest: &str) -> Option<String> {
        sha256_hex(digest).map(|hex| format!("blobs/sha256/{hex}"))
    }

    /// Opens `rel` for reading: a regular file (not a link, FIFO, device or directory, refused
    /// without blocking and unread) of at most `limit` bytes; returns it with its size.
    fn open_regular(&self, rel: &str, limit: u64) -> Result<(fs::File, u64), OciError> {
        let file =
            self.root
                .open_read(rel)
                .map_err(|e| match jitship_confined::what_is_there(&e) {
                    Some(what) => self.refuse(format!(
                        "{rel} is {what}, not a regular file: a layout holds only regular files"
                    )),
                    None => io(&self.dir.join(rel))(e),
                })?;
        let len = file.metadata().map_err(io(&self.dir.join(rel)))?.len();
        if len > limit {
            return Err(self.refuse(format!("{rel} is {len} bytes, over the {limit}-byte bound")));
        }
        Ok((file, len))
    }

    /// `open_regular` of the blob `d` names, checked to be `d.size` bytes, at most `limit`.
    fn open_blob(&self, d: &Descriptor, limit: u64) -> Result<fs::File, OciError> {
        let rel = self
            .blob_rel(&d.digest)
            .ok_or_else(|| self.refuse(format!("{:?} is not a sha256 digest", d.digest)))?;
        if d.size > limit {
            return Err(self.refuse(format!(
                "blob {} claims {} bytes, over the {limit}-byte bound for a {}",
                d.digest, d.size, d.media_type
            )));
        }
        let (file, len) = self.open_regular(&rel, limit)?;
        if len != d.size {
            return Err(self.refuse(format!(
                "blob {} is {len} bytes, its descriptor says {}",
                d.digest, d.size
            )));
        }
        Ok(file)
    }

    fn altered(&self, d: &Descriptor) -> OciError {
        self.refuse(format!(
            "blob {} does not hash to its digest (altered)",
            d.digest
        ))
    }

    /// Writes `bytes` as the new regular file `rel` (never through a link); `false` if a file
    /// is there already.
    fn create(&self, rel: &str, bytes: &[u8]) -> Result<bool, OciError> {
        let path = self.dir.join(rel);
        match self.root.create_new(rel, 0o644) {
            Ok(mut f) => {
                f.write_all(bytes).map_err(io(&path))?;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(io(&path)(e)),
        }
    }
}

impl BlobSink for LayoutDir<'_> {
    fn put_blob(&mut self, media_type: &str, bytes: &[u8]) -> Result<Descriptor, OciError> {
        let d = Descriptor::of(media_type, bytes);
        let rel = self.blob_rel(&d.digest).expect("a digest we computed");
        // A blob already there is these bytes: this export wrote it (the directory was empty).
        self.create(&rel, bytes)?;
        Ok(d)
    }
}

impl BlobSource for LayoutDir<'_> {
    fn describe(&self) -> String {
        self.dir.display().to_string()
    }

    fn read_blob(&self, d: &Descriptor, limit: u64) -> Result<Vec<u8>, OciError> {
        let file = self.open_blob(d, limit)?;
        let mut bytes = Vec::with_capacity(d.size as usize);
        let path = self.dir.join(self.blob_rel(&d.digest).unwrap_or_default());
        file.take(d.size)
            .read_to_end(&mut bytes)
            .map_err(io(&path))?;
        if sha256_digest(&bytes) != d.digest {
            return Err(self.altered(d));
        }
        Ok(bytes)
    }

    fn spool_blob(&self, d: &Descriptor, limit: u64) -> Result<fs::File, OciError> {
        let file = self.open_blob(d, limit)?;
        let path = self.dir.join(self.blob_rel(&d.digest).unwrap_or_default());
        let mut spooled = tempfile::tempfile().map_err(io(&std::env::temp_dir()))?;
        let mut hashing = HashingWriter {
            out: &mut spooled,
            hash: Sha256::new(),
        };
        let copied = std::io::copy(&mut file.take(d.size), &mut hashing).map_err(io(&path))?;
        let digest = format!("sha256:{:x}", hashing.hash.finalize());
        if copied != d.size || digest != d.digest {
            return Err(self.altered(d));
        }
        Ok(spooled)
    }
}

/// Writes through to `out`, hashing what passes.
struct HashingWriter<'a> {
    out: &'a mut fs::File,
    hash: Sha256,
}

impl Write for HashingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
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
) -> Result<BakeReport, OciError> {
    if dir.exists() && fs::read_dir(dir).map_err(io(dir))?.next().is_some() {
        return Err(OciError::Refused {
            from: dir.display().to_string(),
            why: "it exists and is not empty; export writes a new layout".into(),
        });
    }
    fs::create_dir_all(dir).map_err(io(dir))?;
    let mut sink = LayoutDir::open(dir)?;
    sink.root
        .mkdir_all("blobs/sha256", 0o755)
        .map_err(io(dir))?;
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
        let Some(g) = super::newest_whole(store, layout, trust, &compat, &Default::default())?
        else {
            report.skipped.push(compat.to_string());
            continue;
        };
        let (bytes, mut descriptor, baked) = super::write_artifact(&mut sink, layout, &g)?;
        sink.put_blob(&descriptor.media_type.clone(), &bytes)?;
        descriptor
            .annotations
            .insert(REF_NAME.into(), compat.to_string());
        index.manifests.push(descriptor);
        report.generations.push(baked);
    }
    let exists = |rel: &str| OciError::Io {
        path: dir.join(rel),
        source: std::io::ErrorKind::AlreadyExists.into(),
    };
    if !sink.create("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)? {
        return Err(exists("oci-layout"));
    }
    let text = serde_json::to_vec_pretty(&index).expect("an index serializes");
    if !sink.create("index.json", &text)? {
        return Err(exists("index.json"));
    }
    Ok(report)
}

fn read_json<T: serde::de::DeserializeOwned>(
    source: &LayoutDir,
    rel: &str,
    limit: u64,
) -> Result<T, OciError> {
    let (file, len) = source.open_regular(rel, limit)?;
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(limit)
        .read_to_end(&mut bytes)
        .map_err(io(&source.dir.join(rel)))?;
    serde_json::from_slice(&bytes).map_err(|e| source.refuse(format!("{rel}: {e}")))
}

/// Puts every generation of the layout directory `dir` that `trust` admits into `store` (see
/// the module docs for the checks and the order). A layout jitship refuses is an error before
/// anything is written, and so is one of which the trust admits nothing; a generation the trust
/// does not admit is reported (`refused`), one whose compat id the store already holds other
/// heads for is reported, not put.
pub fn import(
    store: &dyn Store,
    layout: &KeyLayout,
    trust: &TrustPolicy,
    dir: &Path,
) -> Result<BakeReport, OciError> {
    let source = LayoutDir::open(dir)?;
    let marker: serde_json::Value = read_json(&source, "oci-layout", 4096)?;
    if marker["imageLayoutVersion"] != "1.0.0" {
        return Err(source.refuse(format!(
            "oci-layout is {marker}, not imageLayoutVersion 1.0.0"
        )));
    }
    let index: ImageIndex = read_json(&source, "index.json", MAX_INDEX_BYTES)?;
    if index.manifests.len() > MAX_GENERATIONS {
        return Err(source.refuse(format!(
            "index.json lists {} manifests; at most {MAX_GENERATIONS}",
            index.manifests.len()
        )));
    }
    // Each manifest once (export lists each generation once): a listing repeated 2,000 times
    // would be verified 2,000 times.
    let mut listed = HashSet::new();
    if let Some(d) = index.manifests.iter().find(|d| !listed.insert(&d.digest)) {
        return Err(source.refuse(format!(
            "index.json: manifest {} is listed more than once (jitship export lists each \
             generation once)",
            d.digest
        )));
    }
    // Everything verified first: a refused layout writes nothing.
    let mut verified = Vec::new();
    let mut generations = HashSet::new();
    let mut refused = Vec::new();
    for d in index
        .manifests
        .iter()
        .filter(|d| d.artifact_type.as_deref() == Some(ARTIFACT_TYPE))
    {
        let bytes = source.read_blob(d, super::MAX_OCI_MANIFEST_BYTES)?;
        let head = super::read_artifact_head(&source, &bytes, &d.digest)?;
        let h = &head.head;
        if !generations.insert(h.generation) {
            return Err(source.refuse(format!(
                "generation {} is listed more than once (under several manifests)",
                h.generation
            )));
        }
        // Judged as install judges it, before anything else of it is read.
        let signer = trust.judge(layout.namespace(), h);
        let what = format_args!(
            "generation {} (head {} of {})",
            h.generation, h.seq, h.compat_id
        );
        if !trust.admits(&signer, &what) {
            refused.push(RefusedGeneration {
                compat_id: h.compat_id,
                generation: h.generation,
                seq: h.seq,
                signer,
            });
            continue;
        }
        verified.push(super::verify_artifact(
            &source,
            head,
            layout.namespace(),
            store.max_value_size(),
            false,
        )?);
    }
    if verified.is_empty() && !refused.is_empty() {
        let reasons: Vec<String> = refused
            .iter()
            .map(|r| {
                format!(
                    "{} of compat id {} is {}",
                    r.generation, r.compat_id, r.signer
                )
            })
            .collect();
        return Err(source.refuse(format!(
            "its {} generation(s) are not admitted by the trust (mode {}), nothing was imported: \
             {}; import only what a trusted key signed, or trust its signer (--trusted-key)",
            refused.len(),
            trust.mode().as_str(),
            reasons.join("; ")
        )));
    }
    if verified.is_empty() {
        return Err(source.refuse(format!(
            "index.json names no {ARTIFACT_TYPE} manifest: not a layout jitship export wrote"
        )));
    }
    let mut report = BakeReport {
        dir: dir.to_path_buf(),
        refused,
        ..BakeReport::default()
    };
    for g in verified {
        report
            .generations
            .push(super::put_generation(store, layout, trust, &source, g)?);
    }
    Ok(report)
}

/// True for a path `export` and `import` take as a tar archive of a layout (`*.tar`).
pub fn is_archive(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "tar")
}

/// [`export`] into the tar archive `file` (which must not exist): the layout is written to a
/// scratch directory beside it, archived into a temporary file there, and that file renamed into
/// place, so a failed export leaves no archive behind.
pub fn export_archive(
    store: &dyn Store,
    layout: &KeyLayout,
    trust: &TrustPolicy,
    compat_ids: &[CompatId],
    file: &Path,
) -> Result<BakeReport, OciError> {
    let refuse = |why: String| OciError::Refused {
        from: file.display().to_string(),
        why,
    };
    if file.exists() {
        return Err(refuse("it exists; export writes a new archive".into()));
    }
    let parent = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let scratch = tempfile::Builder::new()
        .prefix(".jitship-export-")
        .tempdir_in(parent)
        .map_err(io(parent))?;
    let dir = scratch.path().join("layout");
    let mut report = export(store, layout, trust, compat_ids, &dir)?;
    let archive = tempfile::NamedTempFile::new_in(parent).map_err(io(parent))?;
    let mut builder = tar::Builder::new(archive.as_file());
    builder.follow_symlinks(false);
    builder.append_dir_all(".", &dir).map_err(io(&dir))?;
    builder.finish().map_err(io(file))?;
    drop(builder);
    archive.as_file().sync_all().map_err(io(file))?;
    archive.persist_noclobber(file).map_err(|e| OciError::Io {
        path: file.to_path_buf(),
        source: e.error,
    })?;
    report.dir = file.to_path_buf();
    Ok(report)
}

/// [`import`] from the tar archive `file`: unpacked first into a scratch directory (in
/// `$TMPDIR`), taking only the layout's names (`oci-layout`, `index.json`, `blobs/sha256/<64
/// hex>`, their directories), each file at most `max_file_bytes`; anything else refuses it.
pub fn import_archive(
    store: &dyn Store,
    layout: &KeyLayout,
    trust: &TrustPolicy,
    file: &Path,
) -> Result<BakeReport, OciError> {
    let scratch = tempfile::Builder::new()
        .prefix("jitship-import-")
        .tempdir()
        .map_err(io(&std::env::temp_dir()))?;
    let limit = store.max_value_size().max(MAX_INDEX_BYTES);
    unpack_layout(file, scratch.path(), limit)?;
    let mut report = import(store, layout, trust, scratch.path()).map_err(|e| match e {
        // Name the archive, not the scratch directory.
        OciError::Refused { why, .. } => OciError::Refused {
            from: file.display().to_string(),
            why,
        },
        other => other,
    })?;
    report.dir = file.to_path_buf();
    Ok(report)
}

fn unpack_layout(file: &Path, dir: &Path, max_file_bytes: u64) -> Result<(), OciError> {
    let refuse = |why: String| OciError::Refused {
        from: file.display().to_string(),
        why,
    };
    // Never blocking on a FIFO put where the archive was named, and only a regular file read.
    let opened = {
        use std::os::unix::fs::OpenOptionsExt;
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(file)
            .map_err(io(file))?
    };
    if !opened.metadata().map_err(io(file))?.is_file() {
        return Err(refuse("it is not a regular file".into()));
    }
    let mut archive = tar::Archive::new(opened);
    archive.set_preserve_permissions(false);
    archive.set_unpack_xattrs(false);
    for (n, entry) in archive.entries().map_err(io(file))?.enumerate() {
        if n >= MAX_ARCHIVE_ENTRIES {
            return Err(refuse(format!(
                "it holds more than {MAX_ARCHIVE_ENTRIES} entries"
            )));
        }
        let mut entry = entry.map_err(io(file))?;
        let name = entry.path().map_err(io(file))?.into_owned();
        let rel = name.strip_prefix(".").unwrap_or(&name);
        let parts: Vec<&str> = rel.iter().filter_map(|c| c.to_str()).collect();
        let kind = entry.header().entry_type();
        let is_dir = kind.is_dir();
        let allowed = match parts.as_slice() {
            [] => is_dir,
            ["blobs"] | ["blobs", "sha256"] => is_dir,
            ["oci-layout"] | ["index.json"] => kind.is_file(),
            ["blobs", "sha256", hex] => {
                kind.is_file() && sha256_hex(&format!("sha256:{hex}")).is_some()
            }
            _ => false,
        };
        if !allowed || parts.len() != rel.iter().count() {
            return Err(refuse(format!(
                "{} is not a name of an OCI layout jitship writes (or not a plain file)",
                name.display()
            )));
        }
        if entry.size() > max_file_bytes {
            return Err(refuse(format!(
                "{} is {} bytes, over the {max_file_bytes}-byte bound",
                name.display(),
                entry.size()
            )));
        }
        if !is_dir {
            let target = dir.join(rel);
            if let Some(parent) = target.parent() {
                fs::create_dir_all(parent).map_err(io(parent))?;
            }
            let mut out = fs::File::create(&target).map_err(io(&target))?;
            std::io::copy(&mut (&mut entry).take(max_file_bytes), &mut out).map_err(io(&target))?;
        }
    }
    Ok(())
}
