//! Reading and writing generations in a store: head records and manifests. The glue between
//! `generation` (pure) and `store` (bytes), shared by publish, install and gc.

use crate::generation::{CompatId, GenerationId, HeadRecord, Manifest, ManifestError};
use crate::store::{KeyLayout, Store, StoreError};

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
}

/// The newest head for `compat`, if any.
///
/// Stores that list keys are asked directly. For the others (Mooncake) the seqs are probed:
/// heads are written at 1, 2, 3, ... without gaps, so doubling until a miss and then bisecting
/// finds the newest in O(log n) existence checks.
pub fn newest_head(
    store: &dyn Store,
    layout: &KeyLayout,
    compat: &CompatId,
) -> Result<Option<HeadRecord>, CatalogError> {
    let newest_seq = match store.list(&layout.heads_prefix(compat)) {
        Ok(keys) => keys
            .iter()
            .filter_map(|k| k.rsplit('/').next()?.parse::<u64>().ok())
            .max(),
        Err(StoreError::Unsupported(_)) => probe_newest_seq(store, layout, compat)?,
        Err(e) => return Err(e.into()),
    };
    // A head may vanish between finding and reading it (gc, eviction): step back.
    let mut seq = match newest_seq {
        Some(s) => s,
        None => return Ok(None),
    };
    while seq > 0 {
        if let Some(head) = read_head(store, layout, compat, seq)? {
            return Ok(Some(head));
        }
        seq -= 1;
    }
    Ok(None)
}

/// Heads older than `head`, newest first, as far back as `limit` records (for fallbacks).
pub fn older_heads(
    store: &dyn Store,
    layout: &KeyLayout,
    head: &HeadRecord,
    limit: usize,
) -> Result<Vec<HeadRecord>, CatalogError> {
    let mut out = Vec::new();
    let mut seq = head.seq;
    while seq > 1 && out.len() < limit {
        seq -= 1;
        if let Some(h) = read_head(store, layout, &head.compat_id, seq)? {
            out.push(h);
        }
    }
    Ok(out)
}

fn probe_newest_seq(
    store: &dyn Store,
    layout: &KeyLayout,
    compat: &CompatId,
) -> Result<Option<u64>, CatalogError> {
    let exists = |seq: u64| store.exists(&layout.head(compat, seq));
    if !exists(1)? {
        return Ok(None);
    }
    let (mut lo, mut hi) = (1u64, 2u64);
    while exists(hi)? {
        lo = hi;
        hi = hi.saturating_mul(2);
    }
    // Invariant: lo exists, hi does not.
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if exists(mid)? { lo = mid } else { hi = mid }
    }
    Ok(Some(lo))
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
    let Some(bytes) = store.get(&layout.generation(id))? else {
        return Ok(None);
    };
    Manifest::decode(&bytes, *id)
        .map(Some)
        .map_err(|source| CatalogError::Manifest { id: *id, source })
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
