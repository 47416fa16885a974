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
    assert_eq!(
        kinds,
        [
            "inductor",
            "vllm-compile",
            "inductor-pch",
            "vllm-modelinfos"
        ]
    );
    assert_eq!(
        config.engine_candidates,
        ["vllm-compile", "inductor-pch", "vllm-modelinfos"]
    );
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
    assert_eq!(
        on.kinds,
        ["vllm-compile", "inductor-pch", "vllm-modelinfos"]
    );
    assert!(on.why.contains("torch 2.13.0 >= 2.10"), "{}", on.why);
    let off = env(&[("VLLM_USE_AOT_COMPILE", "0")]);
    assert_eq!(
        EngineCaches::choose(Engine::Vllm, &off, &cpu, true).kinds,
        ["inductor", "vllm-modelinfos"]
    );
    assert_eq!(
        EngineCaches::choose(Engine::Vllm, &off, &cpu, false).kinds,
        ["inductor", "inductor-pch", "vllm-modelinfos"]
    );
    // vLLM's default: off before torch 2.10, and whenever the compile cache is disabled.
    let old = facts(&[("pkg.torch", "2.9.1+cpu"), ("gpu.count", "0")]);
    assert_eq!(
        EngineCaches::choose(Engine::Vllm, &env(&[]), &old, true).kinds,
        ["inductor", "vllm-modelinfos"]
    );
    let disabled = env(&[("VLLM_DISABLE_COMPILE_CACHE", "1")]);
    assert_eq!(
        EngineCaches::choose(Engine::Vllm, &disabled, &cpu, true).kinds,
        ["inductor", "vllm-modelinfos"]
    );
    // Only "1" turns it on, as in vLLM.
    let yes = env(&[("VLLM_USE_AOT_COMPILE", "true")]);
    assert_eq!(
        EngineCaches::choose(Engine::Vllm, &yes, &cpu, true).kinds,
        ["inductor", "vllm-modelinfos"]
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
fn sglang_moves_the_caches_it_uses_under_its_cache_dir_unless_set() {
    let home = |vars: &[(&str, &str)]| {
        ProcessEnv::new(
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())),
            Some(("u".into(), "/home/u".into())),
            1000,
        )
    };
    let moved = engine_env(Some(Engine::Sglang), home(&[]));
    for (var, value) in [
        ("SGLANG_CACHE_DIR", "/home/u/.cache/sglang"),
        ("TORCHINDUCTOR_CACHE_DIR", "/home/u/.cache/sglang/inductor"),
        ("TRITON_CACHE_DIR", "/home/u/.cache/sglang/triton"),
        ("CUDA_CACHE_PATH", "/home/u/.cache/sglang/nv"),
        ("TILELANG_CACHE_DIR", "/home/u/.cache/sglang/tilelang"),
        ("FLASHINFER_WORKSPACE_BASE", "/home/u/.cache/sglang"),
        ("DG_JIT_CACHE_DIR", "/home/u/.cache/sglang/deep_gemm"),
        ("SGLANG_JIT_CACHE_DIR", "/home/u/.cache/sglang/jit"),
    ] {
        assert_eq!(moved.var(var), Some(value), "{var}");
    }
    // Set by the operator: SGLang's setdefault keeps it; DeepGEMM's is forced; the JIT
    // cache does not follow SGLANG_CACHE_DIR.
    let set = engine_env(
        Some(Engine::Sglang),
        home(&[
            ("SGLANG_CACHE_DIR", "~/sg"),
            ("TRITON_CACHE_DIR", "/t"),
            ("DG_JIT_CACHE_DIR", "/dg"),
        ]),
    );
    assert_eq!(set.var("TRITON_CACHE_DIR"), Some("/t"));
    assert_eq!(
        set.var("TORCHINDUCTOR_CACHE_DIR"),
        Some("/home/u/sg/inductor")
    );
    assert_eq!(set.var("DG_JIT_CACHE_DIR"), Some("/home/u/sg/deep_gemm"));
    assert_eq!(
        set.var("SGLANG_JIT_CACHE_DIR"),
        Some("/home/u/.cache/sglang/jit")
    );
    assert_eq!(set.var("SGLANG_CACHE_DIR"), Some("~/sg"));
    // Another engine, or none: the environment as it is.
    assert_eq!(engine_env(Some(Engine::Vllm), home(&[])), home(&[]));
    assert_eq!(engine_env(None, home(&[])), home(&[]));
}

#[test]
fn sglang_reads_inductor_on_a_cpu_machine_and_everything_it_moves_on_a_gpu() {
    let cpu = facts(&[("gpu.count", "0")]);
    let c = EngineCaches::choose(Engine::Sglang, &env(&[]), &cpu, false);
    assert_eq!(c.kinds, ["inductor", "inductor-pch"]);
    assert!(c.why.contains("SGLANG_CACHE_DIR unset"), "{}", c.why);
    assert_eq!(
        EngineCaches::choose(Engine::Sglang, &env(&[]), &cpu, true).kinds,
        ["inductor"]
    );
    let gpu = facts(&[("gpu.name", "NVIDIA H200")]);
    let g = EngineCaches::choose(Engine::Sglang, &env(&[]), &gpu, false);
    assert!(!g.kinds.contains(&"inductor-pch"), "{:?}", g.kinds);
    for kind in [
        "inductor",
        "triton",
        "sglang-jit",
        "sglang-compile",
        "deepgemm",
    ] {
        assert!(g.kinds.contains(&kind), "{kind} in {:?}", g.kinds);
    }
}

#[test]
fn sglang_keys_hold_pkg_sglang_once() {
    use crate::policy::native::NativeRules;
    let native: Arc<dyn CachePolicy> = Arc::new(NativeRules::new("inductor"));
    let plain = native.compat_key(&facts(&[("a", "1")])).unwrap();
    let sglang = keyed(Some(Engine::Sglang), "inductor", native.clone());
    assert_eq!(
        sglang
            .compat_key(&facts(&[("a", "1"), ("pkg.sglang", "0.5.23")]))
            .unwrap(),
        // The native rules key on every fact, pkg.sglang among them: not added twice.
        native
            .compat_key(&facts(&[("a", "1"), ("pkg.sglang", "0.5.23")]))
            .unwrap()
    );
    assert!(matches!(
        sglang.compat_key(&facts(&[("a", "1")])),
        Err(PolicyError::MissingFact(f)) if f == "pkg.sglang"
    ));
    // A key without it gets it, encoded as keys are.
    let only_a = crate::policy::testing::HookedPolicy::new(NativeRules::new("inductor"), ())
        .on_compat_key(|_, _, _| Ok("inductor@1;a=1".into()));
    let k = keyed(Some(Engine::Sglang), "inductor", Arc::new(only_a));
    assert_eq!(
        k.compat_key(&facts(&[("pkg.sglang", "0.5;23")])).unwrap(),
        "inductor@1;a=1;pkg.sglang=0.5%3B23"
    );
    // Everything but the key is the policy's own, the module publish stores included.
    struct WithModule(NativeRules);
    impl CachePolicy for WithModule {
        fn info(&self) -> &PolicyInfo {
            self.0.info()
        }
        fn policy_ref(&self) -> PolicyRef {
            self.0.policy_ref()
        }
        fn module(&self) -> Option<Arc<[u8]>> {
            Some(Arc::from(&b"\0asm"[..]))
        }
        fn compat_key(&self, facts: &Facts) -> Result<String, PolicyError> {
            self.0.compat_key(facts)
        }
        fn select(&self, root: &Path, entries: &[FileEntry]) -> Result<Selection, PolicyError> {
            self.0.select(root, entries)
        }
        fn retain(
            &self,
            generations: &[GenerationSummary],
            now: u64,
            limits: &RetentionLimits,
        ) -> Result<Vec<RetentionDrop>, PolicyError> {
            self.0.retain(generations, now, limits)
        }
    }
    let wrapped = keyed(
        Some(Engine::Sglang),
        "inductor",
        Arc::new(WithModule(NativeRules::new("inductor"))),
    );
    assert_eq!(wrapped.module().as_deref(), Some(&b"\0asm"[..]));
    assert_eq!(wrapped.info().cache_kind, "inductor");
    // vLLM adds no fact (its thread count: vllm_keys_drop_the_thread_count_on_a_cpu); a
    // kind SGLang does not read is left alone.
    assert_eq!(
        keyed(Some(Engine::Vllm), "inductor", native.clone())
            .compat_key(&facts(&[("a", "1"), ("gpu.name", "H200")]))
            .unwrap(),
        native
            .compat_key(&facts(&[("a", "1"), ("gpu.name", "H200")]))
            .unwrap()
    );
    assert_eq!(
        keyed(Some(Engine::Sglang), "vllm-compile", native)
            .compat_key(&facts(&[("a", "1")]))
            .unwrap(),
        plain
    );
}

#[test]
fn vllm_keys_drop_the_thread_count_on_a_cpu() {
    use crate::policy::native::NativeRules;
    let cpu = |threads: &str| facts(&[("cpu.threads", threads), ("gpu.count", "0")]);
    let gpu = |threads: &str| facts(&[("cpu.threads", threads), ("gpu.name", "H200")]);
    for kind in ["vllm-compile", "inductor", "inductor-pch"] {
        let vllm = keyed(Some(Engine::Vllm), kind, Arc::new(NativeRules::new(kind)));
        let key = vllm.compat_key(&cpu("2")).unwrap();
        // vLLM compiles with cpp.dynamic_threads on: one key whatever the thread count.
        assert_eq!(vllm.compat_key(&cpu("1")).unwrap(), key, "{kind}");
        assert!(key.contains("cpu.threads=dynamic"), "{key}");
        // On a GPU machine vLLM does not turn it on: the count stays.
        assert_ne!(
            vllm.compat_key(&gpu("1")).unwrap(),
            vllm.compat_key(&gpu("2")).unwrap(),
            "{kind}"
        );
    }
    // Bare torch.compile bakes the count into its kernels: another count, another key.
    let plain: Arc<dyn CachePolicy> = Arc::new(NativeRules::new("inductor"));
    for bare in [
        keyed(None, "inductor", plain.clone()),
        keyed(Some(Engine::Sglang), "inductor", plain),
    ] {
        let with = |t: &str| {
            let mut f = cpu(t);
            f.set("pkg.sglang", "0.5.23");
            f
        };
        assert_ne!(
            bare.compat_key(&with("1")).unwrap(),
            bare.compat_key(&with("2")).unwrap()
        );
    }
}

#[test]
fn vllm_on_a_gpu_machine_reads_its_own_compile_cache() {
    let gpu = facts(&[("pkg.torch", "2.13.0"), ("gpu.name", "NVIDIA H200")]);
    for e in [env(&[]), env(&[("VLLM_USE_AOT_COMPILE", "0")])] {
        let c = EngineCaches::choose(Engine::Vllm, &e, &gpu, true);
        assert_eq!(c.kinds, ["vllm-compile", "vllm-modelinfos"]);
        assert!(c.why.contains("GPU"), "{}", c.why);
    }
}
