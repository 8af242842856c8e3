//! `profiler run`: the long-running daemon. An async front (socket server, signals, systemd
//! notifications) talks to one collector thread that owns all profiling state (see
//! [`command`] for the protocol and [`collector`] for the owner).

pub mod collector;
pub mod command;
mod dump;
pub mod notify;
pub mod render;
pub mod retention;
mod status;

use std::{path::PathBuf, time::Duration};

use tokio::{
    signal::unix::{signal, SignalKind},
    sync::{mpsc, watch},
};

use crate::{
    api,
    cli::RunArgs,
    config::{Config, INTERVAL_RANGE},
    error::{chain, Error, Result},
    output, preflight,
};
use command::CollectorHandle;
use notify::Notifier;

/// The configuration file read when `--config` is not given.
pub const DEFAULT_CONFIG: &str = "/etc/profiler/profiler.toml";

/// How long shutdown waits for in-flight socket requests.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Runs the daemon until SIGTERM or SIGINT, then writes a final dump.
pub fn run(args: &RunArgs) -> Result<()> {
    let config = load_config(args)?;
    preflight::check_privileges()?;
    output::ensure_writable_dir(&config.output_dir)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| Error::Io { action: "start the async runtime".into(), source })?;
    let listener = rt.block_on(async { api::bind(&config.socket) }).map_err(|e| Error::Usage(e.to_string()))?;
    let (tx, rx) = mpsc::channel(64);
    let collector = collector::spawn(config.clone(), rx, rt.handle().clone())?;
    let notifier = Notifier::from_env();
    tracing::info!(output = %config.output_dir.display(), socket = %config.socket.path.display(), "profiler running");
    notifier.ready(&format!("profiling; writing to {}", config.output_dir.display()));
    rt.block_on(front(CollectorHandle::new(tx), listener, &notifier, args));
    let _ = collector.join();
    tracing::info!("stopped");
    Ok(())
}

/// Serves the socket and handles signals until asked to stop.
async fn front(handle: CollectorHandle, listener: tokio::net::UnixListener, notifier: &Notifier, args: &RunArgs) {
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let stopped = async move {
        let _ = stop_rx.changed().await;
    };
    let server = tokio::spawn(api::serve(listener, handle.clone(), api::Limits::default(), stopped));
    let (Ok(mut hup), Ok(mut term), Ok(mut int)) =
        (signal(SignalKind::hangup()), signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        tracing::error!("cannot install signal handlers; stopping");
        let _ = handle.shutdown().await;
        return;
    };
    let mut watchdog = tokio::time::interval(notifier.watchdog_interval().unwrap_or(Duration::from_secs(3600)));
    loop {
        tokio::select! {
            _ = hup.recv() => reload(&handle, notifier, args).await,
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = watchdog.tick() => {
                // Ping only when the collector answers: a stuck collector must trip the watchdog.
                if tokio::time::timeout(Duration::from_secs(5), handle.status()).await.is_ok_and(|r| r.is_ok()) {
                    notifier.watchdog();
                }
            }
        }
    }
    tracing::info!("stopping: writing a final dump");
    notifier.stopping();
    let _ = stop_tx.send(true);
    let _ = handle.shutdown().await;
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, server).await;
}

/// SIGHUP: re-read the configuration; an invalid one is reported and the old one kept.
async fn reload(handle: &CollectorHandle, notifier: &Notifier, args: &RunArgs) {
    notifier.reloading();
    match load_config(args) {
        Ok(config) => match handle.reload(config).await {
            Ok(Ok(())) => tracing::info!("configuration reloaded"),
            Ok(Err(err)) => tracing::error!(error = %err, "configuration not applied; keeping the old one"),
            Err(err) => tracing::error!(error = %err, "configuration not applied"),
        },
        Err(err) => tracing::error!("invalid configuration, keeping the old one: {}", chain(&err)),
    }
    notifier.ready_after_reload("profiling");
}

/// The configuration file (the default one may be absent: then the defaults apply), with
/// the command-line flags on top.
pub fn load_config(args: &RunArgs) -> Result<Config> {
    let path = args.config.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG));
    let mut config = if args.config.is_none() && !path.exists() {
        tracing::info!(path = %path.display(), "no configuration file; using the defaults");
        Config::default()
    } else {
        Config::load(&path).map_err(|err| Error::Usage(chain(&err)))?
    };
    if let Some(output) = &args.output {
        config.output_dir.clone_from(output);
    }
    if let Some(socket) = &args.socket {
        config.socket.path.clone_from(socket);
    }
    if let Some(interval) = args.interval {
        if !INTERVAL_RANGE.contains(&interval) {
            return Err(Error::Usage(format!(
                "--interval {interval:?} is out of range; allowed {:?} to {:?}",
                INTERVAL_RANGE.start(),
                INTERVAL_RANGE.end()
            )));
        }
        config.interval = interval;
        config.retention.max_age = config.retention.max_age.max(interval);
    }
    Ok(config)
}
