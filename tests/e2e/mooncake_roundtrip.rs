//! Publish -> install through a real Mooncake cluster: the installed tree is the published one
//! (content, mode, mtime), a republish of an unchanged tree uploads nothing, a grown tree uploads
//! only what is new, and a second install finds everything current.

use std::sync::Arc;
use std::time::Duration;

use jitship::catalog::KeyLayout;
use jitship::install::InstallOutcome;
use jitship::publish::PublishOutcome;
use jitship::store::{MooncakeStore, Store};
use jitship_tests::fixtures::{digest, large_files_tree, triton_tree};
use jitship_tests::mooncake::{cluster, flow, unique_prefix};

#[test]
#[ignore = "needs the Mooncake test cluster: tests/cluster/cluster.sh run -- cargo test -p jitship-tests --test e2e -- --ignored mooncake"]
fn publish_then_install_through_mooncake_round_trips_the_tree() {
    let c = cluster("publish_then_install_through_mooncake_round_trips_the_tree");
    let store: Arc<dyn Store> =
        Arc::new(MooncakeStore::connect(&c.config()).unwrap_or_else(|e| panic!("connect: {e}")));
    let layout = KeyLayout::new(&unique_prefix("roundtrip")).unwrap();
    let facts = flow::facts("roundtrip");
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    triton_tree(&src, 150, 1);
    // Files larger than a pack are split across packs.
    large_files_tree(&src, 2, 5 * 1024 * 1024 + 17, 2);
    let pack = 4 * 1024 * 1024;

    let first = flow::publish(store.as_ref(), &layout, &src, &facts, pack)
        .unwrap_or_else(|e| panic!("publish: {e}"));
    let PublishOutcome::Published { seq: 1, .. } = first.outcome else {
        panic!("first publish: {:?}", first.outcome)
    };
    assert!(
        first.bytes_uploaded > 10 * 1024 * 1024 && first.packs_uploaded >= 3,
        "{first:?}"
    );

    let dst = tmp.path().join("dst");
    let report = flow::install(
        store.clone(),
        &layout,
        &dst,
        &facts,
        Duration::from_secs(60),
    );
    assert_eq!(
        report.outcome,
        InstallOutcome::Installed,
        "{}",
        report.detail
    );
    assert_eq!(
        digest(&src),
        digest(&dst),
        "installed tree differs from the published one"
    );

    let again = flow::publish(store.as_ref(), &layout, &src, &facts, pack).unwrap();
    assert!(
        matches!(again.outcome, PublishOutcome::Unchanged { .. }),
        "{:?}",
        again.outcome
    );
    assert_eq!(again.bytes_uploaded, 0);

    triton_tree(&src.join("more"), 20, 3);
    let grown = flow::publish(store.as_ref(), &layout, &src, &facts, pack).unwrap();
    let PublishOutcome::Published { seq: 2, .. } = grown.outcome else {
        panic!("grown publish: {:?}", grown.outcome)
    };
    assert!(
        grown.bytes_uploaded < 2 * 1024 * 1024,
        "only the new files: {} bytes",
        grown.bytes_uploaded
    );

    let report = flow::install(
        store.clone(),
        &layout,
        &dst,
        &facts,
        Duration::from_secs(60),
    );
    assert_eq!(
        report.outcome,
        InstallOutcome::Installed,
        "{}",
        report.detail
    );
    assert_eq!(
        report.files_installed,
        20 * 8,
        "only the new files are fetched"
    );
    assert_eq!(digest(&src), digest(&dst));
    let report = flow::install(store, &layout, &dst, &facts, Duration::from_secs(60));
    assert_eq!(
        report.outcome,
        InstallOutcome::AlreadyCurrent,
        "{}",
        report.detail
    );
}

/// The Mooncake client of a CLI process puts an entry for itself in the metadata server
/// (`mooncake/ram/<host>:<port>`) and its `destroy` removes it. The CLI ends with `_exit` a short
/// grace after its teardown begins (`cli::exit::end`); an entry left behind would pile up
/// in the master with every command run. Each command here must leave none: publish, an install
/// that writes files, one that finds them current, `ls`, and a watcher stopped by SIGTERM as soon
/// as its entry shows (during its start). The watcher's entry is seen while it runs (a watcher
/// holds its client until told to stop), so the check is of something real.
#[test]
#[ignore = "needs the Mooncake test cluster: tests/cluster/cluster.sh run -- cargo test -p jitship-tests --test e2e -- --ignored mooncake"]
fn cli_commands_leave_no_client_entry_in_the_metadata_server() {
    use std::process::{Command, Stdio};
    let c = cluster("cli_commands_leave_no_client_entry_in_the_metadata_server");
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("jitship.toml");
    c.write_cli_config(&config);
    let namespace = unique_prefix("metadata-entries");
    let src = tmp.path().join("src");
    triton_tree(&src, 20, 5);
    let dst = tmp.path().join("dst");
    let cli = |command: &str, root: Option<&std::path::Path>| {
        let mut cmd = jitship_tests::cli::jitship();
        cmd.env_remove("RUST_LOG")
            .arg(command)
            .arg("--config")
            .arg(&config)
            .args(["--namespace", &namespace]);
        if let Some(root) = root {
            cmd.args(["--fact", "model.id=metadata-entries", "--cache"])
                .arg(format!("kernels:native={}", root.display()));
        }
        cmd
    };
    // The library logs the key it looks its own entry up under, once, at setup.
    let key_in = |stderr: &str| -> String {
        let at = stderr.find("metadata?key=").unwrap_or_else(|| {
            panic!(
                "no metadata key in the library's log (did Mooncake's logging change?):\n{stderr}"
            )
        });
        let rest = &stderr[at + "metadata?key=".len()..];
        rest[..rest
            .find(|ch: char| ch.is_whitespace())
            .unwrap_or(rest.len())]
            .to_owned()
    };
    let status_of = |key: &str| -> String {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
            .arg(format!("{}?key={key}", c.metadata))
            .output()
            .expect("run curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    for (command, root, code) in [
        ("publish", Some(&src), 0),
        ("install", Some(&dst), 0),
        ("install", Some(&dst), 10),
        ("ls", None, 0),
    ] {
        let out = cli(command, root.map(|p| p.as_path())).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{command}:\n{stderr}");
        let key = key_in(&stderr);
        assert_eq!(
            status_of(&key),
            "404",
            "{command} left its client's entry {key} in the metadata server"
        );
    }

    // A one-shot install told to stop while it holds its client (it waits for another install's
    // lock, before it fetches anything): it exits 128 + SIGTERM and still removes its entry.
    let held = tmp.path().join("held");
    let lock = std::fs::File::create(tmp.path().join(".held.jitship.lock")).unwrap();
    lock.lock().unwrap();
    let log = tmp.path().join("install.log");
    let child = cli("install", Some(&held))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("holds this root's lock")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the install never waited for the lock:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let key = key_in(&std::fs::read_to_string(&log).unwrap());
    assert_eq!(
        status_of(&key),
        "200",
        "the waiting install's entry is live"
    );
    // SAFETY: kill(2) on our own child, which is still running (it waits for the lock).
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert_eq!(out.status.code(), Some(143), "install:\n{stderr}");
    assert_eq!(
        status_of(&key),
        "404",
        "the install stopped by SIGTERM left its entry {key}"
    );
    assert!(!held.exists(), "the stopped install created its root");
    drop(lock);

    // The control: a watcher is a live client until it is told to stop. (An install is no
    // control: it lets go of its client once its packs are fetched, before it commits.)
    let log = tmp.path().join("watch.log");
    let mut child = cli("watch", Some(&src))
        .args(["--rescan-interval", "60s"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut seen_live = false;
    while std::time::Instant::now() < deadline && child.try_wait().unwrap().is_none() {
        let stderr = std::fs::read_to_string(&log).unwrap_or_default();
        if stderr.contains("metadata?key=") {
            seen_live = status_of(&key_in(&stderr)) == "200";
            if seen_live {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SIGTERM as soon as the entry shows, while the watcher may still be starting: its handlers
    // go in before it opens the store, so even then it stops cleanly and removes its entry.
    // SAFETY: kill(2) on our own child's pid (it may have exited: then ESRCH, and the status
    // below says how it ended).
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(0), "watch:\n{stderr}");
    assert!(
        seen_live,
        "the entry of a live client was never seen: this test would pass whatever the CLI did\n{stderr}"
    );
    assert_eq!(
        status_of(&key_in(&stderr)),
        "404",
        "the watcher left its entry after SIGTERM"
    );
}
