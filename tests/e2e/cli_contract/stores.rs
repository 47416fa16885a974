//! Stores beyond the one: a durable tier serves what the store lost; `export` then `import`
//! into an empty store installs the same signed bytes.

use super::*;
use jitship_tests::fixtures::copy_tree;

/// `--durable-store`: publish writes both tiers; when the fast store has lost everything (an
/// evicted or restarted Mooncake, here a local store emptied), install is served by the durable
/// tier byte for byte, says so in its report, and puts what it read back, so the next install is
/// the fast tier's alone.
#[test]
fn a_durable_tier_serves_what_the_store_lost_and_repairs_it() {
    let env = Env::new();
    triton_tree(&env.path("src"), 3, 9);
    let durable = format!("local:{}", env.path("durable").display());
    let with_durable = |root: &str| {
        let mut flags = cache_flags(&env, root, "durable");
        flags.extend(["--durable-store".to_owned(), durable.clone()]);
        flags
    };
    let out = run_with(&env, "publish", &with_durable("src"), &["--json"]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert_eq!(json(&out)["results"][0]["outcome"], "published");

    // The fast store loses everything.
    std::fs::remove_dir_all(env.path("store")).unwrap();
    let plain = run_with(
        &env,
        "install",
        &cache_flags(&env, "plain", "durable"),
        &["--json"],
    );
    assert_eq!(
        code(&plain),
        11,
        "without the durable tier: a miss: {}",
        show(&plain)
    );

    let out = run_with(&env, "install", &with_durable("dst1"), &["--json"]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let r = &json(&out)["results"][0];
    assert_eq!(r["outcome"], "installed", "{r}");
    let tiers = &r["tiers"];
    let hits = tiers["durable_hits"].as_u64().unwrap();
    assert!(hits > 0 && tiers["fast_hits"] == 0, "{tiers}");
    assert_eq!(tiers["repaired"].as_u64(), Some(hits), "{tiers}");
    assert_eq!(
        jitship_tests::fixtures::digest(&env.path("dst1")),
        jitship_tests::fixtures::digest(&env.path("src"))
    );

    // Repaired: the next pod's install is the fast tier's alone, with or without the durable one.
    let out = run_with(&env, "install", &with_durable("dst2"), &["--json"]);
    let tiers = &json(&out)["results"][0]["tiers"];
    assert_eq!(tiers["durable_hits"], 0, "{tiers}");
    assert!(tiers["fast_hits"].as_u64().unwrap() > 0, "{tiers}");
    let out = run_with(&env, "install", &cache_flags(&env, "dst3", "durable"), &[]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    // The person's summary says where it came from.
    let out = run_with(&env, "install", &with_durable("dst4"), &[]);
    assert!(
        text(&out.stdout).contains("0 (0 B) from the durable tier"),
        "{}",
        show(&out)
    );
}

/// `export` then `import` into an empty store at another path, and `install` from it: the same
/// bytes, the publisher's signature kept (a host that requires it installs); the layout is an OCI
/// image layout (checked field by field against the image spec, as no OCI tool is installed
/// here); an altered blob or a store that already has the key writes nothing.
#[test]
fn export_then_import_into_an_empty_store_installs_the_same_signed_bytes() {
    let env = Env::new();
    let key = env.path("publisher.key");
    let out = env.run(&["key", "generate", "--out", key.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let public = text(&out.stdout).trim().to_owned();
    for (root, tag, seed) in [("src-a", "bake-a", 3), ("src-b", "bake-b", 4)] {
        triton_tree(&env.path(root), 2, seed);
        let mut flags = cache_flags(&env, root, tag);
        flags.extend(["--signing-key".to_owned(), key.display().to_string()]);
        let out = run_with(&env, "publish", &flags, &["--json"]);
        assert_eq!(code(&out), 0, "{}", show(&out));
    }
    // A second generation of a, so the exported head is not seq 1.
    triton_tree(&env.path("src-a/more"), 1, 5);
    let mut flags = cache_flags(&env, "src-a", "bake-a");
    flags.extend(["--signing-key".to_owned(), key.display().to_string()]);
    assert_eq!(code(&run_with(&env, "publish", &flags, &[])), 0);

    let layout = env.path("layout");
    let out = env.run(&[
        "export",
        "--store",
        &env.store(),
        "--out",
        layout.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let exported = &json(&out)["results"][0]["generations"];
    assert_eq!(exported.as_array().unwrap().len(), 2, "{exported}");

    // The OCI image layout, as the image spec defines it.
    let read = |p: &Path| -> Value { serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap() };
    assert_eq!(
        read(&layout.join("oci-layout"))["imageLayoutVersion"],
        "1.0.0"
    );
    let index = read(&layout.join("index.json"));
    assert_eq!(index["schemaVersion"], 2);
    assert_eq!(
        index["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    let blob = |digest: &str| -> Vec<u8> {
        let hex = digest.strip_prefix("sha256:").unwrap();
        let bytes = std::fs::read(layout.join("blobs/sha256").join(hex)).unwrap();
        use sha2::Digest;
        assert_eq!(format!("{:x}", sha2::Sha256::digest(&bytes)), hex);
        bytes
    };
    for d in index["manifests"].as_array().unwrap() {
        assert_eq!(d["mediaType"], "application/vnd.oci.image.manifest.v1+json");
        assert_eq!(d["artifactType"], "application/vnd.jitship.generation.v1");
        let tag = d["annotations"]["org.opencontainers.image.ref.name"]
            .as_str()
            .unwrap();
        assert_eq!(tag.len(), 64, "the compat id names it: {d}");
        let m: Value = serde_json::from_slice(&blob(d["digest"].as_str().unwrap())).unwrap();
        assert_eq!(m["schemaVersion"], 2);
        assert_eq!(
            m["config"]["mediaType"],
            "application/vnd.jitship.generation.manifest.v1+json"
        );
        blob(m["config"]["digest"].as_str().unwrap());
        let layers = m["layers"].as_array().unwrap();
        for l in layers {
            assert_eq!(
                blob(l["digest"].as_str().unwrap()).len() as u64,
                l["size"].as_u64().unwrap()
            );
        }
        assert_eq!(
            layers.last().unwrap()["mediaType"],
            "application/vnd.jitship.head.v1+json"
        );
        assert!(
            m["annotations"]["dev.jitship.signer"]
                .as_str()
                .unwrap()
                .starts_with("signed"),
            "{m}"
        );
        assert!(
            m["annotations"]["dev.jitship.compat-key"]
                .as_str()
                .unwrap()
                .contains("bake-")
        );
    }

    // An altered blob: refused, nothing written to the store.
    let altered = env.path("altered");
    copy_tree(&layout, &altered);
    let victim = std::fs::read_dir(altered.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&victim, bytes).unwrap();
    let other = format!("local:{}", env.path("other-store").display());
    let out = env.run(&[
        "import",
        "--store",
        &other,
        "--from",
        altered.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 1, "{}", show(&out));
    assert!(
        text(&out.stderr).contains("does not hash to its digest"),
        "{}",
        show(&out)
    );
    let ls = env.run(&["ls", "--store", &other, "--json"]);
    let listed = json(&ls);
    assert_eq!(
        listed["results"][0]["compats"],
        serde_json::json!([]),
        "nothing of a refused layout is written: {listed}"
    );

    // Into an empty store: imported, and installed from there, the signature required.
    let out = env.run(&[
        "import",
        "--store",
        &other,
        "--from",
        layout.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let imported = &json(&out)["results"][0]["generations"];
    for g in imported.as_array().unwrap() {
        assert_eq!(g["outcome"], "imported", "{g}");
    }
    assert!(
        imported.as_array().unwrap().iter().any(|g| g["seq"] == 2),
        "{imported}"
    );
    for (root, src, tag) in [("dst-a", "src-a", "bake-a"), ("dst-b", "src-b", "bake-b")] {
        let out = env.run(&[
            "install",
            "--store",
            &other,
            "--cache",
            &format!("kernels:native={}", env.path(root).display()),
            "--fact",
            &format!("test.tag={tag}"),
            "--trusted-key",
            &public,
            "--trust-mode",
            "required",
        ]);
        assert_eq!(code(&out), 0, "{}", show(&out));
        assert_eq!(
            jitship_tests::fixtures::digest(&env.path(root)),
            jitship_tests::fixtures::digest(&env.path(src)),
            "{root}"
        );
    }
    // Again: already there. Into the first store (it has those keys): left out, said so.
    let out = env.run(&[
        "import",
        "--store",
        &other,
        "--from",
        layout.to_str().unwrap(),
        "--json",
    ]);
    for g in json(&out)["results"][0]["generations"].as_array().unwrap() {
        assert_eq!(g["outcome"], "already-present", "{g}");
    }
    let out = env.run(&[
        "import",
        "--store",
        &env.store(),
        "--from",
        layout.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert!(
        text(&out.stdout).contains("already-present"),
        "{}",
        show(&out)
    );
}
