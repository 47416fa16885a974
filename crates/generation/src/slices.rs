//! Rebuilding files from packs: where each chunk of each file lies, grouped by pack, so a reader
//! that fetches packs one at a time (install, `verify`) knows what each pack holds for it.

use std::collections::BTreeMap;

use super::FileRecord;

/// One chunk of a file, located both in its pack and in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackSlice {
    /// Index of the file in the list given to [`slices_by_pack`].
    pub file: usize,
    /// Index of the chunk in the file's `chunks`.
    pub chunk: usize,
    pub file_offset: u64,
    pub pack_offset: u64,
    pub len: u64,
}

impl PackSlice {
    /// This slice's bytes in its pack (which the caller has checked is the manifest's size).
    pub fn of<'p>(&self, pack: &'p [u8]) -> &'p [u8] {
        &pack[self.pack_offset as usize..(self.pack_offset + self.len) as usize]
    }
}

/// The chunks of `files` by pack index, packs in ascending order, and within a pack in file
/// order then chunk order. A file whose chunks go back to an earlier pack index shows up under
/// both; a file without chunks (empty) under none.
pub fn slices_by_pack<'a>(
    files: impl IntoIterator<Item = &'a FileRecord>,
) -> BTreeMap<u32, Vec<PackSlice>> {
    let mut by_pack: BTreeMap<u32, Vec<PackSlice>> = BTreeMap::new();
    for (file, record) in files.into_iter().enumerate() {
        let mut file_offset = 0;
        for (chunk, c) in record.chunks.iter().enumerate() {
            by_pack.entry(c.pack).or_default().push(PackSlice {
                file,
                chunk,
                file_offset,
                pack_offset: c.offset,
                len: c.len,
            });
            file_offset += c.len;
        }
    }
    by_pack
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Chunk, ContentHash, RelPath};

    fn file(path: &str, chunks: &[(u32, u64, u64)]) -> FileRecord {
        FileRecord {
            path: RelPath::parse(path).unwrap(),
            size: chunks.iter().map(|c| c.2).sum(),
            mode: 0o644,
            mtime_s: 0,
            mtime_ns: 0,
            blake3: ContentHash([0; 32]),
            chunks: chunks
                .iter()
                .map(|&(pack, offset, len)| Chunk { pack, offset, len })
                .collect(),
            marker: false,
            canonical: false,
        }
    }

    #[test]
    fn every_chunk_once_by_pack_with_its_place_in_the_file() {
        // b spans packs 2 then 0 (back to an earlier pack); c is empty.
        let files = [
            file("a", &[(0, 0, 4)]),
            file("b", &[(2, 0, 3), (0, 4, 5)]),
            file("c", &[]),
        ];
        let by_pack = slices_by_pack(&files);
        assert_eq!(by_pack.keys().copied().collect::<Vec<_>>(), vec![0, 2]);
        let slice = |file, chunk, file_offset, pack_offset, len| PackSlice {
            file,
            chunk,
            file_offset,
            pack_offset,
            len,
        };
        assert_eq!(
            by_pack[&0],
            vec![slice(0, 0, 0, 0, 4), slice(1, 1, 3, 4, 5)]
        );
        assert_eq!(by_pack[&2], vec![slice(1, 0, 0, 0, 3)]);
        let pack: Vec<u8> = (0..16).collect();
        assert_eq!(by_pack[&0][1].of(&pack), &[4, 5, 6, 7, 8]);
    }
}
