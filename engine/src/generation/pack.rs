//! Pack planning: which bytes go into which pack. Deterministic, so two pods that produced the same
//! files plan the same packs with the same ids and the store keeps one copy.
//!
//! A pack's id is the blake3 of its canonical descriptor (the list of content hashes, offsets and
//! lengths it holds), not of its bytes: the bytes are already covered by the per-file hashes that
//! every install verifies, so naming a pack costs no second pass over the data.

use super::ContentHash;

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
    }
    if used > 0 {
        plans.push(finish(current, used));
    }
    plans
}

fn finish(pieces: Vec<Piece>, size: u64) -> PackPlan {
    let mut h = blake3::Hasher::new();
    h.update(b"jitship-pack-v1\0");
    for p in &pieces {
        h.update(&p.content.0);
        h.update(&p.content_offset.to_le_bytes());
        h.update(&p.len.to_le_bytes());
    }
    PackPlan {
        id: h.finalize().into(),
        size,
        pieces,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(n: u8) -> ContentHash {
        ContentHash([n; 32])
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
