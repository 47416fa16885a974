//! Pieces the benchmarks share: environment knobs, the jitship CLI pointed at a namespace, the
//! Python the baselines run with, the PR 676-style baseline (`benches/pr676_baseline.py`), and
//! herds of concurrent child processes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Barrier};

use crate::child::{Run, jitship_bin, run_measured};
use crate::mooncake::Cluster;

/// A number from the environment, or `default`.
pub fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A comma-separated list of numbers from the environment (`1,4,16`), or `default`.
pub fn env_list(name: &str, default: &[usize]) -> Vec<usize> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .split(',')
            .map(|n| {
                n.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}: {n:?} is not a number"))
            })
            .collect(),
        Ok(_) => Vec::new(),
        Err(_) => default.to_vec(),
    }
}

/// The CLI against `config`'s store in `namespace`, on the native policy, the root (if any) as
/// cache kind `kernels` with fact `model.id=bench`: every root shares one compat key.
pub fn cli(config: &Path, namespace: &str, command: &str, root: Option<&Path>) -> Command {
    let mut cmd = Command::new(jitship_bin());
    cmd.arg(command)
        .arg("--config")
        .arg(config)
        .args(["--namespace", namespace]);
    if let Some(root) = root {
        cmd.args(["--fact", "model.id=bench", "--cache"])
            .arg(format!("kernels:native={}", root.display()));
    }
    cmd
}

/// The interpreter `python3` on PATH runs, resolved once (`sys.executable`): jitship's facts
/// probe (`[gather] python`) and the PR 676 baseline both use it, so neither pays a pyenv shim.
pub fn python() -> &'static Path {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON.get_or_init(|| {
        let out = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("run python3");
        assert!(out.status.success(), "python3 did not say where it lives");
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

/// The PR 676-style baseline (`pr676_baseline.py OP ...`) with the official client, as a command.
pub fn pr676_command(c: &Cluster, op: &str, prefix: &str, dir: &Path) -> Command {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/pr676_baseline.py");
    let pythonpath = c
        .pythonpath
        .as_ref()
        .expect("JITSHIP_TEST_MOONCAKE_PYTHONPATH names the official wheel");
    let mut cmd = Command::new(python());
    cmd.arg(script)
        .args([op, &c.master, &c.metadata, prefix])
        .arg(dir)
        .env("PYTHONPATH", pythonpath);
    cmd
}

/// Every exit code: a herd records failures rather than stopping at the first.
pub const ANY_CODE: &[i32] = &{
    let mut codes = [0i32; 257];
    let mut i = 0;
    while i < 256 {
        codes[i] = i as i32;
        i += 1;
    }
    codes[256] = -1;
    codes
};

/// Runs `n` commands at once (`make(i)` builds the i-th), released together, each measured
/// (`run_measured`); every exit code is recorded, none panics.
pub fn herd(n: usize, make: impl Fn(usize) -> Command + Sync) -> Vec<Run> {
    let start = Arc::new(Barrier::new(n));
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (start, make) = (start.clone(), &make);
                s.spawn(move || {
                    let mut cmd = make(i);
                    start.wait();
                    run_measured(&mut cmd, ANY_CODE)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("herd thread"))
            .collect()
    })
}
