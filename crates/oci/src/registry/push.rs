//! Pushing to the registry: a generation's blobs and its tagged manifest, and the store a
//! publish writes through so each pack is pushed while the publisher still holds its bytes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use oci_client::RegistryOperation;

use super::Registry;
use crate::{BakeOutcome, BakedGeneration, BlobSink, Descriptor, OCI_MANIFEST, OciError};
use jitship_catalog::KeyLayout;
use jitship_generation::CompatId;
use jitship_store::{Capabilities, Fetched, Store, StoreResult, TierStats, ValueClass};
use jitship_trust::TrustPolicy;

impl Registry {
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
        let Some(g) = crate::newest_whole(store, layout, trust, compat, pushed)? else {
            return Ok(None);
        };
        let tag = Self::generation_tag(compat, g.head.seq, &g.head.generation);
        let mut sink = PushSink {
            registry: self,
            deadline,
            authorized: false,
        };
        let (bytes, descriptor, mut baked) = crate::write_artifact(&mut sink, layout, &g)?;
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
        let mut walk = jitship_catalog::HeadWalk::new(store, layout, compat)?;
        let Some((head, _)) = crate::next_admitted_head(&mut walk, layout, trust)? else {
            return Ok(None);
        };
        let tag = Self::generation_tag(compat, head.seq, &head.generation);
        let found = self.block(deadline, "reading a manifest", async {
            let auth = self.authorization(RegistryOperation::Pull).await?;
            self.manifest(&tag, &auth).await
        })?;
        let Some(oci) = found
            .and_then(|(bytes, _)| serde_json::from_slice::<crate::ImageManifest>(&bytes).ok())
        else {
            return Ok(None);
        };
        let noted = |key: &str| oci.annotations.get(&crate::annotation(key));
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
        let result = sink.put_blob(crate::PACK_MEDIA_TYPE, value);
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
