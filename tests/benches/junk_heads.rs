//! What junk head records cost (issue 39, `docs/threat-model.md`): a store writer puts N one-byte
//! records in the last N seqs of the range, above a trusted chain, on the local store (which
//! lists keys, so every reader sees all of them). For N = 256 and N = 10^6 (JITSHIP_BENCH_JUNK
//! sets the list) it prints, each against the same install with no junk measured in the same run:
//! - `walk`: opening a head walk (listing) and reading down to the newest trusted head;
//! - `install`: a `required` install while the junk is there (it passes over at most 256 records,
//!   then reports a miss);
//! - `clearing publish`: the trusted publish that removes the junk and writes just above its base;
//! - `install after`: the `required` install after it (it takes the new generation).
//!
//! Each with wall time and the process's peak RSS growth. Run:
//! `cargo bench -p jitship-tests --bench junk_heads` (release build; a few minutes for 10^6 on
//! the 2-core VM, most of it planting and clearing the junk).

use std::sync::Arc;
use std::time::{Duration, Instant};

use jitship::catalog::{self, MAX_SEQ};
use jitship::config::TrustMode;
use jitship::install::{InstallOutcome, InstallReport};
use jitship::publish::PublishReport;
use jitship::store::{LocalStore, Store};
use jitship::trust::{PublishTrust, PublisherKey, TrustPolicy};
use jitship_tests::fixtures::triton_tree;
use jitship_tests::harness::{Scenario, published};

fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Resets the peak RSS to the current RSS (Linux: writing 5 to clear_refs).
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn measured<T>(f: impl FnOnce() -> T) -> (T, Duration, u64) {
    reset_peak();
    let before = peak_rss_kib();
    let started = Instant::now();
    let out = f();
    (
        out,
        started.elapsed(),
        peak_rss_kib().saturating_sub(before),
    )
}

fn install(s: &Scenario, root: &std::path::Path, key: &PublisherKey) -> InstallReport {
    s.install_trusting(
        root,
        TrustPolicy::new(TrustMode::Required, &[key.public_key()]),
    )
}

fn publish(s: &Scenario, root: &std::path::Path, key: &PublisherKey) -> PublishReport {
    let trust = TrustPolicy::new(TrustMode::Required, &[key.public_key()]);
    s.publish_trusting(
        root,
        PublishTrust::new(Some(Arc::new(key.clone())), Arc::new(trust)),
    )
    .expect("trusted publish")
}

fn main() {
    let counts: Vec<u64> = std::env::var("JITSHIP_BENCH_JUNK")
        .unwrap_or_else(|_| "256,1000000".into())
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .expect("JITSHIP_BENCH_JUNK: comma-separated counts")
        })
        .collect();
    let key = PublisherKey::generate().unwrap();
    for n in counts {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let store: Arc<dyn Store> = Arc::new(LocalStore::open(&dir).unwrap());
        let mut s = Scenario::new(store, "kernels");
        s.pack_size = 1 << 20;
        let c = s.compat_id();
        let good = tmp.path().join("good");
        triton_tree(&good, 2, 1);
        let (_, base_seq) = published(&publish(&s, &good, &key));
        // Best of three (the first loads the policy and warms the page cache).
        let (mut baseline, mut baseline_rss) = (Duration::MAX, 0);
        for i in 0..3 {
            let (r, d, rss) = measured(|| install(&s, &tmp.path().join(format!("t0-{i}")), &key));
            assert_eq!(r.outcome, InstallOutcome::Installed, "{}", r.detail);
            if d < baseline {
                (baseline, baseline_rss) = (d, rss);
            }
        }

        // Planted as files beside the store's own (a key is a path under the store directory,
        // as the attacker with a shared volume would): a put per record takes a millisecond.
        let planting = Instant::now();
        let heads_dir = dir.join(s.layout.heads_prefix(&c));
        for seq in MAX_SEQ - n + 1..=MAX_SEQ {
            std::fs::write(heads_dir.join(seq.to_string()), b"x").unwrap();
        }
        println!("N = {n}: planted in {:.1?}", planting.elapsed());

        let ((newest, probes), walk, walk_rss) = measured(|| {
            let mut w = catalog::HeadWalk::new(s.store.as_ref(), &s.layout, &c).unwrap();
            let mut read = 0u64;
            while let Some(h) = w.next_head().unwrap() {
                read += 1;
                if h.is_ok() {
                    break;
                }
            }
            (read, w.probes())
        });
        let (r, attacked, attacked_rss) = measured(|| install(&s, &tmp.path().join("t1"), &key));
        let outcome = format!("{:?}", r.outcome);
        triton_tree(&good, 3, 1);
        let (r, clearing, clearing_rss) = measured(|| publish(&s, &good, &key));
        let (g, seq) = published(&r);
        assert_eq!(
            seq,
            base_seq + 1,
            "the clearing publish wrote just above its base"
        );
        let (r, after, after_rss) = measured(|| install(&s, &tmp.path().join("t2"), &key));
        assert_eq!(r.generation, Some(g), "{}", r.detail);

        let ratio = |d: Duration| d.as_secs_f64() / baseline.as_secs_f64();
        println!(
            "N = {n}: install with no junk (baseline): {baseline:.1?}, +{baseline_rss} KiB peak"
        );
        println!(
            "N = {n}: walk to the trusted head: {walk:.1?} ({:.1}x), {newest} records read, {probes} probes, +{walk_rss} KiB",
            ratio(walk)
        );
        println!(
            "N = {n}: required install over the junk: {attacked:.1?} ({:.1}x), outcome {outcome}, +{attacked_rss} KiB",
            ratio(attacked)
        );
        println!(
            "N = {n}: clearing trusted publish: {clearing:.1?} ({:.1}x), +{clearing_rss} KiB",
            ratio(clearing)
        );
        println!(
            "N = {n}: required install after it: {after:.1?} ({:.1}x), +{after_rss} KiB",
            ratio(after)
        );
    }
}
