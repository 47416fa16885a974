use std::time::Duration;

use super::*;
use crate::generation::CompatId;
use std::collections::BTreeMap;

fn report(outcome: PublishOutcome, skipped: &[(ReasonCategory, u64)]) -> PublishReport {
    PublishReport {
        cache_kind: "triton".into(),
        root: "/r".into(),
        compat_key: "k".into(),
        compat_id: CompatId::new("triton", "k"),
        outcome,
        files_selected: 3,
        skipped: skipped.iter().copied().collect::<BTreeMap<_, _>>(),
        skip_details: vec![],
        incomplete: None,
        files_new: 3,
        files_hashed: 3,
        bytes_uploaded: 1000,
        bytes_deduplicated: 10,
        packs_uploaded: 1,
        packs_reused: 0,
        conflicts: vec![],
        merged: vec![],
        head_attempts: 0,
        contributions: 0,
        carried: false,
        signed_by: None,
        parent_signer: None,
        duration_ms: 1,
        registry: None,
        module_not_stored: None,
        policy: None,
        settings_kept_from: None,
        settings_note: None,
        hash_ms: 0,
        upload_ms: 0,
    }
}

/// How a slow client's connection ended.
#[derive(Debug, PartialEq)]
enum SlowEnd {
    /// The server closed it (evicted, or its head never came whole in time).
    ClosedByServer,
    /// It sent every byte it had without being closed.
    BudgetSpent,
}

/// Issue 24: many loopback clients trickling a request head, one byte at a time, never keep
/// `/healthz` from answering a client that sends its request at once (a kubelet probe, whose
/// default timeout is 1 s); and every one of them is closed by the server, not left to hold a
/// connection. Loopback only; every socket is closed and the server stopped at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_cannot_starve_healthz() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const SLOW: usize = 96;
    const PROBES: usize = 20;
    // At most this many bytes after the request line, one per tick: 6 s in all, more than
    // HEADER_READ_TIMEOUT, so only the server can end a slow client early.
    const TRICKLE_BYTES: usize = 60;
    const TICK: Duration = Duration::from_millis(100);
    const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

    let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(serve(listener, Arc::new(Metrics::new())));

    let (started_tx, mut started_rx) = tokio::sync::mpsc::channel::<()>(SLOW);
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut slow = Vec::new();
    for _ in 0..SLOW {
        let (started, open) = (started_tx.clone(), open.clone());
        slow.push(tokio::spawn(async move {
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            open.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let (mut reader, mut writer) = stream.split();
            let sent = writer.write_all(b"GET /healthz HTTP/1.1\r\n").await;
            started.send(()).await.unwrap();
            let mut end = if sent.is_err() {
                Some(SlowEnd::ClosedByServer)
            } else {
                None
            };
            let mut tick = tokio::time::interval(TICK);
            let mut buf = [0u8; 256];
            let mut budget = TRICKLE_BYTES;
            while end.is_none() {
                tokio::select! {
                    r = reader.read(&mut buf) => {
                        // No response can come: the head is never whole. EOF or reset.
                        assert!(!matches!(r, Ok(n) if n > 0), "a slow client got an answer");
                        end = Some(SlowEnd::ClosedByServer);
                    }
                    _ = tick.tick() => {
                        if budget == 0 {
                            end = Some(SlowEnd::BudgetSpent);
                        } else if writer.write_all(b"x").await.is_err() {
                            end = Some(SlowEnd::ClosedByServer);
                        }
                        budget = budget.saturating_sub(1);
                    }
                }
            }
            open.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            end.unwrap()
        }));
    }
    drop(started_tx);
    // Every slow client is connected and has begun its head.
    for _ in 0..SLOW {
        started_rx.recv().await.unwrap();
    }

    for attempt in 0..PROBES {
        let probe = async {
            let mut stream = tokio::net::TcpStream::connect(addr).await?;
            stream
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .await?;
            let mut response = Vec::new();
            stream.read_to_end(&mut response).await?;
            Ok::<_, std::io::Error>(String::from_utf8_lossy(&response).into_owned())
        };
        let response = tokio::time::timeout(PROBE_TIMEOUT, probe)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "probe {attempt}: no answer within {PROBE_TIMEOUT:?} beside {SLOW} slow clients"
                )
            })
            .unwrap();
        assert!(
            response.starts_with("HTTP/1.1 200") && response.ends_with("ok\n"),
            "probe {attempt}: {response}"
        );
    }
    // The probes ran while slow clients were still connected, trickling.
    let still_open = open.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        still_open > 0,
        "every slow client was gone before the probes ended"
    );

    // Each slow client ends because the server closed it: evicted, or its head not whole
    // within HEADER_READ_TIMEOUT, well before its bytes run out.
    for client in slow {
        assert_eq!(client.await.unwrap(), SlowEnd::ClosedByServer);
    }
    server.abort();
    assert!(server.await.unwrap_err().is_cancelled());
}

#[test]
fn reports_become_metrics_and_stale_skip_reasons_reset() {
    let m = Metrics::new();
    m.record_report(&report(PublishOutcome::Empty, &[(ReasonCategory::Lock, 2)]));
    m.record_report(&report(PublishOutcome::Empty, &[]));
    m.record_cycle_error("triton", ErrorKind::Store);
    let text = m.encode();
    for line in [
        "jitship_watch_publish_cycles_total{cache=\"triton\",outcome=\"empty\"} 2",
        "jitship_watch_publish_cycles_total{cache=\"triton\",outcome=\"error\"} 1",
        "jitship_watch_bytes_uploaded_total{cache=\"triton\"} 2000",
        "jitship_watch_files_skipped{cache=\"triton\",category=\"lock\"} 0",
        "jitship_watch_files_skipped{cache=\"triton\",category=\"foreign-root\"} 0",
        "jitship_watch_cache_incomplete{cache=\"triton\"} 0",
        "jitship_watch_errors_total{cache=\"triton\",kind=\"store\"} 1",
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
}

/// A tree full of distinct bad files (temp, lock, per-host, each name different) gives the same
/// fixed set of `files_skipped` series as an empty one: categories, never file names.
#[test]
fn skip_labels_are_bounded_whatever_the_tree_holds() {
    use crate::catalog::KeyLayout;
    use crate::policy::native::NativeRules;
    use crate::publish::{PublishOptions, publish};
    use crate::store::LocalStore;

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    for i in 0..300 {
        let files = [
            format!("k{i}/tmp.pid_{i}_abc/kernel.cubin"),
            format!("k{i}/model.{i}.tmp"),
            format!("locks/{i}.lock"),
            format!("k{i}/x{i}.lock"),
            format!("gpu_p2p_access_cache_for_{i}.json"),
            format!("k{i}/ok.bin"),
        ];
        for f in files {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, i.to_string()).unwrap();
        }
    }
    std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
    let store = LocalStore::open(dir.path().join("store")).unwrap();
    let layout = KeyLayout::new("t").unwrap();
    let opts = PublishOptions {
        pack_size: 1 << 20,
        producer: crate::generation::Producer {
            host: "h".into(),
            pod: None,
            jitship_version: "0".into(),
        },
        facts: crate::facts::Facts::new(),
        max_head_attempts: 4,
        trust: Default::default(),
        interrupt: Default::default(),
        registry: None,
    };
    let policy = NativeRules::new("triton");
    let r = publish(&store, &layout, &policy, &root, &opts, None).unwrap();
    assert_eq!(r.files_selected, 300);
    assert_eq!(
        r.skipped.values().sum::<u64>(),
        5 * 300 + 1,
        "{:?}",
        r.skipped
    );
    assert_eq!(r.skip_details.len(), crate::publish::MAX_SKIP_DETAILS);

    let m = Metrics::new();
    m.record_report(&r);
    let text = m.encode();
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("jitship_watch_files_skipped{"))
        .collect();
    assert_eq!(
        series.len(),
        ReasonCategory::ALL.len() - 1,
        "one series per skip category, whatever the tree holds:\n{}",
        series.join("\n")
    );
    for (category, n) in [
        ("temporary", 600),
        ("lock", 600),
        ("per-host", 300),
        ("excluded", 1),
    ] {
        let line =
            format!("jitship_watch_files_skipped{{cache=\"triton\",category=\"{category}\"}} {n}");
        assert!(
            series.contains(&line.as_str()),
            "{line} missing from:\n{}",
            series.join("\n")
        );
    }
    assert!(!text.contains("k17"), "a file name leaked into a label");
}

#[test]
fn disabled_policies_show_in_the_metric_and_healthz() {
    use crate::policies::{DisabledCause, PolicySource};
    let m = Metrics::new();
    assert_eq!(
        m.health(),
        Health {
            ok: true,
            body: "ok\n".into()
        }
    );
    let kind = |kind: &str, cause: Option<DisabledCause>| KindStatus {
        kind: kind.into(),
        source: PolicySource::Builtin,
        policy: None,
        digest: None,
        disabled: cause.map(|c| format!("{} reason", c.as_str())),
        disabled_cause: cause,
    };
    let status = vec![
        kind("triton", Some(DisabledCause::Backoff)),
        kind("inductor", None),
        kind("deepgemm", Some(DisabledCause::Violation)),
    ];
    m.watch_policies(Arc::new(move || status.clone()));
    let Health { ok, body: health } = m.health();
    assert!(ok, "one kind still runs: {health}");
    assert!(health.starts_with("ok\n"), "{health}");
    assert!(
        health.contains("cache kind triton disabled (backoff): backoff reason\n"),
        "{health}"
    );
    assert!(
        health.contains("cache kind deepgemm disabled (violation)"),
        "{health}"
    );
    assert!(!health.contains("inductor"), "{health}");
    let text = m.encode();
    for line in [
        "jitship_watch_policy_disabled{cache=\"triton\",cause=\"backoff\"} 1",
        "jitship_watch_policy_disabled{cache=\"triton\",cause=\"violation\"} 0",
        "jitship_watch_policy_disabled{cache=\"deepgemm\",cause=\"violation\"} 1",
        "jitship_watch_policy_disabled{cache=\"inductor\",cause=\"backoff\"} 0",
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
}

/// No kind can run (every one disabled until restart): 503 with each reason. A kind only
/// paused by backoff runs again by itself: still 200.
#[test]
fn healthz_is_unhealthy_only_when_no_cache_kind_can_run() {
    use crate::policies::{DisabledCause, PolicySource};
    let kind = |kind: &str, cause: Option<DisabledCause>| KindStatus {
        kind: kind.into(),
        source: PolicySource::Builtin,
        policy: None,
        digest: None,
        disabled: cause.map(|c| format!("{} reason", c.as_str())),
        disabled_cause: cause,
    };
    let health = |status: Vec<KindStatus>| {
        let m = Metrics::new();
        m.watch_policies(Arc::new(move || status.clone()));
        m.health()
    };
    let all_down = health(vec![
        kind("triton", Some(DisabledCause::Load)),
        kind("deepgemm", Some(DisabledCause::Violation)),
    ]);
    assert!(!all_down.ok, "{}", all_down.body);
    assert!(
        all_down
            .body
            .starts_with("unhealthy: no cache kind can run"),
        "{}",
        all_down.body
    );
    assert!(
        all_down
            .body
            .contains("cache kind triton disabled (load): load reason\n"),
        "{}",
        all_down.body
    );
    assert!(
        all_down
            .body
            .contains("cache kind deepgemm disabled (violation): violation reason\n"),
        "{}",
        all_down.body
    );
    let paused = health(vec![
        kind("triton", Some(DisabledCause::Load)),
        kind("deepgemm", Some(DisabledCause::Backoff)),
    ]);
    assert!(paused.ok, "{}", paused.body);
    assert!(
        paused
            .body
            .contains("cache kind deepgemm disabled (backoff)"),
        "{}",
        paused.body
    );
    let one = health(vec![kind("triton", Some(DisabledCause::Violation))]);
    assert!(!one.ok, "{}", one.body);
}

/// The endpoint answers the status `health` decides: 503 and the reasons over HTTP.
#[tokio::test]
async fn healthz_answers_503_over_http_when_no_kind_can_run() {
    use crate::policies::{DisabledCause, PolicySource};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let m = Arc::new(Metrics::new());
    m.watch_policies(Arc::new(|| {
        vec![KindStatus {
            kind: "triton".into(),
            source: PolicySource::Builtin,
            policy: None,
            digest: None,
            disabled: Some("cannot load".into()),
            disabled_cause: Some(DisabledCause::Load),
        }]
    }));
    let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, m));
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut resp = String::new();
    c.read_to_string(&mut resp).await.unwrap();
    assert!(resp.starts_with("HTTP/1.1 503"), "{resp}");
    assert!(
        resp.contains("cache kind triton disabled (load): cannot load"),
        "{resp}"
    );
}
