use std::os::unix::fs::symlink;

use proptest::prelude::*;

use std::collections::HashSet;
use std::fs;
use std::time::{Duration, UNIX_EPOCH};

use super::diff::diff_with_disk;
use super::stage::{Materializer, fetch_batches};
use super::*;
use crate::generation::{Chunk, ContentHash, PackRef, RelPath};
use std::collections::BTreeMap;

proptest! {
    /// Batches keep the packs' order, cover each exactly once, and stay within the budget
    /// unless a pack alone exceeds it (then it is a batch of its own).
    #[test]
    fn fetch_batches_cover_every_pack_in_order_within_the_budget(
        sizes in proptest::collection::vec(1u64..300, 0..40),
        budget in 1u64..400,
    ) {
        let packs = sizes.iter().map(|&n| (ContentHash::of(&n.to_le_bytes()), n));
        let batches = fetch_batches(packs, budget);
        let order: Vec<usize> = batches.iter().flatten().map(|&(i, _, _)| i).collect();
        prop_assert_eq!(order, (0..sizes.len()).collect::<Vec<_>>());
        for batch in &batches {
            let total: u64 = batch.iter().map(|&(_, _, n)| n).sum();
            prop_assert!(!batch.is_empty());
            prop_assert!(total <= budget || batch.len() == 1);
        }
        // Greedy: no batch could have taken the next batch's first pack.
        for pair in batches.windows(2) {
            let total: u64 = pair[0].iter().map(|&(_, _, n)| n).sum();
            prop_assert!(total + pair[1][0].2 > budget);
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum OnDisk {
    Missing,
    /// The same bytes, with other times (must be hashed).
    Same,
    /// The same bytes and the exact mtime an install sets.
    Installed,
    OtherContentSameSize,
    OtherSize,
    Directory,
    /// A link to a file with the same bytes, outside the root: still never followed.
    LinkToSame,
}

fn on_disk() -> impl Strategy<Value = OnDisk> {
    prop_oneof![
        Just(OnDisk::Missing),
        Just(OnDisk::Same),
        Just(OnDisk::Installed),
        Just(OnDisk::OtherContentSameSize),
        Just(OnDisk::OtherSize),
        Just(OnDisk::Directory),
        Just(OnDisk::LinkToSame),
    ]
}

fn content(path: &str) -> Vec<u8> {
    path.as_bytes().repeat(3)
}

fn manifest_of(paths: &[String]) -> Manifest {
    let mut m = crate::generation::testing::sample_manifest();
    m.packs = vec![PackRef {
        id: ContentHash([1; 32]),
        size: 1 << 20,
    }];
    m.files = paths
        .iter()
        .map(|p| FileRecord {
            path: RelPath::parse(p).unwrap(),
            size: content(p).len() as u64,
            mode: 0o644,
            mtime_s: 1_000_000,
            mtime_ns: 5,
            blake3: ContentHash::of(&content(p)),
            chunks: vec![Chunk {
                pack: 0,
                offset: 0,
                len: content(p).len() as u64,
            }],
            marker: false,
            canonical: false,
        })
        .collect();
    m.normalize();
    m
}

proptest! {
    /// Every file of the manifest lands in exactly one of todo / conflicts / present, by what
    /// is on disk; a link (as the file, or as a directory above it) is never followed, even to
    /// identical bytes; nothing is written.
    #[test]
    fn the_diff_classifies_every_file_and_follows_no_link(
        files in proptest::collection::btree_map("([a-c]/)?[x-z]{1,2}", on_disk(), 1..16),
        linked_dirs in proptest::collection::btree_set("[a-c]", 0..3),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(&root).unwrap();
        fs::create_dir_all(&outside).unwrap();
        // A file "a" and a directory "a/..." cannot both be in a manifest.
        let files: BTreeMap<String, OnDisk> = files
            .clone()
            .into_iter()
            .filter(|(p, _)| !files.keys().any(|q| q.starts_with(&format!("{p}/"))))
            .collect();
        let paths: Vec<String> = files.keys().cloned().collect();
        let m = manifest_of(&paths);
        for d in &linked_dirs {
            fs::create_dir_all(outside.join(d)).unwrap();
            symlink(outside.join(d), root.join(d)).unwrap();
        }
        for (p, state) in &files {
            let dest = root.join(p);
            let bytes = content(p);
            // Under a linked directory, files exist (identical) only on the far side.
            let dest = match p.split_once('/') {
                Some((d, _)) if linked_dirs.contains(d) => outside.join(p),
                _ => dest,
            };
            fs::create_dir_all(dest.parent().unwrap()).unwrap();
            match state {
                OnDisk::Missing => {}
                OnDisk::Same => fs::write(&dest, &bytes).unwrap(),
                OnDisk::Installed => {
                    fs::write(&dest, &bytes).unwrap();
                    let t = UNIX_EPOCH + Duration::new(1_000_000, 5);
                    File::options().write(true).open(&dest).unwrap().set_modified(t).unwrap();
                }
                OnDisk::OtherContentSameSize => {
                    let mut b = bytes.clone();
                    b[0] ^= 1;
                    fs::write(&dest, b).unwrap();
                }
                OnDisk::OtherSize => fs::write(&dest, b"x").unwrap(),
                OnDisk::Directory => fs::create_dir(&dest).unwrap(),
                OnDisk::LinkToSame => {
                    let far = outside.join(format!("{}.same", p.replace('/', "_")));
                    fs::write(&far, &bytes).unwrap();
                    symlink(&far, &dest).unwrap();
                }
            }
        }
        let before = listing(tmp.path());
        let dir = Confined::open(&root).unwrap();
        let plain = Materializer {
            policy: Arc::new(crate::policy::native::NativeRules::new("t")),
            root: root.clone(),
        };
        let diff = diff_with_disk(Some(&dir), &m, &plain).unwrap();
        prop_assert_eq!(listing(tmp.path()), before, "the diff wrote something");
        prop_assert_eq!(diff.missing.len() + diff.conflicts.len() + diff.present as usize, m.files.len());
        let todo: HashSet<&str> = diff.missing.iter().map(|f| f.path.as_str()).collect();
        let mut expect_todo = HashSet::new();
        let mut expect_present = 0;
        for (p, state) in &files {
            let linked = p.split_once('/').is_some_and(|(d, _)| linked_dirs.contains(d));
            match state {
                _ if linked => {}
                OnDisk::Missing => { expect_todo.insert(p.as_str()); }
                OnDisk::Same | OnDisk::Installed => expect_present += 1,
                _ => {}
            }
        }
        prop_assert_eq!(todo, expect_todo);
        prop_assert_eq!(diff.present, expect_present);
    }
}

fn listing(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut v: Vec<_> = walkdir::WalkDir::new(dir)
        .into_iter()
        .map(|e| {
            let e = e.unwrap();
            (e.path().to_owned(), e.metadata().unwrap().len())
        })
        .collect();
    v.sort();
    v
}
