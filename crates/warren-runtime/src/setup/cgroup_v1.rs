//! A sandbox's cgroups on a cgroup v1 (or hybrid) host, made by the
//! spawner before the sandbox's init exists: one directory in each
//! controller hierarchy, its limits written straight to the files.
//! The hierarchies are read from the mount table once per spawner, where
//! libcontainer's manager read it once per controller for every create.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::error::SetupError;
use super::spec::Resources;

/// One mounted v1 hierarchy.
#[derive(Debug, Clone)]
pub struct Hierarchy {
    /// Where the host mounts it, e.g. `/sys/fs/cgroup/cpu,cpuacct`.
    pub mount: PathBuf,
    /// Its mount options that name it: controllers (`cpu,cpuacct`) or a
    /// name (`name=systemd`).
    pub options: String,
}

/// The v1 controllers a hierarchy is recognised by (libcgroups' list); a
/// sandbox gets a cgroup only in those with one of
/// [`SANDBOX_CONTROLLERS`].
const CONTROLLERS: &[&str] = &[
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "hugetlb",
    "pids",
    "perf_event",
    "memory",
    "blkio",
    "net_prio",
    "net_cls",
    "freezer",
];

/// The controllers that limit, count, freeze or guard a sandbox: it gets a
/// cgroup of its own in each hierarchy that has one of them. The others
/// (`cpuset`, `perf_event`, `net_cls`, `net_prio`) keep it in its node's
/// cgroup: Warren sets nothing there, and a sandbox cpuset cost every
/// create a walk over its siblings and every destroy a rebuild of the
/// scheduler domains over all cpusets, under the host's cpuset and cgroup
/// mutexes (docs/benchmarks.md).
const SANDBOX_CONTROLLERS: &[&str] = &[
    "cpu", "cpuacct", "memory", "pids", "devices", "freezer", "blkio", "hugetlb",
];

impl Hierarchy {
    pub fn controllers(&self) -> impl Iterator<Item = &str> {
        self.options.split(',').filter(|o| CONTROLLERS.contains(o))
    }

    /// Whether a sandbox has a cgroup of its own in this hierarchy (and
    /// sees it, mounted at its root, in its `/sys/fs/cgroup`).
    pub fn sandboxed(&self) -> bool {
        self.controllers().any(|c| SANDBOX_CONTROLLERS.contains(&c))
    }

    fn has(&self, controller: &str) -> bool {
        self.controllers().any(|c| c == controller)
    }
}

/// The host's v1 hierarchies under `/sys/fs/cgroup`, read once.
pub fn hierarchies() -> Result<&'static [Hierarchy], SetupError> {
    static CACHE: OnceLock<Vec<Hierarchy>> = OnceLock::new();
    if let Some(h) = CACHE.get() {
        return Ok(h);
    }
    let table = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| SetupError::os("read /proc/self/mountinfo", e))?;
    Ok(CACHE.get_or_init(|| parse(&table)))
}

fn parse(mountinfo: &str) -> Vec<Hierarchy> {
    let mut found: Vec<Hierarchy> = mountinfo
        .lines()
        .filter_map(|line| {
            // "<id> <parent> <dev> <root> <mount point> <opts> [tags] - <type> <source> <super opts>"
            let (left, right) = line.split_once(" - ")?;
            let mount = left.split(' ').nth(4)?;
            let mut right = right.split(' ');
            if right.next()? != "cgroup" {
                return None;
            }
            let super_options = right.nth(1)?;
            if !mount.starts_with(crate::cgroups::ROOT) {
                return None;
            }
            let options: Vec<&str> = super_options
                .split(',')
                .filter(|o| {
                    CONTROLLERS.contains(o)
                        || o.starts_with("name=")
                        || *o == "rdma"
                        || *o == "misc"
                })
                .collect();
            Some(Hierarchy {
                mount: PathBuf::from(mount.replace("\\040", " ")),
                options: options.join(","),
            })
        })
        .filter(|h| !h.options.is_empty())
        .collect();
    found.sort_by(|a, b| a.mount.cmp(&b.mount));
    found.dedup_by(|a, b| a.options == b.options);
    found
}

/// Makes the sandbox's cgroup `path` (relative to each hierarchy's root) in
/// every hierarchy with a controller, writes `resources`' limits, and
/// returns the directories to put the init's pid in. On an error, what it
/// made is left for the caller's destroy, which removes the cgroups of a
/// failed create.
pub fn create(path: &str, resources: &Resources) -> Result<Vec<PathBuf>, SetupError> {
    let mut dirs = Vec::new();
    for h in hierarchies()?.iter().filter(|h| h.sandboxed()) {
        let dir = make_levels(&h.mount, path, h.has("cpuset"))?;
        if h.has("cpu") {
            write(&dir, "cpu.cfs_period_us", resources.cpu.period)?;
            write(&dir, "cpu.cfs_quota_us", resources.cpu.quota)?;
            write(&dir, "cpu.shares", resources.cpu.shares)?;
        }
        if h.has("memory") {
            let m = &resources.memory;
            write(&dir, "memory.limit_in_bytes", m.limit)?;
            // Memory and swap together. The file exists only where the
            // kernel accounts swap; without it a sandbox could swap past its
            // limit, which is harmless only on a host with no swap.
            if dir.join("memory.memsw.limit_in_bytes").exists() {
                write(&dir, "memory.memsw.limit_in_bytes", m.swap)?;
            } else if has_swap(&read(Path::new("/proc/meminfo"))?) {
                return Err(SetupError::Host(
                    "this host has swap but does not account it (no memory.memsw files), so a \
                     sandbox could swap past its memory limit: boot with swapaccount=1 or turn \
                     swap off",
                ));
            }
            write(&dir, "memory.kmem.tcp.limit_in_bytes", m.kernel_tcp)?;
            write(&dir, "memory.soft_limit_in_bytes", m.reservation)?;
        }
        if h.has("pids") {
            write(&dir, "pids.max", resources.pids.limit)?;
        }
        if h.has("devices") {
            for rule in &resources.devices {
                let line = format!(
                    "{} {}:{} {}",
                    rule.kind.as_deref().unwrap_or("a"),
                    number(rule.major),
                    number(rule.minor),
                    rule.access
                );
                let file = if rule.allow {
                    "devices.allow"
                } else {
                    "devices.deny"
                };
                write(&dir, file, line)?;
            }
        }
        dirs.push(dir);
    }
    Ok(dirs)
}

/// Whether `/proc/meminfo` (its text) shows any swap.
fn has_swap(meminfo: &str) -> bool {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("SwapTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .is_some_and(|kb| kb != "0")
}

fn number(n: Option<i64>) -> String {
    n.map_or_else(|| "*".to_string(), |n| n.to_string())
}

/// Creates `path` under `mount` one level at a time. A new cpuset cgroup
/// has no CPUs or memory nodes unless its parent has `clone_children` set;
/// any level left empty gets its parent's, or no process could join it.
/// (Sandboxes get no cpuset, so this is only for a host that mounts
/// `cpuset` together with a controller they do get.)
fn make_levels(mount: &Path, path: &str, cpuset: bool) -> Result<PathBuf, SetupError> {
    let mut dir = mount.to_path_buf();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        let above = dir.clone();
        dir.push(part);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(SetupError::os(
                    format!("create cgroup {}", dir.display()),
                    e,
                ))
            }
        }
        if cpuset {
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let own = read(&dir.join(file))?;
                if own.trim().is_empty() {
                    write(&dir, file, read(&above.join(file))?.trim())?;
                }
            }
        }
    }
    Ok(dir)
}

fn read(path: &Path) -> Result<String, SetupError> {
    std::fs::read_to_string(path).map_err(|e| SetupError::os(format!("read {}", path.display()), e))
}

fn write(dir: &Path, file: &str, value: impl ToString) -> Result<(), SetupError> {
    let path = dir.join(file);
    let value = value.to_string();
    std::fs::write(&path, &value)
        .map_err(|e| SetupError::os(format!("write {value} to {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_is_read_from_meminfo() {
        assert!(has_swap("MemTotal: 100 kB\nSwapTotal:     2048 kB\n"));
        assert!(!has_swap("MemTotal: 100 kB\nSwapTotal:        0 kB\n"));
        assert!(!has_swap("MemTotal: 100 kB\n"));
    }

    #[test]
    fn hierarchies_come_from_the_mount_table() {
        let table = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset,clone_children
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,favordynmods
50 23 0:29 / /mnt/other rw,relatime - cgroup cgroup rw,cpu,cpuacct";
        let h = parse(table);
        let options: Vec<&str> = h.iter().map(|h| h.options.as_str()).collect();
        assert_eq!(options, ["cpu,cpuacct", "cpuset", "name=systemd"]);
        assert_eq!(h[0].controllers().collect::<Vec<_>>(), ["cpu", "cpuacct"]);
        assert!(h[2].controllers().next().is_none());
        // A sandbox gets a cgroup where it is limited or counted, not in a
        // cpuset nor a named hierarchy.
        let sandboxed: Vec<bool> = h.iter().map(|h| h.sandboxed()).collect();
        assert_eq!(sandboxed, [true, false, false]);
    }
}
