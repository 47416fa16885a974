//! gc beside the other writers: an install running while gc removes what it does not need, and
//! pins, floors and a gc interrupted half way.

use super::*;

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
