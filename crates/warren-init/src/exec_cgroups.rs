//! Exec cgroups init keeps itself, where the daemon cannot give it any.
//!
//! In the container class the daemon makes each exec a cgroup of the host's
//! and hands init its `cgroup.procs`; the shim enters it before forking the
//! command, so everything the command starts is found there and killed with
//! it. In gVisor no host cgroup reaches into the sentry, and this runsc
//! refuses `PR_SET_CHILD_SUBREAPER`, so an orphan that calls `setsid` left
//! both the shim's tree and the command's session and outlived the exec.
//! gVisor's kernel has cgroups of its own: init mounts a hierarchy of them
//! at start ([`Hierarchy::mount`]), keeps only a descriptor of its root and
//! detaches the mount at once, so no path in the sandbox leads to it (and
//! init is not dumpable, so `/proc/1/fd` does not either). Each exec gets a
//! cgroup there, entered by its shim as in the container class.
//!
//! Mounting takes `CAP_SYS_ADMIN`, which the gVisor class grants init alone
//! (in gVisor's kernel, never the host's; outside the bounding set, so no
//! execve can get it): init gives it up before any process of the sandbox
//! runs, whether the mount worked or not.

use std::os::fd::{AsFd, OwnedFd};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use rustix::fs::{Mode, OFlags};

/// The environment variable that asks init to keep its own exec cgroups
/// (the gVisor class sets it).
pub const ENV: &str = "WARREN_INIT_EXEC_CGROUPS";

/// Where the hierarchy is mounted for the moment it takes to open it.
const MOUNT_POINT: &str = "/dev/.warren-cgroups";

/// The hierarchy's controller: any would do (init only groups processes);
/// gVisor's cpuacct also counts each exec's CPU time.
const CONTROLLER: &str = "cpuacct";

/// The root of init's cgroup hierarchy, and the exec cgroups it could not
/// remove yet (something the exec left running when it ended).
pub(crate) struct Hierarchy {
    root: OwnedFd,
    made: u64,
    leftover: Vec<String>,
}

/// One exec's cgroup.
pub(crate) struct ExecCgroup {
    name: String,
    dir: OwnedFd,
    /// Its `cgroup.procs`, open for the shim to enter.
    pub procs: OwnedFd,
}

impl Hierarchy {
    /// Mounts the hierarchy when [`ENV`] asks for it and keeps its root;
    /// then gives up `CAP_SYS_ADMIN`. None when not asked or when gVisor
    /// refused (execs are then found by their tree and session alone).
    pub(crate) fn mount() -> Option<Hierarchy> {
        std::env::var_os(ENV)?;
        let root = mount_and_open();
        drop_sys_admin();
        Some(Hierarchy {
            root: root?,
            made: 0,
            leftover: Vec::new(),
        })
    }

    /// A new, empty cgroup for an exec.
    pub(crate) fn create(&mut self) -> Option<ExecCgroup> {
        self.made += 1;
        let name = format!("exec-{}", self.made);
        rustix::fs::mkdirat(&self.root, name.as_str(), Mode::from_raw_mode(0o700)).ok()?;
        let dir_flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC;
        let dir = rustix::fs::openat(&self.root, name.as_str(), dir_flags, Mode::empty()).ok()?;
        let procs_flags = OFlags::WRONLY | OFlags::CLOEXEC;
        let procs = rustix::fs::openat(&dir, "cgroup.procs", procs_flags, Mode::empty()).ok()?;
        Some(ExecCgroup { name, dir, procs })
    }

    /// Removes an exec's cgroup once nothing is left in it; one that still
    /// holds processes (what an exec that ended normally left running, as
    /// in the container class) is tried again each time an exec ends.
    pub(crate) fn release(&mut self, cgroup: ExecCgroup) {
        self.leftover.push(cgroup.name);
        let root = self.root.as_fd();
        self.leftover.retain(|name| {
            rustix::fs::unlinkat(root, name.as_str(), rustix::fs::AtFlags::REMOVEDIR).is_err()
        });
    }
}

impl ExecCgroup {
    /// The processes in it now.
    pub(crate) fn members(&self) -> Vec<i32> {
        let flags = OFlags::RDONLY | OFlags::CLOEXEC;
        let Ok(fd) = rustix::fs::openat(&self.dir, "cgroup.procs", flags, Mode::empty()) else {
            return Vec::new();
        };
        let mut text = String::new();
        let mut file = std::fs::File::from(fd);
        let _ = std::io::Read::read_to_string(&mut file, &mut text);
        text.lines().filter_map(|l| l.trim().parse().ok()).collect()
    }
}

/// Mounts the hierarchy, opens its root and detaches the mount.
fn mount_and_open() -> Option<OwnedFd> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(MOUNT_POINT)
        .ok()?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let mounted = mount(
        Some("none"),
        MOUNT_POINT,
        Some("cgroup"),
        flags,
        Some(CONTROLLER),
    );
    let root = mounted.ok().and_then(|()| {
        let dir_flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC;
        let root = rustix::fs::open(MOUNT_POINT, dir_flags, Mode::empty()).ok();
        let _ = umount2(MOUNT_POINT, MntFlags::MNT_DETACH);
        root
    });
    let _ = std::fs::remove_dir(MOUNT_POINT);
    root
}

/// Gives up `CAP_SYS_ADMIN` (effective, permitted, inheritable). It was
/// never in the bounding set, so nothing init starts can get it back.
fn drop_sys_admin() {
    use rustix::thread::{capabilities, set_capabilities, CapabilitySet};
    if let Ok(mut sets) = capabilities(None) {
        sets.effective.remove(CapabilitySet::SYS_ADMIN);
        sets.permitted.remove(CapabilitySet::SYS_ADMIN);
        sets.inheritable.remove(CapabilitySet::SYS_ADMIN);
        let _ = set_capabilities(None, sets);
    }
}
