//! Shared pieces of the end-to-end tests and benchmarks: fixture trees shaped like real caches,
//! and a digest of a tree to compare two of them.

pub mod fixtures;
pub mod harness;
pub mod policy_fixtures;
