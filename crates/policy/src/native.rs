//! Generic selection rules compiled into jitship, for a cache kind with no policy module that the
//! operator explicitly put under them (`policy = "native"`, `--cache KIND:native=ROOT`; an unknown
//! kind is otherwise refused, see `config`). They know no kind's completion signal, only what no
//! kind ever wants published (docs/jit-caches.md#never-published): in-flight temp files and
//! directories, locks, per-host files. The key is every fact except the per-host ones
//! (`jitship_policy_contract::PER_HOST_FACTS`, the list the SDK's `KeyBuilder` refuses too), so that
//! workers that differ only by host name share a key.

use std::path::Path;

use super::{
    CachePolicy, Decision, FileEntry, GenerationSummary, PolicyError, PolicyInfo, ReasonCategory,
    RetentionCategory, RetentionDrop, RetentionLimits, Selection,
};
use jitship_facts::Facts;
use jitship_generation::PolicyRef;

pub struct NativeRules {
    info: PolicyInfo,
}

impl NativeRules {
    pub fn new(cache_kind: &str) -> Self {
        Self {
            info: PolicyInfo {
                name: "native".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                cache_kind: cache_kind.into(),
                default_root: String::new(),
                root_env: vec![],
                description:
                    "generic rules: skip temp, lock and per-host files; key on every fact but the per-host ones"
                        .into(),
                settings: vec![],
            },
        }
    }
}

/// Why a path must never be published, if it must not: its category (temporary, lock, per-host)
/// and a detail.
pub fn never_publish_reason(path: &str) -> Option<(ReasonCategory, &'static str)> {
    let name = path.rsplit('/').next().unwrap_or(path);
    let in_dir = |pred: &dyn Fn(&str) -> bool| path.split('/').rev().skip(1).any(pred);
    if in_dir(&|d| d == "locks") {
        return Some((ReasonCategory::Lock, "inside a lock directory"));
    }
    if in_dir(&|d| d.starts_with("tmp.") || d.starts_with(".staging-") || d == "tmp") {
        return Some((
            ReasonCategory::Temporary,
            "inside an in-flight temp directory",
        ));
    }
    if name.ends_with(".tmp") || name.starts_with("tmp.") || name.contains(".tmp.") {
        return Some((ReasonCategory::Temporary, "in-flight temp file"));
    }
    if name.starts_with(".nfs") {
        return Some((ReasonCategory::Temporary, "NFS silly-rename file"));
    }
    if name.ends_with(".lock") || name.ends_with(".lck") {
        return Some((ReasonCategory::Lock, "lock file"));
    }
    if name.starts_with("gpu_p2p_access_cache") {
        return Some((
            ReasonCategory::PerHost,
            "per-host file (GPU topology probe)",
        ));
    }
    None
}

impl CachePolicy for NativeRules {
    fn info(&self) -> &PolicyInfo {
        &self.info
    }

    fn policy_ref(&self) -> PolicyRef {
        PolicyRef {
            name: self.info.name.clone(),
            version: self.info.version.clone(),
            digest: "native".into(),
            settings: Default::default(),
        }
    }

    /// `name=value` for every fact but the per-host ones, in name order, joined by `;`; names
    /// and values encoded by the contract's `encode_key_part` (the SDK's too) (`%`, `;`, `=` and control characters
    /// as `%XX`), so a value holding `;gpu.arch=sm_80` cannot pass for another fact. Facts made of
    /// ordinary characters encode to themselves: their keys, and compat ids, are unchanged.
    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
        use jitship_policy_contract::encode_key_part as enc;
        Ok(facts
            .iter()
            .filter(|(k, _)| !jitship_policy_contract::PER_HOST_FACTS.contains(k))
            .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
            .collect::<Vec<_>>()
            .join(";"))
    }

    fn select(&self, _root: &Path, entries: &[FileEntry]) -> Result<Selection, PolicyError> {
        Ok(Selection::complete(
            entries
                .iter()
                .map(|e| match never_publish_reason(&e.path) {
                    Some((category, detail)) => Decision::skip(category, detail),
                    None => Decision::publish("complete file"),
                })
                .collect(),
        ))
    }

    fn retain(
        &self,
        generations: &[GenerationSummary],
        now: u64,
        limits: &RetentionLimits,
    ) -> Result<Vec<RetentionDrop>, PolicyError> {
        let keep = limits.max_generations.unwrap_or(3) as usize;
        let mut bytes = 0u64;
        let mut drop = Vec::new();
        for (i, g) in generations.iter().enumerate() {
            bytes += g.size_bytes;
            let too_many = i >= keep;
            let too_big = limits.max_bytes.is_some_and(|m| bytes > m) && i > 0;
            let too_old = limits
                .max_age_secs
                .is_some_and(|a| now.saturating_sub(g.created_at) > a)
                && i > 0;
            if g.pinned {
                continue;
            }
            let why = if too_old {
                Some((
                    RetentionCategory::Age,
                    "over the operator's age limit".to_owned(),
                ))
            } else if too_big {
                Some((
                    RetentionCategory::Size,
                    "over the operator's byte quota".to_owned(),
                ))
            } else if too_many {
                Some((
                    RetentionCategory::Count,
                    format!("beyond the newest {keep} generations kept"),
                ))
            } else {
                None
            };
            if let Some((category, detail)) = why {
                drop.push(RetentionDrop {
                    id: g.id,
                    category,
                    detail,
                });
            }
        }
        Ok(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two workers that differ only in per-host facts share a key; any other fact splits it.
    #[test]
    fn key_ignores_per_host_facts_and_follows_every_other_fact() {
        let worker = |host: &str, python: &str, gpu: &str| {
            let mut f = Facts::new();
            f.set("host.name", host);
            f.set("python.executable", python);
            f.set("gpu.name", gpu);
            f.set("pkg.torch", "2.15.0");
            f
        };
        let rules = NativeRules::new("kernels");
        let a = rules
            .compat_key(&worker("pod-a", "/venv-a/bin/python3", "H100"))
            .unwrap();
        let b = rules
            .compat_key(&worker("pod-b", "/venv-b/bin/python3", "H100"))
            .unwrap();
        assert_eq!(a, b);
        for name in jitship_policy_contract::PER_HOST_FACTS {
            assert!(!a.contains(name), "{name} is in the native key {a}");
        }
        assert!(a.contains("pkg.torch=2.15.0"), "{a}");
        let c = rules
            .compat_key(&worker("pod-a", "/venv-a/bin/python3", "A100"))
            .unwrap();
        assert_ne!(a, c);
    }

    fn facts_of(pairs: &[(String, String)]) -> Facts {
        let mut f = Facts::new();
        for (k, v) in pairs {
            f.set(k.clone(), v.clone());
        }
        f
    }

    /// A value holding the key's separators is one fact, never a second one.
    #[test]
    fn a_value_holding_separators_cannot_pass_for_another_fact() {
        let rules = NativeRules::new("kernels");
        let key = |pairs: &[(&str, &str)]| {
            let pairs: Vec<(String, String)> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            rules.compat_key(&facts_of(&pairs)).unwrap()
        };
        assert_ne!(
            key(&[("model.id", "Q;pkg.torch=2.8.0")]),
            key(&[("model.id", "Q"), ("pkg.torch", "2.8.0")])
        );
        assert_ne!(key(&[("a", "1=2")]), key(&[("a=1", "2")]));
        assert_ne!(key(&[("a", "x\ny")]), key(&[("a", "x%0Ay")]));
        // Ordinary facts give the key they always gave.
        assert_eq!(
            key(&[("gpu.arch", "sm_90"), ("model.id", "Qwen/Qwen3-8B")]),
            "gpu.arch=sm_90;model.id=Qwen/Qwen3-8B"
        );
    }

    proptest::proptest! {
        /// Distinct fact maps (names and values drawn from the separators, `%`, a newline and
        /// ordinary characters) give distinct native keys.
        #[test]
        fn distinct_fact_maps_give_distinct_native_keys(
            a in proptest::collection::btree_map("[a;=%\\n.]{1,3}", "[a;=%\\n/ ]{1,4}", 0..4),
            b in proptest::collection::btree_map("[a;=%\\n.]{1,3}", "[a;=%\\n/ ]{1,4}", 0..4),
        ) {
            let rules = NativeRules::new("kernels");
            let pairs = |m: &std::collections::BTreeMap<String, String>| {
                m.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<Vec<_>>()
            };
            let (ka, kb) = (
                rules.compat_key(&facts_of(&pairs(&a))).unwrap(),
                rules.compat_key(&facts_of(&pairs(&b))).unwrap(),
            );
            proptest::prop_assert_eq!(a == b, ka == kb, "{:?} {:?}: {} {}", a, b, ka, kb);
        }

        /// The forgery a raw join allows, generated: two neighbouring facts folded into the
        /// first one's value (`a=1`, `b=2` -> `a=1;b=2`) never give the same key.
        #[test]
        fn folding_a_fact_into_its_neighbours_value_changes_the_key(
            a in proptest::collection::btree_map("[a-c.;=%]{1,3}", "[a-c;=%\\n]{1,4}", 2..5),
            at in 0usize..4,
        ) {
            let rules = NativeRules::new("kernels");
            let pairs: Vec<(String, String)> =
                a.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            let i = at % (pairs.len() - 1);
            let mut folded = pairs.clone();
            let (k2, v2) = folded.remove(i + 1);
            folded[i].1 = format!("{};{k2}={v2}", folded[i].1);
            proptest::prop_assert_ne!(
                rules.compat_key(&facts_of(&pairs)).unwrap(),
                rules.compat_key(&facts_of(&folded)).unwrap()
            );
        }
    }

    #[test]
    fn skips_what_no_cache_kind_wants() {
        use ReasonCategory::*;
        for (p, category) in [
            ("tmp.pid_12_abc/x.cubin", Temporary),
            ("ab/tmp.pid_1_2/k.json", Temporary),
            ("cache/tmp/uuid/kernel.cu", Temporary),
            ("model.123.tmp", Temporary),
            ("x/.staging-1234/m.so", Temporary),
            ("cached_ops/tmp/a.lock", Temporary),
            ("gpu_p2p_access_cache_for_0,1.json", PerHost),
            ("locks/abc", Lock),
            ("x/y.lock", Lock),
            ("fx/.1.2.tmp", Temporary),
            ("ab/.nfs000012", Temporary),
        ] {
            assert_eq!(
                never_publish_reason(p).map(|(c, _)| c),
                Some(category),
                "{p}"
            );
        }
        for p in [
            "ab/k.cubin",
            "ab/__grp__k.json",
            "cache/kernel.x/kernel.cubin",
            "rank_0_0/model",
        ] {
            assert!(never_publish_reason(p).is_none(), "{p} would be skipped");
        }
    }
}
