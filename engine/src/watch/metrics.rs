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

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
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

/// Connections open at once. Every connection is accepted at once (none waits in the kernel's
/// accept queue behind others); accepting one more than this drops the oldest still open.
const MAX_CONNECTIONS: usize = 64;

/// A request's head must arrive whole within this. A well-behaved client (a kubelet probe, a
/// Prometheus scrape) sends it in one packet right after connecting; a client trickling its
/// header is dropped. hyper starts this timer whenever it waits for a head, so it is also the idle
/// timeout of a kept-alive connection between requests.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// Bound on one connection's whole life (a client that reads its response slowly, or keeps a
/// connection busy with requests).
const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);

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

/// Binds the metrics endpoint (an error here stops the watcher: a port clash should be seen at
/// start, not discovered when someone scrapes).
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

/// Serves `/metrics` and `/healthz` until the runtime stops. `/healthz` answers while the
/// watcher's runtime is alive (it serves from the same runtime as the event loop): 200, or 503
/// when no cache kind can run ([`Metrics::health`]).
///
/// Slow or idle clients cannot starve a health probe (issue 24: 64 loopback clients trickling one
/// header line a second kept `/healthz` failing for 45 s). What guarantees it:
/// - the accept loop never waits for a free slot: each connection is accepted and gets its own
///   task as soon as it arrives, so a probe never queues behind slow clients;
/// - at most [`MAX_CONNECTIONS`] are open: one more accepted drops the oldest (its task is
///   aborted, its socket closed). A probe sends its request at once and is answered from memory
///   in one round trip, so it is dropped only if more than `MAX_CONNECTIONS` connections arrive
///   within that round trip (a flood, not a slow client);
/// - a connection whose request head is not whole within [`HEADER_READ_TIMEOUT`] (or that idles
///   that long between requests) is closed, and none lives longer than [`CONNECTION_LIFETIME`].
pub async fn serve(listener: tokio::net::TcpListener, metrics: Arc<Metrics>) {
    let open: OpenConnections = Arc::new(Mutex::new(BTreeMap::new()));
    let mut next_id = 0u64;
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and friends pass; do not spin on them.
                tracing::warn!(error = %e, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let id = next_id;
        next_id += 1;
        let metrics = metrics.clone();
        let registration = Registration {
            open: open.clone(),
            id,
        };
        let mut evicted = Vec::new();
        {
            // Held across the spawn, so the task's deregistration (which takes this lock) comes
            // after its registration even if it ends at once.
            let mut table = open.lock().unwrap_or_else(PoisonError::into_inner);
            while table.len() >= MAX_CONNECTIONS {
                match table.pop_first() {
                    Some((_, oldest)) => evicted.push(oldest),
                    None => break,
                }
            }
            let task = tokio::spawn(async move {
                let _registration = registration;
                serve_connection(stream, metrics).await;
            });
            table.insert(id, task.abort_handle());
        }
        for oldest in evicted {
            oldest.abort();
        }
    }
}

/// The open connections by accept order (oldest first): what to abort to make room.
type OpenConnections = Arc<Mutex<BTreeMap<u64, tokio::task::AbortHandle>>>;

/// Removes its connection from the table when its task ends or is aborted.
struct Registration {
    open: OpenConnections,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

async fn serve_connection(stream: tokio::net::TcpStream, metrics: Arc<Metrics>) {
    let service = hyper::service::service_fn(move |req| {
        let metrics = metrics.clone();
        async move { Ok::<_, Infallible>(respond(&req, &metrics)) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    let _ = tokio::time::timeout(CONNECTION_LIFETIME, conn).await;
}

fn respond(req: &Request<Incoming>, metrics: &Metrics) -> Response<Full<Bytes>> {
    let (status, ctype, body) = match (req.method(), req.uri().path()) {
        (&hyper::Method::GET, "/metrics") => (
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.encode(),
        ),
        (&hyper::Method::GET, "/healthz") => {
            let health = metrics.health();
            let status = if health.ok {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            (status, "text/plain", health.body)
        }
        (&hyper::Method::GET, _) => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /metrics or /healthz\n".into(),
        ),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET\n".into(),
        ),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(ctype) {
        resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generation::CompatId;
    use std::collections::BTreeMap;

    fn report(outcome: PublishOutcome, skipped: &[(ReasonCategory, u64)]) -> PublishReport {
        PublishReport {
            cache_kind: "triton".into(),
            root: "/r".into(),
            compat_key: "k".into(),
            compat_id: CompatId::new("triton", "k"),
            outcome,
            files_selected: 3,
            skipped: skipped.iter().copied().collect::<BTreeMap<_, _>>(),
            skip_details: vec![],
            incomplete: None,
            files_new: 3,
            files_hashed: 3,
            bytes_uploaded: 1000,
            bytes_deduplicated: 10,
            packs_uploaded: 1,
            packs_reused: 0,
            conflicts: vec![],
            merged: vec![],
            head_attempts: 0,
            contributions: 0,
            carried: false,
            signed_by: None,
            parent_signer: None,
            duration_ms: 1,
            registry: None,
            module_not_stored: None,
            policy: None,
            settings_kept_from: None,
            settings_note: None,
            hash_ms: 0,
            upload_ms: 0,
        }
    }

    /// How a slow client's connection ended.
    #[derive(Debug, PartialEq)]
    enum SlowEnd {
        /// The server closed it (evicted, or its head never came whole in time).
        ClosedByServer,
        /// It sent every byte it had without being closed.
        BudgetSpent,
    }

    /// Issue 24: many loopback clients trickling a request head, one byte at a time, never keep
    /// `/healthz` from answering a client that sends its request at once (a kubelet probe, whose
    /// default timeout is 1 s); and every one of them is closed by the server, not left to hold a
    /// connection. Loopback only; every socket is closed and the server stopped at the end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slow_clients_cannot_starve_healthz() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const SLOW: usize = 96;
        const PROBES: usize = 20;
        // At most this many bytes after the request line, one per tick: 6 s in all, more than
        // HEADER_READ_TIMEOUT, so only the server can end a slow client early.
        const TRICKLE_BYTES: usize = 60;
        const TICK: Duration = Duration::from_millis(100);
        const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, Arc::new(Metrics::new())));

        let (started_tx, mut started_rx) = tokio::sync::mpsc::channel::<()>(SLOW);
        let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut slow = Vec::new();
        for _ in 0..SLOW {
            let (started, open) = (started_tx.clone(), open.clone());
            slow.push(tokio::spawn(async move {
                let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
                open.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (mut reader, mut writer) = stream.split();
                let sent = writer.write_all(b"GET /healthz HTTP/1.1\r\n").await;
                started.send(()).await.unwrap();
                let mut end = if sent.is_err() {
                    Some(SlowEnd::ClosedByServer)
                } else {
                    None
                };
                let mut tick = tokio::time::interval(TICK);
                let mut buf = [0u8; 256];
                let mut budget = TRICKLE_BYTES;
                while end.is_none() {
                    tokio::select! {
                        r = reader.read(&mut buf) => {
                            // No response can come: the head is never whole. EOF or reset.
                            assert!(!matches!(r, Ok(n) if n > 0), "a slow client got an answer");
                            end = Some(SlowEnd::ClosedByServer);
                        }
                        _ = tick.tick() => {
                            if budget == 0 {
                                end = Some(SlowEnd::BudgetSpent);
                            } else if writer.write_all(b"x").await.is_err() {
                                end = Some(SlowEnd::ClosedByServer);
                            }
                            budget = budget.saturating_sub(1);
                        }
                    }
                }
                open.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                end.unwrap()
            }));
        }
        drop(started_tx);
        // Every slow client is connected and has begun its head.
        for _ in 0..SLOW {
            started_rx.recv().await.unwrap();
        }

        for attempt in 0..PROBES {
            let probe = async {
                let mut stream = tokio::net::TcpStream::connect(addr).await?;
                stream
                    .write_all(
                        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                    )
                    .await?;
                let mut response = Vec::new();
                stream.read_to_end(&mut response).await?;
                Ok::<_, std::io::Error>(String::from_utf8_lossy(&response).into_owned())
            };
            let response = tokio::time::timeout(PROBE_TIMEOUT, probe)
                .await
                .unwrap_or_else(|_| {
                    panic!("probe {attempt}: no answer within {PROBE_TIMEOUT:?} beside {SLOW} slow clients")
                })
                .unwrap();
            assert!(
                response.starts_with("HTTP/1.1 200") && response.ends_with("ok\n"),
                "probe {attempt}: {response}"
            );
        }
        // The probes ran while slow clients were still connected, trickling.
        let still_open = open.load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            still_open > 0,
            "every slow client was gone before the probes ended"
        );

        // Each slow client ends because the server closed it: evicted, or its head not whole
        // within HEADER_READ_TIMEOUT, well before its bytes run out.
        for client in slow {
            assert_eq!(client.await.unwrap(), SlowEnd::ClosedByServer);
        }
        server.abort();
        assert!(server.await.unwrap_err().is_cancelled());
    }

    #[test]
    fn reports_become_metrics_and_stale_skip_reasons_reset() {
        let m = Metrics::new();
        m.record_report(&report(PublishOutcome::Empty, &[(ReasonCategory::Lock, 2)]));
        m.record_report(&report(PublishOutcome::Empty, &[]));
        m.record_cycle_error("triton", ErrorKind::Store);
        let text = m.encode();
        for line in [
            "jitship_watch_publish_cycles_total{cache=\"triton\",outcome=\"empty\"} 2",
            "jitship_watch_publish_cycles_total{cache=\"triton\",outcome=\"error\"} 1",
            "jitship_watch_bytes_uploaded_total{cache=\"triton\"} 2000",
            "jitship_watch_files_skipped{cache=\"triton\",category=\"lock\"} 0",
            "jitship_watch_files_skipped{cache=\"triton\",category=\"foreign-root\"} 0",
            "jitship_watch_cache_incomplete{cache=\"triton\"} 0",
            "jitship_watch_errors_total{cache=\"triton\",kind=\"store\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }

    /// A tree full of distinct bad files (temp, lock, per-host, each name different) gives the same
    /// fixed set of `files_skipped` series as an empty one: categories, never file names.
    #[test]
    fn skip_labels_are_bounded_whatever_the_tree_holds() {
        use crate::catalog::KeyLayout;
        use crate::policy::native::NativeRules;
        use crate::publish::{PublishOptions, publish};
        use crate::store::LocalStore;

        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        for i in 0..300 {
            let files = [
                format!("k{i}/tmp.pid_{i}_abc/kernel.cubin"),
                format!("k{i}/model.{i}.tmp"),
                format!("locks/{i}.lock"),
                format!("k{i}/x{i}.lock"),
                format!("gpu_p2p_access_cache_for_{i}.json"),
                format!("k{i}/ok.bin"),
            ];
            for f in files {
                let p = root.join(f);
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(p, i.to_string()).unwrap();
            }
        }
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
        let store = LocalStore::open(dir.path().join("store")).unwrap();
        let layout = KeyLayout::new("t").unwrap();
        let opts = PublishOptions {
            pack_size: 1 << 20,
            producer: crate::generation::Producer {
                host: "h".into(),
                pod: None,
                jitship_version: "0".into(),
            },
            facts: crate::facts::Facts::new(),
            max_head_attempts: 4,
            trust: Default::default(),
            interrupt: Default::default(),
            registry: None,
        };
        let policy = NativeRules::new("triton");
        let r = publish(&store, &layout, &policy, &root, &opts, None).unwrap();
        assert_eq!(r.files_selected, 300);
        assert_eq!(
            r.skipped.values().sum::<u64>(),
            5 * 300 + 1,
            "{:?}",
            r.skipped
        );
        assert_eq!(r.skip_details.len(), crate::publish::MAX_SKIP_DETAILS);

        let m = Metrics::new();
        m.record_report(&r);
        let text = m.encode();
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("jitship_watch_files_skipped{"))
            .collect();
        assert_eq!(
            series.len(),
            ReasonCategory::ALL.len() - 1,
            "one series per skip category, whatever the tree holds:\n{}",
            series.join("\n")
        );
        for (category, n) in [
            ("temporary", 600),
            ("lock", 600),
            ("per-host", 300),
            ("excluded", 1),
        ] {
            let line = format!(
                "jitship_watch_files_skipped{{cache=\"triton\",category=\"{category}\"}} {n}"
            );
            assert!(
                series.contains(&line.as_str()),
                "{line} missing from:\n{}",
                series.join("\n")
            );
        }
        assert!(!text.contains("k17"), "a file name leaked into a label");
    }

    #[test]
    fn disabled_policies_show_in_the_metric_and_healthz() {
        use crate::policies::{DisabledCause, PolicySource};
        let m = Metrics::new();
        assert_eq!(
            m.health(),
            Health {
                ok: true,
                body: "ok\n".into()
            }
        );
        let kind = |kind: &str, cause: Option<DisabledCause>| KindStatus {
            kind: kind.into(),
            source: PolicySource::Builtin,
            policy: None,
            digest: None,
            disabled: cause.map(|c| format!("{} reason", c.as_str())),
            disabled_cause: cause,
        };
        let status = vec![
            kind("triton", Some(DisabledCause::Backoff)),
            kind("inductor", None),
            kind("deepgemm", Some(DisabledCause::Violation)),
        ];
        m.watch_policies(Arc::new(move || status.clone()));
        let Health { ok, body: health } = m.health();
        assert!(ok, "one kind still runs: {health}");
        assert!(health.starts_with("ok\n"), "{health}");
        assert!(
            health.contains("cache kind triton disabled (backoff): backoff reason\n"),
            "{health}"
        );
        assert!(
            health.contains("cache kind deepgemm disabled (violation)"),
            "{health}"
        );
        assert!(!health.contains("inductor"), "{health}");
        let text = m.encode();
        for line in [
            "jitship_watch_policy_disabled{cache=\"triton\",cause=\"backoff\"} 1",
            "jitship_watch_policy_disabled{cache=\"triton\",cause=\"violation\"} 0",
            "jitship_watch_policy_disabled{cache=\"deepgemm\",cause=\"violation\"} 1",
            "jitship_watch_policy_disabled{cache=\"inductor\",cause=\"backoff\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }

    /// No kind can run (every one disabled until restart): 503 with each reason. A kind only
    /// paused by backoff runs again by itself: still 200.
    #[test]
    fn healthz_is_unhealthy_only_when_no_cache_kind_can_run() {
        use crate::policies::{DisabledCause, PolicySource};
        let kind = |kind: &str, cause: Option<DisabledCause>| KindStatus {
            kind: kind.into(),
            source: PolicySource::Builtin,
            policy: None,
            digest: None,
            disabled: cause.map(|c| format!("{} reason", c.as_str())),
            disabled_cause: cause,
        };
        let health = |status: Vec<KindStatus>| {
            let m = Metrics::new();
            m.watch_policies(Arc::new(move || status.clone()));
            m.health()
        };
        let all_down = health(vec![
            kind("triton", Some(DisabledCause::Load)),
            kind("deepgemm", Some(DisabledCause::Violation)),
        ]);
        assert!(!all_down.ok, "{}", all_down.body);
        assert!(
            all_down
                .body
                .starts_with("unhealthy: no cache kind can run"),
            "{}",
            all_down.body
        );
        assert!(
            all_down
                .body
                .contains("cache kind triton disabled (load): load reason\n"),
            "{}",
            all_down.body
        );
        assert!(
            all_down
                .body
                .contains("cache kind deepgemm disabled (violation): violation reason\n"),
            "{}",
            all_down.body
        );
        let paused = health(vec![
            kind("triton", Some(DisabledCause::Load)),
            kind("deepgemm", Some(DisabledCause::Backoff)),
        ]);
        assert!(paused.ok, "{}", paused.body);
        assert!(
            paused
                .body
                .contains("cache kind deepgemm disabled (backoff)"),
            "{}",
            paused.body
        );
        let one = health(vec![kind("triton", Some(DisabledCause::Violation))]);
        assert!(!one.ok, "{}", one.body);
    }

    /// The endpoint answers the status `health` decides: 503 and the reasons over HTTP.
    #[tokio::test]
    async fn healthz_answers_503_over_http_when_no_kind_can_run() {
        use crate::policies::{DisabledCause, PolicySource};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let m = Arc::new(Metrics::new());
        m.watch_policies(Arc::new(|| {
            vec![KindStatus {
                kind: "triton".into(),
                source: PolicySource::Builtin,
                policy: None,
                digest: None,
                disabled: Some("cannot load".into()),
                disabled_cause: Some(DisabledCause::Load),
            }]
        }));
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, m));
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut resp = String::new();
        c.read_to_string(&mut resp).await.unwrap();
        assert!(resp.starts_with("HTTP/1.1 503"), "{resp}");
        assert!(
            resp.contains("cache kind triton disabled (load): cannot load"),
            "{resp}"
        );
    }
}
