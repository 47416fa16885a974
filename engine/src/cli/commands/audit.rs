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
    crate::roots::resolve_cache_roots(&mut config.caches, &policies, &ProcessEnv::from_process())?;
    let mut reports = Vec::new();
    for cache in &config.caches {
        reports.push(crate::audit::audit(&cache.kind, &cache.root)?);
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
        reports.iter().for_each(render::print_audit);
    }
    Ok(code)
}
