//! The readiness gate: with `--ready-url`, nothing is published until the server's health
//! endpoint has answered 200 once. Until then the engine is still compiling and warming up
//! (vLLM writes its `model` file before warmup and CUDA-graph capture), so early generations would
//! be partial and the uploads would compete with the start-up for the node.
//!
//! Plain `http://` only: the endpoint is the server's own port in the same pod. One GET over
//! hyper's client, not reqwest (the registry tier's client): reqwest is built here without a TLS
//! crypto provider and refuses to build even a plain-HTTP client until one is installed, which
//! would tie this layer-0 probe to the registry tier (`crates/oci`).

use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper::{Request, Uri};

/// One probe, connection included, takes at most this long.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyUrl {
    uri: Uri,
    host: String,
    port: u16,
}

#[derive(Debug, thiserror::Error)]
#[error("invalid ready URL {url:?}: {hint}")]
pub struct ReadyUrlError {
    pub url: String,
    pub hint: &'static str,
}

impl ReadyUrl {
    pub fn parse(url: &str) -> Result<Self, ReadyUrlError> {
        let err = |hint| ReadyUrlError {
            url: url.to_owned(),
            hint,
        };
        let uri: Uri = url.parse().map_err(|_| {
            err("expected http://HOST:PORT/PATH, e.g. http://127.0.0.1:8000/health")
        })?;
        if uri.scheme_str() != Some("http") {
            return Err(err(
                "only http:// is supported (the server's own port in the same pod)",
            ));
        }
        let host = uri
            .host()
            .ok_or_else(|| err("the URL has no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(80);
        Ok(Self { uri, host, port })
    }

    pub fn as_str(&self) -> String {
        self.uri.to_string()
    }
}

/// What one probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    Ready,
    /// Answered with another status.
    NotReady(u16),
    /// No answer (refused, timed out, broken response).
    Unreachable(String),
}

/// GETs the URL once, bounded by `PROBE_TIMEOUT`.
pub async fn probe(url: &ReadyUrl) -> Probe {
    match tokio::time::timeout(PROBE_TIMEOUT, probe_inner(url)).await {
        Ok(Ok(200)) => Probe::Ready,
        Ok(Ok(status)) => Probe::NotReady(status),
        Ok(Err(e)) => Probe::Unreachable(e),
        Err(_) => Probe::Unreachable(format!("no answer within {PROBE_TIMEOUT:?}")),
    }
}

async fn probe_inner(url: &ReadyUrl) -> Result<u16, String> {
    let stream = tokio::net::TcpStream::connect((url.host.as_str(), url.port))
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(conn);
    let path = url
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let authority = url
        .uri
        .authority()
        .map_or(url.host.clone(), |a| a.to_string());
    let req = Request::get(path)
        .header(hyper::header::HOST, authority)
        .header(hyper::header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let result = sender
        .send_request(req)
        .await
        .map(|resp| resp.status().as_u16())
        .map_err(|e| e.to_string());
    driver.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_urls_with_a_host() {
        let u = ReadyUrl::parse("http://127.0.0.1:8000/health").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("127.0.0.1", 8000));
        assert_eq!(ReadyUrl::parse("http://[::1]/h").unwrap().host, "::1");
        assert_eq!(ReadyUrl::parse("http://localhost/h").unwrap().port, 80);
        assert!(ReadyUrl::parse("https://x/health").is_err());
        assert!(ReadyUrl::parse("localhost:8000").is_err());
        assert!(ReadyUrl::parse("not a url").is_err());
    }

    #[tokio::test]
    async fn probes_a_loopback_server() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            for status in ["503 Service Unavailable", "200 OK"] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await.unwrap();
                let resp = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
                s.write_all(resp.as_bytes()).await.unwrap();
            }
        });
        let url = ReadyUrl::parse(&format!("http://127.0.0.1:{port}/health")).unwrap();
        assert_eq!(probe(&url).await, Probe::NotReady(503));
        assert_eq!(probe(&url).await, Probe::Ready);
        server.await.unwrap();
        assert!(matches!(probe(&url).await, Probe::Unreachable(_)));
    }
}
