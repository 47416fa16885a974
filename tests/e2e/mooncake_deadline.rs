//! `install --deadline` is the whole process's: from its start to its exit, connecting to the
//! store and cleanup included, within the deadline plus the documented margin
//! (`jitship help install`: 2 s), several at once on a loaded machine.

use std::net::TcpListener;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use jitship_tests::mooncake::cluster;
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(3);
/// What `jitship help install` promises past the deadline (exit code 15).
const MARGIN: Duration = Duration::from_secs(2);
/// Installs at once: the load an init-container rollout puts on a node.
const INSTALLS: usize = 4;

#[test]
#[ignore = "needs the Mooncake test cluster: tests/cluster/cluster.sh run -- cargo test -p jitship-tests --test e2e -- --ignored mooncake"]
fn installs_against_a_mooncake_master_that_never_answers_exit_within_the_deadline_plus_the_margin()
{
    let c = cluster("mooncake_deadline");
    // A master that never answers: the kernel accepts connections into the backlog of a listener
    // nobody accepts from or reads, so the client's probe passes and its setup waits.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("jitship.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nbackend = \"mooncake\"\n[store.mooncake]\nlibrary = {:?}\nmaster = {:?}\n\
             metadata_server = {:?}\nlocal_hostname = \"127.0.0.1\"\n",
            c.library.display().to_string(),
            silent.local_addr().unwrap().to_string(),
            c.metadata,
        ),
    )
    .unwrap();

    let spawn = |i: usize| -> (Instant, Child) {
        let root = tmp.path().join(format!("root{i}"));
        // Taken before the process exists: what is measured from it bounds the process's life.
        let spawned = Instant::now();
        let child = jitship_tests::cli::jitship()
            .args(["install", "--config"])
            .arg(&config)
            .arg("--cache")
            .arg(format!("kernels:native={}", root.display()))
            .args(["--fact", "test.tag=deadline", "--deadline"])
            .arg(format!("{}s", DEADLINE.as_secs()))
            .arg("--json")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run jitship-e2e");
        (spawned, child)
    };
    let children: Vec<(Instant, Child)> = (0..INSTALLS).map(spawn).collect();
    for (i, (spawned, child)) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let took = spawned.elapsed();
        eprintln!(
            "install {i}: exit {:?} {took:?} after its start",
            out.status.code()
        );
        let shown = format!(
            "install {i}: exit {:?} after {took:?}\nstdout: {}\nstderr: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(15), "{shown}");
        let doc: Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {shown}"));
        let result = &doc["results"][0];
        assert_eq!(result["outcome"], "deadline", "{shown}");
        assert!(
            result["detail"].as_str().unwrap().contains("deadline"),
            "{shown}"
        );
        assert!(
            took < DEADLINE + MARGIN,
            "past the deadline plus the margin: {shown}"
        );
        assert!(
            !tmp.path().join(format!("root{i}")).exists(),
            "the root was left as it was: {shown}"
        );
    }
    drop(silent);
}
