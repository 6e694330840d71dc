//! The long-running processes: `warren up` (all in one), `warren server`
//! (a cluster's control plane) and `warren node` (a node agent), and what
//! they share: logging, signals, the node's settings from its flags.

mod compat;
pub mod node_agent;
mod port_door;
pub mod server;
pub mod traces;
pub mod up;

use anyhow::{Context, Result};

use crate::cli::{ControlOpts, NodeOpts};

// In the library: `warren-bench fake-nodes` listens and stops the same way.
pub use warren_cli::serving::{first_signal, listen};

/// The daemon's log: everything from info up goes to `<home>/<file>`
/// (`warren-up.log`, `warren-server.log`, `warren-node.log`); the terminal
/// (or the journal, under systemd) gets only warnings and errors, besides
/// the few lines the daemon prints itself, so that `warren up &` does not
/// bury a shell. `WARREN_LOG` (an `EnvFilter`, e.g. `debug`) sets what both
/// show. With `traces`' endpoint set, the daemon's spans are exported
/// too, as `service`, while the answer's [`traces::Exporting`] lives.
/// Makes the daemon's home, or takes the one there, as the daemon's own
/// (mode 0700): it holds the API token, the join token, node credentials,
/// the store and every sandbox's files, none of them for the host's other
/// users.
pub fn private_home(home: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(home).with_context(|| format!("create home {}", home.display()))?;
    std::fs::set_permissions(home, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("make home {} private (mode 0700)", home.display()))
}

pub fn init_logging(
    home: &std::path::Path,
    file: &str,
    traces: &crate::cli::TraceOpts,
    service: &str,
) -> Result<(std::path::PathBuf, Option<traces::Exporting>)> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer};
    private_home(home)?;
    let path = home.join(file);
    // One generation is kept: the log is for what just happened, and a
    // node that runs for months must not fill its disk with it.
    if std::fs::metadata(&path).is_ok_and(|m| m.len() > LOG_ROTATE_BYTES) {
        let old = home.join(format!("{file}.1"));
        std::fs::rename(&path, &old)
            .with_context(|| format!("rotating {} to {}", path.display(), old.display()))?;
    }
    let log = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("opening the log {} (check --home)", path.display()))?
    };
    // A log made by an older Warren keeps its mode otherwise.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("make the log {} private", path.display()))?;
    }
    let custom = std::env::var("WARREN_LOG").ok();
    let filter = |default: &str| {
        custom
            .as_deref()
            .and_then(|f| EnvFilter::try_new(f).ok())
            .unwrap_or_else(|| EnvFilter::new(default))
    };
    let (spans, exporting) = match traces::layer(traces, service)? {
        Some((layer, exporting)) => (Some(layer), Some(exporting)),
        None => (None, None),
    };
    tracing_subscriber::registry()
        .with(spans)
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(log))
                .with_filter(filter(&format!("info,{QUIET_LIBRARIES}"))),
        )
        .with(
            tracing_subscriber::fmt::layer()
                // Colours for a person at a terminal, none in a file.
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_writer(std::io::stderr)
                .with_target(false)
                .without_time()
                .with_filter(filter(&format!("warn,{QUIET_LIBRARIES}"))),
        )
        .init();
    Ok((path, exporting))
}

/// Past this size a daemon's log is moved aside at the next start.
const LOG_ROTATE_BYTES: u64 = 64 << 20;

/// libcontainer and libcgroups warn about what Warren handles itself or
/// cannot change (a cgroup v1 controller the host does not mount, once per
/// sandbox): nothing an operator can act on, so only their errors show.
pub const QUIET_LIBRARIES: &str = "libcgroups=error,libcontainer=error";

/// How profiles learn, from the flags.
pub fn policy(opts: &ControlOpts) -> Result<warren_core::profile::Policy> {
    for (name, m) in [
        ("--cpu-margin", opts.cpu_margin),
        ("--memory-margin", opts.memory_margin),
    ] {
        if !(1.0..=10.0).contains(&m) {
            anyhow::bail!("{name} {m}: a margin is a factor between 1 and 10 (requests below the observed peak would starve or OOM)");
        }
    }
    Ok(warren_core::profile::Policy {
        cpu_margin: opts.cpu_margin,
        memory_margin: opts.memory_margin,
        ..Default::default()
    })
}

/// How long and how much of the shipped logs the control plane keeps,
/// from its flags.
pub fn log_limits(retention: &str, max_total: Option<&str>) -> Result<warren_control::LogLimits> {
    Ok(warren_control::LogLimits {
        retention: warren_core::quantity::parse_duration(retention).context("--log-retention")?,
        max_total: max_total
            .map(warren_core::quantity::parse_size)
            .transpose()
            .context("--log-max-total")?,
    })
}

/// Starts the node agent of this host from its flags (as `name`, carrying
/// `labels`); returns it and the process's open-file limit.
pub fn start_node(
    home: &std::path::Path,
    name: String,
    labels: std::collections::BTreeMap<String, String>,
    args: &NodeOpts,
) -> Result<(std::sync::Arc<warren_node::Node>, u64)> {
    let exe = std::env::current_exe().context("locating the warren binary for the spawner")?;
    let spawners = args.spawners.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
    });
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
        log_shipping: !args.no_log_shipping,
        ship_max: defaults.ship_max,
        default_disk: warren_core::quantity::parse_size(&args.default_disk)
            .context("--default-disk")?,
        disk_floor: args
            .disk_floor
            .as_deref()
            .map(warren_core::quantity::parse_size)
            .transpose()
            .context("--disk-floor")?,
        memory_floor: args
            .memory_floor
            .as_deref()
            .map(warren_core::quantity::parse_size)
            .transpose()
            .context("--memory-floor")?,
        sample_interval: warren_core::quantity::parse_duration(&args.sample_interval)?,
        egress: egress_settings(args, nofile)?,
        image_budget: args
            .image_budget
            .as_deref()
            .map(warren_core::quantity::parse_size)
            .transpose()?,
        userns: !args.no_userns,
        favor_dynmods: !args.no_favor_dynmods,
        capacity: (
            args.capacity_cpu
                .as_deref()
                .map(warren_core::quantity::parse_cpu)
                .transpose()
                .context("--capacity-cpu")?,
            args.capacity_memory
                .as_deref()
                .map(warren_core::quantity::parse_size)
                .transpose()
                .context("--capacity-memory")?,
        ),
        cdi_dirs: if args.cdi_dirs.is_empty() {
            defaults.cdi_dirs.clone()
        } else {
            args.cdi_dirs.clone()
        },
        gpu_kind: warren_runtime::cdi::parse_kind(&args.gpu_kind)
            .map(|_| args.gpu_kind.clone())
            .with_context(|| {
                format!(
                    "--gpu-kind {:?}: write a CDI kind vendor/class, e.g. nvidia.com/gpu",
                    args.gpu_kind
                )
            })?,
        cgroup_parent: args.cgroup_parent.clone(),
        default_isolation: args.default_isolation,
        runsc: warren_runtime::gvisor::RunscSettings {
            path: args.runsc.clone(),
            platform: args.runsc_platform.clone(),
        },
    };
    let node = warren_node::Node::start(warren_node::NodeConfig {
        home: home.to_path_buf(),
        name,
        labels,
        spawner_exe: exe,
        spawner_args: vec!["spawner".into()],
        spawners,
        settings,
    })
    .map_err(|e| anyhow::anyhow!("node agent: {e}"))?;
    Ok((node, nofile))
}

/// How long a clean stop waits for requests to finish and then for each
/// sandbox's destroy.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(20);

fn egress_settings(args: &NodeOpts, nofile: u64) -> Result<warren_net::Settings> {
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
        open: args.egress_open,
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

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "local".into())
}

/// The control plane a daemon runs, once it runs one (a server replica
/// runs none while it follows another).
pub type Running = warren_control::ControlCell;

/// Serves the public API until the first SIGINT or SIGTERM (a second one
/// exits at once, leaving sandboxes for the next start); from the first
/// signal on, streams end and creates are refused.
pub async fn serve_until_signal(
    who: &'static str,
    listener: tokio::net::TcpListener,
    router: axum::Router,
    nofile: u64,
    running: Running,
) -> Result<()> {
    let stop = async move {
        first_signal().await;
        say!("{who}: stopping (again to stop at once)");
        tokio::spawn(async move {
            first_signal().await;
            say!("{who}: stopped at once; the next start adopts or removes what is left");
            std::process::exit(130);
        });
        if let Some(control) = running.get() {
            control.lifecycle().stop();
        }
    };
    warren_control::serve::serve(
        listener,
        router,
        warren_control::serve::connection_limit(nofile),
        stop,
        SHUTDOWN_GRACE,
    )
    .await
    .context("HTTP server")
}
