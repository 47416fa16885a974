//! Garbage collection on every backend (local, local with listing hidden = Mooncake's code path,
//! and the real Mooncake cluster when present): packs a retained generation references survive and
//! the others go; an install running while gc removes generations completes and verifies; pins,
//! head floors (newest-head discovery without listing after heads were removed), dry runs, and a
//! gc interrupted halfway that the next run finishes.

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

jitship_tests::on_local_and_mooncake! {
    an_install_running_during_gc_completes,
    an_install_running_during_gc_completes_on_mooncake
        => an_install_running_during_gc_completes_on;
}

fn an_install_running_during_gc_completes_on(place: Place) {
    for b in backends("an_install_running_during_gc_completes", place) {
        let tmp = tempfile::tempdir().unwrap();
        let tag = "gc-install";
        let root = tmp.path().join("root");
        triton_tree(&root, 6, 1);
        let (g1, _, _) = publish(&b, &root, tag);
        triton_tree(&root, 14, 1);
        let (g2, s2, _) = publish(&b, &root, tag);
        let expected = content(&root);
        let g2_packs = packs_of(&b, &g2);
        assert!(g2_packs.len() >= 10, "enough packs to hold the install");

        // Install gen2 through a store whose pack gets wait at a gate: once the first one is
        // reached the install has chosen gen2, and it reads no pack until gc is done.
        let gate = Arc::new(PackGate::default());
        let (reached, first_pack) = std::sync::mpsc::channel();
        *gate.reached.lock().unwrap() = Some(reached);
        let packs = b.layout.packs_prefix();
        let held: Arc<dyn Store> = Arc::new(Hooked::new(b.store.clone(), gate.clone()).on_get(
            move |inner, gate, key| {
                if key.starts_with(&packs) {
                    gate.wait_until_open();
                }
                inner.get(key)
            },
        ));
        let layout = b.layout.clone();
        let dst = tmp.path().join("dst");
        let dst2 = dst.clone();
        let installer = std::thread::spawn(move || {
            flow::install(
                held,
                &layout,
                &dst2,
                &flow::facts(tag),
                Duration::from_secs(120),
            )
        });
        first_pack
            .recv_timeout(Duration::from_secs(60))
            .expect("the install reads its first pack");

        // Meanwhile a publisher makes a fresh chain the head (nothing of gen2 in it), and gc runs
        // 10 s later on the injected clock with a 2 s grace: gen1 (superseded 10 s before) goes,
        // gen2 (superseded at that instant) stays.
        let later = now_secs() + 10;
        let other = tmp.path().join("other");
        triton_tree(&other, 2, 99);
        let g3 = graft(&b, &other, tag, s2 + 1, later);
        let report = gc_at(b.store.as_ref(), &b.layout, 1, 2, false, later);
        assert!(
            !installer.is_finished(),
            "[{}] the install finished before gc ran",
            b.name
        );
        gate.open();
        assert_eq!(
            verdict(&report, &g1).0,
            Verdict::Drop,
            "[{}] {report:#?}",
            b.name
        );
        let (v2, why) = verdict(&report, &g2);
        assert_eq!(v2, Verdict::Keep, "[{}] {why}", b.name);
        assert!(why.contains("grace"), "{why}");
        assert_eq!(verdict(&report, &g3).0, Verdict::Keep);
        assert!(
            !has(&b, &b.layout.generation(&g1)),
            "[{}] gen1 removed",
            b.name
        );

        let inst = installer.join().unwrap();
        assert_eq!(
            inst.outcome,
            InstallOutcome::Installed,
            "[{}] {}",
            b.name,
            inst.detail
        );
        assert_eq!(inst.generation, Some(g2));
        assert!(
            content(&dst) == expected,
            "[{}] installed tree differs",
            b.name
        );

        // Once the grace has passed, gen2 goes too, with the packs gen3 does not share.
        let report = gc_at(b.store.as_ref(), &b.layout, 1, 0, false, later);
        assert_eq!(verdict(&report, &g2).0, Verdict::Drop);
        let g3_packs = packs_of(&b, &g3);
        for p in &g2_packs {
            assert_eq!(
                has(&b, &b.layout.pack(p)),
                g3_packs.contains(p),
                "[{}] pack {p}",
                b.name
            );
        }
    }
}

/// Where a held install waits: it says when it first got there (`reached`), then waits until
/// the test opens the gate.
#[derive(Debug, Default)]
struct PackGate {
    reached: std::sync::Mutex<Option<std::sync::mpsc::Sender<()>>>,
    open: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
}

impl PackGate {
    fn wait_until_open(&self) {
        if let Some(reached) = self.reached.lock().unwrap().take() {
            let _ = reached.send(());
        }
        let open = self.open.lock().unwrap();
        drop(self.opened.wait_while(open, |open| !*open).unwrap());
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

/// Fails every remove of a manifest: a gc that stops halfway.
fn manifest_removes_fail(inner: Arc<dyn Store>) -> Hooked<Arc<dyn Store>> {
    Hooked::new(inner, ()).on_remove(|inner, (), key| {
        if key.contains("/gen/") {
            return Err(StoreError::Unavailable("injected".into()));
        }
        inner.remove(key)
    })
}

jitship_tests::on_local_and_mooncake! {
    pins_floors_and_an_interrupted_gc,
    pins_floors_and_an_interrupted_gc_on_mooncake
        => pins_floors_and_an_interrupted_gc_on;
}

fn pins_floors_and_an_interrupted_gc_on(place: Place) {
    for b in backends("pins_floors_and_an_interrupted_gc", place) {
        let tmp = tempfile::tempdir().unwrap();
        let tag = "gc-pins";
        let root = tmp.path().join("root");
        let mut gens = Vec::new();
        for k in 1..=4 {
            triton_tree(&root, k, 5);
            gens.push(publish(&b, &root, tag));
        }
        let compat = gens[0].2;
        let s = b.store.as_ref();
        catalog::pin(s, &b.layout, &gens[1].0, Some("test".into())).unwrap();

        let r = run_gc(s, &b.layout, 1, 0, false);
        assert_eq!(
            verdict(&r, &gens[1].0),
            (Verdict::Keep, "pinned".into()),
            "[{}]",
            b.name
        );
        assert_eq!(verdict(&r, &gens[0].0).0, Verdict::Drop);
        assert_eq!(verdict(&r, &gens[2].0).0, Verdict::Drop);
        assert_eq!(
            r.floors,
            vec![(compat, 4)],
            "[{}] floor above the dropped heads",
            b.name
        );
        assert!(!has(&b, &b.layout.head(&compat, 1)) && !has(&b, &b.layout.head(&compat, 3)));
        assert!(
            has(&b, &b.layout.head(&compat, 2)),
            "[{}] pinned head kept",
            b.name
        );
        let head = catalog::newest_head(s, &b.layout, &compat)
            .unwrap()
            .unwrap();
        assert_eq!(head.seq, 4, "[{}]", b.name);
        let older = catalog::older_heads(s, &b.layout, &head, 5).unwrap();
        assert_eq!(
            older.iter().map(|h| h.seq).collect::<Vec<_>>(),
            vec![2],
            "[{}]",
            b.name
        );
        let survey =
            jitship::inspect::survey_compat(s, &b.layout, &compat, &Default::default()).unwrap();
        let ids: Vec<_> = survey.generations.iter().map(|g| g.id).collect();
        assert_eq!(ids, vec![gens[3].0, gens[1].0], "[{}] ls after gc", b.name);

        // Unpinned, it goes; the gc removing it is interrupted after the heads.
        triton_tree(&root, 5, 5);
        let (g5, s5, _) = publish(&b, &root, tag);
        assert_eq!(s5, 5);
        assert!(catalog::unpin(s, &b.layout, &gens[1].0).unwrap());
        let failing = manifest_removes_fail(b.store.clone());
        let r = run_gc(&failing, &b.layout, 1, 0, false);
        assert!(
            !r.errors.is_empty(),
            "[{}] injected failures reported",
            b.name
        );
        assert!(
            has(&b, &b.layout.generation(&gens[1].0)),
            "manifest left by the interruption"
        );
        assert!(
            !has(&b, &b.layout.head(&compat, 2)),
            "head removed before the manifest"
        );
        // Readers see a consistent store meanwhile: the newest head and its generation.
        let head = catalog::newest_head(s, &b.layout, &compat)
            .unwrap()
            .unwrap();
        assert_eq!(head.generation, g5);

        let r = run_gc(s, &b.layout, 1, 0, false);
        assert!(r.errors.is_empty());
        assert!(r.resumed_journal.is_some(), "[{}] {r:#?}", b.name);
        for (g, _, _) in &gens {
            assert!(
                !has(&b, &b.layout.generation(g)),
                "[{}] {g} left behind",
                b.name
            );
        }
        let v = jitship::inspect::verify(s, &b.layout, &g5).unwrap();
        assert!(v.ok, "[{}] {v:?}", b.name);
    }
}

/// Native rules whose retention drops everything it is shown, or fails (`fail`).
fn greedy(kind: &str, fail: bool) -> std::sync::Arc<dyn jitship::policy::CachePolicy> {
    std::sync::Arc::new(HookedPolicy::new(NativeRules::new(kind), fail).on_retain(
        |_, fail, generations, _, _| {
            if *fail {
                return Err(jitship::policy::PolicyError::Internal("boom".into()));
            }
            Ok(generations
                .iter()
                .map(|g| jitship::policy::RetentionDrop {
                    id: g.id,
                    category: jitship::policy::RetentionCategory::Rule,
                    detail: "drops everything".into(),
                })
                .collect())
        },
    ))
}

#[test]
fn the_host_keeps_the_newest_and_pinned_whatever_the_policy_says() {
    let b = jitship_tests::backends::local("policy", true);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let mut gens = Vec::new();
    for k in 1..=3 {
        triton_tree(&root, k, 8);
        gens.push(publish(&b, &root, "greedy").0);
    }
    catalog::pin(b.store.as_ref(), &b.layout, &gens[0], None).unwrap();
    let opts = GcOptions {
        now: now_secs(),
        grace: Duration::ZERO,
        limits: RetentionLimits::default(),
        dry_run: false,
        lease_wait: GcOptions::DEFAULT_LEASE_WAIT,
        lease_rounds: GcOptions::DEFAULT_LEASE_ROUNDS,
        trust: Default::default(),
    };

    // A failing policy disables retention for its kind: everything stays, the error is reported.
    let failing = |kind: &str| greedy(kind, true);
    let r = gc::collect(b.store.as_ref(), &b.layout, &failing, &opts).unwrap();
    assert_eq!(r.policy_errors.len(), 1, "{r:#?}");
    assert!(r.policy_errors[0].contains("boom"));
    assert!(r.decisions.iter().all(|d| d.verdict == Verdict::Keep));
    assert!(r.heads.is_empty() && r.manifests.is_empty());

    // A policy that drops everything: the newest and the pinned one stay.
    let dropping = |kind: &str| greedy(kind, false);
    let r = gc::collect(b.store.as_ref(), &b.layout, &dropping, &opts).unwrap();
    assert_eq!(verdict(&r, &gens[2]).0, Verdict::Keep);
    assert_eq!(verdict(&r, &gens[0]), (Verdict::Keep, "pinned".into()));
    assert_eq!(verdict(&r, &gens[1]).0, Verdict::Drop);
    assert!(has(&b, &b.layout.generation(&gens[0])) && has(&b, &b.layout.generation(&gens[2])));
    assert!(!has(&b, &b.layout.generation(&gens[1])));
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

/// The example third-party policy (examples/retention-policy: `golden-retention`, kind triton,
/// keeps 5 by default), built as `jitship policy build` builds it.
fn golden_retention_module() -> Vec<u8> {
    use jitship::policy::build::{BuildOptions, build_policy_crate};
    let ws = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf();
    let opts = BuildOptions {
        target_dir: Some(ws.join("target/policy-example")),
        quiet: true,
        locked: true,
    };
    build_policy_crate(&ws.join("examples/retention-policy"), &opts)
        .unwrap_or_else(|e| {
            panic!("building examples/retention-policy: {e} (is wasm32-unknown-unknown installed?)")
        })
        .component
}

/// A key published with a third-party policy is decided by that policy or kept whole: gc never
/// runs another rule on it (the native keep-3 would drop 4 of 7).
#[test]
fn a_key_is_decided_by_the_policy_it_was_published_with_or_kept_whole() {
    use jitship::policy::host::{PolicyConfig, PolicyEngine};

    let b = jitship_tests::backends::local("gc-third-party", false);
    let tmp = tempfile::tempdir().unwrap();
    let module = golden_retention_module();
    let engine = PolicyEngine::new(&PolicyConfig {
        compile_cache: false,
        ..PolicyConfig::default()
    })
    .unwrap();
    let policy = engine.load(&module, "golden-retention.wasm").unwrap();
    let digest = policy.digest().to_owned();
    let mut facts = flow::facts("third-party");
    for (k, v) in [
        ("pkg.triton", "3.9.0"),
        ("gpu.arch", "sm_90"),
        ("driver.major", "550"),
        ("os.arch", "x86_64"),
    ] {
        facts.set(k, v);
    }
    let root = tmp.path().join("root");
    let mut gens = Vec::new();
    for k in 1..=7 {
        triton_tree(&root, k, 9);
        let r = jitship::publish::publish(
            b.store.as_ref(),
            &b.layout,
            &policy,
            &root,
            &flow::options(&facts, PACK),
            None,
        )
        .unwrap();
        let PublishOutcome::Published { generation, .. } = r.outcome else {
            panic!("publish: {:?}", r.outcome)
        };
        gens.push(generation);
    }
    // Publish stored the module by its digest (issue 43); without it, the store alone has no
    // such policy either.
    let stored = b.layout.module(&digest.parse().unwrap());
    assert!(has(&b, &stored));
    b.store.remove(&stored).unwrap();
    let live = |b: &Backend| {
        gens.iter()
            .filter(|g| has(b, &b.layout.generation(g)))
            .count()
    };

    let config = tmp.path().join("jitship.toml");
    std::fs::write(
        &config,
        "[[cache]]\nkind = \"inductor\"\n\n[[cache]]\nkind = \"my-kind\"\npolicy = \"native\"\n\n\
         [policy]\ncompile_cache = false\n",
    )
    .unwrap();
    // Exit 4 where a key was kept whole (not decided by retention), 0 where every key was.
    let gc = |extra: &[&str], code: i32| -> serde_json::Value {
        let out = jitship_tests::cli::jitship()
            .arg("gc")
            .args(b.cli.as_ref().unwrap())
            .args(["--grace", "0s", "--json"])
            .args(extra)
            .env("RUST_LOG", "error")
            .env_remove("JITSHIP_CONFIG")
            .env_remove("JITSHIP_CACHES")
            .env_remove("JITSHIP_POLICY_DIR")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(code),
            "gc {extra:?}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        doc["results"][0].clone()
    };
    let kept_whole = |r: &serde_json::Value| {
        let keys = r["policies"].as_array().unwrap();
        assert_eq!(keys.len(), 1, "{r:#}");
        assert_eq!(keys[0]["published_with"]["name"], "golden-retention");
        assert!(keys[0]["decided_by"].is_null(), "{r:#}");
        let why = keys[0]["kept_whole"].as_str().unwrap().to_owned();
        assert!(
            why.contains("golden-retention@0.1.0") && why.contains("--policy-dir"),
            "{why}"
        );
        assert!(r["manifests"].as_array().unwrap().is_empty(), "{r:#}");
        assert!(r["heads"].as_array().unwrap().is_empty(), "{r:#}");
        assert_eq!(
            r["not_decided"],
            serde_json::json!({"keys": 1, "policy_missing": 1, "policy_failed": 0, "unreadable": 0}),
            "{r:#}"
        );
    };

    // The store alone: gc has no such policy; nothing is dropped and the report says why.
    kept_whole(&gc(&[], 4));
    // The text summary counts the key and says why (issue 43: a cron gc that decided nothing
    // does not report success).
    let out = jitship_tests::cli::jitship()
        .arg("gc")
        .args(b.cli.as_ref().unwrap())
        .args(["--dry-run"])
        .env("RUST_LOG", "error")
        .env_remove("JITSHIP_CONFIG")
        .env_remove("JITSHIP_CACHES")
        .env_remove("JITSHIP_POLICY_DIR")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("NOT DECIDED: 1 keys kept whole, not decided by retention: 1 because the policy they were published with is not here"),
        "{text}"
    );
    assert_eq!(live(&b), 7);
    // A config naming only other caches: the same.
    kept_whole(&gc(&["--config", config.to_str().unwrap()], 4));
    assert_eq!(live(&b), 7);

    // With the module in a modules dir: its rule applies (keeps 5) and the report names it.
    let dir = tmp.path().join("modules");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("golden.wasm"), &module).unwrap();
    std::fs::write(dir.join("junk.wasm"), b"not a module").unwrap();
    let with_dir = [
        "--config",
        config.to_str().unwrap(),
        "--policy-dir",
        dir.to_str().unwrap(),
    ];
    let dry = gc(&[&with_dir[..], &["--dry-run"]].concat(), 0);
    let key = &dry["policies"][0];
    assert_eq!(key["decided_by"]["name"], "golden-retention", "{dry:#}");
    assert_eq!(key["decided_by"]["digest"], digest.as_str());
    assert_eq!(key["decided_by"]["found"]["type"], "modules-dir");
    assert!(key.get("kept_whole").is_none(), "{dry:#}");
    assert_eq!(dry["manifests"].as_array().unwrap().len(), 2, "{dry:#}");
    assert_eq!(live(&b), 7);
    let r = gc(&with_dir, 0);
    assert_eq!(r["manifests"].as_array().unwrap().len(), 2, "{r:#}");
    assert_eq!(live(&b), 5);
    for g in &gens[2..] {
        assert!(has(&b, &b.layout.generation(g)), "{g} dropped");
    }

    // The text report names the policy that decided.
    let out = jitship_tests::cli::jitship()
        .arg("gc")
        .args(b.cli.as_ref().unwrap())
        .args(["--dry-run"])
        .args(with_dir)
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("DECIDED BY")
            && text.contains("golden-retention@0.1.0")
            && text.contains("modules dir"),
        "{text}"
    );
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
