//! A call tried again across a master restart (`[store.mooncake] retry_for`).

use super::*;

/// A master restarted under a client: the client's calls fail (RPC_FAIL) until it reconnects.
/// Without a durable tier a call is tried again within `retry_for`, so a put made while the
/// master was down succeeds once it is back, and reads back.
#[test]
#[ignore = "needs the Mooncake test cluster: tests/cluster/cluster.sh run -- cargo test -p jitship-tests --test e2e -- --ignored mooncake"]
fn mooncake_a_put_while_the_master_restarts_is_tried_again_until_it_succeeds() {
    let _serial = serial();
    let c = cluster("mooncake_a_put_while_the_master_restarts");
    let mut config = c.config();
    config.call_timeout = Duration::from_secs(10);
    config.staging_buffer_size = bytesize::ByteSize::mib(8);
    config.retry_for = Duration::from_secs(90);
    let store =
        Arc::new(MooncakeStore::connect(&config).unwrap_or_else(|e| panic!("connect: {e}")));
    let key = format!("{}/retried", unique_prefix("retry"));
    // A client that has worked already: its staging buffer is registered (registering one needs
    // the master's metadata server, and fails with INVALID_PARAMS while it is down).
    store
        .put(&format!("{key}-before"), b"before", ValueClass::Bulk)
        .unwrap();
    c.ctl(&["kill-master"]);
    let t = Instant::now();
    let writer = {
        let (store, key) = (store.clone(), key.clone());
        std::thread::spawn(move || store.put(&key, b"written across a restart", ValueClass::Bulk))
    };
    // The master comes back only once the put has failed and waits to try again.
    if !store.wait_for_retries(1, Duration::from_secs(60)) {
        c.ctl(&["start-master"]);
        c.ctl(&["wait-node"]);
        panic!(
            "the put never retried: {:?}",
            writer.is_finished().then(|| writer.join().unwrap())
        );
    }
    c.ctl(&["start-master"]);
    c.ctl(&["wait-node"]);
    let put = writer.join().unwrap();
    eprintln!(
        "DRILL retry: a put begun with the master down succeeded {:.1?} later, after {} retries",
        t.elapsed(),
        store.retries()
    );
    put.unwrap_or_else(|e| panic!("the put across the restart: {e}"));
    assert_eq!(
        store.get(&key).unwrap().as_deref(),
        Some(&b"written across a restart"[..])
    );
}
