//! Manifest assembly: where each file of a new generation lives, in its parent's packs or in the
//! packs just planned.

use std::collections::HashMap;

use super::{Chunk, ContentHash, FileRecord, Manifest, PackPlan, PackRef};

/// Places `files` (records whose `chunks` are not filled in yet): a content `parent` stores keeps
/// the parent's chunks, any other is located in `plans` (from `plan_packs` over the contents
/// the parent lacks). Returns the files and the pack list, the parent's packs then the plans',
/// so the parent's chunk indices stay valid. A content found in neither gets no chunks, which
/// `Manifest::validate` refuses for a non-empty file: never a silent hole.
pub fn place_files(
    parent: Option<&Manifest>,
    mut files: Vec<FileRecord>,
    plans: &[PackPlan],
) -> (Vec<FileRecord>, Vec<PackRef>) {
    let stored: HashMap<ContentHash, &[Chunk]> = parent
        .iter()
        .flat_map(|m| m.files.iter().map(|f| (f.blake3, f.chunks.as_slice())))
        .collect();
    let mut packs: Vec<PackRef> = parent.map(|m| m.packs.clone()).unwrap_or_default();
    let base = packs.len() as u32;
    packs.extend(plans.iter().map(|p| PackRef {
        id: p.id,
        size: p.size,
    }));
    let mut planned: HashMap<ContentHash, Vec<Chunk>> = HashMap::new();
    for (i, plan) in plans.iter().enumerate() {
        for piece in &plan.pieces {
            planned.entry(piece.content).or_default().push(Chunk {
                pack: base + i as u32,
                offset: piece.pack_offset,
                len: piece.len,
            });
        }
    }
    for f in &mut files {
        f.chunks = match stored.get(&f.blake3) {
            Some(chunks) => chunks.to_vec(),
            None => planned.get(&f.blake3).cloned().unwrap_or_default(),
        };
    }
    (files, packs)
}

/// Manifest assembly as a property: every file reads back its own bytes.
#[cfg(test)]
mod props {
    use std::collections::HashSet;

    use proptest::prelude::*;

    use super::*;
    use crate::manifest::tests::sample;
    use crate::{RelPath, plan_packs};

    /// A file's bytes, a function of its content "seed" (so equal seeds share content).
    fn bytes_of(seed: u8, size: u64) -> Vec<u8> {
        (0..size).map(|i| seed.wrapping_add(i as u8)).collect()
    }

    fn record(path: &str, seed: u8, size: u64) -> FileRecord {
        FileRecord {
            path: RelPath::parse(path).unwrap(),
            size,
            mode: 0o644,
            mtime_s: 0,
            mtime_ns: 0,
            blake3: ContentHash::of(&bytes_of(seed, size)),
            chunks: vec![],
            marker: false,
            canonical: false,
        }
    }

    /// The packs' bytes as `plan_packs` lays them out, by pack id.
    fn pack_bytes(
        plans: &[PackPlan],
        contents: &HashMap<ContentHash, Vec<u8>>,
    ) -> HashMap<ContentHash, Vec<u8>> {
        plans
            .iter()
            .map(|p| {
                let mut bytes = vec![0u8; p.size as usize];
                for piece in &p.pieces {
                    let src = &contents[&piece.content];
                    let at = piece.pack_offset as usize;
                    let from = piece.content_offset as usize;
                    bytes[at..at + piece.len as usize]
                        .copy_from_slice(&src[from..from + piece.len as usize]);
                }
                (p.id, bytes)
            })
            .collect()
    }

    proptest! {
        #[test]
        fn every_file_reads_back_its_bytes(
            old in proptest::collection::vec((0u8..6, 0u64..40), 0..6),
            new in proptest::collection::vec((0u8..12, 0u64..40), 0..10),
            pack_size in 8u64..64,
        ) {
            let mut contents: HashMap<ContentHash, Vec<u8>> = HashMap::new();
            let mut remember = |seed: u8, size: u64| {
                let b = bytes_of(seed, size);
                contents.insert(ContentHash::of(&b), b);
            };
            // The parent: its own files placed the same way, from nothing.
            let old_files: Vec<FileRecord> = old
                .iter()
                .enumerate()
                .map(|(i, &(seed, size))| {
                    remember(seed, size);
                    record(&format!("old/{i}"), seed, size)
                })
                .collect();
            let old_order: Vec<(ContentHash, u64)> = dedup(&old_files);
            let old_plans = plan_packs(&old_order, pack_size);
            let (files, packs) = place_files(None, old_files, &old_plans);
            let mut parent = sample();
            parent.files = files;
            parent.packs = packs;
            prop_assert!(parent.validate().is_ok(), "{:?}", parent.validate());

            // The child: new files, some sharing contents with the parent or each other.
            let new_files: Vec<FileRecord> = new
                .iter()
                .enumerate()
                .map(|(i, &(seed, size))| {
                    remember(seed, size);
                    record(&format!("new/{i}"), seed, size)
                })
                .collect();
            let stored: HashSet<ContentHash> = parent.files.iter().map(|f| f.blake3).collect();
            let order: Vec<(ContentHash, u64)> =
                dedup(&new_files).into_iter().filter(|(h, _)| !stored.contains(h)).collect();
            let plans = plan_packs(&order, pack_size);
            let (files, packs) = place_files(Some(&parent), new_files, &plans);
            let mut child = sample();
            child.files = files;
            child.packs = packs;
            prop_assert!(child.validate().is_ok(), "{:?}", child.validate());

            // Every file of the child reads back its own bytes from the packs it names.
            let mut all_packs = pack_bytes(&old_plans, &contents);
            all_packs.extend(pack_bytes(&plans, &contents));
            for f in &child.files {
                let mut got = Vec::new();
                for c in &f.chunks {
                    let pack = &all_packs[&child.packs[c.pack as usize].id];
                    got.extend_from_slice(&pack[c.offset as usize..(c.offset + c.len) as usize]);
                }
                prop_assert_eq!(ContentHash::of(&got), f.blake3, "{}", f.path);
            }
        }
    }

    fn dedup(files: &[FileRecord]) -> Vec<(ContentHash, u64)> {
        let mut seen = HashSet::new();
        files
            .iter()
            .filter(|f| seen.insert(f.blake3))
            .map(|f| (f.blake3, f.size))
            .collect()
    }
}
