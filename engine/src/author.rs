//! What policy authors run before they ship a `.wasm`: `jitship policy check` (does this module speak
//! our contract, what does it say it is, what does it import) and `jitship policy test` (a dry run of
//! every decision on a real root and real facts, with nothing published). Each returns a
//! serializable report; the CLI only prints it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::facts::Facts;
use crate::generation::{CompatId, GenerationId};
use crate::policy::host::{LoadStats, LogLine, PolicyEngine, Traced, WasmPolicy};
use crate::policy::{
    CachePolicy, GenerationSummary, PolicyError, PolicyInfo, ReasonCategory, RetentionLimits,
    Verdict,
};

#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckReport {
    pub path: PathBuf,
    pub size_bytes: u64,
    /// blake3 of the module, as recorded in manifests.
    pub digest: String,
    /// The contract version it was built against, e.g. "2.0.0".
    pub contract: String,
    pub info: PolicyInfo,
    /// Every import, down to the function (`jitship:policy/host@2.0.0#read-file`).
    pub imports: Vec<String>,
    pub exports: Vec<String>,
    /// Whether it can read files under the cache root at all.
    pub reads_files: bool,
    pub load: LoadStats,
}

/// Loads `path` the way jitship would (contract check, link, `info()`), and reports what it found.
/// A module jitship would refuse is an error, with the reason.
pub fn check(engine: &Arc<PolicyEngine>, path: &Path) -> Result<CheckReport, PolicyError> {
    let policy = engine.load_file(path)?;
    let size_bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    Ok(CheckReport {
        path: path.to_path_buf(),
        size_bytes,
        digest: policy.digest().to_string(),
        contract: policy.contract().version.clone(),
        info: policy.info().clone(),
        imports: policy.contract().imports.clone(),
        exports: policy.contract().exports.clone(),
        reads_files: policy.contract().uses_read_file(),
        load: policy.load_stats(),
    })
}

/// The outcome of one call: a value or the error, and what it cost.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Call<T> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<T>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Fuel the call used (absent when it did not complete).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fuel_used: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wall_us: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logs: Vec<LogLine>,
}

impl<T> Call<T> {
    fn from<U>(
        r: Result<Traced<Result<U, PolicyError>>, PolicyError>,
        map: impl FnOnce(U) -> T,
    ) -> Self {
        match r {
            Ok(t) => {
                let (value, error) = match t.value {
                    Ok(v) => (Some(map(v)), None),
                    Err(e) => (None, Some(e.to_string())),
                };
                let mut logs = t.logs;
                if t.logs_dropped > 0 {
                    logs.push(LogLine {
                        level: "warn",
                        message: format!("[{} more log messages dropped]", t.logs_dropped),
                    });
                }
                Self {
                    value,
                    error,
                    fuel_used: Some(t.fuel_used),
                    wall_us: Some(t.wall.as_micros() as u64),
                    logs,
                }
            }
            Err(e) => Self {
                value: None,
                error: Some(e.to_string()),
                fuel_used: None,
                wall_us: None,
                logs: vec![],
            },
        }
    }

    pub fn is_ok(&self) -> bool {
        self.error.is_none()
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct EntryDecision {
    pub path: String,
    pub size: u64,
    pub verdict: Verdict,
    pub category: ReasonCategory,
    pub detail: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub marker: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub embeds_root: bool,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct SelectReport {
    pub root: PathBuf,
    pub call: Call<Vec<EntryDecision>>,
    /// Whether the policy judged the root a complete cache for its kind (absent if select failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub complete: Option<bool>,
    /// Why not, in the policy's words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub incomplete_detail: Option<String>,
    pub publish_files: usize,
    pub publish_bytes: u64,
    pub skip_files: usize,
    /// What exists under the root but is never offered to a policy (symlinks, devices, bad names).
    pub never_offered: Vec<(String, String)>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct RetainReport {
    pub generations: usize,
    pub call: Call<Vec<GenerationId>>,
    /// The ids kept, newest first (everything not dropped).
    pub keep: Vec<GenerationId>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct TestReport {
    pub policy: PolicyInfo,
    pub digest: String,
    pub contract: String,
    pub compat_key: Call<String>,
    /// What jitship would publish under: blake3 of (cache kind, key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compat_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub select: Option<SelectReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retain: Option<RetainReport>,
}

impl TestReport {
    /// Every call that ran answered (a refusal such as a missing fact counts as failing here: the
    /// author asked to see it work).
    pub fn all_ok(&self) -> bool {
        self.compat_key.is_ok()
            && self.select.as_ref().is_none_or(|s| s.call.is_ok())
            && self.retain.as_ref().is_none_or(|r| r.call.is_ok())
    }
}

#[derive(Debug, Clone, Default)]
pub struct TestInput {
    pub facts: Facts,
    /// A cache root to run `select` on (scanned the way publish scans it).
    pub root: Option<PathBuf>,
    /// Generations (one compat key, newest first) to run `retain` on.
    pub generations: Option<Vec<GenerationSummary>>,
    /// Seconds since the Unix epoch handed to `retain`.
    pub now: u64,
    pub limits: RetentionLimits,
}

/// Dry-runs `policy` on `input`: the key (or the refusal), the publish/skip list with reasons,
/// retention decisions. Nothing is written anywhere. An error only if the root cannot be scanned.
pub fn test(policy: &WasmPolicy, input: &TestInput) -> Result<TestReport, PolicyError> {
    let compat_key = Call::from(policy.compat_key_traced(&input.facts), |k| k);
    let compat_id = compat_key
        .value
        .as_ref()
        .map(|k| CompatId::new(&policy.info().cache_kind, k).to_string());
    let select = match &input.root {
        None => None,
        Some(root) => {
            let snap = crate::scan::snapshot(root).map_err(|e| {
                PolicyError::InvalidInput(format!("cannot scan {}: {e}", root.display()))
            })?;
            let entries: Vec<_> = snap.files.iter().map(|f| f.entry()).collect();
            let mut completeness = None;
            let call = Call::from(policy.select_traced(root, &entries), |selection| {
                completeness = Some((selection.complete, selection.incomplete_detail));
                entries
                    .iter()
                    .zip(selection.decisions)
                    .map(|(e, d)| EntryDecision {
                        path: e.path.clone(),
                        size: e.size,
                        verdict: d.verdict,
                        category: d.category,
                        detail: d.detail,
                        marker: d.marker,
                        embeds_root: d.embeds_root,
                    })
                    .collect::<Vec<_>>()
            });
            let decided = call.value.as_deref().unwrap_or(&[]);
            let published = decided.iter().filter(|d| d.verdict == Verdict::Publish);
            Some(SelectReport {
                root: root.clone(),
                complete: completeness.as_ref().map(|(c, _)| *c),
                incomplete_detail: completeness.and_then(|(c, why)| (!c).then_some(why)),
                publish_files: published.clone().count(),
                publish_bytes: published.map(|d| d.size).sum(),
                skip_files: decided
                    .iter()
                    .filter(|d| d.verdict == Verdict::Skip)
                    .count(),
                never_offered: snap
                    .unpublishable
                    .iter()
                    .map(|(p, r)| (p.clone(), (*r).to_string()))
                    .collect(),
                call,
            })
        }
    };
    let retain = input.generations.as_ref().map(|gens| {
        let call = Call::from(
            policy.retain_traced(gens, input.now, &input.limits),
            |ids| ids,
        );
        let dropped = call.value.clone().unwrap_or_default();
        let keep = if call.is_ok() {
            gens.iter()
                .map(|g| g.id)
                .filter(|id| !dropped.contains(id))
                .collect()
        } else {
            vec![]
        };
        RetainReport {
            generations: gens.len(),
            call,
            keep,
        }
    });
    Ok(TestReport {
        policy: policy.info().clone(),
        digest: policy.digest().to_string(),
        contract: policy.contract().version.clone(),
        compat_key,
        compat_id,
        select,
        retain,
    })
}

/// Reads `--generations FILE.json`: a list of generation summaries, newest first.
pub fn read_generations(path: &Path) -> Result<Vec<GenerationSummary>, PolicyError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| PolicyError::InvalidInput(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| {
        PolicyError::InvalidInput(format!(
            "{} is not a JSON list of generations ({{\"id\", \"compat_key\", \"created_at\", \"size_bytes\", \
             \"file_count\", \"pinned\"}}): {e}",
            path.display()
        ))
    })
}
