use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "warren",
    version,
    about = "Isolated, disposable sandboxes for agent and RL training"
)]
pub struct Cli {
    /// Warren API URL (client commands).
    #[arg(
        long,
        env = "WARREN_URL",
        default_value = "http://127.0.0.1:7070",
        global = true
    )]
    pub url: String,
    /// API token; defaults to the token file under --home.
    #[arg(long, env = "WARREN_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// Warren's state directory.
    #[arg(
        long,
        env = "WARREN_HOME",
        default_value = "/var/lib/warren",
        global = true
    )]
    pub home: PathBuf,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run control plane, node agent and SQLite store in one process.
    Up(UpArgs),
    /// Run a cluster's control plane: the public API, scheduler and store;
    /// nodes join it with `warren node`.
    Server(ServerArgs),
    /// Run a node agent that joins a `warren server` (`warren node --server
    /// URL --join-token FILE`), or manage the cluster's nodes (`ls`,
    /// `cordon`, `uncordon`, `rm`).
    Node(NodeArgs),
    /// Manage images.
    #[command(subcommand)]
    Image(ImageCmd),
    /// Create a sandbox and print its id once it is ready.
    Create(CreateArgs),
    /// Run a command as a sandbox's main process, stream its output, exit with its code.
    Run {
        #[command(flatten)]
        create: CreateArgs,
        /// Remove the sandbox when the command ends.
        #[arg(long)]
        rm: bool,
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Run a command in a running sandbox.
    Exec(ExecArgs),
    /// Copy files: `warren cp LOCAL ID:PATH` or `warren cp ID:PATH LOCAL`.
    Cp { src: String, dst: String },
    /// List sandboxes.
    Ps {
        #[arg(long)]
        label: Vec<String>,
        #[arg(long)]
        state: Option<String>,
        /// Include destroyed, failed and lost sandboxes.
        #[arg(long, short)]
        all: bool,
        #[arg(long)]
        json: bool,
    },
    /// Show a sandbox as JSON: spec, state, node, usage, events.
    Inspect { id: String },
    /// Store a sandbox's filesystem changes as a new image: one layer on top
    /// of the image it runs (push it with `warren image push`).
    Commit {
        id: String,
        /// Name of the new image, repo[:tag].
        name: String,
    },
    /// Print a sandbox's JSON-lines log (or, with --label, those of every
    /// matching sandbox).
    Logs {
        #[arg(required_unless_present = "label")]
        id: Option<String>,
        #[arg(long, conflicts_with = "id")]
        label: Vec<String>,
        #[arg(long, short)]
        follow: bool,
    },
    /// Destroy sandboxes by id or label selector.
    Rm {
        ids: Vec<String>,
        #[arg(long)]
        label: Vec<String>,
    },
    /// Resource profiles: learned requests per task.
    #[command(subcommand)]
    Profile(ProfileCmd),
    /// Batches: N sandboxes from one spec.
    #[command(subcommand)]
    Batch(BatchCmd),
    /// Show the event stream (state changes with reasons).
    Events {
        #[arg(long)]
        sandbox: Option<String>,
        #[arg(long)]
        label: Vec<String>,
        #[arg(long)]
        batch: Option<String>,
        /// Reason or state, e.g. ttl_expired or destroyed.
        #[arg(long = "type")]
        kind: Option<String>,
        #[arg(long, short)]
        follow: bool,
    },
    /// Freeze every process of a running sandbox.
    Pause { id: String },
    /// Thaw a paused sandbox.
    Resume { id: String },
    /// Renew a sandbox's lease.
    Heartbeat { id: String },
    /// Let a sandbox live TTL from now (e.g. 30m).
    Ttl { id: String, ttl: String },
    /// Replace an `allowlist` sandbox's egress rules; connections the new
    /// rules do not allow are closed.
    Network {
        id: String,
        #[arg(long)]
        allow: Vec<String>,
        #[arg(long)]
        deny: Vec<String>,
    },
    /// Forward a local TCP port to a port inside a sandbox (LOCAL:REMOTE,
    /// or just PORT for both).
    PortForward {
        id: String,
        ports: String,
        /// Local address to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        address: std::net::IpAddr,
    },
    /// Measure create/exec/destroy through the API (see docs/benchmarks.md).
    Bench(BenchArgs),
    /// Measure the scheduler alone: placement decisions per second over
    /// simulated nodes, full filter and score (see docs/benchmarks.md).
    BenchPlacement(BenchPlacementArgs),
    /// Measure what network mode `allowlist` costs: create latency, proxy
    /// latency and tunnel throughput, many live policies (run as root on
    /// the node; see docs/benchmarks.md).
    BenchNet(BenchNetArgs),
    /// Check this host: kernel features, cgroups, overlayfs, seccomp, user
    /// namespaces, disk limits; say what Warren can and cannot guarantee.
    Doctor {
        #[arg(long)]
        json: bool,
    },
    /// Replay a synthetic training workload against simulated nodes with
    /// fixed, learned and oracle requests (see docs/benchmarks.md).
    Simulate(SimulateArgs),
    #[command(hide = true)]
    Spawner,
}

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
    /// Sum of sandbox CPU limits allowed per core (CPU is compressible).
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
    /// How long the log of a finished sandbox is kept (e.g. 7d, 12h).
    #[arg(long, default_value = "7d")]
    pub log_retention: String,
    /// Most bytes of log kept per sandbox (its newest lines; the log is
    /// rotated once, at half of this).
    #[arg(long, default_value = "64M")]
    pub log_max: String,
    /// Disk a sandbox created without --disk may fill (its writable layer,
    /// measured every ~10 s; past it the sandbox is stopped with reason
    /// disk_exceeded). 0 turns the per-sandbox limit off.
    #[arg(long, default_value = "10G")]
    pub default_disk: String,
    /// Free space kept under the home: below it creates are refused and the
    /// sandbox that wrote the most is stopped (default: the larger of 1G and
    /// 5% of the file system).
    #[arg(long)]
    pub disk_floor: Option<String>,
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
    /// Allow rule merged into every `allowlist` sandbox (object storage, log
    /// service, model registry), e.g. `logs.internal:443`. Repeatable.
    #[arg(long = "net-default-allow", value_name = "HOST:PORT")]
    pub net_default_allow: Vec<String>,
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
}

/// How the control plane admits and learns (`warren up` and `warren server`).
#[derive(Args)]
pub struct ControlOpts {
    /// Creates that may wait for capacity; more get 429 with a retry hint.
    #[arg(long, default_value_t = 1024)]
    pub queue_limit: usize,
    /// Profile recommendations are peak × margin, per resource.
    #[arg(long, default_value_t = 1.5)]
    pub cpu_margin: f64,
    #[arg(long, default_value_t = 1.5)]
    pub memory_margin: f64,
}

#[derive(Args)]
pub struct UpArgs {
    #[arg(long, default_value = "127.0.0.1:7070")]
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
    #[command(flatten)]
    pub control: ControlOpts,
    #[command(subcommand)]
    pub command: Option<ServerCmd>,
}

#[derive(Subcommand)]
pub enum ServerCmd {
    /// Print the token nodes join with (`<home>/join-token`, made on first
    /// use); --rotate replaces it (nodes already joined stay joined).
    JoinToken {
        #[arg(long)]
        rotate: bool,
    },
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct NodeArgs {
    /// The control plane to join (`http://host:7070`).
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
    /// http:// and the --listen address; set it when listening on 0.0.0.0).
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
    #[command(subcommand)]
    pub command: Option<NodeCmd>,
}

#[derive(Subcommand)]
pub enum NodeCmd {
    /// List the cluster's nodes: state, labels, capacity, allocation, load.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Stop placing sandboxes on a node (what runs there stays).
    Cordon { name: String },
    /// Place sandboxes on a node again.
    Uncordon { name: String },
    /// Remove a node from the cluster: its sandboxes become `lost`.
    Rm { name: String },
    /// Cordon a node and wait for its sandboxes to end; those still there
    /// at the deadline are destroyed (reason `node_drained`).
    Drain {
        name: String,
        /// How long sandboxes may run on before they are destroyed.
        #[arg(long, default_value = "10m")]
        deadline: String,
    },
}

#[derive(Subcommand)]
pub enum ImageCmd {
    /// Import an OCI image-layout tar or a docker-archive tar.
    Import {
        file: PathBuf,
        #[arg(long)]
        name: String,
    },
    /// Pull an image from an OCI registry (host[:port]/repo[:tag|@sha256:digest]).
    /// Credentials and plain-HTTP registries are configured in
    /// <home>/registries.toml on the node.
    Pull {
        reference: String,
        /// No progress lines on stderr.
        #[arg(long, short)]
        quiet: bool,
        /// Print the image record as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Collect unreferenced image content; with --budget, also remove
    /// registry images no sandbox uses (oldest first) until the store fits.
    /// Prints a JSON report.
    Gc {
        /// Most bytes the image store may hold, e.g. 20G.
        #[arg(long)]
        budget: Option<String>,
    },
    /// Push a stored image to a registry (host[:port]/repo:tag).
    Push {
        reference: String,
        /// The stored image to push under REFERENCE (default: the image
        /// named REFERENCE).
        #[arg(long)]
        from: Option<String>,
    },
    /// Pull an image onto nodes before a batch needs it; answers once every
    /// node holds the digest the reference names now.
    Prewarm {
        reference: String,
        /// Node names, comma-separated, or `all` (the default).
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<String>,
        /// Only nodes carrying this label, e.g. `gpu=h200`. Repeatable.
        #[arg(long = "node-selector", value_name = "K=V")]
        node_selector: Vec<String>,
    },
    /// List images.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Remove an image.
    Rm { reference: String },
}

#[derive(Subcommand)]
pub enum ProfileCmd {
    Ls,
    Show {
        name: String,
    },
    /// Print the profile table as TOML.
    Export,
    /// Load a TOML profile table (as written by export).
    Import {
        file: PathBuf,
    },
    /// Forget a profile's runs and anomaly flag.
    Reset {
        name: String,
    },
}

#[derive(Subcommand)]
pub enum BatchCmd {
    /// Create COUNT sandboxes from one spec; prints progress, then the batch id.
    Create {
        #[arg(long)]
        count: u32,
        /// Batch label, e.g. task=swe (added to every sandbox's labels).
        #[arg(long = "batch-label")]
        batch_labels: Vec<String>,
        /// Retry an OOM-killed sandbox once with the grown request.
        #[arg(long)]
        retry_on_oom: bool,
        /// Retry a sandbox lost with its node once, on another node.
        #[arg(long)]
        retry_on_lost: bool,
        #[command(flatten)]
        create: Box<CreateArgs>,
        /// Main command for every sandbox.
        #[arg(last = true)]
        cmd: Vec<String>,
    },
    Ls,
    Inspect {
        id: String,
    },
    Rm {
        id: String,
    },
}

#[derive(Args, Clone)]
pub struct CreateArgs {
    #[arg(long)]
    pub image: String,
    /// CPU cores (0.5) or millicores (500m).
    #[arg(long)]
    pub cpu: Option<String>,
    /// Memory hard limit (256M, 1G); no swap.
    #[arg(long)]
    pub memory: Option<String>,
    #[arg(long)]
    pub pids: Option<u32>,
    #[arg(long)]
    pub disk: Option<String>,
    #[arg(long)]
    pub gpus: Option<u32>,
    #[arg(long = "env", short = 'e')]
    pub env: Vec<String>,
    #[arg(long = "label", short = 'l')]
    pub labels: Vec<String>,
    #[arg(long)]
    pub ttl: Option<String>,
    #[arg(long)]
    pub lease: Option<String>,
    #[arg(long)]
    pub profile: Option<String>,
    #[arg(long)]
    pub network: Option<String>,
    /// Egress rule HOST:PORT (name, *.suffix, IPv4 or CIDR); implies
    /// `--network allowlist`. Repeatable.
    #[arg(long)]
    pub allow: Vec<String>,
    /// Rule that wins over the allow rules. Repeatable.
    #[arg(long)]
    pub deny: Vec<String>,
    #[arg(long)]
    pub reclaim: Option<String>,
    /// How long a kept sandbox is held (keep, keep_on_failure), e.g. 2h.
    #[arg(long)]
    pub keep_for: Option<String>,
    #[arg(long)]
    pub cwd: Option<String>,
    #[arg(long)]
    pub user: Option<String>,
    /// Idempotency key: a repeated create with the same id returns the first sandbox.
    #[arg(long)]
    pub request_id: Option<String>,
    /// Run only on a node carrying this label (a cluster), e.g. `gpu=h200`.
    /// Repeatable: every one must match.
    #[arg(long = "node-selector", value_name = "K=V")]
    pub node_selector: Vec<String>,
    /// How nodes are chosen: `spread` (the most free, the default) or
    /// `pack` (the fullest that fits, for GPU nodes).
    #[arg(long)]
    pub placement: Option<String>,
}

#[derive(Args)]
pub struct ExecArgs {
    pub id: String,
    #[arg(long = "env", short = 'e')]
    pub env: Vec<String>,
    #[arg(long)]
    pub cwd: Option<String>,
    #[arg(long)]
    pub timeout: Option<String>,
    #[arg(long)]
    pub user: Option<String>,
    /// Send this process's stdin to the command.
    #[arg(long, short = 'i')]
    pub stdin: bool,
    #[arg(last = true, required = true)]
    pub cmd: Vec<String>,
}

#[derive(Args)]
pub struct BenchArgs {
    #[arg(long)]
    pub image: String,
    /// Iterations per measurement.
    #[arg(long, default_value_t = 200)]
    pub iterations: usize,
    /// Concurrency levels for the full cycle.
    #[arg(long, default_value = "1,8")]
    pub concurrency: String,
    /// Idle sandboxes to hold at once for the memory check (0 to skip).
    #[arg(long, default_value_t = 200)]
    pub idle: usize,
    /// PID of the daemon, to report its RSS growth during the idle check.
    #[arg(long)]
    pub daemon_pid: Option<u32>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct BenchNetArgs {
    #[arg(long)]
    pub image: String,
    /// Iterations per latency measurement.
    #[arg(long, default_value_t = 100)]
    pub iterations: usize,
    /// MiB sent through the CONNECT tunnel (and directly, for comparison).
    #[arg(long, default_value_t = 2048)]
    pub tunnel_mib: u64,
    /// Sandboxes with live policies held at once (0 to skip).
    #[arg(long, default_value_t = 500)]
    pub sandboxes: usize,
    /// PID of the daemon, to report its RSS with the live policies.
    #[arg(long)]
    pub daemon_pid: Option<u32>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct BenchPlacementArgs {
    /// Simulated node counts, each measured in turn.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    pub nodes: Vec<usize>,
    /// Placements measured per node count (each followed by a release, so
    /// the cluster stays about half full).
    #[arg(long, default_value_t = 100000)]
    pub decisions: usize,
}

#[derive(Args)]
pub struct SimulateArgs {
    #[arg(long, default_value_t = 5000)]
    pub sandboxes: usize,
    #[arg(long, default_value_t = 200)]
    pub tasks: usize,
    #[arg(long, default_value_t = 64)]
    pub node_cores: u64,
    #[arg(long, default_value_t = 256)]
    pub node_memory_gib: u64,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Profile margins: recommendation = peak × margin.
    #[arg(long, default_value_t = 1.5)]
    pub cpu_margin: f64,
    #[arg(long, default_value_t = 1.5)]
    pub memory_margin: f64,
    /// Sum of sandbox CPU limits allowed per core, as `warren up
    /// --cpu-overcommit` (same default); 1 makes CPU requests binding.
    #[arg(long, default_value_t = 8.0)]
    pub cpu_overcommit: f64,
}
