//! The embedded built-in policies come from the sources: rebuild every `policies/<kind>` crate
//! to a component (the same `build_policy_crate` as `jitship policy build`: wasm32-unknown-unknown,
//! the reproducible `policy` profile, checkout path and CARGO_HOME remapped) and compare the bytes
//! with the committed `policies/dist/<kind>.wasm` that `policy::builtin` embeds.
//!
//! `JITSHIP_WRITE_DIST=1` writes the rebuilt files instead (that is what `policies/build-dist.sh`
//! does). Needs `rustup target add wasm32-unknown-unknown`.

use std::path::Path;

use jitship::policy::build::{BuildOptions, build_policy_crate};
use jitship::policy::builtin;

#[test]
fn committed_dist_modules_are_rebuilt_byte_for_byte_from_source() {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf();
    let write = std::env::var_os("JITSHIP_WRITE_DIST").is_some();
    let opts = BuildOptions {
        target_dir: Some(ws.join("target/policy-dist")),
        quiet: true,
        locked: true,
    };
    let mut stale = Vec::new();
    for b in builtin::BUILTINS {
        let built = build_policy_crate(&ws.join(b.crate_dir), &opts).unwrap_or_else(|e| {
            panic!(
                "building {}: {e} (is the wasm32-unknown-unknown target installed?)",
                b.crate_dir
            )
        });
        let dist = ws.join(b.dist);
        if write {
            std::fs::write(&dist, &built.component).expect("write dist module");
            continue;
        }
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
