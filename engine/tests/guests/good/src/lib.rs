//! A well-behaved policy for the host's golden round trip and benchmarks: keys on two facts,
//! skips temp and lock files, reads JSON files through `read-file` to check they are complete,
//! keeps the newest generations.

wit_bindgen::generate!({ path: "../../../../plugins-sdk/wit", world: "policy" });

use jitship::policy::host::{self, Level};
use jitship::policy::types::Verdict;

struct Good;

fn forward_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|p| {
            host::log(Level::Error, &format!("policy panicked: {p}"))
        }))
    });
}

fn decision(verdict: Verdict, reason: &str) -> Decision {
    Decision {
        verdict,
        reason: reason.to_string(),
    }
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
        }
    }

    fn compat_key(facts: Vec<Fact>) -> Result<String, PolicyError> {
        forward_panics();
        let get = |n: &str| facts.iter().find(|f| f.name == n).map(|f| f.value.clone());
        let gpu = get("gpu.name").ok_or_else(|| PolicyError::MissingFact("gpu.name".into()))?;
        let py = get("python.version")
            .ok_or_else(|| PolicyError::MissingFact("python.version".into()))?;
        host::log(Level::Debug, "keyed");
        Ok(format!("test-v1;gpu={gpu};py={py}"))
    }

    fn select(entries: Vec<FileEntry>) -> Result<Vec<Decision>, PolicyError> {
        forward_panics();
        Ok(entries
            .iter()
            .map(|e| {
                let name = e.path.rsplit('/').next().unwrap_or(&e.path);
                if name.ends_with(".tmp") {
                    decision(Verdict::Skip, "in-flight temp file")
                } else if name.ends_with(".lock") {
                    decision(Verdict::Skip, "lock file")
                } else if name.ends_with(".json") {
                    match host::read_file(&e.path, 0, 4096) {
                        Ok(bytes)
                            if bytes.first() == Some(&b'{') && bytes.last() == Some(&b'}') =>
                        {
                            decision(Verdict::Publish, "complete json")
                        }
                        Ok(_) => decision(Verdict::Skip, "truncated json"),
                        Err(e) => decision(Verdict::Skip, &format!("unreadable: {e}")),
                    }
                } else {
                    decision(Verdict::Publish, "complete file")
                }
            })
            .collect())
    }

    fn retain(
        generations: Vec<GenerationSummary>,
        now: u64,
        limits: RetentionLimits,
    ) -> Result<Vec<String>, PolicyError> {
        forward_panics();
        let keep = limits.max_generations.unwrap_or(2) as usize;
        Ok(generations
            .iter()
            .enumerate()
            .filter(|(i, g)| {
                let too_old = limits
                    .max_age_secs
                    .is_some_and(|a| now.saturating_sub(g.created_at) > a);
                *i >= keep || (too_old && *i > 0)
            })
            .map(|(_, g)| g.id.clone())
            .collect())
    }
}

export!(Good);
