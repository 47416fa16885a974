//! `jitship watch` on Mooncake: started before its master, and its periodic scrub.

use super::*;

/// `jitship watch` started while the master is down does not exit (it used to exit 1, "store
/// master unavailable", and crash-loop): it watches, says on its log that the store does not
/// answer, and publishes once the master is up.
#[test]
#[ignore = "needs the Mooncake test cluster: tests/cluster/cluster.sh run -- cargo test -p jitship-tests --test e2e -- --ignored mooncake"]
fn mooncake_watch_started_before_the_master_publishes_once_it_is_up() {
    use std::process::Stdio;
    let _serial = serial();
    let c = cluster("mooncake_watch_started_before_the_master_publishes_once_it_is_up");
    let _restore = Restore(&c);
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("jitship.toml");
    c.write_cli_config(&config);
    let src = tmp.path().join("src");
    triton_tree(&src, 10, 41);
    c.ctl(&["kill-master"]);
    let log = tmp.path().join("watch.log");
    let mut child = jitship_tests::cli::jitship()
        .env_remove("RUST_LOG")
        .arg("watch")
        .arg("--config")
        .arg(&config)
        .args(["--namespace", &unique_prefix("watch-waits")])
        .args(["--fact", "model.id=watch-waits", "--cache"])
        .arg(format!("kernels:native={}", src.display()))
        .args([
            "--settle",
            "200ms",
            "--min-interval",
            "0s",
            "--rescan-interval",
            "60s",
            "-v",
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let dir = log
        .parent()
        .expect("the log is in the test's directory")
        .to_owned();
    let mut wait_log = |needle: &str, within: Duration| -> Duration {
        let t = Instant::now();
        let logged = || std::fs::read_to_string(&log).unwrap_or_default();
        let mut exited = None;
        let seen = jitship_tests::child::wait_for_change(&dir, within, || {
            exited = child.try_wait().unwrap();
            logged().contains(needle) || exited.is_some()
        });
        if let Some(status) = exited.filter(|_| !logged().contains(needle)) {
            panic!("watch exited ({status}) before {needle:?}:\n{}", logged());
        }
        assert!(
            seen,
            "{needle:?} not logged within {within:?}:\n{}",
            logged()
        );
        t.elapsed()
    };
    wait_log("the store does not answer: watching the caches", FAIL_FAST);
    wait_log("store_unreachable=true", FAIL_FAST);
    c.ctl(&["start-master"]);
    c.ctl(&["wait-node"]);
    // The retry backoff is capped at 30 s while the store does not answer.
    let took = wait_log("published a new generation", Duration::from_secs(90));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains("the store answers: publishing"), "{text}");
    eprintln!("DRILL watch-before-master: published {took:.1?} after the master and node were up");
    // SAFETY: kill(2) on our own child, still running (wait_log checked).
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(0), "watch:\n{text}");
}

/// `watch`'s periodic scrub on Mooncake with a durable tier: a pack removed from Mooncake behind
/// jitship's back is found by the first scrub, put back from the durable tier, and counted in the
/// `jitship_store_scrub_*` metrics.
#[test]
#[ignore = "needs the Mooncake test cluster: tests/cluster/cluster.sh run -- cargo test -p jitship-tests --test e2e -- --ignored mooncake"]
fn mooncake_watch_scrub_repairs_a_pack_removed_behind_its_back() {
    use std::io::{Read, Write};
    use std::process::Stdio;
    let _serial = serial();
    let c = cluster("mooncake_watch_scrub_repairs_a_pack_removed_behind_its_back");
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("jitship.toml");
    c.write_cli_config(&config);
    let namespace = unique_prefix("watch-scrub");
    let durable = tmp.path().join("durable");
    let durable_flag = format!("local:{}", durable.display());
    let src = tmp.path().join("src");
    triton_tree(&src, 10, 51);
    let cli = |command: &str, root: &Path| {
        let mut cmd = jitship_tests::cli::jitship();
        cmd.env_remove("RUST_LOG")
            .arg(command)
            .arg("--config")
            .arg(&config)
            .args(["--namespace", &namespace, "--durable-store", &durable_flag])
            .args(["--fact", "model.id=watch-scrub", "--cache"])
            .arg(format!("kernels:native={}", root.display()));
        cmd
    };
    let out = cli("publish", &src).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let name = std::fs::read_dir(durable.join(&namespace).join("pack"))
        .unwrap()
        .next()
        .expect("the durable tier holds a pack")
        .unwrap()
        .file_name();
    let key = format!("{namespace}/pack/{}", name.to_string_lossy());
    // Behind jitship's back. The publish's own read of it may still hold a lease (10 s).
    let store = connect(&c);
    let t = Instant::now();
    loop {
        match store.remove(&key) {
            Ok(true) => break,
            Err(StoreError::Leased(_)) if t.elapsed() < FAIL_FAST => {
                std::thread::sleep(Duration::from_millis(200))
            }
            other => panic!("removing {key}: {other:?}"),
        }
    }
    assert!(!store.exists(&key).unwrap());
    drop(store);
    let idle = tmp.path().join("idle");
    std::fs::create_dir_all(&idle).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = tmp.path().join("watch.log");
    let mut child = cli("watch", &idle)
        .args(["--settle", "200ms", "--rescan-interval", "60s", "-v"])
        .args(["--scrub-interval", "1h", "--scrub-sample", "1000"])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let metrics = || -> String {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return String::new();
        };
        let _ = write!(
            s,
            "GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        );
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        text
    };
    let want = [
        "\njitship_store_scrub_runs_total 1\n",
        "\njitship_store_scrub_missing_total 1\n",
        "\njitship_store_scrub_repaired_total 1\n",
        "\njitship_store_scrub_last_unrepaired 0\n",
    ];
    let t = Instant::now();
    let body = loop {
        let body = metrics();
        if want.iter().all(|w| body.contains(w)) {
            break body;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "watch exited ({status}):\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{want:?} not in the metrics:\n{body}\nlog:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let line = |name: &str| {
        body.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or("")
            .to_owned()
    };
    eprintln!(
        "DRILL watch scrub: {}; {}; {}; {}",
        line("jitship_store_scrub_checked_total"),
        line("jitship_store_scrub_missing_total"),
        line("jitship_store_scrub_repaired_total"),
        line("jitship_store_scrub_last_unrepaired")
    );

    // Stopped as a pod is. This test process loaded Mooncake's library, so the watcher started
    // with the stop signals blocked: it stops cleanly only because it clears that mask
    // (`interrupt::clear_inherited_signal_mask`); before, the library's signal thread took SIGTERM
    // and the watcher died of it without its final publish.
    // SAFETY: kill(2) on our own child, still running (the loop above checked).
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(0), "watch:\n{text}");
    assert!(text.contains("jitship watch stopped"), "watch:\n{text}");
    assert!(
        connect(&c).exists(&key).unwrap(),
        "the pack is back in Mooncake"
    );
}
