//! Pack planning: which bytes go into which pack. Deterministic, so two pods that produced the same
//! files plan the same packs with the same ids and the store keeps one copy.
//!
//! A pack's id is the blake3 of its canonical descriptor (the list of content hashes, offsets and
//! lengths it holds), not of its bytes: the bytes are already covered by the per-file hashes that
//! every install verifies, so naming a pack costs no second pass over the data.
//!
//! Because the id is predictable, anyone who can write to the store can put garbage under it
//! before an honest publisher does (puts never overwrite). A publisher therefore checks a pack it
//! finds already stored, and if the bytes are not the descriptor's, names its own copy with a
//! salted id ([`PackPlan::salted_id`]): the same descriptor, hashed with a salt. The manifest only
//! records ids and sizes (readers verify files, never pack ids), so a salted pack needs no new
//! manifest field; deterministic salts let honest publishers that met the same planted key still
//! share their replacement, and a random salt ends the series (a key nobody can plant ahead).

use super::{ContentHash, ContentHasher};

/// A run of one content's bytes placed in a pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub content: ContentHash,
    /// Offset inside the content (non-zero only for a large content split across packs).
    pub content_offset: u64,
    /// Offset inside the pack.
    pub pack_offset: u64,
    pub len: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackPlan {
    pub id: ContentHash,
    pub size: u64,
    pub pieces: Vec<Piece>,
}

/// Places `contents` (hash, size), in the given order, into packs of at most `pack_size` bytes.
/// A content that fits in the current pack goes there whole; one that fits in a pack but not in
/// what is left starts a new pack (small files are never split); one larger than a pack is split
/// into consecutive pieces. Empty contents need no bytes and get no piece.
///
/// Packs also end at content-defined points: after a content whose hash falls below a threshold
/// proportional to its size (about one cut per half pack of bytes, never before a quarter pack).
/// Two pods whose file lists differ by a few files then still cut most packs at the same places
/// and share them, instead of every boundary after the first difference shifting.
pub fn plan_packs(contents: &[(ContentHash, u64)], pack_size: u64) -> Vec<PackPlan> {
    assert!(pack_size > 0, "pack size must be positive");
    let mut plans = Vec::new();
    let mut current: Vec<Piece> = Vec::new();
    let mut used = 0u64;
    for &(content, size) in contents {
        if size == 0 {
            continue;
        }
        if size <= pack_size && used + size > pack_size && used > 0 {
            plans.push(finish(std::mem::take(&mut current), used));
            used = 0;
        }
        let mut placed = 0u64;
        while placed < size {
            if used == pack_size {
                plans.push(finish(std::mem::take(&mut current), used));
                used = 0;
            }
            let len = (size - placed).min(pack_size - used);
            current.push(Piece {
                content,
                content_offset: placed,
                pack_offset: used,
                len,
            });
            used += len;
            placed += len;
        }
        if used >= pack_size / 4 && content_defined_cut(&content, size, pack_size / 2) {
            plans.push(finish(std::mem::take(&mut current), used));
            used = 0;
        }
    }
    if used > 0 {
        plans.push(finish(current, used));
    }
    plans
}

/// True with probability `size / target` (capped at 1), decided by the content hash alone.
fn content_defined_cut(content: &ContentHash, size: u64, target: u64) -> bool {
    let h = u64::from_le_bytes(content.0[..8].try_into().expect("8 bytes"));
    let threshold =
        ((u128::from(size) << 64) / u128::from(target.max(1))).min(u128::from(u64::MAX)) as u64;
    h < threshold
}

fn finish(pieces: Vec<Piece>, size: u64) -> PackPlan {
    PackPlan {
        id: descriptor_id(&pieces, &[]),
        size,
        pieces,
    }
}

/// The blake3 of the canonical descriptor, then, if not empty, of a separator and `salt`.
fn descriptor_id(pieces: &[Piece], salt: &[u8]) -> ContentHash {
    let mut h = ContentHasher::new();
    h.update(b"jitship-pack-v1\0");
    for p in pieces {
        h.update(&p.content.0);
        h.update(&p.content_offset.to_le_bytes());
        h.update(&p.len.to_le_bytes());
    }
    if !salt.is_empty() {
        h.update(b"\0salt\0");
        h.update(salt);
    }
    h.finish()
}

impl PackPlan {
    /// The id of the same pack named with `salt` (an empty salt gives the plain id): where a
    /// publisher puts its copy when the plain key holds bytes that are not this pack's.
    pub fn salted_id(&self, salt: &[u8]) -> ContentHash {
        descriptor_id(&self.pieces, salt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A content whose hash never triggers a content-defined cut at these sizes.
    fn c(n: u8) -> ContentHash {
        ContentHash([0xf0 | n; 32])
    }

    #[test]
    fn small_files_share_a_pack_and_are_never_split() {
        let plans = plan_packs(&[(c(1), 4), (c(2), 4), (c(3), 4)], 10);
        assert_eq!(plans.len(), 2);
        assert_eq!(plans[0].pieces.len(), 2);
        assert_eq!(plans[1].pieces[0].content, c(3));
        assert!(
            plans
                .iter()
                .all(|p| p.pieces.iter().all(|x| x.content_offset == 0))
        );
    }

    #[test]
    fn large_files_are_split_across_packs() {
        let plans = plan_packs(&[(c(1), 3), (c(2), 25)], 10);
        let sizes: Vec<u64> = plans.iter().map(|p| p.size).collect();
        assert_eq!(sizes, vec![10, 10, 8]);
        let total: u64 = plans
            .iter()
            .flat_map(|p| &p.pieces)
            .filter(|p| p.content == c(2))
            .map(|p| p.len)
            .sum();
        assert_eq!(total, 25);
    }

    #[test]
    fn identical_inputs_give_identical_ids() {
        let input = [(c(1), 5), (c(2), 7)];
        assert_eq!(plan_packs(&input, 8), plan_packs(&input, 8));
        assert_ne!(
            plan_packs(&input, 8)[0].id,
            plan_packs(&[(c(3), 5)], 8)[0].id
        );
    }

    #[test]
    fn salted_ids_differ_from_the_plain_id_and_from_each_other() {
        let plan = &plan_packs(&[(c(1), 5), (c(2), 7)], 16)[0];
        assert_eq!(plan.salted_id(b""), plan.id);
        let (a, b) = (plan.salted_id(b"1"), plan.salted_id(b"2"));
        assert!(a != plan.id && b != plan.id && a != b);
        assert_eq!(
            a,
            plan.clone().salted_id(b"1"),
            "salted ids are deterministic"
        );
    }

    #[test]
    fn packs_realign_after_an_inserted_file() {
        let contents: Vec<(ContentHash, u64)> = (0..400u32)
            .map(|i| (ContentHash::of(&i.to_le_bytes()), 1000))
            .collect();
        let mut with_extra = contents.clone();
        with_extra.insert(10, (ContentHash::of(b"extra"), 1000));
        let a: std::collections::HashSet<_> = plan_packs(&contents, 40_000)
            .into_iter()
            .map(|p| p.id)
            .collect();
        let b: Vec<_> = plan_packs(&with_extra, 40_000)
            .into_iter()
            .map(|p| p.id)
            .collect();
        let shared = b.iter().filter(|id| a.contains(*id)).count();
        assert!(
            b.len() > 8 && shared + 2 >= b.len(),
            "{shared} of {} packs shared",
            b.len()
        );
    }

    proptest::proptest! {
        #[test]
        fn every_byte_placed_once_and_packs_bounded(sizes in proptest::collection::vec(0u64..50, 0..30), pack in 1u64..40) {
            let contents: Vec<_> = sizes.iter().enumerate().map(|(i, &s)| (ContentHash([i as u8; 32]), s)).collect();
            let plans = plan_packs(&contents, pack);
            for p in &plans {
                proptest::prop_assert!(p.size <= pack && p.size > 0);
                proptest::prop_assert_eq!(p.pieces.iter().map(|x| x.len).sum::<u64>(), p.size);
            }
            for (h, s) in &contents {
                let placed: u64 = plans.iter().flat_map(|p| &p.pieces).filter(|x| x.content == *h).map(|x| x.len).sum();
                proptest::prop_assert_eq!(placed, *s);
            }
        }
    }
}
