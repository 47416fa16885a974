//! Hostile guests (tests/guests/hostile) are contained: fuel, the wall-clock deadline, memory,
//! panics and recursion, reads outside the root, a wrong contract version, invalid answers; the
//! host still works after each.

use super::*;

#[test]
fn infinite_loop_runs_out_of_fuel() {
    let engine = engine_with(limits());
    let hostile = load(&engine, "hostile");
    // Fuel is the bound (a count, not a time): the loop stops after exactly the budget.
    let err = hostile.compat_key(&facts(&[("evil", "loop")])).unwrap_err();
    assert_eq!(err, PolicyError::OutOfFuel { fuel: 200_000_000 });
    // The same policy still answers on a fresh instance: nothing of the trapped one survives.
    assert_eq!(hostile.compat_key(&Facts::new()).unwrap(), "hostile-key");
    host_still_works(&engine);
}

#[test]
fn a_hostile_check_settings_is_bounded_and_its_refusal_is_a_settings_error() {
    let engine = engine_with(limits());
    let hostile = load(&engine, "hostile");
    let given = |v: &str| BTreeMap::from([("evil".to_owned(), v.to_owned())]);
    let err = hostile.configure(&given("loop")).unwrap_err();
    assert_eq!(err, PolicyError::OutOfFuel { fuel: 200_000_000 });
    let err = hostile.configure(&given("refuse")).unwrap_err();
    assert!(
        matches!(&err, PolicyError::Settings(m) if m.contains("refused its settings evil=refuse")),
        "{err:?}"
    );
    // Its defaults it accepts (it loaded), and the policy still answers.
    assert!(hostile.configure(&given("")).is_ok());
    assert_eq!(hostile.compat_key(&Facts::new()).unwrap(), "hostile-key");
}

#[test]
fn infinite_loop_hits_the_wall_clock_deadline_when_fuel_is_plentiful() {
    let engine = engine_with(Limits {
        fuel: u64::MAX / 2,
        deadline: Duration::from_millis(300),
        ..limits()
    });
    let hostile = load(&engine, "hostile");
    // The deadline's own error is the signal that it fired; it cannot fire early (a lower bound a
    // loaded machine cannot break). No upper bound: a deadline that never fires is caught as a
    // hang (60 s, far past anything a loaded machine adds), not timed.
    let (tx, rx) = std::sync::mpsc::channel();
    let started = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(hostile.compat_key(&facts(&[("evil", "loop")])));
    });
    let err = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the wall-clock deadline never stopped the loop")
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(err, PolicyError::WallTimeExceeded { deadline_ms: 300 });
    assert!(took >= Duration::from_millis(250), "{took:?}");
    host_still_works(&engine);
}

#[test]
fn memory_bomb_is_stopped_with_a_typed_error() {
    let engine = engine_with(limits());
    let hostile = load(&engine, "hostile");
    match hostile.compat_key(&facts(&[("evil", "bomb")])) {
        Err(PolicyError::MemoryExceeded { requested, limit }) => {
            assert_eq!(limit, 16 << 20);
            assert!(requested > limit);
        }
        other => panic!("expected MemoryExceeded, got {other:?}"),
    }
    host_still_works(&engine);
}

#[test]
fn panic_message_is_forwarded_and_runaway_recursion_traps() {
    let engine = engine_with(limits());
    let hostile = load(&engine, "hostile");
    match hostile.compat_key(&facts(&[("evil", "panic")])) {
        Err(PolicyError::Trapped(msg)) => {
            assert!(msg.contains("deliberate panic for test: 1"), "{msg}");
            assert!(msg.contains("unreachable"), "{msg}");
        }
        other => panic!("expected Trapped, got {other:?}"),
    }
    match hostile.compat_key(&facts(&[("evil", "recurse")])) {
        // Rust keeps big frames on a shadow stack in linear memory: overflowing it runs off the
        // bottom of memory (out of bounds) before wasmtime's own call-stack limit is reached.
        Err(PolicyError::Trapped(msg)) => {
            assert!(
                msg.contains("call stack exhausted") || msg.contains("out of bounds memory access"),
                "{msg}"
            )
        }
        other => panic!("expected Trapped, got {other:?}"),
    }
    assert_eq!(
        hostile.compat_key(&facts(&[("evil", "error")])),
        Err(PolicyError::Internal("asked to fail".into())),
        "a policy-error value is passed through, typed"
    );
    host_still_works(&engine);
}

#[test]
fn reads_outside_the_root_are_refused() {
    let engine = engine_with(limits());
    let hostile = load(&engine, "hostile");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("d")).unwrap();
    std::fs::write(root.join("ok.txt"), b"inside").unwrap();
    std::fs::write(dir.path().join("secret"), b"outside").unwrap();
    std::os::unix::fs::symlink(dir.path().join("secret"), root.join("link")).unwrap();
    std::os::unix::fs::symlink(dir.path(), root.join("dirlink")).unwrap();
    let secret = dir.path().join("secret");
    let absolute = format!("read:{}", secret.display());
    let paths = [
        "read:../secret",
        "read:d/../../secret",
        absolute.as_str(),
        "read:link",
        "read:dirlink/secret",
        "read:d",
        "read:ok.txt",
    ];
    let entries: Vec<FileEntry> = paths.iter().map(|p| entry(p)).collect();
    let decisions = hostile.select(&root, &entries).unwrap().decisions;
    for (p, d) in paths.iter().zip(&decisions).take(paths.len() - 1) {
        assert!(d.detail.starts_with("refused: "), "{p}: {}", d.detail);
        assert!(!d.detail.contains("outside"), "{p} leaked: {}", d.detail);
    }
    assert!(
        decisions[3].detail.contains("symlink"),
        "{}",
        decisions[3].detail
    );
    assert_eq!(decisions[6].detail, "read ok: inside");

    // No root outside select: compat-key cannot read anything (exercised via the host unit tests);
    // the per-evaluation budget stops a policy that reads forever.
    let engine = engine_with(Limits {
        read_budget: 3 << 20,
        ..limits()
    });
    let hostile = load(&engine, "hostile");
    std::fs::write(root.join("big"), vec![1u8; 10 << 20]).unwrap();
    let d = hostile
        .select(&root, &[entry("readall:big")])
        .unwrap()
        .decisions;
    assert!(
        d[0].detail
            .starts_with("refused after 3145728 bytes: refused: the read budget"),
        "{}",
        d[0].detail
    );
    host_still_works(&engine);
}

#[test]
fn wrong_contract_version_is_refused_before_instantiation() {
    let engine = engine_with(limits());
    // A module built for contract 1 is told how to rebuild.
    let err = engine.load_file(&wasm("v1")).unwrap_err();
    let PolicyError::Contract(msg) = &err else {
        panic!("expected Contract, got {err:?}")
    };
    assert!(
        msg.contains("was built for policy contract 1 (jitship:policy@1.0.0)"),
        "{msg}"
    );
    assert!(
        msg.contains("rebuild it against jitship-policy-sdk 3 (jitship policy build)"),
        "{msg}"
    );
    // One built for a future major is told it is newer.
    let err = engine.load_file(&wasm("v4")).unwrap_err();
    let PolicyError::Contract(msg) = &err else {
        panic!("expected Contract, got {err:?}")
    };
    assert!(
        msg.contains(
            "speaks jitship:policy@4.0.0, a newer contract than this jitship's jitship:policy@3.0.0"
        ),
        "{msg}"
    );

    // A core module (built but not componentized) is refused with what to do.
    let core = out_dir().join("target/wasm32-unknown-unknown/policy/guest_good.wasm");
    let _ = guests();
    let err = engine.load_file(&core).unwrap_err();
    assert!(
        matches!(&err, PolicyError::Contract(m) if m.contains("jitship policy build")),
        "{err}"
    );
    let err = engine.load(b"not wasm at all", "junk").unwrap_err();
    assert!(matches!(err, PolicyError::Load(_)), "{err}");
    host_still_works(&engine);
}

#[test]
fn invalid_answers_are_refused() {
    let engine = engine_with(limits());
    let hostile = load(&engine, "hostile");
    let root = tempfile::tempdir().unwrap();
    let err = hostile
        .select(root.path(), &[entry("short"), entry("x"), entry("y")])
        .unwrap_err();
    assert!(
        matches!(&err, PolicyError::BadOutput(m) if m.contains("2 decisions for 3 entries")),
        "{err}"
    );
    let err = hostile
        .select(root.path(), &[entry("bigreason")])
        .unwrap_err();
    assert!(
        matches!(&err, PolicyError::BadOutput(m) if m.contains("detail for entry 0 is 100000 bytes")),
        "{err}"
    );
    for (path, what) in [
        ("skipcomplete", "skips entry 0 with category complete"),
        ("publishlock", "publishes entry 0 with category lock"),
        ("skiptraits", "skips entry 0 but gives it traits"),
        ("silentincomplete", "incomplete cache without saying why"),
    ] {
        let err = hostile.select(root.path(), &[entry(path)]).unwrap_err();
        assert!(
            matches!(&err, PolicyError::BadOutput(m) if m.contains(what)),
            "{path}: {err}"
        );
    }
    // canonicalize/materialize answers are bounded; an echo is fine.
    let grow = RelPath::parse("grow").unwrap();
    let err = hostile
        .canonicalize(root.path(), &grow, b"small")
        .unwrap_err();
    assert!(
        matches!(&err, PolicyError::BadOutput(m) if m.contains("canonicalize of grow answered")),
        "{err}"
    );
    let err = hostile
        .materialize(root.path(), &grow, b"small")
        .unwrap_err();
    assert!(
        matches!(&err, PolicyError::BadOutput(m) if m.contains("materialize of grow answered")),
        "{err}"
    );
    let echo = RelPath::parse("echo").unwrap();
    assert_eq!(
        hostile.canonicalize(root.path(), &echo, b"same").unwrap(),
        b"same"
    );
    let huge = vec![0u8; jitship::policy::host::MAX_REWRITE_BYTES + 1];
    let t = hostile
        .rewrite_traced(Rewrite::Canonicalize, root.path(), &echo, &huge)
        .unwrap();
    assert!(
        matches!(&t.value, Err(PolicyError::HostRefusedInput(m)) if m.contains("at most")),
        "{:?}",
        t.value.as_ref().err()
    );
    let spin = RelPath::parse("spin").unwrap();
    assert!(matches!(
        hostile.materialize(root.path(), &spin, b"x"),
        Err(PolicyError::OutOfFuel { .. })
    ));
    let err = hostile
        .compat_key(&facts(&[("evil", "bigkey")]))
        .unwrap_err();
    assert!(
        matches!(&err, PolicyError::BadOutput(m) if m.contains("1048576 bytes")),
        "{err}"
    );
    let err = hostile
        .compat_key(&facts(&[("evil", "emptykey")]))
        .unwrap_err();
    assert!(
        matches!(&err, PolicyError::BadOutput(m) if m.contains("empty key")),
        "{err}"
    );
    let err = hostile
        .retain(&[generation(1, 1, false)], 10, &RetentionLimits::default())
        .unwrap_err();
    assert!(
        matches!(&err, PolicyError::BadOutput(m) if m.contains("not-a-generation-we-gave-you")),
        "{err}"
    );

    // Log spam: the call succeeds, the host keeps a bounded number of truncated lines.
    let t = hostile
        .compat_key_traced(&facts(&[("evil", "logspam")]))
        .unwrap();
    assert_eq!(t.value.as_deref(), Ok("spammed"));
    assert_eq!(t.logs.len(), jitship::policy::host::MAX_LOG_MESSAGES);
    assert_eq!(
        t.logs_dropped,
        5000 - jitship::policy::host::MAX_LOG_MESSAGES as u64
    );
    assert!(
        t.logs
            .iter()
            .all(|l| l.message.len() < jitship::policy::host::MAX_LOG_MESSAGE + 32)
    );
    host_still_works(&engine);
}
