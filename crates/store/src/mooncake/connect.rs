//! Connecting: load the library, probe the master, set up a pure client. Every setting goes to
//! `mooncake_store_setup` as an argument; nothing is written to the process environment.

use std::ffi::CString;
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock, mpsc};
use std::time::Duration;

use mooncake_sys as sys;

use super::call::Handle;
use super::pool::Pool;
use super::{Inner, MooncakeStore, teardown};
use crate::settings::{MooncakeConfig, parse_host_port};
use crate::{StoreError, StoreResult};

impl MooncakeStore {
    /// Loads the library, probes the master and sets up a pure client; staging buffers are made
    /// by the calls that need them. Fails within about `probe_timeout` when the master is
    /// unreachable.
    pub fn connect(config: &MooncakeConfig) -> StoreResult<Self> {
        config
            .validate()
            .map_err(|e| StoreError::Other(e.to_string()))?;
        let (lib, path) = load_library(config)?;
        probe_master(config)?;
        let handle = set_up(&lib, &path, config)?;
        tracing::debug!("mooncake: client set up");
        let size = config.staging_buffer_size.as_u64() as usize;
        let inner = Inner {
            lib,
            handle,
            pool: Pool::new(config.staging_buffers, size),
            replica_num: config.replicas as usize,
            soft_pin: config.soft_pin,
            soft_pin_catalog: config.soft_pin_catalog,
            hard_pin: config.hard_pin,
            hard_pin_catalog: config.hard_pin_catalog,
            master: config.master.clone(),
            segments_url: config.segments_url.clone(),
            probe_timeout: config.probe_timeout,
            segments: OnceLock::new(),
            in_flight: AtomicUsize::new(0),
        };
        teardown::opened();
        Ok(Self {
            inner: Arc::new(inner),
            master: config.master.clone(),
            call_timeout: config.call_timeout,
            limit: size as u64,
            retry_for: config.retry_for,
            retries: Default::default(),
            retried: Default::default(),
        })
    }
}

fn load_library(config: &MooncakeConfig) -> StoreResult<(Arc<sys::MooncakeLib>, PathBuf)> {
    let path = config
        .library_path()
        .map_err(|e| StoreError::Other(e.to_string()))?;
    // SAFETY: the operator configured this path as libmooncake_store.so; `load` opens it only
    // once the store_c.h beside it declares the layout mooncake-sys is written for, and loading
    // runs its initializers, which is what the library expects.
    let lib =
        unsafe { sys::MooncakeLib::load(&path) }.map_err(|e| StoreError::Other(e.to_string()))?;
    tracing::debug!(
        library = %path.display(),
        header = %lib.abi.header.display(),
        layout = %lib.abi.layout,
        "mooncake: library loaded"
    );
    Ok((lib, path))
}

/// Probes the master's TCP port, and an HTTP metadata server's, so a dead master fails in seconds
/// with a message saying what to check instead of setup's ~90 s hang.
fn probe_master(config: &MooncakeConfig) -> StoreResult<()> {
    let secs = config.probe_timeout.as_secs_f64();
    probe(&config.master, config.probe_timeout).map_err(|e| {
        StoreError::MasterDown(format!(
            "master {} unreachable (probe of {secs:.1} s: {e}); is mooncake_master running? check store.mooncake.master",
            config.master
        ))
    })?;
    if let Some(rest) = config.metadata_server.strip_prefix("http://") {
        let host_port = rest.split('/').next().unwrap_or(rest);
        if parse_host_port(host_port).is_some() {
            probe(host_port, config.probe_timeout).map_err(|e| {
                StoreError::Unavailable(format!(
                    "metadata server {} unreachable (probe of {secs:.1} s: {e}); is the master's HTTP metadata server enabled \
                     (--enable_http_metadata_server)? check store.mooncake.metadata_server",
                    config.metadata_server
                ))
            })?;
        }
    }
    tracing::debug!("mooncake: master and metadata server answer the probe");
    Ok(())
}

/// Creates a handle and sets it up as a pure client (`global_segment_size = 0`: what jitship
/// writes lives on store nodes and survives its exit), waiting at most `setup_timeout`.
fn set_up(
    lib: &Arc<sys::MooncakeLib>,
    path: &Path,
    config: &MooncakeConfig,
) -> StoreResult<Handle> {
    let hostname = match &config.local_hostname {
        Some(h) => h.clone(),
        None => gethostname::gethostname().to_string_lossy().into_owned(),
    };
    let args = [
        c_arg("local hostname", &hostname)?,
        c_arg("metadata server", &config.metadata_server)?,
        c_arg("protocol", config.protocol.as_str())?,
        c_arg("rdma devices", &config.rdma_devices.join(","))?,
        c_arg("master", &config.master)?,
    ];
    // SAFETY: create takes no arguments and returns a new handle or NULL.
    let raw = unsafe { (lib.create)() };
    if raw.is_null() {
        return Err(StoreError::Other(format!(
            "mooncake_store_create in {} returned NULL",
            path.display()
        )));
    }
    let (rc, handle) = run_setup(lib, Handle(raw), args, config)?;
    if rc != 0 {
        // SAFETY: setup failed; the handle is ours alone.
        unsafe { (lib.destroy)(handle.0) };
        return Err(StoreError::Unavailable(format!(
            "Mooncake setup failed ({rc}) with master {}, metadata server {}, protocol {}, local hostname {hostname}: check \
             that they are reachable from this host; on a network without a routable address Mooncake needs \
             MC_TCP_BIND_ADDRESS=127.0.0.1 in its environment; its log on stderr says more",
            config.master,
            config.metadata_server,
            config.protocol.as_str()
        )));
    }
    Ok(handle)
}

/// Runs `mooncake_store_setup` on its own thread: it can block for a long time (the master
/// answers the probe but not RPCs). If we stop waiting, that thread destroys the handle when
/// done. The setup's code and the handle back.
fn run_setup(
    lib: &Arc<sys::MooncakeLib>,
    handle: Handle,
    args: [CString; 5],
    config: &MooncakeConfig,
) -> StoreResult<(i32, Handle)> {
    let local_buffer = config.local_buffer_size.as_u64();
    let (tx, rx) = mpsc::sync_channel::<(i32, Handle)>(1);
    let lib = lib.clone();
    std::thread::Builder::new()
        .name("mooncake-setup".into())
        .spawn(move || {
            let [host, meta, proto, dev, master] = &args;
            // SAFETY: the handle is fresh from create; every string is NUL-terminated and
            // outlives the call (the library copies what it keeps).
            let rc = unsafe {
                (lib.setup)(
                    handle.0,
                    host.as_ptr(),
                    meta.as_ptr(),
                    0,
                    local_buffer,
                    proto.as_ptr(),
                    dev.as_ptr(),
                    master.as_ptr(),
                )
            };
            if let Err(mpsc::SendError((_, handle))) = tx.send((rc, handle)) {
                // SAFETY: nobody else has the handle: the caller gave up on it.
                unsafe { (lib.destroy)(handle.0) };
            }
        })
        .map_err(|e| StoreError::Other(format!("cannot start the setup thread: {e}")))?;
    rx.recv_timeout(config.setup_timeout).map_err(|_| {
        StoreError::MasterDown(format!(
            "Mooncake setup with master {} did not finish within {:?}; check that the master answers and that the \
             metadata server {} is reachable",
            config.master, config.setup_timeout, config.metadata_server
        ))
    })
}

fn c_arg(what: &str, value: &str) -> StoreResult<CString> {
    CString::new(value)
        .map_err(|_| StoreError::Other(format!("{what} {value:?} contains a NUL byte")))
}

/// Connects to `addr` within `timeout`, trying each address it resolves to.
fn probe(addr: &str, timeout: Duration) -> Result<(), String> {
    let addrs: Vec<_> = addr
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {addr}: {e}"))?
        .collect();
    let mut last = format!("{addr} resolves to no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(_) => return Ok(()),
            Err(e) => last = format!("{a}: {e}"),
        }
    }
    Err(last)
}

/// Most segment names kept from the master's list, and the most bytes read of its answer: the
/// list is only a placement hint, read from a port anyone on the network may answer.
const MOST_SEGMENTS: usize = 1024;
const MOST_SEGMENT_LIST_BYTES: u64 = 256 * 1024;

/// The store nodes' segment names from the master's `get_all_segments` (one per line), sorted so
/// every publisher places copy `k` on the same node. Any failure is logged and gives no names:
/// Mooncake then places copies itself. One plain HTTP/1.0 GET over a socket, by hand: the store
/// crate is synchronous and has no HTTP client, and this bounded read is all it needs.
pub(super) fn read_segments(url: &str, timeout: Duration) -> Vec<CString> {
    match fetch_segment_list(url, timeout) {
        Ok(names) => {
            tracing::debug!(url, segments = names.len(), "mooncake: segments read");
            names
        }
        Err(why) => {
            tracing::warn!(
                url,
                "could not read the store nodes' segments ({why}): Mooncake places pack copies \
                 itself; check store.mooncake.segments_url"
            );
            Vec::new()
        }
    }
}

fn fetch_segment_list(url: &str, timeout: Duration) -> Result<Vec<CString>, String> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").ok_or("not an http:// URL")?;
    let (host_port, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/get_all_segments"),
    };
    let addr = host_port
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or("no address")?;
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host_port}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    // The master's server keeps the connection open whatever the request says: read until the
    // body's Content-Length has arrived, the server closes, or the bound.
    let mut answer = Vec::new();
    let mut chunk = [0u8; 8192];
    while (answer.len() as u64) < MOST_SEGMENT_LIST_BYTES {
        let n = stream.read(&mut chunk).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&chunk[..n]);
        if answer_is_whole(&answer) {
            break;
        }
    }
    parse_segment_list(&answer)
}

/// Whether `answer` holds its whole header and as many body bytes as its Content-Length says.
fn answer_is_whole(answer: &[u8]) -> bool {
    let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&answer[..end]);
    let length = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())?
    });
    length.is_some_and(|len| answer.len() >= end + 4 + len)
}

/// The names in an HTTP answer holding one segment name per line: status 200, names of at most
/// 255 printable characters without spaces (others skipped), at most `MOST_SEGMENTS`, sorted.
fn parse_segment_list(answer: &[u8]) -> Result<Vec<CString>, String> {
    let text = String::from_utf8_lossy(answer);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no HTTP header end")?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("answered {:?}", status.escape_debug().to_string()));
    }
    let mut names: Vec<CString> = body
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && l.len() <= 255 && l.chars().all(|c| c.is_ascii_graphic()))
        .take(MOST_SEGMENTS)
        .filter_map(|l| CString::new(l).ok())
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::{
        MOST_SEGMENTS, MooncakeConfig, MooncakeStore, answer_is_whole, parse_segment_list, probe,
    };

    #[test]
    fn missing_library_is_a_clear_error() {
        let config = MooncakeConfig {
            library: Some(PathBuf::from("/nowhere/libmooncake_store.so")),
            ..Default::default()
        };
        let err = MooncakeStore::connect(&config).unwrap_err().to_string();
        assert!(
            err.contains("/nowhere/libmooncake_store.so") && err.contains("store.mooncake.library"),
            "{err}"
        );
    }

    /// An unknown store_c.h layout is refused at load, before any connection: a master that
    /// listens is never connected to, and the stub library (built here with gcc, its functions
    /// aborting if called) is never opened.
    #[test]
    fn unknown_abi_is_refused_before_any_connection() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = String::from("#include <stdlib.h>\n");
        for f in mooncake_sys::FUNCTIONS {
            c.push_str(&format!("void {f}(void) {{ abort(); }}\n"));
        }
        std::fs::write(dir.path().join("stub.c"), c).unwrap();
        let lib = dir.path().join("libmooncake_store.so");
        let out = std::process::Command::new("gcc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&lib)
            .arg(dir.path().join("stub.c"))
            .output()
            .expect("gcc runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut h = String::from(
            "struct mooncake_replicate_config { size_t replica_num; int soft_pin_mode; };\n",
        );
        for f in mooncake_sys::FUNCTIONS {
            h.push_str(&format!("int {f}(void *store);\n"));
        }
        std::fs::create_dir(dir.path().join("include")).unwrap();
        std::fs::write(dir.path().join("include/store_c.h"), h).unwrap();

        let master = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        master.set_nonblocking(true).unwrap();
        let config = MooncakeConfig {
            library: Some(lib.clone()),
            master: master.local_addr().unwrap().to_string(),
            metadata_server: "P2PHANDSHAKE".into(),
            ..Default::default()
        };
        let err = MooncakeStore::connect(&config).unwrap_err().to_string();
        assert!(
            err.contains(&lib.display().to_string())
                && err.contains("unknown layout")
                && err.contains("int soft_pin_mode")
                && err.contains("jitship supports"),
            "{err}"
        );
        assert_eq!(
            master.accept().unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock,
            "the master was connected to"
        );
    }

    #[test]
    fn unreachable_port_fails_the_probe_fast() {
        // A port nobody listens on: bind one, note it, close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        // Refused at once, not left to the timeout.
        let err = probe(&format!("127.0.0.1:{port}"), Duration::from_secs(2)).unwrap_err();
        assert!(err.contains("refused"), "{err}");
    }

    #[test]
    fn a_segment_list_is_parsed_bounded_and_sorted() {
        let answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n127.0.0.1:2\n127.0.0.1:1\n\n\x1b[31m\nbad name\n127.0.0.1:1\n";
        let names = parse_segment_list(answer).unwrap();
        let names: Vec<&str> = names.iter().map(|n| n.to_str().unwrap()).collect();
        assert_eq!(names, ["127.0.0.1:1", "127.0.0.1:2"]);
        assert!(parse_segment_list(b"HTTP/1.1 404 Not Found\r\n\r\nnope").is_err());
        assert!(parse_segment_list(b"garbage").is_err());
        let many: String = (0..5000).map(|i| format!("n{i}\n")).collect();
        let answer = format!("HTTP/1.0 200 OK\r\n\r\n{many}");
        assert_eq!(
            parse_segment_list(answer.as_bytes()).unwrap().len(),
            MOST_SEGMENTS
        );
        // The master keeps the connection open: the read stops at the body's Content-Length.
        assert!(answer_is_whole(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"
        ));
        assert!(!answer_is_whole(
            b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nabc"
        ));
        assert!(!answer_is_whole(b"HTTP/1.1 200 OK\r\n\r\nabc"));
    }
}
