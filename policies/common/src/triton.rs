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
//! What this cannot see: a whole cache copied from another root, whose groups all agree on that
//! other root (the contract does not tell a policy the root's absolute path).

use std::collections::{BTreeMap, BTreeSet};

use jitship_policy_sdk::{Decision, FileEntry, Host, file_name};

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

fn parse_group(
    host: &dyn Host,
    kernel_dir: &str,
    name: &str,
    present: &BTreeSet<&str>,
) -> Result<Group, String> {
    let path = format!("{kernel_dir}/{name}");
    let v =
        json_value(host, &path, GROUP_LIMIT).map_err(|m| format!("group file unusable: {m}"))?;
    let cp = v
        .as_object()
        .and_then(|o| o.get("child_paths"))
        .and_then(|c| c.as_object())
        .ok_or("group file has no child_paths object")?;
    if cp.is_empty() {
        return Err("group file names no children".into());
    }
    let mut children = BTreeSet::new();
    let mut root: Option<String> = None;
    for (fname, p) in cp {
        let p = p
            .as_str()
            .ok_or_else(|| format!("child path of {fname:?} is not a string"))?;
        if fname.is_empty() || fname.contains('/') || fname == name {
            return Err(format!("group names an invalid child {fname:?}"));
        }
        let Some(abs) = p.strip_prefix('/') else {
            return Err(format!("child path {p:?} is not absolute"));
        };
        if abs
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(format!("child path {p:?} is not normalized"));
        }
        if file_name(p) != fname {
            return Err(format!(
                "child path {p:?} does not end with its file name {fname:?}"
            ));
        }
        let suffix = format!("/{kernel_dir}/{fname}");
        let Some(r) = p.strip_suffix(suffix.as_str()) else {
            return Err(format!(
                "child {fname} points outside the group's own directory ({p})"
            ));
        };
        match &root {
            None => root = Some(r.to_string()),
            Some(known) if known != r => {
                return Err("child paths disagree on the cache root".into());
            }
            Some(_) => {}
        }
        if !present.contains(fname.as_str()) {
            return Err(format!("child {fname} does not exist (group incomplete)"));
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
    let mut groups: BTreeMap<(&str, &str), Result<Group, String>> = BTreeMap::new();
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
                *g = Err(why);
            }
        }
    }
    for (dir, fs) in &dirs {
        let dir_groups: Vec<(&str, &Result<Group, String>)> = groups
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
                    Some(Ok(_)) => Decision::publish("group file parses and every child exists"),
                    Some(Err(why)) => Decision::skip(why.clone()),
                    None => Decision::skip("group file unusable"),
                }
            } else if let Some((g, _)) = dir_groups
                .iter()
                .find(|(_, g)| matches!(g, Ok(grp) if grp.children.contains(&f.name)))
            {
                Decision::publish(format!("named by complete group {g}"))
            } else if let Some((g, Err(why))) = dir_groups.iter().find(|(_, g)| g.is_err()) {
                Decision::skip(format!("its kernel's group {g} is unusable: {why}"))
            } else if !dir_groups.is_empty() {
                Decision::skip("not named by its directory's group file")
            } else if f.name.ends_with(".so") {
                Decision::publish("launcher shared object (written by one atomic put)")
            } else if f.name.ends_with(".autotune.json") {
                Decision::publish("autotune result (written by one atomic put)")
            } else {
                Decision::skip("kernel directory without a group file (compile in flight)")
            };
            out.set(f.index, d);
        }
    }
}

fn is_group(name: &str) -> bool {
    name.starts_with("__grp__") && name.ends_with(".json")
}
