//! `jitship import` and `jitship export` against OCI layouts and stores an attacker wrote (issue
//! 39), through the real CLI on the local store: the trust mode decides what is imported, an
//! untrusted head never shadows a trusted one, and small hostile inputs (duplicate index entries
//! or pack ids, a link to `/dev/zero`, a FIFO) are refused at once instead of costing gigabytes or
//! hanging. Every child runs with a deadline and a data-segment cap, so a regression fails the
//! test instead of hanging it or taking the machine's memory.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use jitship::catalog;
use jitship::generation::{ContentHash, GenerationId, HeadRecord, HeadSignature, Manifest};
use jitship::store::ValueClass;
use jitship_tests::backends::{Backend, local};
use jitship_tests::fixtures::{digest, triton_tree};
use serde_json::Value;
use sha2::Digest;

/// Far longer than an honest import of these small layouts takes.
const HANG: Duration = Duration::from_secs(90);
/// The data segment a child may use (`ulimit -d`, KiB): an unbounded read fails here, not in
/// the machine's memory.
const DATA_KIB: u64 = 2 << 20;

/// Runs `jitship ARGS` (no trust from the environment) and returns its output; fails the test,
/// after killing the child, if it is still running after `HANG`.
fn run(args: &[String]) -> Output {
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(format!("ulimit -d {DATA_KIB} && exec \"$0\" \"$@\""))
        .arg(jitship_tests::cli::exe())
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("JITSHIP_SIGNING_KEY_FILE")
        .env_remove("JITSHIP_TRUSTED_KEYS")
        .env_remove("JITSHIP_TRUST_MODE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn jitship-e2e");
    let pid = child.id();
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let stderr = std::thread::spawn(move || {
        let mut b = Vec::new();
        err.read_to_end(&mut b).ok();
        b
    });
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut stdout = Vec::new();
        out.read_to_end(&mut stdout).ok();
        let _ = tx.send((child.wait().expect("wait"), stdout));
    });
    let started = Instant::now();
    let Ok((status, stdout)) = rx.recv_timeout(HANG) else {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        panic!(
            "jitship {} still running after {HANG:?}: it hangs",
            args.join(" ")
        );
    };
    let stderr = stderr.join().unwrap_or_default();
    eprintln!("jitship {} took {:?}", args[0], started.elapsed());
    Output {
        status,
        stdout,
        stderr,
    }
}

fn show(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn expect(args: &[String], code: i32) -> Output {
    let out = run(args);
    assert_eq!(
        out.status.code(),
        Some(code),
        "jitship {args:?}:\n{}",
        show(&out)
    );
    out
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

fn store_flags(b: &Backend) -> Vec<String> {
    b.cli
        .clone()
        .expect("the local store is reachable from the CLI")
}

/// A key made by `jitship key generate`: (private key file, public key text).
fn key(dir: &Path, name: &str) -> (PathBuf, String) {
    let file = dir.join(name);
    let out = expect(
        &strings(&["key", "generate", "--out", file.to_str().unwrap()]),
        0,
    );
    (file, String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Publishes `root` (a Triton tree of `seed`) as compat key `tag` into `b`, signed with `key`
/// if one is given.
fn publish(b: &Backend, root: &Path, tag: &str, seed: u64, key: Option<&Path>) {
    triton_tree(root, 1, seed);
    let mut args = strings(&["publish"]);
    args.extend(store_flags(b));
    args.extend(strings(&[
        "--cache",
        &format!("kernels:native={}", root.display()),
        "--fact",
        &format!("test.tag={tag}"),
    ]));
    if let Some(k) = key {
        args.extend(strings(&["--signing-key", k.to_str().unwrap()]));
    }
    expect(&args, 0);
}

/// `jitship export` of everything in `b` (trust off) to a new layout directory.
fn export(b: &Backend, out: &Path) -> Output {
    let mut args = strings(&["export", "--out", out.to_str().unwrap(), "--json"]);
    args.extend(store_flags(b));
    expect(&args, 0)
}

/// `jitship import --from FROM` into `b` with `trust` flags.
fn import(b: &Backend, from: &Path, trust: &[String]) -> Output {
    let mut args = strings(&["import", "--from", from.to_str().unwrap()]);
    args.extend(store_flags(b));
    args.extend(trust.iter().cloned());
    run(&args)
}

fn required(public: &str) -> Vec<String> {
    strings(&["--trusted-key", public, "--trust-mode", "required"])
}

/// Every head the store holds, over all its compat ids.
/// The import failed (exit 1), saying `says`, and put no head into `target`.
fn assert_refused(out: &Output, target: &Backend, says: &str) {
    assert_eq!(out.status.code(), Some(1), "{}", show(out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(says),
        "{}",
        show(out)
    );
    assert!(heads(target).is_empty());
}

fn heads(b: &Backend) -> Vec<HeadRecord> {
    let s = b.store.as_ref();
    catalog::compat_ids(s, &b.layout)
        .unwrap()
        .iter()
        .flat_map(|c| catalog::all_heads(s, &b.layout, c).unwrap().heads)
        .collect()
}

// The layout's files, read and rewritten as an attacker does.

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn blob_path(layout: &Path, digest: &str) -> PathBuf {
    layout
        .join("blobs/sha256")
        .join(digest.strip_prefix("sha256:").unwrap())
}

/// Writes `bytes` as a blob; returns its digest and size.
fn put_blob(layout: &Path, bytes: &[u8]) -> (String, u64) {
    let digest = format!("sha256:{:x}", sha2::Sha256::digest(bytes));
    std::fs::write(blob_path(layout, &digest), bytes).unwrap();
    (digest, bytes.len() as u64)
}

fn set_digest(d: &mut Value, (digest, size): (String, u64)) {
    d["digest"] = digest.into();
    d["size"] = size.into();
}

/// The layout's only generation: its OCI manifest, the jitship manifest and the head.
fn only_generation(layout: &Path) -> (Value, Manifest, HeadRecord) {
    let index = read_json(&layout.join("index.json"));
    let ds = index["manifests"].as_array().unwrap();
    assert_eq!(ds.len(), 1, "{index}");
    let oci = read_json(&blob_path(layout, ds[0]["digest"].as_str().unwrap()));
    let config =
        std::fs::read(blob_path(layout, oci["config"]["digest"].as_str().unwrap())).unwrap();
    let id = GenerationId(ContentHash::of(&config));
    let manifest = Manifest::decode(&config, id).unwrap();
    let last = oci["layers"].as_array().unwrap().last().unwrap();
    let head = HeadRecord::decode(
        &std::fs::read(blob_path(layout, last["digest"].as_str().unwrap())).unwrap(),
    )
    .unwrap();
    (oci, manifest, head)
}

/// Rewrites the layout's only generation with `oci` (its manifest JSON) as it is.
fn write_generation(layout: &Path, oci: &Value) {
    let index_path = layout.join("index.json");
    let mut index = read_json(&index_path);
    let bytes = serde_json::to_vec(oci).unwrap();
    set_digest(&mut index["manifests"][0], put_blob(layout, &bytes));
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
}

/// Replaces the head of the layout's only generation by what `f` makes of it.
fn rewrite_head(layout: &Path, f: impl FnOnce(&mut HeadRecord)) {
    let (mut oci, _, mut head) = only_generation(layout);
    f(&mut head);
    let last = oci["layers"].as_array().unwrap().len() - 1;
    set_digest(&mut oci["layers"][last], put_blob(layout, &head.encode()));
    write_generation(layout, &oci);
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in jitship_tests::fixtures::files_under(from) {
        let dest = to.join(entry.strip_prefix(from).unwrap());
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(&entry, dest).unwrap();
    }
}

/// A signed generation exported to `tmp/trusted` and, in layouts of their own, one of the same
/// compat id unsigned, one signed by a key the importer does not trust, and one that names the
/// trusted key with a signature that does not verify. Returns the trusted public key.
struct Layouts {
    public: String,
    trusted: PathBuf,
    trusted_root: PathBuf,
    unsigned: PathBuf,
    untrusted: PathBuf,
    forged: PathBuf,
}

fn layouts(tmp: &Path) -> Layouts {
    let (key_file, public) = key(tmp, "trusted.key");
    let (other_key, _) = key(tmp, "other.key");
    let make = |name: &str, seed: u64, key: Option<&Path>| -> PathBuf {
        let b = local("hostile_import", false);
        let root = tmp.join(format!("{name}-root"));
        publish(&b, &root, "hostile-import", seed, key);
        let out = tmp.join(name);
        export(&b, &out);
        out
    };
    let trusted = make("trusted", 1, Some(&key_file));
    let unsigned = make("unsigned", 2, None);
    let untrusted = make("untrusted", 3, Some(&other_key));
    // Signed by the other key, then made to name the trusted key's id.
    let forged = make("forged", 4, Some(&other_key));
    let trusted_id = only_generation(&trusted).2.signature.unwrap().key_id;
    rewrite_head(&forged, |h| {
        let sig = h.signature.as_mut().unwrap();
        sig.key_id = trusted_id.clone();
    });
    Layouts {
        public,
        trusted_root: tmp.join("trusted-root"),
        trusted,
        unsigned,
        untrusted,
        forged,
    }
}

/// Attack 1: `import` applied no trust at all, so under `required` an unsigned, an
/// untrusted-key and a forged generation were imported (exit 0). Now each is refused before a
/// byte is written, with exit 1 and the signer named, and the trusted one imports.
#[test]
fn import_under_required_refuses_unsigned_untrusted_and_forged_generations() {
    let tmp = tempfile::tempdir().unwrap();
    let l = layouts(tmp.path());
    let target = local("hostile_import", false);
    for (layout, what) in [
        (&l.unsigned, "unsigned"),
        (&l.untrusted, "not trusted"),
        (&l.forged, "forged"),
    ] {
        let out = import(&target, layout, &required(&l.public));
        assert_eq!(out.status.code(), Some(1), "{what}: {}", show(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("not admitted by the trust") && err.contains(what),
            "{what}: {}",
            show(&out)
        );
        assert!(heads(&target).is_empty(), "{what}: {:?}", heads(&target));
    }
    // `[trust]` from the config file says the same as the flags (mode unset: required once a
    // key is configured).
    let config = tmp.path().join("jitship.toml");
    std::fs::write(
        &config,
        format!("[trust]\ntrusted_keys = [\"{}\"]\n", l.public),
    )
    .unwrap();
    let out = import(
        &target,
        &l.unsigned,
        &strings(&["--config", config.to_str().unwrap()]),
    );
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(heads(&target).is_empty());

    // The same layout as a tar archive (`--from FILE.tar`): the same judgement.
    let archive = tmp.path().join("unsigned.tar");
    let status = std::process::Command::new("tar")
        .arg("-C")
        .arg(&l.unsigned)
        .arg("-cf")
        .arg(&archive)
        .arg(".")
        .status()
        .unwrap();
    assert!(status.success());
    let out = import(&target, &archive, &required(&l.public));
    assert_refused(&out, &target, "not admitted by the trust");

    let out = import(&target, &l.trusted, &required(&l.public));
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("imported"),
        "{}",
        show(&out)
    );
    let held = heads(&target);
    assert_eq!(held, vec![only_generation(&l.trusted).2]);
}

/// Attack 2: the first head of a compat id won, so an unsigned layout imported first (here by a
/// host without trust, as an attacker or a careless operator does) made the trusted import
/// answer `left out` with exit 0, and `required` installs found nothing. Now the trusted
/// generation lands at its seq, over the untrusted head, and installs.
#[test]
fn an_untrusted_head_imported_first_never_shadows_the_trusted_one() {
    let tmp = tempfile::tempdir().unwrap();
    let l = layouts(tmp.path());
    for first in [&l.unsigned, &l.untrusted, &l.forged] {
        let target = local("hostile_import", false);
        let out = import(&target, first, &[]);
        assert_eq!(out.status.code(), Some(0), "{}", show(&out));
        assert_eq!(heads(&target).len(), 1);

        let out = import(&target, &l.trusted, &required(&l.public));
        assert_eq!(out.status.code(), Some(0), "{}", show(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("imported") && !text.contains("left out"),
            "{}",
            show(&out)
        );
        // Installed under `required`: the trusted bytes.
        let dst = tmp.path().join("dst");
        let _ = std::fs::remove_dir_all(&dst);
        let mut args = strings(&["install"]);
        args.extend(store_flags(&target));
        args.extend(strings(&[
            "--cache",
            &format!("kernels:native={}", dst.display()),
            "--fact",
            "test.tag=hostile-import",
        ]));
        args.extend(required(&l.public));
        expect(&args, 0);
        assert_eq!(digest(&dst), digest(&l.trusted_root));
        // Again: already there, not left out for the untrusted head.
        let out = import(&target, &l.trusted, &required(&l.public));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("already-present"),
            "{}",
            show(&out)
        );
    }
}

/// Attack 3a: an index listing one generation 2,000 times made import verify (and hold) it 2,000
/// times. Now a manifest listed twice is refused before any blob is read.
#[test]
fn an_index_listing_a_generation_twice_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let l = layouts(tmp.path());
    let layout = tmp.path().join("repeated");
    copy_dir(&l.trusted, &layout);
    let path = layout.join("index.json");
    let mut index = read_json(&path);
    let one = index["manifests"][0].clone();
    index["manifests"] = Value::Array(vec![one; 2_000]);
    std::fs::write(&path, serde_json::to_vec(&index).unwrap()).unwrap();
    let target = local("hostile_import", false);
    let out = import(&target, &layout, &[]);
    assert_refused(&out, &target, "listed more than once");
}

/// A manifest whose only pack is listed `n` times (chunks all in the first): a valid manifest
/// that costs `n` times its pack to read.
fn repeated_packs(m: &Manifest, n: usize) -> Manifest {
    assert_eq!(m.packs.len(), 1, "a one-pack generation");
    let mut m = m.clone();
    m.packs = vec![m.packs[0].clone(); n];
    m
}

/// Attack 3b, import: a manifest listing one pack 100 times made import read and hold it 100
/// times. Now a pack id listed twice refuses the generation.
#[test]
fn import_refuses_a_manifest_listing_a_pack_twice() {
    let tmp = tempfile::tempdir().unwrap();
    let l = layouts(tmp.path());
    let layout = tmp.path().join("packs-repeated");
    copy_dir(&l.unsigned, &layout);
    let (mut oci, manifest, mut head) = only_generation(&layout);
    let m = repeated_packs(&manifest, 100);
    let config = m.encode();
    head.generation = GenerationId(ContentHash::of(&config));
    set_digest(&mut oci["config"], put_blob(&layout, &config));
    let pack = oci["layers"][0].clone();
    let mut layers = vec![pack; 100];
    let mut head_layer = oci["layers"][1].clone();
    set_digest(&mut head_layer, put_blob(&layout, &head.encode()));
    layers.push(head_layer);
    oci["layers"] = Value::Array(layers);
    write_generation(&layout, &oci);
    let target = local("hostile_import", false);
    let out = import(&target, &layout, &[]);
    assert_refused(&out, &target, "listed more than once");
}

/// Attack 3b, export: a head in the store naming such a manifest made export read and hold the
/// pack 100 times and write an artifact of 100 layers. Now it is passed over (said why) and the
/// older whole generation is exported.
#[test]
fn export_passes_over_a_manifest_listing_a_pack_twice() {
    let tmp = tempfile::tempdir().unwrap();
    let b = local("hostile_import", false);
    publish(&b, &tmp.path().join("root"), "hostile-import", 5, None);
    let s = b.store.as_ref();
    let first = heads(&b).pop().unwrap();
    let m = catalog::fetch_manifest(s, &b.layout, &first.generation)
        .unwrap()
        .unwrap();
    let bytes = repeated_packs(&m, 100).encode();
    let id = GenerationId(ContentHash::of(&bytes));
    s.put(&b.layout.generation(&id), &bytes, ValueClass::Record)
        .unwrap();
    let head = HeadRecord {
        seq: first.seq + 1,
        generation: id,
        writer: "attacker".into(),
        signature: None::<HeadSignature>,
        ..first.clone()
    };
    s.put(
        &b.layout.head(&head.compat_id, head.seq),
        &head.encode(),
        ValueClass::Record,
    )
    .unwrap();
    let out = export(&b, &tmp.path().join("out"));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let gens = &report["results"][0]["generations"];
    assert_eq!(gens.as_array().map(Vec::len), Some(1), "{}", show(&out));
    assert_eq!(gens[0]["seq"], first.seq, "{}", show(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("listed more than once"),
        "{}",
        show(&out)
    );
}

/// Attack 3c: `index.json` linked to `/dev/zero` was read until memory ran out (the link was
/// followed, its size read as 0). Now a link anywhere in the layout is refused unread.
#[test]
fn a_link_in_a_layout_is_refused_unread() {
    let tmp = tempfile::tempdir().unwrap();
    let l = layouts(tmp.path());
    let target = local("hostile_import", false);
    let layout = tmp.path().join("linked");
    copy_dir(&l.trusted, &layout);
    std::fs::remove_file(layout.join("index.json")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", layout.join("index.json")).unwrap();
    let out = import(&target, &layout, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("symbolic link"),
        "{}",
        show(&out)
    );
    // A blob linked to another file outside the layout: the same.
    let layout = tmp.path().join("blob-linked");
    copy_dir(&l.trusted, &layout);
    let (oci, _, _) = only_generation(&layout);
    let pack = blob_path(&layout, oci["layers"][0]["digest"].as_str().unwrap());
    let outside = tmp.path().join("outside");
    std::fs::rename(&pack, &outside).unwrap();
    std::os::unix::fs::symlink(&outside, &pack).unwrap();
    let out = import(&target, &layout, &[]);
    assert_refused(&out, &target, "symbolic link");
}

/// Attack 3d: a FIFO in a layout hung import forever (opened for reading, it waits for a
/// writer). Now it is refused at once (opened without blocking, and not a regular file).
#[test]
fn a_fifo_in_a_layout_is_refused_without_hanging() {
    let tmp = tempfile::tempdir().unwrap();
    let l = layouts(tmp.path());
    let target = local("hostile_import", false);
    let layout = tmp.path().join("fifo");
    copy_dir(&l.trusted, &layout);
    let (oci, _, _) = only_generation(&layout);
    let pack = blob_path(&layout, oci["layers"][0]["digest"].as_str().unwrap());
    std::fs::remove_file(&pack).unwrap();
    let status = std::process::Command::new("mkfifo")
        .arg(&pack)
        .status()
        .unwrap();
    assert!(status.success());
    let out = import(&target, &layout, &[]);
    assert_refused(&out, &target, "FIFO");
}

/// "Already imported" is the very signed head being there, and it vouched for whatever sat under
/// its keys: an attacker who copied the trusted head into the store over planted garbage (zeros
/// under its pack ids, junk at its manifest key) made a trusted import answer `already-present`
/// and installs fail. Now what the head names is read back and replaced (`repaired`).
#[test]
fn a_replayed_trusted_head_over_planted_garbage_is_repaired() {
    let tmp = tempfile::tempdir().unwrap();
    let l = layouts(tmp.path());
    let target = local("hostile_import", false);
    let (_, manifest, head) = only_generation(&l.trusted);
    let (s, layout) = (target.store.as_ref(), &target.layout);
    s.put(
        &layout.head(&head.compat_id, head.seq),
        &head.encode(),
        ValueClass::Record,
    )
    .unwrap();
    for p in &manifest.packs {
        s.put(
            &layout.pack(&p.id),
            &vec![0; p.size as usize],
            ValueClass::Bulk,
        )
        .unwrap();
    }
    s.put(
        &layout.generation(&head.generation),
        b"{}",
        ValueClass::Record,
    )
    .unwrap();
    catalog::ensure_indexed(
        s,
        layout,
        &head.compat_id,
        &manifest.cache_kind,
        &manifest.compat_key,
    )
    .unwrap();
    let out = import(&target, &l.trusted, &required(&l.public));
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("repaired"),
        "{}",
        show(&out)
    );
    let dst = tmp.path().join("dst");
    let mut args = strings(&["install"]);
    args.extend(store_flags(&target));
    args.extend(strings(&[
        "--cache",
        &format!("kernels:native={}", dst.display()),
        "--fact",
        "test.tag=hostile-import",
    ]));
    args.extend(required(&l.public));
    expect(&args, 0);
    assert_eq!(digest(&dst), digest(&l.trusted_root));
}
