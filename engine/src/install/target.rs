//! The root an install writes into, resolved once: its path, its parent's descriptor, its name.

use std::fs;
use std::path::{Path, PathBuf};

use crate::confined::Confined;

use super::io;
use super::report::InstallError;

/// The root, resolved once at the start of an install.
pub(super) struct Target {
    /// The directory holding the root, open (its path is the operator's, made canonical).
    pub(super) parent: Confined,
    /// The root's name in `parent`.
    pub(super) name: String,
    /// The root, open; `None` if it does not exist yet.
    pub(super) dir: Option<Confined>,
}

impl Target {
    pub(super) fn path(&self) -> PathBuf {
        self.parent.path().join(&self.name)
    }
}

/// Resolves the configured root once: a root that is a symlink is followed now (and logged) and
/// never again; the parent directory is created if missing. A root (a symlink's target) that is
/// not ours is refused (`owner::check_owner`): another user could change the verified files. Everything after this goes through
/// the descriptors opened here.
pub(super) fn resolve_root(configured: &Path) -> Result<Target, InstallError> {
    let absolute = std::path::absolute(configured).map_err(io("resolve", configured))?;
    let resolved = match fs::symlink_metadata(&absolute) {
        Ok(m) if m.file_type().is_symlink() => {
            let target = fs::canonicalize(&absolute)
                .map_err(io("resolve the symlink (its target must exist)", &absolute))?;
            tracing::info!(
                root = %absolute.display(),
                target = %target.display(),
                "the cache root is a symlink: installing into its target, resolved once now"
            );
            target
        }
        _ => absolute,
    };
    let (Some(parent), Some(name)) = (
        resolved.parent(),
        resolved.file_name().and_then(|n| n.to_str()),
    ) else {
        return Err(InstallError::RootNotDir(resolved));
    };
    fs::create_dir_all(parent).map_err(io("create", parent))?;
    let parent_path = fs::canonicalize(parent).map_err(io("resolve", parent))?;
    let parent = Confined::open(&parent_path).map_err(io("open", &parent_path))?;
    let dir = match parent.open_dir(name) {
        Ok(d) => {
            // Judged on the directory opened, so a swap after the check changes nothing.
            let st = rustix::fs::fstat(d.fd()).map_err(|e| InstallError::Io {
                op: "stat",
                path: parent_path.join(name),
                source: e.into(),
            })?;
            crate::owner::check_owner(&parent_path.join(name), st.st_uid, st.st_mode)?;
            Some(d)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR) | Some(libc::ELOOP)) => {
            return Err(InstallError::RootNotDir(parent_path.join(name)));
        }
        Err(e) => {
            return Err(InstallError::Io {
                op: "open",
                path: parent_path.join(name),
                source: e,
            });
        }
    };
    Ok(Target {
        parent,
        name: name.to_owned(),
        dir,
    })
}
