//! Walking a sequence of records that anyone can write to, newest first, at a bounded cost.
//!
//! Sequences (`head`, `index`, `floor`, `gc`) are appended at `newest + 1`. A store writer
//! without the signing key can still put any key: a record at seq 2^64-1, one far above the
//! newest, records at exactly the seqs a probe looks at, or a long run of junk. The rules that keep
//! every reader's cost bounded whatever was written:
//!
//! - Seqs live in `1..=MAX_SEQ`. A key above it is out of range: never read, never built on,
//!   never a reason to write above it, so sequence arithmetic cannot overflow or wrap.
//! - A walk yields the seqs that exist, newest first. On a store that lists keys that is exact.
//!   Without listing (Mooncake) each step searches `[from, below)` by doubling from `from` and
//!   bisecting, then walks down one seq at a time while the run stays contiguous: a contiguous
//!   run costs one `exists` per record, and a search at most `2 x 53` of them, so a record
//!   planted at a probe point costs a reader one search, never a walk over the gap below it.
//! - The walk never decides what a record means: its caller reads and judges each one (decoded,
//!   labelled with its own key, under the size cap, trusted) and goes on to the next when it will
//!   not do. Callers bound how many they pass over.

use jitship_store::{Store, StoreError};

/// The highest seq of any sequence. 2^53 is the largest integer every JSON reader keeps exact,
/// and at one record a second it would take 285 million years to reach.
pub const MAX_SEQ: u64 = 1 << 53;

/// The seqs of one sequence that exist, newest first (see the module docs).
pub struct SeqWalk<'a> {
    store: &'a dyn Store,
    key: Box<dyn Fn(u64) -> String + 'a>,
    source: Source,
    /// The last seq yielded: every later one is below it.
    last: u64,
    /// `exists` calls made so far (probing only).
    pub probes: u64,
}

enum Source {
    /// Every seq in range that the store listed, ascending; popped from the end.
    Listed(Vec<u64>),
    /// Ranges `[from, below)` to search, the one holding the newest seqs last; `searched` is false
    /// until the range's top was found by a search (after that the walk steps down).
    Probed(Vec<Range>),
}

#[derive(Debug, Clone, Copy)]
struct Range {
    from: u64,
    below: u64,
    searched: bool,
}

impl<'a> SeqWalk<'a> {
    /// A walk over the keys `key(seq)` under `prefix`. Without listing, `starts` are the seqs the
    /// sequence may be contiguous from (1, or head floors): each starts a range that ends where
    /// the next begins.
    pub fn new(
        store: &'a dyn Store,
        prefix: &str,
        key: impl Fn(u64) -> String + 'a,
        starts: &[u64],
    ) -> Result<Self, StoreError> {
        let source = if store.capabilities().listing {
            let mut seqs: Vec<u64> = store
                .list(prefix)?
                .iter()
                .filter_map(|k| parse_seq(k.strip_prefix(prefix)?))
                .collect();
            seqs.sort_unstable();
            seqs.dedup();
            Source::Listed(seqs)
        } else {
            let mut starts: Vec<u64> = starts
                .iter()
                .copied()
                .filter(|&s| (1..=MAX_SEQ).contains(&s))
                .collect();
            if starts.is_empty() {
                starts.push(1);
            }
            starts.sort_unstable();
            starts.dedup();
            let mut ranges = Vec::with_capacity(starts.len());
            for (i, &from) in starts.iter().enumerate() {
                let below = starts.get(i + 1).copied().unwrap_or(MAX_SEQ + 1);
                ranges.push(Range {
                    from,
                    below,
                    searched: false,
                });
            }
            Source::Probed(ranges)
        };
        Ok(Self {
            store,
            key: Box::new(key),
            source,
            last: MAX_SEQ + 1,
            probes: 0,
        })
    }

    /// Adds single seqs known to exist apart from the contiguous runs (heads a gc floor keeps).
    pub fn also(&mut self, seqs: &[u64]) {
        if let Source::Probed(ranges) = &mut self.source {
            for &s in seqs.iter().filter(|&&s| (1..=MAX_SEQ).contains(&s)) {
                ranges.push(Range {
                    from: s,
                    below: s + 1,
                    searched: false,
                });
            }
            // Newest last; a point inside a wider range is visited once (seqs only go down).
            ranges.sort_by_key(|r| (r.below, std::cmp::Reverse(r.from)));
        }
    }

    /// Goes on below `seq` (the seqs at and above it were seen before).
    pub fn start_below(&mut self, seq: u64) {
        self.last = self.last.min(seq);
    }

    fn exists(&mut self, seq: u64) -> Result<bool, StoreError> {
        self.probes += 1;
        self.store.exists(&(self.key)(seq))
    }

    /// The next existing seq below the last one yielded, or `None` when there is none.
    pub fn next_seq(&mut self) -> Result<Option<u64>, StoreError> {
        let found = match &mut self.source {
            Source::Listed(seqs) => loop {
                match seqs.pop() {
                    Some(s) if s < self.last => break Some(s),
                    Some(_) => continue,
                    None => break None,
                }
            },
            Source::Probed(_) => self.next_probed()?,
        };
        if let Some(s) = found {
            self.last = s;
        }
        Ok(found)
    }

    fn next_probed(&mut self) -> Result<Option<u64>, StoreError> {
        loop {
            let Source::Probed(ranges) = &mut self.source else {
                unreachable!("called for probing stores only")
            };
            let Some(range) = ranges.last_mut() else {
                return Ok(None);
            };
            let from = range.from;
            let below = range.below.min(self.last);
            let searched = range.searched;
            if below <= from {
                ranges.pop();
                continue;
            }
            // A run found by a search is walked down one seq at a time while it is contiguous.
            if searched {
                let seq = below - 1;
                if self.exists(seq)? {
                    return Ok(Some(seq));
                }
                // A gap: search what is below it.
                self.set_top(below - 1, false);
                continue;
            }
            if !self.exists(from)? {
                self.pop_range();
                continue;
            }
            // Doubling from `from` while seqs exist, then bisecting: lo exists, hi does not (or is
            // the bound).
            let (mut lo, mut step) = (from, 1u64);
            let mut hi = loop {
                let hi = lo.saturating_add(step).min(below);
                if hi >= below || !self.exists(hi)? {
                    break hi;
                }
                lo = hi;
                step = step.saturating_mul(2);
            };
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if self.exists(mid)? {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            self.set_top(below, true);
            return Ok(Some(lo));
        }
    }

    fn set_top(&mut self, below: u64, searched: bool) {
        if let Source::Probed(ranges) = &mut self.source
            && let Some(r) = ranges.last_mut()
        {
            r.below = below;
            r.searched = searched;
        }
    }

    fn pop_range(&mut self) {
        if let Source::Probed(ranges) = &mut self.source {
            ranges.pop();
        }
    }
}

/// A seq as it appears in a key: decimal, no sign or leading zero, in `1..=MAX_SEQ`.
pub fn parse_seq(text: &str) -> Option<u64> {
    if text.is_empty() || text.starts_with('0') || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok().filter(|s| (1..=MAX_SEQ).contains(s))
}
