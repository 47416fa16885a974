//! Shared pieces of the end-to-end tests and benchmarks: fixture trees shaped like real caches,
//! a digest of a tree to compare two of them, and the Mooncake test cluster's whereabouts.

pub mod fixtures;
pub mod harness;
pub mod mooncake;
