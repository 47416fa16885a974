//! Whose a cache root is (issue 39). A default root under `/tmp` can be created first by any
//! local user (or be a symlink to their directory), who would then own the verified files and
//! could swap one after verification. So `install`, `publish` and `watch` refuse a root (a
//! symlink's target) owned by another user than jitship's and root, or writable by group or
//! others without being jitship's own ([`check_owner`]). A sticky world-writable directory such
//! as `/tmp` is fine as the root's parent, never as the root. Below `roots` (which resolves
//! where a root is) so that install and publish can ask it.

use std::path::{Path, PathBuf};

/// A cache root jitship refuses to install into or publish from: it belongs to someone else.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{path}: the cache root {why}; jitship installs into and publishes from a root only if it \
     is owned by uid {me} (the user jitship runs as) or by root and writable by no one else. \
     Remove it if you did not create it, or make it ours (`chown {me} DIR; chmod go-w DIR`), \
     or point the cache elsewhere"
)]
pub struct ForeignRoot {
    pub path: PathBuf,
    pub why: String,
    pub me: u32,
}

/// Checks that the directory at `path` (a symlink's target: the caller passes what it opened),
/// owned by `owner` with `mode`, belongs to the user jitship runs as: owned by another non-root
/// user, or writable by group or others while not ours, it is refused.
pub fn check_owner(path: &Path, owner: u32, mode: u32) -> Result<(), ForeignRoot> {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let who = |uid: u32| match passwd_entry(uid) {
        Some((name, _)) => format!("uid {uid} ({name})"),
        None => format!("uid {uid}"),
    };
    let why = if owner != me && owner != 0 {
        format!("is owned by {}, another user", who(owner))
    } else if owner != me && mode & 0o022 != 0 {
        format!(
            "is owned by {} and writable by group or others (mode {:o})",
            who(owner),
            mode & 0o7777
        )
    } else {
        return Ok(());
    };
    Err(ForeignRoot {
        path: path.to_owned(),
        why,
        me,
    })
}

/// The passwd entry of `uid`: (name, home). Hand-written over libc (already a dependency) because
/// this one lookup is all jitship needs of the user database; a crate (nix, uzers) would add a
/// dependency for a single call.
pub(crate) fn passwd_entry(uid: u32) -> Option<(String, PathBuf)> {
    use std::ffi::CStr;
    use std::os::unix::ffi::OsStrExt;
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: an all-zero passwd is a valid out-parameter for getpwuid_r.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: pwd, buf and result are valid for the call; buf outlives every use of the
        // pointers getpwuid_r stores in pwd.
        let rc = unsafe {
            libc::getpwuid_r(
                uid,
                &mut pwd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut result,
            )
        };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        if rc != 0 || result.is_null() || pwd.pw_name.is_null() || pwd.pw_dir.is_null() {
            return None;
        }
        // SAFETY: getpwuid_r succeeded: both are NUL-terminated strings inside buf.
        let (name, dir) = unsafe { (CStr::from_ptr(pwd.pw_name), CStr::from_ptr(pwd.pw_dir)) };
        let name = name.to_str().ok()?.to_string();
        let dir = PathBuf::from(std::ffi::OsStr::from_bytes(dir.to_bytes()));
        return Some((name, dir));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_of_another_user_or_writable_without_being_ours_is_refused() {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let other = if me == 65534 { 65533 } else { 65534 };
        let p = Path::new("/tmp/torchinductor_x");
        assert_eq!(check_owner(p, me, 0o755), Ok(()));
        assert_eq!(check_owner(p, me, 0o777), Ok(()), "ours, however writable");
        let e = check_owner(p, other, 0o700).unwrap_err();
        assert!(e.why.contains(&format!("uid {other}")), "{e}");
        assert!(e.to_string().contains("chown"), "{e}");
        assert!(check_owner(p, other, 0o1777).is_err());
        if me != 0 {
            assert_eq!(
                check_owner(p, 0, 0o755),
                Ok(()),
                "root's, writable by no one else"
            );
            assert!(check_owner(p, 0, 0o775).is_err());
        }
    }

    #[test]
    fn this_process_has_a_passwd_entry_or_none_without_failing() {
        let uid = rustix::process::getuid().as_raw();
        if let Some((name, home)) = passwd_entry(uid) {
            assert!(
                !name.is_empty() && home.is_absolute(),
                "{name} {}",
                home.display()
            );
        }
    }
}
