//! Relocation with the real engine: Triton from PyPI (the engines venv, `tests/engines/venv.sh`, honouring
//! `JITSHIP_ENGINES_VENV`) compiles kernels into cache roots at different absolute paths (a CUDA
//! target needs no GPU; `tests/engines/triton_cache.py`), the real `jitship` CLI with the embedded
//! `triton` policy publishes and installs them, and Triton itself judges the result:
//! `FileCacheManager(key).get_group(name)` with `TRITON_CACHE_DIR` at the installing root must
//! resolve every child inside that root, and compiling the same kernels again must be a cache hit.
//!
//! Ignored in the fast loop (they need the venv, downloaded on first use): the engines step of
//! `tests/run-all.sh` runs them, after the venv is in place.
//!
//! * `four_publishers_from_one_installed_generation_converge_and_install_anywhere`: a generation
//!   produced at root A is installed at four other roots; each pod compiles a kernel of its own
//!   and the four publish at one instant; the head holds the union (group files stored in
//!   canonical form), and an install at a fifth root passes Triton's own `get_group` for every
//!   kernel and loads all of them without recompiling.
//! * `two_pods_at_different_roots_with_the_same_kernels_upload_packs_once`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use jitship::catalog;
use jitship::generation::{CompatId, Manifest};
use jitship_tests::backends::{Backend, local};

/// The python of the engines venv (installed from PyPI on first use).
fn python() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("engines/venv.sh");
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .expect("running tests/engines/venv.sh");
    assert!(out.status.success(), "tests/engines/venv.sh failed");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// Runs `triton_cache.py CMD ROOT VARIANT...` and returns its JSON answer.
fn triton(py: &Path, cmd: &str, root: &Path, variants: &[u32]) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("engines/triton_cache.py");
    let out = Command::new(py)
        .arg(&script)
        .arg(cmd)
        .arg(root)
        .args(variants.iter().map(u32::to_string))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("running triton_cache.py");
    assert!(
        out.status.success(),
        "triton_cache.py {cmd} {}: {}",
        root.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("triton_cache.py prints JSON")
}

/// Triton's key facts, as a worker with this venv's Triton on an H100 would have them.
const FACTS: &[&str] = &[
    "pkg.triton=3.9.0",
    "gpu.arch=sm_90",
    "gpu.cc=9.0",
    "driver.major=550",
    "os.arch=x86_64",
];

fn jitship(b: &Backend, cmd: &str, root: &Path, start_at: Option<u128>) -> Command {
    let mut c = jitship_tests::cli::jitship();
    c.arg(cmd)
        .args(b.cli.as_ref().expect("cli backend"))
        .args(["--cache", &format!("triton={}", root.display()), "--json"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for f in FACTS {
        c.args(["--fact", f]);
    }
    if let Some(t) = start_at {
        c.env("JITSHIP_E2E_START_AT", t.to_string());
    }
    c
}

fn report(what: &str, out: Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what} failed ({:?}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    doc["results"][0].clone()
}

fn publish(b: &Backend, root: &Path) -> serde_json::Value {
    let out = jitship(b, "publish", root, None).output().unwrap();
    report(&format!("publish {}", root.display()), out)
}

fn install(b: &Backend, root: &Path) -> serde_json::Value {
    let out = jitship(b, "install", root, None).output().unwrap();
    let r = report(&format!("install {}", root.display()), out);
    assert_eq!(r["outcome"], "installed", "{r}");
    r
}

fn head_manifest(b: &Backend, compat: &str) -> Manifest {
    let compat: CompatId = compat.parse().unwrap();
    let head = catalog::newest_head(b.store.as_ref(), &b.layout, &compat)
        .unwrap()
        .expect("a head");
    catalog::fetch_manifest(b.store.as_ref(), &b.layout, &head.generation)
        .unwrap()
        .expect("the head's manifest")
}

/// Kernel directories (Triton's hash keys) holding a group file, from a manifest.
fn kernels(m: &Manifest) -> BTreeSet<String> {
    m.files
        .iter()
        .filter(|f| f.path.as_str().contains("/__grp__"))
        .map(|f| f.path.as_str().split('/').next().unwrap().to_string())
        .collect()
}

fn assert_triton_loads_everything(py: &Path, root: &Path, variants: &[u32]) {
    let check = triton(py, "check", root, variants);
    assert_eq!(check["problems"], serde_json::json!([]), "{check}");
    assert_eq!(check["groups"], variants.len(), "{check}");
    assert_eq!(check["hits"], variants.len(), "{check}");
}

#[test]
#[ignore = "needs the engines venv (Triton from PyPI, about 3.5 GB: tests/engines/venv.sh): run by the engines step of tests/run-all.sh"]
fn four_publishers_from_one_installed_generation_converge_and_install_anywhere() {
    let py = python();
    let b = local("relocation-four", false);
    let tmp = tempfile::tempdir().unwrap();
    // Roots of different depths and names: nothing may depend on the producer's path.
    let root = |name: &str| tmp.path().join(name).join("triton-cache");

    let shared = [16];
    let producer = root("producer");
    triton(&py, "compile", &producer, &shared);
    let first = publish(&b, &producer);
    assert_eq!(first["outcome"], "published", "{first}");
    let compat = first["compat_id"].as_str().unwrap().to_string();

    let own: [u32; 4] = [32, 64, 128, 256];
    let pods: Vec<PathBuf> = (0..4)
        .map(|p| root(&format!("pods/pod-{p}/home/user/.triton")))
        .collect();
    for (pod, variant) in pods.iter().zip(own) {
        let r = install(&b, pod);
        assert!(
            !r["files_materialized"].as_array().unwrap().is_empty(),
            "{r}"
        );
        // The shared kernel works here before this pod compiles anything.
        assert_triton_loads_everything(&py, pod, &shared);
        triton(&py, "compile", pod, &[variant]);
    }
    let start_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 1500;
    let children: Vec<_> = pods
        .iter()
        .map(|pod| {
            jitship(&b, "publish", pod, Some(start_at))
                .spawn()
                .expect("spawn publish")
        })
        .collect();
    for (p, child) in children.into_iter().enumerate() {
        let r = report(
            &format!("pod {p} publish"),
            child.wait_with_output().unwrap(),
        );
        assert_eq!(r["outcome"], "published", "pod {p}: {r}");
        // Every kernel of this pod publishes: the installed one and its own.
        let skipped: u64 = r["skipped"]
            .as_object()
            .map_or(0, |m| m.values().map(|v| v.as_u64().unwrap()).sum());
        assert_eq!(skipped, 0, "pod {p} skipped files: {r}");
    }

    let head = head_manifest(&b, &compat);
    assert_eq!(kernels(&head).len(), 5, "the head holds the union");
    let groups: Vec<_> = head
        .files
        .iter()
        .filter(|f| f.path.as_str().contains("/__grp__"))
        .collect();
    assert!(
        groups.iter().all(|f| f.canonical),
        "groups stored canonical"
    );

    let fifth = root("elsewhere/entirely/fifth");
    let r = install(&b, &fifth);
    assert_eq!(r["files_materialized"].as_array().unwrap().len(), 5, "{r}");
    let mut all = shared.to_vec();
    all.extend(own);
    assert_triton_loads_everything(&py, &fifth, &all);
    // The installed root is now current: a second install finds every file (groups compared in
    // canonical form) and writes nothing.
    let again = jitship(&b, "install", &fifth, None).output().unwrap();
    assert_eq!(again.status.code(), Some(10), "already current");
}

#[test]
#[ignore = "needs the engines venv (Triton from PyPI, about 3.5 GB: tests/engines/venv.sh): run by the engines step of tests/run-all.sh"]
fn two_pods_at_different_roots_with_the_same_kernels_upload_packs_once() {
    let py = python();
    let b = local("relocation-dedup", false);
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a/.triton/cache");
    let c = tmp.path().join("pod-c/a/much/longer/path/to/the/cache");
    triton(&py, "compile", &a, &[16, 32]);
    triton(&py, "compile", &c, &[16, 32]);
    let first = publish(&b, &a);
    assert!(first["bytes_uploaded"].as_u64().unwrap() > 0, "{first}");
    let second = publish(&b, &c);
    // Same kernels, other root: the group files differ on disk but not in canonical form, so
    // every pack is already stored.
    assert_eq!(second["bytes_uploaded"], 0, "{second}");
    assert_eq!(second["packs_uploaded"], 0, "{second}");
    assert!(
        matches!(
            second["outcome"].as_str(),
            Some("unchanged") | Some("published")
        ),
        "{second}"
    );
}
