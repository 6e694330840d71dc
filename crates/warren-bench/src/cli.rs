//! The command line of `warren-bench`: the benchmarks, the fake nodes and
//! the simulator, with the flags they had as `warren` commands.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "warren-bench",
    version,
    about = "Warren's benchmarks and workload simulator (docs/benchmarks.md)",
    after_help = "The commands that measure a running Warren talk to it as `warren` does:\n\
                  --url/WARREN_URL, and the token from --token/WARREN_TOKEN or --home/WARREN_HOME."
)]
pub struct Cli {
    #[command(flatten)]
    pub api: warren_cli::ApiArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Measure create/exec/destroy through the API, and idle density (was
    /// `warren bench`; scripts/bench.sh runs it beside runc, bwrap and podman).
    Lifecycle(LifecycleArgs),
    /// Measure the scheduler alone: placement decisions per second over
    /// simulated nodes, full filter and score (was `warren bench-placement`).
    Placement(PlacementArgs),
    /// Measure creates per second through the API: COUNT sandboxes at a
    /// concurrency, then their deletes (was `warren bench-creates`).
    Creates(CreatesArgs),
    /// Measure what network mode `allowlist` costs: create latency, proxy
    /// latency and tunnel throughput, many live policies (run as root on
    /// the node; was `warren bench-net`).
    Net(NetArgs),
    /// One sandbox's worth of kernel work with nothing of Warren around it
    /// (cgroup limits, overlay root, namespaces, pivot_root, /proc,
    /// /bin/true, teardown): the floor that `scripts/bench.sh` times beside
    /// the runtimes. Root only (was `warren bench-floor`).
    Floor {
        /// The image's unpacked root file system (the overlay's lower layer).
        #[arg(long)]
        rootfs: PathBuf,
    },
    /// Join COUNT in-memory nodes to a `warren server`: each speaks the real
    /// node API but makes no sandboxes, for control-plane benchmarks (was
    /// `warren fake-nodes`).
    FakeNodes(FakeNodesArgs),
    /// Replay a synthetic training workload against simulated nodes with
    /// fixed, learned and oracle requests (was `warren simulate`).
    Simulate(SimulateArgs),
    /// Measure fair share between tenants on simulated nodes: shares while
    /// all are busy, one going idle and coming back, with and without
    /// preemption (docs/tenants.md).
    Tenants(TenantsArgs),
}

#[derive(Args)]
pub struct LifecycleArgs {
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
pub struct NetArgs {
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
pub struct CreatesArgs {
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
pub struct PlacementArgs {
    /// Simulated node counts, each measured in turn.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    pub nodes: Vec<usize>,
    /// Placements measured per node count (each followed by a release, so
    /// the cluster stays about half full).
    #[arg(long, default_value_t = 100000)]
    pub decisions: usize,
    /// Also measure each node count with this many tenants (quota checked,
    /// fair-share bookkeeping), beside the run without: 0 for without only.
    #[arg(long, default_value_t = 0)]
    pub tenants: usize,
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

#[derive(Args)]
pub struct TenantsArgs {
    /// Simulated nodes.
    #[arg(long, default_value_t = 200)]
    pub nodes: usize,
    /// Cores of each simulated node.
    #[arg(long, default_value_t = 64)]
    pub node_cores: u64,
    /// Memory of each simulated node, GiB.
    #[arg(long, default_value_t = 256)]
    pub node_memory_gib: u64,
    /// The tenants' weights (one tenant each); the last goes idle and
    /// comes back.
    #[arg(long, value_delimiter = ',', default_value = "1,1,2")]
    pub weights: Vec<u32>,
    /// Creates each busy tenant keeps waiting (also each tenant's queue
    /// limit).
    #[arg(long, default_value_t = 64)]
    pub backlog: usize,
    /// Shortest run of a sandbox, simulated seconds.
    #[arg(long, default_value_t = 20.0)]
    pub min_runtime_s: f64,
    /// Longest run of a sandbox, simulated seconds.
    #[arg(long, default_value_t = 100.0)]
    pub max_runtime_s: f64,
    /// Length of each phase (all busy, last idle, last back), simulated
    /// seconds.
    #[arg(long, default_value_t = 600.0)]
    pub phase_s: f64,
    /// How long the control plane takes to end a preempted sandbox,
    /// simulated milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub destroy_ms: u64,
    /// Random seed of the workload.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every flag and argument of every command says what it is for (as
    /// the same test of `warren`'s command line).
    #[test]
    fn every_argument_is_described() {
        let missing = warren_cli::undescribed(&super::Cli::command(), "warren-bench");
        assert!(missing.is_empty(), "undescribed: {missing:#?}");
    }
}
