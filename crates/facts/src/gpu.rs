//! GPU and driver facts: NVML loaded at run time (`nvml-wrapper`), else `nvidia-smi`, else the kernel module's
//! `/proc/driver/nvidia/version` (driver only). Each source answers what it can; the caller takes
//! each fact from the first source that had it and keeps every source's reason for what it lacked.

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use super::command;

/// What one source said about the GPUs. `None` fields are what it could not tell.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct GpuReport {
    /// Name of the first GPU.
    pub name: Option<String>,
    pub count: Option<u32>,
    /// Compute capability of the first GPU, "major.minor".
    pub cc: Option<String>,
    pub driver: Option<String>,
}

/// Queries NVML from `library` on a helper thread, so a driver that hangs in `nvmlInit` costs at
/// most `timeout` (the thread is then abandoned; it holds nothing the caller needs).
pub(crate) fn from_nvml(library: &Path, timeout: Duration) -> Result<GpuReport, String> {
    let (tx, rx) = mpsc::channel();
    let library = library.to_path_buf();
    std::thread::Builder::new()
        .name("jitship-nvml".into())
        .spawn(move || {
            let _ = tx.send(query_nvml(&library));
        })
        .map_err(|e| format!("cannot start the NVML thread: {e}"))?;
    match rx.recv_timeout(timeout) {
        Ok(result) => result,
        Err(_) => Err(format!(
            "NVML did not answer within {}",
            humantime::format_duration(timeout)
        )),
    }
}

fn query_nvml(library: &Path) -> Result<GpuReport, String> {
    use nvml_wrapper::Nvml;
    use nvml_wrapper::error::NvmlError;
    let nvml = Nvml::builder()
        .lib_path(library.as_os_str())
        .init()
        .map_err(|e| match e {
            NvmlError::LibloadingError(e) => format!("cannot load {e}"),
            e => format!("nvmlInit_v2: {e}"),
        })?;
    let mut report = GpuReport {
        driver: nvml.sys_driver_version().ok().and_then(trimmed),
        ..GpuReport::default()
    };
    let count = nvml
        .device_count()
        .map_err(|e| format!("nvmlDeviceGetCount_v2: {e}"))?;
    report.count = Some(count);
    if count == 0 {
        return Ok(report);
    }
    let device = nvml
        .device_by_index(0)
        .map_err(|e| format!("nvmlDeviceGetHandleByIndex_v2(0): {e}"))?;
    report.name = device.name().ok().and_then(trimmed);
    report.cc = device
        .cuda_compute_capability()
        .ok()
        .map(|cc| format!("{}.{}", cc.major, cc.minor));
    Ok(report)
}

fn trimmed(s: String) -> Option<String> {
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_owned())
}

/// `nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader`. Drivers older
/// than the `compute_cap` field (before about R510) refuse that query; they are asked again for
/// name and driver only, and the capability is left to be missing.
pub(crate) fn from_nvidia_smi(program: &Path, timeout: Duration) -> Result<GpuReport, String> {
    let query = |fields: &str| {
        let arg = format!("--query-gpu={fields}");
        command::run(program, &[&arg, "--format=csv,noheader"], timeout)
    };
    let out = query("name,compute_cap,driver_version")?;
    if out.success {
        return parse_nvidia_smi(&out.stdout, true);
    }
    let refused_field = out.stdout.contains("compute_cap") || out.stderr.contains("compute_cap");
    if refused_field {
        let old = query("name,driver_version")?;
        if old.success {
            return parse_nvidia_smi(&old.stdout, false);
        }
    }
    Err(format!("{} failed: {}", program.display(), out.failure()))
}

/// Rows of `name[,compute_cap],driver_version`. Fields are taken from the right, so a comma in a
/// GPU name cannot shift them.
pub(crate) fn parse_nvidia_smi(text: &str, with_cc: bool) -> Result<GpuReport, String> {
    let rows: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let first = rows.first().ok_or("nvidia-smi listed no GPU")?;
    let wanted = if with_cc { 3 } else { 2 };
    let mut fields: Vec<&str> = first.rsplitn(wanted, ',').map(str::trim).collect();
    if fields.len() != wanted {
        return Err(format!(
            "unexpected nvidia-smi line {first:?} (wanted name,{}driver_version)",
            if with_cc { "compute_cap," } else { "" }
        ));
    }
    fields.reverse();
    let (name, cc, driver) = if with_cc {
        (fields[0], Some(fields[1]), fields[2])
    } else {
        (fields[0], None, fields[1])
    };
    // nvidia-smi prints "[N/A]" or "[Not Supported]" for what it cannot tell.
    let known = |v: &str| (!v.is_empty() && !v.starts_with('[')).then(|| v.to_string());
    let count = u32::try_from(rows.len()).map_err(|_| "too many GPU rows".to_string())?;
    Ok(GpuReport {
        name: known(name),
        count: Some(count),
        cc: cc.and_then(known).filter(|c| is_version(c)),
        driver: known(driver).filter(|d| is_version(d)),
    })
}

/// The driver version from the kernel module's version file, e.g.
/// `NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 19:24:24 UTC 2024`.
pub(crate) fn from_proc_version(path: &Path) -> Result<GpuReport, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let driver = parse_proc_version(&text)
        .ok_or_else(|| format!("no driver version in the NVRM line of {}", path.display()))?;
    Ok(GpuReport {
        driver: Some(driver),
        ..GpuReport::default()
    })
}

pub(crate) fn parse_proc_version(text: &str) -> Option<String> {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("NVRM version:"))?;
    line.split_whitespace()
        .find(|w| is_version(w) && w.contains('.'))
        .map(str::to_string)
}

fn is_version(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_digit()) && s.chars().all(|c| c.is_ascii_digit() || c == '.')
}

/// "9.0" -> "sm_90", "12.1" -> "sm_121".
pub(crate) fn arch_from_cc(cc: &str) -> Option<String> {
    let (major, minor) = cc.split_once('.')?;
    let ok = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    (ok(major) && ok(minor)).then(|| format!("sm_{major}{minor}"))
}

/// "550.54.15" -> "550".
pub(crate) fn driver_major(version: &str) -> Option<String> {
    let major = version.split('.').next()?;
    (!major.is_empty() && major.chars().all(|c| c.is_ascii_digit())).then(|| major.to_string())
}

/// A stand-in NVML built from C with the system compiler, for tests of the FFI path on machines
/// without a GPU. `variant`: "ok" (8 x H100), "no-devices", "init-fails", "hangs" (nvmlInit_v2 sleeps 30 s).
/// Panics, saying what to install, when there is no C compiler: the test cannot run, so it fails.
#[cfg(test)]
pub(crate) fn build_fake_nvml(dir: &Path, variant: &str) -> std::path::PathBuf {
    let source = dir.join(format!("fake-nvml-{variant}.c"));
    let library = dir.join(format!("libfake-nvml-{variant}.so"));
    let init = match variant {
        "ok" => "return 0;",
        "init-fails" => "return 9;",
        "hangs" => "sleep(30); return 0;",
        "no-devices" => "gpus = 0; return 0;",
        other => panic!("unknown fake NVML variant {other}"),
    };
    let code = format!(
        r#"#include <string.h>
#include <unistd.h>
static int device;
static unsigned int gpus = 8;
int nvmlInit_v2(void) {{ {init} }}
int nvmlShutdown(void) {{ return 0; }}
const char *nvmlErrorString(int rc) {{ return rc == 9 ? "Driver Not Loaded" : "Unknown Error"; }}
int nvmlDeviceGetCount_v2(unsigned int *count) {{ *count = gpus; return 0; }}
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **dev) {{ if (i >= gpus) return 2; *dev = &device; return 0; }}
int nvmlDeviceGetName(void *dev, char *name, unsigned int len) {{
    if (dev != &device || len < 96) return 2; strncpy(name, "NVIDIA H100 80GB HBM3", len); return 0; }}
int nvmlDeviceGetCudaComputeCapability(void *dev, int *major, int *minor) {{
    if (dev != &device) return 2; *major = 9; *minor = 0; return 0; }}
int nvmlSystemGetDriverVersion(char *v, unsigned int len) {{ if (len < 80) return 2; strncpy(v, "550.54.15", len); return 0; }}
"#
    );
    std::fs::write(&source, code).expect("write the fake NVML source");
    let status = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(&source)
        .status()
        .unwrap_or_else(|e| {
            panic!("running cc: {e}; this test builds a fake NVML in C: install gcc (apt-get install gcc)")
        });
    assert!(status.success(), "cc failed to build the fake NVML");
    library
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_answers_through_the_declared_signatures() {
        let dir = tempfile::tempdir().unwrap();
        let lib = build_fake_nvml(dir.path(), "ok");
        let r = from_nvml(&lib, Duration::from_secs(10)).unwrap();
        let expected = GpuReport {
            name: Some("NVIDIA H100 80GB HBM3".into()),
            count: Some(8),
            cc: Some("9.0".into()),
            driver: Some("550.54.15".into()),
        };
        assert_eq!(r, expected);
    }

    #[test]
    fn nvml_errors_and_hangs_are_reasons() {
        let dir = tempfile::tempdir().unwrap();
        let fails = build_fake_nvml(dir.path(), "init-fails");
        let err = from_nvml(&fails, Duration::from_secs(10)).unwrap_err();
        assert_eq!(err, "nvmlInit_v2: NVIDIA driver is not loaded");
        let hangs = build_fake_nvml(dir.path(), "hangs");
        // Cut at the timeout: had it waited, the fake would have answered after 30 s.
        let err = from_nvml(&hangs, Duration::from_millis(300)).unwrap_err();
        assert_eq!(err, "NVML did not answer within 300ms");
    }

    #[test]
    fn nvidia_smi_rows_give_first_gpu_and_count() {
        let text = "NVIDIA H100 80GB HBM3, 9.0, 550.54.15\nNVIDIA H100 80GB HBM3, 9.0, 550.54.15\n";
        let r = parse_nvidia_smi(text, true).unwrap();
        assert_eq!(r.name.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(r.count, Some(2));
        assert_eq!(r.cc.as_deref(), Some("9.0"));
        assert_eq!(r.driver.as_deref(), Some("550.54.15"));
        let r = parse_nvidia_smi("Tesla T4, [N/A], 470.1\n", true).unwrap();
        assert_eq!(r.cc, None);
        let r = parse_nvidia_smi("Odd, Name, 8.6, 535.1\n", true).unwrap();
        assert_eq!(r.name.as_deref(), Some("Odd, Name"));
        assert_eq!(r.cc.as_deref(), Some("8.6"));
        let r = parse_nvidia_smi("Tesla V100-SXM2-16GB, 470.57.02\n", false).unwrap();
        assert_eq!((r.cc, r.driver.as_deref()), (None, Some("470.57.02")));
        assert!(parse_nvidia_smi("", true).is_err());
        assert!(parse_nvidia_smi("garbage line\n", true).is_err());
    }

    #[test]
    fn an_old_nvidia_smi_without_compute_cap_still_gives_name_and_driver() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let smi = dir.path().join("nvidia-smi");
        let body = "case \"$1\" in *compute_cap*) echo 'Field \"compute_cap\" is not a valid field to query.'; exit 2;; esac\necho 'Tesla V100-SXM2-16GB, 470.57.02'";
        std::fs::write(&smi, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
        let r = from_nvidia_smi(&smi, Duration::from_secs(5)).unwrap();
        assert_eq!(r.name.as_deref(), Some("Tesla V100-SXM2-16GB"));
        assert_eq!(r.driver.as_deref(), Some("470.57.02"));
        assert_eq!(r.cc, None);
    }

    #[test]
    fn proc_version_lines_of_both_kernel_modules() {
        let closed = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 19:24:24 UTC 2024\nGCC version:  gcc version 12.2.0\n";
        assert_eq!(parse_proc_version(closed).as_deref(), Some("550.54.15"));
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  570.86.15  Release Build  (dvs-builder@U16)  Thu Jan 23 2025\n";
        assert_eq!(parse_proc_version(open).as_deref(), Some("570.86.15"));
        assert_eq!(parse_proc_version("GCC version: 12.2.0\n"), None);
    }

    #[test]
    fn arch_and_driver_major() {
        assert_eq!(arch_from_cc("9.0").as_deref(), Some("sm_90"));
        assert_eq!(arch_from_cc("12.1").as_deref(), Some("sm_121"));
        assert_eq!(arch_from_cc("10.0").as_deref(), Some("sm_100"));
        assert_eq!(arch_from_cc("9"), None);
        assert_eq!(arch_from_cc("x.0"), None);
        assert_eq!(driver_major("550.54.15").as_deref(), Some("550"));
        assert_eq!(driver_major(".1"), None);
    }

    #[test]
    fn nvml_that_cannot_load_is_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let bogus = dir.path().join("libnvidia-ml.so.1");
        std::fs::write(&bogus, "not an ELF file").unwrap();
        let err = from_nvml(&bogus, Duration::from_secs(5)).unwrap_err();
        assert!(
            err.contains("cannot load") && err.contains("libnvidia-ml.so.1"),
            "{err}"
        );
    }
}
