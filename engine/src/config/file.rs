//! The config file's schema: what a TOML file may say, nothing the command line or resolving adds
//! (those live on [`Config`](super::Config), which reads and writes through this).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{
    CacheConfig, Engine, GatherConfig, InstallConfig, PolicyConfig, PublishConfig, RetentionConfig,
    StoreConfig, TrustConfig, WatchConfig,
};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConfigFile {
    pub store: StoreConfig,
    /// One entry per cache root.
    #[serde(rename = "cache")]
    pub caches: Vec<CacheConfig>,
    /// Facts that override (or add to) what jitship gathers, for every cache (a `[[cache]]`'s own
    /// `facts` win over these for that cache).
    pub facts: BTreeMap<String, String>,
    /// Where and how jitship gathers facts (the `[facts]` table stays a plain overrides map).
    pub gather: GatherConfig,
    pub publish: PublishConfig,
    pub install: InstallConfig,
    pub policy: PolicyConfig,
    pub watch: WatchConfig,
    pub retention: RetentionConfig,
    pub trust: TrustConfig,
    /// `engine = "vllm"` (or `--engine`): the caches that engine reads, without naming each kind;
    /// an explicit `[[cache]]`/`--cache` of one of its kinds wins (`crate::engines`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<Engine>,
}
