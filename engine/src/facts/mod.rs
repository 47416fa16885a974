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
//! | `pkg.<name>` | version of an installed distribution, e.g. `pkg.torch` = `2.8.0+cu128`; `<name>` is the distribution name lowercased with `-` and `.` turned into `_` (`pkg.flashinfer_python`, `pkg.deep_gemm`) | `*.dist-info/METADATA` or `*.egg-info/PKG-INFO` `Version:` header, without starting Python. Always asked: torch, triton, vllm, sglang, flashinfer-python, deep-gemm, tilelang, nvidia-cutlass-dsl, apache-tvm-ffi, plus `[gather] packages` |
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
//! Every fact can be overridden, in increasing precedence: the config's `[facts]` table, then
//! `JITSHIP_FACTS="k=v;k=v"` / `--fact k=v`. An overridden fact is reported with source
//! `override`; an empty value (`--fact gpu.name=`) makes the fact missing. The derived facts `gpu.arch` and `driver.major` follow the final `gpu.cc` and
//! `driver.version` (overridden or not) unless they are overridden themselves.
//!
//! GPU facts describe the node as the driver lists it (NVML index 0, all GPUs, whatever
//! `CUDA_VISIBLE_DEVICES` says); on a node with mixed GPU models, override `gpu.*` per worker.
//!
//! Gathering reads nothing from the process environment by itself: `FactsConfig` carries the
//! search path, the variables it consults (`CUDA_HOME`, `CUDA_PATH`, `CXX`, `ATEN_CPU_CAPABILITY`,
//! `OMP_NUM_THREADS`, `TORCHINDUCTOR_*`, `TORCH_COMPILE_*`), the cpuinfo file and the affinity mask's
//! CPU count, so tests and callers decide them explicitly.

mod command;
mod cpu;
mod gpu;
mod python;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

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

/// `[gather]`: the settings of fact gathering (see the `facts` module for the facts themselves).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatherConfig {
    /// The inference engine's interpreter (e.g. a venv's `bin/python3`); default `python3` on PATH.
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
    /// The `[gather]` settings, this process's PATH and CUDA variables, the config's `[facts]`
    /// (`config_facts`) and then `flag_facts` (the `--fact` flags, or `JITSHIP_FACTS` when no
    /// flag is given).
    pub fn from_process(
        settings: &GatherConfig,
        config_facts: &BTreeMap<String, String>,
        flag_facts: &BTreeMap<String, String>,
    ) -> Self {
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
            overrides: vec![
                OverrideLayer {
                    origin: "config [facts]".into(),
                    facts: config_facts.clone(),
                },
                OverrideLayer {
                    origin: format!("--fact / {FACTS_ENV}"),
                    facts: flag_facts.clone(),
                },
            ],
        }
    }
}

/// Whether gathering reads the environment variable `name` (what `from_process` passes on).
pub fn consulted_env(name: &str) -> bool {
    matches!(
        name,
        "CUDA_HOME" | "CUDA_PATH" | "CXX" | "ATEN_CPU_CAPABILITY" | "OMP_NUM_THREADS"
    ) || is_inductor_env(name)
}

/// Gathers every fact of the table above, then applies the overrides. Never fails and never
/// hangs: each external program and NVML are bounded by `settings.timeout`, and whatever cannot
/// be determined ends up in `missing` with the reason.
pub fn gather(cfg: &FactsConfig) -> Gathered {
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
            for name in ["gpu.name", "gpu.count", "gpu.cc", "driver.version"] {
                g.lack(name, "the GPU probe panicked (a bug in jitship)");
            }
        }
    }
    gather_cuda(cfg, &site_dirs, &mut g);
    gather_cpu(cfg, &mut g);
    gather_deployment(cfg, &mut g);
    g.found(
        "os.arch",
        std::env::consts::ARCH,
        Source::Target,
        "the build target of jitship",
    );
    match gethostname::gethostname().into_string() {
        Ok(name) if !name.is_empty() => {
            g.found("host.name", name, Source::Hostname, "gethostname(2)")
        }
        Ok(_) => g.lack("host.name", "gethostname(2) returned an empty name"),
        Err(raw) => g.lack("host.name", format!("the host name {raw:?} is not UTF-8")),
    }
    g.apply_overrides_and_derive(&cfg.overrides);
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

    /// `gpu.arch` from `gpu.cc` and `driver.major` from `driver.version`, unless overridden.
    fn derive(&mut self) {
        let rules: [(&str, &str, Derivation); 2] = [
            ("gpu.arch", "gpu.cc", gpu::arch_from_cc),
            ("driver.major", "driver.version", gpu::driver_major),
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

fn gather_gpu(cfg: &FactsConfig) -> Gathered {
    let settings = &cfg.settings;
    let mut reasons = Vec::new();
    let mut reports: Vec<(gpu::GpuReport, Source, String)> = Vec::new();
    match gpu::from_nvml(&settings.nvml_library, settings.timeout) {
        Ok(r) => reports.push((r, Source::Nvml, settings.nvml_library.display().to_string())),
        Err(e) => reasons.push(format!("NVML: {e}")),
    }
    if !reports.iter().any(|(r, ..)| complete(r)) {
        match command::find_in(&cfg.search_path, "nvidia-smi") {
            Some(smi) => match gpu::from_nvidia_smi(&smi, settings.timeout) {
                Ok(r) => reports.push((r, Source::NvidiaSmi, smi.display().to_string())),
                Err(e) => reasons.push(format!("nvidia-smi: {e}")),
            },
            None => reasons.push("nvidia-smi: not on PATH".into()),
        }
    }
    if !reports.iter().any(|(r, ..)| r.driver.is_some()) {
        let path = &settings.driver_version_file;
        match gpu::from_proc_version(path) {
            Ok(r) => reports.push((r, Source::ProcDriver, path.display().to_string())),
            Err(e) => reasons.push(e),
        }
    }
    let mut g = Gathered::default();
    let fields: [(&str, ReportField); 4] = [
        ("gpu.name", |r| r.name.clone()),
        ("gpu.count", |r| r.count.map(|c| c.to_string())),
        ("gpu.cc", |r| r.cc.clone()),
        ("driver.version", |r| r.driver.clone()),
    ];
    for (name, field) in fields {
        match reports
            .iter()
            .find_map(|(r, source, detail)| field(r).map(|v| (v, *source, detail)))
        {
            Some((value, source, detail)) => g.found(name, value, source, detail.clone()),
            None if name.starts_with("gpu.")
                && reports.iter().any(|(r, ..)| r.count == Some(0)) =>
            {
                g.lack(name, "no GPU visible (the driver reports 0 devices)")
            }
            None => {
                let mut why = reasons.clone();
                for (_, source, _) in &reports {
                    why.push(format!("{source}: did not report it"));
                }
                g.lack(name, why.join("; "));
            }
        }
    }
    g
}

fn complete(r: &gpu::GpuReport) -> bool {
    r.name.is_some() && r.count.is_some() && r.cc.is_some() && r.driver.is_some()
        || r.count == Some(0) && r.driver.is_some()
}

/// `python.*` facts and `pkg.*` versions; returns the site-packages directories it read.
fn gather_python(cfg: &FactsConfig, g: &mut Gathered) -> Vec<PathBuf> {
    let settings = &cfg.settings;
    let interpreter = match &settings.python {
        Some(p) if command::is_executable(p) => Ok(p.clone()),
        Some(p) => Err(format!(
            "[gather] python {} is not an executable file",
            p.display()
        )),
        None => command::find_in(&cfg.search_path, "python3")
            .ok_or_else(|| "no python3 on PATH; set [gather] python".to_string()),
    };
    let probed = interpreter.and_then(|p| python::probe(&p, settings.timeout).map(|i| (p, i)));
    let asked = match probed {
        Ok((path, info)) => {
            let detail = format!("{} -I -S", path.display());
            g.found("python.version", info.version, Source::Python, &detail);
            g.found(
                "python.executable",
                info.executable.clone(),
                Source::Python,
                &detail,
            );
            match &info.include {
                Some(dir) => g.found("python.include", dir.clone(), Source::Python, &detail),
                None => g.lack(
                    "python.include",
                    format!("{} has no sysconfig include path", info.executable),
                ),
            }
            if info.site_packages.is_empty() {
                Err(format!(
                    "{} reports no existing site-packages directory",
                    info.executable
                ))
            } else {
                Ok(info.site_packages)
            }
        }
        Err(reason) => {
            g.lack("python.version", reason.clone());
            g.lack("python.executable", reason.clone());
            g.lack("python.include", reason.clone());
            Err(format!("no interpreter to ask: {reason}"))
        }
    };
    let site_dirs = if settings.site_packages.is_empty() {
        asked.map(|dirs| (dirs, Source::Python, "sys.path of the interpreter"))
    } else {
        Ok((
            settings.site_packages.clone(),
            Source::Config,
            "[gather] site_packages",
        ))
    };
    let mut names: Vec<&str> = DEFAULT_PACKAGES.to_vec();
    names.extend(settings.packages.iter().map(String::as_str));
    let site_dirs = match site_dirs {
        Ok((dirs, source, detail)) => {
            match std::env::join_paths(&dirs) {
                Ok(v) => g.found("python.site_packages", v.to_string_lossy(), source, detail),
                Err(e) => g.lack("python.site_packages", format!("cannot be listed: {e}")),
            }
            dirs
        }
        Err(reason) => {
            g.lack("python.site_packages", reason.clone());
            for name in names {
                let fact = format!("pkg.{}", python::normalize(name));
                g.lack(&fact, format!("no site-packages: {reason}"));
            }
            return Vec::new();
        }
    };
    for name in names {
        let fact = format!("pkg.{}", python::normalize(name));
        match python::package_version(&site_dirs, name) {
            Ok((version, path)) => g.found(
                &fact,
                version,
                Source::SitePackages,
                path.display().to_string(),
            ),
            Err(reason) => g.lack(&fact, reason),
        }
    }
    site_dirs
}

/// `cuda.home`, `cuda.runtime` (torch's, else libcudart's) and `cuda.nvcc`.
fn gather_cuda(cfg: &FactsConfig, site_dirs: &[PathBuf], g: &mut Gathered) {
    let home = ["CUDA_HOME", "CUDA_PATH"].iter().find_map(|var| {
        cfg.env
            .get(*var)
            .map(|v| (PathBuf::from(v), Source::Env, var.to_string()))
    });
    let home = home.or_else(|| {
        cfg.default_cuda_home.is_dir().then(|| {
            (
                cfg.default_cuda_home.clone(),
                Source::Filesystem,
                "default location".to_string(),
            )
        })
    });
    match &home {
        Some((path, source, detail)) => g.found(
            "cuda.home",
            path.display().to_string(),
            *source,
            detail.clone(),
        ),
        None => g.lack(
            "cuda.home",
            format!(
                "CUDA_HOME and CUDA_PATH unset and no {}",
                cfg.default_cuda_home.display()
            ),
        ),
    }
    let home = home.map(|(p, ..)| p);

    let mut lib_dirs: Vec<PathBuf> = site_dirs
        .iter()
        .map(|d| d.join("nvidia/cuda_runtime/lib"))
        .collect();
    if let Some(home) = &home {
        lib_dirs.extend([home.join("lib64"), home.join("lib")]);
    }
    match python::torch_cuda(site_dirs) {
        Ok((v, path)) => g.found(
            "cuda.runtime",
            v,
            Source::SitePackages,
            path.display().to_string(),
        ),
        Err(torch_reason) => match python::libcudart_version(site_dirs, &lib_dirs) {
            Ok((v, path)) => g.found(
                "cuda.runtime",
                v,
                Source::Libcudart,
                path.display().to_string(),
            ),
            Err(cudart_reason) => {
                g.lack("cuda.runtime", format!("{torch_reason}; {cudart_reason}"))
            }
        },
    }

    let nvcc = home
        .as_ref()
        .map(|h| h.join("bin/nvcc"))
        .filter(|p| command::is_executable(p));
    match nvcc.or_else(|| command::find_in(&cfg.search_path, "nvcc")) {
        Some(nvcc) => match command::run(&nvcc, &["--version"], cfg.settings.timeout) {
            Ok(out) if out.success => match python::parse_nvcc_release(&out.stdout) {
                Some(v) => g.found("cuda.nvcc", v, Source::Nvcc, nvcc.display().to_string()),
                None => g.lack(
                    "cuda.nvcc",
                    format!("{} --version printed no \"release X.Y\"", nvcc.display()),
                ),
            },
            Ok(out) => g.lack(
                "cuda.nvcc",
                format!("{} --version failed: {}", nvcc.display(), out.failure()),
            ),
            Err(e) => g.lack("cuda.nvcc", e),
        },
        None => g.lack("cuda.nvcc", "no nvcc in cuda.home/bin nor on PATH"),
    }
}

/// `cpu.isa`, `cpu.flags_digest`, `cpu.threads`, `cxx.identity`, `inductor.env_digest`.
fn gather_cpu(cfg: &FactsConfig, g: &mut Gathered) {
    let cpuinfo_path = cfg.cpuinfo.display().to_string();
    let flags = std::fs::read_to_string(&cfg.cpuinfo)
        .map_err(|e| format!("cannot read {cpuinfo_path}: {e}"))
        .and_then(|text| {
            cpu::cpu_flags(&text).ok_or_else(|| format!("{cpuinfo_path} lists no CPU flags"))
        });
    match &flags {
        Ok(flags) => {
            let digest = blake3::hash(flags.join(" ").as_bytes()).to_hex();
            g.found(
                "cpu.flags_digest",
                digest.as_str(),
                Source::File,
                format!("flags of the first processor in {cpuinfo_path}"),
            );
        }
        Err(why) => g.lack("cpu.flags_digest", why.clone()),
    }
    let capability = cfg.env.get("ATEN_CPU_CAPABILITY").map(String::as_str);
    match (&flags, std::env::consts::ARCH) {
        (Ok(flags), "x86_64") => {
            let tier = cpu::x86_isa_tier(flags, capability);
            let detail = match capability {
                Some(c) => format!("{cpuinfo_path} flags with ATEN_CPU_CAPABILITY={c}"),
                None => format!("{cpuinfo_path} flags (ATEN_CPU_CAPABILITY unset)"),
            };
            let source = if capability.is_some() {
                Source::Env
            } else {
                Source::File
            };
            g.found("cpu.isa", tier, source, detail);
        }
        (Err(why), _) => g.lack("cpu.isa", why.clone()),
        (Ok(_), arch) => g.lack(
            "cpu.isa",
            format!("jitship derives torch's ISA tier on x86_64 only (this is {arch}); give it with --fact cpu.isa=VALUE"),
        ),
    }
    match cpu::torch_threads(
        cfg.env.get("OMP_NUM_THREADS").map(String::as_str),
        cfg.affinity_cpus,
    ) {
        Ok((n, detail)) => g.found("cpu.threads", n.to_string(), Source::Env, detail),
        Err(why) => g.lack("cpu.threads", why),
    }
    let cxx = cfg.env.get("CXX").map_or("g++", String::as_str);
    match cpu::compiler_identity(cxx, &cfg.search_path, cfg.settings.timeout) {
        Ok((digest, detail)) => g.found("cxx.identity", digest, Source::Program, detail),
        Err(why) => g.lack("cxx.identity", why),
    }
    let (digest, names) = cpu::inductor_env_digest(&cfg.env);
    let detail = if names.is_empty() {
        "no TORCHINDUCTOR_*/TORCH_COMPILE_* variable set".to_string()
    } else {
        names.join(", ")
    };
    g.found("inductor.env_digest", digest, Source::Env, detail);
}

/// Facts about the deployment rather than the machine: model and engine configuration.
fn gather_deployment(cfg: &FactsConfig, g: &mut Gathered) {
    let how = |name: &str| {
        format!(
            "not on the machine: give it with --fact {name}=VALUE, {FACTS_ENV} or [facts] in the config"
        )
    };
    g.lack("model.id", how("model.id"));
    g.lack("model.revision", how("model.revision"));
    match &cfg.settings.engine_config {
        Some(path) => match digest_file(path) {
            Ok(hex) => g.found("engine.config_digest", hex, Source::File, path.display().to_string()),
            Err(e) => g.lack("engine.config_digest", e),
        },
        None => g.lack(
            "engine.config_digest",
            format!("no [gather] engine_config file to digest; or give it with --fact engine.config_digest=VALUE, {FACTS_ENV} or [facts]"),
        ),
    }
}

fn digest_file(path: &Path) -> Result<String, String> {
    let mut file =
        std::fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut hasher = blake3::Hasher::new();
    std::io::copy(&mut file, &mut hasher)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(hasher.finalize().to_hex().to_string())
}

#[cfg(test)]
mod tests;
