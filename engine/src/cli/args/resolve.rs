//! Flag, environment and config-file precedence, in one place: every command turns its arguments
//! into a [`CommandLine`] and [`CommandLine::resolve`] builds its `Config`.
//!
//! The order, highest first, as `jitship --help` and docs/guide/configuration.md say: a flag, then
//! its `JITSHIP_*` variable (clap has already put each flag over its variable), then the config
//! file (`--config`), then the defaults. A cache given on the command line without a root
//! (`--cache triton`, `JITSHIP_CACHES=triton`) takes the root the engine would use from this
//! process's environment (`crate::roots`), never the root of the config's `[[cache]]` of that
//! kind: the flag wins over the file as a whole.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;

use super::{AuditArgs, FactArgs, FactsArgs, GcArgs, SettingsArgs, StoreArgs};
use crate::config::{self, Config, ConfigError, Engine, ScopedFacts, SettingValue};

/// What one command's command line (flags, and their variables) gives on top of the config file.
#[derive(Default)]
pub(crate) struct CommandLine<'a> {
    config_file: Option<&'a Path>,
    store: Option<&'a StoreArgs>,
    caches: &'a [String],
    engine: Option<Engine>,
    facts: Option<&'a FactArgs>,
    settings: &'a [String],
    signing_key: Option<&'a Path>,
}

impl CommandLine<'_> {
    /// The effective, validated configuration.
    pub(crate) fn resolve(&self) -> Result<Config> {
        let mut config = match self.config_file {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        if let Some(args) = self.store {
            apply_store_args(&mut config, args)?;
        }
        apply_cache_args(&mut config, self.caches)?;
        if self.engine.is_some() {
            config.engine = self.engine;
        }
        config.add_engine_candidates();
        if let Some(facts) = self.facts {
            if let Some(python) = &facts.python {
                config.gather.python = Some(python.clone());
            }
            config.flag_facts = fact_overrides(&facts.facts, facts.fact_list.as_deref())?;
        }
        for setting in self.settings {
            apply_setting_arg(&mut config, setting)?;
        }
        if let Some(path) = self.signing_key {
            config.trust.signing_key_file = Some(path.to_owned());
        }
        config.validate()?;
        for warning in config::unknown_fact_warnings(&config) {
            tracing::warn!("{warning}");
        }
        Ok(config)
    }
}

/// The store, namespace, durable tier and trust flags over the file's.
fn apply_store_args(config: &mut Config, args: &StoreArgs) -> Result<()> {
    if let Some(store) = &args.store {
        config::apply_store_arg(&mut config.store, store)?;
    }
    if let Some(ns) = &args.namespace {
        config.store.namespace = ns.clone();
    }
    if let Some(durable) = &args.durable_store {
        config::apply_durable_store_arg(&mut config.store, durable)?;
    }
    config.trust.trusted_keys.extend(
        args.trust
            .trusted_keys
            .iter()
            .filter(|k| !k.trim().is_empty())
            .map(|k| k.trim().to_owned()),
    );
    if let Some(mode) = args.trust.trust_mode {
        config.trust.mode = Some(mode);
    }
    Ok(())
}

/// `--cache` arguments over the config's `[[cache]]` entries: a kind already there takes the
/// flag's root (without `=ROOT`: the root the engine would use, resolved later from the
/// environment, not the file's) and the flag's policy if it names one; its facts and settings
/// stay. A new kind is added.
fn apply_cache_args(config: &mut Config, args: &[String]) -> Result<(), ConfigError> {
    for arg in args {
        let cache = config::parse_cache_arg(arg)?;
        match config.caches.iter_mut().find(|c| c.kind == cache.kind) {
            Some(existing) => {
                existing.root = cache.root;
                if cache.policy.is_some() {
                    existing.policy = cache.policy;
                }
            }
            None => config.caches.push(cache),
        }
    }
    Ok(())
}

/// `KIND:NAME=VALUE` (the form of `--setting` on the commands that key caches): sets the
/// setting of the cache of kind KIND, which the command must have; wins over `[[cache]] settings`.
fn apply_setting_arg(config: &mut Config, s: &str) -> Result<(), ConfigError> {
    let invalid = |hint: String| ConfigError::Invalid {
        what: "--setting",
        value: s.into(),
        hint,
    };
    let Some((kind, rest)) = s.split_once(':') else {
        return Err(invalid(
            "expected KIND:NAME=VALUE, e.g. my-cache:keep=2 (settings belong to one cache's policy)"
                .into(),
        ));
    };
    let (name, value) = config::parse_setting_arg(rest).map_err(|_| {
        invalid(
            "expected KIND:NAME=VALUE with NAME of a-z, 0-9, _ and -, e.g. my-cache:keep=2".into(),
        )
    })?;
    let kinds: Vec<&str> = config.caches.iter().map(|c| c.kind.as_str()).collect();
    let known = kinds.join(", ");
    let Some(cache) = config.caches.iter_mut().find(|c| c.kind == kind) else {
        return Err(invalid(format!(
            "this command has no cache of kind {kind:?} (it has: {known}); add it with --cache or [[cache]]"
        )));
    };
    cache.settings.insert(name, SettingValue::Text(value));
    Ok(())
}

/// The facts given on the command line: every `--fact [KIND:]NAME=VALUE` kept whole (only the
/// first `=` separates; a value may hold `;` and `=`, so one flag is always exactly one fact),
/// or, when no `--fact` is given, `JITSHIP_FACTS` parsed as a `[KIND:]NAME=VALUE;...` list
/// (`config::parse_fact_list`: a value there cannot hold `;`; give such a fact with `--fact` or
/// in the config). With `KIND:` a fact is for the cache of that kind only
/// (`config::parse_scoped_fact_arg`; `Config::validate` refuses a kind the command has no cache
/// of). The flags win over the variable as a whole, as clap's flags win over their variables;
/// among flags, a later one of the same name and scope wins.
fn fact_overrides(flags: &[String], env_list: Option<&str>) -> Result<ScopedFacts> {
    if flags.is_empty() {
        return Ok(config::parse_fact_list(env_list.unwrap_or(""))?);
    }
    let mut facts = ScopedFacts::default();
    for arg in flags {
        let (kind, name, value) = config::parse_scoped_fact_arg(arg)?;
        facts.insert(kind.as_deref(), name, value);
    }
    Ok(facts)
}

/// `--setting NAME=VALUE` flags of `policy check` and `policy test`, by name (a later one wins).
pub(crate) fn policy_settings(flags: &[String]) -> Result<BTreeMap<String, String>> {
    flags
        .iter()
        .map(|f| Ok(config::parse_setting_arg(f)?))
        .collect()
}

impl StoreArgs {
    fn command_line(&self) -> CommandLine<'_> {
        CommandLine {
            config_file: self.config.config.as_deref(),
            store: Some(self),
            ..CommandLine::default()
        }
    }

    /// The effective configuration for a store command.
    pub fn resolve(&self) -> Result<Config> {
        self.command_line().resolve()
    }
}

impl SettingsArgs {
    /// The effective configuration of a command that keys caches.
    pub fn resolve(&self) -> Result<Config> {
        CommandLine {
            caches: &self.caches.caches,
            engine: self.engine,
            facts: Some(&self.facts),
            settings: &self.settings,
            signing_key: self.signing_key.as_deref(),
            ..self.store.command_line()
        }
        .resolve()
    }
}

impl FactsArgs {
    /// The configuration `facts` shows the facts and roots of (no store).
    pub fn resolve(&self) -> Result<Config> {
        CommandLine {
            config_file: self.config.config.as_deref(),
            caches: &self.caches.caches,
            engine: self.engine,
            facts: Some(&self.facts),
            ..CommandLine::default()
        }
        .resolve()
    }
}

impl AuditArgs {
    /// The config file with the --cache and --engine flags on top (no store, no facts).
    pub fn resolve(&self) -> Result<Config> {
        CommandLine {
            config_file: self.config.config.as_deref(),
            caches: &self.caches.caches,
            engine: self.engine,
            ..CommandLine::default()
        }
        .resolve()
    }
}

impl GcArgs {
    /// The store command's configuration with the caches whose policy modules gc may use.
    pub fn resolve(&self) -> Result<Config> {
        CommandLine {
            caches: &self.caches.caches,
            ..self.common.store.command_line()
        }
        .resolve()
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::cli::{Cli, Command};

    fn watch_config(args: &[&str]) -> crate::config::Config {
        let cli = Cli::try_parse_from([&["jitship", "watch"], args].concat()).unwrap();
        let Command::Watch(watch) = cli.command else {
            unreachable!()
        };
        watch.settings.resolve().unwrap()
    }

    /// `--cache KIND` without a root leaves the root to the engine's environment, as
    /// `watch --help` says: the config's `[[cache]] root` of that kind loses to the flag.
    #[test]
    fn a_cache_flag_without_a_root_wins_over_the_config_files_root() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("jitship.toml");
        let text = "[[cache]]\nkind = \"triton\"\nroot = \"/from/config\"\n\
                    facts = { \"model.id\" = \"m\" }\n";
        std::fs::write(&file, text).unwrap();
        let file = file.to_str().unwrap();

        let from_file = watch_config(&["--config", file]);
        assert_eq!(
            from_file.caches[0].root,
            std::path::Path::new("/from/config")
        );

        let flag = watch_config(&["--config", file, "--cache", "triton"]);
        assert!(flag.caches[0].root_is_default(), "{:?}", flag.caches[0]);
        assert_eq!(
            flag.caches[0].facts["model.id"], "m",
            "the file's facts stay"
        );

        let with_root = watch_config(&["--config", file, "--cache", "triton=/from/flag"]);
        assert_eq!(with_root.caches[0].root, std::path::Path::new("/from/flag"));
    }
}
