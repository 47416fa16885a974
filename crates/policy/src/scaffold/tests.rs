use super::*;

/// Adding a file to plugins-sdk/ (a module, a build script, another .wit) without embedding it
/// would write a crate that does not build: every file there must be in `SDK_FILES`.
#[test]
fn the_embedded_sdk_is_every_file_of_plugins_sdk() {
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plugins-sdk");
    let mut on_disk: Vec<String> = walkdir::WalkDir::new(&sdk)
        .into_iter()
        .filter_entry(|e| e.file_name() != "target")
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            let rel = e.path().strip_prefix(&sdk).unwrap();
            rel.to_str().unwrap().to_string()
        })
        .collect();
    on_disk.sort();
    let mut embedded: Vec<String> = SDK_FILES.iter().map(|(p, _)| p.to_string()).collect();
    embedded.sort();
    assert_eq!(
        embedded, on_disk,
        "crates/policy/src/scaffold.rs SDK_FILES must list every file of plugins-sdk/"
    );
    for (path, text) in SDK_FILES {
        assert_eq!(
            std::fs::read_to_string(sdk.join(path)).unwrap(),
            *text,
            "{path}"
        );
    }
}

/// The same for the common crate a scaffold started from a built-in gets.
#[test]
fn the_embedded_common_is_every_file_of_policies_common() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies/common");
    let mut on_disk: Vec<String> = walkdir::WalkDir::new(&dir)
        .into_iter()
        .filter_entry(|e| e.file_name() != "target")
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            e.path()
                .strip_prefix(&dir)
                .unwrap()
                .to_str()
                .unwrap()
                .to_string()
        })
        .collect();
    on_disk.sort();
    let mut embedded: Vec<String> = COMMON_FILES.iter().map(|(p, _)| p.to_string()).collect();
    embedded.sort();
    assert_eq!(
        embedded, on_disk,
        "COMMON_FILES must list every file of policies/common/"
    );
    let manifest = standalone_common_manifest().unwrap();
    assert!(manifest.contains(SDK_DEP_WRITTEN_COMMON), "{manifest}");
}

/// `policy new --kind K` starts from the built-in of every kind jitship has one for: its
/// source is embedded, and its info is renamed and versioned from Cargo.toml.
#[test]
fn every_builtin_kind_has_its_source_embedded() {
    let mut kinds: Vec<&str> = crate::builtin::kinds().collect();
    kinds.sort_unstable();
    let mut embedded: Vec<&str> = BUILTIN_SOURCES.iter().map(|(k, _)| *k).collect();
    embedded.sort_unstable();
    assert_eq!(embedded, kinds);
    for (kind, source) in BUILTIN_SOURCES {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies");
        assert_eq!(
            std::fs::read_to_string(dir.join(kind).join("src/lib.rs")).unwrap(),
            *source,
            "{kind}"
        );
        let lib = from_builtin("my-policy", kind, source).unwrap();
        assert!(lib.contains("name: \"my-policy\".into(),"), "{kind}");
        assert!(
            lib.contains("version: env!(\"CARGO_PKG_VERSION\")"),
            "{kind}"
        );
    }
    let files = render("my-triton", "triton").unwrap();
    let lib = &files.iter().find(|(p, _)| p == "src/lib.rs").unwrap().1;
    assert!(lib.contains("default_root: \"~/.triton/cache\""), "{lib}");
    assert!(lib.contains("TRITON_CACHE_DIR") && lib.contains("materialize_group"));
    assert!(files.iter().any(|(p, _)| p == "common/src/triton.rs"));
    let generic = render("my-demo", "demo").unwrap();
    assert!(!generic.iter().any(|(p, _)| p.starts_with("common/")));
}

/// The same for the contract crate the SDK depends on.
#[test]
fn the_embedded_contract_is_every_file_of_policy_contract() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policy-contract");
    let mut on_disk: Vec<String> = walkdir::WalkDir::new(&dir)
        .into_iter()
        .filter_entry(|e| e.file_name() != "target")
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            let rel = e.path().strip_prefix(&dir).unwrap();
            rel.to_str().unwrap().to_string()
        })
        .collect();
    on_disk.sort();
    let mut embedded: Vec<String> = CONTRACT_FILES.iter().map(|(p, _)| p.to_string()).collect();
    embedded.sort();
    assert_eq!(
        embedded, on_disk,
        "crates/policy/src/scaffold.rs CONTRACT_FILES must list every file of crates/policy-contract/"
    );
    let m: toml::Table = standalone_manifest(CONTRACT_FILES[0].1)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        m["package"]["name"].as_str(),
        Some("jitship-policy-contract")
    );
    assert_eq!(m["package"]["version"].as_str(), Some(SDK_VERSION));
}

#[test]
fn the_sdk_manifest_is_standalone_with_the_workspace_values() {
    let text = standalone_sdk_manifest().unwrap();
    let m: toml::Table = text.parse().unwrap();
    assert!(
        !mentions_workspace(&toml::Value::Table(m.clone())),
        "{text}"
    );
    let pkg = m["package"].as_table().unwrap();
    assert_eq!(pkg["name"].as_str(), Some("jitship-policy-sdk"));
    assert_eq!(pkg["version"].as_str(), Some(SDK_VERSION));
    assert_eq!(pkg["edition"].as_str(), Some("2024"));
    assert_eq!(
        pkg["rust-version"].as_str(),
        Some(env!("CARGO_PKG_RUST_VERSION"))
    );
    assert_eq!(pkg["license"].as_str(), Some(env!("CARGO_PKG_LICENSE")));
    assert_eq!(m["dev-dependencies"]["tempfile"].as_str(), Some("3"));
    assert!(
        m["dependencies"]["wit-bindgen"]["version"]
            .as_str()
            .is_some()
    );
    assert_eq!(
        m["dependencies"]["jitship-policy-contract"]["path"].as_str(),
        Some("contract")
    );
    // Comments are kept.
    assert!(text.contains("# 0.60.0 generates with wit-component"));
}

#[test]
fn inline_tables_and_arrays_stay_on_one_line() {
    let v: toml::Table = r#"x = { version = "1", features = ["a", "b"] }"#.parse().unwrap();
    let line = format!("x = {}", inline(&v["x"]));
    assert!(!line.contains('\n'));
    let back: toml::Table = line.parse().unwrap();
    assert_eq!(back, v);
}

#[test]
fn names_kinds_and_type_names() {
    for ok in ["my-cache", "p", "A_b-9"] {
        check_name(ok).unwrap();
    }
    let long = "x".repeat(65);
    for bad in ["", "9x", "-x", "a b", "a/b", "é", long.as_str()] {
        assert!(check_name(bad).is_err(), "{bad:?}");
    }
    for ok in ["triton", "my-jit_2"] {
        check_kind(ok).unwrap();
    }
    for bad in ["", "Triton", "a.b", "a b"] {
        assert!(check_kind(bad).is_err(), "{bad:?}");
    }
    assert_eq!(type_name("my-cache"), "MyCache");
    assert_eq!(
        type_name("golden_retention-policy"),
        "GoldenRetentionPolicy"
    );
    assert_eq!(type_name("x"), "X");
}

#[test]
fn render_fills_every_placeholder() {
    let files = render("my-jit-policy", "my-jit").unwrap();
    let paths: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
    assert!(paths.contains(&"Cargo.toml") && paths.contains(&"sdk/wit/policy.wit"));
    for (path, text) in &files {
        if !path.starts_with("sdk/") {
            assert!(!text.contains("{{"), "{path} keeps a placeholder");
        }
    }
    let lib = &files.iter().find(|(p, _)| p == "src/lib.rs").unwrap().1;
    assert!(lib.contains("pub struct MyJitPolicy {"));
    assert!(lib.contains(r#"pub const KIND: &str = "my-jit";"#));
    assert!(lib.contains(&format!("pub const KEEP: u32 = {KEEP};")));
    assert!(lib.contains("MY_JIT_CACHE_DIR"));
    let manifest: toml::Table = files[0].1.parse().unwrap();
    assert_eq!(manifest["package"]["name"].as_str(), Some("my-jit-policy"));
    assert_eq!(
        manifest["dependencies"]["jitship-policy-sdk"]["path"].as_str(),
        Some("sdk")
    );
}

#[test]
fn create_refuses_a_non_empty_directory_and_writes_into_an_empty_one() {
    let tmp = tempfile::tempdir().unwrap();
    let taken = tmp.path().join("taken");
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("keep.txt"), b"mine").unwrap();
    let req = |dir: PathBuf| NewPolicy {
        name: "p".into(),
        kind: "k".into(),
        dir,
    };
    let err = create(&req(taken.clone())).unwrap_err();
    assert!(matches!(err, ScaffoldError::NotEmpty(_)), "{err}");
    assert_eq!(std::fs::read_dir(&taken).unwrap().count(), 1);
    let file = tmp.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    assert!(matches!(
        create(&req(file)).unwrap_err(),
        ScaffoldError::NotADirectory(_)
    ));

    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let done = create(&req(empty.clone())).unwrap();
    assert_eq!(done.files.len(), 4 + SDK_FILES.len() + CONTRACT_FILES.len());
    assert!(empty.join("sdk/src/lib.rs").is_file());
    assert!(empty.join("sdk/contract/src/lib.rs").is_file());
    let fresh = create(&req(tmp.path().join("a/b/new"))).unwrap();
    assert_eq!(fresh.crate_name, "p");
    assert!(tmp.path().join("a/b/new/src/lib.rs").is_file());
}

#[test]
fn every_file_a_builtin_includes_is_embedded() {
    // A new policy starts from the built-in's lib.rs; a file it `include_str!`s that is not
    // written beside it breaks the new policy's `cargo test`.
    for (kind, source) in BUILTIN_SOURCES {
        let files = render("my-policy", kind).unwrap();
        for included in source
            .split("include_str!(\"")
            .skip(1)
            .filter_map(|rest| rest.split_once("\")").map(|(name, _)| name))
        {
            let path = format!("src/{included}");
            let written = files
                .iter()
                .find(|(p, _)| *p == path)
                .unwrap_or_else(|| panic!("{kind}: src/lib.rs includes {included}, not written"));
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies");
            assert_eq!(
                std::fs::read_to_string(dir.join(kind).join(&path)).unwrap(),
                written.1,
                "{kind}: {path}"
            );
        }
    }
}
