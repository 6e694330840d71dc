//! Flags of the commands that serve: `warren up`, `warren server`, `warren node`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Subcommand};

/// How `warren up` drives its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NodeTransport {
    InProcess,
    Http,
}

/// How a node lends its host (`warren up` and `warren node`).
#[derive(Args)]
pub struct NodeOpts {
    /// Spawner processes (parallel sandbox creations); default: one per core.
    #[arg(long)]
    pub spawners: Option<usize>,
    /// Sum of sandbox CPU requests allowed per core (CPU is compressible:
    /// requests are weights, limits are quotas); 1 makes requests binding.
    #[arg(long, default_value_t = 8.0)]
    pub cpu_overcommit: f64,
    /// CPU kept back for the system and Warren (cores or millicores).
    #[arg(long, default_value = "250m")]
    pub reserve_cpu: String,
    /// Memory kept back for the system and Warren.
    #[arg(long, default_value = "512M")]
    pub reserve_memory: String,
    /// Most sandboxes alive at once.
    #[arg(long, default_value_t = 4096)]
    pub max_sandboxes: u32,
    /// Sandboxes initialising at once; default 8 per core.
    #[arg(long)]
    pub max_initializing: Option<usize>,
    /// How long the log of a finished sandbox is kept (e.g. 7d, 12h); in
    /// `warren up`, also how long the control plane keeps what its node
    /// shipped.
    #[arg(long, default_value = "7d")]
    pub log_retention: String,
    /// Most bytes of log kept per sandbox (its newest lines; the log is
    /// rotated once, at half of this).
    #[arg(long, default_value = "64M")]
    pub log_max: String,
    /// Keep sandbox logs and usage samples on this node only: they are not
    /// shipped to the control plane (and are lost with the node).
    #[arg(long)]
    pub no_log_shipping: bool,
    /// Disk a sandbox created without --disk may fill (its writable layer,
    /// measured every ~10 s; past it the sandbox is stopped with reason
    /// disk_exceeded). 0 turns the per-sandbox limit off.
    #[arg(long, default_value = "10G")]
    pub default_disk: String,
    /// Free space kept under the home: below it creates are refused and the
    /// sandbox that wrote the most is stopped (default: 5% of the file
    /// system, at least 1G and at most 4G).
    #[arg(long)]
    pub disk_floor: Option<String>,
    /// Host memory kept available (MemAvailable): below it creates are
    /// refused and the sandbox using the most above its memory request is
    /// stopped with reason memory_pressure (default: the larger of 256M and
    /// 2% of the host's memory).
    #[arg(long)]
    pub memory_floor: Option<String>,
    /// Most bytes the image store may hold (e.g. 50G): after each pull,
    /// registry images no sandbox uses are removed, oldest first, until it
    /// fits. Imported images are never removed.
    #[arg(long)]
    pub image_budget: Option<String>,
    /// How often every sandbox's cgroup is sampled.
    #[arg(long, default_value = "1s")]
    pub sample_interval: String,
    /// Run sandboxes without user namespaces: root inside is then host
    /// root, held back only by capabilities, seccomp and the other layers.
    /// For hosts where `warren doctor` finds no id-mapped mounts.
    #[arg(long)]
    pub no_userns: bool,
    /// Leave the host's cgroup2 mount as it is. By default the node turns
    /// on `favordynmods` there (until the host restarts), so that a create
    /// does not wait for an RCU grace period while moving its init into its
    /// cgroups; the price is a little more work in every fork and exit on
    /// the host (docs/configuration.md).
    #[arg(long)]
    pub no_favor_dynmods: bool,
    /// The isolation class of a sandbox that names none: `container` (the
    /// host kernel behind namespaces and seccomp) or `gvisor` (gVisor's
    /// user-space kernel, through runsc; docs/isolation.md).
    #[arg(long, default_value = "container", value_parser = clap::value_parser!(warren_core::Isolation))]
    pub default_isolation: warren_core::Isolation,
    /// The runsc binary of the `gvisor` class; default: `runsc` on PATH.
    /// The class is offered when it answers `runsc --version`.
    #[arg(long, value_name = "PATH")]
    pub runsc: Option<std::path::PathBuf>,
    /// gVisor's platform, passed to runsc as `--platform` (e.g. `ptrace`,
    /// `systrap`, `kvm`); default: runsc's own. `warren doctor` says which
    /// ones run here.
    #[arg(long, value_name = "NAME")]
    pub runsc_platform: Option<String>,
    /// Allow rule merged into every `allowlist` sandbox (object storage, log
    /// service, model registry), e.g. `logs.internal:443`. Repeatable.
    #[arg(long = "net-default-allow", value_name = "HOST:PORT")]
    pub net_default_allow: Vec<String>,
    /// Permit network mode `open`: egress through the proxy to any public
    /// address on any port (internal and metadata addresses still need an
    /// address rule, deny rules still apply). Off by default: a sandbox
    /// reaches only what it declares.
    #[arg(long)]
    pub egress_open: bool,
    /// Resolve NAME to fixed addresses in the egress proxy instead of DNS
    /// (like curl --resolve), e.g. `data.internal=10.0.0.5`. Repeatable.
    #[arg(long = "net-resolve", value_name = "NAME=IP[,IP]")]
    pub net_resolve: Vec<String>,
    /// Per sandbox: new egress connections (and plain-HTTP requests) per second.
    #[arg(long, default_value_t = 100.0)]
    pub net_conn_rate: f64,
    /// Per sandbox: egress connections open at once.
    #[arg(long, default_value_t = 512)]
    pub net_max_conns: usize,
    /// Per sandbox: egress bytes per second, both ways (e.g. 10M); unlimited if unset.
    #[arg(long)]
    pub net_bandwidth: Option<String>,
    /// Whole node: egress connections open at once.
    #[arg(long, default_value_t = 16384)]
    pub net_node_max_conns: usize,
    /// The node's CPU in cores, instead of the host's (overcommit and
    /// reserve apply to it): to lend a share of a shared host.
    #[arg(long)]
    pub capacity_cpu: Option<String>,
    /// The node's memory, instead of the host's (e.g. 2G).
    #[arg(long)]
    pub capacity_memory: Option<String>,
    /// A directory of CDI device specs (*.yaml, *.yml, *.json), instead of
    /// /etc/cdi and /var/run/cdi; a later one wins over an earlier one for
    /// a device of the same name. Repeatable. See docs/gpu.md.
    #[arg(long = "cdi-dir", value_name = "DIR")]
    pub cdi_dirs: Vec<std::path::PathBuf>,
    /// The CDI kind (vendor/class) that --gpus requests take.
    #[arg(long, default_value = warren_node::DEFAULT_GPU_KIND)]
    pub gpu_kind: String,
    /// The cgroup every sandbox lives below, e.g. `warren/ci-7`: a node of
    /// its own beside others on one host. The home remembers it (default:
    /// the one it recorded, else `warren`).
    #[arg(long, value_name = "PATH")]
    pub cgroup_parent: Option<warren_runtime::cgroup_parent::CgroupParent>,
}

/// Other clients' protocols, each on a listener of its own (`warren up` and
/// `warren server`); off unless given an address.
#[derive(Args)]
pub struct CompatOpts {
    /// Serve E2B's control API here (`E2B_API_URL`; the API key is Warren's
    /// API token).
    #[arg(long, value_name = "ADDR")]
    pub e2b_api: Option<SocketAddr>,
    /// Serve E2B's sandbox traffic (envd and ports) here (`E2B_SANDBOX_URL`).
    #[arg(long, value_name = "ADDR")]
    pub e2b_sandbox: Option<SocketAddr>,
    /// The domain E2B's SDKs name sandbox ports below (`PORT-ID.DOMAIN`,
    /// `get_host`): the sandbox door also routes requests by that Host.
    /// Needs wildcard DNS (`*.DOMAIN`) to --e2b-sandbox.
    #[arg(long, value_name = "DOMAIN")]
    pub e2b_domain: Option<warren_e2b::SandboxDomain>,
    /// Let sandboxes made through E2B with `allowPublicTraffic` (E2B's
    /// default) take requests on their ports without a token, as E2B does.
    /// Off: every port needs the sandbox's traffic token.
    #[arg(long)]
    pub e2b_public_traffic: bool,
    /// Serve SandboxFusion's `/run_code` here. It takes no token unless
    /// --sandbox-fusion-token sets one (its clients send none): keep it on
    /// loopback otherwise.
    #[arg(long, value_name = "ADDR")]
    pub sandbox_fusion: Option<SocketAddr>,
    /// The token SandboxFusion calls must carry (`Authorization: Bearer
    /// TOKEN`), for a door beyond loopback.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "WARREN_SANDBOX_FUSION_TOKEN",
        hide_env_values = true
    )]
    pub sandbox_fusion_token: Option<String>,
    /// The tenant whose sandboxes `/run_code` makes: its quota, queue and
    /// fair share count them (the tenant must exist when calls come).
    /// Default: the operator's.
    #[arg(long, value_name = "NAME")]
    pub sandbox_fusion_tenant: Option<warren_core::tenant::TenantName>,
    /// The image `/run_code` runs code in (it needs the languages' toolchains).
    #[arg(long, value_name = "REF", default_value = "python:3.11-slim")]
    pub sandbox_fusion_image: String,
}

/// Where the daemon's traces go (`warren up|server|node`).
#[derive(Args, Debug, Clone, Default)]
pub struct TraceOpts {
    /// Export traces over OTLP/HTTP to this collector (its base URL, e.g.
    /// http://127.0.0.1:4318; spans go to /v1/traces under it), as the
    /// standard OTEL_EXPORTER_OTLP_ENDPOINT does. JSON unless
    /// OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf. Unset: no traces.
    #[arg(long, value_name = "URL", env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

/// How the control plane admits and learns (`warren up` and `warren server`).
#[derive(Args)]
pub struct ControlOpts {
    /// Creates that may wait for capacity, per tenant; more get 429 with a
    /// retry hint.
    #[arg(long, default_value_t = 1024)]
    pub queue_limit: usize,
    /// Profile recommendations for CPU are the observed peak × this.
    #[arg(long, default_value_t = 1.5)]
    pub cpu_margin: f64,
    /// Profile recommendations for memory are the observed peak × this.
    #[arg(long, default_value_t = 1.5)]
    pub memory_margin: f64,
    /// The URL browsers reach the web console at, when a proxy or TLS is in
    /// front (e.g. https://warren.example); its origin is the one console
    /// requests must come from (default: http:// and the request's Host).
    #[arg(long, value_name = "URL")]
    pub public_url: Option<String>,
    /// Where browsers open the web pages sandboxes serve, each port on an
    /// origin of its own (`PORT-ID.<host>`, never the console's); links come
    /// from `GET /v1/sandboxes/ID/ports/PORT`. Port 0 picks a free one.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub ports_listen: SocketAddr,
    /// The URL browsers reach --ports-listen at (a host name: each sandbox
    /// port is a host below it, so beyond one machine it needs wildcard DNS,
    /// `*.HOST`); default http://localhost:PORT.
    #[arg(long, value_name = "URL")]
    pub ports_url: Option<String>,
    /// Send alerts (a node's CPU saturated, unreachable or lost; a sandbox
    /// OOM-killed, over its disk, or under memory pressure) to this URL in
    /// Alertmanager's webhook format. Repeatable.
    #[arg(long = "alert-webhook", value_name = "URL")]
    pub alert_webhooks: Vec<warren_control::alerts::Webhook>,
    /// Most bytes of sandbox logs and usage samples the control plane keeps
    /// from its nodes (e.g. 50G); past it the oldest are deleted. Unbounded
    /// if unset (--log-retention still applies).
    #[arg(long, value_name = "SIZE")]
    pub log_max_total: Option<String>,
}

#[derive(Args)]
pub struct UpArgs {
    /// Address of the API; keep it on loopback or put TLS in front.
    #[arg(long, env = "WARREN_LISTEN", default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,
    /// How the control plane reaches its node: in the same process, or
    /// over HTTP through the node API (as in a cluster; on loopback here).
    #[arg(long, value_enum, default_value_t = NodeTransport::InProcess)]
    pub node_transport: NodeTransport,
    /// Where the node API listens with `--node-transport http` (it takes
    /// the node credential in `<home>/node-credential`, never the API token).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub node_listen: SocketAddr,
    #[command(flatten)]
    pub control: ControlOpts,
    #[command(flatten)]
    pub node: NodeOpts,
    #[command(flatten)]
    pub compat: CompatOpts,
    #[command(flatten)]
    pub traces: TraceOpts,
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct ServerArgs {
    /// Where the public API (and node joins and heartbeats) are served.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,
    /// The state store: `sqlite:PATH` (default `<home>/warren.db`) or
    /// `postgres://user@host/db` for replicas sharing one database.
    #[arg(long)]
    pub database: Option<String>,
    /// The URL the other replicas forward requests to while this one leads
    /// (default: http:// and the --listen address).
    #[arg(long)]
    pub advertise: Option<String>,
    /// A registry every node reaches (`HOST[:PORT][/PATH]`, e.g. a
    /// `docker-registry` beside the server): images built, committed or
    /// imported in the cluster are pushed there under their names, and a
    /// node that lacks one pulls it by digest. Without it such images stay
    /// on the node that made them.
    #[arg(long, value_name = "HOST[:PORT][/PATH]")]
    pub cluster_registry: Option<warren_core::image_ref::ClusterRegistry>,
    /// How long the sandbox logs and usage samples the nodes ship are kept
    /// (e.g. 7d, 12h).
    #[arg(long, default_value = "7d")]
    pub log_retention: String,
    #[command(flatten)]
    pub control: ControlOpts,
    #[command(flatten)]
    pub compat: CompatOpts,
    #[command(flatten)]
    pub traces: TraceOpts,
    #[command(subcommand)]
    pub command: Option<ServerCmd>,
}

#[derive(Subcommand)]
pub enum ServerCmd {
    /// Print the token nodes join with (`<home>/join-token`, made on first
    /// use); --rotate replaces it (nodes already joined stay joined).
    JoinToken {
        /// Replace the token with a new one (nodes already joined stay).
        #[arg(long)]
        rotate: bool,
    },
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct NodeArgs {
    /// The control plane to join (`http://host:7070`); several replicas
    /// comma-separated, tried in turn when one does not answer.
    #[arg(long, required = true)]
    pub server: Option<String>,
    /// File holding the join token (`warren server join-token` prints it).
    #[arg(long, required = true)]
    pub join_token: Option<PathBuf>,
    /// Where this node's API listens (it takes only the credential the
    /// control plane received at join, never a user's API token).
    #[arg(long, default_value = "127.0.0.1:7071")]
    pub listen: SocketAddr,
    /// The URL the control plane reaches this node's API at (default:
    /// https:// and the --listen address; set it when listening on 0.0.0.0).
    #[arg(long)]
    pub advertise: Option<String>,
    /// This node's name in the cluster (default: the host name).
    #[arg(long)]
    pub name: Option<String>,
    /// A label the scheduler's node selectors match, e.g. `gpu=h200`.
    /// Repeatable.
    #[arg(long = "label", short = 'l', value_name = "K=V")]
    pub labels: Vec<String>,
    #[command(flatten)]
    pub node: NodeOpts,
    #[command(flatten)]
    pub traces: TraceOpts,
    #[command(subcommand)]
    pub command: Option<NodeCmd>,
}

#[derive(Subcommand)]
pub enum NodeCmd {
    /// List the cluster's nodes: state, labels, capacity, allocation, load.
    Ls {
        /// Print the nodes as JSON (as `GET /v1/nodes` answers).
        #[arg(long)]
        json: bool,
    },
    /// Stop placing sandboxes on a node (what runs there stays).
    Cordon {
        /// The node's name (see `warren node ls`).
        name: String,
    },
    /// Place sandboxes on a node again.
    Uncordon {
        /// The node's name (see `warren node ls`).
        name: String,
    },
    /// Remove a node from the cluster: its sandboxes become `lost`.
    Rm {
        /// The node's name (see `warren node ls`).
        name: String,
    },
    /// Cordon a node and wait for its sandboxes to end; those still there
    /// at the deadline are destroyed (reason `node_drained`).
    Drain {
        /// The node's name (see `warren node ls`).
        name: String,
        /// How long sandboxes may run on before they are destroyed.
        #[arg(long, default_value = "10m")]
        deadline: String,
    },
}
