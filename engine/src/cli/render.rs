//! How reports print for a person: summaries, tables, ages, spinners.

use std::io::IsTerminal;
use std::time::Duration;

use crate::audit::AuditReport;
use crate::install::{InstallOutcome, InstallReport};
use crate::publish::{PublishOutcome, PublishReport};

pub(crate) fn spinner(message: String) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        tracing::info!("{message}");
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new_spinner().with_message(message);
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

pub(crate) fn print_publish(r: &PublishReport) {
    let what = match &r.outcome {
        PublishOutcome::Published { generation, seq } => format!(
            "published generation {generation} (head {seq}, {})",
            r.signed_by
                .as_ref()
                .map_or("unsigned".to_owned(), |k| format!("signed by {k}"))
        ),
        PublishOutcome::Unchanged { generation } => {
            format!("unchanged: generation {generation} already holds every file")
        }
        PublishOutcome::Empty => "nothing to publish yet".into(),
    };
    println!("{}: {what}", r.cache_kind);
    println!(
        "  {} files selected, {} new, {} hashed; uploaded {} in {} packs, {} already stored; {} ms",
        r.files_selected,
        r.files_new,
        r.files_hashed,
        bytesize::ByteSize(r.bytes_uploaded),
        r.packs_uploaded,
        bytesize::ByteSize(r.bytes_deduplicated),
        r.duration_ms
    );
    for (category, n) in &r.skipped {
        println!("  skipped {n}: {category}");
    }
    // The policy's words for each skipped file only with -v: a tree can hold any number of them.
    if tracing::enabled!(tracing::Level::DEBUG) {
        for d in &r.skip_details {
            println!("    {} {}: {}", d.category, d.path, d.detail);
        }
        let total: u64 = r.skipped.values().sum();
        if total > r.skip_details.len() as u64 {
            println!(
                "    ... and {} more (the report lists the first {})",
                total - r.skip_details.len() as u64,
                r.skip_details.len()
            );
        }
    }
    if let Some(why) = &r.incomplete {
        println!(
            "  incomplete cache: {why} (recorded in the generation; installs prefer a complete one)"
        );
    }
    if let Some(parent) = &r.parent_signer {
        println!("  built on a generation {parent}");
    }
    for c in &r.conflicts {
        println!(
            "  conflict: {} differs from the published copy (kept the published one)",
            c.path
        );
    }
}

pub(crate) fn print_install(r: &InstallReport) {
    let outcome = serde_json::to_value(r.outcome)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    println!("{}: {outcome}: {}", r.cache_kind, r.detail);
    if !r.newer_incomplete.is_empty() {
        println!(
            "  passed over {} newer incomplete generation(s): {}",
            r.newer_incomplete.len(),
            r.newer_incomplete
                .iter()
                .map(|g| short(g))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if matches!(
        r.outcome,
        InstallOutcome::Installed | InstallOutcome::Conflict
    ) {
        println!(
            "  {} files ({}) into {}, {} already present; fetched {} packs ({}); {} ms",
            r.files_installed,
            bytesize::ByteSize(r.bytes_installed),
            r.root.display(),
            r.files_already_present,
            r.packs_fetched,
            bytesize::ByteSize(r.bytes_fetched),
            r.duration_ms
        );
    }
    for c in &r.conflicts {
        println!("  left alone: {c}");
    }
}

pub(crate) fn print_audit(r: &AuditReport) {
    let verdict = if r.warm {
        "warm: the engine ran from the installed cache"
    } else {
        "the engine compiled anyway"
    };
    println!("{} {}: {verdict}", r.cache_kind, r.root.display());
    println!(
        "  generation {} installed {} files: {} kept, {} rewritten, {} removed",
        short(&r.generation),
        r.files_installed,
        r.files_kept,
        r.files_rewritten,
        r.files_removed
    );
    let added: Vec<String> = r.added.iter().map(|(k, n)| format!("{n} {k}")).collect();
    if !added.is_empty() {
        println!("  added since the install: {}", added.join(", "));
    }
    for p in &r.examples {
        println!("    {p}");
    }
}

pub(crate) fn now() -> u64 {
    crate::publish::now_secs()
}

/// "45s", "12m", "3h", "5d" ago.
pub(crate) fn age(then: u64) -> String {
    let s = now().saturating_sub(then);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

pub(crate) fn short(id: &impl std::fmt::Display) -> String {
    id.to_string().chars().take(12).collect()
}

/// Prints rows as left-aligned columns under a header.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(c);
            } else {
                out.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        println!("{}", out.trim_end());
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}

pub(crate) fn print_call_cost<T>(call: &crate::author::Call<T>) -> String {
    match (call.fuel_used, call.wall_us) {
        (Some(fuel), Some(us)) => format!("(fuel {fuel}, {:.2} ms)", us as f64 / 1000.0),
        _ => String::new(),
    }
}

pub(crate) fn print_policy_logs<T>(call: &crate::author::Call<T>) {
    for l in &call.logs {
        println!("    log [{}] {}", l.level, l.message);
    }
}

pub(crate) fn print_policy_test(r: &crate::author::TestReport) {
    println!(
        "policy {} {} (cache kind {:?}, contract {}, blake3 {})",
        r.policy.name, r.policy.version, r.policy.cache_kind, r.contract, r.digest
    );
    match (&r.compat_key.value, &r.compat_key.error) {
        (Some(key), _) => {
            println!("compat key: {key} {}", print_call_cost(&r.compat_key));
            if let Some(id) = &r.compat_id {
                println!("  compat id {id}");
            }
        }
        (None, Some(e)) => println!(
            "compat key: REFUSED: {e} {}",
            print_call_cost(&r.compat_key)
        ),
        (None, None) => {}
    }
    print_policy_logs(&r.compat_key);
    if let Some(s) = &r.select {
        match &s.call.error {
            Some(e) => println!(
                "select on {}: FAILED: {e} {}",
                s.root.display(),
                print_call_cost(&s.call)
            ),
            None => println!(
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
            println!(
                "  {verdict} {}  ({}: {}){traits}",
                d.path, d.category, d.detail
            );
        }
        for (path, why) in &s.never_offered {
            println!("  never   {path}  ({why}; not offered to the policy)");
        }
        print_policy_logs(&s.call);
    }
    if let Some(t) = &r.retain {
        match (&t.call.value, &t.call.error) {
            (Some(drop), _) => {
                println!(
                    "retain over {} generations: drop {}, keep {} {}",
                    t.generations,
                    drop.len(),
                    t.keep.len(),
                    print_call_cost(&t.call)
                );
                for id in drop {
                    println!("  drop {id}");
                }
                for id in &t.keep {
                    println!("  keep {id}");
                }
            }
            (None, Some(e)) => println!("retain: FAILED: {e} {}", print_call_cost(&t.call)),
            (None, None) => {}
        }
        print_policy_logs(&t.call);
    }
}
