//! A small scenario harness: a store, a policy and the default options, so tests read like
//! "publish this root, install into that one".

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use jitship::catalog::KeyLayout;
use jitship::facts::Facts;
use jitship::generation::Producer;
use jitship::generation::{CompatId, GenerationId};
use jitship::install::{InstallOptions, InstallReport};
use jitship::policy::native::NativeRules;
use jitship::publish::{PublishError, PublishOptions, PublishOutcome, PublishReport};
use jitship::store::Store;
use jitship::trust::{PublishTrust, TrustPolicy};

pub struct Scenario {
    pub store: Arc<dyn Store>,
    pub layout: KeyLayout,
    pub policy: Arc<NativeRules>,
    pub facts: Facts,
    pub pack_size: u64,
}

impl Scenario {
    pub fn new(store: Arc<dyn Store>, kind: &str) -> Self {
        let mut facts = Facts::new();
        facts.set("gpu.name", "NVIDIA H100 80GB HBM3");
        facts.set("python.version", "3.12.3");
        Self {
            store,
            layout: KeyLayout::new("jitship").unwrap(),
            policy: Arc::new(NativeRules::new(kind)),
            facts,
            pack_size: 1 << 20,
        }
    }

    /// The compat id this scenario's facts give under its policy.
    pub fn compat_id(&self) -> CompatId {
        use jitship::policy::CachePolicy;
        let key = self.policy.compat_key(&self.facts).expect("compat key");
        CompatId::new(&self.policy.info().cache_kind, &key)
    }

    pub fn publish_opts(&self, pod: &str) -> PublishOptions {
        publish_options(&self.facts, self.pack_size, pod)
    }

    pub fn publish(&self, root: &Path) -> Result<PublishReport, PublishError> {
        self.publish_trusting(root, PublishTrust::default())
    }

    /// A publish with `trust` (`PublishTrust::new` for what the CLI builds from a signing key
    /// and the configured trust).
    pub fn publish_trusting(
        &self,
        root: &Path,
        trust: PublishTrust,
    ) -> Result<PublishReport, PublishError> {
        let mut opts = self.publish_opts("pod-a");
        opts.trust = trust;
        jitship::publish::publish(
            self.store.as_ref(),
            &self.layout,
            self.policy.as_ref(),
            root,
            &opts,
            None,
        )
    }

    pub fn install(&self, root: &Path) -> InstallReport {
        self.install_within(root, Duration::from_secs(60))
    }

    /// An install that judges heads by `trust`.
    pub fn install_trusting(&self, root: &Path, trust: TrustPolicy) -> InstallReport {
        let opts = InstallOptions {
            trust: Arc::new(trust),
            deadline: Duration::from_secs(600),
            ..InstallOptions::default()
        };
        jitship::install::install(
            self.store.clone(),
            &self.layout,
            self.policy.clone(),
            root,
            &self.facts,
            &opts,
        )
    }

    /// Installs within `deadline` and returns once the install's job has ended too, also one the
    /// install gave up waiting for: what a test sees afterwards is final, with no sleep to guess
    /// how long an abandoned job takes to notice.
    pub fn install_within(&self, root: &Path, deadline: Duration) -> InstallReport {
        let (ended, job_ended) = std::sync::mpsc::channel();
        let opts = InstallOptions {
            deadline,
            job_ended: Some(ended),
            ..InstallOptions::default()
        };
        let report = jitship::install::install(
            self.store.clone(),
            &self.layout,
            self.policy.clone(),
            root,
            &self.facts,
            &opts,
        );
        job_ended
            .recv_timeout(Duration::from_secs(120))
            .expect("the install's job ended within 120 s of the install");
        report
    }
}

/// The options every test publishes with unless it says otherwise (the one place their
/// defaults live): producer `test-host`/`pod`, 16 head attempts, no trust, no registry.
pub fn publish_options(facts: &Facts, pack_size: u64, pod: &str) -> PublishOptions {
    PublishOptions {
        pack_size,
        producer: Producer {
            host: "test-host".into(),
            pod: Some(pod.into()),
            jitship_version: "test".into(),
        },
        facts: facts.clone(),
        max_head_attempts: 16,
        trust: Default::default(),
        interrupt: Default::default(),
        registry: None,
    }
}

/// The generation and head seq of a publish that wrote one (panics on any other outcome).
pub fn published(r: &PublishReport) -> (GenerationId, u64) {
    match r.outcome {
        PublishOutcome::Published { generation, seq } => (generation, seq),
        ref other => panic!("expected a new generation, got {other:?}"),
    }
}
