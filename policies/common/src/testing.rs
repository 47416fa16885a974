//! Fixture helpers for the policies' native tests: a throw-away directory tree, a run of
//! `select` over it through [`DirHost`], and file contents shaped like real caches.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use jitship_policy_sdk::{Decision, DirHost, Policy, Selection};

/// A temporary directory removed on drop.
pub struct Tree {
    root: PathBuf,
}

impl Default for Tree {
    fn default() -> Self {
        Self::new()
    }
}

impl Tree {
    pub fn new() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let root = std::env::temp_dir().join(format!(
            "jitship-policy-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&root).expect("create fixture dir");
        Self { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The root as the absolute string a cache would embed.
    pub fn abs(&self) -> String {
        self.root.display().to_string()
    }

    pub fn file(&self, rel: &str, bytes: impl AsRef<[u8]>) -> &Self {
        let p = self.root.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, bytes).expect("write fixture file");
        self
    }

    /// Sets a file's mtime (milliseconds since the epoch).
    pub fn mtime(&self, rel: &str, ms: u64) -> &Self {
        let f = std::fs::File::options()
            .write(true)
            .open(self.root.join(rel))
            .expect("open");
        f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
            .expect("set mtime");
        self
    }

    /// `select` over the whole tree: path -> (published, "category: detail").
    pub fn select<P: Policy>(&self, p: &P) -> BTreeMap<String, (bool, String)> {
        self.decisions(p)
            .into_iter()
            .map(|(path, d)| {
                let why = format!("{}: {}", d.category.as_str(), d.detail);
                (path, (d.is_publish(), why))
            })
            .collect()
    }

    /// `select` over the whole tree, as the wasm export runs it: the selection.
    pub fn selection<P: Policy>(&self, p: &P) -> Selection {
        DirHost::new(&self.root).select(p).expect("select").1
    }

    /// `select` over the whole tree: path -> the full decision (category, detail, traits).
    pub fn decisions<P: Policy>(&self, p: &P) -> BTreeMap<String, Decision> {
        let (entries, selection) = DirHost::new(&self.root).select(p).expect("select");
        entries
            .into_iter()
            .zip(selection.decisions)
            .map(|(e, d)| (e.path, d))
            .collect()
    }

    /// Published paths carrying the `marker` trait, sorted.
    pub fn markers<P: Policy>(&self, p: &P) -> Vec<String> {
        self.decisions(p)
            .into_iter()
            .filter(|(_, d)| d.is_publish() && d.is_marker())
            .map(|(k, _)| k)
            .collect()
    }

    /// Published paths carrying the `embeds-root` trait, sorted.
    pub fn embedding_root<P: Policy>(&self, p: &P) -> Vec<String> {
        self.decisions(p)
            .into_iter()
            .filter(|(_, d)| d.is_publish() && d.is_embeds_root())
            .map(|(k, _)| k)
            .collect()
    }

    pub fn published<P: Policy>(&self, p: &P) -> Vec<String> {
        self.select(p)
            .into_iter()
            .filter(|(_, (p, _))| *p)
            .map(|(k, _)| k)
            .collect()
    }

    pub fn skipped<P: Policy>(&self, p: &P) -> Vec<String> {
        self.select(p)
            .into_iter()
            .filter(|(_, (p, _))| !*p)
            .map(|(k, _)| k)
            .collect()
    }

    /// A Triton kernel directory `<dir>/` with its files and a group file naming them by
    /// absolute path under `abs_root`.
    pub fn triton_kernel(&self, dir: &str, kernel: &str, abs_root: &str) -> &Self {
        let mut children = serde_json::Map::new();
        for ext in ["source", "ttir", "ttgir", "llir", "ptx", "cubin", "json"] {
            let name = format!("{kernel}.{ext}");
            self.file(&format!("{dir}/{name}"), format!("{kernel} {ext}"));
            children.insert(name.clone(), format!("{abs_root}/{dir}/{name}").into());
        }
        let grp = serde_json::json!({ "child_paths": children });
        self.file(&format!("{dir}/__grp__{kernel}.json"), grp.to_string())
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A small but complete ELF64 shared object image: the header, then `len` bytes, then one
/// section header at the end of the file (where the linker writes it last).
pub fn elf(len: usize) -> Vec<u8> {
    let shoff = 64 + len as u64;
    let mut b = vec![0u8; 64 + len + 64];
    b[..4].copy_from_slice(b"\x7fELF");
    b[4] = 2;
    b[5] = 1;
    b[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
    b[0x3A..0x3C].copy_from_slice(&64u16.to_le_bytes());
    b[0x3C..0x3E].copy_from_slice(&1u16.to_le_bytes());
    b
}

/// Asserts two path lists are equal, printing both sorted.
pub fn assert_paths(got: &[String], want: &[&str]) {
    let mut w: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    w.sort();
    let mut g = got.to_vec();
    g.sort();
    assert_eq!(g, w);
}
