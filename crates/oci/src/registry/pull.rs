//! Pulling from the registry: the newest tag of a compat id that the trust admits and that
//! verifies, put into the fast tier (read-repair); every tag, manifest and blob read as hostile.

use std::time::Instant;

use oci_client::RegistryOperation;

use super::{Auth, CONCURRENT_PULLS, MAX_CANDIDATES, Registry, RegistryPull};
use crate::{BlobSource, Descriptor, OciError, sha256_digest};
use jitship_catalog::KeyLayout;
use jitship_generation::CompatId;
use jitship_store::Store;
use jitship_trust::TrustPolicy;

impl Registry {
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
                Some((jitship_catalog::walk::parse_seq(seq)?, t))
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
            let head = match crate::read_artifact_head(&source, &bytes, &digest) {
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
            let verified = match crate::verify_artifact(
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
            pull.served = Some(crate::put_generation(
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
        if crate::sha256_hex(&d.digest).is_none() {
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
