//! `warren up`: control plane, node agent and SQLite store in one process.

use anyhow::{Context, Result};
use tokio::net::TcpListener;
use warren_control::UpConfig;

use crate::cli::UpArgs;

pub async fn run(home: &std::path::Path, args: UpArgs) -> Result<i32> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WARREN_LOG")
                .unwrap_or_else(|_| "info,libcgroups=error,libcontainer=error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let exe = std::env::current_exe().context("locating the warren binary for the spawner")?;
    let spawners = args.spawners.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
    });
    for (name, m) in [
        ("--cpu-margin", args.cpu_margin),
        ("--memory-margin", args.memory_margin),
    ] {
        if !(1.0..=10.0).contains(&m) {
            anyhow::bail!("{name} {m}: a margin is a factor between 1 and 10 (requests below the observed peak would starve or OOM)");
        }
    }
    let defaults = warren_node::NodeSettings::default();
    let settings = warren_node::NodeSettings {
        cpu_overcommit: args.cpu_overcommit,
        reserve_cpu_millis: warren_core::quantity::parse_cpu(&args.reserve_cpu)?,
        reserve_memory: warren_core::quantity::parse_size(&args.reserve_memory)?,
        max_sandboxes: args.max_sandboxes,
        queue_limit: args.queue_limit,
        max_initializing: args.max_initializing.unwrap_or(defaults.max_initializing),
        log_retention: warren_core::quantity::parse_duration(&args.log_retention)?,
        sample_interval: warren_core::quantity::parse_duration(&args.sample_interval)?,
    };
    let cfg = UpConfig {
        home: home.to_path_buf(),
        listen: args.listen,
        spawner_exe: exe,
        spawner_args: vec!["spawner".into()],
        spawners,
        settings,
        policy: warren_core::profile::Policy {
            cpu_margin: args.cpu_margin,
            memory_margin: args.memory_margin,
            ..Default::default()
        },
    };
    let (up, router) = warren_control::start(&cfg)
        .await
        .map_err(anyhow::Error::msg)?;
    let listener = TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("listen on {} (is another warren up running?)", cfg.listen))?;
    eprintln!(
        "warren up: listening on http://{} (home {}, token in {})",
        cfg.listen,
        home.display(),
        home.join("token").display()
    );
    // Exec streams are many small writes; without TCP_NODELAY each one can
    // wait for a delayed ACK (~40 ms).
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown_signal())
        .await
        .context("HTTP server")?;
    eprintln!("warren up: stopping; destroying live sandboxes");
    up.control.shutdown().await;
    eprintln!("warren up: stopped");
    Ok(0)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {},
        _ = term.recv() => {},
    }
}
