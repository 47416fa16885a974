//! Key layout in a store, under one namespace:
//! `{ns}/pack/{blake3}`, `{ns}/gen/{generation-id}`, `{ns}/head/{compat-id}/{seq}`.

use crate::generation::{CompatId, ContentHash, GenerationId};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLayout {
    namespace: String,
}

impl KeyLayout {
    pub fn new(namespace: &str) -> Result<Self, super::StoreError> {
        super::check_key(namespace)?;
        Ok(Self {
            namespace: namespace.trim_end_matches('/').to_owned(),
        })
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn pack(&self, id: &ContentHash) -> String {
        format!("{}/pack/{id}", self.namespace)
    }

    pub fn generation(&self, id: &GenerationId) -> String {
        format!("{}/gen/{id}", self.namespace)
    }

    pub fn head(&self, compat: &CompatId, seq: u64) -> String {
        format!("{}/head/{compat}/{seq}", self.namespace)
    }

    pub fn heads_prefix(&self, compat: &CompatId) -> String {
        format!("{}/head/{compat}/", self.namespace)
    }
}
