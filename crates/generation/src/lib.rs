//! Generations: the immutable unit jitship publishes. Pure data and hashing over local files;
//! this crate never talks to a store.
//!
//! A generation is a manifest (which files, with which hashes, stored where) plus the packs holding
//! the bytes. Packs are named by a hash of their canonical descriptor, manifests by the hash of their
//! canonical bytes, so identical inputs give identical names on any machine.

mod assemble;
mod compat;
mod hash;
mod head;
mod manifest;
mod merge;
mod pack;
mod relpath;
mod slices;

pub use assemble::place_files;
pub use compat::CompatId;
pub use hash::{ContentHash, ContentHasher, hash_open_file};
pub use head::{HeadRecord, HeadSignature};
pub use manifest::{
    Chunk, FORMAT_VERSION, FileRecord, GenerationId, MAX_MANIFEST_BYTES, MAX_POLICY_SETTINGS,
    MAX_SETTING_NAME_BYTES, MAX_SETTING_VALUE_BYTES, Manifest, ManifestError, PackRef, PolicyRef,
    Producer,
};
pub use merge::{Conflict, merge_files, prune_packs};
pub use pack::{PackPlan, Piece, plan_packs};
pub use relpath::{PathError, RelPath};
pub use slices::{PackSlice, slices_by_pack};

/// Fixtures for tests of crates built on this one (feature `testing`).
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    pub use super::manifest::tests::sample as sample_manifest;
}
