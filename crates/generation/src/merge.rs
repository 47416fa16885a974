//! Merging generations: the union of two file sets. Used when a publisher builds on the head,
//! and when two publishers raced for the same head seq (invariant 4: they converge on the union).
//!
//! The rule for a path both sides hold with different content: the base (the generation already
//! published, i.e. the one installers may already have) wins, and the other side's version is
//! reported as a conflict. Caches name entries by a hash of their inputs, so such a path means a
//! compiler wrote non-deterministic output; keeping the first keeps installs stable.

use std::collections::{HashMap, HashSet};

use super::{Chunk, ContentHash, FileRecord, Manifest, PackRef, RelPath};

/// A path two sides hold with different content.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Conflict {
    pub path: RelPath,
    pub kept: ContentHash,
    pub dropped: ContentHash,
}

/// Files and packs of `base` plus every file of `other` whose path `base` does not hold.
/// Pack indices of `other`'s files are remapped into the merged pack list.
pub fn merge_files(
    base_files: &[FileRecord],
    base_packs: &[PackRef],
    other_files: &[FileRecord],
    other_packs: &[PackRef],
) -> (Vec<FileRecord>, Vec<PackRef>, Vec<Conflict>) {
    let mut files: Vec<FileRecord> = base_files.to_vec();
    let mut packs: Vec<PackRef> = base_packs.to_vec();
    let mut pack_index: HashMap<ContentHash, u32> = packs
        .iter()
        .enumerate()
        .map(|(i, p)| (p.id, i as u32))
        .collect();
    let by_path: HashMap<&RelPath, &FileRecord> = base_files.iter().map(|f| (&f.path, f)).collect();
    let base_dirs: HashSet<&str> = base_files.iter().flat_map(|f| f.path.ancestors()).collect();
    let mut conflicts = Vec::new();

    for f in other_files {
        if let Some(existing) = by_path.get(&f.path) {
            if existing.blake3 != f.blake3 {
                conflicts.push(Conflict {
                    path: f.path.clone(),
                    kept: existing.blake3,
                    dropped: f.blake3,
                });
            }
            continue;
        }
        // A file where base has a directory, or under a path base holds as a file.
        if base_dirs.contains(f.path.as_str())
            || f.path
                .ancestors()
                .any(|d| by_path.keys().any(|p| p.as_str() == d))
        {
            conflicts.push(Conflict {
                path: f.path.clone(),
                kept: ContentHash::of(b""),
                dropped: f.blake3,
            });
            continue;
        }
        let mut record = f.clone();
        record.chunks = f
            .chunks
            .iter()
            .map(|c| {
                let pack = &other_packs[c.pack as usize];
                let idx = *pack_index.entry(pack.id).or_insert_with(|| {
                    packs.push(pack.clone());
                    (packs.len() - 1) as u32
                });
                Chunk { pack: idx, ..*c }
            })
            .collect();
        files.push(record);
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    (files, packs, conflicts)
}

/// Drops packs no file references and renumbers chunks (after a merge, every pack is referenced
/// unless a side's files were all conflicts).
pub fn prune_packs(manifest: &mut Manifest) {
    let mut used = vec![false; manifest.packs.len()];
    for c in manifest.files.iter().flat_map(|f| &f.chunks) {
        used[c.pack as usize] = true;
    }
    let mut remap = vec![0u32; manifest.packs.len()];
    let mut kept = Vec::new();
    for (i, p) in manifest.packs.iter().enumerate() {
        if used[i] {
            remap[i] = kept.len() as u32;
            kept.push(p.clone());
        }
    }
    for c in manifest.files.iter_mut().flat_map(|f| f.chunks.iter_mut()) {
        c.pack = remap[c.pack as usize];
    }
    manifest.packs = kept;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(path: &str, content: u8, pack: u32) -> FileRecord {
        FileRecord {
            path: RelPath::parse(path).unwrap(),
            size: 1,
            mode: 0o644,
            mtime_s: 0,
            mtime_ns: 0,
            blake3: ContentHash([content; 32]),
            chunks: vec![Chunk {
                pack,
                offset: 0,
                len: 1,
            }],
            marker: false,
            canonical: false,
        }
    }

    fn pack(n: u8) -> PackRef {
        PackRef {
            id: ContentHash([n; 32]),
            size: 10,
        }
    }

    #[test]
    fn union_with_base_winning_conflicts() {
        let base = vec![rec("a", 1, 0), rec("b", 2, 0)];
        let other = vec![rec("b", 9, 0), rec("c", 3, 1), rec("a/x", 4, 1)];
        let (files, packs, conflicts) = merge_files(&base, &[pack(1)], &other, &[pack(1), pack(2)]);
        let paths: Vec<_> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, vec!["a", "b", "c"]);
        assert_eq!(files[1].blake3, ContentHash([2; 32]));
        assert_eq!(packs.len(), 2);
        assert_eq!(files[2].chunks[0].pack, 1);
        assert_eq!(conflicts.len(), 2);
    }
}

/// The merge as a property (issue 14): for any two valid generations, the result is their union
/// with the base winning, it validates and round-trips, and every pack it keeps is used.
#[cfg(test)]
mod props {
    use std::collections::{HashMap, HashSet};

    use proptest::prelude::*;

    use super::*;
    use crate::manifest::tests::sample;
    use crate::{GenerationId, Manifest};

    /// One side of a merge: a valid manifest whose files (paths from a tiny alphabet, so paths
    /// and file/directory clashes recur across sides) sit in packs drawn from a shared set.
    fn sides() -> impl Strategy<Value = Manifest> {
        let file = ("[ab](/[ab]){0,2}", 0u8..3, 0usize..3, any::<bool>());
        (
            proptest::collection::vec(file, 0..10),
            proptest::collection::vec(1u8..5, 1..4),
        )
            .prop_map(|(files, pack_ids)| {
                let mut m = sample();
                m.packs = pack_ids
                    .iter()
                    .map(|&n| PackRef {
                        id: ContentHash([n; 32]),
                        size: 64,
                    })
                    .collect();
                m.files = files
                    .into_iter()
                    .filter_map(|(path, content, pack, empty)| {
                        Some(FileRecord {
                            path: RelPath::parse(&path).ok()?,
                            size: u64::from(!empty),
                            mode: 0o644,
                            mtime_s: 0,
                            mtime_ns: 0,
                            blake3: ContentHash([content; 32]),
                            chunks: if empty {
                                vec![]
                            } else {
                                vec![Chunk {
                                    pack: (pack % pack_ids.len()) as u32,
                                    offset: u64::from(content),
                                    len: 1,
                                }]
                            },
                            marker: false,
                            canonical: false,
                        })
                    })
                    .collect();
                m.normalize();
                m.files.dedup_by(|a, b| a.path == b.path);
                let dirs: HashSet<String> = m
                    .files
                    .iter()
                    .flat_map(|f| f.path.ancestors().map(str::to_owned).collect::<Vec<_>>())
                    .collect();
                m.files.retain(|f| !dirs.contains(f.path.as_str()));
                prune_packs(&mut m);
                m
            })
    }

    /// A file as it reads back: content hash and where each chunk's bytes are, by pack id.
    fn resolved(m: &Manifest, f: &FileRecord) -> (ContentHash, Vec<(ContentHash, u64, u64)>) {
        let chunks = f
            .chunks
            .iter()
            .map(|c| (m.packs[c.pack as usize].id, c.offset, c.len))
            .collect();
        (f.blake3, chunks)
    }

    proptest! {
        #[test]
        fn merge_is_the_union_with_the_base_winning(base in sides(), other in sides()) {
            prop_assume!(base.validate().is_ok() && other.validate().is_ok());
            let (files, packs, conflicts) =
                merge_files(&base.files, &base.packs, &other.files, &other.packs);
            let mut merged = base.clone();
            merged.files = files;
            merged.packs = packs;
            prune_packs(&mut merged);

            // It is a generation: valid, and its bytes decode back to it under its id.
            prop_assert!(merged.validate().is_ok(), "{:?}", merged.validate());
            let bytes = merged.encode();
            let again = Manifest::decode(&bytes, GenerationId(ContentHash::of(&bytes))).ok();
            prop_assert_eq!(again.as_ref(), Some(&merged));

            let by_path: HashMap<&str, &FileRecord> =
                merged.files.iter().map(|f| (f.path.as_str(), f)).collect();
            // The base is kept whole, byte for byte.
            for f in &base.files {
                let m = by_path.get(f.path.as_str());
                prop_assert!(m.is_some(), "base file {} lost", f.path);
                prop_assert_eq!(resolved(&merged, m.unwrap()), resolved(&base, f));
            }
            // Every other file is either taken as it was or reported as a conflict; one the base
            // holds with the same content is neither.
            let conflicted: HashSet<&str> = conflicts.iter().map(|c| c.path.as_str()).collect();
            let base_paths: HashMap<&str, &FileRecord> =
                base.files.iter().map(|f| (f.path.as_str(), f)).collect();
            for f in &other.files {
                let p = f.path.as_str();
                match base_paths.get(p) {
                    Some(b) => prop_assert_eq!(conflicted.contains(p), b.blake3 != f.blake3),
                    None if conflicted.contains(p) => prop_assert!(!by_path.contains_key(p)),
                    None => {
                        let m = by_path.get(p);
                        prop_assert!(m.is_some(), "other file {} neither taken nor a conflict", p);
                        prop_assert_eq!(resolved(&merged, m.unwrap()), resolved(&other, f));
                    }
                }
            }
            // Nothing else appears, and every pack kept is used.
            let other_paths: HashSet<&str> = other.files.iter().map(|f| f.path.as_str()).collect();
            for p in by_path.keys() {
                prop_assert!(base_paths.contains_key(p) || other_paths.contains(p));
            }
            let used: HashSet<u32> =
                merged.files.iter().flat_map(|f| f.chunks.iter().map(|c| c.pack)).collect();
            prop_assert_eq!(used.len(), merged.packs.len());
        }
    }
}
