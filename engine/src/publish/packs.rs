//! Uploading the planned packs the store lacks: filling each in place in the store's put buffer
//! (`fill_pack`), two at a time, from contents kept since hashing or read again. A pack the store
//! already has is read back and checked before it is used (deduplication cannot be poisoned by a
//! value planted under a predictable pack key; see `crate::generation` pack planning).

use std::collections::HashMap;
use std::io::Read;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::catalog::KeyLayout;
use crate::generation::{ContentHash, PackPlan, Piece};
use crate::scan::ScannedFile;
use crate::store::{Store, StoreError, ValueClass};

use super::hashing::{LastDir, RootReader, Stored, canonical_bytes};
use super::{PublishError, PublishReport};

/// Uploads the packs the store lacks and checks the ones it has. Two workers each take a pack:
/// one the store lacks is filled in place (in a Mooncake staging buffer: `Store::put_filled`) and
/// put, so one reads files while the other uploads: at most two pack buffers exist at once,
/// whatever the tree size. One the store has is read back (capped to its size) and checked
/// against this publisher's contents before the generation may reference it (`place_pack`): a
/// pack id is predictable from the files, so anyone could have put garbage there first. A plan
/// whose key held something else gets the salted id its copy went under (`plans` is updated).
pub(super) fn upload_packs(
    store: &dyn Store,
    layout: &KeyLayout,
    reader: &RootReader,
    plans: &mut [PackPlan],
    source_of: &HashMap<ContentHash, (&ScannedFile, Stored)>,
    report: &mut PublishReport,
) -> Result<(), PublishError> {
    let interrupt = reader.interrupt;
    let keys: Vec<String> = plans.iter().map(|p| layout.pack(&p.id)).collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let present = store
        .exists_batch(&key_refs)
        .into_iter()
        .collect::<Result<Vec<bool>, _>>()?;
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let shared: &[PackPlan] = plans;
    let work = || -> Result<Vec<(usize, Placed)>, PublishError> {
        let mut placed = Vec::new();
        while !failed.load(Ordering::Relaxed) {
            if let Some(signal) = interrupt.signal_name() {
                return Err(PublishError::Interrupted(signal));
            }
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(plan) = shared.get(i) else {
                break;
            };
            let place = Placing {
                store,
                layout,
                reader,
                source_of,
            };
            placed.push((i, place.pack(plan, present[i])?));
        }
        Ok(placed)
    };
    let worker = || {
        let r = work();
        if r.is_err() {
            failed.store(true, Ordering::Relaxed);
        }
        r
    };
    let results = std::thread::scope(|scope| {
        let other = scope.spawn(worker);
        let mine = worker();
        [mine, other.join().expect("pack upload worker panicked")]
    });
    for r in results {
        for (i, placed) in r? {
            let plan = &mut plans[i];
            plan.id = placed.id;
            if placed.uploaded {
                report.packs_uploaded += 1;
                report.bytes_uploaded += plan.size;
            } else {
                report.packs_reused += 1;
                report.bytes_deduplicated += plan.size;
            }
        }
    }
    Ok(())
}

/// Salts tried, in order, after the plain id held bytes that are not the pack's, before a random
/// one: honest publishers that met the same planted key move to the same next key and still
/// share one copy; an attacker who plants all of these too only costs them the sharing.
const SHARED_SALTS: [&[u8]; 2] = [b"1", b"2"];

/// Where a pack ended up: its id (salted if the plain key was taken by other bytes) and whether
/// this publish uploaded it.
struct Placed {
    id: ContentHash,
    uploaded: bool,
}

struct Placing<'a, 's> {
    store: &'a dyn Store,
    layout: &'a KeyLayout,
    reader: &'a RootReader<'a>,
    source_of: &'a HashMap<ContentHash, (&'s ScannedFile, Stored)>,
}

impl Placing<'_, '_> {
    /// Puts `plan` under its id, or reuses the value there once it checked to be this pack; a
    /// value that is not moves the pack to the next salted id, then to a random one.
    fn pack(&self, plan: &PackPlan, mut present: bool) -> Result<Placed, PublishError> {
        let mut id = plan.id;
        for attempt in 0..=SHARED_SALTS.len() + 1 {
            let key = self.layout.pack(&id);
            if present {
                match self.check_stored(&key, plan)? {
                    Checked::Same(bytes) => {
                        self.replicate(&id, &bytes);
                        return Ok(Placed {
                            id,
                            uploaded: false,
                        });
                    }
                    Checked::Gone => {}
                    Checked::Other(why) => {
                        tracing::warn!(
                            key,
                            "the store already holds a value under this pack's key that is not \
                             this pack ({why}): not using it; putting this pack under a salted key"
                        );
                        id = match SHARED_SALTS.get(attempt) {
                            Some(salt) => plan.salted_id(salt),
                            None => plan.salted_id(&random_salt()?),
                        };
                        present = self.store.exists(&self.layout.pack(&id))?;
                        continue;
                    }
                }
            }
            self.upload(&id, plan)?;
            return Ok(Placed { id, uploaded: true });
        }
        // Only reached if a random key held foreign bytes: nobody could have planted it.
        Err(PublishError::Store(StoreError::Other(format!(
            "every key tried for pack {} holds other bytes (the last a random one): the store \
             does not keep what is put; check it",
            plan.id
        ))))
    }

    /// Puts the pack under its key, and under its replicas' keys where `pack_replicas` asks for
    /// them: filled once into memory then (one pack per worker, as `check_stored` holds), in
    /// place in the store's put buffer otherwise.
    fn upload(&self, id: &ContentHash, plan: &PackPlan) -> Result<(), PublishError> {
        let key = self.layout.pack(id);
        if self.layout.pack_replicas() > 1 {
            let mut bytes = vec![0u8; plan.size as usize];
            fill_pack(self.reader, &plan.pieces, self.source_of, &mut bytes)?;
            self.store.put_copy(&key, &bytes, ValueClass::Bulk, 0)?;
            self.replicate(id, &bytes);
            return Ok(());
        }
        let key = key.as_str();
        let mut fill_error = None;
        let stored = self
            .store
            .put_filled(key, plan.size as usize, ValueClass::Bulk, &mut |buf| {
                fill_pack(self.reader, &plan.pieces, self.source_of, buf)
                    .map_err(|e| fill_error = Some(e))
                    .is_ok()
            });
        match (stored, fill_error) {
            (_, Some(e)) => Err(e),
            (Err(e), None) => Err(e.into()),
            (Ok(_), None) => Ok(()),
        }
    }

    /// Reads the value under `key` back, at most the pack's size, and checks it holds this pack:
    /// each piece that is a whole content hashes to it; the pieces of a split content are
    /// compared with this root's bytes.
    fn check_stored(&self, key: &str, plan: &PackPlan) -> Result<Checked, PublishError> {
        let bytes = match self.store.get_capped(key, plan.size) {
            Ok(Some(b)) => b,
            Ok(None) => return Ok(Checked::Gone),
            Err(StoreError::TooLarge { size, .. }) => {
                return Ok(Checked::Other(format!("{size} bytes, not {}", plan.size)));
            }
            Err(e) => return Err(e.into()),
        };
        if bytes.len() as u64 != plan.size {
            let why = format!("{} bytes, not {}", bytes.len(), plan.size);
            return Ok(Checked::Other(why));
        }
        let mut split = Vec::new();
        for piece in &plan.pieces {
            let whole = self.source_of[&piece.content].1.size == piece.len;
            let at = piece.pack_offset as usize..(piece.pack_offset + piece.len) as usize;
            if !whole {
                split.push(piece.clone());
            } else if ContentHash::of(&bytes[at]) != piece.content {
                let why = format!(
                    "the bytes at {} do not hash to {}",
                    piece.pack_offset, piece.content
                );
                return Ok(Checked::Other(why));
            }
        }
        if !split.is_empty() {
            let mut mine = vec![0u8; plan.size as usize];
            fill_pack(self.reader, &split, self.source_of, &mut mine)?;
            if let Some(p) = split.iter().find(|p| {
                let at = p.pack_offset as usize..(p.pack_offset + p.len) as usize;
                bytes[at.clone()] != mine[at]
            }) {
                let why = format!("the bytes at {} are not this root's", p.pack_offset);
                return Ok(Checked::Other(why));
            }
        }
        Ok(Checked::Same(bytes))
    }

    /// Puts copies 1.. of pack `id` (`bytes`, checked to be it) under their replica keys. A key
    /// that holds other bytes (planted: every pack key is predictable) is removed first, so an
    /// install that picks it does not fail; one holding these bytes is kept (another publisher's).
    /// A replica is only a second source: one that cannot be written is logged, not an error.
    fn replicate(&self, id: &ContentHash, bytes: &[u8]) {
        let copies = self.layout.pack_replicas();
        if copies <= 1 {
            return;
        }
        let keys: Vec<String> = (1..copies).map(|k| self.layout.pack_copy(id, k)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let present = self.store.exists_batch(&refs);
        for ((key, present), copy) in keys.iter().zip(present).zip(1..) {
            let result = match present {
                Ok(false) => self.store.put_copy(key, bytes, ValueClass::Bulk, copy),
                Ok(true) => match self.store.get_capped(key, bytes.len() as u64) {
                    Ok(Some(held)) if held == bytes => Ok(()),
                    Ok(None) => self.store.put_copy(key, bytes, ValueClass::Bulk, copy),
                    Ok(Some(_)) | Err(StoreError::TooLarge { .. }) => {
                        tracing::warn!(
                            key,
                            "a pack replica's key holds other bytes: replacing them"
                        );
                        self.store
                            .remove(key)
                            .and_then(|_| self.store.put_copy(key, bytes, ValueClass::Bulk, copy))
                    }
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                tracing::warn!(
                    key,
                    "could not write a pack replica ({e}): installs read the pack's other copies"
                );
            }
        }
    }
}

enum Checked {
    /// The value is this pack (its bytes).
    Same(Vec<u8>),
    /// Nothing there any more (evicted or collected since `exists`).
    Gone,
    /// Something else, and why it is not this pack.
    Other(String),
}

/// A salt nobody can guess ahead, for the last resort key.
fn random_salt() -> Result<[u8; 32], PublishError> {
    let mut salt = [0u8; 32];
    getrandom::fill(&mut salt).map_err(|e| {
        PublishError::Store(StoreError::Other(format!(
            "no randomness for a pack key nobody can plant: {e}"
        )))
    })?;
    Ok(salt)
}

/// Reads the packs of the base's generation back and checks every file against its hash
/// (`inspect::verify`) before the new generation inherits them: a pack someone planted under its
/// key before an older publisher referenced it, or put there after removing the real one, must
/// not be carried into every later generation. Files in a pack that failed are dropped from the
/// parent, like the files of an evicted pack, and uploaded again from this root if it has them
/// (true: files were dropped). A watcher remembers the generations it checked or wrote, so it
/// reads a parent back once, not every round; a one-off publish reads its parent back once.
pub(super) fn check_parent_packs(
    store: &dyn Store,
    layout: &KeyLayout,
    base: &mut super::Base,
    memo: Option<&super::HashCache>,
) -> Result<bool, PublishError> {
    use crate::inspect::{InspectError, Problem};
    let (Some(head), Some(parent)) = (&base.head, &mut base.parent) else {
        return Ok(false);
    };
    let id = head.generation;
    if memo.is_some_and(|m| m.is_checked(&id)) {
        return Ok(false);
    }
    let v = crate::inspect::verify(store, layout, &id).map_err(|e| match e {
        InspectError::Store(e) => PublishError::Store(e),
        InspectError::Catalog(e) => PublishError::Catalog(e),
        other => PublishError::Store(crate::store::StoreError::Other(other.to_string())),
    })?;
    let bad: std::collections::HashSet<ContentHash> = v
        .problems
        .iter()
        .flat_map(|p| match p {
            Problem::PackSize { pack, .. } | Problem::PackMissing { pack } => vec![*pack],
            Problem::FileCorrupt { packs, .. } => packs.clone(),
            _ => vec![],
        })
        .collect();
    if bad.is_empty() {
        return Ok(false);
    }
    let before = parent.files.len();
    let packs = &parent.packs;
    parent.files.retain(|f| {
        f.chunks
            .iter()
            .all(|c| !bad.contains(&packs[c.pack as usize].id))
    });
    crate::generation::prune_packs(parent);
    tracing::warn!(
        generation = %id,
        packs_bad = bad.len(),
        files_dropped = before - parent.files.len(),
        "the head generation's packs hold bytes that are not its files (planted or replaced): not \
         inheriting them; uploading those files again from this root"
    );
    base.parent_damaged = true;
    Ok(true)
}

/// Writes `pieces` (of one pack) into `buf`, each at its pack offset.
fn fill_pack(
    reader: &RootReader,
    pieces: &[Piece],
    source_of: &HashMap<ContentHash, (&ScannedFile, Stored)>,
    buf: &mut [u8],
) -> Result<(), PublishError> {
    let &RootReader {
        policy,
        files,
        kept,
        ..
    } = reader;
    let mut last = LastDir::default();
    for piece in pieces {
        let (f, stored) = source_of[&piece.content];
        let dst = &mut buf[piece.pack_offset as usize..(piece.pack_offset + piece.len) as usize];
        if kept.copy_piece(&piece.content, piece.content_offset, dst) {
            continue;
        }
        if stored.canonical {
            // Canonicalized again rather than kept from hashing (memory stays bounded); the hash
            // says whether the file is still what was hashed.
            let bytes = canonical_bytes(policy, files, f, &mut last)?;
            if ContentHash::of(&bytes) != stored.hash {
                return Err(files.changed(f));
            }
            let from = piece.content_offset as usize;
            dst.copy_from_slice(&bytes[from..from + piece.len as usize]);
            continue;
        }
        let mut file = files.open_file(f, &mut last)?;
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(piece.content_offset))
            .and_then(|_| file.read_exact(dst))
            .map_err(|source| files.read_error(f, source))?;
        // The bytes were hashed earlier; if the file changed since, the hash would lie. Caches
        // write by rename, so size, mtime and inode catch a change.
        if !f.is_unchanged(&file) {
            return Err(files.changed(f));
        }
    }
    Ok(())
}

/// Largest file whose content publish keeps from hashing to packing.
pub(super) const KEEP_FILE_LIMIT: u64 = 1 << 20;

/// Contents read while hashing, kept for the pack that uploads them, so a small file (most of a
/// kernel cache) is read and canonicalized once, not twice. At most `budget` bytes are kept (one
/// pack's worth: peak memory grows by at most one pack); the rest are read again when their pack
/// is filled and checked then. A kept content is dropped once its last piece is packed.
pub(super) struct KeptContents {
    left: AtomicU64,
    contents: Mutex<HashMap<ContentHash, Vec<u8>>>,
}

impl KeptContents {
    pub(super) fn new(budget: u64) -> Self {
        Self {
            left: AtomicU64::new(budget),
            contents: Mutex::new(HashMap::new()),
        }
    }

    /// Takes `size` bytes of the budget for a file about to be read, if it is small and fits.
    pub(super) fn reserve(&self, size: u64) -> bool {
        size <= KEEP_FILE_LIMIT
            && self
                .left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                    left.checked_sub(size)
                })
                .is_ok()
    }

    /// Keeps `bytes` read under a reservation of `reserved` bytes (returned if not kept: the
    /// content is already kept, from an identical file).
    pub(super) fn keep(&self, hash: ContentHash, bytes: Vec<u8>, reserved: u64) {
        let mut contents = self.contents.lock().unwrap_or_else(|e| e.into_inner());
        match contents.entry(hash) {
            std::collections::hash_map::Entry::Occupied(_) => {
                self.left.fetch_add(reserved, Ordering::Relaxed);
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(bytes);
            }
        }
    }

    /// Keeps a canonical form computed while hashing, if it fits the budget.
    pub(super) fn offer(&self, hash: ContentHash, bytes: Vec<u8>) {
        let size = bytes.len() as u64;
        if self.reserve(size) {
            self.keep(hash, bytes, size);
        }
    }

    /// Copies the piece of a kept content at `offset` into `dst`; false if it is not kept.
    pub(super) fn copy_piece(&self, hash: &ContentHash, offset: u64, dst: &mut [u8]) -> bool {
        let mut contents = self.contents.lock().unwrap_or_else(|e| e.into_inner());
        let Some(bytes) = contents.get(hash) else {
            return false;
        };
        let (from, to) = (offset as usize, offset as usize + dst.len());
        dst.copy_from_slice(&bytes[from..to]);
        if to == bytes.len() {
            contents.remove(hash);
        }
        true
    }
}
