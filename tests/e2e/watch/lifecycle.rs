//! The watcher's life: a root created late, SIGTERM, a server not ready yet, /metrics and
//! /healthz, a restart, a store that answers late, the periodic scrub.

use super::*;

// ---------------------------------------------------------------------------------------------

#[test]
fn a_root_created_late_is_picked_up_within_the_settle_window() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let root = dir.path().join("home/.cache/sglang/jit");
    let w = Watcher::start(&store, &[("sglang-jit", &root)], SETTLE, &[]);
    // The watcher watches the nearest ancestor that exists (the temp dir itself).
    w.wait_log(&format!("path={} ", dir.path().display()));
    assert!(generations(&store, "sglang-jit").is_empty());
    // The engine creates the directories level by level, then publishes a staging dir by rename.
    std::fs::create_dir_all(dir.path().join("home/.cache")).unwrap();
    // The watcher has moved down to the new nearest ancestor before the next level appears.
    w.wait_log(&format!(
        "path={} ",
        dir.path().join("home/.cache").display()
    ));
    let staging = root.join("cuda/norm/.staging-1234");
    std::fs::create_dir_all(&staging).unwrap();
    let so = bytes(9, 50_000);
    std::fs::write(staging.join("norm.so"), &so).unwrap();
    let leaf = root.join("cuda/norm/build-0123456789abcdef/deps-fedcba9876543210");
    std::fs::create_dir_all(leaf.parent().unwrap()).unwrap();
    std::fs::rename(&staging, &leaf).unwrap();
    let writes_stopped = Instant::now();
    let want = "cuda/norm/build-0123456789abcdef/deps-fedcba9876543210/norm.so".to_string();
    let (m, seen) = wait_for(&store, "sglang-jit", &w, "the module", |m| {
        paths(m).contains(&want)
    });
    let latency = seen - writes_stopped;
    eprintln!("late root: change-to-generation latency {latency:?} (settle {SETTLE:?})");
    assert_eq!(paths(&m), BTreeSet::from([want]));
    let (status, log) = w.terminate();
    assert!(status.success(), "exit {status}; log:\n{log}");
}

#[test]
fn sigterm_publishes_pending_work_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let triton = dir.path().join("triton");
    let dg = dir.path().join("deep_gemm");
    std::fs::create_dir_all(&triton).unwrap();
    // A settle window far longer than the test: only the final publish can publish.
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let w = Watcher::start(
        &store,
        &[("triton", &triton), ("deepgemm", &dg)],
        Duration::from_secs(600),
        &["--metrics-addr", &addr],
    );
    let files = triton_kernel(&triton, 7, || {});
    let entry = dg.join("cache/kernel.x.0123456789abcdef0123456789abcdef");
    std::fs::create_dir_all(&entry).unwrap();
    std::fs::write(entry.join("kernel.cu"), b"__global__ void k() {}").unwrap();
    std::fs::write(entry.join("kernel.cubin"), bytes(3, 9_000)).unwrap();
    // Work still in flight at SIGTERM stays out.
    let tmp = triton
        .join(format!("{:0>52}", "K7"))
        .join("tmp.pid_99_beef");
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::write(tmp.join("kernel_8.cubin"), b"half").unwrap();
    std::fs::create_dir_all(dg.join("tmp/feed")).unwrap();
    std::fs::write(dg.join("tmp/feed/kernel.cu"), b"half").unwrap();
    // Both roots have seen their changes and wait for the settle window.
    w.wait_metrics(
        port,
        &[
            "jitship_watch_pending{cache=\"triton\"} 1",
            "jitship_watch_pending{cache=\"deepgemm\"} 1",
        ],
    );
    assert!(generations(&store, "triton").is_empty());
    let (status, log) = w.terminate();
    assert!(status.success(), "exit {status}; log:\n{log}");
    let t = generations(&store, "triton");
    assert_eq!(t.len(), 1, "{log}");
    assert_eq!(
        paths(&t[0]),
        files
            .iter()
            .map(|(p, _)| p.clone())
            .collect::<BTreeSet<_>>()
    );
    assert_triton_complete(&t[0]);
    let d = generations(&store, "deepgemm");
    assert_eq!(d.len(), 1, "{log}");
    assert_eq!(
        paths(&d[0]),
        BTreeSet::from([
            "cache/kernel.x.0123456789abcdef0123456789abcdef/kernel.cu".to_string(),
            "cache/kernel.x.0123456789abcdef0123456789abcdef/kernel.cubin".to_string(),
        ])
    );
    assert!(log.contains("SIGTERM"), "{log}");
}

/// A loopback HTTP server answering `status` to every request until dropped.
struct Health {
    port: u16,
    ready: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Probes answered "not ready".
    refused: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Health {
    fn start() -> Self {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let ready = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let refused = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (r, s, n) = (ready.clone(), stop.clone(), refused.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(mut conn) = conn else { continue };
                let mut buf = [0u8; 2048];
                let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                let _ = conn.read(&mut buf);
                let status = if r.load(Ordering::SeqCst) {
                    "200 OK"
                } else {
                    n.fetch_add(1, Ordering::SeqCst);
                    "503 Service Unavailable"
                };
                let _ = conn.write_all(
                    format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                        .as_bytes(),
                );
            }
        });
        Self {
            port,
            ready,
            refused,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Health {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // Wake the blocking accept so the thread sees the flag.
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn nothing_is_published_before_the_server_is_ready() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let root = dir.path().join("triton");
    std::fs::create_dir_all(&root).unwrap();
    let health = Health::start();
    let url = format!("http://127.0.0.1:{}/health", health.port);
    let w = Watcher::start(&store, &[("triton", &root)], SETTLE, &["--ready-url", &url]);
    let files = triton_kernel(&root, 1, || {});
    // The root is pending (the gate is probed only then) and the gate refused it twice since the
    // files were written, READY_POLL apart: past the settle window, held by the gate alone.
    let seen = health.refused.load(std::sync::atomic::Ordering::SeqCst);
    let deadline = Instant::now() + WAIT;
    while health.refused.load(std::sync::atomic::Ordering::SeqCst) < seen + 2 {
        assert!(
            Instant::now() < deadline,
            "the gate was not probed; log:\n{}",
            w.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        generations(&store, "triton").is_empty(),
        "published before ready"
    );
    health
        .ready
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let all: BTreeSet<String> = files.iter().map(|(p, _)| p.clone()).collect();
    wait_for(&store, "triton", &w, "the kernel", |m| paths(m) == all);
    let (status, log) = w.terminate();
    assert!(status.success(), "exit {status}; log:\n{log}");
    assert!(log.contains("server is ready"), "{log}");
}

#[test]
fn metrics_and_healthz_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let root = dir.path().join("triton");
    std::fs::create_dir_all(&root).unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let w = Watcher::start(
        &store,
        &[("triton", &root)],
        SETTLE,
        &["--metrics-addr", &addr],
    );
    let files = triton_kernel(&root, 2, || {});
    let all: BTreeSet<String> = files.iter().map(|(p, _)| p.clone()).collect();
    wait_for(&store, "triton", &w, "the kernel", |m| paths(m) == all);
    let (status, body) = http_get(port, "/healthz");
    assert_eq!(status, 200, "{body}");
    // The store is the truth (a loaded machine may split the writes over two generations); the
    // loop records a cycle's metrics just after its head is written, so poll briefly.
    let n = generations(&store, "triton").len();
    let lines = [
        format!("jitship_watch_generations_published_total{{cache=\"triton\"}} {n}"),
        format!("jitship_watch_publish_cycles_total{{cache=\"triton\",outcome=\"published\"}} {n}"),
        "jitship_watch_ready 1".to_string(),
    ];
    let deadline = Instant::now() + WAIT;
    let body = loop {
        let (status, body) = http_get(port, "/metrics");
        assert_eq!(status, 200, "{body}");
        if lines.iter().all(|l| body.contains(l.as_str())) {
            break body;
        }
        assert!(Instant::now() < deadline, "{lines:?} missing:\n{body}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(body.contains("jitship_watch_last_publish_timestamp_seconds{cache=\"triton\"}"));
    let uploaded: u64 = body
        .lines()
        .find(|l| l.starts_with("jitship_watch_bytes_uploaded_total{cache=\"triton\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0);
    assert!(uploaded > 0, "{body}");
    assert_eq!(http_get(port, "/nope").0, 404);
    let (status, log) = w.terminate();
    assert!(status.success(), "exit {status}; log:\n{log}");
}

/// Killed without a final publish (SIGKILL, OOM, node loss), then restarted: the new watcher
/// rebuilds its state from the store and the root and publishes what was written meanwhile. No
/// marker file or lock is left to block it.
#[test]
fn a_restarted_watcher_publishes_what_was_written_while_it_was_down() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let root = dir.path().join("triton");
    std::fs::create_dir_all(&root).unwrap();
    let mut all: BTreeSet<String> = BTreeSet::new();
    let w = Watcher::start(&store, &[("triton", &root)], SETTLE, &[]);
    all.extend(triton_kernel(&root, 1, || {}).into_iter().map(|(p, _)| p));
    wait_for(&store, "triton", &w, "the first kernel", |m| {
        paths(m) == all
    });
    // Usually 1; 2 if a loaded machine stalled the writer past the settle window mid-kernel.
    let before = generations(&store, "triton").len();
    w.signal(libc::SIGKILL);
    drop(w);
    // Written while no watcher runs.
    all.extend(triton_kernel(&root, 2, || {}).into_iter().map(|(p, _)| p));
    let entries_in_root: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries_in_root.len(), 2, "the watcher wrote into the root");
    let w = Watcher::start(&store, &[("triton", &root)], SETTLE, &[]);
    let (m, _) = wait_for(&store, "triton", &w, "both kernels", |m| paths(m) == all);
    assert!(
        m.parent.is_some(),
        "the new generation builds on the old head"
    );
    assert_eq!(generations(&store, "triton").len(), before + 1);
    let (status, log) = w.terminate();
    assert!(status.success(), "exit {status}; log:\n{log}");
    // Nothing new: the final publish found the head current and made no generation.
    assert_eq!(generations(&store, "triton").len(), before + 1, "{log}");
}

/// A watcher started while its store cannot be reached (here a local store whose directory
/// cannot be made yet, as an unmounted volume; on Mooncake a master not up yet,
/// `mooncake_drills`) keeps watching, says so on `/healthz` and in its metrics, and publishes
/// once the store answers, instead of exiting and crash-looping.
#[test]
fn a_watcher_started_before_its_store_answers_publishes_once_it_does() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    // A file where the store's directory must go: opening the store fails until it is gone.
    std::fs::write(&store, b"not mounted yet").unwrap();
    let root = dir.path().join("triton");
    std::fs::create_dir_all(&root).unwrap();
    let files = triton_kernel(&root, 1, || {});
    let all: BTreeSet<String> = files.iter().map(|(p, _)| p.clone()).collect();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let w = Watcher::start(
        &store,
        &[("triton", &root)],
        SETTLE,
        &["--metrics-addr", &addr],
    );
    w.wait_log("the store does not answer: watching the caches");
    // The metric and /healthz say why from the start.
    w.wait_metrics(port, &["\njitship_watch_store_reachable 0\n"]);
    let (status, body) = http_get(port, "/healthz");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("store unreachable"), "{body}");
    // The first cycle tried to connect, failed, and is retried after a backoff.
    w.wait_log("publish cycle failed");
    assert!(w.log().contains("store_unreachable=true"), "{}", w.log());
    std::fs::remove_file(&store).unwrap();
    w.wait_log("the store answers: publishing");
    wait_for(&store, "triton", &w, "the kernel", |m| paths(m) == all);
    w.wait_metrics(port, &["\njitship_watch_store_reachable 1\n"]);
    let (status, body) = http_get(port, "/healthz");
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("store unreachable"), "{body}");
    let (status, log) = w.terminate();
    assert!(status.success(), "exit {status}; log:\n{log}");
}

/// The watcher's periodic scrub (`--scrub-interval`) over a store with a durable tier: a pack
/// removed from the fast tier behind jitship's back is found, put back from the durable tier
/// byte for byte, and counted in the `jitship_store_scrub_*` metrics.
#[test]
fn the_periodic_scrub_finds_and_repairs_a_pack_removed_behind_its_back() {
    let dir = tempfile::tempdir().unwrap();
    let fast = dir.path().join("store");
    let durable = dir.path().join("durable");
    let durable_flag = format!("local:{}", durable.display());
    let root = dir.path().join("triton");
    std::fs::create_dir_all(&root).unwrap();
    triton_kernel(&root, 1, || {});
    triton_kernel(&root, 2, || {});
    let out = jitship_tests::cli::jitship()
        .arg("publish")
        .arg("--store")
        .arg(format!("local:{}", fast.display()))
        .args(["--durable-store", &durable_flag])
        .args(WORKER_FACTS.iter().flat_map(|f| ["--fact", f]))
        .arg("--cache")
        .arg(format!("triton={}", root.display()))
        .env_remove("JITSHIP_CONFIG")
        .env_remove("JITSHIP_CACHES")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let packs: Vec<PathBuf> = std::fs::read_dir(fast.join("jitship/pack"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!packs.is_empty());
    let lost = &packs[0];
    let name = lost.file_name().unwrap();
    std::fs::remove_file(lost).unwrap();
    // `verify --sample` finds it; without --repair it writes nothing.
    let out = jitship_tests::cli::jitship()
        .arg("verify")
        .arg("--store")
        .arg(format!("local:{}", fast.display()))
        .args(["--durable-store", &durable_flag, "--sample", "1000"])
        .env_remove("JITSHIP_CONFIG")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("1 missing, 0 corrupt, 0 repaired"), "{text}");
    assert!(!lost.exists());
    // The watcher's own root has nothing to publish: what it scrubs is the store's.
    let idle = dir.path().join("idle");
    std::fs::create_dir_all(&idle).unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let w = Watcher::start(
        &fast,
        &[("triton", &idle)],
        SETTLE,
        &[
            "--durable-store",
            &durable_flag,
            "--scrub-interval",
            "1h",
            "--scrub-sample",
            "1000",
            "--metrics-addr",
            &addr,
        ],
    );
    w.wait_metrics(
        port,
        &[
            "\njitship_store_scrub_runs_total 1\n",
            "\njitship_store_scrub_missing_total 1\n",
            "\njitship_store_scrub_repaired_total 1\n",
            "\njitship_store_scrub_corrupt_total 0\n",
            "\njitship_store_scrub_last_unrepaired 0\n",
        ],
    );
    let (_, body) = http_get(port, "/metrics");
    assert!(
        body.contains(&format!(
            "\njitship_store_scrub_checked_total {}\n",
            packs.len()
        )),
        "{body}"
    );
    assert_eq!(
        std::fs::read(lost).unwrap(),
        std::fs::read(durable.join("jitship/pack").join(name)).unwrap(),
        "put back as the durable tier holds it"
    );
    let (status, log) = w.terminate();
    assert!(status.success(), "exit {status}; log:\n{log}");
    assert!(
        log.contains("scrub: a pack a kept generation needs is missing"),
        "{log}"
    );
}
