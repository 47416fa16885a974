//! Writing fetched packs into staging: batches of packs to fetch, the files they hold written
//! and verified in parallel, canonical files materialized for this root, final modes and times.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, FileTimes};
use std::io::Write;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::time::{Duration, UNIX_EPOCH};

use rayon::prelude::*;

use crate::catalog::KeyLayout;
use crate::confined::{self, Confined};
use crate::generation::{
    ContentHash, ContentHasher, FileRecord, Manifest, PackSlice, hash_open_file, slices_by_pack,
};
use crate::policy::CachePolicy;
use crate::store::{Fetched, Store, StoreResult};

use super::beside::{
    beside_staging_name, inside_staging_name, is_beside_staging_of, is_inside_staging,
    make_staging, remove_stale,
};
use super::gate::Cutoff;
use super::io;
use super::report::{InstallError, Progress};
use super::target::Target;

/// What to write: a file of the manifest and where it goes in staging (relative to the staging
/// directory's descriptor).
pub(super) struct Pending<'m> {
    pub(super) record: &'m FileRecord,
    pub(super) staged: String,
}

impl<'m> Pending<'m> {
    /// Every file of `todo`, staged under `STAGED_TREE` at its path in the root.
    pub(super) fn all(todo: &[&'m FileRecord]) -> Vec<Self> {
        todo.iter()
            .map(|r| Pending {
                record: r,
                staged: format!("{STAGED_TREE}/{}", r.path),
            })
            .collect()
    }
}

/// A fresh staging directory on the root's filesystem, open: beside the root, or inside it
/// when it is a mount point of its own (`beside`). Leftovers of crashed installs of this root
/// (we hold its lock, so nobody else is using them), and only of this root, are removed first.
pub(super) fn staging_dir(target: &Target) -> Result<(PathBuf, Confined), InstallError> {
    let name = target.name.as_str();
    remove_stale(&target.parent, |e| is_beside_staging_of(e, name));
    match &target.dir {
        Some(dir) => {
            let root = target.path();
            let (root_dev, _, _) = dir.stat().map_err(io("stat", &root))?;
            let (parent_dev, _, _) = target
                .parent
                .stat()
                .map_err(io("stat", target.parent.path()))?;
            if root_dev == parent_dev {
                make_staging(&target.parent, || beside_staging_name(name))
            } else {
                remove_stale(dir, is_inside_staging);
                make_staging(dir, inside_staging_name)
            }
        }
        None => make_staging(&target.parent, || beside_staging_name(name)),
    }
}

/// The fetch-and-stage phase: where packs come from, and how a verified file becomes this root's.
pub(super) struct Stager<'a> {
    pub(super) store: Arc<dyn Store>,
    pub(super) layout: &'a KeyLayout,
    pub(super) materializer: &'a Materializer,
    pub(super) cutoff: &'a Cutoff,
}

/// A batch of packs fetched in one call: (index into the packs needed, what the store answered).
type FetchedBatch = Vec<(usize, StoreResult<Option<Fetched>>)>;

impl Stager<'_> {
    /// Streams the needed packs and writes every file into staging, verifying its blake3 before
    /// it counts as written. Packs are fetched in batches of at most the largest pack's bytes
    /// (one `get_sized_batch` each) while the previous batch is written, so
    /// fetching overlaps hashing and writing and at most two batches are held at once; the files
    /// of a pack are written in parallel. A file is open only while a piece of it is written, so
    /// the number of descriptors stays bounded whatever the number of files.
    pub(super) fn write_staging(
        &self,
        manifest: &Manifest,
        pending: &[Pending],
        staging: &Confined,
        progress: &mut Progress,
    ) -> Result<(), InstallError> {
        let mut writer = StagingWriter::new(staging, self.materializer)?;
        for p in pending.iter().filter(|p| p.record.chunks.is_empty()) {
            writer.write_whole(p, &[])?;
        }
        // Which pending files need which pack, in pack order.
        let by_pack = slices_by_pack(pending.iter().map(|p| p.record));
        let packs: Vec<u32> = by_pack.keys().copied().collect();
        for batch in self.fetch_in_background(manifest, &packs) {
            for (i, received) in batch {
                self.cutoff.check()?;
                let pack = &manifest.packs[packs[i] as usize];
                let bytes = received?.ok_or(InstallError::PackVanished(pack.id))?;
                if bytes.len() as u64 != pack.size {
                    return Err(InstallError::PackSize {
                        id: pack.id,
                        expected: pack.size,
                        actual: bytes.len(),
                    });
                }
                progress.packs_fetched += 1;
                progress.bytes_fetched += bytes.len() as u64;
                writer.write_pack(pending, &by_pack[&packs[i]], &bytes)?;
            }
        }
        progress.files_materialized = std::mem::take(&mut writer.materialized);
        if let Some(fi) = writer.unfinished.keys().next() {
            // Cannot happen for a validated manifest whose packs all arrived; refuse rather than trust.
            return Err(InstallError::Corrupt {
                path: pending[*fi].record.path.to_string(),
                expected: pending[*fi].record.blake3,
                actual: ContentHash::of(b""),
            });
        }
        Ok(())
    }

    /// Fetches `packs` (indices into the manifest's) on a thread of its own, a batch at a time,
    /// handing each over only when the caller takes it (a rendezvous channel): one batch is
    /// written while the next is fetched, never more. A batch holds at most the bytes of the
    /// largest pack: small packs (a tree's tail, a small tree) share one call, and memory stays
    /// at two packs' worth, as with one pack in flight.
    fn fetch_in_background(
        &self,
        manifest: &Manifest,
        packs: &[u32],
    ) -> mpsc::IntoIter<FetchedBatch> {
        let store = self.store.clone();
        let layout = self.layout.clone();
        let largest = packs
            .iter()
            .map(|&i| manifest.packs[i as usize].size)
            .max()
            .unwrap_or(0);
        let batches = fetch_batches(
            packs.iter().map(|&i| {
                let p = &manifest.packs[i as usize];
                (p.id, p.size)
            }),
            largest.min(store.max_value_size()),
        );
        let (tx, rx) = mpsc::sync_channel::<FetchedBatch>(0);
        let gate = self.cutoff.gate.clone();
        let seed = random_seed();
        std::thread::spawn(move || {
            for batch in batches {
                if gate.cancelled() {
                    return;
                }
                let picks: Vec<u32> = batch
                    .iter()
                    .map(|(_, id, _)| pick_copy(seed, id, layout.pack_replicas()))
                    .collect();
                let keys: Vec<(String, u64)> = batch
                    .iter()
                    .zip(&picks)
                    .map(|((_, id, size), &k)| (layout.pack_copy(id, k), *size))
                    .collect();
                let items: Vec<(&str, u64)> = keys.iter().map(|(k, n)| (k.as_str(), *n)).collect();
                let fetched = store.get_sized_batch(&items);
                let fetched = fetched.into_iter().zip(batch.iter().zip(&picks)).map(
                    |(got, ((_, id, size), &k))| other_copies(&*store, &layout, id, *size, k, got),
                );
                let batch = batch.iter().map(|&(i, _, _)| i).zip(fetched).collect();
                if tx.send(batch).is_err() {
                    return;
                }
            }
        });
        rx.into_iter()
    }
}

/// Random bits for this install's choice of pack copies, so a fleet's installs spread over them.
fn random_seed() -> u64 {
    let mut b = [0u8; 8];
    // Without randomness every install reads the copy the pack id picks: still spread over packs.
    let _ = getrandom::fill(&mut b);
    u64::from_le_bytes(b)
}

/// Which of a pack's `copies` this install reads first (0: the primary; see `KeyLayout`).
fn pick_copy(seed: u64, id: &ContentHash, copies: u32) -> u32 {
    if copies <= 1 {
        return 0;
    }
    let mut x = seed ^ u64::from_le_bytes(id.0[..8].try_into().expect("8 bytes"));
    // splitmix64's finalizer: seeds that differ in a bit pick independently.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((x ^ (x >> 31)) % u64::from(copies)) as u32
}

/// What to use for a pack whose copy `picked` answered `got`: that, unless it is missing, short
/// or an error; then the primary and the other replicas in turn (a replica is a second source,
/// written best effort, and any copy may be evicted). Bytes are verified against the manifest
/// after, whichever copy they came from. If every copy fails, the primary's answer stands.
fn other_copies(
    store: &dyn Store,
    layout: &KeyLayout,
    id: &ContentHash,
    size: u64,
    picked: u32,
    got: StoreResult<Option<Fetched>>,
) -> StoreResult<Option<Fetched>> {
    let usable =
        |r: &StoreResult<Option<Fetched>>| matches!(r, Ok(Some(b)) if b.len() as u64 == size);
    let copies = layout.pack_replicas();
    if copies <= 1 || usable(&got) {
        return got;
    }
    let mut primary = (picked == 0).then_some(got);
    for k in (0..copies).filter(|&k| k != picked) {
        let r = store
            .get_sized_batch(&[(&layout.pack_copy(id, k), size)])
            .pop()
            .unwrap_or(Ok(None));
        if usable(&r) {
            return r;
        }
        if k == 0 {
            primary = Some(r);
        }
    }
    primary.unwrap_or(Ok(None))
}

/// Splits packs `(id, size)` (numbered in the order given) into consecutive batches of at most
/// `budget` bytes each (a larger pack is a batch of its own).
pub(super) fn fetch_batches(
    packs: impl Iterator<Item = (ContentHash, u64)>,
    budget: u64,
) -> Vec<Vec<(usize, ContentHash, u64)>> {
    let mut batches: Vec<Vec<(usize, ContentHash, u64)>> = Vec::new();
    let mut bytes = 0;
    for (i, (id, size)) in packs.enumerate() {
        match batches.last_mut() {
            Some(last) if bytes + size <= budget => last.push((i, id, size)),
            _ => {
                batches.push(vec![(i, id, size)]);
                bytes = 0;
            }
        }
        bytes += size;
    }
    batches
}

/// The directory inside staging that holds the files, laid out as in the root (so a root that
/// does not exist yet receives it in one rename).
pub(super) const STAGED_TREE: &str = "tree";

/// Largest file on disk compared in canonical form (files that embed the root are small metadata,
/// as at publish); a larger one at such a path is not the installed file.
pub(super) const CANONICAL_COMPARE_LIMIT: u64 = 16 << 20;

/// Turns the root-independent form of a file that embeds the root back into the file for this
/// root (`CachePolicy::materialize`), and the other way for comparing a copy on disk. `root` is
/// the root as configured (the path the engine names its files by), as at publish.
pub(super) struct Materializer {
    pub(super) policy: Arc<dyn CachePolicy>,
    pub(super) root: PathBuf,
}

impl Materializer {
    /// The bytes to write for `record` given its verified stored bytes: as stored, or for a file
    /// stored canonical, materialized by the policy. Either way a Triton group file must name
    /// children inside this root only (`check_group`): the manifest's `canonical` flag is the
    /// store's word, and a store can hold any manifest.
    pub(super) fn for_root<'b>(
        &self,
        record: &FileRecord,
        verified: &'b [u8],
    ) -> Result<std::borrow::Cow<'b, [u8]>, InstallError> {
        let bytes: std::borrow::Cow<'b, [u8]> = if record.canonical {
            self.policy
                .materialize(&self.root, &record.path, verified)
                .map_err(|source| InstallError::Materialize {
                    path: record.path.to_string(),
                    source,
                })?
                .into()
        } else {
            verified.into()
        };
        self.check_group(record, &bytes)?;
        Ok(bytes)
    }

    /// Refuses a Triton group file (`__grp__*.json`, in every policy that relocates them: all but
    /// the native rules, whose files are opaque bytes and never relocated) unless its bytes are a
    /// JSON object whose `child_paths`, if present, are all absolute normalized paths inside this
    /// root: Triton opens the files a group names wherever they are.
    fn check_group(&self, record: &FileRecord, bytes: &[u8]) -> Result<(), InstallError> {
        let (_, name) = confined::split(record.path.as_str());
        if !(name.starts_with("__grp__") && name.ends_with(".json"))
            || self.policy.policy_ref().digest == "native"
        {
            return Ok(());
        }
        let refuse = |child: &str| InstallError::GroupOutsideRoot {
            path: record.path.to_string(),
            child: child.to_owned(),
            root: self.root.clone(),
        };
        let root = std::path::absolute(&self.root).unwrap_or_else(|_| self.root.clone());
        let root = root.to_string_lossy();
        let prefix = format!("{}/", root.trim_end_matches('/'));
        let group: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|_| refuse("(not JSON: cannot tell what it names)"))?;
        let Some(object) = group.as_object() else {
            return Err(refuse("(not a JSON object: cannot tell what it names)"));
        };
        let Some(children) = object.get("child_paths") else {
            return Ok(());
        };
        let Some(children) = children.as_object() else {
            return Err(refuse("(child_paths is not an object)"));
        };
        for child in children.values() {
            let Some(path) = child.as_str() else {
                return Err(refuse(&child.to_string()));
            };
            let inside = path.strip_prefix(&prefix).is_some_and(|rel| {
                !rel.is_empty()
                    && rel
                        .split('/')
                        .all(|c| !c.is_empty() && c != "." && c != "..")
            });
            if !inside {
                return Err(refuse(path));
            }
        }
        Ok(())
    }

    /// Whether `file` (the copy on disk of `record`, read through the root's descriptor) is
    /// `record` as materialized for this root: its canonical form hashes to the record's (a file
    /// the policy cannot canonicalize, e.g. one naming another root, is not).
    pub(super) fn on_disk_matches(
        &self,
        record: &FileRecord,
        mut file: File,
        shown: &Path,
    ) -> Result<bool, InstallError> {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut bytes).map_err(io("read", shown))?;
        Ok(self
            .policy
            .canonicalize(&self.root, &record.path, &bytes)
            .is_ok_and(|c| ContentHash::of(&c) == record.blake3))
    }
}

/// Writes staged files: a single-piece file (nearly all of them) is checked in memory and written
/// in one go; a file spread over several packs is written piece by piece and checked once the
/// last piece is in. Everything goes through the staging directory's descriptor. A file stored
/// canonical is verified as stored, then written as materialized for this root.
pub(super) struct StagingWriter<'s> {
    pub(super) staging: &'s Confined,
    pub(super) created_dirs: HashSet<String>,
    pub(super) unfinished: HashMap<usize, Unfinished>,
    pub(super) materializer: &'s Materializer,
    pub(super) materialized: Vec<String>,
}

pub(super) struct Unfinished {
    pub(super) hasher: ContentHasher,
    pub(super) hashed: u64,
    pub(super) written: u64,
    pub(super) in_order: bool,
}

impl<'s> StagingWriter<'s> {
    pub(super) fn new(
        staging: &'s Confined,
        materializer: &'s Materializer,
    ) -> Result<Self, InstallError> {
        staging
            .mkdir(STAGED_TREE, DIR_MODE)
            .map_err(io("create", &staging.display(STAGED_TREE)))?;
        Ok(Self {
            staging,
            created_dirs: HashSet::from([STAGED_TREE.to_owned()]),
            unfinished: HashMap::new(),
            materializer,
            materialized: Vec::new(),
        })
    }

    pub(super) fn ensure_parent(&mut self, staged: &str) -> Result<(), InstallError> {
        match staged.rsplit_once('/') {
            Some((dir, _)) => self.ensure_dir(dir),
            None => Ok(()),
        }
    }

    /// Creates `dir` and its missing parents, one `mkdirat` each: staging is this install's own
    /// fresh directory, so a directory not yet created here does not exist (and if something
    /// else put one there, the install fails rather than write into it).
    pub(super) fn ensure_dir(&mut self, dir: &str) -> Result<(), InstallError> {
        if self.created_dirs.contains(dir) {
            return Ok(());
        }
        if let Some((parent, _)) = dir.rsplit_once('/') {
            self.ensure_dir(parent)?;
        }
        self.staging
            .mkdir(dir, DIR_MODE)
            .map_err(io("create", &self.staging.display(dir)))?;
        self.created_dirs.insert(dir.to_owned());
        Ok(())
    }

    /// Writes the pieces a pack holds: the parents first (created once), then the files held
    /// whole by this pack in parallel (hash, create, write: per-file system calls dominate a tree
    /// of small files), then the pieces of files split over packs, in order.
    pub(super) fn write_pack(
        &mut self,
        pending: &[Pending],
        pieces: &[PackSlice],
        pack: &[u8],
    ) -> Result<(), InstallError> {
        for piece in pieces {
            self.ensure_parent(&pending[piece.file].staged)?;
        }
        let (whole, split): (Vec<&PackSlice>, Vec<&PackSlice>) = pieces
            .iter()
            .partition(|piece| pending[piece.file].record.chunks.len() == 1);
        let this = &*self;
        let materialized = whole
            .par_iter()
            .with_min_len(8)
            .map(|piece| this.stage_whole(&pending[piece.file], piece.of(pack)))
            .collect::<Result<Vec<bool>, InstallError>>()?;
        for (piece, materialized) in whole.iter().zip(materialized) {
            if materialized {
                let path = pending[piece.file].record.path.to_string();
                self.materialized.push(path);
            }
        }
        for piece in split {
            let p = &pending[piece.file];
            self.write_piece(piece.file, p, piece.file_offset, piece.of(pack))?;
        }
        Ok(())
    }

    /// Writes a file held whole in `bytes` (checked against its blake3 first).
    pub(super) fn write_whole(&mut self, p: &Pending, bytes: &[u8]) -> Result<(), InstallError> {
        self.ensure_parent(&p.staged)?;
        if self.stage_whole(p, bytes)? {
            self.materialized.push(p.record.path.to_string());
        }
        Ok(())
    }

    /// Verifies and stages one whole file whose parent exists; true if it was materialized for
    /// this root.
    pub(super) fn stage_whole(&self, p: &Pending, bytes: &[u8]) -> Result<bool, InstallError> {
        let actual = ContentHash::of(bytes);
        if actual != p.record.blake3 {
            return Err(InstallError::Corrupt {
                path: p.record.path.to_string(),
                expected: p.record.blake3,
                actual,
            });
        }
        self.stage_verified(p, bytes)?;
        Ok(p.record.canonical)
    }

    pub(super) fn write_piece(
        &mut self,
        fi: usize,
        p: &Pending,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), InstallError> {
        self.ensure_parent(&p.staged)?;
        let shown = self.staging.display(&p.staged);
        let file = self
            .staging
            .open_write(&p.staged, 0o600)
            .map_err(io("create", &shown))?;
        file.write_all_at(bytes, offset)
            .map_err(io("write", &shown))?;
        let state = self.unfinished.entry(fi).or_insert_with(|| Unfinished {
            hasher: ContentHasher::new(),
            hashed: 0,
            written: 0,
            in_order: true,
        });
        if state.in_order && state.hashed == offset {
            state.hasher.update(bytes);
            state.hashed += bytes.len() as u64;
        } else {
            state.in_order = false;
        }
        state.written += bytes.len() as u64;
        if state.written < p.record.size {
            return Ok(());
        }
        let state = self.unfinished.remove(&fi).expect("present");
        let actual = if state.in_order {
            state.hasher.finish()
        } else {
            let mut f = self
                .staging
                .open_read(&p.staged)
                .map_err(io("read", &shown))?;
            hash_open_file(&mut f).map_err(io("read", &shown))?.0
        };
        if actual != p.record.blake3 {
            return Err(InstallError::Corrupt {
                path: p.record.path.to_string(),
                expected: p.record.blake3,
                actual,
            });
        }
        if p.record.canonical {
            // Verified as stored; now the same file rewritten for this root.
            drop(file);
            let mut verified = Vec::new();
            let mut f = self
                .staging
                .open_read(&p.staged)
                .map_err(io("read", &shown))?;
            std::io::Read::read_to_end(&mut f, &mut verified).map_err(io("read", &shown))?;
            drop(f);
            self.staging
                .remove_file(&p.staged)
                .map_err(io("remove", &shown))?;
            self.stage_verified(p, &verified)?;
            self.materialized.push(p.record.path.to_string());
            return Ok(());
        }
        finish_file(&file, p, &shown)
    }

    /// Writes a verified file into staging: the point where a stored file becomes the file for
    /// this root.
    pub(super) fn stage_verified(&self, p: &Pending, verified: &[u8]) -> Result<(), InstallError> {
        let bytes = self.materializer.for_root(p.record, verified)?;
        let shown = self.staging.display(&p.staged);
        // Created with its final mode (`install_mode`), which the kernel's own umask leaves as it
        // is: no fchmod per file. Staging is private until the commit anyway.
        let mut file = self
            .staging
            .create_new(&p.staged, install_mode(p.record.mode))
            .map_err(io("create", &shown))?;
        file.write_all(&bytes).map_err(io("write", &shown))?;
        set_times(&file, p, &shown)
    }
}

/// Gives a verified staged file its mode (`install_mode`) and the manifest's times.
pub(super) fn finish_file(file: &File, p: &Pending, shown: &Path) -> Result<(), InstallError> {
    set_times(file, p, shown)?;
    set_mode(file, p, shown)
}

pub(super) fn set_times(file: &File, p: &Pending, shown: &Path) -> Result<(), InstallError> {
    let mtime = UNIX_EPOCH
        + Duration::new(
            p.record.mtime_s.max(0) as u64,
            p.record.mtime_ns.min(999_999_999),
        );
    file.set_times(FileTimes::new().set_modified(mtime).set_accessed(mtime))
        .map_err(io("set times on", shown))
}

pub(super) fn set_mode(file: &File, p: &Pending, shown: &Path) -> Result<(), InstallError> {
    file.set_permissions(fs::Permissions::from_mode(install_mode(p.record.mode)))
        .map_err(io("chmod", shown))
}

/// The mode of every directory an install creates (the kernel takes the umask off as well):
/// never group or other write, like files (`install_mode`).
pub(super) const DIR_MODE: u32 = 0o755;

/// The mode an installed file gets: the published permission bits, less what the process's
/// umask takes away, and never group or other write (a store anyone can write to must not make a
/// consumer's cache writable by others). Where the umask cannot be read, 022 is assumed (files
/// created with this mode still get the real umask from the kernel).
pub(super) fn install_mode(published: u32) -> u32 {
    published & 0o777 & !(umask().unwrap_or(0o022) | 0o022)
}

/// The process's umask, read once from `/proc/self/status` (`umask(2)` can only be read by
/// setting it, which races with other threads creating files); `None` where it cannot be read.
pub(super) fn umask() -> Option<u32> {
    static UMASK: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *UMASK.get_or_init(|| {
        let status = fs::read_to_string("/proc/self/status").ok()?;
        let value = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
        u32::from_str_radix(value.trim(), 8).ok()
    })
}
