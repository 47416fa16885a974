//! Issue 11: an install stays inside its root whatever happens to the root meanwhile, refuses a
//! generation of another cache, tells the truth about conflicts, orders markers last so a SIGKILL
//! mid-commit never shows an engine a marker before what it marks, and cleans its staging; a
//! publish of a root that is missing or a file is an error naming it.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use jitship::catalog;
use jitship::catalog::now_secs;
use jitship::generation::{CompatId, GenerationId, HeadRecord};
use jitship::install::InstallOutcome;
use jitship::store::ValueClass;
use jitship::store::testing::slow_gets;
use jitship::store::{LocalStore, Store};
use jitship_tests::cli::quiet as jitship;
use jitship_tests::fixtures::{self, bytes, digest};
use jitship_tests::harness::{Scenario, published};

fn local(dir: &Path) -> Arc<dyn Store> {
    Arc::new(LocalStore::open(dir.join("store")).unwrap())
}

/// Everything under `dir` (the directory itself included) as the kernel shows it, links never
/// followed: path -> "dir <mode>", "file <mode> <blake3>" or "link -> <target>".
fn snapshot(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let rel = p.strip_prefix(dir).unwrap().display().to_string();
        let m = fs::symlink_metadata(&p).unwrap();
        let mode = m.permissions().mode() & 0o7777;
        let what = if m.file_type().is_symlink() {
            format!("link -> {}", fs::read_link(&p).unwrap().display())
        } else if m.is_dir() {
            for e in fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
            format!("dir {mode:o}")
        } else {
            let h = blake3::hash(&fs::read(&p).unwrap()).to_hex().to_string();
            format!("file {mode:o} {h} {}", m.mtime())
        };
        out.insert(rel, what);
    }
    out
}

fn exchange(a: &Path, b: &Path) -> bool {
    let a = CString::new(a.as_os_str().as_bytes()).unwrap();
    let b = CString::new(b.as_os_str().as_bytes()).unwrap();
    // SAFETY: two valid C strings; renameat2 only reads them.
    unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        ) == 0
    }
}

/// A tree of `dirs` x `per_dir` files under `sub/` (the directory the attack swaps) plus a few at
/// the top.
fn swap_source(root: &Path, dirs: usize, per_dir: usize) {
    for d in 0..dirs {
        let dir = root.join(format!("sub/d{d}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..per_dir {
            fs::write(
                dir.join(format!("f{f}")),
                bytes((d * 1000 + f) as u64, 200 + f * 7),
            )
            .unwrap();
        }
    }
    for f in 0..20 {
        fs::write(root.join(format!("top{f}")), bytes(99_000 + f, 300)).unwrap();
    }
}

/// Must show 1: while many installs run, another thread swaps `root/sub` (a real directory) with
/// `root/.swap` (a symlink to a directory of victim files, named like the files the install
/// writes) as fast as it can. Nothing outside the root may be created, changed or removed; an
/// install that fails leaves the root exactly as it was; one that succeeds put every file inside.
#[test]
fn swapping_a_root_directory_for_a_link_never_touches_anything_outside_the_root() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    swap_source(&src, 40, 55); // 2,220 files
    let s = Scenario::new(local(t.path()), "triton");
    s.publish(&src).unwrap();

    // Victims: same names as the install's files under sub/, other content, plus extras.
    let victim = t.path().join("victim");
    for d in 0..40 {
        let dir = victim.join(format!("d{d}"));
        fs::create_dir_all(&dir).unwrap();
        for f in (0..55).step_by(3) {
            fs::write(dir.join(format!("f{f}")), b"victim").unwrap();
        }
        fs::write(dir.join("precious"), b"victim").unwrap();
    }
    let victim_before = snapshot(&victim);

    let started = Instant::now();
    let mut outcomes: BTreeMap<String, u32> = BTreeMap::new();
    let mut iterations = 0;
    while iterations < 16 && started.elapsed() < Duration::from_secs(90) {
        iterations += 1;
        let root = t.path().join(format!("root{iterations}"));
        fs::create_dir_all(root.join("sub/d0")).unwrap();
        fs::write(root.join("sub/mine"), b"the engine's own file").unwrap();
        fs::write(root.join("sub/d0/f1"), bytes(1, 207)).unwrap(); // identical to the source's
        fs::write(root.join("own"), b"keep").unwrap();
        symlink(&victim, root.join(".swap")).unwrap();
        let root_before = snapshot(&root);

        let stop = Arc::new(AtomicBool::new(false));
        let swaps = Arc::new(AtomicU64::new(0));
        let attacker = {
            let (stop, swaps) = (stop.clone(), swaps.clone());
            let (a, b) = (root.join("sub"), root.join(".swap"));
            std::thread::spawn(move || {
                // Bounded: stops when asked, or after 50 million swaps.
                while !stop.load(Ordering::Relaxed) && swaps.load(Ordering::Relaxed) < 50_000_000 {
                    if exchange(&a, &b) {
                        swaps.fetch_add(1, Ordering::Relaxed);
                    }
                }
                // Leave the root in its original orientation.
                if fs::symlink_metadata(&a).unwrap().file_type().is_symlink() {
                    assert!(exchange(&a, &b));
                }
            })
        };
        let r = s.install(&root);
        stop.store(true, Ordering::Relaxed);
        attacker.join().unwrap();
        assert!(
            swaps.load(Ordering::Relaxed) > 0,
            "the attacker never swapped"
        );
        *outcomes.entry(format!("{:?}", r.outcome)).or_default() += 1;

        assert_eq!(
            snapshot(&victim),
            victim_before,
            "iteration {iterations}: files outside the root changed ({:?}: {})",
            r.outcome,
            r.detail
        );
        let after = snapshot(&root);
        match r.outcome {
            InstallOutcome::Failed => assert_eq!(
                after, root_before,
                "iteration {iterations}: a failed install changed the root: {}",
                r.detail
            ),
            InstallOutcome::Installed | InstallOutcome::Conflict => {
                // What was there is untouched, and every installed file is inside, verified.
                for (path, what) in &root_before {
                    assert_eq!(
                        after.get(path),
                        Some(what),
                        "iteration {iterations}: {path}"
                    );
                }
                let installed = digest(&src)
                    .into_iter()
                    .filter(|(p, (h, ..))| {
                        fs::read(root.join(p))
                            .is_ok_and(|b| blake3::hash(&b).to_hex().as_str() == h)
                    })
                    .count() as u64;
                assert!(
                    installed >= r.files_installed,
                    "iteration {iterations}: {installed} files verified in the root, {} reported",
                    r.files_installed
                );
            }
            other => panic!("iteration {iterations}: {other:?}: {}", r.detail),
        }
        let staging: Vec<_> = fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("staging"))
            .collect();
        assert!(staging.is_empty(), "iteration {iterations}: {staging:?}");
    }
    eprintln!("{iterations} installs under attack: {outcomes:?}");
    // The attack must have bitten (otherwise this test proves nothing).
    assert!(
        outcomes.keys().any(|o| o != "Installed"),
        "no install was disturbed by the swaps: {outcomes:?}"
    );
}

/// A root that is a symlink is resolved once at the start: the files land in its target, the
/// link stays a link.
#[test]
fn a_root_that_is_a_symlink_is_installed_into_its_target() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fixtures::triton_tree(&src, 4, 1);
    let s = Scenario::new(local(t.path()), "triton");
    s.publish(&src).unwrap();
    let target = t.path().join("real-cache");
    fs::create_dir_all(&target).unwrap();
    fs::write(target.join("own"), b"keep").unwrap();
    let link = t.path().join("cache-link");
    symlink(&target, &link).unwrap();
    let r = s.install(&link);
    assert_eq!(r.outcome, InstallOutcome::Installed, "{}", r.detail);
    assert!(
        fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    let mut expected = digest(&src);
    expected.insert("own".into(), digest(&target)["own"].clone());
    assert_eq!(digest(&target), expected);
    // A dangling link is an error naming it, and nothing is created.
    let dangling = t.path().join("dangling");
    symlink(t.path().join("nowhere"), &dangling).unwrap();
    let r = s.install(&dangling);
    assert_eq!(r.outcome, InstallOutcome::Failed);
    assert!(r.detail.contains("dangling"), "{}", r.detail);
    assert!(!t.path().join("nowhere").exists());
}

/// Writes `manifest` (re-encoded) as a new generation and makes it head `seq` of `compat`.
fn plant_head(s: &Scenario, compat: CompatId, seq: u64, bytes: &[u8]) -> GenerationId {
    let id = GenerationId(jitship::generation::ContentHash::of(bytes));
    s.store
        .put(&s.layout.generation(&id), bytes, ValueClass::Record)
        .unwrap();
    let head = HeadRecord {
        compat_id: compat,
        seq,
        generation: id,
        written_at: now_secs(),
        writer: "test".into(),
        signature: None,
    };
    s.store
        .put(
            &s.layout.head(&compat, seq),
            &head.encode(),
            ValueClass::Record,
        )
        .unwrap();
    id
}

/// A head of this worker's compat id pointing at another cache's manifest (whose packs are all
/// there) is refused as failed, naming both compat ids; nothing is written.
#[test]
fn a_head_pointing_at_another_compat_ids_manifest_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let store = local(t.path());
    let ours = Scenario::new(store.clone(), "triton");
    let mut other = Scenario::new(store.clone(), "inductor");
    other.facts.set("gpu.name", "another GPU");
    let src = t.path().join("src");
    fixtures::triton_tree(&src, 3, 7);
    let r = other.publish(&src).unwrap();
    let (foreign, _) = published(&r);
    let foreign_compat = r.compat_id;
    let bytes = store
        .get(&other.layout.generation(&foreign))
        .unwrap()
        .unwrap();
    use jitship::policy::CachePolicy;
    let our_compat = CompatId::new("triton", &ours.policy.compat_key(&ours.facts).unwrap());
    plant_head(&ours, our_compat, 1, &bytes);

    let root = t.path().join("root");
    let r = ours.install(&root);
    assert_eq!(r.outcome, InstallOutcome::Failed, "{}", r.detail);
    assert!(
        r.detail.contains(&our_compat.to_string())
            && r.detail.contains(&foreign_compat.to_string()),
        "{}",
        r.detail
    );
    assert!(!root.exists());
}

/// Files of the generation present with other content are left alone and the outcome is
/// `conflict` (exit 13), never `already-current`, whether or not anything else was installed.
#[test]
fn conflicting_files_give_the_conflict_outcome_not_already_current() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fixtures::triton_tree(&src, 3, 2);
    let s = Scenario::new(local(t.path()), "triton");
    s.publish(&src).unwrap();
    let files: Vec<String> = digest(&src).into_keys().collect();

    // Every path exists with other content (the case): nothing can be installed.
    let root = t.path().join("all");
    for f in &files {
        let p = root.join(f);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, b"someone else's").unwrap();
    }
    let before = digest(&root);
    let r = s.install(&root);
    assert_eq!(r.outcome, InstallOutcome::Conflict, "{}", r.detail);
    assert_eq!(r.outcome.exit_code(), 13);
    assert_eq!(r.conflicts.len(), files.len());
    assert_eq!(r.files_installed, 0);
    assert!(r.detail.contains("partly installed"), "{}", r.detail);
    assert_eq!(digest(&root), before);

    // One path conflicts, the rest installs: still conflict.
    let root = t.path().join("one");
    let p = root.join(&files[0]);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(&p, b"someone else's").unwrap();
    let r = s.install(&root);
    assert_eq!(r.outcome, InstallOutcome::Conflict, "{}", r.detail);
    assert_eq!(r.files_installed as usize, files.len() - 1);
    assert_eq!(fs::read(&p).unwrap(), b"someone else's");
    // And once the file is put right, the generation is complete.
    fs::remove_file(&p).unwrap();
    assert_eq!(s.install(&root).outcome, InstallOutcome::Installed);
    assert_eq!(s.install(&root).outcome, InstallOutcome::AlreadyCurrent);
    assert_eq!(digest(&root), digest(&src));
}

/// A deadline that passes while packs are being fetched removes the staging directory before
/// `install` returns (not later, not by the next install).
#[test]
fn a_deadline_removes_the_staging_before_install_returns() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fixtures::triton_tree(&src, 30, 5);
    let mut s = Scenario::new(local(t.path()), "triton");
    s.pack_size = 8 * 1024;
    s.publish(&src).unwrap();
    let packs = s.layout.packs_prefix();
    s.store = Arc::new(slow_gets(
        s.store.clone(),
        Duration::from_millis(40),
        move |key| key.starts_with(&packs),
    ));
    let root = t.path().join("root");
    fs::create_dir_all(&root).unwrap();
    fs::write(root.join("own"), b"keep").unwrap();
    let r = s.install_within(&root, Duration::from_millis(1200));
    assert_eq!(r.outcome, InstallOutcome::Deadline, "{}", r.detail);
    let staging: Vec<_> = fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("staging"))
        .collect();
    assert!(staging.is_empty(), "staging left behind: {staging:?}");
    // The abandoned job, ended now (install_within waits for it), did not recreate it either.
    assert!(
        !fs::read_dir(t.path()).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains("staging"))
    );
    assert_eq!(fs::read_dir(&root).unwrap().count(), 1);
}

/// `publish` of a root that does not exist or is a file: an error naming the path, exit 1,
/// never "unchanged".
#[test]
fn publish_of_a_missing_root_or_a_file_is_an_error_naming_it() {
    let t = tempfile::tempdir().unwrap();
    let store = format!("local:{}", t.path().join("store").display());
    let file = t.path().join("a-file");
    fs::write(&file, b"not a cache").unwrap();
    for (root, words) in [
        (t.path().join("nonexistent"), "does not exist"),
        (file.clone(), "is not a directory"),
    ] {
        let out = jitship()
            .args(["publish", "--store", &store, "--fact", "t=1"])
            .args(["--cache", &format!("kernels:native={}", root.display())])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
        assert!(
            stderr.contains(&root.display().to_string()) && stderr.contains(words),
            "{stderr}"
        );
        assert!(!stdout.contains("unchanged"), "{stdout}");
    }
}

/// Counts what is not a directory under `dir`.
fn files_under(dir: &Path) -> usize {
    jitship_tests::fixtures::files_under(dir).len()
}

/// A SIGKILL of the real binary during the commit of a non-empty root, early (among the plain
/// files) and late (among the markers): every marker on disk has every file of the generation
/// present and complete (markers are moved last), and the next install completes the generation
/// and clears the staging left behind.
#[test]
fn a_sigkill_during_commit_never_shows_a_marker_before_its_files_and_the_next_install_completes() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fixtures::triton_tree(&src, 30, 3); // 30 kernels x 8 files; 30 `__grp__` markers
    let store_dir = t.path().join("store");
    let store_flag = format!("local:{}", store_dir.display());
    let common = |c: &mut Command, root: &Path| {
        c.args(["--store", &store_flag, "--fact", "test.tag=sigkill"])
            .args(["--cache", &format!("kernels:native={}", root.display())]);
    };
    let mut c = jitship();
    c.arg("publish");
    common(&mut c, &src);
    let out = c.arg("--json").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let report = &report["results"][0];
    let compat: CompatId = report["compat_id"].as_str().unwrap().parse().unwrap();
    let generation: GenerationId = report["generation"].as_str().unwrap().parse().unwrap();

    // Mark the Triton group files as markers (what the triton policy's contract-2 `marker` trait
    // will say), as generation 2.
    let store = LocalStore::open(&store_dir).unwrap();
    let layout = jitship::catalog::KeyLayout::new("jitship").unwrap();
    let mut m = catalog::fetch_manifest(&store, &layout, &generation)
        .unwrap()
        .unwrap();
    let mut markers = 0;
    for f in &mut m.files {
        f.marker = f.path.as_str().contains("__grp__");
        markers += usize::from(f.marker);
    }
    assert_eq!(markers, 30);
    let bytes = m.encode();
    let id = GenerationId(jitship::generation::ContentHash::of(&bytes));
    store
        .put(&layout.generation(&id), &bytes, ValueClass::Record)
        .unwrap();
    let head = HeadRecord {
        compat_id: compat,
        seq: 2,
        generation: id,
        written_at: now_secs(),
        writer: "test".into(),
        signature: None,
    };
    store
        .put(&layout.head(&compat, 2), &head.encode(), ValueClass::Record)
        .unwrap();
    let total = m.files.len();
    let plain = total - markers;
    let expected = digest(&src);

    // Kill early (after some plain files) and late (after some markers).
    for (round, kill_at) in [(0, 20), (1, plain + 8)] {
        let root = t.path().join(format!("root{round}"));
        fs::create_dir_all(&root).unwrap();
        fs::write(root.join("engine-own"), b"keep").unwrap();
        let mut c = jitship();
        c.arg("install");
        common(&mut c, &root);
        let mut child = c
            .args(["--test-commit-pause", "15ms"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        while files_under(&root) < kill_at + 1 {
            assert!(
                Instant::now() < deadline,
                "the install never reached {kill_at} files"
            );
            assert!(
                child.try_wait().unwrap().is_none(),
                "install ended before the kill"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();

        let on_disk = digest(&root);
        let present = on_disk.len() - 1;
        assert!(
            present > 0 && present < total,
            "round {round}: the kill did not land mid-commit ({present} of {total})"
        );
        for (path, (hash, ..)) in &on_disk {
            if path == "engine-own" {
                continue;
            }
            assert_eq!(
                &expected[path].0, hash,
                "round {round}: {path} is not complete"
            );
        }
        let markers_present = on_disk.keys().filter(|p| p.contains("__grp__")).count();
        if markers_present > 0 {
            // Every marker present: all files of the generation are there before it.
            let plain_present = on_disk
                .keys()
                .filter(|p| *p != "engine-own" && !p.contains("__grp__"))
                .count();
            assert_eq!(
                plain_present, plain,
                "round {round}: a marker came before its files"
            );
        }
        if round == 1 {
            assert!(markers_present > 0, "round 1 should stop among the markers");
        } else {
            assert_eq!(
                markers_present, 0,
                "round 0 should stop among the plain files"
            );
        }

        // The next install completes the generation and clears the staging left behind.
        let mut c = jitship();
        c.arg("install");
        common(&mut c, &root);
        let out = c.output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let mut want = expected.clone();
        want.insert("engine-own".into(), digest(&root)["engine-own"].clone());
        assert_eq!(digest(&root), want, "round {round}");
        assert!(
            !fs::read_dir(t.path()).unwrap().any(|e| e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains("staging")),
            "round {round}: staging left behind"
        );
    }
}

/// SIGTERM to the real binary once its commit has begun: unlike a SIGKILL, the commit finishes,
/// so the root holds the whole generation, and the process then exits 143 (stopped by SIGTERM)
/// with no staging left behind.
#[test]
fn a_sigterm_during_commit_lets_the_commit_finish_and_exits_143() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fixtures::triton_tree(&src, 10, 3);
    let store_flag = format!("local:{}", t.path().join("store").display());
    let command = |verb: &str, root: &Path| {
        let mut c = jitship();
        c.arg(verb)
            .args(["--store", &store_flag, "--fact", "test.tag=sigterm"])
            .args(["--cache", &format!("kernels:native={}", root.display())]);
        c
    };
    let out = command("publish", &src).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A root that exists and holds a file of the engine's own: files are moved in one by one
    // (a missing root is renamed into place whole, too fast to signal mid-commit).
    let root = t.path().join("root");
    fs::create_dir_all(&root).unwrap();
    fs::write(root.join("engine-own"), b"keep").unwrap();
    let total = files_under(&src) + 1;
    let mut child = command("install", &root)
        .args(["--test-commit-pause", "20ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while files_under(&root) < 4 {
        assert!(
            Instant::now() < deadline && child.try_wait().unwrap().is_none(),
            "the install never began its commit"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    // SAFETY: kill(2) on our own child, which is still committing (20 ms per file).
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{stderr}");
    let mut installed = digest(&root);
    assert!(installed.remove("engine-own").is_some());
    assert!(
        files_under(&root) == total && installed == digest(&src),
        "the commit did not finish: {} of {total} files\n{stderr}",
        files_under(&root)
    );
    assert!(
        !fs::read_dir(t.path()).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains("staging")),
        "staging left behind"
    );
}
