//! Interop with the official Mooncake Python client (`mooncake.store.MooncakeDistributedStore`
//! from the official `mooncake-transfer-engine-non-cuda` wheel): what jitship writes, Python reads
//! byte for byte, and the other way round. Proves jitship's objects are plain Mooncake objects.

use std::path::Path;
use std::process::Command;

use jitship::store::ValueClass;
use jitship::store::{MooncakeStore, Store};
use jitship_tests::fixtures::bytes;
use jitship_tests::mooncake::{Cluster, cluster, unique_prefix};

fn python(c: &Cluster, op: &str, key: &str, file: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/mooncake_interop.py");
    let pythonpath = c
        .pythonpath
        .as_ref()
        .expect("JITSHIP_TEST_MOONCAKE_PYTHONPATH names the official wheel");
    let out = Command::new("python3")
        .arg(&script)
        .args([c.master.as_str(), c.metadata.as_str(), op, key])
        .arg(file)
        .env("PYTHONPATH", pythonpath)
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3: {e}"));
    assert!(
        out.status.success(),
        "official Python client, {op} {key}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| !l.contains("metadata not found"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
#[ignore = "needs the Mooncake test cluster: tests/cluster/cluster.sh run -- cargo test -p jitship-tests --test e2e -- --ignored mooncake"]
fn objects_cross_between_jitship_and_the_official_python_client() {
    let c = cluster("objects_cross_between_jitship_and_the_official_python_client");
    let store = MooncakeStore::connect(&c.config()).unwrap_or_else(|e| panic!("connect: {e}"));
    let tmp = tempfile::tempdir().unwrap();
    let p = unique_prefix("interop");

    // jitship -> Python, a small and a multi-MiB value.
    for (name, len) in [("small", 1000usize), ("large", 3 * 1024 * 1024 + 5)] {
        let key = format!("{p}/from-jitship/{name}");
        let value = bytes(len as u64, len);
        store.put(&key, &value, ValueClass::Record).unwrap();
        let file = tmp.path().join(format!("py-read-{name}"));
        python(&c, "get", &key, &file);
        let got = std::fs::read(&file).unwrap();
        assert!(
            got == value,
            "Python read {} bytes that differ from the {} jitship wrote",
            got.len(),
            value.len()
        );
    }

    // Python -> jitship.
    for (name, len) in [("small", 777usize), ("large", 2 * 1024 * 1024 + 3)] {
        let key = format!("{p}/from-python/{name}");
        let value = bytes(len as u64 + 99, len);
        let file = tmp.path().join(format!("py-write-{name}"));
        std::fs::write(&file, &value).unwrap();
        python(&c, "put", &key, &file);
        let got = store
            .get(&key)
            .unwrap()
            .expect("jitship finds what Python wrote");
        assert!(
            got == value,
            "jitship read {} bytes that differ from the {} Python wrote",
            got.len(),
            value.len()
        );
        let batch = store.get_batch(&[key.as_str()]);
        assert_eq!(batch[0].as_ref().unwrap().as_deref(), Some(&value[..]));
    }
}
