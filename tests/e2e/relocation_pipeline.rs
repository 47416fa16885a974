//! The relocation pipeline of the host with a native `CachePolicy` (no wasm, no engine): files
//! whose decision has `embeds_root` are stored in the policy's canonical form (hashed and deduped
//! as such, `FileRecord::canonical`), verified as stored, materialized for the installing root
//! before they enter it, listed in the install report, compared in canonical form by "already on
//! disk", and checked as stored by `verify`. The policy here writes `{ROOT}` for the root; the
//! Triton one is tested natively in `policies/common` and end to end in `relocation.rs`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use jitship::catalog::KeyLayout;
use jitship::facts::Facts;
use jitship::install::{InstallOptions, InstallOutcome, InstallReport};
use jitship::policy::native::NativeRules;
use jitship::policy::testing::HookedPolicy;
use jitship::policy::{CachePolicy, PolicyError};
use jitship::publish::{PublishOutcome, PublishReport};
use jitship::store::Store;
use jitship::store::local::LocalStore;

/// Native rules, plus: `*.grp` files name the root, written `{ROOT}` in canonical form. The
/// state says whether materializing is refused.
type Templated = HookedPolicy<NativeRules, bool>;

fn templated(refuse_materialize: bool) -> Templated {
    HookedPolicy::new(NativeRules::new("relocatable"), refuse_materialize)
        .on_select(|inner, _, root, entries| {
            let mut s = inner.select(root, entries)?;
            for (e, d) in entries.iter().zip(&mut s.decisions) {
                d.embeds_root = e.path.ends_with(".grp");
            }
            Ok(s)
        })
        .on_canonicalize(|_, _, root, path, content| {
            let text = String::from_utf8_lossy(content);
            let root = root_str(root);
            if !text.contains(&root) {
                return Err(PolicyError::InvalidInput(format!(
                    "{path} names another root"
                )));
            }
            Ok(text.replace(&root, "{ROOT}").into_bytes())
        })
        .on_materialize(|_, refuse, root, path, content| {
            if *refuse {
                return Err(PolicyError::InvalidInput(format!("cannot place {path}")));
            }
            let text = String::from_utf8_lossy(content);
            Ok(text.replace("{ROOT}", &root_str(root)).into_bytes())
        })
}

fn root_str(root: &Path) -> String {
    root.display().to_string()
}

struct World {
    _tmp: tempfile::TempDir,
    dir: std::path::PathBuf,
    store: Arc<dyn Store>,
    layout: KeyLayout,
    facts: Facts,
}

impl World {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_owned();
        let store: Arc<dyn Store> = Arc::new(LocalStore::open(dir.join("store")).unwrap());
        let mut facts = Facts::new();
        facts.set("test.tag", "relocation");
        Self {
            _tmp: tmp,
            dir,
            store,
            layout: KeyLayout::new("jitship").unwrap(),
            facts,
        }
    }

    /// A pod's cache at `rel`: a kernel's data and the group file naming it by absolute path.
    fn pod(&self, rel: &str, kernel: &str) -> std::path::PathBuf {
        let root = self.dir.join(rel);
        self.kernel(&root, kernel);
        root
    }

    fn kernel(&self, root: &Path, kernel: &str) {
        std::fs::create_dir_all(root.join(kernel)).unwrap();
        std::fs::write(
            root.join(kernel).join("data.bin"),
            format!("{kernel} bytes"),
        )
        .unwrap();
        std::fs::write(
            root.join(kernel).join("k.grp"),
            format!("child={}/{kernel}/data.bin\n", root.display()),
        )
        .unwrap();
    }

    fn publish(&self, policy: &Templated, root: &Path) -> PublishReport {
        let opts = jitship_tests::harness::publish_options(&self.facts, 1 << 20, "pod-a");
        jitship::publish::publish(self.store.as_ref(), &self.layout, policy, root, &opts, None)
            .unwrap()
    }

    fn install(&self, policy: Templated, root: &Path) -> InstallReport {
        let opts = InstallOptions {
            deadline: Duration::from_secs(60),
            ..InstallOptions::default()
        };
        jitship::install::install(
            self.store.clone(),
            &self.layout,
            Arc::new(policy),
            root,
            &self.facts,
            &opts,
        )
    }
}

#[test]
fn canonical_files_dedup_across_roots_and_materialize_at_install() {
    let w = World::new();
    let policy = templated(false);
    let a = w.pod("pod-a/cache", "k1");
    let b = w.pod("pod-b/a/longer/root", "k1");

    let first = w.publish(&policy, &a);
    let PublishOutcome::Published { generation, .. } = first.outcome else {
        panic!("{first:?}")
    };
    let m = jitship::catalog::fetch_manifest(w.store.as_ref(), &w.layout, &generation)
        .unwrap()
        .unwrap();
    let grp = m
        .files
        .iter()
        .find(|f| f.path.as_str() == "k1/k.grp")
        .unwrap();
    assert!(grp.canonical);
    assert_eq!(
        grp.blake3,
        blake3::hash(b"child={ROOT}/k1/data.bin\n").into()
    );
    let data = m
        .files
        .iter()
        .find(|f| f.path.as_str() == "k1/data.bin")
        .unwrap();
    assert!(!data.canonical);

    // Another root, the same kernel: nothing new to store.
    let second = w.publish(&policy, &b);
    assert_eq!(second.bytes_uploaded, 0, "{second:?}");
    assert!(
        matches!(second.outcome, PublishOutcome::Unchanged { .. }),
        "{second:?}"
    );

    // Install at a third root: the group names that root.
    let c = w.dir.join("pod-c/x");
    let r = w.install(templated(false), &c);
    assert_eq!(r.outcome, InstallOutcome::Installed, "{r:?}");
    assert_eq!(r.files_materialized, vec!["k1/k.grp".to_string()]);
    assert_eq!(
        std::fs::read_to_string(c.join("k1/k.grp")).unwrap(),
        format!("child={}/k1/data.bin\n", c.display())
    );
    // Already on disk: compared in canonical form.
    let again = w.install(templated(false), &c);
    assert_eq!(again.outcome, InstallOutcome::AlreadyCurrent, "{again:?}");
    assert_eq!(again.files_already_present, 2);

    // verify checks the bytes as stored (canonical).
    let v = jitship::inspect::verify(w.store.as_ref(), &w.layout, &generation).unwrap();
    assert!(v.ok && v.files_checked == 2, "{v:?}");

    // Republishing the installed root uploads nothing: its group canonicalizes to the same bytes.
    let third = w.publish(&policy, &c);
    assert_eq!(third.bytes_uploaded, 0, "{third:?}");
    assert_eq!(
        third.files_hashed, 1,
        "only the group is canonicalized again"
    );
}

#[test]
fn install_on_a_locally_grown_cache_and_a_refused_materialization() {
    let w = World::new();
    let policy = templated(false);
    let a = w.pod("pod-a/cache", "k1");
    w.publish(&policy, &a);

    // A pod that grew kernel k2 itself gets k1 added beside it, then publishes both.
    let d = w.pod("pod-d/cache", "k2");
    let r = w.install(templated(false), &d);
    assert_eq!(r.outcome, InstallOutcome::Installed, "{r:?}");
    assert_eq!(
        std::fs::read_to_string(d.join("k1/k.grp")).unwrap(),
        format!("child={}/k1/data.bin\n", d.display())
    );
    let p = w.publish(&policy, &d);
    assert!(
        matches!(p.outcome, PublishOutcome::Published { .. }),
        "{p:?}"
    );
    assert_eq!(p.files_selected, 4);

    // A policy that cannot materialize: the install fails and the root is left as it was.
    let e = w.dir.join("pod-e/cache");
    let refusing = templated(true);
    let r = w.install(refusing, &e);
    assert_eq!(r.outcome, InstallOutcome::Failed, "{r:?}");
    assert!(r.detail.contains("cannot place"), "{}", r.detail);
    assert!(!e.exists() || std::fs::read_dir(&e).unwrap().next().is_none());
}
