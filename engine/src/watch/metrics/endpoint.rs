//! The HTTP endpoint serving the metrics: `GET /metrics` and `GET /healthz`, bounded so slow or idle
//! clients cannot starve a health probe.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};

use super::Metrics;

/// Connections open at once. Every connection is accepted at once (none waits in the kernel's
/// accept queue behind others); accepting one more than this drops the oldest still open.
pub(super) const MAX_CONNECTIONS: usize = 64;

/// A request's head must arrive whole within this. A well-behaved client (a kubelet probe, a
/// Prometheus scrape) sends it in one packet right after connecting; a client trickling its
/// header is dropped. hyper starts this timer whenever it waits for a head, so it is also the idle
/// timeout of a kept-alive connection between requests.
pub(super) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// Bound on one connection's whole life (a client that reads its response slowly, or keeps a
/// connection busy with requests).
pub(super) const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);

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
pub(super) type OpenConnections = Arc<Mutex<BTreeMap<u64, tokio::task::AbortHandle>>>;

/// Removes its connection from the table when its task ends or is aborted.
pub(super) struct Registration {
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

pub(super) async fn serve_connection(stream: tokio::net::TcpStream, metrics: Arc<Metrics>) {
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

pub(super) fn respond(req: &Request<Incoming>, metrics: &Metrics) -> Response<Full<Bytes>> {
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
