//! Which contract a component speaks, read from its import and export names before it is
//! instantiated (no custom section needed: the WIT package version is in the names, e.g.
//! `jitship:policy/host@3.0.0`).

use wasmtime::Engine;
use wasmtime::component::Component;
use wasmtime::component::types::ComponentItem;

use super::super::PolicyError;

/// The WIT package this jitship speaks.
pub const CONTRACT_PACKAGE: &str = "jitship:policy";
/// Its version, as in plugins-sdk/wit/policy.wit. Minor versions only add; majors break.
pub const CONTRACT_MAJOR: u64 = 3;
pub const CONTRACT_MINOR: u64 = 0;
/// Interfaces of the package the host provides.
const PROVIDED_INTERFACES: &[&str] = &["types", "host"];
/// World exports the host calls.
pub const REQUIRED_EXPORTS: &[&str] = &[
    "info",
    "check-settings",
    "compat-key",
    "select",
    "canonicalize",
    "materialize",
    "retain",
];

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ContractInfo {
    /// The contract version the component was built against, e.g. "3.0.0".
    pub version: String,
    /// Every import, down to the function: `jitship:policy/host@3.0.0#read-file`.
    pub imports: Vec<String>,
    pub exports: Vec<String>,
}

impl ContractInfo {
    /// Whether the policy can read files at all (a capability an operator may want to know of).
    pub fn uses_read_file(&self) -> bool {
        self.imports.iter().any(|i| i.ends_with("#read-file"))
    }
}

struct Version {
    major: u64,
    minor: u64,
    text: String,
}

fn parse_version(v: &str) -> Option<Version> {
    let core = v.split(['-', '+']).next()?;
    let mut it = core.split('.');
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some(Version {
        major,
        minor,
        text: v.to_string(),
    })
}

/// Checks `component` speaks a contract this host can run; `source` names it in messages.
pub fn check(
    component: &Component,
    engine: &Engine,
    source: &str,
) -> Result<ContractInfo, PolicyError> {
    let ty = component.component_type();
    let ours = format!("{CONTRACT_PACKAGE}@{CONTRACT_MAJOR}.{CONTRACT_MINOR}.0");
    let mut imports = Vec::new();
    let mut version: Option<Version> = None;
    for (name, item) in ty.imports(engine) {
        let Some((package, rest)) = name.split_once('/') else {
            return Err(PolicyError::Contract(format!(
                "policy {source} imports {name:?}, which jitship does not provide (a policy imports only \
                 {CONTRACT_PACKAGE} interfaces); rebuild it with plugins-sdk"
            )));
        };
        if package != CONTRACT_PACKAGE {
            return Err(PolicyError::Contract(format!(
                "policy {source} imports {name}, which jitship does not provide: policies get no WASI or other \
                 capability. Build it for wasm32-unknown-unknown with `jitship policy build`, not for wasm32-wasip2"
            )));
        }
        let (interface, ver) = rest.split_once('@').unwrap_or((rest, ""));
        let Some(v) = parse_version(ver) else {
            return Err(PolicyError::Contract(format!(
                "policy {source} imports {name} without a version; rebuild it with plugins-sdk {CONTRACT_MAJOR}.x"
            )));
        };
        if v.major != CONTRACT_MAJOR {
            return Err(mismatch(source, &v.text, &ours));
        }
        if !PROVIDED_INTERFACES.contains(&interface) {
            return Err(PolicyError::Contract(format!(
                "policy {source} imports {name}, which this jitship (speaking {ours}) does not provide; it was \
                 built for a newer contract: upgrade jitship or rebuild the policy with an older plugins-sdk"
            )));
        }
        match &item.ty {
            ComponentItem::ComponentInstance(inst) => {
                // Functions only: the capabilities a policy uses (types such as `level` are not).
                let mut funcs: Vec<String> = inst
                    .exports(engine)
                    .filter(|(_, e)| matches!(e.ty, ComponentItem::ComponentFunc(_)))
                    .map(|(f, _)| format!("{name}#{f}"))
                    .collect();
                if interface == "types" {
                    funcs.clear();
                    funcs.push(name.to_string());
                }
                imports.extend(funcs);
            }
            _ => imports.push(name.to_string()),
        }
        if version.as_ref().is_none_or(|have| have.minor < v.minor) {
            version = Some(v);
        }
    }
    let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
    // Exported functions carry no version; an export named after a future package major does.
    for name in &exports {
        if let Some(rest) = name.strip_prefix(&format!("{CONTRACT_PACKAGE}/"))
            && let Some(v) = rest.split_once('@').and_then(|(_, v)| parse_version(v))
            && v.major != CONTRACT_MAJOR
        {
            return Err(mismatch(source, &v.text, &ours));
        }
    }
    let Some(version) = version else {
        return Err(PolicyError::Contract(format!(
            "policy {source} imports no {CONTRACT_PACKAGE} interface, so it cannot be speaking {ours}; build it \
             with plugins-sdk (or wit-bindgen against plugins-sdk/wit/policy.wit)"
        )));
    };
    let missing: Vec<&str> = REQUIRED_EXPORTS
        .iter()
        .copied()
        .filter(|want| !exports.iter().any(|e| e == want))
        .collect();
    if !missing.is_empty() {
        return Err(PolicyError::Contract(format!(
            "policy {source} does not export {} (it exports {:?}); it is not a {ours} policy",
            missing.join(", "),
            exports
        )));
    }
    if version.minor > CONTRACT_MINOR {
        tracing::info!(
            policy = source,
            "policy speaks {CONTRACT_PACKAGE}@{}, newer than this jitship's {ours}; it loads if it uses nothing new",
            version.text
        );
    }
    Ok(ContractInfo {
        version: version.text,
        imports,
        exports,
    })
}

fn mismatch(source: &str, theirs: &str, ours: &str) -> PolicyError {
    let major = parse_version(theirs).map_or(0, |v| v.major);
    if major < CONTRACT_MAJOR {
        return PolicyError::Contract(format!(
            "policy {source} was built for policy contract {major} ({CONTRACT_PACKAGE}@{theirs}); this jitship \
             speaks contract {CONTRACT_MAJOR} ({ours}): rebuild it against jitship-policy-sdk {CONTRACT_MAJOR} \
             (jitship policy build)"
        ));
    }
    PolicyError::Contract(format!(
        "policy {source} speaks {CONTRACT_PACKAGE}@{theirs}, a newer contract than this jitship's {ours}; \
         upgrade jitship, or rebuild the policy against jitship-policy-sdk {CONTRACT_MAJOR}"
    ))
}
