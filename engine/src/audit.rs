//! "Did the installed cache work?": install leaves a record of what it put into a root
//! (`.<root name>.jitship-installed.json` beside the root, next to its lock file; scans never offer
//! it): each file with its size, inode and mtime right after the install. `jitship audit` compares
//! the root with that record after the engine has run. Every file of a compile class
//! ([`class_of`]: kernels, precompiled headers, FX-graph/AOTAutograd entries, vLLM's AOT artifact,
//! vLLM/SGLang compiled graphs) that the engine added since, or rewrote (another size, inode or
//! mtime: in place, or a temp file renamed over it), is work it did anyway. An engine that took
//! the installed cache only reads those files: it is warm. A record of an older version holds
//! sizes only; its files are compared by size, and the report says how many were.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::install::record::mtime_ns;
pub use crate::install::record::{
    InstallRecord, Installed, Stamp, StoredRecord, record_path, write_record,
};
use crate::policy::native::never_publish_reason;

/// How many compiled-anyway files a report lists (the count covers them all).
pub const MAX_LISTED: usize = 50;

/// The class of a file that is not the result of a compile.
pub const OTHER: &str = "other";

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

/// How a compiled-anyway file differs from the install.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    /// Not in the record: the engine created it.
    Added,
    /// In the record, now with another size, inode or mtime: the engine wrote it again.
    Rewritten,
}

/// A file of a compile class the engine added or rewrote after the install.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CompiledFile {
    pub path: String,
    pub class: &'static str,
    pub change: Change,
}

/// How the root compares with what install put there.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditReport {
    pub cache_kind: String,
    pub root: PathBuf,
    pub generation: String,
    /// When an install last wrote the record (seconds since the epoch): an already-current
    /// install that found it saying what the root holds leaves it, and this, as they were.
    pub installed_at: u64,
    pub files_installed: u64,
    /// Installed files still there as installed (size, inode and mtime; size only, for files in
    /// `files_compared_by_size_only`).
    pub files_kept: u64,
    /// Installed files gone from the root.
    pub files_removed: u64,
    /// Installed files now with another size, inode or mtime (rewritten by the engine).
    pub files_rewritten: u64,
    /// Installed files still there whose record holds a size only (a record written by an older
    /// jitship): a rewrite of the same size is not seen for them. Reinstall to stamp them.
    pub files_compared_by_size_only: u64,
    /// Files the engine added since the install, by class ([`class_of`]).
    pub added: BTreeMap<String, u64>,
    /// Installed files the engine rewrote, by class.
    pub rewritten: BTreeMap<String, u64>,
    /// Files of a compile class (all but `other`) the engine added or rewrote although a cache
    /// was installed: the work it did anyway.
    pub compiled_anyway: u64,
    /// `compiled_anyway` by class.
    pub compiled_anyway_by_class: BTreeMap<String, u64>,
    /// The compiled-anyway files, by class then path, the first [`MAX_LISTED`] of them.
    pub compiled_anyway_files: Vec<CompiledFile>,
    /// True when the engine added or rewrote no file of a compile class: it ran from the cache.
    pub warm: bool,
    /// `warm` or `compiled anyway`.
    pub verdict: &'static str,
    /// The first ten paths of `compiled_anyway_files` (kept for readers of older reports).
    pub examples: Vec<String>,
}

/// The class of a path in a cache root, from any of its components: `kernel` (`.so`; Triton's
/// `.cubin`, `.hsaco`, `__grp__*.json`), `precompiled-header` (`.gch`), `aot-artifact` (vLLM's
/// compiled model, `torch_aot_compile/<hash>/rank_*/model`), `compiled-graph` (vLLM/SGLang's
/// per-graph files `vllm_compile_cache.py`, `sglang_compile_cache.py`,
/// `artifact_compile_range_*` under `<hash>/rank_*/<prefix>/`), `fxgraph-entry` (under a
/// component `fxgraph`), `aotautograd-entry` (under a component `aotautograd`); else `other`.
pub fn class_of(path: &str) -> &'static str {
    let c: Vec<&str> = path.split('/').collect();
    let name = c.last().copied().unwrap_or_default();
    let under_rank = |i: usize| i >= 3 && c[i - 2].starts_with("rank_");
    let kernel = [".so", ".cubin", ".hsaco"]
        .iter()
        .any(|e| name.ends_with(e))
        || (name.starts_with("__grp__") && name.ends_with(".json"));
    if kernel {
        "kernel"
    } else if name.ends_with(".gch") {
        "precompiled-header"
    } else if c.len() >= 4
        && name == "model"
        && c[c.len() - 2].starts_with("rank_")
        && c[c.len() - 4] == "torch_aot_compile"
    {
        "aot-artifact"
    } else if c.iter().enumerate().any(|(i, s)| {
        under_rank(i)
            && (*s == "vllm_compile_cache.py"
                || *s == "sglang_compile_cache.py"
                || s.starts_with("artifact_compile_range_"))
    }) {
        "compiled-graph"
    } else if c.contains(&"fxgraph") {
        "fxgraph-entry"
    } else if c.contains(&"aotautograd") {
        "aotautograd-entry"
    } else {
        OTHER
    }
}

/// True when the file scanned as `f` is still what the record says install put there.
fn unchanged(installed: &Installed, f: &crate::scan::ScannedFile) -> bool {
    match installed {
        Installed::Stamped(s) => {
            s.size == f.size
                && s.ino == f.ino
                && s.mtime_ns == mtime_ns(f.mtime_s, i64::from(f.mtime_ns))
        }
        Installed::Size(size) => *size == f.size,
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
    let record: StoredRecord =
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
    let mut compiled = Vec::new();
    for f in &snap.files {
        let p = f.path.to_string();
        let change = match record.files.get(&p) {
            Some(installed) => {
                seen += 1;
                if matches!(installed, Installed::Size(_)) {
                    r.files_compared_by_size_only += 1;
                }
                if unchanged(installed, f) {
                    r.files_kept += 1;
                    continue;
                }
                r.files_rewritten += 1;
                Change::Rewritten
            }
            // Locks and temp files say nothing about whether the cache was used.
            None if never_publish_reason(&p).is_some() => continue,
            None => Change::Added,
        };
        let class = class_of(&p);
        let by_class = match change {
            Change::Added => &mut r.added,
            Change::Rewritten => &mut r.rewritten,
        };
        *by_class.entry(class.to_string()).or_default() += 1;
        if class != OTHER {
            *r.compiled_anyway_by_class
                .entry(class.to_string())
                .or_default() += 1;
            compiled.push(CompiledFile {
                path: p,
                class,
                change,
            });
        }
    }
    r.files_removed = r.files_installed - seen;
    r.compiled_anyway = compiled.len() as u64;
    r.warm = compiled.is_empty();
    r.verdict = if r.warm { "warm" } else { "compiled anyway" };
    compiled.sort_by(|a, b| (a.class, &a.path).cmp(&(b.class, &b.path)));
    compiled.truncate(MAX_LISTED);
    r.examples = compiled.iter().take(10).map(|c| c.path.clone()).collect();
    r.compiled_anyway_files = compiled;
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
            whole: false,
        }
    }

    const SHA: &str = "0f3a9c";

    fn listed(r: &AuditReport) -> Vec<(&str, &str, Change)> {
        r.compiled_anyway_files
            .iter()
            .map(|f| (f.class, f.path.as_str(), f.change))
            .collect()
    }

    #[test]
    fn classes_come_from_any_component() {
        for (path, class) in [
            ("ex/cex.main.so", "kernel"),
            ("triton/AB/k.cubin", "kernel"),
            ("triton/AB/k.hsaco", "kernel"),
            ("triton/AB/__grp__k.json", "kernel"),
            ("triton/AB/k.json", OTHER),
            ("precompiled_headers/c.h.gch", "precompiled-header"),
            ("fxgraph/ab/k/e", "fxgraph-entry"),
            ("inductor/fxgraph/ab/k/e", "fxgraph-entry"),
            ("aotautograd/ab/e", "aotautograd-entry"),
            (
                "torch_aot_compile/h/inductor_cache/aotautograd/ab/e",
                "aotautograd-entry",
            ),
            ("torch_aot_compile/h/rank_0_0/model", "aot-artifact"),
            ("torch_aot_compile/h/rank_0_0/model.77.tmp", OTHER),
            (
                "h/rank_0_0/backbone/vllm_compile_cache.py",
                "compiled-graph",
            ),
            (
                "h/rank_1_0/backbone/sglang_compile_cache.py",
                "compiled-graph",
            ),
            (
                "h/rank_0_0/backbone/artifact_compile_range_1_8192_subgraph_0",
                "compiled-graph",
            ),
            (
                "h/rank_0_0/backbone/artifact_compile_range_1_8192_subgraph_0/x.bin",
                "compiled-graph",
            ),
            ("vllm_compile_cache.py", OTHER),
            ("s5/cs5.py", OTHER),
        ] {
            assert_eq!(class_of(path), class, "{path}");
        }
    }

    /// vLLM 0.32 on CPU fails to load its AOT artifact on a warm start and compiles again: it
    /// writes `model.<pid>.tmp` and renames it over `model` (often the same size), and adds an
    /// AOTAutograd entry under the AOT prefix.
    #[test]
    fn vllm_recompiling_its_aot_artifact_is_not_warm() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("torch_compile_cache");
        let model = format!("torch_aot_compile/{SHA}/rank_0_0/model");
        let entry = format!("torch_aot_compile/{SHA}/inductor_cache/aotautograd/ab/entry");
        let graph = format!("{SHA}/rank_0_0/backbone/vllm_compile_cache.py");
        write(&root, &model, b"compiled model v1");
        write(&root, &entry, b"aot entry");
        write(&root, &graph, b"graphs");
        write_record(
            &root,
            &record(&[
                (model.as_str(), 17),
                (entry.as_str(), 9),
                (graph.as_str(), 6),
            ]),
        )
        .unwrap();
        let before = std::fs::metadata(root.join(&model)).unwrap();
        write(&root, &format!("{model}.4242.tmp"), b"compiled model v2");
        std::fs::rename(root.join(format!("{model}.4242.tmp")), root.join(&model)).unwrap();
        let new_entry = format!("torch_aot_compile/{SHA}/inductor_cache/aotautograd/cd/entry");
        write(&root, &new_entry, b"aot entry 2");
        let after = std::fs::metadata(root.join(&model)).unwrap();
        assert_eq!(before.len(), after.len(), "the same size");
        let r = audit("vllm", &root).unwrap();
        assert!(!r.warm, "{r:?}");
        assert_eq!(r.verdict, "compiled anyway");
        assert_eq!(
            (r.files_kept, r.files_rewritten, r.files_removed),
            (2, 1, 0)
        );
        assert_eq!(r.compiled_anyway, 2);
        assert_eq!(
            listed(&r),
            [
                ("aot-artifact", model.as_str(), Change::Rewritten),
                ("aotautograd-entry", new_entry.as_str(), Change::Added),
            ]
        );
        assert_eq!(r.rewritten.get("aot-artifact"), Some(&1));
        assert_eq!(r.added.get("aotautograd-entry"), Some(&1));
        assert_eq!(r.compiled_anyway_by_class.len(), 2);
    }

    #[test]
    fn a_kernel_rewritten_in_place_with_another_mtime_counts() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cache");
        write(&root, "ex/cex.main.so", b"kernel");
        write_record(&root, &record(&[("ex/cex.main.so", 6)])).unwrap();
        let ino = std::os::unix::fs::MetadataExt::ino(
            &std::fs::metadata(root.join("ex/cex.main.so")).unwrap(),
        );
        let f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(root.join("ex/cex.main.so"))
            .unwrap();
        std::io::Write::write_all(&mut &f, b"kernel").unwrap();
        f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_007))
            .unwrap();
        drop(f);
        let meta = std::fs::metadata(root.join("ex/cex.main.so")).unwrap();
        assert_eq!(
            (std::os::unix::fs::MetadataExt::ino(&meta), meta.len()),
            (ino, 6),
            "the same inode and size"
        );
        let r = audit("inductor", &root).unwrap();
        assert!(!r.warm, "{r:?}");
        assert_eq!(
            listed(&r),
            [("kernel", "ex/cex.main.so", Change::Rewritten)]
        );
    }

    #[test]
    fn an_old_size_only_record_still_audits_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cache");
        write(&root, "fxgraph/ab/k/e", b"entry");
        write(&root, "ex/cex.main.so", b"kernel");
        std::fs::write(
            record_path(&root),
            br#"{"cache_kind":"inductor","generation":"g","installed_at":1,"files":{"fxgraph/ab/k/e":5,"ex/cex.main.so":6,"gone.so":3}}"#,
        )
        .unwrap();
        let r = audit("inductor", &root).unwrap();
        assert!(r.warm, "{r:?}");
        assert_eq!(r.files_compared_by_size_only, 2);
        assert_eq!(
            (r.files_kept, r.files_rewritten, r.files_removed),
            (2, 0, 1)
        );
        // By size: another size is a rewrite; a new kernel is compiled anyway.
        write(&root, "fxgraph/ab/k/e", b"entry, longer");
        write(&root, "ni/cni.main.so", b"kernel");
        let r = audit("inductor", &root).unwrap();
        assert!(!r.warm);
        assert_eq!(
            listed(&r),
            [
                ("fxgraph-entry", "fxgraph/ab/k/e", Change::Rewritten),
                ("kernel", "ni/cni.main.so", Change::Added),
            ]
        );
    }

    #[test]
    fn the_record_stamps_each_file_as_installed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cache");
        write(&root, "ex/cex.main.so", b"kernel");
        write(&root, "short", b"x");
        write_record(
            &root,
            &record(&[("ex/cex.main.so", 6), ("short", 5), ("gone.so", 3)]),
        )
        .unwrap();
        let stored: StoredRecord =
            serde_json::from_slice(&std::fs::read(record_path(&root)).unwrap()).unwrap();
        let meta = std::fs::metadata(root.join("ex/cex.main.so")).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            stored.files["ex/cex.main.so"],
            Installed::Stamped(Stamp {
                size: 6,
                ino: meta.ino(),
                mtime_ns: mtime_ns(meta.mtime(), meta.mtime_nsec()),
            })
        );
        // Not there with the size install put: its size only (audit sees the difference).
        assert_eq!(stored.files["short"], Installed::Size(5));
        assert_eq!(stored.files["gone.so"], Installed::Size(3));
        let r = audit("inductor", &root).unwrap();
        assert_eq!((r.files_rewritten, r.files_removed), (1, 1));
    }

    #[test]
    fn the_list_is_bounded_and_the_count_is_whole() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cache");
        std::fs::create_dir_all(&root).unwrap();
        write_record(&root, &record(&[])).unwrap();
        for i in 0..MAX_LISTED + 7 {
            write(&root, &format!("k{i:03}/c.so"), b"kernel");
        }
        let r = audit("inductor", &root).unwrap();
        assert_eq!(r.compiled_anyway, (MAX_LISTED + 7) as u64);
        assert_eq!(r.compiled_anyway_files.len(), MAX_LISTED);
        assert_eq!(r.examples.len(), 10);
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
        // The engine read every installed file, regenerated a wrapper and took a lock: none of
        // that is compiling anyway.
        for p in ["fxgraph/ab/k/e", "ex/cex.main.so"] {
            std::fs::read(root.join(p)).unwrap();
        }
        write(&root, "s5/cs5.py", b"wrapper");
        write(&root, "locks/cex.lock", b"");
        let r = audit("inductor", &root).unwrap();
        assert_eq!(
            (r.files_installed, r.files_kept, r.files_removed),
            (2, 2, 0)
        );
        assert_eq!(r.compiled_anyway, 0);
        assert_eq!(r.added.get("other"), Some(&1));
        assert_eq!(r.files_compared_by_size_only, 0);
        assert!(r.warm, "{r:?}");
        assert_eq!(r.verdict, "warm");
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
        assert_eq!(r.compiled_anyway, 4);
        assert_eq!(r.files_removed, 1);
        assert!(!r.warm);
        assert_eq!(r.verdict, "compiled anyway");
        assert_eq!(r.examples.len(), 4);
        assert_eq!(r.compiled_anyway_files.len(), 4);
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
