//! `--engine vllm|sglang`: the caches an inference engine reads, named once. Which roots vLLM reads
//! depends on its compile mode and its platform (docs/vllm.md, "Where vLLM's compiled code
//! lives"), decided from the same environment vLLM reads and from the facts:
//!
//! | AOT compile | machine | caches |
//! |---|---|---|
//! | on | CPU | `vllm-compile`, `inductor-pch` (torch keeps the C++ kernels' header in its default directory) |
//! | off | CPU | `inductor` (vLLM's CPU backend is plain Inductor), and `inductor-pch` when `TORCHINDUCTOR_CACHE_DIR` moves the Inductor cache away from the header |
//! | on or off | GPU | `vllm-compile` (everything vLLM compiles lives under its `torch_compile_cache`) |
//!
//! and in every mode `vllm-modelinfos`, vLLM's model-inspection cache (`$VLLM_CACHE_ROOT/modelinfos`,
//! 8-25 s rebuilt on a fresh pod; docs/vllm.md).
//!
//! AOT compile is on when `VLLM_USE_AOT_COMPILE` is `1`, off when it is anything else; unset,
//! vLLM turns it on with torch >= 2.10 unless `VLLM_DISABLE_COMPILE_CACHE` is set to a non-zero
//! number. The roots themselves resolve from each kind's policy like any `--cache KIND`
//! (`crate::roots`), so `VLLM_CACHE_ROOT`, `XDG_CACHE_HOME`, `TMPDIR` and `TORCHINDUCTOR_CACHE_DIR`
//! move them as they move vLLM's.
//!
//! SGLang (docs/sglang.md) moves the caches of the libraries it uses under its own
//! `SGLANG_CACHE_DIR`, in its own process only: [`engine_env`] makes the same moves in the
//! environment jitship resolves roots from, so a sidecar or `jitship run` beside an SGLang
//! server finds them where the server writes them. On a CPU machine SGLang compiles with plain
//! Inductor (`inductor`, `inductor-pch`); on a GPU machine every cache it moves or keeps, not the
//! header. Its caches are keyed with `pkg.sglang` besides their policies' own facts
//! ([`EngineKeyed`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::config::{Config, Engine};
use crate::facts::Facts;
use crate::generation::{PolicyRef, RelPath};
use crate::policy::{
    CachePolicy, FileEntry, GenerationSummary, PolicyError, PolicyInfo, RetentionDrop,
    RetentionLimits, Selection,
};
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
            Engine::Sglang => sglang(env, facts, pch_inside_inductor),
        }
    }
}

fn sglang(env: &ProcessEnv, facts: &Facts, pch_inside_inductor: bool) -> EngineCaches {
    let gpu = has_gpu(facts);
    let kinds: Vec<&'static str> = match (gpu, pch_inside_inductor) {
        (true, _) => Engine::Sglang
            .candidate_kinds()
            .iter()
            .copied()
            .filter(|k| *k != "inductor-pch")
            .collect(),
        (false, true) => vec!["inductor"],
        (false, false) => vec!["inductor", "inductor-pch"],
    };
    let base = match env.var(SGLANG_CACHE_DIR) {
        Some(v) => format!("{SGLANG_CACHE_DIR}={v}"),
        None => format!("{SGLANG_CACHE_DIR} unset: {SGLANG_DEFAULT_CACHE_DIR}"),
    };
    EngineCaches {
        why: format!(
            "SGLang: caches under {base} on {}: {}",
            if gpu {
                "a GPU machine"
            } else {
                "a CPU machine"
            },
            kinds.join(", ")
        ),
        kinds,
    }
}

const SGLANG_CACHE_DIR: &str = "SGLANG_CACHE_DIR";
const SGLANG_DEFAULT_CACHE_DIR: &str = "~/.cache/sglang";

/// The environment the engine's own process resolves its caches in, once it has started:
/// `env` itself, except for SGLang, which (0.5.23, docs/sglang.md) on `import sglang` sets each
/// of these unless it is set already, under `base` = `SGLANG_CACHE_DIR` (`~` expanded; default
/// `~/.cache/sglang`): `TORCHINDUCTOR_CACHE_DIR=base/inductor`, `TRITON_CACHE_DIR=base/triton`,
/// `CUDA_CACHE_PATH=base/nv`, `TILELANG_CACHE_DIR=base/tilelang`,
/// `FLASHINFER_WORKSPACE_BASE=base`; and when DeepGEMM loads, `DG_JIT_CACHE_DIR` =
/// `SGLANG_DG_CACHE_DIR` (default `base/deep_gemm`) whatever it was. Its JIT cache is
/// `SGLANG_JIT_CACHE_DIR`, else `~/.cache/sglang/jit` (not under `base`).
pub fn engine_env(engine: Option<Engine>, mut env: ProcessEnv) -> ProcessEnv {
    if engine != Some(Engine::Sglang) {
        return env;
    }
    // An empty SGLANG_CACHE_DIR is used as given by SGLang (relative paths): left to the roots'
    // own refusal of a relative root.
    let configured = env
        .has(SGLANG_CACHE_DIR)
        .then(|| env.var(SGLANG_CACHE_DIR).unwrap_or("").to_owned());
    let Some(base) = env.expand_user(configured.as_deref().unwrap_or(SGLANG_DEFAULT_CACHE_DIR))
    else {
        // No home directory: nothing moves; the roots say what they cannot resolve.
        return env;
    };
    let base = base.trim_end_matches('/').to_owned();
    let under = |sub: &str| match base.as_str() {
        "" => sub.to_owned(),
        b => format!("{b}/{sub}"),
    };
    for (name, value) in [
        ("TRITON_CACHE_DIR", under("triton")),
        ("TORCHINDUCTOR_CACHE_DIR", under("inductor")),
        ("CUDA_CACHE_PATH", under("nv")),
        ("TILELANG_CACHE_DIR", under("tilelang")),
        ("FLASHINFER_WORKSPACE_BASE", base.clone()),
    ] {
        env.set_default(name, value);
    }
    let deep_gemm = match env.var("SGLANG_DG_CACHE_DIR") {
        Some(v) => v.to_owned(),
        None => under("deep_gemm"),
    };
    env.set("DG_JIT_CACHE_DIR", deep_gemm);
    if env.var("SGLANG_JIT_CACHE_DIR").is_none()
        && let Some(jit) = env.expand_user("~/.cache/sglang/jit")
    {
        env.set("SGLANG_JIT_CACHE_DIR", jit);
    }
    if configured.is_none() {
        env.set(SGLANG_CACHE_DIR, base);
    }
    env
}

/// A cache's policy, its compat key extended with the engine's own facts (`pkg.sglang` for
/// SGLang, docs/sglang.md), unless the policy's key holds them already: generations an SGLang
/// worker published are installed by SGLang workers of that version only, and a worker whose
/// `pkg.sglang` cannot be gathered gets a missing fact, not another engine's generation.
/// Everything else is the policy's.
///
/// It also turns a policy's refusal for a fact that could not be gathered for want of a Python
/// interpreter into [`PolicyError::Ungathered`], whose words name where the interpreter is looked
/// for (`--python`, `JITSHIP_PYTHON`, `VIRTUAL_ENV`, PATH) instead of advising a `--fact` that
/// would have to be given for every `python.*` and `pkg.*` fact.
pub struct EngineKeyed {
    inner: Arc<dyn CachePolicy>,
    facts: &'static [&'static str],
    /// Facts the engine's kernels do not depend on, given the policy as this value instead.
    dropped: &'static [(&'static str, &'static str)],
    /// Facts missing for want of an interpreter, and why (`Gathered::no_interpreter`).
    ungathered: BTreeMap<String, String>,
}

impl EngineKeyed {
    /// `inner` keyed as this one is.
    fn around(&self, inner: Arc<dyn CachePolicy>) -> Self {
        Self {
            inner,
            facts: self.facts,
            dropped: self.dropped,
            ungathered: self.ungathered.clone(),
        }
    }
}

/// The facts an engine adds to the key of every cache it reads.
fn key_facts(engine: Engine) -> &'static [&'static str] {
    match engine {
        // vLLM's own compile cache keys on pkg.vllm; the Inductor cache it falls back to is
        // torch's, keyed as torch keys it (docs/vllm.md).
        Engine::Vllm => &[],
        Engine::Sglang => &[jitship_policy_contract::facts::PKG_SGLANG],
    }
}

/// Facts an engine's kernels do not depend on, on a CPU machine: the policy is given each as the
/// value here instead of the gathered one, so workers that differ only in it share a key.
///
/// vLLM on CPU (0.32, `vllm/platforms/cpu.py`, `check_and_update_config`) compiles with Inductor's
/// `cpp.dynamic_threads` on: its C++ kernels read the thread count at run time (`max_threads`,
/// `torch/_inductor/codegen/cpp.py`), and torch leaves the thread count out of its own FX-graph
/// key when it is on (`cpp_runtime_thread_count`, `torch/_inductor/codecache.py`). A worker with
/// `OMP_NUM_THREADS=1` started from a copy of a 2-thread producer's cache with 0 new `.so`
/// (docs/vllm.md, "Keys"). Bare torch.compile bakes the count into its kernels and keeps it.
fn dropped_facts(engine: Engine) -> &'static [(&'static str, &'static str)] {
    match engine {
        Engine::Vllm => &[(jitship_policy_contract::facts::CPU_THREADS, "dynamic")],
        Engine::Sglang => &[],
    }
}

/// `policy` for a cache of kind `kind`: wrapped in [`EngineKeyed`] when `engine` reads that kind
/// and adds facts to its keys or drops some.
pub fn keyed(
    engine: Option<Engine>,
    kind: &str,
    policy: Arc<dyn CachePolicy>,
) -> Arc<dyn CachePolicy> {
    keyed_explained(engine, kind, policy, &BTreeMap::new())
}

/// [`keyed`], and a refusal for a fact of `ungathered` (missing for want of an interpreter, and
/// why: `Gathered::ungathered`) says so.
pub fn keyed_explained(
    engine: Option<Engine>,
    kind: &str,
    policy: Arc<dyn CachePolicy>,
    ungathered: &BTreeMap<String, String>,
) -> Arc<dyn CachePolicy> {
    let (facts, dropped) = match engine {
        Some(e) if e.candidate_kinds().contains(&kind) => (key_facts(e), dropped_facts(e)),
        _ => (&[][..], &[][..]),
    };
    let ungathered = ungathered.clone();
    if facts.is_empty() && dropped.is_empty() && ungathered.is_empty() {
        return policy;
    }
    Arc::new(EngineKeyed {
        inner: policy,
        facts,
        dropped,
        ungathered,
    })
}

impl CachePolicy for EngineKeyed {
    fn info(&self) -> &PolicyInfo {
        self.inner.info()
    }
    fn policy_ref(&self) -> PolicyRef {
        self.inner.policy_ref()
    }
    fn module(&self) -> Option<Arc<[u8]>> {
        self.inner.module()
    }
    /// The inner policy with the recorded settings, keyed as this one is (publish compares keys).
    fn with_recorded_settings(
        &self,
        recorded: &PolicyRef,
    ) -> Option<Result<Box<dyn CachePolicy>, PolicyError>> {
        let configured = self.inner.with_recorded_settings(recorded)?;
        Some(
            configured.map(|inner| Box::new(self.around(Arc::from(inner))) as Box<dyn CachePolicy>),
        )
    }
    fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
        let explain = |e: PolicyError| match e {
            PolicyError::MissingFact(fact) if self.ungathered.contains_key(&fact) => {
                PolicyError::Ungathered {
                    why: self.ungathered[&fact].clone(),
                    fact,
                }
            }
            e => e,
        };
        let mut given;
        let facts = if self.dropped.is_empty() || has_gpu(facts) {
            facts
        } else {
            given = facts.clone();
            for (name, value) in self.dropped {
                given.set(*name, *value);
            }
            &given
        };
        let mut key = self.inner.compat_key(facts).map_err(explain)?;
        for name in self.facts {
            if key.split(';').any(|f| f.starts_with(&format!("{name}="))) {
                continue;
            }
            let value = facts
                .get(name)
                .ok_or_else(|| explain(PolicyError::MissingFact((*name).to_owned())))?;
            key.push(';');
            key.push_str(name);
            key.push('=');
            key.push_str(&jitship_policy_contract::encode_key_part(value));
        }
        Ok(key)
    }
    fn select(&self, root: &Path, entries: &[FileEntry]) -> Result<Selection, PolicyError> {
        self.inner.select(root, entries)
    }
    fn canonicalize(
        &self,
        root: &Path,
        path: &RelPath,
        content: &[u8],
    ) -> Result<Vec<u8>, PolicyError> {
        self.inner.canonicalize(root, path, content)
    }
    fn materialize(
        &self,
        root: &Path,
        path: &RelPath,
        content: &[u8],
    ) -> Result<Vec<u8>, PolicyError> {
        self.inner.materialize(root, path, content)
    }
    fn retain(
        &self,
        generations: &[GenerationSummary],
        now: u64,
        limits: &RetentionLimits,
    ) -> Result<Vec<RetentionDrop>, PolicyError> {
        self.inner.retain(generations, now, limits)
    }
}

fn vllm(env: &ProcessEnv, facts: &Facts, pch_inside_inductor: bool) -> EngineCaches {
    let (aot, aot_why) = vllm_aot(env, facts);
    let gpu = has_gpu(facts);
    let mut kinds = match (aot, gpu) {
        (_, true) => vec!["vllm-compile"],
        (true, false) => vec!["vllm-compile", "inductor-pch"],
        (false, false) if pch_inside_inductor => vec!["inductor"],
        (false, false) => vec!["inductor", "inductor-pch"],
    };
    // What a warm start reads besides compiled code, in every mode (docs/vllm.md).
    kinds.push(MODELINFOS);
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

/// vLLM's model-inspection cache.
const MODELINFOS: &str = "vllm-modelinfos";

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
        Engine::Sglang => 30000,
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
mod tests;
