//! The durable registry tier: generations as OCI artifacts in a registry (see the module above
//! for the artifact), behind the fast tier (Mooncake), which loses what it evicts and all of it
//! when its master restarts.
//!
//! In the repository `[store.durable] registry` names, each generation is tagged
//! `<compat id>.<seq>.<generation id, first 16 hex digits>` (its seq is the head's, which its
//! signature binds; the id keeps two generations of one seq, say before and after a master
//! restart emptied the fast tier, from taking each other's tag), and `<compat id>` names the
//! newest one pushed, for standard tools (`skopeo`, `oras`, `crane`). A tag is pushed
//! only after every blob it needs is there, so a tag never names an incomplete generation.
//!
//! Anyone who can push to the repository can push tags, so a pull treats everything as hostile:
//! the tag list, manifests and blobs are read with a size bound, a tag's head must name that
//! compat id and seq and be admitted by the install's trust before anything else of it is read,
//! and at most [`MAX_CANDIDATES`] tags are tried, newest seq first. Forged tags cost two small
//! reads each, and a pull ends at the install's deadline whatever the registry does.
//!
//! oci-client does the authentication (docker config, credential helpers, bearer tokens) and
//! pushes blobs; manifests, tag lists and deletes go through reqwest (oci-client has no delete,
//! and reads manifests and tag lists whole, without a bound).

use std::time::{Duration, Instant};

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use reqwest::StatusCode;

mod pull;
mod push;

pub use push::RegistryTee;

use super::{BakedGeneration, Descriptor, MAX_OCI_MANIFEST_BYTES, OCI_MANIFEST, sha256_digest};
use jitship_generation::{CompatId, GenerationId};
use jitship_store::DurableStoreConfig;

/// Blobs a pull reads at once.
const CONCURRENT_PULLS: usize = 4;
/// Most tags of one compat id a pull tries (newest seq first) before it gives up.
pub const MAX_CANDIDATES: usize = 64;
/// Most tags read from the repository's tag list, and its bound in bytes.
const MAX_TAGS: usize = 100_000;
const MAX_TAG_LIST_BYTES: u64 = 16 << 20;
const TAG_PAGE: usize = 1000;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("registry {registry} is unreachable: {why}")]
    Unreachable { registry: String, why: String },
    #[error("registry {registry} answered {status} to {what}: {body}")]
    Status {
        registry: String,
        status: u16,
        what: String,
        body: String,
    },
    #[error("registry {registry}: {what} is over its {limit}-byte bound")]
    TooLarge {
        registry: String,
        what: String,
        limit: u64,
    },
    #[error("registry {registry} did not finish {what} before the deadline ({left:?} were left)")]
    Deadline {
        registry: String,
        what: String,
        left: Duration,
    },
    #[error("registry {registry}: {why}")]
    Client { registry: String, why: String },
    #[error(
        "durable registry {0:?} is not HOST[:PORT]/REPOSITORY (for example registry.example.com/jitship/cache)"
    )]
    BadReference(String),
}

/// A repository of a registry, with the client that talks to it.
pub struct Registry {
    client: Client,
    http: reqwest::Client,
    auth: RegistryAuth,
    /// `host[:port]` as resolved for requests, and the repository in it.
    registry: String,
    repository: String,
    scheme: &'static str,
    /// `None` only while dropped (see `Drop`).
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Registry {
    /// Without waiting: the last reference may go inside an async context (the watcher's loop),
    /// where dropping a runtime, which waits for its workers, panics.
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Registry({})", self.describe())
    }
}

/// What a pull found for one compat id.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RegistryPull {
    /// The registry and repository ("oci:127.0.0.1:5000/jitship").
    pub registry: String,
    /// The generation put into the fast tier (read-repair), with the outcome of that put.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served: Option<BakedGeneration>,
    /// The tag it came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Tags passed over (not this compat id's, refused by the trust, not verifiable), with why.
    pub passed_over: Vec<String>,
    /// Why nothing was served, when nothing was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub duration_ms: u64,
}

impl Registry {
    /// The registry `config` names (`registry = "HOST[:PORT]/REPOSITORY"`), with the credentials
    /// the docker config gives for its host (`$DOCKER_CONFIG/config.json` or
    /// `~/.docker/config.json`, credential helpers included), anonymous when it gives none.
    /// Connects to nothing yet.
    pub fn open(config: &DurableStoreConfig) -> Result<Self, RegistryError> {
        let named = config.registry.as_deref().unwrap_or_default();
        let (host, repository) = named
            .split_once('/')
            .filter(|(h, r)| !h.is_empty() && !r.is_empty() && !named.contains(['@', ' ']))
            .ok_or_else(|| RegistryError::BadReference(named.to_owned()))?;
        let reference = Reference::with_tag(host.to_owned(), repository.to_owned(), "x".into());
        let registry = reference.resolve_registry().to_owned();
        // reqwest is built without a crypto provider (see Cargo.toml): ring, installed once.
        #[allow(deprecated)] // ring lacks post-quantum key exchange; aws-lc-rs has it, but its C
        // build was not tried under the glibc-baseline zig toolchain (see Cargo.toml).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = Client::new(ClientConfig {
            protocol: if config.plain_http {
                ClientProtocol::Http
            } else {
                ClientProtocol::Https
            },
            connect_timeout: Some(config.timeout),
            read_timeout: Some(config.timeout),
            ..ClientConfig::default()
        });
        let http = reqwest::Client::builder()
            .connect_timeout(config.timeout)
            .read_timeout(config.timeout)
            .build()
            .map_err(|e| RegistryError::Client {
                registry: registry.clone(),
                why: e.to_string(),
            })?;
        let auth = match docker_credential::get_credential(&registry) {
            Ok(docker_credential::DockerCredential::UsernamePassword(u, p)) => {
                RegistryAuth::Basic(u, p)
            }
            Ok(docker_credential::DockerCredential::IdentityToken(t)) => RegistryAuth::Bearer(t),
            Err(_) => RegistryAuth::Anonymous,
        };
        // Publish pushes packs from its upload threads at once: two workers drive them.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("jitship-registry")
            .enable_all()
            .build()
            .map_err(|e| RegistryError::Client {
                registry: registry.clone(),
                why: format!("starting its I/O runtime: {e}"),
            })?;
        Ok(Self {
            client,
            http,
            auth,
            registry,
            repository: repository.to_owned(),
            scheme: if config.plain_http { "http" } else { "https" },
            runtime: Some(runtime),
        })
    }

    /// "oci:HOST[:PORT]/REPOSITORY".
    pub fn describe(&self) -> String {
        format!("oci:{}/{}", self.registry, self.repository)
    }

    fn reference(&self, tag: &str) -> Reference {
        Reference::with_tag(self.registry.clone(), self.repository.clone(), tag.into())
    }

    /// The tag of `generation`, head `seq` of `compat`.
    pub fn generation_tag(compat: &CompatId, seq: u64, generation: &GenerationId) -> String {
        let id = generation.to_string();
        format!("{compat}.{seq}.{}", &id[..id.len().min(16)])
    }

    fn url(&self, path: &str) -> String {
        format!(
            "{}://{}/v2/{}/{path}",
            self.scheme, self.registry, self.repository
        )
    }

    /// A failed request: `Unreachable` when it never reached the registry (no connection, a
    /// timeout, nothing sent), which is the registry being away rather than refusing; told by
    /// reqwest's error kind, not by its message.
    fn http_error(&self, e: reqwest::Error) -> RegistryError {
        let registry = self.registry.clone();
        let why = e.to_string();
        if e.is_connect() || e.is_timeout() || e.is_request() {
            RegistryError::Unreachable { registry, why }
        } else {
            RegistryError::Client { registry, why }
        }
    }

    /// An oci-client failure: its transport errors classified as [`Self::http_error`] does.
    fn client_error(&self, e: OciDistributionError) -> RegistryError {
        match e {
            OciDistributionError::RequestError(e) => self.http_error(e),
            e => RegistryError::Client {
                registry: self.registry.clone(),
                why: e.to_string(),
            },
        }
    }

    /// Runs `fut` to completion or until `deadline`, on this registry's runtime, from a thread of
    /// its own (a caller may itself be inside a tokio runtime: the watcher's blocking pool).
    fn block<T: Send>(
        &self,
        deadline: Instant,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, RegistryError>> + Send,
    ) -> Result<T, RegistryError> {
        let left = deadline.saturating_duration_since(Instant::now());
        let runtime = self.runtime.as_ref().expect("present until dropped");
        std::thread::scope(|s| {
            s.spawn(|| runtime.block_on(async { tokio::time::timeout(left, fut).await }))
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
        .unwrap_or_else(|_| {
            Err(RegistryError::Deadline {
                registry: self.registry.clone(),
                what: what.into(),
                left,
            })
        })
    }

    /// How requests for `op` are authorized: a bearer token the registry's token service gave
    /// (oci-client asks it), else the docker config's credentials as they are.
    async fn authorization(&self, op: RegistryOperation) -> Result<Auth, RegistryError> {
        let token = self
            .client
            .auth(&self.reference("x"), &self.auth, op)
            .await
            .map_err(|e| self.client_error(e))?;
        Ok(match (token, &self.auth) {
            (Some(token), _) => Auth::Bearer(token),
            (None, RegistryAuth::Bearer(token)) => Auth::Bearer(token.clone()),
            (None, RegistryAuth::Basic(user, password)) => {
                Auth::Basic(user.clone(), password.clone())
            }
            (None, RegistryAuth::Anonymous) => Auth::None,
        })
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        auth: &Auth,
        what: &str,
    ) -> Result<Option<reqwest::Response>, RegistryError> {
        let request = match auth {
            Auth::Bearer(token) => request.bearer_auth(token),
            Auth::Basic(user, password) => request.basic_auth(user, Some(password)),
            Auth::None => request,
        };
        let res = request.send().await.map_err(|e| self.http_error(e))?;
        match res.status() {
            s if s.is_success() => Ok(Some(res)),
            StatusCode::NOT_FOUND => Ok(None),
            status => {
                let body = read_bounded(res, 512).await.unwrap_or_default();
                Err(RegistryError::Status {
                    registry: self.registry.clone(),
                    status: status.as_u16(),
                    what: what.into(),
                    body: String::from_utf8_lossy(&body).trim().to_owned(),
                })
            }
        }
    }

    async fn read(
        &self,
        res: reqwest::Response,
        limit: u64,
        what: &str,
    ) -> Result<Vec<u8>, RegistryError> {
        read_bounded(res, limit).await.map_err(|e| match e {
            ReadError::TooLarge => RegistryError::TooLarge {
                registry: self.registry.clone(),
                what: what.into(),
                limit,
            },
            ReadError::Http(e) => self.http_error(e),
        })
    }

    /// Every tag of the repository (at most `MAX_TAGS`), page by page.
    async fn tags(&self, auth: &Auth) -> Result<Vec<String>, RegistryError> {
        #[derive(serde::Deserialize)]
        struct TagList {
            #[serde(default)]
            tags: Option<Vec<String>>,
        }
        let mut all: Vec<String> = Vec::new();
        let mut read = 0u64;
        loop {
            let mut request = self
                .http
                .get(self.url("tags/list"))
                .query(&[("n", TAG_PAGE.to_string())]);
            if let Some(last) = all.last() {
                request = request.query(&[("last", last)]);
            }
            let Some(res) = self.send(request, auth, "the tag list").await? else {
                return Ok(all); // No repository yet: nothing pushed.
            };
            let bytes = self
                .read(res, MAX_TAG_LIST_BYTES - read, "the tag list")
                .await?;
            read += bytes.len() as u64;
            let page: TagList =
                serde_json::from_slice(&bytes).map_err(|e| RegistryError::Client {
                    registry: self.registry.clone(),
                    why: format!("its tag list is not JSON: {e}"),
                })?;
            let page = page.tags.unwrap_or_default();
            let full = page.len() >= TAG_PAGE;
            let before = all.len();
            all.extend(page);
            all.truncate(MAX_TAGS);
            if !full || all.len() == before || all.len() >= MAX_TAGS {
                return Ok(all);
            }
        }
    }

    /// The manifest `reference` (a tag or a digest) names, with its digest; `None` if missing.
    async fn manifest(
        &self,
        reference: &str,
        auth: &Auth,
    ) -> Result<Option<(Vec<u8>, String)>, RegistryError> {
        let what = format!("manifest {reference}");
        let request = self
            .http
            .get(self.url(&format!("manifests/{reference}")))
            .header(reqwest::header::ACCEPT, OCI_MANIFEST);
        let Some(res) = self.send(request, auth, &what).await? else {
            return Ok(None);
        };
        let bytes = self.read(res, MAX_OCI_MANIFEST_BYTES, &what).await?;
        let digest = sha256_digest(&bytes);
        Ok(Some((bytes, digest)))
    }

    async fn blob(
        &self,
        d: &Descriptor,
        limit: u64,
        auth: &Auth,
    ) -> Result<Option<Vec<u8>>, RegistryError> {
        let what = format!("blob {}", d.digest);
        let request = self.http.get(self.url(&format!("blobs/{}", d.digest)));
        let Some(res) = self.send(request, auth, &what).await? else {
            return Ok(None);
        };
        self.read(res, limit.min(d.size), &what).await.map(Some)
    }

    /// Deletes the manifest of `generation`, head `seq` of `compat` (by digest, as the
    /// distribution API deletes; the tags naming it go with it). `false` when it was not there.
    /// The blobs stay until the registry's own garbage collection.
    pub fn delete_generation(
        &self,
        compat: &CompatId,
        seq: u64,
        generation: &GenerationId,
        deadline: Instant,
    ) -> Result<bool, RegistryError> {
        let tag = Self::generation_tag(compat, seq, generation);
        self.block(deadline, "deleting a generation", async {
            let auth = self.authorization(RegistryOperation::Push).await?;
            let Some((_, digest)) = self.manifest(&tag, &auth).await? else {
                return Ok(false);
            };
            let what = format!("deleting manifest {digest} ({tag})");
            let request = self.http.delete(self.url(&format!("manifests/{digest}")));
            Ok(self.send(request, &auth, &what).await?.is_some())
        })
    }
}

/// How a request is authorized.
#[derive(Clone)]
enum Auth {
    None,
    Bearer(String),
    Basic(String, String),
}

enum ReadError {
    TooLarge,
    Http(reqwest::Error),
}

/// The body of `res`, refused once it passes `limit` bytes (before it is read whole when the
/// registry says its length).
async fn read_bounded(mut res: reqwest::Response, limit: u64) -> Result<Vec<u8>, ReadError> {
    if res.content_length().is_some_and(|len| len > limit) {
        return Err(ReadError::TooLarge);
    }
    let mut out = Vec::new();
    while let Some(chunk) = res.chunk().await.map_err(ReadError::Http)? {
        if (out.len() + chunk.len()) as u64 > limit {
            return Err(ReadError::TooLarge);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}
