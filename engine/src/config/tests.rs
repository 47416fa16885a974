use super::*;

#[test]
fn fact_lists_parse_like_the_env_variable() {
    let parsed = parse_fact_list("model.id=Qwen/Qwen3-8B; gpu.cc=9.0;;").unwrap();
    assert_eq!(
        parsed.global,
        BTreeMap::from([
            ("gpu.cc".into(), "9.0".into()),
            ("model.id".into(), "Qwen/Qwen3-8B".into())
        ])
    );
    assert!(parsed.per_cache.is_empty());
    assert!(parse_fact_list("model.id").is_err());
    assert!(parse_fact_list("").unwrap().is_empty());
    // KIND:NAME=VALUE items are for that cache only; a later item wins.
    let parsed =
        parse_fact_list("gpu.name=G;vllm-compile:gpu.name=V=1;vllm-compile:gpu.name=V;x.y=")
            .unwrap();
    assert_eq!(
        parsed.global,
        BTreeMap::from([
            ("gpu.name".into(), "G".into()),
            ("x.y".into(), String::new())
        ])
    );
    assert_eq!(
        parsed.per_cache,
        BTreeMap::from([(
            "vllm-compile".into(),
            BTreeMap::from([("gpu.name".into(), "V".into())])
        )])
    );
}

#[test]
fn scoped_fact_args_parse_and_bad_ones_are_refused_with_the_form() {
    let parse = parse_scoped_fact_arg;
    assert_eq!(
        parse("model.id=a:b=c;d").unwrap(),
        (None, "model.id".into(), "a:b=c;d".into())
    );
    assert_eq!(
        parse("vllm-compile:gpu.name=NVIDIA H100").unwrap(),
        (
            Some("vllm-compile".into()),
            "gpu.name".into(),
            "NVIDIA H100".into()
        )
    );
    assert_eq!(
        parse("inductor:gpu.name=").unwrap(),
        (Some("inductor".into()), "gpu.name".into(), String::new())
    );
    let refused = |s: &str, wants: &str| {
        let err = parse(s).unwrap_err().to_string();
        assert!(err.contains(wants), "{s}: {err}");
    };
    // A bad KIND: not a cache kind's spelling, or empty.
    refused("VLLM:gpu.name=x", "KIND:NAME=VALUE");
    refused(":gpu.name=x", "KIND:NAME=VALUE");
    refused("vllm compile:gpu.name=x", "KIND:NAME=VALUE");
    // An empty name, plain or after KIND:.
    refused("=x", "the fact name is empty");
    refused("inductor:=x", "the fact name is empty");
    // No '=' at all.
    refused(
        "inductor:gpu.name",
        "expected NAME=VALUE or KIND:NAME=VALUE",
    );
    // A name never holds ':' (so KIND: is never part of one), nor whitespace.
    refused("a:b:c=x", "holds no ':'");
    refused("gpu name=x", "holds no ':'");
    // `policy test --fact` takes plain facts only.
    assert!(parse_fact_arg("inductor:gpu.name=x").is_err());
    assert_eq!(
        parse_fact_arg("gpu.name=x").unwrap(),
        ("gpu.name".into(), "x".into())
    );
}

#[test]
fn per_cache_facts_parse_from_the_config_and_layer_by_precedence() {
    let text = r#"
[facts]
"model.id" = "global"
"gpu.cc" = "8.0"

[[cache]]
kind = "vllm-compile"
root = "/v"
facts = { "model.id" = "vllm-model", "gpu.name" = "placeholder" }

[[cache]]
kind = "inductor"
root = "/i"
"#;
    let mut config = Config::parse(text, Path::new("x.toml")).unwrap();
    assert_eq!(config.caches[0].facts["gpu.name"], "placeholder");
    assert!(config.caches[1].facts.is_empty());
    config.flag_facts = parse_fact_list("gpu.cc=9.0;vllm-compile:model.id=flag-model").unwrap();
    config.validate().unwrap();
    let overrides = config.fact_overrides();
    let set = |kind: Option<&str>| -> BTreeMap<String, String> {
        overrides
            .applied(kind)
            .into_iter()
            .map(|(k, o)| (k, o.value))
            .collect()
    };
    // gathered < [facts] < [[cache]] facts < --fact NAME=VALUE < --fact KIND:NAME=VALUE.
    assert_eq!(
        set(Some("vllm-compile")),
        BTreeMap::from([
            ("gpu.cc".into(), "9.0".into()),
            ("gpu.name".into(), "placeholder".into()),
            ("model.id".into(), "flag-model".into()),
        ])
    );
    // The other cache sees none of vllm-compile's own overrides.
    assert_eq!(
        set(Some("inductor")),
        BTreeMap::from([
            ("gpu.cc".into(), "9.0".into()),
            ("model.id".into(), "global".into()),
        ])
    );
    assert_eq!(set(None), set(Some("inductor")));
    // Its report names only what its own overrides decided, and where they came from.
    let own = overrides.own("vllm-compile");
    assert_eq!(own.keys().collect::<Vec<_>>(), ["gpu.name", "model.id"]);
    assert_eq!(
        own["gpu.name"].origin,
        "config [[cache]] vllm-compile facts"
    );
    assert_eq!(
        own["model.id"].origin,
        "--fact vllm-compile:NAME / JITSHIP_FACTS"
    );
    assert!(overrides.own("inductor").is_empty());
    // A global --fact beats a [[cache]] fact: then it is no override of the cache's own.
    config.flag_facts = parse_fact_list("gpu.name=global-flag").unwrap();
    let overrides = config.fact_overrides();
    assert_eq!(
        overrides.applied(Some("vllm-compile"))["gpu.name"].value,
        "global-flag"
    );
    assert!(!overrides.own("vllm-compile").contains_key("gpu.name"));
}

#[test]
fn per_cache_facts_are_refused_for_a_kind_not_configured_or_a_bad_name() {
    let mut config = Config::parse(
        "[[cache]]\nkind = \"inductor\"\n[[cache]]\nkind = \"triton\"\n",
        Path::new("x.toml"),
    )
    .unwrap();
    config.flag_facts = parse_fact_list("vllm-compile:gpu.name=x").unwrap();
    let err = config.validate().unwrap_err().to_string();
    assert!(
        err.contains("\"vllm-compile\" is not a cache of this command"),
        "{err}"
    );
    assert!(err.contains("inductor, triton"), "{err}");
    config.caches.clear();
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("no cache is configured"), "{err}");

    // In the file: names are checked like the command line's; unknown fields stay refused.
    let err = Config::parse(
        "[[cache]]\nkind = \"inductor\"\nfacts = { \"a:b\" = \"x\" }\n",
        Path::new("x.toml"),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("[[cache]] facts entry"), "{err}");
    let err = Config::parse("[facts]\n\"\" = \"x\"\n", Path::new("x.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("[facts] entry"), "{err}");
    let err = Config::parse(
        "[[cache]]\nkind = \"inductor\"\nfact = { \"a\" = \"x\" }\n",
        Path::new("x.toml"),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("fact"), "{err}");
    assert!(err.contains("unknown field"), "{err}");
}

#[test]
fn example_config_parses() {
    let path = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/jitship.toml"
    ));
    let config = Config::load(path).unwrap();
    assert!(!config.caches.is_empty());
}

/// The tests crate writes configs with `toml::to_string`; [watch] must survive the round trip.
#[test]
fn default_config_round_trips_through_toml() {
    let mut config = Config::default();
    config.watch.metrics_addr = Some("127.0.0.1:9464".parse().unwrap());
    let text = toml::to_string(&config).unwrap();
    assert_eq!(Config::parse(&text, Path::new("x.toml")).unwrap(), config);
    let text = toml::to_string(&Config::default()).unwrap();
    assert_eq!(
        Config::parse(&text, Path::new("x.toml")).unwrap(),
        Config::default()
    );
}

/// The Kubernetes example embeds a jitship.toml in a ConfigMap; it must stay a valid config.
#[test]
fn kubernetes_example_config_parses() {
    let path = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/kubernetes/configmap.yaml"
    ));
    let yaml = std::fs::read_to_string(path).unwrap();
    let (_, body) = yaml.split_once("jitship.toml: |\n").unwrap();
    let toml: String = body
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let config = Config::parse(&toml, path).unwrap();
    assert_eq!(config.store.backend, Backend::Mooncake);
    assert_eq!(config.watch.metrics_addr.unwrap().port(), 9464);
    assert_eq!(config.trust.effective_mode(), TrustMode::Required);
    config.validate().unwrap();
}

#[test]
fn trust_is_off_until_a_key_is_configured_and_required_needs_a_key() {
    let config = Config::parse("", Path::new("x.toml")).unwrap();
    assert_eq!(config.trust.effective_mode(), TrustMode::Off);
    let config = Config::parse(
        "[trust]\ntrusted_keys = ['ed25519:00']\n",
        Path::new("x.toml"),
    )
    .unwrap();
    assert_eq!(config.trust.effective_mode(), TrustMode::Required);
    // Parsing validates; a config built another way is checked by `validate`.
    let err = match Config::parse("[trust]\nmode = 'required'\n", Path::new("x.toml")) {
        Ok(config) => config.validate().unwrap_err().to_string(),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("jitship key generate"), "{err}");
    let err = Config::parse("[trust]\nmode = 'strict'\n", Path::new("x.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("strict"), "{err}");
}

#[test]
fn unknown_keys_and_bad_values_are_clear_errors() {
    let err = Config::parse("[store]\nbakend = 'local'\n", Path::new("x.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("bakend") && err.contains("x.toml"), "{err}");
    let err = Config::parse("[install]\ndeadline = 'soon'\n", Path::new("x.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("deadline"), "{err}");
    let err = Config::parse("[publish]\npack_size = '1KiB'\n", Path::new("x.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("at least"), "{err}");
    let err = Config::parse("[watch]\nrescan_interval = '0s'\n", Path::new("x.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("busy polling"), "{err}");
    let err = Config::parse("[watch]\nready_url = 'https://x/h'\n", Path::new("x.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("http://"), "{err}");
    let err = Config::parse("[watch]\nsettel = '1s'\n", Path::new("x.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("settel"), "{err}");
    assert!(parse_cache_arg("Tri ton=/x").is_err());
    assert!(parse_cache_arg("triton=").is_err());
    assert!(parse_cache_arg("triton:=/x").is_err());
    assert!(parse_fact_arg("=x").is_err());
    let err = Config::parse("[gather]\ntimeout = '0s'\n", Path::new("x.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("gather.timeout"), "{err}");
    let err = Config::parse("[gather]\npackages = ['torch>=2']\n", Path::new("x.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("torch>=2"), "{err}");
    let err = Config::parse("[policy]\nfuel = 5\n", Path::new("x.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("policy.fuel"), "{err}");
    let err = Config::parse("[policy]\nfule = 5\n", Path::new("x.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("fule"), "{err}");
}

#[test]
fn cache_arg_takes_a_kind_an_optional_policy_and_an_optional_root() {
    let c = parse_cache_arg("triton=/c/triton").unwrap();
    assert_eq!(
        (c.kind.as_str(), c.root.as_path(), c.policy),
        ("triton", Path::new("/c/triton"), None)
    );
    let c = parse_cache_arg("inductor").unwrap();
    assert!(c.root_is_default() && c.policy.is_none());
    let c = parse_cache_arg("kernels:native=/data/k").unwrap();
    assert!(c.uses_native_policy() && c.policy_file().is_none());
    assert_eq!(c.root, Path::new("/data/k"));
    let c = parse_cache_arg("mine:/p/mine.wasm").unwrap();
    assert_eq!(c.policy_file(), Some(Path::new("/p/mine.wasm")));
    assert!(c.root_is_default() && !c.uses_native_policy());
}

/// An unknown kind is refused with the built-in kinds and the nearest one, unless the operator
/// chose a policy module or the native rules; a missing root is left for `roots` to resolve.
#[test]
fn unknown_kinds_are_refused_with_the_builtins_and_the_nearest_name() {
    let parse = |t: &str| Config::parse(t, Path::new("x.toml"));
    for (kind, nearest) in [
        ("vllm", "vllm-compile"),
        ("flashinfer", "flashinfer-jit"),
        ("inducter", "inductor"),
        ("deep_gemm", "deepgemm"),
    ] {
        let err = parse(&format!("[[cache]]\nkind = '{kind}'\nroot = '/c'\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("did you mean {nearest:?}")), "{err}");
        for b in crate::policy::builtin::kinds() {
            assert!(err.contains(b), "{b} is not listed: {err}");
        }
        assert!(
            err.contains("policy = \"native\"") && err.contains(&format!("{kind}:native=ROOT")),
            "{err}"
        );
    }
    let err = parse("[[cache]]\nkind = 'zzzzzzzzzz'\nroot = '/c'\n")
        .unwrap_err()
        .to_string();
    assert!(!err.contains("did you mean"), "{err}");
    let native = parse("[[cache]]\nkind = 'vllm'\nroot = '/c'\npolicy = 'native'\n").unwrap();
    assert!(native.caches[0].uses_native_policy());
    let module = parse("[[cache]]\nkind = 'vllm'\nroot = '/c'\npolicy = '/p/v.wasm'\n").unwrap();
    assert_eq!(module.caches[0].policy_file(), Some(Path::new("/p/v.wasm")));
    let default_root = parse("[[cache]]\nkind = 'inductor'\n").unwrap();
    assert!(default_root.caches[0].root_is_default());
    assert!(!toml::to_string(&default_root).unwrap().contains("root"));
}

#[test]
fn policy_section_and_per_cache_policy_parse() {
    let text = "[policy]\nfuel = 2000000\ndeadline = '250ms'\nmemory = '16 MiB'\ncompile_cache = false\n\n\
                    [[cache]]\nkind = 'triton'\nroot = '/c'\npolicy = '/p/triton.wasm'\n";
    let config = Config::parse(text, Path::new("x.toml")).unwrap();
    assert_eq!(config.policy.fuel, 2_000_000);
    assert_eq!(config.policy.deadline, Duration::from_millis(250));
    assert_eq!(config.policy.memory, ByteSize::mib(16));
    assert!(!config.policy.compile_cache);
    assert_eq!(
        config.caches[0].policy.as_deref(),
        Some(Path::new("/p/triton.wasm"))
    );
}

#[test]
fn gather_settings_parse_beside_the_facts_overrides() {
    let text = "[facts]\n\"model.id\" = \"m\"\n[gather]\npython = \"/venv/bin/python3\"\npackages = [\"xformers\"]\ntimeout = \"2s\"\n";
    let config = Config::parse(text, Path::new("x.toml")).unwrap();
    assert_eq!(config.facts.get("model.id").map(String::as_str), Some("m"));
    assert_eq!(
        config.gather.python.as_deref(),
        Some(Path::new("/venv/bin/python3"))
    );
    assert_eq!(config.gather.packages, vec!["xformers".to_string()]);
    assert_eq!(config.gather.timeout, Duration::from_secs(2));
    assert_eq!(
        config.gather.nvml_library,
        PathBuf::from("libnvidia-ml.so.1")
    );
}

#[test]
fn example_mooncake_section_parses_when_uncommented() {
    let path = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/jitship.toml"
    ));
    let text = std::fs::read_to_string(path).unwrap();
    let mut inside = false;
    let mut out = String::new();
    for line in text.lines() {
        if line == "# [store.mooncake]" {
            inside = true;
        } else if line.trim().is_empty() {
            inside = false;
        }
        let body = line.strip_prefix("# ").unwrap_or(line);
        let setting = body.starts_with('[')
            || body
                .split_once(" = ")
                .is_some_and(|(k, _)| !k.contains(' '));
        out.push_str(if inside && setting { body } else { line });
        out.push('\n');
    }
    let out = out.replace("backend = \"local\"", "backend = \"mooncake\"");
    assert!(
        out.contains("\n[store.mooncake]\n") && out.contains("\nrdma_devices = "),
        "the example has no mooncake section"
    );
    let config = Config::parse(&out, path).unwrap();
    assert_eq!(config.store.backend, Backend::Mooncake);
    assert_eq!(
        config.store.mooncake.library_path().unwrap(),
        PathBuf::from("/opt/mooncake/lib/libmooncake_store.so")
    );
}

#[test]
fn mooncake_section_parses_validates_and_store_arg_selects_it() {
    let text = "[store]\nbackend = 'mooncake'\n[store.mooncake]\nmaster = '10.0.0.5:50051'\nprotocol = 'rdma'\n\
                    rdma_devices = ['mlx5_0', 'mlx5_1']\nreplicas = 2\nsoft_pin = true\nstaging_buffer_size = '128 MiB'\n\
                    call_timeout = '5s'\n";
    let c = Config::parse(text, Path::new("x.toml")).unwrap();
    assert_eq!(c.store.backend, Backend::Mooncake);
    assert_eq!(c.store.mooncake.master, "10.0.0.5:50051");
    assert_eq!(c.store.mooncake.protocol, MooncakeProtocol::Rdma);
    assert_eq!(c.store.mooncake.replicas, 2);
    assert_eq!(c.store.mooncake.call_timeout, Duration::from_secs(5));
    assert_eq!(
        c.store.mooncake.staging_buffers, 4,
        "unset fields take their defaults"
    );

    let bad = |t: &str| {
        Config::parse(
            &format!("[store]\nbackend = 'mooncake'\n[store.mooncake]\n{t}\n"),
            Path::new("x.toml"),
        )
        .unwrap_err()
        .to_string()
    };
    assert!(bad("mastr = 'x:1'").contains("mastr"));
    assert!(bad("master = 'nohost'").contains("HOST:PORT"));
    assert!(bad("master = 'h:0'").contains("HOST:PORT"));
    assert!(bad("protocol = 'udp'").contains("protocol"));
    assert!(bad("replicas = 0").contains("replicas"));
    assert!(bad("staging_buffers = 0").contains("staging_buffers"));
    assert!(bad("call_timeout = '0s'").contains("call_timeout"));
    assert!(bad("metadata_server = 'localhost:8080'").contains("metadata_server"));
    let err = Config::parse(
            "[store]\nbackend = 'mooncake'\n[store.mooncake]\nstaging_buffer_size = '32 MiB'\n[publish]\npack_size = '64 MiB'\n",
            Path::new("x.toml"),
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("pack_size") && err.contains("staging_buffer_size"),
        "{err}"
    );

    let mut store = StoreConfig::default();
    apply_store_arg(&mut store, "mooncake").unwrap();
    assert_eq!(store.backend, Backend::Mooncake);
    assert_eq!(store.mooncake.master, "127.0.0.1:50051");
    apply_store_arg(&mut store, "mooncake:master.svc:6000").unwrap();
    assert_eq!(store.mooncake.master, "master.svc:6000");
    assert!(apply_store_arg(&mut store, "mooncake:").is_err());
    assert!(apply_store_arg(&mut store, "mooncake:host").is_err());
    assert!(apply_store_arg(&mut store, "redis:host:1").is_err());
}

/// The guide's configuration table (docs/guide/configuration.md) names each file setting as
/// `[section] key` (or `[section] key = value`, or a bare `[section]` for a free-form table): every
/// one of them must be a name the parser knows (`deny_unknown_fields` refuses the rest), and every
/// value it shows must parse, so the table cannot drift from `Config` (it once put `path` under
/// `[store]`).
#[test]
fn the_readme_configuration_table_names_only_settings_the_parser_takes() {
    const README: &str = include_str!("../../../docs/guide/configuration.md");
    let table: Vec<&str> = README
        .split("\n## Settings\n")
        .nth(1)
        .expect("docs/guide/configuration.md has a ## Settings section")
        .lines()
        .skip_while(|l| !l.starts_with("| setting |"))
        .take_while(|l| l.starts_with('|'))
        .collect();
    assert!(table.len() > 10, "configuration table not found: {table:?}");
    let mut named = Vec::new();
    for row in &table {
        // Code spans: every odd piece between backticks.
        for span in row.split('`').skip(1).step_by(2) {
            let Some(rest) = span.strip_prefix('[') else {
                continue;
            };
            let (section, rest) = match rest.strip_prefix('[') {
                Some(r) => {
                    let (s, rest) = r.split_once("]]").expect(span);
                    (format!("[[{s}]]"), rest)
                }
                None => {
                    let (s, rest) = rest.split_once(']').expect(span);
                    (format!("[{s}]"), rest)
                }
            };
            let (key, value) = match rest.trim().split_once(" = ") {
                Some((k, v)) => (Some(k.trim()), Some(v.trim())),
                None if rest.trim().is_empty() => (None, None),
                None => (Some(rest.trim()), None),
            };
            // Only `[a.b] key` spans name settings (`[KIND:]NAME=VALUE` is a flag's syntax).
            let name = section.trim_matches(['[', ']']);
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '.' || c == '_')
            {
                continue;
            }
            named.push((span, section, key, value));
        }
    }
    // The settings the table is for, including the one it once got wrong.
    for expected in [
        "[store.local] path",
        "[store] backend",
        "[publish] pack_size",
        "[install] deadline",
        "[trust] mode",
        "[[cache]] kind",
    ] {
        assert!(
            named.iter().any(|(span, ..)| span.starts_with(expected)),
            "the table no longer names {expected}: {named:#?}"
        );
    }
    for (span, section, key, value) in &named {
        let Some(key) = key else {
            // A whole table (`[facts]`, `[[cache]]` entries): it exists (an entry may miss a
            // required key, never be unknown).
            let snippet = format!("{section}\n");
            if let Err(e) = toml::from_str::<Config>(&snippet) {
                let e = e.to_string();
                assert!(
                    !e.contains("unknown field"),
                    "README names {span:?}, which the parser does not know: {e}"
                );
            }
            continue;
        };
        assert!(
            key.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
            "{span:?}: not a [section] key"
        );
        // Any value: a known key fails at worst on the value's type or a missing sibling; an
        // unknown one fails as unknown whatever its value.
        let snippet = format!("{section}\n{key} = {}\n", value.unwrap_or("0"));
        if let Err(e) = toml::from_str::<Config>(&snippet) {
            let e = e.to_string();
            assert!(
                !e.contains("unknown field") && !e.contains("unknown variant"),
                "README names {span:?}, which the parser does not know:\n{snippet}\n{e}"
            );
            assert!(
                value.is_none(),
                "README shows {span:?}, whose value the parser refuses:\n{snippet}\n{e}"
            );
        }
        // A value shown is the default: the file setting it gives what no setting gives.
        if let Some(v) = value {
            let parsed = Config::parse(&snippet, Path::new("README.md"))
                .unwrap_or_else(|e| panic!("README shows {span:?}: {e}"));
            let defaults = Config::parse("", Path::new("README.md")).unwrap();
            assert!(
                parsed == defaults,
                "README shows {span:?} = {v} as the default, but it is not"
            );
        }
    }
    // The check itself catches the old mistake.
    let e = toml::from_str::<Config>("[store]\npath = \"/x\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown field"), "{e}");
}

/// Every environment variable a flag reads (`env = "..."` in the CLI's arguments) and the Mooncake
/// library's variable are in the guide's configuration reference, so a new one cannot go
/// undocumented.
#[test]
fn the_configuration_reference_names_every_environment_variable_the_cli_reads() {
    const PAGE: &str = include_str!("../../../docs/guide/configuration.md");
    const ARGS: [&str; 4] = [
        include_str!("../cli/args.rs"),
        include_str!("../cli/args/worker.rs"),
        include_str!("../cli/args/store.rs"),
        include_str!("../cli/args/policy.rs"),
    ];
    let mut vars: Vec<&str> = ARGS
        .iter()
        .flat_map(|args| args.split("env = \"").skip(1))
        .filter_map(|rest| rest.split_once('"').map(|(name, _)| name))
        .collect();
    vars.push(crate::config::MOONCAKE_LIBRARY_ENV);
    vars.sort_unstable();
    vars.dedup();
    assert!(vars.len() > 20, "{vars:?}");
    let missing: Vec<&&str> = vars
        .iter()
        .filter(|v| !PAGE.contains(&format!("`{v}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/guide/configuration.md does not name {missing:?}"
    );
}
