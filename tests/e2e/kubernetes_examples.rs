//! The Kubernetes examples (`examples/kubernetes/*.yaml`) share caches between pods: every kind
//! they name has a built-in policy, every root they resolve is the one the server writes, and the
//! init container (install) and the sidecar (watch) compute the same compat key for each cache.
//!
//! Each jitship container's settings (its args, its env and envFrom, the ConfigMap files it
//! mounts) go through the real command line (`jitship::cli::Cli`, the container's variables turned
//! into the flags clap reads them as), the real settings resolution (`SettingsArgs::resolve`), the
//! real root resolution (`roots`, with the container's environment) and the real embedded
//! policies, over one fixed set of gathered worker facts: what `gather` finds in the server's image
//! on a pod whose jitship containers see no GPU.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser};
use jitship::cli::{Cli, Command, SettingsArgs};
use jitship::config::Config;
use jitship::facts::{Facts, Gathered, Provenance, Source};
use jitship::policies::{PolicySet, PolicySource};
use jitship::policy::CachePolicy;
use jitship::roots::{self, ProcessEnv, RootOrigin};
use serde::Deserialize;
use serde_norway::Value;

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/kubernetes");

struct Container {
    name: String,
    command: Vec<String>,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    /// mountPath -> the volume's name.
    mounts: Vec<(String, String)>,
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_norway::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| s.iter().map(|x| x.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// Every ConfigMap of the example files: name -> data.
fn config_maps(docs: &[Value]) -> BTreeMap<String, BTreeMap<String, String>> {
    docs.iter()
        .filter(|d| d["kind"].as_str() == Some("ConfigMap"))
        .map(|d| {
            let data = d["data"]
                .as_mapping()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.as_str().unwrap().into(), v.as_str().unwrap().into()))
                .collect();
            (d["metadata"]["name"].as_str().unwrap().to_string(), data)
        })
        .collect()
}

/// The init containers and containers of the Deployment, their environment as Kubernetes builds
/// it: envFrom first, then env, `$(NAME)` in a value replaced by an earlier variable's value
/// (stand-ins for the downward API's `valueFrom`: `pod-0` for the pod name, `10.1.2.3` for the
/// pod IP).
fn containers(pod: &Value, maps: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<Container> {
    let list = |key: &str| pod[key].as_sequence().cloned().unwrap_or_default();
    list("initContainers")
        .into_iter()
        .chain(list("containers"))
        .map(|c| {
            let mut env = BTreeMap::new();
            for from in c["envFrom"].as_sequence().cloned().unwrap_or_default() {
                let name = from["configMapRef"]["name"].as_str().unwrap();
                let data = maps.get(name).unwrap_or_else(|| {
                    panic!("envFrom names ConfigMap {name}, which is not in the examples")
                });
                env.extend(data.clone());
            }
            for e in c["env"].as_sequence().cloned().unwrap_or_default() {
                let value = match (e["value"].as_str(), e["valueFrom"].is_null()) {
                    (Some(v), _) => {
                        env.iter()
                            .fold(v.to_string(), |v, (name, value): (&String, &String)| {
                                v.replace(&format!("$({name})"), value)
                            })
                    }
                    (None, false) if e["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP" => {
                        "10.1.2.3".to_string()
                    }
                    (None, false) => "pod-0".to_string(),
                    (None, true) => String::new(),
                };
                env.insert(e["name"].as_str().unwrap().to_string(), value);
            }
            let mounts = c["volumeMounts"]
                .as_sequence()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|m| {
                    let path = m["mountPath"].as_str().unwrap().to_string();
                    (path, m["name"].as_str().unwrap().to_string())
                })
                .collect();
            Container {
                name: c["name"].as_str().unwrap().to_string(),
                command: strings(&c["command"]),
                args: strings(&c["args"]),
                env,
                mounts,
            }
        })
        .collect()
}

/// What `gather` finds in the server's image when no GPU is visible: the interpreter and its
/// packages, the CUDA toolkit; the GPU and driver facts are missing.
fn worker_facts() -> Gathered {
    let found = [
        ("python.version", "3.12.3"),
        ("python.executable", "/usr/bin/python3"),
        (
            "python.site_packages",
            "/usr/local/lib/python3.12/dist-packages",
        ),
        ("pkg.torch", "2.15.0+cu132"),
        ("pkg.triton", "3.9.0"),
        ("pkg.vllm", "0.34.0"),
        ("pkg.sglang", "0.5.23"),
        ("pkg.flashinfer_python", "0.7.4"),
        ("pkg.deep_gemm", "2.6.1"),
        ("cuda.runtime", "13.2"),
        ("cuda.nvcc", "13.2"),
        ("cuda.home", "/usr/local/cuda"),
        ("os.arch", "x86_64"),
        ("host.name", "pod-0"),
        // TorchInductor's CPU facts (crates/facts/src/cpu.rs): the node's, the same for both
        // containers of the pod.
        ("python.include", "/usr/include/python3.12"),
        ("cpu.isa", "avx512"),
        ("cpu.flags_digest", "b3:0c1d2e3f"),
        ("cpu.threads", "32"),
        ("cxx.identity", "b3:9a8b7c6d"),
        ("inductor.env_digest", "b3:af1349b9"),
    ];
    let mut g = Gathered::default();
    for (name, value) in found {
        g.facts.set(name, value);
        g.sources.insert(
            name.into(),
            Provenance {
                source: Source::Python,
                detail: "worker image".into(),
            },
        );
    }
    for name in ["gpu.name", "gpu.count", "gpu.cc", "driver.version"] {
        g.missing.insert(name.into(), "no GPU visible".into());
    }
    g
}

/// The container's settings through the real command line: each variable a flag of its
/// subcommand reads (`JITSHIP_CACHES`, `JITSHIP_FACTS`, `JITSHIP_PYTHON`, ...) becomes that flag,
/// unless the args give the flag (which wins, as in clap); ConfigMap files are read from `files`.
fn settings(c: &Container, files: &BTreeMap<String, PathBuf>) -> SettingsArgs {
    match command(c, files) {
        Command::Install(a) => a.settings,
        Command::Watch(a) => a.settings,
        _ => panic!("{}: neither install nor watch", c.name),
    }
}

/// The container's command line as the real CLI parses it (see [`settings`]).
fn command(c: &Container, files: &BTreeMap<String, PathBuf>) -> Command {
    let sub = Cli::command()
        .find_subcommand(&c.args[0])
        .unwrap_or_else(|| panic!("{}: no jitship subcommand {:?}", c.name, c.args[0]))
        .clone();
    let mut argv = vec!["jitship".to_string()];
    argv.extend(c.args.iter().cloned());
    for arg in sub.get_arguments() {
        let (Some(var), Some(long)) = (arg.get_env(), arg.get_long()) else {
            continue;
        };
        let Some(value) = c.env.get(var.to_str().unwrap()) else {
            continue;
        };
        let flag = format!("--{long}");
        if c.args
            .iter()
            .any(|a| *a == flag || a.starts_with(&format!("{flag}=")))
        {
            continue;
        }
        let value = files
            .get(value)
            .map_or_else(|| value.clone(), |p| p.display().to_string());
        if arg.get_action().takes_values() {
            argv.push(format!("{flag}={value}"));
        } else if value == "true" || value == "1" {
            argv.push(flag);
        }
    }
    Cli::try_parse_from(&argv)
        .unwrap_or_else(|e| panic!("{}: {argv:?} does not parse: {e}", c.name))
        .command
}

/// What one jitship container computes for each of its caches: (root, compat key).
struct Rendered {
    config: Config,
    policies: PolicySet,
    /// Each cache's own facts, by kind (its overrides apply to it only).
    facts: BTreeMap<String, Facts>,
    roots: BTreeMap<String, (PathBuf, RootOrigin)>,
}

fn render(c: &Container, files: &BTreeMap<String, PathBuf>, worker: &Gathered) -> Rendered {
    let mut config = settings(c, files)
        .resolve()
        .unwrap_or_else(|e| panic!("{}: {e:#}", c.name));
    config.policy.compile_cache = false;
    let policies = PolicySet::from_config(&config).unwrap();
    let env = ProcessEnv::new(c.env.clone(), Some(("root".into(), "/root".into())), 0);
    let origins = roots::resolve_cache_roots(&mut config.caches, &policies, &env)
        .unwrap_or_else(|e| panic!("{}: {e}", c.name));
    let roots = config
        .caches
        .iter()
        .zip(origins)
        .map(|(cache, origin)| (cache.kind.clone(), (cache.root.clone(), origin)))
        .collect();
    // As `jitship install` and `jitship watch` do: gathered facts, then for each cache the
    // config's [facts], its [[cache]] facts, --fact / JITSHIP_FACTS and its --fact KIND: values.
    let overrides = config.fact_overrides();
    let facts = config
        .caches
        .iter()
        .map(|cache| {
            let layers = overrides.layers(Some(&cache.kind));
            (cache.kind.clone(), worker.with_overrides(&layers).facts)
        })
        .collect();
    Rendered {
        config,
        policies,
        facts,
        roots,
    }
}

/// Each cache's key from its own facts, as `edit` leaves them.
fn keys(r: &Rendered, edit: impl Fn(&Facts) -> Facts) -> BTreeMap<String, Result<String, String>> {
    r.config
        .caches
        .iter()
        .map(|cache| {
            let facts = edit(&r.facts[&cache.kind]);
            let key = r.policies.policy(&cache.kind).compat_key(&facts);
            (cache.kind.clone(), key.map_err(|e| e.to_string()))
        })
        .collect()
}

/// What the `jitship-setup` init container (the jitship image's busybox) writes into the pod's
/// `/jitship`: the config template mounted at `/etc/jitship-template` with `@POD_IP@` replaced by
/// the pod's IP (10.1.2.3 here, as `containers` gives `status.podIP`), at `/jitship/etc/`. It also
/// refuses trust.yaml's placeholder key (checked in `setup_refuses_the_placeholder_trust_key`).
fn render_setup(containers: &[Container], files: &mut BTreeMap<String, PathBuf>, dir: &Path) {
    let setup = containers
        .iter()
        .find(|c| c.name == "jitship-setup")
        .expect("a jitship-setup init container");
    let script = &setup.args[0];
    assert!(
        script.contains("s/@POD_IP@/$POD_IP/g")
            && script.contains("/etc/jitship-template/jitship.toml > /jitship/etc/jitship.toml"),
        "jitship-setup no longer renders the config as this test does: {script}"
    );
    assert_eq!(
        setup.env.get("POD_IP").map(String::as_str),
        Some("10.1.2.3")
    );
    let template = &files["/etc/jitship-template/jitship.toml"];
    let text = std::fs::read_to_string(template).unwrap();
    assert!(
        text.contains("@POD_IP@"),
        "the config template names no @POD_IP@"
    );
    let rendered = dir.join("rendered-jitship.toml");
    std::fs::write(&rendered, text.replace("@POD_IP@", "10.1.2.3")).unwrap();
    files.insert("/jitship/etc/jitship.toml".into(), rendered);
}

/// The example's documents with configmap.yaml's and trust.yaml's, its Deployment's containers,
/// and every ConfigMap file a container mounts (written to `dir`), by mount path.
fn load_example(file: &str, dir: &Path) -> (Vec<Container>, BTreeMap<String, PathBuf>) {
    let mut docs = documents(&Path::new(EXAMPLES).join("configmap.yaml"));
    docs.extend(documents(&Path::new(EXAMPLES).join("trust.yaml")));
    docs.extend(documents(&Path::new(EXAMPLES).join(file)));
    let maps = config_maps(&docs);
    let deployment = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("Deployment"))
        .unwrap_or_else(|| panic!("{file}: no Deployment"));
    let pod = &deployment["spec"]["template"]["spec"];
    let volume_maps: BTreeMap<String, String> = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|v| {
            Some((
                v["name"].as_str()?.to_string(),
                v["configMap"]["name"].as_str()?.to_string(),
            ))
        })
        .collect();
    let containers = containers(pod, &maps);
    let mut files = BTreeMap::new();
    for c in &containers {
        for (mount, volume) in &c.mounts {
            let Some(map) = volume_maps.get(volume) else {
                continue;
            };
            for (key, text) in &maps[map] {
                let local = dir.join(volume).join(key);
                std::fs::create_dir_all(local.parent().unwrap()).unwrap();
                std::fs::write(&local, text).unwrap();
                files.insert(format!("{mount}/{key}"), local);
            }
        }
    }
    render_setup(&containers, &mut files, dir);
    (containers, files)
}

fn check_example(file: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (containers, files) = load_example(file, dir.path());

    let jitship: Vec<&Container> = containers
        .iter()
        .filter(|c| c.command.first().is_some_and(|p| p.ends_with("/jitship")))
        .collect();
    let install = jitship
        .iter()
        .find(|c| c.args[0] == "install")
        .expect("an install init container");
    let watch = jitship
        .iter()
        .find(|c| c.args[0] == "watch")
        .expect("a watch sidecar");
    let server = containers.iter().find(|c| c.name == "server").unwrap();
    let worker = worker_facts();
    let (init, side) = (
        render(install, &files, &worker),
        render(watch, &files, &worker),
    );

    // The same caches, every one under its built-in policy.
    let kinds: Vec<&str> = init.config.caches.iter().map(|c| c.kind.as_str()).collect();
    assert!(!kinds.is_empty(), "{file}: no caches");
    for status in init
        .policies
        .status()
        .iter()
        .chain(side.policies.status().iter())
    {
        assert!(
            jitship::policy::builtin::kinds().any(|k| k == status.kind),
            "{file}: {} is not a built-in kind",
            status.kind
        );
        assert_eq!(
            status.source,
            PolicySource::Builtin,
            "{file}: {}",
            status.kind
        );
        assert_eq!(status.disabled, None, "{file}: {}", status.kind);
    }

    // Roots: the same in both containers, each from a variable of the server's own environment
    // (never a guessed default), none nested in another.
    assert_eq!(
        init.roots, side.roots,
        "{file}: init and sidecar resolve different roots"
    );
    let server_env = ProcessEnv::new(server.env.clone(), Some(("root".into(), "/root".into())), 0);
    for (kind, (root, origin)) in &init.roots {
        assert!(
            matches!(origin, RootOrigin::Env { .. }),
            "{file}: {kind} root {} comes from {origin}",
            root.display()
        );
        let info = init.policies.get(kind).unwrap().info().clone();
        let (engine_root, _) = roots::resolve(&info, &server_env).unwrap();
        assert_eq!(
            root, &engine_root,
            "{file}: jitship's {kind} root is not the server's"
        );
        for (other, (other_root, _)) in &init.roots {
            assert!(
                kind == other || !root.starts_with(other_root),
                "{file}: {kind} root {} is inside {other}'s",
                root.display()
            );
        }
    }

    // Store nodes reach each jitship client at the pod's IP.
    for r in [&init, &side] {
        assert_eq!(
            r.config.store.mooncake.local_hostname.as_deref(),
            Some("10.1.2.3"),
            "{file}: local_hostname is not the pod IP"
        );
    }

    // One interpreter for every command: JITSHIP_PYTHON reaches install and watch alike.
    assert_eq!(init.config.gather.python, side.config.gather.python);
    assert!(
        init.config.gather.python.is_some(),
        "{file}: no JITSHIP_PYTHON"
    );

    // Keys: computed (no missing fact) and identical for every cache.
    let (init_keys, side_keys) = (keys(&init, Facts::clone), keys(&side, Facts::clone));
    for (kind, key) in &init_keys {
        assert!(key.is_ok(), "{file}: install cannot key {kind}: {key:?}");
    }
    assert_eq!(
        init_keys, side_keys,
        "{file}: install and watch key differently"
    );

    // Every fact JITSHIP_FACTS gives is read by some policy: without it a key changes or is refused.
    let given = jitship::config::parse_fact_list(&watch.env["JITSHIP_FACTS"]).unwrap();
    let names = given
        .global
        .keys()
        .chain(given.per_cache.values().flat_map(|f| f.keys()));
    for name in names {
        let without = |facts: &Facts| -> Facts {
            facts
                .iter()
                .filter(|(k, _)| *k != name.as_str())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_ne!(
            keys(&side, without),
            side_keys,
            "{file}: no policy reads the fact {name} given in JITSHIP_FACTS"
        );
    }

    // /metrics and /healthz bind the pod's IP only (where the kubelet's probe and Prometheus
    // connect), never every address.
    let Command::Watch(watch_args) = command(watch, &files) else {
        unreachable!()
    };
    let metrics = watch_args
        .flags
        .metrics_addr
        .or(side.config.watch.metrics_addr)
        .unwrap_or_else(|| panic!("{file}: the sidecar serves no /healthz"));
    assert_eq!(
        metrics.to_string(),
        "10.1.2.3:9464",
        "{file}: metrics bound to {metrics}, not the pod IP"
    );

    // The check can fail: a sidecar whose facts drift from the init container's keys differently.
    let mut drifted = worker.clone();
    drifted.facts.set("pkg.torch", "2.16.0");
    let drifted = render(watch, &files, &drifted);
    assert_ne!(
        keys(&drifted, Facts::clone),
        init_keys,
        "{file}: a torch upgrade did not change any key"
    );
}

#[test]
fn vllm_example_shares_caches_between_install_and_watch() {
    check_example("vllm.yaml");
}

#[test]
fn sglang_example_shares_caches_between_install_and_watch() {
    check_example("sglang.yaml");
}

/// `jitship run` around the server (run.yaml): the server container's command parses as `run`,
/// and its settings (the same `SettingsArgs` install and watch take) resolve every cache root
/// from the server's own environment under a built-in policy, store nodes reach it at the pod IP,
/// and every cache has a key from what jitship gathers in that container (it has the GPU, so the
/// GPU facts are gathered, not given) and the model facts JITSHIP_FACTS gives.
#[test]
fn run_example_keys_every_cache_from_gathered_facts() {
    let dir = tempfile::tempdir().unwrap();
    let (containers, files) = load_example("run.yaml", dir.path());
    let server = containers.iter().find(|c| c.name == "server").unwrap();
    assert!(server.command[0].ends_with("/jitship") && server.args[0] == "run");
    let dashes = server
        .args
        .iter()
        .position(|a| a == "--")
        .expect("run ... -- SERVER");
    assert_eq!(server.args[dashes + 1..][..2], ["vllm", "serve"]);
    // Settings as install resolves them (run takes install's flags: the same SettingsArgs).
    let mut as_install = Container {
        name: server.name.clone(),
        command: server.command.clone(),
        args: vec!["install".into()],
        env: server.env.clone(),
        mounts: server.mounts.clone(),
    };
    as_install.args.extend(
        server.args[1..dashes]
            .iter()
            .filter(|a| a.starts_with("--config"))
            .cloned(),
    );
    let mut worker = worker_facts();
    for (name, value) in [
        ("gpu.name", "NVIDIA H100 80GB HBM3"),
        ("gpu.count", "1"),
        ("gpu.cc", "9.0"),
        ("driver.version", "570.133.20"),
        ("driver.major", "570"),
    ] {
        worker.missing.remove(name);
        worker.facts.set(name, value);
    }
    let r = render(&as_install, &files, &worker);
    assert_eq!(
        r.config.store.mooncake.local_hostname.as_deref(),
        Some("10.1.2.3")
    );
    let server_env = ProcessEnv::new(server.env.clone(), Some(("root".into(), "/root".into())), 0);
    for (kind, (root, origin)) in &r.roots {
        assert!(matches!(origin, RootOrigin::Env { .. }), "{kind}: {origin}");
        let info = r.policies.get(kind).unwrap().info().clone();
        assert_eq!(
            root,
            &roots::resolve(&info, &server_env).unwrap().0,
            "{kind}"
        );
    }
    for status in r.policies.status() {
        assert_eq!(status.source, PolicySource::Builtin, "{}", status.kind);
    }
    for (kind, key) in keys(&r, Facts::clone) {
        assert!(key.is_ok(), "run.yaml: cannot key {kind}: {key:?}");
    }
    let given = jitship::config::parse_fact_list(&server.env["JITSHIP_FACTS"]).unwrap();
    assert!(
        !given
            .global
            .keys()
            .any(|k| k.starts_with("gpu.") || k.starts_with("driver.")),
        "run.yaml gives GPU facts by hand; jitship gathers them in the server's container"
    );
}

/// trust.yaml's placeholder never passes for a key: jitship-setup's check (a line of `ed25519:` and
/// 64 lowercase hex digits, the form `jitship key generate` prints) refuses it, so a pod whose
/// operator did not paste the key fails in its init container, with a message naming trust.yaml,
/// instead of every install exiting 0 under --best-effort.
#[test]
fn setup_refuses_the_placeholder_trust_key() {
    let is_key = |s: &str| {
        s.trim_end_matches('\n')
            .strip_prefix("ed25519:")
            .is_some_and(|hex| {
                hex.len() == 64
                    && hex
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            })
    };
    let docs = documents(&Path::new(EXAMPLES).join("trust.yaml"));
    let placeholder = config_maps(&docs)["jitship-trust"]["publisher.pub"].clone();
    assert!(!is_key(&placeholder), "{placeholder}");
    assert!(placeholder.contains("trust.yaml"), "{placeholder}");
    let generated = format!("ed25519:{}\n", "0123456789abcdef".repeat(4));
    assert!(is_key(&generated));
    for file in ["vllm.yaml", "sglang.yaml", "run.yaml"] {
        let text = std::fs::read_to_string(Path::new(EXAMPLES).join(file)).unwrap();
        assert!(
            text.contains(
                "busybox grep -Eq '^ed25519:[0-9a-f]{64}$' /etc/jitship-trust/publisher.pub"
            ),
            "{file}: jitship-setup does not check the trust key as this test assumes"
        );
    }
}
