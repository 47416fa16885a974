//! A well-behaved policy for the host's golden round trip and benchmarks: keys on two facts,
//! skips temp and lock files, reads JSON files through `read-file` to check they are complete
//! (a complete `*.grp.json` is a marker that embeds the root), answers the cache incomplete while
//! a `*.partial` file exists, keeps the newest `keep` generations (a setting, default 2, at
//! least 1), and relocates by replacing the root with a token.

wit_bindgen::generate!({ path: "../../../plugins-sdk/wit", world: "policy" });

use jitship::policy::host::{self, Level};
use jitship::policy::types::{
    Decision, FileTraits, ReasonCategory, RetentionCategory, SettingKind, SettingSpec, Verdict,
};

struct Good;

fn forward_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|p| {
            host::log(Level::Error, &format!("policy panicked: {p}"))
        }))
    });
}

fn publish(detail: &str) -> Decision {
    Decision {
        verdict: Verdict::Publish,
        category: ReasonCategory::Complete,
        detail: detail.to_string(),
        traits: FileTraits::empty(),
    }
}

fn skip(category: ReasonCategory, detail: &str) -> Decision {
    Decision {
        verdict: Verdict::Skip,
        category,
        detail: detail.to_string(),
        traits: FileTraits::empty(),
    }
}

const TOKEN: &str = "${ROOT}";

fn replace(content: &[u8], from: &str, to: &str) -> Result<Vec<u8>, PolicyError> {
    let text =
        std::str::from_utf8(content).map_err(|_| PolicyError::InvalidInput("not UTF-8".into()))?;
    if !text.contains(from) {
        return Err(PolicyError::InvalidInput(format!("does not name {from}")));
    }
    Ok(text.replace(from, to).into_bytes())
}

impl Guest for Good {
    fn info() -> PolicyInfo {
        PolicyInfo {
            name: "good".into(),
            version: "1.2.3".into(),
            cache_kind: "test".into(),
            default_root: "~/.cache/test".into(),
            root_env: vec!["TEST_CACHE_DIR".into()],
            description: "test policy: keys on gpu.name and python.version".into(),
            settings: vec![SettingSpec {
                name: "keep".into(),
                kind: SettingKind::Integer,
                default_value: "2".into(),
                description: "generations kept per key (the operator's max_generations wins)"
                    .into(),
            }],
        }
    }

    fn check_settings(settings: Vec<Setting>) -> Result<(), PolicyError> {
        keep(&settings).map(drop)
    }

    fn compat_key(facts: Vec<Fact>, _settings: Vec<Setting>) -> Result<String, PolicyError> {
        forward_panics();
        let get = |n: &str| facts.iter().find(|f| f.name == n).map(|f| f.value.clone());
        let gpu = get("gpu.name").ok_or_else(|| PolicyError::MissingFact("gpu.name".into()))?;
        let py = get("python.version")
            .ok_or_else(|| PolicyError::MissingFact("python.version".into()))?;
        host::log(Level::Debug, "keyed");
        Ok(format!("test-v1;gpu={gpu};py={py}"))
    }

    fn select(
        root: String,
        entries: Vec<FileEntry>,
        _settings: Vec<Setting>,
    ) -> Result<Selection, PolicyError> {
        forward_panics();
        let decisions = entries
            .iter()
            .map(|e| {
                let name = e.path.rsplit('/').next().unwrap_or(&e.path);
                if name.ends_with(".tmp") {
                    skip(ReasonCategory::Temporary, "in-flight temp file")
                } else if name.ends_with(".lock") {
                    skip(ReasonCategory::Lock, "lock file")
                } else if name == "root-probe" {
                    // Says which root it was given (tests check it is the absolute root).
                    skip(ReasonCategory::Excluded, &format!("root is {root}"))
                } else if name.ends_with(".json") {
                    match host::read_file(&e.path, 0, 4096) {
                        Ok(bytes)
                            if bytes.first() == Some(&b'{') && bytes.last() == Some(&b'}') =>
                        {
                            let mut d = publish("complete json");
                            if name.ends_with(".grp.json") {
                                d.traits = FileTraits::MARKER | FileTraits::EMBEDS_ROOT;
                            }
                            d
                        }
                        Ok(_) => skip(ReasonCategory::Incomplete, "truncated json"),
                        Err(e) => skip(ReasonCategory::Unparseable, &format!("unreadable: {e}")),
                    }
                } else {
                    publish("complete file")
                }
            })
            .collect();
        let partial = entries
            .iter()
            .filter(|e| e.path.ends_with(".partial"))
            .count();
        Ok(Selection {
            decisions,
            complete: partial == 0,
            incomplete_detail: if partial == 0 {
                String::new()
            } else {
                format!("{partial} partial file(s) still being written")
            },
        })
    }

    fn canonicalize(
        root: String,
        _path: String,
        content: Vec<u8>,
        _settings: Vec<Setting>,
    ) -> Result<Vec<u8>, PolicyError> {
        forward_panics();
        replace(&content, &root, TOKEN)
    }

    fn materialize(
        root: String,
        _path: String,
        content: Vec<u8>,
        _settings: Vec<Setting>,
    ) -> Result<Vec<u8>, PolicyError> {
        forward_panics();
        replace(&content, TOKEN, &root)
    }

    fn retain(
        generations: Vec<GenerationSummary>,
        now: u64,
        limits: RetentionLimits,
        settings: Vec<Setting>,
    ) -> Result<Vec<RetentionDrop>, PolicyError> {
        forward_panics();
        let keep = limits
            .max_generations
            .map_or(keep(&settings)?, |m| m as usize);
        Ok(generations
            .iter()
            .enumerate()
            .filter_map(|(i, g)| {
                let too_old = limits
                    .max_age_secs
                    .is_some_and(|a| now.saturating_sub(g.created_at) > a);
                let (category, detail) = if too_old && i > 0 {
                    (RetentionCategory::Age, "over the age limit".to_owned())
                } else if i >= keep {
                    (
                        RetentionCategory::Count,
                        format!("beyond the newest {keep}"),
                    )
                } else {
                    return None;
                };
                Some(RetentionDrop {
                    id: g.id.clone(),
                    category,
                    detail,
                })
            })
            .collect())
    }
}

/// The `keep` setting: the host passes every declared setting, so it is always there.
fn keep(settings: &[Setting]) -> Result<usize, PolicyError> {
    let value = settings
        .iter()
        .find(|s| s.name == "keep")
        .ok_or_else(|| PolicyError::InvalidInput("the host passed no keep setting".into()))?;
    match value.value.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(PolicyError::InvalidInput(format!(
            "keep is {}; keep at least 1 generation",
            value.value
        ))),
    }
}

export!(Good);
