//! Prometheus metrics of the watcher (`prometheus-client` registry, text exposition) and the small
//! HTTP endpoint serving them: `GET /metrics` and `GET /healthz`.
//!
//! Names (prefix `jitship_watch_`): `publish_cycles_total{cache,outcome}`,
//! `generations_published_total{cache}`, `bytes_uploaded_total{cache}`,
//! `bytes_deduplicated_total{cache}`, `files_hashed_total{cache}`, `files_selected{cache}` and
//! `files_skipped{cache,category}` (both as of the last cycle; `category` is one of the policy
//! contract's fixed reason categories, every one always exported, so the label set is bounded
//! whatever a cache holds), `cache_incomplete{cache}` (1 when the last cycle's root was not a
//! complete cache for its kind), `last_publish_timestamp_seconds{cache}`
//! (last new generation), `last_cycle_timestamp_seconds{cache}`, `errors_total{cache,kind}`,
//! `pending{cache}`, `ready`, `rescans_total`, `events_total`, and `policy_disabled{cache,cause}`
//! (1 while a kind's policy does not run: cause `load` or `violation` for the process, `backoff`
//! until its pause passes), which `/healthz` also lists with the reason, and `store_reachable`
//! (0 while the last cycle found the store not answering; `/healthz` says why, still 200: a
//! restarted sidecar would find the store no sooner).
//!
//! The periodic scrub's (`crate::scrub`), prefix `jitship_store_scrub_`: `runs_total`,
//! `failures_total` (scrubs that could not ask the store), `checked_total`, `missing_total`,
//! `corrupt_total`, `repaired_total` (packs), `last_run_timestamp_seconds` and `last_unrepaired`
//! (packs the last scrub found lost or damaged and could not put back: "the store lost N").

mod endpoint;
#[cfg(test)]
mod tests;

pub use endpoint::{bind, serve};

use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::policies::KindStatus;
use crate::policy::ReasonCategory;
use crate::publish::{PublishOutcome, PublishReport};

/// `/healthz`'s answer: 200 when `ok`, else 503; the body says why either way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub ok: bool,
    pub body: String,
}

/// Where the metrics learn which cache kinds have their policy disabled (the process's `PolicySet`).
pub type PolicyStatusSource = Arc<dyn Fn() -> Vec<KindStatus> + Send + Sync>;

type Labels = Vec<(&'static str, String)>;

/// Why the watcher counted an error: the `kind` label of the errors metric, a fixed set so the
/// label stays bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    Policy,
    Scan,
    Read,
    Store,
    Catalog,
    Contention,
    Config,
    Interrupted,
    Panic,
    /// A watch could not be registered.
    Watch,
    /// The inotify watch limit was reached.
    WatchLimit,
    /// File events were lost (inotify queue overflow).
    Overflow,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Policy => "policy",
            Self::Scan => "scan",
            Self::Read => "read",
            Self::Store => "store",
            Self::Catalog => "catalog",
            Self::Contention => "contention",
            Self::Config => "config",
            Self::Interrupted => "interrupted",
            Self::Panic => "panic",
            Self::Watch => "watch",
            Self::WatchLimit => "watch_limit",
            Self::Overflow => "overflow",
        }
    }
}

pub struct Metrics {
    registry: Registry,
    cycles: Family<Labels, Counter>,
    generations: Family<Labels, Counter>,
    bytes_uploaded: Family<Labels, Counter>,
    bytes_deduplicated: Family<Labels, Counter>,
    files_hashed: Family<Labels, Counter>,
    files_selected: Family<Labels, Gauge>,
    files_skipped: Family<Labels, Gauge>,
    incomplete: Family<Labels, Gauge>,
    last_publish: Family<Labels, Gauge>,
    last_cycle: Family<Labels, Gauge>,
    errors: Family<Labels, Counter>,
    pending: Family<Labels, Gauge>,
    ready: Gauge,
    rescans: Counter,
    events: Counter,
    policy_disabled: Family<Labels, Gauge>,
    policy_status: Mutex<Option<PolicyStatusSource>>,
    store_reachable: Gauge,
    scrub_runs: Counter,
    scrub_failures: Counter,
    scrub_checked: Counter,
    scrub_missing: Counter,
    scrub_corrupt: Counter,
    scrub_repaired: Counter,
    scrub_last_run: Gauge,
    scrub_last_unrepaired: Gauge,
    /// Why the store did not answer the last cycle, while it does not.
    store_down: Mutex<Option<String>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut root = Registry::default();
        let registry = root.sub_registry_with_prefix("jitship_watch");
        let m = Self {
            cycles: Family::default(),
            generations: Family::default(),
            bytes_uploaded: Family::default(),
            bytes_deduplicated: Family::default(),
            files_hashed: Family::default(),
            files_selected: Family::default(),
            files_skipped: Family::default(),
            incomplete: Family::default(),
            last_publish: Family::default(),
            last_cycle: Family::default(),
            errors: Family::default(),
            pending: Family::default(),
            ready: Gauge::default(),
            rescans: Counter::default(),
            events: Counter::default(),
            policy_disabled: Family::default(),
            policy_status: Mutex::new(None),
            store_reachable: Gauge::default(),
            scrub_runs: Counter::default(),
            scrub_failures: Counter::default(),
            scrub_checked: Counter::default(),
            scrub_missing: Counter::default(),
            scrub_corrupt: Counter::default(),
            scrub_repaired: Counter::default(),
            scrub_last_run: Gauge::default(),
            scrub_last_unrepaired: Gauge::default(),
            store_down: Mutex::new(None),
            registry: Registry::default(),
        };
        registry.register(
            "publish_cycles",
            "Publish cycles run, by cache and outcome (published, unchanged, empty, error)",
            m.cycles.clone(),
        );
        registry.register(
            "generations_published",
            "New generations made head",
            m.generations.clone(),
        );
        registry.register(
            "bytes_uploaded",
            "Pack bytes uploaded to the store",
            m.bytes_uploaded.clone(),
        );
        registry.register(
            "bytes_deduplicated",
            "Pack bytes needed but already in the store (not uploaded again)",
            m.bytes_deduplicated.clone(),
        );
        registry.register(
            "files_hashed",
            "Files read and hashed (files known from earlier cycles are not)",
            m.files_hashed.clone(),
        );
        registry.register(
            "files_selected",
            "Files the policy selected in the last cycle",
            m.files_selected.clone(),
        );
        registry.register(
            "files_skipped",
            "Files not published in the last cycle, by reason category (complete, temporary, lock, per-host, \
             incomplete, foreign-root, unparseable, not-cache, excluded)",
            m.files_skipped.clone(),
        );
        registry.register(
            "cache_incomplete",
            "1 when the last cycle's root was not a complete cache for its kind (the policy said so)",
            m.incomplete.clone(),
        );
        registry.register(
            "last_publish_timestamp_seconds",
            "Unix time of the last new generation",
            m.last_publish.clone(),
        );
        registry.register(
            "last_cycle_timestamp_seconds",
            "Unix time of the last successful cycle",
            m.last_cycle.clone(),
        );
        registry.register(
            "errors",
            "Errors by cache and kind (policy, scan, read, store, catalog, contention, interrupted, panic, watch, watch_limit, ready)",
            m.errors.clone(),
        );
        registry.register(
            "pending",
            "1 while a cache has changes not yet published",
            m.pending.clone(),
        );
        registry.register(
            "ready",
            "1 once the readiness gate is open (always 1 without --ready-url)",
            m.ready.clone(),
        );
        registry.register(
            "rescans",
            "Periodic full rescans of the roots",
            m.rescans.clone(),
        );
        registry.register(
            "events",
            "Batches of file-system events received",
            m.events.clone(),
        );
        registry.register(
            "policy_disabled",
            "1 while a cache kind's policy does not run, by cause (load, violation: for the process; backoff: until the pause passes)",
            m.policy_disabled.clone(),
        );
        registry.register(
            "store_reachable",
            "1 while the store answers; 0 while it does not (unreachable at start, or the last cycle found it down)",
            m.store_reachable.clone(),
        );
        m.store_reachable.set(1);
        let scrub = root.sub_registry_with_prefix("jitship_store_scrub");
        for (name, help, c) in [
            ("runs", "Scrubs run", &m.scrub_runs),
            (
                "failures",
                "Scrubs that could not ask the store",
                &m.scrub_failures,
            ),
            ("checked", "Packs scrubs read and checked", &m.scrub_checked),
            (
                "missing",
                "Packs scrubs found missing from the (fast) store",
                &m.scrub_missing,
            ),
            (
                "corrupt",
                "Packs scrubs found damaged in the (fast) store",
                &m.scrub_corrupt,
            ),
            (
                "repaired",
                "Missing or damaged packs put back from the durable tier",
                &m.scrub_repaired,
            ),
        ] {
            scrub.register(name, help, c.clone());
        }
        scrub.register(
            "last_run_timestamp_seconds",
            "Unix time of the last scrub that read the store",
            m.scrub_last_run.clone(),
        );
        scrub.register(
            "last_unrepaired",
            "Packs the last scrub found missing or damaged and could not put back",
            m.scrub_last_unrepaired.clone(),
        );
        Self {
            registry: root,
            ..m
        }
    }

    pub fn record_scrub(&self, r: &crate::scrub::ScrubReport) {
        self.scrub_runs.inc();
        self.scrub_checked.inc_by(r.checked);
        self.scrub_missing.inc_by(r.missing);
        self.scrub_corrupt.inc_by(r.corrupt);
        self.scrub_repaired.inc_by(r.repaired);
        self.scrub_last_run.set(crate::catalog::now_secs() as i64);
        self.scrub_last_unrepaired
            .set(r.findings.iter().filter(|f| !f.repaired).count() as i64);
    }

    pub fn record_scrub_failure(&self) {
        self.scrub_runs.inc();
        self.scrub_failures.inc();
    }

    /// `Some(why)` while the store does not answer; `None` once it does.
    pub fn set_store_unreachable(&self, why: Option<&str>) {
        self.store_reachable.set(i64::from(why.is_none()));
        *self
            .store_down
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = why.map(str::to_owned);
    }

    /// Reports the kinds of `source` in `policy_disabled` and `/healthz` (read at each request).
    pub fn watch_policies(&self, source: PolicyStatusSource) {
        *self
            .policy_status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(source);
    }

    /// The policies' status now, with `policy_disabled` brought up to date.
    fn policy_status(&self) -> Vec<KindStatus> {
        let source = self
            .policy_status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let Some(source) = source else {
            return vec![];
        };
        let status = source();
        for s in &status {
            for cause in [
                crate::policies::DisabledCause::Load,
                crate::policies::DisabledCause::Violation,
                crate::policies::DisabledCause::Backoff,
            ] {
                self.policy_disabled
                    .get_or_create(&vec![
                        ("cache", s.kind.clone()),
                        ("cause", cause.as_str().to_owned()),
                    ])
                    .set(i64::from(s.disabled_cause == Some(cause)));
            }
        }
        status
    }

    /// `/healthz`: 200 `ok` while some cache kind can run, each disabled kind on its own line
    /// with why; 503 when none can: every kind's policy is disabled for the process (`load` or
    /// `violation`), so the watcher would never publish again until restarted. A kind paused by
    /// `backoff` runs again by itself, so it keeps the answer 200.
    pub fn health(&self) -> Health {
        use crate::policies::DisabledCause;
        let status = self.policy_status();
        let mut lines = String::new();
        for s in &status {
            if let (Some(cause), Some(reason)) = (s.disabled_cause, &s.disabled) {
                lines.push_str(&format!(
                    "cache kind {} disabled ({}): {reason}\n",
                    s.kind,
                    cause.as_str()
                ));
            }
        }
        if let Some(why) = &*self
            .store_down
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            lines.push_str(&format!(
                "store unreachable (publishes wait for it, retried with backoff): {why}\n"
            ));
        }
        let none_can_run = !status.is_empty()
            && status.iter().all(|s| {
                matches!(
                    s.disabled_cause,
                    Some(DisabledCause::Load | DisabledCause::Violation)
                )
            });
        if none_can_run {
            Health {
                ok: false,
                body: format!(
                    "unhealthy: no cache kind can run (all {} disabled until restart)\n{lines}",
                    status.len()
                ),
            }
        } else {
            Health {
                ok: true,
                body: format!("ok\n{lines}"),
            }
        }
    }

    pub fn record_report(&self, r: &PublishReport) {
        let cache = r.cache_kind.clone();
        let l = vec![("cache", cache.clone())];
        let outcome = match r.outcome {
            PublishOutcome::Published { .. } => "published",
            PublishOutcome::Unchanged { .. } => "unchanged",
            PublishOutcome::Empty => "empty",
        };
        self.cycles
            .get_or_create(&vec![("cache", cache.clone()), ("outcome", outcome.into())])
            .inc();
        let now = crate::catalog::now_secs() as i64;
        if matches!(r.outcome, PublishOutcome::Published { .. }) {
            self.generations.get_or_create(&l).inc();
            self.last_publish.get_or_create(&l).set(now);
        }
        self.last_cycle.get_or_create(&l).set(now);
        self.bytes_uploaded
            .get_or_create(&l)
            .inc_by(r.bytes_uploaded);
        self.bytes_deduplicated
            .get_or_create(&l)
            .inc_by(r.bytes_deduplicated);
        self.files_hashed.get_or_create(&l).inc_by(r.files_hashed);
        self.files_selected
            .get_or_create(&l)
            .set(r.files_selected as i64);
        // Every skip category, every cycle: a category that disappears reads 0, not a stale count,
        // and the series per cache are a fixed set whatever the tree holds.
        for category in ReasonCategory::ALL {
            if category == ReasonCategory::Complete {
                continue;
            }
            let n = r.skipped.get(&category).copied().unwrap_or(0);
            self.files_skipped
                .get_or_create(&vec![
                    ("cache", cache.clone()),
                    ("category", category.as_str().to_owned()),
                ])
                .set(n as i64);
        }
        self.incomplete
            .get_or_create(&l)
            .set(i64::from(r.incomplete.is_some()));
    }

    pub fn record_error(&self, cache: &str, kind: ErrorKind) {
        self.errors
            .get_or_create(&vec![
                ("cache", cache.to_owned()),
                ("kind", kind.as_str().to_owned()),
            ])
            .inc();
    }

    pub fn record_cycle_error(&self, cache: &str, kind: ErrorKind) {
        self.cycles
            .get_or_create(&vec![
                ("cache", cache.to_owned()),
                ("outcome", "error".into()),
            ])
            .inc();
        self.record_error(cache, kind);
    }

    pub fn set_pending(&self, cache: &str, pending: bool) {
        self.pending
            .get_or_create(&vec![("cache", cache.to_owned())])
            .set(i64::from(pending));
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    pub fn rescan(&self) {
        self.rescans.inc();
    }

    pub fn events(&self) {
        self.events.inc();
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        self.policy_status();
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
