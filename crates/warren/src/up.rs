//! `warren up`: control plane, node agent and SQLite store in one process;
//! the control plane drives the node through the node contract, in-process.

use anyhow::{Context, Result};
use tokio::net::TcpListener;
use warren_control::UpConfig;

use std::sync::Arc;

use warren_node_api::NodeApi;

use crate::cli::{NodeTransport, UpArgs};

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
    // Raised first: the limits below are shares of it.
    let nofile = warren_runtime::host_tables::raise_nofile();
    let defaults = warren_node::NodeSettings::default();
    let settings = warren_node::NodeSettings {
        cpu_overcommit: args.cpu_overcommit,
        reserve_cpu_millis: warren_core::quantity::parse_cpu(&args.reserve_cpu)?,
        reserve_memory: warren_core::quantity::parse_size(&args.reserve_memory)?,
        max_sandboxes: args.max_sandboxes,
        max_initializing: args.max_initializing.unwrap_or(defaults.max_initializing),
        log_retention: warren_core::quantity::parse_duration(&args.log_retention)
            .context("--log-retention")?,
        log_max: warren_core::quantity::parse_size(&args.log_max).context("--log-max")?,
        default_disk: warren_core::quantity::parse_size(&args.default_disk)
            .context("--default-disk")?,
        disk_floor: args
            .disk_floor
            .as_deref()
            .map(warren_core::quantity::parse_size)
            .transpose()
            .context("--disk-floor")?,
        sample_interval: warren_core::quantity::parse_duration(&args.sample_interval)?,
        egress: egress_settings(&args, nofile)?,
        image_budget: args
            .image_budget
            .as_deref()
            .map(warren_core::quantity::parse_size)
            .transpose()?,
        userns: !args.no_userns,
    };
    std::fs::create_dir_all(home).with_context(|| format!("create home {}", home.display()))?;
    let node = warren_node::Node::start(warren_node::NodeConfig {
        home: home.to_path_buf(),
        name: hostname(),
        spawner_exe: exe,
        spawner_args: vec!["spawner".into()],
        spawners,
        settings,
    })
    .map_err(|e| anyhow::anyhow!("node agent: {e}"))?;
    let cfg = UpConfig {
        home: home.to_path_buf(),
        listen: args.listen,
        queue_limit: args.queue_limit,
        policy: warren_core::profile::Policy {
            cpu_margin: args.cpu_margin,
            memory_margin: args.memory_margin,
            ..Default::default()
        },
        destroy_on_stop: true,
    };
    let node = node_transport(home, &args, warren_node::LocalNode::new(node)).await?;
    let (up, router) = warren_control::start(&cfg, node)
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
    let control = up.control.clone();
    // The first SIGINT or SIGTERM stops cleanly; a second one stops now.
    let stop = async move {
        first_signal().await;
        eprintln!(
            "warren up: stopping (again to stop at once, leaving sandboxes for the next start)"
        );
        tokio::spawn(async {
            first_signal().await;
            eprintln!("warren up: stopped at once; the next start adopts or removes what is left");
            std::process::exit(130);
        });
        // Streams end and creates are refused from here on.
        control.lifecycle.stop();
    };
    warren_control::serve::serve(
        listener,
        router,
        warren_control::serve::connection_limit(nofile),
        stop,
        SHUTDOWN_GRACE,
    )
    .await
    .context("HTTP server")?;
    eprintln!("warren up: destroying live sandboxes");
    up.control.shutdown(SHUTDOWN_GRACE).await;
    eprintln!("warren up: stopped");
    Ok(0)
}

/// How long a clean stop waits for requests to finish and then for each
/// sandbox's destroy.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(20);

async fn first_signal() {
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

fn egress_settings(args: &UpArgs, nofile: u64) -> Result<warren_net::Settings> {
    let mut resolve = std::collections::HashMap::new();
    for entry in &args.net_resolve {
        let (name, ips) = entry.split_once('=').with_context(|| {
            format!("--net-resolve {entry:?}: write NAME=IP[,IP], e.g. data.internal=10.0.0.5")
        })?;
        let name = match warren_core::network::normalize_host(name) {
            Ok(warren_core::network::Target::Name(n)) => n,
            _ => anyhow::bail!("--net-resolve {entry:?}: {name:?} is not a host name"),
        };
        let ips = ips
            .split(',')
            .map(|ip| {
                ip.trim().parse::<std::net::IpAddr>().with_context(|| {
                    format!("--net-resolve {entry:?}: {ip:?} is not an IP address")
                })
            })
            .collect::<Result<Vec<_>>>()?;
        resolve.insert(name, ips);
    }
    warren_core::network::Policy::parse(&args.net_default_allow, &[], &[])
        .map_err(|e| anyhow::anyhow!("--net-default-allow: {e}"))?;
    let bytes_per_sec = args
        .net_bandwidth
        .as_deref()
        .map(warren_core::quantity::parse_size)
        .transpose()
        .context("--net-bandwidth")?;
    Ok(warren_net::Settings {
        defaults: args.net_default_allow.clone(),
        resolve,
        sandbox: warren_net::Limits {
            conn_rate: args.net_conn_rate,
            conn_burst: (args.net_conn_rate * 2.0).max(1.0),
            max_conns: args.net_max_conns,
            bytes_per_sec,
        },
        // Two descriptors per proxied connection, within a quarter of the
        // daemon's limit (the API's connections take another quarter).
        node_max_conns: args.net_node_max_conns.min((nofile / 8).max(64) as usize),
        ..Default::default()
    })
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "local".into())
}

/// The control plane's way to its node: the node itself, or a client of
/// the node's HTTP API served on `--node-listen` (what a cluster does over
/// the network), guarded by the node credential in `<home>/node-credential`.
async fn node_transport(
    home: &std::path::Path,
    args: &UpArgs,
    node: warren_node::LocalNode,
) -> Result<Arc<dyn NodeApi>> {
    match args.node_transport {
        NodeTransport::InProcess => Ok(Arc::new(node)),
        NodeTransport::Http => {
            let credential = warren_control::ensure_secret(&home.join("node-credential"))
                .context("node credential")?;
            let listener = TcpListener::bind(args.node_listen).await.with_context(|| {
                format!("node API: listen on {} (--node-listen)", args.node_listen)
            })?;
            let addr = listener.local_addr().context("node API address")?;
            let router = warren_node_http::router(Arc::new(node), credential.clone());
            tokio::spawn(async move {
                if let Err(e) = warren_node_http::serve(listener, router).await {
                    tracing::error!(error = %e, "the node API stopped");
                }
            });
            eprintln!(
                "warren up: node API on http://{addr} (credential in {})",
                home.join("node-credential").display()
            );
            let client = warren_node_http::HttpNode::new(&format!("http://{addr}"), &credential)
                .map_err(|e| anyhow::anyhow!("node API client: {e}"))?;
            Ok(Arc::new(client))
        }
    }
}
