//! Reading the root: links swapped in after the scan, files replaced mid-publish, the watcher's
//! hash cache, an interrupt before any write.

use super::*;

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
