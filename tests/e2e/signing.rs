//! Signed generations (issue 12): a forged head, a replay under another compat id and another
//! namespace, an unsigned generation under `required`, an untrusted key, a key rotation, and a
//! corrupt pack repaired by `verify --repair` and republished; on the local store (with and
//! without listing) and, inside the test cluster, on Mooncake. The last test drives the real CLI:
//! `key generate`, signed `publish`, `install` exiting 14, `ls`/`inspect`/`verify` naming the key.

use std::path::Path;
use std::process::Output;
use std::sync::Arc;

use jitship::catalog;
use jitship::catalog::KeyLayout;
use jitship::config::TrustMode;
use jitship::generation::{ContentHash, GenerationId, HeadRecord};
use jitship::install::{InstallOutcome, InstallReport};
use jitship::publish::{PublishError, PublishReport};
use jitship::store::ValueClass;
use jitship::trust::{PublishTrust, PublisherKey, Signer, TrustPolicy};
use jitship_tests::backends::{Backend, Place, backends, cli_backends, remove_retrying};
use jitship_tests::fixtures::triton_tree;
use jitship_tests::harness::{Scenario, published};
use serde_json::Value;

fn scenario(b: &Backend) -> Scenario {
    let mut s = Scenario::new(b.store.clone(), "kernels");
    s.layout = b.layout.clone();
    // Larger than any fixture file: no file spans two packs, so a poisoned pack damages only its own files.
    s.pack_size = 64 << 10;
    s
}

fn trust(mode: TrustMode, keys: &[&PublisherKey]) -> TrustPolicy {
    let keys: Vec<_> = keys.iter().map(|k| k.public_key()).collect();
    TrustPolicy::new(mode, &keys)
}

fn publish(
    s: &Scenario,
    root: &Path,
    key: Option<&PublisherKey>,
    trust: TrustPolicy,
) -> Result<PublishReport, PublishError> {
    s.publish_trusting(
        root,
        PublishTrust::new(key.map(|k| Arc::new(k.clone())), Arc::new(trust)),
    )
}

fn install(s: &Scenario, root: &Path, trust: TrustPolicy) -> InstallReport {
    s.install_trusting(root, trust)
}

fn head(s: &Scenario, seq: u64) -> HeadRecord {
    let compat = jitship::generation::CompatId::new("kernels", &compat_key(s));
    catalog::read_head(s.store.as_ref(), &s.layout, &compat, seq)
        .unwrap()
        .unwrap_or_else(|| panic!("head {seq}"))
}

fn compat_key(s: &Scenario) -> String {
    use jitship::policy::CachePolicy;
    s.policy.compat_key(&s.facts).unwrap()
}

fn put_head(s: &Scenario, layout: &KeyLayout, h: &HeadRecord) {
    s.store
        .put(
            &layout.head(&h.compat_id, h.seq),
            &h.encode(),
            ValueClass::Record,
        )
        .unwrap();
}

jitship_tests::on_local_and_mooncake! {
    /// A head pointing at another generation, carrying a signature copied from a genuine head, is
    /// refused as forged; install falls back to the genuine generation below it.
    a_forged_head_is_refused_and_install_falls_back_to_the_signed_one,
    a_forged_head_is_refused_and_install_falls_back_to_the_signed_one_on_mooncake
        => a_forged_head_is_refused_and_install_falls_back_to_the_signed_one_on;
}

fn a_forged_head_is_refused_and_install_falls_back_to_the_signed_one_on(place: Place) {
    let key = PublisherKey::generate().unwrap();
    for b in backends("signing_forged", place) {
        let s = scenario(&b);
        let tmp = tempfile::tempdir().unwrap();
        let (good, evil) = (tmp.path().join("good"), tmp.path().join("evil"));
        triton_tree(&good, 2, 1);
        let (g1, _) = published(
            &publish(&s, &good, Some(&key), trust(TrustMode::Required, &[&key])).unwrap(),
        );
        // The attacker can write to the store: publishes its own generation unsigned (seq 2)...
        triton_tree(&evil, 2, 666);
        let (g_evil, seq) = published(&publish(&s, &evil, None, TrustPolicy::default()).unwrap());
        assert_eq!(seq, 2, "[{}]", b.name);
        // ...then a head above it that claims the publisher's signature.
        let mut forged = head(&s, 2);
        forged.seq = 3;
        forged.signature = head(&s, 1).signature;
        put_head(&s, &s.layout, &forged);

        let required = trust(TrustMode::Required, &[&key]);
        let survey = jitship::inspect::survey(s.store.as_ref(), &s.layout, &required).unwrap();
        let signers: Vec<(u64, String)> = survey
            .generations()
            .flat_map(|(_, g)| {
                g.signatures
                    .iter()
                    .map(|x| (x.seq, x.signer.status().to_owned()))
            })
            .collect();
        assert!(
            signers.contains(&(3, "forged".into()))
                && signers.contains(&(2, "unsigned".into()))
                && signers.contains(&(1, "trusted".into())),
            "[{}] {signers:?}",
            b.name
        );

        let root = tmp.path().join("root");
        let r = install(&s, &root, required);
        assert_eq!(
            r.outcome,
            InstallOutcome::Installed,
            "[{}] {}",
            b.name,
            r.detail
        );
        assert_eq!(r.generation, Some(g1), "[{}]", b.name);
        assert!(matches!(r.signer, Some(Signer::Trusted { .. })));
        assert_eq!(
            r.refused.iter().map(|x| x.seq).collect::<Vec<_>>(),
            vec![3, 2]
        );
        assert!(matches!(r.refused[0].signer, Signer::Forged { .. }));
        assert!(r.refused.iter().all(|x| x.generation == g_evil));
        assert_same_tree(&good, &root);

        // The publisher never builds on the refused heads: its next generation holds no evil file
        // and its signed head goes above them.
        triton_tree(&good, 3, 1);
        let r = publish(&s, &good, Some(&key), trust(TrustMode::Required, &[&key])).unwrap();
        let (g4, seq) = published(&r);
        assert_eq!(seq, 4, "[{}]", b.name);
        assert!(matches!(r.parent_signer, Some(Signer::Trusted { .. })));
        let m = catalog::fetch_manifest(s.store.as_ref(), &s.layout, &g4)
            .unwrap()
            .unwrap();
        assert_eq!(m.parent, Some(g1), "[{}]", b.name);
        let root2 = tmp.path().join("root2");
        let r = install(&s, &root2, trust(TrustMode::Required, &[&key]));
        assert_eq!(r.generation, Some(g4), "[{}] {}", b.name, r.detail);
        assert_same_tree(&good, &root2);
    }
}

jitship_tests::on_local_and_mooncake! {
    /// A validly signed head copied under another compat id (its compat id rewritten to match the
    /// key it sits at) or into another namespace does not verify there.
    a_signed_generation_replayed_under_another_compat_id_or_namespace_is_refused,
    a_signed_generation_replayed_under_another_compat_id_or_namespace_is_refused_on_mooncake
        => a_signed_generation_replayed_under_another_compat_id_or_namespace_is_refused_on;
}

fn a_signed_generation_replayed_under_another_compat_id_or_namespace_is_refused_on(place: Place) {
    let key = PublisherKey::generate().unwrap();
    for b in backends("signing_replay", place) {
        let s = scenario(&b);
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        triton_tree(&src, 2, 2);
        published(&publish(&s, &src, Some(&key), trust(TrustMode::Required, &[&key])).unwrap());
        let genuine = head(&s, 1);

        // Workers with another GPU: another compat id, nothing published for it.
        let mut other = scenario(&b);
        other.facts.set("gpu.name", "NVIDIA B200");
        let replayed = HeadRecord {
            compat_id: jitship::generation::CompatId::new("kernels", &compat_key(&other)),
            ..genuine.clone()
        };
        assert_ne!(replayed.compat_id, genuine.compat_id);
        put_head(&other, &other.layout, &replayed);
        let root = tmp.path().join("other-gpu");
        let r = install(&other, &root, trust(TrustMode::Required, &[&key]));
        assert_eq!(
            r.outcome,
            InstallOutcome::Untrusted,
            "[{}] {}",
            b.name,
            r.detail
        );
        assert_eq!(r.outcome.exit_code(), 14);
        assert!(matches!(r.refused[0].signer, Signer::Forged { .. }));
        assert!(!root.exists(), "[{}] nothing written", b.name);
        // Even with trust off the manifest's own compat id does not match: refused as a failure
        // naming both compat ids (issue 11's cross-compat check), never installed.
        let r = install(&other, &root, TrustPolicy::default());
        assert_eq!(
            r.outcome,
            InstallOutcome::Failed,
            "[{}] {}",
            b.name,
            r.detail
        );
        assert!(
            r.detail.contains("another cache"),
            "[{}] {}",
            b.name,
            r.detail
        );
        assert!(!root.exists());

        // Another namespace: the manifest and packs copied over too, the head verbatim.
        let mut elsewhere = scenario(&b);
        elsewhere.layout = KeyLayout::new(&format!("{}-replica", b.layout.namespace())).unwrap();
        let m = catalog::fetch_manifest(s.store.as_ref(), &s.layout, &genuine.generation)
            .unwrap()
            .unwrap();
        for p in &m.packs {
            let bytes = s.store.get(&s.layout.pack(&p.id)).unwrap().unwrap();
            s.store
                .put(&elsewhere.layout.pack(&p.id), &bytes, ValueClass::Bulk)
                .unwrap();
        }
        s.store
            .put(
                &elsewhere.layout.generation(&genuine.generation),
                &m.encode(),
                ValueClass::Record,
            )
            .unwrap();
        put_head(&elsewhere, &elsewhere.layout, &genuine);
        let r = install(&elsewhere, &root, trust(TrustMode::Required, &[&key]));
        assert_eq!(
            r.outcome,
            InstallOutcome::Untrusted,
            "[{}] {}",
            b.name,
            r.detail
        );
        assert!(matches!(r.refused[0].signer, Signer::Forged { .. }));
        assert!(!root.exists());
    }
}

jitship_tests::on_local_and_mooncake! {
    /// Unsigned generations: refused under `required` (exit 14, root untouched), used under `warn`
    /// and `off`; a publisher under `required` without a key refuses to publish.
    an_unsigned_generation_is_refused_under_required_only,
    an_unsigned_generation_is_refused_under_required_only_on_mooncake
        => an_unsigned_generation_is_refused_under_required_only_on;
}

fn an_unsigned_generation_is_refused_under_required_only_on(place: Place) {
    let key = PublisherKey::generate().unwrap();
    for b in backends("signing_unsigned", place) {
        let s = scenario(&b);
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        triton_tree(&src, 2, 3);
        let err = publish(&s, &src, None, trust(TrustMode::Required, &[&key])).unwrap_err();
        assert!(matches!(err, PublishError::NoSigningKey), "{err}");
        assert!(err.to_string().contains("jitship key generate"));
        let (g, _) = published(&publish(&s, &src, None, TrustPolicy::default()).unwrap());

        let root = tmp.path().join("required");
        let r = install(&s, &root, trust(TrustMode::Required, &[&key]));
        assert_eq!(
            r.outcome,
            InstallOutcome::Untrusted,
            "[{}] {}",
            b.name,
            r.detail
        );
        assert_eq!(r.refused[0].signer, Signer::Unsigned);
        assert!(r.detail.contains("unsigned"), "{}", r.detail);
        assert!(!root.exists(), "[{}] the root is untouched", b.name);
        for mode in [TrustMode::Warn, TrustMode::Off] {
            let root = tmp.path().join(format!("{mode:?}"));
            let r = install(&s, &root, trust(mode, &[&key]));
            assert_eq!(
                r.outcome,
                InstallOutcome::Installed,
                "[{}] {mode:?}",
                b.name
            );
            assert_eq!(r.generation, Some(g));
            assert_eq!(r.signer, Some(Signer::Unsigned));
            assert_same_tree(&src, &root);
        }
    }
}

jitship_tests::on_local_and_mooncake! {
    /// A generation signed by a key this host does not trust is refused, and its files are never
    /// merged into what a trusted publisher signs.
    a_generation_signed_by_an_untrusted_key_is_refused_and_never_built_on,
    a_generation_signed_by_an_untrusted_key_is_refused_and_never_built_on_on_mooncake
        => a_generation_signed_by_an_untrusted_key_is_refused_and_never_built_on_on;
}

fn a_generation_signed_by_an_untrusted_key_is_refused_and_never_built_on_on(place: Place) {
    let trusted = PublisherKey::generate().unwrap();
    let stranger = PublisherKey::generate().unwrap();
    for b in backends("signing_untrusted", place) {
        let s = scenario(&b);
        let tmp = tempfile::tempdir().unwrap();
        let (theirs, ours) = (tmp.path().join("theirs"), tmp.path().join("ours"));
        triton_tree(&theirs, 2, 4);
        let (g_theirs, _) =
            published(&publish(&s, &theirs, Some(&stranger), trust(TrustMode::Off, &[])).unwrap());
        let root = tmp.path().join("root");
        let r = install(&s, &root, trust(TrustMode::Required, &[&trusted]));
        assert_eq!(
            r.outcome,
            InstallOutcome::Untrusted,
            "[{}] {}",
            b.name,
            r.detail
        );
        assert_eq!(
            r.refused[0].signer,
            Signer::Untrusted {
                key_id: stranger.key_id().into()
            }
        );
        assert!(!root.exists());

        // A trusted publisher starts a fresh chain above it instead of inheriting its files.
        triton_tree(&ours, 1, 5);
        let r = publish(
            &s,
            &ours,
            Some(&trusted),
            trust(TrustMode::Required, &[&trusted]),
        )
        .unwrap();
        let (g_ours, seq) = published(&r);
        assert_eq!(seq, 2);
        assert_eq!(r.parent_signer, None, "[{}] no trusted parent", b.name);
        let m = catalog::fetch_manifest(s.store.as_ref(), &s.layout, &g_ours)
            .unwrap()
            .unwrap();
        assert_eq!(m.parent, None);
        assert!(!m.merged.contains(&g_theirs));
        let r = install(&s, &root, trust(TrustMode::Required, &[&trusted]));
        assert_eq!(r.generation, Some(g_ours), "[{}] {}", b.name, r.detail);
        assert_same_tree(&ours, &root);
    }
}

jitship_tests::on_local_and_mooncake! {
    /// Rotation: old and new key both trusted while publishers move to the new one; then the old
    /// one is removed, and only what the new key signed is installed.
    a_rotated_key_old_and_new_trusted_then_the_old_removed,
    a_rotated_key_old_and_new_trusted_then_the_old_removed_on_mooncake
        => a_rotated_key_old_and_new_trusted_then_the_old_removed_on;
}

fn a_rotated_key_old_and_new_trusted_then_the_old_removed_on(place: Place) {
    let old = PublisherKey::generate().unwrap();
    let new = PublisherKey::generate().unwrap();
    for b in backends("signing_rotation", place) {
        let s = scenario(&b);
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        triton_tree(&src, 2, 6);
        let (g1, _) =
            published(&publish(&s, &src, Some(&old), trust(TrustMode::Required, &[&old])).unwrap());
        let both = || trust(TrustMode::Required, &[&old, &new]);
        let r = install(&s, &tmp.path().join("a"), both());
        assert_eq!(r.generation, Some(g1), "[{}] {}", b.name, r.detail);

        // The publisher rotates: it builds on the old key's generation and signs with the new key.
        triton_tree(&src, 3, 6);
        let r = publish(&s, &src, Some(&new), both()).unwrap();
        let (g2, _) = published(&r);
        assert_eq!(
            r.parent_signer,
            Some(Signer::Trusted {
                key_id: old.key_id().into()
            })
        );
        assert_eq!(r.signed_by.as_deref(), Some(new.key_id()));
        let r = install(&s, &tmp.path().join("b"), both());
        assert_eq!(r.generation, Some(g2), "[{}] {}", b.name, r.detail);
        // Hosts that still trust only the old key fall back to the old key's generation.
        let r = install(
            &s,
            &tmp.path().join("c"),
            trust(TrustMode::Required, &[&old]),
        );
        assert_eq!(r.generation, Some(g1), "[{}] {}", b.name, r.detail);
        assert_eq!(r.refused.len(), 1);

        // The old key is removed: the new generation (with every file of the old one) installs;
        // the old key's head shows as untrusted.
        let only_new = trust(TrustMode::Required, &[&new]);
        let root = tmp.path().join("d");
        let r = install(&s, &root, only_new.clone());
        assert_eq!(r.generation, Some(g2), "[{}] {}", b.name, r.detail);
        assert_same_tree(&src, &root);
        let survey = jitship::inspect::survey(s.store.as_ref(), &s.layout, &only_new).unwrap();
        let g1_view = survey.generations().find(|(_, g)| g.id == g1).unwrap().1;
        assert_eq!(
            g1_view.signatures[0].signer,
            Signer::Untrusted {
                key_id: old.key_id().into()
            }
        );
        // With the newest generation signed by the old key only, nothing is installable.
        let s2 = {
            let mut s2 = scenario(&b);
            s2.facts.set("python.version", "3.13.1");
            s2
        };
        published(&publish(&s2, &src, Some(&old), trust(TrustMode::Off, &[])).unwrap());
        let r = install(&s2, &tmp.path().join("e"), only_new);
        assert_eq!(
            r.outcome,
            InstallOutcome::Untrusted,
            "[{}] {}",
            b.name,
            r.detail
        );
    }
}

jitship_tests::on_local_and_mooncake! {
    /// A poisoned pack (right size, wrong bytes) under a key puts never overwrite: install falls
    /// back to the older complete generation; `verify` + `repair` removes it; the next publish
    /// uploads it again and the newest generation installs and verifies clean.
    a_corrupt_pack_is_passed_over_repaired_and_republished,
    a_corrupt_pack_is_passed_over_repaired_and_republished_on_mooncake
        => a_corrupt_pack_is_passed_over_repaired_and_republished_on;
}

fn a_corrupt_pack_is_passed_over_repaired_and_republished_on(place: Place) {
    let key = PublisherKey::generate().unwrap();
    for b in backends("signing_repair", place) {
        let s = scenario(&b);
        let policy = || trust(TrustMode::Required, &[&key]);
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        triton_tree(&src, 1, 7);
        let (g1, _) = published(&publish(&s, &src, Some(&key), policy()).unwrap());
        triton_tree(&src, 3, 7);
        let (g2, _) = published(&publish(&s, &src, Some(&key), policy()).unwrap());
        let store = s.store.as_ref();
        let m1 = catalog::fetch_manifest(store, &s.layout, &g1)
            .unwrap()
            .unwrap();
        let m2 = catalog::fetch_manifest(store, &s.layout, &g2)
            .unwrap()
            .unwrap();
        let poisoned = m2
            .packs
            .iter()
            .find(|p| !m1.packs.contains(p))
            .expect("gen 2 has a pack of its own")
            .clone();
        let pack_key = s.layout.pack(&poisoned.id);
        let mut bytes = store.get(&pack_key).unwrap().unwrap();
        bytes.iter_mut().for_each(|x| *x = !*x);
        assert!(remove_retrying(store, &pack_key));
        store.put(&pack_key, &bytes, ValueClass::Bulk).unwrap();

        let root = tmp.path().join("root");
        let r = install(&s, &root, policy());
        assert_eq!(
            r.outcome,
            InstallOutcome::Installed,
            "[{}] {}",
            b.name,
            r.detail
        );
        assert_eq!(r.generation, Some(g1), "[{}] fell back", b.name);
        assert_eq!(r.damaged.len(), 1, "{:?}", r.damaged);
        assert!(r.damaged[0].contains(&g2.to_string()));

        let v = jitship::inspect::verify(store, &s.layout, &g2).unwrap();
        assert!(!v.ok);
        assert!(v.problems.iter().any(|p| matches!(
            p,
            jitship::inspect::Problem::FileCorrupt { packs, .. } if packs.contains(&poisoned.id)
        )));
        let survey = jitship::inspect::survey(store, &s.layout, &policy()).unwrap();
        let trust = policy();
        let removed = jitship::inspect::Repairer::new(store, &s.layout, &survey, &trust)
            .repair(&v)
            .unwrap()
            .removed;
        assert_eq!(removed, vec![poisoned.id], "[{}]", b.name);
        assert!(!store.exists(&pack_key).unwrap());

        // The watcher or the next publish sees the parent lost a pack and uploads it again.
        let r = publish(&s, &src, Some(&key), policy()).unwrap();
        let (g3, _) = published(&r);
        assert!(r.packs_uploaded >= 1, "[{}] {r:?}", b.name);
        let v = jitship::inspect::verify(store, &s.layout, &g3).unwrap();
        assert!(v.ok, "[{}] {:?}", b.name, v.problems);
        let root = tmp.path().join("root2");
        let r = install(&s, &root, policy());
        assert_eq!(r.generation, Some(g3), "[{}] {}", b.name, r.detail);
        assert!(r.damaged.is_empty());
        assert_same_tree(&src, &root);
    }
}

fn assert_same_tree(a: &Path, b: &Path) {
    let list = |root: &Path| -> Vec<(String, ContentHash)> {
        let mut out: Vec<_> = jitship_tests::fixtures::files_under(root)
            .into_iter()
            .map(|p| {
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                (rel, ContentHash::of(&std::fs::read(&p).unwrap()))
            })
            .collect();
        out.sort();
        out
    };
    assert_eq!(list(a), list(b), "{} vs {}", a.display(), b.display());
}

// ---------------------------------------------------------------------------------------------
// Through the CLI

fn jitship(flags: &[String], args: &[&str]) -> Output {
    jitship_tests::cli::jitship()
        .arg(args[0])
        .args(flags)
        .args(&args[1..])
        .env("RUST_LOG", "warn")
        .env_remove("JITSHIP_SIGNING_KEY_FILE")
        .env_remove("JITSHIP_TRUSTED_KEYS")
        .env_remove("JITSHIP_TRUST_MODE")
        .output()
        .expect("run jitship-e2e")
}

fn expect(b: &Backend, flags: &[String], args: &[&str], code: i32) -> String {
    let out = jitship(flags, args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(code),
        "[{}] jitship {}:\n{stdout}\n{}",
        b.name,
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

jitship_tests::on_local_and_mooncake! {
    the_cli_generates_keys_signs_refuses_with_exit_14_and_repairs,
    the_cli_generates_keys_signs_refuses_with_exit_14_and_repairs_on_mooncake
        => the_cli_generates_keys_signs_refuses_with_exit_14_and_repairs_on;
}

fn the_cli_generates_keys_signs_refuses_with_exit_14_and_repairs_on(place: Place) {
    for b in cli_backends("signing_cli", place) {
        let tmp = tempfile::tempdir().unwrap();
        let key_file = tmp.path().join("publisher.key");
        let key_arg = key_file.display().to_string();
        let public = expect(&b, &[], &["key", "generate", "--out", &key_arg], 0);
        let public = public.trim().to_owned();
        assert!(
            public.starts_with("ed25519:") && public.len() == 8 + 64,
            "{public}"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let pub_file = std::fs::read_to_string(tmp.path().join("publisher.key.pub")).unwrap();
        assert_eq!(pub_file.trim(), public);
        // Never overwritten; the private key never reaches stdout.
        let out = jitship(&[], &["key", "generate", "--out", &key_arg]);
        assert_eq!(out.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&out.stderr).contains("exists already"));
        let shown = expect(&b, &[], &["key", "public", &key_arg], 0);
        assert_eq!(shown.trim(), public);
        assert!(!shown.contains("PRIVATE"));
        let key_id = PublisherKey::load(&key_file).unwrap().key_id().to_owned();

        let flags = b.cli.clone().unwrap();
        let root = tmp.path().join("root");
        let cache = format!("kernels:native={}", root.display());
        let with = |extra: &[&str]| -> Vec<String> {
            let mut f = flags.clone();
            f.extend(["--cache".to_owned(), cache.clone()]);
            f.extend(["--fact".to_owned(), "test.tag=signing".to_owned()]);
            f.extend(extra.iter().map(|s| s.to_string()));
            f
        };
        let required = with(&["--trusted-key", &public]);
        let signing = with(&["--trusted-key", &public, "--signing-key", &key_arg]);
        // The store commands take the store and the trust, no caches or facts.
        let reader = {
            let mut f = flags.clone();
            f.extend(["--trusted-key".to_owned(), public.clone()]);
            f
        };

        // Unsigned publish, then an install that requires signatures: exit 14.
        triton_tree(&root, 2, 8);
        expect(&b, &with(&[]), &["publish"], 0);
        let target = tmp.path().join("target");
        let install_flags = |f: &[String]| -> Vec<String> {
            let mut f = f.to_vec();
            let at = f.iter().position(|x| x == "--cache").unwrap();
            f[at + 1] = format!("kernels:native={}", target.display());
            f
        };
        let out = expect(&b, &install_flags(&required), &["install"], 14);
        assert!(
            out.contains("untrusted") && out.contains("unsigned"),
            "{out}"
        );
        assert!(!target.exists());
        // A publisher under `required` without its key refuses, with what to do.
        let out = jitship(&required, &["publish"]);
        assert_eq!(out.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&out.stderr).contains("signing key"));

        // Signed publish: installs, and ls / inspect / verify name the key.
        triton_tree(&root, 3, 8);
        let text = expect(&b, &signing, &["publish"], 0);
        assert!(text.contains(&format!("signed by {key_id}")), "{text}");
        let out = expect(&b, &install_flags(&required), &["install"], 0);
        assert!(out.contains(&key_id), "{out}");
        let ls = expect(&b, &reader, &["ls"], 0);
        assert!(
            ls.contains("SIGNED") && ls.contains(&format!("{key_id} trusted")),
            "{ls}"
        );
        assert!(ls.contains("unsigned"), "{ls}");
        let ls: Value = serde_json::from_str(&expect(&b, &reader, &["ls", "--json"], 0)).unwrap();
        let ls = &ls["results"][0];
        let newest = &ls["compats"][0]["generations"][0];
        assert_eq!(newest["signatures"][0]["signer"]["status"], "trusted");
        assert_eq!(newest["signatures"][0]["signer"]["key_id"], key_id.as_str());
        let g = newest["id"].as_str().unwrap().to_owned();
        let text = expect(&b, &reader, &["inspect", &g[..12]], 0);
        assert!(
            text.contains(&format!("signed by trusted key {key_id}")),
            "{text}"
        );
        // verify: the unsigned older generation is a problem under `required`, the newest is ok.
        let text = expect(&b, &reader, &["verify"], 3);
        assert!(text.contains("is unsigned"), "{text}");
        expect(&b, &reader, &["verify", &g], 0);

        // Poison a pack of the newest generation; verify --repair removes it; republish; clean.
        let s = b.store.as_ref();
        let id: GenerationId = g.parse().unwrap();
        let m = catalog::fetch_manifest(s, &b.layout, &id).unwrap().unwrap();
        let pack = m.packs.last().unwrap();
        let pack_key = b.layout.pack(&pack.id);
        let mut bytes = s.get(&pack_key).unwrap().unwrap();
        bytes.iter_mut().for_each(|x| *x ^= 0x5a);
        assert!(remove_retrying(s, &pack_key));
        s.put(&pack_key, &bytes, ValueClass::Bulk).unwrap();
        let text = expect(&b, &reader, &["verify", &g, "--repair"], 3);
        assert!(
            text.contains(&format!("removed damaged pack {}", pack.id)),
            "{text}"
        );
        assert!(!s.exists(&pack_key).unwrap());
        let text = expect(&b, &signing, &["publish", "--json"], 0);
        let report: Value = serde_json::from_str(&text).unwrap();
        assert!(
            report["results"][0]["packs_uploaded"].as_u64().unwrap() >= 1,
            "{report}"
        );
        let ls: Value = serde_json::from_str(&expect(&b, &reader, &["ls", "--json"], 0)).unwrap();
        let ls = &ls["results"][0];
        let g3 = ls["compats"][0]["generations"][0]["id"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_ne!(g3, g);
        expect(&b, &reader, &["verify", &g3], 0);
        let fresh = tmp.path().join("fresh");
        let mut f = required.clone();
        let at = f.iter().position(|x| x == "--cache").unwrap();
        f[at + 1] = format!("kernels:native={}", fresh.display());
        expect(&b, &f, &["install"], 0);
        assert_same_tree(&root, &fresh);
    }
}
