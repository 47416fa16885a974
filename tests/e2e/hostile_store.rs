//! A store anyone can write to (issue 24): an attacker who can put keys in jitship's namespace but
//! does not hold the signing key. Heads at seq 2^64-1 and far above the newest, corrupt, empty,
//! mislabelled and oversized heads on top, untrusted heads against gc, a signing publisher given
//! no trusted key, and a property test over random hostile store contents next to a trusted
//! publisher. On the local store (with and without listing) and, inside the test cluster, on
//! Mooncake.
//!
//! Every store call here is bounded: each scenario runs on a thread that must answer within
//! `HANG` (a hang fails the test instead of stalling the suite).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use jitship::catalog::{self, MAX_SEQ, contributions};
use jitship::config::TrustMode;
use jitship::generation::{CompatId, GenerationId, HeadRecord};
use jitship::install::{InstallOptions, InstallOutcome, InstallReport, PassReason};
use jitship::publish::{PublishError, PublishOutcome, PublishReport};
use jitship::store::ValueClass;
use jitship::trust::{PublishTrust, PublisherKey, Signer, TrustPolicy};
use jitship_tests::backends::{Backend, Place, backends, remove_retrying};
use jitship_tests::fixtures::triton_tree;
use jitship_tests::harness::{Scenario, published};

/// Longer than any honest publish or install here takes by far.
const HANG: Duration = Duration::from_secs(120);

/// Runs `f` on its own thread and fails the test if it does not answer within `HANG`.
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(HANG)
        .unwrap_or_else(|_| panic!("{what} did not finish within {HANG:?}: it hangs"))
}

fn scenario(b: &Backend) -> Arc<Scenario> {
    let mut s = Scenario::new(b.store.clone(), "kernels");
    s.layout = b.layout.clone();
    s.pack_size = 64 << 10;
    Arc::new(s)
}

fn required(key: &PublisherKey) -> TrustPolicy {
    TrustPolicy::new(TrustMode::Required, &[key.public_key()])
}

/// A publish as the CLI makes it: `PublishTrust::new` (a signing key tightens the trust).
fn publish(
    s: &Arc<Scenario>,
    root: &Path,
    key: Option<&PublisherKey>,
    trust: TrustPolicy,
) -> Result<PublishReport, PublishError> {
    let s = s.clone();
    let root = root.to_owned();
    let key = key.cloned();
    bounded("publish", move || {
        s.publish_trusting(&root, PublishTrust::new(key.map(Arc::new), Arc::new(trust)))
    })
}

fn install(s: &Arc<Scenario>, root: &Path, trust: TrustPolicy) -> InstallReport {
    let s = s.clone();
    let root = root.to_owned();
    bounded("install", move || {
        let opts = InstallOptions {
            trust: Arc::new(trust),
            deadline: Duration::from_secs(60),
            ..InstallOptions::default()
        };
        jitship::install::install(
            s.store.clone(),
            &s.layout,
            s.policy.clone(),
            &root,
            &s.facts,
            &opts,
        )
    })
}

fn put(s: &Scenario, key: &str, bytes: &[u8]) {
    assert!(
        put_hostile(s, key, bytes),
        "{key}: the store refused {bytes:?}"
    );
}

/// Puts what an attacker would; false if the store cannot hold it at all (Mooncake refuses an
/// empty value, so there that attack does not exist).
fn put_hostile(s: &Scenario, key: &str, bytes: &[u8]) -> bool {
    match s.store.put(key, bytes, ValueClass::Record) {
        Ok(()) => true,
        Err(e) if bytes.is_empty() && e.to_string().contains("empty value") => false,
        Err(e) => panic!("{key}: {e}"),
    }
}

/// `head` copied to `seq`, relabelled so it looks valid there (unsigned: the attacker has no key).
fn plant(s: &Scenario, head: &HeadRecord, seq: u64) {
    let mut h = head.clone();
    h.seq = seq;
    h.signature = None;
    put(s, &s.layout.head(&h.compat_id, seq), &h.encode());
}

fn files_of(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    if !root.exists() {
        return out;
    }
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

jitship_tests::on_local_and_mooncake! {
    /// A signing publisher given no trusted key (the signing example of docs/guide/security.md)
    /// never builds on, merges or signs an attacker's generation, and writes a signed head above an
    /// untrusted newest head even with nothing new, so `required` installers move on to it.
    a_signing_publisher_never_signs_an_attackers_files,
    a_signing_publisher_never_signs_an_attackers_files_on_mooncake
        => a_signing_publisher_never_signs_an_attackers_files_on;
}

fn a_signing_publisher_never_signs_an_attackers_files_on(place: Place) {
    let key = PublisherKey::generate().unwrap();
    for b in backends("hostile_signing_publisher", place) {
        let s = scenario(&b);
        let tmp = tempfile::tempdir().unwrap();
        let (good, evil) = (tmp.path().join("good"), tmp.path().join("evil"));
        triton_tree(&good, 2, 1);
        triton_tree(&evil, 1, 666);
        // Trust off, as configured: only a signing key.
        let (g1, _) = published(&publish(&s, &good, Some(&key), TrustPolicy::default()).unwrap());
        let (g_evil, evil_seq) =
            published(&publish(&s, &evil, None, TrustPolicy::default()).unwrap());
        assert_eq!(evil_seq, 2, "[{}]", b.name);

        // Nothing new: still a signed head above the attacker's, holding only its own files.
        let r = publish(&s, &good, Some(&key), TrustPolicy::default()).unwrap();
        let (g2, seq) = published(&r);
        assert_eq!(seq, 3, "[{}] {:?}", b.name, r.outcome);
        assert!(r.merged.is_empty(), "[{}] merged {:?}", b.name, r.merged);
        let m2 = catalog::fetch_manifest(s.store.as_ref(), &s.layout, &g2)
            .unwrap()
            .unwrap();
        assert_eq!(m2.parent, Some(g1), "[{}]", b.name);
        assert!(!m2.merged.contains(&g_evil), "[{}]", b.name);

        // Something new: built on its own generation, never on the attacker's.
        triton_tree(&good, 3, 1);
        let r = publish(&s, &good, Some(&key), TrustPolicy::default()).unwrap();
        let (g3, _) = published(&r);
        let m = catalog::fetch_manifest(s.store.as_ref(), &s.layout, &g3)
            .unwrap()
            .unwrap();
        assert_eq!(m.parent, Some(g2), "[{}]", b.name);
        assert!(!m.merged.contains(&g_evil), "[{}]", b.name);

        let target = tmp.path().join("target");
        let r = install(&s, &target, required(&key));
        assert_eq!(
            r.outcome,
            InstallOutcome::Installed,
            "[{}] {}",
            b.name,
            r.detail
        );
        assert_eq!(r.generation, Some(g3));
        let installed = files_of(&target);
        let evil_files = files_of(&evil);
        assert!(
            installed.keys().all(|p| !evil_files.contains_key(p)),
            "[{}] an attacker's file was installed",
            b.name
        );
        assert_eq!(installed, files_of(&good), "[{}]", b.name);
    }
}

jitship_tests::on_local_and_mooncake! {
    /// Valid-looking unsigned heads at seq 2^64-1 and at newest + 10^7: `required` installs take
    /// the newest trusted generation, a trusted publisher and a default-mode publisher finish,
    /// nothing wraps. Prints what head discovery cost (probes, time) for the closing note.
    heads_at_u64_max_and_far_above_freeze_nothing,
    heads_at_u64_max_and_far_above_freeze_nothing_on_mooncake
        => heads_at_u64_max_and_far_above_freeze_nothing_on;
}

fn heads_at_u64_max_and_far_above_freeze_nothing_on(place: Place) {
    let key = PublisherKey::generate().unwrap();
    for b in backends("hostile_far_heads", place) {
        let s = scenario(&b);
        let c = s.compat_id();
        let tmp = tempfile::tempdir().unwrap();
        let (good, evil) = (tmp.path().join("good"), tmp.path().join("evil"));
        triton_tree(&good, 2, 1);
        triton_tree(&evil, 1, 666);
        let (g1, s1) = published(&publish(&s, &good, Some(&key), required(&key)).unwrap());
        let (_, s_evil) = published(&publish(&s, &evil, None, TrustPolicy::default()).unwrap());
        let evil_head = catalog::read_head(s.store.as_ref(), &s.layout, &c, s_evil)
            .unwrap()
            .unwrap();
        let far = s_evil + 10_000_000;
        plant(&s, &evil_head, u64::MAX);
        plant(&s, &evil_head, far);

        let started = Instant::now();
        let walk = catalog::HeadWalk::new(s.store.as_ref(), &s.layout, &c).unwrap();
        println!(
            "[{}] head discovery with hostile heads at {far} and 2^64-1: newest seq {:?}, {} probes, {:?}",
            b.name,
            walk.newest_seq(),
            walk.probes(),
            started.elapsed()
        );
        assert!(walk.newest_seq().unwrap() <= MAX_SEQ, "[{}]", b.name);

        // `required` install: the trusted generation, with what it passed over.
        let started = Instant::now();
        let r = install(&s, &tmp.path().join("t1"), required(&key));
        println!(
            "[{}] required install: {:?}, {}",
            b.name,
            started.elapsed(),
            r.detail
        );
        assert_eq!(
            r.outcome,
            InstallOutcome::Installed,
            "[{}] {}",
            b.name,
            r.detail
        );
        assert_eq!(r.generation, Some(g1));
        assert!(
            r.passed_over
                .iter()
                .all(|p| p.reason == PassReason::Untrusted && p.seq > s1),
            "[{}] {:?}",
            b.name,
            r.passed_over
        );

        // A trusted publisher finishes and writes above whatever it found; installs take it.
        triton_tree(&good, 3, 1);
        let (g2, s2) = published(&publish(&s, &good, Some(&key), required(&key)).unwrap());
        assert!(s2 > s_evil && s2 <= MAX_SEQ, "[{}] seq {s2}", b.name);
        let r = install(&s, &tmp.path().join("t2"), required(&key));
        assert_eq!(r.generation, Some(g2), "[{}] {}", b.name, r.detail);

        // A default-mode publisher (no key, trust off) finishes too, above the newest it found,
        // and never wraps to a low seq.
        triton_tree(&good, 4, 1);
        let (g3, s3) = published(&publish(&s, &good, None, TrustPolicy::default()).unwrap());
        assert!(s3 > s2 && s3 <= MAX_SEQ, "[{}] seq {s3}", b.name);
        assert!(
            catalog::read_head(s.store.as_ref(), &s.layout, &c, 0)
                .unwrap()
                .is_none()
        );
        let r = install(&s, &tmp.path().join("t3"), TrustPolicy::default());
        assert_eq!(r.generation, Some(g3), "[{}] {}", b.name, r.detail);
        // ...while `required` installs stay on the newest trusted one.
        let r = install(&s, &tmp.path().join("t4"), required(&key));
        assert_eq!(r.generation, Some(g2), "[{}] {}", b.name, r.detail);
    }
}

jitship_tests::on_local_and_mooncake! {
    /// Issue 39: junk records at the top of the seq range (one byte each, 256 and more) and a
    /// valid-looking unsigned head just below the ceiling took a key from its trusted publisher for
    /// good: it passed over them, wrote a fresh chain far below and reported success, and every
    /// `required` install walked down from the top, passed 256 and gave up. Under `required` a
    /// signing publisher now removes what it refuses above its base and writes just above it, so the
    /// next trusted publish is what installs take, however many times the attack is repeated.
    junk_at_the_top_cannot_take_a_key_from_its_trusted_publisher,
    junk_at_the_top_cannot_take_a_key_from_its_trusted_publisher_on_mooncake
        => junk_at_the_top_cannot_take_a_key_from_its_trusted_publisher_on;
}

fn reach_is_high(seq: u64) -> bool {
    seq > MAX_SEQ / 2
}

fn junk_at_the_top_cannot_take_a_key_from_its_trusted_publisher_on(place: Place) {
    let key = PublisherKey::generate().unwrap();
    for b in backends("hostile_top_junk", place) {
        let s = scenario(&b);
        let c = s.compat_id();
        let tmp = tempfile::tempdir().unwrap();
        let good = tmp.path().join("good");
        triton_tree(&good, 2, 1);
        let (_, s1) = published(&publish(&s, &good, Some(&key), required(&key)).unwrap());
        let mut expected_seq = s1;
        for round in 1..=3u64 {
            // The attack: 300 one-byte records right above the trusted head (what a walk without
            // listing finds) and 300 at the ceiling, plus an unsigned head just below it.
            let mut junk: Vec<u64> = (expected_seq + 1..=expected_seq + 300).collect();
            junk.extend(MAX_SEQ - 299..=MAX_SEQ);
            for &seq in &junk {
                put(&s, &s.layout.head(&c, seq), b"x");
            }
            let unsigned = catalog::read_head(s.store.as_ref(), &s.layout, &c, expected_seq)
                .unwrap()
                .unwrap();
            remove_retrying(s.store.as_ref(), &s.layout.head(&c, MAX_SEQ - 1));
            plant(&s, &unsigned, MAX_SEQ - 1);

            triton_tree(&good, 2 + round as usize, 1);
            let started = Instant::now();
            let r = publish(&s, &good, Some(&key), required(&key)).unwrap();
            let (g, seq) = published(&r);
            println!(
                "[{}] round {round}: trusted publish over {} junk heads took {:?}",
                b.name,
                junk.len() + 1,
                started.elapsed()
            );
            // Low in the range (the junk at the ceiling was removed, not written above), and
            // above the junk right above the base on a store without listing (which never sees
            // the ceiling), or just above the base on one that lists (which removed it all).
            assert!(!reach_is_high(seq), "[{}] round {round}: seq {seq}", b.name);
            if b.store.capabilities().listing {
                assert_eq!(seq, expected_seq + 1, "[{}] round {round}", b.name);
            }
            expected_seq = seq;
            let r = install(&s, &tmp.path().join(format!("t{round}")), required(&key));
            assert_eq!(
                (r.outcome, r.generation),
                (InstallOutcome::Installed, Some(g)),
                "[{}] round {round}: {}",
                b.name,
                r.detail
            );
            assert!(r.passed_over.is_empty(), "[{}] {:?}", b.name, r.passed_over);
            assert_eq!(
                files_of(&tmp.path().join(format!("t{round}"))),
                files_of(&good)
            );
        }
    }
}

/// Issue 39: a publisher that cannot make its head the one installs reach (no signing key, and
/// junk at the ceiling it may not remove) says so instead of reporting success.
#[test]
fn a_publish_installs_cannot_reach_is_not_reported_as_success() {
    // Only a store that lists keys sees records at the ceiling; a walk without listing never
    // probes there, so on it the same publish is reachable and succeeds.
    for b in backends("hostile_unreachable", Place::Local) {
        let s = scenario(&b);
        let c = s.compat_id();
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        triton_tree(&root, 2, 1);
        for seq in MAX_SEQ - 299..=MAX_SEQ {
            put(&s, &s.layout.head(&c, seq), b"x");
        }
        let r = publish(&s, &root, None, TrustPolicy::default());
        if b.store.capabilities().listing {
            assert!(
                matches!(r, Err(PublishError::Unreachable { .. })),
                "[{}] {r:?}",
                b.name
            );
            let e = r.unwrap_err().to_string();
            assert!(e.contains("would not reach it"), "{e}");
        } else {
            let (g, _) = published(&r.unwrap());
            let r = install(&s, &tmp.path().join("t"), TrustPolicy::default());
            assert_eq!(r.generation, Some(g), "[{}] {}", b.name, r.detail);
        }
    }
}

jitship_tests::on_local_and_mooncake! {
    /// Corrupt, empty, mislabelled and oversized heads on top: installs fall back with a reason for
    /// each, publish writes above them, gc reports them and still collects.
    bad_heads_on_top_are_passed_over_with_a_reason_and_block_nothing,
    bad_heads_on_top_are_passed_over_with_a_reason_and_block_nothing_on_mooncake
        => bad_heads_on_top_are_passed_over_with_a_reason_and_block_nothing_on;
}

fn bad_heads_on_top_are_passed_over_with_a_reason_and_block_nothing_on(place: Place) {
    for b in backends("hostile_bad_heads", place) {
        let s = scenario(&b);
        let c = s.compat_id();
        let tmp = tempfile::tempdir().unwrap();
        let good = tmp.path().join("good");
        triton_tree(&good, 2, 1);
        let (g1, s1) = published(&s.publish(&good).unwrap());
        let h1 = catalog::read_head(s.store.as_ref(), &s.layout, &c, s1)
            .unwrap()
            .unwrap();
        put(&s, &s.layout.head(&c, s1 + 1), b"{\"compat_id\": garbage");
        // Mooncake cannot hold an empty value: a blank one there keeps the run contiguous.
        if !put_hostile(&s, &s.layout.head(&c, s1 + 2), b"") {
            put(&s, &s.layout.head(&c, s1 + 2), b" ");
        }
        // Another seq's bytes, and another compat id's.
        put(&s, &s.layout.head(&c, s1 + 3), &h1.encode());
        let mut other = h1.clone();
        other.compat_id = CompatId::new("kernels", "another key");
        other.seq = s1 + 4;
        put(&s, &s.layout.head(&c, s1 + 4), &other.encode());
        // 64 MiB (or the most the store takes), far over the head cap.
        let big = (64usize << 20).min(s.store.max_value_size() as usize);
        put(&s, &s.layout.head(&c, s1 + 5), &vec![b' '; big]);

        let rss_before = peak_rss_kib();
        let r = install(&s, &tmp.path().join("t1"), TrustPolicy::default());
        let rss_after = peak_rss_kib();
        assert_eq!(
            r.outcome,
            InstallOutcome::Installed,
            "[{}] {}",
            b.name,
            r.detail
        );
        assert_eq!(r.generation, Some(g1));
        let seqs: Vec<u64> = r.passed_over.iter().map(|p| p.seq).collect();
        assert_eq!(
            seqs,
            (s1 + 1..=s1 + 5).rev().collect::<Vec<_>>(),
            "[{}] {}",
            b.name,
            r.detail
        );
        assert!(
            r.passed_over.iter().all(|p| p.reason == PassReason::Faulty),
            "[{}] {:?}",
            b.name,
            r.passed_over
        );
        for word in ["not a head record", "another compat id or seq", "cap"] {
            assert!(r.detail.contains(word), "[{}] {word}: {}", b.name, r.detail);
        }
        // The oversized head is refused before it is read (a 64 MiB allocation would show).
        assert!(
            rss_after.saturating_sub(rss_before) < 48 << 10,
            "[{}] peak RSS grew by {} KiB",
            b.name,
            rss_after - rss_before
        );

        // Publish writes above them; installs take it at once.
        triton_tree(&good, 3, 1);
        let (g2, s2) = published(&s.publish(&good).unwrap());
        assert_eq!(s2, s1 + 6, "[{}]", b.name);
        let r = install(&s, &tmp.path().join("t2"), TrustPolicy::default());
        assert_eq!(r.generation, Some(g2), "[{}] {}", b.name, r.detail);
        assert!(r.passed_over.is_empty(), "[{}] {:?}", b.name, r.passed_over);

        // gc reports them and still works.
        let report = gc(&s, TrustPolicy::default(), 1);
        assert_eq!(
            report.faulty_heads.len(),
            5,
            "[{}] {:?}",
            b.name,
            report.faulty_heads
        );
        assert!(
            report
                .decisions
                .iter()
                .any(|d| d.generation == g1 && d.verdict == jitship::gc::Verdict::Drop),
            "[{}] {:?}",
            b.name,
            report.decisions
        );
        let r = install(&s, &tmp.path().join("t3"), TrustPolicy::default());
        assert_eq!(r.generation, Some(g2), "[{}] {}", b.name, r.detail);
        for seq in s1 + 1..=s1 + 5 {
            remove_retrying(s.store.as_ref(), &s.layout.head(&c, seq));
        }
    }
}

fn gc(s: &Scenario, trust: TrustPolicy, keep: u32) -> jitship::gc::GcReport {
    try_gc(s, trust, keep, catalog::now_secs() + 7200).unwrap()
}

/// A gc under `trust` keeping `keep` generations, at time `now`, with no grace.
fn try_gc(
    s: &Scenario,
    trust: TrustPolicy,
    keep: u32,
    now: u64,
) -> Result<jitship::gc::GcReport, jitship::gc::GcError> {
    let opts = jitship::gc::GcOptions {
        now,
        grace: Duration::ZERO,
        limits: jitship::policy::RetentionLimits {
            max_generations: Some(keep),
            ..Default::default()
        },
        dry_run: false,
        lease_wait: Duration::from_secs(11),
        lease_rounds: jitship::gc::GcOptions::DEFAULT_LEASE_ROUNDS,
        trust: Arc::new(trust),
    };
    let policy: Arc<dyn jitship::policy::CachePolicy> = s.policy.clone();
    jitship::gc::collect(
        s.store.as_ref(),
        &s.layout,
        &|_: &str| policy.clone(),
        &opts,
    )
}

/// Peak resident set of this process, KiB (`VmHWM`).
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

jitship_tests::on_local_and_mooncake! {
    /// Three unsigned heads above three trusted generations and `gc --keep 3` under `required`:
    /// every trusted generation is kept (the untrusted ones never fill the quota), installs still
    /// take the newest trusted one; once a trusted head lies above them, the untrusted ones are
    /// removed.
    gc_never_drops_trusted_generations_for_untrusted_ones,
    gc_never_drops_trusted_generations_for_untrusted_ones_on_mooncake
        => gc_never_drops_trusted_generations_for_untrusted_ones_on;
}

fn gc_never_drops_trusted_generations_for_untrusted_ones_on(place: Place) {
    let key = PublisherKey::generate().unwrap();
    for b in backends("hostile_gc", place) {
        let s = scenario(&b);
        let tmp = tempfile::tempdir().unwrap();
        let good = tmp.path().join("good");
        let mut trusted = vec![];
        for n in 1..=3 {
            triton_tree(&good, n, 1);
            trusted.push(published(&publish(&s, &good, Some(&key), required(&key)).unwrap()).0);
        }
        let mut untrusted = vec![];
        for n in 1..=3 {
            let evil = tmp.path().join(format!("evil{n}"));
            triton_tree(&evil, 1, 600 + n as u64);
            untrusted.push(published(&publish(&s, &evil, None, TrustPolicy::default()).unwrap()).0);
        }
        let report = gc(&s, required(&key), 3);
        for d in &report.decisions {
            if trusted.contains(&d.generation) {
                assert_eq!(d.verdict, jitship::gc::Verdict::Keep, "[{}] {d:?}", b.name);
            }
        }
        let r = install(&s, &tmp.path().join("t1"), required(&key));
        assert_eq!(
            r.outcome,
            InstallOutcome::Installed,
            "[{}] {}",
            b.name,
            r.detail
        );
        assert_eq!(r.generation, Some(trusted[2]));

        // A trusted head above them: now they are below it and removed.
        triton_tree(&good, 4, 1);
        let (g4, _) = published(&publish(&s, &good, Some(&key), required(&key)).unwrap());
        let report = gc(&s, required(&key), 3);
        for d in &report.decisions {
            if untrusted.contains(&d.generation) {
                assert_eq!(d.verdict, jitship::gc::Verdict::Drop, "[{}] {d:?}", b.name);
            }
        }
        let kept: Vec<_> = report
            .decisions
            .iter()
            .filter(|d| d.verdict == jitship::gc::Verdict::Keep)
            .map(|d| d.generation)
            .collect();
        assert_eq!(kept, vec![g4, trusted[2], trusted[1]], "[{}]", b.name);
        let r = install(&s, &tmp.path().join("t2"), required(&key));
        assert_eq!(r.generation, Some(g4), "[{}] {}", b.name, r.detail);
        assert!(matches!(r.signer, Some(Signer::Trusted { .. })));
    }
}

mod property;
