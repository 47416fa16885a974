//! Where the test cluster is (`tests/cluster/cluster.sh run -- ...` sets the variables) and how
//! tests drive it. A test that needs the cluster is `#[ignore]`d with that reason, and fails
//! without it: it never passes having checked nothing.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use jitship::config::MooncakeConfig;

/// The test cluster, as `cluster.sh run` describes it in the environment.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// `JITSHIP_TEST_MOONCAKE_MASTER`: HOST:PORT of mooncake_master.
    pub master: String,
    /// `JITSHIP_TEST_MOONCAKE_METADATA`: the HTTP metadata server URL.
    pub metadata: String,
    /// `JITSHIP_TEST_MOONCAKE_LIBRARY`: libmooncake_store.so.
    pub library: PathBuf,
    /// `JITSHIP_TEST_MOONCAKE_CTL`: cluster.sh, for kill/restart drills.
    pub ctl: PathBuf,
    /// `JITSHIP_TEST_MOONCAKE_PYTHONPATH`: the unpacked official wheel (the `mooncake` package).
    pub pythonpath: Option<PathBuf>,
}

const VARS: [&str; 4] = [
    "JITSHIP_TEST_MOONCAKE_MASTER",
    "JITSHIP_TEST_MOONCAKE_METADATA",
    "JITSHIP_TEST_MOONCAKE_LIBRARY",
    "JITSHIP_TEST_MOONCAKE_CTL",
];

/// The cluster; panics, saying how to run the test, when the environment does not describe one.
pub fn cluster(test: &str) -> Cluster {
    let get = |v: &str| std::env::var(v).ok().filter(|s| !s.is_empty());
    let missing: Vec<&str> = VARS.iter().copied().filter(|v| get(v).is_none()).collect();
    assert!(
        missing.is_empty(),
        "{test}: no Mooncake test cluster ({} unset); run it inside the cluster: \
         `tests/cluster/cluster.sh install`, then `tests/cluster/cluster.sh run -- cargo test \
         -p jitship-tests --test e2e -- --ignored mooncake --skip mooncake_drills::` (the drills \
         restart the master: they run alone)",
        missing.join(", ")
    );
    let v = |name: &str| get(name).unwrap_or_default();
    Cluster {
        master: v(VARS[0]),
        metadata: v(VARS[1]),
        library: PathBuf::from(v(VARS[2])),
        ctl: PathBuf::from(v(VARS[3])),
        pythonpath: get("JITSHIP_TEST_MOONCAKE_PYTHONPATH").map(PathBuf::from),
    }
}

impl Cluster {
    /// A client configuration for this cluster.
    pub fn config(&self) -> MooncakeConfig {
        MooncakeConfig {
            library: Some(self.library.clone()),
            master: self.master.clone(),
            metadata_server: self.metadata.clone(),
            local_hostname: Some("127.0.0.1".into()),
            call_timeout: Duration::from_secs(15),
            ..MooncakeConfig::default()
        }
    }

    /// Writes a jitship config file that points the CLI at this cluster.
    pub fn write_cli_config(&self, path: &std::path::Path) {
        let text = format!(
            "[store]\nbackend = \"mooncake\"\n[store.mooncake]\nlibrary = {:?}\nmaster = {:?}\nmetadata_server = {:?}\nlocal_hostname = \"127.0.0.1\"\n",
            self.library.display().to_string(),
            self.master,
            self.metadata
        );
        std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }

    /// Runs `cluster.sh ARGS` (kill-master, start-master, kill-node, start-node SIZE, wait-node...).
    pub fn ctl(&self, args: &[&str]) {
        let status = Command::new("bash").arg(&self.ctl).args(args).status();
        match status {
            Ok(s) if s.success() => {}
            other => panic!("cluster.sh {} failed: {other:?}", args.join(" ")),
        }
    }
}

/// A key prefix no other run uses (keys outlive a test in a shared cluster).
pub fn unique_prefix(test: &str) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!(
        "jitship-test/{test}/{}-{}",
        std::process::id(),
        t.as_nanos()
    )
}

/// Publishing and installing one cache root the way the CLI will, with the native policy.
pub mod flow {
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    use jitship::catalog::KeyLayout;
    use jitship::facts::Facts;
    use jitship::install::{self, InstallOptions, InstallReport};
    use jitship::policy::native::NativeRules;
    use jitship::publish::{self, PublishError, PublishOptions, PublishReport};
    use jitship::store::Store;

    /// Facts that make a compat id of their own (tests in one namespace do not meet).
    pub fn facts(tag: &str) -> Facts {
        let mut f = Facts::new();
        f.set("model.id", "test/model");
        f.set("test.tag", tag);
        f
    }

    /// The tests' publish options ([`crate::harness::publish_options`]) for pod `test-pod`.
    pub fn options(facts: &Facts, pack_size: u64) -> PublishOptions {
        crate::harness::publish_options(facts, pack_size, "test-pod")
    }

    pub fn publish(
        store: &dyn Store,
        layout: &KeyLayout,
        root: &Path,
        facts: &Facts,
        pack_size: u64,
    ) -> Result<PublishReport, PublishError> {
        publish::publish(
            store,
            layout,
            &NativeRules::new("triton"),
            root,
            &options(facts, pack_size),
            None,
        )
    }

    /// [`publish`], then the push to the durable registry tier `registry`.
    pub fn publish_to_registry(
        store: &dyn Store,
        layout: &KeyLayout,
        root: &Path,
        facts: &Facts,
        pack_size: u64,
        registry: &Arc<jitship::oci::Registry>,
    ) -> Result<PublishReport, PublishError> {
        let opts = PublishOptions {
            registry: Some(registry.clone()),
            ..options(facts, pack_size)
        };
        publish::publish(
            store,
            layout,
            &NativeRules::new("triton"),
            root,
            &opts,
            None,
        )
    }

    pub fn install(
        store: Arc<dyn Store>,
        layout: &KeyLayout,
        root: &Path,
        facts: &Facts,
        deadline: Duration,
    ) -> InstallReport {
        install_with_registry(store, layout, root, facts, deadline, None)
    }

    /// [`install`] with the durable registry tier `registry` behind `store`.
    pub fn install_with_registry(
        store: Arc<dyn Store>,
        layout: &KeyLayout,
        root: &Path,
        facts: &Facts,
        deadline: Duration,
        registry: Option<Arc<jitship::oci::Registry>>,
    ) -> InstallReport {
        let opts = InstallOptions {
            deadline,
            registry,
            ..InstallOptions::default()
        };
        install::install(
            store,
            layout,
            Arc::new(NativeRules::new("triton")),
            root,
            facts,
            &opts,
        )
    }
}
