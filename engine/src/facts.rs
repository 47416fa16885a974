//! Facts about the worker that compatibility keys are built from. A fact is a named string;
//! missing facts are absent, never guessed.

use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Facts(BTreeMap<String, String>);

impl Facts {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    pub fn set(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.0.insert(name.into(), value.into());
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    pub fn as_map(&self) -> &BTreeMap<String, String> {
        &self.0
    }

    /// Overrides win over what was gathered.
    pub fn merge(&mut self, overrides: &BTreeMap<String, String>) {
        for (k, v) in overrides {
            self.0.insert(k.clone(), v.clone());
        }
    }
}

impl FromIterator<(String, String)> for Facts {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}
