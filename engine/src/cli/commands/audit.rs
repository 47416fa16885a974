//! `jitship audit`: after the engine has run, did it use the installed cache? (`crate::audit`)

use anyhow::{Result, bail};

use crate::cli::args::AuditArgs;
use crate::cli::output::{self, Envelope};
use crate::cli::{exit, render};
use crate::policies::PolicySet;
use crate::roots::ProcessEnv;

pub(crate) fn run_audit(args: AuditArgs) -> Result<i32> {
    let mut config = args.resolve()?;
    if config.caches.is_empty() {
        bail!("no cache to audit: give one with --cache KIND[=ROOT] or [[cache]] in the config");
    }
    // The roots as install resolved them (a kind without =ROOT: the engine's own root from this
    // process's environment); no store, no facts.
    let policies = PolicySet::from_config(&config)?;
    let env = crate::engines::engine_env(config.engine, ProcessEnv::from_process());
    crate::roots::resolve_cache_roots(&mut config.caches, &policies, &env)?;
    let mut reports = Vec::new();
    for cache in &config.caches {
        // --engine: its candidate roots that install wrote into (install chose them by the same
        // environment and facts; audit has no facts, so the install record says which).
        if config.engine_candidates.contains(&cache.kind)
            && !crate::audit::record_path(&cache.root).exists()
        {
            continue;
        }
        reports.push(crate::audit::audit(&cache.kind, &cache.root)?);
    }
    if reports.is_empty() {
        let roots: Vec<String> = config
            .caches
            .iter()
            .map(|c| format!("{} {}", c.kind, c.root.display()))
            .collect();
        bail!(
            "nothing to audit: none of the engine's roots holds an install record ({}); run `jitship install` first",
            roots.join(", ")
        );
    }
    let code = if reports.iter().all(|r| r.warm) {
        exit::OK
    } else {
        exit::COMPILED_ANYWAY
    };
    if args.json {
        print!(
            "{}",
            output::to_text(&Envelope::start("audit").finish(&reports, code))
        );
    } else {
        reports.iter().for_each(render::worker::audit);
    }
    Ok(code)
}
