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
    let sizes: Vec<u64> = plans.iter().map(|p| p.size).collect();
    let present = presence(store, &key_refs, &sizes)?;
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

/// Where a pack key stands before a publish names it.
#[derive(Debug, Clone, Copy)]
struct Presence {
    /// Some tier holds a value under the key (the fast tier is asked first).
    any: bool,
    /// What the durable tier holds, for a store of two tiers (`Whole` for one).
    durable: DurableCopy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DurableCopy {
    /// A value of the pack's size (or no durable tier to ask).
    Whole,
    Missing,
    /// A value of another size: not this pack.
    Other(u64),
}

/// Where each of `keys` (packs of `sizes`) stands: one batched call to the store, or, for a store
/// of two tiers, one to the fast tier and one look per key at the durable tier (a size where it
/// answers sizes, a stat for a directory). A generation is announced in the durable tier only once
/// every pack it names is there, so a pack the fast tier alone holds (a durable tier added later,
/// or one that lost data) must be seen as missing from it, not skipped as stored.
fn presence(
    store: &dyn Store,
    keys: &[&str],
    sizes: &[u64],
) -> Result<Vec<Presence>, PublishError> {
    let Some((fast, durable)) = store.tiers() else {
        return Ok(store
            .exists_batch(keys)
            .into_iter()
            .map(|r| {
                r.map(|any| Presence {
                    any,
                    durable: DurableCopy::Whole,
                })
            })
            .collect::<Result<_, _>>()?);
    };
    let copies = keys
        .iter()
        .zip(sizes)
        .map(|(key, size)| durable_copy(durable, key, *size))
        .collect::<Result<Vec<_>, _>>()?;
    // A fast tier that cannot answer (a restarting master) counts as not holding the key: the
    // durable tier decides, as `TieredStore::exists_batch` does.
    Ok(fast
        .exists_batch(keys)
        .into_iter()
        .zip(copies)
        .map(|(fast, durable)| Presence {
            any: matches!(fast, Ok(true)) || durable != DurableCopy::Missing,
            durable,
        })
        .collect())
}

/// What the durable tier `durable` holds under `key`, for a pack of `size` bytes.
fn durable_copy(durable: &dyn Store, key: &str, size: u64) -> Result<DurableCopy, PublishError> {
    if durable.capabilities().sizes {
        return Ok(match durable.size(key)? {
            None => DurableCopy::Missing,
            Some(s) if s == size => DurableCopy::Whole,
            Some(s) => DurableCopy::Other(s),
        });
    }
    Ok(match durable.exists(key)? {
        true => DurableCopy::Whole,
        false => DurableCopy::Missing,
    })
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
    fn pack(&self, plan: &PackPlan, mut present: Presence) -> Result<Placed, PublishError> {
        let mut id = plan.id;
        for attempt in 0..=SHARED_SALTS.len() + 1 {
            let key = self.layout.pack(&id);
            if present.any {
                let checked = match present.durable {
                    DurableCopy::Other(size) => Checked::Other(format!(
                        "{size} bytes in the durable tier, not {}",
                        plan.size
                    )),
                    _ => self.check_stored(&key, plan)?,
                };
                match checked {
                    Checked::Same(bytes) => {
                        if present.durable == DurableCopy::Missing {
                            self.fill_durable(&key, &bytes)?;
                        }
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
                        present = self.presence(&self.layout.pack(&id), plan.size)?;
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

    /// [`presence`] of one key.
    fn presence(&self, key: &str, size: u64) -> Result<Presence, PublishError> {
        Ok(presence(self.store, &[key], &[size])?.remove(0))
    }

    /// Puts a pack the fast tier alone held (`bytes`, checked to be it) into the durable tier, so
    /// the generation about to name it is whole there (a refusal fails the publish, as any
    /// durable write does).
    fn fill_durable(&self, key: &str, bytes: &[u8]) -> Result<(), PublishError> {
        if let Some((_, durable)) = self.store.tiers() {
            durable.put(key, bytes, ValueClass::Bulk)?;
            tracing::info!(
                key,
                "copied a pack the fast tier alone held into the durable tier"
            );
        }
        Ok(())
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
    base: &mut super::base::Base,
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

/// With a durable tier: copies the packs of the base's generation that the durable tier lacks
/// (or holds at another size) from the fast tier, then checks the copies where they now are, so
/// the generation this publish writes, which names the parent's packs, is whole in the durable
/// tier before its head is (a durable tier added to a store that already held the chain, or one
/// that lost data). A pack that cannot be copied, or whose copy does not check, is removed from
/// the durable tier and its files are dropped from the parent, to be uploaded again from this root
/// like those of an evicted pack (true: files were dropped). Costs one stat per parent pack when
/// the durable tier is whole; never memoized (the durable tier can lose data between publishes).
pub(super) fn fill_durable_parent(
    store: &dyn Store,
    layout: &KeyLayout,
    base: &mut super::base::Base,
) -> Result<bool, PublishError> {
    let (Some((fast, durable)), Some(head), Some(parent)) =
        (store.tiers(), &base.head, &mut base.parent)
    else {
        return Ok(false);
    };
    let mut gaps = std::collections::HashSet::new();
    for p in &parent.packs {
        if durable_copy(durable, &layout.pack(&p.id), p.size)? != DurableCopy::Whole {
            gaps.insert(p.id);
        }
    }
    if gaps.is_empty() {
        return Ok(false);
    }
    let mut bad = std::collections::HashSet::new();
    for p in parent.packs.iter().filter(|p| gaps.contains(&p.id)) {
        let key = layout.pack(&p.id);
        // A value of another size is not this pack: it goes before the copy is put.
        durable.remove(&key)?;
        match fast.get_capped(&key, p.size) {
            Ok(Some(bytes)) if bytes.len() as u64 == p.size => {
                durable.put(&key, &bytes, ValueClass::Bulk)?;
            }
            Ok(_) | Err(StoreError::TooLarge { .. }) => {
                bad.insert(p.id);
            }
            Err(e) => return Err(e.into()),
        }
    }
    // The copies are checked in the durable tier itself: the files they hold must hash to the
    // parent's manifest (a file spanning packs reads its other packs there too).
    let mut touched = parent.clone();
    touched.files.retain(|f| {
        f.chunks
            .iter()
            .any(|c| gaps.contains(&parent.packs[c.pack as usize].id))
    });
    crate::generation::prune_packs(&mut touched);
    let v = crate::inspect::verify_manifest(durable, layout, &head.generation, &touched)
        .map_err(|e| PublishError::Store(StoreError::Other(e.to_string())))?;
    for problem in &v.problems {
        use crate::inspect::Problem;
        match problem {
            Problem::PackMissing { pack } | Problem::PackSize { pack, .. } => {
                bad.insert(*pack);
            }
            Problem::FileCorrupt { packs, .. } => {
                bad.extend(packs.iter().filter(|p| gaps.contains(p)))
            }
            _ => {}
        }
    }
    tracing::info!(
        generation = %head.generation,
        copied = gaps.len() - bad.len(),
        failed = bad.len(),
        "the durable tier lacked packs of the generation this publish builds on: copied from the \
         fast tier and checked there"
    );
    if bad.is_empty() {
        return Ok(false);
    }
    for pack in &bad {
        durable.remove(&layout.pack(pack))?;
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
        generation = %head.generation,
        packs_bad = bad.len(),
        files_dropped = before - parent.files.len(),
        "packs of the generation this publish builds on could not be made whole in the durable \
         tier (the fast tier lacks them or holds other bytes): uploading those files again from \
         this root"
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
