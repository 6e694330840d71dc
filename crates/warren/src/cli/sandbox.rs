//! Flags of the commands that make and drive one sandbox.

use clap::Args;

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
    /// Children resume the source's memory and running processes too, not
    /// only its files (a gvisor source on network none; the source is
    /// stopped for the save and resumed).
    #[arg(long)]
    pub with_processes: bool,
    /// Print the children as one JSON array instead of their ids.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Clone)]
pub struct CreateArgs {
    /// Image name (as imported or pulled) or registry reference.
    #[arg(long)]
    pub image: String,
    /// A name for it, unique among live sandboxes, usable wherever its id
    /// is (`warren exec NAME ...`), as `docker run --name`.
    #[arg(long)]
    pub name: Option<warren_core::sandbox_name::SandboxName>,
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
    /// A volume mounted at a path, as `docker run -v`: NAME:/PATH, or
    /// NAME:/PATH:ro to share it read-only (`warren volume create` makes
    /// one). Repeatable.
    #[arg(long = "volume", short = 'v', value_name = "NAME:/PATH[:ro]")]
    pub volumes: Vec<warren_core::volume::VolumeMount>,
    /// A secret given to the sandbox (`warren secret create` keeps one):
    /// NAME as the file /run/secrets/NAME, NAME,env=VAR as an environment
    /// variable, NAME,target=FILE as /run/secrets/FILE. Repeatable.
    #[arg(long = "secret", value_name = "NAME[,env=VAR|,target=FILE]")]
    pub secrets: Vec<warren_core::secret::SecretRef>,
    /// Environment variable KEY=VALUE. Repeatable.
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Label KEY=VALUE, for ps, rm, logs and events selectors. Repeatable.
    #[arg(long = "label", short = 'l', value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// Lifetime from creation (10m, 2h; default 1h): then it is
    /// destroyed, reason ttl_expired (or kept, as --reclaim says).
    #[arg(long)]
    pub ttl: Option<String>,
    /// Lease (30s): destroyed, reason lease_expired, unless `warren
    /// heartbeat ID` renews it within that time, again and again.
    #[arg(long)]
    pub lease: Option<String>,
    /// Resource profile to learn from and feed (default: the task label).
    #[arg(long)]
    pub profile: Option<String>,
    /// Network mode: none (loopback only), allowlist (egress through the
    /// node's proxy to the --allow rules) or open (any public address,
    /// less the --deny rules; only on nodes started with --egress-open).
    /// Default: none, or allowlist with --allow.
    #[arg(long, value_parser = ["none", "allowlist", "open"])]
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
    /// (keep after a failure or OOM kill, destroy otherwise); pause (at the
    /// TTL, paused with its memory for --keep-for: `warren resume` and
    /// `warren ttl` carry on).
    #[arg(
        long,
        value_parser = ["destroy", "delay", "keep", "keep_on_failure", "pause"]
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
    /// What stands between its code and the host: `container` or `gvisor`
    /// (gVisor's user-space kernel); default: its node's (docs/isolation.md).
    #[arg(long, value_parser = clap::value_parser!(warren_core::Isolation))]
    pub isolation: Option<warren_core::Isolation>,
    /// Its place in its tenant's queue: higher starts first and is
    /// preempted last. Default: its tenant's priority, which is also the
    /// most a tenant's token may give.
    #[arg(long, allow_negative_numbers = true)]
    pub priority: Option<i32>,
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
    /// The command and its arguments (after the id, as `docker exec`;
    /// `--` first if it starts with `-`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub cmd: Vec<String>,
}
