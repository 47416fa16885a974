//! "Did the installed cache work?": install leaves a record of what it put into a root
//! (`.<root name>.jitship-installed.json` beside the root, next to its lock file; scans never offer
//! it), and `jitship audit` compares the root with that record after the engine has run. Files the
//! engine added since are work it did anyway: compiled kernels (`.so`), precompiled headers
//! (`.gch`), new FX-graph/AOTAutograd entries (a torch cache miss). An engine that took the
//! installed cache adds none of those.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub use crate::install::record::{InstallRecord, record_path, write_record};
use crate::policy::native::never_publish_reason;

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error(
        "no install record at {0}: nothing was installed into this root by jitship (run `jitship install` first)"
    )]
    NoRecord(PathBuf),
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not an install record jitship wrote: {source}")]
    Bad {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// How the root compares with what install put there.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditReport {
    pub cache_kind: String,
    pub root: PathBuf,
    pub generation: String,
    pub installed_at: u64,
    pub files_installed: u64,
    /// Installed files still there with their size.
    pub files_kept: u64,
    /// Installed files gone from the root.
    pub files_removed: u64,
    /// Installed files now with another size (rewritten by the engine).
    pub files_rewritten: u64,
    /// Files the engine added since the install, by class: `kernel` (`.so`),
    /// `precompiled-header` (`.gch`), `fxgraph-entry`, `aotautograd-entry`, `other`.
    pub added: BTreeMap<String, u64>,
    /// Kernels and precompiled headers the engine built although a cache was installed.
    pub compiled_anyway: u64,
    /// True when the engine added no compiled artifact and no cache entry: it ran from the cache.
    pub warm: bool,
    /// A few of the added paths, for a person to look at.
    pub examples: Vec<String>,
}

fn class_of(path: &str) -> &'static str {
    if path.ends_with(".so") {
        "kernel"
    } else if path.ends_with(".gch") {
        "precompiled-header"
    } else if path.starts_with("fxgraph/") {
        "fxgraph-entry"
    } else if path.starts_with("aotautograd/") {
        "aotautograd-entry"
    } else {
        "other"
    }
}

/// Compares `root` with its install record.
pub fn audit(cache_kind: &str, root: &Path) -> Result<AuditReport, AuditError> {
    let path = record_path(root);
    let bytes = match crate::install::record::read_record(root) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(AuditError::NoRecord(path));
        }
        Err(source) => return Err(AuditError::Io { path, source }),
    };
    let record: InstallRecord =
        serde_json::from_slice(&bytes).map_err(|source| AuditError::Bad {
            path: path.clone(),
            source,
        })?;
    let snap = crate::scan::snapshot(root).map_err(|source| AuditError::Io {
        path: root.to_path_buf(),
        source,
    })?;
    let mut r = AuditReport {
        cache_kind: cache_kind.to_string(),
        root: root.to_path_buf(),
        generation: record.generation.clone(),
        installed_at: record.installed_at,
        files_installed: record.files.len() as u64,
        ..AuditReport::default()
    };
    let mut seen = 0u64;
    for f in &snap.files {
        let p = f.path.to_string();
        match record.files.get(&p) {
            Some(size) => {
                seen += 1;
                if *size == f.size {
                    r.files_kept += 1;
                } else {
                    r.files_rewritten += 1;
                }
            }
            // Locks and temp files say nothing about whether the cache was used.
            None if never_publish_reason(&p).is_some() => {}
            None => {
                let class = class_of(&p);
                *r.added.entry(class.to_string()).or_default() += 1;
                if class != "other" && r.examples.len() < 10 {
                    r.examples.push(p);
                }
            }
        }
    }
    r.files_removed = r.files_installed - seen;
    r.compiled_anyway = ["kernel", "precompiled-header"]
        .iter()
        .filter_map(|c| r.added.get(*c))
        .sum();
    r.warm = r.compiled_anyway == 0
        && !r.added.contains_key("fxgraph-entry")
        && !r.added.contains_key("aotautograd-entry");
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::{RECORD_SUFFIX, STAGING_PREFIX};

    fn write(root: &Path, rel: &str, bytes: &[u8]) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }

    fn record(files: &[(&str, u64)]) -> InstallRecord {
        InstallRecord {
            cache_kind: "inductor".into(),
            generation: "g".into(),
            installed_at: 1,
            files: files.iter().map(|(p, s)| (p.to_string(), *s)).collect(),
        }
    }

    #[test]
    fn a_root_the_engine_only_read_is_warm() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cache");
        write(&root, "fxgraph/ab/k/e", b"entry");
        write(&root, "ex/cex.main.so", b"kernel");
        write_record(
            &root,
            &record(&[("fxgraph/ab/k/e", 5), ("ex/cex.main.so", 6)]),
        )
        .unwrap();
        // The engine regenerated a wrapper and took a lock: neither is compiling anyway.
        write(&root, "s5/cs5.py", b"wrapper");
        write(&root, "locks/cex.lock", b"");
        let r = audit("inductor", &root).unwrap();
        assert_eq!(
            (r.files_installed, r.files_kept, r.files_removed),
            (2, 2, 0)
        );
        assert_eq!(r.compiled_anyway, 0);
        assert_eq!(r.added.get("other"), Some(&1));
        assert!(r.warm, "{r:?}");
        // The record is beside the root and a scan of the root never offers it.
        assert!(record_path(&root).exists());
        let snap = crate::scan::snapshot(dir.path()).unwrap();
        assert!(
            snap.files
                .iter()
                .all(|f| !f.path.to_string().ends_with(RECORD_SUFFIX)),
            "{:?}",
            snap.files
        );
    }

    #[test]
    fn kernels_and_entries_compiled_after_the_install_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cache");
        write(&root, "fxgraph/ab/k/e", b"entry");
        write_record(&root, &record(&[("fxgraph/ab/k/e", 5), ("gone.so", 3)])).unwrap();
        write(&root, "ex/cex.main.so", b"kernel");
        write(&root, "ni/cni.main.so", b"kernel");
        write(&root, "precompiled_headers/c.h.gch", b"gpch");
        write(&root, "fxgraph/cd/k2/e2", b"entry");
        let r = audit("inductor", &root).unwrap();
        assert_eq!(r.added.get("kernel"), Some(&2));
        assert_eq!(r.added.get("precompiled-header"), Some(&1));
        assert_eq!(r.added.get("fxgraph-entry"), Some(&1));
        assert_eq!(r.compiled_anyway, 3);
        assert_eq!(r.files_removed, 1);
        assert!(!r.warm);
        assert_eq!(r.examples.len(), 4);
    }

    #[test]
    fn the_record_replaces_a_link_at_its_name_and_never_writes_through_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cache");
        std::fs::create_dir_all(&root).unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"not jitship's").unwrap();
        std::os::unix::fs::symlink(&victim, record_path(&root)).unwrap();
        // A temp file left by a crashed install is replaced too.
        std::fs::write(
            dir.path().join(format!("{STAGING_PREFIX}cache.record")),
            b"stale",
        )
        .unwrap();
        write_record(&root, &record(&[("a", 1)])).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"not jitship's");
        let meta = std::fs::symlink_metadata(record_path(&root)).unwrap();
        assert!(meta.is_file(), "{meta:?}");
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().all(|n| !n.starts_with(STAGING_PREFIX)),
            "{names:?}"
        );
        assert_eq!(audit("inductor", &root).unwrap().files_removed, 1);
    }

    #[test]
    fn a_root_that_is_a_symlink_has_its_record_beside_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("real/cache");
        std::fs::create_dir_all(&target).unwrap();
        std::fs::write(target.join("k.so"), b"kernel").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        write_record(&link, &record(&[("k.so", 6)])).unwrap();
        assert!(
            dir.path()
                .join("real/.cache.jitship-installed.json")
                .exists()
        );
        assert!(audit("inductor", &link).unwrap().warm);
    }

    #[test]
    fn a_root_never_installed_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let err = audit("inductor", &dir.path().join("cache")).unwrap_err();
        assert!(
            err.to_string().contains("run `jitship install` first"),
            "{err}"
        );
        std::fs::write(record_path(&dir.path().join("cache")), b"{}").unwrap();
        let err = audit("inductor", &dir.path().join("cache")).unwrap_err();
        assert!(err.to_string().contains("not an install record"), "{err}");
    }
}
