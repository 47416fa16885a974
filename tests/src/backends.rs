//! The stores an end-to-end test runs against: [`Place::Local`] is the local store and the local
//! store with listing hidden (the code paths Mooncake takes); [`Place::Mooncake`] is the real
//! Mooncake cluster `tests/cluster/cluster.sh run -- ...` describes. A test over backends is
//! written once, as `fn x_on(place: Place)`, and declared twice: `x` on the local stores and an
//! `#[ignore]`d `x_on_mooncake`, which fails outside the cluster (`mooncake::cluster`).

use std::path::PathBuf;
use std::sync::Arc;

use jitship::catalog::KeyLayout;
use jitship::config::{Backend as BackendKind, Config, StoreConfig};
use jitship::store::testing::WithoutListing;
use jitship::store::{LocalStore, MooncakeStore, Store};

pub struct Backend {
    pub name: &'static str,
    pub store: Arc<dyn Store>,
    pub layout: KeyLayout,
    /// Whether the store lists keys (orphans are found only then).
    pub lists: bool,
    /// Flags that point the `jitship` CLI at this store and namespace, if the CLI can reach it
    /// (the local store with listing hidden exists only inside the test process).
    pub cli: Option<Vec<String>>,
    _tmp: tempfile::TempDir,
}

/// Where a test over backends runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The local store, with and without listing.
    Local,
    /// The Mooncake test cluster.
    Mooncake,
}

/// The backends for `test` at `place`, each with a namespace of its own.
pub fn backends(test: &str, place: Place) -> Vec<Backend> {
    match place {
        Place::Local => vec![local(test, false), local(test, true)],
        Place::Mooncake => vec![mooncake(test)],
    }
}

/// The backends at `place` the CLI can reach (the local store with listing hidden lives only
/// inside the test process).
pub fn cli_backends(test: &str, place: Place) -> Vec<Backend> {
    backends(test, place)
        .into_iter()
        .filter(|b| b.cli.is_some())
        .collect()
}

pub fn local(_test: &str, hide_listing: bool) -> Backend {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("store");
    let local = LocalStore::open(&dir).expect("open local store");
    let ns = "jitship-test";
    let (name, store, cli): (_, Arc<dyn Store>, _) = if hide_listing {
        (
            "local-without-listing",
            Arc::new(WithoutListing(local)),
            None,
        )
    } else {
        (
            "local",
            Arc::new(local),
            Some(vec![
                "--store".to_owned(),
                format!("local:{}", dir.display()),
                "--namespace".to_owned(),
                ns.to_owned(),
            ]),
        )
    };
    Backend {
        name,
        store,
        layout: KeyLayout::new(ns).expect("namespace"),
        lists: !hide_listing,
        cli,
        _tmp: tmp,
    }
}

pub fn mooncake(test: &str) -> Backend {
    let cluster = crate::mooncake::cluster(test);
    let tmp = tempfile::tempdir().expect("tempdir");
    let ns = crate::mooncake::unique_prefix(test);
    let store = MooncakeStore::connect(&cluster.config())
        .unwrap_or_else(|e| panic!("{test}: connecting to the test cluster: {e}"));
    let config = Config {
        store: StoreConfig {
            backend: BackendKind::Mooncake,
            namespace: ns.clone(),
            mooncake: cluster.config(),
            ..StoreConfig::default()
        },
        ..Config::default()
    };
    let path: PathBuf = tmp.path().join("jitship.toml");
    let text = toml::to_string(&config).expect("config serializes");
    std::fs::write(&path, text).expect("write config");
    Backend {
        name: "mooncake",
        store: Arc::new(store),
        layout: KeyLayout::new(&ns).expect("namespace"),
        lists: false,
        cli: Some(vec!["--config".to_owned(), path.display().to_string()]),
        _tmp: tmp,
    }
}

/// Removes `key`, waiting out readers' leases (Mooncake refuses to remove a key read or probed in
/// the last 10 s). Test setup only (corrupting or losing data on purpose).
pub fn remove_retrying(store: &dyn Store, key: &str) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
    loop {
        match store.remove(key) {
            Ok(removed) => return removed,
            Err(jitship::store::StoreError::Leased(_)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
            Err(e) => panic!("removing {key}: {e}"),
        }
    }
}

/// Declares a test over backends, written once as `fn x_on(place: Place)`, twice: `x` on the
/// local stores and `x_on_mooncake`, ignored in the fast loop, on the Mooncake test cluster
/// (tests/run-all.sh's Mooncake steps run it with `-- --ignored mooncake`). Attributes (doc
/// comments) go on both. Several may be declared in one call.
///
/// ```ignore
/// on_local_and_mooncake! {
///     /// What it shows.
///     x, x_on_mooncake => x_on;
/// }
/// ```
#[macro_export]
macro_rules! on_local_and_mooncake {
    ($($(#[$attr:meta])* $local:ident, $mooncake:ident => $on:path;)+) => {$(
        $(#[$attr])*
        #[test]
        fn $local() {
            $on($crate::backends::Place::Local);
        }

        $(#[$attr])*
        #[test]
        #[ignore = "needs the Mooncake test cluster: tests/cluster/cluster.sh run -- cargo test -p jitship-tests --test e2e -- --ignored mooncake"]
        fn $mooncake() {
            $on($crate::backends::Place::Mooncake);
        }
    )+};
}
