//! Head floors and heads: reading the heads of a compat id newest first (`HeadWalk`), each checked
//! against its key, past faulty ones and below the floors gc wrote.

use super::*;

/// The newest readable floor record of `compat`, if gc ever wrote one.
pub fn newest_floor(
    store: &dyn Store,
    layout: &KeyLayout,
    compat: &CompatId,
) -> Result<Option<FloorRecord>, CatalogError> {
    Ok(recent_floors(store, layout, compat, 1)?.into_iter().next())
}

/// Floor records of `compat`, newest first, until `n` of them are *held*: a head exists at their
/// `floor` seq, as gc leaves it (gc never removes a head at or above its floor). A floor that is
/// corrupt, oversized or names another place than its key is passed over (logged), and one that
/// is not held is returned but not counted: anyone can write a floor, so a floor only ever adds a
/// place a head walk starts from (`HeadWalk`), it never hides the heads below it, and planted
/// floors that start nowhere cannot push gc's out of the walk. At most `4n` records are read.
fn recent_floors(
    store: &dyn Store,
    layout: &KeyLayout,
    compat: &CompatId,
    n: usize,
) -> Result<Vec<FloorRecord>, CatalogError> {
    let key = |seq| layout.floor(compat, seq);
    let mut seqs = SeqWalk::new(store, &layout.floors_prefix(compat), key, &[1])?;
    let (mut out, mut held) = (Vec::new(), 0);
    // Floors are never removed: a miss is eviction, and the one below is the next best bound.
    for _ in 0..n.saturating_mul(4) {
        if held >= n {
            break;
        }
        let Some(seq) = seqs.next_seq()? else { break };
        let k = key(seq);
        match read_record::<FloorRecord>(store, &k, MAX_RECORD_BYTES) {
            Ok(Some(f)) if f.compat_id == *compat && f.seq == seq && f.floor <= MAX_SEQ => {
                if f.floor >= 1 && store.exists(&layout.head(compat, f.floor))? {
                    held += 1;
                }
                out.push(f)
            }
            Ok(None) => {}
            Ok(Some(_)) => {
                tracing::warn!(key = %k, "floor record names another place than its key; passed over")
            }
            Err(CatalogError::Store(e)) if !matches!(e, StoreError::TooLarge { .. }) => {
                return Err(e.into());
            }
            Err(e) => tracing::warn!(key = %k, "floor record passed over: {e}"),
        }
    }
    Ok(out)
}

/// Appends a floor record (gc only; before removing any head below `floor`). A floor never goes
/// down: if a newer floor is higher (another gc ran meanwhile) and a head exists at it, that one
/// is kept, so heads it let gc remove never fall above the newest floor. Run one gc at a time per
/// namespace all the same.
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
        && store.exists(&layout.head(compat, previous.floor))?
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
    let is_floor = |seq, bytes: &[u8]| {
        decode_record::<FloorRecord>("", bytes)
            .is_ok_and(|f| f.seq == seq && f.compat_id == *compat)
    };
    let seq = append_seq(store, &layout.floors_prefix(compat), &key, &make, &is_floor)?;
    Ok(FloorRecord {
        compat_id: *compat,
        seq,
        floor,
        keep,
        written_at,
        writer,
    })
}

/// Why a head record cannot be used, whoever wrote it. A reader passes such a head over and goes
/// on to the one below; a publisher writes above it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "fault", rename_all = "kebab-case")]
pub enum HeadFault {
    /// Over `MAX_HEAD_BYTES`: refused before it was read.
    TooLarge { size: u64 },
    /// Not a head record this jitship decodes (garbage, empty, truncated).
    Corrupt { error: String },
    /// A valid head record, but of another compat id or another seq than its key (a copy).
    Mislabelled,
}

impl std::fmt::Display for HeadFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooLarge { size } => {
                write!(
                    f,
                    "{size} bytes, over the {MAX_HEAD_BYTES}-byte cap on a head record"
                )
            }
            Self::Corrupt { error } => write!(f, "not a head record: {error}"),
            Self::Mislabelled => {
                write!(f, "a head record of another compat id or seq than its key")
            }
        }
    }
}

/// A head that exists but cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FaultyHead {
    pub seq: u64,
    #[serde(flatten)]
    pub fault: HeadFault,
}

/// The head record at `seq`: `None` if it is missing, else the record or why it cannot be used.
/// Only the store failing is an error.
pub fn read_head_at(
    store: &dyn Store,
    layout: &KeyLayout,
    compat: &CompatId,
    seq: u64,
) -> Result<Option<Result<HeadRecord, HeadFault>>, StoreError> {
    read_head_record(store, &layout.head(compat, seq), compat, seq)
}

/// The head record (or a record of its format: contributions) at `key`, which must name `compat`
/// and `seq`: `None` if missing, else the record or why it cannot be used.
pub(crate) fn read_head_record(
    store: &dyn Store,
    key: &str,
    compat: &CompatId,
    seq: u64,
) -> Result<Option<Result<HeadRecord, HeadFault>>, StoreError> {
    let bytes = match store.get_capped(key, MAX_HEAD_BYTES) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Ok(None),
        Err(StoreError::TooLarge { size, .. }) => {
            return Ok(Some(Err(HeadFault::TooLarge { size })));
        }
        Err(e) => return Err(e),
    };
    Ok(Some(match HeadRecord::decode(&bytes) {
        Err(e) => Err(HeadFault::Corrupt {
            error: e.to_string(),
        }),
        Ok(head) if head.seq != seq || head.compat_id != *compat => Err(HeadFault::Mislabelled),
        Ok(head) => Ok(head),
    }))
}

/// The head record at `seq`, `None` if missing; a head that cannot be used is an error naming it.
pub fn read_head(
    store: &dyn Store,
    layout: &KeyLayout,
    compat: &CompatId,
    seq: u64,
) -> Result<Option<HeadRecord>, CatalogError> {
    match read_head_at(store, layout, compat, seq)? {
        None => Ok(None),
        Some(Ok(head)) => Ok(Some(head)),
        Some(Err(fault)) => Err(CatalogError::CorruptHead {
            key: layout.head(compat, seq),
            message: fault.to_string(),
        }),
    }
}

/// The heads of one compat id, newest first, each read and checked against its key: what every
/// reader (install, publish, gc, ls) walks instead of trusting "the highest seq". Bounded
/// whatever anyone wrote (see `walk`): out-of-range seqs are never looked at, a planted record
/// costs one search, and the caller decides how many heads it passes over.
pub struct HeadWalk<'a> {
    store: &'a dyn Store,
    layout: &'a KeyLayout,
    compat: CompatId,
    seqs: SeqWalk<'a>,
    /// The first seq found, yielded by the first `next`.
    peeked: Option<Option<u64>>,
    newest_seq: Option<u64>,
    /// The newest floor (gc) when the walk started.
    pub floor: Option<FloorRecord>,
}

impl<'a> HeadWalk<'a> {
    /// Starts a walk from the newest head. Without listing, heads are searched from 1 and from
    /// each recent gc floor, plus the heads those floors keep; a probe that overlapped a gc (the
    /// floor changed meanwhile) starts again, as a seqlock would.
    pub fn new(
        store: &'a dyn Store,
        layout: &'a KeyLayout,
        compat: &CompatId,
    ) -> Result<Self, CatalogError> {
        let lists = store.capabilities().listing;
        let compat = *compat;
        let mut floors = if lists {
            vec![]
        } else {
            recent_floors(store, layout, &compat, FLOORS_READ)?
        };
        for _ in 0..8 {
            let mut starts = vec![1];
            starts.extend(floors.iter().map(|f| f.floor));
            let key = move |seq| layout.head(&compat, seq);
            let mut seqs = SeqWalk::new(store, &layout.heads_prefix(&compat), key, &starts)?;
            // Newest first within each floor, the newest floor first.
            let keep: Vec<u64> = floors
                .iter()
                .flat_map(|f| f.keep.iter().copied())
                .take(MAX_FLOOR_KEEPS)
                .collect();
            seqs.also(&keep);
            let first = seqs.next_seq()?;
            if !lists {
                let again = recent_floors(store, layout, &compat, FLOORS_READ)?;
                if again != floors {
                    floors = again;
                    continue;
                }
            }
            let floor = if lists {
                newest_floor(store, layout, &compat)?
            } else {
                floors.first().cloned()
            };
            return Ok(Self {
                store,
                layout,
                compat,
                seqs,
                peeked: Some(first),
                newest_seq: first,
                floor,
            });
        }
        Err(CatalogError::Contention(layout.floors_prefix(&compat)))
    }

    /// The newest seq that holds a head record of any content: a publisher writes above it.
    pub fn newest_seq(&self) -> Option<u64> {
        self.newest_seq
    }

    /// Makes the walk go on below `seq` (a reader that read the heads above it before).
    pub fn start_below(&mut self, seq: u64) {
        if let Some(Some(first)) = self.peeked
            && first >= seq
        {
            self.peeked = None;
        }
        self.seqs.start_below(seq);
    }

    /// `exists` calls the walk made (stores without listing).
    pub fn probes(&self) -> u64 {
        self.seqs.probes
    }

    /// The next head below the last one, newest first: the record, or why it cannot be used.
    /// A head that vanished between finding and reading it (eviction) is skipped.
    pub fn next_head(&mut self) -> Result<Option<Result<HeadRecord, FaultyHead>>, CatalogError> {
        loop {
            let seq = match self.peeked.take() {
                Some(first) => first,
                None => self.seqs.next_seq()?,
            };
            let Some(seq) = seq else { return Ok(None) };
            match read_head_at(self.store, self.layout, &self.compat, seq)? {
                None => continue,
                Some(Ok(head)) => return Ok(Some(Ok(head))),
                Some(Err(fault)) => return Ok(Some(Err(FaultyHead { seq, fault }))),
            }
        }
    }

    /// The next usable head, passing over (and logging) at most `max_faulty` faulty ones.
    pub fn next_usable(&mut self, max_faulty: usize) -> Result<Option<HeadRecord>, CatalogError> {
        let mut faulty = 0;
        while let Some(entry) = self.next_head()? {
            match entry {
                Ok(head) => return Ok(Some(head)),
                Err(f) => {
                    tracing::warn!(seq = f.seq, compat = %self.compat, "head passed over: {}", f.fault);
                    faulty += 1;
                    if faulty > max_faulty {
                        break;
                    }
                }
            }
        }
        Ok(None)
    }
}

/// How many heads a reader passes over before giving up: `newest_head` and `older_heads` (faulty
/// ones), an install (any it cannot use), and a publisher checking an install reaches its head.
pub const MAX_FAULTY_PASSED: usize = 256;

/// The newest usable head for `compat`, if any (faulty heads above it are passed over).
pub fn newest_head(
    store: &dyn Store,
    layout: &KeyLayout,
    compat: &CompatId,
) -> Result<Option<HeadRecord>, CatalogError> {
    HeadWalk::new(store, layout, compat)?.next_usable(MAX_FAULTY_PASSED)
}

/// Usable heads older than `head`, newest first, at most `limit` (for fallbacks).
pub fn older_heads(
    store: &dyn Store,
    layout: &KeyLayout,
    head: &HeadRecord,
    limit: usize,
) -> Result<Vec<HeadRecord>, CatalogError> {
    let mut walk = HeadWalk::new(store, layout, &head.compat_id)?;
    let mut out = Vec::new();
    while out.len() < limit {
        match walk.next_usable(MAX_FAULTY_PASSED)? {
            Some(h) if h.seq < head.seq => out.push(h),
            Some(_) => {}
            None => break,
        }
    }
    Ok(out)
}

/// Every head of `compat` that exists, newest first, with the newest floor and the heads that
/// cannot be used (each with why, the newest [`MAX_FAULTY_LISTED`] of them; `faulty_count` counts
/// all: anyone can write a million junk heads, and a report naming each would be the attack).
pub struct CompatHeads {
    pub floor: Option<FloorRecord>,
    pub heads: Vec<HeadRecord>,
    pub faulty: Vec<FaultyHead>,
    pub faulty_count: u64,
}

/// How many faulty heads of one compat id `all_heads` names.
pub const MAX_FAULTY_LISTED: usize = 64;

/// Every head of `compat` (see `CompatHeads`).
pub fn all_heads(
    store: &dyn Store,
    layout: &KeyLayout,
    compat: &CompatId,
) -> Result<CompatHeads, CatalogError> {
    let mut walk = HeadWalk::new(store, layout, compat)?;
    let (mut heads, mut faulty, mut faulty_count) = (Vec::new(), Vec::new(), 0);
    while let Some(entry) = walk.next_head()? {
        match entry {
            Ok(h) => heads.push(h),
            Err(f) => {
                faulty_count += 1;
                if faulty.len() < MAX_FAULTY_LISTED {
                    faulty.push(f);
                }
            }
        }
    }
    Ok(CompatHeads {
        floor: walk.floor.take(),
        heads,
        faulty,
        faulty_count,
    })
}
