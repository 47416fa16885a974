//! Running the few external programs facts come from (`nvidia-smi`, `nvcc`, a bare `python3`),
//! each bounded by a deadline, and finding them on an explicit search path (never the process's
//! own `PATH` behind the caller's back: the caller passes the directories).

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use wait_timeout::ChildExt;

/// What a finished command printed.
#[derive(Debug)]
pub(crate) struct Output {
    pub success: bool,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// A one-line account of a failed run, for a "missing" reason.
    pub fn failure(&self) -> String {
        let status = match self.code {
            Some(code) => format!("exit status {code}"),
            None => "killed by a signal".to_string(),
        };
        let said = first_line(&self.stderr).or_else(|| first_line(&self.stdout));
        match said {
            Some(line) => format!("{status}: {line}"),
            None => status,
        }
    }
}

fn first_line(s: &str) -> Option<&str> {
    s.lines().map(str::trim).find(|l| !l.is_empty())
}

/// Runs `program args` with no stdin and returns what it printed, or a one-line reason why it
/// could not. Past `timeout` the program and everything it started (its process group) is killed.
pub(crate) fn run(program: &Path, args: &[&str], timeout: Duration) -> Result<Output, String> {
    run_as(program, &program.to_string_lossy(), args, timeout)
}

/// [`run`] with `argv[0]` = `arg0` (a compiler driver prints it back in `-v`, and engines run it by
/// its bare name).
pub(crate) fn run_as(
    program: &Path,
    arg0: &str,
    args: &[&str],
    timeout: Duration,
) -> Result<Output, String> {
    let deadline = Instant::now() + timeout;
    let mut child = spawn(program, arg0, args)?;
    let stdout = child.stdout.take().map(drain);
    let stderr = child.stderr.take().map(drain);
    // Blocks until the child exits or the deadline passes (no polling: the facts probes run
    // beside store setup at the start of every command).
    let status = match child.wait_timeout(timeout) {
        Ok(Some(status)) => status,
        Ok(None) => {
            kill_group(&mut child);
            return Err(format!(
                "{} did not finish within {}",
                program.display(),
                humantime::format_duration(timeout)
            ));
        }
        Err(e) => {
            kill_group(&mut child);
            return Err(format!("waiting for {} failed: {e}", program.display()));
        }
    };
    // A grandchild may keep the pipes open after the child exits; never wait for it past the deadline.
    let collect = |rx: Option<mpsc::Receiver<Vec<u8>>>| -> String {
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(50));
        rx.and_then(|rx| rx.recv_timeout(wait).ok())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    };
    Ok(Output {
        success: status.success(),
        code: status.code(),
        stdout: collect(stdout),
        stderr: collect(stderr),
    })
}

fn spawn(program: &Path, arg0: &str, args: &[&str]) -> Result<std::process::Child, String> {
    let mut attempts = 0;
    loop {
        let spawned = Command::new(program)
            .arg0(arg0)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Own process group, so a timeout kills whatever the program started too.
            .process_group(0)
            .spawn();
        match spawned {
            Ok(child) => return Ok(child),
            // A script written a moment ago can be briefly "busy" while another thread forks.
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempts < 20 => {
                attempts += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(format!("cannot run {}: {e}", program.display())),
        }
    }
}

fn drain(mut pipe: impl Read + Send + 'static) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        // Bounded: facts come from short outputs; a runaway program cannot exhaust memory.
        let _ = (&mut pipe).take(1 << 20).read_to_end(&mut buf);
        let _ = tx.send(buf);
    });
    rx
}

fn kill_group(child: &mut std::process::Child) {
    // The process group we created at spawn: the program and anything it started.
    let _ = rustix::process::kill_process_group(
        rustix::process::Pid::from_child(child),
        rustix::process::Signal::KILL,
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// The first executable file named `name` in `dirs`, like a shell's PATH lookup.
pub(crate) fn find_in(dirs: &[PathBuf], name: &str) -> Option<PathBuf> {
    dirs.iter().map(|d| d.join(name)).find(|p| is_executable(p))
}

pub(crate) fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn captures_output_and_status() {
        let dir = tempfile::tempdir().unwrap();
        let p = script(dir.path(), "t", "echo out; echo err >&2; exit 3");
        let out = run(&p, &[], Duration::from_secs(5)).unwrap();
        assert!(!out.success);
        assert_eq!(out.code, Some(3));
        assert_eq!(out.stdout, "out\n");
        assert_eq!(out.failure(), "exit status 3: err");
    }

    #[test]
    fn a_hanging_program_and_its_children_are_killed_at_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        // The grandchild `sleep` holds stdout open: the run must still return at the deadline.
        let p = script(dir.path(), "hang", "sleep 3600 & sleep 3600");
        // On a thread, so a run that waited for the grandchild fails the test at the guard
        // instead of hanging it (a guard against a hang, not a timing bound).
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(run(&p, &[], Duration::from_millis(300)));
        });
        let err = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("run returned at its deadline")
            .unwrap_err();
        assert!(err.contains("did not finish within"), "{err}");
    }

    #[test]
    fn missing_program_is_a_reason_not_a_panic() {
        let err = run(Path::new("/nonexistent/prog"), &[], Duration::from_secs(1)).unwrap_err();
        assert!(err.contains("cannot run /nonexistent/prog"), "{err}");
    }

    #[test]
    fn find_in_skips_non_executables() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tool"), "x").unwrap();
        assert_eq!(find_in(&[dir.path().to_path_buf()], "tool"), None);
        let p = script(dir.path(), "tool", "true");
        assert_eq!(
            find_in(
                &[PathBuf::from("/nonexistent"), dir.path().to_path_buf()],
                "tool"
            ),
            Some(p)
        );
    }
}
