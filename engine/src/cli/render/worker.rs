//! The commands that work on caches, for a person: `publish`, `install`, `audit`, `facts`.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{say, short, verbose};
use crate::audit::AuditReport;
use crate::facts::{AppliedOverride, Gathered};
use crate::install::{InstallOutcome, InstallReport};
use crate::oci::BakeOutcome;
use crate::policy::ReasonCategory;
use crate::publish::{PublishOutcome, PublishReport};
use crate::roots::RootOrigin;

/// "12.3 MiB/s" over `ms` milliseconds ("-" when too quick to say).
fn rate(bytes: u64, ms: u64) -> String {
    if ms == 0 || bytes == 0 {
        return "-".into();
    }
    format!("{}/s", bytesize::ByteSize(bytes.saturating_mul(1000) / ms))
}

fn seconds(ms: u64) -> String {
    format!("{:.1}s", ms as f64 / 1000.0)
}

fn short_id(id: &impl std::fmt::Display) -> String {
    short(id)
}

/// Skipped files by the policy contract's reason category, most frequent first: every category
/// and the policy's words for each file (as many as the report keeps) under `-v`, else the first
/// three categories and a count.
fn skipped_lines(r: &PublishReport) -> Vec<String> {
    let total: u64 = r.skipped.values().sum();
    if total == 0 {
        return vec![];
    }
    let mut by_count: Vec<(&ReasonCategory, &u64)> = r.skipped.iter().collect();
    by_count.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    if verbose() {
        let mut lines = vec![format!("  skipped {total} files:")];
        lines.extend(by_count.iter().map(|(c, n)| format!("    {n:>6}  {c}")));
        // The policy's words for each skipped file: a tree can hold any number of them.
        for d in &r.skip_details {
            lines.push(format!("    {} {}: {}", d.category, d.path, d.detail));
        }
        if total > r.skip_details.len() as u64 {
            lines.push(format!(
                "    ... and {} more (the report lists the first {})",
                total - r.skip_details.len() as u64,
                r.skip_details.len()
            ));
        }
        return lines;
    }
    const SHOWN: usize = 3;
    let mut parts: Vec<String> = by_count
        .iter()
        .take(SHOWN)
        .map(|(c, n)| format!("{n} {c}"))
        .collect();
    if by_count.len() > SHOWN {
        parts.push(format!("{} more categories (-v)", by_count.len() - SHOWN));
    }
    vec![format!(
        "  skipped {total}: {} (details: -v)",
        parts.join("; ")
    )]
}

pub(crate) fn publish(r: &PublishReport) {
    let head = match &r.outcome {
        PublishOutcome::Published { generation, seq } => format!(
            "published {} (head {seq}, {}): {} files, {} new, {} uploaded at {} in {}",
            short_id(generation),
            r.signed_by
                .as_ref()
                .map_or("unsigned".to_owned(), |k| format!("signed by {k}")),
            r.files_selected,
            r.files_new,
            bytesize::ByteSize(r.bytes_uploaded),
            rate(r.bytes_uploaded, r.upload_ms.max(1)),
            seconds(r.duration_ms)
        ),
        PublishOutcome::Unchanged { generation } => format!(
            "unchanged: {} already holds all {} files ({})",
            short_id(generation),
            r.files_selected,
            seconds(r.duration_ms)
        ),
        PublishOutcome::Empty => "nothing to publish yet".into(),
    };
    say!("{}: {head}", r.cache_kind);
    if let Some(p) = &r.policy {
        let settings = match p.settings.is_empty() {
            true => "no settings".to_owned(),
            false => format!("settings {}", crate::policy::host::describe(&p.settings)),
        };
        let kept = match &r.settings_kept_from {
            Some(g) => format!(
                ", kept from generation {} (no --setting given)",
                short_id(g)
            ),
            None => String::new(),
        };
        say!(
            "  key {} ({}), policy {}@{}, {settings}{kept}",
            short(&r.compat_id),
            r.compat_key,
            p.name,
            p.version
        );
    }
    if let Some(why) = &r.settings_note {
        say!("  settings: {why}");
    }
    if let Some(why) = &r.module_not_stored {
        say!(
            "  policy module NOT stored by digest: {why} (gc keeps the key whole until it has it)"
        );
    }
    if verbose() {
        say!(
            "  {} hashed ({} ms), {} packs uploaded ({} ms), {} packs / {} already stored",
            r.files_hashed,
            r.hash_ms,
            r.packs_uploaded,
            r.upload_ms,
            r.packs_reused,
            bytesize::ByteSize(r.bytes_deduplicated),
        );
    }
    for line in skipped_lines(r) {
        say!("{line}");
    }
    if let Some(why) = &r.incomplete {
        say!(
            "  incomplete cache: {why} (recorded in the generation; installs prefer a complete one)"
        );
    }
    if let Some(parent) = &r.parent_signer {
        say!("  built on a generation {parent}");
    }
    for c in &r.conflicts {
        say!(
            "  conflict: {} differs from the published copy (kept the published one)",
            c.path
        );
    }
    if let Some(push) = &r.registry {
        match (&push.generation, &push.error) {
            (_, Some(e)) => say!(
                "  durable tier: NOT pushed to {}: {e} (the store has the generation; the next \
                 publish pushes it)",
                push.registry
            ),
            (Some(g), None) if g.outcome == BakeOutcome::AlreadyPresent => say!(
                "  durable tier: {} already in {}",
                short_id(&g.generation),
                push.registry
            ),
            (Some(g), None) => say!(
                "  durable tier: {} ({} packs, {}) {} in {}",
                short_id(&g.generation),
                g.packs,
                bytesize::ByteSize(g.bytes),
                g.outcome,
                seconds(push.duration_ms)
            ),
            (None, None) => say!(
                "  durable tier: nothing pushed to {}: the store holds no whole generation this \
                 publisher trusts",
                push.registry
            ),
        }
    }
}

pub(crate) fn install(r: &InstallReport) {
    match r.outcome {
        // The figures on one line; the detail (which generation, its signer, what was passed
        // over, completeness) on the next.
        InstallOutcome::Installed => {
            say!(
                "{}: installed {} files ({}) into {} at {} in {}",
                r.cache_kind,
                r.files_installed,
                bytesize::ByteSize(r.bytes_installed),
                r.root.display(),
                rate(r.bytes_fetched, r.duration_ms),
                seconds(r.duration_ms)
            );
            let prefix = format!("installed {} files of ", r.files_installed);
            say!("  {}", r.detail.strip_prefix(&prefix).unwrap_or(&r.detail));
        }
        _ => {
            // The outcome word once: details that already start with it are not prefixed again.
            let word = serde_json::to_value(r.outcome)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            if r.detail.starts_with(&word) {
                say!("{}: {}", r.cache_kind, r.detail);
            } else {
                say!("{}: {word}: {}", r.cache_kind, r.detail);
            }
        }
    }
    if let Some(t) = &r.tiers
        && t.fast_hits + t.durable_hits > 0
    {
        say!(
            "  tiers: {} objects from the fast tier, {} ({}) from the durable tier, {} put back in the fast tier{}",
            t.fast_hits,
            t.durable_hits,
            bytesize::ByteSize(t.durable_bytes),
            t.repaired,
            if t.fast_put_failures > 0 {
                format!(" ({} refused by it)", t.fast_put_failures)
            } else {
                String::new()
            }
        );
    }
    if let Some(pull) = &r.registry {
        match &pull.served {
            Some(g) => say!(
                "  durable tier: {} ({} packs, {}) pulled from {}:{}, verified, and {} in the \
                 store ({})",
                short_id(&g.generation),
                g.packs,
                bytesize::ByteSize(g.bytes),
                pull.registry,
                pull.tag.as_deref().unwrap_or("?"),
                if g.outcome.put_into_store() {
                    "put back"
                } else {
                    "found"
                },
                seconds(pull.duration_ms)
            ),
            None => say!(
                "  durable tier: {} served nothing: {}",
                pull.registry,
                pull.error.as_deref().unwrap_or("no generation")
            ),
        }
        for why in pull.passed_over.iter().take(5) {
            say!("    passed over {why}");
        }
    }
    if !r.newer_incomplete.is_empty() {
        say!(
            "  passed over {} newer incomplete generation(s): {}",
            r.newer_incomplete.len(),
            r.newer_incomplete
                .iter()
                .map(short)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if r.outcome == InstallOutcome::Conflict {
        say!(
            "  {} files ({}) into {}; fetched {} packs ({})",
            r.files_installed,
            bytesize::ByteSize(r.bytes_installed),
            r.root.display(),
            r.packs_fetched,
            bytesize::ByteSize(r.bytes_fetched),
        );
    }
    if verbose() {
        if let Some(g) = &r.generation {
            say!("  generation {g}");
        }
        say!(
            "  {} files in the generation, {} already present; fetched {} packs ({}); {} ms",
            r.files_in_generation,
            r.files_already_present,
            r.packs_fetched,
            bytesize::ByteSize(r.bytes_fetched),
            r.duration_ms
        );
    }
    for c in &r.conflicts {
        say!("  left alone: {c}");
    }
}

pub(crate) fn audit(r: &AuditReport) {
    audit_lines(r).iter().for_each(|l| say!("{l}"));
}

/// The audit of one root for a person: the verdict, the figures, and every compiled-anyway file
/// the report lists, by class.
pub(crate) fn audit_lines(r: &AuditReport) -> Vec<String> {
    let verdict = if r.warm {
        "warm: the engine ran from the installed cache".to_string()
    } else {
        format!(
            "compiled anyway: the engine added or rewrote {} compiled file(s) after the install",
            r.compiled_anyway
        )
    };
    let mut lines = vec![
        format!("{} {}: {verdict}", r.cache_kind, r.root.display()),
        format!(
            "  generation {} installed {} files: {} kept, {} rewritten, {} removed",
            short(&r.generation),
            r.files_installed,
            r.files_kept,
            r.files_rewritten,
            r.files_removed
        ),
    ];
    if r.files_compared_by_size_only > 0 {
        lines.push(format!(
            "  {} files compared by size only: their record (from an older jitship) has no inode \
             or mtime, so a rewrite of the same size goes unseen; install again to record them",
            r.files_compared_by_size_only
        ));
    }
    let added: Vec<String> = r.added.iter().map(|(k, n)| format!("{n} {k}")).collect();
    if !added.is_empty() {
        lines.push(format!("  added since the install: {}", added.join(", ")));
    }
    let rewritten: Vec<String> = r
        .rewritten
        .iter()
        .map(|(k, n)| format!("{n} {k}"))
        .collect();
    if !rewritten.is_empty() {
        lines.push(format!(
            "  rewritten since the install: {}",
            rewritten.join(", ")
        ));
    }
    for (class, n) in &r.compiled_anyway_by_class {
        lines.push(format!("  compiled anyway, {class}: {n}"));
        for f in r.compiled_anyway_files.iter().filter(|f| f.class == class) {
            let change = match f.change {
                crate::audit::Change::Added => "added",
                crate::audit::Change::Rewritten => "rewritten",
            };
            lines.push(format!("    {change:<9} {}", f.path));
        }
    }
    let unlisted = r.compiled_anyway - r.compiled_anyway_files.len() as u64;
    if unlisted > 0 {
        lines.push(format!("    ... and {unlisted} more not listed"));
    }
    lines
}

/// The facts a cache's own overrides (`[[cache]] facts`, `--fact KIND:NAME=VALUE`) set for its
/// key, one line each under its summary: they apply to this cache only.
pub(crate) fn own_facts(own: &BTreeMap<String, AppliedOverride>) {
    for (name, o) in own {
        let value = if o.value.is_empty() {
            "(made missing)".to_owned()
        } else {
            format!("= {}", o.value)
        };
        say!("  fact {name} {value} (this cache only: {})", o.origin);
    }
}

/// What `jitship facts` shows.
#[derive(Serialize)]
pub(crate) struct FactsView<'a> {
    #[serde(flatten)]
    pub(crate) gathered: &'a Gathered,
    /// `--engine`: what it reads here and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) engine: Option<&'a str>,
    /// By cache kind: the facts of that cache's own set that differ from the above.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) caches: &'a BTreeMap<&'a str, Gathered>,
    pub(crate) roots: &'a [ResolvedRoot],
}

/// One row of the roots `jitship facts` shows.
#[derive(Debug, Serialize)]
pub(crate) struct ResolvedRoot {
    pub(crate) kind: String,
    /// Empty when it cannot be resolved (`error` says why).
    pub(crate) root: std::path::PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) origin: Option<RootOrigin>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

pub(crate) fn facts(view: &FactsView<'_>, as_json: bool) {
    if as_json {
        return super::json(view);
    }
    print!("{}", view.gathered.render_table());
    for (kind, own) in view.caches {
        println!("\nfacts of the {kind} cache only (its own overrides change these for its key):");
        let table = own.render_table();
        print!(
            "{}",
            if own.facts.iter().next().is_none() {
                // Only missing facts: render_table's header row would stand alone.
                table
                    .split_once('\n')
                    .map_or("", |(_, rest)| rest)
                    .trim_start_matches('\n')
            } else {
                &table
            }
        );
    }
    if let Some(why) = view.engine {
        println!("\nengine: {why}");
    }
    if !view.roots.is_empty() {
        println!("\ncache roots (as publish, install and watch resolve them):");
        for r in view.roots {
            match (&r.origin, &r.error) {
                (Some(origin), _) => say!("{}  {}  {origin}", r.kind, r.root.display()),
                (None, error) => say!("{}  -  {}", r.kind, error.as_deref().unwrap_or("")),
            }
        }
    }
}
