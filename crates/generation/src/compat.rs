//! Compatibility ids: the full-width blake3 of (cache kind, compatibility key).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{ContentHash, ContentHasher};

/// Which caches may be installed on which worker: two workers with the same compat id may share a
/// generation. Full 256-bit width (a truncated id would let two keys collide silently).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CompatId(pub ContentHash);

impl CompatId {
    pub fn new(cache_kind: &str, compat_key: &str) -> Self {
        let mut h = ContentHasher::new();
        h.update(b"jitship-compat-v1\0");
        h.update(cache_kind.as_bytes());
        h.update(b"\0");
        h.update(compat_key.as_bytes());
        Self(h.finish())
    }
}

impl fmt::Display for CompatId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for CompatId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CompatId({})", self.0)
    }
}

impl std::str::FromStr for CompatId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        s.parse().map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_and_key_are_separated() {
        assert_ne!(CompatId::new("ab", "c"), CompatId::new("a", "bc"));
        assert_eq!(CompatId::new("triton", "k"), CompatId::new("triton", "k"));
    }
}
