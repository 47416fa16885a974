use std::cell::{Cell, RefCell};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::{FileEntry, Level, Policy, PolicyError, Selection};

/// What a policy may ask of the host: the contract's `host` interface.
pub trait Host {
    /// Log through the host's logger.
    fn log(&self, level: Level, message: &str);

    /// Up to `max_bytes` of the file at `path` (relative to the root) from `offset`. Fewer bytes
    /// than asked, or none, at the end of the file. Paths outside the root, links and reads over
    /// the host's byte budget are refused with a message.
    fn read_file(&self, path: &str, offset: u64, max_bytes: u32) -> Result<Vec<u8>, String>;
}

/// The real host imports; only meaningful inside a wasm32 component.
pub struct WasmHost;

impl Host for WasmHost {
    #[cfg(target_arch = "wasm32")]
    fn log(&self, level: Level, message: &str) {
        crate::bindings::jitship::policy::host::log(level, message)
    }
    #[cfg(target_arch = "wasm32")]
    fn read_file(&self, path: &str, offset: u64, max_bytes: u32) -> Result<Vec<u8>, String> {
        crate::bindings::jitship::policy::host::read_file(path, offset, max_bytes)
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn log(&self, level: Level, message: &str) {
        eprintln!("[policy {level:?}] {message}");
    }
    #[cfg(not(target_arch = "wasm32"))]
    fn read_file(&self, _path: &str, _offset: u64, _max_bytes: u32) -> Result<Vec<u8>, String> {
        Err("WasmHost has no root outside a wasm component; use DirHost in native tests".into())
    }
}

/// Reads a whole file through `host` in chunks, refusing files longer than `limit` bytes.
pub fn read_to_end(host: &dyn Host, path: &str, limit: usize) -> Result<Vec<u8>, String> {
    const CHUNK: u32 = 256 * 1024;
    let mut out = Vec::new();
    loop {
        // One byte past the limit tells a file over the limit from one exactly at it.
        let left = (limit - out.len()).saturating_add(1);
        let want = CHUNK.min(u32::try_from(left).unwrap_or(u32::MAX));
        let chunk = host.read_file(path, out.len() as u64, want)?;
        if chunk.is_empty() {
            return Ok(out);
        }
        out.extend_from_slice(&chunk);
        if out.len() > limit {
            return Err(format!("{path} is larger than {limit} bytes"));
        }
    }
}

/// A native [`Host`] over a real directory, with the confinement rules of jitship's host:
/// relative normalized paths only, no links on the way, a byte budget per evaluation. Logs are
/// kept for tests to inspect.
pub struct DirHost {
    root: PathBuf,
    budget: Cell<u64>,
    logs: RefCell<Vec<(Level, String)>>,
}

impl DirHost {
    /// 16 MiB of reads, like the wasm host's default per evaluation.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self::with_budget(root, 16 << 20)
    }

    pub fn with_budget(root: impl Into<PathBuf>, bytes: u64) -> Self {
        Self {
            root: root.into(),
            budget: Cell::new(bytes),
            logs: RefCell::new(Vec::new()),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The root as a policy receives it: absolute, as text (the wasm host passes the absolute
    /// root; tests that give a relative directory get the same).
    pub fn root_str(&self) -> String {
        std::path::absolute(&self.root)
            .unwrap_or_else(|_| self.root.clone())
            .to_string_lossy()
            .into_owned()
    }

    /// Runs `policy`'s `select` over every file under the root, exactly as the wasm export
    /// would (`run::select`: the checks, the completeness answer): the entries and the
    /// selection.
    pub fn select<P: Policy>(
        &self,
        policy: &P,
    ) -> Result<(Vec<FileEntry>, Selection), PolicyError> {
        let entries = self
            .entries()
            .map_err(|e| PolicyError::InvalidInput(format!("{}: {e}", self.root.display())))?;
        let selection = crate::run::select(policy, self, &self.root_str(), &entries)?;
        Ok((entries, selection))
    }

    pub fn logs(&self) -> Vec<(Level, String)> {
        self.logs.borrow().clone()
    }

    /// Every regular file under the root (links and special files are left out, as the host
    /// does), sorted by path.
    pub fn entries(&self) -> std::io::Result<Vec<FileEntry>> {
        let mut out = Vec::new();
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir)? {
                let e = e?;
                let meta = std::fs::symlink_metadata(e.path())?;
                if meta.is_dir() {
                    stack.push(e.path());
                } else if meta.is_file() {
                    let rel = e
                        .path()
                        .strip_prefix(&self.root)
                        .map_err(std::io::Error::other)?
                        .to_path_buf();
                    let path = rel
                        .iter()
                        .map(|c| c.to_string_lossy())
                        .collect::<Vec<_>>()
                        .join("/");
                    let mtime_ms = meta
                        .modified()
                        .ok()
                        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                        .map_or(0, |d| d.as_millis() as u64);
                    out.push(FileEntry {
                        path,
                        size: meta.len(),
                        mtime_ms,
                    });
                }
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    fn resolve(&self, path: &str) -> Result<PathBuf, String> {
        if path.is_empty() || path.starts_with('/') {
            return Err(format!("{path:?} is not a relative path"));
        }
        let mut p = self.root.clone();
        for c in path.split('/') {
            if c.is_empty() || c == "." || c == ".." || c.contains('\\') {
                return Err(format!("{path:?} is not a normalized path inside the root"));
            }
            p.push(c);
            let meta = std::fs::symlink_metadata(&p).map_err(|e| format!("{path}: {e}"))?;
            if meta.file_type().is_symlink() {
                return Err(format!("{path}: a link on the way"));
            }
        }
        Ok(p)
    }
}

impl Host for DirHost {
    fn log(&self, level: Level, message: &str) {
        self.logs.borrow_mut().push((level, message.to_string()));
    }

    fn read_file(&self, path: &str, offset: u64, max_bytes: u32) -> Result<Vec<u8>, String> {
        let p = self.resolve(path)?;
        if !std::fs::symlink_metadata(&p)
            .map_err(|e| e.to_string())?
            .is_file()
        {
            return Err(format!("{path}: not a regular file"));
        }
        let want = u64::from(max_bytes).min(1 << 20);
        if want > self.budget.get() {
            return Err(format!("{path}: read budget exhausted"));
        }
        let mut f = std::fs::File::open(&p).map_err(|e| format!("{path}: {e}"))?;
        f.seek(SeekFrom::Start(offset))
            .map_err(|e| format!("{path}: {e}"))?;
        let mut buf = Vec::new();
        f.take(want)
            .read_to_end(&mut buf)
            .map_err(|e| format!("{path}: {e}"))?;
        self.budget.set(self.budget.get() - buf.len() as u64);
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_host_confines_and_reads_in_chunks() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a")).unwrap();
        std::fs::write(d.path().join("a/f"), vec![7u8; 600_000]).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("a/link")).unwrap();
        let h = DirHost::new(d.path());
        assert_eq!(read_to_end(&h, "a/f", 1 << 20).unwrap().len(), 600_000);
        assert!(read_to_end(&h, "a/f", 1000).is_err());
        for bad in ["../x", "/etc/passwd", "a/../a/f", "a//f", "a/link", ""] {
            assert!(h.read_file(bad, 0, 10).is_err(), "{bad} was read");
        }
        let entries = h.entries().unwrap();
        assert_eq!(
            entries.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(),
            ["a/f"]
        );
        let small = DirHost::with_budget(d.path(), 10);
        assert!(small.read_file("a/f", 0, 100).is_err());
    }
}
