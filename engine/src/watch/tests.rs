use super::*;
use crate::facts::Facts;
use crate::generation::Producer;
use crate::policy::PolicyError;
use crate::policy::native::NativeRules;
use crate::policy::testing::HookedPolicy;
use crate::store::LocalStore;

/// Native rules whose key and selection fail, as a broken policy module's would.
fn broken(kind: &str) -> HookedPolicy {
    HookedPolicy::new(NativeRules::new(kind), ())
        .on_compat_key(|_, _, _| Err(PolicyError::Internal("out of fuel".into())))
        .on_select(|_, _, _, _| Err(PolicyError::Internal("out of fuel".into())))
}

fn options() -> WatchOptions {
    WatchOptions {
        timing: Timing {
            settle: Duration::from_millis(50),
            min_interval: Duration::ZERO,
            rescan_interval: Duration::from_secs(60),
        },
        ready_url: None,
        grace: Duration::from_secs(10),
        metrics_addr: None,
        notify: true,
        cycles_finished: None,
        scrub: None,
        publish: PublishOptions {
            pack_size: 1 << 20,
            producer: Producer {
                host: "test".into(),
                pod: None,
                jitship_version: "0".into(),
            },
            facts: Facts::new(),
            max_head_attempts: 4,
            trust: Default::default(),
            interrupt: Default::default(),
            registry: None,
        },
    }
}

#[tokio::test]
async fn a_failing_root_is_counted_and_retried_while_the_others_publish() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    let bad = dir.path().join("bad");
    std::fs::create_dir_all(&good).unwrap();
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(good.join("k.cubin"), b"kernel").unwrap();
    std::fs::write(bad.join("k.cubin"), b"kernel").unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::open(dir.path().join("store")).unwrap());
    let layout = KeyLayout::new("t").unwrap();
    let roots = vec![
        WatchedRoot {
            kind: "bad".into(),
            root: bad,
            policy: std::sync::Arc::new(broken("bad")),
            facts: None,
        },
        WatchedRoot {
            kind: "good".into(),
            root: good.clone(),
            policy: std::sync::Arc::new(NativeRules::new("good")),
            facts: None,
        },
    ];
    let metrics = Arc::new(Metrics::new());
    let (tx, rx) = mpsc::channel(2);
    let task = tokio::spawn(run_with_metrics(
        store.clone(),
        layout.clone(),
        roots,
        options(),
        rx,
        metrics.clone(),
    ));
    let compat = crate::generation::CompatId::new("good", "");
    let deadline = Instant::now() + Duration::from_secs(20);
    // The good root publishes; meanwhile the bad one fails and is retried (backoff 2 s).
    loop {
        let published = crate::catalog::newest_head(store.as_ref(), &layout, &compat)
            .unwrap()
            .is_some();
        let text = metrics.encode();
        if published && text.contains("jitship_watch_errors_total{cache=\"bad\",kind=\"policy\"} 2")
        {
            break;
        }
        assert!(Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Writing more into the good root still publishes: the bad root does not stall the loop.
    std::fs::write(good.join("k2.cubin"), b"kernel 2").unwrap();
    loop {
        let head = crate::catalog::newest_head(store.as_ref(), &layout, &compat)
            .unwrap()
            .unwrap();
        if head.seq == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "no second generation");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tx.send("SIGTERM").await.unwrap();
    let summary = task.await.unwrap().unwrap();
    assert_eq!(summary.stopped_by, "SIGTERM");
    assert_eq!(summary.generations, 2);
    assert_eq!(
        summary.final_publish,
        FinalPublish::Failed {
            caches: vec!["bad".into()]
        }
    );
    assert!(summary.failed_cycles >= 4, "{summary:?}");
}

/// No file events at all (network file system): the rescan alone finds the change, and the
/// settle window still applies after it.
#[tokio::test]
async fn the_rescan_alone_finds_changes_when_no_event_comes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::open(dir.path().join("store")).unwrap());
    let layout = KeyLayout::new("t").unwrap();
    let mut opts = options();
    opts.notify = false;
    opts.timing.rescan_interval = Duration::from_secs(1);
    let (cycles, mut cycles_finished) = tokio::sync::watch::channel(0);
    opts.cycles_finished = Some(cycles);
    let (tx, rx) = mpsc::channel(2);
    let task = tokio::spawn(run(
        store.clone(),
        layout.clone(),
        vec![WatchedRoot {
            kind: "k".into(),
            root: root.clone(),
            policy: std::sync::Arc::new(NativeRules::new("k")),
            facts: None,
        }],
        opts,
        rx,
    ));
    // Once the start-up cycle (empty root) has finished, write.
    cycles_finished.wait_for(|n| *n >= 1).await.unwrap();
    std::fs::write(root.join("a.cubin"), b"kernel").unwrap();
    let written = Instant::now();
    let compat = crate::generation::CompatId::new("k", "");
    loop {
        if crate::catalog::newest_head(store.as_ref(), &layout, &compat)
            .unwrap()
            .is_some()
        {
            break;
        }
        assert!(
            written.elapsed() < Duration::from_secs(20),
            "the rescan never found the file"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tx.send("SIGTERM").await.unwrap();
    let summary = task.await.unwrap().unwrap();
    assert_eq!(summary.generations, 1);
    assert_eq!(summary.final_publish, FinalPublish::Done);
}

#[tokio::test]
async fn without_roots_it_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::open(dir.path()).unwrap());
    let (_tx, rx) = mpsc::channel(1);
    let err = run(store, KeyLayout::new("t").unwrap(), vec![], options(), rx)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("--cache"), "{err}");
}
