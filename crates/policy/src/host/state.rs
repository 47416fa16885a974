//! Per-evaluation host state: the resource limiter and the two host functions a policy may call.
//! Host functions run outside fuel and epoch metering, so each one bounds its own work.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::bindings::jitship::policy::host::{Host, Level};
use super::bindings::jitship::policy::types;
use rustix::io::Errno;

use jitship_confined::Confined;
use jitship_generation::RelPath;
use jitship_policy_contract::truncate;

/// Returned by the limiter when a policy grows its memory past the cap. Travels through wasmtime
/// as the call's error, so the host can downcast it instead of parsing a trap message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("policy exceeded its memory limit: requested {requested} bytes, limit {limit} bytes")]
pub struct MemoryLimitExceeded {
    pub requested: u64,
    pub limit: u64,
}

/// Largest table a policy may grow (each element is a pointer on the host).
const MAX_TABLE_ELEMENTS: usize = 100_000;
/// A component holds several core instances; these caps keep a hostile one from multiplying.
const MAX_INSTANCES: usize = 16;
const MAX_TABLES: usize = 16;
const MAX_MEMORIES: usize = 4;

/// Longest log message kept (longer ones are truncated on a char boundary).
pub const MAX_LOG_MESSAGE: usize = 4096;
/// Log messages kept per evaluation; later ones are counted and dropped.
pub const MAX_LOG_MESSAGES: usize = 256;
/// Largest single `read-file` answer.
pub const MAX_READ_PER_CALL: u64 = 1 << 20;
/// `read-file` calls per evaluation: each costs a few syscalls that fuel does not see. The SDK's
/// `read_to_end` spends two on a small file (the bytes, then the empty answer that ends it), so
/// this lets a policy read every file of a 100,000-file cache; the byte budget and the deadline
/// still bound the work.
pub const MAX_READ_CALLS: u32 = 1_000_000;

pub(crate) struct Limiter {
    memory_cap: usize,
}

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_cap {
            return Err(wasmtime::Error::new(MemoryLimitExceeded {
                requested: desired as u64,
                limit: self.memory_cap as u64,
            }));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LogLine {
    pub level: &'static str,
    pub message: String,
}

pub(crate) struct HostState {
    pub(crate) limiter: Limiter,
    /// For log lines: which policy said it.
    policy: Arc<str>,
    /// The root `select` is considering; `None` in calls that have no root (reads are refused).
    root: Option<PathBuf>,
    read_left: u64,
    read_calls: u32,
    pub(crate) bytes_read: u64,
    pub(crate) logs: Vec<LogLine>,
    pub(crate) logs_dropped: u64,
}

impl HostState {
    pub(crate) fn new(
        policy: Arc<str>,
        memory_cap: usize,
        read_budget: u64,
        root: Option<PathBuf>,
    ) -> Self {
        Self {
            limiter: Limiter { memory_cap },
            policy,
            root,
            read_left: read_budget,
            read_calls: 0,
            bytes_read: 0,
            logs: Vec::new(),
            logs_dropped: 0,
        }
    }

    /// What the policy said last at error level: the SDK's panic hook sends the panic message there.
    pub(crate) fn last_error_log(&self) -> Option<&str> {
        self.logs
            .iter()
            .rev()
            .find(|l| l.level == "error")
            .map(|l| l.message.as_str())
    }

    fn read(&mut self, path: &str, offset: u64, max_bytes: u32) -> Result<Vec<u8>, String> {
        let Some(root) = self.root.clone() else {
            return Err(
                "read-file is only available during select (there is no root in this call)".into(),
            );
        };
        if self.read_calls >= MAX_READ_CALLS {
            return Err(format!(
                "refused: more than {MAX_READ_CALLS} read-file calls in one evaluation"
            ));
        }
        self.read_calls += 1;
        let rel = RelPath::parse(path)
            .map_err(|e| format!("refused: {e}; paths are relative to the root"))?;
        if self.read_left == 0 {
            return Err(
                "refused: the read budget for this evaluation is spent ([policy] read_budget)"
                    .into(),
            );
        }
        let want = u64::from(max_bytes)
            .min(MAX_READ_PER_CALL)
            .min(self.read_left);
        let file = open_beneath(&root, &rel).map_err(|e| format!("refused: {path}: {e}"))?;
        let mut buf = vec![0u8; want as usize];
        let mut filled = 0usize;
        // pread until the request is met or EOF: a short read is not the end of a regular file.
        while filled < buf.len() {
            match file.read_at(&mut buf[filled..], offset.saturating_add(filled as u64)) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("cannot read {path}: {e}")),
            }
        }
        buf.truncate(filled);
        self.read_left -= filled as u64;
        self.bytes_read += filled as u64;
        Ok(buf)
    }
}

/// Opens `rel` under `root` through `confined` (the one primitive for this), so neither a link in
/// the path nor one swapped in while it resolves can lead outside the root; only a regular file is
/// accepted (a FIFO or device could block or never end). The root itself is operator-configured
/// and may be a symlink: it is resolved once, here.
fn open_beneath(root: &Path, rel: &RelPath) -> std::io::Result<File> {
    let root = Confined::open(&std::fs::canonicalize(root)?)?;
    root.open_read(rel.as_str()).map_err(|e| {
        let escapes = [Errno::LOOP, Errno::NOTDIR, Errno::XDEV].map(|e| Some(e.raw_os_error()));
        if escapes.contains(&e.raw_os_error()) {
            std::io::Error::other("a component of the path is a symlink or not a directory")
        } else {
            e
        }
    })
}

fn level_name(level: Level) -> &'static str {
    match level {
        Level::Debug => "debug",
        Level::Info => "info",
        Level::Warn => "warn",
        Level::Error => "error",
    }
}

impl Host for HostState {
    fn log(&mut self, level: Level, message: String) {
        if self.logs.len() >= MAX_LOG_MESSAGES {
            self.logs_dropped += 1;
            return;
        }
        let message = truncate(message, MAX_LOG_MESSAGE);
        let policy = &*self.policy;
        match level {
            Level::Debug => tracing::debug!(policy, "{message}"),
            Level::Info => tracing::info!(policy, "{message}"),
            Level::Warn => tracing::warn!(policy, "{message}"),
            Level::Error => tracing::error!(policy, "{message}"),
        }
        self.logs.push(LogLine {
            level: level_name(level),
            message,
        });
    }

    fn read_file(&mut self, path: String, offset: u64, max_bytes: u32) -> Result<Vec<u8>, String> {
        self.read(&path, offset, max_bytes)
    }
}

impl types::Host for HostState {}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(root: &Path, budget: u64) -> HostState {
        HostState::new("t".into(), 1 << 20, budget, Some(root.to_path_buf()))
    }

    #[test]
    fn reads_stay_inside_the_root_and_within_budget() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("a")).unwrap();
        std::fs::write(root.join("a/f"), b"hello world").unwrap();
        std::fs::write(dir.path().join("secret"), b"secret").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), root.join("link")).unwrap();
        std::os::unix::fs::symlink(dir.path(), root.join("dirlink")).unwrap();

        let mut s = state(&root, 8);
        assert_eq!(s.read("a/f", 6, 100).unwrap(), b"world");
        assert_eq!(
            s.read("a/f", 0, 100).unwrap(),
            b"hel",
            "clamped to what is left of the budget"
        );
        assert!(s.read("a/f", 0, 1).unwrap_err().contains("budget"));

        let mut s = state(&root, 1 << 20);
        for bad in [
            "../secret",
            "/etc/passwd",
            "a/../../secret",
            "./a/f",
            "a//f",
            "",
        ] {
            let err = s.read(bad, 0, 10).unwrap_err();
            assert!(err.starts_with("refused"), "{bad}: {err}");
        }
        for link in ["link", "dirlink/secret"] {
            let err = s.read(link, 0, 10).unwrap_err();
            assert!(err.contains("symlink"), "{link}: {err}");
        }
        let err = s.read("a", 0, 10).unwrap_err();
        assert!(err.contains("not a regular file"), "{err}");
        assert_eq!(
            s.read("a/f", 100, 10).unwrap(),
            b"",
            "past the end is empty, not an error"
        );

        let mut s = HostState::new("t".into(), 1 << 20, 1 << 20, None);
        assert!(
            s.read("a/f", 0, 10)
                .unwrap_err()
                .contains("only available during select")
        );
    }

    #[test]
    fn logs_are_truncated_and_capped() {
        let mut s = HostState::new("t".into(), 1 << 20, 0, None);
        s.log(Level::Info, "é".repeat(MAX_LOG_MESSAGE));
        assert!(s.logs[0].message.len() <= MAX_LOG_MESSAGE);
        for _ in 0..MAX_LOG_MESSAGES + 10 {
            s.log(Level::Error, "x".into());
        }
        assert_eq!(s.logs.len(), MAX_LOG_MESSAGES);
        assert_eq!(s.logs_dropped, 11);
    }
}
