//! A policy that misbehaves on request, so the host's containment can be tested one misbehaviour
//! at a time from a single build. `compat-key` obeys the fact `evil`; `select` obeys entry paths
//! (`read:PATH` tries to read PATH and reports the outcome as the detail; `short` answers one
//! decision too few; `bigreason` answers an oversized detail; `readall:PATH` reads PATH 1 MiB at a
//! time until refused; `skipcomplete` skips with category complete; `publishlock` publishes with
//! category lock; `skiptraits` gives a skipped file traits; `silentincomplete` answers an
//! incomplete cache without a detail); `canonicalize`/`materialize` obey the path (`grow` answers
//! far more bytes than given, `spin` never returns, anything else echoes); `retain` answers ids it
//! was never given.

wit_bindgen::generate!({ path: "../../../plugins-sdk/wit", world: "policy" });

use jitship::policy::host::{self, Level};
use jitship::policy::types::{
    Decision, FileTraits, ReasonCategory, RetentionCategory, SettingKind, SettingSpec, Verdict,
};

struct Hostile;

fn forward_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|p| {
            host::log(Level::Error, &format!("policy panicked: {p}"))
        }))
    });
}

fn spin() -> ! {
    let mut n = 0u64;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}

#[allow(unconditional_recursion)]
fn recurse(depth: u64) -> u64 {
    let local = std::hint::black_box([depth; 64]);
    recurse(depth + 1) + local[3]
}

impl Guest for Hostile {
    fn info() -> PolicyInfo {
        PolicyInfo {
            name: "hostile".into(),
            version: "0.0.1".into(),
            cache_kind: "hostile".into(),
            default_root: String::new(),
            root_env: vec![],
            description: "misbehaves on request".into(),
            settings: vec![SettingSpec {
                name: "evil".into(),
                kind: SettingKind::Text,
                default_value: String::new(),
                description: "loop: check-settings never ends; refuse: it refuses".into(),
            }],
        }
    }

    fn check_settings(settings: Vec<Setting>) -> Result<(), PolicyError> {
        forward_panics();
        match settings
            .iter()
            .find(|s| s.name == "evil")
            .map(|s| s.value.as_str())
        {
            Some("loop") => spin(),
            Some("refuse") => Err(PolicyError::InvalidInput("evil=refuse: refused".into())),
            _ => Ok(()),
        }
    }

    fn compat_key(facts: Vec<Fact>, _settings: Vec<Setting>) -> Result<String, PolicyError> {
        forward_panics();
        let evil = facts
            .iter()
            .find(|f| f.name == "evil")
            .map(|f| f.value.as_str())
            .unwrap_or("");
        match evil {
            "loop" => spin(),
            "bomb" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(std::hint::black_box(vec![7u8; 1 << 20]));
                }
            }
            "panic" => panic!("deliberate panic for test: {}", facts.len()),
            "recurse" => Ok(recurse(0).to_string()),
            "logspam" => {
                let line = "x".repeat(64 * 1024);
                for _ in 0..5000 {
                    host::log(Level::Warn, &line);
                }
                Ok("spammed".into())
            }
            "bigkey" => Ok("k".repeat(1 << 20)),
            "emptykey" => Ok(String::new()),
            "error" => Err(PolicyError::Internal("asked to fail".into())),
            _ => Ok("hostile-key".into()),
        }
    }

    fn select(
        _root: String,
        entries: Vec<FileEntry>,
        _settings: Vec<Setting>,
    ) -> Result<Selection, PolicyError> {
        forward_panics();
        let complete = |decisions| Selection {
            decisions,
            complete: true,
            incomplete_detail: String::new(),
        };
        let first = entries.first().map(|e| e.path.as_str());
        if first == Some("short") {
            return Ok(complete(vec![
                Decision {
                    verdict: Verdict::Publish,
                    category: ReasonCategory::Complete,
                    detail: "one too few".into(),
                    traits: FileTraits::empty(),
                };
                entries.len() - 1
            ]));
        }
        let decisions: Vec<Decision> = entries
            .iter()
            .map(|e| {
                let (verdict, category, traits) = match e.path.as_str() {
                    "skipcomplete" => {
                        (Verdict::Skip, ReasonCategory::Complete, FileTraits::empty())
                    }
                    "publishlock" => (Verdict::Publish, ReasonCategory::Lock, FileTraits::empty()),
                    "skiptraits" => (Verdict::Skip, ReasonCategory::Excluded, FileTraits::MARKER),
                    _ => (Verdict::Skip, ReasonCategory::Excluded, FileTraits::empty()),
                };
                let detail = if let Some(path) = e.path.strip_prefix("read:") {
                    match host::read_file(path, 0, 64) {
                        Ok(bytes) => format!("read ok: {}", String::from_utf8_lossy(&bytes)),
                        Err(msg) => format!("refused: {msg}"),
                    }
                } else if let Some(path) = e.path.strip_prefix("readall:") {
                    let mut total = 0u64;
                    loop {
                        match host::read_file(path, total, 1 << 20) {
                            Ok(bytes) if bytes.is_empty() => {
                                break format!("eof after {total} bytes");
                            }
                            Ok(bytes) => total += bytes.len() as u64,
                            Err(msg) => break format!("refused after {total} bytes: {msg}"),
                        }
                    }
                } else if e.path == "bigreason" {
                    "r".repeat(100_000)
                } else {
                    "fine".into()
                };
                Decision {
                    verdict,
                    category,
                    detail,
                    traits,
                }
            })
            .collect();
        if first == Some("silentincomplete") {
            return Ok(Selection {
                decisions,
                complete: false,
                incomplete_detail: String::new(),
            });
        }
        Ok(complete(decisions))
    }

    fn canonicalize(
        _root: String,
        path: String,
        content: Vec<u8>,
        _settings: Vec<Setting>,
    ) -> Result<Vec<u8>, PolicyError> {
        forward_panics();
        rewrite(&path, content)
    }

    fn materialize(
        _root: String,
        path: String,
        content: Vec<u8>,
        _settings: Vec<Setting>,
    ) -> Result<Vec<u8>, PolicyError> {
        forward_panics();
        rewrite(&path, content)
    }

    fn retain(
        generations: Vec<GenerationSummary>,
        _now: u64,
        _limits: RetentionLimits,
        _settings: Vec<Setting>,
    ) -> Result<Vec<RetentionDrop>, PolicyError> {
        let mut ids: Vec<String> = generations.iter().map(|g| g.id.clone()).collect();
        ids.push("not-a-generation-we-gave-you".into());
        Ok(ids
            .into_iter()
            .map(|id| RetentionDrop {
                id,
                category: RetentionCategory::Rule,
                detail: "drops everything".into(),
            })
            .collect())
    }
}

fn rewrite(path: &str, content: Vec<u8>) -> Result<Vec<u8>, PolicyError> {
    match path {
        "grow" => Ok(vec![b'x'; content.len() + (4 << 20)]),
        "spin" => spin(),
        _ => Ok(content),
    }
}

export!(Hostile);
