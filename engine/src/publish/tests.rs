use std::sync::Mutex;

use super::manifest::manifest_limit;
use super::packs::KEEP_FILE_LIMIT;
use super::*;
use crate::facts::Facts;
use crate::generation::{
    ContentHash, GenerationId, HeadRecord, MAX_MANIFEST_BYTES, Manifest, Producer, merge_files,
};
use crate::policy::native::NativeRules;
use crate::policy::testing::HookedPolicy;
use crate::store::testing::Hooked;
use crate::store::{LocalStore, ValueClass};
use crate::trust::PublishTrust;

mod contributions;
mod limits;
mod races;
mod root;

#[test]
fn kept_contents_stay_within_the_budget_and_go_once_fully_packed() {
    let kept = KeptContents::new(10);
    let (a, b) = (ContentHash::of(b"0123456"), ContentHash::of(b"xyz"));
    assert!(kept.reserve(7));
    kept.keep(a, b"0123456".to_vec(), 7);
    // An identical content is not kept twice: its reservation comes back.
    assert!(kept.reserve(3));
    kept.keep(a, b"0123456".to_vec(), 3);
    assert!(kept.reserve(3));
    kept.keep(b, b"xyz".to_vec(), 3);
    assert!(!kept.reserve(1), "budget of 10 spent on 7 + 3 bytes");
    assert!(!kept.reserve(KEEP_FILE_LIMIT + 1));
    // Pieces in order; the content is dropped after its last piece.
    let mut first = [0u8; 4];
    assert!(kept.copy_piece(&a, 0, &mut first));
    assert_eq!(&first, b"0123");
    let mut rest = [0u8; 3];
    assert!(kept.copy_piece(&a, 4, &mut rest));
    assert_eq!(&rest, b"456");
    assert!(!kept.copy_piece(&a, 0, &mut first), "dropped once packed");
    assert!(!kept.copy_piece(&ContentHash::of(b"other"), 0, &mut rest));
}

/// Another publisher racing ours: once `winner` is set, its head (naming that generation) lands
/// at the key of our first head put just before ours. It signs with `resign`, or else keeps our
/// signature, which then no longer matches: a forged head.
#[derive(Debug, Default)]
struct Race {
    winner: Mutex<Option<GenerationId>>,
    resign: Mutex<Option<crate::trust::PublisherKey>>,
}

type LosesFirstHead = Hooked<LocalStore, Race>;

fn loses_first_head(inner: LocalStore) -> LosesFirstHead {
    Hooked::new(inner, Race::default()).on_put(|inner, race, key, value, class| {
        if key.contains("/head/")
            && let Some(winner) = race.winner.lock().unwrap().take()
        {
            let mut head = HeadRecord::decode(value).unwrap();
            head.generation = winner;
            head.writer = "the other publisher".into();
            if let Some(k) = race.resign.lock().unwrap().as_ref() {
                k.sign("ns", &mut head);
            }
            inner.put(key, &head.encode(), ValueClass::Record)?;
        }
        inner.put(key, value, class)
    })
}

/// The other publisher's head put (see `Race`) is "in flight": its value is there (our put
/// keeps it) but the first `reads` gets of that key miss, as on Mooncake.
#[derive(Debug)]
struct Hidden {
    key: Mutex<Option<String>>,
    reads: Mutex<u32>,
}

fn in_flight_head(race: LosesFirstHead, reads: u32) -> Hooked<LosesFirstHead, Hidden> {
    let hidden = Hidden {
        key: Mutex::new(None),
        reads: Mutex::new(reads),
    };
    Hooked::new(race, hidden)
        .on_put(|race, hidden, key, value, class| {
            if key.contains("/head/") && race.state.winner.lock().unwrap().is_some() {
                *hidden.key.lock().unwrap() = Some(key.to_owned());
            }
            race.put(key, value, class)
        })
        .on_get(|race, hidden, key| {
            if hidden.key.lock().unwrap().as_deref() == Some(key) {
                let mut n = hidden.reads.lock().unwrap();
                if *n > 0 {
                    *n -= 1;
                    return Ok(None);
                }
            }
            race.get(key)
        })
}

fn opts() -> PublishOptions {
    let mut facts = Facts::new();
    facts.set("model.id", "m");
    PublishOptions {
        pack_size: 4096,
        producer: Producer {
            host: "h".into(),
            pod: None,
            jitship_version: "t".into(),
        },
        facts,
        max_head_attempts: 4,
        trust: Default::default(),
        interrupt: Default::default(),
        registry: None,
    }
}

fn tree(root: &Path, files: &[(&str, &[u8])]) {
    for (p, c) in files {
        let path = root.join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, c).unwrap();
    }
}

fn run(store: &dyn Store, layout: &KeyLayout, root: &Path) -> PublishReport {
    try_run(store, layout, root).unwrap()
}

/// A publish of `root` with the triton rules and `opts()`.
fn try_run(
    store: &dyn Store,
    layout: &KeyLayout,
    root: &Path,
) -> Result<PublishReport, PublishError> {
    publish(
        store,
        layout,
        &NativeRules::new("triton"),
        root,
        &opts(),
        None,
    )
}

/// The manifest of the generation `r` published (panics on any other outcome).
fn published_manifest(store: &dyn Store, layout: &KeyLayout, r: &PublishReport) -> Manifest {
    let PublishOutcome::Published { generation, .. } = &r.outcome else {
        panic!("{:?}", r.outcome)
    };
    catalog::fetch_manifest(store, layout, generation)
        .unwrap()
        .unwrap()
}

fn paths(m: &Manifest) -> Vec<String> {
    m.files.iter().map(|f| f.path.to_string()).collect()
}

/// Publishes `files` as another publisher's generation in a scratch namespace and copies its
/// packs (and, if `with_manifest`, its manifest) into `layout`, without a head.
fn other_publisher(
    store: &LosesFirstHead,
    layout: &KeyLayout,
    dir: &Path,
    files: &[(&str, &[u8])],
    with_manifest: bool,
) -> GenerationId {
    let scratch = KeyLayout::new("scratch").unwrap();
    let root = dir.join("winner");
    tree(&root, files);
    let r = run(&store.inner, &scratch, &root);
    let PublishOutcome::Published { generation, .. } = r.outcome else {
        panic!("{:?}", r.outcome)
    };
    let m = catalog::fetch_manifest(&store.inner, &scratch, &generation)
        .unwrap()
        .unwrap();
    for p in &m.packs {
        let bytes = store.inner.get(&scratch.pack(&p.id)).unwrap().unwrap();
        store
            .inner
            .put(&layout.pack(&p.id), &bytes, ValueClass::Bulk)
            .unwrap();
    }
    if with_manifest {
        store
            .inner
            .put(
                &layout.generation(&generation),
                &m.encode(),
                ValueClass::Record,
            )
            .unwrap();
    }
    generation
}

fn setup() -> (tempfile::TempDir, LosesFirstHead, KeyLayout) {
    let dir = tempfile::tempdir().unwrap();
    let store = loses_first_head(LocalStore::open(dir.path().join("store")).unwrap());
    (dir, store, KeyLayout::new("ns").unwrap())
}

// Contributions (issue 40; `docs/concurrent-publishes.md`): a loser leaves its generation where
// the next head's writer merges it, and is done once a head names it.
