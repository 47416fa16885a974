//! Reading and writing generations in a store: head records, manifests, and the records that make
//! a store without listing navigable over time (the compat index, head floors, pins, the gc
//! journal). The glue between `generation` (pure) and `store` (bytes), shared by publish, install,
//! inspect and gc. Key layout and the reasons behind it: `keys`.

pub mod clock;
pub mod keys;
mod removal;

use serde::{Deserialize, Serialize};

pub use clock::{now_secs, writer_id};
use jitship_generation::{
    CompatId, ContentHash, GenerationId, HeadRecord, Manifest, ManifestError,
};
use jitship_store::{Store, StoreError, ValueClass};
pub use keys::KeyLayout;
pub use removal::{LeaseWait, Removal, remove_one, remove_waiting_out_leases};

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("generation {id}: {source}")]
    Manifest {
        id: GenerationId,
        source: ManifestError,
    },
    #[error("head record {key} is corrupt: {message}")]
    CorruptHead { key: String, message: String },
    #[error("record {key} is corrupt: {message}; remove the key if it was not written by jitship")]
    CorruptRecord { key: String, message: String },
    #[error(
        "gave up appending to {0} after many attempts: other writers kept winning; retry later"
    )]
    Contention(String),
}

/// One entry of the compat index: a compat id that has (or had) heads. Written once per compat id,
/// before its first head, so gc and `ls` find every compat id without listing keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexEntry {
    pub compat_id: CompatId,
    pub cache_kind: String,
    pub compat_key: String,
    /// Seconds since the Unix epoch.
    pub written_at: u64,
    /// Unique per write, so a writer can tell its entry from another writer's at the same seq.
    pub writer: String,
}

/// A head floor, written by gc before it removes head records of `compat_id`: heads with a seq
/// below `floor` may be gone, except those listed in `keep` (retained generations, e.g. pinned
/// ones), which gc leaves in place. Heads at or above `floor` are never removed by gc, so probing
/// for the newest head starts at `floor` and still sees a contiguous run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FloorRecord {
    pub compat_id: CompatId,
    pub seq: u64,
    pub floor: u64,
    /// Head seqs below `floor` that still exist and are retained, newest first.
    pub keep: Vec<u64>,
    pub written_at: u64,
    pub writer: String,
}

/// What one gc run is about to remove, written before it removes anything, so an interrupted run
/// is finished by the next one (which cannot otherwise find manifests whose heads are gone on a
/// store without listing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcJournal {
    pub seq: u64,
    pub written_at: u64,
    pub writer: String,
    /// Head record keys and manifest keys, removed unconditionally, heads first.
    pub keys: Vec<String>,
    /// Packs to remove if, when removed, no retained generation references them.
    pub packs: Vec<ContentHash>,
}

/// A pin: the generation is never dropped by retention. Existence of the key is what counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinRecord {
    pub generation: GenerationId,
    pub pinned_at: u64,
    pub by: String,
    pub reason: Option<String>,
}

fn decode_record<T: serde::de::DeserializeOwned>(
    key: &str,
    bytes: &[u8],
) -> Result<T, CatalogError> {
    serde_json::from_slice(bytes).map_err(|e| CatalogError::CorruptRecord {
        key: key.to_owned(),
        message: e.to_string(),
    })
}

fn encode_record<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("record serialization cannot fail")
}

/// The newest seq of a sequence of keys `key(from), key(from+1), ...`, if `key(from)` exists.
///
/// Stores that list keys are asked directly (any existing seq >= `from` counts). For the others
/// (Mooncake) the seqs are probed: the sequence is contiguous from `from`, so doubling until a
/// miss and then bisecting finds the newest in O(log n) existence checks.
pub fn newest_seq(
    store: &dyn Store,
    prefix: &str,
    from: u64,
    key: &dyn Fn(u64) -> String,
) -> Result<Option<u64>, StoreError> {
    if store.capabilities().listing {
        return Ok(store
            .list(prefix)?
            .iter()
            .filter_map(|k| k.strip_prefix(prefix)?.parse::<u64>().ok())
            .filter(|&s| s >= from)
            .max());
    }
    let exists = |seq: u64| store.exists(&key(seq));
    if !exists(from)? {
        return Ok(None);
    }
    let (mut lo, mut step) = (from, 1u64);
    let mut hi = from.saturating_add(step);
    while exists(hi)? {
        lo = hi;
        step = step.saturating_mul(2);
        hi = hi.saturating_add(step);
    }
    // Invariant: lo exists, hi does not.
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if exists(mid)? { lo = mid } else { hi = mid }
    }
    Ok(Some(lo))
}

/// Appends a record to a sequence at `newest + 1`: puts it, reads the seq back, and if another
/// writer won that seq, tries the next one. `make(seq)` builds the bytes for a seq and must embed
/// something unique to this writer, so winning is detected by comparing bytes. Returns the seq won.
pub fn append_seq(
    store: &dyn Store,
    prefix: &str,
    key: &dyn Fn(u64) -> String,
    make: &dyn Fn(u64) -> Vec<u8>,
) -> Result<u64, CatalogError> {
    let mut seq = newest_seq(store, prefix, 1, key)?.map_or(1, |s| s + 1);
    for _ in 0..64 {
        let bytes = make(seq);
        let k = key(seq);
        store.put(&k, &bytes, ValueClass::Record)?;
        match store.get(&k)? {
            Some(stored) if stored == bytes => return Ok(seq),
            // Another writer won this seq, or the record was evicted at once: try the next.
            _ => seq += 1,
        }
    }
    Err(CatalogError::Contention(prefix.to_owned()))
}

// ---------------------------------------------------------------------------------------------
// Head floors and heads

/// The newest floor record of `compat`, if gc ever wrote one.
pub fn newest_floor(
    store: &dyn Store,
    layout: &KeyLayout,
    compat: &CompatId,
) -> Result<Option<FloorRecord>, CatalogError> {
    let key = |seq| layout.floor(compat, seq);
    let Some(mut seq) = newest_seq(store, &layout.floors_prefix(compat), 1, &key)? else {
        return Ok(None);
    };
    // Floors are never removed; a miss here is eviction: the one below is the next best bound.
    while seq > 0 {
        let k = key(seq);
        if let Some(bytes) = store.get(&k)? {
            let floor: FloorRecord = decode_record(&k, &bytes)?;
            if floor.compat_id != *compat || floor.seq != seq {
                return Err(CatalogError::CorruptRecord {
                    key: k,
                    message: "compat id or seq does not match its key".into(),
                });
            }
            return Ok(Some(floor));
        }
        seq -= 1;
    }
    Ok(None)
}

/// Appends a floor record (gc only; before removing any head below `floor`). A floor never goes
/// down: if a newer floor is higher (another gc ran meanwhile), that one is kept, so heads it let
/// gc remove never fall above the newest floor. Run one gc at a time per namespace all the same.
pub fn write_floor(
    store: &dyn Store,
    layout: &KeyLayout,
    compat: &CompatId,
    floor: u64,
    mut keep: Vec<u64>,
) -> Result<FloorRecord, CatalogError> {
    let mut floor = floor;
    if let Some(previous) = newest_floor(store, layout, compat)?
        && previous.floor > floor
    {
        floor = previous.floor;
        keep.extend(previous.keep.iter().copied());
        keep.retain(|&s| s < floor);
        keep.sort_unstable_by(|a, b| b.cmp(a));
        keep.dedup();
    }
    let writer = writer_id();
    let written_at = now_secs();
    let make = |seq| {
        encode_record(&FloorRecord {
            compat_id: *compat,
            seq,
            floor,
            keep: keep.clone(),
            written_at,
            writer: writer.clone(),
        })
    };
    let key = |seq| layout.floor(compat, seq);
    let seq = append_seq(store, &layout.floors_prefix(compat), &key, &make)?;
    Ok(FloorRecord {
        compat_id: *compat,
        seq,
        floor,
        keep,
        written_at,
        writer,
    })
}

fn floor_seq(floor: &Option<FloorRecord>) -> u64 {
    floor.as_ref().map_or(1, |f| f.floor.max(1))
}

/// The newest head for `compat`, if any.
///
/// Heads are contiguous from the newest floor (1 when gc never ran). gc writes a new floor before
/// it removes heads below it, so a probe that overlapped a gc sees the floor change and starts
/// again from the new floor (the same idea as a seqlock).
pub fn newest_head(
    store: &dyn Store,
    layout: &KeyLayout,
    compat: &CompatId,
) -> Result<Option<HeadRecord>, CatalogError> {
    let lists = store.capabilities().listing;
    let mut floor = if lists {
        None
    } else {
        newest_floor(store, layout, compat)?
    };
    for _ in 0..8 {
        let from = floor_seq(&floor);
        let key = |seq| layout.head(compat, seq);
        let newest = newest_seq(store, &layout.heads_prefix(compat), from, &key)?;
        if !lists {
            let again = newest_floor(store, layout, compat)?;
            if again != floor {
                floor = again;
                continue;
            }
        }
        // A head may vanish between finding and reading it (eviction): step back.
        let Some(mut seq) = newest else {
            return Ok(None);
        };
        while seq >= from {
            if let Some(head) = read_head(store, layout, compat, seq)? {
                return Ok(Some(head));
            }
            seq -= 1;
        }
        return Ok(None);
    }
    Err(CatalogError::Contention(layout.floors_prefix(compat)))
}

/// Heads older than `head`, newest first, as far back as `limit` records (for fallbacks). Stops
/// at the floor, then continues with the retained heads the floor lists.
pub fn older_heads(
    store: &dyn Store,
    layout: &KeyLayout,
    head: &HeadRecord,
    limit: usize,
) -> Result<Vec<HeadRecord>, CatalogError> {
    let floor = newest_floor(store, layout, &head.compat_id)?;
    let from = floor_seq(&floor);
    let mut out = Vec::new();
    let mut seq = head.seq;
    while seq > from && out.len() < limit {
        seq -= 1;
        if let Some(h) = read_head(store, layout, &head.compat_id, seq)? {
            out.push(h);
        }
    }
    for &s in floor.iter().flat_map(|f| &f.keep) {
        if out.len() >= limit {
            break;
        }
        if s < head.seq.min(from)
            && let Some(h) = read_head(store, layout, &head.compat_id, s)?
        {
            out.push(h);
        }
    }
    Ok(out)
}

/// Every head of `compat` that exists, newest first, with the floor they were found from.
pub fn all_heads(
    store: &dyn Store,
    layout: &KeyLayout,
    compat: &CompatId,
) -> Result<(Option<FloorRecord>, Vec<HeadRecord>), CatalogError> {
    let floor = newest_floor(store, layout, compat)?;
    let Some(newest) = newest_head(store, layout, compat)? else {
        return Ok((floor, vec![]));
    };
    // newest_head may have seen a newer floor than ours; re-read so both agree.
    let floor = newest_floor(store, layout, compat)?;
    let mut seqs: Vec<u64> = if store.capabilities().listing {
        let prefix = layout.heads_prefix(compat);
        store
            .list(&prefix)?
            .iter()
            .filter_map(|k| k.strip_prefix(&prefix)?.parse().ok())
            .filter(|&s| s <= newest.seq)
            .collect()
    } else {
        let from = floor_seq(&floor);
        let mut v: Vec<u64> = (from..=newest.seq).collect();
        v.extend(floor.iter().flat_map(|f| &f.keep).filter(|&&s| s < from));
        v
    };
    seqs.sort_unstable_by(|a, b| b.cmp(a));
    seqs.dedup();
    let mut out = Vec::with_capacity(seqs.len());
    for seq in seqs {
        if seq == newest.seq {
            out.push(newest.clone());
        } else if let Some(h) = read_head(store, layout, compat, seq)? {
            out.push(h);
        }
    }
    Ok((floor, out))
}

pub fn read_head(
    store: &dyn Store,
    layout: &KeyLayout,
    compat: &CompatId,
    seq: u64,
) -> Result<Option<HeadRecord>, CatalogError> {
    let key = layout.head(compat, seq);
    let Some(bytes) = store.get(&key)? else {
        return Ok(None);
    };
    let head = HeadRecord::decode(&bytes).map_err(|e| CatalogError::CorruptHead {
        key: key.clone(),
        message: e.to_string(),
    })?;
    if head.seq != seq || head.compat_id != *compat {
        return Err(CatalogError::CorruptHead {
            key,
            message: "seq or compat id does not match its key".into(),
        });
    }
    Ok(Some(head))
}

/// Fetches and fully validates a manifest; `None` if it is missing (evicted or removed).
pub fn fetch_manifest(
    store: &dyn Store,
    layout: &KeyLayout,
    id: &GenerationId,
) -> Result<Option<Manifest>, CatalogError> {
    match read_manifest(store, layout, id)? {
        ManifestRead::Present(m) => Ok(Some(*m)),
        ManifestRead::Missing => Ok(None),
        ManifestRead::Unreadable(source) => Err(CatalogError::Manifest { id: *id, source }),
    }
}

/// A manifest as the store holds it. The one tolerant read: every caller that must go on past a
/// manifest it cannot use (gc, inspect, a publish building on a head) matches these three states
/// instead of picking an error variant apart.
#[derive(Debug)]
pub enum ManifestRead {
    Present(Box<Manifest>),
    /// Never written, removed, or evicted.
    Missing,
    /// There, but not a manifest this jitship accepts: corrupt, or a newer format.
    Unreadable(ManifestError),
}

/// Reads the manifest of `id` (see [`ManifestRead`]); only the store failing is an error.
pub fn read_manifest(
    store: &dyn Store,
    layout: &KeyLayout,
    id: &GenerationId,
) -> Result<ManifestRead, StoreError> {
    let Some(bytes) = store.get(&layout.generation(id))? else {
        return Ok(ManifestRead::Missing);
    };
    Ok(match Manifest::decode(&bytes, *id) {
        Ok(m) => ManifestRead::Present(Box::new(m)),
        Err(e) => ManifestRead::Unreadable(e),
    })
}

/// True if every pack `manifest` references is in the store right now.
pub fn packs_present(
    store: &dyn Store,
    layout: &KeyLayout,
    manifest: &Manifest,
) -> Result<bool, StoreError> {
    let keys: Vec<String> = manifest.packs.iter().map(|p| layout.pack(&p.id)).collect();
    for chunk in keys.chunks(256) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        for r in store.exists_batch(&refs) {
            if !r? {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

// ---------------------------------------------------------------------------------------------
// The compat index

/// Makes sure `compat` is in the index (publish calls it before writing a head). One `exists`
/// when it already is; otherwise appends an index entry, then puts the marker. A crash between the
/// two only leaves a duplicate entry behind, which readers drop.
pub fn ensure_indexed(
    store: &dyn Store,
    layout: &KeyLayout,
    compat: &CompatId,
    cache_kind: &str,
    compat_key: &str,
) -> Result<(), CatalogError> {
    let marker = layout.compat_marker(compat);
    if store.exists(&marker)? {
        return Ok(());
    }
    let writer = writer_id();
    let written_at = now_secs();
    let make = |_seq| {
        encode_record(&IndexEntry {
            compat_id: *compat,
            cache_kind: cache_kind.to_owned(),
            compat_key: compat_key.to_owned(),
            written_at,
            writer: writer.clone(),
        })
    };
    let key = |seq| layout.index(seq);
    let seq = append_seq(store, &layout.index_prefix(), &key, &make)?;
    store.put(&marker, seq.to_string().as_bytes(), ValueClass::Record)?;
    Ok(())
}

/// Every compat id jitship knows in this namespace: the index, plus (on stores that list) compat
/// ids that have heads but no index entry (published before the index existed). Sorted, unique.
pub fn compat_ids(store: &dyn Store, layout: &KeyLayout) -> Result<Vec<CompatId>, CatalogError> {
    let mut out = Vec::new();
    let key = |seq| layout.index(seq);
    if let Some(newest) = newest_seq(store, &layout.index_prefix(), 1, &key)? {
        for seq in 1..=newest {
            let k = key(seq);
            // An evicted entry is a gap; the entries around it still count.
            if let Some(bytes) = store.get(&k)? {
                let entry: IndexEntry = decode_record(&k, &bytes)?;
                out.push(entry.compat_id);
            }
        }
    }
    if store.capabilities().listing {
        let prefix = layout.all_heads_prefix();
        out.extend(store.list(&prefix)?.iter().filter_map(|k| {
            k.strip_prefix(&prefix)?
                .split('/')
                .next()?
                .parse::<CompatId>()
                .ok()
        }));
    }
    out.sort();
    out.dedup();
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Pins

pub fn pin_record(
    store: &dyn Store,
    layout: &KeyLayout,
    id: &GenerationId,
) -> Result<Option<PinRecord>, CatalogError> {
    let key = layout.pin(id);
    match store.get(&key)? {
        Some(bytes) => decode_record(&key, &bytes).map(Some),
        None => Ok(None),
    }
}

pub fn is_pinned(
    store: &dyn Store,
    layout: &KeyLayout,
    id: &GenerationId,
) -> Result<bool, StoreError> {
    store.exists(&layout.pin(id))
}

/// Pins `id`; pinning a pinned generation keeps the first pin record. Returns the record stored.
pub fn pin(
    store: &dyn Store,
    layout: &KeyLayout,
    id: &GenerationId,
    reason: Option<String>,
) -> Result<PinRecord, CatalogError> {
    let record = PinRecord {
        generation: *id,
        pinned_at: now_secs(),
        by: writer_id(),
        reason,
    };
    store.put(&layout.pin(id), &encode_record(&record), ValueClass::Record)?;
    Ok(pin_record(store, layout, id)?.unwrap_or(record))
}

/// Removes the pin; `false` if the generation was not pinned. On Mooncake any recent read of the
/// pin (an `ls`, a gc) leases it for 10 s; the remove is retried until the lease passes.
pub fn unpin(store: &dyn Store, layout: &KeyLayout, id: &GenerationId) -> Result<bool, StoreError> {
    remove_one(store, &layout.pin(id), LeaseWait::ONE_KEY)
}

// ---------------------------------------------------------------------------------------------
// The gc journal

pub fn newest_gc_journal(
    store: &dyn Store,
    layout: &KeyLayout,
) -> Result<Option<GcJournal>, CatalogError> {
    let key = |seq| layout.gc_journal(seq);
    let Some(seq) = newest_seq(store, &layout.gc_journal_prefix(), 1, &key)? else {
        return Ok(None);
    };
    let k = key(seq);
    match store.get(&k)? {
        Some(bytes) => decode_record(&k, &bytes).map(Some),
        None => Ok(None),
    }
}

/// Marks journal `seq` finished: the next gc does not retry it.
pub fn mark_gc_done(store: &dyn Store, layout: &KeyLayout, seq: u64) -> Result<(), StoreError> {
    store.put(&layout.gc_done(seq), b"done", ValueClass::Record)
}

pub fn gc_done(store: &dyn Store, layout: &KeyLayout, seq: u64) -> Result<bool, StoreError> {
    store.exists(&layout.gc_done(seq))
}

pub fn write_gc_journal(
    store: &dyn Store,
    layout: &KeyLayout,
    keys: Vec<String>,
    packs: Vec<ContentHash>,
) -> Result<GcJournal, CatalogError> {
    let writer = writer_id();
    let written_at = now_secs();
    let make = |seq| {
        encode_record(&GcJournal {
            seq,
            written_at,
            writer: writer.clone(),
            keys: keys.clone(),
            packs: packs.clone(),
        })
    };
    let key = |seq| layout.gc_journal(seq);
    let seq = append_seq(store, &layout.gc_journal_prefix(), &key, &make)?;
    Ok(GcJournal {
        seq,
        written_at,
        writer,
        keys,
        packs,
    })
}

#[cfg(test)]
mod tests;
