//! The operator commands through the real CLI (`jitship-e2e` processes): `ls`, `inspect`,
//! `verify`, `pin`, `unpin` and `gc`, in tables and `--json`, with their exit codes and error
//! messages, on the local store and (inside the test cluster) on Mooncake.

use std::process::Output;

use jitship::store::ValueClass;
use jitship_tests::backends::{Backend, Place, cli_backends, remove_retrying};
use jitship_tests::fixtures::triton_tree;
use serde_json::Value;

struct Cli<'a> {
    b: &'a Backend,
    flags: Vec<String>,
}

impl Cli<'_> {
    fn run(&self, args: &[&str]) -> Output {
        let mut cmd = jitship_tests::cli::jitship();
        cmd.arg(args[0])
            .args(&self.flags)
            .args(&args[1..])
            .env("RUST_LOG", "warn");
        cmd.output().expect("run jitship-e2e")
    }

    /// Runs, expects `code`, returns stdout.
    fn expect(&self, args: &[&str], code: i32) -> String {
        let out = self.run(args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(
            out.status.code(),
            Some(code),
            "[{}] jitship {}:\n{stdout}\n{}",
            self.b.name,
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.push("--json");
        let out = self.expect(&a, 0);
        let doc: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        // The envelope (docs/guide/exit-codes.md, "JSON output"): per-item commands list their
        // results, the others have exactly one.
        assert_eq!(doc["schema"], 1, "{doc}");
        assert_eq!(doc["command"], args[0], "{doc}");
        assert_eq!(doc["ok"], true, "{doc}");
        let results = doc["results"].clone();
        match args[0] {
            "verify" | "publish" => results,
            _ => {
                assert_eq!(results.as_array().map(Vec::len), Some(1), "{doc}");
                results[0].clone()
            }
        }
    }
}

fn generations(ls: &Value) -> Vec<Value> {
    ls["compats"][0]["generations"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn run_for(b: &Backend) {
    let cli = Cli {
        b,
        flags: b.cli.clone().unwrap(),
    };
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let cache = format!("kernels:native={}", root.display());
    let publish = [
        "publish",
        "--cache",
        &cache,
        "--fact",
        "test.tag=ops",
        "--pack-size",
        "8 KiB",
        "--json",
    ];
    let mut ids = Vec::new();
    for k in 1..=3 {
        triton_tree(&root, 2 * k, 11);
        let r = cli.json(&publish[..publish.len() - 1]);
        ids.push(r[0]["generation"].as_str().unwrap().to_owned());
    }
    let (g1, g2, g3) = (&ids[0], &ids[1], &ids[2]);

    // ls
    let ls = cli.json(&["ls"]);
    let gens = generations(&ls);
    assert_eq!(gens.len(), 3, "[{}] {ls}", b.name);
    assert_eq!(gens[0]["id"], g3.as_str());
    assert_eq!(gens[0]["is_head"], true);
    assert_eq!(gens[2]["id"], g1.as_str());
    assert_eq!(gens[0]["state"]["file_count"], 6 * 8);
    assert_eq!(ls["compats"][0]["cache_kind"], "kernels");
    let table = cli.expect(&["ls"], 0);
    assert!(
        table.contains("GENERATION") && table.contains(&g3[..12]),
        "{table}"
    );
    assert!(table.contains("head"), "{table}");

    // inspect, by a 12-digit prefix as ls prints it
    let i = cli.json(&["inspect", &g3[..12]]);
    assert_eq!(i["id"], g3.as_str());
    let chain: Vec<&str> = i["parent_chain"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        chain,
        vec![g2.as_str(), g1.as_str()],
        "[{}] parent chain",
        b.name
    );
    assert_eq!(i["facts"]["test.tag"], "ops");
    assert_eq!(i["file_count"], 48);
    assert!(i["producer"]["host"].is_string());
    let text = cli.expect(&["inspect", &g3[..12], "--files"], 0);
    assert!(
        text.contains("parent chain") && text.contains("kernel_5.cubin"),
        "{text}"
    );
    let out = cli.run(&["inspect", "0123456789ab"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("jitship ls"));
    let out = cli.run(&["pin", "xyz"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 8 hex digits"));

    // verify, all generations
    let v = cli.json(&["verify"]);
    assert_eq!(v.as_array().unwrap().len(), 3);
    assert!(v.as_array().unwrap().iter().all(|r| r["ok"] == true), "{v}");

    // pin, dry run, gc
    cli.expect(&["pin", &g2[..16], "--reason", "known good"], 0);
    let ls = cli.json(&["ls"]);
    assert_eq!(generations(&ls)[1]["pinned"], true);
    let dry = cli.json(&["gc", "--dry-run", "--keep", "1", "--grace", "0s"]);
    let verdict = |r: &Value, id: &str| {
        r["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["generation"] == id)
            .map(|d| {
                (
                    d["verdict"].as_str().unwrap().to_owned(),
                    d["reason"].as_str().unwrap().to_owned(),
                )
            })
            .unwrap()
    };
    assert_eq!(verdict(&dry, g1).0, "drop");
    assert_eq!(verdict(&dry, g2), ("keep".into(), "pinned".into()));
    // --now: a dry run as of 30 days from now, so age rules can be tried without waiting; a
    // real gc always decides at the current time.
    let by_age = ["gc", "--dry-run", "--max-age", "7d"];
    assert_eq!(verdict(&cli.json(&by_age), g1).0, "keep");
    let later = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 30 * 86_400)
        .to_string();
    let aged = cli.json(&[&by_age[..], &["--now", &later]].concat());
    assert_eq!(verdict(&aged, g1).0, "drop", "{aged}");
    assert_eq!(verdict(&aged, g2), ("keep".into(), "pinned".into()));
    cli.expect(&["gc", "--max-age", "7d", "--now", &later], 2);
    assert_eq!(dry["heads"].as_array().unwrap().len(), 1);
    assert_eq!(
        generations(&cli.json(&["ls"])).len(),
        3,
        "dry run removed nothing"
    );
    let text = cli.expect(&["gc", "--dry-run", "--keep", "1", "--grace", "0s"], 0);
    assert!(
        text.contains("would remove 1 head records, 1 manifests"),
        "{text}"
    );
    let gc = cli.json(&["gc", "--keep", "1", "--grace", "0s"]);
    assert_eq!(gc["manifests"].as_array().unwrap().len(), 1);
    let gens = generations(&cli.json(&["ls"]));
    let left: Vec<&str> = gens.iter().map(|g| g["id"].as_str().unwrap()).collect();
    assert_eq!(left, vec![g3.as_str(), g2.as_str()], "[{}]", b.name);
    let i = cli.json(&["inspect", g3]);
    assert_eq!(i["parent_chain"][0]["id"], g2.as_str());
    assert!(
        i["parent_chain"][1]["created_at"].is_null(),
        "gen1's manifest is gone: {i}"
    );

    // unpin, gc again
    let text = cli.expect(&["unpin", &g2[..16]], 0);
    assert!(text.contains("unpinned"), "{text}");
    cli.expect(&["gc", "--keep", "1", "--grace", "0s"], 0);
    assert_eq!(generations(&cli.json(&["ls"])).len(), 1);
    // The full id still works once gc removed the generation; unpinning twice is harmless.
    let text = cli.expect(&["unpin", g2], 0);
    assert!(text.contains("was not pinned"), "{text}");

    // verify finds a corrupt file and a missing pack, names them, exits 3
    let s = b.store.as_ref();
    let manifest = jitship::catalog::fetch_manifest(s, &b.layout, &g3.parse().unwrap())
        .unwrap()
        .unwrap();
    let victim = &manifest.files[0];
    let pack = &manifest.packs[victim.chunks[0].pack as usize];
    let key = b.layout.pack(&pack.id);
    let mut bytes = s.get(&key).unwrap().unwrap();
    bytes[victim.chunks[0].offset as usize] ^= 0xff;
    assert!(remove_retrying(s, &key));
    s.put(&key, &bytes, ValueClass::Record).unwrap();
    let lost = manifest
        .packs
        .iter()
        .rev()
        .find(|p| p.id != pack.id)
        .unwrap();
    assert!(remove_retrying(s, &b.layout.pack(&lost.id)));
    let text = cli.expect(&["verify", g3], 3);
    assert!(text.contains(&format!("file {}", victim.path)), "{text}");
    assert!(
        text.contains(&format!("pack {} missing", lost.id)),
        "{text}"
    );
    let v = cli.run(&["verify", g3, "--json"]);
    assert_eq!(v.status.code(), Some(3));
    let v: Value = serde_json::from_slice(&v.stdout).unwrap();
    assert_eq!(v["exit_code"], 3);
    assert_eq!(v["results"][0]["ok"], false);
}

jitship_tests::on_local_and_mooncake! {
    operator_commands_on_every_backend,
    operator_commands_on_every_backend_on_mooncake
        => operator_commands_on_every_backend_on;
}

fn operator_commands_on_every_backend_on(place: Place) {
    for b in cli_backends("operator_commands_on_every_backend", place) {
        run_for(&b);
    }
}
