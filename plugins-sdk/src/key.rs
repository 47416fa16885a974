use std::collections::BTreeMap;

use crate::{Facts, PolicyError};

/// Builds a compatibility key from named factors, canonically: `<kind>@<schema>` then
/// `;name=value` for every factor in name order. Values are escaped (`%`, `;`, `=` and control
/// characters become `%XX`) so that no two factor sets give one key.
///
/// ```
/// use jitship_policy_sdk::{Facts, KeyBuilder};
/// let facts = Facts::from_pairs([("pkg.triton", "3.9.0"), ("gpu.arch", "sm_90")]).unwrap();
/// let key = KeyBuilder::new("triton", 1)
///     .require(&facts, "pkg.triton").unwrap()
///     .require(&facts, "gpu.arch").unwrap()
///     .factor("layout", "a;b=c")
///     .build()
///     .unwrap();
/// assert_eq!(key, "triton@1;gpu.arch=sm_90;layout=a%3Bb%3Dc;pkg.triton=3.9.0");
/// ```
#[derive(Debug, Clone)]
pub struct KeyBuilder {
    kind: String,
    schema: u32,
    factors: BTreeMap<String, String>,
    error: Option<PolicyError>,
}

/// Longest factor value a key takes.
pub const MAX_FACTOR_BYTES: usize = 256;

/// Facts that describe one host or one installation, never a class of workers: keying on them
/// would give every pod (or every image layout) its own key and nothing would be shared.
/// [`KeyBuilder`] refuses them as factors, and jitship's native policy (the generic rules for a
/// kind without a policy module) leaves them out of its key: both read this one list.
pub const PER_HOST_FACTS: &[&str] = &["host.name", "python.executable"];

impl KeyBuilder {
    /// `schema` is the policy's key schema version: bump it whenever the factor set changes.
    pub fn new(kind: &str, schema: u32) -> Self {
        Self {
            kind: kind.to_string(),
            schema,
            factors: BTreeMap::new(),
            error: None,
        }
    }

    /// Adds the fact `name` as a factor, or fails with `missing-fact(name)`.
    pub fn require(self, facts: &Facts, name: &str) -> Result<Self, PolicyError> {
        let v = facts.require(name)?.to_string();
        Ok(self.factor(name, &v))
    }

    /// Adds every fact in `names`, failing on the first missing one.
    pub fn require_all(mut self, facts: &Facts, names: &[&str]) -> Result<Self, PolicyError> {
        for n in names {
            self = self.require(facts, n)?;
        }
        Ok(self)
    }

    /// Adds a factor the policy computes itself (a layout tag, a derived value).
    pub fn factor(mut self, name: &str, value: &str) -> Self {
        let valid_name = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
        if !valid_name {
            self.error.get_or_insert(PolicyError::Internal(format!(
                "invalid factor name {name:?}"
            )));
        } else if PER_HOST_FACTS.contains(&name) {
            self.error.get_or_insert(PolicyError::Internal(format!(
                "{name} must never be part of a key"
            )));
        } else if let Some(old) = self.factors.insert(name.to_string(), value.to_string())
            && old != value
        {
            self.error
                .get_or_insert(PolicyError::Internal(format!("factor {name} given twice")));
        }
        self
    }

    /// The key, or an error if a factor failed. A value over [`MAX_FACTOR_BYTES`] is
    /// `invalid-input` (the host refuses keys over 4 KiB as a policy failure).
    pub fn build(self) -> Result<String, PolicyError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if let Some((n, v)) = self
            .factors
            .iter()
            .find(|(_, v)| v.len() > MAX_FACTOR_BYTES)
        {
            return Err(PolicyError::InvalidInput(format!(
                "fact {n} is {} bytes long; at most {MAX_FACTOR_BYTES} can be keyed",
                v.len()
            )));
        }
        let mut key = format!("{}@{}", escape(&self.kind), self.schema);
        for (n, v) in &self.factors {
            key.push(';');
            key.push_str(n);
            key.push('=');
            key.push_str(&escape(v));
        }
        Ok(key)
    }
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '%' || c == ';' || c == '=' || c.is_control() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_does_not_matter_and_escaping_is_injective() {
        let a = KeyBuilder::new("k", 1)
            .factor("b", "2")
            .factor("a", "1")
            .build()
            .unwrap();
        let b = KeyBuilder::new("k", 1)
            .factor("a", "1")
            .factor("b", "2")
            .build()
            .unwrap();
        assert_eq!(a, b);
        let x = KeyBuilder::new("k", 1)
            .factor("a", "1;b=2")
            .build()
            .unwrap();
        let y = KeyBuilder::new("k", 1)
            .factor("a", "1")
            .factor("b", "2")
            .build()
            .unwrap();
        assert_ne!(x, y);
        assert_eq!(
            KeyBuilder::new("k", 1)
                .factor("a", "x\ny%")
                .build()
                .unwrap(),
            "k@1;a=x%0Ay%25"
        );
    }

    #[test]
    fn refuses_per_host_facts_bad_names_and_conflicts() {
        for name in PER_HOST_FACTS {
            assert!(
                KeyBuilder::new("k", 1).factor(name, "x").build().is_err(),
                "{name} was accepted as a factor"
            );
        }
        assert!(KeyBuilder::new("k", 1).factor("A B", "1").build().is_err());
        assert!(
            KeyBuilder::new("k", 1)
                .factor("a", "1")
                .factor("a", "2")
                .build()
                .is_err()
        );
        let long = "x".repeat(MAX_FACTOR_BYTES + 1);
        assert!(matches!(
            KeyBuilder::new("k", 1).factor("a", &long).build(),
            Err(PolicyError::InvalidInput(_))
        ));
        let facts = Facts::from_pairs([("a", "1")]).unwrap();
        assert_eq!(
            KeyBuilder::new("k", 1)
                .require_all(&facts, &["a", "b"])
                .err(),
            Some(PolicyError::MissingFact("b".into()))
        );
    }
}
