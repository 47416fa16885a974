//! Into the root: the commit that moves staged files in (markers last), checks they are in
//! place, and rolls back exactly what it moved.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use crate::confined::{self, Confined, Kind};
use crate::generation::FileRecord;

use super::diff::{Looked, look_up};
use super::io;
use super::report::{InstallError, Progress};
use super::stage::{DIR_MODE, Pending, STAGED_TREE};
use super::target::Target;

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
    progress: &mut Progress,
) -> Result<(), InstallError> {
    if let Some(result) = commit_whole_tree(target, staging, pending, progress) {
        return result;
    }
    let root = target.dir.as_ref().expect("an existing root");
    raise_open_file_limit();
    let mut dirs = DirCache::new(root).map_err(io("open", &target.path()))?;
    let mut moved: Vec<Moved> = Vec::new();
    let ordered = pending
        .iter()
        .filter(|p| !p.record.marker)
        .chain(pending.iter().filter(|p| p.record.marker));
    let mut result = Ok(());
    for p in ordered {
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
        match move_one(root, staging, &mut dirs, p) {
            Ok(Some(m)) => {
                moved.push(m);
                progress.files_installed += 1;
                progress.bytes_installed += p.record.size;
            }
            Ok(None) => progress.conflicts.push(format!(
                "{}: appeared during the install (left alone)",
                p.record.path
            )),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    if result.is_ok() {
        result = verify_moved(root, &moved);
    }
    if result.is_err() {
        roll_back(&moved, &dirs);
        progress.files_installed = 0;
        progress.bytes_installed = 0;
        progress.files_materialized.clear();
    }
    result
}

/// The whole staged tree renamed into a root that does not exist or is empty, in one step; `None`
/// when that cannot be done (the root is a mount point, or a file appeared in it) and the commit
/// goes file by file.
fn commit_whole_tree(
    target: &Target,
    staging: &Confined,
    pending: &[Pending],
    progress: &mut Progress,
) -> Option<Result<(), InstallError>> {
    let root_path = target.path();
    let old_mode = match &target.dir {
        None => None,
        Some(dir) => match dir.is_empty() {
            Ok(true) => match dir.stat() {
                Ok((_, _, mode)) => Some(mode),
                Err(e) => return Some(Err(io("stat", &root_path)(e))),
            },
            Ok(false) => return None,
            Err(e) => return Some(Err(io("read", &root_path)(e))),
        },
    };
    // rename(2) replaces an empty directory and nothing else (a link or a file fails).
    let renamed = confined::rename_dir_over_empty(
        staging.fd(),
        STAGED_TREE,
        target.parent.fd(),
        &target.name,
    );
    match renamed {
        Ok(()) => {}
        Err(e) if target.dir.is_none() => {
            return Some(Err(InstallError::Io {
                op: "rename into",
                path: root_path,
                source: e,
            }));
        }
        // The root is a mount point, or a file appeared in it: go file by file.
        Err(_) => return None,
    }
    // The tree took the empty root's place: give it the root's permissions, never group or other
    // write (an empty root may have been made 0777 by anyone before jitship ran).
    if let Some(mode) = old_mode.map(|m| m & !0o022) {
        let chmod = target
            .parent
            .open_dir(&target.name)
            .map_err(io("open", &root_path))
            .and_then(|dir| confined::chmod(dir.fd(), mode).map_err(io("chmod", &root_path)));
        if let Err(e) = chmod {
            return Some(Err(e));
        }
    }
    progress.files_installed = pending.len() as u64;
    progress.bytes_installed = pending.iter().map(|p| p.record.size).sum();
    Some(verify_in_place(target, pending.iter()))
}

/// A file the commit moved into the root: the directory it went into (the descriptor kept), its
/// name there, its identity, and its path in the root.
struct Moved<'r> {
    dir: Arc<OwnedFd>,
    name: &'r str,
    dev: u64,
    ino: u64,
    path: &'r str,
}

/// Moves one staged file into its directory in the root (created as needed) without replacing
/// anything: `None` when a file appeared at its path meanwhile (left alone).
fn move_one<'r>(
    root: &Confined,
    staging: &Confined,
    dirs: &mut DirCache<'r>,
    p: &'r Pending,
) -> Result<Option<Moved<'r>>, InstallError> {
    let rel = p.record.path.as_str();
    let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel));
    let parent = dirs.get_or_create(dir).map_err(|source| InstallError::Io {
        op: "install under",
        path: root.display(dir),
        source,
    })?;
    let find_staged = |source| InstallError::Io {
        op: "find staged",
        path: staging.display(&p.staged),
        source,
    };
    let (from_dir, from_name) = staging.parent_of(&p.staged).map_err(find_staged)?;
    let entry = confined::entry_at(from_dir.as_fd(), from_name)
        .map_err(find_staged)?
        .ok_or_else(|| find_staged(std::io::ErrorKind::NotFound.into()))?;
    match confined::rename_noreplace(from_dir.as_fd(), from_name, parent.as_fd(), name) {
        Ok(()) => Ok(Some(Moved {
            dir: parent,
            name,
            dev: entry.dev,
            ino: entry.ino,
            path: rel,
        })),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(None),
        Err(e) => Err(InstallError::Io {
            op: "rename into",
            path: root.display(rel),
            source: e,
        }),
    }
}

/// Takes back out only what this commit put there: a file is removed if it is still the inode
/// moved, then the directories it created, deepest first.
fn roll_back(moved: &[Moved], dirs: &DirCache) {
    for m in moved.iter().rev() {
        let _ = confined::remove_if_same(m.dir.as_fd(), m.name, m.dev, m.ino);
    }
    for (dir, name) in dirs.created.iter().rev() {
        let _ = confined::remove_dir_at(dir.as_fd(), name);
    }
}

/// The file-by-file commit checks its own result before it reports it: every file it moved is
/// still the inode it moved, in the directory it moved it into (reached through the descriptor
/// it kept, so a directory another process swaps meanwhile does not fool it either way).
/// Otherwise the commit is rolled back and fails.
fn verify_moved(root: &Confined, moved: &[Moved]) -> Result<(), InstallError> {
    for m in moved {
        let why = match confined::entry_at(m.dir.as_fd(), m.name) {
            Ok(Some(e)) if e.kind == Kind::File && (e.dev, e.ino) == (m.dev, m.ino) => continue,
            Ok(Some(_)) => "another file took its place".to_owned(),
            Ok(None) => "missing".to_owned(),
            Err(e) => e.to_string(),
        };
        return Err(InstallError::NotInPlace {
            path: root.display(m.path),
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

/// The commit keeps one descriptor per directory it writes into, and a cache can have thousands:
/// raise the soft limit on open files to the hard one, as file-heavy tools commonly do.
fn raise_open_file_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let limit = getrlimit(Resource::Nofile);
        if limit.current != limit.maximum {
            let raised = rustix::process::Rlimit {
                current: limit.maximum,
                ..limit
            };
            if let Err(e) = setrlimit(Resource::Nofile, raised) {
                tracing::debug!(error = %e, "could not raise the open-file limit");
            }
        }
    });
}
