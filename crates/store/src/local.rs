//! The embedded store: one file per key under a directory. Same contract as Mooncake, plus
//! listing. A put writes a temp file in `.tmp`, fsyncs it, then hard-links it into place
//! (`linkat(2)` fails if the key exists, which is exactly the immutable put, even with several
//! processes writing at once, and it never replaces anything), then fsyncs the key's directory.
//!
//! The directory may be shared (an NFS or ReadWriteMany volume) with writers jitship does not
//! trust, while jitship runs as root. So the store directory is confined like a cache root
//! (`jitship-confined`): it is opened once, and every operation (temp files, puts, gets, listing,
//! removal, sizes and times, the stale-temp cleanup, directory creation) goes through that
//! descriptor with no symbolic link followed anywhere beneath it. A `.tmp` or key directory that
//! is not a real directory is refused with an error naming it, nothing is ever created or deleted
//! through a link, and a value that is not a regular file (a link, FIFO, device or socket) is
//! refused without blocking (`O_NONBLOCK | O_NOFOLLOW`, then `fstat`).
//!
//! The root itself is the operator's choice and may be a link (a volume mounted elsewhere and
//! linked into place): its path is resolved once, when the store is opened, following links;
//! only what lies beneath it is confined.

use std::fs;
use std::io::{self, ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use jitship_confined::{Confined, Entry, Kind, entry_at, remove_if_same, split, what_is_there};
use rustix::fs::AtFlags;

use super::{Capabilities, Store, StoreError, StoreResult, ValueClass, check_key};

const TMP_DIR: &str = ".tmp";

/// A temp file untouched this long belongs to a put that died (a put writes, fsyncs and links its
/// temp file within one call, and every write refreshes its mtime): opening the store removes it.
pub const STALE_TEMP_AGE: Duration = Duration::from_secs(3600);

/// Mode of new values (what `tempfile` gave them before: the store is jitship's alone).
const VALUE_MODE: u32 = 0o600;
/// Mode of new directories, less the umask (as `create_dir_all`).
const DIR_MODE: u32 = 0o777;

#[derive(Debug)]
pub struct LocalStore {
    /// The path the operator gave, for messages and `root()`; files are reached through `dir`.
    root: PathBuf,
    /// The store directory, opened once.
    dir: Confined,
    /// Puts are fsynced (false only for `scratch`).
    durable: bool,
}

/// Opens the operator's store directory, following links in its path (see the module docs).
fn open_root(root: &Path) -> StoreResult<Confined> {
    let resolved = fs::canonicalize(root).map_err(|e| io_err(root, e))?;
    Confined::open(&resolved).map_err(|e| io_err(root, e))
}

impl LocalStore {
    /// A store in `root` (created) for data that dies with the process using it (what an install
    /// pulled from the registry tier, read once): puts are not fsynced.
    pub fn scratch(root: impl Into<PathBuf>) -> StoreResult<Self> {
        Self::create(root.into(), false)
    }

    /// Opens (and creates) the store directory.
    pub fn open(root: impl Into<PathBuf>) -> StoreResult<Self> {
        let store = Self::create(root.into(), true)?;
        // Every command that writes (publish, gc) opens the store first, so killed puts never
        // accumulate; failing to clean is not a reason to refuse the store.
        if let Err(e) = store.remove_stale_temp(STALE_TEMP_AGE) {
            tracing::warn!("cleaning {}: {e}", store.root.join(TMP_DIR).display());
        }
        Ok(store)
    }

    fn create(root: PathBuf, durable: bool) -> StoreResult<Self> {
        fs::create_dir_all(&root).map_err(|e| io_err(&root, e))?;
        let store = Self {
            dir: open_root(&root)?,
            root,
            durable,
        };
        // A `.tmp` an attacker replaced is refused here, before any command uses the store.
        store.real_dir(TMP_DIR)?;
        Ok(store)
    }

    /// Opens an existing store directory for reading, creating and removing nothing (the
    /// read-only commands: ls, inspect, verify). A missing directory is an error naming it.
    pub fn open_existing(root: impl Into<PathBuf>) -> StoreResult<Self> {
        let root = root.into();
        match fs::metadata(&root) {
            Ok(m) if m.is_dir() => Ok(Self {
                dir: open_root(&root)?,
                root,
                durable: true,
            }),
            Ok(_) => Err(StoreError::Other(format!(
                "the local store {} is not a directory",
                root.display()
            ))),
            Err(e) if e.kind() == ErrorKind::NotFound => Err(StoreError::Other(format!(
                "the local store {} does not exist (nothing was published to it yet, or the \
                 path is mistyped); this command only reads and does not create it",
                root.display()
            ))),
            Err(e) => Err(io_err(&root, e)),
        }
    }

    /// Removes temp files of puts that died (regular files not modified for `older_than`);
    /// returns how many. Links and anything else in `.tmp` are left alone, and a `.tmp` that is
    /// not a real directory is refused: nothing is removed outside the store.
    pub fn remove_stale_temp(&self, older_than: Duration) -> StoreResult<u64> {
        let tmp = match self.dir.open_dir(TMP_DIR) {
            Ok(d) => d,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(self.fs_err(TMP_DIR, e)),
        };
        let now = SystemTime::now();
        let mut removed = 0;
        for name in tmp.names().map_err(|e| self.fs_err(TMP_DIR, e))? {
            let rel = format!("{TMP_DIR}/{name}");
            let entry = match entry_at(tmp.fd(), &name) {
                Ok(Some(e)) if e.kind == Kind::File => e,
                Ok(_) => continue,
                Err(e) => return Err(self.fs_err(&rel, e)),
            };
            if now
                .duration_since(mtime(&entry))
                .is_ok_and(|age| age >= older_than)
            {
                // Only if it is still that file: never a name someone swapped in meanwhile.
                match remove_if_same(tmp.fd(), &name, entry.dev, entry.ino) {
                    Ok(true) => removed += 1,
                    Ok(false) => {}
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => return Err(self.fs_err(&rel, e)),
                }
            }
        }
        if removed > 0 {
            tracing::info!(
                removed,
                "removed temp files of interrupted puts from the local store"
            );
        }
        Ok(removed)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The key as a path beneath the store directory.
    fn rel<'k>(&self, key: &'k str) -> StoreResult<&'k str> {
        check_key(key)?;
        if key == TMP_DIR || key.starts_with(".tmp/") {
            return Err(StoreError::InvalidKey(key.to_owned()));
        }
        Ok(key)
    }

    /// A miss is only a miss while the store directory is still where the operator put it: an
    /// unmounted or removed share (the descriptor then holds a directory nobody can reach) is an
    /// error, not an empty store. Checked on misses only, so a hit costs nothing more.
    fn missing<T>(&self, miss: T) -> StoreResult<T> {
        let same = match (self.dir.stat(), fs::metadata(&self.root)) {
            (Ok((dev, ino, _)), Ok(m)) => {
                use std::os::unix::fs::MetadataExt;
                m.is_dir() && m.dev() == dev && m.ino() == ino
            }
            _ => false,
        };
        if same {
            Ok(miss)
        } else {
            Err(StoreError::Other(format!(
                "the local store directory {} was removed, replaced or unmounted while in use;                  make it available again and rerun the command",
                self.root.display()
            )))
        }
    }

    /// The directory `rel` beneath the store (created with its parents if missing), refused if it
    /// or a directory above it is not a real directory.
    fn real_dir(&self, rel: &str) -> StoreResult<Confined> {
        match self.dir.open_dir(rel) {
            Ok(d) => return Ok(d),
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(self.fs_err(rel, e)),
        }
        self.dir
            .mkdir_all(rel, DIR_MODE)
            .and_then(|_| self.dir.open_dir(rel))
            .map_err(|e| match self.missing(()) {
                Ok(()) => self.fs_err(rel, e),
                Err(gone) => gone,
            })
    }

    /// What stands at `rel` (never following a link); `None` if nothing does.
    fn entry(&self, rel: &str) -> StoreResult<Option<Entry>> {
        match self.dir.entry(rel).map_err(|e| self.fs_err(rel, e))? {
            None => self.missing(None),
            found => Ok(found),
        }
    }

    /// The value at `rel` opened for reading; `None` if it is missing, or a directory (of keys).
    fn open_value(&self, rel: &str) -> StoreResult<Option<fs::File>> {
        match self.dir.open_read(rel) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == ErrorKind::NotFound => self.missing(None),
            Err(e) if what_is_there(&e) == Some("a directory") => Ok(None),
            Err(e) => Err(self.fs_err(rel, e)),
        }
    }

    /// `Ok` if a value (a regular file) stands at `rel`, as a put that finds its key taken
    /// answers; an error naming anything else.
    fn taken_by_a_value(&self, rel: &str) -> StoreResult<()> {
        match self.entry(rel)?.map(|e| e.kind) {
            Some(Kind::File) => Ok(()),
            Some(Kind::Dir) => Err(self.planted(rel, "is a directory, not a value")),
            _ => Err(self.planted(
                rel,
                "is not a value but a link, FIFO, device or socket, and a put never replaces it",
            )),
        }
    }

    /// The error for something at `rel` the store did not put there.
    fn planted(&self, rel: &str, what: &str) -> StoreError {
        StoreError::Other(format!(
            "{} {what}; the local store follows no link and uses only regular files and real \
             directories beneath {} (whoever can write that directory may have planted it): \
             remove it and retry",
            self.root.join(rel).display(),
            self.root.display(),
        ))
    }

    fn fs_err(&self, rel: &str, e: io::Error) -> StoreError {
        if e.raw_os_error() == Some(libc::ELOOP) {
            return self.planted(
                rel,
                "or a directory above it is a symbolic link (links are not followed)",
            );
        }
        if let Some(what) = what_is_there(&e) {
            return self.planted(rel, &format!("is {what}, not a regular file"));
        }
        if e.kind() == ErrorKind::NotADirectory {
            return self.planted(
                rel,
                "is not a directory, or a directory above it is not (a symbolic link or a file \
                 stands there)",
            );
        }
        io_err(&self.root.join(rel), e)
    }
}

fn io_err(path: &Path, e: std::io::Error) -> StoreError {
    if e.raw_os_error() == Some(libc::ENOSPC) || e.raw_os_error() == Some(libc::EDQUOT) {
        StoreError::NoSpace(format!("{}: {e}", path.display()))
    } else {
        StoreError::Io {
            path: path.display().to_string(),
            source: std::sync::Arc::new(e),
        }
    }
}

fn mtime(e: &Entry) -> SystemTime {
    let nanos = Duration::from_nanos(e.mtime_ns.clamp(0, 999_999_999) as u64);
    let at = if e.mtime_s >= 0 {
        SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(e.mtime_s as u64))
    } else {
        SystemTime::UNIX_EPOCH.checked_sub(Duration::from_secs(e.mtime_s.unsigned_abs()))
    };
    at.and_then(|t| t.checked_add(nanos))
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// A temp file of a put in `.tmp`, whose name is removed when dropped (linked into place or not).
struct Temp<'d> {
    dir: &'d Confined,
    name: String,
    file: fs::File,
}

impl<'d> Temp<'d> {
    fn create(dir: &'d Confined) -> io::Result<Self> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        loop {
            let nanos = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            // Unique per process and call; `O_EXCL` settles collisions with other hosts.
            let name = format!(
                ".tmp{}-{}-{nanos:08x}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            );
            match dir.create_new(&name, VALUE_MODE) {
                Ok(file) => return Ok(Self { dir, name, file }),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

impl Drop for Temp<'_> {
    fn drop(&mut self) {
        // Beneath the `.tmp` descriptor: the name itself, never through a link.
        let _ = rustix::fs::unlinkat(self.dir.fd(), self.name.as_str(), AtFlags::empty());
    }
}

impl Store for LocalStore {
    fn describe(&self) -> String {
        format!("local:{}", self.root.display())
    }

    fn max_value_size(&self) -> u64 {
        u64::from(u32::MAX)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            listing: true,
            write_times: true,
            sizes: true,
        }
    }

    /// Every class alike: a directory evicts nothing.
    fn put(&self, key: &str, value: &[u8], _class: ValueClass) -> StoreResult<()> {
        let rel = self.rel(key)?;
        if value.len() as u64 > self.max_value_size() {
            return Err(StoreError::TooLarge {
                size: value.len() as u64,
                limit: self.max_value_size(),
            });
        }
        if self.entry(rel)?.is_some() {
            return self.taken_by_a_value(rel);
        }
        let (dir_rel, name) = split(rel);
        let dir = self.real_dir(dir_rel)?;
        let tmp_dir = self.real_dir(TMP_DIR)?;
        let mut tmp = Temp::create(&tmp_dir).map_err(|e| self.fs_err(TMP_DIR, e))?;
        let tmp_rel = format!("{TMP_DIR}/{}", tmp.name);
        tmp.file
            .write_all(value)
            .map_err(|e| self.fs_err(&tmp_rel, e))?;
        if self.durable {
            tmp.file.sync_all().map_err(|e| self.fs_err(&tmp_rel, e))?;
        }
        // link(2) never replaces its target and never follows a link there.
        match rustix::fs::linkat(
            tmp_dir.fd(),
            tmp.name.as_str(),
            dir.fd(),
            name,
            AtFlags::empty(),
        ) {
            Ok(()) => {}
            Err(rustix::io::Errno::EXIST) => return self.taken_by_a_value(rel),
            Err(e) => return Err(self.fs_err(rel, e.into())),
        }
        drop(tmp);
        if !self.durable {
            return Ok(());
        }
        rustix::fs::fsync(dir.fd()).map_err(|e| self.fs_err(dir_rel, e.into()))
    }

    fn get(&self, key: &str) -> StoreResult<Option<Vec<u8>>> {
        let rel = self.rel(key)?;
        let Some(mut file) = self.open_value(rel)? else {
            return Ok(None);
        };
        let mut value = Vec::new();
        file.read_to_end(&mut value)
            .map_err(|e| self.fs_err(rel, e))?;
        Ok(Some(value))
    }

    /// Reads the size from the open file before reading it, so an oversized value is refused
    /// without being read.
    fn get_capped(&self, key: &str, limit: u64) -> StoreResult<Option<Vec<u8>>> {
        let rel = self.rel(key)?;
        let Some(mut file) = self.open_value(rel)? else {
            return Ok(None);
        };
        let len = file.metadata().map_err(|e| self.fs_err(rel, e))?.len();
        if len > limit {
            return Err(StoreError::TooLarge { size: len, limit });
        }
        let mut value = Vec::with_capacity(len as usize);
        // `take`: a value that grows while it is read is still refused past the limit.
        (&mut file)
            .take(limit + 1)
            .read_to_end(&mut value)
            .map_err(|e| self.fs_err(rel, e))?;
        if value.len() as u64 > limit {
            return Err(StoreError::TooLarge {
                size: value.len() as u64,
                limit,
            });
        }
        Ok(Some(value))
    }

    fn exists(&self, key: &str) -> StoreResult<bool> {
        let rel = self.rel(key)?;
        Ok(self.entry(rel)?.is_some_and(|e| e.kind == Kind::File))
    }

    /// Removes the name beneath the store (a planted link itself, never what it points to).
    fn remove(&self, key: &str) -> StoreResult<bool> {
        let rel = self.rel(key)?;
        match self.dir.remove_file(rel) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => self.missing(false),
            Err(e) => Err(self.fs_err(rel, e)),
        }
    }

    fn modified(&self, key: &str) -> StoreResult<Option<SystemTime>> {
        let rel = self.rel(key)?;
        Ok(self
            .entry(rel)?
            .filter(|e| e.kind == Kind::File)
            .map(|e| mtime(&e)))
    }

    fn size(&self, key: &str) -> StoreResult<Option<u64>> {
        let rel = self.rel(key)?;
        Ok(self
            .entry(rel)?
            .filter(|e| e.kind == Kind::File)
            .map(|e| e.size))
    }

    /// Regular files only; links are neither listed nor descended into.
    fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
        // Walk only the deepest directory the prefix names completely.
        let start = prefix.rfind('/').map_or("", |i| &prefix[..i]);
        let join = |dir: &str, name: &str| {
            if dir.is_empty() {
                name.to_owned()
            } else {
                format!("{dir}/{name}")
            }
        };
        let mut keys = Vec::new();
        let mut pending = vec![start.to_owned()];
        while let Some(rel) = pending.pop() {
            let dir = match self.dir.open_dir(&rel) {
                Ok(d) => d,
                Err(e) if e.kind() == ErrorKind::NotFound && rel == start => {
                    return self.missing(Vec::new());
                }
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                // The prefix's own directory is refused like any key directory; one below it
                // that changed since it was seen (removed, swapped for a link) is passed over.
                Err(e) if rel == start => return Err(self.fs_err(&rel, e)),
                Err(e)
                    if e.raw_os_error() == Some(libc::ELOOP)
                        || e.kind() == ErrorKind::NotADirectory =>
                {
                    continue;
                }
                Err(e) => return Err(self.fs_err(&rel, e)),
            };
            for name in dir.names().map_err(|e| self.fs_err(&rel, e))? {
                let child = join(&rel, &name);
                let kind = match entry_at(dir.fd(), &name) {
                    Ok(Some(e)) => e.kind,
                    Ok(None) => continue,
                    Err(e) => return Err(self.fs_err(&child, e)),
                };
                match kind {
                    Kind::File if child.starts_with(prefix) => keys.push(child),
                    Kind::Dir if child != TMP_DIR => {
                        let below = format!("{child}/");
                        if below.starts_with(prefix) || prefix.starts_with(&below) {
                            pending.push(child);
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(keys)
    }
}

#[cfg(test)]
mod tests;
