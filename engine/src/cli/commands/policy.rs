//! The policy-author commands: policy build, check, test.

use std::path::PathBuf;

use anyhow::Result;

use crate::cli::args::{PolicyBuildArgs, PolicyCheckArgs, PolicyCommand, PolicyTestArgs};
use crate::cli::render::print_policy_test;
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
    if args.json {
        let report = serde_json::json!({
            "name": built.name,
            "path": out,
            "digest": built.digest,
            "core_size": built.core_size,
            "component_size": built.component.len(),
            "warnings": built.warnings,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "built {} ({}; core module {}) blake3 {}",
            out.display(),
            bytesize::ByteSize(built.component.len() as u64),
            bytesize::ByteSize(built.core_size),
            built.digest
        );
        println!("  check it: jitship policy check {}", out.display());
    }
    Ok(0)
}

pub(crate) fn run_policy_check(args: PolicyCheckArgs) -> Result<i32> {
    let engine = args.sandbox.engine()?;
    let settings = crate::cli::args::policy_settings(&args.settings)?;
    let report = match crate::author::check(&engine, &args.file, &settings) {
        Ok(r) => r,
        Err(e) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({ "path": args.file, "error": e.to_string() })
                );
            } else {
                eprintln!("{}: refused: {e}", args.file.display());
            }
            return Ok(1);
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(0);
    }
    let i = &report.info;
    println!("{}: ok", report.path.display());
    println!(
        "  policy      {} {} for cache kind {:?}",
        i.name, i.version, i.cache_kind
    );
    println!("  contract    jitship:policy@{}", report.contract);
    println!(
        "  module      {} blake3 {}",
        bytesize::ByteSize(report.size_bytes),
        report.digest
    );
    if !i.description.is_empty() {
        println!("  description {}", i.description);
    }
    println!(
        "  root        {} (moved by: {})",
        i.default_root,
        if i.root_env.is_empty() {
            "-".to_string()
        } else {
            i.root_env.join(", ")
        }
    );
    if i.settings.is_empty() {
        println!("  settings    none");
    }
    for spec in &i.settings {
        let value = &report.settings[&spec.name];
        let given = if *value == spec.default_value {
            "default".to_owned()
        } else {
            format!("default {}", spec.default_value)
        };
        println!(
            "  setting     {} = {value} ({}, {given}){}",
            spec.name,
            spec.kind.as_str(),
            if spec.description.is_empty() {
                String::new()
            } else {
                format!(": {}", spec.description)
            }
        );
    }
    println!(
        "  reads files {}",
        if report.reads_files {
            "yes (read-file, inside the root only)"
        } else {
            "no"
        }
    );
    println!("  imports");
    for import in &report.imports {
        println!("    {import}");
    }
    println!("  exports     {}", report.exports.join(", "));
    println!(
        "  load        {} µs ({})",
        report.load.total_us,
        if report.load.from_cache {
            "compiled-module cache hit"
        } else {
            "compiled"
        }
    );
    Ok(0)
}

pub(crate) fn run_policy_test(args: PolicyTestArgs) -> Result<i32> {
    let engine = args.sandbox.engine()?;
    let settings = crate::cli::args::policy_settings(&args.settings)?;
    let policy = match engine
        .load_file(&args.file)
        .and_then(|p| p.configure(&settings))
    {
        Ok(p) => p,
        Err(e) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({ "path": args.file, "error": e.to_string() })
                );
            } else {
                eprintln!("{}: refused: {e}", args.file.display());
            }
            return Ok(1);
        }
    };
    let mut facts = Facts::new();
    for arg in args.facts.iter().filter(|a| !a.trim().is_empty()) {
        let (k, v) = config::parse_fact_arg(arg.trim())?;
        facts.set(k, v);
    }
    let generations = match args
        .generations
        .as_deref()
        .map(crate::author::read_generations)
    {
        None => None,
        Some(Ok(gens)) => Some(gens),
        Some(Err(e)) => return Ok(input_refused(&args, &e)),
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
        Err(e) => return Ok(input_refused(&args, &e)),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_policy_test(&report);
    }
    Ok(if report.all_ok() { 0 } else { 1 })
}

/// Jitship refused an input of `policy test` before the policy ran: said as jitship's refusal
/// (`"rejected_by": "jitship"` in JSON), exit 1.
fn input_refused(args: &PolicyTestArgs, e: &crate::author::InputError) -> i32 {
    if args.json {
        println!(
            "{}",
            serde_json::json!({ "path": args.file, "rejected_by": "jitship", "error": e.to_string() })
        );
    } else {
        eprintln!("{e}");
    }
    1
}
