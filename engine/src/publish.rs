//! Publishing a cache root as a generation.
//!
//! Order of writes (invariant 1): packs, then the manifest, then the head record. A reader only
//! finds generations through heads, so a crash anywhere leaves nothing visible; the packs and
//! manifest already written are reused by the next publish (puts of existing keys are no-ops) or
//! collected by gc.
//!
//! Steps: scan -> policy.select -> read the newest head and its manifest (the parent) -> hash the
//! selected files not already known -> merge onto the parent -> plan packs for contents the parent
//! lacks -> upload the packs the store lacks -> make sure the compat id is in the compat index
//! (`catalog::ensure_indexed`, so gc and `ls` find it without listing) -> put manifest -> put head
//! seq+1, read it back, and if another publisher won that seq, merge onto its generation and try
//! the next seq (details and the in-flight-put cases: `commit_head`).
//!
//! Reading: small files hashed are kept in memory for their pack, up to one pack's worth
//! (`KeptContents`), so most of a kernel cache is read once; larger files and the rest are read
//! again when their pack is filled, and a change since hashing fails the publish. Packs are
//! filled in place in the store's put buffer (`Store::put_filled`), two at a time.
//!
//! Conflict rule (one path, two contents): the generation already published wins (the head's
//! version when building on it; the winner's when a head race was lost), and the other version is
//! reported in `PublishReport::conflicts`.
//!
//! A head whose manifest is missing or corrupt is not a parent (a fresh chain starts above it);
//! a parent whose packs were evicted or collected is used without the files they held.
//!
//! Deduplication is checked: a pack already in the store is read back and checked before the new
//! generation names it (one holding other bytes is put under a salted key instead), and so are the
//! parent's packs once a generation is to be written (files in one that fails are dropped from
//! the parent and uploaded again); a watcher checks each parent once (`packs`).
//!
//! Signing (`crate::trust`): every head this publisher writes is signed with its key, including the
//! heads it writes after merging a lost head race. A head its trust does not admit (unsigned,
//! untrusted or forged, under `required`) is never a parent and never merged: the publish builds on
//! the newest admitted head below it and writes its signed head above the refused one.

mod hashing;
mod head;
mod packs;
mod reach;
mod report;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::Instant;

use crate::catalog::KeyLayout;
use crate::catalog::{self, ManifestRead, now_secs};
use crate::generation::{
    CompatId, Conflict, ContentHash, FORMAT_VERSION, FileRecord, GenerationId, HeadRecord,
    MAX_MANIFEST_BYTES, Manifest, PackPlan, RelPath, merge_files, place_files, plan_packs,
    prune_packs,
};
use crate::policy::{CachePolicy, PolicyError, ReasonCategory, Verdict};
use crate::scan::{self, ScannedFile};
use crate::store::Store;
use crate::trust::{PublishTrust, Signer};

pub use hashing::HashCache;
pub use report::{
    MAX_SKIP_DETAILS, PublishError, PublishOptions, PublishOutcome, PublishReport, RegistryPush,
    SkipDetail,
};

use hashing::{RootFiles, RootReader, Stored, hash_selected};
use head::commit_head;
use packs::{KeptContents, check_parent_packs, fill_durable_parent, upload_packs};

/// For a one-off publish: the root must exist (`watch` instead waits for a missing root to
/// appear, so `publish` itself treats a missing root as empty).
pub fn check_root_exists(root: &Path) -> Result<(), PublishError> {
    match std::fs::metadata(root) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(PublishError::RootNotDir(root.into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(PublishError::RootMissing(root.into()))
        }
        Err(source) => Err(PublishError::Scan {
            root: root.into(),
            source,
        }),
    }
}

/// Bound on pushing one generation to the durable registry tier (each read and connect has the
/// tier's own `timeout` besides).
const REGISTRY_PUSH_DEADLINE: std::time::Duration = std::time::Duration::from_secs(600);

/// Publishes `root` as a new generation (or reports it unchanged), then, with a durable registry
/// tier, pushes the newest generation the publisher trusts there (a push that fails is in the
/// report; the generation is published in the store all the same, and the next publish pushes
/// it). `hashes` is the watcher's memory of file hashes between publishes; a one-off publish
/// passes `None`, since what it would remember is dropped at exit (remembering 24,000 paths took
/// 6% of hashing).
pub fn publish(
    store: &dyn Store,
    layout: &KeyLayout,
    policy: &dyn CachePolicy,
    root: &Path,
    opts: &PublishOptions,
    hashes: Option<&mut HashCache>,
) -> Result<PublishReport, PublishError> {
    let Some(registry) = &opts.registry else {
        return publish_to_store(store, layout, policy, root, opts, hashes);
    };
    let deadline = Instant::now() + REGISTRY_PUSH_DEADLINE;
    let tee = crate::oci::registry::RegistryTee::new(store, registry, deadline);
    let mut report = publish_to_store(&tee, layout, policy, root, opts, hashes)?;
    if report.outcome != PublishOutcome::Empty {
        let started = Instant::now();
        let pushed = registry.push_newest(
            store,
            layout,
            opts.trust.policy(),
            &report.compat_id,
            deadline,
            &tee.pushed(),
        );
        let (generation, error) = match pushed {
            Ok(g) => (g, None),
            Err(e) => (None, Some(e.to_string())),
        };
        report.registry = Some(RegistryPush {
            registry: registry.describe(),
            generation,
            error,
            duration_ms: started.elapsed().as_millis() as u64,
        });
    }
    Ok(report)
}

/// The phases: select -> base -> hash -> plan and upload -> head.
fn publish_to_store(
    store: &dyn Store,
    layout: &KeyLayout,
    policy: &dyn CachePolicy,
    root: &Path,
    opts: &PublishOptions,
    mut hashes: Option<&mut HashCache>,
) -> Result<PublishReport, PublishError> {
    let started = Instant::now();
    check_can_start(opts)?;
    check_pack_size(store, opts.pack_size)?;
    let kind = policy.info().cache_kind.clone();
    let compat_key = policy
        .compat_key(&opts.facts)
        .map_err(policy_error(policy))?;
    let compat_id = CompatId::new(&kind, &compat_key);
    let mut base = find_base(store, layout, &compat_id, &opts.trust)?;
    let (sticky, settings_note) = recorded_settings(policy, &base, &opts.facts, &compat_key);
    let policy: &dyn CachePolicy = sticky.as_deref().unwrap_or(policy);
    let snap = scan_root(root)?;
    let selection = select(policy, root, &snap)?;
    let mut report = PublishReport::new(kind, root, compat_key, compat_id, &selection);
    report.parent_signer = base.signer.clone();
    report.policy = Some(policy.policy_ref());
    report.settings_kept_from = sticky
        .is_some()
        .then(|| base.head.as_ref().map(|h| h.generation))
        .flatten();
    report.settings_note = settings_note;

    let hashing = Instant::now();
    let kept = KeptContents::new(opts.pack_size);
    let files = RootFiles::open(root)?;
    let reader = RootReader {
        policy,
        files: &files,
        kept: &kept,
        interrupt: &opts.interrupt,
    };
    let parent = base.parent.as_ref();
    let memo = hashes.as_deref_mut();
    let local = hash_selected(&reader, &selection.files, parent, memo, &mut report)?;
    report.hash_ms = hashing.elapsed().as_millis() as u64;
    let mut new_files = new_files(&local, parent);
    report.files_new = new_files.len() as u64;
    if !base.needs_generation(new_files.is_empty(), report.incomplete.is_none()) {
        report.conflicts = conflicts_with_parent(&local, parent);
        report.outcome = match parent {
            Some(m) => PublishOutcome::Unchanged { generation: m.id() },
            None => PublishOutcome::Empty,
        };
        report.duration_ms = started.elapsed().as_millis() as u64;
        return Ok(report);
    }

    // Only now that a generation will be written: its parent's packs are read back and checked
    // before it inherits them, and copied into a durable tier that lacks them; files in one that
    // fails are uploaded again from here.
    let dropped = check_parent_packs(store, layout, &mut base, hashes.as_deref())?;
    if fill_durable_parent(store, layout, &mut base)? || dropped {
        new_files = self::new_files(&local, base.parent.as_ref());
        report.files_new = new_files.len() as u64;
    }
    let parent = base.parent.as_ref();
    let (mut plans, source_of) = plan_new_contents(&new_files, parent, opts.pack_size);
    // The manifest's size is known before any pack is uploaded (a pack that moves to a salted id
    // keeps an id of the same length): one the store would refuse, or installs could not read,
    // stops the publish here, with nothing written.
    let (planned, _) = new_manifest(policy, opts, &base, &new_files, &selection, &plans, &report);
    check_manifest_fits(store, &planned)?;
    drop(planned);
    let uploading = Instant::now();
    // A pack already in the store is checked first; one that held other bytes comes back with the
    // salted id its copy went under, and the manifest names that.
    upload_packs(store, layout, &reader, &mut plans, &source_of, &mut report)?;
    report.upload_ms = uploading.elapsed().as_millis() as u64;
    let (candidate, conflicts) =
        new_manifest(policy, opts, &base, &new_files, &selection, &plans, &report);
    report.conflicts.extend(conflicts);

    // Last point to stop at: from here on the head is written.
    if let Some(signal) = opts.interrupt.signal_name() {
        return Err(PublishError::Interrupted(signal));
    }
    // The policy module goes in the store before the head names it (through the manifest), so
    // gc, inspect and `policy test` can fetch it whatever becomes of the local file.
    store_policy_module(store, layout, policy, &mut report)?;
    // The compat index lets gc and `ls` find this compat id on stores that cannot list keys; it is
    // written before the head, so no head exists that the index does not lead to.
    let (kind, key) = (&candidate.cache_kind, &candidate.compat_key);
    catalog::ensure_indexed(store, layout, &compat_id, kind, key)?;
    let first_seq = base.first_seq;
    let (generation, seq) = commit_head(store, layout, candidate, first_seq, opts, &mut report)?;
    reach::check_reachable(store, layout, &compat_id, seq, &opts.trust)?;
    // Its packs are this publish's own or checked by it (not a race winner's it merged, nor
    // those of a head that carried its files).
    if let Some(memo) = hashes.filter(|_| report.merged.is_empty() && !report.carried) {
        memo.note_checked(generation);
    }
    report.outcome = PublishOutcome::Published { generation, seq };
    report.signed_by = opts
        .trust
        .signing_key()
        .map(|k| k.key_id().to_owned());
    report.duration_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

fn policy_error(policy: &dyn CachePolicy) -> impl Fn(PolicyError) -> PublishError + '_ {
    move |source| PublishError::Policy {
        policy: policy.info().name.clone(),
        source,
    }
}

/// Refuses to start when stopped before it began (the CLI's next cache after a signal: not even
/// a scan), or when the trust requires a signature and there is no key to sign with.
fn check_can_start(opts: &PublishOptions) -> Result<(), PublishError> {
    if let Some(signal) = opts.interrupt.signal_name() {
        return Err(PublishError::Interrupted(signal));
    }
    if opts.trust.policy().mode() == crate::config::TrustMode::Required
        && opts.trust.signing_key().is_none()
    {
        return Err(PublishError::NoSigningKey);
    }
    Ok(())
}

/// The root's files. A file where the root should be is never a cache (a missing root is: not
/// written yet); a root another user owns, or could write without being ours, is not published
/// from (`owner::check_owner`: they could plant files the publisher would sign).
fn scan_root(root: &Path) -> Result<scan::Snapshot, PublishError> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(root) {
        Ok(m) if !m.is_dir() => return Err(PublishError::RootNotDir(root.into())),
        Ok(m) => {
            crate::owner::check_owner(root, m.uid(), m.mode()).map_err(|e| PublishError::Scan {
                root: root.into(),
                source: std::io::Error::new(std::io::ErrorKind::PermissionDenied, e),
            })?
        }
        Err(_) => {}
    }
    scan::snapshot(root).map_err(|source| PublishError::Scan {
        root: root.into(),
        source,
    })
}

/// What the policy chose from the root: the files to publish and what it said of the rest.
struct Chosen<'s> {
    /// The files to publish, each with whether it embeds the root (then stored in the policy's
    /// root-independent form).
    files: Vec<(&'s ScannedFile, bool)>,
    markers: HashSet<&'s RelPath>,
    skipped: BTreeMap<ReasonCategory, u64>,
    skip_details: Vec<SkipDetail>,
    incomplete: Option<String>,
}

fn select<'s>(
    policy: &dyn CachePolicy,
    root: &Path,
    snap: &'s scan::Snapshot,
) -> Result<Chosen<'s>, PublishError> {
    let entries: Vec<_> = snap.files.iter().map(ScannedFile::entry).collect();
    let chosen = policy
        .select(root, &entries)
        .map_err(policy_error(policy))?;
    let incomplete = chosen.incomplete();
    let decisions = chosen.decisions;
    if decisions.len() != entries.len() {
        let name = policy.info().name.clone();
        return Err(PublishError::PolicyContract(
            name,
            decisions.len(),
            entries.len(),
        ));
    }
    let mut selection = Chosen {
        files: Vec::new(),
        markers: HashSet::new(),
        skipped: BTreeMap::new(),
        skip_details: Vec::new(),
        incomplete,
    };
    // What the scan never offers (links, special files, names that are not UTF-8) is left out by
    // jitship itself.
    for (path, reason) in &snap.unpublishable {
        selection.note_skip(path, ReasonCategory::Excluded, reason);
    }
    for (f, d) in snap.files.iter().zip(&decisions) {
        match d.verdict {
            Verdict::Publish => {
                if d.marker {
                    selection.markers.insert(&f.path);
                }
                selection.files.push((f, d.embeds_root));
            }
            Verdict::Skip => selection.note_skip(f.path.as_str(), d.category, &d.detail),
        }
    }
    Ok(selection)
}

impl Chosen<'_> {
    fn note_skip(&mut self, path: &str, category: ReasonCategory, detail: &str) {
        *self.skipped.entry(category).or_default() += 1;
        if self.skip_details.len() < MAX_SKIP_DETAILS {
            self.skip_details.push(SkipDetail {
                path: path.to_owned(),
                category,
                detail: detail.to_owned(),
            });
        }
    }
}

impl PublishReport {
    fn new(
        cache_kind: String,
        root: &Path,
        compat_key: String,
        compat_id: CompatId,
        selection: &Chosen,
    ) -> Self {
        Self {
            cache_kind,
            root: root.into(),
            compat_key,
            compat_id,
            outcome: PublishOutcome::Empty,
            files_selected: selection.files.len() as u64,
            skipped: selection.skipped.clone(),
            skip_details: selection.skip_details.clone(),
            incomplete: selection.incomplete.clone(),
            files_new: 0,
            files_hashed: 0,
            bytes_uploaded: 0,
            bytes_deduplicated: 0,
            packs_uploaded: 0,
            packs_reused: 0,
            conflicts: vec![],
            merged: vec![],
            head_attempts: 0,
            contributions: 0,
            carried: false,
            signed_by: None,
            parent_signer: None,
            hash_ms: 0,
            upload_ms: 0,
            duration_ms: 0,
            registry: None,
            module_not_stored: None,
            policy: None,
            settings_kept_from: None,
            settings_note: None,
        }
    }
}

/// Where a publish builds: the newest head this publisher may build on, its manifest as the
/// parent, and the seq to write first.
struct Base {
    /// The head this publish builds on (None: a fresh chain).
    head: Option<HeadRecord>,
    /// Who signed it.
    signer: Option<Signer>,
    /// Its manifest, less the files whose packs are gone; `None` when it is missing or corrupt.
    parent: Option<Manifest>,
    /// The parent lost packs (its files were dropped from `parent`).
    parent_damaged: bool,
    /// A head above the base (refused by the trust, corrupt, another place's) that this publish
    /// must write above, so readers find this publisher's head first.
    covers_refused_head: bool,
    /// A durable tier does not hold the base's head (added to a store that already held the
    /// chain, or it lost data): a generation is written over the base, so the durable tier
    /// announces one with every pack (`packs::fill_durable_parent`). False without tiers.
    unannounced_in_durable: bool,
    first_seq: u64,
}

/// The newest seq anyone wrote (this publish writes above it) and the newest head this
/// publisher may build on. A head whose manifest was evicted (or is corrupt) is no parent: this
/// publish starts a fresh chain above it. A parent with evicted packs is used without the files
/// those packs held (they are uploaded again from this root if it has them), so one lost pack
/// cannot make every later generation incomplete.
fn find_base(
    store: &dyn Store,
    layout: &KeyLayout,
    compat_id: &CompatId,
    trust: &PublishTrust,
) -> Result<Base, PublishError> {
    let mut walk = catalog::HeadWalk::new(store, layout, compat_id)?;
    let mut occupied = walk.newest_seq();
    // A store of two tiers walks its durable tier's heads; the fast tier may hold newer ones (a
    // durable tier added to a store that already held the chain): this publish writes above them
    // too, so its head never lands in a seq one tier already holds for another generation.
    if let Some((fast, _)) = store.tiers() {
        occupied = occupied.max(catalog::HeadWalk::new(fast, layout, compat_id)?.newest_seq());
    }
    // Seqs pushed towards the ceiling: under `required` a signing publisher clears what it
    // refuses above its base and writes just above the base (`reach`), walking as far as it
    // removes.
    let clears = trust.removes_untrusted() && occupied.is_some_and(reach::is_high);
    let limit = if clears {
        reach::MAX_REMOVED_PER_PUBLISH
    } else {
        MAX_PASSED_OVER
    };
    let (head, passed) = admitted_base(&mut walk, layout, trust, limit)?;
    let (parent, parent_damaged) = match &head {
        Some(h) => usable_parent(store, layout, &h.generation)?,
        None => (None, false),
    };
    let mut first_seq = first_seq_to_write(occupied, head.as_ref());
    let mut covers_refused_head = occupied != head.as_ref().map(|h| h.seq);
    if clears && !passed.is_empty() {
        let kept = reach::remove_heads(store, layout, compat_id, &passed);
        if head.is_none() && passed.len() >= limit {
            // Where the flood ends is unknown: writing in it would start a chain in the upper
            // half. The next publish goes on clearing.
            return Err(PublishError::Flooded {
                removed: passed.len() - kept.len(),
            });
        }
        first_seq = kept
            .iter()
            .copied()
            .chain(head.as_ref().map(|h| h.seq))
            .max()
            .map_or(1, |s| s + 1);
        covers_refused_head = !kept.is_empty();
    }
    let unannounced_in_durable = match (store.tiers(), &head) {
        (Some((_, durable)), Some(h)) => !matches!(
            catalog::read_head_at(durable, layout, compat_id, h.seq)?,
            Some(Ok(d)) if d.generation == h.generation
        ),
        _ => false,
    };
    Ok(Base {
        unannounced_in_durable,
        signer: head
            .as_ref()
            .map(|h| trust.policy().judge(layout.namespace(), h)),
        covers_refused_head,
        first_seq,
        head,
        parent,
        parent_damaged,
    })
}

impl Base {
    /// Whether this publish writes a generation: new files, a damaged parent to repair, an
    /// incomplete parent this complete root completes (the same files, now known to make a
    /// complete cache), or a refused head above a parent to write over.
    fn needs_generation(&self, nothing_new: bool, root_complete: bool) -> bool {
        let completes_parent =
            root_complete && self.parent.as_ref().is_some_and(|p| p.incomplete.is_some());
        !nothing_new
            || self.parent_damaged
            || (self.unannounced_in_durable && self.parent.is_some())
            || completes_parent
            || (self.covers_refused_head && self.parent.is_some())
    }
}

/// The hashed files the parent does not have at their path.
fn new_files<'l, 's>(
    local: &'l [(&'s ScannedFile, Stored)],
    parent: Option<&Manifest>,
) -> Vec<&'l (&'s ScannedFile, Stored)> {
    let parent_paths: HashSet<&RelPath> = parent
        .iter()
        .flat_map(|m| &m.files)
        .map(|f| &f.path)
        .collect();
    local
        .iter()
        .filter(|(f, _)| !parent_paths.contains(&f.path))
        .collect()
}

/// Paths whose content here differs from the parent's (the parent's version is kept).
fn conflicts_with_parent(
    local: &[(&ScannedFile, Stored)],
    parent: Option<&Manifest>,
) -> Vec<Conflict> {
    let parent_paths: HashMap<&RelPath, &FileRecord> = parent
        .iter()
        .flat_map(|m| &m.files)
        .map(|f| (&f.path, f))
        .collect();
    local
        .iter()
        .filter_map(|(f, s)| {
            let p = parent_paths.get(&f.path)?;
            (p.blake3 != s.hash).then(|| Conflict {
                path: f.path.clone(),
                kept: p.blake3,
                dropped: s.hash,
            })
        })
        .collect()
}

/// Where each new content's bytes come from.
type Sources<'s> = HashMap<ContentHash, (&'s ScannedFile, Stored)>;

/// The packs for contents the parent does not already store (those are referenced, not uploaded
/// again), and where each content is read from.
fn plan_new_contents<'s>(
    new_files: &[&(&'s ScannedFile, Stored)],
    parent: Option<&Manifest>,
    pack_size: u64,
) -> (Vec<PackPlan>, Sources<'s>) {
    let parent_contents: HashSet<ContentHash> = parent
        .iter()
        .flat_map(|m| m.files.iter().map(|f| f.blake3))
        .collect();
    let mut order: Vec<(ContentHash, u64)> = Vec::new();
    let mut source_of: Sources = HashMap::new();
    for (f, s) in new_files {
        if !parent_contents.contains(&s.hash) && !source_of.contains_key(&s.hash) {
            source_of.insert(s.hash, (*f, *s));
            order.push((s.hash, s.size));
        }
    }
    (plan_packs(&order, pack_size), source_of)
}

/// The new generation's manifest: the new files, located in parent packs or in the packs just
/// uploaded, merged onto the parent (whose version wins a conflicting path), and the paths whose
/// content here lost to the parent's.
fn new_manifest(
    policy: &dyn CachePolicy,
    opts: &PublishOptions,
    base: &Base,
    new_files: &[&(&ScannedFile, Stored)],
    selection: &Chosen,
    plans: &[PackPlan],
    report: &PublishReport,
) -> (Manifest, Vec<Conflict>) {
    let parent = base.parent.as_ref();
    let unplaced: Vec<FileRecord> = new_files
        .iter()
        .map(|(f, s)| FileRecord {
            path: f.path.clone(),
            size: s.size,
            mode: f.mode,
            mtime_s: f.mtime_s,
            mtime_ns: f.mtime_ns,
            blake3: s.hash,
            chunks: vec![],
            marker: selection.markers.contains(&f.path),
            canonical: s.canonical,
        })
        .collect();
    let (ours_files, ours_packs) = place_files(parent, unplaced, plans);
    let (files, packs, conflicts) = match parent {
        Some(p) => merge_files(&p.files, &p.packs, &ours_files, &ours_packs),
        None => merge_files(&[], &[], &ours_files, &ours_packs),
    };
    let mut manifest = Manifest {
        format: FORMAT_VERSION,
        cache_kind: report.cache_kind.clone(),
        compat_key: report.compat_key.clone(),
        compat_id: report.compat_id,
        facts: opts.facts.as_map().clone(),
        policy: policy.policy_ref(),
        parent: parent.and(base.head.as_ref().map(|h| h.generation)),
        merged: vec![],
        producer: opts.producer.clone(),
        created_at: now_secs(),
        packs,
        files,
        incomplete: report.incomplete.clone(),
    };
    prune_packs(&mut manifest);
    (manifest, conflicts)
}

/// Sticky settings: `policy` configured with the settings the key's newest generation (the base
/// this publish builds on) recorded, when the operator gave none for the cache and they differ
/// (`CachePolicy::with_recorded_settings`). Kept only if the key stays the same; otherwise, or
/// when the module refuses them, the configured settings apply and the note says why.
fn recorded_settings(
    policy: &dyn CachePolicy,
    base: &Base,
    facts: &crate::facts::Facts,
    compat_key: &str,
) -> (Option<Box<dyn CachePolicy>>, Option<String>) {
    let Some(parent) = &base.parent else {
        return (None, None);
    };
    let recorded = &parent.policy;
    let said = crate::policy::host::describe(&recorded.settings);
    match policy.with_recorded_settings(recorded) {
        None => (None, None),
        Some(Ok(p)) => match p.compat_key(facts) {
            Ok(k) if k == compat_key => (Some(p), None),
            _ => (
                None,
                Some(format!(
                    "the settings the key's newest generation recorded ({said}) give another key; \
                     publishing with the configured settings"
                )),
            ),
        },
        Some(Err(e)) => {
            tracing::warn!("settings the key's newest generation recorded are refused: {e}");
            (
                None,
                Some(format!(
                    "this module refuses the settings the key's newest generation recorded \
                     ({said}): {e}; publishing with the configured settings"
                )),
            )
        }
    }
}

/// Stores the module of `policy` by its digest (`catalog::modules`), unless it is one of the
/// built-in modules every jitship carries (gc finds those in itself, and decides keys of an
/// older built-in with today's: `gc`). A key someone else holds with other bytes is reported,
/// never a reason to fail: gc then keeps the key whole until it has the module.
fn store_policy_module(
    store: &dyn Store,
    layout: &KeyLayout,
    policy: &dyn CachePolicy,
    report: &mut PublishReport,
) -> Result<(), PublishError> {
    let Some(bytes) = policy.module() else {
        return Ok(());
    };
    if crate::policy::builtin::is_builtin(&bytes) {
        return Ok(());
    }
    if let catalog::modules::ModulePut::Refused(why) =
        catalog::modules::put_module(store, layout, &bytes)?
    {
        tracing::warn!("policy module not stored: {why}");
        report.module_not_stored = Some(why);
    }
    Ok(())
}

/// The largest manifest a publish may write to `store`: what the store takes as one value, and
/// no more than every reader accepts (`MAX_MANIFEST_BYTES`: install, verify and gc read a
/// manifest under that cap), so a generation that fits is one installs can read.
fn manifest_limit(store: &dyn Store) -> u64 {
    store.max_value_size().min(MAX_MANIFEST_BYTES as u64)
}

/// Refuses a manifest over `manifest_limit`, with its numbers and what to do, before anything of
/// its generation is written (the manifest is one value: a bigger one fails its put, or worse
/// passes it on a store with a higher limit than readers accept).
pub(super) fn check_manifest_fits(
    store: &dyn Store,
    manifest: &Manifest,
) -> Result<(), PublishError> {
    let size = manifest.encoded_len();
    let limit = manifest_limit(store);
    if size <= limit {
        return Ok(());
    }
    let files = manifest.files.len() as u64;
    let readers_cap = limit == MAX_MANIFEST_BYTES as u64;
    let split = "publish fewer files per generation: split the cache root into caches of fewer \
                 files (each cache kind and compat key is a generation of its own)";
    Err(PublishError::ManifestTooLarge {
        files,
        size,
        limit,
        limit_of: if readers_cap {
            "every jitship reader accepts a manifest under".into()
        } else {
            format!("on one value in {}", store.describe())
        },
        files_that_fit: limit / (size / files.max(1)).max(1),
        what_to_do: if readers_cap {
            format!("{split}; this cap is fixed")
        } else {
            format!(
                "{split}, or raise the store's value limit (on Mooncake \
                 store.mooncake.staging_buffer_size, on every publisher and installer alike)"
            )
        },
    })
}

/// Refuses a pack size over the largest value the store takes: every pack of this size would
/// fail its put, after the files were hashed and some packs uploaded.
fn check_pack_size(store: &dyn Store, pack_size: u64) -> Result<(), PublishError> {
    let limit = store.max_value_size();
    if pack_size <= limit {
        return Ok(());
    }
    Err(PublishError::PackSizeOverLimit {
        pack_size,
        limit,
        store: store.describe(),
    })
}

/// How many heads a publish passes over (refused by its trust, or faulty) looking for its base
/// before it starts a fresh chain: a store flooded with junk costs a publish a fresh chain, not a
/// long walk. A publisher that clears what it refuses (`reach`) walks up to
/// `reach::MAX_REMOVED_PER_PUBLISH`.
const MAX_PASSED_OVER: usize = 256;

/// The newest head this publisher may build on: the newest usable head its trust admits, walking
/// down past at most `limit` refused and faulty ones (None: start a fresh chain), with the seqs
/// passed over.
fn admitted_base(
    walk: &mut catalog::HeadWalk<'_>,
    layout: &KeyLayout,
    trust: &PublishTrust,
    limit: usize,
) -> Result<(Option<HeadRecord>, Vec<u64>), PublishError> {
    let mut passed = Vec::new();
    while let Some(entry) = walk.next_head()? {
        match entry {
            Ok(h) if trust.admits(layout.namespace(), &h) => {
                if !passed.is_empty() {
                    tracing::warn!(
                        seq = h.seq,
                        passed = passed.len(),
                        "newer heads are not trusted or not usable: building on the newest trusted head"
                    );
                }
                return Ok((Some(h), passed));
            }
            Ok(h) => {
                tracing::debug!(seq = h.seq, generation = %h.generation, "head not admitted by this publisher's trust; passed over");
                passed.push(h.seq);
            }
            Err(f) => {
                tracing::debug!(seq = f.seq, "head passed over: {}", f.fault);
                passed.push(f.seq);
            }
        }
        if passed.len() >= limit {
            tracing::warn!(
                passed = passed.len(),
                "no usable trusted head among the newest; publishing a fresh chain"
            );
            break;
        }
    }
    Ok((None, passed))
}

fn first_seq_to_write(occupied: Option<u64>, base: Option<&HeadRecord>) -> u64 {
    match occupied {
        None => 1,
        Some(s) if s < catalog::MAX_SEQ => s + 1,
        Some(_) => base.map_or(1, |b| b.seq + 1),
    }
}

/// The manifest of `id` as a parent, and whether it had to be repaired: `None` if it is missing or
/// does not decode (a corrupt manifest must not block every later publish); files held in packs
/// the store no longer has are dropped from it.
fn usable_parent(
    store: &dyn Store,
    layout: &KeyLayout,
    id: &GenerationId,
) -> Result<(Option<Manifest>, bool), PublishError> {
    let mut manifest = match catalog::read_manifest(store, layout, id)? {
        ManifestRead::Present(m) => *m,
        ManifestRead::Missing => return Ok((None, false)),
        ManifestRead::Unreadable(source) => {
            tracing::warn!(generation = %id, error = %source, "the head's manifest is corrupt; publishing a fresh chain");
            return Ok((None, false));
        }
    };
    let keys: Vec<String> = manifest.packs.iter().map(|p| layout.pack(&p.id)).collect();
    let mut missing = vec![false; keys.len()];
    for (chunk_no, chunk) in keys.chunks(256).enumerate() {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        for (i, r) in store.exists_batch(&refs).into_iter().enumerate() {
            missing[chunk_no * 256 + i] = !r?;
        }
    }
    if !missing.iter().any(|&m| m) {
        return Ok((Some(manifest), false));
    }
    let before = manifest.files.len();
    manifest
        .files
        .retain(|f| f.chunks.iter().all(|c| !missing[c.pack as usize]));
    prune_packs(&mut manifest);
    tracing::warn!(
        generation = %id,
        packs_missing = missing.iter().filter(|&&m| m).count(),
        files_dropped = before - manifest.files.len(),
        "the head generation lost packs (evicted or collected); building on what is left"
    );
    Ok((Some(manifest), true))
}

#[cfg(test)]
mod tests;
