//! Scrub: re-reads a random sample of the packs that kept generations name, checks each against
//! its generation's manifest (its size, and the blake3 of every file with bytes in it), and puts
//! back from the durable tier what the fast tier lost or damaged. Eviction is silent and store
//! bugs are quiet, so an operator learns "the store lost N packs" here (`verify --sample N`, and
//! `watch`'s periodic scrub with its `jitship_store_scrub_*` metrics) before an install misses.
//!
//! What is read is bounded: the catalog (heads and manifests, as `ls` reads it), then each
//! sampled pack under its manifest's size as a cap, plus, for a file whose bytes span packs, its
//! other packs one at a time. Repair writes only a copy that checked: a damaged fast-tier value
//! is removed first (Mooncake never overwrites a key), then the durable tier's bytes are put.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;

use crate::catalog::{self, KeyLayout, ManifestRead};
use crate::generation::{ContentHash, ContentHasher, GenerationId, Manifest};
use crate::inspect::{self, InspectError, ManifestState};
use crate::store::{Store, StoreError, ValueClass};
use crate::trust::TrustPolicy;

/// What one scrub found. Counters are of packs (distinct pack ids).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ScrubReport {
    /// Kept generations whose manifests were read.
    pub generations: u64,
    /// Distinct packs they name.
    pub packs: u64,
    /// Packs sampled and read.
    pub checked: u64,
    /// Sampled packs the fast tier (the store, without a durable tier) did not hold.
    pub missing: u64,
    /// Sampled packs the fast tier held with the wrong size or bytes.
    pub corrupt: u64,
    /// Missing or corrupt packs put back from the durable tier, checked.
    pub repaired: u64,
    /// Kept generations whose manifest could not be read (missing or corrupt): their packs
    /// cannot be sampled.
    pub manifests_unreadable: u64,
    pub findings: Vec<Finding>,
    pub duration_ms: u64,
}

impl ScrubReport {
    /// Nothing is wrong now: every finding was repaired and every manifest was read.
    pub fn clean(&self) -> bool {
        self.manifests_unreadable == 0 && self.findings.iter().all(|f| f.repaired)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub generation: GenerationId,
    pub pack: ContentHash,
    /// "missing" or "corrupt".
    pub problem: &'static str,
    pub detail: String,
    pub repaired: bool,
    /// Why it was not repaired.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_repaired: Option<String>,
}

/// Scrubs up to `sample` packs of the generations `store`'s heads keep. With a durable tier
/// (`Store::tiers`), the fast tier is what is checked and, with `repair`, repaired; the catalog
/// is read through both. Errors are for a store that cannot be asked; what is wrong in it is in
/// the report.
pub fn scrub(
    store: &dyn Store,
    layout: &KeyLayout,
    trust: &TrustPolicy,
    sample: usize,
    repair: bool,
) -> Result<ScrubReport, InspectError> {
    let started = std::time::Instant::now();
    let mut report = ScrubReport::default();
    let (checked_tier, durable) = match store.tiers() {
        Some((fast, durable)) => (fast, Some(durable)),
        None => (store, None),
    };
    let survey = inspect::survey(store, layout, trust)?;
    let mut ids: Vec<GenerationId> = Vec::new();
    for (_, g) in survey.generations() {
        if ids.contains(&g.id) {
            continue;
        }
        ids.push(g.id);
        if !matches!(g.state, ManifestState::Present(_)) {
            report.manifests_unreadable += 1;
        }
    }
    // Pass 1: a uniform sample of the distinct packs (reservoir), one manifest in memory at once.
    let mut rng = Rng::new();
    let mut seen: HashSet<ContentHash> = HashSet::new();
    let mut chosen: Vec<(GenerationId, ContentHash)> = Vec::new();
    for id in &ids {
        let Some(m) = manifest(store, layout, id)? else {
            continue;
        };
        report.generations += 1;
        for p in &m.packs {
            if !seen.insert(p.id) {
                continue;
            }
            report.packs += 1;
            if chosen.len() < sample {
                chosen.push((*id, p.id));
            } else {
                let j = rng.below(report.packs);
                if (j as usize) < sample {
                    chosen[j as usize] = (*id, p.id);
                }
            }
        }
    }
    // Pass 2: check each chosen pack with its generation's manifest.
    let mut by_generation: BTreeMap<GenerationId, Vec<ContentHash>> = BTreeMap::new();
    for (g, p) in chosen {
        by_generation.entry(g).or_default().push(p);
    }
    for (id, packs) in by_generation {
        let Some(m) = manifest(store, layout, &id)? else {
            continue;
        };
        for pack in packs {
            let Some(pi) = m.packs.iter().position(|p| p.id == pack) else {
                continue;
            };
            report.checked += 1;
            let key = layout.pack(&pack);
            let read = read_pack(checked_tier, &key, m.packs[pi].size)?;
            let verdict = match read {
                Read::Missing => Some(("missing", "not in the store (evicted or removed)".into())),
                Read::Bytes(bytes) => {
                    judge(&bytes, &m, pi, checked_tier, layout)?.map(|why| ("corrupt", why))
                }
                Read::Other(why) => Some(("corrupt", why)),
            };
            let Some((problem, detail)) = verdict else {
                continue;
            };
            match problem {
                "missing" => report.missing += 1,
                _ => report.corrupt += 1,
            }
            let outcome = match durable {
                None => Err("no durable tier to repair from".to_owned()),
                Some(_) if !repair => Err("not asked to repair (--repair)".to_owned()),
                Some(durable) => put_back(checked_tier, durable, layout, &m, pi, problem)?,
            };
            tracing::warn!(
                generation = %id,
                pack = %pack,
                problem,
                detail = %detail,
                repaired = outcome.is_ok(),
                not_repaired = outcome.as_ref().err().map(String::as_str),
                "scrub: a pack a kept generation needs is {problem}"
            );
            report.repaired += u64::from(outcome.is_ok());
            report.findings.push(Finding {
                generation: id,
                pack,
                problem,
                detail,
                repaired: outcome.is_ok(),
                not_repaired: outcome.err(),
            });
        }
    }
    report.duration_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

fn manifest(
    store: &dyn Store,
    layout: &KeyLayout,
    id: &GenerationId,
) -> Result<Option<Manifest>, InspectError> {
    Ok(match catalog::read_manifest(store, layout, id)? {
        ManifestRead::Present(m) => Some(*m),
        ManifestRead::Missing | ManifestRead::Unreadable(_) => None,
    })
}

enum Read {
    Missing,
    Bytes(Vec<u8>),
    /// Something that is not the pack (its size is wrong).
    Other(String),
}

/// A pack's value, read under its manifest size as a cap (anyone can put a pack key).
fn read_pack(store: &dyn Store, key: &str, size: u64) -> Result<Read, StoreError> {
    match store.get_capped(key, size) {
        Ok(None) => Ok(Read::Missing),
        Ok(Some(b)) if b.len() as u64 == size => Ok(Read::Bytes(b)),
        Ok(Some(b)) => Ok(Read::Other(format!(
            "{} bytes, the manifest says {size}",
            b.len()
        ))),
        Err(StoreError::TooLarge { size: actual, .. }) => Ok(Read::Other(format!(
            "{actual} bytes, the manifest says {size}"
        ))),
        Err(e) => Err(e),
    }
}

/// Why `bytes`, read as pack `pi` of `m`, are not that pack (`None`: they are). Every file with
/// bytes in it is hashed; a file spanning packs reads its other packs from `store`, one at a
/// time, and is skipped when one of them is missing (that pack's own check finds it).
fn judge(
    bytes: &[u8],
    m: &Manifest,
    pi: usize,
    store: &dyn Store,
    layout: &KeyLayout,
) -> Result<Option<String>, StoreError> {
    let mut other: Option<(u32, Vec<u8>)> = None;
    'files: for f in &m.files {
        if !f.chunks.iter().any(|c| c.pack as usize == pi) {
            continue;
        }
        let mut hasher = ContentHasher::new();
        for c in &f.chunks {
            let source: &[u8] = if c.pack as usize == pi {
                bytes
            } else {
                if other.as_ref().is_none_or(|(p, _)| *p != c.pack) {
                    let pack = &m.packs[c.pack as usize];
                    match read_pack(store, &layout.pack(&pack.id), pack.size)? {
                        Read::Bytes(b) => other = Some((c.pack, b)),
                        Read::Missing | Read::Other(_) => continue 'files,
                    }
                }
                &other.as_ref().expect("just read").1
            };
            let (from, to) = (c.offset as usize, (c.offset + c.len) as usize);
            let Some(piece) = source.get(from..to) else {
                return Ok(Some(format!("file {} points outside its pack", f.path)));
            };
            hasher.update(piece);
        }
        let actual = hasher.finish();
        if actual != f.blake3 {
            return Ok(Some(format!(
                "file {}: its bytes hash to {actual}, the manifest says {}",
                f.path, f.blake3
            )));
        }
    }
    Ok(None)
}

/// Puts pack `pi` of `m` back into `fast` from `durable`, once the durable copy checked.
/// `Err(why)` when it could not be; `Ok(Err)` only when a store cannot be asked.
fn put_back(
    fast: &dyn Store,
    durable: &dyn Store,
    layout: &KeyLayout,
    m: &Manifest,
    pi: usize,
    problem: &str,
) -> Result<Result<(), String>, StoreError> {
    let pack = &m.packs[pi];
    let key = layout.pack(&pack.id);
    let bytes = match read_pack(durable, &key, pack.size)? {
        Read::Bytes(b) => b,
        Read::Missing => return Ok(Err("the durable tier does not hold it either".into())),
        Read::Other(why) => return Ok(Err(format!("the durable tier's copy is {why}"))),
    };
    if let Some(why) = judge(&bytes, m, pi, durable, layout)? {
        return Ok(Err(format!(
            "the durable tier's copy is damaged too: {why}"
        )));
    }
    if problem != "missing" {
        // Mooncake keeps an existing value on put: the damaged one goes first. Reading it just
        // now leased it (10 s by default), so on Mooncake this usually waits for the next scrub.
        match fast.remove(&key) {
            Ok(_) => {}
            Err(StoreError::Leased(_)) => {
                return Ok(Err(
                    "the damaged copy is leased by a read (this scrub's own, for the master's \
                     lease TTL); the next scrub replaces it"
                        .into(),
                ));
            }
            Err(e) => return Err(e),
        }
    }
    if let Err(e) = fast.put(&key, &bytes, ValueClass::Bulk) {
        return Ok(Err(format!("the fast tier refused the copy: {e}")));
    }
    Ok(Ok(()))
}

/// A small generator for the sample (xorshift64*), seeded from the OS: which packs a scrub reads
/// needs no more than not being the same every time.
struct Rng(u64);

impl Rng {
    fn new() -> Self {
        let mut seed = [0u8; 8];
        let _ = getrandom::fill(&mut seed);
        Self(u64::from_le_bytes(seed) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform enough in `0..n` for n far below 2^64.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
