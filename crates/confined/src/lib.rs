//! File operations confined beneath one directory descriptor.
//!
//! An install writes into a directory that other processes (the engine, a hostile tenant of the
//! pod) may change while it runs. Checking a path with `symlink_metadata` and then using the same
//! path is a race: between the two, a directory can be swapped for a link to somewhere else. So
//! every operation here starts from a descriptor of the root opened once, and resolves the rest
//! of the path with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`: the
//! kernel refuses any link and any escape, atomically with the lookup. The final component is
//! then used through its parent's descriptor (`mkdirat`, `renameat2`, `unlinkat`, `fstatat`
//! without following), so no operation ever leaves the tree under the descriptor.
//!
//! Kernels before 5.6 have no `openat2` (`ENOSYS`; some seccomp profiles answer `EPERM` too):
//! there, and only there, the path is walked one component at a time with
//! `openat(O_NOFOLLOW | O_DIRECTORY)`, which gives the same guarantee (a link in any component
//! fails with `ELOOP` or `ENOTDIR`) at the cost of one system call per component.
//!
//! Paths handed in are `RelPath` strings (relative, normalized, no `.` or `..`), or `""` for the
//! directory itself.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags, ResolveFlags, Stat};

/// Set once the kernel said it has no usable `openat2`; later lookups go straight to the walk.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// A directory, held open; everything below it is reached without following a link.
#[derive(Debug)]
pub struct Confined {
    fd: OwnedFd,
    /// Where it was when opened, for messages only (never used to reach files).
    path: PathBuf,
}

/// What is at a path, as `lstat` sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    /// A link, device, socket or fifo: never written through, never replaced.
    Other,
}

#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub kind: Kind,
    pub size: u64,
    pub mtime_s: i64,
    pub mtime_ns: i64,
    pub dev: u64,
    pub ino: u64,
}

impl Entry {
    fn of(st: &Stat) -> Self {
        let fmt = st.st_mode & libc::S_IFMT;
        Self {
            kind: match fmt {
                libc::S_IFREG => Kind::File,
                libc::S_IFDIR => Kind::Dir,
                _ => Kind::Other,
            },
            size: st.st_size as u64,
            mtime_s: st.st_mtime,
            mtime_ns: st.st_mtime_nsec as i64,
            dev: st.st_dev,
            ino: st.st_ino,
        }
    }
}

/// `rel`'s directory (`""` for the top) and last component.
pub fn split(rel: &str) -> (&str, &str) {
    match rel.rfind('/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => ("", rel),
    }
}

impl Confined {
    /// Opens the directory at `path` (which the caller has resolved; its last component must not
    /// be a link).
    pub fn open(path: &Path) -> io::Result<Self> {
        let fd = rustix::fs::openat(
            rustix::fs::CWD,
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Self {
            fd,
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `rel` under this directory, for messages.
    pub fn display(&self, rel: &str) -> PathBuf {
        if rel.is_empty() {
            self.path.clone()
        } else {
            self.path.join(rel)
        }
    }

    /// Opens `rel` beneath this directory, following no link in any component.
    fn open_beneath(&self, rel: &str, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
        let rel = if rel.is_empty() { "." } else { rel };
        let flags = flags | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        if !NO_OPENAT2.load(Ordering::Relaxed) {
            // EAGAIN: the kernel saw a concurrent rename it could not rule out; try again.
            for _ in 0..16 {
                match rustix::fs::openat2(&self.fd, rel, flags, mode, RESOLVE) {
                    Err(rustix::io::Errno::AGAIN) => continue,
                    Err(rustix::io::Errno::NOSYS) | Err(rustix::io::Errno::PERM) => {
                        NO_OPENAT2.store(true, Ordering::Relaxed);
                        break;
                    }
                    r => return r.map_err(io::Error::from),
                }
            }
            if !NO_OPENAT2.load(Ordering::Relaxed) {
                return Err(io::Error::from(rustix::io::Errno::AGAIN));
            }
        }
        self.open_walking(rel, flags, mode)
    }

    /// The fallback for kernels without `openat2`: one component at a time, each opened with
    /// `O_NOFOLLOW` relative to the previous one.
    fn open_walking(&self, rel: &str, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
        let (dirs, last) = split(rel);
        let mut current: Option<OwnedFd> = None;
        for c in dirs.split('/').filter(|c| !c.is_empty()) {
            let at = current.as_ref().map_or(self.fd.as_fd(), |f| f.as_fd());
            current = Some(rustix::fs::openat(
                at,
                c,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?);
        }
        let at = current.as_ref().map_or(self.fd.as_fd(), |f| f.as_fd());
        Ok(rustix::fs::openat(at, last, flags, mode)?)
    }

    /// The directory `rel` (`""`: this one again), as a `Confined` of its own.
    pub fn open_dir(&self, rel: &str) -> io::Result<Confined> {
        let fd = self.open_beneath(rel, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        Ok(Confined {
            fd,
            path: self.display(rel),
        })
    }

    /// A descriptor of the directory holding `rel` (a path-only one: enough for `*at` calls),
    /// and `rel`'s last component.
    pub fn parent_of<'r>(&self, rel: &'r str) -> io::Result<(OwnedFd, &'r str)> {
        let (dir, name) = split(rel);
        let fd = self.open_beneath(dir, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
        Ok((fd, name))
    }

    /// What is at `rel` (never following a link), `None` if nothing is.
    pub fn entry(&self, rel: &str) -> io::Result<Option<Entry>> {
        let (parent, name) = match self.parent_of(rel) {
            Ok(p) => p,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        entry_at(parent.as_fd(), name)
    }

    /// Opens the regular file `rel` for reading.
    pub fn open_read(&self, rel: &str) -> io::Result<File> {
        let fd = self.open_beneath(rel, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty())?;
        regular(File::from(fd))
    }

    /// Creates the regular file `rel`, which must not exist, for writing.
    pub fn create_new(&self, rel: &str, mode: u32) -> io::Result<File> {
        let fd = self.open_beneath(
            rel,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
            Mode::from_raw_mode(mode),
        )?;
        Ok(File::from(fd))
    }

    /// Opens `rel` for writing, creating it if it does not exist (never truncating).
    pub fn open_write(&self, rel: &str, mode: u32) -> io::Result<File> {
        let fd = self.open_beneath(
            rel,
            OFlags::WRONLY | OFlags::CREATE,
            Mode::from_raw_mode(mode),
        )?;
        Ok(File::from(fd))
    }

    /// Creates the directory `rel`; its parent must exist. Fails if anything is there already.
    pub fn mkdir(&self, rel: &str, mode: u32) -> io::Result<()> {
        let (parent, name) = self.parent_of(rel)?;
        Ok(rustix::fs::mkdirat(
            &parent,
            name,
            Mode::from_raw_mode(mode),
        )?)
    }

    /// Creates `rel` and every missing directory above it; returns those it created, top down.
    pub fn mkdir_all(&self, rel: &str, mode: u32) -> io::Result<Vec<String>> {
        let mut created = Vec::new();
        for (i, _) in rel.match_indices('/').chain([(rel.len(), "")]) {
            let dir = &rel[..i];
            if dir.is_empty() {
                continue;
            }
            match self.mkdir(dir, mode) {
                Ok(()) => created.push(dir.to_owned()),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    if self.entry(dir)?.map(|e| e.kind) != Some(Kind::Dir) {
                        return Err(io::Error::new(
                            io::ErrorKind::NotADirectory,
                            format!("{} is not a directory", self.display(dir).display()),
                        ));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(created)
    }

    /// Removes the file (or link) `rel`.
    pub fn remove_file(&self, rel: &str) -> io::Result<()> {
        let (parent, name) = self.parent_of(rel)?;
        Ok(rustix::fs::unlinkat(&parent, name, AtFlags::empty())?)
    }

    /// Removes the empty directory `rel`.
    pub fn remove_dir(&self, rel: &str) -> io::Result<()> {
        let (parent, name) = self.parent_of(rel)?;
        Ok(rustix::fs::unlinkat(&parent, name, AtFlags::REMOVEDIR)?)
    }

    /// True if the directory holds no entry.
    pub fn is_empty(&self) -> io::Result<bool> {
        let mut dir = rustix::fs::Dir::read_from(&self.fd)?;
        while let Some(entry) = dir.read() {
            let name = entry?.file_name().to_bytes().to_vec();
            if name != b"." && name != b".." {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The names of the entries of this directory with UTF-8 names (`.` and `..` left out).
    pub fn names(&self) -> io::Result<Vec<String>> {
        let mut dir = rustix::fs::Dir::read_from(&self.fd)?;
        let mut names = Vec::new();
        while let Some(entry) = dir.read() {
            if let Ok(name) = entry?.file_name().to_str()
                && name != "."
                && name != ".."
            {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    /// Flushes the whole file system holding this directory (one `syncfs` is far cheaper than an
    /// fsync per small file).
    pub fn sync_filesystem(&self) -> io::Result<()> {
        Ok(rustix::fs::syncfs(&self.fd)?)
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The directory's own device, inode and permission bits.
    pub fn stat(&self) -> io::Result<(u64, u64, u32)> {
        let st = rustix::fs::fstat(&self.fd)?;
        Ok((st.st_dev as u64, st.st_ino as u64, st.st_mode & 0o7777))
    }

    /// A path-only descriptor of the directory `rel` beneath this one (`""`: this one).
    pub fn dir_fd(&self, rel: &str) -> io::Result<OwnedFd> {
        self.open_beneath(rel, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
    }
}

/// Opens the directory `name` (one component) in `dir` without following a link, as a path-only
/// descriptor for `*at` calls.
pub fn open_dir_at(dir: BorrowedFd<'_>, name: &str) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Creates the directory `name` (one component) in `dir`.
pub fn mkdir_at(dir: BorrowedFd<'_>, name: &str, mode: u32) -> io::Result<()> {
    Ok(rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(mode))?)
}

/// Removes the empty directory `name` (one component) in `dir`.
pub fn remove_dir_at(dir: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    Ok(rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?)
}

/// Sets the permission bits of the directory open as `dir`.
pub fn chmod(dir: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    Ok(rustix::fs::fchmod(dir, Mode::from_raw_mode(mode & 0o7777))?)
}

/// Opens the regular file `name` in `dir` for reading, not following a link.
pub fn open_read_at(dir: BorrowedFd<'_>, name: &str) -> io::Result<File> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    regular(File::from(fd))
}

/// Opens the regular file `name` in `dir` for reading, creating it (with `mode`) if nothing is
/// there: for the files jitship keeps beside a root, in a directory others may write to (`/tmp`).
/// The last component is never followed (`O_NOFOLLOW`: a link there fails with `ELOOP`, see
/// [`what_is_there`]), a FIFO or device never blocks the open (`O_NONBLOCK`, cleared once the
/// descriptor is known to be a regular file), and anything but a regular file is refused
/// ([`NotRegular`]), so nothing is ever created or opened through a link.
pub fn open_or_create_regular_at(dir: BorrowedFd<'_>, name: &str, mode: u32) -> io::Result<File> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::CREATE | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    )?;
    let file = regular(File::from(fd))?;
    let flags = rustix::fs::fcntl_getfl(&file)?;
    rustix::fs::fcntl_setfl(&file, flags - OFlags::NONBLOCK)?;
    Ok(file)
}

/// What a file that must be regular turned out to be: the error of [`open_read_at`],
/// [`Confined::open_read`] and [`open_or_create_regular_at`] for anything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotRegular(pub &'static str);

impl std::fmt::Display for NotRegular {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not a regular file but {}", self.0)
    }
}

impl std::error::Error for NotRegular {}

/// Says what stood where a regular file was expected, from the error of an open through this
/// module: a link (`ELOOP` of `O_NOFOLLOW`), or a directory, FIFO, device or socket; `None` for
/// any other error.
pub fn what_is_there(e: &io::Error) -> Option<&'static str> {
    if e.raw_os_error() == Some(libc::ELOOP) {
        return Some("a symbolic link");
    }
    if e.raw_os_error() == Some(libc::EISDIR) {
        return Some("a directory");
    }
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<NotRegular>())
        .map(|n| n.0)
}

/// `file` if it is a regular file (not a directory, FIFO or device). `fstat`, not
/// `File::metadata` (a `statx` of an empty path): this runs once per file read.
fn regular(file: File) -> io::Result<File> {
    use rustix::fs::FileType;
    let st = rustix::fs::fstat(&file)?;
    let what = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => return Ok(file),
        FileType::Directory => "a directory",
        FileType::Fifo => "a FIFO",
        FileType::CharacterDevice | FileType::BlockDevice => "a device",
        FileType::Socket => "a socket",
        FileType::Symlink => "a symbolic link",
        _ => "of an unknown type",
    };
    Err(io::Error::other(NotRegular(what)))
}

/// What is at `name` in the directory `dir`, never following a link.
pub fn entry_at(dir: BorrowedFd<'_>, name: &str) -> io::Result<Option<Entry>> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(Entry::of(&st))),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Moves `from_name` in `from_dir` to `to_name` in `to_dir`, failing with `AlreadyExists` if the
/// destination exists (`renameat2(RENAME_NOREPLACE)`: never over a file that appeared meanwhile).
pub fn rename_noreplace(
    from_dir: BorrowedFd<'_>,
    from_name: &str,
    to_dir: BorrowedFd<'_>,
    to_name: &str,
) -> io::Result<()> {
    Ok(rustix::fs::renameat_with(
        from_dir,
        from_name,
        to_dir,
        to_name,
        RenameFlags::NOREPLACE,
    )?)
}

/// Moves a directory over an empty directory (or onto a missing name): plain `renameat`, which
/// replaces an empty directory and fails on anything else (a file, a link, a non-empty directory).
pub fn rename_dir_over_empty(
    from_dir: BorrowedFd<'_>,
    from_name: &str,
    to_dir: BorrowedFd<'_>,
    to_name: &str,
) -> io::Result<()> {
    Ok(rustix::fs::renameat(from_dir, from_name, to_dir, to_name)?)
}

/// Moves the file `from_name` over `to_name`, both in `dir` (plain `renameat`): a file or link at
/// `to_name` is replaced (the link itself, never what it points to); a directory there fails.
pub fn rename_over(dir: BorrowedFd<'_>, from_name: &str, to_name: &str) -> io::Result<()> {
    Ok(rustix::fs::renameat(dir, from_name, dir, to_name)?)
}

/// Removes `name` in `dir` if it is still the file `(dev, ino)`; a file someone else put there
/// meanwhile is left alone.
pub fn remove_if_same(dir: BorrowedFd<'_>, name: &str, dev: u64, ino: u64) -> io::Result<bool> {
    match entry_at(dir, name)? {
        Some(e) if e.dev == dev && e.ino == ino && e.kind == Kind::File => {
            rustix::fs::unlinkat(dir, name, AtFlags::empty())?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> (tempfile::TempDir, Confined) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("root/a/b")).unwrap();
        std::fs::create_dir_all(dir.path().join("outside")).unwrap();
        std::fs::write(dir.path().join("outside/victim"), b"v").unwrap();
        std::os::unix::fs::symlink(dir.path().join("outside"), dir.path().join("root/link"))
            .unwrap();
        std::os::unix::fs::symlink("../../outside", dir.path().join("root/a/rel")).unwrap();
        let c = Confined::open(&dir.path().join("root")).unwrap();
        (dir, c)
    }

    #[test]
    fn links_are_never_followed_in_any_component() {
        let (dir, c) = tree();
        for rel in ["link/victim", "link/new", "a/rel/victim", "a/rel/new"] {
            assert!(c.open_read(rel).is_err(), "{rel}");
            assert!(c.create_new(rel, 0o644).is_err(), "{rel}");
            assert!(c.open_write(rel, 0o644).is_err(), "{rel}");
            assert!(c.mkdir(rel, 0o755).is_err(), "{rel}");
            assert!(c.mkdir_all(rel, 0o755).is_err(), "{rel}");
            assert!(c.remove_file(rel).is_err(), "{rel}");
            assert!(
                c.entry(rel).is_err() || c.entry(rel).unwrap().is_none(),
                "{rel}"
            );
        }
        // The link itself is seen as what it is, and can be removed (it is inside the root).
        assert_eq!(c.entry("link").unwrap().unwrap().kind, Kind::Other);
        assert!(c.open_dir("link").is_err());
        assert_eq!(
            std::fs::read(dir.path().join("outside/victim")).unwrap(),
            b"v"
        );
        assert_eq!(
            std::fs::read_dir(dir.path().join("outside"))
                .unwrap()
                .count(),
            1
        );
    }

    #[test]
    fn the_walk_fallback_refuses_links_too() {
        let (_dir, c) = tree();
        for rel in ["link/victim", "a/rel/victim"] {
            assert!(
                c.open_walking(rel, OFlags::RDONLY | OFlags::NOFOLLOW, Mode::empty())
                    .is_err(),
                "{rel}"
            );
        }
        assert!(
            c.open_walking("a/b", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
                .is_ok()
        );
        assert!(
            c.open_walking("link", OFlags::RDONLY | OFlags::NOFOLLOW, Mode::empty())
                .is_err()
        );
    }

    #[test]
    fn create_rename_and_remove_stay_beneath() {
        let (dir, c) = tree();
        assert_eq!(
            c.mkdir_all("x/y/z", 0o755).unwrap(),
            vec!["x", "x/y", "x/y/z"]
        );
        assert!(c.mkdir_all("x/y/z", 0o755).unwrap().is_empty());
        {
            use std::io::Write;
            c.create_new("x/y/z/f", 0o644)
                .unwrap()
                .write_all(b"hi")
                .unwrap();
        }
        assert!(c.create_new("x/y/z/f", 0o644).is_err());
        let e = c.entry("x/y/z/f").unwrap().unwrap();
        assert_eq!((e.kind, e.size), (Kind::File, 2));
        let (from, fname) = c.parent_of("x/y/z/f").unwrap();
        let (to, tname) = c.parent_of("a/b/g").unwrap();
        rename_noreplace(from.as_fd(), fname, to.as_fd(), tname).unwrap();
        assert_eq!(std::fs::read(dir.path().join("root/a/b/g")).unwrap(), b"hi");
        std::fs::write(dir.path().join("root/x/h"), b"other").unwrap();
        let (from, _) = c.parent_of("a/b/g").unwrap();
        let (to, _) = c.parent_of("x/h").unwrap();
        let err = rename_noreplace(from.as_fd(), "g", to.as_fd(), "h").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        let g = c.entry("a/b/g").unwrap().unwrap();
        let (b, _) = c.parent_of("a/b/g").unwrap();
        assert!(!remove_if_same(b.as_fd(), "g", g.dev, g.ino + 1).unwrap());
        assert!(remove_if_same(b.as_fd(), "g", g.dev, g.ino).unwrap());
        assert!(c.entry("a/b/g").unwrap().is_none());
        assert!(c.open_dir("a/b").unwrap().is_empty().unwrap());
        assert!(!c.open_dir("x").unwrap().is_empty().unwrap());
        c.remove_dir("x/y/z").unwrap();
        c.sync_filesystem().unwrap();
    }
}
