//! Per-graph torch.compile trees of vLLM and SGLang (docs/jit-caches.md#vllm-compile):
//! `<hash>/rank_<r>_<dp>/<prefix>/` holds the graph artifacts and a Python-literal index
//! (`vllm_compile_cache.py`, `sglang_compile_cache.py`) written **last and non-atomically** after
//! every graph compiled. A prefix directory is complete when that index is a complete literal and
//! every `artifact_compile_range_*` it names exists; then every file of the directory publishes.
//! `<hash>/rank_<r>_<dp>/inductor_cache/` and `.../triton_cache/` (vLLM without AOT) follow the
//! Inductor and Triton rules.
//!
//! The index is a `marker`: the engine finds the graph artifacts through it, so an install
//! commits it after them.

use std::collections::{BTreeMap, BTreeSet};

use jitship_policy_sdk::{Decision, FileEntry, Host, ReasonCategory};

use crate::check::python_literal;
use crate::{Decisions, inductor, triton};

const INDEX_LIMIT: usize = 16 << 20;

fn is_rank_dir(s: &str) -> bool {
    s.strip_prefix("rank_")
        .and_then(|r| r.split_once('_'))
        .is_some_and(|(a, b)| {
            !a.is_empty()
                && !b.is_empty()
                && (a.to_string() + b).bytes().all(|c| c.is_ascii_digit())
        })
}

/// Decides undecided entries of the form `<base><hash>/rank_<r>_<dp>/...`; `root` is the absolute
/// root the entries live under.
pub fn decide(
    host: &dyn Host,
    root: &str,
    entries: &[FileEntry],
    base: &str,
    index_name: &str,
    out: &mut Decisions,
) {
    // prefix dir -> member entry indices (relative names inside the prefix dir)
    let mut prefixes: BTreeMap<String, Vec<(usize, String)>> = BTreeMap::new();
    // base or area -> its entries: each sub-cache looks only at its own (linear in the tree).
    let mut inductor_bases: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let mut triton_areas: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, e) in entries.iter().enumerate() {
        if out.is_decided(i) {
            continue;
        }
        let Some(rel) = e.path.strip_prefix(base) else {
            continue;
        };
        let parts: Vec<&str> = rel.split('/').collect();
        if parts.len() < 4 || !is_rank_dir(parts[1]) {
            out.set(
                i,
                Decision::skip(
                    ReasonCategory::NotCache,
                    "not inside <hash>/rank_<r>_<dp>/<prefix>/",
                ),
            );
            continue;
        }
        let rank_dir = format!("{base}{}/{}/", parts[0], parts[1]);
        match parts[2] {
            "inductor_cache" => inductor_bases
                .entry(format!("{rank_dir}inductor_cache/"))
                .or_default()
                .push(i),
            "triton_cache" => triton_areas
                .entry(format!("{rank_dir}triton_cache/"))
                .or_default()
                .push(i),
            p => prefixes
                .entry(format!("{rank_dir}{p}"))
                .or_default()
                .push((i, parts[3..].join("/"))),
        }
    }
    for (b, members) in &inductor_bases {
        inductor::decide(host, root, entries, members.iter().copied(), b, out);
    }
    for (a, members) in &triton_areas {
        let files = triton::kernel_files(entries, members.iter().copied(), a);
        triton::decide(host, root, entries, &files, out);
    }
    for (dir, members) in &prefixes {
        let index = format!("{dir}/{index_name}");
        let verdict: Result<(), String> = if !members.iter().any(|(_, n)| n == index_name) {
            Err(format!(
                "{index_name} not written yet (written last: graphs still compiling)"
            ))
        } else {
            match python_literal(host, &index, INDEX_LIMIT) {
                Err(why) => Err(format!("{index_name} incomplete: {why}")),
                Ok(strings) => {
                    let present: BTreeSet<&str> = members
                        .iter()
                        .map(|(_, n)| n.split('/').next().unwrap_or(n))
                        .collect();
                    match strings
                        .iter()
                        .filter(|s| s.starts_with("artifact_compile_range_") && !s.contains('/'))
                        .find(|s| !present.contains(s.as_str()))
                    {
                        Some(missing) => Err(format!(
                            "{index_name} names {missing}, which does not exist"
                        )),
                        None => Ok(()),
                    }
                }
            }
        };
        for (i, name) in members {
            out.set(
                *i,
                match &verdict {
                    Ok(()) if name == index_name => Decision::publish(format!(
                        "{index_name} complete and every artifact it names exists; the engine finds \
                         the artifacts through it"
                    ))
                    .marker(),
                    Ok(()) => Decision::publish(format!(
                        "{index_name} complete and every artifact it names exists"
                    )),
                    Err(why) => Decision::skip(ReasonCategory::Incomplete, why.clone()),
                },
            );
        }
    }
}
