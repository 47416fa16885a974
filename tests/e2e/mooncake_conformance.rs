//! The store contract (`jitship::store::conformance`) against a real Mooncake cluster: the same
//! checks the local store passes in its unit tests.

use jitship::store::ValueClass;
use jitship::store::{MooncakeStore, Store, StoreError, conformance};
use jitship_tests::mooncake::{cluster, unique_prefix};

#[test]
#[ignore = "needs the Mooncake test cluster: tests/cluster/cluster.sh run -- cargo test -p jitship-tests --test e2e -- --ignored mooncake"]
fn mooncake_passes_the_store_conformance_suite() {
    let c = cluster("mooncake_passes_the_store_conformance_suite");
    let store = MooncakeStore::connect(&c.config())
        .unwrap_or_else(|e| panic!("connect to {}: {e}", c.master));
    conformance::run_all(&store, &unique_prefix("conformance"))
        .unwrap_or_else(|f| panic!("conformance failures:\n{f}"));
}

#[test]
#[ignore = "needs the Mooncake test cluster: tests/cluster/cluster.sh run -- cargo test -p jitship-tests --test e2e -- --ignored mooncake"]
fn mooncake_refuses_values_over_the_staging_buffer_and_reports_its_limit() {
    let c = cluster("mooncake_refuses_values_over_the_staging_buffer");
    let mut config = c.config();
    config.staging_buffer_size = bytesize::ByteSize::mib(1);
    config.staging_buffers = 2;
    let store = MooncakeStore::connect(&config).unwrap_or_else(|e| panic!("connect: {e}"));
    assert_eq!(store.max_value_size(), 1024 * 1024);
    let p = unique_prefix("too-large");
    let big = vec![7u8; 1024 * 1024 + 1];
    assert!(matches!(
        store.put(&format!("{p}/big"), &big, ValueClass::Record),
        Err(StoreError::TooLarge { .. })
    ));
    // Exactly the limit fits, and a batch mixing sizes answers per key.
    let fits = vec![9u8; 1024 * 1024];
    let (k1, k2, k3) = (
        format!("{p}/fits"),
        format!("{p}/big2"),
        format!("{p}/small"),
    );
    let r = store.put_batch(
        &[(&k1, &fits), (&k2, &big), (&k3, b"small")],
        ValueClass::Record,
    );
    assert!(
        r[0].is_ok() && matches!(r[1], Err(StoreError::TooLarge { .. })) && r[2].is_ok(),
        "{r:?}"
    );
    let got = store.get_batch(&[&k1, &k2, &k3]);
    assert_eq!(got[0].as_ref().unwrap().as_deref(), Some(&fits[..]));
    assert!(matches!(got[1], Ok(None)));
    assert_eq!(got[2].as_ref().unwrap().as_deref(), Some(&b"small"[..]));
    // A value written by a client with bigger buffers is TooLarge for this one, not a miss.
    let writer = MooncakeStore::connect(&c.config()).unwrap_or_else(|e| panic!("connect: {e}"));
    let k4 = format!("{p}/written-wide");
    writer
        .put(&k4, &vec![1u8; 3 * 1024 * 1024], ValueClass::Record)
        .unwrap();
    assert!(
        matches!(store.get(&k4), Err(StoreError::TooLarge { .. })),
        "{:?}",
        store.get(&k4).map(|v| v.map(|v| v.len()))
    );
}

#[test]
#[ignore = "needs the Mooncake test cluster: tests/cluster/cluster.sh run -- cargo test -p jitship-tests --test e2e -- --ignored mooncake"]
fn mooncake_connect_to_a_dead_master_fails_in_seconds_with_a_hint() {
    let c = cluster("mooncake_connect_to_a_dead_master_fails_in_seconds");
    let mut config = c.config();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    config.master = format!("127.0.0.1:{port}");
    // Its own connect deadline ends it: a hang is caught (60 s, far past anything a loaded machine
    // adds), the time is printed, not asserted.
    let (tx, rx) = std::sync::mpsc::channel();
    let started = std::time::Instant::now();
    let connecting = config.clone();
    std::thread::spawn(move || {
        let _ = tx.send(MooncakeStore::connect(&connecting).map(drop));
    });
    let err = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("connecting to a dead master hangs")
        .unwrap_err();
    eprintln!("a dead master refused in {:?}", started.elapsed());
    assert!(matches!(err, StoreError::MasterDown(_)), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&config.master) && msg.contains("store.mooncake.master"),
        "{msg}"
    );
}

#[test]
#[ignore = "needs the Mooncake test cluster: tests/cluster/cluster.sh run -- cargo test -p jitship-tests --test e2e -- --ignored mooncake"]
fn mooncake_staging_buffers_are_made_lazily_and_sized_to_the_work() {
    let c = cluster("mooncake_staging_buffers_are_made_lazily");
    const MIB: u64 = 1024 * 1024;
    // The default configuration: up to 4 buffers of 64 MiB.
    let store = MooncakeStore::connect(&c.config()).unwrap_or_else(|e| panic!("connect: {e}"));
    assert_eq!(
        store.registered_staging_bytes(),
        0,
        "nothing registered at connect"
    );
    let p = unique_prefix("lazy-staging");
    let (small, mid) = (format!("{p}/small"), format!("{p}/mid"));
    store.put(&small, b"small", ValueClass::Record).unwrap();
    assert_eq!(
        store.registered_staging_bytes(),
        8 * MIB,
        "a small value: one 8 MiB buffer"
    );
    let value: Vec<u8> = (0..12 * MIB).map(|i| (i % 251) as u8).collect();
    store.put(&mid, &value, ValueClass::Record).unwrap();
    assert_eq!(
        store.registered_staging_bytes(),
        24 * MIB,
        "a 12 MiB value: one more buffer of 16 MiB, the small one kept"
    );

    // A get of a value bigger than the buffer it tries first reads it whole with a bigger one.
    let reader = MooncakeStore::connect(&c.config()).unwrap_or_else(|e| panic!("connect: {e}"));
    assert_eq!(reader.get(&mid).unwrap().as_deref(), Some(&value[..]));
    assert_eq!(reader.get(&small).unwrap().as_deref(), Some(&b"small"[..]));
    assert_eq!(reader.registered_staging_bytes(), 24 * MIB);

    // At the bound (two buffers), a buffer too small is replaced by a bigger one, not added.
    let big: Vec<u8> = (0..18 * MIB).map(|i| (i % 241) as u8).collect();
    let big_key = format!("{p}/big");
    writer_put(&c, &big_key, &big);
    let mut two = c.config();
    two.staging_buffers = 2;
    let store = MooncakeStore::connect(&two).unwrap_or_else(|e| panic!("connect: {e}"));
    assert_eq!(store.get(&small).unwrap().as_deref(), Some(&b"small"[..]));
    assert_eq!(store.registered_staging_bytes(), 8 * MIB);
    assert_eq!(store.get(&mid).unwrap().as_deref(), Some(&value[..]));
    assert_eq!(store.registered_staging_bytes(), 24 * MIB);
    assert_eq!(store.get(&big_key).unwrap().as_deref(), Some(&big[..]));
    assert_eq!(
        store.registered_staging_bytes(),
        40 * MIB,
        "the 16 MiB buffer replaced by one of 32 MiB, the 8 MiB one kept"
    );
    let batch = store.get_batch(&[&small, &mid]);
    assert_eq!(batch[0].as_ref().unwrap().as_deref(), Some(&b"small"[..]));
    assert_eq!(batch[1].as_ref().unwrap().as_deref(), Some(&value[..]));
    // A sized batch reads values in place, in one buffer that fits them all.
    let sized = store.get_sized_batch(&[(&small, 5), (&mid, 12 * MIB), (&big_key, 18 * MIB)]);
    assert_eq!(sized[0].as_ref().unwrap().as_deref(), Some(&b"small"[..]));
    assert_eq!(sized[1].as_ref().unwrap().as_deref(), Some(&value[..]));
    assert_eq!(sized[2].as_ref().unwrap().as_deref(), Some(&big[..]));
    assert_eq!(store.registered_staging_bytes(), 40 * MIB);
}

/// Puts `value` under `key` with a client of the default configuration.
fn writer_put(c: &jitship_tests::mooncake::Cluster, key: &str, value: &[u8]) {
    let writer = MooncakeStore::connect(&c.config()).unwrap_or_else(|e| panic!("connect: {e}"));
    writer.put(key, value, ValueClass::Bulk).unwrap();
}
