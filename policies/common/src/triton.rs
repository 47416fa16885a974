//! Triton kernel directories (research/jit-caches.md §1.3).
//!
//! Triton writes every file of a kernel through `tmp.pid_*` + `os.replace`, then writes
//! `__grp__<kernel>.json` last: `{"child_paths": {file name: absolute path}}`. Triton 3.9 uses a
//! group only if it parses and every child exists, so a kernel directory is publishable when:
//!
//! * its group file parses, names at least one child, and every child path is absolute and
//!   normalized, ends with `/<the group's own directory>/<file name>` (the child's own path
//!   relative to the root), and names a file present in the snapshot;
//! * the absolute root its child paths imply agrees with the other groups of the same cache (a
//!   group copied from another cache root points at files that do not exist on this machine).
//!
//! Files a complete group names are published with it; files of a directory whose group is
//! missing, truncated or foreign are skipped. A directory with no group at all holds only
//! launcher `.so` files and `*.autotune.json` results when it is complete (both written with one
//! atomic `put`); anything else there is a kernel still compiling.
//!
//! A published group file is a `marker` (Triton finds the kernel's files through it) and
//! `embeds-root` (its `child_paths` are absolute): [`canonicalize_group`] and [`materialize_group`]
//! move it between the root it was written under and a root-independent form.
//!
//! Skips say why in the contract's categories: a group that does not parse or names children
//! in a shape Triton never writes is `unparseable`; a missing child or a directory without its
//! group yet is `incomplete`; a group naming another cache root is `foreign-root`.

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
/// or ends with '/'.
pub fn kernel_files(entries: &[FileEntry], area: &str) -> Vec<KernelFile> {
    entries
        .iter()
        .enumerate()
        .filter_map(|(index, e)| {
            let rel = e.path.strip_prefix(area)?;
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

struct Group {
    children: BTreeSet<String>,
    root: String,
}

/// Why a group is unusable: the contract's category and the detail.
type Unusable = (ReasonCategory, String);

fn unparseable(detail: impl Into<String>) -> Unusable {
    (ReasonCategory::Unparseable, detail.into())
}

fn parse_group(
    host: &dyn Host,
    kernel_dir: &str,
    name: &str,
    present: &BTreeSet<&str>,
) -> Result<Group, Unusable> {
    let path = format!("{kernel_dir}/{name}");
    let v = json_value(host, &path, GROUP_LIMIT)
        .map_err(|m| unparseable(format!("group file unusable: {m}")))?;
    let cp = v
        .as_object()
        .and_then(|o| o.get("child_paths"))
        .and_then(|c| c.as_object())
        .ok_or_else(|| unparseable("group file has no child_paths object"))?;
    if cp.is_empty() {
        return Err(unparseable("group file names no children"));
    }
    let mut children = BTreeSet::new();
    let mut root: Option<String> = None;
    for (fname, p) in cp {
        let p = p
            .as_str()
            .ok_or_else(|| unparseable(format!("child path of {fname:?} is not a string")))?;
        if fname.is_empty() || fname.contains('/') || fname == name {
            return Err(unparseable(format!(
                "group names an invalid child {fname:?}"
            )));
        }
        let Some(abs) = p.strip_prefix('/') else {
            return Err(unparseable(format!("child path {p:?} is not absolute")));
        };
        if abs
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(unparseable(format!("child path {p:?} is not normalized")));
        }
        if file_name(p) != fname {
            return Err(unparseable(format!(
                "child path {p:?} does not end with its file name {fname:?}"
            )));
        }
        let suffix = format!("/{kernel_dir}/{fname}");
        let Some(r) = p.strip_suffix(suffix.as_str()) else {
            return Err((
                ReasonCategory::ForeignRoot,
                format!("child {fname} points outside the group's own directory ({p})"),
            ));
        };
        match &root {
            None => root = Some(r.to_string()),
            Some(known) if known != r => {
                return Err(unparseable("child paths disagree on the cache root"));
            }
            Some(_) => {}
        }
        if !present.contains(fname.as_str()) {
            return Err((
                ReasonCategory::Incomplete,
                format!("child {fname} does not exist (group incomplete)"),
            ));
        }
        children.insert(fname.clone());
    }
    Ok(Group {
        children,
        root: root.unwrap_or_default(),
    })
}

/// Decides every file in `files` (entries already decided, e.g. temp files, stay as they are).
pub fn decide(host: &dyn Host, entries: &[FileEntry], files: &[KernelFile], out: &mut Decisions) {
    let mut dirs: BTreeMap<&str, Vec<&KernelFile>> = BTreeMap::new();
    for f in files {
        if !out.is_decided(f.index) && f.index < entries.len() {
            dirs.entry(f.kernel_dir.as_str()).or_default().push(f);
        }
    }
    // Parse every group of every directory.
    let mut groups: BTreeMap<(&str, &str), Result<Group, Unusable>> = BTreeMap::new();
    for (dir, fs) in &dirs {
        let present: BTreeSet<&str> = fs.iter().map(|f| f.name.as_str()).collect();
        for f in fs {
            if is_group(&f.name) {
                groups.insert(
                    (dir, f.name.as_str()),
                    parse_group(host, dir, &f.name, &present),
                );
            }
        }
    }
    // The groups must agree on the absolute root; the minority points at another cache.
    let mut roots: BTreeMap<String, usize> = BTreeMap::new();
    for g in groups.values().flatten() {
        *roots.entry(g.root.clone()).or_default() += 1;
    }
    if roots.len() > 1 {
        let best = roots.values().copied().max().unwrap_or(0);
        let winners: Vec<&String> = roots
            .iter()
            .filter(|(_, n)| **n == best)
            .map(|(r, _)| r)
            .collect();
        let dominant = if winners.len() == 1 {
            Some(winners[0].clone())
        } else {
            None
        };
        for g in groups.values_mut() {
            let foreign = match (&*g, &dominant) {
                (Ok(grp), Some(d)) if &grp.root != d => Some(format!(
                    "child paths point at another cache root ({}/...) than the rest of this cache ({d}/...)",
                    grp.root
                )),
                (Ok(grp), None) => Some(format!(
                    "groups disagree on the cache root ({}/... among {} roots); cannot tell which is this one",
                    grp.root,
                    roots.len()
                )),
                _ => None,
            };
            if let Some(why) = foreign {
                *g = Err((ReasonCategory::ForeignRoot, why));
            }
        }
    }
    for (dir, fs) in &dirs {
        let dir_groups: Vec<(&str, &Result<Group, Unusable>)> = groups
            .iter()
            .filter(|((d, _), _)| d == dir)
            .map(|((_, n), g)| (*n, g))
            .collect();
        for f in fs {
            let d = if is_group(&f.name) {
                match dir_groups
                    .iter()
                    .find(|(n, _)| *n == f.name)
                    .map(|(_, g)| g)
                {
                    // Triton finds the kernel through its group, and the group names the root.
                    Some(Ok(_)) => Decision::publish("group file parses and every child exists")
                        .marker()
                        .embeds_root(),
                    Some(Err((category, why))) => Decision::skip(*category, why.clone()),
                    None => Decision::skip(ReasonCategory::Unparseable, "group file unusable"),
                }
            } else if let Some((g, _)) = dir_groups
                .iter()
                .find(|(_, g)| matches!(g, Ok(grp) if grp.children.contains(&f.name)))
            {
                Decision::publish(format!("named by complete group {g}"))
            } else if let Some((g, Err((category, why)))) =
                dir_groups.iter().find(|(_, g)| g.is_err())
            {
                Decision::skip(
                    *category,
                    format!("its kernel's group {g} is unusable: {why}"),
                )
            } else if !dir_groups.is_empty() {
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

fn is_group(name: &str) -> bool {
    name.starts_with("__grp__") && name.ends_with(".json")
}

/// The root-independent form of a Triton group file written under the absolute `root`: every
/// `child_paths` value `<root>/<rest>` becomes `${JITSHIP_ROOT}/<rest>` (the SDK's
/// [`ROOT_TOKEN`]). Refuses a group that does not parse or names a child outside `root`, so the
/// file is never stored in a form that cannot be materialized elsewhere.
pub fn canonicalize_group(root: &str, bytes: &[u8]) -> Result<Vec<u8>, PolicyError> {
    let root = root.trim_end_matches('/');
    rewrite_children(bytes, |p| {
        p.strip_prefix(root)
            .filter(|rest| rest.starts_with('/'))
            .map(|rest| format!("{ROOT_TOKEN}{rest}"))
            .ok_or_else(|| format!("child path {p:?} is not under the root {root:?}"))
    })
}

/// The group file for the absolute `root` from its canonical form (the inverse of
/// [`canonicalize_group`]).
pub fn materialize_group(root: &str, bytes: &[u8]) -> Result<Vec<u8>, PolicyError> {
    let root = root.trim_end_matches('/');
    rewrite_children(bytes, |p| {
        p.strip_prefix(ROOT_TOKEN)
            .filter(|rest| rest.starts_with('/'))
            .map(|rest| format!("{root}{rest}"))
            .ok_or_else(|| format!("child path {p:?} is not in canonical form ({ROOT_TOKEN}/...)"))
    })
}

/// Parses a group, rewrites every `child_paths` value with `f`, and serializes it as compact JSON
/// with sorted keys: Triton reads groups only with `json.loads`, so any JSON text of the same
/// object is equivalent, and one fixed form makes canonical bytes equal across roots.
fn rewrite_children(
    bytes: &[u8],
    f: impl Fn(&str) -> Result<String, String>,
) -> Result<Vec<u8>, PolicyError> {
    let mut v: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| PolicyError::InvalidInput(format!("group file does not parse: {e}")))?;
    let children = v
        .as_object_mut()
        .and_then(|o| o.get_mut("child_paths"))
        .and_then(|c| c.as_object_mut())
        .ok_or_else(|| PolicyError::InvalidInput("group file has no child_paths object".into()))?;
    for (name, p) in children.iter_mut() {
        let s = p.as_str().ok_or_else(|| {
            PolicyError::InvalidInput(format!("child path of {name:?} is not a string"))
        })?;
        *p = serde_json::Value::String(f(s).map_err(PolicyError::InvalidInput)?);
    }
    serde_json::to_vec(&v)
        .map_err(|e| PolicyError::Internal(format!("cannot serialize the group: {e}")))
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
            Err(PolicyError::InvalidInput(m)) if m.contains("not under the root")
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
