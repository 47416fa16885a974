//! The command-line forms of settings (`--cache`, `--fact`, `--setting`, `--store`,
//! `--durable-store`) parsed into the config's types, and the name rules they share with the file.
//! Which one wins over the file is decided in one place: `cli::args::resolve`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{Backend, CacheConfig, ConfigError, ScopedFacts, StoreConfig, parse_host_port};

/// A fact name: not empty, and no `:` (it separates a cache kind: `--fact KIND:NAME=VALUE`), `=`,
/// `;` (the separators of `JITSHIP_FACTS`), whitespace or control characters.
pub(super) fn check_fact_name(what: &'static str, name: &str) -> Result<(), ConfigError> {
    let bad = |c: char| matches!(c, ':' | '=' | ';') || c.is_whitespace() || c.is_control();
    if name.is_empty() || name.contains(bad) {
        return Err(ConfigError::Invalid {
            what,
            value: name.into(),
            hint: "a fact name is not empty and holds no ':', '=', ';' or whitespace, e.g. \
                   model.id or pkg.torch"
                .into(),
        });
    }
    Ok(())
}

pub(super) fn parse_kind(kind: &str) -> Result<(), ConfigError> {
    if kind.is_empty()
        || !kind
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    {
        return Err(ConfigError::Invalid {
            what: "cache kind",
            value: kind.into(),
            hint: "use lowercase letters, digits, - and _".into(),
        });
    }
    Ok(())
}

/// The refusal of a kind jitship ships no policy for: without one, the cache would silently key
/// and select by generic rules nobody chose. Names the built-in kinds and the nearest one.
pub(super) fn unknown_kind(kind: &str) -> ConfigError {
    let builtins: Vec<&str> = crate::policy::builtin::kinds().collect();
    let nearest = nearest_kind(kind, &builtins)
        .map(|k| format!("did you mean {k:?}? "))
        .unwrap_or_default();
    ConfigError::Invalid {
        what: "cache kind",
        value: kind.into(),
        hint: format!(
            "jitship has no built-in policy for it. {nearest}The built-in kinds are: {}. \
             For a cache of your own, give a policy module (`policy = \"x.wasm\"` in its [[cache]], \
             or --cache {kind}:x.wasm=ROOT), or choose jitship's generic native rules explicitly \
             (`policy = \"native\"`, or --cache {kind}:native=ROOT)",
            builtins.join(", ")
        ),
    }
}

/// The built-in kind closest to `kind`: one that contains it or is contained in it (`vllm` ->
/// `vllm-compile`), else the smallest edit distance within a third of the name's length.
fn nearest_kind<'a>(kind: &str, builtins: &[&'a str]) -> Option<&'a str> {
    let distance = |b: &str| strsim::damerau_levenshtein(kind, b);
    let related = |b: &str| b.contains(kind) || kind.contains(b);
    builtins
        .iter()
        .copied()
        .filter(|b| related(b) || distance(b) <= (kind.len() / 3).max(2))
        .min_by_key(|&b| (!related(b), distance(b)))
}

/// `KIND[:POLICY][=ROOT]`, as given to `--cache`: POLICY is `native` or a policy module file (as
/// `policy` in a `[[cache]]`); without `=ROOT` the root is resolved from the environment the way
/// the engine resolves it (`crate::roots`).
pub fn parse_cache_arg(s: &str) -> Result<CacheConfig, ConfigError> {
    let invalid = |hint: &str| ConfigError::Invalid {
        what: "--cache",
        value: s.into(),
        hint: hint.into(),
    };
    let (spec, root) = match s.split_once('=') {
        Some((_, "")) => {
            return Err(invalid(
                "the root is empty; give KIND=ROOT, or just KIND to use the root the engine would use",
            ));
        }
        Some((spec, root)) => (spec, PathBuf::from(root)),
        None => (s, PathBuf::new()),
    };
    let (kind, policy) = match spec.split_once(':') {
        Some((_, "")) => {
            return Err(invalid(
                "the policy after ':' is empty; expected KIND:native or KIND:FILE.wasm",
            ));
        }
        Some((kind, policy)) => (kind, Some(PathBuf::from(policy))),
        None => (spec, None),
    };
    parse_kind(kind).map_err(|_| {
        invalid("expected KIND[:POLICY][=ROOT], e.g. triton=/root/.triton/cache, inductor, or mykind:native=/data/cache (KIND: lowercase letters, digits, - and _)")
    })?;
    Ok(CacheConfig {
        kind: kind.into(),
        root,
        policy,
        facts: BTreeMap::new(),
        settings: BTreeMap::new(),
    })
}

/// `NAME=VALUE`, a fact for every cache (`jitship policy test --fact`): the value is everything
/// after the first `=`.
pub fn parse_fact_arg(s: &str) -> Result<(String, String), ConfigError> {
    match parse_scoped_fact_arg(s)? {
        (None, name, value) => Ok((name, value)),
        (Some(_), ..) => Err(ConfigError::Invalid {
            what: "--fact",
            value: s.into(),
            hint: "expected NAME=VALUE (a fact name holds no ':'), e.g. model.id=Qwen/Qwen3-8B"
                .into(),
        }),
    }
}

/// `[KIND:]NAME=VALUE`, as given to `--fact` of the commands that key caches: with `KIND:` the
/// fact is for the cache of that kind only. The value is everything after the first `=`; the
/// name holds no `:` (so `KIND:` is never part of it). Whether KIND is a cache of the command is
/// checked by [`Config::validate`].
pub fn parse_scoped_fact_arg(s: &str) -> Result<(Option<String>, String, String), ConfigError> {
    let invalid = |hint: &str| ConfigError::Invalid {
        what: "--fact",
        value: s.into(),
        hint: hint.into(),
    };
    let Some((lhs, value)) = s.split_once('=') else {
        return Err(invalid(
            "expected NAME=VALUE or KIND:NAME=VALUE, e.g. model.id=Qwen/Qwen3-8B or \
             vllm-compile:model.id=Qwen/Qwen3-8B",
        ));
    };
    let (kind, name) = match lhs.split_once(':') {
        Some((kind, name)) => {
            parse_kind(kind).map_err(|_| {
                invalid(
                    "expected KIND:NAME=VALUE with KIND a cache kind (lowercase letters, digits, \
                     - and _), e.g. vllm-compile:model.id=Qwen/Qwen3-8B",
                )
            })?;
            (Some(kind), name)
        }
        None => (None, lhs),
    };
    if name.is_empty() {
        return Err(invalid(
            "the fact name is empty; expected NAME=VALUE or KIND:NAME=VALUE, e.g. model.id=Qwen/Qwen3-8B",
        ));
    }
    check_fact_name("--fact", name).map_err(|_| {
        invalid("a fact name holds no ':', '=', ';' or whitespace (NAME=VALUE or KIND:NAME=VALUE)")
    })?;
    Ok((kind.map(str::to_owned), name.into(), value.into()))
}

/// Parses `[KIND:]NAME=VALUE;[KIND:]NAME=VALUE` (the form of `JITSHIP_FACTS`); empty items are
/// ignored, a later item wins.
pub fn parse_fact_list(s: &str) -> Result<ScopedFacts, ConfigError> {
    let mut facts = ScopedFacts::default();
    for item in s.split(';').map(str::trim).filter(|item| !item.is_empty()) {
        let (kind, name, value) = parse_scoped_fact_arg(item)?;
        facts.insert(kind.as_deref(), name, value);
    }
    Ok(facts)
}

/// `NAME=VALUE` (the form of `policy check --setting`): the value is everything after the first
/// `=`, whose kind the policy's declaration decides.
pub fn parse_setting_arg(s: &str) -> Result<(String, String), ConfigError> {
    match s.split_once('=') {
        Some((name, value)) if crate::policy::settings::valid_name(name.trim()) => {
            Ok((name.trim().to_owned(), value.to_owned()))
        }
        _ => Err(ConfigError::Invalid {
            what: "--setting",
            value: s.into(),
            hint:
                "expected NAME=VALUE with NAME a setting the policy declares (a-z, 0-9, _ and -), \
                   e.g. keep=2 or max_age=1h"
                    .into(),
        }),
    }
}

/// `local:DIR`, `oci:HOST[:PORT]/REPOSITORY` or `oci+http:HOST[:PORT]/REPOSITORY` (plain HTTP),
/// as given to `--durable-store`: the durable tier. It replaces one the config file names.
pub fn apply_durable_store_arg(store: &mut StoreConfig, s: &str) -> Result<(), ConfigError> {
    let durable = &mut store.durable;
    match s.split_once(':') {
        Some(("local", dir)) if !dir.is_empty() => {
            durable.path = Some(PathBuf::from(dir));
            durable.registry = None;
            Ok(())
        }
        Some((scheme @ ("oci" | "oci+http"), reference)) if reference.contains('/') => {
            durable.registry = Some(reference.to_owned());
            durable.plain_http = scheme == "oci+http";
            durable.path = None;
            Ok(())
        }
        _ => Err(ConfigError::Invalid {
            what: "--durable-store",
            value: s.into(),
            hint: "expected local:DIR (a local or shared directory), oci:HOST[:PORT]/REPOSITORY \
                   (an OCI registry) or oci+http:HOST[:PORT]/REPOSITORY (one over plain HTTP)"
                .into(),
        }),
    }
}

/// `local:DIR`, `mooncake` (the `[store.mooncake]` settings) or `mooncake:HOST:PORT` (those
/// settings with another master), as given to `--store`.
pub fn apply_store_arg(store: &mut StoreConfig, s: &str) -> Result<(), ConfigError> {
    let hint = "expected local:DIR, mooncake or mooncake:HOST:PORT (the master)";
    match s.split_once(':') {
        Some(("local", dir)) if !dir.is_empty() => {
            store.backend = Backend::Local;
            store.local.path = PathBuf::from(dir);
            Ok(())
        }
        None if s == "mooncake" => {
            store.backend = Backend::Mooncake;
            Ok(())
        }
        Some(("mooncake", master)) if parse_host_port(master).is_some() => {
            store.backend = Backend::Mooncake;
            store.mooncake.master = master.into();
            Ok(())
        }
        _ => Err(ConfigError::Invalid {
            what: "--store",
            value: s.into(),
            hint: hint.into(),
        }),
    }
}
