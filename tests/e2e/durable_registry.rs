//! The durable registry tier against a real registry (Debian's docker-registry on 127.0.0.1) and
//! the real CLI, on the local store: publish pushes generations as OCI artifacts that a standard
//! tool (skopeo) lists; an install whose store lost everything is served by the registry and
//! puts the generation back (the next install never asks the registry); tags that are forged or
//! refused by the trust are passed over; a registry that is down or silent leaves installs
//! bounded by their deadline and store hits untouched; gc deletes what retention dropped; an
//! exported layout copied into the registry by skopeo installs like a pushed one.
//!
//! The Mooncake drills (master restart, eviction) are in `mooncake_drills/`.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Output};

use jitship_tests::fixtures::{digest, triton_tree};
use jitship_tests::output::{code, show, text};
use jitship_tests::registry::{TestRegistry, skopeo_tags};
use serde_json::Value;

struct Env {
    tmp: tempfile::TempDir,
    public_key: String,
}

impl Env {
    /// A temporary directory with a publisher key (`publisher.key`).
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let key = tmp.path().join("publisher.key");
        let out = run(&["key", "generate", "--out", key.to_str().unwrap()]);
        assert_eq!(code(&out), 0, "{}", show(&out));
        let public_key = text(&out.stdout).trim().to_owned();
        Self { tmp, public_key }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.tmp.path().join(p)
    }

    fn store(&self, name: &str) -> String {
        format!("local:{}", self.path(name).display())
    }

    /// `publish` of `root` (key fact `test.tag=tag`) to `store`, signed unless `unsigned`, with
    /// the durable tier `durable`.
    fn publish(&self, store: &str, root: &str, durable: &str, signed: bool) -> Output {
        let key = self.path("publisher.key");
        let root = format!("kernels:native={}", self.path(root).display());
        let mut args = vec![
            "publish",
            "--store",
            store,
            "--cache",
            &root,
            "--fact",
            "test.tag=durable",
            "--durable-store",
            durable,
            "--json",
        ];
        if signed {
            args.extend(["--signing-key", key.to_str().unwrap()]);
        }
        run(&args)
    }

    /// `install` into `root` from `store` with the durable tier `durable`, trusting only the
    /// publisher key.
    fn install(&self, store: &str, root: &str, durable: &str, deadline: &str) -> Output {
        let root = format!("kernels:native={}", self.path(root).display());
        run(&[
            "install",
            "--store",
            store,
            "--cache",
            &root,
            "--fact",
            "test.tag=durable",
            "--durable-store",
            durable,
            "--trusted-key",
            &self.public_key,
            "--trust-mode",
            "required",
            "--deadline",
            deadline,
            "--json",
        ])
    }
}

fn run(args: &[&str]) -> Output {
    jitship_tests::cli::jitship()
        .args(args)
        .env("RUST_LOG", "warn")
        // No docker config of the machine's: the test registry is anonymous.
        .env("DOCKER_CONFIG", "/nonexistent")
        .output()
        .expect("run jitship-e2e")
}

fn result(out: &Output) -> Value {
    let v: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", show(out)));
    v["results"][0].clone()
}

#[test]
#[ignore = "needs Debian's docker-registry and skopeo (apt-get install docker-registry skopeo): tests/run-all.sh runs it with -- --ignored durable_registry::"]
fn publish_pushes_and_an_install_whose_store_lost_everything_pulls_and_puts_it_back() {
    let env = Env::new();
    let registry = TestRegistry::start();
    let durable = registry.durable_store_arg();
    triton_tree(&env.path("src"), 3, 11);

    let out = env.publish(&env.store("store"), "src", &durable, true);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let published = result(&out);
    let compat = published["compat_id"].as_str().unwrap().to_owned();
    let generation = published["generation"].as_str().unwrap().to_owned();
    let pushed = &published["registry"]["generation"];
    assert!(
        pushed["outcome"].as_str().unwrap().starts_with("pushed to"),
        "{published}"
    );
    // A standard tool sees the generation's tag and the compat id's newest-pointer tag.
    let tag = format!("{compat}.1.{}", &generation[..16]);
    let tags = skopeo_tags(&registry);
    assert!(tags.contains(&tag), "{tags:?}");
    assert!(tags.contains(&compat), "{tags:?}");

    // Publishing the same tree again pushes nothing.
    let out = env.publish(&env.store("store"), "src", &durable, true);
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert_eq!(
        result(&out)["registry"]["generation"]["outcome"],
        "already-present",
        "{}",
        show(&out)
    );

    // A store that lost everything (a new, empty one): served by the registry, verified, put
    // back into the store.
    let out = env.install(&env.store("emptied"), "dst", &durable, "60s");
    assert_eq!(code(&out), 0, "{}", show(&out));
    let installed = result(&out);
    assert_eq!(installed["outcome"], "installed", "{installed}");
    assert_eq!(installed["registry"]["served"]["outcome"], "imported");
    assert_eq!(installed["registry"]["tag"], tag.as_str());
    assert_eq!(installed["generation"], generation.as_str());
    assert_eq!(digest(&env.path("dst")), digest(&env.path("src")));

    // The next install is a store hit: the registry is not asked.
    let out = env.install(&env.store("emptied"), "dst2", &durable, "60s");
    assert_eq!(code(&out), 0, "{}", show(&out));
    let again = result(&out);
    assert_eq!(again["outcome"], "installed", "{again}");
    assert!(again.get("registry").is_none(), "{again}");
    assert_eq!(digest(&env.path("dst2")), digest(&env.path("src")));

    // gc: a second generation, keep 1: the first is dropped from the store and the registry.
    triton_tree(&env.path("src/more"), 1, 12);
    let out = env.publish(&env.store("store"), "src", &durable, true);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let second = result(&out)["generation"].as_str().unwrap().to_owned();
    let out = run(&[
        "gc",
        "--store",
        &env.store("store"),
        "--durable-store",
        &durable,
        "--keep",
        "1",
        "--grace",
        "0s",
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let gc = result(&out);
    assert_eq!(gc["registry"]["deleted"], serde_json::json!([tag]), "{gc}");
    let tags = skopeo_tags(&registry);
    assert!(
        !tags.contains(&tag),
        "the dropped generation's tag is gone: {tags:?}"
    );
    assert!(
        tags.contains(&format!("{compat}.2.{}", &second[..16])),
        "{tags:?}"
    );
}

#[test]
#[ignore = "needs Debian's docker-registry and skopeo (apt-get install docker-registry skopeo): tests/run-all.sh runs it with -- --ignored durable_registry::"]
fn forged_and_untrusted_tags_are_passed_over_for_the_newest_trusted_generation() {
    let env = Env::new();
    let registry = TestRegistry::start();
    let durable = registry.durable_store_arg();
    triton_tree(&env.path("src"), 2, 21);
    let out = env.publish(&env.store("store"), "src", &durable, true);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let trusted = result(&out)["generation"].as_str().unwrap().to_owned();

    // Another writer of the registry, unsigned, publishes twice for the same key from its own
    // store: tags of seq 1 and 2, above the trusted seq 1.
    triton_tree(&env.path("evil"), 2, 22);
    assert_eq!(
        code(&env.publish(&env.store("evil-store"), "evil", &durable, false)),
        0
    );
    triton_tree(&env.path("evil/more"), 1, 23);
    let out = env.publish(&env.store("evil-store"), "evil", &durable, false);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let evil = result(&out);
    let compat = evil["compat_id"].as_str().unwrap().to_owned();
    let evil_generation = evil["generation"].as_str().unwrap().to_owned();
    // And copies its artifact under a tag naming a higher seq and the trusted generation.
    let forged = format!("{compat}.9.{}", &trusted[..16]);
    let copied = Command::new("skopeo")
        .args([
            "copy",
            "--src-tls-verify=false",
            "--dest-tls-verify=false",
            &format!(
                "{}:{compat}.2.{}",
                registry.skopeo_repo(),
                &evil_generation[..16]
            ),
            &format!("{}:{forged}", registry.skopeo_repo()),
        ])
        .output()
        .unwrap();
    assert!(copied.status.success(), "{}", text(&copied.stderr));

    let out = env.install(&env.store("emptied"), "dst", &durable, "60s");
    assert_eq!(code(&out), 0, "{}", show(&out));
    let installed = result(&out);
    assert_eq!(installed["generation"], trusted.as_str(), "{installed}");
    let passed: Vec<&str> = installed["registry"]["passed_over"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        passed
            .iter()
            .any(|p| p.starts_with(&forged) && p.contains("not this tag's")),
        "{passed:?}"
    );
    assert!(
        passed
            .iter()
            .any(|p| p.starts_with(&format!("{compat}.2.")) && p.contains("not admitted")),
        "{passed:?}"
    );
    assert_eq!(digest(&env.path("dst")), digest(&env.path("src")));
}

/// Issue 39: 64 tags at seqs beyond any head's (2^53 and above) were the 64 candidates a pull
/// tries, newest seq first, so the trusted generation below them was never reached.
#[test]
#[ignore = "needs Debian's docker-registry and skopeo (apt-get install docker-registry skopeo): tests/run-all.sh runs it with -- --ignored durable_registry::"]
fn tags_at_seqs_no_head_can_have_never_push_the_trusted_one_out() {
    let env = Env::new();
    let registry = TestRegistry::start();
    let durable = registry.durable_store_arg();
    triton_tree(&env.path("src"), 2, 41);
    let out = env.publish(&env.store("store"), "src", &durable, true);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let published = result(&out);
    let trusted = published["generation"].as_str().unwrap().to_owned();
    let compat = published["compat_id"].as_str().unwrap().to_owned();
    let source = format!("{}:{compat}.1.{}", registry.skopeo_repo(), &trusted[..16]);
    for i in 0..65u64 {
        let seq = (1u64 << 53) + 1 + i;
        let forged = format!(
            "{}:{compat}.{seq}.{}",
            registry.skopeo_repo(),
            &trusted[..16]
        );
        let copied = Command::new("skopeo")
            .args(["copy", "--src-tls-verify=false", "--dest-tls-verify=false"])
            .args([&source, &forged])
            .output()
            .unwrap();
        assert!(copied.status.success(), "{}", text(&copied.stderr));
    }
    let out = env.install(&env.store("emptied"), "dst", &durable, "60s");
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert_eq!(
        result(&out)["generation"],
        trusted.as_str(),
        "{}",
        show(&out)
    );
    assert_eq!(digest(&env.path("dst")), digest(&env.path("src")));
}

#[test]
#[ignore = "needs Debian's docker-registry and skopeo (apt-get install docker-registry skopeo): tests/run-all.sh runs it with -- --ignored durable_registry::"]
fn a_registry_down_or_silent_bounds_the_install_and_leaves_store_hits_alone() {
    let env = Env::new();
    let mut registry = TestRegistry::start();
    let durable = registry.durable_store_arg();
    triton_tree(&env.path("src"), 2, 31);
    let out = env.publish(&env.store("store"), "src", &durable, true);
    assert_eq!(code(&out), 0, "{}", show(&out));
    registry.stop();

    // Down: the store that has the generation installs it; the registry is never asked.
    let out = env.install(&env.store("store"), "dst", &durable, "60s");
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert!(result(&out).get("registry").is_none(), "{}", show(&out));
    // An empty store: a miss that says the registry is unreachable.
    let out = env.install(&env.store("emptied"), "dst-down", &durable, "60s");
    assert_eq!(code(&out), 11, "{}", show(&out));
    let missed = result(&out);
    assert!(
        missed["registry"]["error"]
            .as_str()
            .unwrap()
            .contains("unreachable"),
        "{missed}"
    );

    // Silent: a listener that accepts and never answers. The install ends at its deadline.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_arg = format!("oci+http:{}/jitship/cache", silent.local_addr().unwrap());
    let out = env.install(&env.store("emptied"), "dst-silent", &silent_arg, "3s");
    assert_eq!(code(&out), 15, "{}", show(&out));
    let stopped = result(&out);
    assert!(
        stopped["detail"].as_str().unwrap().contains("deadline"),
        "{stopped}"
    );
    // ... and the store's hits do not wait for it.
    let out = env.install(&env.store("store"), "dst-hit", &silent_arg, "3s");
    assert_eq!(code(&out), 0, "{}", show(&out));
    drop(silent);
}

#[test]
#[ignore = "needs Debian's docker-registry and skopeo (apt-get install docker-registry skopeo): tests/run-all.sh runs it with -- --ignored durable_registry::"]
fn an_exported_layout_copied_into_the_registry_by_skopeo_installs_like_a_pushed_one_and_travels_as_a_tar()
 {
    let env = Env::new();
    let registry = TestRegistry::start();
    triton_tree(&env.path("src"), 3, 41);
    let key = env.path("publisher.key");
    let root = format!("kernels:native={}", env.path("src").display());
    let out = run(&[
        "publish",
        "--store",
        &env.store("store"),
        "--cache",
        &root,
        "--fact",
        "test.tag=durable",
        "--signing-key",
        key.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let published = result(&out);
    let compat = published["compat_id"].as_str().unwrap().to_owned();
    let generation = published["generation"].as_str().unwrap().to_owned();
    let layout = env.path("layout");
    let out = run(&[
        "export",
        "--store",
        &env.store("store"),
        "--out",
        layout.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 0, "{}", show(&out));

    // skopeo reads the layout (by the compat id the index names it by) ...
    let inspected = Command::new("skopeo")
        .args([
            "inspect",
            "--raw",
            &format!("oci:{}:{compat}", layout.display()),
        ])
        .output()
        .unwrap();
    assert!(inspected.status.success(), "{}", text(&inspected.stderr));
    let manifest: Value = serde_json::from_slice(&inspected.stdout).unwrap();
    assert_eq!(
        manifest["artifactType"],
        "application/vnd.jitship.generation.v1"
    );
    // ... and copies it into the registry under the tag a push would give it.
    let tag = format!("{compat}.1.{}", &generation[..16]);
    let copied = Command::new("skopeo")
        .args([
            "copy",
            "--dest-tls-verify=false",
            &format!("oci:{}:{compat}", layout.display()),
            &format!("{}:{tag}", registry.skopeo_repo()),
        ])
        .output()
        .unwrap();
    assert!(copied.status.success(), "{}", text(&copied.stderr));

    let out = env.install(
        &env.store("emptied"),
        "dst",
        &registry.durable_store_arg(),
        "60s",
    );
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert_eq!(result(&out)["registry"]["tag"], tag.as_str());
    assert_eq!(digest(&env.path("dst")), digest(&env.path("src")));

    // The layout as one tar archive: skopeo reads it, import takes it.
    let archive = env.path("layout.tar");
    let out = run(&[
        "export",
        "--store",
        &env.store("store"),
        "--out",
        archive.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    let inspected = Command::new("skopeo")
        .args([
            "inspect",
            "--raw",
            &format!("oci-archive:{}:{compat}", archive.display()),
        ])
        .output()
        .unwrap();
    assert!(inspected.status.success(), "{}", text(&inspected.stderr));
    assert_eq!(
        serde_json::from_slice::<Value>(&inspected.stdout).unwrap()["artifactType"],
        "application/vnd.jitship.generation.v1"
    );
    let out = run(&[
        "import",
        "--store",
        &env.store("from-archive"),
        "--from",
        archive.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert_eq!(result(&out)["generations"][0]["outcome"], "imported");
    let out = env.install(
        &env.store("from-archive"),
        "dst-archive",
        "oci+http:127.0.0.1:1/unreachable",
        "60s",
    );
    assert_eq!(code(&out), 0, "{}", show(&out));
    assert_eq!(digest(&env.path("dst-archive")), digest(&env.path("src")));

    // An archive with a name outside the layout is refused whole: nothing written anywhere.
    let hostile = env.path("hostile.tar");
    let made = Command::new("python3")
        .args([
            "-c",
            "import io, sys, tarfile\n\
             t = tarfile.open(sys.argv[1], 'w')\n\
             for name, data in [('oci-layout', b'{\"imageLayoutVersion\":\"1.0.0\"}'), ('../escaped', b'x')]:\n\
             \x20   i = tarfile.TarInfo(name); i.size = len(data); t.addfile(i, io.BytesIO(data))\n\
             t.close()",
            hostile.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", text(&made.stderr));
    let out = run(&[
        "import",
        "--store",
        &env.store("hostile-store"),
        "--from",
        hostile.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 1, "{}", show(&out));
    assert!(
        text(&out.stderr).contains("is not a name of an OCI layout"),
        "{}",
        show(&out)
    );
    assert!(
        !env.path("escaped").exists() && !env.tmp.path().parent().unwrap().join("escaped").exists()
    );
}
