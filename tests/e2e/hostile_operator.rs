//! Operator commands against a store an attacker writes into (issue 39): the attacker can put any
//! key in jitship's namespace (and others'), but does not hold the signing key. `verify --repair`,
//! `gc`, `inspect`, `ls` and `verify` run through the real CLI on the local store and must judge
//! by trust: an unsigned record never condemns a trusted pack, never decides what gc drops or how
//! long grace lasts, a planted gc journal never makes gc fail or remove another namespace's keys,
//! and no record can write terminal escape sequences to an operator's screen.

use std::path::Path;
use std::process::Output;
use std::sync::Arc;

use jitship::catalog::{self, FloorRecord, GcJournal, KeyLayout};
use jitship::config::TrustMode;
use jitship::generation::{CompatId, ContentHash, GenerationId, HeadRecord, Manifest};
use jitship::store::{Store, ValueClass};
use jitship::trust::{PublishTrust, PublisherKey, TrustPolicy};
use jitship_tests::backends::{Backend, local};
use jitship_tests::fixtures::triton_tree;
use jitship_tests::harness::{Scenario, published};
use serde_json::Value;

fn scenario(b: &Backend) -> Scenario {
    let mut s = Scenario::new(b.store.clone(), "kernels");
    s.layout = b.layout.clone();
    s.pack_size = 64 << 10;
    s
}

/// A generation of `root` published and signed by `key`: (id, head seq). Trust mode `warn`, so
/// the publisher writes above whatever the attacker put on top (a publisher under `required` may
/// clear it first) and the scenarios stay where the tests put them.
fn publish_signed(s: &Scenario, root: &Path, key: &PublisherKey) -> (GenerationId, u64) {
    let trust = PublishTrust::new(
        Some(Arc::new(key.clone())),
        Arc::new(TrustPolicy::new(TrustMode::Warn, &[key.public_key()])),
    );
    published(&s.publish_trusting(root, trust).expect("trusted publish"))
}

fn manifest(b: &Backend, id: &GenerationId) -> Manifest {
    catalog::fetch_manifest(b.store.as_ref(), &b.layout, id)
        .unwrap()
        .unwrap_or_else(|| panic!("manifest {id}"))
}

/// The attacker's manifest: a copy of `from`, edited, put under its own id (unsigned, like every
/// manifest; what binds it is a head).
fn forge(b: &Backend, from: &GenerationId, edit: impl FnOnce(&mut Manifest)) -> GenerationId {
    let mut m = manifest(b, from);
    edit(&mut m);
    m.normalize();
    let id = m.id();
    b.store
        .put(&b.layout.generation(&id), &m.encode(), ValueClass::Record)
        .unwrap();
    id
}

/// An unsigned head the attacker writes, claiming `written_at`.
fn plant_head(b: &Backend, compat: CompatId, seq: u64, generation: GenerationId, written_at: u64) {
    let h = HeadRecord {
        compat_id: compat,
        seq,
        generation,
        written_at,
        writer: "attacker".into(),
        signature: None,
    };
    b.store
        .put(
            &b.layout.head(&compat, seq),
            &h.encode(),
            ValueClass::Record,
        )
        .unwrap();
}

fn public(key: &PublisherKey) -> String {
    jitship::trust::public_key_text(&key.public_key())
}

/// Runs `jitship ARGS` against `b`'s store, with `extra` flags (the trust).
fn jitship(b: &Backend, extra: &[&str], args: &[&str]) -> Output {
    jitship_tests::cli::jitship()
        .arg(args[0])
        .args(b.cli.as_ref().unwrap())
        .args(extra)
        .args(&args[1..])
        .env("RUST_LOG", "warn")
        .env_remove("JITSHIP_CONFIG")
        .env_remove("JITSHIP_SIGNING_KEY_FILE")
        .env_remove("JITSHIP_TRUSTED_KEYS")
        .env_remove("JITSHIP_TRUST_MODE")
        .output()
        .expect("run jitship-e2e")
}

/// Runs, expects exit `code`, returns (stdout, stderr).
fn expect(b: &Backend, extra: &[&str], args: &[&str], code: i32) -> (String, String) {
    let out = jitship(b, extra, args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(code),
        "jitship {}:\n{stdout}\n{stderr}",
        args.join(" ")
    );
    (stdout, stderr)
}

/// The one result of a `--json` command.
fn json(stdout: &str) -> Value {
    let doc: Value = serde_json::from_str(stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    doc["results"][0].clone()
}

fn has(b: &Backend, key: &str) -> bool {
    b.store.exists(key).unwrap()
}

fn packs_of(b: &Backend, id: &GenerationId) -> Vec<ContentHash> {
    manifest(b, id).packs.iter().map(|p| p.id).collect()
}

// ---------------------------------------------------------------------------------------------
// 1. verify --repair

/// An unsigned manifest claims other file hashes for a trusted generation's packs. Before the
/// fix, `verify --repair --trusted-key` condemned and removed the trusted pack on that claim (and
/// so did `verify --repair` without a key, though the trusted generation verifies the pack).
#[test]
fn repair_condemns_a_pack_only_on_an_admitted_manifest_and_never_one_another_verifies() {
    let b = local("hostile_operator_repair", false);
    let s = scenario(&b);
    let key = PublisherKey::generate().unwrap();
    let pub_key = public(&key);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    triton_tree(&root, 2, 31);
    let (good, _) = publish_signed(&s, &root, &key);
    // The attacker's manifest: the same packs, a file claimed to hash to something else.
    let evil = forge(&b, &good, |m| m.files[0].blake3 = ContentHash::of(b"a lie"));
    plant_head(&b, s.compat_id(), 2, evil, catalog::now_secs());
    let packs = packs_of(&b, &good);

    // Under `required`: the unsigned manifest is reported, never acted on.
    let (text, _) = expect(&b, &["--trusted-key", &pub_key], &["verify", "--repair"], 3);
    for p in &packs {
        assert!(
            has(&b, &b.layout.pack(p)),
            "verify --repair --trusted-key removed trusted pack {p} on an unsigned manifest's word:\n{text}"
        );
    }
    assert!(!text.contains("removed damaged pack"), "{text}");
    assert!(text.contains("not admitted"), "{text}");

    // Without a key every manifest is admitted, but the pack is one another admitted manifest
    // (the real one) verifies: spared.
    let (text, _) = expect(&b, &[], &["verify", &evil.to_string(), "--repair"], 3);
    for p in &packs {
        assert!(
            has(&b, &b.layout.pack(p)),
            "verify --repair removed pack {p} that generation {good} verifies:\n{text}"
        );
    }
    assert!(text.contains(&good.to_string()[..12]), "{text}");
    expect(
        &b,
        &["--trusted-key", &pub_key],
        &["verify", &good.to_string()],
        0,
    );
}

// ---------------------------------------------------------------------------------------------
// 2. gc's settings and times

/// A backdated `written_at` on an unsigned head: under `required`, the generation it seems to
/// supersede was superseded only when the trusted head above it was written. Before the fix the
/// attacker's claim (1970) cancelled the grace period and gc dropped it at once.
#[test]
fn an_untrusted_head_never_shortens_the_grace_of_a_trusted_generation() {
    let b = local("hostile_operator_grace", false);
    let s = scenario(&b);
    let key = PublisherKey::generate().unwrap();
    let pub_key = public(&key);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    triton_tree(&root, 2, 41);
    let (older, _) = publish_signed(&s, &root, &key);
    let evil = forge(&b, &older, |m| m.created_at = 1);
    plant_head(&b, s.compat_id(), 2, evil, 1);
    triton_tree(&root, 3, 41);
    let (newest, seq) = publish_signed(&s, &root, &key);
    assert_eq!(seq, 3);

    let (out, _) = expect(
        &b,
        &["--trusted-key", &pub_key],
        &["gc", "--keep", "1", "--grace", "1h", "--json"],
        0,
    );
    let r = json(&out);
    assert!(
        has(&b, &b.layout.generation(&older)),
        "gc dropped {older} within its grace period on an unsigned head's written_at: {r:#}"
    );
    assert!(has(&b, &b.layout.generation(&newest)));

    // Without a trusted key (the guide's examples) on a store that dates its keys: the unsigned
    // head on top was written now, whatever it claims; gc keeps the generation it supersedes
    // within grace and says loudly that unsigned records decided.
    let b = local("hostile_operator_grace_off", false);
    let s = scenario(&b);
    triton_tree(&root, 2, 42);
    let (first, _) = publish_signed(&s, &root, &key);
    triton_tree(&root, 3, 42);
    let (second, _) = publish_signed(&s, &root, &key);
    let evil = forge(&b, &second, |m| {
        m.created_at = 1;
        m.policy.settings.insert("keep".into(), "1".into());
    });
    plant_head(&b, s.compat_id(), 3, evil, 1);
    let (out, err) = expect(
        &b,
        &[],
        &["gc", "--keep", "1", "--grace", "1h", "--json"],
        0,
    );
    let r = json(&out);
    assert!(
        has(&b, &b.layout.generation(&second)),
        "gc without a key dropped {second} within grace on an unsigned head's backdated written_at: {r:#}"
    );
    assert!(has(&b, &b.layout.generation(&first)));
    let unsigned = r["unsigned"].as_array().cloned().unwrap_or_default();
    assert!(
        unsigned.iter().any(|u| u
            .as_str()
            .is_some_and(|u| u.contains(&evil.to_string()[..12]))),
        "the report must say which unsigned record decided: {r:#}"
    );
    assert!(err.contains("unsigned"), "no warning on stderr: {err}");
    let (text, _) = expect(&b, &[], &["gc", "--keep", "1", "--dry-run"], 0);
    assert!(
        text.contains("WARNING") && text.contains("unsigned"),
        "the text report must warn: {text}"
    );
}

// ---------------------------------------------------------------------------------------------
// 3. gc journals and floors

fn plant_journal(b: &Backend, seq: u64, keys: Vec<String>, packs: Vec<ContentHash>) {
    let j = GcJournal {
        seq,
        written_at: catalog::now_secs(),
        writer: "attacker".into(),
        keys,
        packs,
    };
    b.store
        .put(
            &b.layout.gc_journal(seq),
            &serde_json::to_vec(&j).unwrap(),
            ValueClass::Record,
        )
        .unwrap();
}

/// A garbage journal made every gc of the namespace fail; a planted one naming another
/// namespace's keys, or the trusted newest head and manifest, made gc remove them; a planted
/// floor far above every head made gc write that floor as its own.
#[test]
fn planted_gc_journals_and_floors_never_steer_gc() {
    let b = local("hostile_operator_journal", false);
    let s = scenario(&b);
    let key = PublisherKey::generate().unwrap();
    let pub_key = public(&key);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    triton_tree(&root, 2, 51);
    let (first, _) = publish_signed(&s, &root, &key);
    triton_tree(&root, 3, 51);
    let (newest, seq) = publish_signed(&s, &root, &key);
    let compat = s.compat_id();
    let trusted = ["--trusted-key", pub_key.as_str()];

    // Garbage at the first journal seq: gc goes on, and says it passed it over.
    b.store
        .put(
            &b.layout.gc_journal(1),
            b"\x00not a journal",
            ValueClass::Record,
        )
        .unwrap();
    let (out, _) = expect(&b, &trusted, &["gc", "--keep", "5", "--json"], 0);
    let garbage = json(&out);

    // Another namespace's keys, and this namespace's newest trusted head and manifest.
    let other = KeyLayout::new("other-tenant").unwrap();
    let foreign = other.head(&compat, 1);
    b.store
        .put(&foreign, b"theirs", ValueClass::Record)
        .unwrap();
    let pin = b.layout.pin(&newest);
    let head_key = b.layout.head(&compat, seq);
    let gen_key = b.layout.generation(&newest);
    plant_journal(
        &b,
        2,
        vec![
            foreign.clone(),
            pin.clone(),
            head_key.clone(),
            gen_key.clone(),
        ],
        packs_of(&b, &newest),
    );
    catalog::pin(b.store.as_ref(), &b.layout, &newest, None).unwrap();
    let (out, _) = expect(&b, &trusted, &["gc", "--keep", "5", "--json"], 0);
    let r = json(&out);
    for k in [&foreign, &pin, &head_key, &gen_key] {
        assert!(
            has(&b, k),
            "gc removed {k} on a planted journal's word: {r:#}"
        );
    }
    for p in packs_of(&b, &newest) {
        assert!(has(&b, &b.layout.pack(&p)), "gc removed pack {p}: {r:#}");
    }
    assert!(
        r["journals_refused"].to_string().contains("other-tenant"),
        "the refused journal must be reported with why: {r:#}"
    );

    assert!(
        garbage["journals_refused"].to_string().contains("/gc/1"),
        "the garbage journal must be reported: {garbage:#}"
    );

    // Only this namespace's head and manifest keys, but of a generation gc keeps: left alone.
    plant_journal(&b, 3, vec![head_key.clone(), gen_key.clone()], vec![]);
    expect(&b, &trusted, &["gc", "--keep", "5"], 0);
    assert!(has(&b, &head_key) && has(&b, &gen_key));

    // A floor far above every head: gc's own floor is built from what it removes, never from it.
    let planted = FloorRecord {
        compat_id: compat,
        seq: 1,
        floor: 1_000_000,
        keep: vec![],
        written_at: catalog::now_secs(),
        writer: "attacker".into(),
    };
    b.store
        .put(
            &b.layout.floor(&compat, 1),
            &serde_json::to_vec(&planted).unwrap(),
            ValueClass::Record,
        )
        .unwrap();
    let (out, _) = expect(
        &b,
        &trusted,
        &["gc", "--keep", "1", "--grace", "0s", "--json"],
        0,
    );
    let r = json(&out);
    assert!(
        !has(&b, &b.layout.generation(&first)),
        "gc must still drop {first}: {r:#}"
    );
    let floors = r["floors"].as_array().unwrap();
    assert_eq!(floors.len(), 1, "{r:#}");
    let floor = floors[0][1].as_u64().unwrap();
    assert!(
        floor <= seq,
        "gc wrote floor {floor}, taken from the attacker's floor record (newest head: {seq})"
    );
    assert!(has(&b, &head_key) && has(&b, &gen_key));
}

// ---------------------------------------------------------------------------------------------
// 4. Output that cannot lie

/// What an attacker writes into strings the commands print: a cursor-up, line-erase and carriage
/// return, then a line that looks like jitship's own.
const FAKE: &str =
    "ok\u{1b}[1A\u{1b}[2K\rsigned      head 1: signed by trusted key 0000\nfake\u{7}";

/// Control characters on a line (tab aside) or any ESC/CR/BEL: what makes a terminal lie.
fn assert_clean(what: &str, text: &str) {
    let bad: Vec<char> = text
        .chars()
        .filter(|&c| c.is_control() && c != '\n')
        .collect();
    assert!(
        bad.is_empty(),
        "{what} printed control characters {bad:?} from store records:\n{text:?}"
    );
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("signed") && l.contains("trusted key 0000")),
        "{what} printed a forged line:\n{text}"
    );
}

#[test]
fn control_characters_from_store_records_are_escaped_in_human_output() {
    let b = local("hostile_operator_escapes", false);
    let s = scenario(&b);
    let key = PublisherKey::generate().unwrap();
    let pub_key = public(&key);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    triton_tree(&root, 2, 61);
    let (good, _) = publish_signed(&s, &root, &key);
    let evil = forge(&b, &good, |m| {
        m.facts.insert("note".into(), FAKE.into());
        m.facts.insert(format!("k{FAKE}"), "v".into());
        m.producer.host = format!("host{FAKE}");
        m.producer.pod = Some(FAKE.into());
        m.incomplete = Some(FAKE.into());
        m.policy.name = format!("native{FAKE}");
    });
    plant_head(&b, s.compat_id(), 2, evil, catalog::now_secs());
    // A compat id of the attacker's own, whose kind and key are the lie.
    let other = forge(&b, &good, |m| {
        m.cache_kind = format!("kernels{FAKE}");
        m.compat_key = FAKE.into();
        m.compat_id = CompatId::new(&m.cache_kind, &m.compat_key);
    });
    let other_compat = manifest(&b, &other).compat_id;
    plant_head(&b, other_compat, 1, other, catalog::now_secs());

    let trusted = ["--trusted-key", pub_key.as_str()];
    let evil_id = evil.to_string();
    let (text, _) = expect(&b, &trusted, &["inspect", &evil_id], 0);
    assert_clean("inspect", &text);
    // The escaped form is shown, so the operator sees what the record holds.
    assert!(text.contains("\\u{1b}[1A"), "{text}");
    let (text, _) = expect(&b, &[], &["inspect", &evil_id], 0);
    assert_clean("inspect without a key", &text);
    let (text, _) = expect(&b, &trusted, &["ls"], 0);
    assert_clean("ls", &text);
    let (text, _) = expect(&b, &trusted, &["verify"], 3);
    assert_clean("verify", &text);
    let (text, log) = expect(&b, &[], &["gc", "--dry-run"], 0);
    assert_clean("gc", &text);
    // gc's WARN lines name what unsigned records decided (the policy name is the attacker's).
    assert!(log.contains("unsigned"), "{log}");
    assert_clean("gc's log", &log);
    // export and import print each generation's kind (the attacker's compat id's is the lie).
    let layout = tmp.path().join("layout");
    let layout = layout.to_str().unwrap();
    let (text, _) = expect(&b, &[], &["export", "--out", layout], 0);
    assert_clean("export", &text);
    assert!(text.contains("\\u{1b}[1A"), "{text}");
    let (text, _) = expect(&b, &[], &["import", "--from", layout], 0);
    assert_clean("import", &text);

    // JSON stays JSON: the exact strings, escaped by JSON alone.
    let (out, _) = expect(&b, &trusted, &["inspect", &evil_id, "--json"], 0);
    let i = json(&out);
    assert_eq!(i["facts"]["note"], FAKE, "{i:#}");
    assert_eq!(i["producer"]["host"], format!("host{FAKE}").as_str());
}
