//! Picking what to install: the heads of the compat id newest first, each judged by the trust,
//! its manifest read and checked against where it was found, its packs looked up; the newest
//! complete one among the newest `fallback_depth + 1` admitted heads, else the newest incomplete.
//! Every head passed over is in the report with why.

use crate::catalog::{self, FaultyHead, KeyLayout};
use crate::generation::{CompatId, GenerationId, HeadRecord, Manifest};
use crate::store::Store;
use crate::trust::{Signer, TrustPolicy};

use super::gate::Cutoff;
use super::report::{InstallError, PassReason, Progress, RefusedHead};

/// How many heads an install passes over (refused by its trust, faulty, incomplete in the
/// store) before it gives up: anyone can write heads, so the walk is bounded whatever is there.
/// Publish checks its head is reachable within the same bound (`publish::reach`).
const MAX_PASSED_OVER: usize = catalog::MAX_FAULTY_PASSED;

/// What the pick reads by and judges against.
pub(super) struct PickContext<'a> {
    pub(super) store: &'a dyn Store,
    pub(super) layout: &'a KeyLayout,
    pub(super) compat: CompatId,
    pub(super) cache_kind: &'a str,
    pub(super) trust: &'a TrustPolicy,
    pub(super) fallback_depth: usize,
    pub(super) cutoff: &'a Cutoff,
    /// The generation the record beside the root says is whole there (`StoredRecord::whole`):
    /// reached among the admitted heads, it is picked without reading its manifest.
    pub(super) recorded: Option<GenerationId>,
}

/// The generation picked, with what the report says of it.
pub(super) struct Picked {
    pub(super) seq: u64,
    pub(super) id: GenerationId,
    pub(super) manifest: Manifest,
    pub(super) signer: Signer,
    /// Newer generations passed over because their policy recorded them incomplete.
    pub(super) newer_incomplete: Vec<GenerationId>,
}

/// What a pick chose: a generation whose manifest it read and checked, or the one the root's
/// record says is already whole there, whose manifest it did not read.
pub(super) enum Choice {
    Fetched(Box<Picked>),
    Recorded(Recorded),
}

/// The recorded generation reached among the admitted heads, with what the report says of it.
pub(super) struct Recorded {
    pub(super) seq: u64,
    pub(super) id: GenerationId,
    pub(super) signer: Signer,
    /// Newer generations passed over because their policy recorded them incomplete.
    pub(super) newer_incomplete: Vec<GenerationId>,
}

/// The heads an install may take, newest first, read from the store as they are needed: the
/// newest first (an install's fixed cost), more only when it will not do. A pick resumes after
/// the last candidate it returned, so a generation found damaged in staging sends the next pick
/// to an older one.
#[derive(Default)]
pub(super) struct Candidates {
    read: Vec<Result<HeadRecord, FaultyHead>>,
    /// Index into `read` of the next head to judge.
    next: usize,
    /// No head below the last one read.
    exhausted: bool,
    /// Heads the trust admitted and that were tried: the newest and up to `fallback_depth` older.
    pub(super) admitted: usize,
}

/// A usable generation its policy recorded as incomplete, taken only when no complete one
/// follows it.
struct Incomplete {
    picked: Picked,
    /// Where the pick resumes should this one turn out damaged.
    resume_at: usize,
}

impl Candidates {
    /// True when no head at all was found.
    pub(super) fn none_found(&self) -> bool {
        self.read.is_empty()
    }

    /// The next candidate whose head the trust admits and whose manifest and packs are all in
    /// the store right now: a complete one if there is one among the newest admitted, else the
    /// newest incomplete one.
    pub(super) fn pick(
        &mut self,
        cx: &PickContext,
        progress: &mut Progress,
    ) -> Result<Option<Choice>, InstallError> {
        let mut newest_incomplete: Option<Incomplete> = None;
        let mut passed_incomplete = Vec::new();
        while let Some(head) = self.next_admitted(cx, progress)? {
            // Complete (the record is whole only for a complete generation), so the pick would
            // take it; whether it is still on disk as recorded is the caller's to check.
            if cx.recorded == Some(head.record.generation) {
                return Ok(Some(Choice::Recorded(Recorded {
                    seq: head.seq,
                    id: head.record.generation,
                    signer: head.signer,
                    newer_incomplete: passed_incomplete,
                })));
            }
            let Some(manifest) = usable_manifest(cx, &head, progress)? else {
                continue;
            };
            let picked = Picked {
                seq: head.seq,
                id: head.record.generation,
                manifest,
                signer: head.signer,
                newer_incomplete: Vec::new(),
            };
            if picked.manifest.incomplete.is_none() {
                return Ok(Some(Choice::Fetched(Box::new(Picked {
                    newer_incomplete: passed_incomplete,
                    ..picked
                }))));
            }
            tracing::info!(generation = %picked.id, "generation is an incomplete cache; looking for an older complete one");
            passed_incomplete.push(picked.id);
            if newest_incomplete.is_none() {
                let resume_at = self.next;
                newest_incomplete = Some(Incomplete { picked, resume_at });
            }
        }
        // No complete one: the newest incomplete one, which the report marks as such. Should its
        // packs turn out damaged, the next pick starts after it.
        let Some(Incomplete { picked, resume_at }) = newest_incomplete else {
            return Ok(None);
        };
        passed_incomplete.retain(|g| *g != picked.id);
        self.next = resume_at;
        Ok(Some(Choice::Fetched(Box::new(Picked {
            newer_incomplete: passed_incomplete,
            ..picked
        }))))
    }

    /// The next head the trust admits, reading more heads as needed; `None` when there is none
    /// left to try (no more heads, `fallback_depth` exhausted, or `MAX_PASSED_OVER` reached).
    fn next_admitted(
        &mut self,
        cx: &PickContext,
        progress: &mut Progress,
    ) -> Result<Option<AdmittedHead>, InstallError> {
        loop {
            if self.next == self.read.len() {
                if self.exhausted {
                    return Ok(None);
                }
                // The newest alone first; then a batch, read once it does not do; then the rest
                // of what an install may pass over. Each batch opens a walk again (listing every
                // head on a store that lists), so a store flooded with junk costs three walks,
                // not one per 16 heads (issue 39: 16 listings of 10^6 junk heads took 129 s).
                let n = match self.read.len() {
                    0 => 1,
                    1 => 16,
                    read => MAX_PASSED_OVER.saturating_sub(read).max(1),
                };
                self.read_heads(cx, n)?;
                continue;
            }
            if self.next >= MAX_PASSED_OVER {
                tracing::warn!(
                    passed = self.next,
                    "gave up looking for an installable head"
                );
                return Ok(None);
            }
            if self.admitted > cx.fallback_depth {
                return Ok(None);
            }
            cx.cutoff.check()?;
            let entry = self.read[self.next].clone();
            self.next += 1;
            let record = match entry {
                Ok(h) => h,
                Err(f) => {
                    progress.pass_over(f.seq, None, PassReason::Faulty, f.fault.to_string());
                    continue;
                }
            };
            let signer = cx.trust.judge(cx.layout.namespace(), &record);
            let what = format_args!("generation {}", record.generation);
            if !cx.trust.admits(&signer, &what) {
                let why = signer.to_string();
                progress.pass_over(
                    record.seq,
                    Some(record.generation),
                    PassReason::Untrusted,
                    why,
                );
                progress.refused.push(RefusedHead {
                    seq: record.seq,
                    generation: record.generation,
                    signer,
                });
                continue;
            }
            self.admitted += 1;
            return Ok(Some(AdmittedHead {
                seq: record.seq,
                record,
                signer,
            }));
        }
    }

    /// Reads up to `n` more heads below the last one read.
    fn read_heads(&mut self, cx: &PickContext, n: usize) -> Result<(), InstallError> {
        let mut walk = catalog::HeadWalk::new(cx.store, cx.layout, &cx.compat)?;
        if let Some(last) = self.read.last() {
            walk.start_below(match last {
                Ok(h) => h.seq,
                Err(f) => f.seq,
            });
        }
        for _ in 0..n {
            match walk.next_head()? {
                Some(entry) => self.read.push(entry),
                None => {
                    self.exhausted = true;
                    break;
                }
            }
        }
        Ok(())
    }
}

struct AdmittedHead {
    seq: u64,
    record: HeadRecord,
    signer: Signer,
}

/// The head's manifest if it can be installed from: present, readable, of the compat id and kind
/// it was found under, every pack in the store. Otherwise the head is passed over, saying why.
fn usable_manifest(
    cx: &PickContext,
    head: &AdmittedHead,
    progress: &mut Progress,
) -> Result<Option<Manifest>, InstallError> {
    let generation = head.record.generation;
    let (reason, why) = match catalog::read_manifest(cx.store, cx.layout, &generation)? {
        catalog::ManifestRead::Present(m)
            if m.compat_id != cx.compat || m.cache_kind != cx.cache_kind =>
        {
            let e = InstallError::CrossCompat {
                head: cx.compat,
                kind: cx.cache_kind.to_owned(),
                generation,
                manifest_compat: m.compat_id,
                manifest_kind: m.cache_kind.clone(),
            };
            (PassReason::Damaged, e.to_string())
        }
        catalog::ManifestRead::Present(m) => {
            if catalog::packs_present(cx.store, cx.layout, &m)? {
                // The manifest decoded under the head's id, so that is its id (no re-encode).
                return Ok(Some(*m));
            }
            let why = "packs missing (evicted or removed)";
            (PassReason::Missing, why.to_owned())
        }
        catalog::ManifestRead::Missing => {
            let why = "manifest missing (evicted or removed)";
            (PassReason::Missing, why.to_owned())
        }
        catalog::ManifestRead::Unreadable(e) => {
            (PassReason::Damaged, format!("manifest unreadable: {e}"))
        }
    };
    progress.pass_over(head.seq, Some(generation), reason, why);
    Ok(None)
}
