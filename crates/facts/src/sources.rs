//! Each source `gather` consults, one function each: the GPU (NVML, nvidia-smi, the driver's
//! proc file), the bare interpreter and its packages, CUDA, the CPU, the deployment.

use std::path::{Path, PathBuf};

use jitship_generation::{ContentHash, ContentHasher};

use crate::{
    DEFAULT_PACKAGES, FACTS_ENV, FactsConfig, Gathered, ReportField, Source, command, cpu, fact,
    gpu, python,
};

pub(super) fn gather_gpu(cfg: &FactsConfig) -> Gathered {
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
        (fact::GPU_NAME, |r| r.name.clone()),
        (fact::GPU_COUNT, |r| r.count.map(|c| c.to_string())),
        (fact::GPU_CC, |r| r.cc.clone()),
        (fact::DRIVER_VERSION, |r| r.driver.clone()),
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

pub(super) fn complete(r: &gpu::GpuReport) -> bool {
    r.name.is_some() && r.count.is_some() && r.cc.is_some() && r.driver.is_some()
        || r.count == Some(0) && r.driver.is_some()
}

/// The engine's interpreter, in this order: `settings.python` (`--python`, `JITSHIP_PYTHON`,
/// `[gather] python`), the active venv's `$VIRTUAL_ENV/bin/python3` (a worker image that sets
/// `VIRTUAL_ENV` without putting the venv on PATH), then `python3` on PATH. A `VIRTUAL_ENV`
/// without an interpreter is an error, not a reason to ask another Python about the packages.
fn interpreter(cfg: &FactsConfig) -> Result<PathBuf, String> {
    const OPTIONS: &str = "give the engine's interpreter with --python PATH or JITSHIP_PYTHON \
        ([gather] python in the config), set VIRTUAL_ENV to its venv, or put python3 on PATH";
    if let Some(p) = &cfg.settings.python {
        return match command::is_executable(p) {
            true => Ok(p.clone()),
            false => Err(format!(
                "{} is not an executable file (given by --python, JITSHIP_PYTHON or [gather] python)",
                p.display()
            )),
        };
    }
    if let Some(venv) = cfg.env.get(VIRTUAL_ENV) {
        let p = Path::new(venv).join("bin/python3");
        return match command::is_executable(&p) {
            true => Ok(p),
            false => Err(format!(
                "{VIRTUAL_ENV}={venv} has no executable bin/python3; {OPTIONS}"
            )),
        };
    }
    command::find_in(&cfg.search_path, "python3")
        .ok_or_else(|| format!("VIRTUAL_ENV is unset and no python3 is on PATH; {OPTIONS}"))
}

/// The active virtual environment, as `activate` and `uv` set it.
pub(crate) const VIRTUAL_ENV: &str = "VIRTUAL_ENV";

/// How the reason of every Python fact begins when no interpreter could be found (see
/// [`Gathered::no_interpreter`](crate::Gathered::no_interpreter)).
pub(crate) const NO_INTERPRETER: &str = "no Python interpreter found";

/// `python.*` facts and `pkg.*` versions; returns the site-packages directories it read.
pub(super) fn gather_python(cfg: &FactsConfig, g: &mut Gathered) -> Vec<PathBuf> {
    let settings = &cfg.settings;
    let interpreter = interpreter(cfg).map_err(|why| format!("{NO_INTERPRETER}: {why}"));
    let probed = interpreter.and_then(|p| python::probe(&p, settings.timeout).map(|i| (p, i)));
    let asked = match probed {
        Ok((path, info)) => {
            let detail = format!("{} -I -S", path.display());
            g.found(fact::PYTHON_VERSION, info.version, Source::Python, &detail);
            g.found(
                fact::PYTHON_EXECUTABLE,
                info.executable.clone(),
                Source::Python,
                &detail,
            );
            match &info.include {
                Some(dir) => g.found(fact::PYTHON_INCLUDE, dir.clone(), Source::Python, &detail),
                None => g.lack(
                    fact::PYTHON_INCLUDE,
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
            g.lack(fact::PYTHON_VERSION, reason.clone());
            g.lack(fact::PYTHON_EXECUTABLE, reason.clone());
            g.lack(fact::PYTHON_INCLUDE, reason.clone());
            Err(reason)
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
                Ok(v) => g.found(
                    fact::PYTHON_SITE_PACKAGES,
                    v.to_string_lossy(),
                    source,
                    detail,
                ),
                Err(e) => g.lack(fact::PYTHON_SITE_PACKAGES, format!("cannot be listed: {e}")),
            }
            dirs
        }
        Err(reason) => {
            g.lack(fact::PYTHON_SITE_PACKAGES, reason.clone());
            for name in names {
                let fact = format!("{}{}", fact::PKG_PREFIX, python::normalize(name));
                g.lack(&fact, format!("no site-packages: {reason}"));
            }
            return Vec::new();
        }
    };
    for name in names {
        let fact = format!("{}{}", fact::PKG_PREFIX, python::normalize(name));
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
pub(super) fn gather_cuda(cfg: &FactsConfig, site_dirs: &[PathBuf], g: &mut Gathered) {
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
            fact::CUDA_HOME,
            path.display().to_string(),
            *source,
            detail.clone(),
        ),
        None => g.lack(
            fact::CUDA_HOME,
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
            fact::CUDA_RUNTIME,
            v,
            Source::SitePackages,
            path.display().to_string(),
        ),
        Err(torch_reason) => match python::libcudart_version(site_dirs, &lib_dirs) {
            Ok((v, path)) => g.found(
                fact::CUDA_RUNTIME,
                v,
                Source::Libcudart,
                path.display().to_string(),
            ),
            Err(cudart_reason) => g.lack(
                fact::CUDA_RUNTIME,
                format!("{torch_reason}; {cudart_reason}"),
            ),
        },
    }

    let nvcc = home
        .as_ref()
        .map(|h| h.join("bin/nvcc"))
        .filter(|p| command::is_executable(p));
    match nvcc.or_else(|| command::find_in(&cfg.search_path, "nvcc")) {
        Some(nvcc) => match command::run(&nvcc, &["--version"], cfg.settings.timeout) {
            Ok(out) if out.success => match python::parse_nvcc_release(&out.stdout) {
                Some(v) => g.found(fact::CUDA_NVCC, v, Source::Nvcc, nvcc.display().to_string()),
                None => g.lack(
                    fact::CUDA_NVCC,
                    format!("{} --version printed no \"release X.Y\"", nvcc.display()),
                ),
            },
            Ok(out) => g.lack(
                fact::CUDA_NVCC,
                format!("{} --version failed: {}", nvcc.display(), out.failure()),
            ),
            Err(e) => g.lack(fact::CUDA_NVCC, e),
        },
        None => g.lack(fact::CUDA_NVCC, "no nvcc in cuda.home/bin nor on PATH"),
    }
}

/// `cpu.isa`, `cpu.flags_digest`, `cpu.threads`, `cxx.identity`, `inductor.env_digest`.
pub(super) fn gather_cpu(cfg: &FactsConfig, g: &mut Gathered) {
    let cpuinfo_path = cfg.cpuinfo.display().to_string();
    let flags = std::fs::read_to_string(&cfg.cpuinfo)
        .map_err(|e| format!("cannot read {cpuinfo_path}: {e}"))
        .and_then(|text| {
            cpu::cpu_flags(&text).ok_or_else(|| format!("{cpuinfo_path} lists no CPU flags"))
        });
    match &flags {
        Ok(flags) => {
            let digest = ContentHash::of(flags.join(" ").as_bytes()).to_hex();
            g.found(
                fact::CPU_FLAGS_DIGEST,
                digest.as_str(),
                Source::File,
                format!("flags of the first processor in {cpuinfo_path}"),
            );
        }
        Err(why) => g.lack(fact::CPU_FLAGS_DIGEST, why.clone()),
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
            g.found(fact::CPU_ISA, tier, source, detail);
        }
        (Err(why), _) => g.lack(fact::CPU_ISA, why.clone()),
        (Ok(_), arch) => g.lack(
            fact::CPU_ISA,
            format!("jitship derives torch's ISA tier on x86_64 only (this is {arch}); give it with --fact cpu.isa=VALUE"),
        ),
    }
    match cpu::torch_threads(
        cfg.env.get("OMP_NUM_THREADS").map(String::as_str),
        cfg.affinity_cpus,
    ) {
        Ok((n, detail)) => g.found(fact::CPU_THREADS, n.to_string(), Source::Env, detail),
        Err(why) => g.lack(fact::CPU_THREADS, why),
    }
    let cxx = cfg.env.get("CXX").map_or("g++", String::as_str);
    match cpu::compiler_identity(cxx, &cfg.search_path, cfg.settings.timeout) {
        Ok((digest, detail)) => g.found(fact::CXX_IDENTITY, digest, Source::Program, detail),
        Err(why) => g.lack(fact::CXX_IDENTITY, why),
    }
    let (digest, names) = cpu::inductor_env_digest(&cfg.env);
    let detail = if names.is_empty() {
        "no TORCHINDUCTOR_*/TORCH_COMPILE_* variable set".to_string()
    } else {
        names.join(", ")
    };
    g.found(fact::INDUCTOR_ENV_DIGEST, digest, Source::Env, detail);
}

/// Facts about the deployment rather than the machine: model and engine configuration.
pub(super) fn gather_deployment(cfg: &FactsConfig, g: &mut Gathered) {
    let how = |name: &str| {
        format!(
            "not on the machine: give it with --fact {name}=VALUE, {FACTS_ENV} or [facts] in the config"
        )
    };
    g.lack(fact::MODEL_ID, how(fact::MODEL_ID));
    g.lack(fact::MODEL_REVISION, how(fact::MODEL_REVISION));
    match &cfg.settings.engine_config {
        Some(path) => match digest_file(path) {
            Ok(hex) => g.found(fact::ENGINE_CONFIG_DIGEST, hex, Source::File, path.display().to_string()),
            Err(e) => g.lack(fact::ENGINE_CONFIG_DIGEST, e),
        },
        None => g.lack(
            fact::ENGINE_CONFIG_DIGEST,
            format!("no [gather] engine_config file to digest; or give it with --fact engine.config_digest=VALUE, {FACTS_ENV} or [facts]"),
        ),
    }
}

pub(super) fn digest_file(path: &Path) -> Result<String, String> {
    let mut file =
        std::fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut hasher = ContentHasher::new();
    std::io::copy(&mut file, &mut hasher)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(hasher.finish().to_hex())
}
