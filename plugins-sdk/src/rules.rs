/// Why `path` (relative to the root) must never be published by any cache kind, if it must not
/// (research/jit-caches.md §5): in-flight temp files and directories (`tmp.pid_*`, `tmp.<uuid>`,
/// `.<pid>.<tid>.tmp`, `model.<pid>.tmp`, `.staging-*`, `tmp/<uuid>`, `*_CxxBuild`), locks
/// (`locks/`, `*.lock`), per-host files (`gpu_p2p_access_cache_*`) and NFS silly-renames.
pub fn never_publish(path: &str) -> Option<&'static str> {
    let mut parts: Vec<&str> = path.split('/').collect();
    let name = parts.pop().unwrap_or(path);
    for d in &parts {
        if d.starts_with("tmp.")
            || d.starts_with(".staging-")
            || *d == "tmp"
            || d.ends_with("_CxxBuild")
        {
            return Some("inside an in-flight temp directory");
        }
        if *d == "locks" {
            return Some("inside a lock directory");
        }
    }
    if name.starts_with("gpu_p2p_access_cache") {
        return Some("per-host file (GPU topology probe)");
    }
    if name.ends_with(".lock") {
        return Some("lock file");
    }
    if name.ends_with(".tmp") || name.starts_with("tmp.pid_") {
        return Some("in-flight temp file");
    }
    if name.starts_with(".nfs") {
        return Some("NFS silly-rename file");
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
        for p in [
            "ab/tmp.pid_12_abc/x.cubin",
            "tmp.pid_1_2",
            "triton/0/tmp.1f2e3d/k.cubin",
            "cache/tmp/5f1c/kernel.cu",
            "fxgraph/ab/.1234.5678.tmp",
            "torch_aot_compile/h/rank_0_0/model.4242.tmp",
            "sm90/mod/build-1/.staging-77/m.so",
            "cached_ops/tmp/batch_prefill.lock",
            "locks/abc",
            "x/locks/abc.lock",
            "gpu_p2p_access_cache_for_0,1,2,3.json",
            "ab/c_CxxBuild/o.o",
            "ab/.nfs0000000012",
        ] {
            assert!(never_publish(p).is_some(), "{p} would be published");
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
mod reason_tests {
    use crate::{Decision, MAX_REASON_BYTES, truncate};

    #[test]
    fn reasons_are_bounded_at_char_boundaries() {
        let d = Decision::skip(format!("child {} is bad", "é".repeat(1000)));
        assert!(d.reason.len() <= MAX_REASON_BYTES && d.reason.ends_with("..."));
        assert_eq!(truncate("short".into(), 10), "short");
    }
}
