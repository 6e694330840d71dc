//! Flags of the benchmarks, the fake nodes and the simulator.

use std::path::PathBuf;

use clap::Args;

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
