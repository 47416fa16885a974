//! `jitship run -- SERVER ARGS...` around small real servers (a shell script, Python's
//! `http.server` on 127.0.0.1), against a local store: the install comes before the server
//! starts, the server's exit status is jitship's, SIGTERM reaches the server and the final
//! publish follows, and nothing is published before the server's health URL answers 200.
//! The real-engine case (`vllm serve`) is `tests/engines/vllm-run-e2e.sh`.

use std::path::PathBuf;
use std::process::{Child, ExitStatus, Stdio};
use std::time::Duration;

use jitship::catalog::{self, KeyLayout};
use jitship::generation::{HeadRecord, Manifest};
use jitship::store::{LocalStore, Store};
use jitship_tests::output::{code, show};

/// Longest a test waits for something that should take a second or two.
const WAIT: Duration = Duration::from_secs(60);

struct Env {
    tmp: tempfile::TempDir,
}

impl Env {
    fn new() -> Self {
        Self {
            tmp: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.tmp.path().join(p)
    }

    /// `jitship SUBCOMMAND` with the local store and one `kernels` cache (native rules) at
    /// `root`, then `extra`.
    fn jitship(&self, sub: &str, root: &str, extra: &[&str]) -> std::process::Command {
        let mut c = jitship_tests::cli::jitship();
        c.arg(sub)
            .arg("--store")
            .arg(format!("local:{}", self.path("store").display()))
            .arg("--cache")
            .arg(format!("kernels:native={}", self.path(root).display()))
            .args(["--fact", "test.tag=run"])
            .args(extra)
            .env_remove("JITSHIP_CONFIG")
            .env_remove("JITSHIP_CACHES")
            .env_remove("JITSHIP_ENGINE")
            .env_remove("JITSHIP_READY_URL")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null());
        c
    }

    /// Every file path of every generation in the store, newest head last.
    fn published(&self) -> Vec<Vec<String>> {
        let Ok(store) = LocalStore::open(self.path("store")) else {
            return Vec::new();
        };
        let layout = KeyLayout::new("jitship").unwrap();
        let mut heads: Vec<HeadRecord> = store
            .list("jitship/head/")
            .unwrap_or_default()
            .iter()
            .filter_map(|k| HeadRecord::decode(&store.get(k).ok()??).ok())
            .collect();
        heads.sort_by_key(|h| h.seq);
        heads
            .iter()
            .map(|h| {
                let m: Manifest = catalog::fetch_manifest(&store, &layout, &h.generation)
                    .unwrap()
                    .expect("a head names a stored manifest");
                m.files.iter().map(|f| f.path.to_string()).collect()
            })
            .collect()
    }
}

/// A `jitship run` child whose stderr (its log and the server's) goes to a file; killed if a
/// test fails before it exits.
struct Running {
    child: Option<Child>,
    log: PathBuf,
}

impl Running {
    fn start(mut cmd: std::process::Command, log: PathBuf) -> Self {
        let child = cmd
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting jitship run");
        Self {
            child: Some(child),
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `done()` holds, at most `WAIT`: checked again at each change under the test's
    /// directory (the log, the store, the files the server writes), as inotify reports it.
    fn wait_until(&self, what: &str, done: impl Fn() -> bool) {
        let dir = self
            .log
            .parent()
            .expect("the log is in the test's directory");
        assert!(
            jitship_tests::child::wait_for_change(dir, WAIT, done),
            "{what}: not after {WAIT:?}; log:\n{}",
            self.log()
        );
    }

    fn signal(&self, sig: i32) {
        let pid = self.child.as_ref().unwrap().id() as i32;
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }

    fn wait(mut self) -> (ExitStatus, String) {
        let mut child = self.child.take().unwrap();
        let pid = child.id() as i32;
        let (tx, exited) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        match exited.recv_timeout(WAIT) {
            Ok(status) => (status.unwrap(), self.log()),
            Err(_) => {
                // SAFETY: kill(2) on our own child's pid, which the waiting thread has not reaped.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                panic!("jitship run did not exit; log:\n{}", self.log());
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SIGTERM: jitship forwards it, so the server ends too.
            let pid = c.id() as i32;
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let _ = c.wait();
            eprintln!("jitship run log:\n{}", self.log());
        }
    }
}

fn sh(script: &str) -> Vec<String> {
    vec!["--".into(), "sh".into(), "-c".into(), script.into()]
}

#[test]
fn the_servers_exit_status_is_jitships_and_its_exit_starts_the_final_publish() {
    let env = Env::new();
    std::fs::create_dir_all(env.path("root")).unwrap();
    let root = env.path("root");
    let script = format!("echo kernel > {}/k.bin; exit 7", root.display());
    let out = env
        .jitship("run", "root", &[])
        .args(sh(&script))
        .output()
        .unwrap();
    assert_eq!(code(&out), 7, "{}", show(&out));
    // No readiness URL and no engine: published once, when the server stopped.
    assert_eq!(env.published(), [["k.bin"]], "{}", show(&out));
    let log = jitship_tests::output::text(&out.stderr);
    assert!(log.contains("published when the server stops"), "{log}");
    assert!(log.contains("final_publish=done"), "{log}");
}

#[test]
fn the_install_comes_before_the_server_starts_and_a_failed_one_does_not_stop_it() {
    let env = Env::new();
    std::fs::create_dir_all(env.path("producer")).unwrap();
    std::fs::write(env.path("producer/a.bin"), b"compiled").unwrap();
    let out = env.jitship("publish", "producer", &[]).output().unwrap();
    assert_eq!(code(&out), 0, "{}", show(&out));
    // The server sees the installed file at its first instruction, or exits 9.
    let consumer = env.path("consumer");
    let check = format!("test -f {}/a.bin || exit 9", consumer.display());
    let out = env
        .jitship(
            "run",
            "consumer",
            &["--report", &env.path("report.json").to_string_lossy()],
        )
        .args(sh(&check))
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", show(&out));
    let report = std::fs::read_to_string(env.path("report.json")).unwrap();
    assert!(report.contains("\"outcome\": \"installed\""), "{report}");

    // A store that cannot be opened: the install fails, the server starts and runs anyway.
    std::fs::write(env.path("not-a-dir"), b"").unwrap();
    let mut cmd = jitship_tests::cli::jitship();
    cmd.args(["run", "--cache"])
        .arg(format!(
            "kernels:native={}",
            env.path("elsewhere").display()
        ))
        .arg("--store")
        .arg(format!("local:{}/store", env.path("not-a-dir").display()))
        .args(["--fact", "test.tag=run"])
        .env_remove("JITSHIP_CONFIG")
        .args(sh("exit 4"));
    let out = cmd.output().unwrap();
    assert_eq!(code(&out), 4, "{}", show(&out));

    // No such server: 127, as a shell says it.
    let out = env
        .jitship(
            "run",
            "consumer",
            &["--", "/nonexistent/jitship-test-server"],
        )
        .output()
        .unwrap();
    assert_eq!(code(&out), 127, "{}", show(&out));
}

#[test]
fn sighup_and_sigterm_reach_the_server_and_the_final_publish_follows_sigterm() {
    let env = Env::new();
    let root = env.path("root");
    std::fs::create_dir_all(&root).unwrap();
    let started = env.path("started");
    let got_hup = env.path("got-hup");
    let got_term = env.path("got-term");
    // Writes its cache, says it is up, notes a SIGHUP and goes on, and exits 5 on SIGTERM (its
    // sleep with it).
    let script = format!(
        "trap 'echo > {hup}' HUP; trap 'kill $p; echo > {term}; exit 5' TERM; \
         echo kernel > {root}/k.bin; sleep 60 & p=$!; echo > {started}; \
         while kill -0 $p 2>/dev/null; do wait $p; done",
        hup = got_hup.display(),
        term = got_term.display(),
        root = root.display(),
        started = started.display(),
    );
    let mut cmd = env.jitship("run", "root", &["--grace", "30s"]);
    cmd.args(sh(&script));
    let run = Running::start(cmd, env.path("run.log"));
    run.wait_until("the server started", || started.exists());
    run.signal(libc::SIGHUP);
    run.wait_until("the server got SIGHUP", || got_hup.exists());
    // SIGHUP is only passed on: nothing stops, nothing is published.
    assert!(!run.log().contains("final publish"), "{}", run.log());
    assert!(
        env.published().is_empty(),
        "published before the server stopped"
    );
    run.signal(libc::SIGTERM);
    let (status, log) = run.wait();
    assert_eq!(status.code(), Some(5), "{log}");
    assert!(
        got_term.exists(),
        "the server never got SIGTERM; log:\n{log}"
    );
    assert_eq!(env.published(), [["k.bin"]], "{log}");
    assert!(log.contains("signal=SIGTERM"), "{log}");
    assert!(log.contains("final_publish=done"), "{log}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Python's `http.server` answers `GET /health` 404 until the file `health` exists in the
/// directory it serves, then 200: a server that becomes ready when the test says so. It logs
/// every request on stderr, which is jitship's log here.
fn probes_answered(log: &str, status: u16) -> usize {
    log.matches(&format!("\"GET /health HTTP/1.1\" {status}"))
        .count()
}

#[test]
fn nothing_is_published_before_the_server_is_ready_and_sigterm_ends_it() {
    let env = Env::new();
    let root = env.path("root");
    let served = env.path("served");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&served).unwrap();
    std::fs::write(root.join("k.bin"), b"compiled before ready").unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/health");
    let mut cmd = env.jitship(
        "run",
        "root",
        &[
            "--ready-url",
            &url,
            "--settle",
            "100ms",
            "--min-interval",
            "0s",
        ],
    );
    cmd.args(["--", "python3", "-m", "http.server", &port.to_string()])
        .args(["--bind", "127.0.0.1", "--directory"])
        .arg(&served);
    let run = Running::start(cmd, env.path("run.log"));
    // Two refused probes, 2 s apart (watch::READY_POLL), the root settled long before the
    // second: the gate alone held the publish.
    run.wait_until("two refused probes", || {
        probes_answered(&run.log(), 404) >= 2
    });
    assert!(env.published().is_empty(), "published before ready");
    std::fs::write(served.join("health"), b"ok").unwrap();
    run.wait_until("a generation once ready", || !env.published().is_empty());
    assert!(run.log().contains("server is ready"), "{}", run.log());
    run.signal(libc::SIGTERM);
    let (status, log) = run.wait();
    // http.server has no SIGTERM handler: it dies of it, and jitship exits as a shell would.
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{log}");
    assert!(log.contains("final_publish=done"), "{log}");
    assert_eq!(env.published(), [["k.bin"]], "{log}");
}
