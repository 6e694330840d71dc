//! The floor: the least kernel work for a sandbox's isolation, with nothing
//! of Warren around it. One [`run_cycle`] makes cgroups with CPU, memory and
//! process limits, an overlay root over an image's files, a child in new
//! user (mapped), mount, PID, network, IPC, UTS and cgroup namespaces that
//! pivots into that root, mounts /proc and runs `/bin/true`, then removes
//! all of it. `scripts/bench.sh` times it beside Warren, runc and
//! bubblewrap (`warren bench-floor`): what a create costs above it is
//! Warren's own (and, on cgroup v2 hosts, libcontainer's).
//!
//! Run it single-threaded (it forks) and as root.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{execv, fork, pipe, read, write, ForkResult, Pid};
use thiserror::Error;

use crate::os_error::OsError;
use crate::RuntimeError;

/// Why a cycle failed.
#[derive(Debug, Error)]
pub enum FloorError {
    #[error(transparent)]
    Os(#[from] OsError),
    /// The overlay root over the image.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("child did not make its user namespace: {0}")]
    NoUserNamespace(String),
    /// A process of the cycle ended other than with status 0.
    #[error("{what} ended with {status}")]
    Ended { what: &'static str, status: String },
}

/// Host ids the probe's user namespace maps root onto: far above the
/// ranges Warren's sandboxes take (see [`crate::userns`]).
const ID_BASE: u32 = 3_900_000_000;
const ID_COUNT: u32 = 65_536;

/// One full cycle with `rootfs` as the image; `scratch` is an empty
/// directory for the overlay's upper and work directories.
pub fn run_cycle(rootfs: &Path, scratch: &Path) -> Result<(), FloorError> {
    // Mounts stay in a namespace of the probe's own, as in Warren's
    // spawners, so the host's mount table never sees them.
    crate::spawner::unshare_private_mounts()?;
    let root = scratch.join("root");
    let (upper, work) = (scratch.join("upper"), scratch.join("work"));
    for d in [&root, &upper, &work] {
        std::fs::create_dir_all(d)
            .map_err(|e| OsError::new(format!("create {}", d.display()), e))?;
    }
    crate::rootfs::mount_overlay(&[rootfs.to_path_buf()], &upper, &work, &root)?;
    let cgroups = Cgroups::make(&format!("warren-floor-{}", std::process::id()))?;
    let ran = run_child(&root, &cgroups);
    let _ = umount2(&root, MntFlags::MNT_DETACH);
    let removed = cgroups.remove();
    ran.and(removed.map_err(FloorError::from))
}

fn run_child(root: &Path, cgroups: &Cgroups) -> Result<(), FloorError> {
    let (ready_r, ready_w) = pipe().map_err(|e| OsError::new("pipe", e))?;
    let (go_r, go_w) = pipe().map_err(|e| OsError::new("pipe", e))?;
    let true_path = c"/bin/true";
    // SAFETY: this process has one thread (the caller's contract), so the
    // child may do anything the parent could.
    match unsafe { fork() }.map_err(|e| OsError::new("fork", e))? {
        ForkResult::Child => {
            drop((ready_r, go_w));
            let code = match child(root, &ready_w, &go_r, true_path) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("floor: {e}");
                    1
                }
            };
            std::process::exit(code);
        }
        ForkResult::Parent { child } => {
            drop((ready_w, go_r));
            let setup = (|| {
                let mut b = [0u8; 1];
                match read(ready_r.as_raw_fd(), &mut b) {
                    Ok(1) => {}
                    other => return Err(FloorError::NoUserNamespace(format!("{other:?}"))),
                }
                for file in ["uid_map", "gid_map"] {
                    std::fs::write(
                        format!("/proc/{child}/{file}"),
                        format!("0 {ID_BASE} {ID_COUNT}"),
                    )
                    .map_err(|e| OsError::new(format!("write {file}"), e))?;
                }
                cgroups.enter(child)?;
                Ok(())
            })();
            // The child goes on (or, with setup failed, gives up) on this byte.
            let _ = write(&go_w, if setup.is_ok() { b"g" } else { b"x" });
            drop(go_w);
            let status = waitpid(child, None).map_err(|e| OsError::new("wait", e))?;
            setup?;
            match status {
                WaitStatus::Exited(_, 0) => Ok(()),
                other => Err(FloorError::Ended {
                    what: "the sandboxed /bin/true",
                    status: format!("{other:?}"),
                }),
            }
        }
    }
}

/// In the forked child: the namespaces, then a grandchild (PID 1 of the new
/// PID namespace) that pivots into the root and runs /bin/true.
fn child(root: &Path, ready: &OwnedFd, go: &OwnedFd, prog: &CStr) -> Result<i32, FloorError> {
    unshare(CloneFlags::CLONE_NEWUSER).map_err(|e| OsError::new("unshare user", e))?;
    write(ready, b"r").map_err(|e| OsError::new("signal", e))?;
    let mut b = [0u8; 1];
    if !matches!(read(go.as_raw_fd(), &mut b), Ok(1)) || b[0] != b'g' {
        return Ok(1);
    }
    unshare(
        CloneFlags::CLONE_NEWNS
            | CloneFlags::CLONE_NEWPID
            | CloneFlags::CLONE_NEWNET
            | CloneFlags::CLONE_NEWIPC
            | CloneFlags::CLONE_NEWUTS
            | CloneFlags::CLONE_NEWCGROUP,
    )
    .map_err(|e| OsError::new("unshare", e))?;
    // SAFETY: still one thread.
    match unsafe { fork() }.map_err(|e| OsError::new("fork pid 1", e))? {
        ForkResult::Child => {
            let e = init(root, prog);
            eprintln!("floor: {e}");
            std::process::exit(1);
        }
        ForkResult::Parent { child } => match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, code)) => Ok(code),
            other => Err(FloorError::Ended {
                what: "pid 1",
                status: format!("{other:?}"),
            }),
        },
    }
}

/// PID 1: returns only on failure.
fn init(root: &Path, prog: &CStr) -> FloorError {
    let steps = || -> Result<std::convert::Infallible, FloorError> {
        // Mounts copied from the host's namespace are locked in this one;
        // pivot_root needs a root mounted here (as runc and youki do).
        crate::rootfs::bind_in_place(root)
            .map_err(|e| OsError::new("bind the root onto itself", e))?;
        // Before the host's /proc goes: the kernel lets a user namespace
        // mount proc only where a full one is already visible.
        mount(
            Some("proc"),
            &root.join("proc"),
            Some("proc"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None::<&str>,
        )
        .map_err(|e| OsError::new("mount /proc", e))?;
        crate::rootfs::pivot_into(root)?;
        execv(prog, &[prog]).map_err(|e| OsError::new("exec /bin/true", e).into())
    };
    match steps() {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

/// A cgroup with a CPU quota, a memory limit and a process limit: one
/// directory on v2, one in each of the cpu, memory and pids hierarchies on
/// v1.
struct Cgroups {
    dirs: Vec<PathBuf>,
}

impl Cgroups {
    fn make(name: &str) -> Result<Cgroups, OsError> {
        let root = Path::new("/sys/fs/cgroup");
        let limits: Vec<(PathBuf, Vec<(&str, &str)>)> = if root.join("cgroup.controllers").exists()
        {
            vec![(
                root.join(name),
                vec![
                    ("cpu.max", "100000 100000"),
                    ("memory.max", "536870912"),
                    ("pids.max", "1024"),
                ],
            )]
        } else {
            vec![
                (
                    root.join("cpu").join(name),
                    vec![("cpu.cfs_quota_us", "100000")],
                ),
                (
                    root.join("memory").join(name),
                    vec![("memory.limit_in_bytes", "536870912")],
                ),
                (root.join("pids").join(name), vec![("pids.max", "1024")]),
            ]
        };
        let mut made = Cgroups { dirs: Vec::new() };
        for (dir, files) in limits {
            std::fs::create_dir(&dir)
                .map_err(|e| OsError::new(format!("create {}", dir.display()), e))?;
            made.dirs.push(dir.clone());
            for (file, value) in files {
                if let Err(e) = std::fs::write(dir.join(file), value) {
                    let _ = made.remove();
                    return Err(OsError::new(format!("write {}/{file}", dir.display()), e));
                }
            }
        }
        Ok(made)
    }

    fn enter(&self, pid: Pid) -> Result<(), OsError> {
        for dir in &self.dirs {
            std::fs::write(dir.join("cgroup.procs"), pid.to_string())
                .map_err(|e| OsError::new(format!("join {}", dir.display()), e))?;
        }
        Ok(())
    }

    /// Its processes have been waited for; a cgroup may still refuse
    /// removal for a moment while the last one is released.
    fn remove(&self) -> Result<(), OsError> {
        for dir in &self.dirs {
            let mut tries = 0;
            while let Err(e) = std::fs::remove_dir(dir) {
                tries += 1;
                if tries > 200 {
                    return Err(OsError::new(format!("remove {}", dir.display()), e));
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        }
        Ok(())
    }
}
