//! Shared pieces of the end-to-end tests and benchmarks: fixture trees shaped like real caches,
//! a digest of a tree to compare two of them, the Mooncake test cluster's whereabouts, and the
//! backends a test runs against.

pub mod backends;
pub mod bench;
pub mod child;
pub mod cli;
pub mod fixtures;
pub mod harness;
pub mod mooncake;
pub mod output;
pub mod policy_fixtures;
pub mod policy_scale;
pub mod registry;
pub mod snapshot;
