//! Uploading the planned packs the store lacks: filling each in place in the store's put buffer
//! (`fill_pack`), two at a time, from contents kept since hashing or read again.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::catalog::KeyLayout;
use crate::generation::{ContentHash, PackPlan};
use crate::scan::ScannedFile;
use crate::store::{Store, ValueClass};

use super::hashing::{LastDir, RootReader, Stored, canonical_bytes};
use super::{PublishError, PublishReport};

/// Uploads the packs the store lacks. Two workers each fill a pack in place (in a Mooncake
/// staging buffer: `Store::put_filled`) and put it, so one reads files while the other uploads:
/// at most two pack buffers exist at once, whatever the tree size.
pub(super) fn upload_packs(
    store: &dyn Store,
    layout: &KeyLayout,
    reader: &RootReader,
    plans: &[PackPlan],
    source_of: &HashMap<ContentHash, (&ScannedFile, Stored)>,
    report: &mut PublishReport,
) -> Result<(), PublishError> {
    let interrupt = reader.interrupt;
    let keys: Vec<String> = plans.iter().map(|p| layout.pack(&p.id)).collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut missing = Vec::new();
    for (i, present) in store.exists_batch(&key_refs).into_iter().enumerate() {
        if present? {
            report.packs_reused += 1;
            report.bytes_deduplicated += plans[i].size;
        } else {
            missing.push(&plans[i]);
        }
    }
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let upload = || -> Result<(u64, u64), PublishError> {
        let (mut packs, mut bytes) = (0, 0);
        while !failed.load(Ordering::Relaxed) {
            if let Some(signal) = interrupt.signal_name() {
                return Err(PublishError::Interrupted(signal));
            }
            let Some(plan) = missing.get(next.fetch_add(1, Ordering::Relaxed)) else {
                break;
            };
            let mut fill_error = None;
            let stored = store.put_filled(
                &layout.pack(&plan.id),
                plan.size as usize,
                ValueClass::Bulk,
                &mut |buf| {
                    fill_pack(reader, plan, source_of, buf)
                        .map_err(|e| fill_error = Some(e))
                        .is_ok()
                },
            );
            match (stored, fill_error) {
                (_, Some(e)) => return Err(e),
                (Err(e), None) => return Err(e.into()),
                (Ok(_), None) => {
                    packs += 1;
                    bytes += plan.size;
                }
            }
        }
        Ok((packs, bytes))
    };
    let worker = || {
        let r = upload();
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
        let (packs, bytes) = r?;
        report.packs_uploaded += packs;
        report.bytes_uploaded += bytes;
    }
    Ok(())
}

fn fill_pack(
    reader: &RootReader,
    plan: &PackPlan,
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
    for piece in &plan.pieces {
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
