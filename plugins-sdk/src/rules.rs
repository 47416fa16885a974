use crate::{Decision, ReasonCategory};

/// The skip decision for `path` (relative to the root) if no cache kind may ever publish it
/// (docs/jit-caches.md#never-published), with its category: in-flight temp files and directories
/// (`tmp.pid_*`, `tmp.<uuid>`, `.<pid>.<tid>.tmp`, `model.<pid>.tmp`, `.staging-*`, `tmp/<uuid>`,
/// `*_CxxBuild`) and NFS silly-renames are `Temporary`; locks (`locks/`, `*.lock`) are `Lock`;
/// per-host files (`gpu_p2p_access_cache_*`) are `PerHost`.
pub fn never_publish(path: &str) -> Option<Decision> {
    never_publish_reason(path).map(|(category, detail)| Decision::skip(category, detail))
}

fn never_publish_reason(path: &str) -> Option<(ReasonCategory, &'static str)> {
    use ReasonCategory::{Lock, PerHost, Temporary};
    let mut parts: Vec<&str> = path.split('/').collect();
    let name = parts.pop().unwrap_or(path);
    for d in &parts {
        if d.starts_with("tmp.")
            || d.starts_with(".staging-")
            || *d == "tmp"
            || d.ends_with("_CxxBuild")
        {
            return Some((Temporary, "inside an in-flight temp directory"));
        }
        if *d == "locks" {
            return Some((Lock, "inside a lock directory"));
        }
    }
    if name.starts_with("gpu_p2p_access_cache") {
        return Some((PerHost, "per-host file (GPU topology probe)"));
    }
    if name.ends_with(".lock") {
        return Some((Lock, "lock file"));
    }
    if name.ends_with(".tmp") || name.starts_with("tmp.pid_") {
        return Some((Temporary, "in-flight temp file"));
    }
    if name.starts_with(".nfs") {
        return Some((Temporary, "NFS silly-rename file"));
    }
    None
}

/// The last component of a '/'-separated path.
pub fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Everything before the last '/', or "" at the root.
pub fn parent_dir(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(d, _)| d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_lock_and_per_host_files_are_never_published() {
        use ReasonCategory::*;
        for (p, category) in [
            ("ab/tmp.pid_12_abc/x.cubin", Temporary),
            ("tmp.pid_1_2", Temporary),
            ("triton/0/tmp.1f2e3d/k.cubin", Temporary),
            ("cache/tmp/5f1c/kernel.cu", Temporary),
            ("fxgraph/ab/.1234.5678.tmp", Temporary),
            ("torch_aot_compile/h/rank_0_0/model.4242.tmp", Temporary),
            ("sm90/mod/build-1/.staging-77/m.so", Temporary),
            ("cached_ops/tmp/batch_prefill.lock", Temporary),
            ("locks/abc", Lock),
            ("x/locks/abc.lock", Lock),
            ("y/abc.lock", Lock),
            ("gpu_p2p_access_cache_for_0,1,2,3.json", PerHost),
            ("ab/c_CxxBuild/o.o", Temporary),
            ("ab/.nfs0000000012", Temporary),
        ] {
            let d = never_publish(p).unwrap_or_else(|| panic!("{p} would be published"));
            assert_eq!((d.category, d.is_publish()), (category, false), "{p}");
            assert!(d.traits.is_empty());
        }
        for p in [
            "ab/k.cubin",
            "ab/__grp__k.json",
            "cache/kernel.x.0123/kernel.cubin",
            "torch_aot_compile/h/rank_0_0/model",
            "tmpfile/x",
            "a/tmp_kernel.ptx",
            "locksmith/x",
        ] {
            assert!(never_publish(p).is_none(), "{p} would be skipped");
        }
        assert_eq!(file_name("a/b/c"), "c");
        assert_eq!(parent_dir("a/b/c"), "a/b");
        assert_eq!(parent_dir("c"), "");
    }
}

#[cfg(test)]
mod detail_tests {
    use crate::{Decision, MAX_DETAIL_BYTES, ReasonCategory, truncate};

    #[test]
    fn details_are_bounded_at_char_boundaries() {
        let d = Decision::skip(
            ReasonCategory::Unparseable,
            format!("child {} is bad", "é".repeat(1000)),
        );
        assert!(d.detail.len() <= MAX_DETAIL_BYTES && d.detail.ends_with("..."));
        assert_eq!(truncate("short".into(), 10), "short");
    }
}
