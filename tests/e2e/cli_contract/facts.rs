//! Facts given per cache (`--fact KIND:NAME=VALUE`) reach that cache's key only.

use super::*;

/// The facts both the inductor and the vllm-compile policy key on, given so that both produce a
/// key on any machine, and a CPU key for inductor (no GPU, whatever this machine has).
fn inductor_facts() -> Vec<String> {
    [
        "pkg.torch=2.8.0+cpu",
        "pkg.triton=3.4.0",
        "pkg.vllm=0.10.2",
        "python.version=3.12.3",
        "python.site_packages=/venv/lib/python3.12/site-packages",
        "python.include=/usr/include/python3.12",
        "os.arch=x86_64",
        "cpu.isa=avx2",
        "cpu.flags_digest=f0",
        "cpu.threads=8",
        "cxx.identity=c0",
        "inductor.env_digest=e0",
        "gpu.name=",
        "gpu.count=0",
    ]
    .into_iter()
    .flat_map(|f| ["--fact".to_string(), f.to_string()])
    .collect()
}

/// Each cache's entry of a publish or install envelope, by kind.
fn by_kind(doc: &Value) -> std::collections::BTreeMap<String, Value> {
    doc["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results: {doc}"))
        .iter()
        .map(|r| (r["cache_kind"].as_str().unwrap().to_string(), r.clone()))
        .collect()
}

/// `--fact KIND:NAME=VALUE` in one publish of two caches changes only that cache's facts: the
/// other cache's compat id is the one it gets with no such override (the operator's case: a
/// `gpu.name` placeholder meant for vllm-compile turned the inductor key into a GPU key).
#[test]
fn a_per_cache_fact_applies_to_its_own_cache_only() {
    let env = Env::new();
    for root in ["vllm", "inductor"] {
        std::fs::create_dir_all(env.path(root)).unwrap();
    }
    let mut flags = vec![
        "--store".to_string(),
        env.store(),
        "--cache".into(),
        format!("vllm-compile={}", env.path("vllm").display()),
        "--cache".into(),
        format!("inductor={}", env.path("inductor").display()),
        "--json".into(),
    ];
    flags.extend(inductor_facts());
    let plain = run_with(&env, "publish", &flags, &[]);
    let plain_doc = json(&plain);
    let plain_results = by_kind(&plain_doc);
    let inductor_id = plain_results["inductor"]["compat_id"].clone();
    assert!(inductor_id.is_string(), "{}", show(&plain));
    assert!(
        plain_results
            .values()
            .all(|r| r.get("fact_overrides").is_none()),
        "{}",
        show(&plain)
    );

    // The placeholder GPU for vllm-compile (with the GPU facts a GPU key needs: gpu.arch and
    // driver.major are derived from its own gpu.cc and driver.version).
    let own = [
        "vllm-compile:gpu.name=NVIDIA H100 80GB HBM3",
        "vllm-compile:gpu.cc=9.0",
        "vllm-compile:driver.version=550.54.15",
        "vllm-compile:cuda.runtime=12.8",
    ];
    let mut with_own = flags.clone();
    with_own.extend(
        own.iter()
            .flat_map(|f| ["--fact".to_string(), f.to_string()]),
    );
    let out = run_with(&env, "publish", &with_own, &[]);
    let results = by_kind(&json(&out));
    assert_eq!(
        results["inductor"]["compat_id"],
        inductor_id,
        "the inductor key moved with vllm-compile's override: {}",
        show(&out)
    );
    assert!(
        results["inductor"].get("fact_overrides").is_none(),
        "{}",
        show(&out)
    );
    let vllm = &results["vllm-compile"]["fact_overrides"];
    assert_eq!(
        vllm["gpu.name"]["value"],
        "NVIDIA H100 80GB HBM3",
        "{}",
        show(&out)
    );
    assert_eq!(
        vllm["gpu.name"]["origin"],
        "--fact vllm-compile:NAME / JITSHIP_FACTS",
        "{}",
        show(&out)
    );
    assert_eq!(
        vllm.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["cuda.runtime", "driver.version", "gpu.cc", "gpu.name"],
        "{}",
        show(&out)
    );

    // The same form in JITSHIP_FACTS (read when no --fact is given).
    let list = inductor_facts()
        .iter()
        .filter(|f| *f != "--fact")
        .map(String::as_str)
        .chain(own)
        .collect::<Vec<_>>()
        .join(";");
    let no_facts: Vec<String> = flags.iter().take(7).cloned().collect();
    let out = env
        .cmd(&["publish"])
        .args(&no_facts)
        .env("JITSHIP_FACTS", &list)
        .output()
        .unwrap();
    let results = by_kind(&json(&out));
    assert_eq!(
        results["inductor"]["compat_id"],
        inductor_id,
        "{}",
        show(&out)
    );
    assert_eq!(
        results["vllm-compile"]["fact_overrides"]["gpu.cc"]["value"],
        "9.0",
        "{}",
        show(&out)
    );

    // `jitship facts` shows vllm-compile's own set apart from the command-wide one.
    let mut facts_flags = vec![
        "--cache".to_string(),
        format!("vllm-compile={}", env.path("vllm").display()),
        "--cache".into(),
        format!("inductor={}", env.path("inductor").display()),
        "--json".into(),
    ];
    facts_flags.extend(inductor_facts());
    facts_flags.extend(
        own.iter()
            .flat_map(|f| ["--fact".to_string(), f.to_string()]),
    );
    let out = run_with(&env, "facts", &facts_flags, &[]);
    let doc = json(&out);
    assert!(doc["facts"].get("gpu.name").is_none(), "{}", show(&out));
    let vllm = &doc["caches"]["vllm-compile"];
    assert_eq!(
        vllm["facts"]["gpu.name"],
        "NVIDIA H100 80GB HBM3",
        "{}",
        show(&out)
    );
    assert_eq!(vllm["facts"]["gpu.arch"], "sm_90", "{}", show(&out));
    assert_eq!(vllm["facts"]["driver.major"], "550", "{}", show(&out));
    assert!(doc["caches"].get("inductor").is_none(), "{}", show(&out));
    facts_flags.retain(|f| f != "--json");
    let out = run_with(&env, "facts", &facts_flags, &[]);
    let table = text(&out.stdout);
    assert!(
        table.contains("facts of the vllm-compile cache only"),
        "{}",
        show(&out)
    );

    // A KIND: naming no cache of the command is a configuration error naming the caches.
    let mut bad = flags.clone();
    bad.extend(["--fact".into(), "triton:gpu.name=x".into()]);
    let out = run_with(&env, "publish", &bad, &[]);
    assert_eq!(code(&out), 1, "{}", show(&out));
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        all.contains("\"triton\" is not a cache of this command")
            && all.contains("vllm-compile, inductor"),
        "{}",
        show(&out)
    );
}
