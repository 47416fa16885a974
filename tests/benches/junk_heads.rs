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
//!
//! On Mooncake (no listing: readers find heads by probing), inside the test cluster, with a
//! segment that holds a million records:
//! `JITSHIP_BENCH_JUNK_STORE=mooncake JITSHIP_CLUSTER_SEGMENT_MB=4096 tests/cluster/cluster.sh run
//! -- cargo bench -p jitship-tests --bench junk_heads`. The junk is put through the client in
//! batches, as a store writer would.

use std::sync::Arc;
use std::time::{Duration, Instant};

use jitship::catalog::{self, MAX_SEQ};
use jitship::config::TrustMode;
use jitship::install::{InstallOutcome, InstallReport};
use jitship::publish::PublishReport;
use jitship::store::{LocalStore, MooncakeStore, Store, ValueClass};
use jitship::trust::{PublishTrust, PublisherKey, TrustPolicy};
use jitship_tests::fixtures::triton_tree;
use jitship_tests::harness::{Scenario, published};
use jitship_tests::mooncake::{cluster, unique_prefix};

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
    let on_mooncake = match std::env::var("JITSHIP_BENCH_JUNK_STORE").as_deref() {
        Ok("mooncake") => true,
        Ok("local") | Err(_) => false,
        Ok(other) => panic!("JITSHIP_BENCH_JUNK_STORE: local or mooncake, not {other}"),
    };
    let key = PublisherKey::generate().unwrap();
    for n in counts {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let store: Arc<dyn Store> = if on_mooncake {
            let c = cluster("junk_heads");
            Arc::new(MooncakeStore::connect(&c.config()).unwrap())
        } else {
            Arc::new(LocalStore::open(&dir).unwrap())
        };
        println!("N = {n}: store {}", store.describe());
        let mut s = Scenario::new(store, "kernels");
        if on_mooncake {
            s.layout = jitship::catalog::KeyLayout::new(&unique_prefix("junk-heads")).unwrap();
        }
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
        // On Mooncake, put through the client in batches of 1,024, right above the trusted head.
        let planting = Instant::now();
        if on_mooncake {
            // Right above the trusted head: the junk a probing walk sees (the top of the range
            // is invisible to it, docs/threat-model.md).
            let seqs: Vec<u64> = (base_seq + 1..=base_seq + n).collect();
            for chunk in seqs.chunks(1024) {
                let keys: Vec<String> = chunk.iter().map(|&q| s.layout.head(&c, q)).collect();
                let items: Vec<(&str, &[u8])> =
                    keys.iter().map(|k| (k.as_str(), &b"x"[..])).collect();
                for r in s.store.put_batch(&items, ValueClass::Record) {
                    r.expect("planting a junk head");
                }
            }
        } else {
            let heads_dir = dir.join(s.layout.heads_prefix(&c));
            for seq in MAX_SEQ - n + 1..=MAX_SEQ {
                std::fs::write(heads_dir.join(seq.to_string()), b"x").unwrap();
            }
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
        // Local: the junk sits in the upper half of the range, so the publish clears it and writes
        // just above its base; Mooncake: it writes above the contiguous junk.
        let expected = if on_mooncake {
            base_seq + n + 1
        } else {
            base_seq + 1
        };
        assert_eq!(seq, expected, "where the trusted publish wrote");
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
            "N = {n}: trusted publish over the junk (clearing it on the local store): {clearing:.1?} ({:.1}x), +{clearing_rss} KiB",
            ratio(clearing)
        );
        println!(
            "N = {n}: required install after it: {after:.1?} ({:.1}x), +{after_rss} KiB",
            ratio(after)
        );
    }
}
