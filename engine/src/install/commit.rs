//! Into the root: the diff of a manifest with what is on disk, and the commit that moves staged
//! files in (markers last) and rolls back exactly what it moved.

use super::*;

/// Files of the manifest missing on disk; paths present with other content (left alone); and how
/// many are present already. A path whose parent on disk is a link or a file is a conflict too:
/// the install never writes through a link. A root that does not exist yet needs every file.
pub(super) fn diff_with_disk<'m>(
    root: Option<&Confined>,
    manifest: &'m Manifest,
    materializer: &Materializer,
) -> Result<(Vec<&'m FileRecord>, Vec<String>, u64), InstallError> {
    let Some(root) = root else {
        return Ok((manifest.files.iter().collect(), vec![], 0));
    };
    let looked = look_up_files(root, manifest)?;
    let mut todo = Vec::new();
    let mut conflicts = Vec::new();
    let mut present = 0;
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
    Ok((todo, conflicts, present))
}

/// What the disk holds at a file's path: blocked by a parent that is not a directory, or the
/// entry there (never following a link), if any.
enum Looked {
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
fn look_up(root: &Confined, paths: &[&str]) -> Result<Vec<Looked>, InstallError> {
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

/// Moves verified files into the root: non-marker files first, then markers, so the engine never
/// finds a marker before what it marks. A root that does not exist yet, or is an empty directory,
/// receives the whole tree in one rename; otherwise file by file with RENAME_NOREPLACE (never over
/// a file that appeared meanwhile), each through a descriptor of its directory reached beneath the
/// root's without following a link. On an error, what was moved and created is taken back out
/// through the same descriptors, so the root is as it was.
pub(super) fn commit(
    target: &Target,
    staging: &Confined,
    pending: &[Pending],
    pause: Duration,
    report: &mut InstallReport,
) -> Result<(), InstallError> {
    let root_path = target.path();
    let bytes: u64 = pending.iter().map(|p| p.record.size).sum();
    let root_is_empty = match &target.dir {
        None => true,
        Some(dir) => dir.is_empty().map_err(io("read", &root_path))?,
    };
    if root_is_empty {
        let old_mode = match &target.dir {
            Some(dir) => Some(dir.stat().map_err(io("stat", &root_path))?.2),
            None => None,
        };
        // rename(2) replaces an empty directory and nothing else (a link or a file fails).
        match confined::rename_dir_over_empty(
            staging.fd(),
            STAGED_TREE,
            target.parent.fd(),
            &target.name,
        ) {
            Ok(()) => {
                // The tree took the empty root's place: give it the root's permissions.
                if let Some(mode) = old_mode {
                    let dir = target
                        .parent
                        .open_dir(&target.name)
                        .map_err(io("open", &root_path))?;
                    confined::chmod(dir.fd(), mode).map_err(io("chmod", &root_path))?;
                }
                report.files_installed = pending.len() as u64;
                report.bytes_installed = bytes;
                return verify_in_place(target, pending.iter());
            }
            Err(e) if target.dir.is_none() => {
                return Err(InstallError::Io {
                    op: "rename into",
                    path: root_path,
                    source: e,
                });
            }
            // The root is a mount point, or a file appeared in it: go file by file.
            Err(_) => {}
        }
    }
    let root = target.dir.as_ref().expect("an existing root");
    raise_open_file_limit();
    let mut dirs = DirCache::new(root).map_err(io("open", &root_path))?;
    // (directory, name, device, inode, path in the root) of each file moved in.
    let mut moved: Vec<(Arc<OwnedFd>, &str, u64, u64, &str)> = Vec::new();
    let ordered = pending
        .iter()
        .filter(|p| !p.record.marker)
        .chain(pending.iter().filter(|p| p.record.marker));
    let mut result = Ok(());
    for p in ordered {
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
        let rel = p.record.path.as_str();
        let (dir, name) = match rel.rsplit_once('/') {
            Some((dir, name)) => (dir, name),
            None => ("", rel),
        };
        let parent = match dirs.get_or_create(dir) {
            Ok(fd) => fd,
            Err(e) => {
                result = Err(InstallError::Io {
                    op: "install under",
                    path: root.display(dir),
                    source: e,
                });
                break;
            }
        };
        let shown = staging.display(&p.staged);
        let staged = staging
            .parent_of(&p.staged)
            .and_then(|(d, n)| Ok((confined::entry_at(d.as_fd(), n)?, d, n)));
        let (identity, from_dir, from_name) = match staged {
            Ok((Some(e), d, n)) => ((e.dev, e.ino), d, n),
            Ok((None, ..)) => {
                result = Err(InstallError::Io {
                    op: "find staged",
                    path: shown,
                    source: std::io::ErrorKind::NotFound.into(),
                });
                break;
            }
            Err(e) => {
                result = Err(InstallError::Io {
                    op: "find staged",
                    path: shown,
                    source: e,
                });
                break;
            }
        };
        match confined::rename_noreplace(from_dir.as_fd(), from_name, parent.as_fd(), name) {
            Ok(()) => {
                moved.push((parent, name, identity.0, identity.1, rel));
                report.files_installed += 1;
                report.bytes_installed += p.record.size;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                report.conflicts.push(format!(
                    "{}: appeared during the install (left alone)",
                    p.record.path
                ));
            }
            Err(e) => {
                result = Err(InstallError::Io {
                    op: "rename into",
                    path: root.display(rel),
                    source: e,
                });
                break;
            }
        }
    }
    if result.is_ok() {
        result = verify_moved(root, &moved);
    }
    if result.is_err() {
        // Only what this install put there: a file is removed if it is still the inode we moved.
        for (dir, name, dev, ino, _) in moved.iter().rev() {
            let _ = confined::remove_if_same(dir.as_fd(), name, *dev, *ino);
        }
        for (dir, name) in dirs.created.iter().rev() {
            let _ = confined::remove_dir_at(dir.as_fd(), name);
        }
        report.files_installed = 0;
        report.bytes_installed = 0;
        report.files_materialized.clear();
    }
    result
}

/// The file-by-file commit checks its own result before it reports it: every file it moved is
/// still the inode it moved, in the directory it moved it into (reached through the descriptor
/// it kept, so a directory another process swaps meanwhile does not fool it either way).
/// Otherwise the commit is rolled back and fails.
fn verify_moved(
    root: &Confined,
    moved: &[(Arc<OwnedFd>, &str, u64, u64, &str)],
) -> Result<(), InstallError> {
    for (dir, name, dev, ino, rel) in moved {
        let why = match confined::entry_at(dir.as_fd(), name) {
            Ok(Some(e)) if e.kind == Kind::File && (e.dev, e.ino) == (*dev, *ino) => continue,
            Ok(Some(_)) => "another file took its place".to_owned(),
            Ok(None) => "missing".to_owned(),
            Err(e) => e.to_string(),
        };
        return Err(InstallError::NotInPlace {
            path: root.display(rel),
            why,
        });
    }
    Ok(())
}

/// The commit of a whole tree (into a root that did not exist or was empty) checks its own
/// result: every file it moved is in the root now, reached afresh beneath the root's descriptor
/// (opened again through its parent's) without following a link, a regular file of the
/// manifest's size (a file materialized for this root has its own). A tree another process
/// emptied in part before it was moved in (say, an installer of another root removing staging it
/// took for its own) is never reported installed: the next install moves in what is missing.
fn verify_in_place<'a, 'm: 'a>(
    target: &Target,
    moved: impl Iterator<Item = &'a Pending<'m>>,
) -> Result<(), InstallError> {
    let root = target
        .parent
        .open_dir(&target.name)
        .map_err(|e| InstallError::NotInPlace {
            path: target.path(),
            why: format!("the root cannot be opened: {e}"),
        })?;
    let moved: Vec<&FileRecord> = moved.map(|p| p.record).collect();
    let paths: Vec<&str> = moved.iter().map(|r| r.path.as_str()).collect();
    for (r, looked) in moved.iter().zip(look_up(&root, &paths)?) {
        let why = match looked {
            Looked::Blocked => "a directory above it is no longer a directory".to_owned(),
            Looked::At(None) => "missing".to_owned(),
            Looked::At(Some(e)) if e.kind != Kind::File => "replaced by something else".to_owned(),
            Looked::At(Some(e)) if !r.canonical && e.size != r.size => {
                format!("{} bytes, not the {} moved there", e.size, r.size)
            }
            Looked::At(Some(_)) => continue,
        };
        return Err(InstallError::NotInPlace {
            path: root.display(r.path.as_str()),
            why,
        });
    }
    Ok(())
}

/// Descriptors of the root's directories the commit writes into, each opened one component at a
/// time from its parent's descriptor without following a link, and kept open so a rollback
/// reaches exactly the directories the commit used even if a name was swapped meanwhile.
pub(super) struct DirCache<'r> {
    pub(super) open: HashMap<&'r str, Arc<OwnedFd>>,
    /// Directories this commit created: (parent, name), top down.
    pub(super) created: Vec<(Arc<OwnedFd>, &'r str)>,
}

impl<'r> DirCache<'r> {
    pub(super) fn new(root: &Confined) -> std::io::Result<Self> {
        Ok(Self {
            open: HashMap::from([("", Arc::new(root.dir_fd("")?))]),
            created: Vec::new(),
        })
    }

    pub(super) fn get_or_create(&mut self, dir: &'r str) -> std::io::Result<Arc<OwnedFd>> {
        if let Some(fd) = self.open.get(dir) {
            return Ok(fd.clone());
        }
        let mut at = self.open[""].clone();
        let components = dir.match_indices('/').map(|(i, _)| i).chain([dir.len()]);
        let mut start = 0;
        for end in components {
            let sofar = &dir[..end];
            let name = &dir[start..end];
            start = end + 1;
            if let Some(fd) = self.open.get(sofar) {
                at = fd.clone();
                continue;
            }
            let fd = match confined::open_dir_at(at.as_fd(), name) {
                Ok(fd) => fd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    confined::mkdir_at(at.as_fd(), name, DIR_MODE)?;
                    self.created.push((at.clone(), name));
                    confined::open_dir_at(at.as_fd(), name)?
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR) | Some(libc::ELOOP)) => {
                    return Err(std::io::Error::other(
                        "not a directory (changed during the install)",
                    ));
                }
                Err(e) => return Err(e),
            };
            let fd = Arc::new(fd);
            self.open.insert(sofar, fd.clone());
            at = fd;
        }
        Ok(at)
    }
}
