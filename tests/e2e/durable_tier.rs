//! A durable tier (`--durable-store local:DIR`) that is complete, with a local directory as the
//! fast tier (a fast tier that loses data is a directory emptied here; on Mooncake it is a master
//! restarted, in `mooncake_drills`):
//!
//! - added to a store that already holds the generation, the durable tier gets every pack the
//!   heads it is given name, though the fast tier had them all (no upload was needed);
//! - `verify` checks each tier on its own and names the one that lacks a pack; `--repair` fills it
//!   from the other; a publish over a parent whose packs the durable tier lost copies them first.

use std::path::PathBuf;
use std::process::Output;

use jitship_tests::fixtures::{digest, files_under, triton_tree};
use jitship_tests::output::{code, json, show, text};
use serde_json::Value;

struct Env {
    tmp: tempfile::TempDir,
}

impl Env {
    fn new() -> Self {
        Self {
            tmp: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.tmp.path().join(p)
    }

    /// `jitship CMD` on the fast tier (`fast/`), with the durable tier (`durable/`) if `durable`,
    /// and the `kernels` cache under `root` if given.
    fn run(&self, cmd: &str, durable: bool, root: Option<&str>, extra: &[&str]) -> Output {
        let mut c = jitship_tests::cli::jitship();
        c.arg(cmd)
            .arg("--store")
            .arg(format!("local:{}", self.path("fast").display()));
        if durable {
            c.arg("--durable-store")
                .arg(format!("local:{}", self.path("durable").display()));
        }
        if let Some(root) = root {
            c.arg("--cache")
                .arg(format!("kernels:native={}", self.path(root).display()))
                .args(["--fact", "test.tag=durable-tier"]);
        }
        c.args(extra).env("RUST_LOG", "warn").env("NO_COLOR", "1");
        c.output().expect("run jitship")
    }

    /// The pack files under `dir`.
    fn packs(&self, dir: &str) -> Vec<PathBuf> {
        files_under(&self.path(dir))
            .into_iter()
            .filter(|p| p.to_string_lossy().contains("/pack/"))
            .collect()
    }
}

/// `verify --json`'s per-tier check of `tier` ("fast" or "durable") for each generation.
fn tier_checks<'a>(doc: &'a Value, tier: &str) -> Vec<&'a Value> {
    doc["results"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["tiers"].as_array().unwrap())
        .filter(|t| t["tier"] == tier)
        .collect()
}

#[test]
fn a_durable_tier_added_to_a_store_that_holds_the_generation_serves_it_once_the_store_is_gone() {
    let env = Env::new();
    triton_tree(&env.path("src"), 3, 9);
    let out = env.run("publish", false, Some("src"), &[]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let fast_packs = env.packs("fast").len();
    assert!(fast_packs > 0);

    // The durable tier is added: the fast tier already holds every pack, so nothing is uploaded,
    // and every pack still lands in the durable tier before its head does.
    let out = env.run("publish", true, Some("src"), &["--json"]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let r = &json(&out)["results"][0];
    assert_eq!(r["outcome"], "published", "{r}");
    assert_eq!(r["packs_uploaded"], 0, "the fast tier held every pack: {r}");
    assert_eq!(
        env.packs("durable").len(),
        fast_packs,
        "every pack is in the durable tier"
    );

    // Each tier on its own: the generation the durable tier announces is whole there. Both
    // publishes may be one generation (manifests of the same tree written within the same second
    // are identical) or two (a second boundary between them, as on a loaded machine): then the
    // first, announced by the fast tier alone, has no manifest in the durable tier (same packs),
    // and only a check of what the durable tier announces must pass.
    let out = env.run("verify", true, None, &["--json"]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let doc = json(&out);
    let durable = tier_checks(&doc, "durable");
    assert!(
        !durable.is_empty()
            && durable
                .iter()
                .filter(|t| !t["heads"].as_array().unwrap().is_empty())
                .all(|t| t["ok"] == true),
        "{doc}"
    );
    assert!(
        durable
            .iter()
            .any(|t| !t["heads"].as_array().unwrap().is_empty() && t["ok"] == true),
        "{doc}"
    );

    // The fast tier is restarted empty: the install is the durable tier's.
    std::fs::remove_dir_all(env.path("fast")).unwrap();
    let out = env.run("install", true, Some("dst"), &["--json"]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let r = &json(&out)["results"][0];
    assert_eq!(r["outcome"], "installed", "{r}");
    assert!(r["tiers"]["durable_hits"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(digest(&env.path("dst")), digest(&env.path("src")));
}

#[test]
fn verify_names_the_tier_that_lacks_a_pack_and_repair_and_publish_fill_it() {
    let env = Env::new();
    triton_tree(&env.path("src"), 3, 9);
    let out = env.run("publish", true, Some("src"), &[]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let out = env.run("verify", true, None, &[]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert!(
        text(&out.stdout).contains("ok in both tiers"),
        "{}",
        show(&out)
    );

    // The durable tier loses a pack.
    let lost = env.packs("durable").remove(0);
    let name = lost.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::remove_file(&lost).unwrap();
    let out = env.run("verify", true, None, &["--json"]);
    assert_eq!(code(&out), 3, "{}", show(&out));
    let doc = json(&out);
    assert_eq!(doc["exit_code"], 3);
    let durable = tier_checks(&doc, "durable");
    assert_eq!(durable[0]["ok"], false, "{doc}");
    assert_eq!(
        durable[0]["problems"][0]["problem"], "pack-missing",
        "{doc}"
    );
    assert!(
        durable[0]["problems"][0]["pack"]
            .as_str()
            .unwrap()
            .contains(&name),
        "{doc}"
    );
    assert_eq!(tier_checks(&doc, "fast")[0]["ok"], true, "{doc}");
    let out = env.run("verify", true, None, &[]);
    assert_eq!(code(&out), 3);
    let said = text(&out.stdout);
    assert!(
        said.contains("durable tier (local:") && said.contains(&format!("pack {name} missing")),
        "{said}"
    );

    // --repair copies it from the fast tier, checked.
    let out = env.run("verify", true, None, &["--repair", "--json"]);
    assert_eq!(code(&out), 3, "it reports what it found: {}", show(&out));
    let doc = json(&out);
    let filled = &tier_checks(&doc, "durable")[0]["filled"];
    assert!(
        filled
            .as_array()
            .is_some_and(|f| f.iter().any(|k| k.as_str().unwrap().ends_with(&name))),
        "{doc}"
    );
    assert!(lost.exists());
    let out = env.run("verify", true, None, &[]);
    assert_eq!(code(&out), 0, "{}", show(&out));

    // A publish over a parent whose pack the durable tier lost copies it before its head.
    std::fs::remove_file(&lost).unwrap();
    triton_tree(&env.path("src/grown"), 2, 10);
    let out = env.run("publish", true, Some("src"), &["--json"]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert_eq!(json(&out)["results"][0]["outcome"], "published");
    assert!(
        lost.exists(),
        "the parent's pack is back in the durable tier"
    );
    let out = env.run("verify", true, None, &[]);
    assert_eq!(code(&out), 0, "{}", show(&out));

    // And the fast tier gone: the newest generation installs from the durable tier alone.
    std::fs::remove_dir_all(env.path("fast")).unwrap();
    let out = env.run("install", true, Some("dst"), &[]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert_eq!(digest(&env.path("dst")), digest(&env.path("src")));
}

/// A durable tier added to a store that already holds a generation, filled by `verify --repair`
/// alone (no publish): packs, manifest, then the head, so an install finds it there once the fast
/// tier is gone.
#[test]
fn verify_repair_fills_a_durable_tier_added_later_with_the_whole_generation() {
    let env = Env::new();
    triton_tree(&env.path("src"), 2, 7);
    let out = env.run("publish", false, Some("src"), &[]);
    assert_eq!(code(&out), 0, "{}", show(&out));

    // An empty directory mounted as the durable tier (a command that only reads never creates
    // one). Announced by the fast tier alone: listed as what the durable tier lacks, not a failure.
    std::fs::create_dir(env.path("durable")).unwrap();
    let out = env.run("verify", true, None, &["--json"]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let doc = json(&out);
    let durable = tier_checks(&doc, "durable");
    assert_eq!(durable.len(), 1, "{doc}");
    assert_eq!(durable[0]["heads"], serde_json::json!([]), "{doc}");
    assert_eq!(durable[0]["ok"], false, "{doc}");
    let said = text(&env.run("verify", true, None, &[]).stdout);
    assert!(said.contains("no head here names it"), "{said}");

    let out = env.run("verify", true, None, &["--repair", "--json"]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let doc = json(&out);
    let filled: Vec<&str> = tier_checks(&doc, "durable")[0]["filled"]
        .as_array()
        .unwrap_or_else(|| panic!("nothing filled: {doc}"))
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    let at = |part: &str| filled.iter().position(|k| k.contains(part));
    let (pack, head) = (at("/pack/"), at("/head/"));
    assert!(
        pack.is_some() && head.is_some() && pack < head,
        "packs before the head: {filled:?}"
    );
    let out = env.run("verify", true, None, &["--json"]);
    let doc = json(&out);
    assert_eq!(tier_checks(&doc, "durable")[0]["ok"], true, "{doc}");
    assert_eq!(
        tier_checks(&doc, "durable")[0]["heads"],
        serde_json::json!([1])
    );

    std::fs::remove_dir_all(env.path("fast")).unwrap();
    let out = env.run("install", true, Some("dst"), &[]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert_eq!(digest(&env.path("dst")), digest(&env.path("src")));
}
