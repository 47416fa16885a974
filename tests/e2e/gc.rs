//! Garbage collection on every backend (local, local with listing hidden = Mooncake's code path,
//! and the real Mooncake cluster when present): packs a retained generation references survive and
//! the others go; an install running while gc removes generations completes and verifies; pins,
//! head floors (newest-head discovery without listing after heads were removed), dry runs, and a
//! gc interrupted halfway that the next run finishes. Here: what gc removes and keeps; `concurrent`:
//! gc beside installs, pins, floors, an interrupted gc; `policy`: what the retention policy decides.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use jitship::catalog;
use jitship::catalog::KeyLayout;
use jitship::catalog::now_secs;
use jitship::gc::{self, GcOptions, GcReport, Verdict};
use jitship::generation::{CompatId, ContentHash, GenerationId, HeadRecord, Manifest};
use jitship::install::InstallOutcome;
use jitship::policy::RetentionLimits;
use jitship::policy::native::NativeRules;
use jitship::policy::testing::HookedPolicy;
use jitship::publish::PublishOutcome;
use jitship::store::testing::Hooked;
use jitship::store::{Store, StoreError, ValueClass};
use jitship_tests::backends::{Backend, Place, backends};
use jitship_tests::fixtures::{bytes, digest, triton_tree};
use jitship_tests::mooncake::flow;

mod concurrent;
mod policy;

const PACK: u64 = 16 * 1024;

fn publish(b: &Backend, root: &Path, tag: &str) -> (GenerationId, u64, CompatId) {
    let r = flow::publish(b.store.as_ref(), &b.layout, root, &flow::facts(tag), PACK)
        .unwrap_or_else(|e| panic!("[{}] publish: {e}", b.name));
    match r.outcome {
        PublishOutcome::Published { generation, seq } => (generation, seq, r.compat_id),
        other => panic!("[{}] publish: {other:?}", b.name),
    }
}

/// A generation that does not build on the head (what a publisher writes when the head's manifest
/// is unreadable): published in a scratch namespace, copied over, and made head `seq`.
fn graft(b: &Backend, root: &Path, tag: &str, seq: u64, written_at: u64) -> GenerationId {
    let m = copy_in(b, root, tag, &format!("scratch-{seq}"));
    let generation = m.id();
    let s = b.store.as_ref();
    let head = HeadRecord {
        compat_id: m.compat_id,
        seq,
        generation,
        written_at,
        writer: "graft".into(),
        signature: None,
    };
    assert!(
        !s.exists(&b.layout.head(&m.compat_id, seq)).unwrap(),
        "graft: head {seq} taken"
    );
    s.put(
        &b.layout.head(&m.compat_id, seq),
        &head.encode(),
        ValueClass::Record,
    )
    .unwrap();
    generation
}

/// `root` published in a scratch namespace `scratch` and its manifest and packs copied into
/// `b`'s, with no head: a generation only something else can name.
fn copy_in(b: &Backend, root: &Path, tag: &str, scratch: &str) -> Manifest {
    let m = packs_in(b, root, tag, scratch);
    b.store
        .put(
            &b.layout.generation(&m.id()),
            &m.encode(),
            ValueClass::Record,
        )
        .unwrap();
    m
}

/// `root` published in a scratch namespace `scratch` and only its packs copied into `b`'s: the
/// manifest is the caller's to place.
fn packs_in(b: &Backend, root: &Path, tag: &str, scratch: &str) -> Manifest {
    let scratch = KeyLayout::new(&format!("{}-{scratch}", b.layout.namespace())).unwrap();
    let r = flow::publish(b.store.as_ref(), &scratch, root, &flow::facts(tag), PACK).unwrap();
    let PublishOutcome::Published { generation, .. } = r.outcome else {
        panic!("scratch publish: {:?}", r.outcome)
    };
    let s = b.store.as_ref();
    let m = catalog::fetch_manifest(s, &scratch, &generation)
        .unwrap()
        .unwrap();
    for p in &m.packs {
        let bytes = s.get(&scratch.pack(&p.id)).unwrap().unwrap();
        s.put(&b.layout.pack(&p.id), &bytes, ValueClass::Bulk)
            .unwrap();
    }
    m
}

fn run_gc(store: &dyn Store, layout: &KeyLayout, keep: u32, grace: u64, dry_run: bool) -> GcReport {
    gc_at(store, layout, keep, grace, dry_run, now_secs())
}

/// gc as of `now` (seconds since the epoch): time is injected, never waited for.
fn gc_at(
    store: &dyn Store,
    layout: &KeyLayout,
    keep: u32,
    grace: u64,
    dry_run: bool,
    now: u64,
) -> GcReport {
    let policy = |kind: &str| -> std::sync::Arc<dyn jitship::policy::CachePolicy> {
        std::sync::Arc::new(NativeRules::new(kind))
    };
    gc::collect(
        store,
        layout,
        &policy,
        &GcOptions {
            now,
            grace: Duration::from_secs(grace),
            limits: RetentionLimits {
                max_generations: Some(keep),
                ..RetentionLimits::default()
            },
            dry_run,
            lease_wait: GcOptions::DEFAULT_LEASE_WAIT,
            lease_rounds: GcOptions::DEFAULT_LEASE_ROUNDS,
            trust: Default::default(),
        },
    )
    .unwrap_or_else(|e| panic!("gc: {e}"))
}

fn packs_of(b: &Backend, id: &GenerationId) -> Vec<ContentHash> {
    catalog::fetch_manifest(b.store.as_ref(), &b.layout, id)
        .unwrap()
        .unwrap()
        .packs
        .iter()
        .map(|p| p.id)
        .collect()
}

/// Path -> (content hash, mode): what an install must reproduce (a republished file keeps the
/// mtime it was first published with).
fn content(root: &Path) -> Vec<(String, String, u32)> {
    digest(root)
        .into_iter()
        .map(|(p, (h, mode, _, _))| (p, h, mode))
        .collect()
}

fn has(b: &Backend, key: &str) -> bool {
    b.store.exists(key).unwrap()
}

fn verdict(r: &GcReport, id: &GenerationId) -> (Verdict, String) {
    let d = r
        .decisions
        .iter()
        .find(|d| d.generation == *id)
        .unwrap_or_else(|| panic!("no decision for {id}: {r:#?}"));
    (d.verdict, d.reason.clone())
}

jitship_tests::on_local_and_mooncake! {
    gc_removes_unreferenced_packs_and_keeps_referenced_ones,
    gc_removes_unreferenced_packs_and_keeps_referenced_ones_on_mooncake
        => gc_removes_unreferenced_packs_and_keeps_referenced_ones_on;
}

fn gc_removes_unreferenced_packs_and_keeps_referenced_ones_on(place: Place) {
    for b in backends(
        "gc_removes_unreferenced_packs_and_keeps_referenced_ones",
        place,
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let tag = "gc-packs";
        // gen1: one large file over 2.5 packs; gen2 adds a small file (a pack only gen1 and gen2
        // reference); gen3 (a fresh chain) has the same large file (so it shares at least its two
        // full packs with gen1) and another small file.
        let r1 = tmp.path().join("r1");
        let big = bytes(42, (PACK * 5 / 2) as usize);
        std::fs::create_dir_all(r1.join("big")).unwrap();
        std::fs::write(r1.join("big/model"), &big).unwrap();
        let (g1, _, compat) = publish(&b, &r1, tag);
        std::fs::create_dir_all(r1.join("zz")).unwrap();
        std::fs::write(r1.join("zz/a.bin"), bytes(43, 1000)).unwrap();
        let (g2, s2, _) = publish(&b, &r1, tag);
        let r3 = tmp.path().join("r3");
        std::fs::create_dir_all(r3.join("big")).unwrap();
        std::fs::create_dir_all(r3.join("c")).unwrap();
        std::fs::write(r3.join("big/model"), &big).unwrap();
        std::fs::write(r3.join("c/x.bin"), bytes(44, 500)).unwrap();
        let g3 = graft(&b, &r3, tag, s2 + 1, now_secs());

        let p1 = packs_of(&b, &g1);
        let p2 = packs_of(&b, &g2);
        let p3 = packs_of(&b, &g3);
        let shared: Vec<_> = p1.iter().filter(|p| p3.contains(p)).copied().collect();
        let doomed: Vec<_> = p1
            .iter()
            .chain(&p2)
            .filter(|p| !p3.contains(p))
            .copied()
            .collect();
        assert!(
            shared.len() >= 2,
            "[{}] gen3 shares the full packs of the large file with gen1",
            b.name
        );
        assert!(!doomed.is_empty());
        // An orphan, as a crashed publish leaves it.
        let orphan = ContentHash::of(b"orphan pack");
        b.store
            .put(&b.layout.pack(&orphan), b"orphan bytes", ValueClass::Bulk)
            .unwrap();
        // gc dates keys in whole seconds: it runs as of two seconds from now, so the orphan is
        // old enough without waiting.
        let later = now_secs() + 2;

        // Dry run: says what goes, removes nothing.
        let dry = gc_at(b.store.as_ref(), &b.layout, 1, 0, true, later);
        assert_eq!(verdict(&dry, &g1).0, Verdict::Drop, "[{}]", b.name);
        assert_eq!(verdict(&dry, &g2).0, Verdict::Drop);
        assert_eq!(verdict(&dry, &g3).0, Verdict::Keep);
        for p in &doomed {
            assert!(dry.packs.contains(p), "[{}] dry run lists {p}", b.name);
        }
        for p in p1.iter().chain(&p2).chain(&p3) {
            assert!(
                has(&b, &b.layout.pack(p)),
                "[{}] dry run removed {p}",
                b.name
            );
        }
        assert!(has(&b, &b.layout.generation(&g1)) && has(&b, &b.layout.head(&compat, 1)));

        let report = gc_at(b.store.as_ref(), &b.layout, 1, 0, false, later);
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        for p in &doomed {
            assert!(
                !has(&b, &b.layout.pack(p)),
                "[{}] unreferenced pack {p} survived",
                b.name
            );
        }
        for p in &p3 {
            assert!(
                has(&b, &b.layout.pack(p)),
                "[{}] referenced pack {p} removed",
                b.name
            );
        }
        assert!(report.packs_shared >= 2, "[{}] {report:#?}", b.name);
        for g in [&g1, &g2] {
            assert!(
                !has(&b, &b.layout.generation(g)),
                "[{}] manifest {g} survived",
                b.name
            );
        }
        for seq in 1..=s2 {
            assert!(
                !has(&b, &b.layout.head(&compat, seq)),
                "[{}] head {seq} survived",
                b.name
            );
        }
        // Orphans are found where the store lists keys; without listing they are out of reach.
        assert_eq!(
            has(&b, &b.layout.pack(&orphan)),
            !b.lists,
            "[{}] orphan pack handling",
            b.name
        );

        // The newest head is still found (from the floor when the store cannot list), installs,
        // verifies, and the next publish lands on the next seq.
        let head = catalog::newest_head(b.store.as_ref(), &b.layout, &compat)
            .unwrap()
            .unwrap();
        assert_eq!((head.generation, head.seq), (g3, s2 + 1), "[{}]", b.name);
        let v = jitship::inspect::verify(b.store.as_ref(), &b.layout, &g3).unwrap();
        assert!(v.ok, "[{}] {v:?}", b.name);
        let dst = tmp.path().join("dst");
        let inst = flow::install(
            b.store.clone(),
            &b.layout,
            &dst,
            &flow::facts(tag),
            Duration::from_secs(60),
        );
        assert_eq!(
            inst.outcome,
            InstallOutcome::Installed,
            "[{}] {}",
            b.name,
            inst.detail
        );
        assert!(
            content(&dst) == content(&r3),
            "[{}] installed tree differs",
            b.name
        );
        std::fs::write(r3.join("c/y.bin"), bytes(45, 700)).unwrap();
        let (_, s4, _) = publish(&b, &r3, tag);
        assert_eq!(
            s4,
            s2 + 2,
            "[{}] publish after gc continues the seqs",
            b.name
        );
    }
}

fn run_gc_at(store: &dyn Store, layout: &KeyLayout, keep: u32, grace: u64, now: u64) -> GcReport {
    gc_at(store, layout, keep, grace, false, now)
}

/// Publishes `root` in a scratch namespace, copies its packs over, and makes `bytes_of(manifest)`
/// (the manifest as some other writer would store it) head `seq` under its own id.
fn plant_undecodable(
    b: &Backend,
    root: &Path,
    tag: &str,
    seq: u64,
    bytes_of: impl Fn(&[u8]) -> (GenerationId, Vec<u8>),
) -> (GenerationId, Vec<ContentHash>) {
    let m = packs_in(b, root, tag, &format!("undecodable-{seq}"));
    let s = b.store.as_ref();
    let (id, bytes) = bytes_of(&m.encode());
    s.put(&b.layout.generation(&id), &bytes, ValueClass::Record)
        .unwrap();
    let head = HeadRecord {
        compat_id: m.compat_id,
        seq,
        generation: id,
        written_at: now_secs(),
        writer: "another jitship".into(),
        signature: None,
    };
    s.put(
        &b.layout.head(&m.compat_id, seq),
        &head.encode(),
        ValueClass::Record,
    )
    .unwrap();
    (id, m.packs.iter().map(|p| p.id).collect())
}

jitship_tests::on_local_and_mooncake! {
    /// Issue 11: the newest generation's manifest is corrupt (bytes that do not hash to its id) and
    /// gc runs with no grace at all. Before, every pack it referenced was removed as an orphan. Now
    /// gc fails closed: nothing of that compat id is dropped, no pack at all is removed, and the
    /// report names the generation.
    a_corrupt_kept_manifest_keeps_every_pack_even_with_no_grace,
    a_corrupt_kept_manifest_keeps_every_pack_even_with_no_grace_on_mooncake
        => a_corrupt_kept_manifest_keeps_every_pack_even_with_no_grace_on;
}

fn a_corrupt_kept_manifest_keeps_every_pack_even_with_no_grace_on(place: Place) {
    for b in backends(
        "a_corrupt_kept_manifest_keeps_every_pack_even_with_no_grace",
        place,
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let tag = "gc-corrupt";
        let r1 = tmp.path().join("r1");
        triton_tree(&r1, 6, 1);
        let (g1, s1, _) = publish(&b, &r1, tag);
        let g1_packs = packs_of(&b, &g1);
        let r2 = tmp.path().join("r2");
        triton_tree(&r2, 8, 2);
        let (corrupt, packs) = plant_undecodable(&b, &r2, tag, s1 + 1, |bytes| {
            let id = GenerationId(ContentHash::of(bytes));
            let mut flipped = bytes.to_vec();
            flipped[bytes.len() / 2] ^= 0x20;
            (id, flipped)
        });
        assert!(packs.len() >= 4, "[{}] {} packs", b.name, packs.len());
        // Dry run first: it already names the problem and plans no pack removal.
        let dry = run_gc(b.store.as_ref(), &b.layout, 1, 0, true);
        assert!(dry.packs.is_empty(), "[{}] {:?}", b.name, dry.packs);
        let r = run_gc(b.store.as_ref(), &b.layout, 1, 0, false);
        assert!(
            r.unreadable
                .iter()
                .any(|u| u.contains(&corrupt.to_string())),
            "[{}] {:?}",
            b.name,
            r.unreadable
        );
        assert!(r.packs.is_empty(), "[{}] removed {:?}", b.name, r.packs);
        assert_eq!(verdict(&r, &corrupt).0, Verdict::Keep, "[{}]", b.name);
        assert_eq!(verdict(&r, &g1).0, Verdict::Keep, "[{}]", b.name);
        for p in packs.iter().chain(&g1_packs) {
            assert!(has(&b, &b.layout.pack(p)), "[{}] pack {p} removed", b.name);
        }
        assert!(has(&b, &b.layout.generation(&g1)), "[{}]", b.name);
    }
}

jitship_tests::on_local_and_mooncake! {
    /// Issue 11: the newest generation was written by a newer jitship (format 2, a field this one
    /// does not know), its packs are 2 h old and gc runs with the default grace (1 h). No pack it
    /// references is removed (before: all of them, while the report said "keep").
    a_newer_format_manifest_keeps_its_packs_under_the_default_grace,
    a_newer_format_manifest_keeps_its_packs_under_the_default_grace_on_mooncake
        => a_newer_format_manifest_keeps_its_packs_under_the_default_grace_on;
}

fn a_newer_format_manifest_keeps_its_packs_under_the_default_grace_on(place: Place) {
    for b in backends(
        "a_newer_format_manifest_keeps_its_packs_under_the_default_grace",
        place,
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let tag = "gc-newer";
        let r1 = tmp.path().join("r1");
        triton_tree(&r1, 5, 3);
        let (g1, s1, _) = publish(&b, &r1, tag);
        let r2 = tmp.path().join("r2");
        triton_tree(&r2, 7, 4);
        let (newer, packs) = plant_undecodable(&b, &r2, tag, s1 + 1, |bytes| {
            let text = String::from_utf8(bytes.to_vec()).unwrap();
            let text = text.replacen("\"format\":1", "\"format\":2", 1);
            let text = format!("{},\"signatures\":[]}}", &text[..text.len() - 1]);
            (
                GenerationId(ContentHash::of(text.as_bytes())),
                text.into_bytes(),
            )
        });
        let two_hours_later = now_secs() + 2 * 3600;
        let r = run_gc_at(b.store.as_ref(), &b.layout, 1, 3600, two_hours_later);
        assert!(
            r.unreadable
                .iter()
                .any(|u| u.contains(&newer.to_string()) && u.contains("format 2")),
            "[{}] {:?}",
            b.name,
            r.unreadable
        );
        assert!(r.packs.is_empty(), "[{}] removed {:?}", b.name, r.packs);
        for p in &packs {
            assert!(has(&b, &b.layout.pack(p)), "[{}] pack {p} removed", b.name);
        }
        for p in packs_of(&b, &g1) {
            assert!(has(&b, &b.layout.pack(&p)), "[{}] pack {p} removed", b.name);
        }
        assert!(has(&b, &b.layout.generation(&newer)), "[{}]", b.name);
    }
}

jitship_tests::on_local_and_mooncake! {
    /// The bytes of removed orphan packs (found by listing, so gc had no manifest size for them)
    /// are reported (before: "(0 B)").
    removed_orphan_packs_are_reported_with_their_bytes,
    removed_orphan_packs_are_reported_with_their_bytes_on_mooncake
        => removed_orphan_packs_are_reported_with_their_bytes_on;
}

fn removed_orphan_packs_are_reported_with_their_bytes_on(place: Place) {
    for b in backends("removed_orphan_packs_are_reported_with_their_bytes", place) {
        if !b.lists {
            continue;
        }
        let tmp = tempfile::tempdir().unwrap();
        let r1 = tmp.path().join("r1");
        triton_tree(&r1, 2, 5);
        publish(&b, &r1, "gc-bytes");
        let orphan = ContentHash::of(b"an orphan pack of a crashed publish");
        b.store
            .put(&b.layout.pack(&orphan), &bytes(7, 12_345), ValueClass::Bulk)
            .unwrap();
        let r = run_gc_at(b.store.as_ref(), &b.layout, 5, 3600, now_secs() + 2 * 3600);
        assert_eq!(r.packs, vec![orphan], "[{}]", b.name);
        assert_eq!(r.pack_bytes, 12_345, "[{}]", b.name);
        assert_eq!(r.packs_unknown_size, 0, "[{}]", b.name);
        assert!(!has(&b, &b.layout.pack(&orphan)));
    }
}

jitship_tests::on_local_and_mooncake! {
    /// Issue 40: what lost head races leave (contributions, `docs/concurrent-publishes.md`) goes
    /// once the head above them is older than grace, with the manifests they name and those
    /// manifests' own packs; the contributions at the newest seq, and any within grace, stay.
    spent_contributions_go_after_grace_and_the_newest_seq_keeps_its_own,
    spent_contributions_go_after_grace_and_the_newest_seq_keeps_its_own_on_mooncake
        => spent_contributions_go_after_grace_on;
}

fn spent_contributions_go_after_grace_on(place: Place) {
    for b in backends("spent_contributions", place) {
        let tmp = tempfile::tempdir().unwrap();
        let tag = "contributions";
        let tree = |name: &str, seed: u64| {
            let root = tmp.path().join(name);
            triton_tree(&root, 2, seed);
            root
        };
        let (_, first, compat) = publish(&b, &tree("one", 1), tag);
        let (_, newest, _) = publish(&b, &tree("two", 2), tag);
        // Losers at the first seq and at the newest, each with a pack of its own.
        let contribute = |seq: u64, seed: u64| {
            let m = copy_in(
                &b,
                &tree(&format!("loser-{seed}"), seed),
                tag,
                &format!("loser-{seed}"),
            );
            let record = HeadRecord {
                compat_id: compat,
                seq,
                generation: m.id(),
                written_at: now_secs(),
                writer: "a loser".into(),
                signature: None,
            };
            let slot = catalog::contributions::contribute(b.store.as_ref(), &b.layout, &record)
                .unwrap()
                .expect("a free slot");
            (m, b.layout.contribution(&compat, seq, slot))
        };
        let (spent, spent_key) = contribute(first, 10);
        let (fresh, fresh_key) = contribute(newest, 11);
        let store = b.store.as_ref();

        let r = run_gc(store, &b.layout, 2, 3600, false);
        assert_eq!(r.contributions, 0, "[{}] within grace: {r:?}", b.name);
        assert!(has(&b, &spent_key) && has(&b, &b.layout.generation(&spent.id())));

        let r = gc_at(store, &b.layout, 2, 3600, false, now_secs() + 7200);
        assert_eq!(r.contributions, 1, "[{}] {r:?}", b.name);
        assert!(!has(&b, &spent_key), "[{}] the spent contribution", b.name);
        assert!(
            !has(&b, &b.layout.generation(&spent.id())),
            "[{}] its manifest",
            b.name
        );
        for p in &spent.packs {
            assert!(
                !has(&b, &b.layout.pack(&p.id)),
                "[{}] its pack {}",
                b.name,
                p.id
            );
        }
        assert!(
            has(&b, &fresh_key),
            "[{}] the newest seq's contribution",
            b.name
        );
        // Its manifest and packs are nobody's but the record's: where the store lists and dates
        // keys they are orphans past grace like any crashed publish's; elsewhere they stay.
        if !b.lists {
            assert!(has(&b, &b.layout.generation(&fresh.id())));
            for p in &fresh.packs {
                assert!(
                    has(&b, &b.layout.pack(&p.id)),
                    "[{}] the newest seq's packs",
                    b.name
                );
            }
        }
    }
}
