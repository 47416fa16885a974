//! Choosing what to publish: the root's files, and what the policy selects from them.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use crate::generation::RelPath;
use crate::policy::{CachePolicy, ReasonCategory, Verdict};
use crate::scan::{self, ScannedFile};

use super::{MAX_SKIP_DETAILS, PublishError, SkipDetail, policy_error};

/// The root's files. A file where the root should be is never a cache (a missing root is: not
/// written yet); a root another user owns, or could write without being ours, is not published
/// from (`owner::check_owner`: they could plant files the publisher would sign).
pub(super) fn scan_root(root: &Path) -> Result<scan::Snapshot, PublishError> {
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
pub(super) struct Chosen<'s> {
    /// The files to publish, each with whether it embeds the root (then stored in the policy's
    /// root-independent form).
    pub(super) files: Vec<(&'s ScannedFile, bool)>,
    pub(super) markers: HashSet<&'s RelPath>,
    pub(super) skipped: BTreeMap<ReasonCategory, u64>,
    pub(super) skip_details: Vec<SkipDetail>,
    pub(super) incomplete: Option<String>,
}

pub(super) fn select<'s>(
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
    pub(super) fn note_skip(&mut self, path: &str, category: ReasonCategory, detail: &str) {
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
