//! The install record an already-current install (every pod restart) leaves: untouched when it
//! still says what the root holds, rewritten when it does not, so `jitship audit` always speaks of
//! the root as the last install found it.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use jitship::audit::{audit, record_path};
use jitship::install::InstallOutcome;
use jitship::store::LocalStore;
use jitship_tests::fixtures::triton_tree;
use jitship_tests::harness::Scenario;

/// The record's bytes and inode (a rewrite renames a new file over it).
fn record_of(root: &Path) -> (Vec<u8>, u64) {
    let path = record_path(root);
    (fs::read(&path).unwrap(), fs::metadata(&path).unwrap().ino())
}

#[test]
fn an_already_current_install_writes_the_record_only_when_the_root_changed() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    triton_tree(&src, 3, 7);
    let s = Scenario::new(
        Arc::new(LocalStore::open(t.path().join("store")).unwrap()),
        "triton",
    );
    s.publish(&src).unwrap();
    let root = t.path().join("root");
    assert_eq!(s.install(&root).outcome, InstallOutcome::Installed);
    let installed = record_of(&root);

    // A restart with nothing changed: nothing written.
    let again = s.install(&root);
    assert_eq!(
        again.outcome,
        InstallOutcome::AlreadyCurrent,
        "{}",
        again.detail
    );
    assert_eq!(record_of(&root), installed, "the record was rewritten");
    assert!(audit("triton", &root).unwrap().warm);

    // An engine writes a kernel again, same bytes, through a temp file renamed over it: audit
    // sees the rewrite against the record...
    let kernel = fs::read_dir(&root)
        .unwrap()
        .flat_map(|d| fs::read_dir(d.unwrap().path()).unwrap())
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "cubin"))
        .expect("a kernel in the root");
    let bytes = fs::read(&kernel).unwrap();
    let tmp = kernel.with_extension("tmp");
    fs::write(&tmp, &bytes).unwrap();
    fs::rename(&tmp, &kernel).unwrap();
    let before = audit("triton", &root).unwrap();
    assert_eq!(
        (before.files_rewritten, before.warm),
        (1, false),
        "{before:?}"
    );

    // ...and the next install (the next start) finds the root current with that file in it,
    // and stamps it as it is now: audit then speaks of what ran after this install.
    let restarted = s.install(&root);
    assert_eq!(
        restarted.outcome,
        InstallOutcome::AlreadyCurrent,
        "{}",
        restarted.detail
    );
    let restamped = record_of(&root);
    assert_ne!(restamped, installed, "the record still holds the old stamp");
    let after = audit("triton", &root).unwrap();
    assert_eq!((after.files_rewritten, after.warm), (0, true), "{after:?}");
    assert_eq!(after.files_kept, after.files_installed, "{after:?}");

    // Once more with nothing changed: left as it is.
    assert_eq!(s.install(&root).outcome, InstallOutcome::AlreadyCurrent);
    assert_eq!(record_of(&root), restamped);
}

/// A restart whose root is as the record stamped it takes the recorded generation without
/// reading its manifest (a 20,000-file cache's is 5 MB); one whose root changed reads it again.
/// Shown by damaging the manifest in the store after the install: the restart with the root
/// untouched is still already-current, and the one after a file was rewritten finds the damage.
#[test]
fn a_restart_with_the_root_as_recorded_does_not_read_the_manifest() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    triton_tree(&src, 3, 7);
    let store = t.path().join("store");
    let s = Scenario::new(Arc::new(LocalStore::open(&store).unwrap()), "triton");
    let (id, _) = jitship_tests::harness::published(&s.publish(&src).unwrap());
    let root = t.path().join("root");
    assert_eq!(s.install(&root).outcome, InstallOutcome::Installed);

    let manifest = s.layout.generation(&id);
    let on_disk = store.join(&manifest);
    assert!(
        on_disk.is_file(),
        "{} is not the manifest",
        on_disk.display()
    );
    fs::write(&on_disk, b"not a manifest").unwrap();

    let restart = s.install(&root);
    assert_eq!(
        (restart.outcome, restart.generation),
        (InstallOutcome::AlreadyCurrent, Some(id)),
        "{}",
        restart.detail
    );
    assert_eq!(restart.files_already_present, 3 * 8, "{restart:?}");
    assert_eq!(restart.complete, Some(true));

    // One file rewritten in place with the same bytes: its stamp no longer matches, so the
    // install reads the manifest, which is damaged now.
    let kernel = fs::read_dir(&root)
        .unwrap()
        .flat_map(|d| fs::read_dir(d.unwrap().path()).unwrap())
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "cubin"))
        .expect("a kernel in the root");
    let tmp = kernel.with_extension("tmp");
    fs::copy(&kernel, &tmp).unwrap();
    fs::rename(&tmp, &kernel).unwrap();
    let changed = s.install(&root);
    assert_ne!(
        changed.outcome,
        InstallOutcome::AlreadyCurrent,
        "{}",
        changed.detail
    );
    assert!(
        changed.detail.contains("manifest unreadable"),
        "{}",
        changed.detail
    );
}
