//! `jitship run [FLAGS] -- SERVER ARGS...`: one command around any server (docs/guide/run.md).
//!
//! The steps, each the existing command's own code:
//! 1. `install` (`worker::install_caches`, best effort, within the install deadline), stopped by
//!    SIGTERM/SIGINT like `install` (then the server is never started: 128 + the signal);
//! 2. the server starts as a child (`crate::server`), in its own process group;
//! 3. `watch` (`worker::Watcher`, the same loop) on the same caches, opened while the server
//!    starts: gated by the server's readiness URL (`--ready-url`, `[watch] ready_url`, else the
//!    engine's health endpoint, `crate::engines::default_ready_url`); with none of these, or with
//!    `--publish-on-exit`, the loop starts only when the server stops, for its final publish;
//! 4. SIGTERM, SIGINT and SIGHUP are forwarded to the server; SIGTERM or SIGINT, or the server's
//!    exit, stop the watcher (its final publish, within the grace period; a second signal cuts it
//!    short, as in `watch`);
//! 5. with `--audit`, `audit` on the same caches; the exit status is the server's.
//!
//! Nothing jitship does can fail the server: an install, a session or a publish that fails is
//! logged, and the server runs as it would without jitship.

use std::time::Duration;

use anyhow::{Context, Result};
use rustix::process::Signal;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::cli::args::{AuditArgs, InstallArgs, RunArgs};
use crate::cli::commands::worker::{Watcher, install_caches};
use crate::cli::exit;
use crate::cli::session::CacheSession;
use crate::interrupt::Interrupt;
use crate::server::Server;

/// How long, once the server has exited, jitship waits for a store still being opened for the
/// final publish, on top of the grace period.
const SESSION_WAIT: Duration = Duration::from_secs(10);

pub(crate) fn run_server(args: RunArgs) -> Result<i32> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    // Before anything else: every signal from now on is either handed to the install (which
    // stops at a safe point) or forwarded to the server.
    let interrupt = Interrupt::default();
    let mut signals = {
        let _in_runtime = rt.enter();
        forward_signals(interrupt.clone())?
    };
    let audit = args.audit.then(|| AuditArgs {
        config: crate::cli::args::ConfigArg {
            config: args.settings.store.config.config.clone(),
        },
        engine: args.settings.engine,
        caches: crate::cli::args::CacheArgs {
            caches: args.settings.caches.caches.clone(),
        },
        json: false,
    });
    let install = InstallArgs {
        settings: args.settings,
        deadline: args.deadline,
        report: args.report,
        json: false,
        best_effort: true,
        test_commit_pause: None,
    };
    // 1. Install. Its outcome is reported (and in --report); it never keeps the server from
    // starting, unless a signal asked jitship to stop.
    if let Err(e) = install_caches(&install, &interrupt) {
        crate::cli::render::print_error(&e.context("installing before the server starts"));
    }
    if let Some(code) = exit::stopped(&interrupt) {
        tracing::warn!(
            signal = interrupt.signal_name().unwrap_or("a signal"),
            "stopped during the install: the server was not started"
        );
        return Ok(code);
    }
    // A SIGHUP during the install is nobody's: the server did not exist yet. A SIGTERM or SIGINT
    // since the install ended stops jitship before the server starts, as one during it does.
    while let Ok(sig) = signals.try_recv() {
        if sig != Signal::HUP {
            tracing::warn!(
                signal = name(sig),
                "stopped before the server started: it was not started"
            );
            return Ok(128 + sig.as_raw());
        }
    }

    // 2. The server.
    let mut server = match Server::spawn(&args.server) {
        Ok(server) => server,
        Err(e) => {
            let code = match e.is_not_found() {
                true => exit::NOT_FOUND,
                false => exit::NOT_EXECUTABLE,
            };
            crate::cli::render::print_error(&anyhow::Error::new(e));
            return Ok(code);
        }
    };
    tracing::info!(pid = server.pid(), "server started");

    // 3. The watcher's session, opened beside the starting server.
    let flags = args.watch;
    let publish_on_exit = args.publish_on_exit;
    let settings = install.settings;
    let opening = rt.spawn_blocking(move || {
        // A store that does not answer yet is waited for, as by `watch`.
        let (session, source) = CacheSession::open(&settings)?.into_watch_session()?;
        let default_url = match publish_on_exit {
            true => None,
            false => session
                .config
                .engine
                .map(|e| crate::engines::default_ready_url(e, &args.server)),
        };
        let mut watcher = Watcher::new(&session, &flags, default_url)?;
        watcher.store = source;
        if publish_on_exit {
            watcher.opts.ready_url = None;
        }
        anyhow::Ok(watcher)
    });
    let status = rt.block_on(supervise(&mut server, opening, &mut signals));
    // A publish still running past the grace period must not hold the exit (invariant 1).
    rt.shutdown_background();
    let code = crate::server::exit_code(status.context("waiting for the server")?);
    tracing::info!(code, "server exited");

    // 5. Did the server use what was installed?
    if let Some(audit) = audit
        && let Err(e) = crate::cli::commands::audit::run_audit(audit)
    {
        crate::cli::render::print_error(&e.context("auditing after the server exited"));
    }
    Ok(code)
}

/// The signals `run` handles: SIGTERM and SIGINT raise `interrupt` (which stops the install) and,
/// like SIGHUP, arrive on the returned channel for the server.
fn forward_signals(interrupt: Interrupt) -> Result<mpsc::UnboundedReceiver<Signal>> {
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let sig = tokio::select! {
                Some(()) = term.recv() => Signal::TERM,
                Some(()) = int.recv() => Signal::INT,
                Some(()) = hup.recv() => Signal::HUP,
                else => break,
            };
            if sig != Signal::HUP {
                interrupt.raise(sig.as_raw());
            }
            if tx.send(sig).is_err() {
                break;
            }
        }
    });
    Ok(rx)
}

/// Runs until the server has exited and the watcher has made its final publish (or could not
/// start); forwards every signal to the server meanwhile. The server's exit status.
async fn supervise(
    server: &mut Server,
    opening: tokio::task::JoinHandle<Result<Watcher>>,
    signals: &mut mpsc::UnboundedReceiver<Signal>,
) -> std::io::Result<std::process::ExitStatus> {
    let mut exited = server.exited();
    let mut status = None;
    let mut opening = Some(opening);
    let mut watcher: Option<Watcher> = None;
    let mut watching: Option<tokio::task::JoinHandle<Result<crate::watch::WatchSummary>>> = None;
    let mut watch_done = false;
    let (stop_tx, stop_rx) = mpsc::channel::<&'static str>(4);
    let mut stop_rx = Some(stop_rx);
    let mut stops_sent = 0u32;
    // Past this, a store still being opened is given up on (set once the server has exited).
    let mut give_up_at: Option<tokio::time::Instant> = None;
    loop {
        // Start the watch loop once its session is open: at once when it publishes while the
        // server runs (a readiness URL), else once it was told to stop (its final publish only).
        if watching.is_none()
            && let Some(w) = watcher.take()
        {
            if w.opts.ready_url.is_some() || stops_sent > 0 {
                let rx = stop_rx.take().expect("the watcher starts once");
                watching = Some(tokio::spawn(w.run(rx)));
            } else {
                watcher = Some(w);
            }
        }
        if status.is_some()
            && (watch_done || opening.is_none() && watching.is_none() && watcher.is_none())
        {
            break;
        }
        tokio::select! {
            r = &mut exited, if status.is_none() => {
                let _ = r;
                status = Some(server.reap());
                if stops_sent == 0 {
                    let _ = stop_tx.try_send("the server exited");
                    stops_sent += 1;
                }
                give_up_at = Some(tokio::time::Instant::now() + SESSION_WAIT);
            }
            Some(sig) = signals.recv() => {
                tracing::info!(signal = name(sig), "forwarding to the server");
                server.signal(sig);
                if sig != Signal::HUP {
                    // The first starts the final publish; a second cuts it short (`watch`).
                    let _ = stop_tx.try_send(name(sig));
                    stops_sent += 1;
                }
            }
            opened = async { opening.as_mut().expect("polled only while opening").await }, if opening.is_some() => {
                opening = None;
                match opened {
                    Ok(Ok(w)) => {
                        if w.opts.ready_url.is_none() {
                            tracing::info!("no readiness URL: the caches are published when the server stops");
                        }
                        watcher = Some(w);
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %crate::cli::output::one_line(&e), "the caches are not published: the watcher could not start (the server runs on)");
                        watch_done = true;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the caches are not published: opening the store failed");
                        watch_done = true;
                    }
                }
            }
            done = async { watching.as_mut().expect("polled only while watching").await }, if watching.is_some() && !watch_done => {
                watch_done = true;
                match done {
                    Ok(Ok(summary)) => {
                        let _ = crate::cli::commands::worker::final_publish_code(&summary);
                    }
                    Ok(Err(e)) => tracing::warn!(error = %crate::cli::output::one_line(&e), "the watcher failed"),
                    Err(e) => tracing::warn!(error = %e, "the watcher failed"),
                }
            }
            _ = async { tokio::time::sleep_until(give_up_at.expect("set")).await }, if give_up_at.is_some() && opening.is_some() => {
                tracing::warn!("the store was not open {SESSION_WAIT:?} after the server exited: no final publish");
                opening = None;
                watch_done = true;
            }
        }
    }
    status.expect("the loop ends once the server has exited")
}

/// The name a log gives `sig`.
fn name(sig: Signal) -> &'static str {
    match sig {
        Signal::TERM => "SIGTERM",
        Signal::INT => "SIGINT",
        Signal::HUP => "SIGHUP",
        _ => "a signal",
    }
}
