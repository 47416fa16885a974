//! The one path-safety check. Every path that comes from a manifest, a policy or a store goes
//! through `RelPath::parse` before it touches a filesystem.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A relative, normalized, '/'-separated path that cannot leave the directory it is joined to.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RelPath(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PathError {
    #[error("empty path")]
    Empty,
    #[error("absolute path {0:?}")]
    Absolute(String),
    #[error("path {0:?} has a `..`, `.` or empty component")]
    NotNormalized(String),
    #[error("path {0:?} contains a NUL or backslash")]
    BadCharacter(String),
    #[error("path {0:?} is longer than 4096 bytes")]
    TooLong(String),
}

impl RelPath {
    pub fn parse(s: &str) -> Result<Self, PathError> {
        Self::check(s)?;
        Ok(Self(s.to_owned()))
    }

    /// `parse` for a string already owned: no copy (a manifest holds one path per file).
    fn parse_owned(s: String) -> Result<Self, PathError> {
        Self::check(&s)?;
        Ok(Self(s))
    }

    fn check(s: &str) -> Result<(), PathError> {
        if s.is_empty() {
            return Err(PathError::Empty);
        }
        if s.len() > 4096 {
            return Err(PathError::TooLong(s.chars().take(64).collect()));
        }
        if s.starts_with('/') {
            return Err(PathError::Absolute(s.to_owned()));
        }
        if s.contains('\0') || s.contains('\\') {
            return Err(PathError::BadCharacter(s.to_owned()));
        }
        if s.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
            return Err(PathError::NotNormalized(s.to_owned()));
        }
        Ok(())
    }

    /// From a path found under `root` on disk (scan). Non-UTF-8 names are refused: they cannot be
    /// carried in a manifest faithfully.
    pub fn from_fs(root: &Path, path: &Path) -> Result<Self, PathError> {
        let rel = path
            .strip_prefix(root)
            .map_err(|_| PathError::Absolute(path.display().to_string()))?;
        let s = rel
            .to_str()
            .ok_or_else(|| PathError::BadCharacter(rel.display().to_string()))?;
        Self::parse(s)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn to_path(&self, root: &Path) -> PathBuf {
        root.join(&self.0)
    }

    /// Parent directories from the top down: "a/b/c" -> ["a", "a/b"].
    pub fn ancestors(&self) -> impl Iterator<Item = &str> {
        self.0.match_indices('/').map(|(i, _)| &self.0[..i])
    }
}

impl fmt::Display for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl Serialize for RelPath {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for RelPath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::parse_owned(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_normal_paths() {
        let p = RelPath::parse("ab/cd/__grp__k.json").unwrap();
        assert_eq!(p.ancestors().collect::<Vec<_>>(), vec!["ab", "ab/cd"]);
    }

    #[test]
    fn refuses_escapes() {
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a//b",
            "./a",
            "a/.",
            "a\\b",
            "a\0b",
            "a/",
        ] {
            assert!(RelPath::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    proptest::proptest! {
        #[test]
        fn parsed_paths_stay_inside(s in "[a-z./]{0,12}") {
            if let Ok(p) = RelPath::parse(&s) {
                let root = Path::new("/root");
                let joined = p.to_path(root);
                let normalized: PathBuf = joined.components().collect();
                proptest::prop_assert!(normalized.starts_with(root));
                proptest::prop_assert!(!s.split('/').any(|c| c == ".."));
            }
        }
    }
}
