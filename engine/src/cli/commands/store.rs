//! The store commands: ls, inspect, verify, pin, unpin, gc.

use anyhow::{Context, Result, bail};

use crate::catalog::now_secs;
use crate::cli::args::{
    ExportArgs, GcArgs, ImportArgs, InspectArgs, LsArgs, PinArgs, UnpinArgs, VerifyArgs,
};
use crate::cli::render::{say, short, spinner, store as render};
use crate::cli::session::Session;
use crate::cli::{exit, output};
use crate::generation::GenerationId;
use crate::inspect;

/// Bound on gc's deletes in the durable registry tier (each request has the tier's own timeout).
const REGISTRY_GC_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

pub(crate) fn resolve_generation(session: &Session, text: &str) -> Result<GenerationId> {
    Ok(inspect::resolve(
        session.store.as_ref(),
        &session.layout,
        text,
    )?)
}

/// Where the module a generation records is (`catalog::modules`): built in, in the store, or not.
fn module_place(session: &Session, digest: &str) -> String {
    let Ok(hash) = digest.parse::<crate::generation::ContentHash>() else {
        return format!("{digest} (no module)");
    };
    if crate::policy::builtin::BUILTINS
        .iter()
        .any(|b| !b.wasm.is_empty() && crate::generation::ContentHash::of(b.wasm) == hash)
    {
        return "built into this jitship".to_owned();
    }
    let key = session.layout.module(&hash);
    match session.store.exists(&key) {
        Ok(true) => format!("in the store ({key}); gc fetches it from there"),
        Ok(false) => format!(
            "NOT in the store ({key}): gc needs it given (--policy-dir) or keeps the key whole"
        ),
        Err(e) => format!("cannot tell ({key}: {e})"),
    }
}

/// Writes the module of `digest` to `out`: a built-in's bytes, else the store's copy
/// (`catalog::modules`, checked against the digest).
fn save_module(session: &Session, digest: &str, out: &std::path::Path) -> Result<()> {
    use crate::catalog::modules::{ModuleRead, read_module};
    let Ok(hash) = digest.parse::<crate::generation::ContentHash>() else {
        bail!("the generation was published with {digest:?}, which is no module to save");
    };
    let builtin = crate::policy::builtin::BUILTINS
        .iter()
        .find(|b| !b.wasm.is_empty() && crate::generation::ContentHash::of(b.wasm) == hash);
    let bytes = match builtin {
        Some(b) => b.wasm.to_vec(),
        None => match read_module(session.store.as_ref(), &session.layout, &hash)? {
            ModuleRead::Present(bytes) => bytes,
            ModuleRead::Missing => bail!(
                "the module {digest} is neither built in nor in the store ({})",
                session.layout.module(&hash)
            ),
            ModuleRead::Refused(why) => {
                bail!("the store's copy of module {digest} is refused: {why}")
            }
        },
    };
    crate::policy::build::write_component(out, &bytes)?;
    eprintln!("saved the module {digest} to {}", out.display());
    Ok(())
}

pub(crate) fn run_ls(args: LsArgs) -> Result<i32> {
    let session = Session::open_store_read_only(&args.common.store)?;
    let survey = inspect::survey(session.store.as_ref(), &session.layout, &session.trust)
        .with_context(|| format!("reading {}", session.store.describe()))?;
    if args.common.json {
        emit_json("ls", [&survey], exit::OK);
        return Ok(exit::OK);
    }
    render::ls(&survey, &session.store.describe());
    Ok(exit::OK)
}

pub(crate) fn run_inspect(args: InspectArgs) -> Result<i32> {
    let session = Session::open_store_read_only(&args.common.store)?;
    let id = resolve_generation(&session, &args.generation)?;
    let mut i = inspect::inspect(session.store.as_ref(), &session.layout, &id, &session.trust)?;
    if !args.files {
        i.files.clear();
    }
    if let Some(out) = &args.save_module {
        save_module(&session, &i.policy.digest, out)?;
    }
    if args.common.json {
        emit_json("inspect", [&i], exit::OK);
        return Ok(exit::OK);
    }
    let module = module_place(&session, &i.policy.digest);
    render::inspect(&i, &module, args.files);
    Ok(exit::OK)
}

pub(crate) fn run_verify(args: VerifyArgs) -> Result<i32> {
    // Only --repair writes (it removes corrupt packs).
    let session = if args.repair {
        Session::open_store(&args.common.store)?
    } else {
        Session::open_store_read_only(&args.common.store)?
    };
    let store = session.store.as_ref();
    if let Some(n) = args.sample {
        return run_scrub(&args, &session, n);
    }
    if let Some((fast, durable)) = store.tiers() {
        return run_verify_tiers(&args, &session, fast, durable);
    }
    let survey = inspect::survey(store, &session.layout, &session.trust)?;
    let ids: Vec<GenerationId> = match &args.generation {
        Some(g) => vec![resolve_generation(&session, g)?],
        None => {
            let mut ids: Vec<GenerationId> = survey.generations().map(|(_, g)| g.id).collect();
            ids.dedup();
            ids
        }
    };
    let mut results = Vec::new();
    // Repair judges by trust: a pack is condemned only on an admitted manifest's word, and never
    // one another admitted generation verifies.
    let mut repairer =
        inspect::Repairer::new(store, &session.layout, &survey, session.trust.as_ref());
    for id in &ids {
        let bar = spinner(format!("verifying {}", short(id)));
        let v = inspect::verify(store, &session.layout, id);
        bar.finish_and_clear();
        let mut v = v.with_context(|| format!("verifying {id}"))?;
        for (_, g) in survey.generations().filter(|(_, g)| g.id == *id) {
            v.signatures.extend(g.signatures.iter().cloned());
            v.problems
                .extend(inspect::signature_problems(g, &session.trust));
        }
        v.ok = v.problems.is_empty();
        if args.repair {
            let repair = repairer
                .repair(&v)
                .with_context(|| format!("repairing {id}"))?;
            v.repaired = repair.removed;
            v.repair_refused = repair.refused;
        }
        if !args.common.json {
            render::verified(&v);
        }
        results.push(v);
    }
    let code = if results.iter().all(|v| v.ok) {
        exit::OK
    } else {
        exit::PROBLEM_FOUND
    };
    if args.common.json {
        emit_json("verify", &results, code);
    } else if ids.is_empty() {
        say!("no generations to verify");
    }
    Ok(code)
}

/// `verify --sample N`: a scrub (crate::scrub) of N packs.
fn run_scrub(args: &VerifyArgs, session: &Session, n: usize) -> Result<i32> {
    let bar = spinner(format!("scrubbing {n} packs"));
    let report = crate::scrub::scrub(
        session.store.as_ref(),
        &session.layout,
        session.trust.as_ref(),
        n,
        args.repair,
    );
    bar.finish_and_clear();
    let report = report.context("scrubbing the store")?;
    let code = if report.clean() {
        exit::OK
    } else {
        exit::PROBLEM_FOUND
    };
    if args.common.json {
        emit_json("verify", &report, code);
        return Ok(code);
    }
    render::scrub(&report);
    Ok(code)
}

/// One generation's `verify` on a store of two tiers: what the tiers hold together (the signers
/// of its heads, and whether both are whole), then each tier on its own.
#[derive(serde::Serialize)]
struct TieredVerification {
    #[serde(flatten)]
    whole: inspect::Verification,
    tiers: Vec<inspect::tiers::TierCheck>,
}

/// `verify` of a store of two tiers (`--durable-store`, `[store.durable] path`): every generation
/// either tier's heads name, each tier checked on its own (inspect::tiers), so a tier that lacks
/// what the other holds is named instead of hidden by reads that fall through. `--repair` fills
/// each tier from the other, for generations the trust admits, then removes what both hold
/// damaged (as on one store).
fn run_verify_tiers(
    args: &VerifyArgs,
    session: &Session,
    fast: &dyn crate::store::Store,
    durable: &dyn crate::store::Store,
) -> Result<i32> {
    use inspect::tiers::{FillContext, Tier, check_tier, fill, heads_of};
    let layout = &session.layout;
    let trust = session.trust.as_ref();
    let read = |tier: Tier, store: &dyn crate::store::Store| {
        inspect::survey(store, layout, trust)
            .with_context(|| format!("reading the {tier} ({})", store.describe()))
    };
    let surveys = [read(Tier::Fast, fast)?, read(Tier::Durable, durable)?];
    let ids: Vec<GenerationId> = match &args.generation {
        Some(g) => vec![resolve_generation(session, g)?],
        None => {
            let mut ids: Vec<GenerationId> = Vec::new();
            for (_, g) in surveys[1].generations().chain(surveys[0].generations()) {
                if !ids.contains(&g.id) {
                    ids.push(g.id);
                }
            }
            ids
        }
    };
    let mut results = Vec::new();
    let mut repairer = inspect::Repairer::new(session.store.as_ref(), layout, &surveys[1], trust);
    for id in &ids {
        let heads = [heads_of(&surveys[0], id), heads_of(&surveys[1], id)];
        let seqs = |i: usize| heads[i].iter().map(|(_, s)| *s).collect::<Vec<u64>>();
        let bar = spinner(format!("verifying {} in each tier", short(id)));
        let checked = check_tier(Tier::Fast, fast, layout, id, &seqs(0))
            .and_then(|f| Ok((f, check_tier(Tier::Durable, durable, layout, id, &seqs(1))?)));
        bar.finish_and_clear();
        let (mut f, mut d) = checked.with_context(|| format!("verifying {id}"))?;
        let mut whole = inspect::Verification::empty(*id);
        // Who signed it, as each tier's heads say (a seq once).
        for (_, g) in surveys
            .iter()
            .flat_map(|s| s.generations())
            .filter(|(_, g)| g.id == *id)
        {
            for s in &g.signatures {
                if !whole.signatures.iter().any(|w| w.seq == s.seq) {
                    whole.signatures.push(s.clone());
                }
            }
            for p in inspect::signature_problems(g, trust) {
                if !whole.problems.contains(&p) {
                    whole.problems.push(p);
                }
            }
        }
        whole.files_checked = f.files_checked.max(d.files_checked);
        whole.packs_fetched = f.packs_fetched + d.packs_fetched;
        whole.bytes_fetched = f.bytes_fetched + d.bytes_fetched;
        whole.ok = whole.problems.is_empty() && f.sound() && d.sound();
        // Only what the trust admits is copied: an untrusted generation's manifest vouches for
        // nothing.
        let both_whole = f.ok && d.ok && f.announces() && d.announces();
        if args.repair && whole.problems.is_empty() && !both_whole {
            let fill_from = |from_heads| FillContext {
                layout,
                trust,
                id: *id,
                from_heads,
            };
            fill(&fill_from(heads[0].clone()), fast, &f, durable, &mut d)
                .with_context(|| format!("filling the durable tier with {id}"))?;
            fill(&fill_from(heads[1].clone()), durable, &d, fast, &mut f)
                .with_context(|| format!("filling the fast tier with {id}"))?;
            // What both tiers hold damaged: removed from both, as on one store.
            let both = inspect::tiers::damaged_in_both(&f, &d);
            let repair = repairer
                .repair(&both)
                .with_context(|| format!("repairing {id}"))?;
            whole.repaired = repair.removed;
            whole.repair_refused = repair.refused;
        }
        if !args.common.json {
            render::tiered(&whole, [&f, &d]);
        }
        results.push(TieredVerification {
            whole,
            tiers: vec![f, d],
        });
    }
    let code = if results.iter().all(|v| v.whole.ok) {
        exit::OK
    } else {
        exit::PROBLEM_FOUND
    };
    if args.common.json {
        emit_json("verify", &results, code);
    } else if ids.is_empty() {
        say!("no generations to verify in either tier");
    }
    Ok(code)
}

pub(crate) fn run_export(args: ExportArgs) -> Result<i32> {
    let session = Session::open_store_read_only(&args.common.store)?;
    let ids = args
        .compat_ids
        .iter()
        .map(|t| {
            t.parse()
                .map_err(|_| anyhow::anyhow!("--compat-id {t:?} is not a compat id (64 hex digits, as `jitship ls` prints them)"))
        })
        .collect::<Result<Vec<_>>>()?;
    let export = if crate::oci::layout::is_archive(&args.out) {
        crate::oci::layout::export_archive
    } else {
        crate::oci::export
    };
    let report = export(
        session.store.as_ref(),
        &session.layout,
        &session.trust,
        &ids,
        &args.out,
    )
    .with_context(|| format!("exporting to {}", args.out.display()))?;
    if args.common.json {
        emit_json("export", [&report], exit::OK);
        return Ok(exit::OK);
    }
    render::exported(&report, &args.out);
    Ok(exit::OK)
}

pub(crate) fn run_import(args: ImportArgs) -> Result<i32> {
    let session = Session::open_store(&args.common.store)?;
    let import = if args.from.is_file() {
        crate::oci::layout::import_archive
    } else {
        crate::oci::import
    };
    let report = import(
        session.store.as_ref(),
        &session.layout,
        &session.trust,
        &args.from,
    )
    .with_context(|| format!("importing from {}", args.from.display()))?;
    if args.common.json {
        emit_json("import", [&report], exit::OK);
        return Ok(exit::OK);
    }
    render::imported(&report);
    Ok(exit::OK)
}

pub(crate) fn run_pin(args: PinArgs) -> Result<i32> {
    let session = Session::open_store(&args.common.store)?;
    let store = session.store.as_ref();
    let id = resolve_generation(&session, &args.generation)?;
    if crate::catalog::fetch_manifest(store, &session.layout, &id)?.is_none() {
        bail!(
            "generation {id} is not in the store (collected or evicted); run `jitship ls` to see what is"
        );
    }
    let record = crate::catalog::pin(store, &session.layout, &id, args.reason.clone())?;
    if args.common.json {
        emit_json("pin", [&record], exit::OK);
    } else {
        render::pinned(&id);
    }
    Ok(exit::OK)
}

pub(crate) fn run_unpin(args: UnpinArgs) -> Result<i32> {
    let session = Session::open_store(&args.common.store)?;
    let id = resolve_generation(&session, &args.generation)?;
    let removed = crate::catalog::unpin(session.store.as_ref(), &session.layout, &id)?;
    let unpinned = render::Unpinned {
        generation: id,
        was_pinned: removed,
    };
    if args.common.json {
        emit_json("unpin", [&unpinned], exit::OK);
    } else {
        render::unpinned(&unpinned);
    }
    Ok(exit::OK)
}

/// Prints the JSON envelope of a store command that ran.
fn emit_json(command: &'static str, results: impl serde::Serialize, code: i32) {
    print!(
        "{}",
        output::to_text(&output::Envelope::start(command).finish(results, code))
    );
}

pub(crate) fn run_gc(args: GcArgs) -> Result<i32> {
    if let Some(given) = args.setting.first() {
        bail!(
            "gc takes no --setting ({given}): it decides each key with the policy and settings its \
             newest generation recorded. To change a key's settings, publish it with --setting \
             KIND:NAME=VALUE (or [[cache]] settings); `jitship ls` and `inspect` show the \
             recorded ones, and `policy test --setting` tries others"
        );
    }
    let session = Session::open_store_config(args.resolve()?)?;
    let opts = gc_options(&args, &session)?;
    // Each compat id is decided by the policy it was published with (found by digest), never by
    // the rule this host configures for its kind.
    let policies = crate::gc::PolicyIndex::new(&session.config, args.policy_dir.clone())
        .with_store(session.store.clone(), session.layout.clone());
    let mut report = crate::gc::collect(session.store.as_ref(), &session.layout, &policies, &opts)
        .with_context(|| format!("gc of {}", session.store.describe()))?;
    if let Some(registry) = &session.registry {
        report.registry = Some(crate::gc::collect_registry(
            registry,
            &report,
            std::time::Instant::now() + REGISTRY_GC_DEADLINE,
        ));
    }
    let registry_errors = report.registry.as_ref().map_or(0, |r| r.errors.len());
    let code = if !report.errors.is_empty() || registry_errors > 0 {
        exit::ERROR
    } else if report.not_decided.is_some() {
        exit::GC_NOT_DECIDED
    } else {
        exit::OK
    };
    if args.common.json {
        emit_json("gc", [&report], code);
    } else {
        render::gc(&report);
    }
    if !report.errors.is_empty() {
        eprintln!(
            "error: {} keys could not be removed; run gc again (it resumes from its journal)",
            report.errors.len()
        );
    }
    Ok(code)
}

/// The retention quotas (`[retention]`, overridden by the flags) and gc's other options.
fn gc_options(args: &GcArgs, session: &Session) -> Result<crate::gc::GcOptions> {
    let retention = &session.config.retention;
    let mut limits = retention.limits();
    if let Some(n) = args.keep {
        if n == 0 {
            bail!("--keep must be at least 1 (the newest generation is always kept)");
        }
        limits.max_generations = Some(n);
    }
    if let Some(b) = args.max_bytes {
        limits.max_bytes = Some(b.as_u64());
    }
    if let Some(a) = args.max_age {
        limits.max_age_secs = Some(a.as_secs());
    }
    Ok(crate::gc::GcOptions {
        now: args.now.unwrap_or_else(now_secs),
        grace: args.grace.unwrap_or(retention.grace),
        limits,
        dry_run: args.dry_run,
        lease_wait: retention.lease_wait,
        lease_rounds: crate::gc::GcOptions::DEFAULT_LEASE_ROUNDS,
        trust: session.trust.clone(),
    })
}
