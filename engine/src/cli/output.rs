//! The machine-readable output of every operator command (`--json`, `install --report FILE`): one
//! envelope with a schema version, the command's results and its errors, so a script never has to
//! guess whether an empty list means "nothing" or "failed before it started".
//!
//! ```json
//! { "schema": 1, "command": "install", "ok": false, "exit_code": 12,
//!   "started_at": 1796280000, "started_at_rfc3339": "2026-12-03T06:40:00Z",
//!   "finished_at": ..., "finished_at_rfc3339": ...,
//!   "results": [ ...one per cache (publish, install) or per item (ls, verify, gc)... ],
//!   "errors": [ { "cache_kind": "triton", "stage": "store", "message": "...", "causes": [...] } ] }
//! ```
//!
//! Stable: fields are only ever added; a removed or retyped field bumps `schema`. Every `*_at`
//! field (Unix seconds) anywhere in the document has an `*_at_rfc3339` sibling (UTC).

use serde::Serialize;
use serde_json::Value;

/// Version of the envelope and of the result shapes inside it.
pub const SCHEMA_VERSION: u32 = 1;

/// Where a command failed (`errors[].stage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// Flags, environment or the config file.
    Config,
    /// Opening or reaching the store.
    Store,
    /// Loading or running a cache's policy (including a fact the policy needs).
    Policy,
    /// The command's own work (publish, install, verify, gc ...).
    Run,
    /// Writing the report file.
    Report,
}

/// One error: which cache (if any), at which stage, the message and its causes, each once.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorRecord {
    pub cache_kind: Option<String>,
    pub stage: Stage,
    pub message: String,
    pub causes: Vec<String>,
}

impl ErrorRecord {
    pub fn new(cache_kind: Option<&str>, stage: Stage, error: &anyhow::Error) -> Self {
        let mut chain = causes(error).into_iter();
        Self {
            cache_kind: cache_kind.map(str::to_owned),
            stage,
            message: chain.next().unwrap_or_default(),
            causes: chain.collect(),
        }
    }

    pub fn text(cache_kind: Option<&str>, stage: Stage, message: impl Into<String>) -> Self {
        Self {
            cache_kind: cache_kind.map(str::to_owned),
            stage,
            message: message.into(),
            causes: vec![],
        }
    }
}

/// The messages of an error's chain, each once: a cause whose text its parent already contains
/// (errors that format their source into their own message) is not repeated.
pub fn causes(error: &anyhow::Error) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if text.is_empty() || out.iter().any(|seen| seen.contains(&text)) {
            continue;
        }
        out.push(text);
    }
    out
}

/// One line for a person: the causes joined with ": ".
pub fn one_line(error: &anyhow::Error) -> String {
    causes(error).join(": ")
}

pub struct Envelope {
    command: &'static str,
    started_at: u64,
    pub errors: Vec<ErrorRecord>,
}

/// When the command started (set by `main` before any work; else at first use).
static STARTED_AT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

pub fn mark_start() {
    STARTED_AT.get_or_init(crate::catalog::now_secs);
}

impl Envelope {
    pub fn start(command: &'static str) -> Self {
        Self {
            command,
            started_at: *STARTED_AT.get_or_init(crate::catalog::now_secs),
            errors: Vec::new(),
        }
    }

    /// Prints the document for a command that failed before it had results, with `error` as its
    /// one error, and returns the exit code.
    pub fn print_failure(mut self, error: &anyhow::Error, stage: Stage) -> i32 {
        self.errors.push(ErrorRecord::new(None, stage, error));
        print!(
            "{}",
            to_text(&self.finish(Vec::<()>::new(), super::exit::ERROR))
        );
        super::exit::ERROR
    }

    /// The document: `results` as given, `ok` = no errors and exit code 0 or an install outcome
    /// that is not a failure.
    pub fn finish(&self, results: impl Serialize, exit_code: i32) -> Value {
        let results = serde_json::to_value(results).unwrap_or(Value::Null);
        let mut doc = serde_json::json!({
            "schema": SCHEMA_VERSION,
            "command": self.command,
            "ok": self.errors.is_empty(),
            "exit_code": exit_code,
            "started_at": self.started_at,
            "finished_at": crate::catalog::now_secs(),
            "results": results,
            "errors": self.errors,
        });
        add_rfc3339(&mut doc);
        doc
    }
}

/// Pretty JSON text of `doc`, newline-terminated.
pub fn to_text(doc: &Value) -> String {
    let mut s = serde_json::to_string_pretty(doc).unwrap_or_default();
    s.push('\n');
    s
}

/// Adds `X_rfc3339` beside every integer field `X` whose name ends in `_at`.
fn add_rfc3339(value: &mut Value) {
    match value {
        Value::Object(map) => {
            let stamps: Vec<(String, String)> = map
                .iter()
                .filter(|(k, _)| k.ends_with("_at"))
                .filter_map(|(k, v)| Some((format!("{k}_rfc3339"), rfc3339(v.as_u64()?))))
                .collect();
            for v in map.values_mut() {
                add_rfc3339(v);
            }
            for (k, v) in stamps {
                map.insert(k, Value::String(v));
            }
        }
        Value::Array(items) => items.iter_mut().for_each(add_rfc3339),
        _ => {}
    }
}

fn rfc3339(unix_secs: u64) -> String {
    humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix_secs),
    )
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_at_field_gets_an_rfc3339_sibling() {
        let mut v = serde_json::json!({
            "created_at": 0,
            "nested": [{ "pinned_at": 1796281200u64, "name": "x" }],
            "format": 1,
            "seen_at": "not a number",
        });
        add_rfc3339(&mut v);
        assert_eq!(v["created_at_rfc3339"], "1970-01-01T00:00:00Z");
        assert_eq!(v["nested"][0]["pinned_at_rfc3339"], "2026-12-03T07:00:00Z");
        assert!(v.get("format_rfc3339").is_none());
        assert!(v.get("seen_at_rfc3339").is_none());
    }

    #[test]
    fn a_cause_already_in_its_parent_is_printed_once() {
        let io = std::io::Error::from_raw_os_error(20);
        let text = io.to_string();
        let e = anyhow::Error::new(io).context(format!("opening /etc/passwd/x: {text}"));
        let e = e.context("opening the local store");
        assert_eq!(
            one_line(&e),
            format!("opening the local store: opening /etc/passwd/x: {text}")
        );
        assert_eq!(one_line(&e).matches(&text).count(), 1);
    }

    #[test]
    fn the_envelope_has_schema_results_and_errors() {
        let mut env = Envelope::start("publish");
        env.errors.push(ErrorRecord::text(
            Some("triton"),
            Stage::Store,
            "store unreachable",
        ));
        let doc = env.finish(vec![serde_json::json!({"cache_kind": "triton"})], 1);
        assert_eq!(doc["schema"], SCHEMA_VERSION);
        assert_eq!(doc["command"], "publish");
        assert_eq!(doc["ok"], false);
        assert_eq!(doc["exit_code"], 1);
        assert_eq!(doc["errors"][0]["stage"], "store");
        assert_eq!(doc["errors"][0]["cache_kind"], "triton");
        assert!(doc["started_at_rfc3339"].as_str().unwrap().ends_with('Z'));
        assert_eq!(doc["results"][0]["cache_kind"], "triton");
    }
}
