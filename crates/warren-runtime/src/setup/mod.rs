//! Warren's own set-up of a sandbox on cgroup v1 hosts, in place of
//! libcontainer's build: the same isolation, read from the same
//! `config.json` ([`crate::oci`] keeps every choice as data), in one clone
//! and a few hundred system calls where libcontainer spent about 2,400
//! (docs/benchmarks.md, "Where the rest of libcontainer's build goes").
//!
//! The spawner makes the sandbox's cgroups and clones a child into new
//! user, mount, PID, network, IPC and UTS namespaces: the child is PID 1
//! of its namespace and the spawner's own child. While the child waits,
//! the spawner writes its id maps, puts it in its cgroups and brings up its
//! loopback. The child then takes a cgroup namespace (rooted at its own
//! cgroups), its hostname and root file system, its user, limits and
//! capabilities, reports that it is ready, and becomes Warren's init.
//!
//! cgroup v2 hosts still go through libcontainer: its device program and
//! v2 limits have not been checked on a v2 machine in this path.

mod cgroup_v1;
mod creds;
mod error;
mod mounts;
mod shared;
mod spec;

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use nix::sched::CloneFlags;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::{pipe2, read, write, Pid};

pub use error::SetupError;
use spec::Config;

/// Sets up the sandbox `id` from the config in `bundle` and returns its
/// init's pid once the init is ready to serve. `took` records the phases
/// under the names libcontainer's path uses: `spawn_build` (cgroups, the
/// clone, id maps, the init in its cgroups), `spawn_loopback`, and
/// `spawn_start` (the init's own set-up: root, mounts, user, capabilities).
pub fn spawn(id: &str, bundle: &Path, took: &mut dyn FnMut(&str)) -> Result<i32, SetupError> {
    if !crate::is_sandbox_id(id) {
        return Err(SetupError::Unsupported(format!(
            "{id:?} is not a sandbox id"
        )));
    }
    let config = Config::load(bundle)?;
    let flags = clone_flags(&config)?;
    let hierarchies = cgroup_v1::hierarchies()?;
    let shared = shared::get(hierarchies)?;
    let cgroups = cgroup_v1::create(&config.linux.cgroups_path, &config.linux.resources)?;
    let (go_r, go_w) =
        pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| SetupError::os("pipe", e))?;
    let (report_r, report_w) =
        pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| SetupError::os("pipe", e))?;
    let pid = clone_into(flags)?;
    if pid == 0 {
        drop((go_w, report_r));
        child(&config, go_r, report_w, hierarchies, shared)
    }
    drop((go_r, report_w));
    let pid = Pid::from_raw(pid);
    let ready = (|| {
        if config.has_namespace("user") {
            write_id_map(pid, "uid_map", &config.linux.uid_mappings)?;
            write_id_map(pid, "gid_map", &config.linux.gid_mappings)?;
        }
        for dir in &cgroups {
            std::fs::write(dir.join("cgroup.procs"), pid.to_string())
                .map_err(|e| SetupError::os(format!("put the sandbox in {}", dir.display()), e))?;
        }
        took("spawn_build");
        crate::netns::loopback_up(pid.as_raw())
            .map_err(|e| SetupError::os("bring up loopback", e))?;
        took("spawn_loopback");
        write(&go_w, b"g").map_err(|e| SetupError::os("start the sandbox's set-up", e))?;
        drop(go_w);
        let report = read_report(&report_r);
        took("spawn_start");
        report
    })();
    if let Err(e) = ready {
        // The child stops at a closed pipe or exits after its report; a
        // kill covers one that hangs. The caller's destroy removes the
        // cgroups.
        let _ = kill(pid, Signal::SIGKILL);
        let _ = waitpid(pid, None);
        return Err(e);
    }
    Ok(pid.as_raw())
}

fn clone_flags(config: &Config) -> Result<CloneFlags, SetupError> {
    let mut flags = CloneFlags::empty();
    for ns in &config.linux.namespaces {
        flags |= match ns.kind.as_str() {
            "user" => CloneFlags::CLONE_NEWUSER,
            "pid" => CloneFlags::CLONE_NEWPID,
            "mount" => CloneFlags::CLONE_NEWNS,
            "ipc" => CloneFlags::CLONE_NEWIPC,
            "uts" => CloneFlags::CLONE_NEWUTS,
            "network" => CloneFlags::CLONE_NEWNET,
            // Taken by the child once it is in its cgroups.
            "cgroup" => CloneFlags::empty(),
            other => {
                return Err(SetupError::Unsupported(format!(
                    "the {other} namespace is not one Warren sets up"
                )))
            }
        };
    }
    let needed = CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS
        | CloneFlags::CLONE_NEWNET;
    if !flags.contains(needed) || !config.has_namespace("cgroup") {
        return Err(SetupError::Unsupported(
            "a sandbox's config must ask for PID, mount, IPC, UTS, network and cgroup namespaces"
                .into(),
        ));
    }
    if config.root.readonly || config.process.terminal {
        return Err(SetupError::Unsupported(
            "a read-only root or a terminal for init is not something Warren sets up".into(),
        ));
    }
    Ok(flags)
}

/// Clones this process into new namespaces; 0 in the child, as fork.
fn clone_into(flags: CloneFlags) -> Result<i32, SetupError> {
    let flags = flags.bits() as libc::c_ulong | libc::SIGCHLD as libc::c_ulong;
    // SAFETY: the spawner is single-threaded (see spawner.rs), so the child,
    // a copy of it, holds no lock another thread owns. Without CLONE_VM and
    // with no new stack the child runs on its own copy of this stack, as
    // after fork; the other arguments are unused for these flags.
    let pid = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    if pid < 0 {
        return Err(SetupError::last_os("clone into new namespaces"));
    }
    // A pid fits an i32; the syscall returns it as a long.
    Ok(pid as i32)
}

fn write_id_map(pid: Pid, file: &str, maps: &[spec::IdMapping]) -> Result<(), SetupError> {
    let text: String = maps
        .iter()
        .map(|m| format!("{} {} {}\n", m.container_id, m.host_id, m.size))
        .collect();
    std::fs::write(format!("/proc/{pid}/{file}"), text)
        .map_err(|e| SetupError::os(format!("write the sandbox's {file}"), e))
}

/// `R` once the child is ready; `E` and a message when it failed.
fn read_report(from: &OwnedFd) -> Result<(), SetupError> {
    let mut report = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        match read(from.as_raw_fd(), &mut buf) {
            Ok(0) => break,
            Ok(n) => {
                report.extend_from_slice(&buf[..n]);
                if report == b"R" {
                    return Ok(());
                }
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(SetupError::os("read the sandbox's set-up report", e)),
        }
    }
    match report.split_first() {
        Some((b'R', [])) => Ok(()),
        Some((b'E', message)) => Err(SetupError::Init(
            String::from_utf8_lossy(message).into_owned(),
        )),
        _ => Err(SetupError::Init(
            "the sandbox's init exited during its set-up".into(),
        )),
    }
}

/// In the clone: waits for the spawner, sets itself up and becomes the
/// sandbox's init. Never returns.
fn child(
    config: &Config,
    go: OwnedFd,
    report: OwnedFd,
    hierarchies: &[cgroup_v1::Hierarchy],
    shared: &shared::Shared,
) -> ! {
    let set_up = || -> Result<(), SetupError> {
        let mut b = [0u8; 1];
        if !matches!(read(go.as_raw_fd(), &mut b), Ok(1)) || b[0] != b'g' {
            return Err(SetupError::GivenUp);
        }
        creds::become_user(&config.process.user)?;
        nix::unistd::setsid().map_err(|e| SetupError::os("setsid", e))?;
        nix::sched::unshare(CloneFlags::CLONE_NEWCGROUP)
            .map_err(|e| SetupError::os("unshare the cgroup namespace", e))?;
        nix::unistd::sethostname(&config.hostname)
            .map_err(|e| SetupError::os("set the hostname", e))?;
        mounts::enter_root(config, hierarchies, shared)?;
        nix::unistd::chdir(config.process.cwd.as_str())
            .map_err(|e| SetupError::os(format!("enter {}", config.process.cwd), e))?;
        creds::set_rlimits(&config.process.rlimits)?;
        creds::set_env(&config.process.env);
        if config.process.no_new_privileges {
            creds::set_no_new_privs()?;
        }
        creds::drop_capabilities(&config.process.capabilities)
    };
    match set_up() {
        Ok(()) => {
            drop(go);
            if write(&report, b"R").is_err() {
                std::process::exit(1);
            }
            drop(report);
            crate::init::serve()
        }
        // The boundary: the error crosses the pipe as its message.
        Err(e) => {
            let _ = write(&report, format!("E{e}").as_bytes());
            std::process::exit(1)
        }
    }
}
