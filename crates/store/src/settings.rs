//! The store settings (`[store]` in the config file): which backend, the namespace, and each
//! backend's own table. The engine's config composes them; this crate reads nothing else.

use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

/// A store setting out of range, with what to do about it.
#[derive(Debug, thiserror::Error)]
#[error("invalid {what} {value:?}: {hint}")]
pub struct InvalidSetting {
    pub what: &'static str,
    pub value: String,
    pub hint: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    pub backend: Backend,
    /// Prefix of every key jitship writes; separate deployments may share a store.
    pub namespace: String,
    pub local: LocalStoreConfig,
    pub mooncake: MooncakeConfig,
    /// A durable tier behind the store above (`crate::tiered`): what Mooncake evicts or a
    /// restarted master forgets is read from it and put back.
    pub durable: DurableStoreConfig,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            backend: Backend::Local,
            namespace: "jitship".into(),
            local: LocalStoreConfig::default(),
            mooncake: MooncakeConfig::default(),
            durable: DurableStoreConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Local,
    Mooncake,
}

/// Environment variable naming `libmooncake_store.so` when `store.mooncake.library` is not set.
pub const MOONCAKE_LIBRARY_ENV: &str = "MOONCAKE_STORE_LIBRARY";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MooncakeProtocol {
    Tcp,
    Rdma,
}

impl MooncakeProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Rdma => "rdma",
        }
    }
}

/// `[store.mooncake]`: how to reach a Mooncake Store cluster. jitship is a pure client (it
/// contributes no segment), and every setting is passed to Mooncake's setup call explicitly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MooncakeConfig {
    /// `libmooncake_store.so` (a Mooncake build with the C ABI, `-DWITH_STORE_C_SHARED=ON`).
    /// Unset: the path in $MOONCAKE_STORE_LIBRARY.
    pub library: Option<PathBuf>,
    /// The master's RPC address, HOST:PORT.
    pub master: String,
    /// Transfer-engine metadata: `http://HOST:PORT/metadata` (the master's HTTP metadata server),
    /// `etcd://...`, or `P2PHANDSHAKE`.
    pub metadata_server: String,
    pub protocol: MooncakeProtocol,
    /// RDMA device names (e.g. ["mlx5_0", "mlx5_1"]); empty lets Mooncake pick. Ignored for tcp.
    pub rdma_devices: Vec<String>,
    /// The name or address store nodes reach this client by. Unset: the machine's hostname.
    pub local_hostname: Option<String>,
    /// Copies of each object, on distinct store nodes.
    pub replicas: u32,
    /// The master's list of store-node segments, `http://HOST:PORT/get_all_segments` (the
    /// master's metrics port, 9003 by default). When set, copy `k` of a pack kept under several
    /// keys (`[publish] pack_replicas`) is placed on the `k`-th segment listed (sorted), so the
    /// copies sit on different store nodes and a rollout's reads spread over them. Unset, or the
    /// list unreadable: Mooncake places each copy itself, often all on one node. Only a hint: a
    /// listed name that is wrong costs nothing but the spread.
    pub segments_url: Option<String>,
    /// Soft-pinned objects survive ordinary eviction (until their pin TTL lapses).
    pub soft_pin: bool,
    /// Soft-pin the small catalog records (head records, manifests, the compat index, floors,
    /// pins and gc journals: values put as `ValueClass::Record`) even when `soft_pin` is off, so
    /// eviction takes packs first and the head chain keeps no holes while its packs live.
    pub soft_pin_catalog: bool,
    /// Hard-pinned objects are never evicted; puts then fail with "store is full".
    pub hard_pin: bool,
    /// Hard-pin the catalog records (as `soft_pin_catalog` names them): never evicted, removed
    /// only by gc, so a generation whose packs were evicted is still known and its packs come
    /// back from the durable tier (read-repair, scrub). A soft pin lasts a fixed time from the
    /// write (Mooncake #2909), so without this an old catalog is evicted with its packs. The
    /// records are small beside packs (most are kilobytes; a manifest is capped at 256 MiB).
    pub hard_pin_catalog: bool,
    /// Largest registered staging buffer (buffers are made as calls need them, sized to the
    /// values moved: a power of two from 8 MiB up to this); also the largest value jitship can
    /// put or get, so `publish.pack_size` must not exceed it.
    pub staging_buffer_size: ByteSize,
    /// Most staging buffers at once (calls in flight at once; an install holds two: the batch
    /// of packs it writes from and the one it fetches). Staging memory is at most
    /// `staging_buffers x staging_buffer_size`.
    pub staging_buffers: usize,
    /// Mooncake's own client-side buffer (setup's `local_buffer_size`).
    pub local_buffer_size: ByteSize,
    /// Bound on each store call; past it the call reports a timeout.
    #[serde(with = "humantime_serde")]
    pub call_timeout: Duration,
    /// How long a call that failed with a failure that passes by itself (the master or a store
    /// node not answering, replicas busy) is tried again, with a jittered backoff; 0: never.
    /// Not over a durable tier, which answers instead.
    #[serde(with = "humantime_serde")]
    pub retry_for: Duration,
    /// Bound on reaching the master's TCP port before setup.
    #[serde(with = "humantime_serde")]
    pub probe_timeout: Duration,
    /// Bound on Mooncake's setup call (connecting to the master and the metadata server).
    #[serde(with = "humantime_serde")]
    pub setup_timeout: Duration,
}

impl Default for MooncakeConfig {
    fn default() -> Self {
        Self {
            library: None,
            master: "127.0.0.1:50051".into(),
            metadata_server: "http://127.0.0.1:8080/metadata".into(),
            protocol: MooncakeProtocol::Tcp,
            rdma_devices: vec![],
            local_hostname: None,
            replicas: 1,
            segments_url: None,
            soft_pin: false,
            soft_pin_catalog: true,
            hard_pin: false,
            hard_pin_catalog: true,
            staging_buffer_size: ByteSize::mib(64),
            staging_buffers: 4,
            local_buffer_size: ByteSize::mib(16),
            call_timeout: Duration::from_secs(30),
            retry_for: Duration::from_secs(10),
            probe_timeout: Duration::from_secs(3),
            setup_timeout: Duration::from_secs(30),
        }
    }
}

impl MooncakeConfig {
    /// The library to load: the configured path, else $MOONCAKE_STORE_LIBRARY.
    pub fn library_path(&self) -> Result<PathBuf, InvalidSetting> {
        if let Some(p) = &self.library {
            return Ok(p.clone());
        }
        match std::env::var_os(MOONCAKE_LIBRARY_ENV) {
            Some(p) if !p.is_empty() => Ok(PathBuf::from(p)),
            _ => Err(InvalidSetting {
                what: "store.mooncake.library",
                value: String::new(),
                hint: format!(
                    "the mooncake backend needs libmooncake_store.so: set store.mooncake.library or {MOONCAKE_LIBRARY_ENV}"
                ),
            }),
        }
    }

    pub fn validate(&self) -> Result<(), InvalidSetting> {
        let invalid = |what, value: String, hint: &str| {
            Err(InvalidSetting {
                what,
                value,
                hint: hint.into(),
            })
        };
        if parse_host_port(&self.master).is_none() {
            return invalid(
                "store.mooncake.master",
                self.master.clone(),
                "expected HOST:PORT, e.g. 127.0.0.1:50051",
            );
        }
        let m = &self.metadata_server;
        let known = m == "P2PHANDSHAKE"
            || m.starts_with("http://")
            || m.starts_with("etcd://")
            || m.starts_with("redis://");
        if !known {
            return invalid(
                "store.mooncake.metadata_server",
                m.clone(),
                "expected http://HOST:PORT/metadata, etcd://HOST:PORT, redis://HOST:PORT or P2PHANDSHAKE",
            );
        }
        if self
            .rdma_devices
            .iter()
            .any(|d| d.is_empty() || d.contains(',') || d.contains(char::is_whitespace))
        {
            return invalid(
                "store.mooncake.rdma_devices",
                format!("{:?}", self.rdma_devices),
                "device names like \"mlx5_0\", without commas or spaces",
            );
        }
        if let Some(url) = &self.segments_url
            && url
                .strip_prefix("http://")
                .and_then(|rest| parse_host_port(rest.split('/').next().unwrap_or(rest)))
                .is_none()
        {
            return invalid(
                "store.mooncake.segments_url",
                url.clone(),
                "expected http://HOST:PORT/get_all_segments (the master's metrics port)",
            );
        }
        if let Some(h) = &self.local_hostname
            && (h.is_empty() || h.contains(char::is_whitespace))
        {
            return invalid(
                "store.mooncake.local_hostname",
                h.clone(),
                "a hostname or IP address",
            );
        }
        if self.replicas == 0 || self.replicas > 16 {
            return invalid(
                "store.mooncake.replicas",
                self.replicas.to_string(),
                "between 1 and 16",
            );
        }
        let size = self.staging_buffer_size.as_u64();
        if !(ByteSize::mib(1).as_u64()..=ByteSize::gib(16).as_u64()).contains(&size) {
            return invalid(
                "store.mooncake.staging_buffer_size",
                self.staging_buffer_size.to_string(),
                "between 1 MiB and 16 GiB",
            );
        }
        // An install writes one batch of packs from its staging buffer while it fetches the
        // next into another: with one buffer it would wait for itself.
        if self.staging_buffers < 2 || self.staging_buffers > 64 {
            return invalid(
                "store.mooncake.staging_buffers",
                self.staging_buffers.to_string(),
                "between 2 and 64",
            );
        }
        for (what, d) in [
            ("store.mooncake.call_timeout", self.call_timeout),
            ("store.mooncake.probe_timeout", self.probe_timeout),
            ("store.mooncake.setup_timeout", self.setup_timeout),
        ] {
            if d.is_zero() {
                return invalid(what, "0s".into(), "must be more than zero, e.g. \"10s\"");
            }
        }
        Ok(())
    }
}

/// `HOST:PORT` (a bracketed IPv6 host is fine) with a non-zero port.
pub fn parse_host_port(s: &str) -> Option<(&str, u16)> {
    let (host, port) = s.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    let valid_host = !host.is_empty() && !host.contains(char::is_whitespace) && !host.contains('/');
    valid_host.then_some((host, port))
}

/// `[store.durable]`: where generations outlive the fast tier. Unset: no durable tier. At most
/// one of `path` and `registry`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DurableStoreConfig {
    /// A local or shared directory (an NFS or object-store mount works), laid out like the local
    /// store. Publish writes it before the fast tier; install reads it when the fast tier misses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// An OCI registry repository, `HOST[:PORT]/REPOSITORY`: publish pushes each generation
    /// there as an OCI artifact once it is whole in the fast tier; install pulls from it when
    /// the fast tier has nothing to install and puts what it pulled back (the engine's
    /// `oci::registry`). Credentials come from the docker config.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registry: Option<String>,
    /// Talk to the registry over plain HTTP (a registry on loopback or a trusted network only).
    pub plain_http: bool,
    /// Bound on connecting to the registry and on each read from it.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for DurableStoreConfig {
    fn default() -> Self {
        Self {
            path: None,
            registry: None,
            plain_http: false,
            timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocalStoreConfig {
    pub path: PathBuf,
}

impl Default for LocalStoreConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("/var/lib/jitship/store"),
        }
    }
}
