//! Reading and writing generations in a store: head records, manifests, and the records that make
//! a store without listing navigable over time (the compat index, head floors, pins, the gc
//! journal). The glue between `generation` (pure) and `store` (bytes), shared by publish, install,
//! inspect and gc. Key layout and the reasons behind it: `keys`.

pub mod clock;
pub mod contributions;
mod heads;
pub mod keys;
pub mod modules;
mod removal;
pub mod walk;

use serde::{Deserialize, Serialize};

pub use clock::{now_secs, writer_id};
pub use heads::*;
use jitship_generation::{
    CompatId, ContentHash, GenerationId, HeadRecord, Manifest, ManifestError,
};
use jitship_store::{Store, StoreError, ValueClass};
pub use keys::KeyLayout;
pub use removal::{LeaseWait, Removal, remove_one, remove_waiting_out_leases};
pub use walk::{MAX_SEQ, SeqWalk};

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
    #[error(
        "{0} has a record at the highest seq there is ({MAX_SEQ}); nothing can be appended above \
         it: remove that key (anyone can write to the store; jitship never writes that high)"
    )]
    SequenceFull(String),
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
    /// Head record, contribution and manifest keys, removed unconditionally, in that order.
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

/// Reads and decodes the record at `key`, refused over `limit` bytes before it is read.
fn read_record<T: serde::de::DeserializeOwned>(
    store: &dyn Store,
    key: &str,
    limit: u64,
) -> Result<Option<T>, CatalogError> {
    match store.get_capped(key, limit)? {
        Some(bytes) => decode_record(key, &bytes).map(Some),
        None => Ok(None),
    }
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

/// Caps on what one record read from the store may hold, checked before it is read whole
/// (`Store::get_capped`): anyone can write these keys. Heads are a few hundred bytes; index
/// entries, floors and pins a few KiB; a gc journal names every key one run removes; a manifest
/// takes about 1 KiB per file.
pub const MAX_HEAD_BYTES: u64 = 64 << 10;
pub const MAX_RECORD_BYTES: u64 = 1 << 20;
pub const MAX_JOURNAL_BYTES: u64 = 64 << 20;
/// How many floor records of one compat id a head walk reads (newest first).
const FLOORS_READ: usize = 4;
/// How many of the heads all floors read say they keep below them a head walk looks at (each
/// costs a probe without listing). gc keeps the retained and pinned generations below a floor,
/// a handful; a floor anyone wrote could name millions (issue 39: four forged floors of 60,000
/// each cost a walk 240,002 probes and 7.7 s).
pub const MAX_FLOOR_KEEPS: usize = 1024;

/// The newest seq of a sequence (`prefix`, `key(seq)`) contiguous from 1, if any: see `walk`.
fn newest_seq(
    store: &dyn Store,
    prefix: &str,
    key: &dyn Fn(u64) -> String,
) -> Result<Option<u64>, StoreError> {
    SeqWalk::new(store, prefix, key, &[1])?.next_seq()
}

/// Appends a record to a sequence at `newest + 1`: puts it, reads the seq back, and if another
/// writer won that seq, tries the next one. `make(seq)` builds the bytes for a seq and must embed
/// something unique to this writer, so winning is detected by comparing bytes. Returns the seq won.
///
/// Anyone can write a key at the highest seq there is ([`MAX_SEQ`]), so `newest + 1` may not
/// exist. Then the record goes just above the newest record that `is_record` accepts (one this
/// jitship wrote: it decodes and names its own seq), searching down past at most
/// [`MAX_FAULTY_PASSED`] others: a planted record at the ceiling costs the writer that search,
/// never the sequence (issue 39; `docs/threat-model.md`).
pub fn append_seq(
    store: &dyn Store,
    prefix: &str,
    key: &dyn Fn(u64) -> String,
    make: &dyn Fn(u64) -> Vec<u8>,
    is_record: &dyn Fn(u64, &[u8]) -> bool,
) -> Result<u64, CatalogError> {
    let mut seq = match newest_seq(store, prefix, key)? {
        None => 1,
        Some(s) if s < MAX_SEQ => s + 1,
        Some(_) => below_the_ceiling(store, prefix, key, is_record)?,
    };
    for _ in 0..64 {
        if seq > MAX_SEQ {
            return Err(CatalogError::SequenceFull(prefix.to_owned()));
        }
        let bytes = make(seq);
        let k = key(seq);
        store.put(&k, &bytes, ValueClass::Record)?;
        match store.get_capped(&k, bytes.len() as u64) {
            Ok(Some(stored)) if stored == bytes => return Ok(seq),
            // Another writer won this seq (with anything, of any size), or the record was evicted
            // at once: try the next.
            Ok(_) | Err(StoreError::TooLarge { .. }) => seq += 1,
            Err(e) => return Err(e.into()),
        }
    }
    Err(CatalogError::Contention(prefix.to_owned()))
}

/// Where to append when the sequence's newest key is at the ceiling: just above the newest record
/// `is_record` accepts (1 if none is found among the newest `MAX_FAULTY_PASSED + 1` keys).
fn below_the_ceiling(
    store: &dyn Store,
    prefix: &str,
    key: &dyn Fn(u64) -> String,
    is_record: &dyn Fn(u64, &[u8]) -> bool,
) -> Result<u64, CatalogError> {
    let mut seqs = SeqWalk::new(store, prefix, key, &[1])?;
    for _ in 0..=MAX_FAULTY_PASSED {
        let Some(seq) = seqs.next_seq()? else { break };
        match store.get_capped(&key(seq), MAX_RECORD_BYTES) {
            Ok(Some(bytes)) if seq < MAX_SEQ && is_record(seq, &bytes) => return Ok(seq + 1),
            Ok(_) | Err(StoreError::TooLarge { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    tracing::warn!(
        prefix,
        "no record of this sequence found below the one at the highest seq; appending from 1"
    );
    Ok(1)
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
    let limit = jitship_generation::MAX_MANIFEST_BYTES as u64;
    let bytes = match store.get_capped(&layout.generation(id), limit) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Ok(ManifestRead::Missing),
        Err(StoreError::TooLarge { size, .. }) => {
            return Ok(ManifestRead::Unreadable(ManifestError::TooLarge(
                size.try_into().unwrap_or(usize::MAX),
            )));
        }
        Err(e) => return Err(e),
    };
    Ok(match Manifest::decode(&bytes, *id) {
        Ok(m) => ManifestRead::Present(Box::new(m)),
        Err(e) => ManifestRead::Unreadable(e),
    })
}

/// True if every pack `manifest` references is in the store right now: its primary, or else one
/// of the replicas `layout` names (installs read whichever copy is there).
pub fn packs_present(
    store: &dyn Store,
    layout: &KeyLayout,
    manifest: &Manifest,
) -> Result<bool, StoreError> {
    for chunk in manifest.packs.chunks(256) {
        let keys: Vec<String> = chunk.iter().map(|p| layout.pack(&p.id)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        for (p, r) in chunk.iter().zip(store.exists_batch(&refs)) {
            if r? {
                continue;
            }
            if !replica_present(store, layout, &p.id)? {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// Whether one of the pack's replicas (`KeyLayout::pack_copy` 1..) is in the store.
fn replica_present(
    store: &dyn Store,
    layout: &KeyLayout,
    id: &ContentHash,
) -> Result<bool, StoreError> {
    for k in 1..layout.pack_replicas() {
        if store.exists(&layout.pack_copy(id, k))? {
            return Ok(true);
        }
    }
    Ok(false)
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
    let is_entry = |_seq, bytes: &[u8]| decode_record::<IndexEntry>("", bytes).is_ok();
    let seq = append_seq(store, &layout.index_prefix(), &key, &make, &is_entry)?;
    store.put(&marker, seq.to_string().as_bytes(), ValueClass::Record)?;
    Ok(())
}

/// Every compat id jitship knows in this namespace: the index, plus (on stores that list) compat
/// ids that have heads but no index entry (published before the index existed). Sorted, unique.
pub fn compat_ids(store: &dyn Store, layout: &KeyLayout) -> Result<Vec<CompatId>, CatalogError> {
    let mut out = Vec::new();
    let key = |seq| layout.index(seq);
    let mut seqs = SeqWalk::new(store, &layout.index_prefix(), key, &[1])?;
    while let Some(seq) = seqs.next_seq()? {
        let k = layout.index(seq);
        // An evicted entry is a gap; one that is not an index entry (anyone can write the key) is
        // passed over: the entries around it still count.
        match read_record::<IndexEntry>(store, &k, MAX_RECORD_BYTES) {
            Ok(Some(entry)) => out.push(entry.compat_id),
            Ok(None) => {}
            Err(CatalogError::Store(e)) if !matches!(e, StoreError::TooLarge { .. }) => {
                return Err(e.into());
            }
            Err(e) => tracing::warn!(key = %k, "index entry passed over: {e}"),
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
    read_record(store, &layout.pin(id), MAX_RECORD_BYTES)
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

/// The newest gc journal that is one: a record at a journal key that does not decode, is over
/// the cap or names another seq than its key is passed over (logged), at most
/// [`MAX_FAULTY_PASSED`] of them, so one planted record cannot stop gc for the namespace.
pub fn newest_gc_journal(
    store: &dyn Store,
    layout: &KeyLayout,
) -> Result<Option<GcJournal>, CatalogError> {
    let key = |seq| layout.gc_journal(seq);
    let mut seqs = SeqWalk::new(store, &layout.gc_journal_prefix(), key, &[1])?;
    for _ in 0..=MAX_FAULTY_PASSED {
        let Some(seq) = seqs.next_seq()? else { break };
        let k = key(seq);
        match read_record::<GcJournal>(store, &k, MAX_JOURNAL_BYTES) {
            Ok(Some(journal)) if journal.seq == seq => return Ok(Some(journal)),
            Ok(None) => {}
            Ok(Some(_)) => {
                tracing::warn!(key = %k, "gc journal names another seq than its key; passed over")
            }
            Err(CatalogError::Store(e)) if !matches!(e, StoreError::TooLarge { .. }) => {
                return Err(e.into());
            }
            Err(e) => tracing::warn!(key = %k, "gc journal passed over: {e}"),
        }
    }
    Ok(None)
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
    let is_journal =
        |seq, bytes: &[u8]| decode_record::<GcJournal>("", bytes).is_ok_and(|j| j.seq == seq);
    let seq = append_seq(store, &layout.gc_journal_prefix(), &key, &make, &is_journal)?;
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
