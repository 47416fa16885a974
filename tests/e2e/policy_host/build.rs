//! Guest builds are byte-reproducible from any checkout path; paths of dependencies outside the
//! workspace are remapped and reported.

use super::*;

/// Writes a policy crate whose dependency `dep` panics (so a source path is embedded in the module);
/// with `dep_in_workspace` both are members of one workspace, else `dep` sits next to the policy's
/// own workspace (like a third-party policy next to a plugins-sdk checkout).
fn write_repro_crate(checkout: &Path, dep_in_workspace: bool) -> PathBuf {
    let lock = std::fs::read_to_string(guests_dir().join("Cargo.lock")).unwrap();
    // Any WIT does for a build-reproducibility check; the v4 guest's is self-contained.
    copy_tree(&guests_dir().join("wit-v4"), &checkout.join("wit"));
    write(
        &checkout.join("dep/Cargo.toml"),
        "[package]\nname = \"dep\"\nversion = \"0.1.0\"\nedition = \"2024\"\n",
    );
    write(
        &checkout.join("dep/src/lib.rs"),
        "pub fn check(n: usize) {\n    if n > 3 {\n        panic!(\"too many: {n}\");\n    }\n}\n",
    );
    let policy = checkout.join("policy");
    let workspace = if dep_in_workspace {
        write(
            &checkout.join("Cargo.toml"),
            "[workspace]\nresolver = \"3\"\nmembers = [\"policy\", \"dep\"]\n",
        );
        write(&checkout.join("Cargo.lock"), &lock);
        ""
    } else {
        write(&policy.join("Cargo.lock"), &lock);
        "[workspace]\n\n"
    };
    write(
        &policy.join("Cargo.toml"),
        &format!(
            "{workspace}[package]\nname = \"guest-repro\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n\
             [lib]\ncrate-type = [\"cdylib\"]\n\n[dependencies]\ndep = {{ path = \"../dep\" }}\n\
             wit-bindgen = {{ version = \"=0.60.0\", default-features = false, features = [\"macros\", \"realloc\"] }}\n"
        ),
    );
    let source = std::fs::read_to_string(guests_dir().join("v4/src/lib.rs"))
        .unwrap()
        .replace("../wit-v4", "../wit")
        .replace(
            "Err(PolicyError::Internal(format!(\"{} entries\", entries.len())))",
            "{ dep::check(entries.len()); Ok(vec![]) }",
        );
    write(&policy.join("src/lib.rs"), &source);
    policy
}

#[test]
fn guest_builds_are_byte_reproducible_from_any_checkout_path() {
    // Two checkouts at different paths (and lengths), one shared target dir.
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let mut outputs = Vec::new();
    for checkout in [
        a.path().to_path_buf(),
        b.path().join("some/much/deeper/checkout"),
    ] {
        let policy = write_repro_crate(&checkout, true);
        let opts = BuildOptions {
            target_dir: Some(out_dir().join("target-repro")),
            quiet: true,
            locked: false,
        };
        let built = jitship::policy::build::build_policy_crate(&policy, &opts)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(built.warnings.is_empty(), "{:?}", built.warnings);
        let text = String::from_utf8_lossy(&built.component).into_owned();
        assert!(
            text.contains("too many"),
            "the panic message is in the module"
        );
        assert!(
            !text.contains(checkout.to_str().unwrap()),
            "the checkout path leaked into the module"
        );
        outputs.push(built.component);
    }
    assert!(
        outputs[0] == outputs[1],
        "the component depends on the checkout path"
    );
}

#[test]
fn paths_of_dependencies_outside_the_workspace_are_remapped_and_reported() {
    let checkout = tempfile::tempdir().unwrap();
    let policy = write_repro_crate(checkout.path(), false);
    let opts = BuildOptions {
        target_dir: Some(out_dir().join("target-repro")),
        quiet: true,
        locked: false,
    };
    let built = jitship::policy::build::build_policy_crate(&policy, &opts)
        .unwrap_or_else(|e| panic!("{e}"));
    let text = String::from_utf8_lossy(&built.component).into_owned();
    assert!(
        text.contains("/path-deps/dep-0.1.0/src/lib.rs"),
        "the dependency's panic location is remapped"
    );
    assert!(
        !text.contains(checkout.path().to_str().unwrap()),
        "the checkout path leaked into the module"
    );
    // Cargo still hashes that absolute path into symbol names, so the bytes can differ between
    // checkouts: the author is told.
    assert_eq!(built.warnings.len(), 1, "{:?}", built.warnings);
    assert!(
        built.warnings[0].contains("dep-0.1.0")
            && built.warnings[0].contains("outside the workspace")
    );
}
