use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "warren",
    version,
    about = "Isolated, disposable sandboxes for agent and RL training",
    after_help = "Start with `warren doctor`, then `warren up &` (or `systemctl start warren-up`);\n\
                  `warren COMMAND --help` shows each command's flags and examples."
)]
pub struct Cli {
    /// The API of the `warren up` to talk to (client commands).
    #[arg(
        long,
        env = "WARREN_URL",
        default_value = "http://127.0.0.1:7070",
        global = true,
        help_heading = "Global options"
    )]
    pub url: String,
    /// API token; default: the token file in --home.
    #[arg(
        long,
        env = "WARREN_TOKEN",
        global = true,
        hide_env_values = true,
        help_heading = "Global options"
    )]
    pub token: Option<String>,
    /// Warren's state directory: where `warren up` keeps everything, and
    /// where client commands read its token.
    #[arg(
        long,
        env = "WARREN_HOME",
        default_value = "/var/lib/warren",
        global = true,
        help_heading = "Global options"
    )]
    pub home: PathBuf,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run control plane, node agent and SQLite store in one process.
    #[command(after_help = "Examples:\n  \
        warren up &                                   # 127.0.0.1:7070, home /var/lib/warren\n  \
        warren up --listen 127.0.0.1:7171 --home /srv/warren\n  \
        systemctl enable --now warren-up              # as a service (scripts/install.sh)\n\n\
        Its log is <home>/warren-up.log; the terminal gets warnings and its own lines.")]
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
    #[command(after_help = "Examples:\n  \
        id=$(warren create --image busybox --cpu 0.5 --memory 256M --label task=demo)\n  \
        warren create --image busybox --allow pypi.org:443        # egress through the proxy\n  \
        warren create --image busybox --lease 30s                 # dies unless `warren heartbeat` renews it")]
    Create(CreateArgs),
    /// Run a command as a sandbox's main process, stream its output, exit with its code.
    #[command(after_help = "Example:\n  \
        warren run --image busybox --rm -- sh -c 'echo hello; exit 3'; echo $?   # hello, 3")]
    Run {
        #[command(flatten)]
        create: CreateArgs,
        /// Remove the sandbox when the command ends.
        #[arg(long)]
        rm: bool,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "CMD")]
        cmd: Vec<String>,
    },
    /// Run a command in a running sandbox.
    #[command(after_help = "Examples:\n  \
        warren exec $id -- sh -c 'hostname; ps'\n  \
        warren exec $id --timeout 2s -- sleep 100        # killed with its whole tree: exit 137\n  \
        echo data | warren exec -i $id -- wc -c\n  \
        warren exec -it $id -- sh                        # a shell on a terminal in the sandbox")]
    Exec(ExecArgs),
    /// Copy files: `warren cp LOCAL ID:PATH` or `warren cp ID:PATH LOCAL`.
    #[command(
        after_help = "A path ending in / is a directory the file goes into under its own name;\n\
        directories travel as tar (their contents are copied into the destination).\n\n\
        Examples:\n  \
        warren cp ./train.py $id:/work/          # -> /work/train.py\n  \
        warren cp $id:/work ./out                # /work's contents into ./out"
    )]
    Cp {
        /// LOCAL path, or ID:/absolute/path in a sandbox.
        src: String,
        /// LOCAL path, or ID:/absolute/path in a sandbox.
        dst: String,
    },
    /// List a directory in a sandbox, or describe a file or link: mode,
    /// owner (ids inside the sandbox), size, modification time (UTC), path.
    #[command(
        after_help = "A symlink is shown as a link (-> target), never followed; end the path\n\
        with / to list the directory it points to (resolved inside the sandbox).\n\n\
        Examples:\n  \
        warren ls $id /work\n  \
        warren ls $id /work --depth 3 --json     # every entry three levels down, as JSON"
    )]
    Ls {
        /// The sandbox id (sbx-…).
        id: String,
        /// Path in the sandbox.
        path: String,
        /// Levels to descend into subdirectories (1: the directory's own entries).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        depth: u32,
        /// One JSON array (as `POST /v1/sandboxes/{id}/paths` answers) instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Make a directory in a sandbox, and its missing parents.
    #[command(after_help = "Example:\n  \
        warren mkdir $id /work/out/logs")]
    Mkdir {
        /// The sandbox id (sbx-…).
        id: String,
        /// Path of the new directory; an existing path is an error.
        path: String,
    },
    /// Rename or move a path in a sandbox (FROM's file or whole directory),
    /// making TO's missing parent directories.
    #[command(after_help = "Example:\n  \
        warren mv $id /work/out /archive/run-1/out")]
    Mv {
        /// The sandbox id (sbx-…).
        id: String,
        /// The path to move.
        from: String,
        /// Its new path (a file there is replaced).
        to: String,
    },
    /// List sandboxes.
    #[command(after_help = "Examples:\n  \
        warren ps --label task=demo\n  \
        warren ps --all --state failed --json")]
    Ps {
        /// Only sandboxes with this label, KEY=VALUE. Repeatable (all must match).
        #[arg(long, value_name = "KEY=VALUE")]
        label: Vec<String>,
        /// Only sandboxes in this state.
        #[arg(
            long,
            value_parser = [
                "queued", "creating", "running", "paused", "stopping",
                "destroyed", "failed", "kept", "lost",
            ]
        )]
        state: Option<String>,
        /// Include destroyed, failed and lost sandboxes.
        #[arg(long, short)]
        all: bool,
        /// One JSON array instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Show a sandbox as JSON: spec, state, node, usage, events.
    Inspect {
        /// The sandbox id (sbx-…).
        id: String,
    },
    /// Make N new sandboxes that start from a running or paused sandbox's
    /// filesystem as it is now, and print their ids, one per line.
    #[command(
        after_help = "The sandbox's changes are copied once (a running one is frozen for the copy);\n\
        each child writes to its own layer on top, unseen by the source and its siblings.\n\
        Processes are not carried over: each child runs the source's main process anew,\n\
        if it has one. Labels, sizes and lifetimes are the source's unless given here.\n\n\
        Examples:\n  \
        warren fork $id --count 8 --label branch=a      # one environment state, 8 rollouts\n  \
        warren rm --label warren.dev/fork-of=$id        # every child of $id"
    )]
    Fork(ForkArgs),
    /// Store a sandbox's filesystem changes as a new image: one layer on top
    /// of the image it runs (push it with `warren image push`).
    Commit {
        /// The sandbox id (sbx-…).
        id: String,
        /// Name of the new image, repo[:tag].
        name: String,
    },
    /// Print a sandbox's JSON-lines log (or, with --label, those of every
    /// matching sandbox).
    #[command(
        after_help = "Each line has a `kind`: exec, stdout, stderr, state, net (egress decisions), ...\n\n\
        Examples:\n  \
        warren logs $id\n  \
        warren logs $id | grep '\"kind\":\"net\"'      # every egress decision, with its rule"
    )]
    Logs {
        /// The sandbox id (sbx-…).
        #[arg(required_unless_present = "label")]
        id: Option<String>,
        /// The logs of every sandbox with this label, KEY=VALUE. Repeatable.
        #[arg(long, conflicts_with = "id", value_name = "KEY=VALUE")]
        label: Vec<String>,
        /// Keep printing new lines until the sandbox ends.
        #[arg(long, short)]
        follow: bool,
    },
    /// Destroy sandboxes by id or label selector; or, with `ID /PATH`,
    /// remove a file, link or whole directory in a sandbox.
    #[command(after_help = "Examples:\n  \
        warren rm $id\n  \
        warren rm --label task=demo\n  \
        warren rm $id /work/tmp            # the directory and all it holds; the sandbox stays")]
    Rm {
        /// Sandbox ids (sbx-…); or one id and an absolute path in that sandbox.
        #[arg(value_name = "ID|PATH")]
        ids: Vec<String>,
        /// Every sandbox with this label, KEY=VALUE. Repeatable (all must match).
        #[arg(long, value_name = "KEY=VALUE")]
        label: Vec<String>,
    },
    /// Resource profiles: learned requests per task.
    #[command(subcommand)]
    Profile(ProfileCmd),
    /// Warm pools: ready sandboxes that matching creates take at once.
    #[command(subcommand)]
    Pool(PoolCmd),
    /// Batches: N sandboxes from one spec.
    #[command(subcommand)]
    Batch(BatchCmd),
    /// Show the event stream (state changes with reasons).
    #[command(after_help = "Examples:\n  \
        warren events --sandbox $id\n  \
        warren events --type lease_expired --follow     # Ctrl-C to stop following")]
    Events {
        /// Only this sandbox's events.
        #[arg(long, value_name = "ID")]
        sandbox: Option<String>,
        /// Only events of sandboxes with this label, KEY=VALUE. Repeatable.
        #[arg(long, value_name = "KEY=VALUE")]
        label: Vec<String>,
        /// Only events of this batch's sandboxes.
        #[arg(long, value_name = "BATCH_ID")]
        batch: Option<String>,
        /// Reason or state, e.g. ready, exited, ttl_expired, lease_expired,
        /// oom_killed, destroyed.
        #[arg(long = "type", value_name = "REASON|STATE")]
        kind: Option<String>,
        /// Keep printing new events as they happen (until Ctrl-C).
        #[arg(long, short)]
        follow: bool,
    },
    /// Freeze every process of a running sandbox.
    Pause {
        /// The sandbox id (sbx-…).
        id: String,
    },
    /// Thaw a paused sandbox.
    Resume {
        /// The sandbox id (sbx-…).
        id: String,
    },
    /// Renew a sandbox's lease: a sandbox created with --lease D is
    /// destroyed (reason lease_expired) D after its last heartbeat.
    Heartbeat {
        /// The sandbox id (sbx-…).
        id: String,
    },
    /// Let a sandbox live TTL from now (e.g. 30m).
    Ttl {
        /// The sandbox id (sbx-…).
        id: String,
        /// How long from now, e.g. 90s, 30m, 2h.
        ttl: String,
    },
    /// Change what happens when a running sandbox ends: e.g. keep its
    /// scene (frozen, inspectable) to debug it.
    #[command(after_help = "Example:\n  \
        warren reclaim $id keep --keep-for 2h")]
    Reclaim {
        /// The sandbox id (sbx-…).
        id: String,
        /// destroy, delay, keep or keep_on_failure (as `create --reclaim`).
        #[arg(value_parser = ["destroy", "delay", "keep", "keep_on_failure"])]
        reclaim: String,
        /// How long a kept sandbox is held (or a delayed one frozen), e.g.
        /// 2h; unchanged when left out.
        #[arg(long)]
        keep_for: Option<String>,
    },
    /// Replace an `allowlist` sandbox's egress rules; connections the new
    /// rules do not allow are closed.
    #[command(after_help = "Example:\n  \
        warren network $id --allow pypi.org:443 --allow '*.s3.amazonaws.com:443'")]
    Network {
        /// The sandbox id (sbx-…).
        id: String,
        /// Egress rule HOST:PORT (name, *.suffix, IPv4 or CIDR). Repeatable.
        #[arg(long, value_name = "HOST:PORT")]
        allow: Vec<String>,
        /// Rule that wins over the allow rules. Repeatable.
        #[arg(long, value_name = "HOST:PORT")]
        deny: Vec<String>,
    },
    /// Forward a local TCP port to a port inside a sandbox (LOCAL:REMOTE,
    /// or just PORT for both).
    #[command(after_help = "Example:\n  \
        warren port-forward $id 8080:8000 &     # local 8080 -> port 8000 in the sandbox")]
    PortForward {
        /// The sandbox id (sbx-…).
        id: String,
        /// LOCAL:REMOTE, or PORT for both.
        #[arg(value_name = "LOCAL:REMOTE")]
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
    /// Measure creates per second through the API: COUNT sandboxes at a
    /// concurrency, then their deletes (see docs/benchmarks.md).
    BenchCreates(BenchCreatesArgs),
    /// Join COUNT in-memory nodes to a `warren server`: each speaks the real
    /// node API but makes no sandboxes (for control-plane benchmarks).
    #[command(hide = true)]
    FakeNodes(FakeNodesArgs),
    /// Measure what network mode `allowlist` costs: create latency, proxy
    /// latency and tunnel throughput, many live policies (run as root on
    /// the node; see docs/benchmarks.md).
    BenchNet(BenchNetArgs),
    /// Check this host: kernel features, cgroups, overlayfs, seccomp, user
    /// namespaces, disk limits; say what Warren can and cannot guarantee.
    Doctor {
        /// The checks as JSON.
        #[arg(long)]
        json: bool,
        /// Read CDI specs here instead of /etc/cdi and /var/run/cdi (as the
        /// node's --cdi-dir). Repeatable.
        #[arg(long = "cdi-dir", value_name = "DIR")]
        cdi_dirs: Vec<std::path::PathBuf>,
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
    /// A directory of CDI device specs (*.yaml, *.yml, *.json), instead of
    /// /etc/cdi and /var/run/cdi; a later one wins over an earlier one for
    /// a device of the same name. Repeatable. See docs/gpu.md.
    #[arg(long = "cdi-dir", value_name = "DIR")]
    pub cdi_dirs: Vec<std::path::PathBuf>,
    /// The CDI kind (vendor/class) that --gpus requests take.
    #[arg(long, default_value = warren_node::DEFAULT_GPU_KIND)]
    pub gpu_kind: String,
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
    /// Serve SandboxFusion's `/run_code` here. It takes no token (its
    /// clients send none): keep it on loopback.
    #[arg(long, value_name = "ADDR")]
    pub sandbox_fusion: Option<SocketAddr>,
    /// The image `/run_code` runs code in (it needs the languages' toolchains).
    #[arg(long, value_name = "REF", default_value = "python:3.11-slim")]
    pub sandbox_fusion_image: String,
}

/// How the control plane admits and learns (`warren up` and `warren server`).
#[derive(Args)]
pub struct ControlOpts {
    /// Creates that may wait for capacity; more get 429 with a retry hint.
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
    #[command(flatten)]
    pub control: ControlOpts,
    #[command(flatten)]
    pub compat: CompatOpts,
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

#[derive(Subcommand)]
pub enum ImageCmd {
    /// Import an OCI image-layout tar or a docker-archive tar.
    #[command(after_help = "Example:\n  \
        warren image import /tmp/busybox.tar --name busybox:latest")]
    Import {
        /// The archive (e.g. from `skopeo copy … oci-archive:FILE` or `docker save`).
        file: PathBuf,
        /// Name to store it under, repo[:tag]; sandboxes use it as --image.
        #[arg(long)]
        name: String,
    },
    /// Pull an image from an OCI registry (host[:port]/repo[:tag|@sha256:digest]).
    /// Credentials and plain-HTTP registries are configured in
    /// <home>/registries.toml on the node.
    Pull {
        /// host[:port]/repo[:tag|@sha256:digest].
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
        /// host[:port]/repo:tag to push to.
        reference: String,
        /// The stored image to push under REFERENCE (default: the image
        /// named REFERENCE).
        #[arg(long)]
        from: Option<String>,
    },
    /// Pull an image onto nodes before a batch needs it; answers once every
    /// node holds the digest the reference names now.
    Prewarm {
        /// host[:port]/repo[:tag|@sha256:digest].
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
        /// One JSON array instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Remove an image.
    Rm {
        /// Its name (repo[:tag]) or digest.
        reference: String,
    },
}

#[derive(Subcommand)]
pub enum PoolCmd {
    /// Create or resize a pool: keep SIZE ready sandboxes of this image and
    /// size; a create asking for the same image and sizes (no command, own
    /// disk or node selector) takes one and gets its labels, env, TTL,
    /// lease and network policy at that moment.
    #[command(after_help = "Example:\n  \
        warren pool set py --image python:3.12 --memory 1G --size 16\n  \
        warren create --image python:3.12 --memory 1G --label task=t1   # served from the pool")]
    Set {
        /// The pool's name (a label value: letters, digits, '-', '_', '.').
        name: String,
        /// The image its sandboxes run (as `warren create --image`).
        #[arg(long)]
        image: String,
        /// CPU limit (as `warren create --cpu`).
        #[arg(long)]
        cpu: Option<String>,
        /// Memory limit (as `warren create --memory`).
        #[arg(long)]
        memory: Option<String>,
        /// CPU reserved (as `warren create --cpu-request`).
        #[arg(long)]
        cpu_request: Option<String>,
        /// Memory reserved (as `warren create --memory-request`).
        #[arg(long)]
        memory_request: Option<String>,
        /// Most processes (as `warren create --pids`).
        #[arg(long)]
        pids: Option<u32>,
        /// Ready sandboxes to keep.
        #[arg(long)]
        size: u32,
    },
    /// List pools: size, ready sandboxes, creates served.
    Ls {
        /// The pools as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a pool and its ready sandboxes (ones already taken stay).
    Rm {
        /// The pool's name.
        name: String,
    },
}

#[derive(Subcommand)]
pub enum ProfileCmd {
    /// List profiles: each task's observed peaks and recommended requests.
    Ls,
    /// Show one profile as JSON.
    Show {
        /// The profile's name (a sandbox's --profile, or its task label).
        name: String,
    },
    /// Print the profile table as TOML.
    Export,
    /// Load a TOML profile table (as written by export).
    Import {
        /// The TOML file.
        file: PathBuf,
    },
    /// Forget a profile's runs and anomaly flag.
    Reset {
        /// The profile's name.
        name: String,
    },
}

#[derive(Subcommand)]
pub enum BatchCmd {
    /// Create COUNT sandboxes from one spec; prints progress, then the batch id.
    #[command(after_help = "Example:\n  \
        b=$(warren batch create --count 50 --batch-label task=swe --image busybox --memory 64M -- sh -c 'exit 0')\n  \
        warren batch inspect $b")]
    Create {
        /// How many sandboxes.
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
        /// Main command for every sandbox, after `--`.
        #[arg(last = true, value_name = "CMD")]
        cmd: Vec<String>,
    },
    /// List batches.
    Ls,
    /// Show a batch as JSON: counts per state, summed usage, failures.
    Inspect {
        /// The batch id.
        id: String,
    },
    /// Destroy a batch's sandboxes.
    Rm {
        /// The batch id.
        id: String,
    },
}

#[derive(Args)]
pub struct ForkArgs {
    /// The sandbox to fork (sbx-…).
    pub id: String,
    /// Children to make, 1 to 256.
    #[arg(long, short = 'n', default_value_t = 1)]
    pub count: u32,
    /// Label KEY=VALUE added to (and over) the source's. Repeatable.
    #[arg(long = "label", short = 'l', value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// CPU limit instead of the source's.
    #[arg(long)]
    pub cpu: Option<String>,
    /// Memory limit instead of the source's.
    #[arg(long)]
    pub memory: Option<String>,
    /// CPU request instead of the source's.
    #[arg(long)]
    pub cpu_request: Option<String>,
    /// Memory request instead of the source's.
    #[arg(long)]
    pub memory_request: Option<String>,
    /// Process limit instead of the source's.
    #[arg(long)]
    pub pids: Option<u32>,
    /// Disk limit (each child's own file system) instead of the source's.
    #[arg(long)]
    pub disk: Option<String>,
    /// Lifetime from creation instead of the source's.
    #[arg(long)]
    pub ttl: Option<String>,
    /// Lease instead of the source's.
    #[arg(long)]
    pub lease: Option<String>,
    /// Print the children as one JSON array instead of their ids.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Clone)]
pub struct CreateArgs {
    /// Image name (as imported or pulled) or registry reference.
    #[arg(long)]
    pub image: String,
    /// CPU limit, enforced by the cgroup: cores (0.5) or millicores (500m).
    /// Default 1.
    #[arg(long)]
    pub cpu: Option<String>,
    /// Memory hard limit (256M, 1G); no swap. Default 512M.
    #[arg(long)]
    pub memory: Option<String>,
    /// CPU the scheduler reserves (admission and placement count requests,
    /// not limits); also the sandbox's CPU weight under contention.
    /// Default: the learned profile's, else --cpu if given, else 10m.
    #[arg(long)]
    pub cpu_request: Option<String>,
    /// Memory the scheduler reserves; the kernel reclaims from it last.
    /// Default: the learned profile's, else --memory if given, else 16M.
    #[arg(long)]
    pub memory_request: Option<String>,
    /// Most processes and threads at once.
    #[arg(long)]
    pub pids: Option<u32>,
    /// Disk the sandbox may fill (5G): its own file system of that size;
    /// default: warren up's --default-disk.
    #[arg(long)]
    pub disk: Option<String>,
    /// GPUs: this many free devices of the node's GPU kind (its
    /// --gpu-kind, default nvidia.com/gpu), held by this sandbox alone.
    #[arg(long)]
    pub gpus: Option<u32>,
    /// A CDI device by its full name (vendor/class=name, e.g.
    /// nvidia.com/gpu=0): its device nodes, mounts and environment, held by
    /// this sandbox alone. Repeatable.
    #[arg(long = "device", value_name = "NAME")]
    pub devices: Vec<String>,
    /// Environment variable KEY=VALUE. Repeatable.
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Label KEY=VALUE, for ps, rm, logs and events selectors. Repeatable.
    #[arg(long = "label", short = 'l', value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// Lifetime from creation (10m, 2h): then it is destroyed, reason
    /// ttl_expired (or kept, as --reclaim says).
    #[arg(long)]
    pub ttl: Option<String>,
    /// Lease (30s): destroyed, reason lease_expired, unless `warren
    /// heartbeat ID` renews it within that time, again and again.
    #[arg(long)]
    pub lease: Option<String>,
    /// Resource profile to learn from and feed (default: the task label).
    #[arg(long)]
    pub profile: Option<String>,
    /// Network mode: none (loopback only) or allowlist (egress through the
    /// node's proxy to the --allow rules). Default: none, or allowlist
    /// with --allow.
    #[arg(long, value_parser = ["none", "allowlist"])]
    pub network: Option<String>,
    /// Egress rule HOST:PORT (name, *.suffix, IPv4 or CIDR); implies
    /// `--network allowlist`. Repeatable.
    #[arg(long, value_name = "HOST:PORT")]
    pub allow: Vec<String>,
    /// Rule that wins over the allow rules. Repeatable.
    #[arg(long, value_name = "HOST:PORT")]
    pub deny: Vec<String>,
    /// What happens when the main process ends or the TTL or lease runs
    /// out: destroy at once; delay (frozen for --keep-for, then destroyed);
    /// keep (frozen, inspectable, until --keep-for ends); keep_on_failure
    /// (keep after a failure or OOM kill, destroy otherwise).
    #[arg(
        long,
        value_parser = ["destroy", "delay", "keep", "keep_on_failure"]
    )]
    pub reclaim: Option<String>,
    /// How long a kept sandbox is held (keep, keep_on_failure), e.g. 2h.
    #[arg(long)]
    pub keep_for: Option<String>,
    /// Working directory of the main process and of execs.
    #[arg(long)]
    pub cwd: Option<String>,
    /// User of the main process and of execs: name, UID or UID:GID.
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
    /// The sandbox id (sbx-…).
    pub id: String,
    /// Environment variable KEY=VALUE. Repeatable.
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Working directory.
    #[arg(long)]
    pub cwd: Option<String>,
    /// Kill the command and everything it started after this long (2s,
    /// 5m); it then exits 137.
    #[arg(long)]
    pub timeout: Option<String>,
    /// User to run as: name, UID or UID:GID.
    #[arg(long)]
    pub user: Option<String>,
    /// Send this process's stdin to the command (with -t: as it is typed).
    #[arg(long = "interactive", visible_alias = "stdin", short = 'i')]
    pub stdin: bool,
    /// Give the command a terminal in the sandbox, like `docker exec -t`:
    /// with -i (`-it`) this terminal goes raw and is the command's, window
    /// size included; the exit code is the command's. Needs stdin to be a
    /// terminal.
    #[arg(long, short = 't')]
    pub tty: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

#[derive(Args)]
pub struct BenchArgs {
    /// Image the sandboxes are made from.
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
    /// Results as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct BenchNetArgs {
    /// Image the sandboxes are made from.
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
    /// Results as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct BenchCreatesArgs {
    /// Image the sandboxes are made from.
    #[arg(long)]
    pub image: String,
    /// Sandboxes created (all alive at the end, then deleted).
    #[arg(long, default_value_t = 20000)]
    pub count: usize,
    /// Creates in flight at once.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// CPU of each sandbox (cores).
    #[arg(long, default_value = "0.1")]
    pub cpu: String,
    /// Memory of each sandbox.
    #[arg(long, default_value = "64M")]
    pub memory: String,
}

#[derive(Args)]
pub struct FakeNodesArgs {
    /// The control plane to join.
    #[arg(long)]
    pub server: String,
    /// File holding the join token.
    #[arg(long)]
    pub join_token: PathBuf,
    /// Nodes to run (named fake-000, fake-001, ...).
    #[arg(long, default_value_t = 200)]
    pub count: usize,
    /// CPU each node lends (cores).
    #[arg(long, default_value_t = 64)]
    pub cpu: u64,
    /// Memory each node lends (GiB).
    #[arg(long, default_value_t = 256)]
    pub memory_gib: u64,
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
    /// Sandboxes in the workload.
    #[arg(long, default_value_t = 5000)]
    pub sandboxes: usize,
    /// Distinct tasks (profiles) they belong to.
    #[arg(long, default_value_t = 200)]
    pub tasks: usize,
    /// Cores of each simulated node.
    #[arg(long, default_value_t = 64)]
    pub node_cores: u64,
    /// Memory of each simulated node, GiB.
    #[arg(long, default_value_t = 256)]
    pub node_memory_gib: u64,
    /// Random seed of the workload.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Profile margin for CPU: recommendation = peak × margin.
    #[arg(long, default_value_t = 1.5)]
    pub cpu_margin: f64,
    /// Profile margin for memory: recommendation = peak × margin.
    #[arg(long, default_value_t = 1.5)]
    pub memory_margin: f64,
    /// Sum of sandbox CPU limits allowed per core, as `warren up
    /// --cpu-overcommit` (same default); 1 makes CPU requests binding.
    #[arg(long, default_value_t = 8.0)]
    pub cpu_overcommit: f64,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every flag and argument of every command says what it is for.
    #[test]
    fn every_argument_is_described() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let builtin = matches!(arg.get_id().as_str(), "help" | "version");
                if !builtin && !arg.is_hide_set() && arg.get_help().is_none() {
                    missing.push(format!("{path} {}", arg.get_id()));
                }
            }
            for sub in cmd.get_subcommands().filter(|c| !c.is_hide_set()) {
                if sub.get_about().is_none() && sub.get_name() != "help" {
                    missing.push(format!("{path} {} (the command)", sub.get_name()));
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::Cli::command(), "warren", &mut missing);
        assert!(missing.is_empty(), "undescribed: {missing:#?}");
    }
}
