//! The policy-author commands: policy build, check, test (printed by `render::policy`).

use std::path::PathBuf;

use anyhow::Result;

use crate::cli::args::{PolicyBuildArgs, PolicyCheckArgs, PolicyCommand, PolicyTestArgs};
use crate::cli::exit;
use crate::cli::render::policy::{self as render, Built, Refused};
use crate::config;
use crate::facts::Facts;

pub(crate) fn run_policy(cmd: PolicyCommand) -> Result<i32> {
    match cmd {
        PolicyCommand::Build(args) => run_policy_build(args),
        PolicyCommand::Check(args) => run_policy_check(args),
        PolicyCommand::Test(args) => run_policy_test(args),
        PolicyCommand::New(args) => super::policy_new::run_policy_new(args),
    }
}

pub(crate) fn run_policy_build(args: PolicyBuildArgs) -> Result<i32> {
    use crate::policy::build::{BuildOptions, build_policy_crate, write_component};
    let opts = BuildOptions {
        target_dir: args.target_dir.clone(),
        quiet: false,
        locked: args.locked,
    };
    let built = build_policy_crate(&args.path, &opts)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{}.wasm", built.name)));
    write_component(&out, &built.component)?;
    for w in &built.warnings {
        eprintln!("warning: {w}");
    }
    let report = Built {
        name: &built.name,
        path: &out,
        digest: &built.digest,
        core_size: built.core_size,
        component_size: built.component.len(),
        warnings: &built.warnings,
    };
    render::built(&report, args.json);
    Ok(exit::OK)
}

pub(crate) fn run_policy_check(args: PolicyCheckArgs) -> Result<i32> {
    let engine = args.sandbox.engine()?;
    let settings = crate::cli::args::policy_settings(&args.settings)?;
    match crate::author::check(&engine, &args.file, &settings) {
        Ok(report) => {
            render::check(&report, args.json);
            Ok(exit::OK)
        }
        Err(e) => Ok(refused(&args.file, None, e.to_string(), args.json)),
    }
}

pub(crate) fn run_policy_test(args: PolicyTestArgs) -> Result<i32> {
    let engine = args.sandbox.engine()?;
    let settings = crate::cli::args::policy_settings(&args.settings)?;
    let policy = match engine
        .load_file(&args.file)
        .and_then(|p| p.configure(&settings))
    {
        Ok(p) => p,
        Err(e) => return Ok(refused(&args.file, None, e.to_string(), args.json)),
    };
    let mut facts = Facts::new();
    for arg in args.facts.iter().filter(|a| !a.trim().is_empty()) {
        let (k, v) = config::parse_fact_arg(arg.trim())?;
        facts.set(k, v);
    }
    // Jitship refused an input before the policy ran: said as jitship's refusal.
    let by_jitship = |e: crate::author::InputError| {
        refused(&args.file, Some("jitship"), e.to_string(), args.json)
    };
    let generations = match args
        .generations
        .as_deref()
        .map(crate::author::read_generations)
    {
        None => None,
        Some(Ok(gens)) => Some(gens),
        Some(Err(e)) => return Ok(by_jitship(e)),
    };
    let now = args.now.unwrap_or_else(crate::catalog::now_secs);
    let input = crate::author::TestInput {
        facts,
        root: args.root.clone(),
        generations,
        now,
        limits: crate::policy::RetentionLimits {
            max_generations: args.max_generations,
            max_bytes: args.max_bytes.map(|b| b.as_u64()),
            max_age_secs: args.max_age.map(|d| d.as_secs()),
        },
    };
    let report = match crate::author::test(&policy, &input) {
        Ok(r) => r,
        Err(e) => return Ok(by_jitship(e)),
    };
    render::test(&report, args.json);
    Ok(if report.all_ok() {
        exit::OK
    } else {
        exit::ERROR
    })
}

/// A refusal before any policy call: printed, and the command's code (1).
fn refused(path: &std::path::Path, by: Option<&'static str>, error: String, json: bool) -> i32 {
    let refusal = Refused {
        path,
        rejected_by: by,
        error,
    };
    render::refused(&refusal, json);
    exit::ERROR
}
