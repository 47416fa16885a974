//! Fixture trees shaped like the caches jitship carries (docs/jit-caches.md#fixtures).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Deterministic pseudo-random bytes (the content of "compiled kernels").
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A Triton-like cache: `kernels` hash-named directories, each with the files Triton writes
/// (source, IRs, ptx, cubin, metadata json, and the `__grp__` group file naming its children).
/// File sizes vary from a few hundred bytes to tens of KiB, as in real caches. Files that exist
/// already are left alone, so a second call with more kernels grows the cache like a real one.
pub fn triton_tree(root: &Path, kernels: usize, seed: u64) {
    for k in 0..kernels {
        let name = format!("kernel_{k}");
        let dir_hash = blake3::hash(format!("{seed}/{k}").as_bytes()).to_hex();
        let dir = root.join(&dir_hash[..52]);
        fs::create_dir_all(&dir).unwrap();
        let s = seed * 1_000_003 + k as u64;
        let files = [
            (format!("{name}.source"), 600),
            (format!("{name}.ttir"), 3_000),
            (format!("{name}.ttgir"), 4_000),
            (format!("{name}.llir"), 12_000),
            (format!("{name}.ptx"), 16_000),
            (format!("{name}.cubin"), 20_000 + (s % 7_000) as usize),
            (format!("{name}.json"), 900),
        ];
        let mut children = Vec::new();
        for (i, (file, size)) in files.iter().enumerate() {
            let path = dir.join(file);
            if !path.exists() {
                fs::write(&path, bytes(s * 16 + i as u64, *size)).unwrap();
            }
            children.push(path.display().to_string());
        }
        let grp = serde_json::json!({ "child_paths": children.iter().enumerate().map(|(i, p)| (files[i].0.clone(), p.clone())).collect::<BTreeMap<_,_>>() });
        let grp_path = dir.join(format!("__grp__{name}.json"));
        if !grp_path.exists() {
            fs::write(grp_path, grp.to_string()).unwrap();
        }
    }
}

/// A few large files (model-sized artifacts such as vLLM AOT `model` files or big cubins).
pub fn large_files_tree(root: &Path, files: usize, size: usize, seed: u64) {
    for i in 0..files {
        let dir = root.join(format!("rank_{i}_0"));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("model"), bytes(seed + i as u64, size)).unwrap();
    }
}

/// Every regular file under `root`: path -> (blake3, mode, mtime seconds, mtime nanoseconds).
pub type TreeDigest = BTreeMap<String, (String, u32, i64, i64)>;

/// Copies a tree byte for byte (a second pod that compiled exactly the same files).
pub fn copy_tree(from: &Path, to: &Path) {
    for (rel, _) in digest(from) {
        let dst = to.join(&rel);
        fs::create_dir_all(dst.parent().unwrap()).unwrap();
        fs::copy(from.join(&rel), dst).unwrap();
    }
}

/// Every entry under `dir` that is not a directory (files, symlinks), at any depth; empty if
/// `dir` does not exist.
pub fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| !e.file_type().is_dir())
        .map(walkdir::DirEntry::into_path)
        .collect()
}

pub fn digest(root: &Path) -> TreeDigest {
    let mut out = BTreeMap::new();
    if !root.exists() {
        return out;
    }
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let meta = fs::symlink_metadata(entry.path()).unwrap();
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                let rel = entry
                    .path()
                    .strip_prefix(root)
                    .unwrap()
                    .display()
                    .to_string();
                let hash = blake3::hash(&fs::read(entry.path()).unwrap())
                    .to_hex()
                    .to_string();
                out.insert(
                    rel,
                    (
                        hash,
                        meta.permissions().mode() & 0o7777,
                        meta.mtime(),
                        meta.mtime_nsec(),
                    ),
                );
            }
        }
    }
    out
}

/// A Python venv at `venv` made by the system's `python3 -m venv --without-pip` (no download),
/// with a `.dist-info` for each of `packages` (name, version) in its site-packages, as pip would
/// leave them. Returns the venv's interpreter.
pub fn fake_venv(venv: &Path, packages: &[(&str, &str)]) -> std::path::PathBuf {
    let made = std::process::Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(venv)
        .status()
        .expect("python3 on the test's PATH");
    assert!(made.success(), "python3 -m venv {}", venv.display());
    let site = fs::read_dir(venv.join("lib"))
        .unwrap()
        .next()
        .expect("lib/python3.X in the venv")
        .unwrap()
        .path()
        .join("site-packages");
    for (name, version) in packages {
        let d = site.join(format!("{name}-{version}.dist-info"));
        fs::create_dir_all(&d).unwrap();
        fs::write(
            d.join("METADATA"),
            format!("Name: {name}\nVersion: {version}\n"),
        )
        .unwrap();
    }
    venv.join("bin/python3")
}
