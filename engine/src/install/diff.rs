//! What the root already holds of a manifest: the files missing, those present with other content
//! (left alone), and how many are present already, looked up beneath the root's descriptor.

use std::collections::HashMap;
use std::os::fd::AsFd;

use rayon::prelude::*;

use crate::confined::{self, Confined, Kind};
use crate::generation::{FileRecord, Manifest, hash_open_file};

use super::io;
use super::report::InstallError;
use super::stage::{CANONICAL_COMPARE_LIMIT, Materializer};

/// The manifest held against the disk.
pub(super) struct DiskDiff<'m> {
    /// Files of the manifest not on disk: what the install fetches and moves in.
    pub(super) missing: Vec<&'m FileRecord>,
    /// Paths present with other content or blocked (left alone), in words.
    pub(super) conflicts: Vec<String>,
    /// How many files are on disk as the manifest has them.
    pub(super) present: u64,
    /// The regular files found at the manifest's paths, present or conflicting (the install
    /// record's stamps when nothing is moved in: no second look-up).
    pub(super) files_on_disk: HashMap<&'m str, confined::Entry>,
}

/// Files of the manifest missing on disk; paths present with other content (left alone); and how
/// many are present already. A path whose parent on disk is a link or a file is a conflict too:
/// the install never writes through a link. A root that does not exist yet needs every file.
pub(super) fn diff_with_disk<'m>(
    root: Option<&Confined>,
    manifest: &'m Manifest,
    materializer: &Materializer,
) -> Result<DiskDiff<'m>, InstallError> {
    let Some(root) = root else {
        return Ok(DiskDiff {
            missing: manifest.files.iter().collect(),
            conflicts: vec![],
            present: 0,
            files_on_disk: HashMap::new(),
        });
    };
    let looked = look_up_files(root, manifest)?;
    let mut todo = Vec::new();
    let mut conflicts = Vec::new();
    let mut present = 0;
    let mut files_on_disk = HashMap::new();
    for (f, on_disk) in manifest.files.iter().zip(looked) {
        let rel = f.path.as_str();
        let shown = || root.display(rel);
        let entry = match on_disk {
            Looked::Blocked => {
                conflicts.push(format!("{}: a parent on disk is not a directory", f.path));
                continue;
            }
            Looked::At(entry) => entry,
        };
        if let Some(e) = entry.filter(|e| e.kind == Kind::File) {
            files_on_disk.insert(rel, e);
        }
        match entry {
            None => todo.push(f),
            // Stored canonical: the size differs from the file's; compare in canonical form.
            Some(e) if e.kind == Kind::File && f.canonical => {
                let matches = e.size <= CANONICAL_COMPARE_LIMIT && {
                    let file = root.open_read(rel).map_err(io("read", &shown()))?;
                    materializer.on_disk_matches(f, file, &shown())?
                };
                if matches {
                    present += 1;
                } else {
                    conflicts.push(format!("{}: present with other content", f.path));
                }
            }
            // Same size and the exact mtime an install sets: the file is ours; skip rehashing it.
            Some(e)
                if e.kind == Kind::File
                    && e.size == f.size
                    && e.mtime_s == f.mtime_s
                    && e.mtime_ns == i64::from(f.mtime_ns) =>
            {
                present += 1;
            }
            Some(e) if e.kind == Kind::File && e.size == f.size => {
                let mut file = root.open_read(rel).map_err(io("read", &shown()))?;
                let (h, _) = hash_open_file(&mut file).map_err(io("read", &shown()))?;
                if h == f.blake3 {
                    present += 1;
                } else {
                    conflicts.push(format!("{}: present with other content", f.path));
                }
            }
            Some(_) => conflicts.push(format!("{}: present with another size or type", f.path)),
        }
    }
    Ok(DiskDiff {
        missing: todo,
        conflicts,
        present,
        files_on_disk,
    })
}

/// What the disk holds at a file's path: blocked by a parent that is not a directory, or the
/// entry there (never following a link), if any.
pub(super) enum Looked {
    Blocked,
    At(Option<confined::Entry>),
}

/// Looks up every file of the manifest, in manifest order. Each directory holding files is
/// opened once, beneath the root with no link followed, and its files are `fstatat`-ed through
/// that descriptor, directories in parallel: an already-current install of a 20,000-file cache
/// is mostly this, and a lookup from the root per file doubled its cost. The open also answers
/// for the directories above: one of them that is a file or a link fails it (`ENOTDIR`,
/// `ELOOP`), one that is missing makes it `ENOENT`.
fn look_up_files(root: &Confined, manifest: &Manifest) -> Result<Vec<Looked>, InstallError> {
    let paths: Vec<&str> = manifest.files.iter().map(|f| f.path.as_str()).collect();
    look_up(root, &paths)
}

/// [`look_up_files`] for any paths of the root, in the order given.
pub(super) fn look_up(root: &Confined, paths: &[&str]) -> Result<Vec<Looked>, InstallError> {
    let mut files_by_dir: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, p) in paths.iter().enumerate() {
        let (dir, _) = confined::split(p);
        files_by_dir.entry(dir).or_default().push(i);
    }
    let looked: Vec<Vec<(usize, Looked)>> = files_by_dir
        .into_par_iter()
        .map(|(_, files)| {
            let path = |i: usize| paths[i];
            let fd = match root.parent_of(path(files[0])) {
                Ok((fd, _)) => fd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Ok(files.into_iter().map(|i| (i, Looked::At(None))).collect());
                }
                // Not a directory, a link, or not ours to look into: never written through.
                Err(_) => return Ok(files.into_iter().map(|i| (i, Looked::Blocked)).collect()),
            };
            files
                .into_iter()
                .map(|i| {
                    let (_, name) = confined::split(path(i));
                    let entry = confined::entry_at(fd.as_fd(), name)
                        .map_err(io("stat", &root.display(path(i))))?;
                    Ok((i, Looked::At(entry)))
                })
                .collect()
        })
        .collect::<Result<_, InstallError>>()?;
    let mut by_index: Vec<Option<Looked>> = (0..paths.len()).map(|_| None).collect();
    for (i, l) in looked.into_iter().flatten() {
        by_index[i] = Some(l);
    }
    Ok(by_index
        .into_iter()
        .map(|l| l.expect("every file belongs to one directory"))
        .collect())
}
