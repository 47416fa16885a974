//! The foundation's promises on the embedded local store: round trips, incremental and
//! deduplicated uploads, verification, malicious manifests, deadlines and concurrent installers.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use jitship::generation::{CompatId, ContentHash, GenerationId, HeadRecord};
use jitship::install::InstallOutcome;
use jitship::publish::PublishOutcome;
use jitship::store::testing::{Hooked, slow_gets};
use jitship::store::{LocalStore, Store, ValueClass};
use jitship_tests::fixtures::{self, digest};
use jitship_tests::harness::Scenario;

fn local(dir: &Path) -> Arc<dyn Store> {
    Arc::new(LocalStore::open(dir.join("store")).unwrap())
}

fn packs_in(store_dir: &Path) -> Vec<std::path::PathBuf> {
    let dir = store_dir.join("store/jitship/pack");
    let mut v: Vec<_> = fs::read_dir(&dir)
        .map(|r| r.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn round_trip_preserves_content_modes_and_mtimes() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fixtures::triton_tree(&src, 40, 1);
    fixtures::large_files_tree(&src, 2, 3 << 20, 9);
    fs::set_permissions(
        src.join("rank_0_0/model"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    fs::write(src.join("empty"), b"").unwrap();
    let s = Scenario::new(local(t.path()), "triton");
    let report = s.publish(&src).unwrap();
    assert!(
        matches!(report.outcome, PublishOutcome::Published { seq: 1, .. }),
        "{report:?}"
    );

    let dst = t.path().join("dst");
    let installed = s.install(&dst);
    assert_eq!(
        installed.outcome,
        InstallOutcome::Installed,
        "{}",
        installed.detail
    );
    assert_eq!(digest(&src), digest(&dst));

    // Into an existing root holding part of the files: only the rest is written.
    let partial = t.path().join("partial");
    fs::create_dir_all(&partial).unwrap();
    fs::write(partial.join("empty"), b"").unwrap();
    let r = s.install(&partial);
    assert_eq!(r.outcome, InstallOutcome::Installed, "{}", r.detail);
    assert_eq!(r.files_already_present, 1);
    let mut want = digest(&src);
    let mut got = digest(&partial);
    want.remove("empty");
    got.remove("empty");
    assert_eq!(want, got);
    assert_eq!(s.install(&dst).outcome, InstallOutcome::AlreadyCurrent);
}

#[test]
fn unchanged_tree_uploads_nothing_and_grown_tree_only_new_files() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fixtures::triton_tree(&src, 30, 2);
    let s = Scenario::new(local(t.path()), "triton");
    let first = s.publish(&src).unwrap();
    assert!(first.bytes_uploaded > 0);

    let again = s.publish(&src).unwrap();
    assert!(
        matches!(again.outcome, PublishOutcome::Unchanged { .. }),
        "{again:?}"
    );
    assert_eq!(
        (
            again.bytes_uploaded,
            again.packs_uploaded,
            again.files_hashed
        ),
        (0, 0, 0)
    );

    let before = digest(&src);
    fixtures::triton_tree(&src, 35, 2); // adds 5 kernels
    let added: u64 = digest(&src)
        .keys()
        .filter(|k| !before.contains_key(*k))
        .map(|k| fs::metadata(src.join(k)).unwrap().len())
        .sum();
    let grown = s.publish(&src).unwrap();
    assert!(
        matches!(grown.outcome, PublishOutcome::Published { seq: 2, .. }),
        "{grown:?}"
    );
    assert_eq!(grown.files_new, 5 * 8);
    assert_eq!(
        grown.bytes_uploaded, added,
        "only the new files' bytes are uploaded"
    );

    let dst = t.path().join("dst");
    assert_eq!(s.install(&dst).outcome, InstallOutcome::Installed);
    assert_eq!(digest(&src), digest(&dst));
}

#[test]
fn two_pods_with_the_same_files_share_packs() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (t.path().join("pod-a"), t.path().join("pod-b"));
    fixtures::triton_tree(&a, 25, 3);
    fixtures::copy_tree(&a, &b);
    let store = local(t.path());
    // Two deployments (different namespaces) that compiled the same kernels store them once.
    let mut sa = Scenario::new(store.clone(), "triton");
    let mut sb = Scenario::new(store, "triton");
    sa.layout = jitship::catalog::KeyLayout::new("shared/a").unwrap();
    sb.layout = jitship::catalog::KeyLayout::new("shared/a").unwrap();
    sb.facts.set("model.id", "other-model"); // another compat key, same kernels
    let ra = sa.publish(&a).unwrap();
    let rb = sb.publish(&b).unwrap();
    assert!(ra.packs_uploaded > 0);
    assert_eq!(rb.packs_uploaded, 0, "{rb:?}");
    assert_eq!(rb.packs_reused, ra.packs_uploaded);
    assert_eq!(rb.bytes_deduplicated, ra.bytes_uploaded);
}

#[test]
fn flipped_byte_in_a_pack_is_refused_and_the_root_untouched() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fixtures::triton_tree(&src, 10, 4);
    let s = Scenario::new(local(t.path()), "triton");
    s.publish(&src).unwrap();
    let pack = packs_in(t.path()).into_iter().next().unwrap();
    let mut bytes = fs::read(&pack).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    fs::write(&pack, bytes).unwrap();

    let fresh = t.path().join("fresh");
    let r = s.install(&fresh);
    assert_eq!(r.outcome, InstallOutcome::Failed);
    assert!(r.detail.contains("does not match"), "{}", r.detail);
    assert!(!fresh.exists(), "a failed install must not create the root");

    let existing = t.path().join("existing");
    fs::create_dir_all(existing.join("keep")).unwrap();
    fs::write(existing.join("keep/me"), b"mine").unwrap();
    let before = digest(&existing);
    assert_eq!(s.install(&existing).outcome, InstallOutcome::Failed);
    assert_eq!(digest(&existing), before);
    assert_eq!(
        fs::read_dir(t.path())
            .unwrap()
            .filter(|e| e
                .as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains("staging"))
            .count(),
        0
    );
}

/// Writes `manifest_json` as a generation and points a head at it, the way a hostile or buggy
/// publisher could (ids are hashes of bytes, so they are easy to make consistent).
fn plant(s: &Scenario, manifest_json: &str) {
    let id = GenerationId(ContentHash::of(manifest_json.as_bytes()));
    s.store
        .put(
            &s.layout.generation(&id),
            manifest_json.as_bytes(),
            ValueClass::Record,
        )
        .unwrap();
    let key = s.policy_key();
    let compat = CompatId::new("triton", &key);
    let head = HeadRecord {
        compat_id: compat,
        seq: 1,
        generation: id,
        written_at: 0,
        writer: "evil".into(),
        signature: None,
    };
    s.store
        .put(
            &s.layout.head(&compat, 1),
            &head.encode(),
            ValueClass::Record,
        )
        .unwrap();
}

trait Key {
    fn policy_key(&self) -> String;
}
impl Key for Scenario {
    fn policy_key(&self) -> String {
        use jitship::policy::CachePolicy;
        self.policy.compat_key(&self.facts).unwrap()
    }
}

fn manifest_with_files(s: &Scenario, files: &str, extra_pack: bool) -> String {
    let key = s.policy_key();
    let compat = CompatId::new("triton", &key);
    let key_json = serde_json::to_string(&key).unwrap();
    let packs = if extra_pack {
        format!(r#"[{{"id":"{}","size":4}}]"#, ContentHash::of(b"pack"))
    } else {
        "[]".into()
    };
    format!(
        r#"{{"format":1,"cache_kind":"triton","compat_key":{key_json},"compat_id":"{compat}","facts":{{}},"policy":{{"name":"native","version":"1","digest":"native"}},"parent":null,"merged":[],"producer":{{"host":"h","pod":null,"jitship_version":"0"}},"created_at":0,"packs":{packs},"files":[{files}]}}"#
    )
}

fn file_json(path: &str, mode: u32, extra: &str) -> String {
    format!(
        r#"{{"path":{},"size":4,"mode":{mode},"mtime_s":0,"mtime_ns":0,"blake3":"{}","chunks":[{{"pack":0,"offset":0,"len":4}}]{extra}}}"#,
        serde_json::to_string(path).unwrap(),
        ContentHash::of(b"evil")
    )
}

#[test]
fn malicious_manifests_are_refused_before_any_write() {
    let cases = [
        ("absolute path", file_json("/etc/cron.d/x", 0o644, "")),
        ("parent escape", file_json("../outside", 0o644, "")),
        ("nested escape", file_json("a/../../outside", 0o644, "")),
        (
            "symlink",
            file_json("link", 0o644, r#","symlink":"/etc/passwd""#),
        ),
        ("device file", file_json("dev", 0o20644, "")),
        ("setuid file", file_json("suid", 0o4755, "")),
        (
            "duplicate path",
            format!(
                "{},{}",
                file_json("dup", 0o644, ""),
                file_json("dup", 0o644, "")
            ),
        ),
        (
            "file and directory",
            format!(
                "{},{}",
                file_json("a", 0o644, ""),
                file_json("a/b", 0o644, "")
            ),
        ),
    ];
    for (name, files) in cases {
        let t = tempfile::tempdir().unwrap();
        let s = Scenario::new(local(t.path()), "triton");
        // The pack exists, so only the manifest's own content can cause the refusal.
        s.store
            .put(
                &s.layout.pack(&ContentHash::of(b"pack")),
                b"evil",
                ValueClass::Bulk,
            )
            .unwrap();
        plant(&s, &manifest_with_files(&s, &files, true));
        let root = t.path().join("root");
        fs::create_dir_all(&root).unwrap();
        let r = s.install(&root);
        assert_eq!(r.outcome, InstallOutcome::Failed, "{name}: {}", r.detail);
        assert!(r.detail.contains("manifest"), "{name}: {}", r.detail);
        assert_eq!(
            fs::read_dir(&root).unwrap().count(),
            0,
            "{name}: something was written"
        );
        assert!(
            !t.path().join("outside").exists() && !t.path().join("dev").exists(),
            "{name}"
        );
        let siblings: Vec<_> = fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            siblings.iter().all(|n| !n.contains("staging")),
            "{name}: {siblings:?}"
        );
    }
}

#[test]
fn deadline_expiry_leaves_the_root_untouched() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fixtures::triton_tree(&src, 20, 5);
    let mut s = Scenario::new(local(t.path()), "triton");
    s.pack_size = 16 * 1024; // many packs, each slow to fetch
    s.publish(&src).unwrap();
    // A slow or hung store node: every pack read takes 300 ms.
    let packs = s.layout.packs_prefix();
    s.store = Arc::new(slow_gets(
        s.store.clone(),
        Duration::from_millis(300),
        move |key| key.starts_with(&packs),
    ));

    let root = t.path().join("root");
    fs::create_dir_all(root.join("mine")).unwrap();
    fs::write(root.join("mine/file"), b"keep").unwrap();
    let before = digest(&root);
    let r = s.install_within(&root, Duration::from_millis(800));
    assert_eq!(r.outcome, InstallOutcome::Deadline);
    assert!(r.detail.contains("deadline"), "{}", r.detail);
    assert!(
        r.duration_ms < 5_000,
        "the deadline bounds the install: {} ms",
        r.duration_ms
    );
    // install_within returned once the abandoned job had ended: nothing can change the root now.
    assert_eq!(digest(&root), before);
    let fresh = t.path().join("fresh");
    assert_eq!(
        s.install_within(&fresh, Duration::from_millis(500)).outcome,
        InstallOutcome::Deadline
    );
    assert!(!fresh.exists());
    let leftovers: Vec<_> = fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("staging"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn concurrent_installers_on_one_root_end_consistent() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fixtures::triton_tree(&src, 60, 6);
    let s = Arc::new(Scenario::new(local(t.path()), "triton"));
    s.publish(&src).unwrap();
    for round in 0..3 {
        let root = t.path().join(format!("root{round}"));
        if round == 2 {
            fs::create_dir_all(&root).unwrap(); // an existing, empty root: file-by-file commit
        }
        let outcomes: Vec<InstallOutcome> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|_| scope.spawn(|| s.install(&root).outcome))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(
            outcomes
                .iter()
                .filter(|o| **o == InstallOutcome::Installed)
                .count(),
            1,
            "{outcomes:?}"
        );
        assert_eq!(
            outcomes
                .iter()
                .filter(|o| **o == InstallOutcome::AlreadyCurrent)
                .count(),
            3,
            "{outcomes:?}"
        );
        assert_eq!(digest(&src), digest(&root));
    }
}

/// A store that fails every put after the first `allowed`: a publisher crashing mid-publish.
fn failing_after(inner: Arc<dyn Store>, allowed: usize) -> Hooked<Arc<dyn Store>, AtomicUsize> {
    Hooked::new(inner, AtomicUsize::new(allowed)).on_put(|inner, allowed, key, value, class| {
        if allowed
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_err()
        {
            return Err(jitship::store::StoreError::Unavailable(
                "injected crash".into(),
            ));
        }
        inner.put(key, value, class)
    })
}

#[test]
fn a_crash_anywhere_in_a_publish_leaves_nothing_visible_and_the_next_publish_recovers() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fixtures::triton_tree(&src, 30, 7);
    // A full publish needs one put per pack, then the manifest, then the head.
    let mut probe = Scenario::new(local(&t.path().join("probe")), "triton");
    probe.pack_size = 64 * 1024;
    let packs = probe.publish(&src).unwrap().packs_uploaded as usize;
    assert!(packs > 3, "the tree must need several packs, got {packs}");
    for allowed in 0..packs + 2 {
        let dir = t.path().join(format!("crash{allowed}"));
        let base = local(&dir);
        let mut s = Scenario::new(Arc::new(failing_after(base.clone(), allowed)), "triton");
        s.pack_size = 64 * 1024;
        assert!(
            s.publish(&src).is_err(),
            "publish with {allowed} puts allowed should fail"
        );
        s.store = base;
        let dst = dir.join("dst");
        assert_eq!(
            s.install(&dst).outcome,
            InstallOutcome::Miss,
            "a reader saw a partial publish after {allowed} puts"
        );
        assert!(!dst.exists());
        let r = s.publish(&src).unwrap();
        assert!(
            matches!(r.outcome, PublishOutcome::Published { seq: 1, .. }),
            "{:?}",
            r.outcome
        );
        assert_eq!(
            r.packs_reused as usize,
            allowed.min(packs),
            "packs stored before the crash are reused"
        );
        assert_eq!(s.install(&dst).outcome, InstallOutcome::Installed);
        assert_eq!(digest(&src), digest(&dst));
    }
}
