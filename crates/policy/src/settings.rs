//! Policy settings: what a policy declares it takes (`policy-info.settings`) and how jitship reads
//! an operator's values for it. Every value is checked against its declared kind and turned into
//! the kind's canonical text before the policy sees it (`check-settings`, then every call), and
//! that text is what a generation records for gc.

use std::collections::BTreeMap;

use bytesize::ByteSize;

use super::PolicyError;

/// A policy's settings as every call receives them: each declared one, canonical text.
pub type PolicySettings = BTreeMap<String, String>;

/// Most settings a policy may declare (the manifest's bound, so every set it records fits).
pub const MAX_SETTINGS: usize = jitship_generation::MAX_POLICY_SETTINGS;
pub const MAX_SETTING_NAME_BYTES: usize = jitship_generation::MAX_SETTING_NAME_BYTES;
pub const MAX_SETTING_VALUE_BYTES: usize = jitship_generation::MAX_SETTING_VALUE_BYTES;

/// How an operator's value is read (mirrors `setting-kind` in plugins-sdk/wit/policy.wit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SettingKind {
    Boolean,
    Integer,
    /// Written `90s`, `1h 30m` or in seconds; canonical: whole seconds.
    Duration,
    /// Written `512 MiB`, `2GB` or in bytes; canonical: bytes.
    Bytes,
    Text,
}

impl SettingKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Boolean => "boolean",
            Self::Integer => "integer",
            Self::Duration => "duration",
            Self::Bytes => "bytes",
            Self::Text => "text",
        }
    }

    /// `value` in this kind's canonical text, or what is wrong with it.
    pub fn canonical(self, value: &str) -> Result<String, String> {
        let value = value.trim();
        match self {
            Self::Boolean => match value {
                "true" | "false" => Ok(value.to_owned()),
                _ => Err("true or false".into()),
            },
            Self::Integer => value
                .parse::<i64>()
                .map(|i| i.to_string())
                .map_err(|_| "an integer".into()),
            Self::Duration => {
                if let Ok(secs) = value.parse::<u64>() {
                    return Ok(secs.to_string());
                }
                let d = humantime::parse_duration(value)
                    .map_err(|_| "a duration such as 90s, 1h 30m or a number of seconds")?;
                if d.subsec_nanos() != 0 {
                    return Err("a whole number of seconds".into());
                }
                Ok(d.as_secs().to_string())
            }
            Self::Bytes => {
                if let Ok(bytes) = value.parse::<u64>() {
                    return Ok(bytes.to_string());
                }
                value
                    .parse::<ByteSize>()
                    .map(|b| b.as_u64().to_string())
                    .map_err(|_| "a size such as 512 MiB, 2GB or a number of bytes".into())
            }
            Self::Text => {
                if value.len() > MAX_SETTING_VALUE_BYTES || value.chars().any(char::is_control) {
                    return Err(format!(
                        "text of at most {MAX_SETTING_VALUE_BYTES} bytes without control characters"
                    ));
                }
                Ok(value.to_owned())
            }
        }
    }
}

/// One setting a policy declares.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SettingSpec {
    pub name: String,
    pub kind: SettingKind,
    /// Canonical text of `kind`.
    pub default_value: String,
    pub description: String,
}

impl std::fmt::Display for SettingSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}, default {:?})",
            self.name,
            self.kind.as_str(),
            self.default_value
        )
    }
}

/// Whether `name` is a setting name the contract allows: 1-64 bytes of `a-z0-9_-`, starting with
/// a letter (so it reads the same in TOML, on the command line and in reports).
pub fn valid_name(name: &str) -> bool {
    name.len() <= MAX_SETTING_NAME_BYTES
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// The complete settings `policy` (named in messages) runs with: each of `specs`, from `given`
/// when the operator set it (read by its kind), else its default. A name the policy does not
/// declare, or a value its kind cannot read, is refused with what the policy takes.
pub fn resolve(
    policy: &str,
    specs: &[SettingSpec],
    given: &BTreeMap<String, String>,
) -> Result<PolicySettings, PolicyError> {
    let takes = || {
        if specs.is_empty() {
            "it takes no settings".to_owned()
        } else {
            let list: Vec<String> = specs.iter().map(ToString::to_string).collect();
            format!("it takes {}", list.join(", "))
        }
    };
    if let Some(unknown) = given.keys().find(|n| !specs.iter().any(|s| &s.name == *n)) {
        return Err(PolicyError::Settings(format!(
            "policy {policy} has no setting {unknown:?}; {}",
            takes()
        )));
    }
    specs
        .iter()
        .map(|spec| {
            let Some(value) = given.get(&spec.name) else {
                return Ok((spec.name.clone(), spec.default_value.clone()));
            };
            let canonical = spec.kind.canonical(value).map_err(|want| {
                PolicyError::Settings(format!(
                    "policy {policy}'s setting {} is {value:?}, not {want}",
                    spec.name
                ))
            })?;
            Ok((spec.name.clone(), canonical))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, kind: SettingKind, default: &str) -> SettingSpec {
        SettingSpec {
            name: name.into(),
            kind,
            default_value: default.into(),
            description: String::new(),
        }
    }

    #[test]
    fn values_are_read_by_kind_into_canonical_text_and_defaults_fill_the_rest() {
        let specs = [
            spec("keep", SettingKind::Integer, "5"),
            spec("max_age", SettingKind::Duration, "3600"),
            spec("quota", SettingKind::Bytes, "0"),
            spec("strict", SettingKind::Boolean, "false"),
        ];
        let given = BTreeMap::from([
            ("max_age".to_owned(), "1h 30m".to_owned()),
            ("quota".to_owned(), "2 KiB".to_owned()),
        ]);
        let got = resolve("p", &specs, &given).unwrap();
        assert_eq!(got["keep"], "5");
        assert_eq!(got["max_age"], "5400");
        assert_eq!(got["quota"], "2048");
        assert_eq!(got["strict"], "false");

        let bad = BTreeMap::from([("keep".to_owned(), "two".to_owned())]);
        let err = resolve("p", &specs, &bad).unwrap_err().to_string();
        assert!(
            err.contains("setting keep is \"two\", not an integer"),
            "{err}"
        );
        let unknown = BTreeMap::from([("kep".to_owned(), "2".to_owned())]);
        let err = resolve("p", &specs, &unknown).unwrap_err().to_string();
        assert!(
            err.contains("no setting \"kep\"") && err.contains("keep (integer, default \"5\")"),
            "{err}"
        );
        let err = resolve("p", &[], &unknown).unwrap_err().to_string();
        assert!(err.contains("it takes no settings"), "{err}");
        assert!(SettingKind::Duration.canonical("1.5s").is_err());
    }

    #[test]
    fn names_are_plain_identifiers() {
        assert!(valid_name("keep") && valid_name("max_age") && valid_name("a-1"));
        assert!(!valid_name("") && !valid_name("Keep") && !valid_name("1x") && !valid_name("a b"));
        assert!(!valid_name(&"a".repeat(65)));
    }
}
