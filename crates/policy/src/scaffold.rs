//! `jitship policy new`: a new policy crate that builds with `jitship policy build` out of the box,
//! anywhere, with no access to jitship's repository.
//!
//! The SDK has no published crate nor public git URL, so its source is embedded in the binary
//! ([`SDK_FILES`], listed one by one; a test fails if `plugins-sdk/` gains a file the list lacks)
//! and written beside the new crate as `sdk/`, a path dependency. The contract crate the SDK
//! depends on (`crates/policy-contract`, [`CONTRACT_FILES`]) goes with it, as `sdk/contract/`.
//! Their Cargo.toml files are made standalone: every `workspace = true` field resolved from
//! jitship's workspace manifest, and the SDK's path to the contract pointed at `contract`. The SDK
//! written is therefore the one of the jitship that wrote it, version included.
//!
//! The templates are files under `scaffold/` with `{{placeholders}}` ([`render`]).

use std::path::{Path, PathBuf};

/// The SDK's files as jitship embeds them: path under the SDK directory, contents. Every file of
/// `plugins-sdk/` is here (`the_embedded_sdk_is_every_file_of_plugins_sdk`).
pub const SDK_FILES: &[(&str, &str)] = &[
    (
        "Cargo.toml",
        include_str!("../../../plugins-sdk/Cargo.toml"),
    ),
    (
        "src/lib.rs",
        include_str!("../../../plugins-sdk/src/lib.rs"),
    ),
    (
        "src/facts.rs",
        include_str!("../../../plugins-sdk/src/facts.rs"),
    ),
    (
        "src/host.rs",
        include_str!("../../../plugins-sdk/src/host.rs"),
    ),
    (
        "src/key.rs",
        include_str!("../../../plugins-sdk/src/key.rs"),
    ),
    (
        "src/retention.rs",
        include_str!("../../../plugins-sdk/src/retention.rs"),
    ),
    (
        "src/rules.rs",
        include_str!("../../../plugins-sdk/src/rules.rs"),
    ),
    (
        "src/settings.rs",
        include_str!("../../../plugins-sdk/src/settings.rs"),
    ),
    (
        "wit/policy.wit",
        include_str!("../../../plugins-sdk/wit/policy.wit"),
    ),
];

/// The contract crate's files (`crates/policy-contract/`), written as `sdk/contract/`: every file
/// there is here (`the_embedded_contract_is_every_file_of_policy_contract`).
pub const CONTRACT_FILES: &[(&str, &str)] = &[
    (
        "Cargo.toml",
        include_str!("../../../crates/policy-contract/Cargo.toml"),
    ),
    (
        "src/lib.rs",
        include_str!("../../../crates/policy-contract/src/lib.rs"),
    ),
];

/// Files a built-in policy's `src/lib.rs` reads with `include_str!` (its test data), by kind:
/// written beside it, so the new policy's tests build (`every_file_a_builtin_includes_is_embedded`).
pub const BUILTIN_EXTRA_FILES: &[(&str, &str, &str)] = &[(
    "vllm-compile",
    "src/aot_tree.txt",
    include_str!("../../../policies/vllm-compile/src/aot_tree.txt"),
)];

/// The source of each built-in policy (`policies/<kind>/src/lib.rs`), by kind: `policy new
/// --kind KIND` starts from it (`render`), so a new policy for a known kind has its root, its
/// environment variables, its `select`, `canonicalize` and `materialize` from the first build.
/// Every built-in is here (`every_builtin_kind_has_its_source_embedded`).
pub const BUILTIN_SOURCES: &[(&str, &str)] = &[
    (
        "cuda-computecache",
        include_str!("../../../policies/cuda-computecache/src/lib.rs"),
    ),
    (
        "cute-dsl",
        include_str!("../../../policies/cute-dsl/src/lib.rs"),
    ),
    (
        "deepgemm",
        include_str!("../../../policies/deepgemm/src/lib.rs"),
    ),
    (
        "flashinfer-autotune",
        include_str!("../../../policies/flashinfer-autotune/src/lib.rs"),
    ),
    (
        "flashinfer-jit",
        include_str!("../../../policies/flashinfer-jit/src/lib.rs"),
    ),
    (
        "inductor",
        include_str!("../../../policies/inductor/src/lib.rs"),
    ),
    (
        "inductor-pch",
        include_str!("../../../policies/inductor-pch/src/lib.rs"),
    ),
    (
        "sglang-compile",
        include_str!("../../../policies/sglang-compile/src/lib.rs"),
    ),
    (
        "sglang-jit",
        include_str!("../../../policies/sglang-jit/src/lib.rs"),
    ),
    (
        "tilelang",
        include_str!("../../../policies/tilelang/src/lib.rs"),
    ),
    (
        "triton",
        include_str!("../../../policies/triton/src/lib.rs"),
    ),
    (
        "tvm-ffi",
        include_str!("../../../policies/tvm-ffi/src/lib.rs"),
    ),
    (
        "vllm-compile",
        include_str!("../../../policies/vllm-compile/src/lib.rs"),
    ),
    (
        "vllm-modelinfos",
        include_str!("../../../policies/vllm-modelinfos/src/lib.rs"),
    ),
];

/// `jitship-policy-common` (`policies/common/`), the layout rules the built-ins share, written
/// as `common/` beside a crate started from a built-in: every file there is here
/// (`the_embedded_common_is_every_file_of_policies_common`).
pub const COMMON_FILES: &[(&str, &str)] = &[
    (
        "Cargo.toml",
        include_str!("../../../policies/common/Cargo.toml"),
    ),
    (
        "src/lib.rs",
        include_str!("../../../policies/common/src/lib.rs"),
    ),
    (
        "src/check.rs",
        include_str!("../../../policies/common/src/check.rs"),
    ),
    (
        "src/compile_cache.rs",
        include_str!("../../../policies/common/src/compile_cache.rs"),
    ),
    (
        "src/inductor.rs",
        include_str!("../../../policies/common/src/inductor.rs"),
    ),
    (
        "src/testing.rs",
        include_str!("../../../policies/common/src/testing.rs"),
    ),
    (
        "src/triton.rs",
        include_str!("../../../policies/common/src/triton.rs"),
    ),
];

/// The common crate's dependency on the SDK in the repository, and in the written crate.
const SDK_DEP_IN_COMMON: &str = r#"jitship-policy-sdk = { path = "../../plugins-sdk" }"#;
const SDK_DEP_WRITTEN_COMMON: &str = r#"jitship-policy-sdk = { path = "../sdk" }"#;

/// The SDK's dependency on the contract crate in the repository, and in the written crate.
const CONTRACT_DEP_IN_REPO: &str =
    r#"jitship-policy-contract = { path = "../crates/policy-contract" }"#;
const CONTRACT_DEP_WRITTEN: &str = r#"jitship-policy-contract = { path = "contract" }"#;

/// jitship's workspace manifest: where the SDK's `workspace = true` fields take their values.
const WORKSPACE_MANIFEST: &str = include_str!("../../../Cargo.toml");

const CARGO_TOML: &str = include_str!("scaffold/Cargo.toml.tmpl");
const LIB_RS: &str = include_str!("scaffold/lib.rs.tmpl");
const README_MD: &str = include_str!("scaffold/README.md.tmpl");
const GITIGNORE: &str = include_str!("scaffold/gitignore.tmpl");
const CARGO_TOML_BUILTIN: &str = include_str!("scaffold/Cargo.builtin.toml.tmpl");

/// The generations the scaffold's retention keeps (`KEEP` in its lib.rs; said in its README).
const KEEP: u32 = 3;

/// The version of the jitship writing the crate, and so of the SDK it writes.
pub const SDK_VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Debug, thiserror::Error)]
pub enum ScaffoldError {
    #[error(
        "{0:?} is not a crate name: use ASCII letters, digits, - and _, starting with a letter"
    )]
    InvalidName(String),
    #[error(
        "{0:?} is not a cache kind: use lowercase letters, digits, - and _ (--kind KIND; it defaults to NAME)"
    )]
    InvalidKind(String),
    #[error("{0} exists and is not empty; give another NAME or --dir (nothing was written)")]
    NotEmpty(PathBuf),
    #[error("{0} exists and is not a directory (nothing was written)")]
    NotADirectory(PathBuf),
    #[error("the embedded SDK manifest: {0}")]
    SdkManifest(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What `jitship policy new` was asked for.
#[derive(Debug, Clone)]
pub struct NewPolicy {
    /// The crate's name (and the policy's `info().name`).
    pub name: String,
    /// The cache kind it governs.
    pub kind: String,
    /// Where the crate goes: created if missing, else it must be empty.
    pub dir: PathBuf,
}

/// What was written.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Scaffolded {
    pub dir: PathBuf,
    pub name: String,
    pub kind: String,
    /// What `src/lib.rs` started from: `builtin:KIND` (jitship's own policy of the kind) or
    /// `generic` (a kind jitship has no policy for).
    pub template: String,
    /// The lib name: the module `policy build` writes is `<crate_name>.wasm`.
    pub crate_name: String,
    pub sdk_version: String,
    /// Every file written, relative to `dir`, in the order written.
    pub files: Vec<String>,
}

/// A crate name cargo accepts (and a policy name): an ASCII letter, then letters, digits, `-`, `_`.
pub fn check_name(name: &str) -> Result<(), ScaffoldError> {
    let mut chars = name.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && name.len() <= 64;
    if ok {
        Ok(())
    } else {
        Err(ScaffoldError::InvalidName(name.into()))
    }
}

/// A cache kind as the config accepts it: lowercase letters, digits, `-`, `_`.
pub fn check_kind(kind: &str) -> Result<(), ScaffoldError> {
    let ok = !kind.is_empty()
        && kind.len() <= 64
        && kind
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(ScaffoldError::InvalidKind(kind.into()))
    }
}

/// `my-cache` -> `MyCache` (the policy's type); a name starting with a digit part gets `Policy`
/// in front.
fn type_name(name: &str) -> String {
    let mut out: String = name
        .split(['-', '_'])
        .filter(|p| !p.is_empty())
        .map(|p| {
            let mut c = p.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect();
    if !out.starts_with(|c: char| c.is_ascii_alphabetic()) {
        out.insert_str(0, "Policy");
    }
    out
}

/// The files of a new crate for `name` and `kind`: path relative to its directory, contents.
pub fn render(name: &str, kind: &str) -> Result<Vec<(String, String)>, ScaffoldError> {
    check_name(name)?;
    check_kind(kind)?;
    let crate_name = name.replace('-', "_");
    let root_env = format!("{}_CACHE_DIR", kind.to_ascii_uppercase().replace('-', "_"));
    let fill = |template: &str| {
        template
            .replace("{{name}}", name)
            .replace("{{kind}}", kind)
            .replace("{{crate_name}}", &crate_name)
            .replace("{{type_name}}", &type_name(name))
            .replace("{{root_env}}", &root_env)
            .replace("{{keep}}", &KEEP.to_string())
            .replace("{{jitship_version}}", SDK_VERSION)
    };
    let mut files = vec![
        ("Cargo.toml".to_string(), fill(CARGO_TOML)),
        ("src/lib.rs".to_string(), fill(LIB_RS)),
        ("README.md".to_string(), fill(README_MD)),
        (".gitignore".to_string(), fill(GITIGNORE)),
    ];
    if let Some(source) = builtin_source(kind) {
        files[0].1 = fill(CARGO_TOML_BUILTIN);
        files[1].1 = from_builtin(name, kind, source)?;
        for (_, path, text) in BUILTIN_EXTRA_FILES.iter().filter(|(k, ..)| *k == kind) {
            files.push(((*path).to_string(), (*text).to_string()));
        }
        for (path, text) in COMMON_FILES {
            let text = if *path == "Cargo.toml" {
                standalone_common_manifest()?
            } else {
                (*text).to_string()
            };
            files.push((format!("common/{path}"), text));
        }
    }
    for (path, text) in SDK_FILES {
        let text = if *path == "Cargo.toml" {
            standalone_sdk_manifest()?
        } else {
            (*text).to_string()
        };
        files.push((format!("sdk/{path}"), text));
    }
    for (path, text) in CONTRACT_FILES {
        let text = if *path == "Cargo.toml" {
            standalone_manifest(text)?
        } else {
            (*text).to_string()
        };
        files.push((format!("sdk/contract/{path}"), text));
    }
    Ok(files)
}

/// The source of the built-in policy of `kind`, if jitship has one.
pub fn builtin_source(kind: &str) -> Option<&'static str> {
    BUILTIN_SOURCES
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, s)| *s)
}

/// The built-in policy's source as the new crate's `src/lib.rs`: its `info` names the new policy
/// and takes its version from Cargo.toml; everything else (root, environment variables, key,
/// select, canonicalize, materialize, retention, tests) is the built-in's.
fn from_builtin(name: &str, kind: &str, source: &str) -> Result<String, ScaffoldError> {
    let err = |what: &str| {
        ScaffoldError::SdkManifest(format!(
            "policies/{kind}/src/lib.rs has no `{what}` line in its info to rename"
        ))
    };
    let named = format!("name: \"{kind}\".into(),");
    if !source.contains(&named) {
        return Err(err(&named));
    }
    let mut out = format!(
        "//! `{name}`: a jitship policy for the `{kind}` cache kind, started from the built-in \
         `{kind}`\n//! policy of jitship {SDK_VERSION} (its root, environment variables, key, \
         select, canonicalize,\n//! materialize and retention; `common/` holds the layout rules \
         the built-ins share). Change\n//! what your cache needs; `cargo test` runs its tests \
         natively, `jitship policy build` makes\n//! the module (see README.md).\n//!\n"
    );
    let mut versioned = false;
    for line in source.lines() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        if trimmed == named {
            out.push_str(&format!("{indent}name: \"{name}\".into(),\n"));
        } else if !versioned
            && trimmed.starts_with("version: \"")
            && trimmed.ends_with("\".into(),")
        {
            out.push_str(&format!(
                "{indent}version: env!(\"CARGO_PKG_VERSION\").into(),\n"
            ));
            versioned = true;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !versioned {
        return Err(err("version: \"...\".into(),"));
    }
    Ok(out)
}

/// `policies/common/Cargo.toml` made standalone, its dependency on the SDK pointed at `sdk/`.
pub fn standalone_common_manifest() -> Result<String, ScaffoldError> {
    let common = COMMON_FILES[0].1;
    if !common.contains(SDK_DEP_IN_COMMON) {
        return Err(ScaffoldError::SdkManifest(format!(
            "policies/common/Cargo.toml has no line `{SDK_DEP_IN_COMMON}` to point at the written SDK"
        )));
    }
    standalone_manifest(&common.replace(SDK_DEP_IN_COMMON, SDK_DEP_WRITTEN_COMMON))
}

/// The SDK's Cargo.toml made standalone ([`standalone_manifest`]), its dependency on the
/// contract crate pointed at `sdk/contract/`, where [`render`] writes it.
pub fn standalone_sdk_manifest() -> Result<String, ScaffoldError> {
    let sdk = SDK_FILES[0].1;
    if !sdk.contains(CONTRACT_DEP_IN_REPO) {
        return Err(ScaffoldError::SdkManifest(format!(
            "plugins-sdk/Cargo.toml has no line `{CONTRACT_DEP_IN_REPO}` to point at the written contract crate"
        )));
    }
    standalone_manifest(&sdk.replace(CONTRACT_DEP_IN_REPO, CONTRACT_DEP_WRITTEN))
}

/// A member's Cargo.toml with every `KEY.workspace = true` replaced by the workspace's value:
/// `[package]` fields from `[workspace.package]`, dependencies from `[workspace.dependencies]`.
/// Comments and layout are kept; anything still naming the workspace is an error.
pub fn standalone_manifest(sdk: &str) -> Result<String, ScaffoldError> {
    let err = |m: String| ScaffoldError::SdkManifest(m);
    let ws: toml::Table = WORKSPACE_MANIFEST
        .parse()
        .map_err(|e| err(format!("the workspace Cargo.toml: {e}")))?;
    let section = |name: &str| {
        ws.get("workspace")
            .and_then(|w| w.get(name))
            .and_then(toml::Value::as_table)
            .cloned()
            .unwrap_or_default()
    };
    let (package, dependencies) = (section("package"), section("dependencies"));
    let mut out = String::with_capacity(sdk.len());
    let mut current = String::new();
    for line in sdk.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            current = trimmed.trim_matches(['[', ']']).to_string();
        }
        let resolved = match trimmed.split_once(".workspace") {
            Some((key, rest))
                if rest.trim_start().strip_prefix('=').map(str::trim) == Some("true") =>
            {
                let from = if current == "package" {
                    &package
                } else if current.ends_with("dependencies") {
                    &dependencies
                } else {
                    return Err(err(format!("[{current}] {key}: workspace = true here")));
                };
                let value = from.get(key).ok_or_else(|| {
                    err(format!(
                        "{key}: the workspace Cargo.toml does not define it"
                    ))
                })?;
                Some(format!("{key} = {}", inline(value)))
            }
            _ => None,
        };
        out.push_str(resolved.as_deref().unwrap_or(line));
        out.push('\n');
    }
    let parsed: toml::Table = out
        .parse()
        .map_err(|e| err(format!("the standalone manifest does not parse: {e}")))?;
    if mentions_workspace(&toml::Value::Table(parsed)) {
        return Err(err(
            "a field still inherits from the workspace in a form not resolved here".into(),
        ));
    }
    Ok(out)
}

/// A TOML value on one line (tables inline).
fn inline(value: &toml::Value) -> String {
    match value {
        toml::Value::Table(t) => {
            let fields: Vec<String> = t
                .iter()
                .map(|(k, v)| format!("{k} = {}", inline(v)))
                .collect();
            format!("{{ {} }}", fields.join(", "))
        }
        toml::Value::Array(a) => {
            let items: Vec<String> = a.iter().map(inline).collect();
            format!("[{}]", items.join(", "))
        }
        other => other.to_string(),
    }
}

fn mentions_workspace(value: &toml::Value) -> bool {
    match value {
        toml::Value::Table(t) => t
            .iter()
            .any(|(k, v)| k == "workspace" || mentions_workspace(v)),
        toml::Value::Array(a) => a.iter().any(mentions_workspace),
        _ => false,
    }
}

/// Writes the crate: refuses a `dir` that exists and is not an empty directory, before writing
/// anything.
pub fn create(req: &NewPolicy) -> Result<Scaffolded, ScaffoldError> {
    let files = render(&req.name, &req.kind)?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ScaffoldError::Io { path, source }
    };
    match std::fs::symlink_metadata(&req.dir) {
        Ok(meta) if meta.is_dir() => {
            if std::fs::read_dir(&req.dir)
                .map_err(io(&req.dir))?
                .next()
                .is_some()
            {
                return Err(ScaffoldError::NotEmpty(req.dir.clone()));
            }
        }
        Ok(_) => return Err(ScaffoldError::NotADirectory(req.dir.clone())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(&req.dir).map_err(io(&req.dir))?;
        }
        Err(e) => return Err(io(&req.dir)(e)),
    }
    let mut written = Vec::with_capacity(files.len());
    for (rel, text) in &files {
        let path = req.dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        // create_new: nothing that appeared meanwhile is overwritten.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io(&path))?;
        std::io::Write::write_all(&mut f, text.as_bytes()).map_err(io(&path))?;
        written.push(rel.clone());
    }
    Ok(Scaffolded {
        dir: req.dir.clone(),
        name: req.name.clone(),
        kind: req.kind.clone(),
        template: match builtin_source(&req.kind) {
            Some(_) => format!("builtin:{}", req.kind),
            None => "generic".into(),
        },
        crate_name: req.name.replace('-', "_"),
        sdk_version: SDK_VERSION.into(),
        files: written,
    })
}

#[cfg(test)]
mod tests;
