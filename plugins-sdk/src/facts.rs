//! The facts a policy keys on: [`Facts`], the view `compat-key` gets, and the names of the facts
//! jitship gathers (`facts::GPU_ARCH`, `facts::PKG_TORCH`, ..., from `jitship-policy-contract`).

use std::collections::BTreeMap;

use crate::{Fact, PolicyError};

pub use jitship_policy_contract::facts::*;

/// The facts handed to `compat-key`, by name. A fact that is absent, or present with an empty
/// value, is missing: [`Facts::require`] refuses it with `missing-fact(name)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    map: BTreeMap<String, String>,
}

impl Facts {
    /// Builds the view; two facts with one name and different values are `invalid-input`.
    pub fn new(facts: &[Fact]) -> Result<Self, PolicyError> {
        let mut map = BTreeMap::new();
        for f in facts {
            if let Some(old) = map.insert(f.name.clone(), f.value.clone())
                && old != f.value
            {
                return Err(PolicyError::InvalidInput(format!(
                    "fact {:?} given twice with different values",
                    f.name
                )));
            }
        }
        Ok(Self { map })
    }

    /// Convenience for tests: `Facts::from_pairs([("gpu.arch", "sm_90")])`.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, PolicyError> {
        let facts: Vec<Fact> = pairs
            .into_iter()
            .map(|(n, v)| Fact {
                name: n.to_string(),
                value: v.to_string(),
            })
            .collect();
        Self::new(&facts)
    }

    /// The value, if present and not blank.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.map
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.trim().is_empty())
    }

    /// The value, or `missing-fact(name)`.
    pub fn require(&self, name: &str) -> Result<&str, PolicyError> {
        self.get(name).ok_or_else(|| PolicyError::missing(name))
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.map.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_is_missing_and_conflicts_are_invalid() {
        let f = Facts::from_pairs([("a", "1"), ("b", "  ")]).unwrap();
        assert_eq!(f.require("a"), Ok("1"));
        assert_eq!(f.require("b"), Err(PolicyError::MissingFact("b".into())));
        assert_eq!(f.require("c"), Err(PolicyError::MissingFact("c".into())));
        assert!(Facts::from_pairs([("a", "1"), ("a", "1")]).is_ok());
        assert!(matches!(
            Facts::from_pairs([("a", "1"), ("a", "2")]),
            Err(PolicyError::InvalidInput(_))
        ));
    }
}
