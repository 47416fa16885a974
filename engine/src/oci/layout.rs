//! The OCI image layout directory (`oci-layout` + `index.json` + `blobs/sha256/`, the format of
//! the OCI image spec): `jitship export` writes generations to one, `jitship import` puts them
//! into a store from one. The index names each generation's manifest by its compat id
//! (`org.opencontainers.image.ref.name`). A compat id the store already has heads for is left
//! alone on import (said so), unless it holds this very head.
//!
//! The layout also travels as one tar archive (`--out FILE.tar`, `--from FILE.tar`; what
//! `skopeo copy oci-archive:` reads): written by archiving a layout directory, read by unpacking
//! only the layout's own names, each regular file bounded in size, into a scratch directory.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{
    ARTIFACT_TYPE, BakedGeneration, BlobSink, BlobSource, Descriptor, OCI_INDEX, OciError,
    REF_NAME, sha256_digest, sha256_hex,
};
use crate::catalog::{self, KeyLayout};
use crate::generation::CompatId;
use crate::store::Store;
use crate::trust::TrustPolicy;

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
}

/// A layout directory, as blobs are written to and read from it.
struct LayoutDir<'a> {
    dir: &'a Path,
}

impl LayoutDir<'_> {
    fn refuse(&self, why: String) -> OciError {
        OciError::Refused {
            from: self.dir.display().to_string(),
            why,
        }
    }

    fn blob_path(&self, digest: &str) -> Option<PathBuf> {
        sha256_hex(digest).map(|hex| self.dir.join("blobs/sha256").join(hex))
    }
}

impl BlobSink for LayoutDir<'_> {
    fn put_blob(&mut self, media_type: &str, bytes: &[u8]) -> Result<Descriptor, OciError> {
        let d = Descriptor::of(media_type, bytes);
        let path = self.blob_path(&d.digest).expect("a digest we computed");
        if !path.exists() {
            fs::write(&path, bytes).map_err(io(&path))?;
        }
        Ok(d)
    }
}

impl BlobSource for LayoutDir<'_> {
    fn describe(&self) -> String {
        self.dir.display().to_string()
    }

    fn read_blob(&self, d: &Descriptor, limit: u64) -> Result<Vec<u8>, OciError> {
        let path = self
            .blob_path(&d.digest)
            .ok_or_else(|| self.refuse(format!("{:?} is not a sha256 digest", d.digest)))?;
        if d.size > limit {
            return Err(self.refuse(format!(
                "blob {} claims {} bytes, over the {limit}-byte bound for a {}",
                d.digest, d.size, d.media_type
            )));
        }
        let file = fs::File::open(&path).map_err(io(&path))?;
        let len = file.metadata().map_err(io(&path))?.len();
        if len != d.size {
            return Err(self.refuse(format!(
                "blob {} is {len} bytes, its descriptor says {}",
                d.digest, d.size
            )));
        }
        let mut bytes = Vec::with_capacity(len as usize);
        file.take(len).read_to_end(&mut bytes).map_err(io(&path))?;
        if sha256_digest(&bytes) != d.digest {
            return Err(self.refuse(format!(
                "blob {} does not hash to its digest (altered)",
                d.digest
            )));
        }
        Ok(bytes)
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
    let mut sink = LayoutDir { dir };
    if dir.exists() && fs::read_dir(dir).map_err(io(dir))?.next().is_some() {
        return Err(sink.refuse("it exists and is not empty; export writes a new layout".into()));
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
    let layout_file = dir.join("oci-layout");
    fs::write(&layout_file, br#"{"imageLayoutVersion":"1.0.0"}"#).map_err(io(&layout_file))?;
    let index_file = dir.join("index.json");
    let text = serde_json::to_vec_pretty(&index).expect("an index serializes");
    fs::write(&index_file, text).map_err(io(&index_file))?;
    Ok(report)
}

fn read_json<T: serde::de::DeserializeOwned>(
    source: &LayoutDir,
    path: &Path,
    limit: u64,
) -> Result<T, OciError> {
    let len = fs::metadata(path).map_err(io(path))?.len();
    if len > limit {
        return Err(source.refuse(format!(
            "{} is {len} bytes, over the {limit}-byte bound",
            path.display()
        )));
    }
    let bytes = fs::read(path).map_err(io(path))?;
    serde_json::from_slice(&bytes).map_err(|e| source.refuse(format!("{}: {e}", path.display())))
}

/// Puts every generation of the layout directory `dir` into `store` (see the module docs for
/// the checks and the order). A layout jitship refuses is an error before anything is written;
/// a generation whose compat id the store already holds other heads for is reported, not put.
pub fn import(store: &dyn Store, layout: &KeyLayout, dir: &Path) -> Result<BakeReport, OciError> {
    let source = LayoutDir { dir };
    let marker: serde_json::Value = read_json(&source, &dir.join("oci-layout"), 4096)?;
    if marker["imageLayoutVersion"] != "1.0.0" {
        return Err(source.refuse(format!(
            "oci-layout is {marker}, not imageLayoutVersion 1.0.0"
        )));
    }
    let index: ImageIndex = read_json(&source, &dir.join("index.json"), MAX_INDEX_BYTES)?;
    if index.manifests.len() > MAX_GENERATIONS {
        return Err(source.refuse(format!(
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
        let bytes = source.read_blob(d, super::MAX_OCI_MANIFEST_BYTES)?;
        let head = super::read_artifact_head(&source, &bytes, &d.digest)?;
        verified.push(super::verify_artifact(
            &source,
            head,
            layout.namespace(),
            store.max_value_size(),
            false,
        )?);
    }
    if verified.is_empty() {
        return Err(source.refuse(format!(
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
            .push(super::put_generation(store, layout, &source, g)?);
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
    file: &Path,
) -> Result<BakeReport, OciError> {
    let scratch = tempfile::Builder::new()
        .prefix("jitship-import-")
        .tempdir()
        .map_err(io(&std::env::temp_dir()))?;
    let limit = store.max_value_size().max(MAX_INDEX_BYTES);
    unpack_layout(file, scratch.path(), limit)?;
    let mut report = import(store, layout, scratch.path()).map_err(|e| match e {
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
    let mut archive = tar::Archive::new(fs::File::open(file).map_err(io(file))?);
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
