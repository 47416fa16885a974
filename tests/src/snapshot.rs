//! Snapshot tests, all through `insta`: the snapshots live in `tests/golden/<dir>/<name>.snap`;
//! after an intended change, `INSTA_UPDATE=always cargo test -p jitship-tests --test e2e` rewrites
//! them (or `cargo insta review`, with cargo-insta installed), and the diff is what to review.

use std::path::Path;

/// Fails unless `value` is the snapshot `tests/golden/<dir>/<name>.snap`.
pub fn assert_matches(dir: &str, name: &str, value: &str) {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("golden")
            .join(dir),
    );
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.bind(|| insta::assert_snapshot!(name, value));
}
