//! `profiler run`: the long-running daemon. An async front (socket server, signals, systemd
//! notifications) talks to one collector thread that owns all profiling state, through the
//! messages of [`crate::control`]; [`collector`] is the owner, [`decide`] its decisions.

mod collector;
mod decide;
mod file_closes;
pub mod notify;
mod status;
mod thread_dumps;

use std::{path::PathBuf, time::Duration};

use tokio::{
    signal::unix::{signal, SignalKind},
    sync::watch,
};

use crate::{
    api,
    cli::RunArgs,
    config::{Config, Overrides},
    control::{self, CollectorHandle},
    error::{chain, Error},
    heartbeat::Heartbeat,
    output, preflight,
};
pub use collector::StartError;
use notify::Notifier;

/// The configuration file read when `--config` is not given.
pub const DEFAULT_CONFIG: &str = "/etc/profiler/profiler.toml";

/// How long shutdown waits for in-flight socket requests.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// The collector counts as stuck once its heartbeat is this old: it beats at least once a
/// second while it works, and every 100 ms while it waits on a file read that may never
/// return (which it gives up on, see `crate::offload`).
const HEARTBEAT_STALE: Duration = Duration::from_secs(10);

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Setup(#[from] Error),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Socket(#[from] api::ApiError),
    #[error(transparent)]
    Collector(#[from] StartError),
}

/// Runs the daemon until SIGTERM or SIGINT, then writes a final dump.
pub fn run(args: &RunArgs) -> Result<(), DaemonError> {
    let config = load_config(args)?;
    preflight::check_privileges()?;
    output::ensure_writable_dir(&config.output_dir)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| Error::Io { action: "start the async runtime".into(), source })?;
    let listener = rt.block_on(async { api::bind(&config.socket) })?;
    let (handle, commands) = control::channel();
    let heartbeat = Heartbeat::new();
    let collector = collector::spawn(config.clone(), commands, heartbeat.clone())?;
    let notifier = Notifier::from_env();
    tracing::info!(output = %config.output_dir.display(), socket = %config.socket.path.display(), "profiler running");
    notifier.ready(&format!("profiling; writing to {}", config.output_dir.display()));
    rt.block_on(front(handle, listener, &notifier, &heartbeat, args));
    let _ = collector.join();
    tracing::info!("stopped");
    Ok(())
}

/// Serves the socket and handles signals until asked to stop.
async fn front(
    handle: CollectorHandle,
    listener: tokio::net::UnixListener,
    notifier: &Notifier,
    heartbeat: &Heartbeat,
    args: &RunArgs,
) {
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
                // Ping only while the collector's heartbeat is fresh: a stuck collector must
                // trip the watchdog, one waiting (with a deadline) on a stuck file must not.
                if heartbeat.age() < HEARTBEAT_STALE {
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
    let status = match load_config(args) {
        Ok(config) => {
            let dir = config.output_dir.display().to_string();
            match handle.reload(config).await {
                Ok(Ok(reloaded)) if reloaded.restart_needed.is_empty() => {
                    tracing::info!("configuration reloaded");
                    format!("profiling; writing to {dir}")
                }
                Ok(Ok(reloaded)) => {
                    let keys = reloaded.restart_needed.join(", ");
                    tracing::warn!("configuration reloaded; these settings take effect after a restart: {keys}");
                    format!("profiling; writing to {dir}; restart to apply {keys}")
                }
                Ok(Err(err)) => not_applied(&err),
                Err(err) => not_applied(&err),
            }
        }
        Err(err) => {
            tracing::error!("invalid configuration, keeping the old one: {}", chain(&err));
            "profiling; the last reload failed (invalid configuration), the old one is kept".into()
        }
    };
    notifier.ready_after_reload(&status);
}

/// Logs a reload the collector could not apply; returns the status line.
fn not_applied(err: &dyn std::error::Error) -> String {
    tracing::error!("configuration not applied, keeping the old one: {}", chain(err));
    "profiling; the last reload failed, the old configuration is kept".into()
}

/// The configuration file (the default one may be absent: then the defaults apply), with
/// the command-line flags applied before validation.
pub fn load_config(args: &RunArgs) -> Result<Config, crate::config::ConfigError> {
    let default = PathBuf::from(DEFAULT_CONFIG);
    let path = match &args.config {
        Some(path) => Some(path.as_path()),
        None if default.exists() => Some(default.as_path()),
        None => {
            tracing::info!(path = DEFAULT_CONFIG, "no configuration file; using the defaults");
            None
        }
    };
    let overrides = Overrides {
        output_dir: args.output.clone(),
        socket: args.socket.clone(),
        interval: args.interval,
        ..Overrides::default()
    };
    Config::load_with(path, &overrides)
}
