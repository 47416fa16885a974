//! Every built-in policy finishes `select` on a 100,000-entry tree of its kind within the default
//! fuel budget (`[policy] fuel`, 1e10): the real embedded module through the real wasm host, on
//! trees shaped like real caches (`policy_scale::tree`), every entry of which is complete (so the
//! policy does all its work: every group parsed, every shared object checked). A quadratic policy
//! fails here: the Triton one needed 1.47e9 fuel for 20,013 files before it was made linear.
//!
//! Ignored in the fast loop (about 4 minutes on a 2-core machine): the slow step of
//! `tests/run-all.sh` runs it.
//!
//! The wall-clock deadline is raised (this machine may be shared); fuel is the deterministic
//! measure. Prints fuel and time per 1,000 entries; `cargo bench -p jitship-tests --bench policy_host`
//! prints the same figures with a baseline.

use std::sync::Arc;
use std::time::Duration;

use jitship::config::PolicyConfig;
use jitship::policy::host::{Limits, PolicyEngine};
use jitship::policy::{Verdict, builtin};
use jitship_tests::policy_scale;

const ENTRIES: usize = 100_000;

#[test]
#[ignore = "slow: about 4 minutes on a 2-core machine (fourteen 100,000-entry trees through the wasm host); tests/run-all.sh runs it in the slow step with -- --ignored policy_scale::"]
fn every_builtin_selects_a_100k_tree_within_the_default_fuel() {
    let defaults = Limits::from_config(&PolicyConfig::default());
    let limits = Limits {
        deadline: Duration::from_secs(300),
        ..defaults
    };
    let engine: Arc<PolicyEngine> = PolicyEngine::with_cache_dir(limits, None).expect("engine");
    let mut failures = Vec::new();
    for kind in builtin::kinds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("cache");
        std::fs::create_dir_all(&root).unwrap();
        let entries = policy_scale::tree(kind, &root, ENTRIES);
        assert!(entries.len() >= ENTRIES);
        let policy = engine
            .load(builtin::lookup(kind).unwrap(), &format!("builtin:{kind}"))
            .unwrap_or_else(|e| panic!("loading {kind}: {e}"));
        let traced = match policy.select_traced(&root, &entries) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{kind}: {e}"));
                continue;
            }
        };
        let per_k = 1000.0 / entries.len() as f64;
        println!(
            "{kind:<20} {} entries: fuel {:.3e} ({:.0} per 1,000), {:.1} ms ({:.2} ms per 1,000), {} bytes read",
            entries.len(),
            traced.fuel_used as f64,
            traced.fuel_used as f64 * per_k,
            traced.wall.as_secs_f64() * 1e3,
            traced.wall.as_secs_f64() * 1e3 * per_k,
            traced.bytes_read
        );
        match traced.value {
            Err(e) => failures.push(format!("{kind}: {e}")),
            Ok(selection) => {
                assert!(traced.fuel_used <= defaults.fuel);
                let skipped: Vec<String> = entries
                    .iter()
                    .zip(&selection.decisions)
                    .filter(|(_, d)| d.verdict == Verdict::Skip)
                    .take(3)
                    .map(|(e, d)| format!("{} ({}: {})", e.path, d.category, d.detail))
                    .collect();
                // Every entry of these trees is complete: a skip means the policy did not do
                // the work this test is measuring.
                if !skipped.is_empty() {
                    failures.push(format!("{kind}: skipped complete entries: {skipped:?}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
