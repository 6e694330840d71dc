//! What every sandbox of one spawner binds instead of mounting a file
//! system of its own: an empty directory to hide masked directories under,
//! and the skeleton of `/sys/fs/cgroup` (a directory per v1 hierarchy and
//! a link per co-mounted controller). Both live on one small tmpfs in the
//! spawner's private mount namespace, made read-only for good once built.
//!
//! Each file system a sandbox mounts is a superblock the kernel keeps two
//! memory-cgroup-aware lists for, and taking a memory cgroup offline (every
//! destroy) walks every such list on the host while holding the mutex that
//! mounting a new file system needs. With thousands of sandboxes alive
//! that walk is what creates wait on; a bind makes no superblock.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use nix::mount::{mount, MsFlags};

use super::cgroup_v1::Hierarchy;
use super::error::SetupError;

/// Paths, not descriptors: a sandbox's set-up binds them from its own
/// mount namespace, the spawner's copy, and a descriptor opened before the
/// clone names the spawner's mount, which the kernel refuses to bind there.
pub struct Shared {
    /// An empty directory: bound over each masked directory.
    pub empty: PathBuf,
    /// `/sys/fs/cgroup` as the sandbox sees it, before its hierarchies are
    /// mounted in it.
    pub cgroup: PathBuf,
}

/// This spawner's shared directories, made at its first sandbox.
pub fn get(hierarchies: &[Hierarchy]) -> Result<&'static Shared, SetupError> {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    if let Some(shared) = SHARED.get() {
        return Ok(shared);
    }
    let shared = build(hierarchies)?;
    // The spawner is single-threaded: nobody raced this.
    Ok(SHARED.get_or_init(|| shared))
}

fn build(hierarchies: &[Hierarchy]) -> Result<Shared, SetupError> {
    let at = Path::new(crate::ROOTS_DIR).join(".shared");
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    match std::fs::create_dir(&at) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(SetupError::os(format!("create {}", at.display()), e)),
    }
    mount(
        Some("tmpfs"),
        &at,
        Some("tmpfs"),
        flags,
        Some("mode=0755,size=64k"),
    )
    .map_err(|e| SetupError::os(format!("mount a tmpfs at {}", at.display()), e))?;
    // A build that fails half way leaves nothing mounted: a retry by the
    // next sandbox would otherwise stack a second tmpfs over the first.
    fill(&at, hierarchies, flags).inspect_err(|_| {
        let _ = nix::mount::umount2(&at, nix::mount::MntFlags::MNT_DETACH);
    })?;
    Ok(Shared {
        empty: at.join("empty"),
        cgroup: at.join("cgroup"),
    })
}

fn fill(at: &Path, hierarchies: &[Hierarchy], flags: MsFlags) -> Result<(), SetupError> {
    let dir = |path: &Path| {
        std::fs::create_dir(path)
            .map_err(|e| SetupError::os(format!("create {}", path.display()), e))
    };
    dir(&at.join("empty"))?;
    let cgroup = at.join("cgroup");
    dir(&cgroup)?;
    for h in hierarchies.iter().filter(|h| h.sandboxed()) {
        let Some(name) = h.mount.file_name() else {
            continue;
        };
        dir(&cgroup.join(name))?;
        // Co-mounted controllers (cpu,cpuacct) are reached by each name.
        for controller in h.controllers().filter(|c| OsStr::new(c) != name) {
            std::os::unix::fs::symlink(name, cgroup.join(controller))
                .map_err(|e| SetupError::os(format!("link {controller}"), e))?;
        }
    }
    // Read-only as a file system, not only as this mount: a bind of it in a
    // sandbox cannot be made writable from there.
    mount(
        None::<&str>,
        at,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | flags,
        None::<&str>,
    )
    .map_err(|e| SetupError::os(format!("make {} read-only", at.display()), e))?;
    Ok(())
}
