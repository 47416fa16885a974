//! A real OCI registry for the durable-tier tests: Debian's `docker-registry` (the CNCF
//! distribution registry, 2.8), started on 127.0.0.1 at a port the kernel picks, storing into a
//! temporary directory, deletes enabled (gc deletes manifests). Stopped when dropped.
//!
//! `tests/run-all.sh` installs it (`apt-get install docker-registry skopeo`); without it a test
//! that needs one fails and says how to install it.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";
/// The repository the tests push to.
pub const REPOSITORY: &str = "jitship/cache";

pub struct TestRegistry {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    _dir: tempfile::TempDir,
}

impl TestRegistry {
    /// Starts a registry and waits until it says it listens (its own log line, read from its
    /// stderr), at most 30 s.
    pub fn start() -> Self {
        assert!(
            std::path::Path::new(REGISTRY_BIN).exists(),
            "{REGISTRY_BIN} is missing: install Debian's docker-registry (apt-get install \
             docker-registry skopeo; tests/run-all.sh does)"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("config.yml");
        let storage: PathBuf = dir.path().join("data");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: info\n  formatter: text\nstorage:\n  filesystem:\n    \
                 rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:0\n",
                storage.display()
            ),
        )
        .expect("write the registry config");
        let mut child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start docker-registry");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !sent && let Some(at) = line.find("listening on ") {
                    let rest = &line[at + "listening on ".len()..];
                    let addr: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
                        .collect();
                    sent = tx.send(addr).is_ok();
                }
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                panic!("docker-registry did not say it was listening within 30 s");
            }
        };
        assert!(addr.starts_with("127.0.0.1:"), "listening on {addr}");
        Self {
            child,
            addr,
            _dir: dir,
        }
    }

    /// `oci+http:127.0.0.1:PORT/jitship/cache`, as `--durable-store` takes it.
    pub fn durable_store_arg(&self) -> String {
        format!("oci+http:{}/{REPOSITORY}", self.addr)
    }

    /// `docker://127.0.0.1:PORT/jitship/cache`, as skopeo names it.
    pub fn skopeo_repo(&self) -> String {
        format!("docker://{}/{REPOSITORY}", self.addr)
    }

    /// A client of the test repository, as `--durable-store oci+http:...` opens one.
    pub fn client(&self) -> std::sync::Arc<jitship::oci::Registry> {
        let config = jitship::store::DurableStoreConfig {
            registry: Some(format!("{}/{REPOSITORY}", self.addr)),
            plain_http: true,
            ..Default::default()
        };
        std::sync::Arc::new(jitship::oci::Registry::open(&config).expect("open the test registry"))
    }

    /// Stops the registry now (a drill of a registry that went away).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The repository's tags, listed by skopeo (a standard OCI tool, not jitship).
pub fn skopeo_tags(registry: &TestRegistry) -> Vec<String> {
    let out = Command::new("skopeo")
        .args(["list-tags", "--tls-verify=false", &registry.skopeo_repo()])
        .output()
        .expect("run skopeo (apt-get install skopeo)");
    assert!(
        out.status.success(),
        "skopeo list-tags: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("skopeo JSON");
    v["Tags"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| t.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}
