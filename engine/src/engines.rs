//! `--engine vllm`: the caches an inference engine reads, named once. Which roots vLLM reads
//! depends on its compile mode and its platform (docs/vllm.md, "Where vLLM's compiled code
//! lives"), decided from the same environment vLLM reads and from the facts:
//!
//! | AOT compile | machine | caches |
//! |---|---|---|
//! | on | CPU | `vllm-compile`, `inductor-pch` (torch keeps the C++ kernels' header in its default directory) |
//! | off | CPU | `inductor` (vLLM's CPU backend is plain Inductor), and `inductor-pch` when `TORCHINDUCTOR_CACHE_DIR` moves the Inductor cache away from the header |
//! | on or off | GPU | `vllm-compile` (everything vLLM compiles lives under its `torch_compile_cache`) |
//!
//! AOT compile is on when `VLLM_USE_AOT_COMPILE` is `1`, off when it is anything else; unset,
//! vLLM turns it on with torch >= 2.10 unless `VLLM_DISABLE_COMPILE_CACHE` is set to a non-zero
//! number. The roots themselves resolve from each kind's policy like any `--cache KIND`
//! (`crate::roots`), so `VLLM_CACHE_ROOT`, `XDG_CACHE_HOME`, `TMPDIR` and `TORCHINDUCTOR_CACHE_DIR`
//! move them as they move vLLM's.

use crate::config::{Config, Engine};
use crate::facts::Facts;
use crate::roots::{ProcessEnv, RootOrigin};

/// What an engine reads in this environment on this machine, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineCaches {
    pub kinds: Vec<&'static str>,
    /// One line for a person: the mode and platform decided, and from what.
    pub why: String,
}

impl EngineCaches {
    /// The kinds `engine` reads given `env` and `facts`; `pch_inside_inductor` says whether the
    /// `inductor-pch` root lies inside the `inductor` root (then `inductor` already holds it).
    pub fn choose(
        engine: Engine,
        env: &ProcessEnv,
        facts: &Facts,
        pch_inside_inductor: bool,
    ) -> Self {
        match engine {
            Engine::Vllm => vllm(env, facts, pch_inside_inductor),
        }
    }
}

fn vllm(env: &ProcessEnv, facts: &Facts, pch_inside_inductor: bool) -> EngineCaches {
    let (aot, aot_why) = vllm_aot(env, facts);
    let gpu = has_gpu(facts);
    let kinds = match (aot, gpu) {
        (_, true) => vec!["vllm-compile"],
        (true, false) => vec!["vllm-compile", "inductor-pch"],
        (false, false) if pch_inside_inductor => vec!["inductor"],
        (false, false) => vec!["inductor", "inductor-pch"],
    };
    let machine = if gpu {
        "a GPU machine"
    } else {
        "a CPU machine"
    };
    EngineCaches {
        why: format!(
            "vLLM: AOT compile {} ({aot_why}) on {machine}: {}",
            if aot { "on" } else { "off" },
            kinds.join(", ")
        ),
        kinds,
    }
}

/// Drops the engine's candidate caches (`Config::engine_candidates`) it does not read, from
/// `config.caches` and from `origins` (their roots' origins, same order; empty when the roots
/// could not be resolved), and says what it kept and why. Caches the operator configured stay.
pub fn keep_read_caches(
    config: &mut Config,
    origins: &mut Vec<RootOrigin>,
    env: &ProcessEnv,
    facts: &Facts,
) -> Option<EngineCaches> {
    let engine = config.engine?;
    let root_of = |kind: &str| {
        config
            .caches
            .iter()
            .find(|c| c.kind == kind)
            .map(|c| c.root.clone())
    };
    let pch_inside_inductor = match (root_of("inductor-pch"), root_of("inductor")) {
        (Some(pch), Some(inductor)) => {
            !inductor.as_os_str().is_empty() && pch.starts_with(inductor)
        }
        _ => false,
    };
    let chosen = EngineCaches::choose(engine, env, facts, pch_inside_inductor);
    let keep: Vec<bool> = config
        .caches
        .iter()
        .map(|c| {
            !config.engine_candidates.contains(&c.kind) || chosen.kinds.contains(&c.kind.as_str())
        })
        .collect();
    let mut it = keep.iter();
    config.caches.retain(|_| *it.next().unwrap_or(&true));
    if origins.len() == keep.len() {
        let mut it = keep.iter();
        origins.retain(|_| *it.next().unwrap_or(&true));
    }
    Some(chosen)
}

/// The readiness URL `jitship run` waits for when none is given: the engine's own health
/// endpoint on 127.0.0.1, at the port the server's arguments name (`--port N` or `--port=N`),
/// else the engine's default port (docs/guide/run.md, "When the caches are published").
pub fn default_ready_url(engine: Engine, server_args: &[std::ffi::OsString]) -> String {
    let default_port = match engine {
        Engine::Vllm => 8000,
    };
    let port = port_in(server_args).unwrap_or(default_port);
    format!("http://127.0.0.1:{port}/health")
}

/// The last `--port N` / `--port=N` among `args` (the last one wins, as with argparse).
fn port_in(args: &[std::ffi::OsString]) -> Option<u16> {
    let mut port = None;
    let mut args = args.iter().map(|a| a.to_string_lossy());
    while let Some(a) = args.next() {
        if a == "--port" {
            port = args.next().and_then(|v| v.parse().ok()).or(port);
        } else if let Some(v) = a.strip_prefix("--port=") {
            port = v.parse().ok().or(port);
        }
    }
    port
}

/// The rule the built-in Inductor and vLLM keys use (`jitship_policy_common::inductor::has_gpu`):
/// a GPU name is known, or a GPU count that is not 0.
fn has_gpu(facts: &Facts) -> bool {
    facts.get("gpu.name").is_some()
        || facts
            .get("gpu.count")
            .is_some_and(|c| c.trim().parse::<u32>().map_or(true, |n| n > 0))
}

/// vLLM's `envs.use_aot_compile()`.
fn vllm_aot(env: &ProcessEnv, facts: &Facts) -> (bool, String) {
    if let Some(v) = env.var("VLLM_USE_AOT_COMPILE") {
        return (v == "1", format!("VLLM_USE_AOT_COMPILE={v}"));
    }
    if let Some(v) = env.var("VLLM_DISABLE_COMPILE_CACHE")
        && v.trim().parse::<i64>().is_ok_and(|n| n != 0)
    {
        return (false, format!("VLLM_DISABLE_COMPILE_CACHE={v}"));
    }
    match facts.get("pkg.torch") {
        Some(torch) => match torch_at_least_2_10(torch) {
            Some(on) => (
                on,
                format!(
                    "VLLM_USE_AOT_COMPILE unset, torch {torch} {} 2.10",
                    if on { ">=" } else { "<" }
                ),
            ),
            None => (
                true,
                format!(
                    "VLLM_USE_AOT_COMPILE unset, torch version {torch:?} unreadable: assumed on"
                ),
            ),
        },
        None => (
            true,
            "VLLM_USE_AOT_COMPILE unset, torch version unknown: assumed on".to_string(),
        ),
    }
}

fn torch_at_least_2_10(version: &str) -> Option<bool> {
    let mut parts = version.split(['.', '+']);
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()?;
    Some((major, minor) >= (2, 10))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CacheConfig, Config};

    #[test]
    fn explicit_caches_win_over_the_engines_candidates() {
        let mut config = Config {
            engine: Some(Engine::Vllm),
            caches: vec![CacheConfig {
                kind: "inductor".into(),
                root: "/given".into(),
                policy: None,
                facts: Default::default(),
                settings: Default::default(),
            }],
            ..Config::default()
        };
        config.add_engine_candidates();
        let kinds: Vec<&str> = config.caches.iter().map(|c| c.kind.as_str()).collect();
        assert_eq!(kinds, ["inductor", "vllm-compile", "inductor-pch"]);
        assert_eq!(config.engine_candidates, ["vllm-compile", "inductor-pch"]);
        assert_eq!(config.caches[0].root, std::path::Path::new("/given"));
    }

    fn env(vars: &[(&str, &str)]) -> ProcessEnv {
        ProcessEnv::new(
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())),
            None,
            0,
        )
    }

    fn facts(pairs: &[(&str, &str)]) -> Facts {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn vllm_on_a_cpu_machine_follows_its_compile_mode() {
        let cpu = facts(&[("pkg.torch", "2.13.0"), ("gpu.count", "0")]);
        let on = EngineCaches::choose(Engine::Vllm, &env(&[]), &cpu, true);
        assert_eq!(on.kinds, ["vllm-compile", "inductor-pch"]);
        assert!(on.why.contains("torch 2.13.0 >= 2.10"), "{}", on.why);
        let off = env(&[("VLLM_USE_AOT_COMPILE", "0")]);
        assert_eq!(
            EngineCaches::choose(Engine::Vllm, &off, &cpu, true).kinds,
            ["inductor"]
        );
        assert_eq!(
            EngineCaches::choose(Engine::Vllm, &off, &cpu, false).kinds,
            ["inductor", "inductor-pch"]
        );
        // vLLM's default: off before torch 2.10, and whenever the compile cache is disabled.
        let old = facts(&[("pkg.torch", "2.9.1+cpu"), ("gpu.count", "0")]);
        assert_eq!(
            EngineCaches::choose(Engine::Vllm, &env(&[]), &old, true).kinds,
            ["inductor"]
        );
        let disabled = env(&[("VLLM_DISABLE_COMPILE_CACHE", "1")]);
        assert_eq!(
            EngineCaches::choose(Engine::Vllm, &disabled, &cpu, true).kinds,
            ["inductor"]
        );
        // Only "1" turns it on, as in vLLM.
        let yes = env(&[("VLLM_USE_AOT_COMPILE", "true")]);
        assert_eq!(
            EngineCaches::choose(Engine::Vllm, &yes, &cpu, true).kinds,
            ["inductor"]
        );
    }

    #[test]
    fn the_default_ready_url_is_the_engines_health_at_the_servers_port() {
        let args = |a: &[&str]| a.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        assert_eq!(
            default_ready_url(Engine::Vllm, &args(&["vllm", "serve", "m"])),
            "http://127.0.0.1:8000/health"
        );
        assert_eq!(
            default_ready_url(
                Engine::Vllm,
                &args(&["vllm", "serve", "m", "--port", "9001"])
            ),
            "http://127.0.0.1:9001/health"
        );
        assert_eq!(
            default_ready_url(
                Engine::Vllm,
                &args(&["vllm", "serve", "--port=9001", "--port", "9002"])
            ),
            "http://127.0.0.1:9002/health"
        );
    }

    #[test]
    fn vllm_on_a_gpu_machine_reads_its_own_compile_cache() {
        let gpu = facts(&[("pkg.torch", "2.13.0"), ("gpu.name", "NVIDIA H200")]);
        for e in [env(&[]), env(&[("VLLM_USE_AOT_COMPILE", "0")])] {
            let c = EngineCaches::choose(Engine::Vllm, &e, &gpu, true);
            assert_eq!(c.kinds, ["vllm-compile"]);
            assert!(c.why.contains("GPU"), "{}", c.why);
        }
    }
}
