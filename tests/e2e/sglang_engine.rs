//! `--engine sglang` through the real CLI and the built-in policies (docs/sglang.md): the roots
//! are where SGLang's own process puts its caches, and a tree laid out as a real SGLang CPU run
//! wrote it (docs/sglang.md, "What one real CPU run wrote") publishes, keyed with `pkg.sglang`,
//! and installs at another absolute path, where `audit` calls it warm. SGLang itself cannot run
//! in the suite (no CPU kernel wheel on PyPI).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use jitship_tests::output::{code, json, show};
use jitship_tests::policy_fixtures::elf;
use serde_json::Value;

const USER: &str = "sgl";

/// The facts an Inductor key on a CPU machine holds, as on the machine of the real run, and the
/// SGLang version.
const CPU_FACTS: &[&str] = &[
    "gpu.count=0",
    "pkg.torch=2.14.1",
    "pkg.triton=3.8.0",
    "pkg.sglang=0.5.23",
    "python.version=3.11.7",
    "python.site_packages=/work/sglang/venv/lib/python3.11/site-packages",
    "python.include=/usr/include/python3.11",
    "os.arch=x86_64",
    "cpu.isa=avx512",
    "cpu.flags_digest=0123abcd",
    "cpu.threads=2",
    "cxx.identity=g++ 12.2.0",
    "inductor.env_digest=0123abcd",
];

/// `jitship ARGS` as a process whose environment is only `vars` (and PATH): the environment an
/// SGLang worker with that HOME, TMPDIR and user would start in.
fn jitship(args: &[&str], vars: &[(&str, &Path)]) -> Output {
    let mut c: Command = jitship_tests::cli::jitship();
    c.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("USER", USER)
        .env("LOGNAME", USER)
        .env("RUST_LOG", "warn")
        .args(args);
    for (k, v) in vars {
        c.env(k, v);
    }
    c.output().expect("run jitship")
}

fn facts_flags(extra: &[&str]) -> Vec<String> {
    CPU_FACTS
        .iter()
        .chain(extra)
        .flat_map(|f| ["--fact".to_string(), f.to_string()])
        .collect()
}

/// The roots `jitship facts --engine sglang` resolves, by kind.
fn roots(vars: &[(&str, &Path)], fact: &str) -> BTreeMap<String, String> {
    let out = jitship(
        &["facts", "--engine", "sglang", "--json", "--fact", fact],
        vars,
    );
    assert_eq!(code(&out), 0, "{}", show(&out));
    let v = json(&out);
    assert!(
        v["engine"].as_str().unwrap_or("").starts_with("SGLang: "),
        "{v}"
    );
    v["roots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["kind"].as_str().unwrap().to_owned(),
                r["root"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn the_roots_are_where_sglangs_own_process_puts_its_caches() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let tmp = dir.path().join("tmp");
    let h = home.display();
    let vars = [("HOME", home.as_path()), ("TMPDIR", tmp.as_path())];

    // A GPU machine: every cache SGLang moves under ~/.cache/sglang, and its own.
    let gpu = roots(&vars, "gpu.name=NVIDIA H200");
    let want: BTreeMap<String, String> = [
        ("inductor", format!("{h}/.cache/sglang/inductor")),
        ("triton", format!("{h}/.cache/sglang/triton")),
        ("cuda-computecache", format!("{h}/.cache/sglang/nv")),
        ("tilelang", format!("{h}/.cache/sglang/tilelang")),
        (
            "flashinfer-jit",
            format!("{h}/.cache/sglang/.cache/flashinfer"),
        ),
        ("deepgemm", format!("{h}/.cache/sglang/deep_gemm")),
        ("sglang-jit", format!("{h}/.cache/sglang/jit")),
        (
            "sglang-compile",
            format!("{h}/.cache/sglang/torch_compile_cache"),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(gpu, want);

    // A CPU machine: Inductor's cache, and its header where torch keeps it.
    let cpu = roots(&vars, "gpu.count=0");
    assert_eq!(
        cpu,
        [
            ("inductor", format!("{h}/.cache/sglang/inductor")),
            (
                "inductor-pch",
                format!("{}/torchinductor_{USER}/precompiled_headers", tmp.display())
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    );

    // SGLANG_CACHE_DIR moves them; a variable set already stays (SGLang's setdefault); DeepGEMM's
    // is overwritten by SGLang; its JIT cache does not follow SGLANG_CACHE_DIR.
    let base = dir.path().join("sgcache");
    let triton = dir.path().join("my-triton");
    let dg = dir.path().join("my-deepgemm");
    let moved = roots(
        &[
            ("HOME", home.as_path()),
            ("TMPDIR", tmp.as_path()),
            ("SGLANG_CACHE_DIR", base.as_path()),
            ("TRITON_CACHE_DIR", triton.as_path()),
            ("DG_JIT_CACHE_DIR", dg.as_path()),
        ],
        "gpu.name=NVIDIA H200",
    );
    let b = base.display();
    assert_eq!(moved["inductor"], format!("{b}/inductor"));
    assert_eq!(moved["triton"], triton.display().to_string());
    assert_eq!(moved["deepgemm"], format!("{b}/deep_gemm"));
    assert_eq!(moved["flashinfer-jit"], format!("{b}/.cache/flashinfer"));
    assert_eq!(moved["sglang-compile"], format!("{b}/torch_compile_cache"));
    assert_eq!(moved["sglang-jit"], format!("{h}/.cache/sglang/jit"));
}

fn write(root: &Path, rel: &str, bytes: impl AsRef<[u8]>) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, bytes).unwrap();
}

/// The tree the real cold run wrote (docs/sglang.md): under the Inductor root 62 files (8
/// `fxgraph/` entries, 12 `.cpp` and 12 `.so` of which 2 `*.main.so`, 8 `.py`, 10 `.so.load_ok`,
/// 12 `locks/*.lock`), and the precompiled header with its stub and lock. The FX-graph entries
/// come last, as Inductor writes them. Returns the files jitship should publish, by root.
fn real_run_tree(inductor: &Path, pch: &Path) -> (Vec<String>, Vec<String>) {
    let mut published = Vec::new();
    for i in 0..12 {
        let main = if i < 2 { ".main" } else { "" };
        let name = format!("c{i:02}kernelhash{i:02}");
        let d = &name[1..3];
        for (ext, bytes) in [
            (format!("{main}.cpp"), format!("// kernel {i}").into_bytes()),
            (format!("{main}.so"), elf(256 + i)),
        ] {
            let rel = format!("{d}/{name}{ext}");
            write(inductor, &rel, bytes);
            published.push(rel);
        }
        if i < 10 {
            let rel = format!("{d}/{name}{main}.so.load_ok");
            write(inductor, &rel, b"");
            published.push(rel);
        }
        write(inductor, &format!("locks/{name}.lock"), b"");
    }
    for i in 0..8 {
        let rel = format!("w{i}/cw{i}wrapperhash.py");
        write(inductor, &rel, format!("# wrapper {i}"));
        published.push(rel);
    }
    for i in 0..8 {
        let rel = format!("fxgraph/f{i}/f{i}graphkey/entry{i}");
        write(inductor, &rel, format!("pickle {i}"));
        published.push(rel);
    }
    let header = "c4cpuheaderhash";
    write(
        pch,
        &format!("{header}.h"),
        b"#include <torch/csrc/inductor/cpp_prefix.h>\n",
    );
    write(
        pch,
        &format!("{header}.h.gch"),
        b"gpch+014\x18\xa4 the header",
    );
    write(pch, &format!("locks/{header}.lock"), b"");
    published.sort();
    let mut headers = vec![format!("{header}.h"), format!("{header}.h.gch")];
    headers.sort();
    (published, headers)
}

/// Every file under `root`, relative, sorted, with its contents.
fn tree(root: &Path) -> BTreeMap<String, Vec<u8>> {
    jitship_tests::fixtures::files_under(root)
        .into_iter()
        .filter(|p| !p.starts_with(root.join("locks")))
        .filter(|p| {
            !p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".jitship")
        })
        .map(|p| {
            (
                p.strip_prefix(root).unwrap().display().to_string(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_tree_laid_out_as_a_real_sglang_cpu_run_publishes_and_installs_at_another_path() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("local:{}", dir.path().join("store").display());
    let worker = |name: &str| -> (PathBuf, PathBuf) {
        (
            dir.path().join(name).join("home"),
            dir.path().join(name).join("tmp"),
        )
    };
    let (p_home, p_tmp) = worker("producer");
    let p_inductor = p_home.join(".cache/sglang/inductor");
    let p_pch = p_tmp.join(format!("torchinductor_{USER}/precompiled_headers"));
    let (inductor_files, pch_files) = real_run_tree(&p_inductor, &p_pch);
    let vars = |home: &PathBuf, tmp: &PathBuf| [("HOME", home.clone()), ("TMPDIR", tmp.clone())];
    let run = |args: &[&str], v: &[(&str, PathBuf); 2], extra: &[&str]| {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.extend([
            "--engine".into(),
            "sglang".into(),
            "--store".into(),
            store.clone(),
        ]);
        all.extend(facts_flags(extra));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let v: Vec<(&str, &Path)> = v.iter().map(|(k, p)| (*k, p.as_path())).collect();
        jitship(&all, &v)
    };

    let out = run(&["publish", "--json"], &vars(&p_home, &p_tmp), &[]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let results = json(&out)["results"].as_array().unwrap().clone();
    let by_kind: BTreeMap<&str, &Value> = results
        .iter()
        .map(|r| (r["cache_kind"].as_str().unwrap(), r))
        .collect();
    assert_eq!(
        by_kind.keys().copied().collect::<Vec<_>>(),
        ["inductor", "inductor-pch"]
    );
    for (kind, want) in [
        ("inductor", inductor_files.len()),
        ("inductor-pch", pch_files.len()),
    ] {
        let r = by_kind[kind];
        assert_eq!(r["files_new"], want, "{kind}: {r}");
        let key = r["compat_key"].as_str().unwrap();
        assert!(key.contains(";pkg.sglang=0.5.23"), "{kind}: {key}");
        assert!(
            r["outcome"].to_string().contains("published"),
            "{kind}: {r}"
        );
    }

    // Another worker, at another absolute path: everything but the locks, byte for byte.
    let (c_home, c_tmp) = worker("consumer/at/another/path");
    let out = run(&["install"], &vars(&c_home, &c_tmp), &[]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let c_inductor = c_home.join(".cache/sglang/inductor");
    let c_pch = c_tmp.join(format!("torchinductor_{USER}/precompiled_headers"));
    assert_eq!(tree(&c_inductor), tree(&p_inductor));
    assert_eq!(tree(&c_inductor).len(), inductor_files.len());
    assert_eq!(tree(&c_pch).keys().cloned().collect::<Vec<_>>(), pch_files);
    assert_eq!(tree(&c_pch), tree(&p_pch));
    // Nothing compiled since: audit agrees.
    let v: Vec<(&str, &Path)> = vec![("HOME", &c_home), ("TMPDIR", &c_tmp)];
    let out = jitship(&["audit", "--engine", "sglang"], &v);
    assert_eq!(code(&out), 0, "{}", show(&out));

    // Another SGLang version: its own key, a miss. No SGLang in the interpreter: a missing fact.
    let (o_home, o_tmp) = worker("other-version");
    let out = run(&["install"], &vars(&o_home, &o_tmp), &["pkg.sglang=0.5.24"]);
    assert_eq!(code(&out), 11, "{}", show(&out));
    let out = run(&["install"], &vars(&o_home, &o_tmp), &["pkg.sglang="]);
    assert_eq!(code(&out), 12, "{}", show(&out));
    assert!(
        jitship_tests::output::text(&out.stdout).contains("pkg.sglang"),
        "{}",
        show(&out)
    );
}
