//! Triton kernel directories (docs/jit-caches.md#triton).
//!
//! Triton writes every file of a kernel through `tmp.pid_*` + `os.replace`, then writes
//! `__grp__<kernel>.json` last (`FileCacheManager.put_group`: `json.dumps({"child_paths": {file
//! name: absolute path}})`). Triton 3.9's `get_group` uses a group only if it parses and every
//! child path exists, so a kernel directory is publishable when Triton would load it from *this*
//! root:
//!
//! * its group file parses, names at least one child, and every child path is absolute and
//!   normalized and equals `<this root>/<the group's own directory>/<file name>`, a file present
//!   in the snapshot.
//!
//! A group whose children sit under another root (installed from another cache without
//! relocation, or copied) is skipped as `foreign-root`; the other kernels of the same cache are
//! unaffected, so a pod that installed a generation produced elsewhere and then compiled kernels
//! of its own publishes its own. Files a complete group names are published with it; files of a
//! directory whose group is missing, truncated or foreign are skipped. A directory with no group
//! at all holds only launcher `.so` files and `*.autotune.json` results when it is complete (both
//! written with one atomic `put`); anything else there is a kernel still compiling.
//!
//! A published group file is a `marker` (Triton finds the kernel's files through it) and
//! `embeds-root` (its `child_paths` are absolute): it is published in a root-independent form
//! ([`canonicalize_group`]) and written back for the consumer's root at install
//! ([`materialize_group`]).
//!
//! Skips say why in the contract's categories: a group that does not parse or names children
//! in a shape Triton never writes is `unparseable`; a missing child or a directory without its
//! group yet is `incomplete`; a group naming another cache root, or a child outside the group's
//! own directory, is `foreign-root`.
//!
//! Cost: one pass to bucket files by directory (n log n), one read of each group file.

use std::collections::{BTreeMap, BTreeSet};

use jitship_policy_sdk::{
    Decision, FileEntry, Host, PolicyError, ROOT_TOKEN, ReasonCategory, file_name,
};

use crate::Decisions;
use crate::check::json_value;

/// A file directly inside a Triton kernel directory.
#[derive(Debug, Clone)]
pub struct KernelFile {
    pub index: usize,
    /// The kernel directory, relative to the policy's root (`<hash>`, `triton/0/<hash>`, ...).
    pub kernel_dir: String,
    pub name: String,
}

/// Entries exactly two levels below `area` (`<area><hash>/<file>`), as kernel files. `area` is ""
/// or ends with '/'. Only `candidates` (indices into `entries`) are looked at, so a caller with
/// many areas passes each its own entries and the whole stays linear.
pub fn kernel_files(
    entries: &[FileEntry],
    candidates: impl IntoIterator<Item = usize>,
    area: &str,
) -> Vec<KernelFile> {
    candidates
        .into_iter()
        .filter_map(|index| {
            let rel = entries.get(index)?.path.strip_prefix(area)?;
            let (dir, name) = rel.split_once('/')?;
            if name.contains('/') || dir.is_empty() || name.is_empty() {
                return None;
            }
            Some(KernelFile {
                index,
                kernel_dir: format!("{area}{dir}"),
                name: name.to_string(),
            })
        })
        .collect()
}

const GROUP_LIMIT: usize = 1 << 20;

/// Why a group cannot be published, by reason category.
#[derive(Debug, Clone)]
enum Unusable {
    /// The file is not a group Triton could read, or names children it never would.
    Unparseable(String),
    /// A child is missing: Triton's `get_group` returns None.
    Incomplete(String),
    /// Children under another absolute root, or outside the group's own directory: Triton would
    /// look for them there.
    ForeignRoot(String),
}

impl Unusable {
    fn detail(&self) -> &str {
        match self {
            Self::Unparseable(d) | Self::Incomplete(d) | Self::ForeignRoot(d) => d,
        }
    }

    fn category(&self) -> ReasonCategory {
        match self {
            Self::Unparseable(_) => ReasonCategory::Unparseable,
            Self::Incomplete(_) => ReasonCategory::Incomplete,
            Self::ForeignRoot(_) => ReasonCategory::ForeignRoot,
        }
    }

    fn decision(&self, detail: String) -> Decision {
        Decision::skip(self.category(), detail)
    }
}

struct Group {
    children: BTreeSet<String>,
}

/// The root as Triton would join paths onto it: absolute, without a trailing '/'.
fn root_prefix(root: &str) -> Result<String, String> {
    let trimmed = root.trim_end_matches('/');
    if !root.starts_with('/') || !is_normalized(trimmed.trim_start_matches('/'), true) {
        return Err(format!(
            "cache root {root:?} is not an absolute normalized path"
        ));
    }
    Ok(format!("{trimmed}/"))
}

/// `rel` is a relative path of non-empty components other than `.` and `..` (or empty if
/// `allow_empty`).
fn is_normalized(rel: &str, allow_empty: bool) -> bool {
    if rel.is_empty() {
        return allow_empty;
    }
    rel.split('/')
        .all(|c| !c.is_empty() && c != "." && c != "..")
}

fn parse_group(
    host: &dyn Host,
    prefix: &str,
    kernel_dir: &str,
    name: &str,
    present: &BTreeSet<&str>,
) -> Result<Group, Unusable> {
    use Unusable::*;
    let path = format!("{kernel_dir}/{name}");
    let v = json_value(host, &path, GROUP_LIMIT)
        .map_err(|m| Unparseable(format!("group file unusable: {m}")))?;
    let cp = v
        .as_object()
        .and_then(|o| o.get("child_paths"))
        .and_then(|c| c.as_object())
        .ok_or_else(|| Unparseable("group file has no child_paths object".into()))?;
    if cp.is_empty() {
        return Err(Unparseable("group file names no children".into()));
    }
    let mut children = BTreeSet::new();
    let mut missing = None;
    for (fname, p) in cp {
        let p = p
            .as_str()
            .ok_or_else(|| Unparseable(format!("child path of {fname:?} is not a string")))?;
        if fname.is_empty() || fname.contains('/') || fname == name {
            return Err(Unparseable(format!(
                "group names an invalid child {fname:?}"
            )));
        }
        let Some(abs) = p.strip_prefix('/') else {
            return Err(Unparseable(format!("child path {p:?} is not absolute")));
        };
        if !is_normalized(abs, false) {
            return Err(Unparseable(format!("child path {p:?} is not normalized")));
        }
        if file_name(p) != fname {
            return Err(Unparseable(format!(
                "child path {p:?} does not end with its file name {fname:?}"
            )));
        }
        let suffix = format!("/{kernel_dir}/{fname}");
        let Some(other_root) = p.strip_suffix(suffix.as_str()) else {
            return Err(ForeignRoot(format!(
                "child {fname} points outside the group's own directory ({p})"
            )));
        };
        if p.strip_prefix(prefix) != Some(&suffix[1..]) {
            return Err(ForeignRoot(format!(
                "child paths point at another cache root ({other_root}/...), not this one \
                 ({}); installed or copied without relocation, Triton would not load it from here",
                prefix.trim_end_matches('/')
            )));
        }
        if missing.is_none() && !present.contains(fname.as_str()) {
            missing = Some(fname.clone());
        }
        children.insert(fname.clone());
    }
    if let Some(m) = missing {
        return Err(Incomplete(format!(
            "child {m} does not exist (group incomplete)"
        )));
    }
    Ok(Group { children })
}

/// One kernel directory: its undecided files and what its groups say.
#[derive(Default)]
struct KernelDir<'a> {
    files: Vec<&'a KernelFile>,
    /// Child name -> the complete group naming it.
    named_by: BTreeMap<String, &'a str>,
    /// Group name -> why it is unusable (absent: complete).
    unusable: BTreeMap<&'a str, Unusable>,
    groups: usize,
}

/// Decides every file in `files` (entries already decided, e.g. temp files, stay as they are).
/// `root` is the absolute root the entries live under (the one `select` is given): each group is
/// judged against it.
pub fn decide(
    host: &dyn Host,
    root: &str,
    entries: &[FileEntry],
    files: &[KernelFile],
    out: &mut Decisions,
) {
    let prefix = match root_prefix(root) {
        Ok(p) => p,
        Err(why) => {
            for f in files {
                out.set(
                    f.index,
                    Unusable::Unparseable(why.clone()).decision(why.clone()),
                );
            }
            return;
        }
    };
    let mut dirs: BTreeMap<&str, KernelDir> = BTreeMap::new();
    for f in files {
        if !out.is_decided(f.index) && f.index < entries.len() {
            dirs.entry(f.kernel_dir.as_str()).or_default().files.push(f);
        }
    }
    for (dir, kd) in dirs.iter_mut() {
        let present: BTreeSet<&str> = kd.files.iter().map(|f| f.name.as_str()).collect();
        for f in &kd.files {
            if !is_group(&f.name) {
                continue;
            }
            kd.groups += 1;
            match parse_group(host, &prefix, dir, &f.name, &present) {
                Ok(g) => {
                    for c in g.children {
                        kd.named_by.entry(c).or_insert(f.name.as_str());
                    }
                }
                Err(why) => {
                    kd.unusable.insert(f.name.as_str(), why);
                }
            }
        }
    }
    for kd in dirs.values() {
        let first_unusable = kd.unusable.iter().next();
        for f in &kd.files {
            let d = if is_group(&f.name) {
                match kd.unusable.get(f.name.as_str()) {
                    // Triton finds the kernel through its group, and the group names the root.
                    None => Decision::publish("group file parses and every child exists")
                        .marker()
                        .embeds_root(),
                    Some(why) => why.decision(why.detail().to_string()),
                }
            } else if let Some(g) = kd.named_by.get(&f.name) {
                Decision::publish(format!("named by complete group {g}"))
            } else if let Some((g, why)) = first_unusable {
                why.decision(format!(
                    "its kernel's group {g} is unusable: {}",
                    why.detail()
                ))
            } else if kd.groups > 0 {
                Decision::skip(
                    ReasonCategory::NotCache,
                    "not named by its directory's group file",
                )
            } else if f.name.ends_with(".so") {
                Decision::publish("launcher shared object (written by one atomic put)")
            } else if f.name.ends_with(".autotune.json") {
                Decision::publish("autotune result (written by one atomic put)")
            } else {
                Decision::skip(
                    ReasonCategory::Incomplete,
                    "kernel directory without a group file (compile in flight)",
                )
            };
            out.set(f.index, d);
        }
    }
}

pub fn is_group(name: &str) -> bool {
    name.starts_with("__grp__") && name.ends_with(".json")
}

// ---------------------------------------------------------------------------------------------
// Relocation: group files without the root, and back.

// The root-independent form writes the SDK's `ROOT_TOKEN` where a child path named the root.

/// A JSON value that keeps object keys in document order (Python dicts keep insertion order and
/// Triton iterates `child_paths` in it). Hand-written rather than serde_json's `preserve_order`,
/// which would switch every `serde_json::Map` in the workspace build to insertion order.
#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl<'de> serde::Deserialize<'de> for Json {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Json;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E>(self) -> Result<Json, E> {
                Ok(Json::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<Json, E> {
                Ok(Json::Bool(b))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Json, E> {
                Ok(Json::Number(n.into()))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Json, E> {
                Ok(Json::Number(n.into()))
            }
            fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<Json, E> {
                serde_json::Number::from_f64(n)
                    .map(Json::Number)
                    .ok_or_else(|| E::custom("number out of range"))
            }
            fn visit_str<E>(self, s: &str) -> Result<Json, E> {
                Ok(Json::String(s.to_string()))
            }
            fn visit_string<E>(self, s: String) -> Result<Json, E> {
                Ok(Json::String(s))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
                let mut items = Vec::new();
                while let Some(v) = seq.next_element()? {
                    items.push(v);
                }
                Ok(Json::Array(items))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
                let mut fields: Vec<(String, Json)> = Vec::new();
                let mut seen = BTreeSet::new();
                while let Some((k, v)) = map.next_entry::<String, Json>()? {
                    // Python keeps the last value of a repeated key; refuse rather than guess.
                    if !seen.insert(k.clone()) {
                        return Err(serde::de::Error::custom(format!("duplicate key {k:?}")));
                    }
                    fields.push((k, v));
                }
                Ok(Json::Object(fields))
            }
        }
        d.deserialize_any(Visit)
    }
}

impl serde::Serialize for Json {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self {
            Json::Null => s.serialize_unit(),
            Json::Bool(b) => s.serialize_bool(*b),
            Json::Number(n) => n.serialize(s),
            Json::String(t) => s.serialize_str(t),
            Json::Array(items) => {
                let mut q = s.serialize_seq(Some(items.len()))?;
                for v in items {
                    q.serialize_element(v)?;
                }
                q.end()
            }
            Json::Object(fields) => {
                let mut m = s.serialize_map(Some(fields.len()))?;
                for (k, v) in fields {
                    m.serialize_entry(k, v)?;
                }
                m.end()
            }
        }
    }
}

impl Json {
    /// The value of `key` in an object.
    fn field_mut(&mut self, key: &str) -> Option<&mut Json> {
        match self {
            Json::Object(fields) => fields.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// Rewrites every string of the group's `child_paths` object with `rewrite(child name, path)`,
/// keeping the children's order.
fn rewrite_children(
    group: &mut Json,
    mut rewrite: impl FnMut(&str, &str) -> Result<String, String>,
) -> Result<(), String> {
    let Some(Json::Object(children)) = group.field_mut("child_paths") else {
        return Err("group file has no child_paths object".into());
    };
    for (name, p) in children {
        let Json::String(s) = p else {
            return Err(format!("child path of {name:?} is not a string"));
        };
        *s = rewrite(name, s)?;
    }
    Ok(())
}

/// Python's `json.dumps` defaults, which `FileCacheManager.put_group` uses: `", "` and `": "`
/// separators, and `ensure_ascii` (everything outside printable ASCII as `\uXXXX`).
struct PythonJson;

impl serde_json::ser::Formatter for PythonJson {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        for c in fragment.chars() {
            if (' '..='~').contains(&c) {
                w.write_all(&[c as u8])?;
            } else {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    write!(w, "\\u{u:04x}")?;
                }
            }
        }
        Ok(())
    }
}

/// Serializes `value` byte for byte as Python's `json.dumps(value)` would for the strings,
/// objects and arrays Triton writes.
fn python_json<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonJson);
    value.serialize(&mut ser).map_err(|e| e.to_string())?;
    Ok(out)
}

fn parse_object(bytes: &[u8], what: &str) -> Result<Json, String> {
    match serde_json::from_slice(bytes) {
        Ok(v @ Json::Object(_)) => Ok(v),
        Ok(_) => Err(format!("{what} is not a JSON object")),
        Err(e) => Err(format!("{what} is not valid JSON ({e})")),
    }
}

/// The root-independent form of a Triton group file under `root`: the same JSON object (keys in
/// Triton's order), compact, with each child path `<root>/<rel>` written `${JITSHIP_ROOT}/<rel>`.
/// Refuses a group naming any path outside the root (Triton would read it from there; nothing
/// can relocate it). [`materialize_group`] at the same root gives back the same JSON Triton reads
/// (same keys, order and values; byte for byte when Triton wrote it).
pub fn canonicalize_group(root: &str, bytes: &[u8]) -> Result<Vec<u8>, PolicyError> {
    canonical_form(root, bytes).map_err(PolicyError::InvalidInput)
}

/// A group file for `root` from its root-independent form (see [`canonicalize_group`]), written
/// as Triton's `put_group` would write it there.
pub fn materialize_group(root: &str, canonical: &[u8]) -> Result<Vec<u8>, PolicyError> {
    form_for_root(root, canonical).map_err(PolicyError::InvalidInput)
}

fn canonical_form(root: &str, bytes: &[u8]) -> Result<Vec<u8>, String> {
    let prefix = root_prefix(root)?;
    let mut group = parse_object(bytes, "group file")?;
    rewrite_children(&mut group, |name, p| match p.strip_prefix(&prefix) {
        Some(rel) if is_normalized(rel, false) => Ok(format!("{ROOT_TOKEN}/{rel}")),
        _ => Err(format!(
            "child {name} is at {p}, outside the cache root {}; a group can only be \
                 relocated if every child is inside the root",
            prefix.trim_end_matches('/')
        )),
    })?;
    let out = serde_json::to_vec(&group).map_err(|e| e.to_string())?;
    // The promise above, checked rather than assumed (numbers in unknown keys could round).
    let back: serde_json::Value =
        serde_json::from_slice(&form_for_root(root, &out)?).map_err(|e| e.to_string())?;
    let orig: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if back != orig {
        return Err("group file does not survive relocation unchanged (unusual values)".into());
    }
    Ok(out)
}

fn form_for_root(root: &str, canonical: &[u8]) -> Result<Vec<u8>, String> {
    let prefix = root_prefix(root)?;
    let mut group = parse_object(canonical, "canonical group")?;
    rewrite_children(&mut group, |name, p| {
        match p.strip_prefix(ROOT_TOKEN).and_then(|r| r.strip_prefix('/')) {
            Some(rel) if is_normalized(rel, false) => Ok(format!("{prefix}{rel}")),
            _ => Err(format!(
                "canonical child {name} has path {p:?}, not {ROOT_TOKEN}/<normalized relative path>"
            )),
        }
    })?;
    python_json(&group)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `json.dumps({"child_paths": group})` printed in Triton 3.9 for this group.
    const WRITTEN_BY_TRITON: &str = r#"{"child_paths": {"add_kernel.source": "/home/u/.triton/cache/KHRP/add_kernel.source", "add_kernel.cubin": "/home/u/.triton/cache/KHRP/add_kernel.cubin", "add_kernel.json": "/home/u/.triton/cache/KHRP/add_kernel.json"}}"#;

    #[test]
    fn group_round_trips_byte_for_byte_and_relocates() {
        let c = canonicalize_group("/home/u/.triton/cache", WRITTEN_BY_TRITON.as_bytes()).unwrap();
        let text = String::from_utf8(c.clone()).unwrap();
        assert!(!text.contains("/home/u"), "{text}");
        assert!(
            text.contains(r#""add_kernel.cubin":"${JITSHIP_ROOT}/KHRP/add_kernel.cubin""#),
            "{text}"
        );
        // Same canonical bytes whatever the root (what lets pods at different roots share packs).
        let elsewhere = WRITTEN_BY_TRITON.replace("/home/u/.triton/cache", "/srv/pod-7/cache");
        assert_eq!(
            canonicalize_group("/srv/pod-7/cache/", elsewhere.as_bytes()).unwrap(),
            c
        );
        assert_eq!(
            materialize_group("/home/u/.triton/cache", &c).unwrap(),
            WRITTEN_BY_TRITON.as_bytes()
        );
        assert_eq!(
            materialize_group("/srv/pod-7/cache", &c).unwrap(),
            elsewhere.as_bytes()
        );
        // Order of children is Triton's, not sorted.
        assert!(text.find("source").unwrap() < text.find("cubin").unwrap());
    }

    #[test]
    fn non_ascii_roots_and_other_keys_survive() {
        let orig = "{\"child_paths\": {\"k.cubin\": \"/d\\u00e9j\\u00e0 \\ud83d\\ude80/K/k.cubin\"}, \"x\": [1, {\"b\": null, \"a\": true}]}";
        let root = "/déjà 🚀";
        let c = canonicalize_group(root, orig.as_bytes()).unwrap();
        assert_eq!(materialize_group(root, &c).unwrap(), orig.as_bytes());
        let moved = String::from_utf8(materialize_group("/r", &c).unwrap()).unwrap();
        assert!(moved.contains("\"/r/K/k.cubin\""), "{moved}");
        // Compact JSON from another writer: the same value comes back (Python's layout).
        let compact = r#"{"child_paths":{"k.cubin":"/a/K/k.cubin"}}"#;
        let c = canonicalize_group("/a", compact.as_bytes()).unwrap();
        let back: serde_json::Value =
            serde_json::from_slice(&materialize_group("/a", &c).unwrap()).unwrap();
        assert_eq!(
            back,
            serde_json::from_str::<serde_json::Value>(compact).unwrap()
        );
    }

    #[test]
    fn refuses_paths_outside_the_root_and_bad_input() {
        for (root, bad) in [
            ("/a", r#"{"child_paths": {"k.cubin": "/b/K/k.cubin"}}"#),
            ("/a", r#"{"child_paths": {"k.cubin": "/ab/K/k.cubin"}}"#),
            ("/a", r#"{"child_paths": {"k.cubin": "/a/../etc/k.cubin"}}"#),
            ("/a", r#"{"child_paths": {"k.cubin": "/a//k.cubin"}}"#),
            ("/a", r#"{"child_paths": {"k.cubin": "K/k.cubin"}}"#),
            ("/a", r#"{"child_paths": {"k.cubin": 3}}"#),
            ("/a", r#"{"child_paths": {"k": "/a/K/k", "k": "/a/K/k"}}"#),
            ("/a", r#"{"child_paths": ["/a/K/k"]}"#),
            ("/a", r#"{"no_children": {}}"#),
            ("/a", r#"{"child_paths": {"k.cubin": "/a/K/k.cu"#),
            (
                "relative",
                r#"{"child_paths": {"k.cubin": "relative/K/k.cubin"}}"#,
            ),
            (
                "/a/../b",
                r#"{"child_paths": {"k.cubin": "/a/../b/K/k.cubin"}}"#,
            ),
        ] {
            assert!(canonicalize_group(root, bad.as_bytes()).is_err(), "{bad}");
        }
        let err = canonicalize_group("/a", br#"{"child_paths": {"k.cubin": "/b/K/k.cubin"}}"#)
            .unwrap_err();
        assert!(
            matches!(&err, PolicyError::InvalidInput(m) if m.contains("outside the cache root /a")),
            "{err:?}"
        );
        // Materialize refuses anything but the canonical form, and escapes from the root.
        for bad in [
            r#"{"child_paths": {"k.cubin": "K/k.cubin"}}"#,
            r#"{"child_paths": {"k.cubin": "/a/K/k.cubin"}}"#,
            r#"{"child_paths": {"k": "${JITSHIP_ROOT}/../x/k"}}"#,
            r#"{"child_paths": {"k": "${JITSHIP_ROOT}//abs/k"}}"#,
            r#"{"child_paths": {"k": "${JITSHIP_ROOT}x/k"}}"#,
            r#"{"child_paths": 7}"#,
        ] {
            assert!(materialize_group("/a", bad.as_bytes()).is_err(), "{bad}");
        }
    }
}

#[cfg(test)]
mod rewrite_tests {
    use super::*;

    #[test]
    fn groups_canonicalize_and_materialize_at_another_root() {
        let group = br#"{"child_paths": {"k.cubin": "/home/a/.triton/cache/ab/k.cubin", "k.json": "/home/a/.triton/cache/ab/k.json"}}"#;
        let canon = canonicalize_group("/home/a/.triton/cache", group).unwrap();
        let text = String::from_utf8(canon.clone()).unwrap();
        assert!(!text.contains("/home/a"), "{text}");
        assert!(text.contains("${JITSHIP_ROOT}/ab/k.cubin"), "{text}");
        // Canonical bytes do not depend on the root they came from.
        let other =
            br#"{"child_paths": {"k.cubin": "/srv/b/ab/k.cubin", "k.json": "/srv/b/ab/k.json"}}"#;
        assert_eq!(canonicalize_group("/srv/b/", other).unwrap(), canon);

        let there: serde_json::Value =
            serde_json::from_slice(&materialize_group("/data/c", &canon).unwrap()).unwrap();
        assert_eq!(there["child_paths"]["k.cubin"], "/data/c/ab/k.cubin");
        assert_eq!(there["child_paths"]["k.json"], "/data/c/ab/k.json");
        let back: serde_json::Value =
            serde_json::from_slice(&materialize_group("/home/a/.triton/cache", &canon).unwrap())
                .unwrap();
        assert_eq!(
            back,
            serde_json::from_slice::<serde_json::Value>(group).unwrap()
        );
    }

    #[test]
    fn rewrites_refuse_what_they_cannot_invert() {
        let foreign = br#"{"child_paths": {"k.cubin": "/elsewhere/ab/k.cubin"}}"#;
        assert!(matches!(
            canonicalize_group("/home/a/cache", foreign),
            Err(PolicyError::InvalidInput(m)) if m.contains("outside the cache root")
        ));
        // A sibling directory sharing the root's prefix is not under it.
        let sibling = br#"{"child_paths": {"k.cubin": "/home/a/cache2/ab/k.cubin"}}"#;
        assert!(canonicalize_group("/home/a/cache", sibling).is_err());
        assert!(materialize_group("/x", foreign).is_err(), "not canonical");
        for bad in [&b"{"[..], b"[]", br#"{"child_paths": {"k": 1}}"#] {
            assert!(canonicalize_group("/r", bad).is_err());
            assert!(materialize_group("/r", bad).is_err());
        }
    }
}
