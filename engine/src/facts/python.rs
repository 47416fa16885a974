//! Python facts: the interpreter's version (with patch level), executable and site-packages,
//! asked of a bare interpreter (`-I -S`: no site hooks, no `.pth` files, nothing imported from
//! site-packages), then package versions read from `*.dist-info/METADATA` and
//! `*.egg-info/PKG-INFO`, and torch's CUDA version from `torch/version.py`, without running Python.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::command;

/// What a bare interpreter says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Interpreter {
    /// `platform.python_version()`: "3.12.3", "3.13.0rc1".
    pub version: String,
    pub executable: String,
    /// `sysconfig.get_path("include")`, if the interpreter has one.
    pub include: Option<String>,
    /// Existing site-packages directories, in `sys.path` order.
    pub site_packages: Vec<PathBuf>,
}

/// Stdlib only (`sys`, `os`, `sysconfig`, `site` without `site.main()`). A venv is recognised the
/// way CPython's `site.venv()` does it (a `pyvenv.cfg` beside the executable or one level up), since
/// `-S` skips that; its directories come from the `venv` install scheme, not `site.getsitepackages`,
/// which Debian patches to answer `dist-packages`.
const PROBE: &str = r#"
import os, sys, site
lvl = {'alpha': 'a', 'beta': 'b', 'candidate': 'rc'}.get(sys.version_info.releaselevel)
v = '%d.%d.%d' % sys.version_info[:3] + ('%s%d' % (lvl, sys.version_info.serial) if lvl else '')
print('version\t' + v)
print('executable\t' + sys.executable)
import sysconfig
print('include\t' + (sysconfig.get_path('include') or ''))
exe_dir = os.path.dirname(sys.executable)
cfgs = [os.path.join(d, 'pyvenv.cfg') for d in (exe_dir, os.path.dirname(exe_dir))]
cfg = next((c for c in cfgs if os.path.isfile(c)), None)
dirs = []
if cfg:
    system = False
    with open(cfg, encoding='utf-8') as f:
        for line in f:
            k, _, val = line.partition('=')
            if k.strip().lower() == 'include-system-site-packages':
                system = val.strip().lower() == 'true'
    venv = os.path.dirname(exe_dir)
    import sysconfig
    scheme = 'venv' if 'venv' in sysconfig.get_scheme_names() else 'posix_prefix'
    paths = sysconfig.get_paths(scheme, vars={'base': venv, 'platbase': venv})
    dirs += [paths['purelib'], paths['platlib']]
    if system:
        dirs += site.getsitepackages()
else:
    dirs += site.getsitepackages()
for d in dirs:
    print('site\t' + d)
"#;

pub(crate) fn probe(python: &Path, timeout: Duration) -> Result<Interpreter, String> {
    let out = command::run(python, &["-I", "-S", "-c", PROBE], timeout)?;
    if !out.success {
        return Err(format!("{} failed: {}", python.display(), out.failure()));
    }
    parse_probe(&out.stdout).ok_or_else(|| {
        format!(
            "{} printed no version (is it a Python interpreter?)",
            python.display()
        )
    })
}

fn parse_probe(text: &str) -> Option<Interpreter> {
    let (mut version, mut executable, mut include, mut site) = (None, None, None, Vec::new());
    for line in text.lines() {
        match line.split_once('\t') {
            Some(("version", v)) if !v.is_empty() => version = Some(v.to_string()),
            Some(("executable", v)) if !v.is_empty() => executable = Some(v.to_string()),
            Some(("include", v)) if !v.is_empty() => include = Some(v.to_string()),
            Some(("site", v)) => {
                let dir = PathBuf::from(v);
                if dir.is_dir() && !site.contains(&dir) {
                    site.push(dir);
                }
            }
            _ => {}
        }
    }
    Some(Interpreter {
        version: version?,
        executable: executable?,
        include,
        site_packages: site,
    })
}

/// "flashinfer-python" -> "flashinfer_python": the `pkg.` fact suffix, and how names are compared
/// (PEP 503 normalisation with `_` as the separator, the form dist-info directory names use).
pub fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.trim().chars() {
        let c = if matches!(c, '-' | '.' | '_') {
            '_'
        } else {
            c.to_ascii_lowercase()
        };
        if !(c == '_' && out.ends_with('_')) {
            out.push(c);
        }
    }
    out
}

/// The version of distribution `name` as installed in the first of `site_dirs` that has it.
pub(crate) fn package_version(
    site_dirs: &[PathBuf],
    name: &str,
) -> Result<(String, PathBuf), String> {
    let wanted = normalize(name);
    for dir in site_dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut found = Vec::new();
        for entry in entries.flatten() {
            let file_name = entry.file_name();
            let Some(file_name) = file_name.to_str() else {
                continue;
            };
            let Some(stem) = file_name
                .strip_suffix(".dist-info")
                .or_else(|| file_name.strip_suffix(".egg-info"))
            else {
                continue;
            };
            let dist = stem.split('-').next().unwrap_or(stem);
            if normalize(dist) != wanted {
                continue;
            }
            let path = entry.path();
            let metadata = if file_name.ends_with(".dist-info") {
                path.join("METADATA")
            } else if path.is_dir() {
                path.join("PKG-INFO")
            } else {
                path.clone() // a single-file egg-info is the PKG-INFO itself
            };
            found.push(read_version(&metadata, &wanted)?);
        }
        found.sort();
        found.dedup_by(|a, b| a.0 == b.0);
        match found.len() {
            0 => continue,
            1 => return found.pop().ok_or_else(|| "unreachable".to_string()),
            _ => {
                let versions: Vec<&str> = found.iter().map(|(v, _)| v.as_str()).collect();
                return Err(format!(
                    "{} holds several versions of {name} ({}): a broken install",
                    dir.display(),
                    versions.join(", ")
                ));
            }
        }
    }
    Err(format!("not installed in {}", display_dirs(site_dirs)))
}

fn read_version(metadata: &Path, wanted: &str) -> Result<(String, PathBuf), String> {
    let text = std::fs::read_to_string(metadata)
        .map_err(|e| format!("cannot read {}: {e}", metadata.display()))?;
    let mut version = None;
    for line in text.lines() {
        if line.is_empty() {
            break; // headers end at the first blank line; the description follows
        }
        if let Some(v) = line.strip_prefix("Version:") {
            version = Some(v.trim().to_string());
        } else if let Some(n) = line.strip_prefix("Name:")
            && normalize(n) != wanted
        {
            return Err(format!(
                "{} names {:?}, not the package its directory is named after",
                metadata.display(),
                n.trim()
            ));
        }
    }
    match version {
        Some(v) if !v.is_empty() => Ok((v, metadata.to_path_buf())),
        _ => Err(format!("{} has no Version header", metadata.display())),
    }
}

/// `torch.version.cuda` from the first `torch/version.py` in `site_dirs`: `cuda = '12.4'` or
/// `cuda: Optional[str] = '12.4'`; `None` means a CPU build of torch.
pub(crate) fn torch_cuda(site_dirs: &[PathBuf]) -> Result<(String, PathBuf), String> {
    let path = site_dirs
        .iter()
        .map(|d| d.join("torch").join("version.py"))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("no torch/version.py in {}", display_dirs(site_dirs)))?;
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("cuda") else {
            continue;
        };
        let rest = rest.trim_start();
        let Some(rest) = rest.strip_prefix('=').or_else(|| {
            rest.strip_prefix(':')
                .and_then(|r| r.split_once('=').map(|(_, v)| v))
        }) else {
            continue;
        };
        let value = rest.split('#').next().unwrap_or("").trim();
        if value == "None" {
            return Err(format!(
                "torch is a CPU build ({} says cuda = None)",
                path.display()
            ));
        }
        let unquoted = value.strip_prefix('\'').and_then(|v| v.strip_suffix('\''));
        let unquoted =
            unquoted.or_else(|| value.strip_prefix('"').and_then(|v| v.strip_suffix('"')));
        return match unquoted {
            Some(v) if !v.is_empty() => Ok((v.to_string(), path)),
            _ => Err(format!(
                "cannot read the cuda line of {}: {line:?}",
                path.display()
            )),
        };
    }
    Err(format!("{} has no cuda line", path.display()))
}

/// The CUDA runtime's "major.minor" from the `nvidia-cuda-runtime-cu1x` wheel's metadata or a
/// `libcudart.so.X.Y.Z` in `lib_dirs`: the fallback when torch does not say.
pub(crate) fn libcudart_version(
    site_dirs: &[PathBuf],
    lib_dirs: &[PathBuf],
) -> Result<(String, PathBuf), String> {
    for wheel in [
        "nvidia-cuda-runtime",
        "nvidia-cuda-runtime-cu13",
        "nvidia-cuda-runtime-cu12",
        "nvidia-cuda-runtime-cu11",
    ] {
        if let Ok((version, path)) = package_version(site_dirs, wheel)
            && let Some(mm) = major_minor(&version)
        {
            return Ok((mm, path));
        }
    }
    for dir in lib_dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut best: Option<(Vec<u32>, PathBuf)> = None;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(v) = name.to_str().and_then(|n| n.strip_prefix("libcudart.so.")) else {
                continue;
            };
            let parts: Option<Vec<u32>> = v.split('.').map(|p| p.parse().ok()).collect();
            if let Some(parts) = parts.filter(|p| p.len() >= 2)
                && best.as_ref().is_none_or(|(b, _)| parts > *b)
            {
                best = Some((parts, entry.path()));
            }
        }
        if let Some((parts, path)) = best {
            return Ok((format!("{}.{}", parts[0], parts[1]), path));
        }
    }
    Err(format!(
        "no nvidia-cuda-runtime wheel and no libcudart.so.X.Y in {}",
        display_dirs(lib_dirs)
    ))
}

/// "12.4.127" -> "12.4".
pub(crate) fn major_minor(version: &str) -> Option<String> {
    let mut parts = version.split('.');
    let (major, minor) = (parts.next()?, parts.next()?);
    let ok = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    (ok(major) && ok(minor)).then(|| format!("{major}.{minor}"))
}

/// "Cuda compilation tools, release 12.4, V12.4.131" -> "12.4".
pub(crate) fn parse_nvcc_release(text: &str) -> Option<String> {
    let after = text.split("release ").nth(1)?;
    let release = after.split([',', ' ', '\n']).next()?;
    major_minor(release)
}

pub(crate) fn display_dirs(dirs: &[PathBuf]) -> String {
    if dirs.is_empty() {
        return "no directory".into();
    }
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn torch_version_py_forms() {
        let dir = tempfile::tempdir().unwrap();
        let site = dir.path().to_path_buf();
        std::fs::create_dir(site.join("torch")).unwrap();
        let write = |s: &str| std::fs::write(site.join("torch/version.py"), s).unwrap();
        write(
            "__version__ = '2.8.0+cu128'\ndebug = False\ncuda: Optional[str] = '12.8'\nhip = None\n",
        );
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

    #[test]
    fn probe_of_this_machines_python_has_patch_level() {
        // Bare `python3` from the usual places; the CI image has one.
        let dirs: Vec<PathBuf> = ["/usr/local/bin", "/usr/bin", "/root/.pyenv/shims"]
            .iter()
            .map(PathBuf::from)
            .collect();
        let Some(python) = command::find_in(&dirs, "python3") else {
            return;
        };
        let info = probe(&python, Duration::from_secs(10)).unwrap();
        assert_eq!(info.version.split('.').count(), 3, "{info:?}");
        assert!(info.executable.contains("python"), "{info:?}");
    }

    #[test]
    fn probe_of_a_venv_reads_the_venv_site_packages() {
        // A venv: bin/python3 a symlink to a real interpreter, pyvenv.cfg at the root.
        let dirs: Vec<PathBuf> = ["/usr/local/bin", "/usr/bin", "/root/.pyenv/shims"]
            .iter()
            .map(PathBuf::from)
            .collect();
        let Some(python) = command::find_in(&dirs, "python3") else {
            return;
        };
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
}
