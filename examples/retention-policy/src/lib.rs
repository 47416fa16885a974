//! An example third-party jitship policy, written with `jitship-policy-sdk` only.
//!
//! It governs a Triton cache like the built-in policy does for keys, but with its own, simpler
//! selection and, above all, its own **retention**: pinned generations are "golden" (validated
//! by the operator) and always stay; the newest generation always stays (installs read it);
//! the others stay newest first while they fit in a byte quota (the `quota` setting, 20 GiB,
//! unless the operator sets `max-bytes`) and a count (the `keep` setting, 5, unless
//! `max-generations`), and none older than `max-age` if set. Golden generations count against
//! the quota, so a heavy golden set leaves less room for recent ones, which is the point: the
//! quota is what the store can hold. Each drop says which rule dropped it.

use jitship_policy_sdk::{
    Decision, Facts, FileEntry, GenerationSummary, Host, KeyBuilder, Policy, PolicyError,
    PolicyInfo, ReasonCategory, RetentionCategory, RetentionDrop, RetentionLimits, SettingSpec,
    Settings, export_policy, file_name, never_publish,
};

pub const DEFAULT_QUOTA_BYTES: u64 = 20 << 30;
pub const DEFAULT_MAX_GENERATIONS: u32 = 5;

/// The retention rule's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoldenRetention {
    /// Generations kept (besides golden ones), unless the operator's `max-generations` is set.
    pub keep: u32,
    /// Bytes all kept generations may hold, unless the operator's `max-bytes` is set.
    pub quota: u64,
}

impl Default for GoldenRetention {
    fn default() -> Self {
        Self {
            keep: DEFAULT_MAX_GENERATIONS,
            quota: DEFAULT_QUOTA_BYTES,
        }
    }
}

impl Policy for GoldenRetention {
    fn info(&self) -> PolicyInfo {
        PolicyInfo {
            name: "golden-retention".into(),
            version: "0.1.0".into(),
            cache_kind: "triton".into(),
            default_root: "~/.triton/cache".into(),
            root_env: vec!["TRITON_CACHE_DIR".into()],
            description: "example: Triton files with a group file beside them; keeps golden (pinned) generations within a byte quota".into(),
            settings: vec![
                SettingSpec::integer(
                    "keep",
                    DEFAULT_MAX_GENERATIONS.into(),
                    "generations kept besides golden ones (the operator's max_generations wins)",
                ),
                SettingSpec::bytes(
                    "quota",
                    DEFAULT_QUOTA_BYTES,
                    "bytes all kept generations may hold, golden ones included (max_bytes wins)",
                ),
            ],
        }
    }

    fn configure(self, settings: &Settings) -> Result<Self, PolicyError> {
        let keep = settings.integer("keep")?;
        let keep = u32::try_from(keep)
            .ok()
            .filter(|k| *k >= 1)
            .ok_or_else(|| {
                PolicyError::InvalidInput(format!("keep is {keep}; keep at least 1 generation"))
            })?;
        Ok(Self {
            keep,
            quota: settings.bytes("quota")?,
        })
    }

    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
        KeyBuilder::new("triton-golden", 1)
            .require_all(
                facts,
                &["pkg.triton", "gpu.arch", "driver.major", "os.arch"],
            )?
            .build()
    }

    /// A deliberately simple rule: publish the files of kernel directories that have a group
    /// file (the built-in `triton` policy also checks what the group names, and relocates
    /// groups to the installing root). The group is a marker: Triton finds the kernel through it,
    /// so an install commits it last.
    fn select(
        &self,
        _host: &dyn Host,
        _root: &str,
        entries: &[FileEntry],
    ) -> Result<Vec<Decision>, PolicyError> {
        let grouped: std::collections::BTreeSet<&str> = entries
            .iter()
            .filter(|e| file_name(&e.path).starts_with("__grp__"))
            .filter_map(|e| e.path.rsplit_once('/').map(|(d, _)| d))
            .collect();
        Ok(entries
            .iter()
            .map(|e| match never_publish(&e.path) {
                Some(skip) => skip,
                None => match e.path.rsplit_once('/') {
                    Some((d, _)) if grouped.contains(d) => {
                        let d = Decision::publish("kernel directory with a group file");
                        if file_name(&e.path).starts_with("__grp__") {
                            d.marker()
                        } else {
                            d
                        }
                    }
                    _ => Decision::skip(ReasonCategory::Incomplete, "no group file beside it"),
                },
            })
            .collect())
    }

    fn retain(
        &self,
        generations: &[GenerationSummary],
        now: u64,
        limits: &RetentionLimits,
    ) -> Result<Vec<RetentionDrop>, PolicyError> {
        golden_retain(self, generations, now, limits)
    }
}

/// The retention rule, as a plain function.
pub fn golden_retain(
    settings: &GoldenRetention,
    gens: &[GenerationSummary],
    now: u64,
    limits: &RetentionLimits,
) -> Result<Vec<RetentionDrop>, PolicyError> {
    if gens.windows(2).any(|w| w[0].created_at < w[1].created_at) {
        return Err(PolicyError::InvalidInput(
            "generations are not newest first".into(),
        ));
    }
    let quota = limits.max_bytes.unwrap_or(settings.quota);
    let max_gens = limits.max_generations.unwrap_or(settings.keep);
    // Golden generations and the newest one are kept first, whatever their age or size.
    let mut used: u64 = gens
        .iter()
        .enumerate()
        .filter(|(i, g)| g.pinned || *i == 0)
        .map(|(_, g)| g.size_bytes)
        .fold(0, u64::saturating_add);
    let mut kept = u32::from(gens.first().is_some_and(|g| !g.pinned));
    let mut drop = Vec::new();
    for g in gens.iter().skip(1).filter(|g| !g.pinned) {
        let too_old = limits
            .max_age_secs
            .is_some_and(|a| now.saturating_sub(g.created_at) > a);
        let fits = used.saturating_add(g.size_bytes) <= quota;
        let why = if too_old {
            Some((RetentionCategory::Age, "older than max-age".to_owned()))
        } else if !fits {
            Some((
                RetentionCategory::Size,
                format!("does not fit in the quota of {quota} bytes after golden and newer ones"),
            ))
        } else if kept >= max_gens {
            Some((
                RetentionCategory::Count,
                format!("beyond the newest {max_gens} generations (golden ones are extra)"),
            ))
        } else {
            None
        };
        if let Some((category, detail)) = why {
            drop.push(RetentionDrop {
                id: g.id.clone(),
                category,
                detail,
            });
        } else {
            used += g.size_bytes;
            kept += 1;
        }
    }
    Ok(drop)
}

export_policy!(GoldenRetention);

#[cfg(test)]
mod tests {
    use super::*;

    fn g(id: &str, created_at: u64, gib: u64, pinned: bool) -> GenerationSummary {
        GenerationSummary {
            id: id.into(),
            compat_key: "k".into(),
            created_at,
            size_bytes: gib << 30,
            file_count: 10,
            pinned,
        }
    }
    fn ids(drops: Result<Vec<RetentionDrop>, PolicyError>) -> Vec<String> {
        drops.unwrap().into_iter().map(|d| d.id).collect()
    }

    /// The rule with its default settings.
    fn golden(
        gens: &[GenerationSummary],
        now: u64,
        limits: &RetentionLimits,
    ) -> Result<Vec<RetentionDrop>, PolicyError> {
        golden_retain(&GoldenRetention::default(), gens, now, limits)
    }

    const NONE: RetentionLimits = RetentionLimits {
        max_generations: None,
        max_bytes: None,
        max_age_secs: None,
    };

    #[test]
    fn golden_generations_stay_and_count_against_the_quota() {
        // newest 4 GiB, golden 12 GiB, then 3 + 3 + 3 GiB: 4 + 12 + 3 = 19 fits in 20, the rest not.
        let gens = [
            g("new", 50, 4, false),
            g("gold", 40, 12, true),
            g("a", 30, 3, false),
            g("b", 20, 3, false),
            g("c", 10, 3, false),
        ];
        assert_eq!(ids(golden(&gens, 60, &NONE)), ["b", "c"]);
        // The same through the settings an operator gives: quota 100 GiB, keep 2.
        let info = GoldenRetention::default().info();
        let given = Settings::defaults(&info)
            .set("quota", &(100u64 << 30).to_string())
            .set("keep", "2");
        let configured = GoldenRetention::default().configure(&given).unwrap();
        let drops = configured.retain(&gens, 60, &NONE).unwrap();
        assert_eq!(
            drops.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(),
            ["b", "c"]
        );
        assert_eq!(drops[0].category, RetentionCategory::Count);
        let zero = Settings::defaults(&info).set("keep", "0");
        assert!(GoldenRetention::default().configure(&zero).is_err());
        // a bigger quota keeps everything; a count of 2 keeps new + a (golden is extra).
        let big = RetentionLimits {
            max_bytes: Some(100 << 30),
            ..NONE
        };
        assert!(ids(golden(&gens, 60, &big)).is_empty());
        let two = RetentionLimits {
            max_bytes: Some(100 << 30),
            max_generations: Some(2),
            ..NONE
        };
        assert_eq!(ids(golden(&gens, 60, &two)), ["b", "c"]);
    }

    #[test]
    fn golden_and_newest_survive_even_over_quota_and_age() {
        let gens = [
            g("new", 50, 30, false),
            g("gold", 1, 30, true),
            g("old", 0, 1, false),
        ];
        let strict = RetentionLimits {
            max_bytes: Some(1),
            max_age_secs: Some(5),
            max_generations: Some(0),
        };
        assert_eq!(ids(golden(&gens, 60, &strict)), ["old"]);
    }

    #[test]
    fn refuses_unordered_input() {
        let gens = [g("a", 1, 1, false), g("b", 2, 1, false)];
        assert!(matches!(
            golden(&gens, 3, &NONE),
            Err(PolicyError::InvalidInput(_))
        ));
    }

    #[test]
    fn key_and_select() {
        let f = Facts::from_pairs([
            ("pkg.triton", "3.9.0"),
            ("gpu.arch", "sm_90"),
            ("driver.major", "550"),
            ("os.arch", "x86_64"),
        ])
        .unwrap();
        assert_eq!(
            GoldenRetention::default().compat_key(&f).unwrap(),
            "triton-golden@1;driver.major=550;gpu.arch=sm_90;os.arch=x86_64;pkg.triton=3.9.0"
        );
        let entries: Vec<FileEntry> = [
            "H/__grp__k.json",
            "H/k.cubin",
            "I/k.ttir",
            "H/tmp.pid_1_2/k.ptx",
        ]
        .iter()
        .map(|p| FileEntry {
            path: p.to_string(),
            size: 1,
            mtime_ms: 0,
        })
        .collect();
        let host = jitship_policy_sdk::WasmHost;
        let s =
            jitship_policy_sdk::run::select(&GoldenRetention::default(), &host, "/cache", &entries)
                .unwrap();
        assert_eq!(
            s.decisions
                .iter()
                .map(Decision::is_publish)
                .collect::<Vec<_>>(),
            [true, true, false, false]
        );
        assert_eq!(
            s.decisions.iter().map(|d| d.category).collect::<Vec<_>>(),
            [
                ReasonCategory::Complete,
                ReasonCategory::Complete,
                ReasonCategory::Incomplete,
                ReasonCategory::Temporary
            ]
        );
        assert!(s.decisions[0].is_marker() && !s.decisions[1].is_marker());
        assert!(s.complete);
    }
}
