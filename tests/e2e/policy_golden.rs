//! Golden tests of the built-in policies: the real embedded `.wasm` of every kind, run through
//! the wasm host (`WasmPolicy`) over the fixture tree of its kind (`policy_fixtures`), must answer
//! exactly what `tests/golden/policies/<kind>.snap` records: its info, its key for a full H100
//! worker, the facts without which it refuses (`missing-fact`), the publish/skip decision and
//! reason for every file, and a retention decision.
//!
//! After an intended change, regenerate with `INSTA_UPDATE=always cargo test -p jitship-tests
//! --test e2e -- policy_golden::` and review the diff (`jitship_tests::snapshot`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use jitship::config::PolicyConfig;
use jitship::facts::Facts;
use jitship::policy::host::{Limits, PolicyEngine, WasmPolicy};
use jitship::policy::{
    CachePolicy, GenerationSummary, PolicyError, ReasonCategory, RetentionLimits, Verdict, builtin,
};
use jitship_tests::policy_fixtures;

fn engine() -> Arc<PolicyEngine> {
    PolicyEngine::with_cache_dir(Limits::from_config(&PolicyConfig::default()), None)
        .expect("policy engine")
}

fn load(engine: &Arc<PolicyEngine>, kind: &str) -> WasmPolicy {
    let bytes = builtin::lookup(kind).unwrap_or_else(|| panic!("no built-in policy for {kind}"));
    engine
        .load(bytes, &format!("builtin:{kind}"))
        .unwrap_or_else(|e| panic!("loading {kind}: {e}"))
}

fn facts(pairs: &[(&str, &str)]) -> Facts {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const GENERATIONS: [&str; 6] = ["g6", "g5", "g4", "g3", "g2", "g1"];

/// Generation ids are content hashes; these are the hashes of readable labels.
fn gen_id(label: &str) -> String {
    blake3::hash(label.as_bytes()).to_hex().to_string()
}

fn generations() -> Vec<GenerationSummary> {
    GENERATIONS
        .iter()
        .enumerate()
        .map(|(i, id)| GenerationSummary {
            id: gen_id(id)
                .parse()
                .unwrap_or_else(|e| panic!("generation id {id}: {e}")),
            compat_key: "k".into(),
            created_at: 1_700_000_000 - 3600 * i as u64,
            size_bytes: 1 << 30,
            file_count: 100,
            pinned: *id == "g2",
        })
        .collect()
}

/// What the policy answers on its fixture, as golden text.
fn report(engine: &Arc<PolicyEngine>, kind: &str) -> String {
    let policy = load(engine, kind);
    let mut out = String::new();
    let info = policy.info();
    writeln!(
        out,
        "# golden answers of the built-in `{kind}` policy on tests/src/policy_fixtures.rs"
    )
    .unwrap();
    writeln!(out, "info.name: {}", info.name).unwrap();
    writeln!(out, "info.version: {}", info.version).unwrap();
    writeln!(out, "info.cache_kind: {}", info.cache_kind).unwrap();
    writeln!(out, "info.default_root: {}", info.default_root).unwrap();
    writeln!(out, "info.root_env: {}", info.root_env.join(" ")).unwrap();

    let worker = policy_fixtures::worker_facts();
    match policy.compat_key(&facts(&worker)) {
        Ok(k) => writeln!(out, "key: {k}").unwrap(),
        Err(e) => writeln!(out, "key: ERROR {e:?}").unwrap(),
    }
    let mut refused = Vec::new();
    for (name, _) in &worker {
        let without: Vec<(&str, &str)> =
            worker.iter().copied().filter(|(n, _)| n != name).collect();
        match policy.compat_key(&facts(&without)) {
            Err(PolicyError::MissingFact(f)) if f == *name => refused.push(*name),
            Err(e) => panic!("{kind}: without {name}: unexpected {e:?}"),
            Ok(_) => {}
        }
    }
    refused.sort();
    writeln!(out, "refuses without: {}", refused.join(" ")).unwrap();
    writeln!(
        out,
        "refuses on no facts: {:?}",
        policy.compat_key(&Facts::default()).err()
    )
    .unwrap();

    let dir = tempfile::tempdir().expect("tempdir");
    let root: PathBuf = dir.path().join("root");
    std::fs::create_dir_all(&root).expect("mkdir");
    policy_fixtures::build(kind, &root);
    let entries: Vec<_> = jitship::scan::snapshot(&root)
        .expect("scan")
        .files
        .iter()
        .map(|f| f.entry())
        .collect();
    let selection = policy
        .select(&root, &entries)
        .unwrap_or_else(|e| panic!("{kind}: select: {e}"));
    let decisions = &selection.decisions;
    assert_eq!(decisions.len(), entries.len());
    let abs = root.display().to_string();
    for (e, d) in entries.iter().zip(decisions) {
        let v = match d.verdict {
            Verdict::Publish => "publish",
            Verdict::Skip => "skip   ",
        };
        let traits = match (d.marker, d.embeds_root) {
            (true, true) => " [marker, embeds-root]",
            (true, false) => " [marker]",
            (false, true) => " [embeds-root]",
            (false, false) => "",
        };
        writeln!(
            out,
            "{v} {} | {}: {}{traits}",
            e.path,
            d.category,
            d.detail.replace(&abs, "$ROOT")
        )
        .unwrap();
    }
    match selection.incomplete() {
        None => writeln!(out, "cache: complete").unwrap(),
        Some(why) => writeln!(out, "cache: incomplete: {}", why.replace(&abs, "$ROOT")).unwrap(),
    }
    let limits = RetentionLimits::default();
    let drop = policy
        .retain(&generations(), 1_700_000_000, &limits)
        .unwrap_or_else(|e| panic!("{kind}: retain: {e}"));
    let drop: Vec<String> = drop
        .iter()
        .map(|d| {
            let label = GENERATIONS
                .iter()
                .copied()
                .find(|l| gen_id(l) == d.id.to_string())
                .expect("a known generation");
            format!("{label} ({}: {})", d.category, d.detail)
        })
        .collect();
    writeln!(
        out,
        "retain (6 generations, g2 pinned, no limits) drops: {}",
        drop.join(" ")
    )
    .unwrap();
    out
}

#[test]
fn every_builtin_policy_matches_its_golden_answers() {
    let engine = engine();
    for kind in builtin::kinds() {
        jitship_tests::snapshot::assert_matches("policies", kind, &report(&engine, kind));
    }
}

/// The hard cases are not just recorded but decided the right way, whatever the goldens say.
#[test]
fn hard_cases_are_never_published() {
    let engine = engine();
    for kind in builtin::kinds() {
        let policy = load(&engine, kind);
        let dir = tempfile::tempdir().expect("tempdir");
        policy_fixtures::build(kind, dir.path());
        let entries: Vec<_> = jitship::scan::snapshot(dir.path())
            .expect("scan")
            .files
            .iter()
            .map(|f| f.entry())
            .collect();
        let decisions = policy
            .select(dir.path(), &entries)
            .expect("select")
            .decisions;
        for (e, d) in entries.iter().zip(&decisions) {
            let p = e.path.as_str();
            let hard = p.contains("tmp.pid_")
                || p.contains("/tmp.")
                || p.ends_with(".tmp")
                || p.contains(".staging-")
                || p.starts_with("tmp/")
                || p.contains("/locks/")
                || p.ends_with(".lock")
                || p.starts_with("gpu_p2p_access_cache")
                || p.contains("TRUNCATED")
                || p.contains("FOREIGN")
                || p.contains("OUTSIDEDIR")
                || p.contains("DOTDOT")
                || p.contains("GARBAGE")
                || p.contains("INFLIGHT")
                || p.contains("_CxxBuild/");
            if hard {
                assert_eq!(
                    d.verdict,
                    Verdict::Skip,
                    "{kind}: {p} published ({})",
                    d.detail
                );
                assert_ne!(d.category, ReasonCategory::Complete, "{kind}: {p}");
            }
        }
        assert!(
            decisions.iter().any(|d| d.verdict == Verdict::Publish),
            "{kind}: fixture publishes nothing"
        );
    }
}

#[test]
fn every_policy_crate_is_embedded_and_has_a_fixture() {
    let policies = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
    let mut crates: Vec<String> = std::fs::read_dir(&policies)
        .expect("policies/")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("Cargo.toml").is_file() && e.file_name() != "common")
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    crates.sort();
    let mut kinds: Vec<String> = builtin::kinds().map(String::from).collect();
    kinds.sort();
    assert_eq!(
        crates, kinds,
        "policies/<kind>/ crates and builtin::BUILTINS disagree"
    );
    for k in &kinds {
        let snap = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("golden/policies/{k}.snap"));
        assert!(
            snap.is_file(),
            "no golden answers for {k}: {}",
            snap.display()
        );
    }
}
