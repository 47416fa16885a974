//! File-system notifications for the cache roots, through `notify` (inotify on Linux).
//!
//! A root that exists is watched recursively. A root that does not exist yet (engines create their
//! caches late) is covered by a non-recursive watch on its nearest existing ancestor; whenever
//! something changes there, the watch set is recomputed, so the watch moves down the path as the
//! directories appear, and onto the root itself once it exists. Recomputing is a few `stat`s, so
//! it is done after every batch of events rather than by interpreting each event.
//!
//! The notify callback runs on notify's own thread. It only appends paths to a bounded inbox and
//! wakes the event loop: a burst of events costs one wake-up, and memory stays bounded (past
//! `INBOX_CAP` paths the inbox degrades to "every root changed").

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};

use super::metrics::ErrorKind;

const INBOX_CAP: usize = 4096;
const ERRORS_CAP: usize = 64;

/// What the notify thread hands to the event loop.
#[derive(Debug, Default)]
pub struct Drained {
    pub paths: Vec<PathBuf>,
    /// More events than the inbox holds: treat every root as changed.
    pub all_changed: bool,
    /// The kernel dropped events (inotify queue overflow): new directories may have gone
    /// unwatched, so watches are re-registered and every root is rescanned.
    pub overflowed: bool,
    /// Watch errors (e.g. the inotify watch limit); counted and logged by the loop.
    pub errors: Vec<WatchFault>,
}

/// How `FsWatches::sync` treats the watches it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resync {
    /// Registers what is missing; a registration that failed before is not tried again.
    Missing,
    /// Registers what is missing, retrying registrations that failed before (on start, and
    /// when the watcher retries after the watch limit).
    RetryFailed,
    /// Re-registers every watch (events were lost: an inotify queue overflow).
    Everything,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchFault {
    /// `WatchLimit` or `Watch`.
    pub kind: ErrorKind,
    pub message: String,
}

#[derive(Debug, Default)]
struct InboxState {
    drained: Drained,
}

/// Shared between notify's thread and the event loop.
#[derive(Debug, Default)]
pub struct Inbox {
    state: Mutex<InboxState>,
    wake: tokio::sync::Notify,
}

impl Inbox {
    fn push_event(&self, event: notify::Result<notify::Event>) {
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        let d = &mut st.drained;
        match event {
            Ok(ev) if ev.need_rescan() => d.overflowed = true,
            Ok(ev) if !relevant(&ev.kind) => return,
            Ok(ev) => {
                if d.all_changed {
                    // Already saturated: the paths would be ignored anyway.
                } else if d.paths.len() + ev.paths.len() > INBOX_CAP {
                    d.paths.clear();
                    d.all_changed = true;
                } else {
                    d.paths.extend(ev.paths);
                }
            }
            Err(e) => {
                if d.errors.len() < ERRORS_CAP {
                    d.errors.push(fault(&e));
                }
            }
        }
        drop(st);
        self.wake.notify_one();
    }

    /// Everything received since the last call.
    pub fn drain(&self) -> Drained {
        match self.state.lock() {
            Ok(mut st) => std::mem::take(&mut st.drained),
            // A panic on notify's thread while holding the lock: assume the worst.
            Err(_) => Drained {
                all_changed: true,
                overflowed: true,
                ..Drained::default()
            },
        }
    }

    /// Resolves when something arrived (a wake-up sent while nobody waited is kept).
    pub async fn notified(&self) {
        self.wake.notified().await;
    }
}

/// Our own reads (publish opens every file it hashes; scans open directories) raise inotify
/// OPEN and CLOSE_NOWRITE events; counting them as changes would make every cycle trigger the
/// next. A close after writing is a real change.
fn relevant(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

fn fault(e: &notify::Error) -> WatchFault {
    match e.kind {
        notify::ErrorKind::MaxFilesWatch => WatchFault {
            kind: ErrorKind::WatchLimit,
            message: format!(
                "inotify watch limit reached ({e}); changes under some directories are only seen \
                 by the periodic rescan: raise fs.inotify.max_user_watches or lower --rescan-interval"
            ),
        },
        _ => WatchFault {
            kind: ErrorKind::Watch,
            message: format!("file watch error: {e}"),
        },
    }
}

/// The path to watch for `root`, and how.
pub fn desired_watch(root: &Path) -> Option<(PathBuf, RecursiveMode)> {
    if root.is_dir() {
        return Some((root.to_path_buf(), RecursiveMode::Recursive));
    }
    // A file where the root should be, or nothing yet: watch the nearest existing directory.
    root.ancestors()
        .skip(1)
        .find(|a| a.is_dir())
        .map(|a| (a.to_path_buf(), RecursiveMode::NonRecursive))
}

/// The watches covering `roots`: a path inside a recursively watched one needs no watch of its own
/// (a second registration would share, and on removal destroy, the same inotify descriptor).
pub fn plan_watches(roots: &[PathBuf]) -> BTreeMap<PathBuf, RecursiveMode> {
    let mut wanted: BTreeMap<PathBuf, RecursiveMode> = BTreeMap::new();
    for (path, mode) in roots.iter().filter_map(|r| desired_watch(r)) {
        let e = wanted.entry(path).or_insert(mode);
        if mode == RecursiveMode::Recursive {
            *e = RecursiveMode::Recursive;
        }
    }
    let recursive: Vec<PathBuf> = wanted
        .iter()
        .filter(|(_, m)| **m == RecursiveMode::Recursive)
        .map(|(p, _)| p.clone())
        .collect();
    wanted.retain(|p, _| !recursive.iter().any(|r| p != r && p.starts_with(r)));
    wanted
}

/// The notify watcher and the watches registered with it.
pub struct FsWatch {
    watcher: Option<notify::RecommendedWatcher>,
    inbox: Arc<Inbox>,
    active: BTreeMap<PathBuf, RecursiveMode>,
    /// Paths whose registration failed; retried at the next rescan, not on every event (a
    /// recursive registration walks the whole tree).
    failed: BTreeSet<PathBuf>,
}

impl FsWatch {
    /// Without a working notify backend (or with `enabled` false) the watcher still works, on
    /// rescans alone.
    pub fn new(enabled: bool) -> (Self, Option<WatchFault>) {
        let inbox = Arc::new(Inbox::default());
        let sink = inbox.clone();
        let created = if enabled {
            notify::recommended_watcher(move |ev| sink.push_event(ev))
        } else {
            Err(notify::Error::generic("disabled by configuration"))
        };
        let (watcher, fault) = match created {
            Ok(w) => (Some(w), None),
            Err(e) => (
                None,
                Some(WatchFault {
                    kind: ErrorKind::Watch,
                    message: format!(
                        "file notifications unavailable ({e}); relying on the periodic rescan"
                    ),
                }),
            ),
        };
        (
            Self {
                watcher,
                inbox,
                active: BTreeMap::new(),
                failed: BTreeSet::new(),
            },
            fault,
        )
    }

    pub fn inbox(&self) -> Arc<Inbox> {
        self.inbox.clone()
    }

    pub fn is_active(&self, path: &Path) -> Option<RecursiveMode> {
        self.active.get(path).copied()
    }

    /// Brings the registered watches in line with `roots`, as `how` says.
    pub fn sync(&mut self, roots: &[PathBuf], how: Resync) -> Vec<WatchFault> {
        let mut faults = Vec::new();
        if self.watcher.is_none() {
            return faults;
        }
        if how == Resync::RetryFailed {
            self.failed.clear();
        }
        let mut force = how == Resync::Everything;
        // A directory created between planning and adding the watch on its parent raised its
        // event on no watch, and nothing else would move the watch down until the rescan: plan
        // again until the plan holds. Each round moves a watch down a path that exists now, so
        // the bound is only against directories that keep appearing and vanishing.
        let mut wanted = plan_watches(roots);
        for _ in 0..64 {
            self.apply(&wanted, force, &mut faults);
            force = false;
            let now = plan_watches(roots);
            if now == wanted {
                break;
            }
            wanted = now;
        }
        faults
    }

    /// Makes the active watches `wanted`: removes the others (all of them when `force`), adds the
    /// missing ones, and records a watch that fails in `faults` (retried by `RetryFailed`).
    fn apply(
        &mut self,
        wanted: &BTreeMap<PathBuf, RecursiveMode>,
        force: bool,
        faults: &mut Vec<WatchFault>,
    ) {
        let Some(watcher) = self.watcher.as_mut() else {
            return;
        };
        let stale: Vec<PathBuf> = self
            .active
            .iter()
            .filter(|(p, m)| force || wanted.get(*p) != Some(*m))
            .map(|(p, _)| p.clone())
            .collect();
        for path in stale {
            self.active.remove(&path);
            // The directory may be gone already, taking its watch with it.
            let _ = watcher.unwatch(&path);
        }
        for (path, &mode) in wanted {
            if self.active.contains_key(path) || self.failed.contains(path) {
                continue;
            }
            match watcher.watch(path, mode) {
                Ok(()) => {
                    tracing::debug!(path = %path.display(), ?mode, "watching");
                    self.active.insert(path.clone(), mode);
                }
                Err(e) => {
                    let mut f = fault(&e);
                    f.message = format!("{}: {}", path.display(), f.message);
                    faults.push(f);
                    self.failed.insert(path.clone());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_root_is_watched_through_its_nearest_ancestor() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("a/b/cache");
        assert_eq!(
            desired_watch(&root),
            Some((dir.path().to_path_buf(), RecursiveMode::NonRecursive))
        );
        std::fs::create_dir_all(dir.path().join("a")).unwrap();
        assert_eq!(
            desired_watch(&root),
            Some((dir.path().join("a"), RecursiveMode::NonRecursive))
        );
        std::fs::create_dir_all(&root).unwrap();
        assert_eq!(
            desired_watch(&root),
            Some((root.clone(), RecursiveMode::Recursive))
        );
    }

    #[test]
    fn nested_watches_are_covered_by_the_recursive_one() {
        let dir = tempfile::tempdir().unwrap();
        let outer = dir.path().join("vllm");
        let inner = outer.join("torch_compile_cache/inductor");
        std::fs::create_dir_all(&inner).unwrap();
        let missing = outer.join("deep_gemm");
        let other = dir.path().join("other/missing");
        let plan = plan_watches(&[inner, outer.clone(), missing, other]);
        assert_eq!(
            plan.into_iter().collect::<Vec<_>>(),
            vec![
                (dir.path().to_path_buf(), RecursiveMode::NonRecursive),
                (outer, RecursiveMode::Recursive),
            ]
        );
    }

    #[test]
    fn own_reads_are_not_changes() {
        assert!(!relevant(&EventKind::Access(AccessKind::Open(
            notify::event::AccessMode::Any
        ))));
        assert!(!relevant(&EventKind::Access(AccessKind::Close(
            AccessMode::Read
        ))));
        assert!(relevant(&EventKind::Access(AccessKind::Close(
            AccessMode::Write
        ))));
        assert!(relevant(&EventKind::Create(
            notify::event::CreateKind::File
        )));
    }

    #[test]
    fn the_inbox_is_bounded() {
        let inbox = Inbox::default();
        for i in 0..(INBOX_CAP + 10) {
            inbox.push_event(Ok(notify::Event::new(EventKind::Create(
                notify::event::CreateKind::File,
            ))
            .add_path(PathBuf::from(format!("/x/{i}")))));
        }
        let d = inbox.drain();
        assert!(d.all_changed && d.paths.is_empty());
        assert!(!inbox.drain().all_changed);
    }
}
