//! Host cgroup settings that keep a create's cost flat as live sandboxes
//! grow (docs/benchmarks.md, "Create latency as live sandboxes grow").
//!
//! Every create makes cgroups and moves its init into them. Two kernel
//! defaults make that cost grow with the cgroups alive:
//! - Moving a process between cgroups takes the global threadgroup
//!   semaphore for writing, which by default first waits for an RCU grace
//!   period. With thousands of sandboxes alive a create spent about 12 ms
//!   there. `favordynmods` on the cgroup2 mount keeps the semaphore in its
//!   slow mode for good: no wait on a move, a little more on each fork and
//!   exit (the kernel's cgroup-v2 documentation describes the trade). The
//!   semaphore is one for all hierarchies, so this also serves a cgroup v1
//!   host through its unified (hybrid) mount.
//! - On cgroup v1 a new cpuset cgroup starts with no CPUs and no memory
//!   nodes; the set-up then copies its parent's, and each such write
//!   rebuilds the scheduler domains, walking every cpuset on the host.
//!   With `cgroup.clone_children` on the sandboxes' parent the kernel copies
//!   them itself when the cgroup is made, and nothing is rebuilt.

use std::path::{Path, PathBuf};

use nix::mount::{mount, MsFlags};

const CPUSET_V1: &str = "/sys/fs/cgroup/cpuset";

/// Makes cpuset cgroups below `parent` start with their parent's CPUs and
/// memory nodes (cgroup v1; a no-op elsewhere). Returns whether it changed
/// anything.
pub fn clone_cpusets(parent: &str) -> Result<bool, String> {
    let root = Path::new(CPUSET_V1);
    if !root.join("cpuset.cpus").exists() {
        return Ok(false);
    }
    let mut dir = root.to_path_buf();
    let mut changed = false;
    for part in parent
        .trim_matches('/')
        .split('/')
        .filter(|p| !p.is_empty())
    {
        let above = dir.clone();
        dir.push(part);
        if !dir.is_dir() {
            std::fs::create_dir(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        }
        // A cgroup with no CPUs or memory nodes refuses processes; fill
        // them in from above before telling the kernel to copy them down.
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let own = read(&dir.join(file))?;
            if own.trim().is_empty() {
                let value = read(&above.join(file))?;
                write(&dir.join(file), value.trim())?;
                changed = true;
            }
        }
        if read(&dir.join("cgroup.clone_children"))?.trim() != "1" {
            write(&dir.join("cgroup.clone_children"), "1")?;
            changed = true;
        }
    }
    Ok(changed)
}

/// Turns on `favordynmods` on the host's cgroup2 mount (the whole hierarchy
/// on v2, the unified mount on a hybrid host). Returns the mount point when
/// it changed anything; None when there is no cgroup2 mount or it was on.
/// The kernel keeps the setting until the host restarts.
pub fn favor_dynmods() -> Result<Option<PathBuf>, String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("read /proc/self/mountinfo: {e}"))?;
    let Some(m) = mountinfo.lines().find_map(Cgroup2Mount::parse) else {
        return Ok(None);
    };
    if m.super_options.iter().any(|o| o == "favordynmods") {
        return Ok(None);
    }
    // A remount sets the mount's flags and the file system's options to
    // exactly what it is given, so both are passed on as they are, plus ours.
    let mut data: Vec<&str> = m
        .super_options
        .iter()
        .map(String::as_str)
        .filter(|o| *o != "rw" && *o != "ro")
        .collect();
    data.push("favordynmods");
    mount(
        None::<&str>,
        &m.point,
        None::<&str>,
        MsFlags::MS_REMOUNT | m.flags,
        Some(data.join(",").as_str()),
    )
    .map_err(|e| format!("remount {} with favordynmods: {e}", m.point.display()))?;
    Ok(Some(m.point))
}

/// Where the host's cgroup2 hierarchy is mounted (`/sys/fs/cgroup` on v2,
/// usually `/sys/fs/cgroup/unified` on a hybrid host), if it is.
pub fn cgroup2_mount_point() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo
        .lines()
        .find_map(Cgroup2Mount::parse)
        .map(|m| m.point)
}

/// One cgroup2 line of mountinfo.
#[derive(Debug, PartialEq)]
struct Cgroup2Mount {
    point: PathBuf,
    flags: MsFlags,
    super_options: Vec<String>,
}

impl Cgroup2Mount {
    /// `id parent dev root point mount-options [optional...] - fstype source super-options`
    fn parse(line: &str) -> Option<Cgroup2Mount> {
        let (left, right) = line.split_once(" - ")?;
        let mut right = right.split(' ');
        if right.next()? != "cgroup2" {
            return None;
        }
        let super_options = right.nth(1)?.split(',').map(str::to_string).collect();
        let mut left = left.split(' ');
        let point = unescape(left.nth(4)?);
        let flags = left.next()?.split(',').fold(MsFlags::empty(), |f, o| {
            f | match o {
                "ro" => MsFlags::MS_RDONLY,
                "nosuid" => MsFlags::MS_NOSUID,
                "nodev" => MsFlags::MS_NODEV,
                "noexec" => MsFlags::MS_NOEXEC,
                "noatime" => MsFlags::MS_NOATIME,
                "nodiratime" => MsFlags::MS_NODIRATIME,
                "relatime" => MsFlags::MS_RELATIME,
                "strictatime" => MsFlags::MS_STRICTATIME,
                _ => MsFlags::empty(),
            }
        });
        Some(Cgroup2Mount {
            point: PathBuf::from(point),
            flags,
            super_options,
        })
    }
}

/// mountinfo writes space, tab, newline and backslash as octal escapes.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(c) => {
                out.push(c as char);
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_systemd_v2_mount_with_its_flags_and_options() {
        let line = "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot";
        let m = Cgroup2Mount::parse(line).expect("a cgroup2 line");
        assert_eq!(m.point, PathBuf::from("/sys/fs/cgroup"));
        assert_eq!(
            m.flags,
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_RELATIME
        );
        assert_eq!(
            m.super_options,
            ["rw", "nsdelegate", "memory_recursiveprot"]
        );
    }

    #[test]
    fn reads_a_hybrid_unified_mount_and_skips_other_file_systems() {
        let cgroup1 = "40 30 0:35 / /sys/fs/cgroup/cpuset rw,nosuid - cgroup cgroup rw,cpuset";
        assert_eq!(Cgroup2Mount::parse(cgroup1), None);
        let unified = "31 30 0:27 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";
        let m = Cgroup2Mount::parse(unified).expect("a cgroup2 line");
        assert_eq!(m.point, PathBuf::from("/sys/fs/cgroup/unified"));
        assert_eq!(m.super_options, ["rw"]);
    }

    /// Against the real kernel, on a cgroup v1 host (runs as root; a no-op
    /// elsewhere): a cpuset made below the parent has CPUs and memory nodes
    /// at once, without anyone writing them.
    #[test]
    fn cpusets_below_the_parent_start_with_cpus_and_memory_nodes() {
        let root = Path::new(CPUSET_V1);
        if !root.join("cpuset.cpus").exists() || !nix::unistd::geteuid().is_root() {
            return;
        }
        let parent = format!("warren-test-clone-{}", std::process::id());
        let dir = root.join(&parent);
        let child = dir.join("sbx");
        let result = std::panic::catch_unwind(|| {
            assert!(clone_cpusets(&parent).expect("sets up the parent"));
            assert!(
                !clone_cpusets(&parent).expect("second time"),
                "nothing left to change"
            );
            std::fs::create_dir(&child).expect("mkdir child");
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let theirs = read(&child.join(file)).expect("read child");
                assert_eq!(
                    theirs.trim(),
                    read(&root.join(file)).expect("read root").trim(),
                    "{file}"
                );
            }
        });
        let _ = std::fs::remove_dir(&child);
        let _ = std::fs::remove_dir(&dir);
        if let Err(e) = result {
            std::panic::resume_unwind(e);
        }
    }

    #[test]
    fn unescapes_mount_points() {
        assert_eq!(unescape(r"/mnt/a\040b"), "/mnt/a b");
        assert_eq!(unescape(r"/plain"), "/plain");
        assert_eq!(unescape(r"/odd\x"), r"/odd\x");
    }
}
