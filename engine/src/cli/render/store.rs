//! The store commands for a person: `ls`, `inspect`, `verify` across tiers, `gc`.

use super::{age, say, short, table};
use crate::inspect::{self, ManifestState};

pub(crate) fn ls(survey: &inspect::Survey, store: &str) {
    if survey.compats.is_empty() {
        say!(
            "no generations in namespace {:?} of {}",
            survey.namespace,
            store
        );
        return;
    }
    for c in &survey.compats {
        say!(
            "{} {}  compat id {}",
            c.cache_kind.as_deref().unwrap_or("?"),
            c.compat_key.as_deref().unwrap_or("(no readable manifest)"),
            short(&c.compat_id)
        );
        if let Some(line) = governing_line(c) {
            say!("{line}");
        }
        let rows: Vec<Vec<String>> = c
            .generations
            .iter()
            .map(|g| {
                let seqs = g
                    .seqs
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(",");
                let mut flags = Vec::new();
                if g.is_head {
                    flags.push("head".to_owned());
                }
                if g.pinned {
                    flags.push("pinned".to_owned());
                }
                // The signer of its newest head.
                let signed = g
                    .signatures
                    .first()
                    .map(|s| match s.signer.key_id() {
                        Some(k) => format!("{k} {}", s.signer.status()),
                        None => s.signer.status().to_owned(),
                    })
                    .unwrap_or_default();
                match &g.state {
                    ManifestState::Present(s) => vec![
                        short(&g.id),
                        seqs,
                        s.file_count.to_string(),
                        bytesize::ByteSize(s.size_bytes).to_string(),
                        s.packs.len().to_string(),
                        age(s.created_at),
                        if s.complete { "complete" } else { "incomplete" }.to_owned(),
                        signed,
                        flags.join(" "),
                    ],
                    ManifestState::Missing | ManifestState::Corrupt { .. } => {
                        flags.push(
                            if matches!(g.state, ManifestState::Missing) {
                                "manifest-missing"
                            } else {
                                "manifest-corrupt"
                            }
                            .to_owned(),
                        );
                        vec![
                            short(&g.id),
                            seqs,
                            "-".into(),
                            "-".into(),
                            "-".into(),
                            age(g.head_written_at),
                            "-".into(),
                            signed,
                            flags.join(" "),
                        ]
                    }
                }
            })
            .collect();
        table(
            &[
                "  GENERATION",
                "HEAD",
                "FILES",
                "SIZE",
                "PACKS",
                "AGE",
                "CACHE",
                "SIGNED",
                "",
            ],
            &rows
                .into_iter()
                .map(|mut r| {
                    r[0] = format!("  {}", r[0]);
                    r
                })
                .collect::<Vec<_>>(),
        );
        // Anyone can write the store: what is no usable head is shown, never hidden.
        for f in &c.faulty_heads {
            say!("  head seq {}: not a usable head: {}", f.seq, f.fault);
        }
        let unnamed = c.faulty_count.saturating_sub(c.faulty_heads.len() as u64);
        if unnamed > 0 {
            say!("  and {unnamed} more heads below those that are no usable head");
        }
    }
}

/// The policy that governs a key, as `ls` shows it: the one its newest readable generation a
/// trusted key signed (else its newest readable one) was published with, with its settings.
fn governing_line(c: &inspect::CompatView) -> Option<String> {
    let present = |g: &&inspect::GenerationView| matches!(g.state, ManifestState::Present(_));
    let trusted = |g: &&inspect::GenerationView| {
        g.signatures
            .iter()
            .any(|s| matches!(s.signer, crate::trust::Signer::Trusted { .. }))
    };
    let g = c
        .generations
        .iter()
        .filter(present)
        .find(trusted)
        .or_else(|| c.generations.iter().find(present))?;
    let p = &g.summary()?.policy;
    let settings = match p.settings.is_empty() {
        true => "no settings".to_owned(),
        false => format!("settings {}", crate::policy::host::describe(&p.settings)),
    };
    Some(format!(
        "  policy {}@{} {} ({settings})",
        p.name,
        p.version,
        p.digest.chars().take(12).collect::<String>()
    ))
}

pub(crate) fn inspect(i: &inspect::Inspection, module: &str, files: bool) {
    say!("generation  {}", i.id);
    say!("cache       {} (compat id {})", i.cache_kind, i.compat_id);
    say!("compat key  {}", i.compat_key);
    say!(
        "created     {} ago by {}{} (jitship {})",
        age(i.created_at),
        i.producer.host,
        i.producer
            .pod
            .as_ref()
            .map(|p| format!(", pod {p}"))
            .unwrap_or_default(),
        i.producer.jitship_version
    );
    say!(
        "policy      {} {} ({})",
        i.policy.name,
        i.policy.version,
        i.policy.digest
    );
    say!(
        "settings    {}",
        match i.policy.settings.is_empty() {
            true => "none".to_owned(),
            false => crate::policy::host::describe(&i.policy.settings),
        }
    );
    say!("module      {}", module);
    say!(
        "content     {} files, {}, in {} packs ({})",
        i.file_count,
        bytesize::ByteSize(i.size_bytes),
        i.pack_count,
        bytesize::ByteSize(i.packed_bytes)
    );
    let heads = if i.heads.is_empty() {
        "none (not reachable from a head)".to_owned()
    } else {
        format!(
            "{}{}",
            i.heads
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            if i.is_head { " (the newest)" } else { "" }
        )
    };
    say!("heads       {heads}");
    match &i.incomplete {
        None => say!("complete    yes (a complete cache for its kind)"),
        Some(why) => say!("complete    NO: {why} (installs prefer a complete generation)"),
    }
    for s in &i.signatures {
        say!("signed      head {}: {}", s.seq, s.signer);
    }
    match &i.pinned {
        Some(p) => say!(
            "pinned      {} ago by {}{}",
            age(p.pinned_at),
            p.by,
            p.reason
                .as_ref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        ),
        None => say!("pinned      no"),
    }
    say!("facts");
    for (k, v) in &i.facts {
        say!("  {k} = {v}");
    }
    if !i.merged.is_empty() {
        say!("merged (publishers that lost a head race)");
        for m in &i.merged {
            say!("  {m}");
        }
    }
    say!("parent chain");
    if i.parent_chain.is_empty() {
        say!("  (none: first generation of its chain)");
    }
    for link in &i.parent_chain {
        match (link.created_at, link.file_count) {
            (Some(c), Some(n)) => say!("  {}  {n} files, {} ago", link.id, age(c)),
            _ => say!("  {}  (manifest gone: collected or evicted)", link.id),
        }
    }
    if files {
        say!("files");
        for f in &i.files {
            say!(
                "  {}  {:>10}  {}",
                short(&f.blake3),
                bytesize::ByteSize(f.size).to_string(),
                f.path
            );
        }
    }
}

/// The person's lines for one generation verified in each tier.
pub(crate) fn tiered(whole: &inspect::Verification, tiers: [&inspect::tiers::TierCheck; 2]) {
    let signed = whole
        .signatures
        .iter()
        .map(|s| format!("head {}: {}", s.seq, s.signer))
        .collect::<Vec<_>>()
        .join("; ");
    let quiet = |t: &inspect::tiers::TierCheck| {
        t.ok && t.announces() && t.filled.is_empty() && t.fill_refused.is_empty()
    };
    if whole.ok && tiers.iter().all(|&t| quiet(t)) {
        say!(
            "{}: ok in both tiers ({} files, {} packs, {}; {signed})",
            whole.generation,
            whole.files_checked,
            whole.packs_fetched,
            bytesize::ByteSize(whole.bytes_fetched)
        );
        return;
    }
    let count: usize = whole.problems.len()
        + tiers
            .iter()
            .filter(|t| t.announces())
            .map(|t| t.problems.len())
            .sum::<usize>();
    if whole.ok {
        say!("{}: ok where it is announced ({signed})", whole.generation);
    } else {
        say!("{}: {count} problem(s) ({signed})", whole.generation);
    }
    for p in &whole.problems {
        say!("  {p}");
    }
    for t in tiers {
        let place = format!("{} ({})", t.tier, t.store);
        match (t.announces(), t.ok) {
            (true, true) => say!("  {place}: ok"),
            (true, false) => {
                for p in &t.problems {
                    say!("  {place}: {p}");
                }
            }
            (false, true) => say!("  {place}: whole, but no head here names it"),
            (false, false) => {
                say!("  {place}: no head here names it, and it lacks:");
                for p in &t.problems {
                    say!("    {p}");
                }
            }
        }
        for key in &t.filled {
            say!("  repaired: copied {key} into the {}", t.tier);
        }
        for why in &t.fill_refused {
            say!("  not repaired in the {}: {why}", t.tier);
        }
    }
    for pack in &whole.repaired {
        say!(
            "  removed damaged pack {pack} from both tiers: the next publish of a root holding its files uploads it again"
        );
    }
    for why in &whole.repair_refused {
        say!("  not repaired: {why}");
    }
}

/// gc's decisions per key and what it removed (or would, with --dry-run).
pub(crate) fn gc(report: &crate::gc::GcReport) {
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

/// One generation verified (`verify` on a store of one tier).
pub(crate) fn verified(v: &inspect::Verification) {
    let signed = v
        .signatures
        .iter()
        .map(|s| format!("head {}: {}", s.seq, s.signer))
        .collect::<Vec<_>>()
        .join("; ");
    if v.ok {
        say!(
            "{}: ok ({} files, {} packs, {}; {signed})",
            v.generation,
            v.files_checked,
            v.packs_fetched,
            bytesize::ByteSize(v.bytes_fetched)
        );
    } else {
        say!(
            "{}: {} problem(s) ({signed})",
            v.generation,
            v.problems.len()
        );
        for p in &v.problems {
            say!("  {p}");
        }
    }
    for pack in &v.repaired {
        say!(
            "  removed damaged pack {pack}: the next publish of a root holding its files uploads it again"
        );
    }
    for why in &v.repair_refused {
        say!("  not repaired: {why}");
    }
}

/// `verify --sample N`: the scrub's figures and each finding.
pub(crate) fn scrub(report: &crate::scrub::ScrubReport) {
    say!(
        "scrubbed {} of {} packs ({} generations): {} missing, {} corrupt, {} repaired{}",
        report.checked,
        report.packs,
        report.generations,
        report.missing,
        report.corrupt,
        report.repaired,
        match report.manifests_unreadable {
            0 => String::new(),
            n => format!("; {n} generation(s) with a manifest missing or corrupt (run verify)"),
        }
    );
    for f in &report.findings {
        let how = match (&f.not_repaired, f.repaired) {
            (_, true) => "repaired from the durable tier".to_owned(),
            (Some(why), false) => format!("not repaired: {why}"),
            (None, false) => "not repaired".to_owned(),
        };
        say!(
            "  pack {} of {}: {} ({}); {how}",
            f.pack,
            short(&f.generation),
            f.problem,
            f.detail
        );
    }
}

pub(crate) fn exported(report: &crate::oci::layout::BakeReport, out: &std::path::Path) {
    for g in &report.generations {
        say!(
            "exported {} (seq {}, {} packs, {}) of {} compat id {}",
            g.generation,
            g.seq,
            g.packs,
            bytesize::ByteSize(g.bytes),
            g.cache_kind,
            short(&g.compat_id)
        );
    }
    for id in &report.skipped {
        say!("skipped compat id {id}: no trusted generation whole in the store");
    }
    say!(
        "{} generation(s) in the OCI layout {}",
        report.generations.len(),
        out.display()
    );
}

pub(crate) fn imported(report: &crate::oci::layout::BakeReport) {
    for g in &report.generations {
        say!(
            "{} {} (seq {}) of {} compat id {}",
            g.outcome,
            g.generation,
            g.seq,
            g.cache_kind,
            short(&g.compat_id)
        );
    }
    for r in &report.refused {
        say!(
            "refused {} (seq {}) of compat id {}: not admitted by the trust ({})",
            r.generation,
            r.seq,
            short(&r.compat_id),
            r.signer
        );
    }
}

pub(crate) fn pinned(id: &crate::generation::GenerationId) {
    say!("pinned {id}: gc will not drop it until `jitship unpin`");
}

/// `unpin`'s result.
#[derive(serde::Serialize)]
pub(crate) struct Unpinned {
    pub(crate) generation: crate::generation::GenerationId,
    pub(crate) was_pinned: bool,
}

pub(crate) fn unpinned(u: &Unpinned) {
    match u.was_pinned {
        true => say!("unpinned {}: retention applies to it again", u.generation),
        false => say!("{} was not pinned", u.generation),
    }
}
