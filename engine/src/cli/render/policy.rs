//! The policy author's commands: `policy build`, `check`, `test` and `new`, for a person or as
//! JSON.

use std::path::Path;

use serde::Serialize;

use super::{json, say};
use crate::author::{CheckReport, TestReport};

/// `policy build`'s result.
#[derive(Serialize)]
pub(crate) struct Built<'a> {
    pub(crate) name: &'a str,
    pub(crate) path: &'a Path,
    pub(crate) digest: &'a str,
    pub(crate) core_size: u64,
    pub(crate) component_size: usize,
    pub(crate) warnings: &'a [String],
}

pub(crate) fn built(b: &Built<'_>, as_json: bool) {
    if as_json {
        return json(b);
    }
    say!(
        "built {} ({}; core module {}) blake3 {}",
        b.path.display(),
        bytesize::ByteSize(b.component_size as u64),
        bytesize::ByteSize(b.core_size),
        b.digest
    );
    say!("  check it: jitship policy check {}", b.path.display());
}

/// A module refused before a policy call ran (`rejected_by`: `"jitship"` when jitship refused an
/// input of `policy test`, absent when the module itself was refused).
#[derive(Serialize)]
pub(crate) struct Refused<'a> {
    pub(crate) path: &'a Path,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rejected_by: Option<&'static str>,
    pub(crate) error: String,
}

pub(crate) fn refused(r: &Refused<'_>, as_json: bool) {
    if as_json {
        // One line, as scripts grep it.
        return println!("{}", serde_json::to_string(r).unwrap_or_default());
    }
    match r.rejected_by {
        Some(_) => eprintln!("{}", super::clean(&r.error)),
        None => eprintln!("{}: refused: {}", r.path.display(), super::clean(&r.error)),
    }
}

pub(crate) fn check(report: &CheckReport, as_json: bool) {
    if as_json {
        return json(report);
    }
    let i = &report.info;
    say!("{}: ok", report.path.display());
    say!(
        "  policy      {} {} for cache kind {:?}",
        i.name,
        i.version,
        i.cache_kind
    );
    say!("  contract    jitship:policy@{}", report.contract);
    say!(
        "  module      {} blake3 {}",
        bytesize::ByteSize(report.size_bytes),
        report.digest
    );
    if !i.description.is_empty() {
        say!("  description {}", i.description);
    }
    let moved_by = if i.root_env.is_empty() {
        "-".to_string()
    } else {
        i.root_env.join(", ")
    };
    say!("  root        {} (moved by: {moved_by})", i.default_root);
    if i.settings.is_empty() {
        say!("  settings    none");
    }
    for spec in &i.settings {
        let value = &report.settings[&spec.name];
        let given = if *value == spec.default_value {
            "default".to_owned()
        } else {
            format!("default {}", spec.default_value)
        };
        let description = if spec.description.is_empty() {
            String::new()
        } else {
            format!(": {}", spec.description)
        };
        say!(
            "  setting     {} = {value} ({}, {given}){description}",
            spec.name,
            spec.kind.as_str()
        );
    }
    say!(
        "  reads files {}",
        if report.reads_files {
            "yes (read-file, inside the root only)"
        } else {
            "no"
        }
    );
    say!("  imports");
    for import in &report.imports {
        say!("    {import}");
    }
    say!("  exports     {}", report.exports.join(", "));
    say!(
        "  load        {} µs ({})",
        report.load.total_us,
        if report.load.from_cache {
            "compiled-module cache hit"
        } else {
            "compiled"
        }
    );
}

fn print_call_cost<T>(call: &crate::author::Call<T>) -> String {
    match (call.fuel_used, call.wall_us) {
        (Some(fuel), Some(us)) => format!("(fuel {fuel}, {:.2} ms)", us as f64 / 1000.0),
        _ => String::new(),
    }
}

fn print_policy_logs<T>(call: &crate::author::Call<T>) {
    for l in &call.logs {
        say!("    log [{}] {}", l.level, l.message);
    }
}

pub(crate) fn test(r: &TestReport, as_json: bool) {
    if as_json {
        return json(r);
    }
    say!(
        "policy {} {} (cache kind {:?}, contract {}, blake3 {})",
        r.policy.name,
        r.policy.version,
        r.policy.cache_kind,
        r.contract,
        r.digest
    );
    if !r.settings.is_empty() {
        say!("settings: {}", crate::policy::host::describe(&r.settings));
    }
    match (&r.compat_key.value, &r.compat_key.error) {
        (Some(key), _) => {
            say!("compat key: {key} {}", print_call_cost(&r.compat_key));
            if let Some(id) = &r.compat_id {
                say!("  compat id {id}");
            }
        }
        (None, Some(e)) if !r.key_asked => say!(
            "compat key: not asked (retention only: no --fact, no --root); the policy said: {e}"
        ),
        (None, Some(e)) => say!(
            "compat key: REFUSED: {e} {}",
            print_call_cost(&r.compat_key)
        ),
        (None, None) => {}
    }
    print_policy_logs(&r.compat_key);
    if let Some(s) = &r.select {
        match &s.call.error {
            Some(e) => say!(
                "select on {}: FAILED: {e} {}",
                s.root.display(),
                print_call_cost(&s.call)
            ),
            None => say!(
                "select on {}: {} to publish ({}), {} skipped; {} {}",
                s.root.display(),
                s.publish_files,
                bytesize::ByteSize(s.publish_bytes),
                s.skip_files,
                match (&s.complete, &s.incomplete_detail) {
                    (Some(false), Some(why)) => format!("INCOMPLETE cache: {why}"),
                    _ => "complete cache".to_string(),
                },
                print_call_cost(&s.call)
            ),
        }
        for d in s.call.value.iter().flatten() {
            let verdict = match d.verdict {
                crate::policy::Verdict::Publish => "publish",
                crate::policy::Verdict::Skip => "skip   ",
            };
            let traits = match (d.marker, d.embeds_root) {
                (true, true) => " [marker, embeds-root]",
                (true, false) => " [marker]",
                (false, true) => " [embeds-root]",
                (false, false) => "",
            };
            say!(
                "  {verdict} {}  ({}: {}){traits}",
                d.path,
                d.category,
                d.detail
            );
        }
        for (path, why) in &s.never_offered {
            say!("  never   {path}  ({why}; not offered to the policy)");
        }
        for w in &s.root_rewrites {
            match &w.error {
                Some(e) => say!("  rewrite {}: FAILED: {e}", w.path),
                None => say!(
                    "  rewrite {}: canonical {} B{}, {} at this root, {} at {}",
                    w.path,
                    w.canonical_bytes.unwrap_or(0),
                    if w.root_gone {
                        ""
                    } else {
                        " STILL NAMES THE ROOT"
                    },
                    if w.round_trip {
                        "same bytes back"
                    } else {
                        "rewritten in the policy's own layout"
                    },
                    if w.relocates {
                        "relocated"
                    } else {
                        "NOT relocated"
                    },
                    crate::author::OTHER_ROOT
                ),
            }
        }
        print_policy_logs(&s.call);
    }
    if let Some(t) = &r.retain {
        match (&t.call.value, &t.call.error) {
            (Some(drop), _) => {
                say!(
                    "retain over {} generations: drop {}, keep {} {}",
                    t.generations,
                    drop.len(),
                    t.keep.len(),
                    print_call_cost(&t.call)
                );
                for d in drop {
                    say!("  drop {}  ({}: {})", d.id, d.category, d.detail);
                }
                for id in &t.keep {
                    say!("  keep {id}");
                }
            }
            (None, Some(e)) => say!("retain: FAILED: {e} {}", print_call_cost(&t.call)),
            (None, None) => {}
        }
        print_policy_logs(&t.call);
    }
}

/// `policy new`'s crate, and what to do with it next.
pub(crate) fn created(done: &crate::policy::scaffold::Scaffolded, as_json: bool) {
    if as_json {
        return json(done);
    }
    let dir = done.dir.display();
    say!(
        "created {dir}: policy {} for cache kind {:?}, with jitship-policy-sdk {} in {dir}/sdk",
        done.name,
        done.kind,
        done.sdk_version
    );
    match done.template.strip_prefix("builtin:") {
        Some(kind) => say!(
            "  started from jitship's built-in {kind} policy (its root, env variables, key, select, \
             canonicalize, materialize, retention); common/ holds the rules the built-ins share"
        ),
        None => say!(
            "  jitship has no built-in policy for kind {:?}: started from the generic template \
             (built-in kinds: {})",
            done.kind,
            crate::policy::builtin::kinds()
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
    say!("  test it:  cd {dir} && cargo test");
    say!(
        "  build it: jitship policy build {dir} -o {dir}/target/{}.wasm",
        done.crate_name
    );
    say!("  then:     jitship policy check / policy test that module (see {dir}/README.md)");
}
