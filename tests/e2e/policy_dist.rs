//! The embedded built-in policies come from the sources: rebuild every `policies/<kind>` crate
//! to a component (the same `build_policy_crate` as `jitship policy build`: wasm32-unknown-unknown,
//! the reproducible `policy` profile, checkout path and CARGO_HOME remapped) and compare the bytes
//! with the committed `policies/dist/<kind>.wasm` that `policy::builtin` embeds.
//!
//! `policies/build-dist.sh` writes them (with `jitship policy build`), and `policies/dist/TOOLCHAIN`:
//! the `rustc -V` they were built with. Another rustc emits other bytes, so the check compares that
//! line first and names both toolchains rather than reporting every module stale. Needs
//! `rustup target add wasm32-unknown-unknown`.

use std::path::Path;
use std::process::Command;

use jitship::policy::build::{BuildOptions, build_policy_crate};
use jitship::policy::builtin;

#[test]
fn committed_dist_modules_are_rebuilt_byte_for_byte_from_source() {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf();
    let opts = BuildOptions {
        target_dir: Some(ws.join("target/policy-dist")),
        quiet: true,
        locked: true,
    };
    let toolchain_file = ws.join("policies/dist/TOOLCHAIN");
    let have = rustc_version(&ws);
    let built_with = std::fs::read_to_string(&toolchain_file)
        .unwrap_or_else(|e| panic!("policies/dist/TOOLCHAIN: {e}; run `policies/build-dist.sh`"));
    let built_with = built_with.trim();
    assert!(
        built_with == have,
        "policies/dist was built with {built_with}, you have {have}: rebuilding with another \
         rustc gives other bytes. Use the toolchain rust-toolchain.toml pins \
         (`rustup toolchain install`), or, if the pin moved, run `policies/build-dist.sh`"
    );
    let mut stale = Vec::new();
    for b in builtin::BUILTINS {
        let built = build_policy_crate(&ws.join(b.crate_dir), &opts).unwrap_or_else(|e| {
            panic!(
                "building {}: {e} (is the wasm32-unknown-unknown target installed?)",
                b.crate_dir
            )
        });
        let dist = ws.join(b.dist);
        let committed = std::fs::read(&dist).unwrap_or_default();
        if committed != built.component {
            stale.push(format!("{} is stale: run `policies/build-dist.sh`", b.dist));
        }
        assert_eq!(
            committed, b.wasm,
            "{}: the binary embeds other bytes than the file; rebuild jitship",
            b.dist
        );
    }
    assert!(stale.is_empty(), "{}", stale.join("\n"));
}

/// `rustc -V` as cargo runs it here: `$RUSTC`, else the `rustc` that rust-toolchain.toml selects
/// in the workspace (rustup passes the toolchain on to the processes cargo starts).
fn rustc_version(ws: &Path) -> String {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(&rustc)
        .arg("-V")
        .current_dir(ws)
        .output()
        .unwrap_or_else(|e| panic!("running {rustc:?} -V: {e}"));
    assert!(out.status.success(), "{rustc:?} -V failed: {out:?}");
    String::from_utf8(out.stdout)
        .expect("rustc -V is UTF-8")
        .trim()
        .to_owned()
}
