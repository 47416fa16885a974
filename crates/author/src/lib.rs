//! What policy authors run before they ship a `.wasm`: `jitship policy check` (does this module speak
//! our contract, what does it say it is, what does it import) and `jitship policy test` (a dry run of
//! every decision on a real root and real facts, with nothing published). Each returns a
//! serializable report; the CLI only prints it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use jitship_facts::Facts;
use jitship_generation::{CompatId, GenerationId};
use jitship_policy::host::{LoadStats, LogLine, PolicyEngine, Traced, WasmPolicy};
use jitship_policy::{
    CachePolicy, GenerationSummary, PolicyError, PolicyInfo, PolicySettings, ReasonCategory,
    RetentionDrop, RetentionLimits, Verdict,
};

/// Jitship's refusal of what the author handed `policy test` (a generations file, a root): the
/// policy never saw it. Every message starts by saying so, then names the file, the entry and why.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("jitship rejected {path} (the policy never saw it): {why}")]
    File { path: PathBuf, why: String },
    #[error("jitship cannot scan the root {root} (the policy never saw it): {why}")]
    Root { root: PathBuf, why: String },
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckReport {
    pub path: PathBuf,
    pub size_bytes: u64,
    /// blake3 of the module, as recorded in manifests.
    pub digest: String,
    /// The contract version it was built against, e.g. "3.0.0".
    pub contract: String,
    pub info: PolicyInfo,
    /// The settings it would run with: the given ones read by their kinds, defaults for the rest.
    pub settings: PolicySettings,
    /// Every import, down to the function (`jitship:policy/host@3.0.0#read-file`).
    pub imports: Vec<String>,
    pub exports: Vec<String>,
    /// Whether it can read files under the cache root at all.
    pub reads_files: bool,
    pub load: LoadStats,
}

/// Loads `path` the way jitship would (contract check, link, `info()`) and configures it with
/// `settings` (checked against the declared kinds, then by the policy's `check-settings`), and
/// reports what it found. A module or settings jitship would refuse are an error, with the reason.
pub fn check(
    engine: &Arc<PolicyEngine>,
    path: &Path,
    settings: &BTreeMap<String, String>,
) -> Result<CheckReport, PolicyError> {
    let policy = engine.load_file(path)?.configure(settings)?;
    let size_bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    Ok(CheckReport {
        path: path.to_path_buf(),
        size_bytes,
        digest: policy.digest().to_string(),
        contract: policy.contract().version.clone(),
        info: policy.info().clone(),
        settings: policy.settings().clone(),
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
    /// Each published file marked `embeds-root` (at most `MAX_REWRITES_TRIED`), taken through
    /// `canonicalize` and back through `materialize`, as publish and install do.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub root_rewrites: Vec<RootRewrite>,
}

/// How many `embeds-root` files `policy test` takes through canonicalize and materialize.
pub const MAX_REWRITES_TRIED: usize = 32;

/// One `embeds-root` file through `canonicalize` (publish) and `materialize` (install), at the
/// same root and at another one.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RootRewrite {
    pub path: String,
    /// Size of the root-independent form; `None` when canonicalize refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canonical_bytes: Option<usize>,
    /// The root-independent form no longer names the root.
    pub root_gone: bool,
    /// materialize(canonicalize(file), same root) gave back the file's very bytes (information
    /// only: a policy may write the file in its own layout, as Triton's JSON writer does; install
    /// checks the canonical form's hash, not these bytes).
    pub round_trip: bool,
    /// Materialized for `OTHER_ROOT`, it names that root.
    pub relocates: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RootRewrite {
    pub fn ok(&self) -> bool {
        self.error.is_none() && self.root_gone && self.relocates
    }
}

/// The root `policy test` materializes for, to see a file relocate.
pub const OTHER_ROOT: &str = "/jitship-policy-test/another/root";

fn try_rewrite(policy: &WasmPolicy, root: &Path, path: &str) -> RootRewrite {
    let mut r = RootRewrite {
        path: path.to_owned(),
        canonical_bytes: None,
        root_gone: false,
        round_trip: false,
        relocates: false,
        error: None,
    };
    let fail = |mut r: RootRewrite, e: String| {
        r.error = Some(e);
        r
    };
    let rel = match jitship_generation::RelPath::parse(path) {
        Ok(p) => p,
        Err(e) => return fail(r, e.to_string()),
    };
    let content = match std::fs::read(root.join(path)) {
        Ok(c) => c,
        Err(e) => return fail(r, format!("cannot read it: {e}")),
    };
    let canonical = match policy.canonicalize(root, &rel, &content) {
        Ok(c) => c,
        Err(e) => return fail(r, format!("canonicalize: {e}")),
    };
    r.canonical_bytes = Some(canonical.len());
    let root_text = root.to_string_lossy();
    r.root_gone = !String::from_utf8_lossy(&canonical).contains(root_text.as_ref());
    match policy.materialize(root, &rel, &canonical) {
        Ok(back) => r.round_trip = back == content,
        Err(e) => return fail(r, format!("materialize at the same root: {e}")),
    }
    match policy.materialize(Path::new(OTHER_ROOT), &rel, &canonical) {
        Ok(other) => r.relocates = String::from_utf8_lossy(&other).contains(OTHER_ROOT),
        Err(e) => return fail(r, format!("materialize at {OTHER_ROOT}: {e}")),
    }
    r
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct RetainReport {
    pub generations: usize,
    pub call: Call<Vec<RetentionDrop>>,
    /// The ids kept, newest first (everything not dropped).
    pub keep: Vec<GenerationId>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct TestReport {
    pub policy: PolicyInfo,
    pub digest: String,
    pub contract: String,
    /// What every call received.
    pub settings: PolicySettings,
    pub compat_key: Call<String>,
    /// What jitship would publish under: blake3 of (cache kind, key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compat_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub select: Option<SelectReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retain: Option<RetainReport>,
    /// Whether the key was asked for: not in a retention-only run (`--generations` with no
    /// `--fact` and no `--root`), where a key refused for a missing fact does not fail the test.
    pub key_asked: bool,
}

impl TestReport {
    /// Every call that ran answered (a refusal such as a missing fact counts as failing here: the
    /// author asked to see it work), and every `embeds-root` file went through canonicalize and
    /// materialize and back.
    pub fn all_ok(&self) -> bool {
        (self.compat_key.is_ok() || !self.key_asked)
            && self
                .select
                .as_ref()
                .is_none_or(|s| s.call.is_ok() && s.root_rewrites.iter().all(RootRewrite::ok))
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
/// retention decisions. Nothing is written anywhere. An error only if the root cannot be scanned;
/// what the policy answers, refusals included, is in the report.
pub fn test(policy: &WasmPolicy, input: &TestInput) -> Result<TestReport, InputError> {
    let compat_key = Call::from(policy.compat_key_traced(&input.facts), |k| k);
    let compat_id = compat_key
        .value
        .as_ref()
        .map(|k| CompatId::new(&policy.info().cache_kind, k).to_string());
    let select = match &input.root {
        None => None,
        Some(root) => {
            let snap = jitship_scan::snapshot(root).map_err(|e| InputError::Root {
                root: root.clone(),
                why: e.to_string(),
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
            let root_rewrites = published
                .clone()
                .filter(|d| d.embeds_root)
                .take(MAX_REWRITES_TRIED)
                .map(|d| try_rewrite(policy, root, &d.path))
                .collect();
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
                root_rewrites,
                call,
            })
        }
    };
    let retain = input.generations.as_ref().map(|gens| {
        let call = Call::from(
            policy.retain_traced(gens, input.now, &input.limits),
            |drops| drops,
        );
        let dropped = call.value.clone().unwrap_or_default();
        let keep = if call.is_ok() {
            gens.iter()
                .map(|g| g.id)
                .filter(|id| !dropped.iter().any(|d| d.id == *id))
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
        settings: policy.settings().clone(),
        compat_key,
        compat_id,
        select,
        retain,
        key_asked: !input.facts.as_map().is_empty()
            || input.root.is_some()
            || input.generations.is_none(),
    })
}

/// What a generation id looks like, for the messages that refuse one.
pub const GENERATION_ID_FORM: &str = "a generation id is 64 lowercase hex digits (the blake3 of \
     its manifest, as `jitship ls` prints it); for a dry run any distinct 64-hex strings do, e.g. \
     \"1111111111111111111111111111111111111111111111111111111111111111\"";

/// Reads `--generations FILE.json`: a JSON list of generation summaries, newest first. Jitship
/// checks it before any policy runs: each entry's fields and id form (ids are never padded or
/// hashed, so the report names the ids the file holds), no id twice, newest first by
/// `created_at`. A refusal names the file and the entry (counting from 1).
pub fn read_generations(path: &Path) -> Result<Vec<GenerationSummary>, InputError> {
    let refuse = |why: String| InputError::File {
        path: path.to_path_buf(),
        why,
    };
    let text = std::fs::read_to_string(path).map_err(|e| refuse(format!("cannot read it: {e}")))?;
    const SHAPE: &str = "[{\"id\", \"compat_key\", \"created_at\", \"size_bytes\", \"file_count\", \"pinned\"}, ...], newest first";
    let entries: Vec<serde_json::Value> = serde_json::from_str(&text)
        .map_err(|e| refuse(format!("not a JSON list of generations ({SHAPE}): {e}")))?;
    let mut out: Vec<GenerationSummary> = Vec::with_capacity(entries.len());
    for (i, entry) in entries.into_iter().enumerate() {
        let n = i + 1;
        if let Some(id) = entry.get("id").and_then(|v| v.as_str())
            && id.parse::<GenerationId>().is_err()
        {
            return Err(refuse(format!(
                "entry {n}: \"id\": {id:?} is not a generation id: {GENERATION_ID_FORM}"
            )));
        }
        let g: GenerationSummary = serde_json::from_value(entry).map_err(|e| {
            let hint = if e.to_string().contains("`id`") {
                format!("; {GENERATION_ID_FORM}")
            } else {
                String::new()
            };
            refuse(format!("entry {n}: {e} (each entry is {SHAPE}){hint}"))
        })?;
        if let Some(j) = out.iter().position(|o| o.id == g.id) {
            return Err(refuse(format!(
                "entry {n} repeats the id of entry {}: {}",
                j + 1,
                g.id
            )));
        }
        if let Some(prev) = out.last()
            && g.created_at > prev.created_at
        {
            return Err(refuse(format!(
                "entry {n} (created_at {}) is newer than entry {} (created_at {}): list \
                 generations newest first, as gc hands them to retain",
                g.created_at, i, prev.created_at
            )));
        }
        out.push(g);
    }
    Ok(out)
}

/// `--now`: Unix seconds (`1700000000`) or an RFC 3339 time (`2024-05-01T12:00:00Z`), for
/// retention dry runs at a chosen moment.
pub fn parse_now(s: &str) -> Result<u64, String> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(secs);
    }
    let refuse = |e: &dyn std::fmt::Display| {
        format!(
            "{s:?} is neither Unix seconds nor an RFC 3339 time (e.g. 2024-05-01T12:00:00Z or \
             2024-05-01T14:00:00+02:00): {e}"
        )
    };
    // humantime reads UTC (`Z`) only: a numeric offset `+HH:MM`/`-HH:MM` is taken off here.
    let split = s.len().checked_sub(6).filter(|&i| s.is_char_boundary(i));
    let (utc, offset_secs) = match split.map(|i| s.split_at(i)) {
        Some((time, off))
            if (off.starts_with('+') || off.starts_with('-')) && off.as_bytes()[3] == b':' =>
        {
            let (h, m) = (off[1..3].parse::<i64>(), off[4..6].parse::<i64>());
            let (Ok(h), Ok(m)) = (h, m) else {
                return Err(refuse(&"bad offset"));
            };
            let secs = (h * 3600 + m * 60) * if off.starts_with('-') { -1 } else { 1 };
            (format!("{time}Z"), secs)
        }
        _ => (s.to_string(), 0),
    };
    let t = humantime::parse_rfc3339_weak(&utc).map_err(|e| refuse(&e))?;
    let local = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| format!("{s:?} is before 1970"))?
        .as_secs() as i64;
    u64::try_from(local - offset_secs).map_err(|_| format!("{s:?} is before 1970"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gen_file(body: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("generations.json");
        std::fs::write(&path, body).unwrap();
        (dir, path)
    }

    fn entry(id: &str, created_at: u64) -> String {
        format!(
            r#"{{"id": "{id}", "compat_key": "k", "created_at": {created_at}, "size_bytes": 1, "file_count": 1}}"#
        )
    }

    #[test]
    fn a_good_generations_file_reads_newest_first() {
        let (a, b) = ("a".repeat(64), "b".repeat(64));
        let (_d, path) = gen_file(&format!("[{}, {}]", entry(&a, 200), entry(&b, 100)));
        let gens = read_generations(&path).unwrap();
        assert_eq!(gens.len(), 2);
        assert_eq!(gens[0].id.to_string(), a);
        assert!(!gens[1].pinned);
    }

    #[test]
    fn jitship_names_itself_the_file_the_entry_and_the_id_form_when_it_rejects() {
        let a = "a".repeat(64);
        let (_d, path) = gen_file(&format!("[{}, {}]", entry(&a, 200), entry("g2", 100)));
        let err = read_generations(&path).unwrap_err().to_string();
        assert!(err.starts_with("jitship rejected "), "{err}");
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("entry 2"), "{err}");
        assert!(err.contains("\"g2\""), "{err}");
        assert!(err.contains("64 lowercase hex digits"), "{err}");
        assert!(!err.contains("policy rejected"), "{err}");

        // A field missing, an id twice, oldest first, not a list: each named by entry.
        let (_d, path) = gen_file(&format!(
            r#"[{}, {{"id": "{}", "created_at": 1}}]"#,
            entry(&a, 2),
            "b".repeat(64)
        ));
        let err = read_generations(&path).unwrap_err().to_string();
        assert!(
            err.contains("entry 2") && err.contains("compat_key"),
            "{err}"
        );
        let (_d, path) = gen_file(&format!("[{}, {}]", entry(&a, 2), entry(&a, 1)));
        let err = read_generations(&path).unwrap_err().to_string();
        assert!(err.contains("entry 2 repeats the id of entry 1"), "{err}");
        let (_d, path) = gen_file(&format!(
            "[{}, {}]",
            entry(&a, 1),
            entry(&"b".repeat(64), 2)
        ));
        let err = read_generations(&path).unwrap_err().to_string();
        assert!(
            err.contains("entry 2 (created_at 2) is newer than entry 1"),
            "{err}"
        );
        let (_d, path) = gen_file("{}");
        let err = read_generations(&path).unwrap_err().to_string();
        assert!(
            err.starts_with("jitship rejected ") && err.contains("JSON list"),
            "{err}"
        );
        let err = read_generations(Path::new("/nonexistent/g.json"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("jitship rejected /nonexistent/g.json"),
            "{err}"
        );
    }

    #[test]
    fn now_takes_unix_seconds_or_rfc3339() {
        assert_eq!(parse_now("500"), Ok(500));
        assert_eq!(parse_now("1970-01-01T00:08:20Z"), Ok(500));
        assert_eq!(parse_now("2024-05-01T12:00:00Z"), Ok(1_714_564_800));
        assert_eq!(parse_now("2024-05-01T14:00:00+02:00"), Ok(1_714_564_800));
        assert_eq!(parse_now("2024-05-01T10:30:00-01:30"), Ok(1_714_564_800));
        let err = parse_now("yesterday").unwrap_err();
        assert!(err.contains("RFC 3339"), "{err}");
    }
}
