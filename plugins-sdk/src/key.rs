use std::collections::BTreeMap;

use crate::{Facts, PolicyError};
use jitship_policy_contract::{MAX_FACTOR_BYTES, PER_HOST_FACTS, encode_key_part};

/// Builds a compatibility key from named factors, canonically: `<kind>@<schema>` then
/// `;name=value` for every factor in name order. The kind and every value are encoded by
/// [`encode_key_part`] (`%`, `;`, `=` and control characters become `%XX`; names are already
/// limited to `a-z0-9._-`), so that no two factor sets give one key, whatever a fact's value holds
/// (`--fact 'model.id=Q;gpu.arch=sm_80'` is one factor `model.id`, never a second `gpu.arch`).
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
        let mut key = format!("{}@{}", encode_key_part(&self.kind), self.schema);
        for (n, v) in &self.factors {
            key.push(';');
            key.push_str(n);
            key.push('=');
            key.push_str(&encode_key_part(v));
        }
        Ok(key)
    }
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

    fn key_of(facts: &[(&str, &str)]) -> String {
        let facts = Facts::from_pairs(facts.iter().copied()).unwrap();
        let names: Vec<&str> = facts.iter().map(|(n, _)| n).collect();
        KeyBuilder::new("k", 1)
            .require_all(&facts, &names)
            .unwrap()
            .build()
            .unwrap()
    }

    /// Fact sets that a key joined without encoding would confuse, each pair distinct.
    #[test]
    fn values_holding_separators_never_forge_another_fact_set() {
        type FactSet<'a> = &'a [(&'a str, &'a str)];
        let table: &[(FactSet, FactSet)] = &[
            (
                &[("model.id", "Q;gpu.arch=sm_80")],
                &[("model.id", "Q"), ("gpu.arch", "sm_80")],
            ),
            (&[("a", "1;b=2")], &[("a", "1"), ("b", "2")]),
            (&[("a", "1=2")], &[("a", "1%3D2")]),
            (&[("a", "%3B")], &[("a", ";")]),
            (&[("a", "x\ny")], &[("a", "x%0Ay")]),
            (&[("a", "x\n"), ("b", "y")], &[("a", "x"), ("b", "\ny")]),
            (&[("a", "1;"), ("b", "2")], &[("a", "1"), ("b", ";2")]),
            (&[("a", "="), ("b", "=")], &[("a", "=;b==")]),
            (&[("a", "%")], &[("a", "%25")]),
        ];
        for (x, y) in table {
            let (kx, ky) = (key_of(x), key_of(y));
            assert_ne!(kx, ky, "{x:?} and {y:?} share a key");
        }
        assert_eq!(
            key_of(&[("model.id", "Q;gpu.arch=sm_80")]),
            "k@1;model.id=Q%3Bgpu.arch%3Dsm_80"
        );
    }

    /// Every fact map over two names whose values are up to three characters from the separators,
    /// `%`, a newline and an ordinary letter (or absent) gets a key of its own, and a key decodes
    /// back to its map: the encoding is injective, checked exhaustively on the alphabet that could
    /// break it.
    #[test]
    fn distinct_fact_maps_give_distinct_keys_exhaustively() {
        let alphabet = [";", "=", "%", "\n", "a", "3", "B"];
        let mut values = vec![String::new()];
        for len in 1..=3 {
            let mut next = vec![];
            for v in values.iter().filter(|v| v.chars().count() == len - 1) {
                for c in alphabet {
                    next.push(format!("{v}{c}"));
                }
            }
            values.extend(next);
        }
        // None: the fact is absent. An empty value is a missing fact, so it is not a factor.
        let choices: Vec<Option<&str>> = std::iter::once(None)
            .chain(
                values
                    .iter()
                    .filter(|v| !v.is_empty())
                    .map(|v| Some(v.as_str())),
            )
            .collect();
        let mut seen = std::collections::HashMap::new();
        for a in &choices {
            for b in &choices {
                let mut builder = KeyBuilder::new("k", 1);
                for (name, value) in [("a", a), ("a.b", b)] {
                    if let Some(v) = value {
                        builder = builder.factor(name, v);
                    }
                }
                let key = builder.build().unwrap();
                let expected: Vec<(String, String)> = [("a", a), ("a.b", b)]
                    .into_iter()
                    .filter_map(|(n, v)| Some((n.to_string(), (*v)?.to_string())))
                    .collect();
                assert_eq!(decode(&key), expected, "{key}");
                if let Some(other) = seen.insert(key.clone(), (a, b)) {
                    panic!("{other:?} and {:?} share the key {key}", (a, b));
                }
            }
        }
        assert_eq!(seen.len(), choices.len() * choices.len());
    }

    /// The inverse of the key format, for the tests: factors by name.
    fn decode(key: &str) -> Vec<(String, String)> {
        let unescape = |s: &str| {
            let mut bytes = vec![];
            let mut it = s.bytes();
            while let Some(b) = it.next() {
                if b == b'%' {
                    let hex: Vec<u8> = it.by_ref().take(2).collect();
                    let hex = std::str::from_utf8(&hex).unwrap();
                    bytes.push(u8::from_str_radix(hex, 16).unwrap());
                } else {
                    assert!(b != b';' && b != b'=', "unencoded separator in {s:?}");
                    bytes.push(b);
                }
            }
            String::from_utf8(bytes).unwrap()
        };
        key.split(';')
            .skip(1)
            .map(|f| {
                let (n, v) = f.split_once('=').unwrap();
                (unescape(n), unescape(v))
            })
            .collect()
    }

    #[test]
    fn ordinary_parts_are_left_byte_identical() {
        for s in [
            "Qwen/Qwen3-8B",
            "NVIDIA H100 80GB HBM3",
            "2.8.0+cu128",
            "/usr/lib/python3/site-packages:/opt/venv/lib",
            "b3:af1349b9",
            "sm_90a",
            "größe",
        ] {
            assert_eq!(encode_key_part(s), s);
        }
        assert_eq!(encode_key_part("a\tb\0"), "a%09b%00");
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
