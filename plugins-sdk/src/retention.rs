use std::collections::BTreeSet;

use crate::{GenerationSummary, PolicyError, RetentionCategory, RetentionDrop, RetentionLimits};

/// A policy's own retention defaults, used where the operator set no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionDefaults {
    pub max_generations: u32,
    pub max_bytes: Option<u64>,
    pub max_age_secs: Option<u64>,
}

impl RetentionDefaults {
    /// Keep the newest `n` unpinned generations, no byte or age limit.
    pub const fn keep(n: u32) -> Self {
        Self {
            max_generations: n,
            max_bytes: None,
            max_age_secs: None,
        }
    }
}

/// The default retention: walks generations newest first and drops a generation when keeping it
/// would exceed the count of unpinned generations, the byte quota or the age limit, saying which
/// (age first, then size, then count, when several apply). Operator `limits` override `defaults`.
///
/// The byte quota counts **logical** bytes: each generation's `size_bytes`, the sum of its
/// files' sizes as installed, whatever the store holds (packs shared between generations are
/// counted in each, so the store holds at most this much of them, usually less). Every kept
/// generation counts, pinned ones and the newest included. Once one unpinned generation does not
/// fit, every older unpinned one is dropped too, however small: the quota keeps the newest
/// generations that fit, never an older, smaller one in place of a newer one.
///
/// Never dropped: pinned generations, and the newest generation (installs read it; dropping it
/// would leave the key with nothing or an older cache). Duplicate ids are `invalid-input`.
pub fn default_retain(
    generations: &[GenerationSummary],
    now: u64,
    limits: &RetentionLimits,
    defaults: &RetentionDefaults,
) -> Result<Vec<RetentionDrop>, PolicyError> {
    let mut seen = BTreeSet::new();
    for g in generations {
        if !seen.insert(g.id.as_str()) {
            return Err(PolicyError::InvalidInput(format!(
                "generation {} listed twice",
                g.id
            )));
        }
    }
    let max_gens = limits.max_generations.unwrap_or(defaults.max_generations);
    let max_bytes = limits.max_bytes.or(defaults.max_bytes);
    let max_age = limits.max_age_secs.or(defaults.max_age_secs);

    let mut kept_unpinned = 0u32;
    let mut kept_bytes = 0u64;
    // Set once a generation did not fit the byte quota: every older unpinned one goes too.
    let mut quota_full_at: Option<usize> = None;
    let mut drop = Vec::new();
    for (i, g) in generations.iter().enumerate() {
        if g.pinned || i == 0 {
            kept_bytes = kept_bytes.saturating_add(g.size_bytes);
            kept_unpinned += u32::from(!g.pinned);
            continue;
        }
        let age = now.saturating_sub(g.created_at);
        let why = if let Some(max_age) = max_age.filter(|a| age > *a) {
            Some((
                RetentionCategory::Age,
                format!("published {age} s ago, over the age limit of {max_age} s"),
            ))
        } else if let (Some(max), Some(_)) = (max_bytes, quota_full_at) {
            Some((
                RetentionCategory::Size,
                format!(
                    "older than a generation that did not fit the quota of {max} bytes (logical \
                     bytes; the newest generations that fit are kept)"
                ),
            ))
        } else if let Some(max) = max_bytes.filter(|m| kept_bytes.saturating_add(g.size_bytes) > *m)
        {
            quota_full_at = Some(i);
            Some((
                RetentionCategory::Size,
                format!(
                    "its {} bytes would put the kept generations over the quota of {max} bytes \
                     (logical bytes)",
                    g.size_bytes
                ),
            ))
        } else if kept_unpinned >= max_gens {
            Some((
                RetentionCategory::Count,
                format!("beyond the newest {max_gens} unpinned generations kept"),
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
            kept_unpinned += 1;
            kept_bytes = kept_bytes.saturating_add(g.size_bytes);
        }
    }
    Ok(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 43: a newer generation that does not fit the quota takes every older one with it; an
    /// older, smaller one never stays in its place.
    #[test]
    fn the_byte_quota_keeps_the_newest_that_fit_never_an_older_smaller_one() {
        let gens = [
            g("new", 100, 10, false),
            g("big", 90, 30, false),
            g("small", 80, 5, false),
            g("pin", 70, 5, true),
        ];
        let limits = RetentionLimits {
            max_generations: None,
            max_bytes: Some(25),
            max_age_secs: None,
        };
        let drops = default_retain(&gens, 100, &limits, &RetentionDefaults::keep(10)).unwrap();
        let got: Vec<(&str, RetentionCategory)> =
            drops.iter().map(|d| (d.id.as_str(), d.category)).collect();
        assert_eq!(
            got,
            [
                ("big", RetentionCategory::Size),
                ("small", RetentionCategory::Size)
            ]
        );
        assert!(
            drops[1]
                .detail
                .contains("older than a generation that did not fit")
        );
    }

    fn g(id: &str, created_at: u64, size: u64, pinned: bool) -> GenerationSummary {
        GenerationSummary {
            id: id.into(),
            compat_key: "k".into(),
            created_at,
            size_bytes: size,
            file_count: 1,
            pinned,
        }
    }

    fn ids(drops: Result<Vec<RetentionDrop>, PolicyError>) -> Vec<String> {
        drops.unwrap().into_iter().map(|d| d.id).collect()
    }

    #[test]
    fn each_drop_says_why() {
        let gens = [
            g("a", 100, 10, false),
            g("b", 90, 10, false),
            g("c", 10, 10, false),
        ];
        let age = RetentionLimits {
            max_generations: None,
            max_bytes: None,
            max_age_secs: Some(50),
        };
        let drops = default_retain(&gens, 100, &age, &RetentionDefaults::keep(1)).unwrap();
        let why: Vec<_> = drops.iter().map(|d| (d.id.as_str(), d.category)).collect();
        assert_eq!(
            why,
            [
                ("b", RetentionCategory::Count),
                ("c", RetentionCategory::Age)
            ]
        );
        assert_eq!(
            drops[0].detail,
            "beyond the newest 1 unpinned generations kept"
        );
        assert!(drops[1].detail.contains("90 s ago"), "{}", drops[1].detail);
    }

    #[test]
    fn count_bytes_age_and_pins() {
        let gens = [
            g("a", 100, 10, false),
            g("b", 90, 10, true),
            g("c", 80, 10, false),
            g("d", 70, 10, false),
            g("e", 60, 10, false),
        ];
        let none = RetentionLimits {
            max_generations: None,
            max_bytes: None,
            max_age_secs: None,
        };
        // keep 2 unpinned: a, c; the pin b is extra.
        assert_eq!(
            ids(default_retain(
                &gens,
                100,
                &none,
                &RetentionDefaults::keep(2)
            )),
            ["d", "e"]
        );
        // operator limit overrides the default
        let one = RetentionLimits {
            max_generations: Some(1),
            ..none
        };
        assert_eq!(
            ids(default_retain(
                &gens,
                100,
                &one,
                &RetentionDefaults::keep(2)
            )),
            ["c", "d", "e"]
        );
        // 25 bytes: a + pinned b = 20, c would make 30.
        let bytes = RetentionLimits {
            max_bytes: Some(25),
            ..none
        };
        assert_eq!(
            ids(default_retain(
                &gens,
                100,
                &bytes,
                &RetentionDefaults::keep(9)
            )),
            ["c", "d", "e"]
        );
        // age: older than 25 s at now=100 -> d, e (the newest and pins never).
        let age = RetentionLimits {
            max_age_secs: Some(25),
            ..none
        };
        assert_eq!(
            ids(default_retain(
                &gens,
                100,
                &age,
                &RetentionDefaults::keep(9)
            )),
            ["d", "e"]
        );
        // newest kept even when everything is over quota
        let zero = RetentionLimits {
            max_generations: Some(0),
            max_bytes: Some(0),
            max_age_secs: Some(0),
        };
        assert_eq!(
            ids(default_retain(
                &gens[..1],
                1000,
                &zero,
                &RetentionDefaults::keep(0)
            )),
            Vec::<String>::new()
        );
        let dup = [g("a", 1, 1, false), g("a", 1, 1, false)];
        assert!(default_retain(&dup, 1, &none, &RetentionDefaults::keep(1)).is_err());
    }
}
