// Digests checked against blake3 itself: an oracle independent of the gatherer.
#![allow(clippy::disallowed_methods)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use super::*;

/// A machine laid out in a tempdir: bin/ (the search path), site/ (site-packages), cuda/,
/// and a driver version file. Nothing here touches the process environment.
struct FakeMachine {
    dir: tempfile::TempDir,
}

impl FakeMachine {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        for d in ["bin", "site", "cuda/bin", "cuda/lib64"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        Self { dir }
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
    fn script(&self, rel: &str, body: &str) {
        let path = self.path(rel);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    fn dist(&self, dir_name: &str, name: &str, version: &str) {
        let d = self.path("site").join(dir_name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("METADATA"),
            format!(
                "Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: x\n\nbody\n"
            ),
        )
        .unwrap();
    }
    /// A bare "python3" that answers the probe the way a real one would.
    fn python(&self) {
        let site = self.path("site");
        self.script(
                "bin/python3",
                &format!(
                    "printf 'version\\t3.12.3\\nexecutable\\t/opt/venv/bin/python3\\ninclude\\t/opt/py/include/python3.12\\nsite\\t{}\\n'",
                    site.display()
                ),
            );
    }
    /// Nothing on the search path, no NVML, no driver file, no CUDA.
    fn config(&self) -> FactsConfig {
        FactsConfig {
            settings: GatherConfig {
                nvml_library: self.path("no-libnvidia-ml.so.1"),
                driver_version_file: self.path("proc-driver-nvidia-version"),
                timeout: Duration::from_secs(5),
                ..GatherConfig::default()
            },
            search_path: vec![self.path("bin")],
            env: BTreeMap::new(),
            default_cuda_home: self.path("no-cuda"),
            cpuinfo: self.path("no-cpuinfo"),
            affinity_cpus: Some(4),
            overrides: Vec::new(),
        }
    }
}

fn every_expected_fact_is_accounted_for(g: &Gathered, extra_packages: &[&str]) {
    // The contract's list (jitship_policy_contract::facts::ALL): what policies key on is what the
    // gatherer reports, found or missing, nothing more.
    let mut expected: Vec<String> = fact::ALL.iter().map(|s| s.to_string()).collect();
    expected.extend(
        DEFAULT_PACKAGES
            .iter()
            .chain(extra_packages)
            .map(|p| format!("pkg.{}", normalize_package_name(p))),
    );
    for name in &expected {
        let present = g.facts.get(name).is_some();
        assert!(
            present != g.missing.contains_key(name),
            "{name} must be in exactly one of facts and missing: {g:#?}"
        );
        assert_eq!(
            present,
            g.sources.contains_key(name),
            "{name}: a present fact has a source"
        );
    }
    let known: Vec<&String> = g
        .facts
        .as_map()
        .keys()
        .chain(g.missing.keys())
        .filter(|k| !expected.contains(k))
        .collect();
    assert!(known.is_empty(), "unexpected facts {known:?}");
}

#[test]
fn the_default_packages_are_the_contracts_package_facts() {
    let names: Vec<String> = DEFAULT_PACKAGES
        .iter()
        .map(|p| format!("{}{}", fact::PKG_PREFIX, normalize_package_name(p)))
        .collect();
    assert_eq!(names, fact::DEFAULT_PKGS);
}

#[test]
fn a_full_fake_machine_gives_every_fact_with_its_source() {
    let m = FakeMachine::new();
    m.python();
    m.script("bin/nvidia-smi", "echo 'NVIDIA H100 80GB HBM3, 9.0, 550.54.15'; echo 'NVIDIA H100 80GB HBM3, 9.0, 550.54.15'");
    m.script(
        "cuda/bin/nvcc",
        "echo 'Cuda compilation tools, release 12.4, V12.4.131'",
    );
    m.dist("torch-2.6.0+cu124.dist-info", "torch", "2.6.0+cu124");
    m.dist("triton-3.2.0.dist-info", "triton", "3.2.0");
    m.dist(
        "flashinfer_python-0.2.5.dist-info",
        "flashinfer-python",
        "0.2.5",
    );
    m.dist("deep_gemm-2.1.0.dist-info", "deep_gemm", "2.1.0");
    m.dist("xformers-0.0.29.dist-info", "xformers", "0.0.29");
    // An old-style egg-info directory.
    std::fs::create_dir_all(m.path("site/vllm-0.8.5-py3.12.egg-info")).unwrap();
    std::fs::write(
        m.path("site/vllm-0.8.5-py3.12.egg-info/PKG-INFO"),
        "Name: vllm\nVersion: 0.8.5\n",
    )
    .unwrap();
    std::fs::create_dir_all(m.path("site/torch")).unwrap();
    std::fs::write(
        m.path("site/torch/version.py"),
        "__version__ = '2.6.0+cu124'\ncuda: Optional[str] = '12.4'\n",
    )
    .unwrap();
    std::fs::write(m.path("engine.yaml"), "max_model_len: 8192\n").unwrap();
    let mut cfg = m.config();
    cfg.settings.packages = vec!["xformers".into()];
    cfg.settings.engine_config = Some(m.path("engine.yaml"));
    cfg.env
        .insert("CUDA_HOME".into(), m.path("cuda").display().to_string());

    let g = gather(&cfg);
    let f = &g.facts;
    assert_eq!(f.get("gpu.name"), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(f.get("gpu.count"), Some("2"));
    assert_eq!(f.get("gpu.cc"), Some("9.0"));
    assert_eq!(f.get("gpu.arch"), Some("sm_90"));
    assert_eq!(f.get("driver.version"), Some("550.54.15"));
    assert_eq!(f.get("driver.major"), Some("550"));
    assert_eq!(g.sources["gpu.name"].source, Source::NvidiaSmi);
    assert_eq!(g.sources["gpu.arch"].source, Source::Derived);
    assert_eq!(f.get("python.version"), Some("3.12.3"));
    assert_eq!(f.get("python.executable"), Some("/opt/venv/bin/python3"));
    assert_eq!(
        f.get("python.site_packages"),
        Some(m.path("site").to_str().unwrap())
    );
    assert_eq!(f.get("pkg.torch"), Some("2.6.0+cu124"));
    assert_eq!(f.get("pkg.triton"), Some("3.2.0"));
    assert_eq!(f.get("pkg.flashinfer_python"), Some("0.2.5"));
    assert_eq!(f.get("pkg.deep_gemm"), Some("2.1.0"));
    assert_eq!(f.get("pkg.vllm"), Some("0.8.5"));
    assert_eq!(f.get("pkg.xformers"), Some("0.0.29"));
    assert!(g.missing["pkg.sglang"].contains("not installed"), "{g:#?}");
    assert_eq!(
        g.sources["pkg.torch"].detail,
        m.path("site/torch-2.6.0+cu124.dist-info/METADATA")
            .display()
            .to_string()
    );
    assert_eq!(f.get("cuda.runtime"), Some("12.4"));
    assert_eq!(f.get("cuda.nvcc"), Some("12.4"));
    assert_eq!(f.get("cuda.home"), Some(m.path("cuda").to_str().unwrap()));
    assert_eq!(
        g.sources["cuda.home"],
        Provenance {
            source: Source::Env,
            detail: "CUDA_HOME".into()
        }
    );
    assert_eq!(
        f.get("engine.config_digest"),
        Some(blake3::hash(b"max_model_len: 8192\n").to_hex().as_str())
    );
    assert_eq!(f.get("os.arch"), Some(std::env::consts::ARCH));
    assert!(g.missing["model.id"].contains("--fact model.id=VALUE"));
    every_expected_fact_is_accounted_for(&g, &["xformers"]);
}

#[test]
fn cpu_facts_follow_cpuinfo_the_environment_and_the_compiler() {
    let m = FakeMachine::new();
    std::fs::write(
            m.path("cpuinfo"),
            "processor\t: 0\nflags\t\t: fpu avx2 fma avx512f avx512_vnni\n\nprocessor\t: 1\nflags\t\t: fpu avx2 fma avx512f avx512_vnni\n",
        )
        .unwrap();
    // A compiler driver printing its version on stderr, as gcc does (a script's $0 is its
    // path whatever argv[0] was, so the bare-name argv[0] is checked with the real g++ by
    // tests/engines/inductor-e2e.sh, where a mismatch would re-run torch's ISA probe).
    m.script(
        "bin/g++",
        "echo 'Target: x86_64-linux-gnu' >&2; echo 'gcc version 12.2.0' >&2",
    );
    m.script("bin/clang++", "echo 'clang version 17' >&2");
    let base = || {
        let mut cfg = m.config();
        cfg.cpuinfo = m.path("cpuinfo");
        cfg.affinity_cpus = Some(2);
        cfg
    };
    let g = gather(&base());
    assert_eq!(g.facts.get("cpu.threads"), Some("2"));
    assert!(
        g.sources["cpu.threads"]
            .detail
            .contains("OMP_NUM_THREADS unset")
    );
    let digest = g.facts.get("cpu.flags_digest").unwrap().to_string();
    assert_eq!(
        digest,
        blake3::hash(b"avx2 avx512_vnni avx512f fma fpu")
            .to_hex()
            .as_str()
    );
    let gxx = g.facts.get("cxx.identity").unwrap().to_string();
    assert_eq!(
        gxx,
        blake3::hash(b"Target: x86_64-linux-gnu\ngcc version 12.2.0\n")
            .to_hex()
            .as_str(),
    );
    assert_eq!(g.sources["cxx.identity"].source, Source::Program);
    let none_set = g.facts.get("inductor.env_digest").unwrap().to_string();
    if std::env::consts::ARCH == "x86_64" {
        assert_eq!(g.facts.get("cpu.isa"), Some("avx512_vnni"));
        assert_eq!(g.sources["cpu.isa"].source, Source::File);
    } else {
        assert!(g.missing["cpu.isa"].contains("x86_64 only"));
    }

    let mut cfg = base();
    for (k, v) in [
        ("OMP_NUM_THREADS", "1"),
        ("ATEN_CPU_CAPABILITY", "avx2"),
        ("CXX", "clang++"),
        ("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS", "0"),
        ("TORCHINDUCTOR_CACHE_DIR", "/elsewhere"),
    ] {
        cfg.env.insert(k.into(), v.into());
    }
    let h = gather(&cfg);
    assert_eq!(h.facts.get("cpu.threads"), Some("1"));
    assert_ne!(h.facts.get("cxx.identity"), Some(gxx.as_str()));
    assert_ne!(h.facts.get("inductor.env_digest"), Some(none_set.as_str()));
    assert_eq!(
        h.sources["inductor.env_digest"].detail,
        "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"
    );
    assert_eq!(h.facts.get("cpu.flags_digest"), Some(digest.as_str()));
    if std::env::consts::ARCH == "x86_64" {
        assert_eq!(h.facts.get("cpu.isa"), Some("avx2"));
        assert_eq!(h.sources["cpu.isa"].source, Source::Env);
    }

    let mut cfg = base();
    cfg.env.insert("CXX".into(), "no-such-compiler".into());
    cfg.affinity_cpus = None;
    let k = gather(&cfg);
    assert_eq!(k.missing["cxx.identity"], "no no-such-compiler on PATH");
    assert!(k.missing["cpu.threads"].contains("affinity mask"));
    every_expected_fact_is_accounted_for(&k, &[]);
}

#[test]
fn no_gpu_gives_explicit_missing_facts_with_every_sources_reason() {
    let m = FakeMachine::new();
    let g = gather(&m.config());
    // Nothing was waited for: no probe ran into its timeout (a counted bound, not a clock).
    for (name, why) in &g.missing {
        assert!(!why.contains("did not finish within"), "{name}: {why}");
    }
    for name in ["gpu.name", "gpu.count", "gpu.cc", "driver.version"] {
        let why = &g.missing[name];
        assert!(
            why.contains("NVML: cannot load") && why.contains("nvidia-smi: not on PATH"),
            "{name}: {why}"
        );
        assert!(why.contains("proc-driver-nvidia-version"), "{name}: {why}");
    }
    assert!(
        g.missing["gpu.arch"].starts_with("gpu.cc is missing"),
        "{:?}",
        g.missing["gpu.arch"]
    );
    assert!(g.missing["driver.major"].starts_with("driver.version is missing"));
    assert!(g.missing["python.version"].contains("no python3 is on PATH"));
    assert!(g.missing["pkg.torch"].contains("no site-packages"));
    assert!(g.missing["cuda.home"].contains("CUDA_HOME and CUDA_PATH unset"));
    assert!(g.missing["cuda.runtime"].contains("no torch/version.py"));
    assert!(g.missing["cuda.nvcc"].contains("no nvcc"));
    assert!(g.missing["cpu.isa"].contains("no-cpuinfo"));
    assert!(g.missing["cxx.identity"].contains("no g++ on PATH"));
    every_expected_fact_is_accounted_for(&g, &[]);
    let table = g.render_table();
    assert!(table.contains("\nmissing ("), "{table}");
    let line = table
        .lines()
        .find(|l| l.starts_with("gpu.name "))
        .unwrap_or_default();
    assert!(line.contains("NVML: cannot load"), "{table}");
}

#[test]
fn this_machines_defaults_never_fail_and_account_for_every_fact() {
    // Whatever this machine has (no GPU on CI), gathering with real defaults must answer,
    // quickly, with each fact either found or missing with a reason.
    let cfg = FactsConfig::from_process(&GatherConfig::default(), &Default::default());
    let g = gather(&cfg);
    every_expected_fact_is_accounted_for(&g, &[]);
    assert!(g.missing.values().all(|why| !why.is_empty()), "{g:#?}");
    if !Path::new("/proc/driver/nvidia/version").exists() {
        assert!(g.missing.contains_key("driver.version"), "{g:#?}");
    }
}

#[test]
fn nvml_wins_over_nvidia_smi() {
    let m = FakeMachine::new();
    let nvml = gpu::build_fake_nvml(m.dir.path(), "ok");
    // nvidia-smi would disagree; it must not even be asked once NVML answered everything.
    m.script("bin/nvidia-smi", "echo 'Tesla T4, 7.5, 470.1'");
    let mut cfg = m.config();
    cfg.settings.nvml_library = nvml.clone();
    let g = gather(&cfg);
    assert_eq!(g.facts.get("gpu.name"), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(g.facts.get("gpu.count"), Some("8"));
    assert_eq!(g.facts.get("gpu.arch"), Some("sm_90"));
    assert_eq!(g.facts.get("driver.major"), Some("550"));
    let expected = Provenance {
        source: Source::Nvml,
        detail: nvml.display().to_string(),
    };
    assert_eq!(g.sources["driver.version"], expected);
}

#[test]
fn a_driver_with_no_gpu_gives_count_zero_and_says_so() {
    let m = FakeMachine::new();
    let nvml = gpu::build_fake_nvml(m.dir.path(), "no-devices");
    let mut cfg = m.config();
    cfg.settings.nvml_library = nvml;
    let g = gather(&cfg);
    assert_eq!(g.facts.get("gpu.count"), Some("0"));
    assert_eq!(g.facts.get("driver.version"), Some("550.54.15"));
    assert_eq!(
        g.missing["gpu.name"],
        "no GPU visible (the driver reports 0 devices)"
    );
    assert_eq!(g.missing["gpu.arch"], "gpu.cc is missing");
}

#[test]
fn failing_nvidia_smi_falls_back_to_the_driver_file() {
    let m = FakeMachine::new();
    m.script("bin/nvidia-smi", "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"; exit 9");
    std::fs::write(m.path("proc-driver-nvidia-version"), "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n")
            .unwrap();
    let g = gather(&m.config());
    assert_eq!(g.facts.get("driver.version"), Some("535.183.01"));
    assert_eq!(g.facts.get("driver.major"), Some("535"));
    assert_eq!(g.sources["driver.version"].source, Source::ProcDriver);
    let why = &g.missing["gpu.name"];
    assert!(
        why.contains("exit status 9") && why.contains("couldn't communicate"),
        "{why}"
    );
    assert!(why.contains("proc-driver: did not report it"), "{why}");
}

#[test]
fn a_hanging_nvidia_smi_is_cut_at_the_timeout() {
    let m = FakeMachine::new();
    m.script("bin/nvidia-smi", "sleep 30");
    let mut cfg = m.config();
    cfg.settings.timeout = Duration::from_millis(300);
    // Cut at the timeout, not waited for: had it waited, nvidia-smi would have exited 0 after
    // 30 s with no output, a different reason.
    let g = gather(&cfg);
    assert!(
        g.missing["gpu.name"].contains("did not finish within 300ms"),
        "{:?}",
        g.missing["gpu.name"]
    );
}

#[test]
fn overrides_win_in_layer_order_and_derived_facts_follow_them() {
    let m = FakeMachine::new();
    m.script(
        "bin/nvidia-smi",
        "echo 'NVIDIA H100 80GB HBM3, 9.0, 550.54.15'",
    );
    let mut cfg = m.config();
    cfg.overrides = vec![
        OverrideLayer {
            origin: "config [facts]".into(),
            facts: BTreeMap::from([
                ("gpu.cc".into(), "8.0".into()),
                ("model.id".into(), "from-config".into()),
            ]),
        },
        OverrideLayer {
            origin: "--fact".into(),
            facts: BTreeMap::from([
                ("model.id".into(), "Qwen/Qwen3-8B".into()),
                ("driver.major".into(), "999".into()),
                ("pkg.torch".into(), "2.9.0".into()),
                ("gpu.name".into(), String::new()),
            ]),
        },
    ];
    let g = gather(&cfg);
    assert_eq!(g.facts.get("model.id"), Some("Qwen/Qwen3-8B"));
    assert_eq!(
        g.sources["model.id"],
        Provenance {
            source: Source::Override,
            detail: "--fact".into()
        }
    );
    assert!(!g.missing.contains_key("model.id"));
    assert_eq!(g.facts.get("gpu.cc"), Some("8.0"));
    assert_eq!(g.sources["gpu.cc"].source, Source::Override);
    // Derived from the overridden capability, not the gathered one.
    assert_eq!(g.facts.get("gpu.arch"), Some("sm_80"));
    // An overridden derived fact stays as given.
    assert_eq!(g.facts.get("driver.major"), Some("999"));
    assert_eq!(g.facts.get("pkg.torch"), Some("2.9.0"));
    assert!(!g.missing.contains_key("pkg.torch"));
    // An empty override makes a gathered fact missing, with the reason.
    assert_eq!(g.facts.get("gpu.name"), None);
    assert_eq!(g.missing["gpu.name"], "set empty by --fact");
    assert_eq!(g.facts.get("gpu.count"), Some("1"));
}

#[test]
fn configured_site_packages_work_without_an_interpreter() {
    let m = FakeMachine::new();
    m.dist("sglang-0.5.2.dist-info", "sglang", "0.5.2");
    let mut cfg = m.config();
    cfg.settings.site_packages = vec![m.path("site")];
    cfg.settings.python = Some(m.path("bin/missing-python"));
    let g = gather(&cfg);
    assert_eq!(g.facts.get("pkg.sglang"), Some("0.5.2"));
    assert_eq!(g.sources["python.site_packages"].source, Source::Config);
    assert!(g.missing["python.version"].contains("missing-python is not an executable file"));
}

#[test]
fn the_interpreter_is_the_given_one_then_the_venvs_then_paths() {
    // A venv whose bin/ is not on PATH (an image that sets VIRTUAL_ENV only), PATH without python3.
    let m = FakeMachine::new();
    std::fs::create_dir_all(m.path("venv/bin")).unwrap();
    m.python();
    std::fs::rename(m.path("bin/python3"), m.path("venv/bin/python3")).unwrap();
    m.dist("torch-2.13.0.dist-info", "torch", "2.13.0");
    let mut cfg = m.config();
    let g = gather(&cfg);
    let why = g.no_interpreter("pkg.torch").expect("no interpreter");
    for option in ["--python", "JITSHIP_PYTHON", "VIRTUAL_ENV", "PATH"] {
        assert!(why.contains(option), "{why}");
    }
    assert!(!why.contains("--fact"), "{why}");
    assert!(g.no_interpreter("python.version").is_some());

    cfg.env
        .insert("VIRTUAL_ENV".into(), m.path("venv").display().to_string());
    let g = gather(&cfg);
    assert_eq!(g.facts.get("pkg.torch"), Some("2.13.0"));
    assert_eq!(
        g.sources["python.version"].detail,
        format!("{} -I -S", m.path("venv/bin/python3").display())
    );
    assert_eq!(g.no_interpreter("cuda.home"), None, "not a Python fact");

    // A venv without an interpreter is an error, not a reason to ask PATH's python3.
    m.python();
    cfg.env.insert(
        "VIRTUAL_ENV".into(),
        m.path("no-venv").display().to_string(),
    );
    let g = gather(&cfg);
    let why = g.no_interpreter("pkg.torch").expect("no interpreter");
    assert!(
        why.contains("no-venv has no executable bin/python3"),
        "{why}"
    );

    // The given interpreter wins over the venv.
    cfg.settings.python = Some(m.path("bin/python3"));
    let g = gather(&cfg);
    assert_eq!(
        g.sources["python.version"].detail,
        format!("{} -I -S", m.path("bin/python3").display())
    );
}

#[test]
fn libcudart_answers_when_torch_is_a_cpu_build() {
    let m = FakeMachine::new();
    m.python();
    std::fs::create_dir_all(m.path("site/torch")).unwrap();
    std::fs::write(m.path("site/torch/version.py"), "cuda = None\n").unwrap();
    std::fs::write(m.path("cuda/lib64/libcudart.so.12.8.57"), "").unwrap();
    let mut cfg = m.config();
    cfg.default_cuda_home = m.path("cuda");
    let g = gather(&cfg);
    assert_eq!(g.facts.get("cuda.runtime"), Some("12.8"));
    assert_eq!(g.sources["cuda.runtime"].source, Source::Libcudart);
    assert_eq!(g.sources["cuda.home"].source, Source::Filesystem);
}

#[test]
fn json_has_facts_sources_and_missing() {
    let m = FakeMachine::new();
    let mut cfg = m.config();
    cfg.overrides = vec![OverrideLayer {
        origin: "--fact".into(),
        facts: BTreeMap::from([("model.id".into(), "m".into())]),
    }];
    let v = serde_json::to_value(gather(&cfg)).unwrap();
    assert_eq!(v["facts"]["model.id"], "m");
    assert_eq!(v["sources"]["model.id"]["source"], "override");
    assert_eq!(v["sources"]["os.arch"]["source"], "target");
    assert!(v["missing"]["gpu.name"].is_string());
}

#[test]
fn each_cache_gets_its_own_overrides_on_the_probe_and_derived_facts_follow_them() {
    let m = FakeMachine::new();
    m.script(
        "bin/nvidia-smi",
        "echo 'NVIDIA H100 80GB HBM3, 9.0, 550.54.15'",
    );
    let overrides = FactOverrides {
        config: ScopedFacts {
            global: BTreeMap::from([("model.id".into(), "config".into())]),
            per_cache: BTreeMap::from([(
                "a".into(),
                BTreeMap::from([
                    ("model.id".into(), "config-a".into()),
                    ("gpu.cc".into(), "8.0".into()),
                ]),
            )]),
        },
        flags: ScopedFacts {
            global: BTreeMap::from([("pkg.torch".into(), "2.9.0".into())]),
            per_cache: BTreeMap::from([(
                "a".into(),
                BTreeMap::from([("gpu.name".into(), String::new())]),
            )]),
        },
    };
    let mut cfg = m.config();
    cfg.overrides = overrides.layers(None);
    let probed = probe(&cfg);
    // The probe applies no override; gather applies the command-wide ones.
    assert_eq!(probed.facts.get("model.id"), None);
    let common = gather(&cfg);
    assert_eq!(common, probed.with_overrides(&cfg.overrides));
    assert_eq!(common.facts.get("model.id"), Some("config"));
    assert_eq!(common.facts.get("gpu.arch"), Some("sm_90"));

    let a = probed.with_overrides(&overrides.layers(Some("a")));
    assert_eq!(a.facts.get("model.id"), Some("config-a"));
    assert_eq!(a.sources["model.id"].detail, "config [[cache]] a facts");
    assert_eq!(a.facts.get("pkg.torch"), Some("2.9.0"));
    // Derived from a's own capability.
    assert_eq!(a.facts.get("gpu.arch"), Some("sm_80"));
    assert_eq!(
        a.missing["gpu.name"],
        "set empty by --fact a:NAME / JITSHIP_FACTS"
    );
    // Another kind gets the command-wide set.
    assert_eq!(probed.with_overrides(&overrides.layers(Some("b"))), common);

    // What `jitship facts` shows for a: only what its own overrides change.
    let changed = a.changed_from(&common);
    assert_eq!(
        changed.facts.iter().map(|(k, _)| k).collect::<Vec<_>>(),
        ["gpu.arch", "gpu.cc", "model.id"]
    );
    assert_eq!(changed.missing.keys().collect::<Vec<_>>(), ["gpu.name"]);
    assert_eq!(
        overrides.cache_kinds().into_iter().collect::<Vec<_>>(),
        ["a"]
    );
}
