//! Building policy guests: `cargo build` for `wasm32-unknown-unknown`, then componentize in-process
//! with `wit-component`, so a policy author needs rustup's wasm32 target and nothing else (no
//! wasm-tools, no cargo-component).
//!
//! Why `wasm32-unknown-unknown` and not `wasm32-wasip2`: a wasip2 guest imports a dozen WASI
//! interfaces even when it never does I/O, and its out-of-memory path then fails on a missing
//! `wasi:cli/stderr` import instead of reporting the memory limit (docs/wasm-host.md#guest-target).
//!
//! Builds are byte-reproducible from any checkout path: the profile is passed on the command line
//! (so a crate outside this workspace builds with the same settings) and the workspace root and
//! CARGO_HOME are remapped out of every embedded path (panic locations, mostly).

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use jitship_generation::ContentHash;
use std::process::{Command, Stdio};

/// The rustc target policies are built for.
pub const GUEST_TARGET: &str = "wasm32-unknown-unknown";

/// The cargo profile policies are built with. It is defined in jitship's workspace Cargo.toml and
/// also passed as `--config` (see `PROFILE_SETTINGS`), which wins over any manifest definition.
pub const GUEST_PROFILE: &str = "policy";

/// Same settings as `[profile.policy]` in the workspace Cargo.toml; keep both in step.
const PROFILE_SETTINGS: &[&str] = &[
    r#"profile.policy.inherits="release""#,
    r#"profile.policy.opt-level="s""#,
    "profile.policy.lto=true",
    "profile.policy.codegen-units=1",
    r#"profile.policy.panic="abort""#,
    "profile.policy.strip=true",
    "profile.policy.debug=false",
    "profile.policy.incremental=false",
];

/// Where remapped paths point; stable strings so outputs do not depend on the checkout path.
const REMAPPED_WORKSPACE: &str = "/policy";
const REMAPPED_CARGO_HOME: &str = "/cargo";
const REMAPPED_PATH_DEPS: &str = "/path-deps";

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(
        "this is not a core wasm module ({0}); build the crate for wasm32-unknown-unknown, not wasm32-wasip2"
    )]
    NotCoreModule(&'static str),
    #[error(
        "cannot turn the module into a component: {0}; build it with wit-bindgen (or plugins-sdk) against \
         plugins-sdk/wit/policy.wit so it carries the jitship:policy world"
    )]
    Componentize(String),
    #[error("no Cargo.toml in {0}; give the directory of a policy crate")]
    NoManifest(PathBuf),
    #[error(
        "the {GUEST_TARGET} target is not installed for the toolchain that builds {dir} (rustc's \
         sysroot {sysroot} has no lib/rustlib/{GUEST_TARGET}): run `rustup target add \
         {GUEST_TARGET}` in that directory, then build again (nothing was compiled)"
    )]
    MissingTarget { dir: PathBuf, sysroot: PathBuf },
    #[error("cannot run {cargo:?}: {source}; is cargo on PATH (or $CARGO set)?")]
    Spawn {
        cargo: OsString,
        source: std::io::Error,
    },
    #[error("`cargo {what}` failed for {manifest} ({status}){stderr}")]
    Cargo {
        what: &'static str,
        manifest: PathBuf,
        status: String,
        stderr: String,
    },
    #[error(
        "cargo built no cdylib .wasm for {0}; set `[lib] crate-type = [\"cdylib\"]` in its Cargo.toml \
         (and check `rustup target add wasm32-unknown-unknown`)"
    )]
    NoArtifact(PathBuf),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> BuildError + '_ {
    move |source| BuildError::Io {
        path: path.to_path_buf(),
        source,
    }
}

const CORE_PREAMBLE: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];

/// Turns a core module built with wit-bindgen into a component. The module's embedded
/// `component-type` section names the world; no WASI adapter is involved, so the component imports
/// exactly the `jitship:policy` interfaces the guest uses.
pub fn componentize(core_wasm: &[u8]) -> Result<Vec<u8>, BuildError> {
    if core_wasm.len() < 8 || core_wasm[..4] != CORE_PREAMBLE[..4] {
        return Err(BuildError::NotCoreModule("no wasm magic number"));
    }
    if core_wasm[4..8] != CORE_PREAMBLE[4..8] {
        return Err(BuildError::NotCoreModule(
            "it is already a component, or an unknown wasm version",
        ));
    }
    // An encoder given a module without wit-bindgen's `component-type` section happily produces an
    // empty component; refuse that here, where the author can still be told what to do.
    let (_, bindgen) = wit_component::metadata::decode(core_wasm)
        .map_err(|e| BuildError::Componentize(format!("{e:#}")))?;
    // wit-component merges the module's worlds into a synthesized `root:root` one, so look for the
    // contract's package among everything the module was bound to.
    let packages: Vec<_> = bindgen
        .resolve
        .packages
        .iter()
        .map(|(_, p)| &p.name)
        .collect();
    if !packages
        .iter()
        .any(|n| n.namespace == "jitship" && n.name == "policy")
    {
        let found: Vec<String> = packages
            .iter()
            .filter(|n| n.namespace != "root")
            .map(|n| n.to_string())
            .collect();
        return Err(BuildError::Componentize(if found.is_empty() {
            "the module carries no wit-bindgen world".into()
        } else {
            format!(
                "the module is bound to {}, not jitship:policy",
                found.join(", ")
            )
        }));
    }
    wit_component::ComponentEncoder::default()
        .module(core_wasm)
        .map_err(|e| BuildError::Componentize(format!("{e:#}")))?
        .validate(true)
        .encode()
        .map_err(|e| BuildError::Componentize(format!("{e:#}")))
}

#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// Cargo's target directory; `None` = the crate's own (cargo's default).
    pub target_dir: Option<PathBuf>,
    /// Capture cargo's stderr (reported on failure) instead of letting it through to the terminal.
    pub quiet: bool,
    /// `--locked`: refuse to update the crate's Cargo.lock (for CI and reproducible builds).
    pub locked: bool,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct BuiltPolicy {
    /// The cdylib's name (the default output file stem).
    pub name: String,
    /// The core module cargo produced.
    pub core_module: PathBuf,
    pub core_size: u64,
    /// The component jitship loads.
    pub component: Vec<u8>,
    /// blake3 of `component`, as recorded in manifests.
    pub digest: String,
    /// What makes this build depend on where it was built (shown by `jitship policy build`).
    pub warnings: Vec<String>,
}

/// Builds the policy crate in `manifest_dir` for wasm32 and componentizes it. Writes nothing but
/// cargo's own outputs; see `build_policy_crate_to` to write the component.
pub fn build_policy_crate(
    manifest_dir: &Path,
    opts: &BuildOptions,
) -> Result<BuiltPolicy, BuildError> {
    let manifest = manifest_dir.join("Cargo.toml");
    if !manifest.is_file() {
        return Err(BuildError::NoManifest(manifest_dir.to_path_buf()));
    }
    let manifest = manifest.canonicalize().map_err(io_err(&manifest))?;
    // Before a minute of compiling: is the guest target there at all?
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    check_guest_target(&rustc, manifest.parent().unwrap_or(manifest_dir))?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let roots = path_roots(&cargo, &manifest, opts.locked)?;

    // rustc applies the last matching remap: the workspace goes last so it wins even if it sits
    // under CARGO_HOME. Path dependencies outside the workspace (a plugins-sdk checkout next to the
    // policy) are remapped one by one.
    let mut remaps = Vec::new();
    if let Some(home) = cargo_home() {
        remaps.push(format!(
            "--remap-path-prefix={}={REMAPPED_CARGO_HOME}",
            home.display()
        ));
    }
    for (dir, name) in &roots.path_deps {
        remaps.push(format!(
            "--remap-path-prefix={}={REMAPPED_PATH_DEPS}/{name}",
            dir.display()
        ));
    }
    remaps.push(format!(
        "--remap-path-prefix={}={REMAPPED_WORKSPACE}",
        roots.workspace.display()
    ));

    let mut cmd = Command::new(&cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(&manifest)
        .args([
            "--lib",
            "--target",
            GUEST_TARGET,
            "--profile",
            GUEST_PROFILE,
        ])
        .arg("--message-format=json-render-diagnostics");
    for setting in PROFILE_SETTINGS {
        cmd.args(["--config", setting]);
    }
    if opts.locked {
        cmd.arg("--locked");
    }
    if let Some(dir) = &opts.target_dir {
        cmd.arg("--target-dir").arg(dir);
    }
    // Rustflags from the caller's environment would make the output depend on who built it;
    // CARGO_ENCODED_RUSTFLAGS takes precedence over every other rustflags source.
    cmd.env_remove("RUSTFLAGS")
        .env("CARGO_ENCODED_RUSTFLAGS", remaps.join("\x1f"));
    cmd.stdout(Stdio::piped()).stderr(if opts.quiet {
        Stdio::piped()
    } else {
        Stdio::inherit()
    });

    let mut child = cmd.spawn().map_err(|source| BuildError::Spawn {
        cargo: cargo.clone(),
        source,
    })?;
    // Drain stderr on a thread so a chatty build cannot fill the pipe and deadlock us.
    let stderr_thread = child.stderr.take().map(|mut err| {
        std::thread::spawn(move || {
            let mut buf = String::new();
            let _ = err.read_to_string(&mut buf);
            buf
        })
    });
    let mut artifact = None;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let line = line.map_err(io_err(&manifest))?;
            if let Some(found) = cdylib_artifact(&line, &manifest) {
                artifact = Some(found);
            }
        }
    }
    let status = child.wait().map_err(|source| BuildError::Spawn {
        cargo: cargo.clone(),
        source,
    })?;
    let stderr = stderr_thread
        .and_then(|t| t.join().ok())
        .unwrap_or_default();
    if !status.success() {
        return Err(BuildError::Cargo {
            what: "build",
            manifest,
            status: status.to_string(),
            stderr: tail(&stderr),
        });
    }
    let (name, core_module) = artifact.ok_or_else(|| BuildError::NoArtifact(manifest.clone()))?;
    let core = std::fs::read(&core_module).map_err(io_err(&core_module))?;
    let component = componentize(&core)?;
    let digest = ContentHash::of(&component).to_hex();
    // Remapping keeps the checkout path out of embedded strings, but cargo also hashes the absolute
    // path of a path dependency outside the workspace into its symbol names, which reorders code:
    // the bytes then differ between checkouts (measured by the reproducibility test).
    let warnings = roots
        .path_deps
        .iter()
        .map(|(dir, name)| {
            format!(
                "path dependency {name} ({}) lies outside the workspace {}: the module's bytes will depend on \
                 the checkout path; make it a workspace member (as `jitship policy new` does with its sdk/), \
                 or depend on it through git or a registry",
                dir.display(),
                roots.workspace.display()
            )
        })
        .collect();
    Ok(BuiltPolicy {
        name,
        core_module,
        core_size: core.len() as u64,
        component,
        digest,
        warnings,
    })
}

/// `build_policy_crate`, then writes the component to `out` atomically (temp file + rename), so a
/// reader never sees half a module.
pub fn build_policy_crate_to(
    manifest_dir: &Path,
    out: &Path,
    opts: &BuildOptions,
) -> Result<BuiltPolicy, BuildError> {
    let built = build_policy_crate(manifest_dir, opts)?;
    write_component(out, &built.component)?;
    Ok(built)
}

/// Fails fast when the toolchain that builds `dir` (rustup picks it by `dir`'s
/// rust-toolchain.toml) lacks the guest target's standard library. A rustc that cannot say its
/// sysroot is left to cargo to report.
pub fn check_guest_target(rustc: &std::ffi::OsStr, dir: &Path) -> Result<(), BuildError> {
    let Ok(out) = Command::new(rustc)
        .args(["--print", "sysroot"])
        .current_dir(dir)
        .output()
    else {
        return Ok(());
    };
    if !out.status.success() {
        return Ok(());
    }
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if sysroot.join("lib/rustlib").join(GUEST_TARGET).is_dir() {
        return Ok(());
    }
    Err(BuildError::MissingTarget {
        dir: dir.to_path_buf(),
        sysroot,
    })
}

/// Writes a component to `out` atomically (temp file in the same directory, then rename).
pub fn write_component(out: &Path, bytes: &[u8]) -> Result<(), BuildError> {
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    // 0644 less the umask, like any file a build writes: the module is meant to be read (copied
    // into images, served, checked by others), not private as a temp file's 0600 would make it.
    let mut tmp = tempfile::Builder::new()
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .tempfile_in(&dir)
        .map_err(io_err(&dir))?;
    std::io::Write::write_all(&mut tmp, bytes).map_err(io_err(out))?;
    tmp.persist(out).map_err(|e| BuildError::Io {
        path: out.to_path_buf(),
        source: e.error,
    })?;
    Ok(())
}

struct PathRoots {
    workspace: PathBuf,
    /// Local (path) dependencies outside the workspace: their directory and `name-version`.
    path_deps: Vec<(PathBuf, String)>,
}

/// Where the sources that can end up in embedded paths live: the workspace, and every path
/// dependency outside it (whose panic locations rustc records as absolute paths).
fn path_roots(cargo: &OsString, manifest: &Path, locked: bool) -> Result<PathRoots, BuildError> {
    let mut options = vec!["--filter-platform".to_owned(), GUEST_TARGET.to_owned()];
    if locked {
        options.push("--locked".to_owned());
    }
    let out = cargo_metadata::MetadataCommand::new()
        .cargo_path(cargo)
        .manifest_path(manifest)
        .other_options(options)
        .cargo_command()
        .output()
        .map_err(|source| BuildError::Spawn {
            cargo: cargo.clone(),
            source,
        })?;
    let failed = |stderr: String| BuildError::Cargo {
        what: "metadata",
        manifest: manifest.to_path_buf(),
        status: out.status.to_string(),
        stderr,
    };
    if !out.status.success() {
        return Err(failed(tail(&String::from_utf8_lossy(&out.stderr))));
    }
    let meta = cargo_metadata::MetadataCommand::parse(String::from_utf8_lossy(&out.stdout))
        .map_err(|e| failed(format!(": unreadable output: {e}")))?;
    let workspace = meta.workspace_root.into_std_path_buf();
    let mut path_deps: Vec<(PathBuf, String)> = meta
        .packages
        .iter()
        // Registry and git packages have a source and live under CARGO_HOME; path packages do not.
        .filter(|pkg| pkg.source.is_none())
        .filter_map(|pkg| {
            let dir = pkg.manifest_path.parent()?.as_std_path().to_path_buf();
            let name = format!("{}-{}", pkg.name, pkg.version);
            (!dir.starts_with(&workspace)).then_some((dir, name))
        })
        .collect();
    path_deps.sort();
    Ok(PathRoots {
        workspace,
        path_deps,
    })
}

fn cargo_home() -> Option<PathBuf> {
    if let Some(home) = std::env::var_os("CARGO_HOME") {
        return Some(PathBuf::from(home));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo"))
}

/// The cdylib `.wasm` of the package at `manifest`, from one line of cargo's JSON messages.
fn cdylib_artifact(line: &str, manifest: &Path) -> Option<(String, PathBuf)> {
    use cargo_metadata::{Message, TargetKind};
    let Ok(Message::CompilerArtifact(artifact)) = serde_json::from_str::<Message>(line) else {
        return None;
    };
    if artifact.manifest_path.as_std_path() != manifest
        || !artifact.target.kind.contains(&TargetKind::CDyLib)
    {
        return None;
    }
    let wasm = artifact
        .filenames
        .iter()
        .find(|f| f.extension() == Some("wasm"))?;
    Some((artifact.target.name, wasm.as_std_path().to_path_buf()))
}

fn tail(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().collect();
    if lines.is_empty() {
        return String::new();
    }
    let start = lines.len().saturating_sub(30);
    format!(":\n{}", lines[start..].join("\n"))
}

#[cfg(test)]
mod tests {
    /// Issue 43: a toolchain without the guest target is refused before cargo compiles anything,
    /// with the command that fixes it.
    #[test]
    fn a_toolchain_without_the_guest_target_is_refused_first() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let sysroot = tmp.path().join("sysroot");
        std::fs::create_dir_all(sysroot.join("lib/rustlib/x86_64-unknown-linux-gnu")).unwrap();
        let rustc = tmp.path().join("rustc");
        std::fs::write(&rustc, format!("#!/bin/sh\necho {}\n", sysroot.display())).unwrap();
        std::fs::set_permissions(&rustc, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = super::check_guest_target(rustc.as_os_str(), tmp.path()).unwrap_err();
        let said = err.to_string();
        assert!(
            said.contains("rustup target add wasm32-unknown-unknown")
                && said.contains("nothing was compiled"),
            "{said}"
        );
        std::fs::create_dir_all(sysroot.join("lib/rustlib/wasm32-unknown-unknown")).unwrap();
        super::check_guest_target(rustc.as_os_str(), tmp.path()).unwrap();
    }

    use super::*;

    #[test]
    fn componentize_refuses_what_is_not_a_core_module() {
        assert!(matches!(
            componentize(b"hello"),
            Err(BuildError::NotCoreModule(_))
        ));
        let component_header = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];
        assert!(matches!(
            componentize(&component_header),
            Err(BuildError::NotCoreModule(_))
        ));
        // A valid core module with no component-type section: not a policy.
        let err = componentize(&CORE_PREAMBLE).unwrap_err();
        assert!(matches!(err, BuildError::Componentize(_)), "{err}");
    }

    #[test]
    fn the_written_module_is_readable_by_others_less_the_umask() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("sub/p.wasm");
        write_component(&out, b"module").unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"module");
        let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        // The umask of this process, read without changing it.
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let umask = status
            .lines()
            .find_map(|l| l.strip_prefix("Umask:"))
            .map(|u| u32::from_str_radix(u.trim(), 8).unwrap())
            .unwrap_or(0o022);
        assert_eq!(mode, 0o644 & !umask, "mode {mode:o}, umask {umask:o}");
        // Rewriting keeps it so (the temp file is renamed over the old module).
        write_component(&out, b"again").unwrap();
        let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644 & !umask);
    }

    #[test]
    fn artifact_line_is_matched_by_manifest_and_kind() {
        // As cargo 1.95 prints it for a policy crate.
        let line = r#"{"reason":"compiler-artifact","package_id":"path+file:///x#p@0.1.0","manifest_path":"/x/Cargo.toml","target":{"kind":["cdylib"],"crate_types":["cdylib"],"name":"p","src_path":"/x/src/lib.rs","edition":"2024","doc":true,"doctest":false,"test":true},"profile":{"opt_level":"s","debuginfo":0,"debug_assertions":false,"overflow_checks":false,"test":false},"features":[],"filenames":["/x/target/wasm32-unknown-unknown/policy/p.wasm"],"executable":null,"fresh":false}"#;
        assert_eq!(
            cdylib_artifact(line, Path::new("/x/Cargo.toml")),
            Some((
                "p".into(),
                PathBuf::from("/x/target/wasm32-unknown-unknown/policy/p.wasm")
            ))
        );
        assert_eq!(cdylib_artifact(line, Path::new("/y/Cargo.toml")), None);
        assert_eq!(
            cdylib_artifact(&line.replace("cdylib", "lib"), Path::new("/x/Cargo.toml")),
            None
        );
    }
}
