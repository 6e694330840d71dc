//! How a node is configured: where it lives and how much of the host it lends.

use std::path::PathBuf;

use crate::{logs, sampler};
use warren_node_api::Resources;

/// The disk a sandbox that names none may fill (see NodeSettings).
pub const DEFAULT_DISK: u64 = 10 << 30;
/// The CDI kind of a GPU when the node is told no other.
pub const DEFAULT_GPU_KIND: &str = "nvidia.com/gpu";
pub struct NodeConfig {
    pub home: PathBuf,
    pub name: String,
    /// What node selectors match (a cluster's scheduler).
    pub labels: std::collections::BTreeMap<String, String>,
    pub spawner_exe: PathBuf,
    pub spawner_args: Vec<String>,
    pub spawners: usize,
    pub settings: NodeSettings,
}
/// How much of the host the node lends to sandboxes.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// CPU is compressible (each sandbox is capped by its quota), so the sum
    /// of sandbox CPU limits may exceed the cores by this factor.
    pub cpu_overcommit: f64,
    /// Kept back for the system and Warren itself.
    pub reserve_cpu_millis: u64,
    pub reserve_memory: u64,
    pub max_sandboxes: u32,
    /// Sandboxes initialising at once (the node's start queue).
    pub max_initializing: usize,
    /// How long the log of a finished sandbox is kept.
    pub log_retention: std::time::Duration,
    /// Most bytes one sandbox's log keeps on disk (its newest lines).
    pub log_max: u64,
    /// Every log line and a usage sample of each sandbox every few seconds
    /// go to the shipping journal too, for the control plane to keep
    /// (`ship` in the node contract); off, the node keeps them alone.
    pub log_shipping: bool,
    /// Most bytes the shipping journal holds while the control plane does
    /// not take its entries (then the oldest go).
    pub ship_max: u64,
    /// Disk limit of a sandbox that asks for none: its writable layer is
    /// measured every few seconds and the sandbox stopped past it
    /// (`disk_exceeded`). 0: no limit of its own (the node floor still holds).
    pub default_disk: u64,
    /// Free space under the home the node keeps: below it, creates are
    /// refused and the sandbox writing the most is stopped. None: see
    /// [`default_disk_floor`].
    pub disk_floor: Option<u64>,
    /// Host memory (MemAvailable) the node keeps free: below it, creates
    /// are refused and the sandbox using the most above its memory request
    /// is stopped (`memory_pressure`), one per sample, until it is back.
    /// None: the larger of 256 MiB and 2% of the host's memory.
    pub memory_floor: Option<u64>,
    /// How often every sandbox's cgroup is sampled.
    pub sample_interval: std::time::Duration,
    /// The egress proxy: global allowlist, fixed name resolution, limits.
    pub egress: warren_net::Settings,
    /// Most bytes the image store may hold; after a pull that downloaded
    /// something, registry images no sandbox uses are removed (oldest
    /// first) until it fits. None: only unreferenced content is collected.
    pub image_budget: Option<u64>,
    /// Each sandbox in its own user namespace (see warren_runtime::userns).
    pub userns: bool,
    /// The host's size as the node counts it, when not the whole host
    /// (millicores, bytes): a node lending a share of a shared host.
    pub capacity: (Option<u64>, Option<u64>),
    /// Where the node reads CDI specs (see warren_runtime::cdi).
    pub cdi_dirs: Vec<PathBuf>,
    /// The CDI kind `gpus` requests take, e.g. `nvidia.com/gpu`.
    pub gpu_kind: String,
    /// Turn on `favordynmods` on the host's cgroup2 mount at start, so that
    /// moving a sandbox's init into its cgroups does not wait for an RCU
    /// grace period (see warren_runtime::cgroup_tuning).
    pub favor_dynmods: bool,
    /// The cgroup every sandbox lives below. None: the one the home
    /// recorded, else the default (see warren_runtime::cgroup_parent).
    pub cgroup_parent: Option<warren_runtime::cgroup_parent::CgroupParent>,
    /// The class of a sandbox whose spec names none.
    pub default_isolation: warren_core::Isolation,
    /// Where runsc is, for the `gvisor` class (offered when it answers).
    pub runsc: warren_runtime::gvisor::RunscSettings,
}
impl NodeSettings {
    /// What the node lends to sandboxes on a host of this size. The
    /// `warren simulate` replay uses the same computation.
    pub fn allocatable(&self, host_cpu_millis: u64, host_memory: u64) -> Resources {
        Resources {
            cpu_millis: ((host_cpu_millis as f64 * self.cpu_overcommit) as u64)
                .saturating_sub(self.reserve_cpu_millis),
            memory: host_memory.saturating_sub(self.reserve_memory),
            slots: self.max_sandboxes,
            gpus: 0,
        }
    }
}
impl Default for NodeSettings {
    fn default() -> Self {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        NodeSettings {
            cpu_overcommit: 8.0,
            reserve_cpu_millis: 250,
            reserve_memory: 512 << 20,
            max_sandboxes: 4096,
            max_initializing: 8 * cores,
            log_retention: std::time::Duration::from_secs(7 * 86400),
            log_max: logs::DEFAULT_MAX,
            log_shipping: true,
            ship_max: crate::ship_journal::DEFAULT_MAX,
            default_disk: DEFAULT_DISK,
            disk_floor: None,
            memory_floor: None,
            sample_interval: sampler::DEFAULT_INTERVAL,
            egress: warren_net::Settings::default(),
            image_budget: None,
            userns: true,
            capacity: (None, None),
            cdi_dirs: warren_runtime::cdi::DEFAULT_DIRS
                .iter()
                .map(PathBuf::from)
                .collect(),
            gpu_kind: DEFAULT_GPU_KIND.into(),
            favor_dynmods: true,
            cgroup_parent: None,
            default_isolation: warren_core::Isolation::Container,
            runsc: warren_runtime::gvisor::RunscSettings::default(),
        }
    }
}

/// 5% of the file system, at least 1 GiB and at most 4 GiB. The floor keeps
/// room for the node's own writes (store, journal, logs) and the host's; a
/// few GiB do that on any disk, while 5% of a large one is more than a
/// thin-provisioned or shared file system may have free at all (one whose
/// free space is far below its size minus its use), which would refuse
/// every create there.
pub(crate) fn default_disk_floor(fs_size: u64) -> u64 {
    (fs_size / 20).clamp(1 << 30, 4 << 30)
}

/// Free bytes under `dir` and the floor the node keeps there.
pub(crate) fn disk_headroom(dir: &std::path::Path, floor: Option<u64>) -> Option<(u64, u64)> {
    let st = rustix::fs::statvfs(dir).ok()?;
    let block = st.f_frsize.max(1);
    let free = st.f_bavail.saturating_mul(block);
    let size = st.f_blocks.saturating_mul(block);
    Some((free, floor.unwrap_or_else(|| default_disk_floor(size))))
}

pub(crate) fn default_memory_floor(host_memory: u64) -> u64 {
    (host_memory / 50).max(256 << 20)
}

/// The host's MemAvailable (what can be allocated without swapping).
pub(crate) fn available_memory() -> Option<u64> {
    meminfo("MemAvailable:")
}

pub(crate) fn host_memory() -> u64 {
    meminfo("MemTotal:").unwrap_or(0)
}

fn meminfo(key: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
    })
}

#[cfg(test)]
mod tests {
    use super::default_disk_floor;

    #[test]
    fn disk_floor_is_five_percent_between_one_and_four_gib() {
        const G: u64 = 1 << 30;
        assert_eq!(default_disk_floor(10 * G), G);
        assert_eq!(default_disk_floor(40 * G), 2 * G);
        // 252 GB, thin-provisioned with 80 GB free: 5% would be 12.6 GB.
        assert_eq!(default_disk_floor(252 * G), 4 * G);
        assert_eq!(default_disk_floor(0), G);
    }
}
