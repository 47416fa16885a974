use super::*;

#[test]
fn conformance() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::open(dir.path()).unwrap();
    super::super::conformance::run_all(&store, "conformance-test").unwrap();
}

#[test]
fn stale_temp_files_of_killed_puts_are_removed_and_fresh_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::open(dir.path()).unwrap();
    let tmp = dir.path().join(TMP_DIR);
    fs::write(tmp.join(".tmpOLD"), b"half a pack").unwrap();
    fs::write(tmp.join(".tmpNEW"), b"a put in progress").unwrap();
    let old = std::time::SystemTime::now() - STALE_TEMP_AGE - std::time::Duration::from_secs(5);
    fs::File::options()
        .write(true)
        .open(tmp.join(".tmpOLD"))
        .unwrap()
        .set_modified(old)
        .unwrap();
    store.put("ns/k", b"v", ValueClass::Bulk).unwrap();
    drop(store);
    // Reopening (what the next publish or gc does) removes the stale one only.
    let store = LocalStore::open(dir.path()).unwrap();
    assert!(!tmp.join(".tmpOLD").exists());
    assert!(tmp.join(".tmpNEW").exists());
    assert_eq!(store.get("ns/k").unwrap().as_deref(), Some(&b"v"[..]));
}

#[test]
fn keys_cannot_escape_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::open(dir.path().join("s")).unwrap();
    for bad in ["../x", "a/../../x", "/abs", ".tmp/x", "a b"] {
        assert!(
            matches!(
                store.put(bad, b"v", ValueClass::Bulk),
                Err(StoreError::InvalidKey(_))
            ),
            "{bad}"
        );
    }
}

/// The attacks of issue 39: whoever can write the shared store directory plants links and
/// FIFOs beneath it. Each test checks that nothing outside the store is read, written or
/// removed, and that no call blocks.
mod planted {
    use std::os::unix::fs::symlink;
    use std::path::Path;
    use std::time::{Duration, SystemTime};

    use super::*;

    /// A store directory and, beside it, a directory the attacker points links at, holding
    /// one file of an hour and a bit ago (what the stale-temp cleanup would delete).
    fn store_and_outside() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let (store, outside) = (dir.path().join("store"), dir.path().join("outside"));
        fs::create_dir_all(&outside).unwrap();
        let victim = outside.join("victim");
        fs::write(&victim, b"not the store's").unwrap();
        let old = SystemTime::now() - STALE_TEMP_AGE - Duration::from_secs(60);
        fs::File::options()
            .write(true)
            .open(&victim)
            .unwrap()
            .set_modified(old)
            .unwrap();
        (dir, store, outside)
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    fn untouched(outside: &Path) {
        assert_eq!(
            names(outside),
            ["victim"],
            "the directory outside the store changed"
        );
        assert_eq!(
            fs::read(outside.join("victim")).unwrap(),
            b"not the store's"
        );
    }

    fn message(e: &StoreError) -> String {
        e.to_string()
    }

    #[test]
    fn a_linked_tmp_dir_is_refused_and_nothing_is_removed_through_it() {
        let (_dir, store_dir, outside) = store_and_outside();
        let store = LocalStore::open(&store_dir).unwrap();
        fs::remove_dir(store_dir.join(TMP_DIR)).unwrap();
        symlink(&outside, store_dir.join(TMP_DIR)).unwrap();

        // The next publish or gc opens the store: it refuses, naming `.tmp`.
        let reopened = LocalStore::open(&store_dir);
        untouched(&outside);
        let err = reopened.unwrap_err();
        assert!(message(&err).contains(".tmp"), "{err}");
        // A store opened before the swap neither cleans nor writes through the link.
        assert!(store.remove_stale_temp(Duration::ZERO).is_err());
        let err = store.put("ns/k", b"v", ValueClass::Bulk).unwrap_err();
        assert!(message(&err).contains(".tmp"), "{err}");
        untouched(&outside);
        assert_eq!(store.get("ns/k").unwrap(), None);

        // A `.tmp` that is a file is refused as clearly.
        fs::remove_file(store_dir.join(TMP_DIR)).unwrap();
        fs::write(store_dir.join(TMP_DIR), b"").unwrap();
        let err = LocalStore::open(&store_dir).unwrap_err();
        assert!(message(&err).contains("not a directory"), "{err}");
    }

    #[test]
    fn a_linked_key_dir_is_neither_written_nor_read_nor_removed_through() {
        let (_dir, store_dir, outside) = store_and_outside();
        let store = LocalStore::open(&store_dir).unwrap();
        store.put("ns/heads/h", b"h", ValueClass::Record).unwrap();
        symlink(&outside, store_dir.join("ns/pack")).unwrap();
        symlink(&outside, store_dir.join("other")).unwrap();

        for key in ["ns/pack/victim", "other/victim"] {
            let put = store.put(&key.replace("victim", "new"), b"x", ValueClass::Bulk);
            untouched(&outside);
            let err = put.unwrap_err();
            assert!(message(&err).contains("link"), "{err}");
            assert!(!matches!(store.get(key), Ok(Some(_))), "{key} read");
            assert!(
                !matches!(store.get_capped(key, 1 << 20), Ok(Some(_))),
                "{key} read"
            );
            assert!(!matches!(store.exists(key), Ok(true)), "{key} seen");
            assert!(!matches!(store.size(key), Ok(Some(_))), "{key} sized");
            assert!(!matches!(store.modified(key), Ok(Some(_))), "{key} dated");
            assert!(!matches!(store.remove(key), Ok(true)), "{key} removed");
            untouched(&outside);
        }
        for prefix in ["", "ns/", "ns/pack/", "other/"] {
            if let Ok(keys) = store.list(prefix) {
                assert!(
                    keys.iter().all(|k| !k.ends_with("victim")),
                    "{prefix}: {keys:?}"
                );
            }
        }
        assert_eq!(store.list("ns/").unwrap(), ["ns/heads/h"]);
        // A directory created under a link deeper down is refused too.
        let err = store.put("ns/pack/sub/new", b"x", ValueClass::Bulk);
        assert!(err.is_err());
        untouched(&outside);
    }

    /// Runs `f` on a thread and fails the test if it has not answered within 30 s (a read of
    /// a FIFO with no writer blocks for ever).
    fn within_deadline<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(f()));
        rx.recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("{what} blocked"))
    }

    #[test]
    fn a_fifo_value_is_refused_without_blocking() {
        let (_dir, store_dir, _outside) = store_and_outside();
        let store = std::sync::Arc::new(LocalStore::open(&store_dir).unwrap());
        store.put("ns/heads/h", b"h", ValueClass::Record).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            store_dir.join("ns/heads/fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let s = store.clone();
        let got = within_deadline("get of a FIFO", move || s.get("ns/heads/fifo"));
        let err = got.unwrap_err();
        assert!(message(&err).contains("FIFO"), "{err}");
        let s = store.clone();
        let got = within_deadline("capped get of a FIFO", move || {
            s.get_capped("ns/heads/fifo", 1 << 20)
        });
        assert!(got.is_err());
        assert!(!store.exists("ns/heads/fifo").unwrap());
        // Listing names values only.
        assert_eq!(store.list("ns/").unwrap(), ["ns/heads/h"]);
        // A put on the FIFO's key neither blocks nor claims the key holds a value.
        let s = store.clone();
        let put = within_deadline("put over a FIFO", move || {
            s.put("ns/heads/fifo", b"v", ValueClass::Record)
        });
        assert!(put.is_err());
    }

    #[test]
    fn a_linked_value_is_not_read() {
        let (_dir, store_dir, outside) = store_and_outside();
        let store = LocalStore::open(&store_dir).unwrap();
        store.put("ns/heads/h", b"h", ValueClass::Record).unwrap();
        symlink(outside.join("victim"), store_dir.join("ns/heads/link")).unwrap();

        let err = store.get("ns/heads/link").unwrap_err();
        assert!(message(&err).contains("link"), "{err}");
        assert!(store.get_capped("ns/heads/link", 1 << 20).is_err());
        assert!(!store.exists("ns/heads/link").unwrap());
        assert_eq!(store.size("ns/heads/link").unwrap(), None);
        assert_eq!(store.modified("ns/heads/link").unwrap(), None);
        assert_eq!(store.list("ns/").unwrap(), ["ns/heads/h"]);
        // A put does not take the link for a value it may keep.
        assert!(
            store
                .put("ns/heads/link", b"v", ValueClass::Record)
                .is_err()
        );
        // Removing the key removes the link, never what it points to.
        assert!(store.remove("ns/heads/link").unwrap());
        untouched(&outside);
    }
}
