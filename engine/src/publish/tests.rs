use std::sync::Mutex;

use super::manifest::manifest_limit;
use super::packs::KEEP_FILE_LIMIT;
use super::*;
use crate::facts::Facts;
use crate::generation::{
    ContentHash, GenerationId, HeadRecord, MAX_MANIFEST_BYTES, Manifest, Producer, merge_files,
};
use crate::policy::native::NativeRules;
use crate::policy::testing::HookedPolicy;
use crate::store::testing::Hooked;
use crate::store::{LocalStore, ValueClass};
use crate::trust::PublishTrust;

#[test]
fn kept_contents_stay_within_the_budget_and_go_once_fully_packed() {
    let kept = KeptContents::new(10);
    let (a, b) = (ContentHash::of(b"0123456"), ContentHash::of(b"xyz"));
    assert!(kept.reserve(7));
    kept.keep(a, b"0123456".to_vec(), 7);
    // An identical content is not kept twice: its reservation comes back.
    assert!(kept.reserve(3));
    kept.keep(a, b"0123456".to_vec(), 3);
    assert!(kept.reserve(3));
    kept.keep(b, b"xyz".to_vec(), 3);
    assert!(!kept.reserve(1), "budget of 10 spent on 7 + 3 bytes");
    assert!(!kept.reserve(KEEP_FILE_LIMIT + 1));
    // Pieces in order; the content is dropped after its last piece.
    let mut first = [0u8; 4];
    assert!(kept.copy_piece(&a, 0, &mut first));
    assert_eq!(&first, b"0123");
    let mut rest = [0u8; 3];
    assert!(kept.copy_piece(&a, 4, &mut rest));
    assert_eq!(&rest, b"456");
    assert!(!kept.copy_piece(&a, 0, &mut first), "dropped once packed");
    assert!(!kept.copy_piece(&ContentHash::of(b"other"), 0, &mut rest));
}

/// Another publisher racing ours: once `winner` is set, its head (naming that generation) lands
/// at the key of our first head put just before ours. It signs with `resign`, or else keeps our
/// signature, which then no longer matches: a forged head.
#[derive(Debug, Default)]
struct Race {
    winner: Mutex<Option<GenerationId>>,
    resign: Mutex<Option<crate::trust::PublisherKey>>,
}

type LosesFirstHead = Hooked<LocalStore, Race>;

fn loses_first_head(inner: LocalStore) -> LosesFirstHead {
    Hooked::new(inner, Race::default()).on_put(|inner, race, key, value, class| {
        if key.contains("/head/")
            && let Some(winner) = race.winner.lock().unwrap().take()
        {
            let mut head = HeadRecord::decode(value).unwrap();
            head.generation = winner;
            head.writer = "the other publisher".into();
            if let Some(k) = race.resign.lock().unwrap().as_ref() {
                k.sign("ns", &mut head);
            }
            inner.put(key, &head.encode(), ValueClass::Record)?;
        }
        inner.put(key, value, class)
    })
}

/// The other publisher's head put (see `Race`) is "in flight": its value is there (our put
/// keeps it) but the first `reads` gets of that key miss, as on Mooncake.
#[derive(Debug)]
struct Hidden {
    key: Mutex<Option<String>>,
    reads: Mutex<u32>,
}

fn in_flight_head(race: LosesFirstHead, reads: u32) -> Hooked<LosesFirstHead, Hidden> {
    let hidden = Hidden {
        key: Mutex::new(None),
        reads: Mutex::new(reads),
    };
    Hooked::new(race, hidden)
        .on_put(|race, hidden, key, value, class| {
            if key.contains("/head/") && race.state.winner.lock().unwrap().is_some() {
                *hidden.key.lock().unwrap() = Some(key.to_owned());
            }
            race.put(key, value, class)
        })
        .on_get(|race, hidden, key| {
            if hidden.key.lock().unwrap().as_deref() == Some(key) {
                let mut n = hidden.reads.lock().unwrap();
                if *n > 0 {
                    *n -= 1;
                    return Ok(None);
                }
            }
            race.get(key)
        })
}

#[test]
fn a_head_put_still_in_flight_is_merged_not_skipped() {
    // 3 hidden reads: the read-back retries see it. 8: it stays hidden through all 8 read-backs,
    // the publisher writes above it, and the check below its won seq merges it.
    for hidden in [3, 8] {
        let (dir, race, layout) = setup();
        let winner = other_publisher(&race, &layout, dir.path(), &[("w.bin", b"w")], true);
        *race.state.winner.lock().unwrap() = Some(winner);
        let store = in_flight_head(race, hidden);
        let root = dir.path().join("ours");
        tree(&root, &[("o.bin", b"ours")]);
        let r = run(&store, &layout, &root);
        let head = catalog::newest_head(&store.inner.inner, &layout, &r.compat_id)
            .unwrap()
            .unwrap();
        let m = catalog::fetch_manifest(&store.inner.inner, &layout, &head.generation)
            .unwrap()
            .unwrap();
        assert_eq!(
            paths(&m),
            vec!["o.bin", "w.bin"],
            "hidden={hidden}: {:?}",
            r.outcome
        );
        assert_eq!(r.merged, vec![winner], "hidden={hidden}");
    }
}

/// When our head is read back, another publisher's head, naming `above`, appears one seq above
/// it, built without ours (its writer read our seq while our put was in flight).
fn head_appears_above(
    inner: LocalStore,
    above: GenerationId,
) -> Hooked<LocalStore, Mutex<Option<GenerationId>>> {
    Hooked::new(inner, Mutex::new(Some(above))).on_get(|inner, above, key| {
        let value = inner.get(key)?;
        if key.contains("/head/")
            && let Some(v) = &value
            && let Some(winner) = above.lock().unwrap().take()
        {
            let mut head = HeadRecord::decode(v).unwrap();
            head.seq += 1;
            head.generation = winner;
            head.writer = "the other publisher".into();
            let (prefix, _) = key.rsplit_once('/').unwrap();
            inner.put(
                &format!("{prefix}/{}", head.seq),
                &head.encode(),
                ValueClass::Record,
            )?;
        }
        Ok(value)
    })
}

#[test]
fn a_head_written_above_ours_without_it_is_merged() {
    let (dir, race, layout) = setup();
    let winner = other_publisher(&race, &layout, dir.path(), &[("w.bin", b"w")], true);
    let store = head_appears_above(race.inner, winner);
    let root = dir.path().join("ours");
    tree(&root, &[("o.bin", b"ours")]);
    let r = run(&store, &layout, &root);
    assert!(
        store.state.lock().unwrap().is_none(),
        "the other head was written"
    );
    assert!(
        matches!(r.outcome, PublishOutcome::Published { seq: 3, .. }),
        "{:?}",
        r.outcome
    );
    let head = catalog::newest_head(&store.inner, &layout, &r.compat_id)
        .unwrap()
        .unwrap();
    let m = catalog::fetch_manifest(&store.inner, &layout, &head.generation)
        .unwrap()
        .unwrap();
    assert_eq!(paths(&m), vec!["o.bin", "w.bin"]);
}

/// Issue 39: when our head is read back, a store writer has put an unsigned head right above it
/// and junk above that, at every seq a publisher tries next. The publish wrote a head installs
/// take (the one at seq 1: the rest is passed over) and still exited 1 ("gave up after 4
/// attempts"); now it reports that head.
#[test]
fn a_head_of_ours_that_only_untrusted_heads_cover_is_reported_not_a_failure() {
    use crate::trust::{PublisherKey, TrustPolicy};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let layout = KeyLayout::new("ns").unwrap();
    let inner = LocalStore::open(dir.path().join("store")).unwrap();
    let store = Hooked::new(inner, Mutex::new(true)).on_get(|inner, armed, key| {
        let value = inner.get(key)?;
        if key.contains("/head/")
            && let Some(v) = &value
            && std::mem::take(&mut *armed.lock().unwrap())
        {
            let mut head = HeadRecord::decode(v).unwrap();
            head.signature = None;
            head.writer = "attacker".into();
            let (prefix, _) = key.rsplit_once('/').unwrap();
            head.seq += 1;
            inner.put(
                &format!("{prefix}/{}", head.seq),
                &head.encode(),
                ValueClass::Record,
            )?;
            for junk in head.seq + 1..head.seq + 20 {
                inner.put(&format!("{prefix}/{junk}"), b"x", ValueClass::Record)?;
            }
        }
        Ok(value)
    });
    let key = PublisherKey::generate().unwrap();
    let policy = TrustPolicy::new(crate::config::TrustMode::Required, &[key.public_key()]);
    let mut o = opts();
    o.trust = PublishTrust::new(Some(Arc::new(key)), Arc::new(policy));
    let root = dir.path().join("ours");
    tree(&root, &[("o.bin", b"ours")]);
    let policy = NativeRules::new("triton");
    let r = publish(&store, &layout, &policy, &root, &o, None).unwrap();
    assert!(
        matches!(r.outcome, PublishOutcome::Published { seq: 1, .. }),
        "{:?}",
        r.outcome
    );
}

fn opts() -> PublishOptions {
    let mut facts = Facts::new();
    facts.set("model.id", "m");
    PublishOptions {
        pack_size: 4096,
        producer: Producer {
            host: "h".into(),
            pod: None,
            jitship_version: "t".into(),
        },
        facts,
        max_head_attempts: 4,
        trust: Default::default(),
        interrupt: Default::default(),
        registry: None,
    }
}

fn tree(root: &Path, files: &[(&str, &[u8])]) {
    for (p, c) in files {
        let path = root.join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, c).unwrap();
    }
}

fn run(store: &dyn Store, layout: &KeyLayout, root: &Path) -> PublishReport {
    try_run(store, layout, root).unwrap()
}

/// A publish of `root` with the triton rules and `opts()`.
fn try_run(
    store: &dyn Store,
    layout: &KeyLayout,
    root: &Path,
) -> Result<PublishReport, PublishError> {
    publish(
        store,
        layout,
        &NativeRules::new("triton"),
        root,
        &opts(),
        None,
    )
}

/// The manifest of the generation `r` published (panics on any other outcome).
fn published_manifest(store: &dyn Store, layout: &KeyLayout, r: &PublishReport) -> Manifest {
    let PublishOutcome::Published { generation, .. } = &r.outcome else {
        panic!("{:?}", r.outcome)
    };
    catalog::fetch_manifest(store, layout, generation)
        .unwrap()
        .unwrap()
}

fn paths(m: &Manifest) -> Vec<String> {
    m.files.iter().map(|f| f.path.to_string()).collect()
}

/// Publishes `files` as another publisher's generation in a scratch namespace and copies its
/// packs (and, if `with_manifest`, its manifest) into `layout`, without a head.
fn other_publisher(
    store: &LosesFirstHead,
    layout: &KeyLayout,
    dir: &Path,
    files: &[(&str, &[u8])],
    with_manifest: bool,
) -> GenerationId {
    let scratch = KeyLayout::new("scratch").unwrap();
    let root = dir.join("winner");
    tree(&root, files);
    let r = run(&store.inner, &scratch, &root);
    let PublishOutcome::Published { generation, .. } = r.outcome else {
        panic!("{:?}", r.outcome)
    };
    let m = catalog::fetch_manifest(&store.inner, &scratch, &generation)
        .unwrap()
        .unwrap();
    for p in &m.packs {
        let bytes = store.inner.get(&scratch.pack(&p.id)).unwrap().unwrap();
        store
            .inner
            .put(&layout.pack(&p.id), &bytes, ValueClass::Bulk)
            .unwrap();
    }
    if with_manifest {
        store
            .inner
            .put(
                &layout.generation(&generation),
                &m.encode(),
                ValueClass::Record,
            )
            .unwrap();
    }
    generation
}

fn setup() -> (tempfile::TempDir, LosesFirstHead, KeyLayout) {
    let dir = tempfile::tempdir().unwrap();
    let store = loses_first_head(LocalStore::open(dir.path().join("store")).unwrap());
    (dir, store, KeyLayout::new("ns").unwrap())
}

/// Under `required`: a lost race merges a trusted winner and the head written after the merge
/// is signed; a winner whose signature does not match is written over, never merged.
#[test]
fn under_required_a_lost_race_merges_only_a_trusted_winner_and_signs_the_merged_head() {
    use crate::trust::{PublisherKey, Signer, TrustPolicy};
    use std::sync::Arc;
    let key = PublisherKey::generate().unwrap();
    let policy = TrustPolicy::new(crate::config::TrustMode::Required, &[key.public_key()]);
    let mut o = opts();
    o.trust = PublishTrust::new(Some(Arc::new(key.clone())), Arc::new(policy.clone()));
    for trusted_winner in [true, false] {
        let (dir, store, layout) = setup();
        let winner = other_publisher(&store, &layout, dir.path(), &[("w.bin", b"winner's")], true);
        *store.state.winner.lock().unwrap() = Some(winner);
        if trusted_winner {
            *store.state.resign.lock().unwrap() = Some(key.clone());
        }
        let root = dir.path().join("ours");
        tree(&root, &[("o.bin", b"ours")]);
        let r = publish(
            &store,
            &layout,
            &NativeRules::new("triton"),
            &root,
            &o,
            None,
        )
        .unwrap();
        let PublishOutcome::Published { generation, seq } = r.outcome else {
            panic!("{:?}", r.outcome)
        };
        assert_eq!(seq, 2, "wrote above the winner");
        let m = catalog::fetch_manifest(&store, &layout, &generation)
            .unwrap()
            .unwrap();
        let compat = m.compat_id;
        let judge = |seq| {
            policy.judge(
                "ns",
                &catalog::read_head(&store, &layout, &compat, seq)
                    .unwrap()
                    .unwrap(),
            )
        };
        assert!(
            matches!(judge(2), Signer::Trusted { .. }),
            "our head is signed"
        );
        if trusted_winner {
            assert!(matches!(judge(1), Signer::Trusted { .. }));
            assert_eq!(r.merged, vec![winner]);
            assert_eq!(paths(&m), vec!["o.bin", "w.bin"]);
        } else {
            assert!(matches!(judge(1), Signer::Forged { .. }));
            assert!(r.merged.is_empty(), "{:?}", r.merged);
            assert_eq!(
                paths(&m),
                vec!["o.bin"],
                "nothing of the forged head merged"
            );
        }
    }
}

#[test]
fn losing_a_head_race_merges_onto_the_winner_and_reports_the_conflict() {
    let (dir, store, layout) = setup();
    let winner = other_publisher(
        &store,
        &layout,
        dir.path(),
        &[("w.bin", b"winner's"), ("same.bin", b"winner's version")],
        true,
    );
    *store.state.winner.lock().unwrap() = Some(winner);
    let root = dir.path().join("ours");
    tree(&root, &[("o.bin", b"ours"), ("same.bin", b"our version")]);
    let r = run(&store, &layout, &root);
    let PublishOutcome::Published { generation, seq } = r.outcome else {
        panic!("{:?}", r.outcome)
    };
    assert_eq!(seq, 2, "wrote above the winner");
    assert_eq!(r.merged, vec![winner]);
    assert_eq!(r.conflicts.len(), 1);
    assert_eq!(r.conflicts[0].path.as_str(), "same.bin");
    let m = catalog::fetch_manifest(&store, &layout, &generation)
        .unwrap()
        .unwrap();
    assert_eq!(paths(&m), vec!["o.bin", "same.bin", "w.bin"]);
    let same = m
        .files
        .iter()
        .find(|f| f.path.as_str() == "same.bin")
        .unwrap();
    assert_eq!(
        same.blake3,
        ContentHash::of(b"winner's version"),
        "the published version wins"
    );
    assert_eq!(m.parent, Some(winner));
    assert!(catalog::packs_present(&store, &layout, &m).unwrap());
}

#[test]
fn a_winner_whose_manifest_is_missing_or_corrupt_is_written_above() {
    for corrupt in [false, true] {
        let (dir, store, layout) = setup();
        let winner = other_publisher(&store, &layout, dir.path(), &[("w.bin", b"w")], false);
        if corrupt {
            store
                .inner
                .put(
                    &layout.generation(&winner),
                    b"{\"not\": \"a manifest\"}",
                    ValueClass::Record,
                )
                .unwrap();
        }
        *store.state.winner.lock().unwrap() = Some(winner);
        let root = dir.path().join("ours");
        tree(&root, &[("o.bin", b"ours")]);
        let r = run(&store, &layout, &root);
        let PublishOutcome::Published { generation, seq } = r.outcome else {
            panic!("corrupt={corrupt}: {:?}", r.outcome)
        };
        assert_eq!(seq, 2, "corrupt={corrupt}");
        assert!(r.merged.is_empty());
        let head = catalog::newest_head(&store, &layout, &r.compat_id)
            .unwrap()
            .unwrap();
        assert_eq!(head.generation, generation);
        // The next publish builds on our generation, not on the broken one.
        tree(&root, &[("o2.bin", b"more")]);
        let r = run(&store, &layout, &root);
        assert!(
            matches!(r.outcome, PublishOutcome::Published { seq: 3, .. }),
            "{:?}",
            r.outcome
        );
    }
}

#[test]
fn a_corrupt_head_manifest_does_not_block_later_publishes() {
    let (dir, store, layout) = setup();
    let root = dir.path().join("r");
    tree(&root, &[("a.bin", b"a")]);
    let r = run(&store, &layout, &root);
    let PublishOutcome::Published { generation, .. } = r.outcome else {
        panic!()
    };
    let key = layout.generation(&generation);
    store.inner.remove(&key).unwrap();
    store
        .inner
        .put(&key, b"garbage", ValueClass::Record)
        .unwrap();
    tree(&root, &[("b.bin", b"b")]);
    let r = run(&store, &layout, &root);
    let PublishOutcome::Published { generation, seq: 2 } = r.outcome else {
        panic!("{:?}", r.outcome)
    };
    let m = catalog::fetch_manifest(&store, &layout, &generation)
        .unwrap()
        .unwrap();
    assert_eq!(paths(&m), vec!["a.bin", "b.bin"]);
    assert_eq!(m.parent, None, "a fresh chain");
}

#[test]
fn a_parent_with_lost_packs_is_repaired_by_the_next_publish() {
    let (dir, store, layout) = setup();
    let root = dir.path().join("r");
    // Two files of 3 KiB: one pack each at a 4 KiB pack size.
    tree(&root, &[("a.bin", &[1u8; 3072]), ("b.bin", &[2u8; 3072])]);
    let r = run(&store, &layout, &root);
    let m = published_manifest(&store, &layout, &r);
    assert_eq!(m.packs.len(), 2);
    let b = m.files.iter().find(|f| f.path.as_str() == "b.bin").unwrap();
    let lost = m.packs[b.chunks[0].pack as usize].id;
    store.inner.remove(&layout.pack(&lost)).unwrap();

    // A publisher without b.bin: the new generation drops it and is complete.
    let other = dir.path().join("other");
    tree(&other, &[("a.bin", &[1u8; 3072]), ("c.bin", b"c")]);
    let r = run(&store, &layout, &other);
    let m = published_manifest(&store, &layout, &r);
    assert_eq!(paths(&m), vec!["a.bin", "c.bin"]);
    assert!(catalog::packs_present(&store, &layout, &m).unwrap());

    // A publisher with b.bin uploads it again, even with nothing else new.
    store.inner.remove(&layout.pack(&lost)).unwrap();
    let r = run(&store, &layout, &root);
    let m = published_manifest(&store, &layout, &r);
    assert_eq!(paths(&m), vec!["a.bin", "b.bin", "c.bin"]);
    assert!(catalog::packs_present(&store, &layout, &m).unwrap());
}

/// What the test rules do besides the native ones. `swap` (a path inside the root, and a link
/// target outside it): once the root is scanned, the path is swapped for that link, as a hostile
/// tenant of the cache directory could. `json_embeds_root`: `.json` files embed the root and are
/// canonicalized (to themselves), the calls counted in `canonicalized`.
#[derive(Default)]
struct RuleHooks {
    swap: Option<(std::path::PathBuf, std::path::PathBuf)>,
    json_embeds_root: bool,
    canonicalized: std::sync::atomic::AtomicUsize,
    /// Raised as SIGTERM would be, by the first canonicalization (mid-hashing).
    interrupt_while_hashing: Option<crate::interrupt::Interrupt>,
}

/// Triton's native rules with `hooks`.
fn test_rules(hooks: RuleHooks) -> HookedPolicy<NativeRules, RuleHooks> {
    HookedPolicy::new(NativeRules::new("triton"), hooks)
        .on_select(|inner, hooks, root, entries| {
            if let Some((inside, outside)) = &hooks.swap {
                std::fs::remove_dir_all(inside)
                    .or_else(|_| std::fs::remove_file(inside))
                    .unwrap();
                std::os::unix::fs::symlink(outside, inside).unwrap();
            }
            let mut selection = inner.select(root, entries)?;
            for (d, e) in selection.decisions.iter_mut().zip(entries) {
                d.embeds_root = hooks.json_embeds_root && e.path.ends_with(".json");
            }
            Ok(selection)
        })
        .on_canonicalize(|_, hooks, _, _, content| {
            hooks
                .canonicalized
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if let Some(interrupt) = &hooks.interrupt_while_hashing {
                interrupt.raise(libc::SIGTERM);
            }
            Ok(content.to_vec())
        })
}

/// Publish reads the files it scanned beneath the root without following a link: a file, a
/// large file or a directory swapped for a link after the scan fails the publish, and what the
/// link points to (same names, same sizes) never reaches the store.
#[test]
fn a_file_or_directory_swapped_for_a_link_after_the_scan_is_not_followed() {
    let big = KEEP_FILE_LIMIT as usize + 1;
    for (swapped, name) in [("a.bin", "a.bin"), ("big.bin", "big.bin"), ("d", "d/c.bin")] {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path().join("store")).unwrap();
        let layout = KeyLayout::new("ns").unwrap();
        let root = dir.path().join("r");
        let secret = dir.path().join("secret");
        let files: [(&str, Vec<u8>); 3] = [
            ("a.bin", vec![1u8; 3072]),
            ("big.bin", vec![2u8; big]),
            ("d/c.bin", vec![3u8; 3072]),
        ];
        let as_refs: Vec<(&str, &[u8])> = files.iter().map(|(p, c)| (*p, &c[..])).collect();
        tree(&root, &as_refs);
        let secrets: Vec<(&str, Vec<u8>)> = files
            .iter()
            .map(|(p, c)| (*p, vec![0x5e; c.len()]))
            .collect();
        let secret_refs: Vec<(&str, &[u8])> = secrets.iter().map(|(p, c)| (*p, &c[..])).collect();
        tree(&secret, &secret_refs);
        let policy = test_rules(RuleHooks {
            swap: Some((root.join(swapped), secret.join(swapped))),
            ..RuleHooks::default()
        });
        let err = publish(&store, &layout, &policy, &root, &opts(), None)
            .expect_err("a publish through a swapped link");
        match &err {
            PublishError::Read { path, .. } => assert_eq!(path, &root.join(name), "{err}"),
            other => panic!("{swapped}: expected a read error, got {other}"),
        }
        let compat = CompatId::new("triton", &policy.compat_key(&opts().facts).unwrap());
        assert!(
            catalog::newest_head(&store, &layout, &compat)
                .unwrap()
                .is_none(),
            "{swapped}: nothing published"
        );
    }
}

/// The root itself may be a link (an operator's choice, resolved once): its files are published.
#[test]
fn a_root_that_is_a_link_is_published_through() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::open(dir.path().join("store")).unwrap();
    let layout = KeyLayout::new("ns").unwrap();
    let real = dir.path().join("real");
    tree(&real, &[("a.bin", &[1u8; 3072]), ("d/c.bin", b"c")]);
    let root = dir.path().join("root");
    std::os::unix::fs::symlink(&real, &root).unwrap();
    let r = run(&store, &layout, &root);
    let m = published_manifest(&store, &layout, &r);
    assert_eq!(paths(&m), vec!["a.bin", "d/c.bin"]);
}

/// The watcher's hash cache spares what the parent manifest cannot: a file that embeds the root
/// is never taken from the parent by size, so without the cache each publish canonicalizes it
/// again. A one-off publish (no cache) does exactly that, and still publishes the same bytes.
#[test]
fn a_watchers_hash_cache_spares_canonicalizing_a_file_it_has_seen() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::open(dir.path().join("store")).unwrap();
    let layout = KeyLayout::new("ns").unwrap();
    let root = dir.path().join("r");
    tree(&root, &[("k/a.bin", b"kernel"), ("k/grp.json", b"{}")]);
    let policy = test_rules(RuleHooks {
        json_embeds_root: true,
        ..RuleHooks::default()
    });
    let canonicalized = || {
        policy
            .state
            .canonicalized
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let mut cache = HashCache::default();
    let publish_with = |cache: Option<&mut HashCache>| {
        publish(&store, &layout, &policy, &root, &opts(), cache).unwrap()
    };

    let first = publish_with(Some(&mut cache));
    assert_eq!((first.files_hashed, canonicalized()), (2, 1));

    tree(&root, &[("k/b.bin", b"another kernel")]);
    let second = publish_with(Some(&mut cache));
    assert_eq!((second.files_hashed, canonicalized()), (1, 1));

    tree(&root, &[("k/c.bin", b"a third")]);
    let one_off = publish_with(None);
    assert_eq!((one_off.files_hashed, canonicalized()), (2, 2));
}

/// Replaces the file at the path it holds (by rename, as caches write) when publish first asks
/// whether a pack exists: after hashing, before any pack is filled.
fn replaces_before_upload(
    inner: LocalStore,
    file: std::path::PathBuf,
) -> Hooked<LocalStore, Mutex<Option<std::path::PathBuf>>> {
    Hooked::new(inner, Mutex::new(Some(file))).on_exists(|inner, replace, key| {
        if key.contains("/pack/")
            && let Some(path) = replace.lock().unwrap().take()
        {
            let size = std::fs::metadata(&path).unwrap().len() as usize;
            let fresh = path.with_extension("new");
            std::fs::write(&fresh, vec![2u8; size]).unwrap();
            std::fs::rename(&fresh, &path).unwrap();
        }
        inner.exists(key)
    })
}

/// A file replaced after it was hashed and before its pack is filled (too large to have been
/// kept from hashing) fails the publish: its hash would lie about the bytes packed. Nothing is
/// published, and the next publish takes the new content.
#[test]
fn a_file_replaced_between_hashing_and_packing_fails_the_publish_and_the_next_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    // Same size before and after: only the inode tells the new file from the old.
    tree(&root, &[("big.bin", &[1u8; 10_000])]);
    let store = replaces_before_upload(
        LocalStore::open(dir.path().join("store")).unwrap(),
        root.join("big.bin"),
    );
    let layout = KeyLayout::new("ns").unwrap();

    let err =
        try_run(&store, &layout, &root).expect_err("a file replaced before its pack was filled");
    assert!(
        store.state.lock().unwrap().is_none(),
        "the file was replaced"
    );
    match &err {
        PublishError::Read { path, source } => {
            assert_eq!(path, &root.join("big.bin"));
            assert!(source.to_string().contains("retry the publish"), "{err}");
        }
        other => panic!("expected a read error, got {other}"),
    }
    let keys = store.inner.list("ns").unwrap();
    assert!(!keys.iter().any(|k| k.contains("/head/")), "{keys:?}");

    let m = published_manifest(&store, &layout, &run(&store, &layout, &root));
    assert_eq!(m.files[0].blake3, ContentHash::of(&[2u8; 10_000]));
}

/// SIGTERM while a publish hashes (the CLI raises the interrupt from its handler): the publish
/// stops with an error naming the signal, before any pack or head is written, and the next
/// publish of the same root goes through.
#[test]
fn an_interrupt_stops_a_publish_before_any_pack_or_head() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::open(dir.path().join("store")).unwrap();
    let layout = KeyLayout::new("ns").unwrap();
    let root = dir.path().join("r");
    let kernels: Vec<(String, Vec<u8>)> = (0..200)
        .map(|i| (format!("k{i:03}/a.bin"), vec![i as u8; 5000]))
        .collect();
    let mut files: Vec<(&str, &[u8])> = kernels.iter().map(|(p, c)| (p.as_str(), &c[..])).collect();
    files.push(("k000/grp.json", b"{}"));
    tree(&root, &files);
    let interrupt = crate::interrupt::Interrupt::default();
    let policy = test_rules(RuleHooks {
        json_embeds_root: true,
        interrupt_while_hashing: Some(interrupt.clone()),
        ..RuleHooks::default()
    });
    let stopped = PublishOptions {
        interrupt: interrupt.clone(),
        ..opts()
    };
    let err = publish(&store, &layout, &policy, &root, &stopped, None)
        .expect_err("an interrupted publish");
    assert!(matches!(err, PublishError::Interrupted("SIGTERM")), "{err}");
    assert!(err.to_string().contains("nothing was published"), "{err}");
    assert_eq!(
        store.list("ns/").unwrap(),
        Vec::<String>::new(),
        "nothing written"
    );
    // Raised before a publish begins (the next cache after a signal), even an empty root is not
    // reported as published or empty.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let err = publish(&store, &layout, &policy, &empty, &stopped, None)
        .expect_err("a publish begun after the interrupt");
    assert!(matches!(err, PublishError::Interrupted("SIGTERM")), "{err}");

    // The same root, not interrupted: published whole.
    let policy = test_rules(RuleHooks {
        json_embeds_root: true,
        ..RuleHooks::default()
    });
    let r = publish(&store, &layout, &policy, &root, &opts(), None).unwrap();
    assert!(
        matches!(r.outcome, PublishOutcome::Published { seq: 1, .. }),
        "{:?}",
        r.outcome
    );
    assert_eq!(published_manifest(&store, &layout, &r).files.len(), 201);
}

/// The local store with a smaller value limit (as a Mooncake client's staging buffer size sets
/// one), refusing bigger puts like the real backends.
#[derive(Debug)]
struct SmallValues(LocalStore, u64);

impl Store for SmallValues {
    fn describe(&self) -> String {
        format!("{} (values up to {} bytes)", self.0.describe(), self.1)
    }
    fn max_value_size(&self) -> u64 {
        self.1
    }
    fn capabilities(&self) -> crate::store::Capabilities {
        self.0.capabilities()
    }
    fn put(&self, key: &str, value: &[u8], class: ValueClass) -> crate::store::StoreResult<()> {
        if value.len() as u64 > self.1 {
            return Err(crate::store::StoreError::TooLarge {
                size: value.len() as u64,
                limit: self.1,
            });
        }
        self.0.put(key, value, class)
    }
    fn get(&self, key: &str) -> crate::store::StoreResult<Option<Vec<u8>>> {
        self.0.get(key)
    }
    fn exists(&self, key: &str) -> crate::store::StoreResult<bool> {
        self.0.exists(key)
    }
    fn remove(&self, key: &str) -> crate::store::StoreResult<bool> {
        self.0.remove(key)
    }
    fn list(&self, prefix: &str) -> crate::store::StoreResult<Vec<String>> {
        self.0.list(prefix)
    }
    fn size(&self, key: &str) -> crate::store::StoreResult<Option<u64>> {
        self.0.size(key)
    }
}

fn numbered_files(from: usize, to: usize) -> Vec<(String, Vec<u8>)> {
    (from..to)
        .map(|i| {
            (
                format!("k{i:03}/kernel.cubin"),
                format!("kernel {i}").into_bytes(),
            )
        })
        .collect()
}

fn tree_of(root: &Path, files: &[(String, Vec<u8>)]) {
    let files: Vec<(&str, &[u8])> = files.iter().map(|(p, c)| (p.as_str(), &c[..])).collect();
    tree(root, &files);
}

fn keys(store: &SmallValues) -> Vec<String> {
    let mut keys = store.list("ns/").unwrap();
    keys.sort();
    keys
}

/// A generation whose manifest would pass the store's value limit is refused at publish, with
/// the numbers and what to do, before a pack, index entry, manifest or head is written; a
/// parent's generation that the new files would push over the limit stays the newest.
#[test]
fn a_manifest_over_the_stores_value_limit_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = SmallValues(LocalStore::open(dir.path().join("store")).unwrap(), 8192);
    let layout = KeyLayout::new("ns").unwrap();
    let root = dir.path().join("r");
    tree_of(&root, &numbered_files(0, 60));
    let err = try_run(&store, &layout, &root).expect_err("a manifest of 60 files is over 8 KiB");
    let PublishError::ManifestTooLarge {
        files, size, limit, ..
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!((*files, *limit), (60, 8192), "{err}");
    assert!(*size > 8192, "{err}");
    let text = err.to_string();
    for part in [
        "nothing was published",
        &format!("{size} bytes for 60 files"),
        "8192-byte limit",
        "split the cache root",
        "store.mooncake.staging_buffer_size",
    ] {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }
    assert_eq!(keys(&store), Vec::<String>::new(), "nothing written");

    // Half the files fit: published. The other half on top of them would not: refused, and the
    // generation already there stays the newest, untouched.
    let dir2 = tempfile::tempdir().unwrap();
    let half = dir2.path().join("half");
    tree_of(&half, &numbered_files(0, 20));
    let r = run(&store, &layout, &half);
    let first = published_manifest(&store, &layout, &r);
    assert!(first.encoded_len() <= 8192);
    let before = keys(&store);
    let err = try_run(&store, &layout, &root).expect_err("60 files on top of 20 are over 8 KiB");
    assert!(
        matches!(err, PublishError::ManifestTooLarge { files: 60, .. }),
        "{err}"
    );
    assert_eq!(
        keys(&store),
        before,
        "nothing written by the refused publish"
    );
    let head = catalog::newest_head(&store, &layout, &r.compat_id)
        .unwrap()
        .unwrap();
    assert_eq!(head.generation, first.id());
}

/// A pack size over the store's value limit is refused before the root is read: every pack
/// would fail its put.
#[test]
fn a_pack_size_over_the_stores_value_limit_is_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let store = SmallValues(LocalStore::open(dir.path().join("store")).unwrap(), 2048);
    let layout = KeyLayout::new("ns").unwrap();
    let root = dir.path().join("r");
    tree_of(&root, &numbered_files(0, 3));
    let err = try_run(&store, &layout, &root).expect_err("4096-byte packs on a 2048-byte store");
    assert!(
        matches!(
            err,
            PublishError::PackSizeOverLimit {
                pack_size: 4096,
                limit: 2048,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("publish.pack_size"), "{err}");
    assert_eq!(keys(&store), Vec::<String>::new(), "nothing written");
}

/// On a store that takes bigger values than readers accept (the local store: 4 GiB), the
/// readers' cap is the limit, so nothing is published that installs could not read.
#[test]
fn the_manifest_limit_is_never_above_what_readers_accept() {
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open(dir.path().join("store")).unwrap();
    assert!(local.max_value_size() > MAX_MANIFEST_BYTES as u64);
    assert_eq!(manifest_limit(&local), MAX_MANIFEST_BYTES as u64);
    let small = SmallValues(local, 1 << 20);
    assert_eq!(manifest_limit(&small), 1 << 20);
}

// Contributions (issue 40; `docs/concurrent-publishes.md`): a loser leaves its generation where
// the next head's writer merges it, and is done once a head names it.

/// What another publisher does when our contribution lands (the hook on its put): nothing, a
/// head at the next seq carrying it, or a contribution of its own in another slot.
#[derive(Debug)]
enum OnContribution {
    /// Writes the head above the lost seq: the winner's files and ours, naming ours in `merged`.
    CarryItInTheNextHead { winner: GenerationId },
    /// Leaves its own generation as a contribution at the same seq.
    ContributeToo(GenerationId),
}

type Contributions = Hooked<LosesFirstHead, Mutex<Option<OnContribution>>>;

fn on_contribution(race: LosesFirstHead, then: OnContribution) -> Contributions {
    Hooked::new(race, Mutex::new(Some(then))).on_put(|race, then, key, value, class| {
        race.put(key, value, class)?;
        if !key.contains("/contrib/") {
            return Ok(());
        }
        let record = HeadRecord::decode(value).unwrap();
        let layout = KeyLayout::new("ns").unwrap();
        match then.lock().unwrap().take() {
            None => {}
            Some(OnContribution::CarryItInTheNextHead { winner }) => {
                let fetch = |id| catalog::fetch_manifest(race, &layout, id).unwrap().unwrap();
                let (w, ours) = (fetch(&winner), fetch(&record.generation));
                let mut next = w.clone();
                let (files, packs, _) = merge_files(&w.files, &w.packs, &ours.files, &ours.packs);
                (next.files, next.packs) = (files, packs);
                next.parent = Some(winner);
                next.merged = vec![record.generation];
                next.normalize();
                race.put(
                    &layout.generation(&next.id()),
                    &next.encode(),
                    ValueClass::Record,
                )?;
                let head = HeadRecord {
                    seq: record.seq + 1,
                    generation: next.id(),
                    writer: "the carrier".into(),
                    ..record.clone()
                };
                let key = layout.head(&record.compat_id, head.seq);
                race.put(&key, &head.encode(), ValueClass::Record)?;
            }
            Some(OnContribution::ContributeToo(other)) => {
                let theirs = HeadRecord {
                    generation: other,
                    writer: "another loser".into(),
                    ..record.clone()
                };
                let free = (0..catalog::contributions::CONTRIBUTION_SLOTS)
                    .map(|slot| layout.contribution(&record.compat_id, record.seq, slot))
                    .find(|k| !race.exists(k).unwrap())
                    .unwrap();
                race.put(&free, &theirs.encode(), ValueClass::Record)?;
            }
        }
        Ok(())
    })
}

/// The manifests in the store, by id.
fn manifest_ids(store: &LocalStore, layout: &KeyLayout) -> Vec<GenerationId> {
    let prefix = layout.generations_prefix();
    store
        .list(&prefix)
        .unwrap()
        .iter()
        .map(|k| k.strip_prefix(&prefix).unwrap().parse().unwrap())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

#[test]
fn a_loser_whose_contribution_the_next_head_carries_is_done_and_leaves_no_stray_manifest() {
    let (dir, race, layout) = setup();
    let winner = other_publisher(&race, &layout, dir.path(), &[("w.bin", b"w")], true);
    *race.state.winner.lock().unwrap() = Some(winner);
    let store = on_contribution(race, OnContribution::CarryItInTheNextHead { winner });
    let root = dir.path().join("ours");
    tree(&root, &[("o.bin", b"ours")]);
    let r = run(&store, &layout, &root);
    let PublishOutcome::Published { generation, seq } = r.outcome else {
        panic!("{:?}", r.outcome)
    };
    assert_eq!(seq, 2, "the head that carried our contribution");
    assert!(
        r.carried,
        "another's head: its packs are not noted as checked by this publish"
    );
    let inner = &store.inner.inner;
    let head = catalog::newest_head(inner, &layout, &r.compat_id)
        .unwrap()
        .unwrap();
    assert_eq!((head.seq, head.writer.as_str()), (2, "the carrier"));
    assert_eq!(head.generation, generation);
    let m = catalog::fetch_manifest(inner, &layout, &generation)
        .unwrap()
        .unwrap();
    assert_eq!(paths(&m), vec!["o.bin", "w.bin"]);
    // Our first attempt is named by the contribution and the head's `merged`; the attempt we
    // put for seq 2 (and lost) is named by nothing, so it is gone.
    let mut expected = vec![winner, generation, m.merged[0]];
    expected.sort();
    assert_eq!(manifest_ids(inner, &layout), expected);
}

#[test]
fn the_next_head_merges_every_contribution_at_the_lost_seq() {
    let (dir, race, layout) = setup();
    let winner = other_publisher(&race, &layout, dir.path(), &[("w.bin", b"w")], true);
    let other = {
        let scratch = tempfile::tempdir().unwrap();
        other_publisher(
            &race,
            &layout,
            scratch.path(),
            &[("x.bin", b"another loser's")],
            true,
        )
    };
    *race.state.winner.lock().unwrap() = Some(winner);
    let store = on_contribution(race, OnContribution::ContributeToo(other));
    let root = dir.path().join("ours");
    tree(&root, &[("o.bin", b"ours")]);
    let r = run(&store, &layout, &root);
    let m = published_manifest(&store, &layout, &r);
    let PublishOutcome::Published { seq, .. } = r.outcome else {
        unreachable!()
    };
    assert_eq!(seq, 2);
    assert_eq!(paths(&m), vec!["o.bin", "w.bin", "x.bin"]);
    assert_eq!(m.parent, Some(winner));
    assert!(m.merged.contains(&other), "{:?}", m.merged);
    assert!(r.merged.contains(&other));
}

#[test]
fn junk_in_every_contribution_slot_only_sends_the_loser_to_the_next_seq() {
    let (dir, race, layout) = setup();
    let winner = other_publisher(&race, &layout, dir.path(), &[("w.bin", b"w")], true);
    *race.state.winner.lock().unwrap() = Some(winner);
    let root = dir.path().join("ours");
    tree(&root, &[("o.bin", b"ours")]);
    let compat = CompatId::new(
        "triton",
        &NativeRules::new("triton")
            .compat_key(&opts().facts)
            .unwrap(),
    );
    for slot in 0..catalog::contributions::CONTRIBUTION_SLOTS {
        let key = layout.contribution(&compat, 1, slot);
        race.inner.put(&key, b"junk", ValueClass::Record).unwrap();
    }
    let r = run(&race, &layout, &root);
    let m = published_manifest(&race, &layout, &r);
    assert_eq!(paths(&m), vec!["o.bin", "w.bin"]);
    assert_eq!(m.parent, Some(winner));
}

/// A contribution is signed under its own domain: under `required` an unsigned one is not
/// merged, and a trusted publisher's signed contribution is never a valid head.
#[test]
fn under_required_only_trusted_contributions_are_merged_and_none_passes_as_a_head() {
    use crate::trust::{PublisherKey, Signer, TrustPolicy};
    use std::sync::Arc;
    let key = PublisherKey::generate().unwrap();
    let policy = TrustPolicy::new(crate::config::TrustMode::Required, &[key.public_key()]);
    let (dir, race, layout) = setup();
    let winner = other_publisher(&race, &layout, dir.path(), &[("w.bin", b"w")], true);
    let other = {
        let scratch = tempfile::tempdir().unwrap();
        other_publisher(
            &race,
            &layout,
            scratch.path(),
            &[("x.bin", b"unsigned")],
            true,
        )
    };
    *race.state.winner.lock().unwrap() = Some(winner);
    *race.state.resign.lock().unwrap() = Some(key.clone());
    let store = on_contribution(race, OnContribution::ContributeToo(other));
    let mut o = opts();
    o.trust =
        crate::trust::PublishTrust::new(Some(Arc::new(key.clone())), Arc::new(policy.clone()));
    let root = dir.path().join("ours");
    tree(&root, &[("o.bin", b"ours")]);
    let r = publish(
        &store,
        &layout,
        &NativeRules::new("triton"),
        &root,
        &o,
        None,
    )
    .unwrap();
    let m = published_manifest(&store, &layout, &r);
    assert_eq!(
        paths(&m),
        vec!["o.bin", "w.bin"],
        "the unsigned contribution is not merged"
    );
    assert!(!m.merged.contains(&other));

    let ours =
        catalog::contributions::read_contributions(&store.inner.inner, &layout, &r.compat_id, 1)
            .unwrap()
            .into_iter()
            .filter_map(|(_, read)| read.ok())
            .find(|c| c.generation != other)
            .expect("our signed contribution");
    let domain = catalog::contributions::signing_domain("ns");
    assert!(matches!(
        policy.judge(&domain, &ours),
        Signer::Trusted { .. }
    ));
    assert!(
        matches!(policy.judge("ns", &ours), Signer::Forged { .. }),
        "a contribution copied to a head key does not verify"
    );
}
