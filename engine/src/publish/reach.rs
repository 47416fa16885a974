//! Keeping this publisher's head where installs find it (issue 39; `docs/threat-model.md`).
//!
//! Anyone can write a head key, and an install walks heads newest first, passing over at most
//! [`catalog::MAX_FAULTY_PASSED`] it cannot use. A publisher writes above the newest seq anyone
//! wrote, so its head is the first an install reads. Two attacks remain, and two rules answer them:
//!
//! - **Seqs pushed to the ceiling.** A record at (or just below) `MAX_SEQ` leaves no seq above it.
//!   When the newest seq is in the upper half of the range ([`is_high`]: no honest chain gets
//!   there, it would take 2^52 publishes), a signing publisher under `[trust] mode = "required"`
//!   removes the heads its trust refuses above its base and writes just above its base: the
//!   trusted chain stays low and contiguous, and nothing untrusted is left above the new head.
//!   Under `required` no install may use a refused head, so removing one takes nothing from
//!   anyone. At most [`MAX_REMOVED_PER_PUBLISH`] go per publish, to keep a publish bounded.
//!   Below the upper half nothing is removed: an honest unsigned history stays for `ls` and gc.
//! - **No publisher reports success for a head installs cannot reach** (`check_reachable`): after
//!   the head is written, the install's own walk must reach it (or a head above it that the
//!   trust admits, another trusted publisher's) within the install's bound. A signing publisher
//!   under `required` removes what was written above it meanwhile and looks once more; any other
//!   publisher fails, saying why.

use crate::catalog::{self, KeyLayout, LeaseWait};
use crate::generation::CompatId;
use crate::store::Store;
use crate::trust::PublishTrust;

use super::PublishError;

/// How many refused or faulty heads one publish reads and removes above its base: a flood of a
/// million costs one publish (on the local store about ... s; `docs/threat-model.md`), a larger
/// one more publishes, each failing with `PublishError::Flooded` until the flood is cleared.
pub const MAX_REMOVED_PER_PUBLISH: usize = 1 << 20;

/// How many keys one removal round takes (memory stays bounded however many go).
const REMOVAL_CHUNK: usize = 4096;

/// Whether `seq` is in the upper half of the seq range, where only a store writer puts heads.
pub fn is_high(seq: u64) -> bool {
    seq > catalog::MAX_SEQ / 2
}

/// How a publish waits out readers' leases on the junk it removes (Mooncake leases a key an
/// install just read for 10 s).
const JUNK_LEASE_WAIT: LeaseWait = LeaseWait {
    interval: std::time::Duration::from_millis(500),
    rounds: 30,
};

/// Removes the head records at `seqs` (refused by this publisher's trust, or faulty); returns the
/// seqs it could not remove, each logged.
pub(super) fn remove_heads(
    store: &dyn Store,
    layout: &KeyLayout,
    compat: &CompatId,
    seqs: &[u64],
) -> Vec<u64> {
    if seqs.is_empty() {
        return vec![];
    }
    let (mut removed, mut kept) = (0, Vec::new());
    for chunk in seqs.chunks(REMOVAL_CHUNK) {
        let keys: Vec<String> = chunk.iter().map(|&s| layout.head(compat, s)).collect();
        let removal = catalog::remove_waiting_out_leases(store, &keys, JUNK_LEASE_WAIT);
        removed += removal.removed.len();
        for (key, e) in &removal.failed {
            tracing::warn!(key = %key, "could not remove a refused head: {e}");
        }
        let failed: std::collections::HashSet<&str> =
            removal.failed.iter().map(|(k, _)| k.as_str()).collect();
        kept.extend(
            chunk
                .iter()
                .copied()
                .filter(|&s| failed.contains(layout.head(compat, s).as_str())),
        );
    }
    tracing::warn!(
        compat = %compat,
        removed,
        failed = kept.len(),
        "removed head records this publisher's trust refuses above its base (trust mode required)"
    );
    kept
}

/// Checks that an install's walk (newest first, passing over at most
/// `catalog::MAX_FAULTY_PASSED` heads) reaches the head at `seq` or one above it that `trust`
/// admits. A signing publisher under `required` removes what it passed over and looks again.
pub(super) fn check_reachable(
    store: &dyn Store,
    layout: &KeyLayout,
    compat: &CompatId,
    seq: u64,
    trust: &PublishTrust,
) -> Result<(), PublishError> {
    let mut cleared = false;
    loop {
        let mut walk = catalog::HeadWalk::new(store, layout, compat)?;
        let mut passed = Vec::new();
        while passed.len() <= catalog::MAX_FAULTY_PASSED {
            match walk.next_head()? {
                Some(Ok(h)) if h.seq >= seq && trust.admits(layout.namespace(), &h) => {
                    return Ok(());
                }
                Some(Ok(h)) if h.seq > seq => passed.push(h.seq),
                Some(Err(f)) if f.seq > seq => passed.push(f.seq),
                // At or below ours and not ours: ours vanished (evicted or removed).
                Some(_) | None => break,
            }
        }
        if !cleared && trust.removes_untrusted() && !passed.is_empty() {
            remove_heads(store, layout, compat, &passed);
            cleared = true;
            continue;
        }
        return Err(PublishError::Unreachable {
            seq,
            passed: passed.len(),
        });
    }
}
