//! The fact names jitship gathers or documents (`crate::facts`' table), so that a misspelt name in
//! an override (`[facts]`, `[[cache]] facts`, `--fact`, `JITSHIP_FACTS`) is said, not accepted
//! silently: a policy that keys on `gpu.name` never sees `gpu.nmae`. A warning, not a refusal: a
//! policy of the operator's own may read a name of its own.

use super::Config;

/// Every fact `crate::facts` gathers or documents; `pkg.<distribution>` is open-ended.
pub const KNOWN_FACTS: &[&str] = &[
    "gpu.name",
    "gpu.count",
    "gpu.cc",
    "gpu.arch",
    "driver.version",
    "driver.major",
    "cuda.runtime",
    "cuda.nvcc",
    "cuda.home",
    "python.version",
    "python.executable",
    "python.site_packages",
    "python.include",
    "model.id",
    "model.revision",
    "engine.config_digest",
    "cpu.isa",
    "cpu.flags_digest",
    "cpu.threads",
    "cxx.identity",
    "inductor.env_digest",
    "os.arch",
    "host.name",
];

/// Whether `name` is a fact jitship knows.
pub fn is_known_fact(name: &str) -> bool {
    KNOWN_FACTS.contains(&name) || name.strip_prefix("pkg.").is_some_and(|p| !p.is_empty())
}

/// One line per override whose name jitship does not know, with where it was given, the nearest
/// known name and the list.
pub fn unknown_fact_warnings(config: &Config) -> Vec<String> {
    let flags = &config.flag_facts;
    let given = config
        .facts
        .keys()
        .map(|n| (n, "[facts]".to_owned()))
        .chain(config.caches.iter().flat_map(|c| {
            c.facts
                .keys()
                .map(move |n| (n, format!("[[cache]] {} facts", c.kind)))
        }))
        .chain(
            flags
                .global
                .keys()
                .map(|n| (n, "--fact / JITSHIP_FACTS".to_owned())),
        )
        .chain(flags.per_cache.iter().flat_map(|(kind, facts)| {
            facts
                .keys()
                .map(move |n| (n, format!("--fact {kind}:... / JITSHIP_FACTS")))
        }));
    given
        .filter(|(name, _)| !is_known_fact(name))
        .map(|(name, place)| {
            let nearest = KNOWN_FACTS
                .iter()
                .min_by_key(|k| strsim::damerau_levenshtein(name, k))
                .filter(|k| strsim::damerau_levenshtein(name, k) <= 3)
                .map(|k| format!("did you mean {k:?}? "))
                .unwrap_or_default();
            format!(
                "fact {name:?} ({place}) is not a fact jitship gathers or knows, so no built-in \
                 policy reads it; {nearest}the known facts are {}, and pkg.<distribution>",
                KNOWN_FACTS.join(", ")
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_fact_is_warned_about_with_the_nearest_name_and_the_list() {
        let mut config = Config::default();
        config.facts.insert("gpu.nmae".into(), "H100".into());
        config
            .facts
            .insert("model.id".into(), "Qwen/Qwen3-8B".into());
        config.facts.insert("pkg.torch".into(), "2.8.0".into());
        config
            .flag_facts
            .insert(Some("triton"), "modle.id".into(), "x".into());
        let warnings = unknown_fact_warnings(&config);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[0].contains("\"gpu.nmae\" ([facts])"),
            "{}",
            warnings[0]
        );
        assert!(
            warnings[0].contains("did you mean \"gpu.name\"?"),
            "{}",
            warnings[0]
        );
        assert!(warnings[0].contains("gpu.count"), "{}", warnings[0]);
        assert!(
            warnings[1].contains("did you mean \"model.id\"?"),
            "{}",
            warnings[1]
        );
        assert!(!is_known_fact("pkg."));
    }
}
