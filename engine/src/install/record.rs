//! The record an install leaves beside its root (`.<root name>.jitship-installed.json`, next to
//! its lock file; scans never offer it): what the install put there, for `jitship audit`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::confined::{self, Confined, Entry, Kind};
use crate::generation::{GenerationId, Manifest};
use crate::scan::{RECORD_SUFFIX, STAGING_PREFIX};

/// What one install put into a root, as install hands it to [`write_record_in`], which stamps
/// each file with its identity in the root before writing the [`StoredRecord`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallRecord {
    pub cache_kind: String,
    pub generation: String,
    /// Seconds since the Unix epoch.
    pub installed_at: u64,
    /// Every file of the generation the install put or found in place (not the conflicts it left
    /// alone), by path, with its size on disk.
    pub files: BTreeMap<String, u64>,
    /// The generation is complete and every one of its files is in the root as the manifest has
    /// it (no conflict left alone): see [`StoredRecord::whole`].
    pub whole: bool,
}

impl InstallRecord {
    /// The record of `manifest`, whose id is `id`.
    pub fn of(cache_kind: &str, id: GenerationId, manifest: &Manifest) -> Self {
        Self {
            cache_kind: cache_kind.to_string(),
            generation: id.to_string(),
            installed_at: crate::catalog::now_secs(),
            files: manifest
                .files
                .iter()
                .map(|f| (f.path.to_string(), f.size))
                .collect(),
            whole: false,
        }
    }

    /// The record as written: each file stamped with the inode and mtime it has in `root` now
    /// (right after the commit, under the install lock: the bytes install put there; a rename
    /// keeps both, so a file renamed in from staging has those of the staged file). A file that
    /// is not there as a regular file of the recorded size keeps its size only.
    pub fn stamped(&self, root: Option<&Confined>) -> StoredRecord {
        self.stamped_by(|path| root.and_then(|r| r.entry(path).ok().flatten()))
    }

    /// [`stamped`](Self::stamped) with each file's entry in the root from `on_disk` (an install
    /// that moved nothing in has just looked every file up, under the lock).
    pub fn stamped_by(&self, on_disk: impl Fn(&str) -> Option<Entry>) -> StoredRecord {
        let files: BTreeMap<String, Installed> = self
            .files
            .iter()
            .map(|(path, &size)| {
                let entry = on_disk(path);
                let installed = match entry {
                    Some(e) if e.kind == Kind::File && e.size == size => {
                        Installed::Stamped(Stamp {
                            size,
                            ino: e.ino,
                            mtime_ns: mtime_ns(e.mtime_s, e.mtime_ns),
                        })
                    }
                    _ => Installed::Size(size),
                };
                (path.clone(), installed)
            })
            .collect();
        // Whole only if every file could be stamped: the next install trusts the stamps alone.
        let whole = self.whole && files.values().all(|f| matches!(f, Installed::Stamped(_)));
        StoredRecord {
            cache_kind: self.cache_kind.clone(),
            generation: self.generation.clone(),
            installed_at: self.installed_at,
            files,
            whole,
        }
    }
}

/// The record on disk: what identifies the bytes install put at each path.
///
/// ```json
/// {"cache_kind": "inductor", "generation": "<id>", "installed_at": 1796280000,
///  "files": {"ex/cex.main.so": {"size": 6, "ino": 1234, "mtime_ns": 1796280000123456789}}}
/// ```
///
/// Records of older versions held a size per path (`"ex/cex.main.so": 6`); they are still read
/// ([`Installed::Size`]), and audit compares their files by size only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredRecord {
    pub cache_kind: String,
    pub generation: String,
    /// Seconds since the Unix epoch: when an install last wrote the record (one that found it
    /// already saying all of this leaves it as it is).
    pub installed_at: u64,
    pub files: BTreeMap<String, Installed>,
    /// The generation is complete, and right after the install every one of its files was in
    /// the root as the manifest has it, each stamped. The next install of the same generation
    /// then compares the stamps with the disk instead of fetching and reading the manifest: an
    /// already-current install (every pod restart) of a 20,000-file cache costs a look-up per
    /// file, not a 5 MB manifest read and parsed. The record is as trusted as the files beside
    /// it: whoever can rewrite it can rewrite them (and stamps catch any other change).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub whole: bool,
}

impl StoredRecord {
    /// The record beside `root` if it parses and says its generation was whole.
    pub fn read_whole(root: &Path) -> Option<StoredRecord> {
        let bytes = read_record(root).ok()?;
        serde_json::from_slice::<StoredRecord>(&bytes)
            .ok()
            .filter(|r| r.whole)
    }
}

/// One installed file in a [`StoredRecord`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Installed {
    /// Its size, inode and mtime right after the install.
    Stamped(Stamp),
    /// Its size only (a record of an older version, or a file that could not be looked at).
    Size(u64),
}

/// Read by the JSON type it has, a number or a map. Written by hand because serde's derived
/// untagged enum buffers every value and tries each variant in turn: a 20,000-file record read
/// at every restart (`StoredRecord::read_whole`) took several times as long that way.
impl<'de> Deserialize<'de> for Installed {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Either;
        impl<'de> serde::de::Visitor<'de> for Either {
            type Value = Installed;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a size, or a stamp {size, ino, mtime_ns}")
            }
            fn visit_u64<E: serde::de::Error>(self, size: u64) -> Result<Installed, E> {
                Ok(Installed::Size(size))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Installed, A::Error> {
                Stamp::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(Installed::Stamped)
            }
        }
        d.deserialize_any(Either)
    }
}

impl Installed {
    pub fn size(&self) -> u64 {
        match self {
            Installed::Stamped(s) => s.size,
            Installed::Size(size) => *size,
        }
    }
}

/// What identifies a file's bytes without reading them: a rewrite in place changes the mtime, a
/// write to a temp file renamed over it changes the inode (whatever the size).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stamp {
    pub size: u64,
    pub ino: u64,
    /// Nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
}

/// An mtime (seconds, and nanoseconds within the second) as nanoseconds since the epoch
/// (saturating: far beyond any file's).
pub fn mtime_ns(secs: i64, nanos: i64) -> i64 {
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// The record's name in the directory holding a root named `root_name`.
pub fn record_name(root_name: &str) -> String {
    format!(".{root_name}{RECORD_SUFFIX}")
}

/// The root as install resolves it: absolute, and a root that is a symlink followed once (the
/// record lies beside what the link points to).
fn resolve(root: &Path) -> PathBuf {
    let root = std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf());
    match std::fs::symlink_metadata(&root) {
        Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(&root).unwrap_or(root),
        _ => root,
    }
}

/// Where the record of `root` lives: beside it, in its parent directory.
pub fn record_path(root: &Path) -> PathBuf {
    let root = resolve(root);
    let name = root
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "root".into());
    root.parent()
        .unwrap_or_else(|| Path::new("/"))
        .join(record_name(&name))
}

/// Reads the record of `root` (at [`record_path`]) through the descriptor of the directory
/// holding it: a link, FIFO or device at its name is an error saying so (never followed, read
/// or waited on); a missing record is `NotFound`.
pub fn read_record(root: &Path) -> std::io::Result<Vec<u8>> {
    let path = record_path(root);
    let (Some(parent), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str()))
    else {
        return Err(std::io::ErrorKind::NotFound.into());
    };
    let parent = Confined::open(&std::fs::canonicalize(parent)?)?;
    let mut file = confined::open_read_at(parent.fd(), name).map_err(|e| {
        match confined::what_is_there(&e) {
            Some(what) => std::io::Error::other(format!(
                "{what}, not the regular file jitship writes there: never followed or read; \
                 remove it (the next install writes the record again)"
            )),
            None => e,
        }
    })?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut file, &mut bytes)?;
    Ok(bytes)
}

/// Writes the record of the root `root_name` into `parent` (the open directory holding the root)
/// atomically: a temp file with a staging name (scans skip it) created there without following a
/// link, then renamed over the record. Each file is stamped ([`InstallRecord::stamped`]) from the
/// root as it is now. The caller holds the root's install lock, so the temp name is its own; one
/// left by a crash is replaced.
pub fn write_record_in(
    parent: &Confined,
    root_name: &str,
    record: &InstallRecord,
) -> std::io::Result<()> {
    let root = parent.open_dir(root_name).ok();
    write_stored_in(parent, root_name, &record.stamped(root.as_ref()))
}

/// Writes `stored` as the record of the root `root_name` unless the record there already says
/// exactly that, `installed_at` aside: an already-current install (every pod restart) then costs
/// no write and no fsync. Audit reads the same stamps either way. Whether it wrote.
pub fn write_if_changed_in(
    parent: &Confined,
    root_name: &str,
    mut stored: StoredRecord,
) -> std::io::Result<bool> {
    /// What of a record on disk the comparison needs besides its bytes.
    #[derive(Deserialize)]
    struct Written {
        installed_at: u64,
    }
    let now = stored.installed_at;
    if let Ok(mut file) = confined::open_read_at(parent.fd(), &record_name(root_name)) {
        let mut old = Vec::new();
        if std::io::Read::read_to_end(&mut file, &mut old).is_ok()
            && let Ok(w) = serde_json::from_slice::<Written>(&old)
        {
            stored.installed_at = w.installed_at;
            if serde_json::to_vec(&stored).is_ok_and(|same| same == old) {
                return Ok(false);
            }
        }
    }
    stored.installed_at = now;
    write_stored_in(parent, root_name, &stored).map(|()| true)
}

/// Writes `stored` atomically as the record of the root `root_name` (see [`write_record_in`]).
fn write_stored_in(
    parent: &Confined,
    root_name: &str,
    stored: &StoredRecord,
) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(stored).map_err(std::io::Error::other)?;
    let tmp = format!("{STAGING_PREFIX}{root_name}.record");
    match parent.remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let written = parent.create_new(&tmp, 0o644).and_then(|mut f| {
        f.write_all(&bytes)?;
        f.sync_data()
    });
    let moved =
        written.and_then(|()| confined::rename_over(parent.fd(), &tmp, &record_name(root_name)));
    if moved.is_err() {
        let _ = parent.remove_file(&tmp);
    }
    moved
}

/// Writes the record of `root` (see [`write_record_in`]), opening the directory holding it.
pub fn write_record(root: &Path, record: &InstallRecord) -> std::io::Result<()> {
    let root = resolve(root);
    let (Some(parent), Some(name)) = (root.parent(), root.file_name().and_then(|n| n.to_str()))
    else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{}: no directory holds this root", root.display()),
        ));
    };
    let parent = Confined::open(&std::fs::canonicalize(parent)?)?;
    write_record_in(&parent, name, record)
}
