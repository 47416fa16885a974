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

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use reqwest::StatusCode;

use super::{
    BakeOutcome, BakedGeneration, BlobSink, BlobSource, Descriptor, MAX_OCI_MANIFEST_BYTES,
    OCI_MANIFEST, OciError, sha256_digest,
};
use crate::catalog::KeyLayout;
use crate::generation::{CompatId, GenerationId};
use crate::store::{
    Capabilities, DurableStoreConfig, Fetched, Store, StoreResult, TierStats, ValueClass,
};
use crate::trust::TrustPolicy;

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

    fn client_error(&self, e: impl std::fmt::Display) -> RegistryError {
        let why = e.to_string();
        // Connection failures are the registry being away, not refusing.
        if why.contains("connect") || why.contains("timed out") || why.contains("error sending") {
            RegistryError::Unreachable {
                registry: self.registry.clone(),
                why,
            }
        } else {
            RegistryError::Client {
                registry: self.registry.clone(),
                why,
            }
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
        let res = request.send().await.map_err(|e| self.client_error(e))?;
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
            ReadError::Http(e) => self.client_error(e),
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

    /// Pushes the newest generation of `compat` that `trust` admits and that is whole in `store`
    /// (what its publish just wrote, usually): every blob the registry lacks, then the manifest
    /// tagged `<compat>.<seq>`, then `<compat>`. `None` when the store holds no such generation;
    /// `already-present` when its tag is there with the same manifest.
    ///
    /// `pushed` are packs already in the registry (pushed as the publish uploaded them, see
    /// [`RegistryTee`]): they are not read back from the store, where the fast tier may have
    /// evicted them already.
    pub fn push_newest(
        &self,
        store: &dyn Store,
        layout: &KeyLayout,
        trust: &TrustPolicy,
        compat: &CompatId,
        deadline: Instant,
        pushed: &HashMap<String, Descriptor>,
    ) -> Result<Option<BakedGeneration>, OciError> {
        if let Some(there) = self.already_pushed(store, layout, trust, compat, deadline)? {
            return Ok(Some(there));
        }
        let Some(g) = super::newest_whole(store, layout, trust, compat, pushed)? else {
            return Ok(None);
        };
        let tag = Self::generation_tag(compat, g.head.seq, &g.head.generation);
        let mut sink = PushSink {
            registry: self,
            deadline,
            authorized: false,
        };
        let (bytes, descriptor, mut baked) = super::write_artifact(&mut sink, layout, &g)?;
        let pushed = self.block(deadline, "pushing a generation's manifest", async {
            let auth = self.authorization(RegistryOperation::Push).await?;
            if let Some((_, digest)) = self.manifest(&tag, &auth).await?
                && digest == descriptor.digest
            {
                return Ok(false);
            }
            for t in [tag.as_str(), &compat.to_string()] {
                self.client
                    .push_manifest_raw(
                        &self.reference(t),
                        bytes.clone(),
                        reqwest::header::HeaderValue::from_static(OCI_MANIFEST),
                    )
                    .await
                    .map_err(|e| self.client_error(e))?;
            }
            Ok(true)
        })?;
        baked.outcome = if pushed {
            BakeOutcome::Pushed {
                to: format!("{}:{tag}", self.describe()),
            }
        } else {
            BakeOutcome::AlreadyPresent
        };
        Ok(Some(baked))
    }

    /// The newest head of `compat` the trust admits, when the registry already has its
    /// generation under its tag: found without reading a pack (a watcher pushes after every
    /// publish, most of which leave the head as it was).
    fn already_pushed(
        &self,
        store: &dyn Store,
        layout: &KeyLayout,
        trust: &TrustPolicy,
        compat: &CompatId,
        deadline: Instant,
    ) -> Result<Option<BakedGeneration>, OciError> {
        let mut walk = crate::catalog::HeadWalk::new(store, layout, compat)?;
        let Some((head, _)) = super::next_admitted_head(&mut walk, layout, trust)? else {
            return Ok(None);
        };
        let tag = Self::generation_tag(compat, head.seq, &head.generation);
        let found = self.block(deadline, "reading a manifest", async {
            let auth = self.authorization(RegistryOperation::Pull).await?;
            self.manifest(&tag, &auth).await
        })?;
        let Some(oci) = found
            .and_then(|(bytes, _)| serde_json::from_slice::<super::ImageManifest>(&bytes).ok())
        else {
            return Ok(None);
        };
        let noted = |key: &str| oci.annotations.get(&super::annotation(key));
        if noted("generation") != Some(&head.generation.to_string()) {
            return Ok(None);
        }
        let packs = &oci.layers[..oci.layers.len().saturating_sub(1)];
        Ok(Some(BakedGeneration {
            cache_kind: noted("cache-kind").cloned().unwrap_or_default(),
            compat_id: *compat,
            generation: head.generation,
            seq: head.seq,
            packs: packs.len(),
            bytes: packs.iter().map(|l| l.size).sum(),
            outcome: BakeOutcome::AlreadyPresent,
        }))
    }

    /// The newest generation of `compat` in the registry that `trust` admits and that verifies,
    /// put into `store` (read-repair: the fast tier has it again for the next reader). Ends by
    /// `deadline`; every failure is in the answer, never a panic or a wait past it.
    pub fn pull_into(
        &self,
        store: &dyn Store,
        layout: &KeyLayout,
        trust: &TrustPolicy,
        compat: &CompatId,
        deadline: Instant,
    ) -> RegistryPull {
        let started = Instant::now();
        let mut pull = RegistryPull {
            registry: self.describe(),
            ..RegistryPull::default()
        };
        if let Err(e) = self.pull_newest(store, layout, trust, compat, deadline, &mut pull) {
            pull.error = Some(e.to_string());
        }
        pull.duration_ms = started.elapsed().as_millis() as u64;
        pull
    }

    fn pull_newest(
        &self,
        store: &dyn Store,
        layout: &KeyLayout,
        trust: &TrustPolicy,
        compat: &CompatId,
        deadline: Instant,
        pull: &mut RegistryPull,
    ) -> Result<(), OciError> {
        let auth = self.block(deadline, "authorizing", async {
            self.authorization(RegistryOperation::Pull).await
        })?;
        let tags = self.block(deadline, "listing tags", self.tags(&auth))?;
        let prefix = format!("{compat}.");
        let mut candidates: Vec<(u64, String)> = tags
            .into_iter()
            .filter_map(|t| {
                let (seq, _) = t.strip_prefix(&prefix)?.split_once('.')?;
                // The seqs heads may have (`catalog::walk::parse_seq`): a tag at 2^64-1 or with
                // leading zeros is no generation's, and never pushes a real one out of the
                // candidates (issue 39: 64 forged tags at huge seqs did).
                Some((crate::catalog::walk::parse_seq(seq)?, t))
            })
            .collect();
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        if candidates.is_empty() {
            pull.error = Some(format!(
                "no generation of compat id {compat} is tagged there"
            ));
            return Ok(());
        }
        let source = PullSource {
            registry: self,
            deadline,
            auth: auth.clone(),
        };
        for (_, tag) in candidates.into_iter().take(MAX_CANDIDATES) {
            let pass = |pull: &mut RegistryPull, why: String| {
                pull.passed_over.push(format!("{tag}: {why}"))
            };
            let Some((bytes, digest)) =
                self.block(deadline, "reading a manifest", self.manifest(&tag, &auth))?
            else {
                pass(pull, "gone since the tag list was read".into());
                continue;
            };
            let head = match super::read_artifact_head(&source, &bytes, &digest) {
                Ok(h) => h,
                Err(OciError::Registry(e)) => return Err(e.into()),
                Err(e) => {
                    pass(pull, e.to_string());
                    continue;
                }
            };
            if head.head.compat_id != *compat
                || Self::generation_tag(compat, head.head.seq, &head.head.generation) != tag
            {
                pass(
                    pull,
                    format!(
                        "its head is seq {} of compat id {} (generation {}), not this tag's",
                        head.head.seq, head.head.compat_id, head.head.generation
                    ),
                );
                continue;
            }
            let signer = trust.judge(layout.namespace(), &head.head);
            if !trust.admits(&signer, &format_args!("{} tag {tag}", self.describe())) {
                pass(pull, format!("not admitted by the trust ({signer})"));
                continue;
            }
            let verified = match super::verify_artifact(
                &source,
                head,
                layout.namespace(),
                store.max_value_size(),
                true,
            ) {
                Ok(v) => v,
                Err(OciError::Registry(e)) => return Err(e.into()),
                Err(e) => {
                    pass(pull, e.to_string());
                    continue;
                }
            };
            pull.served = Some(super::put_generation(
                store, layout, trust, &source, verified,
            )?);
            pull.tag = Some(tag);
            return Ok(());
        }
        pull.error = Some(format!(
            "no tag of compat id {compat} held a generation this install takes"
        ));
        Ok(())
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

/// The store a publish writes through when it has a registry tier: every pack it uploads is
/// pushed to the registry as a blob right after the store took it, while the publisher holds its
/// bytes. Under memory pressure Mooncake can evict a pack before the publish ends, and the
/// generation's push, which would read it back, would find nothing whole to push: exactly when a
/// durable copy matters. A blob push that fails is remembered, not raised (the store has the
/// pack; the publish goes on), and the tee pushes no more after it.
pub struct RegistryTee<'a> {
    inner: &'a dyn Store,
    registry: &'a Registry,
    deadline: Instant,
    state: Mutex<TeeState>,
}

#[derive(Default)]
struct TeeState {
    /// Pack key -> its blob in the registry.
    pushed: HashMap<String, Descriptor>,
    failed: Option<String>,
}

impl<'a> RegistryTee<'a> {
    pub fn new(inner: &'a dyn Store, registry: &'a Registry, deadline: Instant) -> Self {
        Self {
            inner,
            registry,
            deadline,
            state: Mutex::default(),
        }
    }

    /// Packs pushed so far, by store key.
    pub fn pushed(&self) -> HashMap<String, Descriptor> {
        self.lock().pushed.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TeeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, key: &str, value: &[u8], class: ValueClass) {
        if class != ValueClass::Bulk || self.lock().failed.is_some() {
            return;
        }
        let mut sink = PushSink {
            registry: self.registry,
            deadline: self.deadline,
            authorized: false,
        };
        let result = sink.put_blob(super::PACK_MEDIA_TYPE, value);
        let mut state = self.lock();
        match result {
            Ok(d) => {
                state.pushed.insert(key.to_owned(), d);
            }
            Err(e) => state.failed = Some(e.to_string()),
        }
    }
}

impl std::fmt::Debug for RegistryTee<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RegistryTee({:?} -> {:?})", self.inner, self.registry)
    }
}

impl Store for RegistryTee<'_> {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn max_value_size(&self) -> u64 {
        self.inner.max_value_size()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn put(&self, key: &str, value: &[u8], class: ValueClass) -> StoreResult<()> {
        self.inner.put(key, value, class)?;
        self.push(key, value, class);
        Ok(())
    }
    fn get(&self, key: &str) -> StoreResult<Option<Vec<u8>>> {
        self.inner.get(key)
    }
    fn get_capped(&self, key: &str, limit: u64) -> StoreResult<Option<Vec<u8>>> {
        self.inner.get_capped(key, limit)
    }
    fn put_filled(
        &self,
        key: &str,
        len: usize,
        class: ValueClass,
        fill: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> StoreResult<bool> {
        if class != ValueClass::Bulk || self.lock().failed.is_some() {
            return self.inner.put_filled(key, len, class, fill);
        }
        // The bytes are kept for the push: one pack per upload thread.
        let mut copy = Vec::new();
        let stored = self.inner.put_filled(key, len, class, &mut |buf| {
            let filled = fill(buf);
            if filled {
                copy = buf.to_vec();
            }
            filled
        })?;
        if stored {
            self.push(key, &copy, class);
        }
        Ok(stored)
    }
    fn exists(&self, key: &str) -> StoreResult<bool> {
        self.inner.exists(key)
    }
    fn remove(&self, key: &str) -> StoreResult<bool> {
        self.inner.remove(key)
    }
    fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
        self.inner.list(prefix)
    }
    fn modified(&self, key: &str) -> StoreResult<Option<std::time::SystemTime>> {
        self.inner.modified(key)
    }
    fn size(&self, key: &str) -> StoreResult<Option<u64>> {
        self.inner.size(key)
    }
    fn put_batch(&self, items: &[(&str, &[u8])], class: ValueClass) -> Vec<StoreResult<()>> {
        let results = self.inner.put_batch(items, class);
        for ((key, value), r) in items.iter().zip(&results) {
            if r.is_ok() {
                self.push(key, value, class);
            }
        }
        results
    }
    fn get_batch(&self, keys: &[&str]) -> Vec<StoreResult<Option<Vec<u8>>>> {
        self.inner.get_batch(keys)
    }
    fn exists_batch(&self, keys: &[&str]) -> Vec<StoreResult<bool>> {
        self.inner.exists_batch(keys)
    }
    fn get_sized_batch(&self, items: &[(&str, u64)]) -> Vec<StoreResult<Option<Fetched>>> {
        self.inner.get_sized_batch(items)
    }
    fn tier_stats(&self) -> Option<TierStats> {
        self.inner.tier_stats()
    }
    fn tiers(&self) -> Option<(&dyn Store, &dyn Store)> {
        self.inner.tiers()
    }
}

/// Blobs pushed to the registry as `write_artifact` produces them (each only if missing).
struct PushSink<'a> {
    registry: &'a Registry,
    deadline: Instant,
    authorized: bool,
}

impl BlobSink for PushSink<'_> {
    fn put_blob(&mut self, media_type: &str, bytes: &[u8]) -> Result<Descriptor, OciError> {
        let d = Descriptor::of(media_type, bytes);
        let r = self.registry;
        let reference = r.reference("x");
        let first = !self.authorized;
        r.block(self.deadline, "pushing a blob", async {
            if first {
                r.client
                    .auth(&reference, &r.auth, RegistryOperation::Push)
                    .await
                    .map_err(|e| r.client_error(e))?;
            }
            let there = r
                .client
                .blob_exists(&reference, &d.digest)
                .await
                .map_err(|e| r.client_error(e))?;
            if !there {
                r.client
                    .push_blob(&reference, bytes.to_vec(), &d.digest)
                    .await
                    .map_err(|e| r.client_error(e))?;
            }
            Ok(())
        })?;
        self.authorized = true;
        Ok(d)
    }
}

/// Blobs read from the registry, each checked against its descriptor.
struct PullSource<'a> {
    registry: &'a Registry,
    deadline: Instant,
    auth: Auth,
}

impl BlobSource for PullSource<'_> {
    fn describe(&self) -> String {
        self.registry.describe()
    }

    fn read_blob(&self, d: &Descriptor, limit: u64) -> Result<Vec<u8>, OciError> {
        self.read_blobs(std::slice::from_ref(d), limit)
            .map(|mut v| v.pop().expect("one blob asked, one read"))
    }

    /// Up to [`CONCURRENT_PULLS`] at once, as standard clients pull layers.
    fn read_blobs(&self, ds: &[Descriptor], limit: u64) -> Result<Vec<Vec<u8>>, OciError> {
        use futures_util::{StreamExt, TryStreamExt};
        for d in ds {
            self.check(d, limit)?;
        }
        let r = self.registry;
        let reads: Vec<_> = ds.iter().map(|d| r.blob(d, limit, &self.auth)).collect();
        let blobs = r.block(
            self.deadline,
            "reading blobs",
            futures_util::stream::iter(reads)
                .buffered(CONCURRENT_PULLS)
                .try_collect::<Vec<Option<Vec<u8>>>>(),
        )?;
        ds.iter()
            .zip(blobs)
            .map(|(d, bytes)| self.checked(d, bytes))
            .collect()
    }
}

impl PullSource<'_> {
    fn refuse(&self, why: String) -> OciError {
        OciError::Refused {
            from: self.describe(),
            why,
        }
    }

    /// `d` may be read: a sha256 digest, a size within `limit`.
    fn check(&self, d: &Descriptor, limit: u64) -> Result<(), OciError> {
        let refuse = |why: String| self.refuse(why);
        if super::sha256_hex(&d.digest).is_none() {
            return Err(refuse(format!("{:?} is not a sha256 digest", d.digest)));
        }
        if d.size > limit {
            return Err(refuse(format!(
                "blob {} claims {} bytes, over the {limit}-byte bound for a {}",
                d.digest, d.size, d.media_type
            )));
        }
        Ok(())
    }

    /// The blob `d` names, as read: there, its size, its sha256.
    fn checked(&self, d: &Descriptor, bytes: Option<Vec<u8>>) -> Result<Vec<u8>, OciError> {
        let refuse = |why: String| self.refuse(why);
        let bytes = bytes.ok_or_else(|| refuse(format!("blob {} is missing", d.digest)))?;
        if bytes.len() as u64 != d.size {
            return Err(refuse(format!(
                "blob {} is {} bytes, its descriptor says {}",
                d.digest,
                bytes.len(),
                d.size
            )));
        }
        if sha256_digest(&bytes) != d.digest {
            return Err(refuse(format!(
                "blob {} does not hash to its digest (altered)",
                d.digest
            )));
        }
        Ok(bytes)
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
