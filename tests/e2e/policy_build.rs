//! `policy::build` on a real crate: cargo for wasm32-unknown-unknown, then in-process componentize.
// blake3 named directly: an oracle independent of the host's own digest.
#![allow(clippy::disallowed_methods)]

use std::path::Path;

use jitship::policy::build::{BuildError, BuildOptions, build_policy_crate_to, componentize};

#[test]
fn builds_a_policy_crate_into_a_component() {
    let guest = Path::new(env!("CARGO_MANIFEST_DIR")).join("guests/good");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("policy-guests");
    let opts = BuildOptions {
        target_dir: Some(out.join("target")),
        quiet: true,
        locked: true,
    };
    let wasm = out.join("build-test/good.wasm");
    let built = build_policy_crate_to(&guest, &wasm, &opts).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(built.name, "guest_good");
    let bytes = std::fs::read(&wasm).unwrap();
    assert_eq!(bytes, built.component);
    assert_eq!(
        &bytes[..8],
        &[0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00],
        "a component, not a core module"
    );
    assert_eq!(built.digest, blake3::hash(&bytes).to_hex().to_string());
    // The core module is not a component yet; componentizing it again gives the same bytes.
    let core = std::fs::read(&built.core_module).unwrap();
    assert_eq!(componentize(&core).unwrap(), bytes);
    // wasm32-unknown-unknown + componentize: no WASI import at all.
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("jitship:policy/host@3.0.0"));
    assert!(!text.contains("wasi:"), "the component imports WASI");
}

#[test]
fn a_directory_without_a_crate_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = build_policy_crate_to(
        dir.path(),
        &dir.path().join("x.wasm"),
        &BuildOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, BuildError::NoManifest(_)), "{err}");
    assert!(
        err.to_string()
            .contains("give the directory of a policy crate")
    );
}
