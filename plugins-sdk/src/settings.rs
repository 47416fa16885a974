use std::collections::BTreeMap;

use crate::{PolicyError, PolicyInfo, Setting, SettingKind, SettingSpec};

impl SettingSpec {
    /// `true` or `false`.
    pub fn boolean(name: &str, default: bool, description: &str) -> Self {
        Self::new(name, SettingKind::Boolean, default.to_string(), description)
    }

    /// A signed integer.
    pub fn integer(name: &str, default: i64, description: &str) -> Self {
        Self::new(name, SettingKind::Integer, default.to_string(), description)
    }

    /// A duration, received in whole seconds (the operator may write `1h 30m`).
    pub fn duration(name: &str, default_secs: u64, description: &str) -> Self {
        let default = default_secs.to_string();
        Self::new(name, SettingKind::Duration, default, description)
    }

    /// A size, received in bytes (the operator may write `512 MiB`).
    pub fn bytes(name: &str, default: u64, description: &str) -> Self {
        Self::new(name, SettingKind::Bytes, default.to_string(), description)
    }

    /// Free text (at most 1 KiB).
    pub fn text(name: &str, default: &str, description: &str) -> Self {
        Self::new(name, SettingKind::Text, default.to_string(), description)
    }

    fn new(name: &str, kind: SettingKind, default_value: String, description: &str) -> Self {
        SettingSpec {
            name: name.to_string(),
            kind,
            default_value,
            description: description.to_string(),
        }
    }
}

/// The settings a call received: every setting the policy declares, in the canonical text of its
/// kind (the host checked each value against the declared kind and filled in the defaults).
/// Read them in [`crate::Policy::configure`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    map: BTreeMap<String, String>,
}

impl Settings {
    /// The view of what the host passed.
    pub fn new(settings: &[Setting]) -> Self {
        let map = settings
            .iter()
            .map(|s| (s.name.clone(), s.value.clone()))
            .collect();
        Self { map }
    }

    /// The declared defaults of `info`, as the host passes them when the operator set nothing:
    /// for native tests, with [`Settings::set`] for what a test changes.
    pub fn defaults(info: &PolicyInfo) -> Self {
        let map = info
            .settings
            .iter()
            .map(|s| (s.name.clone(), s.default_value.clone()))
            .collect();
        Self { map }
    }

    /// `self` with `name` set to `value` (in its canonical text: seconds, bytes).
    pub fn set(mut self, name: &str, value: &str) -> Self {
        self.map.insert(name.to_string(), value.to_string());
        self
    }

    /// The text of `name`; `invalid-input` when the host passed no such setting (it is not
    /// declared in `info`).
    pub fn text(&self, name: &str) -> Result<&str, PolicyError> {
        self.map.get(name).map(String::as_str).ok_or_else(|| {
            PolicyError::InvalidInput(format!(
                "setting {name:?} was not passed; declare it in info().settings"
            ))
        })
    }

    pub fn boolean(&self, name: &str) -> Result<bool, PolicyError> {
        self.parsed(name, "true or false")
    }

    pub fn integer(&self, name: &str) -> Result<i64, PolicyError> {
        self.parsed(name, "an integer")
    }

    /// A duration setting, in seconds.
    pub fn duration_secs(&self, name: &str) -> Result<u64, PolicyError> {
        self.parsed(name, "a number of seconds")
    }

    /// A size setting, in bytes.
    pub fn bytes(&self, name: &str) -> Result<u64, PolicyError> {
        self.parsed(name, "a number of bytes")
    }

    fn parsed<T: std::str::FromStr>(&self, name: &str, what: &str) -> Result<T, PolicyError> {
        let text = self.text(name)?;
        text.parse().map_err(|_| {
            PolicyError::InvalidInput(format!("setting {name:?} is {text:?}, not {what}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_then_set_then_typed_reads() {
        let info = PolicyInfo {
            name: "p".into(),
            version: "1".into(),
            cache_kind: "p".into(),
            default_root: String::new(),
            root_env: vec![],
            description: String::new(),
            settings: vec![
                SettingSpec::integer("keep", 5, "kept"),
                SettingSpec::duration("max_age", 3600, "age"),
                SettingSpec::boolean("strict", false, "strict"),
            ],
        };
        let s = Settings::defaults(&info).set("keep", "2");
        assert_eq!(s.integer("keep"), Ok(2));
        assert_eq!(s.duration_secs("max_age"), Ok(3600));
        assert_eq!(s.boolean("strict"), Ok(false));
        assert!(
            matches!(s.integer("nope"), Err(PolicyError::InvalidInput(m)) if m.contains("declare it"))
        );
        let bad = s.set("keep", "two");
        assert!(
            matches!(bad.integer("keep"), Err(PolicyError::InvalidInput(m)) if m.contains("not an integer"))
        );
    }
}
