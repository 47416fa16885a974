//! A policy that misbehaves on request, so the host's containment can be tested one misbehaviour
//! at a time from a single build. `compat-key` obeys the fact `evil`; `select` obeys entry paths
//! (`read:PATH` tries to read PATH and reports the outcome as the reason; `short` answers one
//! decision too few; `bigreason` answers an oversized reason; `readall:PATH` reads PATH 1 MiB at a
//! time until refused); `retain` answers ids it was never given.

wit_bindgen::generate!({ path: "../../../../plugins-sdk/wit", world: "policy" });

use jitship::policy::host::{self, Level};
use jitship::policy::types::Verdict;

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
        }
    }

    fn compat_key(facts: Vec<Fact>) -> Result<String, PolicyError> {
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

    fn select(entries: Vec<FileEntry>) -> Result<Vec<Decision>, PolicyError> {
        forward_panics();
        if entries.first().is_some_and(|e| e.path == "short") {
            return Ok(vec![
                Decision {
                    verdict: Verdict::Publish,
                    reason: "one too few".into()
                };
                entries.len() - 1
            ]);
        }
        Ok(entries
            .iter()
            .map(|e| {
                let reason = if let Some(path) = e.path.strip_prefix("read:") {
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
                    verdict: Verdict::Skip,
                    reason,
                }
            })
            .collect())
    }

    fn retain(
        generations: Vec<GenerationSummary>,
        _now: u64,
        _limits: RetentionLimits,
    ) -> Result<Vec<String>, PolicyError> {
        let mut ids: Vec<String> = generations.iter().map(|g| g.id.clone()).collect();
        ids.push("not-a-generation-we-gave-you".into());
        Ok(ids)
    }
}

export!(Hostile);
