//! The store's value limit: a manifest or pack size over it is refused before anything is
//! written.

use super::*;

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
