//! What a local user or a store writer plants ahead of jitship (issue 39): a pack put under the key
//! a trusted publisher will predictably use, and a cache root (or a symlink's target) another user
//! created first. On the local store.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use jitship::catalog;
use jitship::catalog::KeyLayout;
use jitship::config::TrustMode;
use jitship::generation::ContentHash;
use jitship::install::{InstallOutcome, InstallReport};
use jitship::publish::{PublishError, PublishReport};
use jitship::store::ValueClass;
use jitship::trust::{PublishTrust, PublisherKey, TrustPolicy};
use jitship_tests::backends::{Place, backends, remove_retrying};
use jitship_tests::fixtures::triton_tree;
use jitship_tests::harness::{Scenario, published};

/// A uid that is neither root nor the test's (nobody).
const OTHER_UID: u32 = 65534;

fn required(key: &PublisherKey) -> TrustPolicy {
    TrustPolicy::new(TrustMode::Required, &[key.public_key()])
}

fn publish_signed(
    s: &Scenario,
    root: &Path,
    key: &PublisherKey,
) -> Result<PublishReport, PublishError> {
    s.publish_trusting(
        root,
        PublishTrust::new(Some(Arc::new(key.clone())), Arc::new(required(key))),
    )
}

fn install_required(s: &Scenario, root: &Path, key: &PublisherKey) -> InstallReport {
    s.install_trusting(root, required(key))
}

fn tree(root: &Path) -> Vec<(String, ContentHash)> {
    let mut out: Vec<_> = jitship_tests::fixtures::files_under(root)
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            (rel, ContentHash::of(&std::fs::read(&p).unwrap()))
        })
        .collect();
    out.sort();
    out
}

/// Garbage put under every pack key a trusted publish of these files will use (predicted by
/// publishing the same files in a scratch namespace), before the publish: once the same size as
/// the pack, once larger. The publisher reads each back, finds it is not its pack, puts its own
/// copy under a salted key, and no generation references a planted value; a `required` install
/// gets the right bytes. (Before the fix the publisher took "exists" for "already uploaded" and
/// the manifest named the planted packs.)
#[test]
fn a_pack_planted_under_its_predictable_key_is_never_referenced() {
    let key = PublisherKey::generate().unwrap();
    for b in backends("hostile_planted_pack", Place::Local) {
        let mut s = Scenario::new(b.store.clone(), "kernels");
        s.layout = b.layout.clone();
        s.pack_size = 16 << 10;
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        triton_tree(&src, 6, 3);
        // Larger than a pack: split across packs, checked against this root's bytes.
        let big: Vec<u8> = (0..40_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(src.join("big.bin"), &big).unwrap();

        let scratch = KeyLayout::new(&format!("{}-scratch", b.layout.namespace())).unwrap();
        let mut predict = Scenario::new(b.store.clone(), "kernels");
        predict.layout = scratch.clone();
        predict.pack_size = s.pack_size;
        let (g0, _) = published(&publish_signed(&predict, &src, &key).unwrap());
        let predicted = catalog::fetch_manifest(b.store.as_ref(), &scratch, &g0)
            .unwrap()
            .unwrap()
            .packs;
        assert!(predicted.len() >= 3, "{predicted:?}");
        for (i, p) in predicted.iter().enumerate() {
            let garbage = vec![0xA5u8; p.size as usize + if i % 2 == 0 { 0 } else { 10 }];
            b.store
                .put(&b.layout.pack(&p.id), &garbage, ValueClass::Bulk)
                .unwrap();
        }

        let r = publish_signed(&s, &src, &key).unwrap();
        let (g, _) = published(&r);
        assert_eq!(
            r.packs_reused, 0,
            "[{}] reused a planted pack: {r:?}",
            b.name
        );
        let m = catalog::fetch_manifest(b.store.as_ref(), &b.layout, &g)
            .unwrap()
            .unwrap();
        for p in &m.packs {
            assert!(
                !predicted.iter().any(|planted| planted.id == p.id),
                "[{}] generation {g} references the planted pack {}",
                b.name,
                p.id
            );
        }
        let v = jitship::inspect::verify(b.store.as_ref(), &b.layout, &g).unwrap();
        assert!(v.ok, "[{}] {:?}", b.name, v.problems);

        let root = tmp.path().join("root");
        let r = install_required(&s, &root, &key);
        assert_eq!(
            r.outcome,
            InstallOutcome::Installed,
            "[{}] {}",
            b.name,
            r.detail
        );
        assert_eq!(r.generation, Some(g), "[{}]", b.name);
        assert!(r.damaged.is_empty(), "[{}] {:?}", b.name, r.damaged);
        assert_eq!(tree(&src), tree(&root), "[{}]", b.name);

        // A second honest publisher of the same files in a fresh chain meets the same planted
        // keys, moves to the same salted keys and shares the copies already there.
        let mut other = Scenario::new(b.store.clone(), "kernels");
        other.layout = KeyLayout::new(&format!("{}-other", b.layout.namespace())).unwrap();
        other.pack_size = s.pack_size;
        for p in &predicted {
            let garbage = vec![0x5Au8; p.size as usize];
            other
                .store
                .put(&other.layout.pack(&p.id), &garbage, ValueClass::Bulk)
                .unwrap();
        }
        for p in &m.packs {
            let bytes = b.store.get(&b.layout.pack(&p.id)).unwrap().unwrap();
            other
                .store
                .put(&other.layout.pack(&p.id), &bytes, ValueClass::Bulk)
                .unwrap();
        }
        let r = publish_signed(&other, &src, &key).unwrap();
        assert_eq!(r.packs_uploaded, 0, "[{}] {r:?}", b.name);
        assert_eq!(r.packs_reused as usize, m.packs.len(), "[{}] {r:?}", b.name);
    }
}

/// A parent generation whose pack was replaced by garbage of the same size (removed and put
/// again: the store lets anyone) is not inherited: the next trusted publish reads the parent's
/// packs back, drops the files of the bad pack and uploads them again under a key that works, so
/// the new generation installs whole under `required`. (Before the fix it named the bad pack,
/// like every later generation.)
#[test]
fn a_parent_pack_replaced_by_garbage_is_not_inherited() {
    let key = PublisherKey::generate().unwrap();
    for b in backends("hostile_parent_pack", Place::Local) {
        let mut s = Scenario::new(b.store.clone(), "kernels");
        s.layout = b.layout.clone();
        s.pack_size = 16 << 10;
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        triton_tree(&src, 4, 5);
        let (g1, _) = published(&publish_signed(&s, &src, &key).unwrap());
        let m1 = catalog::fetch_manifest(b.store.as_ref(), &b.layout, &g1)
            .unwrap()
            .unwrap();
        let bad = m1.packs[0].clone();
        let pack_key = b.layout.pack(&bad.id);
        assert!(remove_retrying(b.store.as_ref(), &pack_key));
        b.store
            .put(
                &pack_key,
                &vec![0xA5u8; bad.size as usize],
                ValueClass::Bulk,
            )
            .unwrap();

        triton_tree(&src, 2, 6);
        let (g2, _) = published(&publish_signed(&s, &src, &key).unwrap());
        let m2 = catalog::fetch_manifest(b.store.as_ref(), &b.layout, &g2)
            .unwrap()
            .unwrap();
        assert!(
            !m2.packs.iter().any(|p| p.id == bad.id),
            "[{}] generation {g2} inherits the bad pack {}",
            b.name,
            bad.id
        );
        let v = jitship::inspect::verify(b.store.as_ref(), &b.layout, &g2).unwrap();
        assert!(v.ok, "[{}] {:?}", b.name, v.problems);
        let root = tmp.path().join("root");
        let r = install_required(&s, &root, &key);
        assert_eq!(r.generation, Some(g2), "[{}] {}", b.name, r.detail);
        assert!(r.damaged.is_empty(), "[{}] {:?}", b.name, r.damaged);
        assert_eq!(tree(&src), tree(&root), "[{}]", b.name);
    }
}

fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid)).unwrap();
}

/// The tests that give a directory to another user need to be root (as jitship is in an init
/// container); they fail, never pass, without.
fn assert_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test chowns directories to another user: run it as root"
    );
}

/// A publisher's generation, for the install tests below.
fn published_scenario(name: &str) -> (jitship_tests::backends::Backend, Scenario) {
    let b = backends(name, Place::Local).remove(0);
    let mut s = Scenario::new(b.store.clone(), "kernels");
    s.layout = b.layout.clone();
    let src = tempfile::tempdir().unwrap();
    triton_tree(src.path(), 2, 1);
    published(&s.publish(src.path()).unwrap());
    (b, s)
}

/// A root another (non-root) user created first, or a symlink to a directory they own, is
/// refused: the install fails naming the owner and leaves the directory as it was. (Before the
/// fix the verified files went into the other user's directory.)
#[test]
fn an_install_refuses_a_root_another_user_owns() {
    assert_root();
    let (_b, s) = published_scenario("hostile_root_owner");
    let tmp = tempfile::tempdir().unwrap();
    let planted = tmp.path().join("planted");
    std::fs::create_dir(&planted).unwrap();
    chown(&planted, OTHER_UID);
    let link = tmp.path().join("link");
    let theirs = tmp.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    chown(&theirs, OTHER_UID);
    std::os::unix::fs::symlink(&theirs, &link).unwrap();
    for (root, owned) in [(&planted, &planted), (&link, &theirs)] {
        let r = s.install(root);
        assert_eq!(
            r.outcome,
            InstallOutcome::Failed,
            "{}: {}",
            root.display(),
            r.detail
        );
        assert!(
            r.detail.contains(&format!("uid {OTHER_UID}")),
            "the error names the owner: {}",
            r.detail
        );
        assert!(
            tree(owned).is_empty(),
            "{} was written into",
            owned.display()
        );
    }
}

/// A root writable by group and others that is not ours (root-owned, while we are not root, is
/// the same rule; here: another user's sticky 01777 directory) is refused too.
#[test]
fn an_install_refuses_a_world_writable_root_of_another_user() {
    assert_root();
    let (_b, s) = published_scenario("hostile_root_writable");
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("shared");
    std::fs::create_dir(&root).unwrap();
    chown(&root, OTHER_UID);
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let r = s.install(&root);
    assert_eq!(r.outcome, InstallOutcome::Failed, "{}", r.detail);
    assert!(tree(&root).is_empty());
}

/// An empty root of ours with mode 0777 (what someone could have made of the default root under
/// /tmp before jitship ran as root) is replaced by the installed tree without group or other
/// write permission. (Before the fix the tree was given the planted 0777.)
#[test]
fn a_replaced_empty_root_never_keeps_group_or_other_write() {
    let (_b, s) = published_scenario("hostile_root_mode");
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
    let r = s.install(&root);
    assert_eq!(r.outcome, InstallOutcome::Installed, "{}", r.detail);
    let mode = std::fs::metadata(&root).unwrap().mode() & 0o7777;
    assert_eq!(mode & 0o022, 0, "the root kept mode {mode:o}");
    assert_eq!(mode, 0o755, "the rest of the planted mode is kept");
}

/// A publisher does not sign what another user could have planted: a root they own is refused
/// with the owner named. (Before the fix their files were published.)
#[test]
fn a_publish_refuses_a_root_another_user_owns() {
    assert_root();
    let b = backends("hostile_root_publish", Place::Local).remove(0);
    let mut s = Scenario::new(b.store.clone(), "kernels");
    s.layout = b.layout.clone();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("theirs");
    triton_tree(&root, 1, 1);
    chown(&root, OTHER_UID);
    let e = s.publish(&root).unwrap_err();
    assert!(e.to_string().contains(&format!("uid {OTHER_UID}")), "{e}");
}
