//! Every integration test of the workspace, as modules of one test binary: one link of wasmtime,
//! tokio and hyper for all of them, and one list of what there is. A module is one area; run one
//! with `cargo test -p jitship-tests --test e2e -- gc::`.
//!
//! Tests that need a tool `cargo test --workspace` does not have (the Mooncake test cluster,
//! Debian's docker-registry and skopeo) are `#[ignore]`d with that reason, so they are listed as
//! not run instead of passing; `tests/run-all.sh` runs them with `-- --ignored` in the step that
//! provides the tool, and `tests/not_run.py` lists any it did not.

mod big_generation;
mod careless_operator;
mod cli_contract;
mod concurrent_publish;
mod confinement;
mod durable_registry;
mod durable_tier;
mod facts_cli;
mod foundation;
mod fuzz_decoders;
mod gc;
mod hostile_import;
mod hostile_operator;
mod hostile_roots;
mod hostile_store;
mod install_record;
mod kubernetes_examples;
mod mooncake_conformance;
mod mooncake_deadline;
mod mooncake_drills;
mod mooncake_interop;
mod mooncake_roundtrip;
mod operator_commands;
mod pack_replicas;
mod policy_build;
mod policy_dist;
mod policy_golden;
mod policy_host;
mod policy_modules;
mod policy_new;
mod policy_scale;
mod policy_test_cli;
mod relocation;
mod relocation_pipeline;
mod run_server;
mod scrub;
mod sglang_engine;
mod signals;
mod signing;
mod watch;
