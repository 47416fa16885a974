//! Snapshots of a cache root: every regular file with its size, mtime, mode and identity.
//! Symlinks, devices, sockets and non-UTF-8 names are never offered for publishing; they are
//! counted so an operator can see them.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use jitship_generation::RelPath;
use jitship_policy::FileEntry;

/// jitship's own staging directories inside a root (when the root is a mount point); never scanned.
pub const STAGING_PREFIX: &str = ".jitship-staging-";

/// How install records end (see `install::record`); the scan skips files with this suffix
/// (jitship's own), so a record beside one root is never published by a root that contains it
/// (the `inductor-pch` root lies inside the default `inductor` root).
pub const RECORD_SUFFIX: &str = ".jitship-installed.json";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannedFile {
    pub path: RelPath,
    pub size: u64,
    pub mtime_s: i64,
    pub mtime_ns: u32,
    pub mode: u32,
    pub dev: u64,
    pub ino: u64,
}

impl ScannedFile {
    pub fn entry(&self) -> FileEntry {
        let ms = (self.mtime_s.max(0) as u64) * 1000 + u64::from(self.mtime_ns) / 1_000_000;
        FileEntry {
            path: self.path.to_string(),
            size: self.size,
            mtime_ms: ms,
        }
    }

    /// True if `file`, this file opened for reading, still has the size, mtime and inode it had
    /// in this snapshot: what was read from it is what was scanned. The open file is checked, not
    /// the path, so a file renamed over this one after it was opened is no false alarm.
    pub fn is_unchanged(&self, file: &std::fs::File) -> bool {
        rustix::fs::fstat(file).is_ok_and(|st| {
            st.st_size as u64 == self.size
                && st.st_mtime == self.mtime_s
                && st.st_mtime_nsec as u32 == self.mtime_ns
                && st.st_ino == self.ino
        })
    }
}

#[derive(Debug, Default)]
pub struct Snapshot {
    /// Sorted by path.
    pub files: Vec<ScannedFile>,
    /// (path, reason) for what exists but can never be published.
    pub unpublishable: Vec<(String, &'static str)>,
}

/// Walks `root`. A missing root is an empty snapshot (engines create their caches late).
pub fn snapshot(root: &Path) -> std::io::Result<Snapshot> {
    let mut snap = Snapshot::default();
    if !root.exists() {
        return Ok(snap);
    }
    let walker = walkdir::WalkDir::new(root)
        .follow_links(false)
        .sort_by_file_name()
        .into_iter();
    // jitship's own files: staging directories and install records (of a root nested in this one).
    let walker = walker.filter_entry(|e| {
        let name = e.file_name().to_string_lossy();
        e.depth() == 0 || !(name.starts_with(STAGING_PREFIX) || name.ends_with(RECORD_SUFFIX))
    });
    for entry in walker {
        let entry = match entry {
            Ok(e) => e,
            // A file removed while we walk (the engine renamed a temp file) is simply not there.
            Err(e)
                if e.io_error()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound) =>
            {
                continue;
            }
            Err(e) => {
                return Err(std::io::Error::other(format!(
                    "scanning {}: {e}",
                    root.display()
                )));
            }
        };
        if entry.depth() == 0 {
            continue;
        }
        let ft = entry.file_type();
        if ft.is_dir() {
            continue;
        }
        let shown = entry
            .path()
            .strip_prefix(root)
            .unwrap_or(entry.path())
            .display()
            .to_string();
        if ft.is_symlink() {
            snap.unpublishable.push((shown, "symbolic link"));
            continue;
        }
        if !ft.is_file() {
            snap.unpublishable.push((shown, "not a regular file"));
            continue;
        }
        let Ok(path) = RelPath::from_fs(root, entry.path()) else {
            snap.unpublishable.push((shown, "name is not valid UTF-8"));
            continue;
        };
        let meta = match entry.metadata() {
            Ok(m) => m,
            Err(e)
                if e.io_error()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound) =>
            {
                continue;
            }
            Err(e) => {
                return Err(std::io::Error::other(format!(
                    "stat {}: {e}",
                    entry.path().display()
                )));
            }
        };
        snap.files.push(ScannedFile {
            path,
            size: meta.len(),
            mtime_s: meta.mtime(),
            mtime_ns: meta.mtime_nsec() as u32,
            mode: meta.mode() & 0o777,
            dev: meta.dev(),
            ino: meta.ino(),
        });
    }
    snap.files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(snap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_regular_files_and_reports_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/f"), b"hello").unwrap();
        std::fs::write(root.join("z"), b"").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
        std::fs::create_dir_all(root.join(".jitship-staging-1/x")).unwrap();
        std::fs::write(root.join(".jitship-staging-1/x/f"), b"x").unwrap();
        let snap = snapshot(root).unwrap();
        let paths: Vec<_> = snap.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, vec!["a/b/f", "z"]);
        assert_eq!(snap.files[0].size, 5);
        assert_eq!(
            snap.unpublishable,
            vec![("link".to_string(), "symbolic link")]
        );
        assert!(snapshot(&root.join("missing")).unwrap().files.is_empty());
    }
}
