//! How reports print for a person: summaries, tables, ages, spinners.
//!
//! Every line a person reads goes through `say!` (or `clean`): strings from store records
//! (facts, compat keys, writer ids, a policy's words, error details) are anyone's, and a control
//! character in them would let a record move the cursor, erase lines or write a line that looks
//! like jitship's own ("signed by trusted key ..."). JSON output is JSON and is not touched.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use crate::audit::AuditReport;
use crate::install::{InstallOutcome, InstallReport};
use crate::oci::BakeOutcome;
use crate::policy::ReasonCategory;
use crate::publish::{PublishOutcome, PublishReport};

/// `text` with its control characters escaped (`\n`, `\u{1b}`, ...), and the bidirectional
/// overrides and isolates that reorder what a terminal shows; other characters, non-ASCII
/// included, unchanged.
pub(crate) fn clean(text: &str) -> std::borrow::Cow<'_, str> {
    escape(text, |c| c.is_control() || bidi(c))
}

fn bidi(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn escape(text: &str, bad: impl Fn(char) -> bool) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(&bad) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if bad(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Where text log lines go: stderr, each event's line escaped like `clean`, but for ESC (tracing
/// escapes ESC in what it formats itself, and colors its own output with it). Log lines name
/// store records too, and tracing leaves CR and LF in them: a record could forge a line.
pub(crate) struct LogWriter;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;

    fn make_writer(&'a self) -> Self::Writer {
        LogWriter
    }
}

impl std::io::Write for LogWriter {
    /// tracing writes one event per call, ending in its line break.
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let (line, end) = match text.strip_suffix('\n') {
            Some(line) => (line, "\n"),
            None => (&*text, ""),
        };
        let line = escape(line, |c| (c.is_control() && c != '\u{1b}') || bidi(c));
        std::io::stderr().write_all(format!("{line}{end}").as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Prints one line for a person, escaped (`clean`): a line holds no line break of its own.
pub(crate) fn say_line(line: &str) {
    println!("{}", clean(line));
}

/// `println!` for a person: the formatted line, escaped (`clean`).
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::cli::render::say_line(&format!($($arg)*))
    };
}
pub(crate) use say;

/// How much a person sees: 0 = one line per cache, 1+ (`-v`) = the figures and every skip reason.
static VERBOSITY: AtomicU8 = AtomicU8::new(0);

pub(crate) fn set_verbosity(v: u8) {
    VERBOSITY.store(v, Ordering::Relaxed);
}

fn verbose() -> bool {
    VERBOSITY.load(Ordering::Relaxed) > 0
}

/// A spinner with the elapsed time on a terminal; off a terminal, one log line and nothing else
/// (no escape codes in `kubectl logs`).
pub(crate) fn spinner(message: String) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        tracing::info!("{message}");
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new_spinner().with_message(message);
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

/// The progress shown while one cache is worked on.
pub(crate) struct Progress(indicatif::ProgressBar);

impl Progress {
    pub(crate) fn start(message: String) -> Self {
        Self(spinner(message))
    }

    pub(crate) fn finish(self) {
        self.0.finish_and_clear();
    }
}

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

pub(crate) fn print_publish(r: &PublishReport) {
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

pub(crate) fn print_install(r: &InstallReport) {
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

pub(crate) fn print_audit(r: &AuditReport) {
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

/// `kind: what: why` on stderr, for a cache whose work failed.
pub(crate) fn print_gc(report: &crate::gc::GcReport) {
    let rows: Vec<Vec<String>> = report
        .decisions
        .iter()
        .map(|d| {
            vec![
                d.cache_kind.clone().unwrap_or_else(|| "?".into()),
                short(&d.generation),
                serde_json::to_value(d.verdict)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                bytesize::ByteSize(d.size_bytes).to_string(),
                d.reason.clone(),
            ]
        })
        .collect();
    if !rows.is_empty() {
        table(&["KIND", "GENERATION", "VERDICT", "SIZE", "WHY"], &rows);
    }
    let rows: Vec<Vec<String>> = report
        .policies
        .iter()
        .map(|k| {
            vec![
                k.cache_kind.clone().unwrap_or_else(|| "?".into()),
                k.compat_id.to_string().chars().take(12).collect(),
                match (&k.kept_whole, &k.decided_by) {
                    (Some(why), _) => format!("kept whole: {why}"),
                    (None, Some(used)) => used.to_string(),
                    (None, None) => String::new(),
                },
            ]
        })
        .collect();
    if !rows.is_empty() {
        table(&["KIND", "COMPAT ID", "DECIDED BY"], &rows);
    }
    for e in &report.policy_errors {
        say!("policy error: {e}");
    }
    for f in &report.faulty_heads {
        say!("not a usable head: {f}");
    }
    for j in &report.journals_refused {
        say!("gc journal refused: {j}");
    }
    if !report.unsigned.is_empty() {
        say!(
            "WARNING: records no trusted key signed decided this gc (anyone who can write the \
             store can write them); configure [trust] trusted_keys (--trusted-key) so gc takes \
             settings and times from signed generations only:"
        );
        for u in &report.unsigned {
            say!("  unsigned: {u}");
        }
    }
    for u in &report.unreadable {
        say!(
            "cannot read {u}; keeping every generation of that compat id and removing no pack \
             this run (run gc with a jitship that reads it, or remove that generation)"
        );
    }
    let verb = if report.dry_run {
        "would remove"
    } else {
        "removed"
    };
    let unknown = match report.packs_unknown_size {
        0 => String::new(),
        n => format!(" and {n} packs of unknown size"),
    };
    say!(
        "{verb} {} head records, {} manifests, {} packs ({}{unknown}); {} packs kept because a retained generation shares them",
        report.heads.len(),
        report.manifests.len(),
        report.packs.len(),
        bytesize::ByteSize(report.pack_bytes),
        report.packs_shared
    );
    if !report.modules.is_empty() {
        say!(
            "{verb} {} stored policy modules no kept generation names",
            report.modules.len()
        );
    }
    if let Some(n) = &report.not_decided {
        say!("NOT DECIDED: {n} (see DECIDED BY; gc exits 4)");
    }
    if report.dry_run {
        for h in &report.heads {
            say!("  head      {h}");
        }
        for m in &report.manifests {
            say!("  manifest  {m}");
        }
        for p in &report.packs {
            say!("  pack      {p}");
        }
        for m in &report.modules {
            say!("  module    {m}");
        }
    }
    if let Some(j) = report.resumed_journal {
        say!("finished the interrupted gc run of journal {j}");
    }
    for e in &report.errors {
        say!("could not remove {e}");
    }
    if let Some(r) = &report.registry {
        say!(
            "durable tier {}: {verb} {} generation(s){}",
            r.registry,
            r.deleted.len(),
            if r.absent > 0 {
                format!(" ({} dropped generation(s) were not there)", r.absent)
            } else {
                String::new()
            }
        );
        if report.dry_run {
            for t in &r.deleted {
                say!("  tag       {t}");
            }
        }
        for e in &r.errors {
            say!("could not delete {e}");
        }
    }
}

pub(crate) fn print_failed(kind: &str, what: &str, why: &str) {
    eprintln!("{}", clean(&format!("{kind}: {what}: {why}")));
}

/// `  root DIR (where it came from)` when the environment decided the root (a kind given
/// without `=ROOT`); under `-v` for every root.
pub(crate) fn print_root(root: &std::path::Path, resolved_from: Option<&str>) {
    match resolved_from {
        Some(origin) => say!("  root {} ({origin})", root.display()),
        None if verbose() => say!("  root {} (given)", root.display()),
        None => {}
    }
}

/// `error: ...` on stderr, each cause once, never in Debug form.
pub(crate) fn print_error(e: &anyhow::Error) {
    eprintln!("error: {}", clean(&super::output::one_line(e)));
}

/// "45s", "12m", "3h", "5d" ago.
pub(crate) fn age(then: u64) -> String {
    let s = crate::catalog::now_secs().saturating_sub(then);
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
        say!("{}", out.trim_end());
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
        say!("    log [{}] {}", l.level, l.message);
    }
}

pub(crate) fn print_policy_test(r: &crate::author::TestReport) {
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

#[cfg(test)]
mod tests {
    use super::clean;

    #[test]
    fn clean_escapes_control_characters_and_bidi_overrides_only() {
        assert_eq!(
            clean("gpu: NVIDIA H100 — ünïcode ✓"),
            "gpu: NVIDIA H100 — ünïcode ✓"
        );
        assert_eq!(
            clean("ok\u{1b}[2K\rsigned by trusted key\nx\u{7}\t"),
            "ok\\u{1b}[2K\\rsigned by trusted key\\nx\\u{7}\\t"
        );
        assert_eq!(clean("a\u{202e}b\u{2066}c"), "a\\u{202e}b\\u{2066}c");
        assert!(matches!(clean("plain"), std::borrow::Cow::Borrowed(_)));
    }
}
