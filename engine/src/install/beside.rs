//! What an install keeps beside its root, in the directory holding it: the lock file
//! (`.<root>.jitship.lock`), staging directories, and (`record`) the install record.
//!
//! That directory is often writable by others (`/tmp` holds the default Inductor root), so
//! everything here goes through its descriptor (`Target::parent`), one name at a time: the lock
//! is opened with `O_NOFOLLOW | O_NONBLOCK` and used only if `fstat` says it is a regular file
//! (a link, FIFO or device there is an error naming it, never followed, never waited on), and a
//! staging directory is made with `mkdirat` and opened without following a link.
//!
//! Staging names cannot collide between sibling roots: the root's own name is spelled out with
//! its length, `.jitship-staging-b<bytes>-<name>-<12 hex>` (`h<blake3 of the name>` instead when
//! that would be too long a file name), so the names of `P/cache` and `P/cache-foo` differ and
//! neither is a prefix match of the other. The staging an install makes inside a root that is a
//! mount point of its own is `.jitship-staging-i-<12 hex>`, a form no root's name can take
//! beside it. Leftovers (of a crashed install) are removed only by an install of the same root,
//! holding that root's lock, and only names of exactly that root's forms: any staging of another
//! root, live or not, is never touched.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use crate::confined::{self, Confined, Kind};
use crate::generation::{ContentHash, ContentHasher};
use crate::scan::STAGING_PREFIX;

use super::gate::Cutoff;
use super::io;
use super::report::InstallError;
use super::target::Target;

/// The lock file's name beside the root `root_name`.
pub(super) fn lock_name(root_name: &str) -> String {
    format!(".{root_name}.jitship.lock")
}

/// Longest file name Linux file systems take.
const NAME_MAX: usize = 255;

/// The random part of a staging name: 12 hex digits.
const UNIQUE_LEN: usize = 12;

/// The part of a beside-the-root staging name that names the root: `b<bytes>-<name>`, or
/// `h<32 hex of its blake3>` for a name too long to be spelled out in a file name.
fn root_tag(root_name: &str) -> String {
    let spelled = format!("b{}-{root_name}", root_name.len());
    if STAGING_PREFIX.len() + spelled.len() + 1 + UNIQUE_LEN <= NAME_MAX {
        spelled
    } else {
        format!("h{}", ContentHash::of(root_name.as_bytes()).short_hex(32))
    }
}

/// `rest` is exactly `-<12 lowercase hex>`.
fn is_unique_suffix(rest: &str) -> bool {
    rest.strip_prefix('-').is_some_and(|u| {
        u.len() == UNIQUE_LEN
            && u.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Staging names of older jitship versions (`tempfile`'s six alphanumerics after `prefix`), for
/// the root `prefix` was made for: exact, so they too match only that root.
fn is_legacy(entry: &str, prefix: &str) -> bool {
    entry
        .strip_prefix(prefix)
        .is_some_and(|r| r.len() == 6 && r.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// A fresh staging name beside the root `root_name`.
pub(super) fn beside_staging_name(root_name: &str) -> String {
    format!("{STAGING_PREFIX}{}-{}", root_tag(root_name), unique())
}

/// A fresh staging name inside a root.
pub(super) fn inside_staging_name() -> String {
    format!("{STAGING_PREFIX}i-{}", unique())
}

/// Whether `entry` (a name beside the root `root_name`) is a staging directory of exactly that
/// root: never one of a sibling whose name starts the same.
pub(super) fn is_beside_staging_of(entry: &str, root_name: &str) -> bool {
    let tagged = format!("{STAGING_PREFIX}{}", root_tag(root_name));
    entry.strip_prefix(&tagged).is_some_and(is_unique_suffix)
        || is_legacy(entry, &format!("{STAGING_PREFIX}{root_name}-"))
}

/// Whether `entry` (a name inside a root) is a staging directory an install of that root made
/// there.
pub(super) fn is_inside_staging(entry: &str) -> bool {
    entry
        .strip_prefix(STAGING_PREFIX)
        .and_then(|r| r.strip_prefix('i'))
        .is_some_and(is_unique_suffix)
        || is_legacy(entry, STAGING_PREFIX)
}

/// 12 hex digits no other staging directory of this root has (the creation is exclusive anyway:
/// `mkdirat` fails on an existing name and the caller tries another).
fn unique() -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = ContentHasher::new();
    h.update(&std::process::id().to_le_bytes());
    h.update(
        &COUNTER
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .to_le_bytes(),
    );
    let now = std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    h.update(&now.as_nanos().to_le_bytes());
    h.update(format!("{:?}", std::thread::current().id()).as_bytes());
    h.finish().short_hex(UNIQUE_LEN)
}

/// Makes a fresh staging directory (0700) named by `name()` in `dir`, through its descriptor, and
/// opens it without following a link.
pub(super) fn make_staging(
    dir: &Confined,
    name: impl Fn() -> String,
) -> Result<(PathBuf, Confined), InstallError> {
    for _ in 0..16 {
        let name = name();
        let path = dir.display(&name);
        match confined::mkdir_at(dir.fd(), &name, 0o700) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io("create staging", &path)(e)),
        }
        return match dir.open_dir(&name) {
            Ok(c) => Ok((path, c)),
            Err(e) => {
                remove_staging(&path);
                Err(io("open", &path)(e))
            }
        };
    }
    Err(InstallError::Io {
        op: "create staging in",
        path: dir.path().to_owned(),
        source: std::io::ErrorKind::AlreadyExists.into(),
    })
}

/// Removes the staging directories in `dir` that `is_ours` recognizes (left by crashed installs
/// of this root: the caller holds its lock). Only directories: a link or file of that name is
/// left alone.
pub(super) fn remove_stale(dir: &Confined, is_ours: impl Fn(&str) -> bool) {
    let Ok(names) = dir.names() else {
        return;
    };
    for name in names.iter().filter(|n| is_ours(n)) {
        if let Ok(Some(e)) = confined::entry_at(dir.fd(), name)
            && e.kind == Kind::Dir
        {
            tracing::info!(staging = %dir.display(name).display(), "removing the staging of an interrupted install");
            let _ = fs::remove_dir_all(dir.display(name));
        }
    }
}

/// Removes a staging directory (std's `remove_dir_all` never follows a link). A job still writing
/// into it (after a deadline) can add an entry between the listing and the final rmdir; a few
/// tries settle it, because once the directory is unlinked the job's writes through its
/// descriptor fail.
pub(super) fn remove_staging(path: &Path) {
    for _ in 0..100 {
        match fs::remove_dir_all(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                std::thread::sleep(Duration::from_millis(5));
            }
            _ => return,
        }
    }
    tracing::warn!(staging = %path.display(), "could not remove the staging directory; the next install will");
}

/// The error for a file beside the root that is not what jitship keeps there, or a plain I/O
/// error.
pub(super) fn beside_error(op: &'static str, path: PathBuf, e: std::io::Error) -> InstallError {
    match confined::what_is_there(&e) {
        Some(what) => InstallError::NotRegularBeside { path, what },
        None => InstallError::Io {
            op,
            path,
            source: e,
        },
    }
}

/// Takes the root's install lock, waiting for another installer until the cutoff. The lock
/// file is opened through the descriptor of the directory holding the root, never through a
/// link, and only if it is a regular file.
pub(super) fn lock_root(target: &Target, cutoff: &Cutoff) -> Result<File, InstallError> {
    let name = lock_name(&target.name);
    let path = target.parent.display(&name);
    let file = confined::open_or_create_regular_at(target.parent.fd(), &name, 0o644)
        .map_err(|e| beside_error("open lock", path.clone(), e))?;
    let mut told = false;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(fs::TryLockError::WouldBlock) => {
                if !told {
                    tracing::info!(lock = %path.display(), "another install holds this root's lock; waiting for it");
                    told = true;
                }
                cutoff.check()?;
                std::thread::sleep(Duration::from_millis(25));
            }
            Err(fs::TryLockError::Error(e)) => {
                return Err(InstallError::Io {
                    op: "lock",
                    path,
                    source: e,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_names_of_sibling_roots_never_match_each_other() {
        let (long, longer) = ("x".repeat(240), "x".repeat(241));
        let roots: [&str; 11] = [
            "cache",
            "cache-foo",
            "cache-",
            "c",
            "c.x",
            "c-x",
            "b1-c",
            "i",
            "cache.record",
            &long,
            &longer,
        ];
        for a in roots {
            let name = beside_staging_name(a);
            assert!(name.len() <= NAME_MAX, "{a}");
            assert!(name.starts_with(STAGING_PREFIX), "{name}");
            assert!(is_beside_staging_of(&name, a), "{name} of {a}");
            assert!(!is_inside_staging(&name), "{name}");
            for b in roots.iter().filter(|b| **b != a) {
                assert!(!is_beside_staging_of(&name, b), "{name} of {a} matched {b}");
            }
            // Nor the record's temp file, nor the lock.
            let record_tmp = format!("{STAGING_PREFIX}{a}.record");
            for b in roots {
                assert!(!is_beside_staging_of(&record_tmp, b), "{record_tmp} {b}");
                assert!(!is_beside_staging_of(&lock_name(a), b));
            }
        }
        let inside = inside_staging_name();
        assert!(is_inside_staging(&inside));
        assert!(roots.iter().all(|r| !is_beside_staging_of(&inside, r)));
        assert_ne!(beside_staging_name("c"), beside_staging_name("c"));
        // Leftovers of older versions, exactly.
        assert!(is_beside_staging_of(
            ".jitship-staging-cache-Ab12Cd",
            "cache"
        ));
        assert!(!is_beside_staging_of(
            ".jitship-staging-cache-foo-Ab12Cd",
            "cache"
        ));
        assert!(is_inside_staging(".jitship-staging-Ab12Cd"));
        assert!(!is_inside_staging(".jitship-staging-c-Ab12Cd"));
    }
}
